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
>>> import asyncio; asyncio.run(wait_at(key)); asyncio.run(wait_at("no-such-gate"))
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


_GATES: dict[str, IdleGate] = {}
_GATES_LOCK = threading.Lock()


def register_gate(gate: IdleGate) -> str:
    """A key under which :func:`wait_at` finds ``gate``."""
    key = f"gate-{secrets.token_hex(8)}"
    with _GATES_LOCK:
        _GATES[key] = gate
    return key


def unregister_gate(key: str) -> IdleGate | None:
    with _GATES_LOCK:
        return _GATES.pop(key, None)


async def wait_at(key: str | None) -> None:
    """Wait at the gate registered as ``key`` (at once if there is none: e.g. it was unregistered)."""
    with _GATES_LOCK:
        gate = _GATES.get(key) if key else None
    if gate is not None:
        await gate.wait()


__all__ = ["IdleGate", "machine_idle_seconds", "register_gate", "unregister_gate", "wait_at"]
