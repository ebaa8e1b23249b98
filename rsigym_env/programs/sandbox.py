"""Program researchers, host side: a program's code runs in a sandbox of its own, reached only by reset/act.

:class:`ProgramResearcher` implements the researcher protocol (``reset``/``act``) by sending JSON
messages to :mod:`rsigym_env.programs.runtime` running inside a sandbox (the protocol is in that
module's docstring). The program never sees this process or its objects: only the observations and
infos of its episodes, as JSON (:func:`to_jsonable`: NumPy arrays become lists, non-finite floats
``null``), and it answers with actions.

The sandbox
-----------
The local world's isolation layer (:mod:`rsigym_env.worlds.local.sandbox.isolation`, bubblewrap): its
own PID, IPC, UTS and network namespaces (no network at all: a loopback of its own), the host's
programs read-only, a fresh ``/tmp``, a masked ``/proc``, an unprivileged uid of its own when we run as
root, rlimits (address space, CPU seconds per process, processes, file size) and a
:class:`~rsigym_env.worlds.local.sandbox.isolation.SandboxGroup` (a cgroup bounding memory and processes
over the whole sandbox, a size-bounded tmpfs for its files). Inside it sees only the base interpreter
(where the isolation layer shows it, e.g. ``/root/.pyenv/versions``, else bound at ``/python``;
read-only, an empty directory over its site-packages; run with ``-I -S``: no user site, no
``PYTHONPATH``), the host's system files, the runtime
(``/runtime``), its program's files (``/program``, read-only) and an empty working directory
(``/app``): no ledger, audit log, ``$RSIGYM_HOME``, ``/work``, run directory, other candidate or
evaluator. Without bubblewrap a program is refused (``isolation_unavailable``) unless
``RSIGYM_UNSANDBOXED_PROGRAMS=1`` is set: then it runs as a plain process with rlimits only, and a
loud warning is logged (trusted code only).

Limits (:class:`ProgramLimits`): a reply to each ``reset``/``act`` within ``act_wall_s``, at most
``episode_wall_s`` of the program's time (summed over the episode's replies), ``cpu_s`` CPU seconds
per episode process, ``memory_mb`` per process and over the sandbox, ``processes`` (threads
included), ``reply_bytes`` per reply, ``disk_mb`` of files. Whatever goes wrong (a timeout, a crash, a
garbled reply, the program raising) kills what needs killing and raises :class:`ProgramError` with a
:attr:`~ProgramError.code` and the reason; the episode is then over (``rsigym_env.sweep.run_spec``
records it as failed, and ``env.close()`` bills the jobs that ran).

The pool
--------
Starting a sandbox costs ~60 ms here (bubblewrap, the interpreter, the standard-library modules of
:data:`~rsigym_env.programs.runtime.PRELOAD`, compiling the program), a sim episode a few: :class:`ProgramPool` keeps live
sandboxes (one per program and limits; another one when two episodes of a program run at once) and
each episode runs in a fresh process forked from the sandbox's zygote. A sandbox whose episode failed
is never reused; idle sandboxes beyond the pool's capacity, and all of them at exit, are closed.
Measured on 2 shared cores (``bench/bench_program_sandbox.py``): an episode's fork and end ~1.5 ms, an
``act``'s round trip ~75 µs; the seed program's sim episodes ~3.5x slower than in-process with the
pool, ~28x without it.

>>> code = {"researcher.py": '''
... class Submitter:
...     def reset(self, observation, info, seed):
...         pass
...     def act(self, observation, info):
...         return {"tool": "submit", "args": {}}
... def make_researcher(params):
...     return Submitter()
... '''}
>>> import gymnasium as gym, rsigym_env
>>> from rsigym_env.episode import run_episode
>>> researcher = ProgramResearcher(code, {}, name="submitter")   # no process yet: its sandbox starts at reset
>>> try:
...     result = run_episode(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=50), researcher, seed=0)
... except ProgramError as exc:   # no bubblewrap on this machine: refused, the message says how to install it
...     print(exc.code == "isolation_unavailable")
... else:
...     print(result.steps == 1 and result.info["submitted"]["by"] == "agent")
True
>>> researcher.close()
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import os
import posixpath
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping


from rsigym_env.canonical import jsonable
from rsigym_env.worlds.local.sandbox import isolation
from rsigym_env.worlds.local.sandbox.isolation import INSTALL_HINT, Limits, Mount, SandboxGroup, bwrap_available

from . import runtime

log = logging.getLogger("rsigym_env.programs")

UNSANDBOXED_ENV = "RSIGYM_UNSANDBOXED_PROGRAMS"
RUNTIME_FILE = Path(runtime.__file__)
# Processes of a sandbox that are not the program's: the cgroup-join shell/bwrap, bwrap's init, the zygote.
_OWN_PROCESSES = 4
_SIGNALS = {int(signal.SIGXCPU): "program_cpu", int(signal.SIGXFSZ): "program_crashed"}


@dataclass(frozen=True)
class ProgramLimits:
    """What a program may use. Defaults suit a sim episode (a few ms of work per act).

    >>> ProgramLimits(act_wall_s=2).memory_mb
    512
    """

    act_wall_s: float = 10.0       # wall seconds for the reply to one reset or act
    episode_wall_s: float = 120.0  # wall seconds of the program's replies, summed over an episode
    start_wall_s: float = 30.0     # wall seconds for a sandbox to start and compile the program
    cpu_s: int = 60                # CPU seconds per episode process (RLIMIT_CPU: SIGXCPU, then SIGKILL)
    memory_mb: int = 512           # address space per process (RLIMIT_AS) and memory of the whole sandbox (cgroup)
    processes: int = 16            # processes and threads of the program (RLIMIT_NPROC, and the cgroup)
    reply_bytes: int = 1 << 20     # largest reply line
    disk_mb: int = 64              # files in /app (the sandbox's tmpfs) and in /tmp; largest file (RLIMIT_FSIZE)
    stderr_bytes: int = 16 << 10   # bytes of the program's stderr kept for error messages (the rest is dropped)
    max_attempts: int = 50         # tampering attempts recorded per episode

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                    or not math.isfinite(value):
                raise ValueError(f"ProgramLimits.{name} must be a positive number, not {value!r}")

    @classmethod
    def bounds(cls) -> "ProgramLimits":
        """The most any scenario may grant (:data:`LIMIT_BOUNDS`)."""
        return cls(**LIMIT_BOUNDS)

    @classmethod
    def parse(cls, values: Mapping[str, Any] | None, base: "ProgramLimits | None" = None,
              ceiling: "ProgramLimits | None" = None) -> "ProgramLimits":
        """``base`` (default: the defaults) with a spec's or a scenario's ``values`` (field -> number): each
        must be a positive number (an integer for integer fields), at most :data:`LIMIT_BOUNDS` and at
        most ``ceiling`` (default: ``base``: a spec can tighten what it is granted, never loosen it);
        ``ValueError`` naming the field otherwise.

        >>> ProgramLimits.parse({"act_wall_s": 2, "memory_mb": 256}).act_wall_s
        2
        >>> ProgramLimits.parse({"act_wall_s": 60}, ceiling=ProgramLimits.bounds()).act_wall_s  # a scenario
        60
        >>> ProgramLimits.parse({"memory_mb": 4096})
        Traceback (most recent call last):
        ...
        ValueError: program limit memory_mb: 4096 is above what is granted here (512)
        """
        base = base or cls()
        top = asdict(ceiling or base)
        out = asdict(base)
        for name, value in (values or {}).items():
            if name not in out:
                raise ValueError(f"unknown program limit {name!r}; known: {', '.join(out)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"program limit {name}: must be a positive number, got {value!r}")
            if isinstance(out[name], int) and not isinstance(value, int):
                raise ValueError(f"program limit {name}: must be an integer, got {value!r}")
            if value > LIMIT_BOUNDS[name]:
                raise ValueError(f"program limit {name}: {value} is above the bound {LIMIT_BOUNDS[name]}")
            if value > top[name]:
                raise ValueError(f"program limit {name}: {value} is above what is granted here ({top[name]})")
            out[name] = value
        return cls(**out)


# The most any spec or scenario may set (ProgramLimits.parse): a scenario raises a program's limits at
# most to these, a spec only lowers what its scenario grants.
LIMIT_BOUNDS: dict[str, float] = {
    "act_wall_s": 120.0, "episode_wall_s": 3600.0, "start_wall_s": 120.0, "cpu_s": 3600, "memory_mb": 4096,
    "processes": 64, "reply_bytes": 16 << 20, "disk_mb": 1024, "stderr_bytes": 1 << 20, "max_attempts": 1000,
}


class ProgramError(RuntimeError):
    """A program researcher failed; :attr:`code` says how, the message says why.

    Codes: ``program_invalid`` (bad files or parameters, a syntax error), ``program_raised`` (the
    program's code raised: its ``Type: message`` and traceback follow), ``program_timeout`` (no reply
    in time), ``program_cpu`` (its CPU limit), ``program_memory`` (its memory limit),
    ``program_processes`` (its process limit), ``program_crashed`` (its process died),
    ``program_protocol`` (a garbled, oversized or unexpected reply, or an action that is not JSON),
    ``isolation_unavailable`` (no sandbox here).

    >>> e = ProgramError("program_timeout", "no reply within 2 s")
    >>> e.code, str(e)
    ('program_timeout', 'program_timeout: no reply within 2 s')
    """

    CODES = ("program_invalid", "program_raised", "program_timeout", "program_cpu", "program_memory",
             "program_processes", "program_crashed", "program_protocol", "isolation_unavailable")

    def __init__(self, code: str, message: str, *, traceback: str = "", stderr: str = "",
                 attempts: list[dict[str, str]] | None = None) -> None:
        self.code, self.message = code, message
        self.traceback, self.stderr = traceback, stderr
        self.attempts = list(attempts or [])
        text = f"{code}: {message}"
        if traceback:
            text += f"\nthe program's traceback:\n{traceback.rstrip()}"
        if stderr:
            text += f"\nthe end of its stderr:\n{stderr.rstrip()}"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_error, (self.code, self.message, self.traceback, self.stderr, self.attempts))


def _rebuild_error(code: str, message: str, tb: str, stderr: str, attempts: list[dict[str, str]]) -> ProgramError:
    return ProgramError(code, message, traceback=tb, stderr=stderr, attempts=attempts)


# ------------------------------------------------------------------------------------------ JSON


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON data for a sandbox: :func:`rsigym_env.canonical.jsonable` (the REST
    gateway's encoding), anything it does not know as its ``str``.

    >>> import numpy as np
    >>> to_jsonable({"a": np.array([1.5, np.nan]), "b": (1, np.int64(2)), "c": {3}, 4: None})
    {'a': [1.5, None], 'b': [1, 2], 'c': [3], '4': None}
    """
    return jsonable(value, fallback=str)


def _dumps(value: Any) -> str:
    return json.dumps(to_jsonable(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def check_params(params: Any) -> dict[str, Any]:
    """``params`` as a JSON object of scalars and lists of scalars, or :class:`ProgramError`."""
    if params is None:
        return {}
    if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
        raise ProgramError("program_invalid", f"params must be a dict with string keys, not {params!r:.200}")
    plain = to_jsonable(params)
    for key, value in plain.items():
        items = value if isinstance(value, list) else [value]
        if not all(v is None or isinstance(v, (str, int, float, bool)) for v in items):
            raise ProgramError("program_invalid", f"parameter {key} must be a scalar or a list of scalars, "
                                                  f"not {value!r:.200}")
    return plain


def program_key(code: dict[str, str], limits: ProgramLimits) -> str:
    """The pool's key of a program: a hash of its files and its limits (params are per episode).

    >>> program_key({"researcher.py": "x = 1"}, ProgramLimits()) == program_key({"researcher.py": "x = 1"}, ProgramLimits())
    True
    """
    blob = json.dumps([sorted(code.items()), asdict(limits)], sort_keys=True).encode("utf-8", "surrogatepass")
    return hashlib.sha256(blob).hexdigest()


# ----------------------------------------------------------------------------------- the sandbox


_started_lock = threading.Lock()
_started_total = 0


def sandboxes_started() -> int:
    """Sandboxes (bubblewrap + interpreter processes) this process has started so far."""
    return _started_total


def _count_start() -> None:
    global _started_total
    with _started_lock:
        _started_total += 1


@lru_cache(maxsize=1)
def _interpreter() -> tuple[str, tuple[Mount, ...], tuple[tuple[str, str], ...]]:
    """(the interpreter's path inside the sandbox, the mounts it needs, environment variables).

    The base interpreter of this process (a venv's is not usable: its packages are not the program's),
    where the isolation layer shows it (``/usr``, ``/root/.pyenv/versions``, ...); an installation it
    does not show (e.g. under ``/home``) is bound read-only at ``/python``.
    """
    exe = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
    if isolation.shows(exe):
        return exe, (), ()
    prefix = os.path.realpath(sys.base_prefix)
    rel = os.path.relpath(exe, prefix)
    if rel.startswith("..") or prefix == "/":
        for fallback in ("/usr/bin/python3", "/usr/local/bin/python3"):
            if os.access(fallback, os.X_OK):
                log.warning("the base interpreter %s is not under its prefix %s: programs run under %s", exe, prefix,
                            fallback)
                return fallback, (), ()
        raise ProgramError("isolation_unavailable", f"no interpreter to run programs with: {exe} is not under {prefix}")
    return posixpath.join("/python", rel), (Mount(Path(prefix), "/python"),), (("LD_LIBRARY_PATH", "/python/lib"),)


@lru_cache(maxsize=1)
def _site_packages() -> str | None:
    """The base installation's site-packages as the sandbox sees it, if there is one: an empty
    directory is shown over it, so that nothing installed there (pip, ``.pth`` files, perhaps this very
    package) is there for a program to put on its path."""
    exe, mounts, _ = _interpreter()
    if exe.startswith("/usr/"):
        return None
    inside = f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    prefix = os.path.realpath(sys.base_prefix)
    if os.path.isdir(os.path.join(prefix, inside)):
        return f"/python/{inside}" if mounts else posixpath.join(prefix, inside)
    return None


def _base_executable() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)


_warned_unsandboxed = False


def _unsandboxed_allowed() -> bool:
    return os.environ.get(UNSANDBOXED_ENV, "").strip().lower() in ("1", "true", "yes")


class _Dead(Exception):
    """The sandbox's process closed its end of the pipes."""


class _Sandbox:
    """One live sandbox: bubblewrap around the runtime's zygote, its pipes, its group, its files."""

    def __init__(self, code: dict[str, str], limits: ProgramLimits, key: str) -> None:
        global _warned_unsandboxed
        self.key, self.limits = key, limits
        self.pending_end = False   # an `end` was sent and its `ended` not read yet
        self.broken = False
        isolated = bwrap_available()
        if not isolated and not _unsandboxed_allowed():
            raise ProgramError("isolation_unavailable", f"programs run only in a sandbox. {INSTALL_HINT}. (Or set "
                               f"{UNSANDBOXED_ENV}=1 to run them as plain processes: trusted code only.)")
        self.root = Path(tempfile.mkdtemp(prefix="rsigym-program-"))
        self.group: SandboxGroup | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._ticket: Any = None
        self._buf = bytearray()
        self._stderr = bytearray()
        self._finalizer = weakref.finalize(self, _Sandbox._cleanup, os.getpid(), self.root, None, None, None)
        try:
            self.group = SandboxGroup(self.root / "sandbox", memory_mb=limits.memory_mb,
                                      processes=limits.processes + _OWN_PROCESSES, disk_mb=limits.disk_mb,
                                      inodes=8192)
            program = self.group.subdir("program")
            for name, text in code.items():
                (program / name).write_text(text, encoding="utf-8", errors="surrogatepass")
            rt = self.group.subdir("runtime")
            shutil.copyfile(RUNTIME_FILE, rt / "runtime.py")
            app = self.group.subdir("app")
            if isolated:
                exe, mounts, env = _interpreter()
                hidden = _site_packages()
                mounts = (*mounts, *((Mount(self.group.subdir("empty"), hidden),) if hidden else ()),
                          Mount(program, "/program"), Mount(rt, "/runtime"))
                argv = [exe, "-I", "-S", "-B", "/runtime/runtime.py", "--program", "/program", "--isolated",
                        "--scratch", isolation.APP, "--scratch", "/tmp"]
                environment = dict(env)
            else:
                if not _warned_unsandboxed:
                    _warned_unsandboxed = True
                    log.warning("!!! %s=1: program researchers run UNSANDBOXED, as plain processes of this user with "
                                "rlimits only: they can read and write what this process can. Trusted code only. %s",
                                UNSANDBOXED_ENV, INSTALL_HINT)
                tmp = self.group.subdir("tmp")
                mounts = ()
                argv = [_base_executable(), "-I", "-S", "-B", str(rt / "runtime.py"), "--program", str(program),
                        "--scratch", str(app), "--scratch", str(tmp)]
                environment = {"TMPDIR": str(tmp), "HOME": str(app)}
            iso_limits = Limits(wall_s=limits.start_wall_s, cpu_s=int(limits.cpu_s), memory_mb=int(limits.memory_mb),
                                processes=int(limits.processes), output_bytes=int(limits.reply_bytes),
                                file_mb=int(limits.disk_mb))
            # the isolation layer's own preparation (checks, claims, the bwrap options through a memfd);
            # a long-lived process with pipes both ways is what its run_isolated/IsolatedProcess do not offer
            prep = isolation._prepare(argv, app, isolation.APP, mounts, environment, False, iso_limits,
                                      isolated, None, self.group)
            try:
                self._ticket = self.group._admit()
                self.proc = subprocess.Popen(self.group._join_argv(prep.argv), cwd=prep.cwd, env=prep.env,
                                             start_new_session=True, pass_fds=prep.pass_fds, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
            finally:
                prep.close()
            _count_start()
            self.group._attach(self._ticket, self.proc.pid)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _Sandbox._cleanup, os.getpid(), self.root, self.group,
                                               self.proc, self._ticket)
            for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                os.set_blocking(f.fileno(), False)  # type: ignore[union-attr]
            self._poll = select.poll()
            self._poll.register(self.proc.stdout.fileno(), select.POLLIN)  # type: ignore[union-attr]
            self._poll.register(self.proc.stderr.fileno(), select.POLLIN)  # type: ignore[union-attr]
            ready = self._reply(time.monotonic() + limits.start_wall_s, "start")
            if ready.get("error"):
                raise self._error_reply(ready, "start")
            if not ready.get("ready") or ready.get("protocol") != runtime.PROTOCOL:
                raise self._fail("program_protocol", f"the sandbox did not start as expected: {str(ready)[:300]}")
            self.modules: list[str] = list(ready.get("modules") or [])
            self.hardened = bool(ready.get("hardened"))
            self.isolated = isolated
        except BaseException:
            self.close()
            raise

    # ---- the end ------------------------------------------------------------------------------

    @staticmethod
    def _cleanup(owner: int, root: Path, group: SandboxGroup | None, proc: subprocess.Popen[bytes] | None,
                 ticket: Any) -> None:
        if os.getpid() != owner:  # a forked copy of the process that started it: not ours to kill
            return
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            for f in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    f.close()  # type: ignore[union-attr]
                except OSError:
                    pass
        if group is not None:
            if ticket is not None:
                try:
                    group._release(ticket)
                except Exception:  # noqa: BLE001
                    pass
            group.close()
        shutil.rmtree(root, ignore_errors=True)

    def close(self) -> None:
        """Kill the sandbox and everything in it; remove its files (safe to call twice)."""
        self.broken = True
        self._finalizer()

    @property
    def alive(self) -> bool:
        return not self.broken and self.proc is not None and self.proc.poll() is None

    # ---- talking ------------------------------------------------------------------------------

    def _drain_stderr(self) -> None:
        fd = self.proc.stderr.fileno()  # type: ignore[union-attr]
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not chunk:
                return
            self._stderr += chunk
            if len(self._stderr) > self.limits.stderr_bytes:
                del self._stderr[: len(self._stderr) - self.limits.stderr_bytes]

    def stderr_tail(self, chars: int = 2000) -> str:
        if self.proc is not None and self.proc.stderr is not None and not self.proc.stderr.closed:
            self._drain_stderr()
        return self._stderr.decode("utf-8", errors="replace")[-chars:]

    def _write(self, data: bytes, deadline: float, op: str) -> None:
        fd = self.proc.stdin.fileno()  # type: ignore[union-attr]
        view = memoryview(data)
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(op)
            if not poller.poll(max(1, int(left * 1000))):
                continue
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                raise _Dead() from None

    def _line(self, deadline: float, op: str) -> bytes:
        out_fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        while True:
            cut = self._buf.find(b"\n")
            if cut >= 0:
                line = bytes(self._buf[:cut])
                del self._buf[: cut + 1]
                if line.strip():
                    return line
                continue
            if len(self._buf) > self.limits.reply_bytes:
                raise self._fail("program_protocol", f"a reply longer than {self.limits.reply_bytes} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(op)
            for fd, _ in self._poll.poll(max(1, math.ceil(left * 1000))):
                if fd == out_fd:
                    try:
                        chunk = os.read(out_fd, 1 << 16)
                    except (BlockingIOError, InterruptedError):
                        continue
                    if not chunk:
                        raise _Dead()
                    self._buf += chunk
                else:
                    self._drain_stderr()

    def _reply(self, deadline: float, op: str) -> dict[str, Any]:
        """The next reply (a JSON object), or :class:`ProgramError` (the sandbox is then closed)."""
        try:
            line = self._line(deadline, op)
        except TimeoutError:
            raise self._fail("program_timeout", f"no reply to {op} in time: the sandbox was killed") from None
        except _Dead:
            raise self._died(op) from None
        try:
            reply = json.loads(line)
        except ValueError:
            raise self._fail("program_protocol", f"a reply to {op} that is not JSON: {line[:200]!r}") from None
        if not isinstance(reply, dict):
            raise self._fail("program_protocol", f"a reply to {op} that is not a JSON object: {line[:200]!r}")
        return reply

    def call(self, message: dict[str, Any], timeout: float, op: str) -> dict[str, Any]:
        """Send ``message``, return its reply; :class:`ProgramError` (the sandbox closed) on any failure,
        the program's own errors included."""
        if not self.alive:
            raise ProgramError("program_crashed", "the program's sandbox is not running")
        deadline = time.monotonic() + timeout
        data = (_dumps(message) + "\n").encode("utf-8", errors="surrogatepass")
        try:
            self._write(data, deadline, op)
        except TimeoutError:
            raise self._fail("program_timeout", f"the program did not read its {op} message in time") from None
        except _Dead:
            raise self._died(op) from None
        reply = self._reply(deadline, op)
        while reply.get("ended") is True and reply.get("idle") is True:
            # the answer to an `end` sent after the episode's process had already ended by itself (whose
            # own `ended` was read as the end's): nothing to do with this request
            reply = self._reply(deadline, op)
        if reply.get("error") is not None or "ended" in reply:
            raise self._error_reply(reply, op)
        return reply

    def end(self, wait: bool, timeout: float = 5.0) -> bool:
        """End the running episode: True if the sandbox is fit for another one. ``wait=False`` only sends
        ``end`` (from a finalizer: no blocking); :meth:`settle` reads its answer later."""
        if not self.alive:
            return False
        data = b'{"op":"end"}\n'
        if not wait:
            try:
                if os.write(self.proc.stdin.fileno(), data) != len(data):  # type: ignore[union-attr]
                    return False
            except OSError:
                return False
            self.pending_end = True
            return True
        try:
            self._write(data, time.monotonic() + timeout, "end")
        except (TimeoutError, _Dead):
            return False
        self.pending_end = True
        return self.settle(timeout)

    def settle(self, timeout: float = 5.0) -> bool:
        """Read the ``ended`` of an episode whose ``end`` was sent: True if it ended cleanly, with nothing
        else said meanwhile."""
        if not self.pending_end:
            return self.alive
        self.pending_end = False
        try:
            reply = self._reply(time.monotonic() + timeout, "end")
        except ProgramError:
            return False
        healthy = (reply.get("ended") is True and reply.get("clean") is True and reply.get("exit") == 0
                   and not self._buf.strip())
        zygote_cpu = reply.get("zygote_cpu_s")
        if isinstance(zygote_cpu, (int, float)) and zygote_cpu > self.limits.cpu_s / 2:
            healthy = False  # its own CPU limit would end it soon: retire it while it is idle
        return healthy and self.alive

    # ---- failures -----------------------------------------------------------------------------

    def _memory_hit(self) -> bool:
        try:
            peak = self.group.usage().memory_peak_bytes if self.group is not None else None
        except Exception:  # noqa: BLE001
            peak = None
        return peak is not None and peak >= 0.9 * (self.limits.memory_mb << 20)

    def _fail(self, code: str, message: str, *, tb: str = "", attempts: list[dict[str, str]] | None = None,
              ) -> ProgramError:
        """Kill the sandbox and make the error (with the end of its stderr)."""
        stderr = self.stderr_tail() if self.proc is not None else ""
        self.close()
        return ProgramError(code, message, traceback=tb, stderr=stderr, attempts=attempts)

    def _died(self, op: str) -> ProgramError:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(2)
            except subprocess.TimeoutExpired:
                code = None
        if self._memory_hit():
            return self._fail("program_memory", f"the sandbox was killed at its memory limit "
                                                f"({self.limits.memory_mb} MB) during {op}")
        how = f"exit code {code}" if code is not None and code >= 0 else (
            f"signal {-code}" if code is not None else "unknown")
        return self._fail("program_crashed", f"the program's sandbox ended during {op} ({how})")

    def _error_reply(self, reply: dict[str, Any], op: str) -> ProgramError:
        attempts = reply.get("attempts") if isinstance(reply.get("attempts"), list) else []
        if "ended" in reply:  # the episode's process died without a reply
            sig = reply.get("signal")
            if isinstance(sig, int):
                if sig == int(signal.SIGKILL) and self._memory_hit():
                    return self._fail("program_memory", f"the episode's process was killed at the sandbox's memory "
                                                        f"limit ({self.limits.memory_mb} MB) during {op}")
                if sig == int(signal.SIGXCPU):
                    return self._fail("program_cpu", f"the episode's process reached its CPU limit "
                                                     f"({self.limits.cpu_s} s) during {op}")
                name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
                extra = " (file size limit)" if sig == int(signal.SIGXFSZ) else ""
                return self._fail(_SIGNALS.get(sig, "program_crashed"),
                                  f"the episode's process was killed by {name}{extra} during {op}")
            return self._fail("program_crashed", f"the episode's process exited (code {reply.get('exit')}) during "
                                                 f"{op} without replying")
        error = str(reply.get("error"))[:2000]
        tb = str(reply.get("traceback") or "")[-runtime.TRACEBACK_CHARS:]
        code = str(reply.get("code") or "program_raised")
        if code not in ProgramError.CODES or code in ("isolation_unavailable", "program_timeout"):
            code = "program_raised"
        if error.startswith("MemoryError"):
            code = "program_memory"
        elif code == "program_raised" and ("[Errno 11]" in error or "can't start new thread" in error) and \
                ("fork" in tb or "thread" in tb or "BlockingIOError" in error):
            code = "program_processes"
        where = {"start": "while loading", "reset": "in make_researcher/reset", "act": "in act"}.get(op, op)
        return self._fail(code, f"the program failed {where}: {error}", tb=tb, attempts=attempts)


# ------------------------------------------------------------------------------------------ the pool


class ProgramPool:
    """Live sandboxes kept for reuse, by program (files and limits): at most ``capacity`` idle ones
    (least recently used closed first); ``capacity=0`` starts a sandbox per episode. Thread-safe: a
    sandbox serves one episode at a time; a second concurrent episode of a program gets its own.

    >>> pool = ProgramPool(capacity=2)
    >>> pool.started, pool.idle
    (0, 0)
    >>> pool.close()
    """

    def __init__(self, capacity: int = 8) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, not {capacity}")
        self.capacity = capacity
        self.started = 0
        self._idle: OrderedDict[int, _Sandbox] = OrderedDict()  # id(sandbox) -> sandbox, oldest first
        self._lock = threading.Lock()
        # sandboxes given back by researchers' finalizers, which may run at any allocation, even inside
        # a method of this pool holding its lock: a deque's append is atomic and takes no lock
        self._returned: deque[_Sandbox] = deque()
        self._pid = os.getpid()

    @property
    def idle(self) -> int:
        self._take_returned()
        return len(self._idle)

    def give_back(self, sandbox: _Sandbox) -> None:
        """:meth:`release` (reusable) from a finalizer: never blocks, never takes a lock."""
        self._returned.append(sandbox)

    def _take_returned(self) -> None:
        while self._returned:
            try:
                sandbox = self._returned.popleft()
            except IndexError:
                return
            self.release(sandbox, True)

    def _forked(self) -> None:
        """In a forked child: forget the parent's sandboxes (its pipes, its processes), do not kill them."""
        if os.getpid() != self._pid:
            with self._lock:
                self._pid, self._idle = os.getpid(), OrderedDict()
                self._returned.clear()

    def acquire(self, key: str, code: dict[str, str], limits: ProgramLimits) -> _Sandbox:
        """A sandbox of this program for one episode: an idle one, else a new one."""
        self._forked()
        self._take_returned()
        while True:
            with self._lock:
                found = next((sid for sid, sb in reversed(self._idle.items()) if sb.key == key), None)
                sandbox = self._idle.pop(found) if found is not None else None
            if sandbox is None:
                break
            if sandbox.settle() and sandbox.alive:
                return sandbox
            sandbox.close()
        sandbox = _Sandbox(code, limits, key)
        with self._lock:
            self.started += 1
        return sandbox

    def release(self, sandbox: _Sandbox, reusable: bool) -> None:
        """Give a sandbox back after an episode; closed unless ``reusable`` (and alive, and room)."""
        evicted: list[_Sandbox] = []
        with self._lock:
            if reusable and sandbox.alive and self.capacity > 0 and os.getpid() == self._pid:
                self._idle[id(sandbox)] = sandbox
                while len(self._idle) > self.capacity:
                    evicted.append(self._idle.popitem(last=False)[1])
            else:
                evicted.append(sandbox)
        for sb in evicted:
            sb.close()

    def close(self) -> None:
        """Close every idle sandbox (the pool stays usable)."""
        self._take_returned()
        with self._lock:
            idle, self._idle = list(self._idle.values()), OrderedDict()
        for sb in idle:
            sb.close()


_default_pool: ProgramPool | None = None
_default_lock = threading.Lock()


def default_pool() -> ProgramPool:
    """The process's shared pool (8 idle sandboxes at most, closed at exit)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = ProgramPool(8)
            atexit.register(_default_pool.close)
        return _default_pool


# ------------------------------------------------------------------------------------ the researcher


class _Lease:
    """The sandbox a researcher holds and whether an episode is open in it (apart from the researcher,
    so that its finalizer can give the sandbox back)."""

    def __init__(self, pool: ProgramPool) -> None:
        self.pool = pool
        self.sandbox: _Sandbox | None = None
        self.open = False

    def finish(self, wait: bool = True) -> None:
        """End the open episode (if any) and give the sandbox back to the pool."""
        sandbox, self.sandbox = self.sandbox, None
        if sandbox is None:
            return
        reusable = sandbox.end(wait) if self.open else sandbox.alive
        self.open = False
        if wait:
            self.pool.release(sandbox, reusable)
        elif reusable:
            self.pool.give_back(sandbox)
        else:
            sandbox.close()

    def fail(self) -> None:
        """The episode failed: the sandbox is closed, never reused."""
        sandbox, self.sandbox, self.open = self.sandbox, None, False
        if sandbox is not None:
            self.pool.release(sandbox, False)


STRIKE_S = 600.0  # a program that exhausted a time limit is refused at once for this long (per host process)
_STRIKES: dict[str, tuple[float, str, str]] = {}  # program key -> (when, code, what happened)
_STRIKES_LOCK = threading.Lock()


def _strike(key: str, code: str, message: str) -> None:
    with _STRIKES_LOCK:
        _STRIKES[key] = (time.monotonic(), code, message)


def _struck(key: str) -> tuple[float, str, str] | None:
    """The recent time-limit failure of this program, if any (a hanging program costs one timeout per
    :data:`STRIKE_S`, not one per episode: an evaluation of many episodes stays short)."""
    with _STRIKES_LOCK:
        hit = _STRIKES.get(key)
        if hit is not None and time.monotonic() - hit[0] > STRIKE_S:
            del _STRIKES[key]
            return None
        return hit


class ProgramResearcher:
    """A researcher whose behaviour is a program (``code``: file name -> source, ``params``: scalars)
    run in a sandbox (see the module docstring). ``attempts``: the tampering attempts its sandbox
    recorded this episode (``{"event", "detail"}`` dicts). :meth:`close` gives the sandbox back.

    Invalid files or parameters raise :class:`ProgramError` (``program_invalid``) here; everything else
    that goes wrong raises it from :meth:`reset` or :meth:`act`.
    """

    def __init__(self, code: dict[str, str], params: dict[str, Any] | None = None, *, name: str = "program",
                 limits: ProgramLimits = ProgramLimits(), pool: ProgramPool | None = None) -> None:
        try:
            self.code = runtime.check_code(code)
        except ValueError as exc:
            raise ProgramError("program_invalid", str(exc)) from None
        self.params = check_params(params)
        self.name = name
        self.limits = limits
        self.pool = pool if pool is not None else default_pool()
        self.key = program_key(self.code, limits)
        self.attempts: list[dict[str, str]] = []
        self._seen: set[tuple[str, str]] = set()
        self._program_s = 0.0
        self._lease = _Lease(self.pool)
        self._finalizer = weakref.finalize(self, self._lease.finish, False)

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        self._lease.finish(wait=True)  # the previous episode, if any
        self.attempts, self._seen, self._program_s = [], set(), 0.0
        struck = _struck(self.key)
        if struck is not None:
            when, code, what = struck
            raise ProgramError(code, f"program {self.name!r}: not run: {time.monotonic() - when:.0f} s ago an episode "
                                     f"of it ran out of time ({what}); it is refused for {STRIKE_S:g} s")
        try:
            self._lease.sandbox = self.pool.acquire(self.key, self.code, self.limits)
        except ProgramError as exc:
            raise ProgramError(exc.code, f"program {self.name!r}: {exc.message}", traceback=exc.traceback,
                               stderr=exc.stderr) from None
        self._lease.open = True
        self._call({"op": "reset", "observation": observation, "info": info, "seed": seed, "params": self.params},
                   "reset")

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any:
        reply = self._call({"op": "act", "observation": observation, "info": info}, "act")
        if "action" not in reply:
            self._lease.fail()
            raise ProgramError("program_protocol", f"a reply to act without an action: {str(reply)[:300]}")
        return reply["action"]

    def close(self) -> None:
        """End the episode (if one is open) and give the sandbox back to its pool."""
        self._finalizer.detach()
        self._lease.finish(wait=True)

    def _call(self, message: dict[str, Any], op: str) -> dict[str, Any]:
        sandbox = self._lease.sandbox
        if sandbox is None:
            raise RuntimeError(f"{self.name}: reset() first (or the episode has already failed)")
        left = self.limits.episode_wall_s - self._program_s
        timeout = min(self.limits.act_wall_s, left)
        started = time.monotonic()
        try:
            if timeout <= 0:
                raise sandbox._fail("program_timeout", f"the program used its {self.limits.episode_wall_s:g} s "
                                                       "of the episode")
            reply = sandbox.call(message, timeout, op)
        except ProgramError as exc:
            self._add(exc.attempts)
            self._lease.fail()
            message = exc.message
            if exc.code in ("program_timeout", "program_cpu"):
                _strike(self.key, exc.code, message[:200])
            if exc.code == "program_timeout" and not message.startswith("the program used"):
                message += (f" (its limit: {self.limits.act_wall_s:g} s per {op})" if timeout == self.limits.act_wall_s
                            else f" (the rest of its {self.limits.episode_wall_s:g} s per episode)")
            raise ProgramError(exc.code, f"program {self.name!r}: {message}", traceback=exc.traceback,
                               stderr=exc.stderr, attempts=self.attempts) from None
        finally:
            self._program_s += time.monotonic() - started
        self._add(reply.get("attempts"))
        return reply

    def _add(self, attempts: Any) -> None:
        if not isinstance(attempts, list):
            return
        for item in attempts:
            if len(self.attempts) >= self.limits.max_attempts + 1:
                return
            if not isinstance(item, dict):
                continue
            entry = {"event": str(item.get("event"))[:100], "detail": str(item.get("detail"))[:200]}
            key = (entry["event"], entry["detail"])
            if key not in self._seen:
                self._seen.add(key)
                self.attempts.append(entry)

    def __repr__(self) -> str:
        return f"ProgramResearcher({self.name!r}, files={sorted(self.code)}, params={self.params})"
