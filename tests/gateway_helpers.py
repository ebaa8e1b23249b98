"""Test helpers for the agent surfaces: uvicorn serving an ASGI app on loopback, in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator


@contextlib.contextmanager
def serve_in_thread(app: Any, *, timeout_s: float = 10.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port, lifespan on, websockets); yield its base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_config=None, log_level="warning", access_log=False, lifespan="on",
                            ws="websockets-sansio", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"test-uvicorn:{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the test server did not start")
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
        if thread.is_alive():
            server.force_exit = True
            thread.join(5)
        sock.close()
