"""Run untrusted commands in a bubblewrap sandbox with limits (the local world's isolation layer).

A sandbox sees its host directory ``workdir`` as ``/app`` (writable, the default cwd), the host's
programs read-only (``/usr`` and the ``/bin``, ``/lib*`` links, a few ``/etc`` files, the Python
installs under ``/root/.pyenv/versions``), a fresh ``/tmp``, ``/proc`` and a minimal ``/dev``, plus any extra
:class:`Mount`. Nothing else of the host exists inside: not ``/root``, ``/work``, ``/home``, the
host's ``/tmp`` nor any run directory. With ``network=False`` the sandbox has its own network
namespace holding only a loopback device. It has its own PID namespace, runs in a new session and
dies with its parent; on a wall-clock timeout the whole sandbox is killed.

Limits (:class:`Limits`) are resource limits set inside the sandbox just before the command runs:
``RLIMIT_AS`` (memory), ``RLIMIT_CPU`` (CPU seconds per process; SIGXCPU, then SIGKILL a second
later), ``RLIMIT_NPROC`` (processes), ``RLIMIT_FSIZE`` (largest file written), no core dumps;
output is read up to ``output_bytes`` per stream and the rest discarded (``truncated``). The
kernel does not apply ``RLIMIT_NPROC`` to root, so when this runs as root the command drops to an
unprivileged uid of its own (:func:`sandbox_uid`, stable per ``workdir``, owning ``workdir`` and
the writable mounts; see :func:`claim`), with no capabilities and ``no_new_privs``. Run as an
ordinary user, bubblewrap puts the sandbox in a user namespace and the limit binds as it is.

A limit that ended or cut a command is named in :attr:`ExecResult.limit` and in a line
``[sandbox] ... limit ...`` appended to ``stderr``. ``wall`` and ``output`` are exact (we enforce
them); ``cpu`` and ``file`` come from the signal that killed the command; ``memory`` and
``processes`` are recognised from the failure messages programs print when an allocation or a
fork is refused (``MemoryError``, ``Cannot allocate memory``, ``Cannot fork``,
``Resource temporarily unavailable``...), since the kernel does not report rlimit hits.

>>> import tempfile
>>> from pathlib import Path
>>> app = Path(tempfile.mkdtemp())
>>> r = run_isolated("echo hi > greeting; cat greeting; pwd", workdir=app, require_isolation=False)
>>> r.stdout.splitlines()[0], r.exit_code
('hi', 0)
>>> (app / "greeting").read_text()
'hi\\n'
"""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Literal, Mapping, Sequence

log = logging.getLogger("rsigym_env.isolation")

LimitName = Literal["wall", "cpu", "memory", "processes", "output", "file"]

APP = "/app"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_ENV: dict[str, str] = {"PATH": DEFAULT_PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
INSTALL_HINT = ("bubblewrap (bwrap) is required to isolate sandbox commands: install it with "
                "`apt-get install -y bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` or "
                "`apk add bubblewrap`, or run `make setup` as root")
# Host paths shown read-only inside every sandbox (those that exist).
SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt/conda", "/root/.pyenv/versions")
ETC_RO = ("alternatives", "ca-certificates", "ca-certificates.conf", "ssl", "ld.so.cache", "ld.so.conf",
          "ld.so.conf.d", "localtime", "timezone", "nsswitch.conf", "host.conf", "gai.conf", "hosts",
          "resolv.conf", "protocols", "services", "networks", "mime.types", "magic", "magic.mime",
          "os-release", "debian_version", "python3", "python3.11", "python3.12", "shells", "bash.bashrc",
          "inputrc", "terminfo", "login.defs", "pip.conf")  # not profile: `bash -l` would reset PATH
# Unprivileged uids for sandboxes when we run as root (RLIMIT_NPROC counts processes per uid).
UID_BASE = 1 << 20
UID_SPAN = 1 << 18
SANDBOX_USER = "sandbox"
WALL_EXIT = 124  # exit code reported for a command killed at the wall-clock limit (as timeout(1))
_SIGXCPU, _SIGXFSZ = int(signal.SIGXCPU), int(signal.SIGXFSZ)
_MEMORY_RE = re.compile(rb"MemoryError|Cannot allocate memory|std::bad_alloc|[Oo]ut of memory|memory exhausted"
                        rb"|xmalloc: cannot allocate|mmap\(\) failed|failed to allocate")
_FORK_RE = re.compile(rb"Cannot fork|fork: retry|fork: Resource temporarily unavailable|can't fork"
                      rb"|Resource temporarily unavailable|\[Errno 11\]|pthread_create failed|can't start new thread")


@dataclass(frozen=True)
class Limits:
    """Resource limits of one command. Defaults suit a benchmark trial.

    >>> Limits(wall_s=5).memory_mb
    1024
    """

    wall_s: float = 60.0          # wall-clock seconds; the whole sandbox is killed after
    cpu_s: int = 60               # CPU seconds per process (RLIMIT_CPU)
    memory_mb: int = 1024         # address space per process (RLIMIT_AS)
    processes: int = 128          # processes + threads of the sandbox's uid (RLIMIT_NPROC)
    output_bytes: int = 1 << 20   # bytes kept of stdout and of stderr (each); the rest is discarded
    file_mb: int = 256            # largest file the command may write (RLIMIT_FSIZE)


@dataclass(frozen=True)
class Mount:
    """A host path shown inside the sandbox at ``target`` (a file, a directory or a unix socket).

    Missing parents of ``target`` are created (mode 0755) in the sandbox. When running as root, a
    writable mount is given to the sandbox's uid (:func:`claim`) and a unix socket is made
    connectable by any user (mode ``o+rw``), since the sandbox runs as an unprivileged uid.

    >>> Mount(Path("/srv/harness"), "/harness").writable
    False
    """

    host: Path
    target: str
    writable: bool = False


@dataclass(frozen=True)
class ExecResult:
    """A finished command. ``limit`` names the limit that ended or cut it (``None`` if none did)."""

    stdout: str
    stderr: str
    exit_code: int
    duration_s: float
    timed_out: bool = False
    truncated: bool = False
    limit: str | None = None   # "wall" | "cpu" | "memory" | "processes" | "output" | "file"
    isolated: bool = True


class IsolationUnavailable(RuntimeError):
    """bubblewrap is missing or does not work here (the message says how to install it)."""


# --------------------------------------------------------------------------------------------
# Capabilities of this machine


def _bwrap() -> str | None:
    return shutil.which("bwrap") or (("/usr/bin/bwrap") if os.access("/usr/bin/bwrap", os.X_OK) else None)


@lru_cache(maxsize=1)
def _bwrap_works() -> tuple[bool, str]:
    path = _bwrap()
    if path is None:
        return False, "bwrap not found"
    argv = [path, "--die-with-parent", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc",
            "--dev", "/dev", "--", "/bin/true"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap failed to run: {exc}"
    if proc.returncode != 0:
        return False, f"bwrap does not work here: {proc.stderr.decode(errors='replace').strip()}"
    return True, ""


def bwrap_available() -> bool:
    """True if bubblewrap is installed and can create namespaces here (checked once per process).

    >>> isinstance(bwrap_available(), bool)
    True
    """
    return _bwrap_works()[0]


@lru_cache(maxsize=1)
def _system_paths() -> tuple[str, ...]:
    """:data:`SYSTEM_RO` plus this interpreter's installation when it lives elsewhere (e.g. a CI tool
    cache), unless that is under a directory that must stay hidden."""
    extra = []
    base = os.path.realpath(sys.base_prefix)
    hidden = ("/tmp", "/work", "/home", "/root", "/var", "/run", "/srv", "/mnt", "/media")
    covered = any(base == p or base.startswith(p + "/") for p in SYSTEM_RO)
    if not covered and base != "/" and not any(base == h or base.startswith(h + "/") for h in hidden):
        extra.append(base)
    return (*SYSTEM_RO, *extra)


def _as_root() -> bool:
    return os.geteuid() == 0


def sandbox_uid(workdir: Path) -> int:
    """The uid commands in ``workdir``'s sandbox run as.

    Not root: our own uid (bubblewrap maps it in a user namespace). Root: an unprivileged uid of the
    sandbox's own, stable for a directory (the one that already owns ``workdir``, else one derived
    from its path), so a sandbox's process limit is not shared with other sandboxes.

    >>> sandbox_uid(Path("/nonexistent/x")) == sandbox_uid(Path("/nonexistent/x"))
    True
    """
    if not _as_root():
        return os.geteuid()
    try:
        owner = os.stat(workdir).st_uid
    except OSError:
        owner = -1
    if UID_BASE <= owner < UID_BASE + UID_SPAN:
        return owner
    return UID_BASE + zlib.crc32(os.path.realpath(workdir).encode()) % UID_SPAN


def claim(path: Path, uid: int) -> None:
    """Make ``uid`` own ``path`` and everything under it (not following symlinks); a no-op unless root.

    Files the host puts into a sandbox's directory (uploads, task files) must be claimed before a
    command can change them; :func:`run_isolated` claims ``workdir`` and writable mounts itself.
    """
    if not _as_root():
        return
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if st.st_uid != uid:
        os.lchown(path, uid, uid)
    if not stat.S_ISDIR(st.st_mode):
        return
    stack = [str(path)]
    while stack:  # entries may vanish meanwhile (a command of the sandbox runs concurrently): skip them
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        est = entry.stat(follow_symlinks=False)
                        if est.st_uid != uid:
                            os.lchown(entry.path, uid, uid)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISDIR(est.st_mode):
                        stack.append(entry.path)
        except (FileNotFoundError, NotADirectoryError):
            continue


def _open_socket(path: Path) -> None:
    """Let any user connect to the unix socket ``path`` (connecting needs write permission; as root the
    sandbox runs as another uid). A no-op for other files and when not root."""
    if not _as_root():
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISSOCK(st.st_mode) and st.st_mode & 0o006 != 0o006:
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o006)


@lru_cache(maxsize=64)
def _identity_files(uid: int) -> tuple[str, str]:
    """(passwd, group) files naming the sandbox user, so tools that look the user up work."""
    root = Path(tempfile.gettempdir()) / "rsigym-isolation"
    root.mkdir(mode=0o755, exist_ok=True)
    out = []
    for name, text in (("passwd", f"root:x:0:0:root:/root:/bin/sh\n{SANDBOX_USER}:x:{uid}:{uid}::/tmp:/bin/sh\n"
                                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
                       ("group", f"root:x:0:\n{SANDBOX_USER}:x:{uid}:\nnogroup:x:65534:\n")):
        path = root / f"{name}-{uid}"
        if not path.exists() or path.read_text() != text:
            tmp = root / f".{name}-{uid}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text(text)
            tmp.chmod(0o644)
            os.replace(tmp, path)
        out.append(str(path))
    return out[0], out[1]


# --------------------------------------------------------------------------------------------
# Command lines


def _shell(command: str | Sequence[str]) -> list[str]:
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    argv = [str(a) for a in command]
    if not argv:
        raise ValueError("empty command")
    return argv


def _rlimits(limits: Limits) -> list[str]:
    mem = limits.memory_mb << 20
    fsize = limits.file_mb << 20
    return ["prlimit", f"--as={mem}:{mem}", f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
            f"--nproc={limits.processes}:{limits.processes}", f"--fsize={fsize}:{fsize}", "--core=0:0", "--"]


def _target(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"mount target must be absolute: {path!r}")
    norm = os.path.normpath(path)
    if norm in ("/", "/proc", "/dev", "/usr", "/etc", "/bin", "/lib", "/lib64", "/tmp") or ".." in norm.split("/"):
        raise ValueError(f"cannot mount over {path!r}")
    return norm


def _sandbox_cwd(cwd: str) -> str:
    return os.path.normpath(cwd if cwd.startswith("/") else f"{APP}/{cwd}")


def isolated_argv(command: str | Sequence[str], *, workdir: Path, cwd: str = APP, mounts: Sequence[Mount] = (),
                  env: Mapping[str, str] | None = None, network: bool = False, limits: Limits = Limits(),
                  uid: int | None = None) -> list[str]:
    """The bubblewrap command line that runs ``command`` in a sandbox (``str``: under ``/bin/sh -c``).

    The environment is exactly :data:`DEFAULT_ENV` updated with ``env``. Pure: it neither checks
    that bwrap works (:func:`bwrap_available`) nor claims ``workdir`` (:func:`claim`); the caller
    kills the sandbox at ``limits.wall_s`` and caps the output. ``uid`` (root only) overrides
    :func:`sandbox_uid`.

    >>> argv = isolated_argv("ls", workdir=Path("/srv/sb1"))
    >>> argv[0].endswith("bwrap"), "--unshare-net" in argv, argv[-3:]
    (True, True, ['/bin/sh', '-c', 'ls'])
    """
    bwrap = _bwrap() or "bwrap"
    workdir = Path(workdir).resolve()
    argv = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox"]
    if not network:
        argv.append("--unshare-net")
    # Directories bwrap would otherwise create with the mode of their host counterpart (/root: 0700).
    argv += ["--perms", "0755", "--dir", "/etc", "--perms", "0755", "--dir", "/root"]
    for path in _system_paths():
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for name in ETC_RO:
        path = f"/etc/{name}"
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    user = sandbox_uid(workdir) if uid is None else uid
    passwd, group = _identity_files(user)
    argv += ["--ro-bind", passwd, "/etc/passwd", "--ro-bind", group, "/etc/group"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(limits.file_mb << 20), "--tmpfs", "/tmp",
             "--bind", str(workdir), APP]
    made = {"/", "/etc", "/root", "/tmp", "/proc", "/dev", APP}
    system = _system_paths()
    for m in mounts:
        target = _target(m.target)
        # parents bwrap would create with mode 0700 (unreachable for the sandbox user): make them 0755
        chain, parent = [], posixpath.dirname(target)
        while parent not in made and not any(parent == p or parent.startswith(p + "/") for p in (*system, APP)):
            chain.append(parent)
            parent = posixpath.dirname(parent)
        for d in reversed(chain):
            argv += ["--perms", "0755", "--dir", d]
            made.add(d)
        argv += ["--bind" if m.writable else "--ro-bind", str(Path(m.host).resolve()), target]
    argv += ["--chdir", _sandbox_cwd(cwd), "--clearenv"]
    for key, value in {**DEFAULT_ENV, **(env or {})}.items():
        argv += ["--setenv", key, str(value)]
    argv += ["--"] + _rlimits(limits)
    if _as_root():
        argv += ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--inh-caps=-all",
                 "--bounding-set=-all", "--no-new-privs", "--"]
    return argv + _shell(command)


def _unisolated_argv(command: str | Sequence[str], limits: Limits) -> list[str]:
    prefix = _rlimits(limits) if shutil.which("prlimit") else []
    return prefix + _shell(command)


def _unisolated_cwd(workdir: Path, cwd: str) -> str:
    """Best effort without bwrap: ``/app/...`` maps to ``workdir/...``."""
    path = _sandbox_cwd(cwd)
    if path == APP or path.startswith(APP + "/"):
        return str(Path(workdir) / path[len(APP) + 1:])
    return path


# --------------------------------------------------------------------------------------------
# Running


@dataclass
class _Prepared:
    argv: list[str]
    cwd: str | None
    env: dict[str, str] | None
    isolated: bool


def _prepare(command: str | Sequence[str], workdir: Path, cwd: str, mounts: Sequence[Mount],
             env: Mapping[str, str] | None, network: bool, limits: Limits, require_isolation: bool,
             uid: int | None) -> _Prepared:
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise FileNotFoundError(f"sandbox directory does not exist: {workdir}")
    ok, why = _bwrap_works()
    if ok:
        user = sandbox_uid(workdir) if uid is None else uid
        claim(workdir, user)
        for m in mounts:
            if m.writable:
                claim(Path(m.host), user)
            _open_socket(Path(m.host))
        argv = isolated_argv(command, workdir=workdir, cwd=cwd, mounts=mounts, env=env, network=network,
                             limits=limits, uid=user)
        return _Prepared(argv, None, {}, True)
    if require_isolation:
        raise IsolationUnavailable(f"{why}. {INSTALL_HINT}")
    log.warning("!!! sandbox NOT isolated (%s): running %r directly on the host with rlimits only. %s",
                why, command, INSTALL_HINT)
    return _Prepared(_unisolated_argv(command, limits), _unisolated_cwd(workdir, cwd),
                     {**os.environ, **DEFAULT_ENV, **(env or {})}, False)


def _classify(out: bytes, err: bytes, code: int, killed_wall: bool, truncated: bool,
              limits: Limits) -> tuple[str | None, str]:
    """(limit, note) for a finished command."""
    if killed_wall:
        return "wall", f"wall-clock limit ({limits.wall_s:g} s) reached: the sandbox was killed"
    if code in (128 + _SIGXCPU, -_SIGXCPU) or b"CPU time limit exceeded" in err:
        return "cpu", f"CPU time limit ({limits.cpu_s} s) reached: the command was killed"
    if code in (128 + _SIGXFSZ, -_SIGXFSZ) or b"File size limit exceeded" in err:
        return "file", f"file size limit ({limits.file_mb} MB) reached"
    if _FORK_RE.search(err):
        return "processes", f"process limit ({limits.processes}) reached: a fork or thread was refused"
    if code != 0 and _MEMORY_RE.search(err):
        return "memory", f"memory limit ({limits.memory_mb} MB) reached: an allocation was refused"
    if truncated:
        return "output", f"output limit ({limits.output_bytes} bytes per stream) reached: the rest was discarded"
    return None, ""


def _result(out: bytes, err: bytes, code: int, duration: float, killed_wall: bool, truncated: bool,
            limits: Limits, isolated: bool) -> ExecResult:
    limit, note = _classify(out, err, code, killed_wall, truncated, limits)
    text = err.decode("utf-8", errors="replace")
    if note:
        text += ("" if not text or text.endswith("\n") else "\n") + f"[sandbox] {note}\n"
    return ExecResult(stdout=out.decode("utf-8", errors="replace"), stderr=text,
                      exit_code=WALL_EXIT if killed_wall else code, duration_s=duration, timed_out=killed_wall,
                      truncated=truncated, limit=limit, isolated=isolated)


def _kill(proc_pid: int) -> None:
    try:
        os.killpg(proc_pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _returncode(code: int) -> int:
    """A signal death of the outermost process as a shell would report it (128 + signal)."""
    return 128 - code if code < 0 else code


def run_isolated(command: str | Sequence[str], *, workdir: Path, cwd: str = APP, mounts: Sequence[Mount] = (),
                 env: Mapping[str, str] | None = None, network: bool = False, limits: Limits = Limits(),
                 stdin: bytes | None = None, require_isolation: bool = True, uid: int | None = None) -> ExecResult:
    """Run ``command`` in a fresh sandbox over ``workdir`` and wait for it (see the module docstring).

    Raises :class:`IsolationUnavailable` if bubblewrap does not work here and ``require_isolation``;
    otherwise it then runs the command on the host with rlimits only, logs a loud warning and
    returns ``isolated=False``.
    """
    prep = _prepare(command, workdir, cwd, mounts, env, network, limits, require_isolation, uid)
    start = time.monotonic()
    proc = subprocess.Popen(prep.argv, cwd=prep.cwd, env=prep.env, start_new_session=True,
                            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    bufs: dict[int, bytearray] = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}  # type: ignore[union-attr]
    truncated = killed = False
    deadline = start + limits.wall_s
    sel = selectors.DefaultSelector()
    try:
        for f in (proc.stdout, proc.stderr):
            os.set_blocking(f.fileno(), False)  # type: ignore[union-attr]
            sel.register(f, selectors.EVENT_READ)  # type: ignore[arg-type]
        pending_in = memoryview(stdin) if stdin else None
        if pending_in is not None:
            os.set_blocking(proc.stdin.fileno(), False)  # type: ignore[union-attr]
            sel.register(proc.stdin, selectors.EVENT_WRITE)  # type: ignore[arg-type]
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                killed = True
                _kill(proc.pid)
                break
            for key, _ in sel.select(min(left, 1.0)):
                fd = key.fd
                if key.fileobj is proc.stdin:
                    try:
                        pending_in = pending_in[os.write(fd, pending_in[:65536]):]  # type: ignore[index]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:
                        pending_in = None
                    if not pending_in:
                        sel.unregister(key.fileobj)
                        proc.stdin.close()  # type: ignore[union-attr]
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[fd]
                room = limits.output_bytes - len(buf)
                if len(chunk) > room:
                    truncated = True
                    chunk = chunk[:max(room, 0)]
                buf += chunk
        remaining = max(deadline - time.monotonic(), 0.0)
        try:
            code = proc.wait(timeout=remaining if not killed else 5.0)
        except subprocess.TimeoutExpired:
            killed = True
            _kill(proc.pid)
            code = proc.wait(5.0)
    finally:
        sel.close()
        if proc.poll() is None:
            _kill(proc.pid)
            proc.wait(5.0)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                f.close()
    duration = time.monotonic() - start
    out, err = (bytes(b) for b in bufs.values())
    return _result(out, err, _returncode(code), duration, killed, truncated, limits, prep.isolated)


OutputCallback = Callable[[str, bytes], None]


class IsolatedProcess:
    """A command running in a sandbox, for asyncio callers that need more than the final result.

    ``start`` launches it (same arguments as :func:`run_isolated`, plus ``stdin=True`` for a pipe
    to feed with :meth:`write` / :meth:`close_stdin`, and ``on_output(stream, chunk)`` called with
    each piece of kept output, ``stream`` being ``"stdout"`` or ``"stderr"``); :meth:`wait` gives
    the :class:`ExecResult`; :meth:`kill` ends the whole sandbox. The wall-clock limit runs from
    the start.

    >>> import asyncio, tempfile
    >>> async def demo():
    ...     p = await IsolatedProcess.start("cat", workdir=Path(tempfile.mkdtemp()), stdin=True,
    ...                                     require_isolation=False)
    ...     await p.write(b"ping")
    ...     await p.close_stdin()
    ...     return (await p.wait()).stdout
    >>> asyncio.run(demo())
    'ping'
    """

    def __init__(self, proc: asyncio.subprocess.Process, limits: Limits, isolated: bool,
                 on_output: OutputCallback | None) -> None:
        self._proc = proc
        self.limits = limits
        self.isolated = isolated
        self.pid: int = proc.pid
        self.started = time.monotonic()
        self._on_output = on_output
        self._killed_wall = False
        self._truncated = False
        self._result: ExecResult | None = None
        self._bufs = {"stdout": bytearray(), "stderr": bytearray()}
        self._readers = [asyncio.ensure_future(self._read(proc.stdout, "stdout")),  # type: ignore[arg-type]
                         asyncio.ensure_future(self._read(proc.stderr, "stderr"))]  # type: ignore[arg-type]
        self._timer = asyncio.get_running_loop().call_later(limits.wall_s, self._wall)
        self._done = asyncio.ensure_future(self._finish())

    @classmethod
    async def start(cls, command: str | Sequence[str], *, workdir: Path, cwd: str = APP,
                    mounts: Sequence[Mount] = (), env: Mapping[str, str] | None = None, network: bool = False,
                    limits: Limits = Limits(), stdin: bytes | bool | None = None, require_isolation: bool = True,
                    uid: int | None = None, on_output: OutputCallback | None = None) -> "IsolatedProcess":
        """Launch ``command`` (raises :class:`IsolationUnavailable` like :func:`run_isolated`)."""
        prep = _prepare(command, workdir, cwd, mounts, env, network, limits, require_isolation, uid)
        proc = await asyncio.create_subprocess_exec(
            *prep.argv, cwd=prep.cwd, env=prep.env, start_new_session=True,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self = cls(proc, limits, prep.isolated, on_output)
        if isinstance(stdin, (bytes, bytearray)):
            await self.write(bytes(stdin))
            await self.close_stdin()
        return self

    @property
    def stdin_open(self) -> bool:
        """True while the command has a stdin pipe that is not closed."""
        return self._proc.stdin is not None and not self._proc.stdin.is_closing()

    @property
    def running(self) -> bool:
        return self._result is None

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin (ignored once the command stopped reading)."""
        if not self.stdin_open:
            raise RuntimeError("the command has no open stdin")
        try:
            self._proc.stdin.write(data)  # type: ignore[union-attr]
            await self._proc.stdin.drain()  # type: ignore[union-attr]
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def close_stdin(self) -> None:
        """Signal end of input."""
        if self.stdin_open:
            self._proc.stdin.close()  # type: ignore[union-attr]
            try:
                await self._proc.stdin.wait_closed()  # type: ignore[union-attr]
            except (BrokenPipeError, ConnectionResetError):
                pass

    def kill(self) -> None:
        """Kill the sandbox and everything in it (safe to call twice or after the end)."""
        if self._proc.returncode is None:
            _kill(self._proc.pid)

    def _wall(self) -> None:
        if self._proc.returncode is None:
            self._killed_wall = True
            self.kill()

    async def _read(self, stream: asyncio.StreamReader, name: str) -> None:
        buf = self._bufs[name]
        cap = self.limits.output_bytes
        while chunk := await stream.read(65536):
            room = cap - len(buf)
            if len(chunk) > room:
                self._truncated = True
                chunk = chunk[:max(room, 0)]
            if chunk:
                buf += chunk
                if self._on_output is not None:
                    self._on_output(name, chunk)

    async def _finish(self) -> ExecResult:
        try:
            await asyncio.gather(*self._readers)
            code = await self._proc.wait()
        finally:
            self._timer.cancel()
        self._result = _result(bytes(self._bufs["stdout"]), bytes(self._bufs["stderr"]), _returncode(code),
                               time.monotonic() - self.started, self._killed_wall, self._truncated, self.limits,
                               self.isolated)
        return self._result

    async def wait(self) -> ExecResult:
        """The result once the command (and every process of its sandbox) has ended.

        Cancelling the wait kills the sandbox.
        """
        try:
            return await asyncio.shield(self._done)
        except asyncio.CancelledError:
            self.kill()
            raise


async def run_isolated_async(command: str | Sequence[str], *, workdir: Path, cwd: str = APP,
                             mounts: Sequence[Mount] = (), env: Mapping[str, str] | None = None,
                             network: bool = False, limits: Limits = Limits(), stdin: bytes | None = None,
                             require_isolation: bool = True, uid: int | None = None) -> ExecResult:
    """:func:`run_isolated` for asyncio: same arguments and result; cancelling it kills the sandbox.

    >>> import asyncio, tempfile
    >>> asyncio.run(run_isolated_async("echo $((6 * 7))", workdir=Path(tempfile.mkdtemp()),
    ...                                require_isolation=False)).stdout
    '42\\n'
    """
    proc = await IsolatedProcess.start(command, workdir=workdir, cwd=cwd, mounts=mounts, env=env, network=network,
                                       limits=limits, stdin=stdin, require_isolation=require_isolation, uid=uid)
    return await proc.wait()
