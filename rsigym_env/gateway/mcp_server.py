"""The run as an MCP server (official ``mcp`` SDK 2.x): stdio for one run, streamable HTTP per run key.

Every tool of :func:`rsigym_env.tools.tool_schemas` is one MCP tool with the same name, description
and input schema (the tool model's JSON schema; nothing is written by hand), its string limits capped
at 1,000 characters by default so that grammar-constrained decoders compile it (``--schema-max-length``,
``$RSIGYM_SCHEMA_MAX_LENGTH``; the run itself accepts the models' limits). A call goes to the run's
:class:`~rsigym_env.gateway.backend.RunBackend`, which validates, bills, audits and scores it; the
result is the :class:`~rsigym_env.gateway.backend.ToolReply` as ``structured_content`` (its text as
the content block). A refused call is an ``is_error`` result whose structured content carries the
error code (``invalid_args``, ``insufficient_budget``, ...): a refusal is never raised, because the
SDK turns an exception into a bare "Error executing tool". While a call runs (a long ``wait``), the
server sends MCP progress notifications to a client that asked for them. Resources:
``rsigym://budget`` (money, time, steps left) and ``rsigym://observation`` (the last observation).

The tools are registered on the SDK's low-level :class:`mcp.server.Server` with explicit schemas:
``MCPServer`` derives schemas from Python signatures and validates arguments itself, and a call it
refused would never reach the run's audit log.

In process (the SDK's own client, connected without a transport):

>>> import anyio
>>> from mcp import Client
>>> from rsigym_env.gateway.local_runs import LocalRunFactory
>>> run = LocalRunFactory(world="sim", benchmark="aime", budget_usd=50)(seed=0)
>>> async def episode():
...     async with Client(build_mcp_server(run)) as client:
...         refused = await client.call_tool("evaluate", {"k": "two"})
...         done = await client.call_tool("submit", {})
...     return refused.is_error, refused.structured_content["error"], done.structured_content["done"]
>>> anyio.run(episode)
(True, 'invalid_args', True)
>>> run.close()

Over stdio (what ``rsigym mcp`` runs; ``claude mcp add rsigym -- rsigym mcp --benchmark aime``)::

    python -m rsigym_env.gateway.mcp_server --world sim --benchmark aime --budget 50 --seed 0

or, for a run of the session service, ``RSIGYM_URL`` and ``RSIGYM_RUN_KEY`` in the environment and
no run flags (run flags win over them: :func:`backend_maker`). ``--run-dir DIR`` writes the run
directory as ``rsigym run`` does. A server that cannot get its run still answers: every tool call is
an error result saying why. Over streamable HTTP: :func:`mcp_http_app` (stateless; the bearer run key
is checked on every request).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import Receive, Scope, Send

from ..tools import SCHEMA_MAX_LENGTH, schema_max_length, tool_schemas
from .backend import RunBackend, ToolReply, jsonable
from .local_runs import IN_PROCESS_FLAGS, LocalRunFactory, add_mcp_arguments

log = logging.getLogger(__name__)

SCOPE_KEY = "rsigym.run"
"""The ASGI scope entry :func:`mcp_http_app` puts the caller's run (its ``RunBackend``) in."""
MAX_TOKEN_CHARS = 4096
BUDGET_URI = "rsigym://budget"
OBSERVATION_URI = "rsigym://observation"
INSTRUCTIONS = (
    "You are the researcher of one RSIGym research run: improve the target system (model weights and "
    "harness; in a recursive run, a researcher whose spec and code are the harness) on the benchmark, then "
    "call `submit` (this ends the episode; the reward is the normalized gain on a held-out split). Every paid "
    "tool is billed to the run's budget before it runs; a refused call costs nothing, uses no step and its "
    "result says why (an error code); the run ends after as many refusals as the scenario allows. Jobs "
    "(train, evaluate) run in the background: `wait` for them, `read` their results. The resource "
    f"{OBSERVATION_URI} holds the latest observation (the briefing before the first call); `read` with ref "
    f"'scenario' gives the scenario's settings; the resource {BUDGET_URI} shows money, time and steps left."
)
QUICK_TOOLS = frozenset({"read", "edit_harness"})
"""Tools that never wait on a job or a sandbox: no progress heartbeat while they run."""
_BUDGET_FIELDS = ("budget_left_usd", "time_left_h", "step", "running_jobs", "done")

ResolveKey = Callable[[str], "RunBackend | None | Awaitable[RunBackend | None]"]
Ctx = ServerRequestContext[Any, Any]
BackendFor = Callable[[Ctx], RunBackend | None]


def mcp_tools(max_string_length: int | str | None = "default") -> list[types.Tool]:
    """The MCP tool list: one per tool of :func:`tool_schemas`, same name, description and input schema.

    String limits are capped as in :func:`tool_schemas` (default 1,000 characters, or
    ``$RSIGYM_SCHEMA_MAX_LENGTH``) so that clients that decode under a grammar compile them; the run
    still accepts what its tool models accept. ``None``: the models' own limits.

    >>> [t.name for t in mcp_tools()][:3]
    ['generate_data', 'transform_data', 'train']
    """
    output_schema = ToolReply.model_json_schema()
    tools = []
    for schema in tool_schemas(max_string_length=max_string_length):
        fn = schema["function"]
        annotations = types.ToolAnnotations(
            read_only_hint=fn["name"] == "read", destructive_hint=fn["name"] == "submit", open_world_hint=False)
        tools.append(types.Tool(name=fn["name"], description=fn["description"], input_schema=fn["parameters"],
                                output_schema=output_schema, annotations=annotations))
    return tools


def tool_result(reply: ToolReply) -> types.CallToolResult:
    """A :class:`ToolReply` as an MCP result: its text as content, itself as structured content."""
    shows_code = reply.ok or (reply.error is not None and reply.error in reply.text)
    text = reply.text if shows_code else f"ERROR {reply.error}: {reply.text}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=reply.model_dump(mode="json"), is_error=not reply.ok)


def _refusal(tool: str, error: str, message: str) -> types.CallToolResult:
    """An ``is_error`` result for a call that never reached a run (no run, or the run is unreachable)."""
    reply = ToolReply(ok=False, tool=tool, text=f"ERROR {error}: {message}", error=error, message=message,
                      budget_left_usd=0.0)
    return tool_result(reply)


def build_mcp_server(backend: RunBackend | None = None, *, backend_for: BackendFor | None = None,
                     name: str = "rsigym", instructions: str = INSTRUCTIONS,
                     progress_interval_s: float = 2.0,
                     schema_max_length: int | str | None = "default") -> Server[Any]:
    """An MCP server whose tools drive one run.

    Args:
        backend: the run every request goes to (stdio, or in process).
        backend_for: instead of ``backend``, how to find a request's run (the HTTP app reads it from the
            request's ASGI scope, where :func:`mcp_http_app` put it after checking the key).
        progress_interval_s: while a call runs longer than this, a progress notification every interval.
        schema_max_length: the tool list's cap on string ``maxLength`` (:func:`mcp_tools`).
    """
    if (backend is None) == (backend_for is None):
        raise ValueError("give exactly one of backend and backend_for")
    if not progress_interval_s > 0:
        raise ValueError(f"progress_interval_s must be > 0, got {progress_interval_s}")
    find_run: BackendFor = (lambda ctx: backend) if backend_for is None else backend_for
    tools = mcp_tools(schema_max_length)
    input_schemas = {t.name: t.input_schema for t in tools}

    async def list_tools(ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        run = find_run(ctx)
        if run is None:
            return _refusal(params.name, "unauthorized", "no run is bound to this request")
        return await _call_with_progress(ctx, run, params.name, params.arguments or {}, progress_interval_s)

    async def list_resources(ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=BUDGET_URI, name="budget", mime_type="application/json",
                           description="Dollars, hours and steps left, running jobs, whether the episode is over."),
            types.Resource(uri=OBSERVATION_URI, name="observation", mime_type="application/json",
                           description="The run's last observation: log, budget, time, dev scores, action mask."),
        ])

    async def read_resource(ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        if params.uri not in (BUDGET_URI, OBSERVATION_URI):
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown resource {params.uri[:200]!r}; "
                                                               f"resources are {BUDGET_URI}, {OBSERVATION_URI}")
        run = find_run(ctx)
        if run is None:
            raise MCPError(code=types.INVALID_REQUEST, message="no run is bound to this request")
        try:
            obs = await anyio.to_thread.run_sync(run.observation)
        except Exception as exc:  # a remote run that cannot be reached
            raise MCPError(code=types.INTERNAL_ERROR, message=f"run unavailable: {exc}") from None
        data = {k: obs.get(k) for k in _BUDGET_FIELDS} if params.uri == BUDGET_URI else obs
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=params.uri, mime_type="application/json", text=json.dumps(jsonable(data)))])

    return Server(name, instructions=instructions, get_tool_input_schema=input_schemas.get,
                  on_list_tools=list_tools, on_call_tool=call_tool,
                  on_list_resources=list_resources, on_read_resource=read_resource)


async def _call_with_progress(ctx: Ctx, run: RunBackend, tool: str,
                              args: dict[str, Any], interval_s: float) -> types.CallToolResult:
    """Run one call in a worker thread; progress notifications while it runs (always for ``wait``)."""
    started = time.monotonic()

    async def progress(message: str) -> None:
        try:  # a client that went away must not turn a finished call into a failure
            await ctx.session.report_progress(time.monotonic() - started, None, message)
        except Exception as exc:
            log.debug("progress notification not sent: %r", exc)

    async def heartbeat() -> None:
        while True:
            await anyio.sleep(interval_s)
            await progress(f"{tool} still running after {time.monotonic() - started:.0f} s")

    if tool == "wait":
        await progress("waiting for a job to finish")
    reply: ToolReply | None = None
    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        if tool not in QUICK_TOOLS:  # the heartbeat task costs about as much as the thread hop
            tg.start_soon(heartbeat)
        try:
            reply = await anyio.to_thread.run_sync(run.call, tool, args)
        except Exception as exc:  # only an unreachable run fails like this; a bad call is a reply, not an exception
            log.warning("tool %r: run unavailable: %s", tool, exc)
            failure = exc
        tg.cancel_scope.cancel()
    if reply is None:
        return _refusal(tool, "run_unavailable", f"the run could not be reached: {failure}")
    if tool == "wait":
        finished = ", ".join(str(e.get("job", e)) for e in reply.events) or "no job"
        await progress(f"wait returned ({finished} finished)")
    return tool_result(reply)


# ------------------------------------------------------------------------------------------------
# Streamable HTTP


def _bearer_token(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or ``None``."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            if scheme.lower() == "bearer" and token and len(token) <= MAX_TOKEN_CHARS:
                return token
            return None
    return None


async def _send_json(send: Send, status: int, body: dict[str, Any], headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})


class MCPHTTPApp:
    """The ASGI app :func:`mcp_http_app` returns: stateless streamable HTTP, one bearer check per request.

    Served by itself (``uvicorn.run(app)``), it runs its own lifespan. Mounted in another app, the host
    enters :meth:`lifespan` in its own (Starlette does not run a mounted app's lifespan)::

        app = mcp_http_app(service.backend_for_key)          # the session service (rsigym serve)
        rest = create_app(service, mounts={"/mcp": app}, lifespan=lambda _: app.lifespan())
        host = Starlette(routes=[Route("/mcp", endpoint=app)], lifespan=lambda _: app.lifespan())  # any app
    """

    def __init__(self, resolve_key: ResolveKey, *, progress_interval_s: float = 2.0,
                 max_request_body_size: int = DEFAULT_MAX_REQUEST_BODY_SIZE,
                 transport_security: TransportSecuritySettings | None = None,
                 schema_max_length: int | str | None = "default"):
        self.resolve_key = resolve_key
        self.server = build_mcp_server(backend_for=_scope_backend, progress_interval_s=progress_interval_s,
                                       schema_max_length=schema_max_length)
        self.session_manager = StreamableHTTPSessionManager(
            app=self.server, stateless=True, json_response=False, security_settings=transport_security,
            max_request_body_size=max_request_body_size)
        self._running = False

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Run the SDK's session manager (its task group) while the context is open."""
        async with self.session_manager.run():
            self._running = True
            try:
                yield
            finally:
                self._running = False

    async def _resolve(self, token: str) -> RunBackend | None:
        found = self.resolve_key(token)
        if inspect.isawaitable(found):
            found = await found
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._serve_lifespan(receive, send)
            return
        if scope["type"] != "http":  # websocket: not part of streamable HTTP
            await send({"type": "websocket.close", "code": 1008})
            return
        if not self._running:
            await _send_json(send, 503, {"error": "not_started", "error_description":
                                         "the MCP endpoint is not running: enter MCPHTTPApp.lifespan() in the host app"})
            return
        token = _bearer_token(scope)
        run = None
        if token is not None:
            try:
                run = await self._resolve(token)
            except Exception:
                log.exception("resolve_key failed")
                await _send_json(send, 503, {"error": "temporarily_unavailable",
                                             "error_description": "the run key could not be checked; try again"})
                return
        if run is None:
            await _send_json(send, 401, {"error": "invalid_token", "error_description":
                                         "a valid run key is required: Authorization: Bearer <run key>"},
                             [(b"www-authenticate", b'Bearer realm="rsigym", error="invalid_token"')])
            return
        await self.session_manager.handle_request({**scope, SCOPE_KEY: run}, receive, send)

    async def _serve_lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(self.lifespan())
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})


def _scope_backend(ctx: Ctx) -> RunBackend | None:
    request = ctx.request
    scope = getattr(request, "scope", None)
    return scope.get(SCOPE_KEY) if isinstance(scope, dict) else None


def mcp_http_app(resolve_key: ResolveKey, *, progress_interval_s: float = 2.0,
                 max_request_body_size: int = DEFAULT_MAX_REQUEST_BODY_SIZE,
                 transport_security: TransportSecuritySettings | None = None,
                 schema_max_length: int | str | None = "default") -> MCPHTTPApp:
    """An ASGI app serving MCP over streamable HTTP for every run whose key ``resolve_key`` accepts.

    Each HTTP request is authorized on its own: ``resolve_key(token)`` (sync, fast and non-blocking, or
    async) maps the bearer token to the run's backend, or ``None`` (401). Protocol sessions are not used
    (stateless HTTP), so a key is never bound to, nor trusted from, an ``Mcp-Session-Id``. Request
    bodies over ``max_request_body_size`` are refused (413) before they are parsed.
    ``transport_security`` enables the SDK's Host/Origin checks (DNS-rebinding protection);
    ``schema_max_length`` caps the tool list's string limits (:func:`mcp_tools`).
    """
    return MCPHTTPApp(resolve_key, progress_interval_s=progress_interval_s,
                      max_request_body_size=max_request_body_size, transport_security=transport_security,
                      schema_max_length=schema_max_length)


# ------------------------------------------------------------------------------------------------
# stdio and the `rsigym mcp` command


class UnavailableRun:
    """The run of an ``rsigym mcp`` that could not start one: every tool call is an ``is_error`` result
    (``run_unavailable``) carrying ``reason``, and the resources fail with it, so the MCP client (and
    its model) reads why instead of seeing the connection close."""

    def __init__(self, reason: str):
        self.reason = reason

    def message(self) -> str:
        return (f"rsigym mcp has no research run: {self.reason} -- fix the server's command line or environment "
                "in the MCP client's configuration, then restart the server")

    def call(self, tool: str, args: dict[str, Any] | None = None) -> ToolReply:
        return ToolReply(ok=False, tool=str(tool)[:64], text=f"ERROR run_unavailable: {self.message()}",
                         error="run_unavailable", message=self.message(), budget_left_usd=0.0)

    def observation(self) -> dict[str, Any]:
        raise RuntimeError(self.message())

    def close(self) -> None:
        pass


async def serve_stdio(make_backend: Callable[[], RunBackend], *, progress_interval_s: float = 2.0,
                      schema_max_length: int | str | None = "default",
                      on_failure: Callable[[str], None] | None = None) -> bool:
    """Serve one run over stdin/stdout until the client closes stdin; then close the run.

    The run is built once the SDK has moved fd 1 aside, so nothing the world prints reaches the wire.
    If it cannot be built, the server still answers: every tool call is an error result saying why
    (:class:`UnavailableRun`; ``on_failure`` gets the reason too). Returns whether the run started.
    """
    async with stdio_server() as (read_stream, write_stream):
        started = True
        try:
            run: RunBackend = await anyio.to_thread.run_sync(make_backend)
        except Exception as exc:
            log.debug("the run could not start", exc_info=True)
            reason = f"the run could not start: {type(exc).__name__}: {exc}"
            if on_failure is not None:
                on_failure(reason)
            run, started = UnavailableRun(reason), False
        try:
            instructions = INSTRUCTIONS if started else unavailable_instructions(run.reason)  # type: ignore[attr-defined]
            server = build_mcp_server(run, progress_interval_s=progress_interval_s, instructions=instructions,
                                      schema_max_length=schema_max_length)
            await server.run(read_stream, write_stream, server.create_initialization_options())
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(run.close)
    return started


def unavailable_instructions(reason: str) -> str:
    """The instructions of a server without a run: why, and that every tool call answers the same."""
    return (f"This rsigym MCP server has no research run: {reason}. Every tool call answers with this error "
            "until the server is restarted with a working configuration.")


async def serve_unavailable(reason: str) -> None:
    """Serve, over stdio, only the reason ``rsigym mcp`` has no run (:class:`UnavailableRun`)."""
    async with stdio_server() as (read_stream, write_stream):
        server = build_mcp_server(UnavailableRun(reason), instructions=unavailable_instructions(reason),
                                  schema_max_length=SCHEMA_MAX_LENGTH)
        await server.run(read_stream, write_stream, server.create_initialization_options())


def _flag_names(flags: Sequence[str]) -> str:
    return ", ".join("--" + f.replace("_", "-") for f in flags)


def backend_maker(args: argparse.Namespace, environ: dict[str, str] | None = None,
                  notice: Callable[[str], None] | None = None) -> Callable[[], RunBackend]:
    """What ``rsigym mcp`` serves: an in-process run from the flags, or the service's run of ``RSIGYM_RUN_KEY``.

    Flags win over the environment: any flag of an in-process run (``--scenario``, ``--benchmark``,
    ``--run-dir``, ``--seed``, ...) means one, and ``notice`` is told that ``RSIGYM_RUN_KEY`` /
    ``RSIGYM_URL`` are ignored. Without such flags, ``RSIGYM_RUN_KEY`` and ``RSIGYM_URL`` together mean
    the session service's run; neither means an in-process run of the default scenario. Raises
    ``ValueError`` with the reason when only one of the two is set, or the scenario is bad.
    """
    environ = dict(os.environ if environ is None else environ)
    key, url = environ.get("RSIGYM_RUN_KEY"), environ.get("RSIGYM_URL")
    flags = [f for f in IN_PROCESS_FLAGS if getattr(args, f, None) is not None]
    if flags or not (key or url):
        if (key or url) and notice is not None:
            ignored = " and ".join(n for n, v in (("RSIGYM_RUN_KEY", key), ("RSIGYM_URL", url)) if v)
            notice(f"{_flag_names(flags)} given: serving an in-process run; {ignored} in the environment "
                   f"{'is' if ' and ' not in ignored else 'are'} ignored")
        factory = LocalRunFactory.from_args(args, step_log=True, researcher=getattr(args, "label", None) or "mcp",
                                            surface="rsigym mcp")
        factory.make_env().close()  # check the scenario now: a bad flag fails here with its reason, not mid-protocol
        seed = getattr(args, "seed", None)
        return lambda: factory(seed=0 if seed is None else seed)
    if not url:
        raise ValueError("RSIGYM_RUN_KEY is set but RSIGYM_URL (the session service's address, e.g. "
                         "http://127.0.0.1:8765) is not; or give run flags (--scenario, --benchmark, ...) for an "
                         "in-process run")
    if not key:
        raise ValueError("RSIGYM_URL is set but RSIGYM_RUN_KEY (the run key of a run of the service, rsr_...) is "
                         "not; or give run flags (--scenario, --benchmark, ...) for an in-process run")
    from .remote import RemoteRun  # the session service's REST client

    return lambda: RemoteRun(url, key)


def _interactive() -> bool:
    """Whether a person (a terminal) is on stdin, rather than an MCP client's pipe."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def cmd_mcp(args: argparse.Namespace, console: Any = None) -> int:
    """``rsigym mcp``: serve a run over stdio. Messages go to stderr; stdout is the protocol's.

    A configuration that cannot give a run (a bad scenario, half of the service's variables) is
    reported on stderr and then, unless stdin is a terminal, served: every tool call answers the
    reason (exit 2 when the client leaves; at a terminal, 2 at once). A run that fails to start is
    served the same way (exit 1).
    """
    from rich.console import Console

    err = Console(stderr=True)

    def say(message: str, style: str) -> None:
        err.print(f"rsigym mcp: {message}", style=style, markup=False, highlight=False, soft_wrap=True)

    try:
        if not args.progress_interval > 0:
            raise ValueError(f"--progress-interval must be > 0, got {args.progress_interval}")
        schema_cap = schema_max_length(getattr(args, "schema_max_length", "default"))
        make = backend_maker(args, notice=lambda text: say(text, "yellow"))
    except Exception as exc:  # ValueError: a bad flag or variable; anything else: the scenario check failed
        reason = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        say(reason, "red")
        if _interactive():
            return 2
        say("serving this error to the MCP client: every tool call answers it", "red")
        try:
            anyio.run(serve_unavailable, reason)
        except Exception as served:
            log.debug("serving the error stopped: %r", served)
        return 2
    try:
        started = anyio.run(lambda: serve_stdio(make, progress_interval_s=args.progress_interval,
                                                schema_max_length=schema_cap,
                                                on_failure=lambda reason: say(reason, "red")))
    except Exception as exc:  # the server broke: say why on stderr, not as a traceback on the wire
        log.exception("rsigym mcp stopped")
        say(f"stopped: {type(exc).__name__}: {exc}", "red")
        return 1
    return 0 if started else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rsigym mcp", description="Serve one research run over MCP (stdio).")
    add_mcp_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return cmd_mcp(args)


if __name__ == "__main__":
    sys.exit(main())
