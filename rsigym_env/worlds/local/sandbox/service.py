"""The local world's sandbox service: the unchanged ``e2b`` SDK (debug mode) against a local envd.

:class:`LocalSandboxService` owns one sandbox — a directory under the run directory, seen as
``/app`` by commands, and the :class:`~.envd.EnvdServer` serving it — and runs the researcher's
``sandbox_exec`` calls in it through ``e2b.Sandbox``. Billing follows E2B's per-second rates
(``PriceList.sandbox``): the quote is the worst case (``timeout_s`` seconds), the bill the
command's measured duration. :meth:`LocalSandboxService.run_script` runs a script in a fresh
private sandbox with input files and returns the output files (what ``transform_data`` needs).

>>> import tempfile
>>> from rsigym_env.tools import SandboxExec
>>> with LocalSandboxService(Path(tempfile.mkdtemp()), require_isolation=False) as sandbox:
...     billed = sandbox.exec(SandboxExec(command="echo hello > greeting.txt && cat greeting.txt"))
>>> billed.value.stdout, billed.value.exit_code, billed.cost_usd <= sandbox.quote(SandboxExec(command="x")).usd
('hello\\n', 0, True)
"""

from __future__ import annotations

import itertools
import shlex
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from e2b import Sandbox
from e2b.exceptions import TimeoutException
from e2b.sandbox.commands.command_handle import CommandExitException

from ....prices import DEFAULT_PRICES, PriceList
from ....services import Billed, CommandResult, Quote
from ....tools import SandboxExec
from .envd import EnvdServer
from .isolation import INSTALL_HINT, WALL_EXIT, IsolationUnavailable, Limits, Mount, SandboxGroup, bwrap_available

KILL_GRACE_S = 1.0     # after the timeout, TERM; this much later, KILL
CLIENT_GRACE_S = 10.0  # the SDK's own deadline, beyond the command's


class OutputTooLarge(Exception):
    """An output file of a script is larger than the caller allows (or not a regular file)."""


@dataclass(frozen=True)
class ScriptRun:
    """A finished :meth:`LocalSandboxService.run_script`: the command, the output files it left
    (path as requested → bytes; missing ones are absent), the ones streamed to host files
    (``saved``: path → bytes written; ``refused``: path → why not), its cost and duration.
    Unpacks as ``result, outputs``."""

    result: CommandResult
    outputs: dict[str, bytes]
    cost_usd: float
    seconds: float
    saved: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.result, self.outputs))


def _wrapped(command: str, timeout_s: float) -> str:
    """``command`` under coreutils ``timeout`` (TERM at ``timeout_s``, KILL a second later), so a
    command that runs too long still returns its output and exit code 124."""
    return f"exec timeout -k {KILL_GRACE_S:g} {timeout_s:g} /bin/bash -c {shlex.quote(command)}"


class LocalSandboxService:
    """The :class:`~rsigym_env.services.SandboxService` of the local world.

    Args:
        run_dir: the run's directory; the sandbox lives in ``run_dir/sandbox/main/app``,
            :meth:`run_script` jobs in ``run_dir/sandbox/jobs`` (removed after each).
        network: give commands the host's network (the scenario's switch); off: loopback only.
        prices, vcpus, memory_gib: the rates and the sandbox size seconds are billed at.
        limits: memory, CPU, processes, output and file-size limits of every command (its wall
            limit is the call's ``timeout_s``).
        processes, disk_mb: limits of the sandbox as a whole (every command together; with
            ``memory_gib``, a :class:`~.isolation.SandboxGroup`): processes and threads, and a disk
            quota over ``/app`` and the jobs' ``/data``. The sandbox's files live in that quota and
            are gone after :meth:`close`.
        mounts: extra host paths shown to commands (e.g. datasets read-only at ``/data``).
        require_isolation: refuse to start (:class:`~.isolation.IsolationUnavailable`) where bubblewrap
            does not work; ``False``: run commands unisolated there, with a loud warning each time.
        sandbox_factory: make sandboxes some other way (e.g. E2B's cloud: ``lambda: Sandbox.create(...)``)
            instead of a local envd server; each :meth:`run_script` gets a fresh one, killed afterwards.
            ``network``, ``limits``, ``mounts``, ``env`` and ``require_isolation`` then do not apply.
        workdir: the working directory of commands in factory-made sandboxes (default: the sandbox's own).
    """

    def __init__(self, run_dir: Path, *, network: bool = False, prices: PriceList = DEFAULT_PRICES,
                 vcpus: float = 2.0, memory_gib: float = 2.0, limits: Limits = Limits(), mounts: Sequence[Mount] = (),
                 env: Mapping[str, str] | None = None, require_isolation: bool = True,
                 sandbox_factory: Callable[[], Sandbox] | None = None, workdir: str | None = None,
                 processes: int = 256, disk_mb: int = 1024) -> None:
        self.dir = Path(run_dir) / "sandbox"
        self.network = network
        self.prices = prices
        self.vcpus = vcpus
        self.memory_gib = memory_gib
        self.limits = limits
        self.mounts = tuple(mounts)
        self.env = dict(env or {})
        self.require_isolation = require_isolation
        self.sandbox_factory = sandbox_factory
        self.workdir = workdir
        self._jobs = itertools.count(1)
        self._lock = threading.Lock()
        self.server: EnvdServer | None = None
        self.group: SandboxGroup | None = None
        self.processes, self.disk_mb = processes, disk_mb
        if sandbox_factory is not None:
            self.sandbox = sandbox_factory()
            return
        if require_isolation and not bwrap_available():
            raise IsolationUnavailable(f"the local sandbox needs bubblewrap. {INSTALL_HINT}")
        self.group = self._group(self.dir / "main")
        self.server = EnvdServer(self.group.subdir("app"), network=network, limits=limits, mounts=self.mounts,
                                 env=self.env, require_isolation=require_isolation, group=self.group).start()
        self.sandbox = Sandbox.create(debug=True, sandbox_url=self.server.url)

    def _group(self, root: Path) -> SandboxGroup:
        """Aggregate limits of one sandbox: its memory size, a process limit and a disk quota, all processes together."""
        return SandboxGroup(root, memory_mb=max(64, int(self.memory_gib * 1024)), processes=self.processes,
                            disk_mb=self.disk_mb)

    @property
    def app_dir(self) -> Path:
        """The host directory commands see as ``/app``."""
        if self.server is None:
            raise RuntimeError("a factory-made sandbox has no host directory")
        return self.server.root

    def usd(self, seconds: float) -> float:
        """What ``seconds`` of this sandbox cost."""
        return self.prices.sandbox_usd(seconds, self.vcpus, self.memory_gib)

    # -- SandboxService ----------------------------------------------------------------------

    def quote(self, call: SandboxExec) -> Quote:
        """The worst case: the whole ``timeout_s`` (the duration cannot be known before running)."""
        return Quote(usd=self.usd(call.timeout_s), seconds=float(call.timeout_s))

    def exec(self, call: SandboxExec) -> Billed[CommandResult]:
        """Run ``call.command`` with bash in ``/app``; bill its measured duration (at most ``timeout_s``)."""
        result = self._run(self.sandbox, call.command, call.timeout_s, cwd=self.workdir)
        seconds = min(result.duration_s, float(call.timeout_s))
        return Billed[CommandResult](value=result, cost_usd=self.usd(seconds), seconds=result.duration_s)

    def _run(self, sandbox: Sandbox, command: str, timeout_s: float, cwd: str | None = None) -> CommandResult:
        start = time.monotonic()
        try:
            r: Any = sandbox.commands.run(_wrapped(command, timeout_s), cwd=cwd, timeout=timeout_s + CLIENT_GRACE_S)
        except CommandExitException as exc:
            r = exc
        except TimeoutException:
            duration = time.monotonic() - start
            return CommandResult(stdout="", stderr=f"[sandbox] wall-clock limit ({timeout_s:g} s) reached: "
                                 "the sandbox was killed\n", exit_code=WALL_EXIT, duration_s=duration)
        duration = time.monotonic() - start
        stdout, stderr, code = r.stdout or "", r.stderr or "", int(r.exit_code)
        if code in (WALL_EXIT, 128 + 9) and duration >= timeout_s:  # coreutils timeout: TERM (124), then KILL
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + \
                f"[sandbox] wall-clock limit ({timeout_s:g} s) reached: the command was killed\n"
        return CommandResult(stdout=stdout, stderr=stderr, exit_code=code, duration_s=duration)

    # -- scripts with files ------------------------------------------------------------------

    def quote_script(self, timeout_s: float) -> Quote:
        """Worst case of :meth:`run_script` with this timeout."""
        return Quote(usd=self.usd(timeout_s), seconds=float(timeout_s))

    def run_script(self, command: str, inputs: Mapping[str, bytes | str | Path] | None = None, *,
                   outputs: Sequence[str] = (), timeout_s: float = 600.0, limits: Limits | None = None,
                   network: bool = False, save: Mapping[str, Path] | None = None,
                   max_save_bytes: int = 64 << 20) -> ScriptRun:
        """Run ``command`` in a fresh private sandbox holding ``inputs`` and fetch ``outputs`` back.

        Paths are the sandbox's: under ``/app`` (relative paths too) or under ``/data`` (a
        writable directory of the job); ``inputs`` values are contents or host files to copy in.
        Everything goes through the e2b SDK against the job's own envd; the job's directories are
        removed afterwards. The cost is the command's measured duration (upload and download are
        free, as with E2B's file API). ``save`` maps sandbox paths to host files they are streamed
        into (never held in memory), each at most ``max_save_bytes`` (a larger one, or one that is
        not a regular file, is not saved: ``refused`` says why).

        >>> import tempfile
        >>> with LocalSandboxService(Path(tempfile.mkdtemp()), require_isolation=False) as sandbox:
        ...     job = sandbox.run_script("sort -r /data/in_0.txt > /data/out.txt",
        ...                              inputs={"/data/in_0.txt": "a\\nb\\n"}, outputs=["/data/out.txt", "/data/x"])
        >>> job.outputs, job.result.exit_code
        ({'/data/out.txt': b'b\\na\\n'}, 0)
        >>> result, outputs = job
        """
        if self.sandbox_factory is not None:
            return self._run_script_factory(command, inputs, outputs, timeout_s)
        with self._lock:
            job_dir = self.dir / "jobs" / f"job-{next(self._jobs)}"
        group = self._group(job_dir)
        server = EnvdServer(group.subdir("app"), network=network, limits=limits or self.limits, env=self.env,
                            mounts=[*self.mounts, Mount(group.subdir("data"), "/data", writable=True)],
                            require_isolation=self.require_isolation, group=group)
        try:
            server.start()
            sandbox = Sandbox.create(debug=True, sandbox_url=server.url)
            for path, data in (inputs or {}).items():
                if isinstance(data, Path):
                    with open(data, "rb") as f:
                        sandbox.files.write(path, f)
                else:
                    sandbox.files.write(path, data)
            result = self._run(sandbox, command, timeout_s)
            got: dict[str, bytes] = {}
            for path in outputs:
                if sandbox.files.exists(path):
                    got[path] = bytes(sandbox.files.read(path, format="bytes"))
            saved, refused = self._save(sandbox, save or {}, max_save_bytes)
        finally:
            server.stop()
            group.close()
            shutil.rmtree(job_dir, ignore_errors=True)
        seconds = min(result.duration_s, timeout_s)
        return ScriptRun(result=result, outputs=got, cost_usd=self.usd(seconds), seconds=result.duration_s,
                         saved=saved, refused=refused)

    @staticmethod
    def _save(sandbox: Sandbox, save: Mapping[str, Path], limit: int) -> tuple[dict[str, int], dict[str, str]]:
        """Stream each sandbox file of ``save`` into its host file, refusing ones over ``limit`` bytes."""
        saved: dict[str, int] = {}
        refused: dict[str, str] = {}
        for path, target in save.items():
            try:
                if not sandbox.files.exists(path):
                    continue
                info = sandbox.files.get_info(path)
                if str(getattr(info.type, "value", info.type)) != "file":
                    raise OutputTooLarge(f"{path} is not a regular file")
                if info.size > limit:
                    raise OutputTooLarge(f"{path} is {info.size:,} bytes; at most {limit:,}")
                written = 0
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as fh:
                    for chunk in sandbox.files.read(path, format="stream"):
                        written += len(chunk)
                        if written > limit:  # it grew meanwhile
                            raise OutputTooLarge(f"{path} is over {limit:,} bytes")
                        fh.write(chunk)
                saved[path] = written
            except (OutputTooLarge, Exception) as exc:  # noqa: BLE001 - a bad output is reported, never fatal
                target.unlink(missing_ok=True)
                refused[path] = str(exc)[:300] if isinstance(exc, OutputTooLarge) else f"{type(exc).__name__}: {exc}"[:300]
        return saved, refused

    def _run_script_factory(self, command: str, inputs: Mapping[str, bytes | str | Path] | None,
                            outputs: Sequence[str], timeout_s: float) -> ScriptRun:
        """:meth:`run_script` in a fresh factory-made sandbox (killed afterwards); relative paths are under ``/app``."""
        sandbox = self.sandbox_factory()  # type: ignore[misc]
        try:
            sandbox.commands.run("mkdir -p /app /data", timeout=30)
            for path, data in (inputs or {}).items():
                target = path if path.startswith("/") else f"/app/{path}"
                if isinstance(data, Path):
                    with open(data, "rb") as f:
                        sandbox.files.write(target, f)
                else:
                    sandbox.files.write(target, data)
            result = self._run(sandbox, command, timeout_s, cwd=self.workdir or "/app")
            got: dict[str, bytes] = {}
            for path in outputs:
                target = path if path.startswith("/") else f"/app/{path}"
                if sandbox.files.exists(target):
                    got[path] = bytes(sandbox.files.read(target, format="bytes"))
        finally:
            try:
                sandbox.kill()
            except Exception:  # noqa: BLE001 - it expires on its own (its lifetime) if the kill fails
                pass
        seconds = min(result.duration_s, timeout_s)
        return ScriptRun(result=result, outputs=got, cost_usd=self.usd(seconds), seconds=result.duration_s)

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the envd server (running commands are killed). The sandbox directory stays.
        A factory-made sandbox is killed."""
        if self.server is not None:
            self.server.stop()
            if self.group is not None:
                self.group.close()
        elif self.sandbox_factory is not None:
            try:
                self.sandbox.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass

    def __enter__(self) -> "LocalSandboxService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

