"""Test helpers for the agent surfaces: uvicorn serving an ASGI app on loopback, in a thread."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from rsigym_env.serving.asgi import ThreadedASGIServer


@contextlib.contextmanager
def serve_in_thread(app: Any, *, timeout_s: float = 10.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port, lifespan on, websockets); yield its base URL."""
    server = ThreadedASGIServer(app, name="test-uvicorn", lifespan="on", ws="websockets-sansio", graceful_s=1)
    server.start(timeout_s)
    try:
        yield server.url
    finally:
        server.stop()
