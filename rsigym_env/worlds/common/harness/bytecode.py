"""The harness's bytecode, compiled once per harness version instead of at every trial's start.

``python3 /harness/agent.py`` compiles ``agent.py`` from source at every start (a script never uses a
``.pyc``), and, ``/harness`` being read-only and ``PYTHONDONTWRITEBYTECODE`` set, every module it imports
from ``/harness`` too: ~2.6 ms of the minimal harness's start, 320 times in a cold swe-bench-verified episode.

:func:`prepare` gives a copy of a harness directory with ``__pycache__/*.pyc`` beside its ``.py`` files,
compiled in a sandbox of the local world by its own interpreter in ``CHECKED_HASH`` mode: an interpreter uses such a file only
after checking that its source hashes to the hash inside, so a stale one never runs. Copies are keyed by the
harness's content and the interpreter (a harness version never sees another's), kept in a private directory
of this process, and shown to a trial only as a read-only copy in its own sandbox (agent phase only, as the
harness itself). :data:`LAUNCHER` runs the script from its ``.pyc`` as ``python3 /harness/agent.py`` would
run it from source (``__name__``, ``__file__``, ``__loader__``, ``sys.argv``, ``sys.orig_argv``,
``sys.path[0]``, tracebacks); on any mismatch it execs that very command. A harness whose ``agent.py`` does
not compile, or that brings its own ``__pycache__``, a symlink or special file, or more than
:data:`MAX_FILES` files or :data:`MAX_BYTES` bytes, gets no copy: it runs as before.

>>> launch_command("/harness/agent.py")
'exec python3 /harness/__pycache__/launch.py /harness/agent.py'
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shlex
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Callable

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the local world's sandbox finds ``python3`` (``sandbox.isolation.DEFAULT_PATH``; its ``/usr`` is the host's)."""
MAX_FILES = 200
MAX_BYTES = 4 << 20
COMPILE_WALL_S = 60.0

LAUNCHER = """\
def _l():
    import _frozen_importlib_external as e, _imp, marshal, os, sys
    path = sys.argv[1]
    try:
        with open(path, "rb") as f:
            source = f.read()
        with open(e.cache_from_source(path), "rb") as f:
            data = f.read()
        ok = (data[:4] == e.MAGIC_NUMBER and int.from_bytes(data[4:8], "little") == 3
              and data[8:16] == _imp.source_hash(e._RAW_MAGIC_NUMBER, source))
        code = marshal.loads(data[16:]) if ok else None
    except Exception:
        code = None
    if code is None:
        os.execv(sys.executable, [sys.orig_argv[0], path])
    _imp._fix_co_filename(code, path)
    sys.argv = sys.argv[1:]
    sys.orig_argv = [sys.orig_argv[0], path]
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    g = sys.modules["__main__"].__dict__
    g["__loader__"] = e.SourceFileLoader("__main__", path)
    g["__file__"], g["__cached__"] = path, None
    return code
try:
    exec(globals().pop("_l")())
except BaseException as x:
    x.__traceback__ = x.__traceback__.tb_next
    raise
"""
"""``__pycache__/launch.py`` of a compiled copy (no docstring: it runs as ``__main__``): ``python3 LAUNCHER SCRIPT``
runs ``SCRIPT`` from its checked ``.pyc`` as ``python3 SCRIPT`` runs it from source (its own frame is cut from
tracebacks); without a ``.pyc`` that matches, it execs ``python3 SCRIPT``. A file, not ``-c``: a harness reading
``/proc/*/cmdline`` sees a short command line."""
LAUNCHER_NAME = "launch.py"

COMPILE_SCRIPT = """\
import os, py_compile, sys
root, mount = sys.argv[1], sys.argv[2]
for top, dirs, files in os.walk(root):
    for name in files:
        if name.endswith(".py"):
            path = os.path.join(top, name)
            try:
                py_compile.compile(path, dfile=mount + path[len(root):], doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            except Exception:
                pass
"""


Compiler = Callable[[Path, str], None]
"""``compiler(copy, mount)``: compile the harness copy at host path ``copy`` in a sandbox, by running
``python3 -I -S -c COMPILE_SCRIPT <the copy's path inside> <mount>`` with only the copy writable (it raises
when that cannot be done). Injected by the world that runs the trials (the local world's sandbox package:
``local/sandbox/harness_bytecode.py``); without one, no harness gets bytecode."""

_compiler: Compiler | None = None


def set_compiler(compiler: Compiler | None) -> None:
    """Compile harness copies with ``compiler`` from now on (None: stop giving harnesses bytecode)."""
    global _compiler
    _compiler = compiler


_lock = threading.Lock()
_prepared: dict[str, Path | None] = {}
_root: Path | None = None
_python: tuple[str, str] | None = None


def launch_command(script: str) -> str:
    """The shell command that runs ``script`` (a sandbox path, in a compiled copy) through :data:`LAUNCHER`."""
    launcher = os.path.join(os.path.dirname(script), "__pycache__", LAUNCHER_NAME)
    return f"exec python3 {shlex.quote(launcher)} {shlex.quote(script)}"


def sandbox_python() -> tuple[str, str]:
    """(path, identity) of the ``python3`` the sandbox runs; identity changes when the interpreter does."""
    global _python
    if _python is None:
        path = shutil.which("python3", path=SANDBOX_PATH) or ""
        real = os.path.realpath(path) if path else ""
        st = os.stat(real) if real else None
        _python = (path, f"{real}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}" if st else "")
    return _python


def _snapshot(src: Path) -> list[tuple[str, bytes, int]] | None:
    """(relative path, content, mode) of every file under ``src``, or None when it has anything but regular
    files and directories, a ``__pycache__``, or is too large."""
    out: list[tuple[str, bytes, int]] = []
    total = 0
    for top, dirs, files in os.walk(src, followlinks=False):
        if "__pycache__" in dirs or "__pycache__" in files:
            return None
        for name in sorted(dirs):
            if not stat.S_ISDIR(os.lstat(os.path.join(top, name)).st_mode):
                return None
        for name in sorted(files):
            path = os.path.join(top, name)
            st = os.lstat(path)
            total += st.st_size
            if not stat.S_ISREG(st.st_mode) or len(out) >= MAX_FILES or total > MAX_BYTES:
                return None
            with open(path, "rb") as fh:
                out.append((os.path.relpath(path, src), fh.read(), stat.S_IMODE(st.st_mode)))
    return sorted(out)


def prepare(src: Path | str, mount: str = "/harness") -> Path | None:
    """A private copy of the harness at ``src`` with its checked bytecode, or None (run it as it is).

    The copy's files are the snapshot its key was computed from, so it never mixes two versions."""
    python, identity = sandbox_python()
    if not python or _compiler is None:
        return None
    files = _snapshot(Path(src))
    if files is None or not any(rel == "agent.py" for rel, _, _ in files):
        return None
    digest = hashlib.sha256(f"{identity}\0{mount}\0".encode())
    for rel, data, mode in files:
        digest.update(f"{rel}\0{mode}\0{len(data)}\0".encode() + data)
    key = digest.hexdigest()
    with _lock:
        if key in _prepared:
            return _prepared[key]
        _prepared[key] = result = _build(files, mount, key, _compiler)
    return result


def _build(files: list[tuple[str, bytes, int]], mount: str, key: str, compiler: Compiler | None) -> Path | None:
    global _root
    if _root is None:
        _root = Path(tempfile.mkdtemp(prefix="rsigym-harness-bytecode-"))
        atexit.register(shutil.rmtree, _root, True)
    target = _root / key
    for rel, data, mode in files:
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
    # the researcher's source is compiled in a sandbox (the injected compiler), never by a host process
    try:
        if compiler is None:
            raise RuntimeError("no compiler")
        compiler(target, mount)
    except Exception:  # noqa: BLE001 - no sandbox to compile in, or it failed: the harness runs as it is
        shutil.rmtree(target, ignore_errors=True)
        return None
    if not any((target / "__pycache__").glob("agent.*.pyc")):  # the script does not compile: run it as it is
        shutil.rmtree(target, ignore_errors=True)
        return None
    (target / "__pycache__" / LAUNCHER_NAME).write_text(LAUNCHER)
    for path in [target, *target.rglob("*")]:  # readable by the sandbox's user (the environment copies modes)
        path.chmod(0o755 if path.is_dir() else stat.S_IMODE(path.stat().st_mode) | 0o644)
    return target


__all__ = ["COMPILE_SCRIPT", "Compiler", "LAUNCHER", "LAUNCHER_NAME", "launch_command", "prepare", "sandbox_python",
           "set_compiler"]
