"""Serving an ASGI app from a background thread, with request-body limits and one-line aborted requests.

The local world's HTTP servers (the OpenAI-compatible server, the sandboxes' envd) are reached by
untrusted code, so each of them is built from the same three parts:

* :class:`ThreadedASGIServer` — uvicorn in a daemon thread on loopback TCP (``port=0``: a free
  port) and/or a unix socket; ``start()`` waits until it accepts connections, ``stop()`` frees the
  port and the socket file; a context manager. It leaves the process's logging configuration
  alone (uvicorn's own would replace the handlers of its loggers).
* :class:`BodyLimitMiddleware` — refuses a request body over ``max_bytes`` with 413, before
  reading it when ``Content-Length`` says so, else as soon as the limit is passed; it decodes
  ``Content-Encoding: gzip``/``deflate`` bodies for the app, counting the decoded bytes (a gzip
  bomb is refused after decoding at most the limit).
* :class:`AbortedRequestFilter` — on uvicorn's error logger: the traceback of a request whose client
  went away becomes one line naming the request.

>>> import httpx
>>> from starlette.applications import Starlette
>>> from starlette.middleware import Middleware
>>> from starlette.responses import PlainTextResponse
>>> from starlette.routing import Route
>>> async def size(request):
...     return PlainTextResponse(str(len(await request.body())))
>>> app = Starlette(routes=[Route("/size", size, methods=["POST"])],
...                 middleware=[Middleware(BodyLimitMiddleware, max_bytes=1000)])
>>> with ThreadedASGIServer(app, name="demo") as server:
...     ok = httpx.post(f"{server.url}/size", content=b"x" * 1000)
...     big = httpx.post(f"{server.url}/size", content=b"x" * 1001)
>>> ok.text, big.status_code, big.text
('1000', 413, 'POST /size: the request body of 1,001 bytes is over the limit of 1,000 bytes')
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import functools
import logging
import os
import socket
import stat
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Awaitable, Callable, MutableMapping, Self

import anyio
from starlette.responses import PlainTextResponse, Response

log = logging.getLogger("rsigym_env.asgi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ErrorResponse = Callable[[int, str], Response]
"""Builds the error response of a refused request from its status and message (413, 400, 415)."""

MiB = 1 << 20

_REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("rsigym_asgi_request", default="")
"""``METHOD /path`` of the request being served in this task (for :class:`AbortedRequestFilter`)."""


def _size(n: int) -> str:
    """``8 MiB (8,388,608 bytes)``-style text for a byte count.

    >>> _size(8 << 20), _size(1000)
    ('8 MiB (8,388,608 bytes)', '1,000 bytes')
    """
    if n >= MiB and n % MiB == 0:
        return f"{n // MiB} MiB ({n:,} bytes)"
    return f"{n:,} bytes"


def plain_error(status: int, message: str) -> Response:
    """The default error response: ``message`` as text."""
    return PlainTextResponse(message, status_code=status)


# --------------------------------------------------------------------------------------------
# Request bodies


class _Refused(Exception):
    """Raised inside the wrapped ``receive`` to refuse the request (status, message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Decoder:
    """Incremental gzip/zlib decoding that never produces more than ``budget`` bytes in total
    (multi-member gzip included)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.produced = 0
        self._z = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, detected

    def feed(self, data: bytes) -> bytes:
        out = []
        while data:
            piece = self._z.decompress(data, self.budget - self.produced + 1)
            self.produced += len(piece)
            if self.produced > self.budget:
                raise _Refused(413, "the decompressed request body is over the limit of " + _size(self.budget))
            out.append(piece)
            if self._z.eof:  # a next gzip member, or trailing bytes that are not one (an error below)
                data = self._z.unused_data
                if data:
                    self._z = zlib.decompressobj(zlib.MAX_WBITS | 32)
            else:
                data = self._z.unconsumed_tail  # empty: the budget was not reached, so all input was taken
        return b"".join(out)

    def finish(self) -> None:
        if not self._z.eof:
            raise _Refused(400, "the compressed request body is truncated")


class BodyLimitMiddleware:
    """Refuse request bodies larger than ``max_bytes`` (counted after decoding) with 413.

    * ``Content-Length`` over the limit: refused before the app runs, nothing read;
    * otherwise the body is counted as the app reads it; past the limit the app sees the client as
      gone (``http.disconnect``), what it still sends is dropped, and once it has ended (its
      clean-up done) the client gets the 413;
    * ``Content-Encoding: gzip``, ``x-gzip`` or ``deflate`` (when ``decode``): decoded on the fly
      for the app (the header removed), at most ``max_bytes`` decoded bytes; a corrupt stream is a
      400; another encoding a 415. With ``decode=False`` encodings pass through untouched (the
      raw bytes still count).

    ``error(status, message)`` shapes the refusal (the API's error format); the message names the
    request and the limit. Before answering, the rest of the body is read and dropped if it is at
    most ``drain_bytes`` (default: a quarter of the limit, at least 16 MiB) and comes within
    ``drain_s``, so that a client still sending reads the answer; past that the connection is
    closed on it. A refused request is logged at INFO in one line.
    """

    ENCODINGS = ("gzip", "x-gzip", "deflate")

    def __init__(self, app: ASGIApp, max_bytes: int, *, decode: bool = True, error: ErrorResponse = plain_error,
                 drain_bytes: int | None = None, drain_s: float = 5.0) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes
        self.decode = decode
        self.error = error
        self.drain_bytes = max(16 * MiB, max_bytes // 4) if drain_bytes is None else drain_bytes
        self.drain_s = drain_s

    async def _drain(self, receive: Receive, more: bool, left: int | None) -> None:
        """Read and drop the rest of a refused body when it is small (at most ``drain_bytes``, for
        ``drain_s``): a client still sending it then reads the answer instead of a reset connection."""
        if not more or (left is not None and left > self.drain_bytes):
            return
        budget = self.drain_bytes
        with anyio.move_on_after(self.drain_s):
            while budget >= 0:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
                budget -= len(message.get("body", b""))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        where = f"{scope.get('method', '')} {scope.get('path', '')}"
        _REQUEST.set(where)
        length, encoding = None, b""
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                length = value
            elif key == b"content-encoding":
                encoding = value.strip().lower()
        state = {"answered": False, "started": False}
        declared: int | None = None
        refusal: Response | None = None

        async def refuse(status: int, message: str, more: bool, left: int | None) -> None:
            """Note the refusal (sent once the app has ended, so its clean-up happens before the client hears)."""
            nonlocal refusal
            log.info("refused %s: %s", where, message)
            state["answered"] = True
            if not state["started"]:
                await self._drain(receive, more, left)
                refusal = self.error(status, f"{where}: {message}")
                refusal.headers["connection"] = "close"

        async def answer() -> None:
            if refusal is not None:
                await refusal(scope, _nothing, send)

        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await refuse(400, f"invalid Content-Length {length[:40]!r}", False, None)
                await answer()
                return
            if declared > self.max_bytes:
                await refuse(413, f"the request body of {_size(declared)} is over the limit of {_size(self.max_bytes)}",
                             declared > 0, declared)
                await answer()
                return
        decoder: _Decoder | None = None
        if encoding not in (b"", b"identity") and self.decode:
            if encoding.decode("latin-1") not in self.ENCODINGS:
                await refuse(415, f"unsupported Content-Encoding {encoding.decode('latin-1')!r} "
                                  f"(supported: {', '.join(self.ENCODINGS)}, identity)", declared != 0, declared)
                await answer()
                return
            decoder = _Decoder(self.max_bytes)
            scope = dict(scope)
            dropped = (b"content-encoding", b"content-length")  # the app sees the decoded body
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k not in dropped]
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            if state["answered"]:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] != "http.request":
                return message
            body = message.get("body", b"")
            received += len(body)
            more = bool(message.get("more_body", False))
            left = None if declared is None else declared - received
            try:
                if received > self.max_bytes:
                    raise _Refused(413, f"the request body is over the limit of {_size(self.max_bytes)}")
                if decoder is not None:
                    body = decoder.feed(body)
                    if not message.get("more_body", False):
                        decoder.finish()
                    message = {**message, "body": body}
            except _Refused as exc:
                await refuse(exc.status, str(exc), more, left)
                return {"type": "http.disconnect"}
            except zlib.error as exc:
                await refuse(400, f"cannot decode the {encoding.decode('latin-1')} request body: {exc}", more, left)
                return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                if state["answered"]:
                    return
                state["started"] = True
            elif state["answered"] and not state["started"]:
                return  # the app's answer to the refusal we already sent
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if refusal is None:
                raise
            # the app failed on the disconnect it was shown after the refusal: answered below
        await answer()


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


# --------------------------------------------------------------------------------------------
# Aborted requests in one log line


class ResponseAborted(Exception):
    """Raise it from a response to cut the connection on purpose (e.g. a file that shrank while it
    was sent); :class:`AbortedRequestFilter` logs it in one line with this message."""


def abort_cause(exc: BaseException) -> BaseException | None:
    """The exception that says the client went away (or :class:`ResponseAborted`), looking into
    exception groups and causes; None for anything else."""
    from starlette.requests import ClientDisconnect

    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (ClientDisconnect, ResponseAborted, BrokenPipeError, ConnectionResetError,
                          ConnectionAbortedError)):
            return e
        if isinstance(e, OSError) and e.errno in (errno.EPIPE, errno.ECONNRESET):
            return e
        if isinstance(e, BaseExceptionGroup):
            if all(abort_cause(sub) is not None for sub in e.exceptions):
                return abort_cause(e.exceptions[0])
            continue
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return None


class AbortedRequestFilter(logging.Filter):
    """Rewrite a log record whose exception is a client disconnect into one WARNING line,
    ``aborted request POST /files: the client disconnected (ClientDisconnect)``; every other record
    passes unchanged (tracebacks of real errors stay).

    >>> from starlette.requests import ClientDisconnect
    >>> record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application",
    ...                            None, (ClientDisconnect, ClientDisconnect(), None))
    >>> AbortedRequestFilter().filter(record), record.getMessage(), record.exc_info, record.levelname
    (True, 'aborted request: the client disconnected (ClientDisconnect)', None, 'WARNING')
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        cause = abort_cause(exc) if exc is not None else None
        if cause is None:
            return True
        where = _REQUEST.get()
        what = (str(cause) or type(cause).__name__) if isinstance(cause, ResponseAborted) else \
            f"the client disconnected ({type(cause).__name__})"
        record.msg, record.args = "aborted request%s: %s", (f" {where}" if where else "", what)
        record.exc_info = record.exc_text = record.stack_info = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_FILTER = AbortedRequestFilter()


def install_aborted_request_filter(logger: str = "uvicorn.error") -> None:
    """Add the (one, shared) :class:`AbortedRequestFilter` to ``logger``; calling it again does nothing."""
    target = logging.getLogger(logger)
    if _FILTER not in target.filters:
        target.addFilter(_FILTER)


# --------------------------------------------------------------------------------------------
# The server thread


@functools.cache
def _prompt_server_class() -> type:
    """uvicorn's ``Server``, stopping as soon as it is asked to (uvicorn is imported when a server starts).

    uvicorn polls ``should_exit`` every 0.1 s and pauses 0.1 s at shutdown for open connections to
    finish, so every stop took ~0.2 s even with nothing connected: an evaluation's own model server
    cost that after its last trial. Here the main loop also wakes when :meth:`wake` is called, and a
    shutdown with no connection and no task open skips the pause (with any open, uvicorn's own runs)."""
    import uvicorn

    class PromptServer(uvicorn.Server):
        _loop: asyncio.AbstractEventLoop | None = None
        _wake: asyncio.Event | None = None

        async def main_loop(self) -> None:
            self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
            counter = 0
            should_exit = await self.on_tick(counter)
            while not should_exit:
                counter = (counter + 1) % 864000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.1)
                should_exit = await self.on_tick(counter)

        def wake(self) -> None:
            """Make the main loop look at ``should_exit`` now (from any thread)."""
            loop, event = self._loop, self._wake
            if loop is not None and event is not None:
                with contextlib.suppress(RuntimeError):  # the loop has closed already
                    loop.call_soon_threadsafe(event.set)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if self.server_state.connections or self.server_state.tasks:
                await super().shutdown(sockets)
                return
            for server in self.servers:
                server.close()
            for sock in sockets or []:
                sock.close()
            for server in self.servers:
                await server.wait_closed()
            if not self.force_exit:
                await self.lifespan.shutdown()

    return PromptServer


class ThreadedASGIServer:
    """uvicorn serving ``app`` in a daemon thread, on ``host:port`` (``port=0``: a free one; ``None``:
    no TCP) and/or the unix socket ``uds`` (created mode 0666, a stale socket replaced).

    ``name`` names the thread and the errors; ``lifespan`` is uvicorn's (``"off"``: no ASGI lifespan
    events; ``"auto"`` for an app with startup/shutdown handlers; ``"on"`` to require them), ``ws``
    uvicorn's websocket implementation (``"none"``: no websockets). ``start(timeout_s)`` binds and
    waits until uvicorn accepts connections (``RuntimeError`` if it does not in time);
    ``stop(timeout_s)`` lets in-flight requests finish for ``graceful_s``, then ends them, frees the
    port and removes the socket file; both are safe to call twice, and a stopped server can start
    again. Idle keep-alive connections are closed after ``keep_alive_s``.

    >>> import httpx
    >>> from starlette.responses import PlainTextResponse
    >>> with ThreadedASGIServer(PlainTextResponse("hi"), name="hello") as server:
    ...     httpx.get(server.url).text, server.running
    ('hi', True)
    >>> server.running
    False
    """

    def __init__(self, app: ASGIApp, *, host: str = "127.0.0.1", port: int | None = 0,
                 uds: str | Path | None = None, name: str = "asgi", log_level: str = "warning",
                 graceful_s: float = 1.0, keep_alive_s: int = 5, lifespan: str = "off", ws: str = "none") -> None:
        if port is None and uds is None:
            raise ValueError("give a TCP port (0 for any free one), a unix socket path (uds), or both")
        self.app = app
        self.host = host
        self.requested_port = port
        self.uds: Path | None = Path(uds) if uds is not None else None
        self.name = name
        self.log_level = log_level
        self.graceful_s = graceful_s
        self.keep_alive_s = keep_alive_s
        self.lifespan = lifespan
        self.ws = ws
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sockets: list[socket.socket] = []
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and bool(self._server and self._server.started)

    @property
    def url(self) -> str:
        """``http://HOST:PORT``."""
        if self.port is None:
            raise RuntimeError(f"the {self.name} server is not started" if self.requested_port is not None
                               else f"the {self.name} server listens on a unix socket only (see .uds)")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- sockets ---------------------------------------------------------------------------

    def _bind_tcp(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets that say they are TCP,
        # and without it every response waits ~40 ms for a delayed ACK (headers and body are two writes).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((self.host, self.requested_port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        return sock

    def _bind_unix(self, path: Path) -> socket.socket:
        try:  # a stale socket from a dead server is replaced; any other file is not
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            os.chmod(path, 0o666)  # who may connect is decided by who can reach the path (mounts)
        except OSError:
            sock.close()
            raise
        return sock

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            is_unix = sock.family == socket.AF_UNIX
            sock.close()
            if is_unix and self.uds is not None:
                try:
                    if stat.S_ISSOCK(self.uds.lstat().st_mode):
                        self.uds.unlink()
                except FileNotFoundError:
                    pass
        self._sockets = []

    # -- life cycle ------------------------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> "ThreadedASGIServer":
        """Bind, start uvicorn in a daemon thread and wait until it accepts connections."""
        import uvicorn

        if self._thread is not None:
            return self
        try:
            if self.requested_port is not None:
                self._sockets.append(self._bind_tcp())
            if self.uds is not None:
                self._sockets.append(self._bind_unix(self.uds))
        except OSError:
            self._close_sockets()
            self.port = None
            raise
        install_aborted_request_filter()
        config = uvicorn.Config(self.app, log_config=None, log_level=self.log_level, access_log=False,
                                lifespan=self.lifespan, ws=self.ws, timeout_graceful_shutdown=self.graceful_s,
                                timeout_keep_alive=self.keep_alive_s)
        self._server = _prompt_server_class()(config)
        self._error = None
        where = self.port if self.port is not None else self.uds
        self._thread = threading.Thread(target=self._serve, name=f"{self.name}:{where}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                error = self._error
                self.stop()
                raise RuntimeError(f"the {self.name} server did not start within {timeout_s} s: {error!r}")
            time.sleep(0.005)
        return self

    def _serve(self) -> None:
        try:
            self._server.run(sockets=list(self._sockets))
        except BaseException as exc:  # SystemExit from uvicorn's start-up failure included
            self._error = exc
            log.error("the %s server stopped: %r", self.name, exc)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving (in-flight requests get ``graceful_s``), free the port, remove the socket file."""
        if self._server is not None:
            self._server.should_exit = True
            self._server.wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout_s)
        self._close_sockets()
        self._thread = self._server = None

    def __enter__(self) -> "ThreadedASGIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HTTPServing:
    """What a server object holding a :class:`ThreadedASGIServer` in ``self._http`` offers the same way:
    ``port``, ``url``, ``running``, ``start()`` (returns the server), ``stop()`` (safe twice) and ``with``.
    A server with more to release overrides ``stop`` and calls ``super().stop(timeout_s)`` last."""

    _http: "ThreadedASGIServer"

    @property
    def port(self) -> int | None:
        """The bound TCP port (None before the first start, or without TCP)."""
        return self._http.port

    @property
    def running(self) -> bool:
        return self._http.running

    @property
    def url(self) -> str:
        """``http://HOST:PORT``."""
        return self._http.url

    def start(self, timeout_s: float = 10.0) -> Self:
        """Bind, start uvicorn in a daemon thread and wait until it accepts connections."""
        self._http.start(timeout_s)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and free the port (and the socket file). Safe to call twice."""
        self._http.stop(timeout_s)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["HTTPServing", "AbortedRequestFilter", "BodyLimitMiddleware", "ResponseAborted", "ThreadedASGIServer", "abort_cause",
           "install_aborted_request_filter", "plain_error"]
