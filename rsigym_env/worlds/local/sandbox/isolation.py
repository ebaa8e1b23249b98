"""Run untrusted commands in a bubblewrap sandbox with limits (the local world's isolation layer).

A sandbox sees its host directory ``workdir`` as ``/app`` (writable, the default cwd), the host's
programs read-only (``/usr`` and the ``/bin``, ``/lib*`` links, a copy of a few ``/etc`` files in one
mount (:func:`etc_directory`), the Python installs under ``/root/.pyenv/versions``), a fresh ``/tmp``, ``/proc`` (its
host-wide load and CPU counters masked: :data:`MASKED_PROC`) and a minimal ``/dev``, plus any extra
:class:`Mount`. Nothing else of the host exists inside: not ``/root``, ``/work``, ``/home``, the
host's ``/tmp`` nor any run directory. With ``network=False`` the sandbox has its own network
namespace holding only a loopback device. It has its own PID namespace, runs in a new session and
dies with its parent; on a wall-clock timeout the whole sandbox is killed.

Limits (:class:`Limits`) are resource limits of the command's processes (set by ``prlimit`` inside the
sandbox just before the command runs; as root, by us on bubblewrap before it makes the sandbox, :class:`_Launch`):
``RLIMIT_AS`` (memory), ``RLIMIT_CPU`` (CPU seconds per process; SIGXCPU, then SIGKILL a second
later), ``RLIMIT_NPROC`` (processes), ``RLIMIT_FSIZE`` (largest file written), no core dumps;
output is read up to ``output_bytes`` per stream and the rest discarded (``truncated``). The
kernel does not apply ``RLIMIT_NPROC`` to root, so when this runs as root the command drops to an
unprivileged uid of its own (:func:`sandbox_uid`, stable per ``workdir``, owning ``workdir`` and
the writable mounts; see :func:`claim`), with no capabilities and ``no_new_privs``. Run as an
ordinary user, bubblewrap puts the sandbox in a user namespace and the limit binds as it is.

A limit that ended or cut a command is named in :attr:`ExecResult.limit` and in a line
``[sandbox] ... limit ...`` (``... quota ...`` for the disk) appended to ``stderr``. ``wall`` and
``output`` are exact (we enforce them); ``cpu`` and ``file`` come from the signal that killed the
command; ``memory`` and ``processes`` are recognised from the failure messages programs print when
an allocation or a fork is refused (``MemoryError``, ``Cannot allocate memory``, ``Cannot fork``,
``Resource temporarily unavailable``...), since the kernel does not report rlimit hits; a group's
own hits come from its cgroup's counters (OOM kills, refused forks) and from "No space left on
device".

Rlimits bind one process (or one uid); a :class:`SandboxGroup` adds limits over *every* process and
file of one sandbox for its whole life, whatever the number of commands: memory (including page
cache and tmpfs pages) and processes through a cgroup (v2, else v1, else a loud warning and rlimits
only), and a disk quota on a host directory holding the sandbox's ``/app`` and writable mounts (a
size- and inode-bounded tmpfs, else a loud warning and a watchdog). Pass it as ``group=``; a command
it stops is reported as ``limit="memory"``, ``"processes"`` or ``"disk"``.

bubblewrap's options (host paths, mounts, environment) reach it through ``--args FD`` (a memfd), so
``/proc/*/cmdline`` inside shows only ``bwrap --args N -- [prlimit ...] [setpriv ...] <command>``. The
sandbox's ``/proc/self/mountinfo`` still shows, for each bind mount, its source path relative to the
source file system: below a group's tmpfs only the group's own subdirectory names, but for a bind of
an ordinary host directory its host path. Callers must keep such host paths opaque (no evaluation,
split or trial names in them), or put them under a group.

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
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import posixpath
import re
import resource
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

from rsigym_env.owners import Owner, current_owner, owner_status

log = logging.getLogger("rsigym_env.isolation")

LimitName = Literal["wall", "cpu", "memory", "processes", "output", "file", "disk"]

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
    limit: str | None = None   # "wall" | "cpu" | "memory" | "processes" | "output" | "file" | "disk"
    isolated: bool = True


class IsolationUnavailable(RuntimeError):
    """bubblewrap is missing or does not work here (the message says how to install it)."""


# --------------------------------------------------------------------------------------------
# Capabilities of this machine


def bwrap_path() -> str | None:
    """Where bubblewrap is installed (None if it is not)."""
    return shutil.which("bwrap") or (("/usr/bin/bwrap") if os.access("/usr/bin/bwrap", os.X_OK) else None)


_BWRAP_CHECK: dict[str, Any] = {"ok": None, "why": "", "at": -math.inf}
BWRAP_RECHECK_S = 30.0  # a failed check (e.g. a timeout on a loaded machine) is tried again after this


def _bwrap_works() -> tuple[bool, str]:
    """Whether bubblewrap runs here (and why not). A success is remembered for the process; a failure
    only for :data:`BWRAP_RECHECK_S` seconds, so that one slow or refused check under load does not
    refuse every sandbox for the rest of a long run."""
    check = _BWRAP_CHECK
    if check["ok"] or (check["ok"] is False and time.monotonic() - check["at"] < BWRAP_RECHECK_S):
        return bool(check["ok"]), check["why"]
    path = bwrap_path()
    ok, why = True, ""
    if path is None:
        ok, why = False, "bwrap not found"
    else:
        argv = [path, "--die-with-parent", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "--proc", "/proc",
                "--dev", "/dev", "--", "/bin/true"]
        try:
            proc = subprocess.run(argv, capture_output=True, timeout=20)
            if proc.returncode != 0:
                ok, why = False, f"bwrap does not work here: {proc.stderr.decode(errors='replace').strip()}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            ok, why = False, f"bwrap failed to run: {exc}"
    check.update(ok=ok, why=why, at=time.monotonic())
    return ok, why


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


def shows(path: str) -> bool:
    """Whether a sandbox sees the host's ``path`` (resolved) at the same place, read-only: it lies
    under one of the system paths (:data:`SYSTEM_RO`, this interpreter's installation).

    >>> shows("/usr/bin/env"), shows("/work/main")
    (True, False)
    """
    real = os.path.realpath(path)
    return any(real == p or real.startswith(p + "/") for p in _system_paths() if not os.path.islink(p))


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
    return _write_identity(Path(tempfile.gettempdir()) / "rsigym-isolation", uid)


def _readable_by_others(st: os.stat_result) -> bool:
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
    return stat.S_ISLNK(st.st_mode) or st.st_mode & need == need


@lru_cache(maxsize=1)
def etc_directory() -> str:
    """The sandbox's ``/etc``: a copy of the host's :data:`ETC_RO` entries, bound read-only in one mount.

    One bind instead of one per entry halves a sandbox's start here (each bind is two mount calls in
    the kernel: ~9 ms of a ~17 ms bubblewrap start, ``bench/bench_eval.py``). Copied as bubblewrap bound
    them: a top-level link by what it points to, links inside directories as links; entries other users
    may not read (``/etc/ssl/private``) are left out, as the sandbox user could not read them; empty
    ``passwd`` and ``group`` files are the mount points of the per-uid identity files. Named by the
    entries' metadata (a changed host file gives a new copy when a process next starts), built once and
    shared by processes, under the same private directory as the identity files.

    >>> d = Path(etc_directory()); (d / "hosts").exists(), (d / "passwd").read_text()
    (True, '')
    """
    sources = [Path("/etc", name) for name in ETC_RO if os.path.exists(os.path.join("/etc", name))]
    digest = hashlib.sha256()
    for source in sources:
        for current, dirs, files in os.walk(source) if source.is_dir() else [(str(source.parent), [], [source.name])]:
            for name in sorted((*dirs, *files)):
                path = os.path.join(current, name)
                st = os.stat(path) if path == str(source) else os.lstat(path)
                link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
                digest.update(f"{path}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0{link}\n".encode())
            dirs.sort()
    root = Path(tempfile.gettempdir()) / "rsigym-isolation"
    root.mkdir(mode=0o755, exist_ok=True)
    final = root / f"etc-{digest.hexdigest()[:16]}"
    if final.is_dir():
        return str(final)
    staging = Path(tempfile.mkdtemp(prefix=".etc-", dir=root))

    def unreadable(directory: str, names: list[str]) -> list[str]:
        return [n for n in names if not _readable_by_others(os.lstat(os.path.join(directory, n)))]

    for source in sources:
        if not _readable_by_others(source.stat()):
            continue
        if source.is_dir():
            shutil.copytree(source, staging / source.name, symlinks=True, ignore=unreadable)
        else:
            shutil.copy2(source, staging / source.name)  # a link: what it points to, as a bind would show
    for name in ("passwd", "group"):
        (staging / name).touch(mode=0o644)
    staging.chmod(0o755)
    try:
        os.rename(staging, final)
    except OSError:  # another process made it first: the same content
        shutil.rmtree(staging, ignore_errors=True)
    return str(final)


MASKED_PROC = ("loadavg", "stat")
"""Host-wide counters of ``/proc`` shown inside every sandbox as a still picture: the load average and
the global last-PID (``loadavg``), CPU times, context switches, interrupts and forks since boot (``stat``)
would otherwise let one sandbox see the work of another, or a later one see traces of an earlier one.
Others remain (``vmstat``, ``meminfo``, ``diskstats``, ``interrupts``, ``pressure/``: README, known limits)."""


@lru_cache(maxsize=1)
def masked_proc_files() -> tuple[tuple[str, str], ...]:
    """``(host file, /proc path)`` pairs bound read-only over :data:`MASKED_PROC`: the same shape as the
    host's files (one ``cpu`` line per CPU, the boot time), every counter zero, built once per process.

    >>> dict((t, open(h).read().split()[:4]) for h, t in masked_proc_files())["/proc/loadavg"]
    ['0.00', '0.00', '0.00', '1/1']
    """
    btime, cpus = "0", 1
    with contextlib.suppress(OSError):
        lines = Path("/proc/stat").read_text().splitlines()
        btime = next((l.split()[1] for l in lines if l.startswith("btime ")), "0")
        cpus = max(1, sum(1 for l in lines if re.match(r"cpu\d+ ", l)))
    zeros = " ".join(["0"] * 10)
    stat_text = "".join([f"cpu  {zeros}\n", *(f"cpu{i} {zeros}\n" for i in range(cpus)),
                         "intr 0\nctxt 0\n", f"btime {btime}\n", "processes 0\nprocs_running 1\nprocs_blocked 0\n",
                         "softirq 0 0 0 0 0 0 0 0 0 0 0\n"])
    texts = {"loadavg": "0.00 0.00 0.00 1/1 1\n", "stat": stat_text}
    root = Path(tempfile.gettempdir()) / "rsigym-isolation"
    root.mkdir(mode=0o755, exist_ok=True)
    final = root / f"proc-{hashlib.sha256(repr(sorted(texts.items())).encode()).hexdigest()[:16]}"
    if not final.is_dir():
        staging = Path(tempfile.mkdtemp(prefix=".proc-", dir=root))
        for name, text in texts.items():
            (staging / name).write_text(text)
            (staging / name).chmod(0o444)
        staging.chmod(0o755)
        try:
            os.rename(staging, final)
        except OSError:  # another process made it first: the same content
            shutil.rmtree(staging, ignore_errors=True)
    return tuple((str(final / name), f"/proc/{name}") for name in MASKED_PROC)


def _write_identity(root: Path, uid: int) -> tuple[str, str]:
    """Write (if changed) the passwd and group files for ``uid`` into ``root``; their paths."""
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


def _rlimit_pairs(limits: Limits) -> list[tuple[str, int, tuple[int, int]]]:
    """``(prlimit's name, resource, (soft, hard))`` of each limit a command runs under.

    >>> [(name, pair) for name, _, pair in _rlimit_pairs(Limits(cpu_s=5))][1]
    ('cpu', (5, 6))
    """
    mem, fsize = limits.memory_mb << 20, limits.file_mb << 20
    return [("as", resource.RLIMIT_AS, (mem, mem)), ("cpu", resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1)),
            ("nproc", resource.RLIMIT_NPROC, (limits.processes, limits.processes)),
            ("fsize", resource.RLIMIT_FSIZE, (fsize, fsize)), ("core", resource.RLIMIT_CORE, (0, 0))]


def _rlimits(limits: Limits) -> list[str]:
    """``prlimit``'s command line setting :func:`_rlimit_pairs` (then ``--`` and the command)."""
    return ["prlimit", *(f"--{name}={soft}:{hard}" for name, _, (soft, hard) in _rlimit_pairs(limits)), "--"]


def _target(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"mount target must be absolute: {path!r}")
    norm = os.path.normpath(path)
    if norm in ("/", "/proc", "/dev", "/usr", "/etc", "/bin", "/lib", "/lib64", "/tmp") or norm.startswith("/etc/") \
            or ".." in norm.split("/"):
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
    user = sandbox_uid(Path(workdir).resolve()) if uid is None else uid
    return [bwrap_path() or "bwrap", *_bwrap_options(workdir=workdir, cwd=cwd, mounts=mounts, env=env, network=network,
                                                 limits=limits, uid=user),
            "--", *_inner_argv(command, limits, user)]


def _parents(target: str, made: set[str], bound: Sequence[str] = ()) -> list[str]:
    """bubblewrap options making the missing parent directories of ``target`` with mode 0755 (bubblewrap
    would copy the mode of their host counterparts, e.g. 0700 for ``/root/.pyenv``, which the sandbox's
    uid could not cross). ``made``: directories made already (it gains the new ones); ``bound``: trees
    bound from the host, whose subdirectories exist.

    >>> made = {"/", "/root"}
    >>> _parents("/root/.pyenv/versions", made), "/root/.pyenv" in made, _parents("/usr/x/y", made, ["/usr"])
    (['--perms', '0755', '--dir', '/root/.pyenv'], True, [])
    """
    chain, parent = [], posixpath.dirname(target)
    while parent not in made and not any(parent == b or parent.startswith(b + "/") for b in bound):
        chain.append(parent)
        parent = posixpath.dirname(parent)
    argv: list[str] = []
    for d in reversed(chain):
        argv += ["--perms", "0755", "--dir", d]
        made.add(d)
    return argv


@lru_cache(maxsize=1)
def _system_options() -> tuple[tuple[str, ...], frozenset[str]]:
    """The options showing the system (``/etc``, :data:`SYSTEM_RO`) in every sandbox, and the directories they make:
    looked up once per process, as :func:`etc_directory` is (each command used to ask again: ~20 ``stat`` calls).

    >>> argv, made = _system_options()
    >>> argv[:3] == ("--ro-bind", etc_directory(), "/etc") and "/root" in made
    True
    """
    # A directory bwrap would otherwise create with the mode of its host counterpart (/root: 0700).
    argv = ["--ro-bind", etc_directory(), "/etc", "--perms", "0755", "--dir", "/root"]
    made, system = {"/", "/etc", "/root"}, _system_paths()
    for path in system:
        if os.path.islink(path):
            argv += _parents(path, made, system) + ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            argv += _parents(path, made, system) + ["--ro-bind", path, path]
    return tuple(argv), frozenset(made)


def _bwrap_options(*, workdir: Path, cwd: str, mounts: Sequence[Mount], env: Mapping[str, str] | None,
                   network: bool, limits: Limits, uid: int, identity: tuple[str, str] | None = None) -> list[str]:
    """bubblewrap's options for :func:`isolated_argv` (everything between ``bwrap`` and ``--``);
    ``identity``: the (passwd, group) files to show (default: :func:`_identity_files`)."""
    workdir = Path(workdir).resolve()
    argv = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox"]
    if not network:
        argv.append("--unshare-net")
    system_argv, system_made = _system_options()
    argv += system_argv
    made, system = set(system_made), _system_paths()
    passwd, group = identity or _identity_files(uid)
    argv += ["--ro-bind", passwd, "/etc/passwd", "--ro-bind", group, "/etc/group"]
    argv += ["--proc", "/proc"]
    for host, target in masked_proc_files():
        argv += ["--ro-bind", host, target]
    argv += ["--dev", "/dev", "--perms", "1777", "--size", str(limits.file_mb << 20), "--tmpfs", "/tmp",
             "--bind", str(workdir), APP]
    made |= {"/tmp", "/proc", "/dev", APP}
    for m in mounts:
        target = _target(m.target)
        argv += _parents(target, made, (*system, APP)) + ["--bind" if m.writable else "--ro-bind", str(Path(m.host).resolve()), target]
    argv += ["--chdir", _sandbox_cwd(cwd), "--clearenv"]
    for key, value in {**DEFAULT_ENV, **(env or {})}.items():
        argv += ["--setenv", key, str(value)]
    return argv


def _inner_argv(command: str | Sequence[str], limits: Limits, uid: int, rlimits: bool = True) -> list[str]:
    """What bubblewrap runs inside: the rlimits (unless ``rlimits=False``: the parent set them on
    bubblewrap already, :class:`_Launch`), the drop to ``uid`` (as root), then the command."""
    argv = _rlimits(limits) if rlimits else []
    if _as_root():
        argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                 "--bounding-set=-all", "--no-new-privs", "--"]
    return argv + _shell(command)


def _args_data(options: Sequence[str]) -> bytes:
    """``options`` NUL-separated, as ``bwrap --args FD`` reads them.

    A NUL inside an option would split it into several and let a caller-supplied value (an
    environment variable, a path) inject bubblewrap options: it is refused.

    >>> _args_data(["--chdir", "/app"])
    b'--chdir\\x00/app\\x00'
    """
    for value in options:
        if "\0" in value:
            raise ValueError("a NUL byte is not allowed in a sandbox path, working directory or environment variable")
    return b"".join(os.fsencode(v) + b"\0" for v in options)


def _args_pipe(data: bytes) -> tuple[int, int] | None:
    """(read end, write end) of a pipe that holds all of ``data`` at once (so that one ``write`` hands
    it over whole), or None if a pipe cannot be made that large here."""
    r, w = os.pipe()
    try:
        if len(data) > 65536:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, len(data))
        if fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) >= len(data):
            return r, w
    except OSError:
        pass
    os.close(r)
    os.close(w)
    return None


def _args_fd(options: Sequence[str]) -> int:
    """A memfd holding ``options`` NUL-separated (:func:`_args_data`), at offset 0, for ``bwrap --args FD``."""
    data = _args_data(options)
    try:
        fd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # no memfd: an unlinked temporary file does the same
        fd = os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


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


JOIN_FAILED = "[sandbox] cannot join the sandbox group"


@dataclass
class _Launch:
    """What the parent does to a started bubblewrap before it may go on (the in-process launch): the
    bubblewrap options reach it through a pipe (``--args FD``) that we write only once bubblewrap is in
    the group's cgroup (``procs_files``) and under the command's rlimits (``limits``, as root), so
    bubblewrap blocks reading them, before it has parsed an option or made a namespace, and every
    process of the sandbox starts inside both, as with the ``sh`` join and ``prlimit`` it replaces
    (two ``execve`` fewer a command). Were the parent to die first, bubblewrap would read no option
    and find nothing to run in its empty root."""

    write_fd: int
    data: bytes
    procs_files: tuple[str, ...] = ()
    limits: Limits | None = None

    def release(self, pid: int) -> str | None:
        """Put ``pid`` (the started bubblewrap) in the cgroup and under the rlimits, then hand it its
        options; on failure kill it unreleased and say why (``None``: released)."""
        why = None
        try:
            for procs in self.procs_files:
                try:
                    _write_text(Path(procs), str(pid))
                except OSError:
                    why = JOIN_FAILED
                    raise
            if self.limits is not None:
                for _, code, pair in _rlimit_pairs(self.limits):
                    resource.prlimit(pid, code, pair)
            view = memoryview(self.data)
            while view:
                view = view[os.write(self.write_fd, view):]
        except BaseException as exc:
            _kill(pid)
            if not isinstance(exc, Exception):
                raise
            return why or f"[sandbox] cannot start the sandbox: {type(exc).__name__}"
        finally:
            self.close()
        return None

    def close(self) -> None:
        if self.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1


_LAUNCHER: dict[int, concurrent.futures.ThreadPoolExecutor] = {}   # by process id (a forked child makes its own)
_LAUNCHER_LOCK = threading.Lock()


def _launcher_after_fork() -> None:
    global _LAUNCHER_LOCK
    _LAUNCHER_LOCK = threading.Lock()  # another thread may have held it when this process was forked


os.register_at_fork(after_in_child=_launcher_after_fork)


def _launcher() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that release the sandboxes asyncio callers start (:meth:`_Launch.release` blocks on
    the cgroup join), apart from a loop's default executor so that they never queue behind other work."""
    pid = os.getpid()
    with _LAUNCHER_LOCK:
        if pid not in _LAUNCHER:
            _LAUNCHER.clear()
            _LAUNCHER[pid] = concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                                   thread_name_prefix="rsigym-sandbox-launch")
        return _LAUNCHER[pid]


@dataclass
class _Prepared:
    argv: list[str]
    cwd: str | None
    env: dict[str, str] | None
    isolated: bool
    pass_fds: tuple[int, ...] = ()
    launch: _Launch | None = None

    def spawn_argv(self, group: "SandboxGroup | None") -> list[str]:
        """The command line to start: with the ``sh`` join in front when the group has a cgroup and
        the parent does not put bubblewrap in it itself."""
        if group is None or (self.launch is not None and self.isolated):
            return self.argv
        return group._join_argv(self.argv)

    def release(self, pid: int) -> str | None:
        """After the start: let the child go (see :class:`_Launch`); why it could not (it is killed)."""
        return self.launch.release(pid) if self.launch is not None else None

    def close(self) -> None:
        """Close our copies of the descriptors handed to the child (call once it is started)."""
        for fd in self.pass_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.pass_fds = ()

    def abandon(self) -> None:
        """The child was not started: close everything."""
        self.close()
        if self.launch is not None:
            self.launch.close()


def _prepare(command: str | Sequence[str], workdir: Path, cwd: str, mounts: Sequence[Mount],
             env: Mapping[str, str] | None, network: bool, limits: Limits, require_isolation: bool,
             uid: int | None, group: "SandboxGroup | None" = None, launch: bool = False) -> _Prepared:
    """Check, claim and build what starts ``command``. ``launch``: the caller lets the started child go
    with :meth:`_Prepared.release` (the in-process launch, :class:`_Launch`; else the ``sh`` join of
    :meth:`SandboxGroup._join_argv` and ``prlimit`` inside do its work)."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise FileNotFoundError(f"sandbox directory does not exist: {workdir}")
    if group is not None:
        group._check_paths(workdir, mounts)
        if uid is None:
            uid = group.uid
    ok, why = _bwrap_works()
    if ok:
        user = sandbox_uid(workdir) if uid is None else uid
        claim(workdir, user)
        for m in mounts:
            if m.writable:
                claim(Path(m.host), user)
            _open_socket(Path(m.host))
        identity = group._identity if group is not None and user == group.uid else None
        options = _bwrap_options(workdir=workdir, cwd=cwd, mounts=mounts, env=env, network=network, limits=limits,
                                 uid=user, identity=identity)
        root = _as_root()
        cgroup = group._state.cgroup if group is not None else None
        if launch and (root or cgroup is not None) and "spawn" not in _fallbacks():
            data = _args_data(options)
            pipe = _args_pipe(data)
            if pipe is not None:
                r, w = pipe
                how = _Launch(w, data, tuple(cgroup.procs_files) if cgroup is not None else (),
                              limits if root else None)
                inner = _inner_argv(command, limits, user, rlimits=not root)
                return _Prepared([bwrap_path() or "bwrap", "--args", str(r), "--", *inner], None, {}, True, (r,),
                                 how)
        inner = _inner_argv(command, limits, user)
        fd = _args_fd(options)
        return _Prepared([bwrap_path() or "bwrap", "--args", str(fd), "--", *inner], None, {}, True, (fd,))
    if require_isolation:
        raise IsolationUnavailable(f"{why}. {INSTALL_HINT}")
    log.warning("!!! sandbox NOT isolated (%s): running %r directly on the host with rlimits only. %s",
                why, command, INSTALL_HINT)
    return _Prepared(_unisolated_argv(command, limits), _unisolated_cwd(workdir, cwd),
                     {**os.environ, **DEFAULT_ENV, **(env or {})}, False)


def _classify(out: bytes, err: bytes, code: int, killed_wall: bool, truncated: bool,
              limits: Limits, events: "_GroupEvents | None" = None) -> tuple[str | None, str]:
    """(limit, note) for a finished command (``events``: what its group recorded meanwhile)."""
    if killed_wall:
        return "wall", f"wall-clock limit ({limits.wall_s:g} s) reached: the sandbox was killed"
    if events is not None:
        if events.disk_killed:
            return "disk", (f"disk quota of the sandbox ({events.disk_mb} MB, {events.inodes} files) exceeded: "
                            "its commands were killed")
        if events.oom_kills and (code == 128 + signal.SIGKILL or b"Killed" in err):
            return "memory", (f"memory limit of the sandbox ({events.memory_mb} MB over all its processes and files) "
                              "reached: the kernel killed a process")
    if code in (128 + _SIGXCPU, -_SIGXCPU) or b"CPU time limit exceeded" in err:
        return "cpu", f"CPU time limit ({limits.cpu_s} s) reached: the command was killed"
    if code in (128 + _SIGXFSZ, -_SIGXFSZ) or b"File size limit exceeded" in err:
        return "file", f"file size limit ({limits.file_mb} MB) reached"
    if _FORK_RE.search(err):
        if events is not None and events.forks_refused:
            return "processes", (f"process limit of the sandbox ({events.processes} over all its commands) reached: "
                                 "a fork or thread was refused")
        return "processes", f"process limit ({limits.processes}) reached: a fork or thread was refused"
    if code != 0 and _MEMORY_RE.search(err):
        return "memory", f"memory limit ({limits.memory_mb} MB) reached: an allocation was refused"
    if events is not None and _ENOSPC_RE.search(err):
        return "disk", (f"disk quota reached: No space left on device (the sandbox's files: {events.disk_mb} MB, "
                        f"{events.inodes} files; /tmp: {limits.file_mb} MB)")
    if truncated:
        return "output", f"output limit ({limits.output_bytes} bytes per stream) reached: the rest was discarded"
    return None, ""


def _result(out: bytes, err: bytes, code: int, duration: float, killed_wall: bool, truncated: bool,
            limits: Limits, isolated: bool, events: "_GroupEvents | None" = None) -> ExecResult:
    limit, note = _classify(out, err, code, killed_wall, truncated, limits, events)
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
                 stdin: bytes | None = None, require_isolation: bool = True, uid: int | None = None,
                 group: "SandboxGroup | None" = None) -> ExecResult:
    """Run ``command`` in a fresh sandbox over ``workdir`` and wait for it (see the module docstring).

    Raises :class:`IsolationUnavailable` if bubblewrap does not work here and ``require_isolation``;
    otherwise it then runs the command on the host with rlimits only, logs a loud warning and
    returns ``isolated=False``. With ``group``, the command also counts towards the group's limits
    (``workdir`` and writable mounts must be under ``group.root``; the uid is ``group.uid``).
    """
    prep = _prepare(command, workdir, cwd, mounts, env, network, limits, require_isolation, uid, group, launch=True)
    start = time.monotonic()
    try:
        ticket = group._admit() if group is not None else None
        try:
            proc = subprocess.Popen(prep.spawn_argv(group),
                                    cwd=prep.cwd, env=prep.env, start_new_session=True, pass_fds=prep.pass_fds,
                                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except BaseException:
            prep.abandon()
            if ticket is not None:
                group._release(ticket)  # type: ignore[union-attr]
            raise
    finally:
        prep.close()
    if ticket is not None:
        group._attach(ticket, proc.pid)  # type: ignore[union-attr]
    failed = prep.release(proc.pid)
    events: _GroupEvents | None = None
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
        if ticket is not None:
            events = group._release(ticket)  # type: ignore[union-attr]
    duration = time.monotonic() - start
    out, err = (bytes(b) for b in bufs.values())
    code = _returncode(code)
    if failed:  # as the sh join reported it: the command never ran
        out, err, code = b"", f"{failed}\n".encode(), 125
    return _result(out, err, code, duration, killed, truncated, limits, prep.isolated, events)


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
                 on_output: OutputCallback | None, group: "SandboxGroup | None" = None,
                 ticket: "_Ticket | None" = None) -> None:
        self._proc = proc
        self._group = group
        self._ticket = ticket
        self.limits = limits
        self.isolated = isolated
        self.pid: int = proc.pid
        self.started = time.monotonic()
        self._on_output = on_output
        self._killed_wall = False
        self._truncated = False
        self._result: ExecResult | None = None
        self._failed: str | None = None   # why the launch could not let it go (it was killed unstarted)
        self._bufs = {"stdout": bytearray(), "stderr": bytearray()}
        self._readers = [asyncio.ensure_future(self._read(proc.stdout, "stdout")),  # type: ignore[arg-type]
                         asyncio.ensure_future(self._read(proc.stderr, "stderr"))]  # type: ignore[arg-type]
        self._timer = asyncio.get_running_loop().call_later(limits.wall_s, self._wall)
        self._done = asyncio.ensure_future(self._finish())

    @classmethod
    async def start(cls, command: str | Sequence[str], *, workdir: Path, cwd: str = APP,
                    mounts: Sequence[Mount] = (), env: Mapping[str, str] | None = None, network: bool = False,
                    limits: Limits = Limits(), stdin: bytes | bool | None = None, require_isolation: bool = True,
                    uid: int | None = None, on_output: OutputCallback | None = None,
                    group: "SandboxGroup | None" = None) -> "IsolatedProcess":
        """Launch ``command`` (raises :class:`IsolationUnavailable` like :func:`run_isolated`)."""
        prep = _prepare(command, workdir, cwd, mounts, env, network, limits, require_isolation, uid, group,
                        launch=True)
        try:
            ticket = group._admit() if group is not None else None
            try:
                proc = await asyncio.create_subprocess_exec(
                    *prep.spawn_argv(group), cwd=prep.cwd, env=prep.env,
                    start_new_session=True, pass_fds=prep.pass_fds,
                    stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            except BaseException:
                prep.abandon()
                if ticket is not None:
                    group._release(ticket)  # type: ignore[union-attr]
                raise
        finally:
            prep.close()
        if ticket is not None:
            group._attach(ticket, proc.pid)  # type: ignore[union-attr]
        failed = None
        if prep.launch is not None:
            # a cgroup v1 join waits for an RCU grace period (~9 ms here): not on the caller's event loop
            release = asyncio.get_running_loop().run_in_executor(_launcher(), prep.release, proc.pid)
            try:
                failed = await asyncio.shield(release)
            except BaseException:
                _kill(proc.pid)
                if ticket is not None:
                    group._release(ticket)  # type: ignore[union-attr]
                raise
        self = cls(proc, limits, prep.isolated, on_output, group, ticket)
        self._failed = failed
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

    def restart_clock(self, wall_s: float) -> None:
        """Start the command's clocks now, with a wall-clock limit of ``wall_s``: for a command started
        ahead of its input (it waits on stdin meanwhile), so that its limit, its ``duration_s`` and the
        group events it is charged with run from when its work was handed to it, as if it started then.
        The rlimits stay those it started with."""
        if self._result is not None or self._killed_wall:
            return
        self._timer.cancel()
        self.limits = dataclasses.replace(self.limits, wall_s=wall_s)
        self.started = time.monotonic()
        self._timer = asyncio.get_running_loop().call_later(wall_s, self._wall)
        if self._group is not None and self._ticket is not None:
            self._group._rebase(self._ticket)

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
        events: _GroupEvents | None = None
        try:
            await asyncio.gather(*self._readers)
            code = await self._proc.wait()
        finally:
            self._timer.cancel()
            if self._ticket is not None:
                events = self._group._release(self._ticket)  # type: ignore[union-attr]
        out, err, code = bytes(self._bufs["stdout"]), bytes(self._bufs["stderr"]), _returncode(code)
        if self._failed:  # as the sh join reported it: the command never ran
            out, err, code = b"", f"{self._failed}\n".encode(), 125
        self._result = _result(out, err, code, time.monotonic() - self.started, self._killed_wall, self._truncated,
                               self.limits, self.isolated, events)
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
                             require_isolation: bool = True, uid: int | None = None,
                             group: "SandboxGroup | None" = None) -> ExecResult:
    """:func:`run_isolated` for asyncio: same arguments and result; cancelling it kills the sandbox.

    >>> import asyncio, tempfile
    >>> asyncio.run(run_isolated_async("echo $((6 * 7))", workdir=Path(tempfile.mkdtemp()),
    ...                                require_isolation=False)).stdout
    '42\\n'
    """
    proc = await IsolatedProcess.start(command, workdir=workdir, cwd=cwd, mounts=mounts, env=env, network=network,
                                       limits=limits, stdin=stdin, require_isolation=require_isolation, uid=uid,
                                       group=group)
    return await proc.wait()


# --------------------------------------------------------------------------------------------
# Aggregate limits of one sandbox: cgroups and a disk quota

GroupMode = Literal["cgroup2", "cgroup1", "rlimits"]
DiskMode = Literal["tmpfs", "watchdog"]
# Pretend cgroups, mounting and/or the in-process launch are unavailable: "cgroups", "mount", "spawn" or "all"
# (comma-separated).
FALLBACK_ENV = "RSIGYM_SANDBOX_FALLBACK"
_CGROUP_PARENT = "rsigym"
_IDENTITY_DIR = ".rsigym-etc"   # in a group's root: the sandbox user's passwd and group files
_ENOSPC_RE = re.compile(rb"No space left on device|Disk quota exceeded|\[Errno 28\]")
# Run by /bin/sh: write our pid into each cgroup.procs file given before "--", then exec the rest, so
# that bubblewrap and everything it forks start inside the group. No host path reaches the sandbox's
# stderr when joining fails.
_JOIN_SCRIPT = ('for f; do if [ "$f" = -- ]; then shift; exec "$@"; fi; '
                '{ echo $$ > "$f"; } 2>/dev/null || { echo "[sandbox] cannot join the sandbox group" >&2; exit 125; }; '
                'shift; done; exit 125')
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, message: str, *args: object) -> None:
    """Log ``message`` as a WARNING the first time ``key`` is seen in this process."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message, *args)


class _Unavailable(Exception):
    """A mechanism (cgroups, a tmpfs mount) that cannot be used here; the message says why."""


@dataclass(frozen=True)
class GroupUsage:
    """What a :class:`SandboxGroup` uses now (``None``: not measured in this mode)."""

    memory_peak_bytes: int | None   # highest memory charged to the group since it was made
    memory_bytes: int | None        # memory charged now (processes, page cache, tmpfs pages)
    processes: int | None           # processes and threads in the group now
    processes_peak: int | None      # most processes and threads at once (kernels with pids.peak)
    disk_bytes: int                 # bytes allocated under group.root
    disk_inodes: int                # files, directories and links under group.root


@dataclass(eq=False)
class _Ticket:
    """One running command of a group: counters when it started, its process, and whether the disk
    watchdog killed it."""

    oom_kills: int
    forks_refused: int
    pid: int | None = None
    disk_killed: bool = False


@dataclass(frozen=True)
class _GroupEvents:
    """What a group recorded while one command ran, and the group's limits for the stderr note."""

    oom_kills: int
    forks_refused: int
    disk_killed: bool
    memory_mb: int
    processes: int
    disk_mb: int
    inodes: int


def _read_text(path: Path) -> str:
    with open(path) as f:
        return f.read()


def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _field(path: Path, key: str) -> int:
    """The value of ``key`` in a cgroup file of ``key value`` lines (0 when missing or unreadable)."""
    try:
        for line in _read_text(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _number(path: Path) -> int | None:
    try:
        return int(_read_text(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(type, root, mount point, super options) of each cgroup and cgroup2 mount this process sees."""
    out = []
    try:
        text = _read_text(Path("/proc/self/mountinfo"))
    except OSError:
        return out
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            out.append((tail[0], _unescape(fields[3]), _unescape(fields[4]), set(tail[2].split(","))))
    return out


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under ``""`` in the v2 hierarchy."""
    own: dict[str, str] = {}
    try:
        text = _read_text(Path("/proc/self/cgroup"))
    except OSError:
        return own
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in (parts[1].split(",") if parts[1] else [""]):
                own[controller] = parts[2]
    return own


def _visible(mount_root: str, mount_point: str, path: str) -> Path | None:
    """Where the cgroup ``path`` of a hierarchy mounted at ``mount_point`` (its root: ``mount_root``) is."""
    if mount_root != "/":
        if path != mount_root and not path.startswith(mount_root + "/"):
            return None
        path = path[len(mount_root):]
    return Path(mount_point) / path.lstrip("/")


class _Cgroup:
    """The cgroup of one group: one directory (v2) or one per controller (v1 ``memory`` and ``pids``)."""

    def __init__(self, version: int, memory_dir: Path, pids_dir: Path) -> None:
        self.version = version
        self.memory_dir = memory_dir
        self.pids_dir = pids_dir
        self.dirs = [memory_dir] if memory_dir == pids_dir else [memory_dir, pids_dir]
        self.procs_files = [str(d / "cgroup.procs") for d in self.dirs]

    @classmethod
    def create(cls, name: str, memory_bytes: int, processes: int) -> "_Cgroup":
        """A new cgroup ``name`` with these limits, v2 if usable, else v1 (raises :class:`_Unavailable`)."""
        mounts, own = _cgroup_mounts(), _own_cgroups()
        reasons = []
        for make in (cls._create_v2, cls._create_v1):
            try:
                return make(mounts, own, name, memory_bytes, processes)
            except _Unavailable as exc:
                reasons.append(str(exc))
        raise _Unavailable("; ".join(reasons))

    @classmethod
    def _create_v2(cls, mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str], name: str,
                   memory_bytes: int, processes: int) -> "_Cgroup":
        found = next(((root, point) for kind, root, point, _ in mounts if kind == "cgroup2"), None)
        base = _visible(*found, own[""]) if found is not None and "" in own else None
        if found is None or base is None:
            raise _Unavailable("cgroup v2: no cgroup2 hierarchy holding this process is mounted")
        need = {"memory", "pids"}
        parent = base
        # Our cgroup, else the nearest writable parent, that has memory and pids enabled for its children
        # (we enable nothing there ourselves: at the root that would change the whole machine).
        while True:
            try:
                enabled = set(_read_text(parent / "cgroup.subtree_control").split())
            except OSError:
                enabled = set()
            if need <= enabled and os.access(parent, os.W_OK):
                break
            if parent == Path(found[1]) or parent == parent.parent:
                raise _Unavailable(f"cgroup v2: memory and pids are not enabled in the cgroup.subtree_control of "
                                   f"{base} or of a writable parent")
            parent = parent.parent
        middle, path = parent / _CGROUP_PARENT, parent / _CGROUP_PARENT / name
        try:
            for _ in range(3):  # the last group of another process may remove `middle` meanwhile
                middle.mkdir(exist_ok=True)
                if not need <= set(_read_text(middle / "cgroup.subtree_control").split()):
                    _write_text(middle / "cgroup.subtree_control", "+memory +pids")
                try:
                    path.mkdir()
                    break
                except FileNotFoundError:
                    continue
            else:
                raise OSError(errno.ENOENT, "removed meanwhile")
        except OSError as exc:
            raise _Unavailable(f"cgroup v2: cannot create {path}: {exc.strerror}") from None
        try:
            _write_text(path / "memory.max", str(memory_bytes))
            if (path / "memory.swap.max").exists():
                _write_text(path / "memory.swap.max", "0")
            _write_text(path / "pids.max", str(processes))
        except OSError as exc:
            path.rmdir()
            raise _Unavailable(f"cgroup v2: cannot set the limits of {path}: {exc.strerror}") from None
        return cls(2, path, path)

    @classmethod
    def _create_v1(cls, mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str], name: str,
                   memory_bytes: int, processes: int) -> "_Cgroup":
        made: list[Path] = []
        try:
            for controller in ("memory", "pids"):
                found = next(((root, point) for kind, root, point, opts in mounts
                              if kind == "cgroup" and controller in opts), None)
                base = _visible(*found, own[controller]) if found is not None and controller in own else None
                if base is None or not base.is_dir():
                    raise _Unavailable(f"cgroup v1: no {controller} hierarchy holding this process is mounted")
                path = base / _CGROUP_PARENT / name
                try:
                    _mkdir_parents(path)
                except OSError as exc:
                    raise _Unavailable(f"cgroup v1: cannot create {path}: {exc.strerror}") from None
                made.append(path)
            memory, pids = made
            try:
                _write_text(memory / "memory.limit_in_bytes", str(memory_bytes))
                if (memory / "memory.memsw.limit_in_bytes").exists():  # no swapping past the limit either
                    _write_text(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
                _write_text(pids / "pids.max", str(processes))
            except OSError as exc:
                raise _Unavailable(f"cgroup v1: cannot set the limits: {exc.strerror}") from None
        except _Unavailable:
            for path in made:
                try:
                    path.rmdir()
                except OSError:
                    pass
            raise
        return cls(1, memory, pids)

    def oom_kills(self) -> int:
        """Processes the kernel killed because the group was out of memory, since it was made."""
        if self.version == 2:
            return _field(self.memory_dir / "memory.events", "oom_kill")
        return _field(self.memory_dir / "memory.oom_control", "oom_kill")

    def forks_refused(self) -> int:
        """Forks refused because the group was at its process limit, since it was made."""
        return _field(self.pids_dir / "pids.events", "max")

    def memory_peak(self) -> int | None:
        return _number(self.memory_dir / ("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"))

    def memory_current(self) -> int | None:
        return _number(self.memory_dir / ("memory.current" if self.version == 2 else "memory.usage_in_bytes"))

    def processes(self) -> int | None:
        return _number(self.pids_dir / "pids.current")

    def processes_peak(self) -> int | None:
        return _number(self.pids_dir / "pids.peak")

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            try:
                found.update(int(p) for p in _read_text(Path(procs)).split())
            except (OSError, ValueError):
                pass
        return found

    def kill(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process in the group, again until none is left (forks race the first pass)."""
        if self.version == 2 and (self.memory_dir / "cgroup.kill").exists():
            try:
                _write_text(self.memory_dir / "cgroup.kill", "1")
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def remove(self, timeout_s: float = 5.0) -> None:
        """Remove the group's directories (retrying while killed processes finish exiting), and the
        ``rsigym`` directory above them once no group is left in it (so that it does not keep the
        cgroup of this process from being removed)."""
        deadline = time.monotonic() + timeout_s
        for path in self.dirs:
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("could not remove the sandbox cgroup %s: %s", path, exc.strerror)
                        break
                    self.kill(0.2)
                    time.sleep(0.02)
            try:
                path.parent.rmdir()
            except OSError:
                pass  # other groups live there


def _mkdir_parents(path: Path) -> None:
    """``path.mkdir(parents=True)``, retried when another process removes an empty parent meanwhile."""
    for attempt in range(3):
        try:
            path.mkdir(parents=True)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


@lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _mount_tmpfs(path: Path, size_bytes: int, inodes: int) -> None:
    """Mount a tmpfs of at most ``size_bytes`` and ``inodes`` at ``path`` (raises :class:`_Unavailable`)."""
    options = f"size={size_bytes},nr_inodes={inodes},mode=0755"
    if _libc().mount(b"sandbox", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()) != 0:
        err = ctypes.get_errno()
        raise _Unavailable(f"cannot mount a tmpfs: {os.strerror(err)}")


def _umount(path: Path) -> None:
    """Unmount ``path``; lazily when still busy (a dying sandbox still holds it)."""
    target = os.fsencode(path)
    for _ in range(50):
        if _libc().umount2(target, 0) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):  # not mounted (any more)
            return
        if err != errno.EBUSY:
            break
        time.sleep(0.02)
    if _libc().umount2(target, _MNT_DETACH) != 0:
        log.warning("could not unmount the sandbox tmpfs at %s: %s", path, os.strerror(ctypes.get_errno()))


def _tree_usage(root: Path, max_entries: int) -> tuple[int, int, bool]:
    """(bytes allocated, entries, complete) under ``root``, visiting at most ``max_entries`` entries.

    Symlinks are not followed; a file linked several times counts once.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = (d / "a").write_bytes(b"x" * 10000)
    >>> used, entries, complete = _tree_usage(d, 100)
    >>> used >= 10000, entries, complete
    (True, 1, True)
    """
    used = entries = 0
    linked: set[tuple[int, int]] = set()
    stack = [str(root)]
    while stack:
        try:
            scan = os.scandir(stack.pop())
        except OSError:
            continue
        with scan:
            for entry in scan:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries += 1
                if entries > max_entries:
                    return used, entries, False
                is_dir = stat.S_ISDIR(st.st_mode)
                if not is_dir and st.st_nlink > 1:
                    if (st.st_dev, st.st_ino) in linked:
                        continue
                    linked.add((st.st_dev, st.st_ino))
                used += st.st_blocks * 512
                if is_dir:
                    stack.append(entry.path)
    return used, entries, True


_group_uids: set[int] = set()   # uids of the groups alive in this process
_group_uids_lock = threading.Lock()


def _fresh_uid() -> int:
    """A random sandbox uid no live group of this process uses. Random, not derived from a path like
    :func:`sandbox_uid`: the uid is visible inside (``id -u``) and must tell nothing about the host."""
    with _group_uids_lock:
        while (uid := UID_BASE + secrets.randbelow(UID_SPAN)) in _group_uids:
            pass
        _group_uids.add(uid)
        return uid


def group_registry() -> Path:
    """Where live sandbox groups are recorded (one JSON file each): ``/run/rsigym-sandboxes`` as root,
    else a directory of this user's in the temporary directory."""
    if _as_root() and os.access("/run", os.W_OK):
        return Path("/run/rsigym-sandboxes")
    return Path(tempfile.gettempdir()) / f"rsigym-sandboxes-{os.geteuid()}"


def _register_group(state: "_GroupState") -> Path | None:
    """Record a group's owner (this process), root, mount and cgroups, so that if this process dies
    without closing it, :func:`reap_stale_groups` can clean up after it."""
    return _register(state.root, mounted=state.mounted, made_root=state.made_root,
                     cgroups=[state.cgroup.memory_dir, state.cgroup.pids_dir] if state.cgroup else [])


def _register(root: Path, *, mounted: bool, made_root: bool, cgroups: Sequence[Path] = ()) -> Path | None:
    """Record ``root`` (its mount, its cgroups) as this process's in :func:`group_registry`."""
    record = {"owner": dataclasses.asdict(current_owner()), "root": str(root), "mounted": mounted,
              "made_root": made_root, "cgroups": [str(d) for d in cgroups]}
    try:
        registry = group_registry()
        registry.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = registry / f"{secrets.token_hex(8)}.json"
        path.write_text(json.dumps(record))
        return path
    except OSError as exc:  # the group works all the same; only crash clean-up is lost
        _warn_once("registry", "cannot record a sandbox group in %s (%s): a crash would leave it behind",
                   group_registry(), exc)
        return None


@contextlib.contextmanager
def opaque_directory(prefix: str = "rsigym-") -> Iterator[Path]:
    """A fresh, empty temporary directory whose host path sandboxes cannot see; removed on exit.

    A sandbox's ``/proc/self/mountinfo`` shows a bind mount's source relative to its file system, so a
    socket bound in from ``/tmp/<random>/model.sock`` shows that random name, the same in every trial
    that shares it. As root the directory is a tmpfs of its own (64 KiB, 16 inodes, reaped by
    :func:`reap_stale_groups` after a crash), and such a bind shows only ``/model.sock``; otherwise it
    is a plain temporary directory, and the name shows.

    >>> with opaque_directory() as d:
    ...     (d / "f").write_text("x"), sorted(p.name for p in d.iterdir())
    (1, ['f'])
    >>> d.exists()
    False
    """
    root = Path(os.path.realpath(tempfile.mkdtemp(prefix=prefix)))
    mounted = False
    if _as_root() and "mount" not in _fallbacks():
        try:
            _mount_tmpfs(root, 64 << 10, 16)
            mounted = True
        except _Unavailable as exc:
            _warn_once(f"opaque: {exc}", "temporary directories shared with sandboxes are plain ones (%s): "
                       "their host paths show in the sandboxes' mountinfo", exc)
    else:
        log.debug("not root: a sandbox's mountinfo shows the host path of %s", root)
    record = _register(root, mounted=mounted, made_root=True) if mounted else None
    try:
        yield root
    finally:
        if mounted:
            _umount(root)
        shutil.rmtree(root, ignore_errors=True)
        if record is not None:
            record.unlink(missing_ok=True)


def reap_stale_groups() -> int:
    """Clean up after sandbox groups whose process died without closing them (a ``kill -9``): kill what
    still runs in their cgroups, remove the cgroups, unmount their tmpfs (freeing its memory) and delete
    their files. Groups of live processes are left alone. Returns how many were reaped."""
    registry = group_registry()
    reaped = 0
    for path in sorted(registry.glob("*.json")) if registry.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            owner = Owner(**record["owner"])
        except (OSError, ValueError, TypeError, KeyError):
            path.unlink(missing_ok=True)
            continue
        if owner_status(owner) != "gone":
            continue
        for directory in map(Path, record.get("cgroups", [])):
            _reap_cgroup(directory)
        root = Path(record["root"])
        if record.get("mounted"):
            _umount(root)
        if root.is_dir():
            shutil.rmtree(root, ignore_errors=True) if record.get("made_root") else [
                shutil.rmtree(e.path, ignore_errors=True) if e.is_dir(follow_symlinks=False) else os.unlink(e.path)
                for e in os.scandir(root)]
        path.unlink(missing_ok=True)
        reaped += 1
    if reaped:
        log.warning("reaped %d sandbox group(s) left behind by processes that died without closing them", reaped)
    return reaped


def _reap_cgroup(directory: Path) -> None:
    for _ in range(50):
        try:
            pids = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            break
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    try:
        directory.rmdir()
    except OSError:
        pass


_reaped = threading.Event()


def _reap_once() -> None:
    """:func:`reap_stale_groups` the first time this process makes a group."""
    if not _reaped.is_set():
        _reaped.set()
        try:
            reap_stale_groups()
        except Exception as exc:  # noqa: BLE001 - clean-up must never stop a sandbox from starting
            log.warning("reaping stale sandbox groups failed: %s: %s", type(exc).__name__, exc)


def _fallbacks() -> set[str]:
    """What :data:`FALLBACK_ENV` tells the sandboxes to do without (``cgroups``, ``mount``, ``spawn``: the
    in-process launch of :class:`_Launch`, so the ``sh`` join and ``prlimit`` run as separate programs)."""
    words = {w.strip().lower() for w in os.environ.get(FALLBACK_ENV, "").split(",") if w.strip()}
    return {"cgroups", "mount", "spawn"} if words & {"1", "all", "true", "yes"} else words


class _GroupState:
    """Everything a :class:`SandboxGroup` owns, apart from the group object itself, so that its
    watchdog thread and its finalizer (closing a group left open) do not keep it alive."""

    def __init__(self, root: Path, made_root: bool, uid: int, memory_mb: int, processes: int, disk_mb: int,
                 inodes: int, watch_interval_s: float) -> None:
        self.root = root
        self.uid = uid
        self.made_root = made_root
        self.memory_mb, self.processes, self.disk_mb, self.inodes = memory_mb, processes, disk_mb, inodes
        self.watch_interval_s = watch_interval_s
        self.cgroup: _Cgroup | None = None
        self.mounted = False
        self.lock = threading.Lock()
        self.tickets: set[_Ticket] = set()
        self.closed = False
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.watchdog: threading.Thread | None = None
        self.last_scan = (0, 0)   # (bytes, entries) of the watchdog's last measure
        self.record: Path | None = None  # this group in the registry of live groups (reap_stale_groups)

    # ---- commands -------------------------------------------------------------------------------

    def admit(self) -> _Ticket:
        cg = self.cgroup
        ticket = _Ticket(cg.oom_kills() if cg else 0, cg.forks_refused() if cg else 0)
        with self.lock:
            if self.closed:
                raise RuntimeError("the sandbox group is closed")
            self.tickets.add(ticket)
        self.wake.set()
        return ticket

    def attach(self, ticket: _Ticket, pid: int) -> None:
        with self.lock:
            ticket.pid = pid
            doomed = self.closed or ticket.disk_killed
        if doomed:
            _kill(pid)

    def release(self, ticket: _Ticket) -> _GroupEvents:
        with self.lock:
            self.tickets.discard(ticket)
        cg = self.cgroup
        # (a closed group's counters are gone and read as 0: never a negative count)
        return _GroupEvents(oom_kills=max(cg.oom_kills() - ticket.oom_kills, 0) if cg else 0,
                            forks_refused=max(cg.forks_refused() - ticket.forks_refused, 0) if cg else 0,
                            disk_killed=ticket.disk_killed, memory_mb=self.memory_mb, processes=self.processes,
                            disk_mb=self.disk_mb, inodes=self.inodes)

    def kill_commands(self, disk: bool = False) -> None:
        with self.lock:
            running = list(self.tickets)
            for ticket in running:
                ticket.disk_killed = ticket.disk_killed or disk
        for ticket in running:
            if ticket.pid is not None:
                _kill(ticket.pid)

    # ---- disk -----------------------------------------------------------------------------------

    def disk_usage(self) -> tuple[int, int]:
        if self.mounted:
            st = os.statvfs(self.root)
            return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree
        used, entries, _ = _tree_usage(self.root, 2 * self.inodes)
        return used, entries

    def watch(self) -> None:
        """The disk watchdog (no tmpfs): while commands run, measure ``root`` and kill the commands when
        it is over quota and growing (a command that deletes files may run). A measure visits at most
        twice the inode quota; measures are spaced by 4x their own duration at least, so the watchdog
        takes at most ~20% of a core."""
        limit = self.disk_mb << 20
        while not self.stop.is_set():
            with self.lock:
                active = bool(self.tickets)
            if not active:
                self.wake.wait()
                self.wake.clear()
                continue
            began = time.monotonic()
            used, entries, complete = _tree_usage(self.root, 2 * self.inodes)
            took = time.monotonic() - began
            last_used, last_entries = self.last_scan
            self.last_scan = (used, entries)
            over = used > limit or entries > self.inodes
            if over and (not complete or used > last_used or entries > last_entries):
                self.kill_commands(disk=True)
            self.stop.wait(max(self.watch_interval_s, 4 * took))

    # ---- the end --------------------------------------------------------------------------------

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.stop.set()
        self.wake.set()
        self.kill_commands()
        if self.cgroup is not None:
            self.cgroup.kill()
            self.cgroup.remove()
        if self.watchdog is not None and self.watchdog is not threading.current_thread():
            self.watchdog.join(10)
        if self.mounted:
            _umount(self.root)
            self.mounted = False
        else:  # the same end as a tmpfs: the sandbox's files go
            for _ in range(3):
                for entry in list(os.scandir(self.root)) if self.root.is_dir() else []:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        try:
                            os.unlink(entry.path)
                        except OSError:
                            pass
                if not self.root.is_dir() or not any(os.scandir(self.root)):
                    break
                time.sleep(0.05)  # a killed command may still be writing
        if self.made_root:
            try:
                self.root.rmdir()
            except OSError:
                pass
        with _group_uids_lock:
            _group_uids.discard(self.uid)
        if self.record is not None:
            self.record.unlink(missing_ok=True)


class SandboxGroup:
    """Aggregate limits over every process of every command of one sandbox, and over its files.

    * **memory** (``memory_mb``, every process together, with the page cache and tmpfs pages they
      use, so a tmpfs quota's bytes count here too) and **processes** (``processes``, threads
      included) through a cgroup: v2 where memory and pids are enabled in a writable parent's
      ``cgroup.subtree_control``, else v1 (``<memory|pids hierarchy>/<this process's
      cgroup>/rsigym/<random name>``), else nothing (:attr:`mode` ``"rlimits"``, one WARNING per
      process; each command's rlimits still apply). A command whose process the kernel killed for
      the group's memory gets ``limit="memory"``; a refused fork ``limit="processes"``.
    * **disk** (``disk_mb`` bytes, ``inodes`` files) of the host directory :attr:`root`: as root a
      tmpfs of that size mounted there (:attr:`disk_mode` ``"tmpfs"``; writes past the quota fail
      with "No space left on device", ``limit="disk"``); else (one WARNING per process) a watchdog
      thread that measures :attr:`root` while commands run and kills them all when it is over quota
      and still growing (``limit="disk"``). The watchdog can be late by ``watch_interval_s`` of
      writing and cannot see files deleted while still open (each still bound by ``file_mb``).

    The kernel frees a finished command's PID namespace about a second late, and until then it still
    counts one process towards ``processes``: size it for the commands started per second too.

    Put the sandbox's directories under :attr:`root` with :meth:`subdir` (``run_isolated`` refuses a
    ``workdir`` or writable mount elsewhere); every command runs as :attr:`uid`, a random uid of the
    group's own (as root; visible inside, so not derived from a host path). :meth:`close` (also
    at the end of a ``with`` block, or at exit for a group left open) kills what still runs, removes
    the cgroup and unmounts the tmpfs: **the sandbox's files are gone afterwards** (in both disk
    modes), so copy out what you keep first. ``cgroups=False`` / ``mount=False`` or the environment
    variable ``RSIGYM_SANDBOX_FALLBACK=cgroups,mount`` (or ``all``) force the fallbacks.

    >>> import tempfile
    >>> with SandboxGroup(Path(tempfile.mkdtemp()) / "sb", memory_mb=512, disk_mb=64) as group:
    ...     app = group.subdir("app")
    ...     r = run_isolated("echo hi > f; cat f", workdir=app, group=group, require_isolation=False)
    ...     r.stdout, group.usage().disk_bytes > 0
    ('hi\\n', True)
    """

    def __init__(self, root: Path, *, memory_mb: int = 2048, processes: int = 512, disk_mb: int = 1024,
                 inodes: int = 65536, cgroups: bool = True, mount: bool = True,
                 watch_interval_s: float = 0.2) -> None:
        _reap_once()
        for label, value in (("memory_mb", memory_mb), ("processes", processes), ("disk_mb", disk_mb),
                             ("inodes", inodes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{label} must be a positive integer, not {value!r}")
        if not watch_interval_s > 0:
            raise ValueError(f"watch_interval_s must be positive, not {watch_interval_s!r}")
        root = Path(root)
        made_root = False
        if os.path.lexists(root):
            if root.is_symlink() or not root.is_dir():
                raise ValueError(f"a sandbox group's root must be a directory (not a symlink): {root}")
            if any(os.scandir(root)):
                raise ValueError(f"a sandbox group's root must be empty (a tmpfs would hide its files): {root}")
        else:
            root.mkdir(mode=0o755, parents=True)
            made_root = True
        self.root = Path(os.path.realpath(root))
        self.uid = _fresh_uid() if _as_root() else os.geteuid()
        self.memory_mb, self.processes, self.disk_mb, self.inodes = memory_mb, processes, disk_mb, inodes
        self._state = state = _GroupState(self.root, made_root, self.uid, memory_mb, processes, disk_mb, inodes,
                                          watch_interval_s)
        self._finalizer = weakref.finalize(self, state.close)
        self._identity: tuple[str, str] | None = None
        skip = _fallbacks()
        self.mode: GroupMode = "rlimits"
        if cgroups and "cgroups" not in skip:
            name = secrets.token_hex(8)
            try:
                state.cgroup = _Cgroup.create(name, memory_mb << 20, processes)
                self.mode = "cgroup2" if state.cgroup.version == 2 else "cgroup1"
            except _Unavailable as exc:
                why = str(exc).replace(name, "<name>")
        else:
            why = f"disabled by {'cgroups=False' if not cgroups else FALLBACK_ENV}"
        if state.cgroup is None:  # one warning per process and reason
            _warn_once(f"cgroups: {why}", "!!! sandbox groups have NO cgroup (%s): memory and processes are limited "
                       "per command only (rlimits), not over all the processes of a sandbox", why)
        self.disk_mode: DiskMode = "watchdog"
        if mount and "mount" not in skip and _as_root():
            try:
                _mount_tmpfs(self.root, disk_mb << 20, inodes)
                state.mounted = True
                self.disk_mode = "tmpfs"
            except _Unavailable as exc:
                why = str(exc)
        else:
            why = (f"disabled by {'mount=False' if not mount else FALLBACK_ENV}" if not mount or "mount" in skip
                   else "not root: cannot mount a tmpfs")
        # the sandbox user's passwd and group files live and go with the group (not in the host's /tmp)
        self._identity = _write_identity(self.root / _IDENTITY_DIR, self.uid)
        if not state.mounted:
            _warn_once(f"mount: {why}", "!!! sandbox disk quotas are enforced by a WATCHDOG only (%s): it kills a "
                       "sandbox's commands once its files pass the quota, up to %.2g s late", why, watch_interval_s)
            state.watchdog = threading.Thread(target=state.watch, name="rsigym-disk-watchdog", daemon=True)
            state.watchdog.start()
        state.record = _register_group(state)

    # ---- public ---------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._state.closed

    def subdir(self, name: str) -> Path:
        """``root/name``, made if missing and owned by :attr:`uid`: a sandbox's ``/app`` or a writable mount.

        ``name`` is one path component (the sandbox cannot write into :attr:`root` itself, so it cannot
        redirect it with a symlink).
        """
        if self.closed:
            raise RuntimeError("the sandbox group is closed")
        if not name or "/" in name or "\0" in name or name in (".", "..", _IDENTITY_DIR):
            raise ValueError(f"a sandbox group's subdirectory is one path component, not {name!r}")
        path = self.root / name
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            if path.is_symlink() or not path.is_dir():
                raise ValueError(f"{path} exists and is not a directory") from None
        claim(path, self.uid)
        return path

    def usage(self) -> GroupUsage:
        """Memory (peak and now), processes now, and the disk used under :attr:`root`.

        >>> import tempfile
        >>> with SandboxGroup(Path(tempfile.mkdtemp()) / "g", disk_mb=8) as g:
        ...     _ = (g.subdir("app") / "f").write_bytes(b"x" * 4096)
        ...     g.usage().disk_bytes >= 4096
        True
        """
        cg = self._state.cgroup
        disk, inodes = self._state.disk_usage() if not self.closed else (0, 0)
        return GroupUsage(memory_peak_bytes=cg.memory_peak() if cg else None,
                          memory_bytes=cg.memory_current() if cg else None,
                          processes=cg.processes() if cg else None,
                          processes_peak=cg.processes_peak() if cg else None, disk_bytes=disk, disk_inodes=inodes)

    def kill(self) -> None:
        """Kill every command running in the group (the group stays usable)."""
        self._state.kill_commands()
        if self._state.cgroup is not None:
            self._state.cgroup.kill(1.0)

    def close(self) -> None:
        """Kill what still runs, remove the cgroup, unmount the tmpfs (the files go); safe to call twice."""
        self._finalizer()

    def __enter__(self) -> "SandboxGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"SandboxGroup({str(self.root)!r}, mode={self.mode!r}, disk_mode={self.disk_mode!r}, "
                f"memory_mb={self.memory_mb}, processes={self.processes}, disk_mb={self.disk_mb}, "
                f"inodes={self.inodes}{', closed' if self.closed else ''})")

    # ---- for run_isolated / IsolatedProcess ------------------------------------------------------

    def _check_paths(self, workdir: Path, mounts: Sequence[Mount]) -> None:
        if self.closed:
            raise RuntimeError("the sandbox group is closed")
        for path in (workdir, *(Path(m.host) for m in mounts if m.writable)):
            real = os.path.realpath(path)
            if not real.startswith(str(self.root) + "/"):
                raise ValueError(f"{path} is not under the sandbox group's root {self.root}: its disk quota would "
                                 "not apply (make it with group.subdir())")

    def _join_argv(self, argv: list[str]) -> list[str]:
        cg = self._state.cgroup
        if cg is None:
            return argv
        return ["/bin/sh", "-c", _JOIN_SCRIPT, "rsigym-join", *cg.procs_files, "--", *argv]

    def _admit(self) -> _Ticket:
        return self._state.admit()

    def _attach(self, ticket: _Ticket, pid: int) -> None:
        self._state.attach(ticket, pid)

    def _release(self, ticket: _Ticket) -> _GroupEvents:
        return self._state.release(ticket)

    def _rebase(self, ticket: _Ticket) -> None:
        """Count a running command's group events (OOM kills, refused forks) from now on."""
        cg = self._state.cgroup
        if cg is not None:
            ticket.oom_kills, ticket.forks_refused = cg.oom_kills(), cg.forks_refused()
