"""The archive of candidate researchers: a tree of specs, stored as patches, with their scores.

Every researcher an improvement loop proposes becomes a :class:`Node`: its id is the
:class:`~rsigym_env.agents.AgentSpec` id of its files view, its ``parent`` the node it was made from,
its ``patch`` how to get its files from its parent's (the root stores its full files), its
``scores`` one :class:`Score` per split (``train``, ``validation``, ``test``, ``transfer/<what>``).
:meth:`Archive.rebuild` replays the patches from the root and checks every step against the ids,
so a broken or hand-edited chain is refused.

The archive is also where the next parent comes from (:func:`select_parent`, rules ``greedy``,
``dgm``, ``thompson`` and ``sica``, more by :func:`register_rule`) and what a proposal is checked
against before it is evaluated (:func:`novelty`).

>>> import random, tempfile
>>> from rsigym_env.agents import AgentSpec
>>> archive = Archive(tempfile.mkdtemp(), name="demo")
>>> root = AgentSpec(kind="scripted", params={"k": 3})
>>> child = root.derive(params={"k": 4})
>>> _ = archive.add(root.to_files(), root.id, parent=None, generation=0)
>>> _ = archive.add(child.to_files(), child.id, parent=root.id, generation=1, produced_by={"operator": "k+1"})
>>> archive.record(root.id, "validation", [0.25, 0.75]).scores["validation"].mean
0.5
>>> _ = archive.record(child.id, "validation", [0.5, 0.75])
>>> archive.rebuild(child.id) == child.to_files()
True
>>> select_parent(archive, "greedy", random.Random(0)).id == child.id
True
>>> novelty(archive, child.to_files(), None)[:12]
'same content'

Stored one JSON file per node, ``<root>/<name>/<id>.json`` (default root ``$RSIGYM_HOME/archives``),
each written atomically (a temporary file, fsync, ``os.replace``). Writers in one process share a
lock per archive directory; across processes an exclusive ``flock`` on ``<root>/<name>/.lock``
serialises them, and :meth:`Archive.record` re-reads the node under that lock, so concurrent
records of different splits all survive.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import hashlib
import itertools
import json
import math
import os
import random
import re
import statistics
import tempfile
import threading
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .canonical import canonical_dumps
from .home import state_dir

try:  # POSIX: serialise writers across processes
    import fcntl
except ImportError:  # pragma: no cover - Windows: atomic replace alone
    fcntl = None  # type: ignore[assignment]

STATUSES = ("evaluated", "accepted", "rejected", "duplicate")
"""A node's status: ``evaluated`` (measured, not yet judged), ``accepted``, ``rejected`` or ``duplicate``."""
Status = Literal["evaluated", "accepted", "rejected", "duplicate"]
ELIGIBLE: frozenset[str] = frozenset({"evaluated", "accepted"})
"""Statuses a parent may be selected from by default (``rejected`` and ``duplicate`` are not)."""
SPLITS = ("train", "validation", "test")
"""The splits scores are recorded on, besides the transfer splits ``transfer/<what>``."""
SPLIT = re.compile(r"^(train|validation|test|transfer/[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
NODE_ID = re.compile(r"^ag-[0-9a-f]{16}$")
MIN_PREFIX = 5
FORM_VERSION = "f1"
"""Version of :func:`normal_form`; stored forms of another version are recomputed."""


class ArchiveError(ValueError):
    """The archive is inconsistent: a patch does not apply, a rebuilt node does not hash to its id, a
    parent is missing."""


class PatchError(ArchiveError):
    """A patch does not apply to the files it is applied to."""


# ---------------------------------------------------------------------------------------- patches

Hunk = tuple[int, int, list[str], list[str]]
"""``(start, end, old_lines, new_lines)``: lines ``start:end`` of the old file (0-based, end exclusive,
each with its line ending), which must equal ``old_lines``, are replaced by ``new_lines``."""


class FilePatch(BaseModel):
    """How one file changes: ``add`` (``text``), ``delete`` or ``modify`` (``hunks``, in ascending
    order, not overlapping, all against the old file). ``sha256`` is the first 16 hex digits of the
    SHA-256 of the file's text after the change (``add``, ``modify``) or of the text deleted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: Literal["add", "delete", "modify"]
    text: str | None = None
    hunks: list[Hunk] = Field(default_factory=list)
    sha256: str


Patch = dict[str, FilePatch]
"""Path -> :class:`FilePatch`, for the files that differ (unchanged files are absent)."""


def text_hash(text: str) -> str:
    """The first 16 hex digits of the SHA-256 of ``text`` (UTF-8).

    >>> text_hash("")
    'e3b0c44298fc1c14'
    """
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def files_hash(files: dict[str, str]) -> str:
    """The first 16 hex digits of the SHA-256 of the canonical JSON of a files view."""
    return hashlib.sha256(canonical_dumps(files).encode()).hexdigest()[:16]


def check_path(path: str) -> str:
    """``path`` if it is a safe relative POSIX path (no ``..``, no absolute path, no backslash).

    >>> check_path("skills/a.md")
    'skills/a.md'
    >>> check_path("../etc/passwd")
    Traceback (most recent call last):
    rsigym_env.archive.ArchiveError: unsafe file path '../etc/passwd' (a relative path without '..', '.', '\\\\' or empty parts)
    """
    parts = path.split("/") if isinstance(path, str) else []
    if (not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\x00" in path
            or any(p in ("", ".", "..") for p in parts)):
        raise ArchiveError(f"unsafe file path {path!r} (a relative path without '..', '.', '\\\\' or empty parts)")
    return path


def make_patch(before: dict[str, str], after: dict[str, str]) -> Patch:
    """The patch from ``before`` to ``after`` (``difflib`` opcodes over lines, line endings kept).

    >>> p = make_patch({"a": "x\\ny\\n", "b": "gone"}, {"a": "x\\nz\\n", "c": "new"})
    >>> {k: v.op for k, v in p.items()}, p["a"].hunks
    ({'a': 'modify', 'b': 'delete', 'c': 'add'}, [(1, 2, ['y\\n'], ['z\\n'])])
    >>> apply_patch({"a": "x\\ny\\n", "b": "gone"}, p) == {"a": "x\\nz\\n", "c": "new"}
    True
    """
    out: Patch = {}
    for path in sorted(before.keys() | after.keys()):
        check_path(path)
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        if new is None:
            out[path] = FilePatch(op="delete", sha256=text_hash(old or ""))
        elif old is None:
            out[path] = FilePatch(op="add", text=new, sha256=text_hash(new))
        else:
            a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
            hunks = [(i1, i2, a[i1:i2], b[j1:j2])
                     for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
                     if tag != "equal"]
            out[path] = FilePatch(op="modify", hunks=hunks, sha256=text_hash(new))
    return out


def apply_patch(files: dict[str, str], patch: Patch) -> dict[str, str]:
    """``files`` with ``patch`` applied (a new dict); :class:`PatchError` naming the file if any
    part does not apply exactly (a hunk's old lines differ, a file to add exists, a hash differs)."""
    out = dict(files)
    for path, fp in patch.items():
        check_path(path)
        old = out.get(path)
        if fp.op == "add":
            if old is not None:
                raise PatchError(f"{path}: the patch adds it but it exists")
            if fp.text is None:
                raise PatchError(f"{path}: an 'add' without text")
            new = fp.text
        elif fp.op == "delete":
            if old is None:
                raise PatchError(f"{path}: the patch deletes it but it does not exist")
            if text_hash(old) != fp.sha256:
                raise PatchError(f"{path}: the file to delete is not the one the patch was made from")
            del out[path]
            continue
        else:
            if old is None:
                raise PatchError(f"{path}: the patch modifies it but it does not exist")
            lines = old.splitlines(keepends=True)
            end = 0
            for start, stop, old_lines, _ in fp.hunks:
                if not (end <= start <= stop <= len(lines)):
                    raise PatchError(f"{path}: hunk at lines {start}:{stop} is out of order or past the end "
                                     f"({len(lines)} lines)")
                if lines[start:stop] != list(old_lines):
                    raise PatchError(f"{path}: hunk at lines {start}:{stop} does not match the file")
                end = stop
            for start, stop, _, new_lines in reversed(fp.hunks):
                lines[start:stop] = list(new_lines)
            new = "".join(lines)
        if text_hash(new) != fp.sha256:
            raise PatchError(f"{path}: the patched file does not hash to {fp.sha256} (patch tampered with?)")
        out[path] = new
    return out


def merge_files(base: dict[str, str], ours: dict[str, str], theirs: dict[str, str]) -> dict[str, str] | None:
    """A three-way merge: ``ours`` with the changes ``theirs`` made to ``base`` applied too, or None when
    a change of ``theirs`` touches lines (or a file) that ``ours`` changed differently. Changes both
    made identically are taken once; edits of adjacent lines merge.

    >>> base = {"a": "x = 1\\ny = 2\\nz = 3\\n"}
    >>> merge_files(base, {"a": "x = 9\\ny = 2\\nz = 3\\n"}, {"a": "x = 1\\ny = 2\\nz = 7\\n"})
    {'a': 'x = 9\\ny = 2\\nz = 7\\n'}
    >>> merge_files(base, {"a": "x = 9\\ny = 2\\nz = 3\\n"}, {"a": "x = 5\\ny = 2\\nz = 3\\n"}) is None
    True
    """
    out = dict(ours)
    mine, theirs_patch = make_patch(base, ours), make_patch(base, theirs)
    for path, fp in theirs_patch.items():
        if path not in mine:  # ours left it as it was: take theirs
            if path in theirs:
                out[path] = theirs[path]
            else:
                out.pop(path, None)
            continue
        own = mine[path]
        if fp.op != "modify" or own.op != "modify":
            if ours.get(path) != theirs.get(path):
                return None
            continue
        hunks = sorted({(h[0], h[1], tuple(h[3])) for h in list(own.hunks) + list(fp.hunks)})
        for (s1, e1, _), (s2, _e2, _) in zip(hunks, hunks[1:]):
            if s2 < e1 or s2 == s1:  # overlapping, or two different changes at the same place
                return None
        lines = base[path].splitlines(keepends=True)
        for start, stop, new_lines in reversed(hunks):
            lines[start:stop] = list(new_lines)
        out[path] = "".join(lines)
    return out


def diff_files(before: dict[str, str], after: dict[str, str], a: str = "a", b: str = "b") -> str:
    """A unified diff of two files views ('' when they are the same); a file missing on one side is
    ``/dev/null`` there.

    >>> print(diff_files({"x": "1\\n"}, {"x": "2\\n"}), end="")
    --- a/x
    +++ b/x
    @@ -1 +1 @@
    -1
    +2
    """
    out: list[str] = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        out += difflib.unified_diff((old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
                                    f"{a}/{path}" if old is not None else "/dev/null",
                                    f"{b}/{path}" if new is not None else "/dev/null")
    return "".join(line if line.endswith("\n") else line + "\n" if line[-1:] in _BREAKS
                   else line + "\n\\ No newline at end of file\n" for line in out)


_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""Line breaks of ``str.splitlines`` besides ``\\n``."""


# ---------------------------------------------------------------------------------------- normal forms


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def normal_text(path: str, text: str) -> str:
    """One file's normal form: Python as ``ast.dump`` without docstrings (comments and layout are gone
    with the parse), JSON and TOML as canonical JSON of their values (``spec.json`` without its
    ``name`` and ``parent``, which do not change behaviour), anything else with its whitespace runs
    collapsed. A file that does not parse is whitespace-normalized.

    >>> normal_text("a.py", "x = 1  # one\\n") == normal_text("a.py", '\\"\\"\\"Doc.\\"\\"\\"\\nx  =  1\\n')
    True
    >>> normal_text("params.toml", "k = 3 # three\\n"), normal_text("prompt.md", "  Be\\n careful. ")
    ('{"k":3}', 'Be careful.')
    """
    try:
        if path.endswith(".py"):
            return ast.dump(_strip_docstrings(ast.parse(text)))
        if path.endswith(".json"):
            value = json.loads(text)
            if path == "spec.json" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in ("name", "parent")}
            return canonical_dumps(value)
        if path.endswith(".toml"):
            return canonical_dumps(tomllib.loads(text), default=str)
    except (SyntaxError, ValueError, RecursionError, TypeError):
        pass
    return " ".join(text.split())


def normal_form(files: dict[str, str]) -> dict[str, str]:
    """:func:`normal_text` of every file."""
    return {path: normal_text(path, text) for path, text in files.items()}


def form_hash(files: dict[str, str]) -> str:
    """A hash of :func:`normal_form`: equal for files that differ only in comments, whitespace,
    docstrings, or the spec's name and parent."""
    return f"{FORM_VERSION}-" + hashlib.sha256(canonical_dumps(normal_form(files)).encode()).hexdigest()[:16]


def genes(files: dict[str, str]) -> frozenset[tuple[str, str]]:
    """A files view as a set of genes ``(path, line)``: its non-empty lines, whitespace collapsed,
    comment lines of Python and TOML left out."""
    out = set()
    for path, text in files.items():
        comment = "#" if path.endswith((".py", ".toml")) else None
        for line in text.splitlines():
            line = " ".join(line.split())
            if line and not (comment and line.startswith(comment)):
                out.add((path, line))
    return frozenset(out)


def gene_distance(a: frozenset[tuple[str, str]], b: frozenset[tuple[str, str]]) -> float:
    """Jaccard distance of two gene sets (0 = the same genes, 1 = none shared).

    >>> gene_distance(frozenset({("a", "x")}), frozenset({("a", "x"), ("a", "y")}))
    0.5
    """
    union = len(a | b)
    return 0.0 if union == 0 else 1.0 - len(a & b) / union


# ---------------------------------------------------------------------------------------- nodes


class Score(BaseModel):
    """A node's result on one split: ``mean``, ``se`` (sample s.d. / sqrt(n); 0 for n < 2), ``n``,
    the per-task ``values`` and, when known, the ``tasks`` they are for."""

    model_config = ConfigDict(extra="forbid")

    mean: float
    se: float = 0.0
    n: int
    values: list[float] | None = None
    tasks: list[str] | None = None

    @classmethod
    def of(cls, values: Sequence[float], tasks: Sequence[str] | None = None) -> "Score":
        """The score of per-task ``values``.

        >>> Score.of([1.0, 0.0, 1.0, 0.0]).model_dump(exclude={"values", "tasks"})
        {'mean': 0.5, 'se': 0.28867513459481287, 'n': 4}
        """
        xs = [float(v) for v in values]
        if not xs:
            raise ValueError("no values to score")
        if not all(math.isfinite(x) for x in xs):
            raise ValueError(f"values must be finite, got {xs}")
        if tasks is not None and len(tasks) != len(xs):
            raise ValueError(f"{len(tasks)} task ids for {len(xs)} values")
        se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0
        return cls(mean=statistics.fmean(xs), se=se, n=len(xs), values=xs,
                   tasks=[str(t) for t in tasks] if tasks is not None else None)

    def all_values(self) -> list[float]:
        """``values``, or ``n`` copies of ``mean`` when the per-task values were not kept."""
        return list(self.values) if self.values is not None else [self.mean] * self.n


class Node(BaseModel):
    """One candidate researcher in the archive (see the module docstring).

    ``produced_by`` says how it was made: ``improver`` (the improver's id), ``round``, ``operator``
    (a description of the change) and anything else a loop wants kept. ``cost_usd`` is what its
    evaluations cost, summed over :meth:`Archive.record` calls. ``files_sha256`` (of its whole files
    view) and ``form`` (:func:`form_hash`) are kept to check rebuilds and find duplicates cheaply.
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    parent: str | None = None
    patch: dict[str, FilePatch]
    generation: int = Field(ge=0)
    chain: int | None = None
    produced_by: dict[str, Any] = Field(default_factory=dict)
    scores: dict[str, Score] = Field(default_factory=dict)
    cost_usd: float = Field(0.0, ge=0.0)
    status: Status = "evaluated"
    notes: str = ""
    created: str
    files_sha256: str
    form: str

    @field_validator("id", "parent")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        if value is not None and not NODE_ID.fullmatch(value):
            raise ValueError(f"a node id is an agent id like 'ag-0123456789abcdef', got {value!r}")
        return value

    @field_validator("scores")
    @classmethod
    def _splits(cls, value: dict[str, Score]) -> dict[str, Score]:
        for split in value:
            check_split(split)
        return value

    def mean(self, split: str) -> float | None:
        """The mean score on ``split`` (``None`` if not recorded)."""
        score = self.scores.get(split)
        return None if score is None else score.mean


def check_split(split: str) -> str:
    """``split`` if it is ``train``, ``validation``, ``test`` or ``transfer/<what>``.

    >>> check_split("transfer/aime")
    'transfer/aime'
    """
    if not isinstance(split, str) or not SPLIT.fullmatch(split):
        raise ValueError(f"unknown split {split!r}: use train, validation, test or transfer/<what>")
    return split


Identify = Callable[[dict[str, str]], str]
"""``files -> id``: the id of the researcher a files view describes (``ValueError`` if it describes none)."""
_IDENTIFY: list[Identify] = []


def use_identity(identify: Identify) -> None:
    """Install how archives compute a files view's id when they are given no ``identify``.

    ``import rsigym_env`` installs :func:`rsigym_env.researchers.spec_id` (``AgentSpec.from_files(files).id``).
    This module never imports :mod:`rsigym_env.agents` itself: it sits below the researcher layer, so
    that worlds (the recursive world's rounds) may use it (see :mod:`rsigym_env.worlds`).
    """
    _IDENTIFY[:] = [identify]


def spec_id(files: dict[str, str]) -> str:
    """The id of the researcher ``files`` describe, by the installed identity (:func:`use_identity`).

    >>> from rsigym_env.agents import AgentSpec
    >>> spec = AgentSpec(kind="scripted", params={"k": 2})
    >>> spec_id(spec.to_files()) == spec.id
    True
    """
    if not _IDENTIFY:
        raise RuntimeError("no identity installed for archives (rsigym_env.archive.use_identity); import rsigym_env")
    return _IDENTIFY[0](files)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


# ---------------------------------------------------------------------------------------- locking

_LOCKS: dict[str, "_DirLock"] = {}
_LOCKS_GUARD = threading.Lock()


class _DirLock:
    """A re-entrant lock per archive directory: a thread lock in this process, ``flock`` across them."""

    def __init__(self, path: Path):
        self.path, self.rlock, self.depth, self.fh = path, threading.RLock(), 0, None

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        with self.rlock:
            if self.depth == 0 and fcntl is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.fh = open(self.path, "a+")
                fcntl.flock(self.fh.fileno(), fcntl.LOCK_EX)
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
                if self.depth == 0 and self.fh is not None:
                    fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
                    self.fh.close()
                    self.fh = None


def _dir_lock(directory: Path) -> _DirLock:
    key = os.path.realpath(directory)
    with _LOCKS_GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = _DirLock(Path(key) / ".lock")
        return lock


# ---------------------------------------------------------------------------------------- the archive


def archives_root(root: str | os.PathLike[str] | None = None) -> Path:
    """``root``, or ``$RSIGYM_HOME/archives`` (default ``~/.rsigym/archives``)."""
    return Path(root) if root is not None else state_dir("archives")


def list_archives(root: str | os.PathLike[str] | None = None) -> list[str]:
    """The names of the archives under ``root`` (directories holding at least one node), sorted."""
    base = archives_root(root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir()
                  if p.is_dir() and NAME.fullmatch(p.name) and any(p.glob("ag-*.json")))


class Archive:
    """Candidate researchers as a tree of patches, one JSON file per node in ``<root>/<name>``.

    Args:
        root: the folder of archives (default ``$RSIGYM_HOME/archives``).
        name: this archive's name (a folder under ``root``; letters, digits, ``_ . -``).

        identify: ``files -> id`` of a files view (default :func:`spec_id`: the
            :class:`~rsigym_env.agents.AgentSpec` id, installed by ``import rsigym_env``).

    ``root`` is the folder of archives, ``dir`` this archive's own folder. Ids may be given by a unique
    prefix of at least 5 characters. Nothing is created on disk until the first write.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, name: str = "default", *,
                 identify: Identify | None = None):
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"archive name {name!r} must match {NAME.pattern}")
        self.name = name
        self.identify: Identify = identify or spec_id
        self.root = archives_root(root)
        self.dir = self.root / name
        self._lock = _dir_lock(self.dir)

    def __repr__(self) -> str:
        return f"Archive({str(self.root)!r}, name={self.name!r})"

    # ---------------------------------------------------------------- storage

    def exists(self) -> bool:
        """Whether the archive holds any node."""
        return self.dir.is_dir() and any(self.dir.glob("ag-*.json"))

    def _path(self, node_id: str) -> Path:
        if not NODE_ID.fullmatch(node_id):
            raise KeyError(f"not a node id: {node_id!r}")
        return self.dir / f"{node_id}.json"

    def _write(self, node: Node) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(node.model_dump(mode="json"), fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self._path(node.id))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _read(self, path: Path) -> Node:
        try:
            node = Node.model_validate(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ArchiveError(f"{path}: not a valid archive node: {exc}") from None
        if node.id != path.stem:
            raise ArchiveError(f"{path}: holds node {node.id}, not {path.stem} (renamed or edited by hand?)")
        return node

    def resolve(self, ref: str) -> str:
        """The full id of the node ``ref`` (an id or a unique prefix of at least 5 characters)."""
        if NODE_ID.fullmatch(ref) and self._path(ref).is_file():
            return ref
        if len(ref) < MIN_PREFIX or not re.fullmatch(r"[a-z0-9-]+", ref):
            raise KeyError(f"unknown node {ref!r} in archive {self.name!r}: give an id 'ag-...' or a unique prefix "
                           f"of at least {MIN_PREFIX} characters")
        matches = sorted(p.stem for p in self.dir.glob(f"{ref}*.json") if NODE_ID.fullmatch(p.stem))
        if len(matches) != 1:
            raise KeyError(f"node {ref!r}: {'no' if not matches else len(matches)} nodes of archive {self.name!r} match"
                           + (f" ({', '.join(matches[:5])})" if matches else "; `rsigym archive list` shows them"))
        return matches[0]

    def get(self, ref: str) -> Node:
        """The node ``ref`` (``KeyError`` if there is none)."""
        return self._read(self._path(self.resolve(ref)))

    def __contains__(self, node_id: object) -> bool:
        return isinstance(node_id, str) and bool(NODE_ID.fullmatch(node_id)) and self._path(node_id).is_file()

    def __len__(self) -> int:
        return sum(1 for _ in self.dir.glob("ag-*.json")) if self.dir.is_dir() else 0

    def nodes(self) -> list[Node]:
        """Every node, oldest first."""
        if not self.dir.is_dir():
            return []
        found = [self._read(p) for p in self.dir.glob("ag-*.json") if NODE_ID.fullmatch(p.stem)]
        return sorted(found, key=lambda n: (n.created, n.generation, n.id))

    # ---------------------------------------------------------------- writing

    def add(self, files: dict[str, str], node_id: str, *, parent: str | None, generation: int,
            chain: int | None = None, produced_by: dict[str, Any] | None = None, status: Status = "evaluated",
            notes: str = "") -> Node:
        """Archive the researcher whose files view is ``files`` (its id ``node_id``, checked) as a child
        of ``parent`` (``None``: a root, stored whole). Adding an id that is archived already returns
        the stored node unchanged.

        ``generation`` is when it was made (a root's is usually 0); a child's must exceed its parent's.
        """
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise ValueError("files must map paths to texts")
        for path in files:
            check_path(path)
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise ValueError(f"generation must be an int >= 0, got {generation!r}")
        try:
            actual = self.identify(files)
        except ValueError as exc:
            raise ValueError(f"the files are not a researcher spec: {exc}") from None
        if actual != node_id:
            raise ValueError(f"the files hash to {actual}, not {node_id}")
        with self._lock.hold():
            if node_id in self:
                return self.get(node_id)
            base: dict[str, str] = {}
            if parent is not None:
                if parent not in self:
                    raise KeyError(f"parent {parent!r} is not in archive {self.name!r}")
                if parent == node_id:
                    raise ValueError("a node cannot be its own parent")
                up = self.get(parent)
                if generation <= up.generation:
                    raise ValueError(f"generation {generation} of a child of {parent} (generation {up.generation}) "
                                     "must be greater")
                base = self.rebuild(parent)
            node = Node(id=node_id, parent=parent, patch=make_patch(base, files), generation=generation, chain=chain,
                        produced_by=dict(produced_by or {}), status=status, notes=notes, created=_now(),
                        files_sha256=files_hash(files), form=form_hash(files))
            self._write(node)
            return node

    def record(self, node_id: str, split: str, values: Sequence[float], cost_usd: float = 0.0, *,
               tasks: Sequence[str] | None = None, extend: bool = False) -> Node:
        """Record per-task ``values`` on ``split`` (replacing what that split had; ``extend=True``
        appends to it), and add ``cost_usd`` to the node's evaluation cost. Other splits, written
        meanwhile by any process, are kept (the node is re-read under the archive's lock).

        ``tasks`` names the tasks the values are for (:func:`novelty` compares behaviour on the same tasks).
        """
        check_split(split)
        if not (isinstance(cost_usd, (int, float)) and math.isfinite(cost_usd) and cost_usd >= 0):
            raise ValueError(f"cost_usd must be a finite number >= 0, got {cost_usd!r}")
        with self._lock.hold():
            node = self.get(node_id)
            xs, ts = list(values), list(tasks) if tasks is not None else None
            old = node.scores.get(split)
            if extend and old is not None:
                if (old.tasks is None) != (ts is None):
                    raise ValueError(f"{split}: cannot extend values {'with' if old.tasks is None else 'without'} task ids")
                xs = old.all_values() + xs
                ts = (old.tasks or []) + (ts or []) if ts is not None else None
            node.scores[split] = Score.of(xs, ts)
            node.cost_usd = float(node.cost_usd + cost_usd)
            self._write(node)
            return node

    def set_status(self, node_id: str, status: Status, note: str | None = None) -> Node:
        """Set the node's status (one of :data:`STATUSES`); ``note`` is appended to its notes."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        with self._lock.hold():
            node = self.get(node_id)
            node.status = status
            if note:
                node.notes = f"{node.notes}\n{note}" if node.notes else note
            self._write(node)
            return node

    # ---------------------------------------------------------------- the tree

    def children(self, node_id: str, nodes: Sequence[Node] | None = None) -> list[Node]:
        """The node's children, oldest first."""
        full = self.resolve(node_id)
        return [n for n in (nodes if nodes is not None else self.nodes()) if n.parent == full]

    def descendants(self, node_id: str, nodes: Sequence[Node] | None = None) -> list[Node]:
        """The node's descendants (children, grandchildren, ...), breadth first; the node itself not."""
        full = self.resolve(node_id)
        kids = _children_map(nodes if nodes is not None else self.nodes())
        out, frontier, seen = [], [full], {full}
        while frontier:
            nxt = []
            for parent in frontier:
                for child in kids.get(parent, []):
                    if child.id not in seen:
                        seen.add(child.id)
                        out.append(child)
                        nxt.append(child.id)
            frontier = nxt
        return out

    def lineage(self, node_id: str) -> list[Node]:
        """The node's ancestors and itself, root first (:class:`ArchiveError` if a parent is missing
        or the parents loop)."""
        out, seen = [], set()
        node: Node | None = self.get(node_id)
        while node is not None:
            if node.id in seen:
                raise ArchiveError(f"the parents of {node_id} loop at {node.id}")
            seen.add(node.id)
            out.append(node)
            if node.parent is None:
                break
            if node.parent not in self:
                raise ArchiveError(f"node {node.id}: its parent {node.parent} is not in archive {self.name!r}")
            node = self.get(node.parent)
        return out[::-1]

    def rebuild(self, node_id: str) -> dict[str, str]:
        """The node's files: the patches from the root to it replayed, each step checked (the patch
        applies exactly, the files hash as stored and parse to a spec whose id is the node's).
        :class:`ArchiveError` names the first node where the chain breaks."""
        files: dict[str, str] = {}
        for node in self.lineage(node_id):
            try:
                files = apply_patch(files, node.patch)
            except PatchError as exc:
                raise ArchiveError(f"node {node.id}: its patch does not apply to its parent's files: {exc}") from None
            if files_hash(files) != node.files_sha256:
                raise ArchiveError(f"node {node.id}: the rebuilt files do not hash to the stored files_sha256 "
                                   "(patch chain broken or tampered with)")
            try:
                actual = self.identify(files)
            except ValueError as exc:
                raise ArchiveError(f"node {node.id}: the rebuilt files are not a spec: {exc}") from None
            if actual != node.id:
                raise ArchiveError(f"node {node.id}: the rebuilt files hash to {actual} (patch chain broken or "
                                   "tampered with)")
        return files

    def rebuild_all(self) -> dict[str, dict[str, str]]:
        """Every node's files (each patch applied once), checked as :meth:`rebuild` checks them."""
        nodes = {n.id: n for n in self.nodes()}
        done: dict[str, dict[str, str]] = {}

        def build(node_id: str) -> dict[str, str]:
            chain: list[Node] = []
            cur: str | None = node_id
            while cur is not None and cur not in done:
                if cur not in nodes:
                    raise ArchiveError(f"node {chain[-1].id}: its parent {cur} is not in archive {self.name!r}")
                if any(n.id == cur for n in chain):
                    raise ArchiveError(f"the parents of {node_id} loop at {cur}")
                chain.append(nodes[cur])
                cur = nodes[cur].parent
            files = done[cur] if cur is not None else {}
            for node in reversed(chain):
                try:
                    files = apply_patch(files, node.patch)
                except PatchError as exc:
                    raise ArchiveError(f"node {node.id}: its patch does not apply to its parent's files: {exc}") from None
                try:
                    same = files_hash(files) == node.files_sha256 and self.identify(files) == node.id
                except ValueError:
                    same = False
                if not same:
                    raise ArchiveError(f"node {node.id}: the rebuilt files do not hash to its id "
                                       "(patch chain broken or tampered with)")
                done[node.id] = files
            return files

        for node_id in nodes:
            build(node_id)
        return done

    def diff(self, a: str, b: str) -> str:
        """A unified diff of the rebuilt files of nodes ``a`` and ``b`` ('' if the same)."""
        ia, ib = self.resolve(a), self.resolve(b)
        return diff_files(self.rebuild(ia), self.rebuild(ib), ia, ib)

    def node_diff(self, node_id: str) -> str:
        """The node's patch as a unified diff from its parent's files (a root: every file added)."""
        node = self.get(node_id)
        before = self.rebuild(node.parent) if node.parent is not None else {}
        return diff_files(before, self.rebuild(node.id), node.parent or "empty", node.id)

    def tree(self, split: str = "validation") -> list[dict[str, Any]]:
        """The tree for display: one dict per root, ``{"id", "parent", "generation", "status",
        "mean" (on ``split``), "scores" (split -> mean), "produced_by", "children": [...]}``; nodes whose
        parent is missing are listed as roots."""
        check_split(split)
        nodes = self.nodes()
        ids = {n.id for n in nodes}
        kids = _children_map(nodes)

        def item(n: Node, seen: frozenset[str]) -> dict[str, Any]:
            return {"id": n.id, "parent": n.parent, "generation": n.generation, "status": n.status, "chain": n.chain,
                    "mean": n.mean(split), "scores": {s: v.mean for s, v in n.scores.items()},
                    "produced_by": n.produced_by,
                    "children": [item(c, seen | {n.id}) for c in kids.get(n.id, []) if c.id not in seen]}

        return [item(n, frozenset()) for n in nodes if n.parent is None or n.parent not in ids]

    def summary(self, split: str = "validation", *, max_pairs_nodes: int = 100) -> dict[str, Any]:
        """Figures of the archive: ``nodes``, ``accepted``, ``by_status``, ``generations`` (how many
        distinct), ``max_generation``, ``cost_usd``, ``best`` (id and mean on ``split``),
        ``by_generation`` (per generation: nodes, best id and mean), and ``diversity``:
        ``distinct_forms`` / ``form_ratio`` (distinct :func:`form_hash` per node) and
        ``mean_gene_distance`` (mean pairwise :func:`gene_distance`, over at most
        ``max_pairs_nodes`` nodes spread over the archive; ``None`` when the chain does not rebuild, or
        with ``max_pairs_nodes=0``, which skips rebuilding)."""
        check_split(split)
        nodes = self.nodes()
        by_status = {s: sum(1 for n in nodes if n.status == s) for s in STATUSES}
        scored = [n for n in nodes if split in n.scores]
        best = max(scored, key=lambda n: n.scores[split].mean, default=None)
        gens: dict[int, list[Node]] = {}
        for n in nodes:
            gens.setdefault(n.generation, []).append(n)
        by_generation = []
        for g in sorted(gens):
            top = max((n for n in gens[g] if split in n.scores), key=lambda n: n.scores[split].mean, default=None)
            by_generation.append({"generation": g, "nodes": len(gens[g]), "best_id": top.id if top else None,
                                  "best": top.scores[split].mean if top else None})
        forms = {n.form for n in nodes}
        distance = None
        if len(nodes) >= 2 and max_pairs_nodes >= 2:
            try:
                built = self.rebuild_all()
            except ArchiveError:
                built = None
            if built is not None:
                step = max(1, math.ceil(len(nodes) / max_pairs_nodes))
                sample = [genes(built[n.id]) for n in nodes[::step]]
                pairs = list(itertools.combinations(sample, 2))
                distance = statistics.fmean(gene_distance(a, b) for a, b in pairs) if pairs else None
        return {"name": self.name, "split": split, "nodes": len(nodes), "accepted": by_status["accepted"],
                "by_status": by_status, "roots": sum(1 for n in nodes if n.parent is None),
                "generations": len(gens), "max_generation": max(gens, default=None),
                "cost_usd": sum(n.cost_usd for n in nodes),
                "best": {"id": best.id, "mean": best.scores[split].mean, "generation": best.generation} if best else None,
                "by_generation": by_generation,
                "diversity": {"distinct_forms": len(forms), "form_ratio": len(forms) / len(nodes) if nodes else None,
                              "mean_gene_distance": distance}}


def _children_map(nodes: Sequence[Node]) -> dict[str, list[Node]]:
    kids: dict[str, list[Node]] = {}
    for n in nodes:
        if n.parent is not None:
            kids.setdefault(n.parent, []).append(n)
    return kids


# ---------------------------------------------------------------------------------------- parent selection


@dataclass
class Population:
    """What a selection rule sees: every node of the archive, the ``candidates`` (eligible, scored on
    ``split``), and the children of each node."""

    nodes: list[Node]
    candidates: list[Node]
    split: str
    kids: dict[str, list[Node]] = field(default_factory=dict)

    def children(self, node_id: str) -> list[Node]:
        return self.kids.get(node_id, [])

    def clade(self, node_id: str) -> list[Node]:
        """The node and all its descendants (any status)."""
        by_id = {n.id: n for n in self.nodes}
        out, stack, seen = [], [node_id], set()
        while stack:
            cur = stack.pop()
            if cur in seen or cur not in by_id:
                continue
            seen.add(cur)
            out.append(by_id[cur])
            stack.extend(c.id for c in self.children(cur))
        return out


Rule = Callable[..., Node]
"""``rule(population, rng, **options) -> Node`` (one of ``population.candidates``)."""
RULES: dict[str, Rule] = {}
"""The selection rules by name (:func:`register_rule` adds one)."""


def register_rule(name: str) -> Callable[[Rule], Rule]:
    """Register a parent-selection rule under ``name`` (a decorator).

    >>> @register_rule("oldest")
    ... def oldest(pop, rng):
    ...     return pop.candidates[0]
    >>> "oldest" in RULES
    True
    >>> del RULES["oldest"]
    """
    def wrap(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn
    return wrap


def population(archive: Archive | Sequence[Node], split: str = "validation", *,
               statuses: frozenset[str] | Sequence[str] = ELIGIBLE) -> Population:
    """The :class:`Population` of ``archive`` (or of just these nodes, e.g. one chain's) on ``split``:
    candidates are the nodes whose status is in ``statuses`` (default evaluated and accepted) and that
    have a score on ``split``; children and clades are counted among the same nodes."""
    check_split(split)
    unknown = set(statuses) - set(STATUSES)
    if unknown:
        raise ValueError(f"unknown statuses {sorted(unknown)}; known: {', '.join(STATUSES)}")
    nodes = archive.nodes() if isinstance(archive, Archive) else sorted(archive, key=lambda n: (n.created, n.generation, n.id))
    candidates = [n for n in nodes if n.status in statuses and split in n.scores]
    return Population(nodes=nodes, candidates=candidates, split=split, kids=_children_map(nodes))


def select_parent(archive: Archive | Sequence[Node], rule: str, rng: random.Random, split: str = "validation", *,
                  statuses: frozenset[str] | Sequence[str] = ELIGIBLE, **options: Any) -> Node:
    """The node to improve next, chosen by ``rule`` among the nodes whose status is in ``statuses``
    (default ``evaluated`` and ``accepted``) that have a score on ``split``. ``archive`` may also be a
    list of nodes (e.g. one chain's): children and clades are then counted among those nodes only.

    Rules (``options`` go to the rule):

    * ``greedy`` — the highest mean (ties: more tasks, then the oldest).
    * ``dgm`` — sampled with weight ``sigmoid(lam * (mean - midpoint)) / (1 + children)`` (Darwin
      Gödel Machine; ``lam=10``, ``midpoint=0.5`` or ``"median"`` of the candidates' means;
      children counts every child in the archive, whatever its status).
    * ``thompson`` — for each candidate, the results of its clade (it and all its descendants, any
      status) give a posterior: Beta(1 + s, 1 + f) when all values lie in [0, 1] (s = sum of values,
      f = sum of 1 - values, times ``temperature``), else normal around the clade's mean with its
      standard error; one draw each, the largest wins (Huxley-Gödel Machine).
    * ``sica`` — the newest candidate whose mean is at least the best candidate's lower bound,
      mean - ``z`` * se (``z=1.96``: 95 %).
    * ``metaproductive`` — the candidate's own mean plus a Thompson draw of what its improver produced
      (the mean gain over their parents of the nodes it made; :func:`metaproductive`).

    ``LookupError`` if there is no candidate.
    """
    if rule not in RULES:
        raise ValueError(f"unknown selection rule {rule!r}; known: {', '.join(sorted(RULES))}")
    pop = population(archive, split, statuses=statuses)
    if not pop.candidates:
        where = f"archive {archive.name!r}" if isinstance(archive, Archive) else f"the {len(pop.nodes)} nodes given"
        raise LookupError(f"no node of {where} can be a parent: none with status "
                          f"{'/'.join(sorted(statuses))} has a score on {split!r}")
    return RULES[rule](pop, rng, **options)


def _score(node: Node, split: str) -> Score:
    return node.scores[split]


@register_rule("greedy")
def greedy(pop: Population, rng: random.Random) -> Node:
    """The candidate with the best mean (ties: more tasks, then the oldest)."""
    return max(pop.candidates, key=lambda n: (_score(n, pop.split).mean, _score(n, pop.split).n))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def dgm_weights(pop: Population, lam: float = 10.0, midpoint: float | str = 0.5) -> dict[str, float]:
    """The ``dgm`` rule's selection probabilities, by candidate id (they sum to 1)."""
    means = [_score(n, pop.split).mean for n in pop.candidates]
    alpha0 = statistics.median(means) if midpoint == "median" else float(midpoint)
    raw = {n.id: _sigmoid(lam * (_score(n, pop.split).mean - alpha0)) / (1 + len(pop.children(n.id)))
           for n in pop.candidates}
    total = sum(raw.values())
    if total <= 0:  # every weight underflowed: uniform
        return {k: 1.0 / len(raw) for k in raw}
    return {k: v / total for k, v in raw.items()}


@register_rule("dgm")
def dgm(pop: Population, rng: random.Random, lam: float = 10.0, midpoint: float | str = 0.5) -> Node:
    """Sampled with the Darwin Gödel Machine's weights (:func:`dgm_weights`)."""
    weights = dgm_weights(pop, lam, midpoint)
    return rng.choices(pop.candidates, weights=[weights[n.id] for n in pop.candidates])[0]


def clade_values(pop: Population, node_id: str) -> list[float]:
    """Every per-task result on the population's split of the node and its descendants."""
    return [v for n in pop.clade(node_id) if pop.split in n.scores for v in n.scores[pop.split].all_values()]


@register_rule("thompson")
def thompson(pop: Population, rng: random.Random, temperature: float = 1.0) -> Node:
    """Thompson sampling over clades (Huxley-Gödel Machine; see :func:`select_parent`)."""
    values = {n.id: clade_values(pop, n.id) for n in pop.candidates}
    bounded = all(0.0 <= v <= 1.0 for vs in values.values() for v in vs)
    best, best_draw = pop.candidates[0], -math.inf
    for n in pop.candidates:
        vs = values[n.id]
        if bounded:
            s = sum(vs)
            draw = rng.betavariate(1.0 + temperature * s, 1.0 + temperature * (len(vs) - s))
        else:
            m = statistics.fmean(vs)
            sd = statistics.stdev(vs) if len(vs) > 1 else max(abs(m), 1.0)
            draw = rng.gauss(m, sd / math.sqrt(len(vs) * temperature))
        if draw > best_draw:
            best, best_draw = n, draw
    return best


def improver_gains(pop: Population, improver_id: str) -> list[float]:
    """What the improver ``improver_id`` achieved: for every node it produced (``produced_by["by"]``)
    that has a score on the population's split, that score's mean minus its parent's (a rejected
    candidate counts as much as an accepted one)."""
    by_id = {n.id: n for n in pop.nodes}
    out = []
    for n in pop.nodes:
        parent = by_id.get(n.parent or "")
        if n.produced_by.get("by") == improver_id and pop.split in n.scores and parent and pop.split in parent.scores:
            out.append(n.scores[pop.split].mean - parent.scores[pop.split].mean)
    return out


@register_rule("metaproductive")
def metaproductive(pop: Population, rng: random.Random, prior_sd: float = 0.02, weight: float = 1.0) -> Node:
    """The candidate whose own mean plus ``weight`` times a Thompson draw of its improver's
    productivity is largest (HyperAgents / Huxley-Gödel style: a parent is also judged by what its
    improver produced). The productivity of a candidate is the mean gain of the nodes its improver
    produced over their parents (:func:`improver_gains`), shrunk to 0 with a normal prior of spread
    ``prior_sd`` against the gains' own spread; a candidate whose improver produced nothing scored
    draws from the prior."""
    best, best_draw = pop.candidates[0], -math.inf
    for n in pop.candidates:
        gains = improver_gains(pop, n.id)
        noise = statistics.stdev(gains) if len(gains) > 1 else prior_sd
        precision = 1.0 / prior_sd**2 + len(gains) / max(noise, 1e-6) ** 2
        mean = (sum(gains) / max(noise, 1e-6) ** 2) / precision
        draw = _score(n, pop.split).mean + weight * rng.gauss(mean, precision ** -0.5)
        if draw > best_draw:
            best, best_draw = n, draw
    return best


@register_rule("sica")
def sica(pop: Population, rng: random.Random, z: float = 1.96) -> Node:
    """The newest candidate whose mean is at least the best's lower ``z``-bound (mean - z * se)."""
    top = greedy(pop, rng)
    bound = _score(top, pop.split).mean - z * _score(top, pop.split).se
    good = [n for n in pop.candidates if _score(n, pop.split).mean >= bound]
    return max(good, key=lambda n: (n.created, n.generation))


# ---------------------------------------------------------------------------------------- novelty


def novelty(archive: Archive, files: dict[str, str], behaviour: Sequence[float] | None = None, *,
            tasks: Sequence[str] | None = None, digits: int = 6) -> str | None:
    """``None`` if ``files`` are new to ``archive``, else why not:

    * the same content id as an archived node;
    * the same code modulo comments, whitespace and docstrings (:func:`form_hash`; for ``spec.json``
      also its name and parent);
    * the same behaviour: ``behaviour`` (per-task train results) equal, rounded to ``digits``, to an
      archived node's train values on the same tasks (when both have task ids they must be equal;
      when neither has, the same number of values; when one has and the other not, not compared).

    Cheap: one read of the node files, no rebuild.
    """
    nodes = archive.nodes()
    try:
        content_id: str | None = archive.identify(files)
    except ValueError:
        content_id = None
    if content_id is not None and any(n.id == content_id for n in nodes):
        return f"same content as {content_id}, which is archived"
    form = form_hash(files)
    for n in nodes:
        if n.form == form:
            return f"same code as {n.id} modulo comments, whitespace and docstrings"
    if behaviour is not None:
        key = [round(float(v), digits) for v in behaviour]
        ts = [str(t) for t in tasks] if tasks is not None else None
        for n in nodes:
            train = n.scores.get("train")
            if train is None or train.values is None or len(train.values) != len(key):
                continue
            if (ts is None) != (train.tasks is None) or (ts is not None and ts != train.tasks):
                continue
            if [round(v, digits) for v in train.values] == key:
                return f"same train results as {n.id} on the same {len(key)} tasks"
    return None


__all__ = ["ELIGIBLE", "RULES", "SPLITS", "STATUSES", "Archive", "ArchiveError", "FilePatch", "Node", "PatchError",
           "Population", "Score", "apply_patch", "archives_root", "check_split", "clade_values", "dgm_weights",
           "diff_files", "files_hash", "form_hash", "gene_distance", "genes", "list_archives", "make_patch",
           "normal_form", "normal_text", "novelty", "population", "register_rule", "select_parent", "spec_id", "text_hash",
           "use_identity"]
