"""Serving the gateway's app with uvicorn: in a background thread (tests, benchmarks) or in the foreground.

The foreground server may listen on non-loopback addresses (the CLI decides whether it may); the
background one is the shared :class:`~rsigym_env.serving.asgi.ThreadedASGIServer` with the app's lifespan.

>>> import httpx
>>> from starlette.responses import PlainTextResponse
>>> with BackgroundServer(PlainTextResponse("hi")) as server:
...     httpx.get(server.url).text
'hi'
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from .asgi import ThreadedASGIServer


def is_loopback(host: str) -> bool:
    """Is ``host`` a loopback address (or ``localhost``)?

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: a free one) with ``TCP_NODELAY``: clients may
    connect as soon as it is returned (they wait in the backlog until the server accepts)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP; without it
    # every response waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)  # connections queue up from now on, before uvicorn starts serving (no early refusals)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def uvicorn_server(app: Any, log_level: str = "warning") -> Any:
    import uvicorn

    config = uvicorn.Config(app, log_config=None, log_level=log_level, access_log=False, lifespan="auto",
                            ws="none", timeout_graceful_shutdown=2, timeout_keep_alive=5)
    return uvicorn.Server(config)


class BackgroundServer(ThreadedASGIServer):
    """uvicorn serving ``app`` on ``host:port`` in a daemon thread, with the app's lifespan (a mounted MCP
    app needs it); ``url`` once started. The shared :class:`~rsigym_env.serving.asgi.ThreadedASGIServer`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        super().__init__(app, host=host, port=port, name="gateway", log_level=log_level, graceful_s=2,
                         keep_alive_s=5, lifespan="auto")
