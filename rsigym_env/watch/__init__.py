"""``rsigym watch``: a live dashboard of research runs and sweeps, and the run record it reads.

* :class:`RunRecorder` (:mod:`.record`) — a gymnasium wrapper that appends a run's record
  (``record.jsonl``: start, every step, datasets, harness versions, job results, the end) as it goes.
* :class:`Catalog` (:mod:`.catalog`) and :mod:`.model` — run and sweep directories read for the pages.
* :func:`create_app` (:mod:`.app`) — the web app; :func:`~.cli.register` adds ``rsigym watch``.
"""

from .catalog import Catalog, ServiceSource, URLSource
from .record import RECORD_FILE, RunRecorder, read_record

__all__ = ["Catalog", "RECORD_FILE", "RunRecorder", "ServiceSource", "URLSource", "create_app", "read_record"]


def __getattr__(name: str):  # the web app needs starlette and jinja2: imported only when asked for
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
