"""The held-out split's secret: official tasks are drawn from it, and nothing a researcher reaches holds it.

A local benchmark's dev and synthetic prompts are public and deterministic (anyone with the
package can generate them). Its **official** split is drawn from a secret that lives only in the
platform's state, outside every sandbox: ``$RSIGYM_HOME/secrets/official-split.key`` (mode 0600,
created at first use), or ``RSIGYM_SPLIT_SECRET`` when set (tests pin it that way). Every result
records the split it was scored on as :attr:`OfficialSplit.info` — the mode and a hash of the
secret, never the secret.

The ``public`` mode draws the official split from the package's fixed seed instead, for
reproducible comparisons across machines (and the figures in the README); results say so.

>>> public = official_split("public")
>>> public.info
{'mode': 'public', 'id': 'public'}
>>> pinned = official_split("secret", secret="test-secret")
>>> pinned.info["mode"], len(pinned.info["id"]), pinned.stream("local-math") != public.stream("local-math")
('secret', 16, True)
>>> "test-secret" in repr(pinned)
False
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .home import state_dir

SplitMode = Literal["secret", "public"]
SECRET_ENV = "RSIGYM_SPLIT_SECRET"
SECRET_FILE = "official-split.key"


def rsigym_home() -> Path:
    """``$RSIGYM_HOME`` or ``~/.rsigym``: the platform's own state (agents, secrets; :func:`~.home.state_dir`)."""
    return state_dir()


@dataclass(frozen=True)
class OfficialSplit:
    """Which official split a world evaluates on: ``mode`` and, for ``secret``, the secret itself (never shown)."""

    mode: SplitMode
    _secret: str = field(repr=False, default="")

    @property
    def id(self) -> str:
        """``public``, or the first 16 hex digits of the secret's SHA-256 (which split, not the secret)."""
        if self.mode == "public":
            return "public"
        return hashlib.sha256(self._secret.encode()).hexdigest()[:16]

    @property
    def info(self) -> dict[str, Any]:
        """What results record about the split."""
        return {"mode": self.mode, "id": self.id}

    def stream(self, benchmark: str) -> str:
        """The name of ``benchmark``'s official problem stream: ``official`` in public mode, else a keyed
        digest of the secret (so one benchmark's stream tells nothing about another's)."""
        if self.mode == "public":
            return "official"
        digest = hmac.new(self._secret.encode(), f"official-split:{benchmark}".encode(), hashlib.sha256).hexdigest()
        return f"official-{digest[:32]}"

    def key(self, purpose: str) -> bytes:
        """A key derived from the secret for ``purpose`` (e.g. per-trial seeds); public mode: a fixed one."""
        base = self._secret if self.mode == "secret" else "public-split"
        return hmac.new(base.encode(), purpose.encode(), hashlib.sha256).digest()


def load_secret(home: Path | None = None) -> str:
    """The split secret: ``$RSIGYM_SPLIT_SECRET``, else the key file under ``home/secrets``, created
    (256 random bits, mode 0600, directory 0700) the first time it is needed."""
    pinned = os.environ.get(SECRET_ENV)
    if pinned:
        return pinned
    directory = (home or rsigym_home()) / "secrets"
    path = directory / SECRET_FILE
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    secret = secrets.token_hex(32)
    tmp = directory / f".{SECRET_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    try:
        os.link(tmp, path)  # atomic and never overwrites: a concurrent first use keeps one secret
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_text().strip()


def official_split(mode: SplitMode = "secret", *, secret: str | None = None, home: Path | None = None) -> OfficialSplit:
    """The official split of ``mode`` (``secret``: from ``secret`` if given, else :func:`load_secret`)."""
    if mode == "public":
        return OfficialSplit("public")
    if mode != "secret":
        raise ValueError(f"official split mode must be 'secret' or 'public', got {mode!r}")
    return OfficialSplit("secret", secret if secret is not None else load_secret(home))


__all__ = ["OfficialSplit", "SECRET_ENV", "SplitMode", "load_secret", "official_split", "rsigym_home"]
