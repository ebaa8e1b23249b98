"""Simulated time: seconds since the run began, advanced only by calls and waits.

>>> from rsigym_env.services import Job, resolved
>>> clock = SimClock()
>>> clock.spend(30.0); clock.now()
30.0
>>> job = Job(id="job-1", kind="train", started_at=30.0, future=resolved(None), ready_at=100.0)
>>> clock.wait([job], deadline=50.0) is None, clock.now()
(True, 50.0)
>>> clock.wait([job], deadline=500.0).id, clock.now()
('job-1', 100.0)
"""

from __future__ import annotations

import math
from typing import Sequence

from rsigym_env.services import Job


class SimClock:
    """A clock that jumps: ``spend`` adds a call's duration, ``wait`` skips to the next finished job."""

    simulated = True

    def __init__(self, start: float = 0.0):
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def spend(self, seconds: float) -> None:
        """A synchronous call took ``seconds``."""
        if seconds < 0:
            raise ValueError(f"cannot spend negative time ({seconds})")
        self._now += seconds

    def wait(self, jobs: Sequence[Job], deadline: float) -> Job | None:
        """Jump to the earliest ``ready_at`` among ``jobs`` and return that job (the first listed on a tie).

        If no job is ready by ``deadline``, jump to ``deadline`` (when finite) and return ``None``.
        A job without ``ready_at`` counts as ready now if its future is done.
        """
        best: Job | None = None
        best_at = math.inf
        for job in jobs:
            if job.ready_at is not None:
                at = max(job.ready_at, self._now)
            elif job.future.done():
                at = self._now
            else:
                continue
            if at < best_at:
                best, best_at = job, at
        if best is not None and best_at <= deadline:
            self._now = best_at
            return best
        if math.isfinite(deadline):
            self._now = max(self._now, deadline)
        return None
