"""Background work that takes only the cores nobody else uses: :class:`IdleGate`.

An evaluation started ahead of need (the initial system's official one, see
:meth:`~.evaluation.HarborEvalService.prefetch_official`) should not slow the episode it runs beside.
Each of its trials first waits at the gate, which lets one through only when the machine had at least
``min_idle_cores`` cores idle over the last ``window_s`` (``/proc/stat``, the whole machine: the
episode's own work, the background trials already running and anything else on it), one at a time, so
the trials already let through are counted before the next one is. When the result is needed,
:meth:`IdleGate.open` lets every waiting and later trial through at once. Waiting never changes a
trial's outcome: it happens before the trial's sandbox exists (its clock, its bill and its limits start
after), and no trial waits longer than ``max_wait_s``. Where ``/proc/stat`` cannot be read the gate is
open.

Gates are found by key (a trial's environment is built by Harbor from plain keywords):

>>> gate = IdleGate(min_idle_cores=0.0, window_s=0.01)
>>> key = register_gate(gate)
>>> import asyncio; _ = asyncio.run(wait_at(key)), asyncio.run(wait_at("no-such-gate"))
>>> unregister_gate(key) is gate
True
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
from typing import Callable

def machine_idle_seconds() -> float | None:
    """Seconds all cores have been idle since boot (idle + iowait in ``/proc/stat``), None if unreadable."""
    try:
        with open("/proc/stat", "rb") as fh:
            fields = fh.readline().split()
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class IdleGate:
    """Lets waiters through one at a time while the machine has ``min_idle_cores`` to spare (module docstring)."""

    def __init__(self, min_idle_cores: float = 0.8, window_s: float = 0.25, max_wait_s: float = 60.0,
                 idle_seconds: Callable[[], float | None] = machine_idle_seconds):
        self.min_idle_cores, self.window_s, self.max_wait_s = min_idle_cores, window_s, max_wait_s
        self._idle_seconds = idle_seconds
        self._open = threading.Event()
        self._closed = threading.Event()
        self._turn = threading.Lock()  # one waiter measures at a time (waiters may be on several event loops)
        self.waited_s = 0.0  # all waiters' time at the gate, summed (for the record)

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def open(self) -> None:
        """From now on every waiter passes at once (thread-safe)."""
        self._open.set()

    def close(self) -> None:
        """From now on no waiter passes: each raises ``asyncio.CancelledError`` (thread-safe; the evaluation is
        being cancelled, and a trial at the gate must not start a sandbox on its way out)."""
        self._closed.set()

    async def wait(self) -> None:
        """Return when this waiter may start: the gate is open, a window showed enough idle cores, or
        ``max_wait_s`` passed."""
        started = time.monotonic()
        deadline = started + self.max_wait_s
        try:
            while not self._open.is_set() and not self._closed.is_set() and time.monotonic() < deadline:
                if not self._turn.acquire(blocking=False):
                    await asyncio.sleep(self.window_s / 4)
                    continue
                try:
                    if await self._spare_window(deadline):
                        break
                finally:
                    self._turn.release()
        finally:
            self.waited_s += time.monotonic() - started
        if self._closed.is_set():
            raise asyncio.CancelledError("the idle gate was closed: its evaluation is being cancelled")

    async def _spare_window(self, deadline: float) -> bool:
        """Watch one window; True if it had enough idle cores (or the machine cannot be read)."""
        before, t0 = self._idle_seconds(), time.monotonic()
        if before is None:
            return True
        while (not self._open.is_set() and not self._closed.is_set() and time.monotonic() - t0 < self.window_s
               and time.monotonic() < deadline):
            await asyncio.sleep(min(0.05, self.window_s))
        after, t1 = self._idle_seconds(), time.monotonic()
        if self._open.is_set() or after is None:
            return True
        return (after - before) / max(t1 - t0, 1e-6) >= self.min_idle_cores


class SpareCores:
    """An evaluation's trials: ``base`` of them at once, and up to ``most`` while the machine has
    ``min_idle_cores`` to spare — the cores a quiet machine leaves idle between a trial's steps (model
    calls, sandbox starts) are filled with more trials; on a busy one the evaluation keeps ``base``.

    A trial enters (:meth:`enter`) before its sandbox exists (so, like :class:`IdleGate`'s wait, it changes no
    outcome) and leaves (:meth:`leave`) when its sandbox is gone. One beyond ``base`` starts only after a window of
    ``window_s`` showed the idle cores (``/proc/stat``, the whole machine), one window at a time, so each
    extra trial is counted before the next is let in; a trial waiting takes a free place below ``base`` as
    soon as one opens. Where ``/proc/stat`` cannot be read only ``base`` run.

    >>> import asyncio
    >>> cores = SpareCores(base=1, most=2, idle_seconds=lambda: None)
    >>> asyncio.run(cores.enter()); cores.running
    1
    >>> cores.leave(); cores.running
    0
    """

    def __init__(self, base: int, most: int, min_idle_cores: float = 0.4, window_s: float = 0.25,
                 idle_seconds: Callable[[], float | None] = machine_idle_seconds):
        self.base, self.most = max(1, int(base)), max(1, int(base), int(most))
        self.min_idle_cores, self.window_s, self._idle_seconds = min_idle_cores, window_s, idle_seconds
        self._lock = threading.Lock()
        self._turn = threading.Lock()  # one waiter watches a window at a time
        self._naps: set[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()
        self.running = 0
        self.peak = 0  # the most trials in at once so far (a cancelled evaluation is billed for them)
        self.extra = 0  # trials let in beyond base, in all (for the record)

    def _take(self, limit: int) -> bool:
        with self._lock:
            if self.running < limit:
                self.running += 1
                self.peak = max(self.peak, self.running)
                return True
            return False

    def _wake(self) -> None:
        """Wake every waiter now (a place was given back, or the window is free to watch)."""
        with self._lock:
            naps, self._naps = self._naps, set()
        for loop, nap in naps:
            loop.call_soon_threadsafe(lambda f=nap: f.done() or f.set_result(None))

    async def _nap(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        nap = loop.create_future()
        with self._lock:
            self._naps.add((loop, nap))
        try:
            await asyncio.wait_for(nap, max(seconds, 0.0))
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._naps.discard((loop, nap))

    async def enter(self) -> None:
        """Return when this trial may start (see the class docstring)."""
        spare = self.most > self.base and self._idle_seconds() is not None
        while not self._take(self.base):
            if not (spare and self._turn.acquire(blocking=False)):
                await self._nap(self.window_s)  # until a place is given back or the window is free
                continue
            try:
                before, t0 = self._idle_seconds(), time.monotonic()
                while self.running >= self.base and time.monotonic() - t0 < self.window_s:
                    await self._nap(t0 + self.window_s - time.monotonic())
                if self.running < self.base:
                    continue  # a place below base: take it (the loop's test)
                after, t1 = self._idle_seconds(), time.monotonic()
                if (before is not None and after is not None and (after - before) / max(t1 - t0, 1e-6)
                        >= self.min_idle_cores and self._take(self.most)):
                    with self._lock:
                        self.extra += 1
                    return
            finally:
                self._turn.release()
                self._wake()

    def leave(self) -> None:
        """A trial that entered is done: its place goes to a waiting one at once."""
        with self._lock:
            self.running = max(self.running - 1, 0)
        self._wake()

    async def wait(self) -> None:  # the gate protocol of :func:`wait_at`
        await self.enter()


_GATES: dict[str, IdleGate | SpareCores] = {}
_GATES_LOCK = threading.Lock()


def register_gate(gate: IdleGate | SpareCores) -> str:
    """A key under which :func:`wait_at` finds ``gate``."""
    key = f"gate-{secrets.token_hex(8)}"
    with _GATES_LOCK:
        _GATES[key] = gate
    return key


def unregister_gate(key: str) -> IdleGate | SpareCores | None:
    with _GATES_LOCK:
        return _GATES.pop(key, None)


async def wait_at(key: str | None) -> Callable[[], None]:
    """Wait at the gate registered as ``key`` (at once if there is none: e.g. it was unregistered); returns
    what to call when the trial is done (a :class:`SpareCores` place to give back, or nothing)."""
    with _GATES_LOCK:
        gate = _GATES.get(key) if key else None
    if gate is None:
        return _nothing
    await gate.wait()
    return gate.leave if isinstance(gate, SpareCores) else _nothing


def _nothing() -> None:
    pass


__all__ = ["IdleGate", "SpareCores", "machine_idle_seconds", "register_gate", "unregister_gate", "wait_at"]
