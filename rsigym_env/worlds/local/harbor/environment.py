"""A Harbor environment that runs each trial in its own bubblewrap sandbox (no Docker).

Plug it into a Harbor job by import path::

    EnvironmentConfig(import_path="rsigym_env.worlds.local.harbor.environment:BubblewrapEnvironment",
                      kwargs={"network": False, "memory_mb": 1024})

A trial's sandbox is a host directory ``<trial_dir>/sandbox/`` holding ``app/`` (the task's
``environment/`` files, minus Docker definitions), ``tests/`` and ``solution/``. Every ``exec`` is
a fresh :func:`~.isolation.run_isolated_async` over ``app/`` (seen as ``/app``) with these mounts:

==================  ==============================  ==========================================
sandbox path        host                            when
==================  ==============================  ==========================================
``/app``            ``sandbox/app`` (rw)            always
``/logs/agent``     the trial's ``agent/`` (rw)     always
``/logs/artifacts`` the trial's artifacts dir (rw)  always
``/logs/verifier``  the trial's ``verifier/`` (rw)  verifier phase only
``/tests``          ``sandbox/tests`` (ro)          verifier phase only
``/solution``       ``sandbox/solution`` (ro)       once something uploaded it (Harbor's oracle)
agent mounts        :meth:`add_agent_mount` (ro)    agent phase only (the harness, the model socket)
==================  ==============================  ==========================================

The **verifier phase** starts when anything is uploaded under ``/tests`` (Harbor's verifier does
that first) and never ends. Each command is its own sandbox with its own PID namespace, so no
agent process survives into it; commands of the verifier phase never see the agent mounts (no
model socket) and commands of the agent phase never see the tests. Network is off unless the
environment is built with ``network=True`` *and* the task allows it.

Host-side file transfers never follow a symlink made inside the sandbox (a path through one is
refused, a symlink in a downloaded tree is skipped), and after every command symlinks and special
files are removed from the host log directories, so nothing the sandbox writes can make the host
(or a later reader of the job directory) open a host file it could not see.

Harbor's ``user`` argument is accepted and ignored: every command runs as the sandbox's own
unprivileged user. Three of Harbor's bookkeeping commands are done on the host, on the same files,
instead of starting a sandbox (~20 ms each): the verifier's ``rm -f -- /logs/verifier/reward.*``
and its ``chmod +x /tests/<script>``, and the artifact collector's ``test -d /logs/<dir>``. ``stop()`` writes ``sandbox.json`` (sandbox seconds, commands) into the trial
directory, where the evaluation bills it from.

>>> sandbox_path_parts("/app/src/../x.py")
Traceback (most recent call last):
ValueError: sandbox path '/app/src/../x.py' must be absolute and normalised (no '..')
>>> sandbox_path_parts("/logs/agent/trajectory.json")
('logs', 'agent', 'trajectory.json')
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import EnvironmentConfig, NetworkMode
from harbor.models.trial.paths import EnvironmentPaths, TrialPaths

from ...common.idle import wait_at
from ..sandbox import isolation
from ..benchmarks.base import PROBE_SOCKET
from ..benchmarks.verifier import PROBE
from ..sandbox.isolation import Limits, Mount

ENVIRONMENT_TYPE = "rsigym-bubblewrap"
IMPORT_PATH = "rsigym_env.worlds.local.harbor.environment:BubblewrapEnvironment"
SANDBOX_RECORD = "sandbox.json"
# Harbor's own bookkeeping commands that are done on the host, on the same files, without a sandbox
# start (~20 ms each): the verifier's removal of stale reward files and its chmod of the test script.
_RM_REWARDS = re.compile(r"rm -f -- ((?:/logs/verifier/reward\.(?:txt|json) ?)+)")
_CHMOD_TEST = re.compile(r"chmod \+x (/tests/[A-Za-z0-9_./-]+)")
_TEST_DIR = re.compile(r"test -d (/logs/[A-Za-z0-9_./-]+)")  # Harbor asks before collecting artifacts
# Files of environment/ that describe a container image rather than /app's contents.
DOCKER_FILES = frozenset({"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"})
# The probe runner: code under test, run apart from the verifier (see BubblewrapEnvironment._probe).
PROBE_LIMITS = Limits(wall_s=10.0, cpu_s=10, memory_mb=512, processes=32, output_bytes=1 << 16, file_mb=16)
PROBE_MAX_REQUEST = 1 << 20
PROBE_MAX_CALLS = 8
PROBE_ARGV = ("python3", "-I", "-c", PROBE)  # what the local tasks' verifier asks the probe runner to run
PROBE_ENV = {"PYTHONDONTWRITEBYTECODE": "1"}
PRESTART_WAIT_S = 600.0  # how long a probe started ahead may wait for its request (its limit restarts then)
PRESTART_PROBE_ENV = "RSIGYM_PRESTART_PROBE"  # "0"/"1": the default of ``prestart_probe`` (unset: on)
DOWNLOAD_MAX_BYTES = 8 << 20  # of one directory copied out of a trial's sandbox (its logs, artifacts)
INLINE_MAX_ENTRIES = 256  # a transfer of a tree this small runs on the event loop (see _host_io)
INLINE_MAX_FILE_BYTES = 1 << 20  # ... and of a single file this small


@functools.lru_cache(maxsize=4096)  # a handful of paths, asked for on every command and transfer
def sandbox_path_parts(path: str) -> tuple[str, ...]:
    """The parts of an absolute, normalised sandbox path (``ValueError`` for ``..`` or a relative path)."""
    pure = PurePosixPath(path)
    if not pure.is_absolute() or ".." in pure.parts or os.path.normpath(path) != str(pure).rstrip("/") or "//" in path:
        raise ValueError(f"sandbox path {path!r} must be absolute and normalised (no '..')")
    return pure.parts[1:]


def _no_symlinks(base: Path, parts: tuple[str, ...]) -> Path:
    """``base/parts...`` on the host, refusing any existing component that is a symlink."""
    path = base
    for part in parts:
        path = path / part
        if path.is_symlink():
            raise PermissionError(f"{path} is a symlink made inside the sandbox; not followed")
    return path


def _copy_file(src: Path | str, dst: Path | str) -> None:
    """Copy a regular file, replacing whatever ``dst`` was (a symlink is removed, not followed)."""
    src, dst = os.fspath(src), os.fspath(dst)
    try:
        if not stat.S_ISDIR(os.lstat(dst).st_mode):
            os.unlink(dst)
    except FileNotFoundError:
        pass
    shutil.copyfile(src, dst, follow_symlinks=False)
    _set_mode(dst, os.stat(src).st_mode, src)


def _set_mode(dst: str, src_mode: int, src: str) -> None:
    mode = stat.S_IMODE(src_mode) | 0o644  # readable by the sandbox's own uid
    if os.path.splitext(os.path.basename(src))[1] == ".sh" or mode & 0o100:  # (``Path.suffix``)
        mode |= 0o755
    os.chmod(dst, mode)


def _copy_tree(src: Path | str, dst: Path | str, *, skip: frozenset[str] = frozenset(),
               max_bytes: int | None = None) -> int:
    """Copy the contents of ``src`` into ``dst``: regular files and directories only (symlinks and
    special files are skipped, never followed); with ``max_bytes``, files stop being copied once that
    many bytes were (larger files are skipped). Returns the number of files copied.

    (On strings, not ``Path`` objects: a trial makes ~8 copies of ~30 files, and ``pathlib``'s per-call work was
    ~2 ms of the main process a trial; the same system calls on the same paths, in ``os.walk``'s order.)"""
    n = 0
    left = max_bytes
    src, dst = os.fspath(src), os.fspath(dst)
    for root, dirs, files in os.walk(src, followlinks=False):
        rel = root[len(src):].lstrip(os.sep)
        target = dst
        for part in rel.split(os.sep) if rel else ():  # refusing any component that is a symlink (_no_symlinks)
            target = os.path.join(target, part)
            if os.path.islink(target):
                raise PermissionError(f"{target} is a symlink made inside the sandbox; not followed")
        os.makedirs(target, exist_ok=True)
        for name in files:
            if not rel and name in skip:
                continue
            source = os.path.join(root, name)
            st = os.lstat(source)
            if not stat.S_ISREG(st.st_mode):
                continue
            if left is not None:
                if st.st_size > left:
                    continue
                left -= st.st_size
            destination = os.path.join(target, name)
            try:
                mode = os.lstat(destination).st_mode
            except FileNotFoundError:
                pass
            else:
                if stat.S_ISDIR(mode):
                    shutil.rmtree(destination)
                else:
                    os.unlink(destination)
            shutil.copyfile(source, destination, follow_symlinks=False)
            _set_mode(destination, st.st_mode, source)
            n += 1
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
    return n


def few_entries(root: Path, limit: int | None = None) -> bool:
    """Whether ``root`` is a regular file of at most :data:`INLINE_MAX_FILE_BYTES`, or a directory whose tree holds
    at most ``limit`` entries (default :data:`INLINE_MAX_ENTRIES`; counted from directory reads alone, symlinks not
    followed; an unreadable part counts as nothing).

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); _ = [(d / f"f{i}").write_text("x") for i in range(3)]
    >>> few_entries(d, limit=3), few_entries(d, limit=2), few_entries(d / "f0")
    (True, False, True)
    """
    try:
        st = os.lstat(root)
    except OSError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size <= INLINE_MAX_FILE_BYTES
    n, stack, limit = 0, [str(root)], INLINE_MAX_ENTRIES if limit is None else limit
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    n += 1
                    if n > limit:
                        return False
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return True


async def _host_io(source: Path, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)``, a host-side transfer from ``source``: on the event loop when ``source`` is small
    (:func:`few_entries`: a trial's logs, its task's files), else in a worker thread. A thread hop costs ~0.1 ms of
    CPU (two wake-ups and the loop's self-pipe) and a trial makes a dozen transfers of a few small files each;
    a large tree (a sandbox can fill its logs with empty files) stays off the loop, so it cannot stall the
    other trials' timers."""
    if few_entries(source):
        return func(*args, **kwargs)
    return await asyncio.to_thread(func, *args, **kwargs)


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def scrub(root: Path) -> int:
    """Remove symlinks and special files (fifos, sockets, devices) under ``root``; returns how many.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()); (d / "ok.txt").write_text("x"); (d / "link").symlink_to("/etc/passwd")
    1
    >>> scrub(d), sorted(p.name for p in d.iterdir())
    (1, ['ok.txt'])
    """
    removed = 0
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return 0
    except OSError:
        return 0
    for current, dirs, files in os.walk(root, followlinks=False):
        for name in files + dirs:
            path = os.path.join(current, name)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                os.unlink(path)
                removed += 1
        dirs[:] = [d for d in dirs if _is_real_dir(os.path.join(current, d))]
    return removed


@dataclass
class SandboxRecord:
    """What a trial's sandbox used: its lifetime (start → stop) and the commands it ran."""

    started_at: float
    stopped_at: float | None = None
    commands: int = 0
    command_seconds: float = 0.0
    timed_out: int = 0

    @property
    def seconds(self) -> float:
        return (self.stopped_at or time.time()) - self.started_at

    def to_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 4), "commands": self.commands,
                "command_seconds": round(self.command_seconds, 4), "timed_out": self.timed_out,
                "started_at": self.started_at, "stopped_at": self.stopped_at}


class BubblewrapEnvironment(BaseEnvironment):
    """A trial's sandbox: bubblewrap over a per-trial directory (see the module docstring).

    Constructor keywords (``EnvironmentConfig.kwargs``): ``network`` (default False), ``memory_mb``,
    ``cpu_s``, ``processes``, ``output_bytes``, ``file_mb`` (per command, :class:`~.isolation.Limits`),
    ``default_timeout_s`` (commands without a timeout), ``require_isolation`` (default True: refuse to
    run unisolated when bubblewrap does not work), ``sandbox_dir`` (where each trial's sandbox directory is
    made, as ``<sandbox_dir>/<random id>``; default ``<trial_dir>/sandbox``), ``group_memory_mb``,
    ``group_processes``, ``disk_mb`` (the trial's aggregate limits, :class:`~.isolation.SandboxGroup`;
    ``group=False`` for none), ``idle_gate`` (the key of an :class:`~rsigym_env.worlds.common.idle.IdleGate` to
    wait at before starting: background evaluations; or of a :class:`~rsigym_env.worlds.common.idle.SpareCores`,
    whose place is given back when the trial stops), ``prestart_probe`` (default on, ``$RSIGYM_PRESTART_PROBE=0``
    turns the default off): when the verifier phase begins on a task whose hidden data says code under test
    will be probed (``expected.json``: ``"kind": "calls"``), start the probe's sandbox and interpreter then, so
    that they are up when the verifier asks (see :meth:`_prestart_probe`).
    """

    def __init__(self, environment_dir: Path, environment_name: str, session_id: str, trial_paths: TrialPaths,
                 task_env_config: EnvironmentConfig, *, network: bool = False, memory_mb: int = 1024,
                 cpu_s: int = 120, processes: int = 128, output_bytes: int = 1 << 20, file_mb: int = 256,
                 default_timeout_s: float = 600.0, require_isolation: bool = True, sandbox_dir: str | None = None,
                 group_memory_mb: int = 2048, group_processes: int = 256, disk_mb: int = 512, group: bool = True,
                 idle_gate: str | None = None, prestart_probe: bool | None = None, **kwargs: Any):
        super().__init__(environment_dir=environment_dir, environment_name=environment_name,
                         session_id=session_id, trial_paths=trial_paths, task_env_config=task_env_config, **kwargs)
        self._network_allowed = bool(network)
        self._limits = Limits(wall_s=default_timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, processes=processes,
                              output_bytes=output_bytes, file_mb=file_mb)
        self._require_isolation = require_isolation
        self._idle_gate = idle_gate
        self._leave_gate: Callable[[], None] | None = None  # what start's gate gave: call when the trial is done
        # An opaque root: nothing of the task, trial or evaluation in any path the sandbox can see (mountinfo).
        self.root = Path(sandbox_dir) / secrets.token_hex(8) if sandbox_dir else trial_paths.trial_dir / "sandbox"
        self.app_dir, self.tests_dir, self.solution_dir = self.root / "app", self.root / "tests", self.root / "solution"
        paths = EnvironmentPaths()
        # The sandbox's own log directories; Harbor copies them into the trial directory (download_dir).
        self._log_dirs: dict[str, Path] = {
            str(paths.agent_dir): self.root / "logs" / "agent",
            str(paths.verifier_dir): self.root / "logs" / "verifier",
            str(paths.artifacts_dir): self.root / "logs" / "artifacts",
        }
        if self._host_mounts:  # Harbor's own log mounts are not host mounts here: it downloads the logs
            raise ValueError(f"{ENVIRONMENT_TYPE} does not support extra mounts: "
                             f"{', '.join(sorted(str(m['target']) for m in self._host_mounts))}")
        self._agent_mounts: list[Mount] = []
        self._skeletons: dict[str, frozenset[tuple[tuple[str, ...], bool]]] = {}  # top -> its points, made
        self._verifying = False
        self._solution_uploaded = False
        self._group_limits = ({"memory_mb": int(group_memory_mb), "processes": int(group_processes),
                               "disk_mb": int(disk_mb)} if group else None)
        self.group: isolation.SandboxGroup | None = None
        self._probe_server: asyncio.AbstractServer | None = None
        self._probes = 0
        if prestart_probe is None:
            prestart_probe = os.environ.get(PRESTART_PROBE_ENV, "1").strip() not in ("0", "false", "no", "off")
        self._prestart = bool(prestart_probe)
        self._ready_probe: tuple[Path, isolation.IsolatedProcess] | None = None
        self.record: SandboxRecord | None = None

    # ---- Harbor's identity and capabilities -------------------------------------------------------

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(mounted=False, disable_internet=True)

    def _validate_definition(self) -> None:
        if self.environment_dir.exists() and not self.environment_dir.is_dir():
            raise FileNotFoundError(f"{self.environment_dir} is not a directory")

    @classmethod
    def preflight(cls) -> None:
        if not isolation.bwrap_available():
            raise SystemExit(isolation.INSTALL_HINT)

    # ---- phases and mounts ------------------------------------------------------------------------

    @property
    def verifying(self) -> bool:
        """True once the verifier phase began (tests were uploaded)."""
        return self._verifying

    @property
    def network_enabled(self) -> bool:
        return self._network_allowed and self.network_policy.network_mode == NetworkMode.PUBLIC

    def add_agent_mount(self, host: Path | str, target: str, *, copy: bool = False) -> None:
        """Show ``host`` (a directory, file or unix socket) read-only at ``target`` in agent-phase commands only.

        A harness directory or a model socket goes here: the verifier's commands never see them.
        ``copy``: show a copy kept under the sandbox's own root instead (regular files only), so no
        host path of ``host`` appears inside the sandbox."""
        parts = sandbox_path_parts(target)
        if not parts or parts[0] in ("app", "logs", "tests", "solution", "tmp"):
            raise ValueError(f"agent mount target {target!r} would shadow a sandbox directory")
        source = Path(host)
        if copy:
            copied = self.root / "agent-files" / str(len(self._agent_mounts))
            if source.is_dir():
                copied.mkdir(parents=True, exist_ok=True)
                _copy_tree(source, copied)
                for d in [copied, *(p for p in copied.rglob("*") if p.is_dir())]:
                    d.chmod(0o755)
            else:
                copied.parent.mkdir(parents=True, exist_ok=True)
                _copy_file(source, copied)
            source = copied
        self._agent_mounts.append(Mount(source, target, writable=False))

    def _mounts_now(self) -> list[Mount]:
        paths = EnvironmentPaths()
        mounts = [Mount(self._log_dirs[str(paths.agent_dir)], str(paths.agent_dir), writable=True),
                  Mount(self._log_dirs[str(paths.artifacts_dir)], str(paths.artifacts_dir), writable=True)]
        if self._solution_uploaded:
            mounts.append(Mount(self.solution_dir, str(paths.solution_dir)))
        if self._verifying:
            mounts += [Mount(self._log_dirs[str(paths.verifier_dir)], str(paths.verifier_dir), writable=True),
                       Mount(self.tests_dir, str(paths.tests_dir))]
            if self._probe_server is not None:
                mounts.append(Mount(self._probe_socket, PROBE_SOCKET))
        else:
            mounts += self._agent_mounts
        return mounts

    def _with_skeleton(self, mounts: list[Mount]) -> list[Mount]:
        """``mounts`` preceded by read-only skeletons of their parent directories.

        bubblewrap creates the missing parents of a nested target (``/logs`` of ``/logs/agent``) with
        mode 0700 and owner root, which the sandbox's unprivileged user cannot traverse; so each
        top-level directory holding nested targets is first shown as a host directory of empty
        mount points (mode 0755). A skeleton is made once per set of mount points (``_skeletons``; each
        command of a phase has the same set) and shown read-only, so nothing inside can change it."""
        tops: dict[str, list[Mount]] = {}
        for m in mounts:
            parts = sandbox_path_parts(m.target)
            if len(parts) > 1:
                tops.setdefault(parts[0], []).append(m)
        skeletons = []
        for top, nested in sorted(tops.items()):
            base = self.root / "skeleton" / top
            points = frozenset((sandbox_path_parts(m.target)[1:], Path(m.host).is_dir()) for m in nested)
            if self._skeletons.get(top) != points:  # (a new phase: its points are added to the skeleton)
                for rel, is_dir in points:
                    point = base.joinpath(*rel)
                    point.parent.mkdir(parents=True, exist_ok=True)
                    if is_dir:
                        point.mkdir(exist_ok=True)
                    elif not point.exists():
                        point.touch()
                for d in [base, *(p for p in base.rglob("*") if p.is_dir())]:
                    d.chmod(0o755)
                self._skeletons[top] = points
            skeletons.append(Mount(base, "/" + top))
        return skeletons + mounts

    def host_path(self, path: str) -> Path:
        """The host path behind sandbox ``path`` (no symlink made inside the sandbox is followed)."""
        parts = sandbox_path_parts(path)
        roots: list[tuple[tuple[str, ...], Path]] = [
            (("app",), self.app_dir), (("tests",), self.tests_dir), (("solution",), self.solution_dir),
            *((sandbox_path_parts(target), host) for target, host in self._log_dirs.items()),
        ]
        for prefix, host in sorted(roots, key=lambda r: -len(r[0])):
            if parts[:len(prefix)] == prefix:
                return _no_symlinks(host, parts[len(prefix):])
        raise ValueError(f"{path!r} is outside the sandbox's transferable directories "
                         "(/app, /tests, /solution, /logs/agent, /logs/verifier, /logs/artifacts)")

    # ---- lifecycle --------------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        """Make the trial's directories and copy the task's ``environment/`` into ``/app`` (a background
        evaluation's trial first waits at its idle gate, before the sandbox and its clock exist)."""
        if self._require_isolation and not isolation.bwrap_available():
            raise isolation.IsolationUnavailable(isolation.INSTALL_HINT)
        self._leave_gate = await wait_at(self._idle_gate)
        try:
            self.record = SandboxRecord(started_at=time.time())
            if self.root.exists():
                shutil.rmtree(self.root)
            self._skeletons = {}  # (made afresh in the new root)
            if self._group_limits is not None:  # every process and file of the trial inside one set of limits
                self.group = isolation.SandboxGroup(self.root, **self._group_limits)
            for d in (self.app_dir, self.tests_dir, self.solution_dir, *self._log_dirs.values()):
                d.mkdir(parents=True, exist_ok=True)
            self.root.chmod(0o700)
            if self.environment_dir.is_dir():
                await _host_io(self.environment_dir, _copy_tree, self.environment_dir, self.app_dir, skip=DOCKER_FILES)
        except BaseException:
            leave, self._leave_gate = self._leave_gate, None
            leave()  # (stop() may never come)
            raise

    async def stop(self, delete: bool) -> None:
        """Record the sandbox's use in ``<trial_dir>/sandbox.json``; remove its directory if ``delete``."""
        try:
            await self._stop(delete)
        finally:
            leave, self._leave_gate = self._leave_gate, None
            if leave is not None:  # the gate's place (SpareCores) is free for the next trial
                leave()

    async def _stop(self, delete: bool) -> None:
        await self._drop_ready_probe()
        if self._probe_server is not None:
            self._probe_server.close()
            self._probe_server = None
            shutil.rmtree(self._probe_dir, ignore_errors=True)
        if self.record is not None and self.record.stopped_at is None:
            self.record.stopped_at = time.time()
            record_path = self.trial_paths.trial_dir / SANDBOX_RECORD
            record_path.write_text(json.dumps(self.record.to_json(), indent=1))
        for d in self._log_dirs.values():
            scrub(d)
        if self.group is not None:  # kills what still runs, frees the cgroup, unmounts: the files are gone
            await asyncio.to_thread(self.group.close)
            self.group = None
        if delete and self.root.exists():  # (with a group, its tmpfs is gone: little is left to remove)
            await _host_io(self.root, shutil.rmtree, self.root, True)

    # ---- commands ---------------------------------------------------------------------------------

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | float | None = None, user: str | int | None = None) -> ExecResult:
        """Run ``command`` (``/bin/sh -c``) in a fresh sandbox; a wall-clock timeout gives exit code 124."""
        if self.record is None:
            raise RuntimeError("the environment is not started")
        fast = self._on_host(command)
        if fast is not None:
            return fast
        limits = self._limits
        if timeout_sec is not None:
            limits = Limits(wall_s=float(timeout_sec), cpu_s=max(limits.cpu_s, int(timeout_sec) + 1),
                            memory_mb=limits.memory_mb, processes=limits.processes,
                            output_bytes=limits.output_bytes, file_mb=limits.file_mb)
        result = await isolation.run_isolated_async(
            command, workdir=self.app_dir, cwd=cwd or self.task_env_config.workdir or isolation.APP,
            mounts=self._with_skeleton(self._mounts_now()), env=self._merge_env(env), network=self.network_enabled, limits=limits,
            require_isolation=self._require_isolation, group=self.group)
        self.record.commands += 1
        self.record.command_seconds += result.duration_s
        self.record.timed_out += int(result.timed_out)
        for d in self._log_dirs.values():
            scrub(d)
        return ExecResult(stdout=result.stdout, stderr=result.stderr, return_code=result.exit_code)

    def _on_host(self, command: str) -> ExecResult | None:
        """Harbor's reward-file removal and test-script chmod, done directly on the (same) host files."""
        if m := _RM_REWARDS.fullmatch(command.strip()):
            for path in m.group(1).split():
                target = self.host_path(path)
                if target.is_dir() and not target.is_symlink():
                    return None  # let rm in the sandbox report it
                target.unlink(missing_ok=True)
            return ExecResult(stdout="", stderr="", return_code=0)
        if m := _TEST_DIR.fullmatch(command.strip()):
            try:
                target = self.host_path(m.group(1))
            except (ValueError, PermissionError):
                return None
            found = target.is_dir() and not target.is_symlink()
            return ExecResult(stdout="", stderr="", return_code=0 if found else 1)
        if (m := _CHMOD_TEST.fullmatch(command.strip())) and self._verifying:
            try:
                target = self.host_path(m.group(1))
            except (ValueError, PermissionError):
                return None
            if not target.is_file() or target.is_symlink():
                return None
            target.chmod(stat.S_IMODE(target.stat().st_mode) | 0o111)
            return ExecResult(stdout="", stderr="", return_code=0)
        return None

    # ---- transfers (host side, never following the sandbox's symlinks) -----------------------------

    async def _note_upload(self, target: str) -> None:
        top = sandbox_path_parts(target)[:1]
        if top == ("tests",) and not self._verifying:
            self._verifying = True  # from now on: tests mounted, agent mounts gone, the probe runner up
            await self._start_probe_runner()
        elif top == ("solution",):
            self._solution_uploaded = True

    # ---- the probe runner: code under test, apart from the verifier ---------------------------------

    async def _start_probe_runner(self) -> None:
        """Listen on a unix socket that only verifier-phase commands see (at ``PROBE_SOCKET``; the host
        path is a short random one: socket paths are limited to 108 bytes)."""
        self._probe_dir = Path(tempfile.mkdtemp(prefix="rsigym-pr-"))
        self._probe_socket = self._probe_dir / "probe.sock"
        self._probe_server = await asyncio.start_unix_server(self._probe, path=str(self._probe_socket),
                                                             limit=PROBE_MAX_REQUEST)

    async def _probe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request of the verifier: ``{"argv": [...], "stdin": str, "timeout_s": n}`` → run it in a
        fresh sandbox over a copy of ``/app`` with no ``/tests``, no ``/logs``, no probe socket and no
        network, and answer ``{"exit_code", "stdout", "stderr", "limit"}``. The code under test thus
        never shares a process, a uid or a writable path with the verifier. (For a code task that sandbox
        was started when the verifier phase began: :meth:`_prestart_probe`.)"""
        try:
            reply = await self._run_probe(await reader.readline())
        except Exception as exc:  # noqa: BLE001 - a bad request gets an answer, never a crash
            reply = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        try:
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()

    async def _run_probe(self, line: bytes) -> dict[str, Any]:
        if self.record is None or not self._verifying:
            raise RuntimeError("the probe runner serves the verifier phase only")
        self._probes += 1
        if self._probes > PROBE_MAX_CALLS:
            raise RuntimeError(f"at most {PROBE_MAX_CALLS} probes per trial")
        request = json.loads(line)
        argv, stdin = request.get("argv"), request.get("stdin", "")
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv) and isinstance(stdin, str)):
            raise ValueError("a probe request is {argv: [str, ...], stdin: str, timeout_s: number}")
        timeout = min(float(request.get("timeout_s", PROBE_LIMITS.wall_s)), PROBE_LIMITS.wall_s)
        result = await self._run_ready_probe(argv, stdin, timeout)
        if result is None:
            work = self.root / "probes" / secrets.token_hex(6)
            (work / "app").mkdir(parents=True)
            try:
                await _host_io(self.app_dir, _copy_tree, self.app_dir, work / "app")
                limits = Limits(wall_s=timeout, cpu_s=PROBE_LIMITS.cpu_s, memory_mb=PROBE_LIMITS.memory_mb,
                                processes=PROBE_LIMITS.processes, output_bytes=PROBE_LIMITS.output_bytes,
                                file_mb=PROBE_LIMITS.file_mb)
                result = await isolation.run_isolated_async(
                    argv, workdir=work / "app", cwd=isolation.APP, env=PROBE_ENV, network=False,
                    limits=limits, stdin=stdin.encode(), require_isolation=self._require_isolation, group=self.group)
            finally:
                await _host_io(work, shutil.rmtree, work, True)
        self.record.commands += 1
        self.record.command_seconds += result.duration_s
        return {"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr[-2000:],
                "limit": result.limit}

    def _probes_code(self) -> bool:
        """Whether the uploaded tests say the verifier will probe code under test (``expected.json`` of a
        ``"calls"`` task; anything unreadable: no)."""
        path = self.tests_dir / "expected.json"
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
                return False
            return json.loads(path.read_text()).get("kind") == "calls"
        except (OSError, ValueError, AttributeError):
            return False

    async def _prestart_probe(self) -> None:
        """Start the probe's sandbox (over an empty ``app`` directory) and its interpreter now, in the verifier
        phase of a code task, so that when the verifier asks (:meth:`_run_probe`) only the work is left: the
        app's files are copied in, the clock starts and the request goes to its stdin. The command
        (:data:`PROBE_ARGV`) reads its stdin before it looks at ``/app`` or imports anything from it, so it
        sees the same files, input and limits as one started at the request, in a sandbox of its own as
        before; it is killed with the trial if no request comes. A failure to start is no error: the probe
        then starts at the request, as without this."""
        if not self._prestart or self._ready_probe is not None or self.record is None or not self._probes_code():
            return
        work = self.root / "probes" / secrets.token_hex(6)
        try:
            (work / "app").mkdir(parents=True)
            proc = await isolation.IsolatedProcess.start(
                list(PROBE_ARGV), workdir=work / "app", cwd=isolation.APP, env=PROBE_ENV, network=False,
                limits=dataclasses.replace(PROBE_LIMITS, wall_s=PRESTART_WAIT_S), stdin=True,
                require_isolation=self._require_isolation, group=self.group)
        except Exception:  # noqa: BLE001 - (e.g. the group's disk is full) the request will start it
            await _host_io(work, shutil.rmtree, work, True)
            return
        self._ready_probe = (work, proc)

    async def _run_ready_probe(self, argv: list[str], stdin: str, timeout: float) -> isolation.ExecResult | None:
        """Run a probe request in the probe started ahead (:meth:`_prestart_probe`), if there is one for this
        command and it is still waiting; ``None`` otherwise (it is then killed and the caller starts one)."""
        ready, self._ready_probe = self._ready_probe, None
        if ready is None:
            return None
        work, proc = ready
        if tuple(argv) == PROBE_ARGV and proc.running:
            await _host_io(self.app_dir, self._fill_probe_app, work / "app")
            if proc.running and proc.stdin_open:  # the same command, files, input and limits: only its start came earlier
                try:
                    proc.restart_clock(timeout)
                    await proc.write(stdin.encode())
                    await proc.close_stdin()
                    return await proc.wait()
                finally:
                    proc.kill()
                    await _host_io(work, shutil.rmtree, work, True)
        await self._drop_ready_probe(ready)
        return None

    def _fill_probe_app(self, app: Path) -> None:
        """Copy ``/app`` into a started probe's (empty) app directory, owned as a fresh sandbox's would be."""
        _copy_tree(self.app_dir, app)
        isolation.claim(app, self.group.uid if self.group is not None else isolation.sandbox_uid(app.resolve()))

    async def _drop_ready_probe(self, ready: "tuple[Path, isolation.IsolatedProcess] | None" = None) -> None:
        """Kill a started probe that no request used (by default the trial's) and remove its directory."""
        if ready is None:
            ready, self._ready_probe = self._ready_probe, None
        if ready is None:
            return
        work, proc = ready
        proc.kill()
        try:
            await asyncio.wait_for(proc.wait(), 10.0)
        except asyncio.TimeoutError:
            pass
        finally:
            await _host_io(work, shutil.rmtree, work, True)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._note_upload(target_path)
        target = self.host_path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await _host_io(Path(source_path), _copy_file, Path(source_path), target)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._note_upload(target_dir)
        target = self.host_path(target_dir)
        await _host_io(Path(source_dir), _copy_tree, Path(source_dir), target)
        if self._verifying and sandbox_path_parts(target_dir)[:1] == ("tests",):
            await self._prestart_probe()

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        source = self.host_path(source_path)
        if not source.is_file() or source.is_symlink():
            raise FileNotFoundError(f"no regular file {source_path!r} in the sandbox")
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await _host_io(source, _copy_file, source, target)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a sandbox directory to the host: regular files only, at most ``DOWNLOAD_MAX_BYTES`` (what a
        trial leaves in the run directory is bounded, whatever it writes)."""
        source = self.host_path(source_dir)
        if not source.is_dir():
            raise FileNotFoundError(f"no directory {source_dir!r} in the sandbox")
        await _host_io(source, _copy_tree, source, Path(target_dir), max_bytes=DOWNLOAD_MAX_BYTES)


__all__ = ["BubblewrapEnvironment", "ENVIRONMENT_TYPE", "IMPORT_PATH", "SANDBOX_RECORD", "SandboxRecord",
           "sandbox_path_parts", "scrub"]
