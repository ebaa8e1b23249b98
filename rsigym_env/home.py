"""Where RSIGym keeps its files: one directory for state, one for caches.

* :func:`state_dir` — the platform's own state, which must survive (secrets, the agent registry,
  gateway runs, refreshed price lists): ``$RSIGYM_HOME`` when set, else ``~/.rsigym``. The default
  stays ``~/.rsigym`` rather than the platform's data directory so that existing installations
  keep finding their secrets, agents and ledgers.
* :func:`cache_dir` — what can be rebuilt at any time (generated task directories, cached
  official evaluations): ``$RSIGYM_HOME/cache`` when ``RSIGYM_HOME`` is set (so one variable
  isolates everything, as the tests do), else the platform's user cache directory
  (``platformdirs``: ``~/.cache/rsigym`` on Linux, honouring ``$XDG_CACHE_HOME``).

Both are read at each call, so a change of ``RSIGYM_HOME`` takes effect at once.

>>> from unittest import mock
>>> with mock.patch.dict(os.environ, {"RSIGYM_HOME": "/srv/rsigym"}):
...     str(state_dir("secrets")), str(cache_dir("tasks"))
('/srv/rsigym/secrets', '/srv/rsigym/cache/tasks')
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

HOME_ENV = "RSIGYM_HOME"
APP_NAME = "rsigym"


def _home_override() -> Path | None:
    value = os.environ.get(HOME_ENV)
    return Path(value) if value else None


def state_dir(*parts: str) -> Path:
    """``$RSIGYM_HOME`` (default ``~/.rsigym``), joined with ``parts``; not created."""
    root = _home_override() or Path.home() / f".{APP_NAME}"
    return root.joinpath(*parts)


def cache_dir(*parts: str) -> Path:
    """``$RSIGYM_HOME/cache`` (default the user cache directory, ``~/.cache/rsigym`` on Linux),
    joined with ``parts``; not created."""
    home = _home_override()
    root = home / "cache" if home is not None else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    return root.joinpath(*parts)


__all__ = ["APP_NAME", "HOME_ENV", "cache_dir", "state_dir"]
