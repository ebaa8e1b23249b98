"""E2B's cloud sandboxes for ``sandbox_exec`` and ``transform_data``: the local sandbox service, a cloud factory.

:class:`RemoteSandboxService` is :class:`~..local.sandbox.service.LocalSandboxService` given a factory that calls
``e2b.Sandbox.create`` (``E2B_API_KEY``, ``E2B_DOMAIN``) with the scenario's template, lifetime and
network switch. Limits: at most ``max_sandboxes`` alive at once (the run's own sandbox counts), each
living at most ``lifetime_s``; the run's sandbox is created on first use and kept alive ``idle_s`` after
its last command (E2B's ``set_timeout``), then recreated (its files are gone; the command is told).

Billing follows E2B, which bills a sandbox for every second it runs: a call pays its command's
duration plus the idle time since the previous command (at most ``idle_s``); the quote is the worst
case, ``idle_s + timeout_s``. The idle tail after the last command of a run is not billed to the run
(at most ``idle_s`` seconds).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from ...errors import ActionError
from ...prices import PriceList
from ...services import Billed, CommandResult, Quote
from ...tools import SandboxExec
from ..local.sandbox.service import LocalSandboxService
from .config import SandboxOptions
from .errors import call_with_retries, translate

WORKDIR = "/app"
SETUP = "mkdir -p /app /data && chmod 777 /app /data"


class _LazySandbox:
    """The run's sandbox, created on first use and recreated once it has expired."""

    def __init__(self, make: Callable[[], Any], release: Callable[[], None]):
        self._make, self._release = make, release
        self.current: Any = None
        self.last_used = 0.0
        self.recreated = False

    def get(self, idle_s: float) -> Any:
        if self.current is not None and time.monotonic() - self.last_used > idle_s:
            self.kill()
            self.recreated = True
        if self.current is None:
            self.current = self._make()
            self.last_used = time.monotonic()
        return self.current

    def kill(self) -> None:
        if self.current is not None:
            try:
                self.current.kill()
            except Exception:  # noqa: BLE001 - it expires on its own
                pass
            self.current = None
            self._release()

    # LocalSandboxService reads these attributes of its sandbox
    @property
    def commands(self) -> Any:
        return self.get(float("inf")).commands

    @property
    def files(self) -> Any:
        return self.get(float("inf")).files


class RemoteSandboxService(LocalSandboxService):
    """The :class:`~rsigym_env.services.SandboxService` of the remote world (E2B's cloud)."""

    def __init__(self, run_dir: Path, *, options: SandboxOptions, prices: PriceList, vcpus: float, memory_gib: float,
                 network: bool, max_sandboxes: int, api_key: str | None = None, domain: str | None = None,
                 create: Callable[..., Any] | None = None):
        if create is None:
            from e2b import Sandbox

            create = Sandbox.create
        self.options, self._create = options, create
        self._api = {k: v for k, v in (("api_key", api_key), ("domain", domain)) if v}
        self._network = network
        self._slots = threading.BoundedSemaphore(max_sandboxes)
        self.max_sandboxes = max_sandboxes
        self._main = _LazySandbox(self._new_sandbox, self._slots.release)
        super().__init__(Path(run_dir), network=network, prices=prices, vcpus=vcpus, memory_gib=memory_gib,
                         sandbox_factory=lambda: self._main, workdir=WORKDIR)
        self.sandbox_factory = self._script_sandbox  # run_script: a fresh sandbox each time, killed afterwards

    def _new_sandbox(self) -> Any:
        if not self._slots.acquire(blocking=False):
            raise ActionError("sandbox_limit", f"this run may have at most {self.max_sandboxes} sandboxes at once; "
                                               "wait for a transform or evaluation to finish")
        try:
            sandbox = call_with_retries(lambda: self._create(template=self.options.template, timeout=self.options.lifetime_s,
                                                             allow_internet_access=self._network,
                                                             metadata={"created_by": "rsigym-env"}, **self._api),
                                        what="E2B")
            sandbox.commands.run(SETUP, user="root", timeout=60)
            return sandbox
        except BaseException as exc:
            self._slots.release()
            if isinstance(exc, Exception):
                raise translate(exc, "E2B") from exc
            raise

    def quote(self, call: SandboxExec) -> Quote:
        """Worst case: a full idle period since the last command plus the whole ``timeout_s``."""
        return Quote(usd=self.usd(self.options.idle_s + call.timeout_s), seconds=float(call.timeout_s))

    def exec(self, call: SandboxExec) -> Billed[CommandResult]:
        """Run ``call.command`` in the run's sandbox (``/app``); bill its duration plus the idle time before it."""
        main = self._main
        had = main.current is not None
        idle = min(time.monotonic() - main.last_used, self.options.idle_s) if had else 0.0
        main.recreated = False
        try:
            sandbox = main.get(self.options.idle_s)
            result = self._run(sandbox, call.command, call.timeout_s, cwd=WORKDIR)
            main.last_used = time.monotonic()
            sandbox.set_timeout(self.options.idle_s)
        except ActionError:
            raise
        except Exception as exc:  # noqa: BLE001 - not retried: the command may have run
            raise translate(exc, "E2B") from exc
        if main.recreated:
            result = result.model_copy(update={"stderr": "[sandbox] the previous sandbox expired (idle longer than "
                                                         f"{self.options.idle_s} s); this is a fresh one\n" + result.stderr})
            idle = 0.0
        seconds = min(result.duration_s, float(call.timeout_s)) + idle
        return Billed[CommandResult](value=result, cost_usd=min(self.usd(seconds), self.quote(call).usd),
                                     seconds=result.duration_s)

    def _script_sandbox(self) -> Any:
        sandbox = self._new_sandbox()
        release = self._slots.release

        class _Owned:
            commands, files = sandbox.commands, sandbox.files

            def kill(self) -> None:
                try:
                    sandbox.kill()
                finally:
                    release()

        return _Owned()

    def close(self) -> None:
        """Kill the run's sandbox (safe to call twice)."""
        self._main.kill()


__all__ = ["RemoteSandboxService"]
