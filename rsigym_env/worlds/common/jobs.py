"""Wall time and jobs of the worlds that do real work: jobs run in worker threads, ``wait`` blocks on them.

>>> clock = WallClock(); clock.now() < 1.0
True
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Sequence

from ...services import Job

CANCEL_WAIT_S = 30.0   # how long a cancelled job may take to stop (one training step, one trial)


class JobCancelled(Exception):
    """A job stopped because it was cancelled (the run ended, was reset or closed)."""


class WallClock:
    """Seconds since the world started; ``wait`` blocks on the jobs' futures."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def spend(self, seconds: float) -> None:
        """Wall time has already passed."""

    def wait(self, jobs: Sequence[Job], deadline: float) -> Job | None:
        by_future = {job.future: job for job in jobs}
        for job in jobs:
            if job.future.done():
                return job
        done, _ = cf.wait(list(by_future), timeout=max(0.0, deadline - self.now()), return_when=cf.FIRST_COMPLETED)
        return next((job for job in jobs if job.future in done), None)


__all__ = ["CANCEL_WAIT_S", "JobCancelled", "WallClock"]
