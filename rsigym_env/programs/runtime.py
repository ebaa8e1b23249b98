"""The side of a program researcher that runs inside its sandbox: load a program, serve its episodes.

**Standard library only**, and nothing from ``rsigym_env``: this file runs as
``python -I -S /runtime/runtime.py`` under the bare base interpreter of a sandbox, where neither this
package nor NumPy nor pydantic exist. The host side is :mod:`rsigym_env.programs.sandbox`.

A *program* is a dict of flat Python files (``{"researcher.py": "...", "common.py": "..."}``, names
matching :data:`FILE_NAME`) whose module ``researcher`` defines ``make_researcher(params) -> obj``, the
object having ``reset(observation, info, seed)`` and ``act(observation, info) -> action``.
:func:`load_program` loads one from memory into fresh module objects (``import common`` inside finds the
sibling file, two programs in one process never collide); in the host process it is for **trusted** code
only (tests, the in-process reference of the bench).

The protocol
------------
One JSON object per line (UTF-8) on the process's stdin (host -> sandbox) and stdout (sandbox -> host);
strictly one request, then its one reply::

    sandbox, once started:  {"ready": true, "protocol": 1, "python": "3.12.1", "modules": ["common", "researcher"],
                             "hardened": true}
                            or {"error": "SyntaxError: ...", "code": "program_invalid", "traceback": "..."} (then exits)
    {"op": "reset", "observation": {...}, "info": {...}, "seed": 0, "params": {...}}
                         -> {"ok": true, "attempts": [...]}
    {"op": "act", "observation": {...}, "info": {...}}
                         -> {"action": <any JSON value>, "attempts": [...]}
    {"op": "end"}        -> {"ended": true, "exit": 0, "clean": true, "zygote_cpu_s": 0.05}
    {"op": "quit"}       -> (no reply: the sandbox exits)

A failed ``reset`` or ``act`` replies ``{"error": "<Type>: <message>", "code": ..., "traceback": "...",
"attempts": [...]}`` (``code``: ``program_raised`` when the program's code raised, ``program_protocol``
when its action is not JSON); the episode is then over. ``attempts`` lists the tampering attempts
recorded since the previous reply (below). ``{"ended": ...}`` follows every episode, whether it ended by
``end`` or by its process dying (then ``"exit": N`` or ``"signal": N`` says how: a host waiting for an
``act`` reply that gets ``ended`` knows the episode process died); ``clean`` is false when the scratch
directories could not be emptied; ``zygote_cpu_s`` is the CPU the zygote itself has used (its CPU
limit is the episodes', so a host retires a zygote long before it reaches it). An ``end`` with no
episode running answers ``{"ended": true, "idle": true, "clean": true}``. The host must not send a
message before the previous one's reply (the zygote hands the rest of its input buffer to the episode).

Episodes
--------
The process started by the host (the *zygote*) reads the program's files from a read-only directory and
compiles them once, then serves episodes: for each ``reset`` it forks a child that executes the
program's modules, builds a fresh researcher with ``make_researcher(params)``, handles ``reset`` and the
following ``act`` messages, and exits at ``end``. The zygote never runs program code, so a program
cannot change what the zygote does between episodes: once the child is gone it kills every process the
episode left behind (in its sandbox: every process of the sandbox but itself and its init; outside one:
the child's process group) and empties the scratch directories (``--scratch``), so each episode starts
from the same state without paying an interpreter start-up. Common standard-library modules are
imported by the zygote beforehand (:data:`PRELOAD`). In a sandbox the zygote also makes itself
non-dumpable (``hardened``), so that an episode (same uid) cannot ptrace it.

The protocol runs on private duplicates of fds 0 and 1; fd 0 becomes ``/dev/null`` and fd 1 a copy of
fd 2, so what a program prints (``print``, ``os.write(1, ...)``, a subprocess) goes to stderr and cannot
corrupt the protocol by accident. A program that deliberately writes to the protocol's fds only garbles
its own replies (the host then ends it with ``program_protocol``).

Tampering attempts (counted, not prevented)
-------------------------------------------
An audit hook (:func:`sys.addaudithook`, installed before the program is read) records, while program
code runs, events a researcher has no business causing: opening or listing paths outside the program's
directory, the interpreter's installation, ``/tmp`` and its working directory (and writing anywhere but
``/tmp`` and its working directory); ``/proc``; sockets; subprocesses, ``exec``, ``fork``,
``posix_spawn``; ``ctypes``; signals to other processes; ``chmod``/``chown``; rlimit changes; a second
audit hook; imports of modules that are neither the program's nor the standard library's. Each is
``{"event": ..., "detail": short text}``, deduplicated, at most :data:`MAX_ATTEMPTS` per episode.
**This is bookkeeping, not the defence**: a program can evade the hook (``ctypes`` calls into libc
directly, and it may patch this module, which runs in its own interpreter). What protects the host is
the sandbox around this process (``rsigym_env.programs.sandbox``: its own namespaces, no network, a
private ``/tmp``, limits); the hook only counts what a program tried.

>>> prog = load_program({"researcher.py": "import common\\n"
...                      "def make_researcher(params):\\n    return common.Echo(params['x'])\\n",
...                      "common.py": "class Echo:\\n    def __init__(self, x): self.x = x\\n"})
>>> prog.make_researcher({"x": 3}).x
3
"""

from __future__ import annotations

import builtins
import gc
import itertools
import json
import linecache
import os
import re
import signal
import sys
import time
import traceback
import types
from typing import Any, Callable

PROTOCOL = 1
ENTRY = "researcher"
FILE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\.py")
"""A program file's name: a flat Python module (the same rule as ``AgentSpec.code``)."""
MAX_FILES = 256
MAX_CODE_BYTES = 4 << 20
MAX_ATTEMPTS = 50
MAX_LINE_BYTES = 64 << 20          # a request line from the host (the host is trusted; this only guards memory)
TRACEBACK_CHARS = 6000
PRELOAD = ("json", "math", "random", "re", "collections", "itertools", "functools", "dataclasses", "typing",
           "statistics", "copy", "heapq", "bisect", "string", "enum", "ast", "tomllib", "textwrap", "hashlib")
"""Standard-library modules the zygote imports before forking, so an episode's imports are free."""
EXIT_ENDED, EXIT_FAILED = 0, 3      # an episode process's exit code after `end` / after an error reply

_real_import = builtins.__import__
_tokens = itertools.count(1)


# ----------------------------------------------------------------------------------------- loading


def check_code(code: Any) -> dict[str, str]:
    """``code`` as a dict of file name -> source, or ``ValueError`` saying what is wrong with it.

    >>> check_code({"researcher.py": "x = 1"})
    {'researcher.py': 'x = 1'}
    >>> check_code({"../x.py": ""})
    Traceback (most recent call last):
    ValueError: program file name '../x.py' must match [A-Za-z_][A-Za-z0-9_]{0,63}\\.py (flat, a Python module)
    """
    if not isinstance(code, dict):
        raise ValueError(f"a program's code is a dict of file name -> source, not {type(code).__name__}")
    if len(code) > MAX_FILES:
        raise ValueError(f"a program has at most {MAX_FILES} files, not {len(code)}")
    total = 0
    for name, text in code.items():
        if not isinstance(name, str) or not FILE_NAME.fullmatch(name):
            raise ValueError(f"program file name {name!r} must match {FILE_NAME.pattern} (flat, a Python module)")
        if not isinstance(text, str):
            raise ValueError(f"program file {name} must be text, not {type(text).__name__}")
        total += len(text.encode("utf-8", errors="surrogatepass"))
    if total > MAX_CODE_BYTES:
        raise ValueError(f"a program's files total {total} bytes, more than {MAX_CODE_BYTES}")
    if f"{ENTRY}.py" not in code:
        raise ValueError(f"a program needs {ENTRY}.py (defining make_researcher(params)); it has "
                         f"{', '.join(sorted(code)) or 'no files'}")
    return dict(code)


def compile_program(code: dict[str, str], origin: str | None = None) -> dict[str, types.CodeType]:
    """Compile every file of ``code`` (module name -> code object); no program code runs.

    ``origin``: the directory the files are in (their tracebacks then name real files); without it they
    are named ``<program N>/<file>`` and their lines put in :mod:`linecache`, so tracebacks show them.
    """
    code = check_code(code)
    base = origin.rstrip("/") if origin else f"<program {next(_tokens)}>"
    out = {}
    for fname, text in sorted(code.items()):
        filename = f"{base}/{fname}"
        out[fname[:-3]] = compile(text, filename, "exec", dont_inherit=True)
        if origin is None:
            linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    return out


class Program:
    """The modules of one loaded program, executed on first import (as Python's imports are).

    Program modules see a ``__builtins__`` of their own whose ``__import__`` resolves the program's
    flat module names first (``import common`` anywhere in its code, at any time), then the normal
    imports. They are not in :data:`sys.modules`, except each one under a unique name
    (``_rsigym_program_<N>_<module>``) while it executes, for ``dataclasses`` and the like.
    """

    def __init__(self, compiled: dict[str, types.CodeType]) -> None:
        self.compiled = compiled
        self.modules: dict[str, types.ModuleType] = {}
        self.token = next(_tokens)
        self.builtins = dict(builtins.__dict__)
        self.builtins["__import__"] = self._import

    def _import(self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and name in self.compiled:
            return self.module(name)
        return _real_import(name, globals, locals, fromlist, level)

    def module(self, name: str) -> types.ModuleType:
        """The program's module ``name``, executed now if it was not yet (``ModuleNotFoundError`` if none)."""
        mod = self.modules.get(name)
        if mod is not None:
            return mod
        if name not in self.compiled:
            raise ModuleNotFoundError(f"the program has no module {name!r}", name=name)
        unique = f"_rsigym_program_{self.token}_{name}"
        mod = types.ModuleType(unique)
        mod.__file__ = self.compiled[name].co_filename
        mod.__dict__["__builtins__"] = self.builtins
        self.modules[name] = mod  # before executing it: import cycles between the files work as usual
        sys.modules[unique] = mod
        try:
            exec(self.compiled[name], mod.__dict__)
        except BaseException:
            del self.modules[name]
            raise
        finally:
            sys.modules.pop(unique, None)
        return mod


def load_program(code: dict[str, str], name: str = ENTRY) -> types.ModuleType:
    """Load ``code`` (file name -> source) from memory and return its module ``name`` (executed).

    Trusted code only: this runs the program in the calling process.

    >>> a = load_program({"researcher.py": "import common\\nN = common.N", "common.py": "N = 1"})
    >>> b = load_program({"researcher.py": "import common\\nN = common.N", "common.py": "N = 2"})
    >>> a.N, b.N, "common" in sys.modules
    (1, 2, False)
    """
    program = Program(compile_program(code))
    return program.module(name[:-3] if name.endswith(".py") else name)


def read_program(directory: str) -> dict[str, str]:
    """The program files of ``directory`` (names matching :data:`FILE_NAME`; others are ignored)."""
    code = {}
    for entry in sorted(os.listdir(directory)):
        if FILE_NAME.fullmatch(entry):
            with open(os.path.join(directory, entry), encoding="utf-8") as f:
                code[entry] = f.read()
    return code


# -------------------------------------------------------------------------------------- the audit


def _paths_under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class Auditor:
    """The audit hook: records tampering attempts while :attr:`enabled` (see the module docstring)."""

    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _ALWAYS = frozenset({
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "os.chmod", "os.chown", "os.chflags",
        "os.lchflags", "os.setxattr", "os.removexattr", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata",
        "ctypes.call_function", "ctypes.string_at", "ctypes.wstring_at", "resource.setrlimit",
        "resource.prlimit", "sys.addaudithook", "sys._current_frames", "urllib.Request", "http.client.connect",
        "ftplib.connect", "smtplib.connect", "poplib.connect", "imaplib.open", "nntplib.connect",
        "telnetlib.Telnet.open", "webbrowser.open"})
    _WRITES = frozenset({"os.mkdir", "os.rmdir", "os.remove", "os.rename", "os.symlink", "os.link",
                         "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.copytree",
                         "shutil.move", "os.mkfifo", "os.mknod"})

    def __init__(self, read_roots: tuple[str, ...], write_roots: tuple[str, ...], program_names: set[str],
                 cap: int = MAX_ATTEMPTS) -> None:
        self.read_roots = tuple(os.path.normpath(r) for r in read_roots)
        self.write_roots = tuple(os.path.normpath(r) for r in write_roots)
        self.devices = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
        self.program_names = program_names
        self.stdlib = frozenset(getattr(sys, "stdlib_module_names", ()))
        self.cap = cap
        self.enabled = False
        self._busy = False
        self.seen: set[tuple[str, str]] = set()
        self.pending: list[dict[str, str]] = []
        self.capped = False

    def take(self) -> list[dict[str, str]]:
        """The attempts recorded since the last call."""
        out, self.pending = self.pending, []
        return out

    def _record(self, event: str, detail: str) -> None:
        key = (event, detail[:200])
        if key in self.seen:
            return
        if len(self.seen) >= self.cap:
            if not self.capped:
                self.capped = True
                self.pending.append({"event": "attempts_capped",
                                     "detail": f"more than {self.cap} attempts: the rest are not recorded"})
            return
        self.seen.add(key)
        self.pending.append({"event": key[0], "detail": key[1]})

    def _path(self, value: Any) -> str | None:
        if isinstance(value, bytes):
            value = os.fsdecode(value)
        if not isinstance(value, str):
            return None  # a file descriptor
        return os.path.normpath(os.path.join(os.getcwd(), value))

    def _outside(self, value: Any, write: bool) -> str | None:
        """The path ``value`` names if a researcher has no business reading (writing) it, else None."""
        path = self._path(value)
        if path is None:
            return None
        if path.startswith("/proc/") or path == "/proc":
            return path
        if path in self.devices and (not write or path == "/dev/null"):
            return None
        return None if _paths_under(path, self.write_roots if write else self.read_roots) else path

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.enabled or self._busy:
            return
        self._busy = True
        try:
            self._handle(event, args)
        except Exception:  # noqa: BLE001 - the hook must never break the program it watches
            pass
        finally:
            self._busy = False

    def _handle(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            write = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and bool(flags & self._WRITE_FLAGS))
            bad = self._outside(path, write)
            if bad is not None:
                self._record("open", f"{bad} ({'write' if write else 'read'})")
        elif event in ("os.listdir", "os.scandir", "os.chdir"):
            bad = self._outside(args[0] if args and args[0] is not None else ".", False)
            if bad is not None:  # by directory two levels down at most: a walk of / is a few attempts, not 50
                parts = bad.split("/")
                self._record(event, "/".join(parts[:3]) + ("/..." if len(parts) > 3 else ""))
        elif event in self._WRITES:
            for value in args[:2]:
                bad = self._outside(value, True)
                if bad is not None:
                    self._record(event, bad)
                    break
        elif event == "import":
            top = str(args[0]).partition(".")[0] if args else ""
            if top and top not in self.stdlib and top not in self.program_names and not top.startswith("_rsigym"):
                self._record("import", top)
        elif event.startswith("socket."):
            self._record(event, _short(args[1:] if event in ("socket.connect", "socket.bind", "socket.sendto")
                                       else args))
        elif event in self._ALWAYS:
            if event == "ctypes.call_function":
                self._record(event, "a foreign function was called")
            elif event in ("os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen"):
                self._record(event, _short(args[:2]))
            else:
                self._record(event, _short(args))


def _short(value: Any, limit: int = 160) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------- the channel


class Channel:
    """Line-delimited JSON over two file descriptors, with ``os.read`` framing (no buffered read-ahead
    beyond what is kept in :attr:`buffer`, which a fork hands to the child as it is)."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self.fd_in, self.fd_out = fd_in, fd_out
        self.buffer = bytearray()

    def read(self) -> dict[str, Any] | None:
        """The next message (``None`` at end of input); ``ValueError`` for a line that is not an object."""
        while True:
            cut = self.buffer.find(b"\n")
            if cut >= 0:
                line = bytes(self.buffer[:cut])
                del self.buffer[: cut + 1]
                if not line.strip():
                    continue
                message = json.loads(line)
                if not isinstance(message, dict):
                    raise ValueError("a message must be a JSON object")
                return message
            if len(self.buffer) > MAX_LINE_BYTES:
                raise ValueError(f"a message longer than {MAX_LINE_BYTES} bytes")
            chunk = os.read(self.fd_in, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk

    def send(self, message: dict[str, Any], lead: bool = False) -> None:
        """Write ``message`` as one line (``lead``: after a newline, ending any partial line a dead
        episode process left, which the host then reads as a line of its own)."""
        text = json.dumps(message, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        data = (("\n" if lead else "") + text + "\n").encode("utf-8", errors="surrogatepass")
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd_out, view):]


def _error(exc: BaseException, code: str = "program_raised") -> dict[str, Any]:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # from the program's first frame on: the runtime's own are noise
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    if len(text) > TRACEBACK_CHARS:
        text = "... (cut)\n" + text[-TRACEBACK_CHARS:]
    return {"error": f"{type(exc).__name__}: {exc}"[:2000], "code": code, "traceback": text}


# ------------------------------------------------------------------------------------- the episode


def _episode(first: dict[str, Any], compiled: dict[str, types.CodeType], channel: Channel,
             auditor: Auditor) -> None:
    """The body of an episode's process: never returns."""
    me = os.getpid()
    status = EXIT_FAILED
    try:
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        status = _serve_episode(first, compiled, channel, auditor, me)
    except BaseException:  # noqa: BLE001 - whatever happens, this process ends here
        pass
    finally:
        if os.getpid() == me:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
        os._exit(status if os.getpid() == me else 0)


def _serve_episode(first: dict[str, Any], compiled: dict[str, types.CodeType], channel: Channel,
                   auditor: Auditor, me: int) -> int:
    def reply(message: dict[str, Any]) -> None:
        if os.getpid() != me:  # a process the program forked came back here: it says nothing
            os._exit(0)
        message["attempts"] = auditor.take()
        channel.send(message)

    auditor.enabled = True
    try:
        program = Program(compiled)
        entry = program.module(ENTRY)
        make: Callable[[dict[str, Any]], Any] | None = getattr(entry, "make_researcher", None)
        if not callable(make):
            raise TypeError(f"{ENTRY}.py must define make_researcher(params)")
        researcher = make(dict(first.get("params") or {}))
        researcher.reset(first.get("observation"), first.get("info"), first.get("seed"))
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the program's too
        reply(_error(exc))
        return EXIT_FAILED
    reply({"ok": True})
    while True:
        try:
            message = channel.read()
        except ValueError as exc:
            reply(_error(exc, "program_protocol"))
            return EXIT_FAILED
        if message is None or message.get("op") == "end":
            return EXIT_ENDED
        if message.get("op") != "act":
            reply({"error": f"ProtocolError: unexpected op {message.get('op')!r} in an episode",
                   "code": "program_protocol", "traceback": ""})
            return EXIT_FAILED
        try:
            action = researcher.act(message.get("observation"), message.get("info"))
        except BaseException as exc:  # noqa: BLE001
            reply(_error(exc))
            return EXIT_FAILED
        try:
            reply({"action": action})
        except (TypeError, ValueError) as exc:
            reply({"error": f"TypeError: the action is not JSON: {exc}"[:2000], "code": "program_protocol",
                   "traceback": ""})
            return EXIT_FAILED


# --------------------------------------------------------------------------------------- the zygote


def _reap_leftovers(child: int, isolated: bool) -> None:
    """Kill what the episode left running: in a sandbox every process we may signal (the sandbox's own
    PID namespace: all of it but us and its init), else the episode's process group."""
    if isolated and os.getuid() != 0:
        for _ in range(200):
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                return
            except OSError:
                return
            time.sleep(0.002)  # killed processes may still exist until their parent (the init) reaps them
    else:
        try:
            os.killpg(child, signal.SIGKILL)
        except OSError:
            pass


def _empty(directory: str) -> bool:
    """Remove everything in ``directory`` (best effort: directories made unwritable are made writable
    first); True if it is empty afterwards."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return True
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                for root, dirs, _files in os.walk(entry.path, topdown=True):
                    try:
                        os.chmod(root, 0o700)
                    except OSError:
                        pass
                    for d in dirs:
                        try:
                            os.chmod(os.path.join(root, d), 0o700, follow_symlinks=False)
                        except OSError:
                            pass
                for root, dirs, files in os.walk(entry.path, topdown=False):
                    for name in files:
                        os.unlink(os.path.join(root, name))
                    for d in dirs:
                        p = os.path.join(root, d)
                        os.unlink(p) if os.path.islink(p) else os.rmdir(p)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass
    try:
        return not any(True for _ in os.scandir(directory))
    except OSError:
        return True


def _not_dumpable() -> bool:
    """Make this process (and the episodes it forks) non-dumpable, so that an episode cannot ptrace the
    zygote (same uid) to change what it does between episodes. Best effort."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    except Exception:  # noqa: BLE001
        return False


def _parse(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"program": "/program", "isolated": False, "scratch": []}
    it = iter(argv)
    for arg in it:
        if arg == "--program":
            opts["program"] = next(it)
        elif arg == "--scratch":
            opts["scratch"].append(next(it))
        elif arg == "--isolated":
            opts["isolated"] = True
        else:
            raise SystemExit(f"runtime.py: unknown argument {arg!r}")
    return opts


def main(argv: list[str] | None = None) -> int:
    """Serve a program's episodes over stdin/stdout (see the module docstring)."""
    opts = _parse(sys.argv[1:] if argv is None else argv)
    # the protocol on private descriptors; what the program prints goes to stderr
    channel = Channel(os.dup(0), os.dup(1))
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    try:
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001
        pass
    if not opts["isolated"]:  # no sandbox: at least not the host's environment (best effort)
        keep = {k: os.environ[k] for k in ("PATH", "LANG", "TMPDIR", "HOME") if k in os.environ}
        os.environ.clear()
        os.environ.update(keep)
    program_dir = os.path.normpath(opts["program"])
    installs = tuple(sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}))
    scratch = tuple(os.path.normpath(s) for s in opts["scratch"])
    writable = (os.getcwd(), *scratch, *(("/tmp",) if opts["isolated"] else ()))
    own = os.path.realpath(__file__)  # tracebacks read the runtime's own lines
    auditor = Auditor(read_roots=(program_dir, own, *installs, *writable), write_roots=writable, program_names=set())
    sys.addaudithook(auditor)
    try:
        code = read_program(program_dir)
        compiled = compile_program(code, origin=program_dir)
    except Exception as exc:  # noqa: BLE001 - a syntax error or an unreadable program: say so and stop
        channel.send(_error(exc, "program_invalid"))
        return 1
    auditor.program_names.update(compiled)
    for name in PRELOAD:
        try:
            _real_import(name)
        except Exception:  # noqa: BLE001
            pass
    hardened = _not_dumpable() if opts["isolated"] else False
    channel.send({"ready": True, "protocol": PROTOCOL, "python": ".".join(map(str, sys.version_info[:3])),
                  "modules": sorted(compiled), "hardened": hardened})
    while True:
        try:
            message = channel.read()
        except ValueError as exc:
            channel.send(_error(exc, "program_protocol"))
            continue
        if message is None or message.get("op") == "quit":
            return 0
        op = message.get("op")
        if op == "end":  # no episode is running: nothing to end
            channel.send({"ended": True, "idle": True, "clean": True})
            continue
        if op != "reset":
            channel.send({"error": f"ProtocolError: expected reset, end or quit, not {op!r}",
                          "code": "program_protocol", "traceback": ""})
            continue
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        gc.freeze()  # the episode's collections skip the zygote's objects: fewer copy-on-write page faults
        pid = os.fork()
        if pid == 0:
            _episode(message, compiled, channel, auditor)
        channel.buffer.clear()  # whatever followed the reset belongs to the episode's process
        _, status = os.waitpid(pid, 0)
        _reap_leftovers(pid, opts["isolated"])
        clean = all([_empty(d) for d in scratch])
        own = os.times()
        ended: dict[str, Any] = {"ended": True, "clean": clean, "zygote_cpu_s": round(own.user + own.system, 3)}
        if os.WIFSIGNALED(status):
            ended["signal"] = os.WTERMSIG(status)
        else:
            ended["exit"] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        channel.send(ended, lead=True)


if __name__ == "__main__":
    sys.exit(main())
