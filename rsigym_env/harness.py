"""The harness: a directory of text files, versioned by content hash.

>>> store = HarnessStore({"harness.toml": "detect = false\\n"})
>>> v1 = store.edit("harness.toml", old="false", new="true")
>>> store.files(v1)["harness.toml"], store.latest == v1
('detect = true\\n', True)
>>> store.edit("harness.toml", old="true", new="false") == store.versions[0]   # same content, same id
True
"""

from __future__ import annotations

import hashlib
import json
from pathlib import PurePosixPath

from .errors import ActionError

MAX_FILES = 64


def version_id(files: dict[str, str]) -> str:
    """Content hash of a harness (the same files always give the same id)."""
    blob = json.dumps(files, sort_keys=True, separators=(",", ":")).encode()
    return "h-" + hashlib.sha256(blob).hexdigest()[:10]


def check_path(path: str) -> str:
    """A normalised relative path inside the harness, or :class:`ActionError`."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or path.endswith("/"):
        raise ActionError("invalid_args", f"edit_harness: path {path!r} must be a relative file path inside the harness")
    return str(pure)


class HarnessStore:
    """Every version a run has made; ``latest`` is the last one created or returned to."""

    def __init__(self, initial: dict[str, str]):
        self._versions: dict[str, dict[str, str]] = {}
        self.versions: list[str] = []
        self.initial = self._add(dict(initial))
        self.latest = self.initial

    def _add(self, files: dict[str, str]) -> str:
        vid = version_id(files)
        if vid not in self._versions:
            self._versions[vid] = files
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
        self.latest = self._add(files)
        return self.latest
