"""What a run key is never shown: seeds, the split's secret and id, host paths — out of data, text and bytes.

Used by the dashboard for everything a run key sees (:mod:`.auth`) and by the session service for
what it tells a researcher about its own run (error messages, the run summary).

>>> r = Redactor(prefixes=["/srv/state"], numbers=[918273645])
>>> r.text("/srv/state/runs and /srv/stateful/x")
'…/runs and …/x'
>>> r.data({"seed": 918273645, "path": "/srv/state/runs/ab12", "log": "seed 918273645 in /home/me/x/ledger.sqlite"})
{'path': '…/runs/ab12', 'log': 'seed … in …/ledger.sqlite'}
>>> r.text("POST http://127.0.0.1:8765/v1/tools/read and docs/agents.md stay")
'POST http://127.0.0.1:8765/v1/tools/read and docs/agents.md stay'
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any, Iterable

REDACTED_KEYS = frozenset({
    "seed", "episode_seed", "seeds", "official_split", "split_id", "split_secret", "secret", "key_sha256",
    "owner", "run_dir", "state_dir", "ledger_path", "roots", "root", "home", "worker", "pid", "hostname",
})
"""Keys dropped, at any depth, from what a run key is shown."""

_PATH_CHARS = r"[^\s/'\"<>()\[\]{},;:|`*?=&\\]"
ABS_PATH = re.compile(rf"(?<![\w.~:/…-])/(?:{_PATH_CHARS}+/)+{_PATH_CHARS}*")
"""An absolute path of two components or more (``/a/b``), not part of a URL or a relative path."""


def _components(path: str) -> int:
    return len([p for p in path.split("/") if p])


def host_paths(roots: Iterable[str | os.PathLike[str]] = ()) -> list[str]:
    """Host paths never shown to a run key: the watched roots, ``$RSIGYM_HOME``, the home and working
    directories, the Python installation (each as given, absolute and resolved; two components or more)."""
    from ..home import state_dir

    found: set[str] = set()
    candidates: list[str] = [os.fspath(r) for r in roots]
    candidates += [os.fspath(state_dir()), os.path.expanduser("~"), os.getcwd(), sys.prefix, sys.base_prefix,
                   sys.exec_prefix]
    for c in candidates:
        for form in (c, os.path.abspath(c), os.path.realpath(c)):
            form = form.rstrip("/")
            if form.startswith("/") and _components(form) >= 2:
                found.add(form)
    return sorted(found, key=len, reverse=True)


def split_secrets() -> list[str]:
    """The held-out split's secret (``$RSIGYM_SPLIT_SECRET`` or the key file, read only if it exists) and
    its id: strings a run key is never shown."""
    from ..home import state_dir
    from ..splits import SECRET_ENV, SECRET_FILE

    values = []
    secret = os.environ.get(SECRET_ENV)
    path = state_dir("secrets", SECRET_FILE)
    if not secret and path.is_file():
        try:
            secret = path.read_text().strip()
        except OSError:
            secret = None
    if secret:
        values += [secret, hashlib.sha256(secret.encode()).hexdigest()[:16]]
    return values


def _number_patterns(numbers: Iterable[int]) -> tuple[re.Pattern[str] | None, re.Pattern[bytes] | None]:
    """Patterns of ``numbers`` standing alone (four digits or more: a seed of 0 or 7 is everywhere)."""
    nums = sorted({str(int(n)) for n in numbers if isinstance(n, int) and not isinstance(n, bool) and abs(n) >= 1000},
                  key=len, reverse=True)
    if not nums:
        return None, None
    pattern = rf"(?<![\d.])(?:{'|'.join(nums)})(?![\d])"
    return re.compile(pattern), re.compile(pattern.encode())


class Redactor:
    """Removes what a run key must not see from data (:meth:`data`), text (:meth:`text`) and response
    bytes (:meth:`bytes`, a last net over everything a run key is sent).

    Args:
        prefixes: host paths replaced by ``…`` wherever they appear.
        secrets: strings replaced by ``…`` (the split's secret and id).
        numbers: numbers replaced by ``…`` where they stand alone (the run's seeds; four digits or more).
    """

    def __init__(self, prefixes: Iterable[str] = (), secrets: Iterable[str] = (), numbers: Iterable[int] = ()):
        paths = sorted({os.fspath(p).rstrip("/") for p in prefixes if _components(os.fspath(p)) >= 1}, key=len, reverse=True)
        words = sorted({s for s in secrets if isinstance(s, str) and len(s) >= 8}, key=len, reverse=True)
        alternatives = [f"(?:{'|'.join(map(re.escape, paths))})(?![\\w.-])"] if paths else []  # a whole path, not /a/bc for /a/b
        alternatives += [re.escape(w) for w in words]
        self._known = re.compile("|".join(alternatives)) if alternatives else None
        self._known_b = re.compile("|".join(alternatives).encode()) if alternatives else None
        self._nums, self._nums_b = _number_patterns(numbers)

    def with_numbers(self, numbers: Iterable[int]) -> "Redactor":
        """This redactor, also replacing ``numbers`` (a run's seeds)."""
        out = Redactor.__new__(Redactor)
        out.__dict__.update(self.__dict__)
        out._nums, out._nums_b = _number_patterns(numbers)
        return out

    def text(self, text: str) -> str:
        """``text`` without known host paths, secrets, seeds and absolute paths (``…/name`` for those)."""
        if self._known is not None:
            text = self._known.sub("…", text)
        text = ABS_PATH.sub(lambda m: "…/" + (m.group(0).rstrip("/").rsplit("/", 1)[-1]), text)
        if self._nums is not None:
            text = self._nums.sub("…", text)
        return text

    def data(self, value: Any) -> Any:
        """``value`` (JSON-like) without :data:`REDACTED_KEYS` at any depth, every string through :meth:`text`."""
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items() if str(k) not in REDACTED_KEYS}
        if isinstance(value, (list, tuple)):
            return [self.data(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Path):
            return self.text(str(value))
        if isinstance(value, int) and not isinstance(value, bool) and self._nums is not None:
            return "…" if self._nums.fullmatch(str(value)) else value
        return value

    def bytes(self, body: bytes) -> bytes:
        """A response body without known host paths, secrets and seeds (no URL is touched)."""
        if self._known_b is not None:
            body = self._known_b.sub("…".encode(), body)
        if self._nums_b is not None:
            body = self._nums_b.sub("…".encode(), body)
        return body


_SEEDS: dict[str, tuple[Any, set[int]]] = {}
_SEEDS_LOCK = threading.Lock()


def run_seeds(run_dir: str | os.PathLike[str] | None) -> set[int]:
    """The seeds a run directory records (``run.json``, ``result.json``, the record's start line)."""
    if run_dir is None:
        return set()
    base = Path(run_dir)
    files = [base / "run.json", base / "result.json", base / "record.jsonl"]
    sig = tuple((f.stat().st_mtime_ns if f.exists() else None) for f in files[:2]) + (files[2].exists(),)
    with _SEEDS_LOCK:
        cached = _SEEDS.get(str(base))
    if cached is not None and cached[0] == sig:
        return cached[1]
    seeds: set[int] = set()
    for f in files[:2]:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("seed"), int):
            seeds.add(data["seed"])
    try:
        with open(files[2], "rb") as fh:
            first = json.loads(fh.readline() or b"null")
        if isinstance(first, dict):
            seeds |= {first[k] for k in ("seed", "episode_seed") if isinstance(first.get(k), int)}
    except (OSError, ValueError):
        pass
    with _SEEDS_LOCK:
        _SEEDS[str(base)] = (sig, seeds)
        while len(_SEEDS) > 1024:
            _SEEDS.pop(next(iter(_SEEDS)))
    return seeds


__all__ = ["ABS_PATH", "REDACTED_KEYS", "Redactor", "host_paths", "run_seeds", "split_secrets"]
