"""Throughput of the budget ledger: reserve+settle pairs in memory and on disk, audit-only records.

Run ``python bench/bench_ledger.py [seconds]``; :func:`measure` returns the figures for other scripts.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from rsigym_env.platform.ledger import Ledger

_AUDIT = {"tool": "infer", "args": {"model": "m", "max_tokens": 256}, "decision": "allowed"}


def _rate(step: Callable[[], None], seconds: float) -> float:
    """Calls of ``step`` per second over about ``seconds`` (batches of 200 keep the clock out of it)."""
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(200):
            step()
        done += 200
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - start)


def _pairs(ledger: Ledger, seconds: float, audited: bool) -> float:
    """reserve+settle pairs per second on a key with a budget that never runs out."""
    ledger.open_account("bench", 1e9)
    audit = _AUDIT if audited else None

    def pair() -> None:
        ledger.settle(ledger.reserve("bench", 0.01, audit=audit), 0.004, audit=audit)

    return _rate(pair, seconds)


def measure(seconds: float = 1.0) -> dict[str, float]:
    """Operations per second for each case, each run for about ``seconds``."""
    results: dict[str, float] = {}
    with Ledger() as ledger:
        results["memory reserve+settle pairs/s"] = _pairs(ledger, seconds, audited=False)
    with Ledger() as ledger:
        results["memory reserve+settle pairs/s (audited)"] = _pairs(ledger, seconds, audited=True)
    with tempfile.TemporaryDirectory() as tmp:
        with Ledger(Path(tmp) / "ledger.db") as ledger:
            results["disk reserve+settle pairs/s"] = _pairs(ledger, seconds, audited=False)
        with Ledger(Path(tmp) / "audited.db") as ledger:
            results["disk reserve+settle pairs/s (audited)"] = _pairs(ledger, seconds, audited=True)
    with Ledger() as ledger:
        ledger.open_account("bench", 1.0)
        event = {**_AUDIT, "key": "bench"}
        results["memory audit-only records/s"] = _rate(lambda: ledger.record(event), seconds)
    return results


if __name__ == "__main__":
    figures = measure(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
    width = max(map(len, figures))
    print(f"{'case':<{width}}  {'per second':>12}  {'us each':>8}")
    for name, rate in figures.items():
        print(f"{name:<{width}}  {rate:>12,.0f}  {1e6 / rate:>8.1f}")
