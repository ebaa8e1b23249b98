"""The life cycle every world shares (:class:`WorldLifecycle`): its run directory, its job threads, ``close()``
with a hook for what else a world holds (as Gymnasium's ``close_extras``), and ``read()`` of world artifacts.

>>> import tempfile
>>> class Tiny(WorldLifecycle):
...     name = "tiny"
...     def __init__(self):
...         self.keep_files(None, prefix="rsigym-tiny-", job_threads=1)
...         self.closed_extras = False
...     def close_extras(self):
...         self.closed_extras = True
>>> world = Tiny(); run_dir = world.run_dir; run_dir.is_dir(), world.read("job-1/task")
(True, None)
>>> world.close(); world.close(); world.closed_extras, run_dir.exists()
(True, False)
"""

from __future__ import annotations

import concurrent.futures as cf
import shutil
import tempfile
from pathlib import Path


class WorldLifecycle:
    """The life cycle of a world (see the module docstring). A world that keeps files or runs jobs calls
    :meth:`keep_files` in its constructor; one that holds nothing needs nothing more."""

    name: str = ""
    run_dir: Path | None = None       # where the world keeps the run's artifacts (None: it keeps none)
    pool: cf.ThreadPoolExecutor | None = None  # the threads jobs run in (None: jobs are computed at once)
    _own_dir = False                  # the world made run_dir (and removes it on close)

    def keep_files(self, run_dir: Path | None, *, prefix: str, job_threads: int = 0) -> Path:
        """Keep the run's artifacts in ``run_dir`` (``None``: a fresh temporary directory, removed on
        :meth:`close`) and run jobs in ``job_threads`` threads (0: none)."""
        self._own_dir = run_dir is None
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix=prefix))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if job_threads:
            self.pool = cf.ThreadPoolExecutor(max_workers=job_threads, thread_name_prefix=f"{prefix}job")
        return self.run_dir

    def read(self, ref: str) -> str | None:
        """A world artifact the researcher can read (e.g. a dev evaluation's trajectories); ``None`` if ``ref``
        names none (the run then says what it can read)."""
        return None

    def close(self) -> None:
        """Stop the jobs, close the sandbox and evaluation services, release the extras, remove the run
        directory if the world made it. Safe to call twice."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        for part in ("sandbox", "evaluation"):
            closer = getattr(getattr(self, part, None), "close", None)
            if closer is not None:
                closer()
        self.close_extras()
        if self._own_dir and self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def close_extras(self) -> None:
        """Release what else the world holds (servers, worker processes, clients); called by :meth:`close`."""


__all__ = ["WorldLifecycle"]
