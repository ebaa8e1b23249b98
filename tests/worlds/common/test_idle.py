"""The idle gate: background trials start only while the machine has a core to spare, one at a time,
and all at once when their result is needed."""

from __future__ import annotations

import asyncio
import threading
import time

from rsigym_env.worlds.common.idle import IdleGate, machine_idle_seconds, register_gate, unregister_gate, wait_at


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
