"""A local server speaking E2B envd's protocol, so the unchanged ``e2b`` SDK drives a bubblewrap sandbox.

One :class:`EnvdServer` is one sandbox: a host directory seen as ``/app`` inside, every command
run through :mod:`.isolation` over it. The SDK talks to it in **debug mode** with ``sandbox_url``
pointing here (``Sandbox.create(debug=True, sandbox_url=server.url)``; debug mode skips E2B's
control plane, and without ``sandbox_url`` it would go to ``http://localhost:49983``). What it
serves, as e2b 2.63's envd client expects it:

* Connect-RPC (JSON codec, as the SDK sends; binary protobuf also accepted), through
  ``connectrpc``'s own ASGI application and the SDK's generated ``*_pb`` messages:
  ``process.Process`` — ``Start`` and ``Connect`` (server streams of start / stdout+stderr data /
  end events, with keep-alives), ``List``, ``SendInput``, ``StreamInput``, ``CloseStdin``,
  ``SendSignal``; ``filesystem.Filesystem`` — ``Stat``, ``ListDir`` (with ``depth``), ``MakeDir``
  (``ALREADY_EXISTS`` when present), ``Remove``, ``Move``.
* HTTP ``GET /health`` (204) and ``/files``: ``GET ?path=`` streams a regular file; ``POST`` writes
  one (``application/octet-stream`` body with ``?path=``, optionally gzip-encoded) or several
  (``multipart/form-data``, the part's file name is its path), creating parent directories, and
  answers ``[{"name", "type", "path"}]``. Errors are ``{"code", "message"}`` with 400/404/...

Untrusted code reaches it (the sandbox writes what the host then reads, and with ``network`` its
commands can connect to it), so: only regular files are read or replaced — a FIFO, socket or
device is refused at once with a 400 naming the path and its type (``Stat`` and ``ListDir`` still
describe it), never opened for reading; all file I/O runs in worker threads, never on the event
loop; an upload is at most ``max_upload_bytes`` and a Connect message ``max_message_bytes``
(decoded sizes: a gzip bomb is refused after decoding at most the limit; 413); a written file
appears whole or not at all; a request the client abandons is one log line.

Paths are the sandbox's view: absolute under ``/app`` or relative to ``/app``; anything else, and
any symlink leading out of ``/app``, is refused. Files are resolved one directory at a time with
``O_NOFOLLOW`` directory descriptors, so a command racing symlinks cannot make the (root) server
touch a host file.

Differences from E2B, by design: every command is its own sandbox over the same directory (its
own PID namespace and ``/tmp``: commands do not see each other's processes, and a command's
background children end with it); a command is killed when its ``timeout`` passes (the SDK then
raises ``TimeoutException`` as with E2B) or after ``max_wall_s`` when it has none; the
``user`` argument is ignored (one unprivileged sandbox user); no PTY, watchers or file metadata
(``UNIMPLEMENTED`` / 400).

>>> import tempfile
>>> from e2b import Sandbox
>>> with EnvdServer(Path(tempfile.mkdtemp()), require_isolation=False) as envd:
...     sbx = Sandbox.create(debug=True, sandbox_url=envd.url)
...     _ = sbx.files.write("hello.txt", "hi")
...     sbx.commands.run("cat hello.txt; echo !").stdout
'hi!\\n'
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import itertools
import logging
import os
import posixpath
import secrets
import shutil
import stat
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence

import anyio
import anyio.to_thread
from connectrpc.code import Code
from connectrpc.codec import proto_binary_codec
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.client_shared import ENVD_JSON_CODEC
from e2b.envd.filesystem import filesystem_connect, filesystem_pb as fpb
from e2b.envd.process import process_connect, process_pb as ppb
from protobuf import Oneof
from protobuf.wkt import Timestamp
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ....serving.asgi import ASGIApp, BodyLimitMiddleware, HTTPServing, ResponseAborted, ThreadedASGIServer

from .isolation import (
    APP, SANDBOX_USER, IsolatedProcess, IsolationUnavailable, Limits, Mount, SandboxGroup, claim, sandbox_uid,
)

log = logging.getLogger("rsigym_env.envd")

ENVD_PORT = 49983            # where the SDK's debug mode looks without sandbox_url
MAX_SYMLINK_HOPS = 40
READ_CHUNK = 1 << 20         # a file is sent in pieces of this size, each read in a worker thread
WRITE_CHUNK = 1 << 20        # an upload is written in pieces of (about) this size
MAX_UPLOAD_BYTES = 256 << 20   # default limit of one upload to /files (decoded)
MAX_MESSAGE_BYTES = 4 << 20    # default limit of one Connect-RPC message (decoded)
MAX_UPLOAD_FILES = 10_000      # files in one multipart upload
_O_PATH = getattr(os, "O_PATH", 0)


# --------------------------------------------------------------------------------------------
# The sandbox's file system, seen from the host


class SandboxPathError(Exception):
    """A path that is not in the sandbox (``code``: a Connect code; ``status``: the HTTP status)."""

    def __init__(self, message: str, code: Code = Code.PERMISSION_DENIED, status: int = 403) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def _not_found(path: str) -> SandboxPathError:
    return SandboxPathError(f"path '{path}' does not exist", Code.NOT_FOUND, 404)


_KINDS = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")]


def _not_regular(path: str, mode: int, resolved: str | None = None) -> SandboxPathError:
    """The refusal to read or replace something that is not a regular file (``path`` as the sandbox
    names it; ``resolved``: where its links lead, if elsewhere).

    >>> str(_not_regular("/app/pipe", stat.S_IFIFO | 0o644))
    "'/app/pipe' is a FIFO (named pipe), not a regular file"
    >>> str(_not_regular("/app/link", stat.S_IFSOCK, "/app/sock"))
    "'/app/link' leads to '/app/sock', which is a socket, not a regular file"
    """
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    what = f"'{path}' is" if resolved in (None, path) else f"'{path}' leads to '{resolved}', which is"
    return SandboxPathError(f"{what} {kind}, not a regular file", Code.INVALID_ARGUMENT, 400)


@dataclass(frozen=True)
class _Root:
    target: str      # where the sandbox sees it: /app or a mount's target
    host: Path
    writable: bool


class SandboxFS:
    """File operations in the sandbox's view (``/app/...`` and directory mounts), safe against symlink escapes.

    ``root`` is ``/app``; each directory in ``mounts`` is reachable at its target too (read-only
    unless the mount is writable), as commands see it.

    >>> import tempfile
    >>> fs = SandboxFS(Path(tempfile.mkdtemp()))
    >>> fs.write("notes/a.txt", [b"hello"])
    '/app/notes/a.txt'
    >>> fs.read_all("/app/notes/a.txt"), [e.name for e in fs.list_dir("notes")]
    (b'hello', ['a.txt'])
    >>> fs.normalize("/etc/passwd")
    Traceback (most recent call last):
    ...
    rsigym_env.worlds.local.sandbox.envd.SandboxPathError: '/etc/passwd' is outside the sandbox's directories (/app)
    """

    def __init__(self, root: Path, uid: int | None = None, mounts: Sequence[Mount] = ()) -> None:
        self.root = Path(root).resolve()
        self.uid = sandbox_uid(self.root) if uid is None else uid
        roots = [_Root(APP, self.root, True)]
        roots += [_Root(posixpath.normpath(m.target), Path(m.host).resolve(), m.writable) for m in mounts
                  if Path(m.host).is_dir()]
        self._roots = sorted(roots, key=lambda r: -len(r.target))  # longest target first

    # -- path resolution ------------------------------------------------------------------

    def _root_of(self, full: str) -> _Root | None:
        return next((r for r in self._roots if full == r.target or full.startswith(r.target + "/")), None)

    def normalize(self, path: str) -> str:
        """``path`` as an absolute, normalized sandbox path in one of the sandbox's directories
        (relative paths are under ``/app``)."""
        if not path:
            raise SandboxPathError("empty path", Code.INVALID_ARGUMENT, 400)
        if "\x00" in path:
            raise SandboxPathError("path contains a NUL byte", Code.INVALID_ARGUMENT, 400)
        full = posixpath.normpath(path if path.startswith("/") else f"{APP}/{path}")
        if full.startswith("//"):
            full = full[1:]
        if self._root_of(full) is None:
            where = ", ".join(sorted(r.target for r in self._roots))
            raise SandboxPathError(f"'{path}' is outside the sandbox's directories ({where})")
        return full

    @contextmanager
    def _parent(self, path: str, follow: bool = True) -> Iterator[tuple[int, str, str, bool]]:
        """(directory fd, name, sandbox path, writable) of ``path``'s last component, every symlink
        before it (and the last one too if ``follow``) resolved inside the sandbox; ``name`` is ``"."``
        for a root itself. Directories are opened one by one with ``O_NOFOLLOW``; the fd is valid
        inside the ``with`` only (it is closed when it ends)."""
        full = self.normalize(path)
        root = self._root_of(full)
        assert root is not None
        stack = [os.open(root.host, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)]
        names: list[str] = []
        pending = [p for p in full[len(root.target):].split("/") if p]
        hops = 0

        def here(*extra: str) -> str:
            return root.target + "".join("/" + n for n in [*names, *extra])  # type: ignore[union-attr]

        try:
            while True:
                if not pending:
                    yield stack[-1], ".", here(), root.writable
                    return
                comp = pending.pop(0)
                if comp in ("", "."):
                    continue
                if comp == "..":
                    if len(stack) == 1:
                        raise SandboxPathError(f"'{path}' leads outside the sandbox's directories")
                    os.close(stack.pop())
                    names.pop()
                    continue
                last = not pending
                try:
                    st = os.stat(comp, dir_fd=stack[-1], follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        yield stack[-1], comp, here(comp), root.writable
                        return
                    raise _not_found(path) from None
                if stat.S_ISLNK(st.st_mode) and (follow or not last):
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        raise SandboxPathError(f"too many symbolic links in '{path}'", Code.INVALID_ARGUMENT, 400)
                    target = os.readlink(comp, dir_fd=stack[-1])
                    if target.startswith("/"):
                        target_full = posixpath.normpath(target)
                        new_root = self._root_of(target_full)
                        if new_root is None:
                            raise SandboxPathError(f"'{path}' is a link leading outside the sandbox's directories")
                        for fd in stack:
                            os.close(fd)
                        stack = [os.open(new_root.host, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)]
                        names.clear()
                        root = new_root
                        pending = [p for p in target_full[len(root.target):].split("/") if p] + pending
                    else:
                        pending = target.split("/") + pending
                    continue
                if last:
                    yield stack[-1], comp, here(comp), root.writable
                    return
                if not stat.S_ISDIR(st.st_mode):
                    raise SandboxPathError(f"'{path}': not a directory", Code.INVALID_ARGUMENT, 400)
                try:
                    fd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=stack[-1])
                except OSError as exc:  # replaced by a link since the stat: refuse
                    raise SandboxPathError(f"'{path}' changed while being resolved: {exc.strerror}",
                                           Code.ABORTED, 409) from None
                stack.append(fd)
                names.append(comp)
        finally:
            for fd in stack:
                os.close(fd)

    @staticmethod
    def _writable(writable: bool, spath: str) -> None:
        if not writable:
            raise SandboxPathError(f"'{spath}' is read-only")

    # -- entries ---------------------------------------------------------------------------

    def _owner(self, uid: int) -> str:
        return SANDBOX_USER if uid == self.uid else ("root" if uid == 0 else str(uid))

    def _entry(self, dir_fd: int, name: str, spath: str) -> fpb.EntryInfo:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        is_link = stat.S_ISLNK(st.st_mode)
        target: str | None = None
        kind_mode = st.st_mode
        if is_link:
            target = os.readlink(name, dir_fd=dir_fd)
            try:
                with self._parent(spath, follow=True) as (pfd, pname, _, _w):
                    kind_mode = os.stat(pname, dir_fd=pfd, follow_symlinks=False).st_mode
            except (SandboxPathError, OSError):
                kind_mode = st.st_mode
        kind = (fpb.FileType.DIRECTORY if stat.S_ISDIR(kind_mode) else
                fpb.FileType.FILE if stat.S_ISREG(kind_mode) else
                fpb.FileType.SYMLINK if stat.S_ISLNK(kind_mode) else fpb.FileType.UNSPECIFIED)
        entry = fpb.EntryInfo(
            name=posixpath.basename(spath), type=kind, path=spath, size=st.st_size,
            mode=stat.S_IMODE(st.st_mode), permissions=stat.filemode(st.st_mode),
            owner=self._owner(st.st_uid), group=self._owner(st.st_gid),
            modified_time=Timestamp.from_datetime(datetime.fromtimestamp(st.st_mtime, timezone.utc)),
            is_symlink=is_link)
        if target is not None:
            entry.symlink_target = target
        return entry

    def stat(self, path: str) -> fpb.EntryInfo:
        """The entry at ``path`` (a symlink is described as itself, with its target's type)."""
        with self._parent(path, follow=False) as (dfd, name, spath, _):
            try:
                return self._entry(dfd, name, spath)
            except FileNotFoundError:
                raise _not_found(path) from None

    def list_dir(self, path: str, depth: int = 1) -> list[fpb.EntryInfo]:
        """Entries under the directory ``path``, ``depth`` levels deep (1: its children)."""
        if depth < 1:
            depth = 1
        with self._parent(path, follow=True) as (dfd, name, spath, _):
            try:
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            except FileNotFoundError:
                raise _not_found(path) from None
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise SandboxPathError(f"'{path}' is not a directory", Code.INVALID_ARGUMENT, 400) from None
                raise
        out: list[fpb.EntryInfo] = []
        self._list(fd, spath, depth, out)
        return out

    def _list(self, fd: int, spath: str, depth: int, out: list[fpb.EntryInfo]) -> None:
        try:
            for name in sorted(os.listdir(fd)):
                child = f"{spath}/{name}"
                try:
                    entry = self._entry(fd, name, child)
                except FileNotFoundError:
                    continue
                out.append(entry)
                if depth > 1 and entry.type == fpb.FileType.DIRECTORY and not entry.is_symlink:
                    try:
                        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    except OSError:
                        continue
                    self._list(sub, child, depth - 1, out)
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except SandboxPathError as exc:
            if exc.code == Code.NOT_FOUND:
                return False
            raise

    # -- changes ---------------------------------------------------------------------------

    def _chown(self, fd: int) -> None:
        if os.geteuid() == 0:
            os.fchown(fd, self.uid, self.uid)

    def _is_root(self, full: str) -> bool:
        return any(full == r.target for r in self._roots)

    def make_dir(self, path: str) -> tuple[bool, fpb.EntryInfo]:
        """Create ``path`` and missing parents; (created, entry). ``False`` if it already was a directory."""
        full = self.normalize(path)
        root = self._root_of(full)
        assert root is not None
        parts = [p for p in full[len(root.target):].split("/") if p]
        created = False
        for i in range(1, len(parts) + 1):
            prefix = root.target + "/" + "/".join(parts[:i])
            with self._parent(prefix, follow=True) as (dfd, name, spath, writable):
                if name == ".":
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    self._writable(writable, spath)
                    os.mkdir(name, 0o755, dir_fd=dfd)
                    created = True
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
                    try:
                        self._chown(fd)
                    finally:
                        os.close(fd)
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    final = i == len(parts)
                    raise SandboxPathError(f"'{prefix}' exists and is not a directory",
                                           Code.ALREADY_EXISTS if final else Code.INVALID_ARGUMENT,
                                           409 if final else 400)
        return created, self.stat(full)

    def remove(self, path: str) -> None:
        """Delete a file, a symlink (not its target) or a directory tree."""
        full = self.normalize(path)
        if self._is_root(full):
            raise SandboxPathError(f"cannot remove {full} itself", Code.INVALID_ARGUMENT, 400)
        with self._parent(full, follow=False) as (dfd, name, spath, writable):
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                raise _not_found(path) from None
            self._writable(writable, spath)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=dfd)
            else:
                os.unlink(name, dir_fd=dfd)

    def move(self, source: str, destination: str) -> fpb.EntryInfo:
        """Rename ``source`` to ``destination`` (both in the sandbox, on the same mount)."""
        src, dst = self.normalize(source), self.normalize(destination)
        if self._is_root(src) or self._is_root(dst):
            raise SandboxPathError("cannot move a sandbox directory itself", Code.INVALID_ARGUMENT, 400)
        with self._parent(src, follow=False) as (sfd, sname, spath, sw), \
                self._parent(dst, follow=False) as (dfd, dname, dpath, dw):
            self._writable(sw, spath)
            self._writable(dw, dpath)
            try:
                os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            except FileNotFoundError:
                raise _not_found(source) from None
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    raise SandboxPathError(f"cannot move '{source}' to another mount ('{destination}')",
                                           Code.INVALID_ARGUMENT, 400) from None
                raise
        return self.stat(dst)

    def open_write(self, path: str) -> "PendingWrite":
        """Start writing the file ``path`` (parents created): a :class:`PendingWrite` whose ``commit()``
        puts it in place, replacing an existing regular file (its mode kept). Only a regular file is
        ever replaced: a directory, FIFO, socket or device at ``path`` is refused."""
        full = self.normalize(path)
        parent = posixpath.dirname(full)
        if not self._is_root(parent) and self._root_of(parent) is not None:
            self.make_dir(parent)
        with self._parent(full, follow=True) as (dfd, name, spath, writable):
            if name == ".":
                raise SandboxPathError(f"'{path}' is a directory", Code.INVALID_ARGUMENT, 400)
            self._writable(writable, spath)
            try:
                st: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise _not_regular(full, st.st_mode, spath)
            temp = f".rsigym-upload-{secrets.token_hex(8)}"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dfd)
            pending = PendingWrite(os.dup(dfd), temp, name, spath, fd,
                                   stat.S_IMODE(st.st_mode) if st is not None else None)
        try:
            self._chown(fd)
        except BaseException:
            pending.abort()
            raise
        return pending

    def write(self, path: str, chunks: Iterable[bytes]) -> str:
        """Write a file (parents created, an existing regular file replaced); returns its sandbox path."""
        pending = self.open_write(path)
        try:
            for chunk in chunks:
                pending.write(chunk)
            return pending.commit()
        except BaseException:
            pending.abort()
            raise

    def open_read(self, path: str) -> tuple[int, int]:
        """(fd, size) of the regular file at ``path``, opened for reading (the caller closes it).

        Anything else is refused without blocking: it is never opened when its type is known
        beforehand, and opened non-blocking (then checked again) when it changes in between, so a
        FIFO with no writer cannot hold the caller."""
        full = self.normalize(path)
        with self._parent(full, follow=True) as (dfd, name, spath, _w):
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise _not_regular(full, st.st_mode, spath)
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                raise _not_found(path) from None
            except OSError as exc:  # a link (ELOOP) or a socket (ENXIO) swapped in since the stat
                raise SandboxPathError(f"'{full}' changed while being opened: {exc.strerror}",
                                       Code.ABORTED, 409) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise _not_regular(full, st.st_mode, spath)
        return fd, st.st_size

    def read_all(self, path: str) -> bytes:
        """The content of the regular file at ``path``."""
        fd, _ = self.open_read(path)
        with os.fdopen(fd, "rb") as f:
            return f.read()


class PendingWrite:
    """A file being written by :meth:`SandboxFS.open_write`: the data goes to a hidden temporary file
    in the target's directory, which takes the target's name on :meth:`commit` (readers never see
    half a file, and a link or FIFO planted at the name is replaced, never written through) and is
    removed on :meth:`abort`."""

    def __init__(self, dir_fd: int, temp: str, name: str, spath: str, fd: int, mode: int | None) -> None:
        self.dir_fd, self.temp, self.name, self.path, self.fd, self.mode = dir_fd, temp, name, spath, fd, mode
        self.done = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def commit(self) -> str:
        """Put the file in place; its sandbox path."""
        try:
            if self.mode is not None:
                os.fchmod(self.fd, self.mode)
            os.close(self.fd)
            self.fd = -1
            try:
                os.rename(self.temp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            except (IsADirectoryError, NotADirectoryError):
                raise SandboxPathError(f"'{self.path}' is a directory", Code.INVALID_ARGUMENT, 400) from None
        except BaseException:
            self.abort()
            raise
        self.done = True
        os.close(self.dir_fd)
        return self.path

    def abort(self) -> None:
        """Drop what was written (the target is left as it was). Safe to call twice."""
        if self.done:
            return
        self.done = True
        if self.fd >= 0:
            os.close(self.fd)
        try:
            os.unlink(self.temp, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(self.dir_fd)


# --------------------------------------------------------------------------------------------
# process.Process


def _event(kind: str, value: Any) -> ppb.ProcessEvent:
    return ppb.ProcessEvent(event=Oneof(kind, value))


@dataclass
class _Process:
    pid: int
    tag: str | None
    config: ppb.ProcessConfig
    handle: IsolatedProcess | None = None
    subscribers: list[asyncio.Queue[ppb.ProcessEvent]] = field(default_factory=list)
    stdin: bool = False
    watcher: asyncio.Future[None] | None = None  # held so the task is not garbage-collected

    def publish(self, event: ppb.ProcessEvent) -> None:
        for q in list(self.subscribers):
            q.put_nowait(event)


class ProcessService:
    """``process.Process`` over :mod:`.isolation`: one isolated sandbox per started command."""

    def __init__(self, server: "EnvdServer") -> None:
        self.server = server
        self.processes: dict[int, _Process] = {}
        self._pids = itertools.count(1000)

    # -- helpers ---------------------------------------------------------------------------

    def _find(self, selector: ppb.ProcessSelector | None) -> _Process:
        match selector.selector if selector is not None else None:
            case Oneof(field="pid", value=pid):
                proc = self.processes.get(pid)
            case Oneof(field="tag", value=tag):
                proc = next((p for p in self.processes.values() if p.tag == tag), None)
            case _:
                raise ConnectError(Code.INVALID_ARGUMENT, "a process selector (pid or tag) is required")
        if proc is None:
            raise ConnectError(Code.NOT_FOUND, f"process with {selector.selector.field} "  # type: ignore[union-attr]
                                               f"{selector.selector.value} not found")  # type: ignore[union-attr]
        return proc

    @staticmethod
    def _keepalive_s(ctx: RequestContext) -> float:
        try:
            return max(1.0, float(ctx.request_headers.get("keepalive-ping-interval") or 50))
        except ValueError:
            return 50.0

    async def _stream(self, proc: _Process, queue: asyncio.Queue[ppb.ProcessEvent], ctx: RequestContext,
                      wrap: Callable[[ppb.ProcessEvent], Any]) -> AsyncIterator[Any]:
        interval = self._keepalive_s(ctx)
        try:
            yield wrap(_event("start", ppb.ProcessEvent.StartEvent(pid=proc.pid)))
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), interval)
                except asyncio.TimeoutError:
                    yield wrap(_event("keepalive", ppb.ProcessEvent.KeepAlive()))
                    continue
                yield wrap(event)
                if event.event is not None and event.event.field == "end":
                    return
        finally:
            if queue in proc.subscribers:
                proc.subscribers.remove(queue)

    async def _watch(self, proc: _Process) -> None:
        assert proc.handle is not None
        try:
            result = await proc.handle.wait()
            end = ppb.ProcessEvent.EndEvent(
                exit_code=result.exit_code, exited=not result.timed_out,
                status=(f"killed: {result.limit} limit" if result.timed_out else f"exit status {result.exit_code}"))
            if result.limit is not None:  # the runner's note closes stderr: stream it like the output
                note = result.stderr.rstrip("\n").rsplit("\n", 1)[-1]
                proc.publish(_event("data", ppb.ProcessEvent.DataEvent(
                    output=Oneof("stderr", (note + "\n").encode()))))
                end.error = note.removeprefix("[sandbox] ")
        except Exception as exc:  # pragma: no cover - a failure of the runner itself
            log.exception("sandbox command %d failed", proc.pid)
            end = ppb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="error", error=str(exc))
        self.processes.pop(proc.pid, None)
        proc.publish(_event("end", end))

    # -- RPCs ------------------------------------------------------------------------------

    async def start(self, request: ppb.StartRequest, ctx: RequestContext) -> AsyncIterator[ppb.StartResponse]:
        if request.has_field("pty"):
            raise ConnectError(Code.UNIMPLEMENTED, "PTY sessions are not supported by the local envd")
        config = request.process or ppb.ProcessConfig()
        if not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is required")
        timeout_ms = ctx.timeout_ms
        wall = self.server.max_wall_s if not timeout_ms else min(timeout_ms / 1000.0, self.server.max_wall_s)
        limits = dataclasses.replace(self.server.limits, wall_s=wall)
        proc = _Process(pid=next(self._pids), tag=request.tag if request.has_field("tag") else None, config=config,
                        stdin=bool(request.stdin))
        queue: asyncio.Queue[ppb.ProcessEvent] = asyncio.Queue()
        proc.subscribers.append(queue)

        def on_output(stream: str, chunk: bytes) -> None:
            proc.publish(_event("data", ppb.ProcessEvent.DataEvent(output=Oneof(stream, chunk))))

        try:
            proc.handle = await IsolatedProcess.start(
                [config.cmd, *config.args], workdir=self.server.root,
                cwd=config.cwd if config.has_field("cwd") and config.cwd else APP, mounts=self.server.mounts,
                env={**self.server.env, **dict(config.envs)}, network=self.server.network, limits=limits,
                stdin=proc.stdin, require_isolation=self.server.require_isolation, on_output=on_output,
                group=self.server.group)
        except IsolationUnavailable as exc:
            raise ConnectError(Code.FAILED_PRECONDITION, str(exc)) from None
        except (OSError, ValueError) as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, f"cannot start {config.cmd!r}: {exc}") from None
        self.processes[proc.pid] = proc
        proc.watcher = asyncio.ensure_future(self._watch(proc))
        async for item in self._stream(proc, queue, ctx, lambda e: ppb.StartResponse(event=e)):
            yield item

    async def connect(self, request: ppb.ConnectRequest, ctx: RequestContext) -> AsyncIterator[ppb.ConnectResponse]:
        proc = self._find(request.process)
        queue: asyncio.Queue[ppb.ProcessEvent] = asyncio.Queue()
        proc.subscribers.append(queue)
        async for item in self._stream(proc, queue, ctx, lambda e: ppb.ConnectResponse(event=e)):
            yield item

    async def list(self, request: ppb.ListRequest, ctx: RequestContext) -> ppb.ListResponse:
        out = []
        for p in self.processes.values():
            info = ppb.ProcessInfo(config=p.config, pid=p.pid)
            if p.tag is not None:
                info.tag = p.tag
            out.append(info)
        return ppb.ListResponse(processes=out)

    async def _input(self, proc: _Process, data: ppb.ProcessInput | None) -> None:
        match data.input if data is not None else None:
            case Oneof(field="stdin", value=chunk):
                if not proc.stdin or proc.handle is None or not proc.handle.stdin_open:
                    raise ConnectError(Code.FAILED_PRECONDITION,
                                       f"process {proc.pid} has no open stdin (start it with stdin=True)")
                await proc.handle.write(chunk)
            case Oneof(field="pty"):
                raise ConnectError(Code.UNIMPLEMENTED, "PTY input is not supported by the local envd")
            case _:
                raise ConnectError(Code.INVALID_ARGUMENT, "input is required")

    async def send_input(self, request: ppb.SendInputRequest, ctx: RequestContext) -> ppb.SendInputResponse:
        await self._input(self._find(request.process), request.input)
        return ppb.SendInputResponse()

    async def stream_input(self, request: AsyncIterator[ppb.StreamInputRequest],
                           ctx: RequestContext) -> ppb.StreamInputResponse:
        proc: _Process | None = None
        async for message in request:
            match message.event:
                case Oneof(field="start", value=start):
                    proc = self._find(start.process)
                case Oneof(field="data", value=data):
                    if proc is None:
                        raise ConnectError(Code.FAILED_PRECONDITION, "the stream must begin with a start event")
                    await self._input(proc, data.input)
                case _:
                    pass  # keep-alive
        return ppb.StreamInputResponse()

    async def close_stdin(self, request: ppb.CloseStdinRequest, ctx: RequestContext) -> ppb.CloseStdinResponse:
        proc = self._find(request.process)
        if proc.handle is not None:
            await proc.handle.close_stdin()
        return ppb.CloseStdinResponse()

    async def send_signal(self, request: ppb.SendSignalRequest, ctx: RequestContext) -> ppb.SendSignalResponse:
        proc = self._find(request.process)
        if request.signal not in (ppb.Signal.SIGKILL, ppb.Signal.SIGTERM):
            raise ConnectError(Code.INVALID_ARGUMENT, f"unsupported signal {request.signal}")
        if proc.handle is not None:
            proc.handle.kill()  # the whole sandbox of the command goes
        return ppb.SendSignalResponse()

    async def update(self, request: ppb.UpdateRequest, ctx: RequestContext) -> ppb.UpdateResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "PTY sessions are not supported by the local envd")

    def kill_all(self) -> None:
        for proc in list(self.processes.values()):
            if proc.handle is not None:
                proc.handle.kill()


# --------------------------------------------------------------------------------------------
# filesystem.Filesystem


async def _fs_call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread (file I/O never runs on the event loop), errors as Connect's."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except SandboxPathError as exc:
        raise ConnectError(exc.code, str(exc)) from None
    except PermissionError as exc:
        raise ConnectError(Code.PERMISSION_DENIED, str(exc)) from None
    except OSError as exc:
        raise ConnectError(Code.INVALID_ARGUMENT if exc.errno in (errno.ENOTDIR, errno.EISDIR, errno.ENOTEMPTY,
                                                                  errno.EINVAL, errno.ELOOP)
                           else Code.INTERNAL, f"{exc.strerror}") from None


class FilesystemService:
    """``filesystem.Filesystem`` over :class:`SandboxFS` (no watchers)."""

    def __init__(self, fs: SandboxFS) -> None:
        self.fs = fs

    async def stat(self, request: fpb.StatRequest, ctx: RequestContext) -> fpb.StatResponse:
        return fpb.StatResponse(entry=await _fs_call(self.fs.stat, request.path))

    async def make_dir(self, request: fpb.MakeDirRequest, ctx: RequestContext) -> fpb.MakeDirResponse:
        created, entry = await _fs_call(self.fs.make_dir, request.path)
        if not created:
            raise ConnectError(Code.ALREADY_EXISTS, f"directory '{request.path}' already exists")
        return fpb.MakeDirResponse(entry=entry)

    async def move(self, request: fpb.MoveRequest, ctx: RequestContext) -> fpb.MoveResponse:
        return fpb.MoveResponse(entry=await _fs_call(self.fs.move, request.source, request.destination))

    async def list_dir(self, request: fpb.ListDirRequest, ctx: RequestContext) -> fpb.ListDirResponse:
        return fpb.ListDirResponse(entries=await _fs_call(self.fs.list_dir, request.path, request.depth or 1))

    async def remove(self, request: fpb.RemoveRequest, ctx: RequestContext) -> fpb.RemoveResponse:
        await _fs_call(self.fs.remove, request.path)
        return fpb.RemoveResponse()

    def watch_dir(self, request: fpb.WatchDirRequest, ctx: RequestContext) -> AsyncIterator[fpb.WatchDirResponse]:
        raise ConnectError(Code.UNIMPLEMENTED, "directory watching is not supported by the local envd")

    async def create_watcher(self, request: fpb.CreateWatcherRequest, ctx: RequestContext) -> fpb.CreateWatcherResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "directory watching is not supported by the local envd")

    async def get_watcher_events(self, request: fpb.GetWatcherEventsRequest,
                                 ctx: RequestContext) -> fpb.GetWatcherEventsResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "directory watching is not supported by the local envd")

    async def remove_watcher(self, request: fpb.RemoveWatcherRequest, ctx: RequestContext) -> fpb.RemoveWatcherResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "directory watching is not supported by the local envd")


# --------------------------------------------------------------------------------------------
# HTTP: /health, /files


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


_CONNECT_CODES = {400: Code.INVALID_ARGUMENT, 413: Code.RESOURCE_EXHAUSTED, 415: Code.UNIMPLEMENTED}


def _connect_error(status: int, message: str) -> JSONResponse:
    """A Connect error body (``{"code": "resource_exhausted", "message"}``) with the HTTP ``status``."""
    code = _CONNECT_CODES.get(status, Code.UNKNOWN)
    return JSONResponse({"code": code.name.lower(), "message": message}, status_code=status)


class _OpenFile:
    """An fd closed exactly once, whoever gets there first (the end of the stream, or the response's
    background task when the client left before the stream began)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


async def _read_chunks(file: _OpenFile, size: int) -> AsyncIterator[bytes]:
    """The first ``size`` bytes of ``file``, read in worker threads (closed at the end). A file that
    shrank meanwhile cuts the response (its ``Content-Length`` was promised)."""
    try:
        left = size
        while left > 0:
            chunk = await anyio.to_thread.run_sync(os.read, file.fd, min(READ_CHUNK, left))
            if not chunk:
                raise ResponseAborted(f"the file shrank while it was sent ({size - left:,} of {size:,} bytes sent)")
            left -= len(chunk)
            yield chunk
    finally:
        file.close()


async def _write_stream(fs: SandboxFS, path: str, stream: AsyncIterator[bytes]) -> str:
    """Write the file ``path`` from ``stream``, in worker threads and in pieces of ``WRITE_CHUNK``;
    nothing is left behind if the stream fails (client gone, body over the limit)."""
    pending = await anyio.to_thread.run_sync(fs.open_write, path)
    try:
        buffer = bytearray()
        async for chunk in stream:
            buffer += chunk
            if len(buffer) >= WRITE_CHUNK:
                await anyio.to_thread.run_sync(pending.write, bytes(buffer))
                buffer.clear()
        if buffer:
            await anyio.to_thread.run_sync(pending.write, bytes(buffer))
        return await anyio.to_thread.run_sync(pending.commit)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(pending.abort)
        raise


def _file_chunks(upload: UploadFile) -> Iterator[bytes]:
    """The content of a multipart part (a spooled temporary file), read from a worker thread."""
    upload.file.seek(0)
    while chunk := upload.file.read(WRITE_CHUNK):
        yield chunk


def create_http_app(fs: SandboxFS, max_upload_bytes: int = MAX_UPLOAD_BYTES) -> Starlette:
    """``/health`` and ``/files`` of envd for the sandbox directory of ``fs``; an upload is at most
    ``max_upload_bytes`` (decoded), else 413."""

    async def health(request: Request) -> Response:
        return Response(status_code=204)

    def _write_info(spath: str) -> dict[str, str]:
        return {"name": posixpath.basename(spath), "type": "file", "path": spath}

    async def read_file(request: Request) -> Response:
        path = request.query_params.get("path")
        if not path:
            return _error(400, "the 'path' query parameter is required")
        try:
            fd, size = await anyio.to_thread.run_sync(fs.open_read, path)
        except SandboxPathError as exc:
            return _error(exc.status, str(exc))
        name = urllib.parse.quote(posixpath.basename(path))
        file = _OpenFile(fd)
        return StreamingResponse(_read_chunks(file, size), media_type="application/octet-stream",
                                 headers={"Content-Length": str(size),
                                          "Content-Disposition": f"inline; filename*=UTF-8''{name}"},
                                 background=BackgroundTask(file.close))

    async def write_file(request: Request) -> Response:
        if any(k.lower().startswith("x-metadata-") for k in request.headers):
            return _error(400, "file metadata is not supported by the local envd")
        ctype = request.headers.get("content-type", "")
        path = request.query_params.get("path")
        try:
            if ctype.startswith("multipart/form-data"):
                form = await request.form(max_files=MAX_UPLOAD_FILES, max_fields=MAX_UPLOAD_FILES)
                try:
                    parts = [item for key, item in form.multi_items() if key == "file"]
                    if any(not isinstance(p, UploadFile) or not p.filename for p in parts):
                        return _error(400, "cannot read the upload: a file part has no file name")
                    files = [(p.filename, p) for p in parts if isinstance(p, UploadFile) and p.filename]
                    if path and len(files) == 1:
                        files = [(path, files[0][1])]
                    if not files:
                        return _error(400, "no file in the upload")
                    infos = [_write_info(await anyio.to_thread.run_sync(fs.write, name, _file_chunks(part)))
                             for name, part in files]
                finally:
                    await form.close()
                return JSONResponse(infos)
            if not path:
                return _error(400, "the 'path' query parameter is required")
            return JSONResponse([_write_info(await _write_stream(fs, path, request.stream()))])
        except SandboxPathError as exc:
            return _error(exc.status, str(exc))
        except HTTPException as exc:  # a malformed multipart body
            return _error(exc.status_code, f"cannot read the upload: {exc.detail}")
        except OSError as exc:
            return _error(507 if exc.errno == errno.ENOSPC else 500, exc.strerror or str(exc))

    return Starlette(routes=[Route("/health", health, methods=["GET"]),
                             Route("/files", read_file, methods=["GET"]),
                             Route("/files", write_file, methods=["POST"])],
                     middleware=[Middleware(BodyLimitMiddleware, max_bytes=max_upload_bytes, error=_error)])


# --------------------------------------------------------------------------------------------
# The server


def _is_stream(scope: dict) -> bool:
    """A Connect/gRPC streaming request (its messages are enveloped and limited one by one)."""
    for key, value in scope.get("headers", ()):
        if key == b"content-type":
            return value.startswith((b"application/connect+", b"application/grpc"))
    return False


def create_app(server: "EnvdServer") -> ASGIApp:
    """One ASGI app: Connect-RPC by path prefix, the rest to the Starlette HTTP app.

    Sizes: a Connect message is at most ``server.max_message_bytes`` (a unary request's whole
    body, decoded; each message of a stream), an upload to ``/files`` ``server.max_upload_bytes``."""
    codecs = [proto_binary_codec(), ENVD_JSON_CODEC]
    limit = server.max_message_bytes
    process_app = process_connect.ProcessASGIApplication(server.process, codecs=codecs, read_max_bytes=limit)
    fs_app = filesystem_connect.FilesystemASGIApplication(FilesystemService(server.fs), codecs=codecs,
                                                          read_max_bytes=limit)
    unary = {app: BodyLimitMiddleware(app, limit, error=_connect_error) for app in (process_app, fs_app)}
    http_app = create_http_app(server.fs, server.max_upload_bytes)

    async def app(scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        path = scope.get("path", "")
        rpc = process_app if path.startswith("/process.Process/") else \
            fs_app if path.startswith("/filesystem.Filesystem/") else None
        if rpc is None:
            await http_app(scope, receive, send)
        elif _is_stream(scope):
            await rpc(scope, receive, send)  # type: ignore[arg-type]
        else:
            await unary[rpc](scope, receive, send)  # type: ignore[arg-type]

    return app


class EnvdServer(HTTPServing):
    """An envd for the sandbox directory ``root`` on ``host:port`` (``port=0``: a free one), in a thread.

    ``url`` is what the SDK's ``sandbox_url`` takes. ``network``, ``limits``, ``mounts`` and ``env``
    apply to every command (``limits.wall_s`` is replaced by each command's ``timeout``, at most
    ``max_wall_s``). An upload to ``/files`` is at most ``max_upload_bytes`` and a Connect-RPC
    message ``max_message_bytes`` (decoded sizes; more is a 413). ``stop()`` (or leaving the
    ``with``) kills running commands. ``group`` (a :class:`~.isolation.SandboxGroup` owning ``root``)
    bounds the memory, processes and disk of all commands together; its owner closes it.
    """

    def __init__(self, root: Path, *, host: str = "127.0.0.1", port: int = 0, network: bool = False,
                 limits: Limits = Limits(), mounts: Sequence[Mount] = (), env: Mapping[str, str] | None = None,
                 require_isolation: bool = True, max_wall_s: float = 3600.0, log_level: str = "warning",
                 max_upload_bytes: int = MAX_UPLOAD_BYTES, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 group: SandboxGroup | None = None) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.group = group
        uid = group.uid if group is not None else sandbox_uid(self.root)
        claim(self.root, uid)
        self.host = host
        self.network = network
        self.limits = limits
        self.mounts = tuple(mounts)
        self.env = dict(env or {})
        self.require_isolation = require_isolation
        self.max_wall_s = max_wall_s
        self.log_level = log_level
        self.max_upload_bytes = max_upload_bytes
        self.max_message_bytes = max_message_bytes
        self.fs = SandboxFS(self.root, uid=uid, mounts=self.mounts)
        self.process = ProcessService(self)
        self.app = create_app(self)
        self._http = ThreadedASGIServer(self.app, host=host, port=port, name="envd", log_level=log_level,
                                        graceful_s=1, keep_alive_s=30)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Kill running commands, stop serving and free the port. Safe to call twice."""
        self.process.kill_all()
        super().stop(timeout_s)


def health(url: str, timeout_s: float = 2.0) -> bool:
    """True if an envd answers ``GET /health`` at ``url``."""
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=timeout_s).status_code in (200, 204)
    except httpx.HTTPError:
        return False


__all__ = ["ENVD_PORT", "EnvdServer", "FilesystemService", "PendingWrite", "ProcessService", "SandboxFS",
           "SandboxPathError", "create_app", "create_http_app", "health"]
