"""The local world's sandbox service: the shared :class:`~rsigym_env.worlds.common.sandbox.E2BSandboxService`
(the unchanged ``e2b`` SDK, in debug mode) against this machine's own envd servers over bubblewrap.

:class:`LocalSandboxService` owns one sandbox — a directory under the run directory, seen as
``/app`` by commands, and the :class:`~.envd.EnvdServer` serving it (:class:`EnvdBackend`) — and runs the
researcher's ``sandbox_exec`` calls in it through ``e2b.Sandbox``. Billing follows E2B's per-second rates
(``PriceList.sandbox``): the quote is the worst case (``timeout_s`` seconds), the bill the
command's measured duration. :meth:`~rsigym_env.worlds.common.sandbox.E2BSandboxService.run_script` runs a
script in a fresh private sandbox (its own envd server) with input files and returns the output files (what
``transform_data`` needs).

>>> import tempfile
>>> from rsigym_env.tools import SandboxExec
>>> with LocalSandboxService(Path(tempfile.mkdtemp()), require_isolation=False) as sandbox:
...     billed = sandbox.exec(SandboxExec(command="echo hello > greeting.txt && cat greeting.txt"))
>>> billed.value.stdout, billed.value.exit_code, billed.cost_usd <= sandbox.quote(SandboxExec(command="x")).usd
('hello\\n', 0, True)
>>> with LocalSandboxService(Path(tempfile.mkdtemp()), require_isolation=False) as sandbox:
...     job = sandbox.run_script("sort -r /data/in_0.txt > /data/out.txt",
...                              inputs={"/data/in_0.txt": "a\\nb\\n"}, outputs=["/data/out.txt", "/data/x"])
>>> job.outputs, job.result.exit_code
({'/data/out.txt': b'b\\na\\n'}, 0)
>>> result, outputs = job
"""

from __future__ import annotations

import itertools
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from e2b import Sandbox

from ....prices import DEFAULT_PRICES, PriceList
from ...common.sandbox import E2BSandboxService, OutputTooLarge, ScriptRun, Session  # noqa: F401 (re-exported)
from .envd import EnvdServer
from .isolation import INSTALL_HINT, IsolationUnavailable, Limits, Mount, SandboxGroup, bwrap_available


class EnvdBackend:
    """Sandboxes on this machine: a directory per sandbox under ``root`` (with its
    :class:`~.isolation.SandboxGroup` limits), served by its own :class:`~.envd.EnvdServer` that runs every
    command under bubblewrap. The run's sandbox starts here; each script gets a fresh one (removed afterwards)."""

    workdir = None
    idle_s = 0.0  # nothing is billed while no command runs

    def __init__(self, root: Path, *, network: bool, limits: Limits, mounts: Sequence[Mount], env: Mapping[str, str],
                 require_isolation: bool, memory_gib: float, processes: int, disk_mb: int):
        self.dir, self.network, self.limits, self.mounts, self.env = root, network, limits, tuple(mounts), dict(env)
        self.require_isolation = require_isolation
        self.memory_gib, self.processes, self.disk_mb = memory_gib, processes, disk_mb
        self._jobs = itertools.count(1)
        self._lock = threading.Lock()
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

    @contextmanager
    def session(self) -> Iterator[Session]:
        yield Session(self.sandbox)

    @contextmanager
    def fresh(self, *, network: bool, limits: Limits | None) -> Iterator[Sandbox]:
        """A job's own sandbox: ``/app`` and a writable ``/data`` in ``root/jobs/job-N``, removed afterwards."""
        with self._lock:
            job_dir = self.dir / "jobs" / f"job-{next(self._jobs)}"
        group = self._group(job_dir)
        server = EnvdServer(group.subdir("app"), network=network, limits=limits or self.limits, env=self.env,
                            mounts=[*self.mounts, Mount(group.subdir("data"), "/data", writable=True)],
                            require_isolation=self.require_isolation, group=group)
        try:
            server.start()
            yield Sandbox.create(debug=True, sandbox_url=server.url)
        finally:
            server.stop()
            group.close()
            shutil.rmtree(job_dir, ignore_errors=True)

    def close(self) -> None:
        """Stop the envd server (running commands are killed). The sandbox directory stays."""
        self.server.stop()
        self.group.close()


class LocalSandboxService(E2BSandboxService):
    """The :class:`~rsigym_env.services.SandboxService` of the local world.

    Args:
        run_dir: the run's directory; the sandbox lives in ``run_dir/sandbox/main/app``,
            ``run_script`` jobs in ``run_dir/sandbox/jobs`` (removed after each).
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
    """

    def __init__(self, run_dir: Path, *, network: bool = False, prices: PriceList = DEFAULT_PRICES,
                 vcpus: float = 2.0, memory_gib: float = 2.0, limits: Limits = Limits(), mounts: Sequence[Mount] = (),
                 env: Mapping[str, str] | None = None, require_isolation: bool = True,
                 processes: int = 256, disk_mb: int = 1024) -> None:
        backend = EnvdBackend(Path(run_dir) / "sandbox", network=network, limits=limits, mounts=mounts, env=env or {},
                              require_isolation=require_isolation, memory_gib=memory_gib, processes=processes,
                              disk_mb=disk_mb)
        super().__init__(backend, prices=prices, vcpus=vcpus, memory_gib=memory_gib)
        self.dir, self.network, self.limits = backend.dir, network, limits
        self.server, self.group, self.sandbox = backend.server, backend.group, backend.sandbox

    @property
    def app_dir(self) -> Path:
        """The host directory commands see as ``/app``."""
        return self.server.root


__all__ = ["EnvdBackend", "LocalSandboxService", "OutputTooLarge", "ScriptRun"]
