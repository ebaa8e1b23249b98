"""The idle gate: background trials start only while the machine has a core to spare, one at a time,
and all at once when their result is needed."""

from __future__ import annotations

import asyncio
import threading
import time

from rsigym_env.worlds.common.idle import (
    IdleGate, SpareCores, machine_idle_seconds, register_gate, unregister_gate, wait_at,
)


class FakeMachine:
    """Idle seconds that grow at ``cores_idle`` per wall second (what /proc/stat would say)."""

    def __init__(self, cores_idle: float):
        self.cores_idle, self.t0 = cores_idle, time.monotonic()
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.cores_idle * (time.monotonic() - self.t0)


def elapsed(coro) -> float:
    started = time.monotonic()
    asyncio.run(coro)
    return time.monotonic() - started


def test_a_busy_machine_holds_a_waiter_until_the_gate_opens():
    busy = IdleGate(min_idle_cores=0.8, window_s=0.05, max_wait_s=30, idle_seconds=FakeMachine(0.1))
    threading.Timer(0.4, busy.open).start()
    assert 0.35 < elapsed(busy.wait()) < 3  # held while busy, let through at once when opened
    assert busy.is_open and elapsed(busy.wait()) < 0.05 and busy.waited_s >= 0.35


def test_a_closed_gate_lets_no_waiter_through_even_when_it_would_have_opened():
    """Closing an evaluation closes its gates first: a trial waiting there fails at once instead of starting a
    sandbox (its job's cancel may reach the job's event loop only later, on a loaded machine)."""
    import pytest

    busy = IdleGate(min_idle_cores=0.8, window_s=0.05, max_wait_s=30, idle_seconds=FakeMachine(0.1))
    threading.Timer(0.3, busy.close).start()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(busy.wait())
    assert time.monotonic() - started < 3
    busy.open()  # closed wins over open: nothing passes any more, not even on an idle machine
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(busy.wait())
    idle = IdleGate(window_s=0.05, idle_seconds=lambda: None)
    idle.close()
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(idle.wait())


def test_a_machine_with_a_spare_core_lets_waiters_through_one_window_at_a_time():
    idle = FakeMachine(1.5)
    gate = IdleGate(min_idle_cores=0.8, window_s=0.1, max_wait_s=30, idle_seconds=idle)

    async def three() -> list[float]:
        started = time.monotonic()

        async def one() -> float:
            await gate.wait()
            return time.monotonic() - started

        return sorted(await asyncio.gather(one(), one(), one()))

    times = asyncio.run(three())
    assert times[0] >= 0.09 and times[2] - times[0] >= 0.18  # each measured its own window after the last
    assert times[2] < 3


def test_no_waiter_is_held_longer_than_max_wait_nor_where_the_machine_cannot_be_read():
    assert 0.25 < elapsed(IdleGate(window_s=0.05, max_wait_s=0.3, idle_seconds=FakeMachine(0.0)).wait()) < 2
    assert elapsed(IdleGate(window_s=5, idle_seconds=lambda: None).wait()) < 0.1


def test_gates_are_found_by_key_and_an_unknown_key_does_not_wait():
    gate = IdleGate(window_s=5, max_wait_s=30, idle_seconds=FakeMachine(0.0))
    key = register_gate(gate)
    gate.open()
    assert elapsed(wait_at(key)) < 0.1
    assert unregister_gate(key) is gate and unregister_gate(key) is None
    assert elapsed(wait_at(key)) < 0.1 and elapsed(wait_at(None)) < 0.1


def test_the_machine_idle_time_is_read_from_proc_stat():
    first = machine_idle_seconds()
    time.sleep(0.05)
    second = machine_idle_seconds()
    assert first is not None and second is not None and second >= first > 0


async def _trials(cores: SpareCores, n: int, hold_s: float, log: list) -> None:
    """``n`` trials that enter, run ``hold_s`` and leave; ``log`` gets (start, end, running while in)."""
    async def trial() -> None:
        await cores.enter()
        start = time.monotonic()
        log.append(("in", start, cores.running))
        await asyncio.sleep(hold_s)
        cores.leave()
        log.append(("out", time.monotonic(), cores.running))

    await asyncio.gather(*(trial() for _ in range(n)))


def test_spare_cores_keep_base_trials_on_a_busy_machine_and_fill_a_quiet_one_up_to_most():
    """Busy (0.1 idle cores): never more than ``base`` at once, every trial still runs (a waiting one takes
    the place of one that leaves). Quiet (1.5 idle cores): extra trials are let in one window at a time, up
    to ``most``. Unreadable machine: ``base``."""
    for idle, most_seen in ((0.1, 2), (1.5, 4)):
        cores = SpareCores(base=2, most=4, min_idle_cores=0.4, window_s=0.02, idle_seconds=FakeMachine(idle))
        log: list = []
        asyncio.run(_trials(cores, 8, 0.15, log))
        assert sum(1 for e in log if e[0] == "in") == 8 and cores.running == 0
        assert max(e[2] for e in log if e[0] == "in") == most_seen
        assert cores.extra == 0 if idle < 0.4 else cores.extra >= 2
        assert cores.peak == most_seen  # what a cancelled evaluation is billed for
    blind = SpareCores(base=2, most=4, idle_seconds=lambda: None)
    log = []
    asyncio.run(_trials(blind, 5, 0.05, log))
    assert max(e[2] for e in log if e[0] == "in") == 2 and blind.extra == 0


def test_a_spare_cores_gate_found_by_key_gives_back_the_place_it_gave():
    cores = SpareCores(base=1, most=1)
    key = register_gate(cores)
    try:
        leave = asyncio.run(wait_at(key))
        assert cores.running == 1
        leave()
        assert cores.running == 0
        assert asyncio.run(wait_at(None))() is None  # no gate: nothing to give back
    finally:
        unregister_gate(key)


def test_a_place_given_back_is_taken_at_once_not_after_a_window():
    """Trials waiting for a place below ``base`` (and the one watching a window) wake when a trial leaves,
    so a busy machine hands places over as fast as without the gate."""
    for idle in (0.1, None):  # watching a window on a busy machine; or no machine to watch
        cores = SpareCores(base=1, most=2, window_s=5.0, idle_seconds=FakeMachine(idle) if idle else lambda: None)
        handoff: list[float] = []

        async def run(cores: SpareCores, handoff: list[float]) -> None:
            await cores.enter()
            waiter = asyncio.ensure_future(cores.enter())
            await asyncio.sleep(0.1)
            assert not waiter.done()
            left = time.monotonic()
            cores.leave()
            await waiter
            handoff.append(time.monotonic() - left)

        asyncio.run(run(cores, handoff))
        assert handoff[0] < 0.5 and cores.running == 1 and cores.extra == 0
