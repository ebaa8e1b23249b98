"""E2B's cloud sandboxes for ``sandbox_exec`` and ``transform_data``: the shared sandbox service, a cloud back end.

:class:`RemoteSandboxService` is :class:`~..common.sandbox.E2BSandboxService` (the local world's too) over
:class:`E2BCloud`, which calls ``e2b.Sandbox.create`` (``E2B_API_KEY``, ``E2B_DOMAIN``) with the scenario's
template, lifetime and network switch. Limits: at most ``max_sandboxes`` alive at once (the run's own sandbox counts), each
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
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ...errors import ActionError
from ...prices import PriceList
from ..common.sandbox import E2BSandboxService, Session
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


class E2BCloud:
    """The :class:`~..common.sandbox.SandboxBackend` of E2B's cloud: at most ``max_sandboxes`` alive at once (the
    run's own counts); the run's sandbox is made on first use and lives ``options.idle_s`` after its last command;
    each script gets its own, killed afterwards. ``create``: ``e2b.Sandbox.create`` or a stand-in."""

    workdir = WORKDIR

    def __init__(self, *, options: SandboxOptions, network: bool, max_sandboxes: int, create: Callable[..., Any],
                 api_key: str | None = None, domain: str | None = None, api_url: str | None = None,
                 sandbox_url: str | None = None):
        self.options, self._create, self._network = options, create, network
        self._api = {k: v for k, v in (("api_key", api_key), ("domain", domain), ("api_url", api_url),
                                       ("sandbox_url", sandbox_url)) if v}
        self._slots = threading.BoundedSemaphore(max_sandboxes)
        self.max_sandboxes = max_sandboxes
        self.idle_s = float(options.idle_s)
        self._main = _LazySandbox(self._new_sandbox, self._slots.release)

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

    @contextmanager
    def session(self) -> Iterator[Session]:
        """The run's sandbox; the idle time since the previous command (at most ``idle_s``) is billed with this one,
        and afterwards it is kept alive ``idle_s`` more (E2B's ``set_timeout``). Provider failures become typed
        errors (not retried: the command may have run)."""
        main = self._main
        idle = min(time.monotonic() - main.last_used, self.idle_s) if main.current is not None else 0.0
        main.recreated = False
        try:
            sandbox = main.get(self.idle_s)
            note = ""
            if main.recreated:
                idle, note = 0.0, (f"[sandbox] the previous sandbox expired (idle longer than {self.options.idle_s} s); "
                                   "this is a fresh one\n")
            yield Session(sandbox, idle, note)
            main.last_used = time.monotonic()
            sandbox.set_timeout(self.options.idle_s)
        except ActionError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise translate(exc, "E2B") from exc

    @contextmanager
    def fresh(self, *, network: bool, limits: Any) -> Iterator[Any]:
        sandbox = self._new_sandbox()
        try:
            yield sandbox
        finally:
            try:
                sandbox.kill()
            except Exception:  # noqa: BLE001 - it expires on its own (its lifetime) if the kill fails
                pass
            finally:
                self._slots.release()

    def close(self) -> None:
        """Kill the run's sandbox (safe to call twice)."""
        self._main.kill()


class RemoteSandboxService(E2BSandboxService):
    """The :class:`~rsigym_env.services.SandboxService` of the remote world (E2B's cloud)."""

    def __init__(self, *, options: SandboxOptions, prices: PriceList, vcpus: float, memory_gib: float,
                 network: bool, max_sandboxes: int, api_key: str | None = None, domain: str | None = None,
                 create: Callable[..., Any] | None = None, api_url: str | None = None, sandbox_url: str | None = None):
        if create is None:
            from e2b import Sandbox

            create = Sandbox.create
        super().__init__(E2BCloud(options=options, network=network, max_sandboxes=max_sandboxes, create=create,
                                  api_key=api_key, domain=domain, api_url=api_url, sandbox_url=sandbox_url),
                         prices=prices, vcpus=vcpus, memory_gib=memory_gib)
        self.options, self.max_sandboxes = options, max_sandboxes


__all__ = ["E2BCloud", "RemoteSandboxService"]
