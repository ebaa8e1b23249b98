"""The harness: a directory of text files, versioned by content hash.

>>> store = HarnessStore({"harness.toml": "detect = false\\n"})
>>> v1 = store.edit("harness.toml", old="false", new="true")
>>> store.files(v1)["harness.toml"], store.latest == v1
('detect = true\\n', True)
>>> store.edit("harness.toml", old="true", new="false") == store.versions[0]   # same content, same id
True
"""

from __future__ import annotations

import functools
import re

from .canonical import sha256_hex
from .errors import ActionError

MAX_FILES = 64
MAX_BYTES = 4 << 20       # all files of one version together
MAX_PATH_PARTS = 8
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,99}")


def version_id(files: dict[str, str]) -> str:
    """Content hash of a harness (the same files always give the same id)."""
    if all(type(k) is str and type(v) is str for k, v in files.items()):
        return _text_version_id(tuple(sorted(files.items())))
    return "h-" + sha256_hex(files)[:10]


@functools.lru_cache(maxsize=256)
def _text_version_id(items: tuple[tuple[str, str], ...]) -> str:
    """:func:`version_id` of text files, remembered: every episode starts from the same harness and makes
    the same few edits (Python keeps a string's hash, so a look-up does not rehash the texts)."""
    return "h-" + sha256_hex(dict(items))[:10]


def check_path(path: str) -> str:
    """A relative file path inside the harness (``dir/name.ext``), or :class:`ActionError`.

    Each part is a plain name (letters, digits, ``_.+-``, not starting with ``.`` or ``-``): no ``.``
    or ``..``, no empty parts, no absolute paths, no control characters or NUL.

    >>> check_path("skills/run.py")
    'skills/run.py'
    >>> check_path("./x")
    Traceback (most recent call last):
    ...
    rsigym_env.errors.ActionError: edit_harness: path './x' must be a relative path of plain names (letters, digits, _ . + -; no '.', '..', empty or hidden parts), e.g. 'harness.toml' or 'skills/run.py'
    """
    parts = path.split("/")
    if not path or len(parts) > MAX_PATH_PARTS or not all(_NAME.fullmatch(p) for p in parts):
        raise ActionError("invalid_args", f"edit_harness: path {path!r} must be a relative path of plain names "
                                          "(letters, digits, _ . + -; no '.', '..', empty or hidden parts), "
                                          "e.g. 'harness.toml' or 'skills/run.py'")
    return path


def check_tree(files: dict[str, str], path: str) -> None:
    """Refuse a file that would shadow a directory of the harness or sit under one of its files."""
    prefix = path + "/"
    if any(other.startswith(prefix) for other in files):
        raise ActionError("invalid_args", f"edit_harness: {path!r} is a directory of the harness; pick another name")
    parts = path.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent in files:
            raise ActionError("invalid_args", f"edit_harness: {parent!r} is a file of the harness, so "
                                              f"{path!r} cannot be under it")


class HarnessStore:
    """Every version a run has made; ``latest`` is the last one created or returned to."""

    def __init__(self, initial: dict[str, str]):
        self._versions: dict[str, dict[str, str]] = {}
        self._texts: dict[str, str] = {}
        self.versions: list[str] = []
        self.initial = self._add(dict(initial))
        self.latest = self.initial

    def _add(self, files: dict[str, str]) -> str:
        vid = version_id(files)
        if vid not in self._versions:
            # one copy of each distinct text across versions, so many small edits of a big file stay small
            self._versions[vid] = {p: self._texts.setdefault(t, t) for p, t in files.items()}
            self.versions.append(vid)
        return vid

    def resolve(self, version: str) -> str:
        """``"latest"``, ``"initial"`` or a version id → a version id."""
        if version == "latest":
            return self.latest
        if version == "initial":
            return self.initial
        if version not in self._versions:
            raise ActionError("unknown_ref", f"no harness version {version!r}; versions: {', '.join(self.versions)}")
        return version

    def files(self, version: str = "latest") -> dict[str, str]:
        """A copy of the files of ``version``."""
        return dict(self._versions[self.resolve(version)])

    def edit(
        self, path: str, *, content: str | None = None, old: str | None = None, new: str | None = None,
        base_version: str = "latest",
    ) -> str:
        """Write ``content`` to ``path``, or replace the single occurrence of ``old`` by ``new``."""
        path = check_path(path)
        files = self.files(base_version)
        if content is not None:
            if old is not None or new is not None:
                raise ActionError("invalid_args", "edit_harness: give either `content` or `old` and `new`, not both")
            if path not in files and len(files) >= MAX_FILES:
                raise ActionError("invalid_args", f"edit_harness: a harness holds at most {MAX_FILES} files")
            check_tree(files, path)
            files[path] = content
        elif old is not None and new is not None:
            if path not in files:
                raise ActionError("unknown_ref", f"edit_harness: no file {path!r}; files: {', '.join(sorted(files))}")
            count = files[path].count(old)
            if count != 1:
                raise ActionError(
                    "harness_patch_failed",
                    f"edit_harness: `old` occurs {count} times in {path} (it must occur exactly once)",
                )
            files[path] = files[path].replace(old, new)
        else:
            raise ActionError("invalid_args", "edit_harness: give `content`, or both `old` and `new`")
        size = sum(len(text.encode()) for text in files.values())
        if size > MAX_BYTES:
            raise ActionError("invalid_args", f"edit_harness: the harness would hold {size:,} bytes; at most {MAX_BYTES:,}")
        self.latest = self._add(files)
        return self.latest
