"""The REST surface of a :class:`~rsigym_env.gateway.service.SessionService` (FastAPI).

Researcher routes take ``Authorization: Bearer <run key>``:

* ``POST /v1/tools/{name}`` — one route per tool; the body is the tool's arguments (exactly a
  ``step`` action's ``args``; its schema is the tool's pydantic model, so ``/openapi.json`` carries
  every tool's schema); the reply is always a :class:`~rsigym_env.gateway.backend.ToolReply`, with
  the HTTP status of its error code (:data:`STATUS`): 200 ok, 401 no or wrong key, 402
  ``insufficient_budget``, 403 what the key does not allow, 404 ``unknown_tool``, 409
  ``episode_over``, 410 a closed or interrupted run, 422 ``invalid_args``/``malformed_action``,
  429 too many calls at once on one run, 400 anything else.
* ``GET /v1/balance`` (``{budget_usd, spent_usd, reserved_usd, remaining_usd}``), ``GET /v1/jobs``,
  ``GET /v1/jobs/{id}``, ``GET /v1/observation``, ``GET /v1/run``, ``GET /v1/tools`` — read-only
  views; they are not steps and cost nothing.
* ``GET /v1/audit`` (the audit log, record by record, and whether its hash chain is intact),
  ``GET /v1/ledger`` (accounts and open reservations), ``GET /v1/ledger.sqlite`` (a copy of the
  ledger database) and ``GET /v1/trajectory`` (the episode as ATIF) — the run's records, read-only,
  once its episode is over (409 ``episode_not_over`` before): what a verifier keeps as evidence.

Admin routes take the admin token: ``POST /v1/runs`` (a :class:`~.service.RunRequest`; answers
the run id and its key, shown once), ``GET /v1/runs``, ``GET /v1/runs/{id}``,
``DELETE /v1/runs/{id}``. ``GET /health`` needs nothing. Errors outside tool calls are
``{"ok": false, "error": code, "message": ...}``. Request bodies over ``max_body_bytes`` get 413.

Other surfaces mount into the same app: ``create_app(service, mounts={"/mcp": asgi_app})``
(and ``lifespan=`` for a sub-app that needs one); they resolve a bearer key with
``service.backend_for_key(key)``.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Path as PathParam, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from ..serving.asgi import BodyLimitMiddleware
from ..tools import TOOLS, tool_schemas
from .auth import bearer_token
from .backend import ToolReply
from .host import refusal
from .service import GatewayError, RunRequest, SessionService

STATUS: dict[str, int] = {
    "unauthorized": 401,
    "insufficient_budget": 402,
    "forbidden_tool": 403, "teacher_not_allowed": 403, "field_locked": 403, "field_not_allowed": 403,
    "limit_exceeded": 403, "key_closed": 403,
    "unknown_tool": 404, "unknown_run": 404, "unknown_job": 404,
    "episode_over": 409,
    "run_closed": 410, "run_interrupted": 410,
    "payload_too_large": 413,
    "invalid_args": 422, "malformed_action": 422, "invalid_scenario": 422,
    "too_many_requests": 429, "too_many_runs": 429,
}
"""HTTP status of each error code; any other refusal is 400."""

MAX_BODY_BYTES = 1 << 20
WORKER_THREADS = 64
_BEARER = HTTPBearer(auto_error=False, description="The run key (researcher routes) or the admin token (/v1/runs).")


def status_for(reply: ToolReply) -> int:
    """The HTTP status of a reply: 200 if it is ok, else its error code's (:data:`STATUS`, default 400)."""
    return 200 if reply.ok else STATUS.get(reply.error or "", 400)


def _reply(reply: ToolReply) -> Response:
    headers = {"WWW-Authenticate": 'Bearer realm="rsigym"'} if reply.error == "unauthorized" else None
    return Response(reply.model_dump_json(), status_code=status_for(reply), media_type="application/json",
                    headers=headers)


def _error(code: str, message: str, status: int | None = None) -> JSONResponse:
    status = status or STATUS.get(code, 400)
    headers = {"WWW-Authenticate": 'Bearer realm="rsigym"'} if status == 401 else None
    return JSONResponse({"ok": False, "error": code, "message": message}, status_code=status, headers=headers)


def parse_args(raw: bytes) -> tuple[Any, str | None]:
    """A request body as tool arguments: empty is ``{}``; anything else must be JSON.

    >>> parse_args(b""), parse_args(b'{"k": 1}'), parse_args(b"[" * 100_000)[1][:34]
    (({}, None), ({'k': 1}, None), 'the request body is not valid JSON')
    """
    if not raw.strip():
        return {}, None
    try:
        return json.loads(raw), None
    except (ValueError, RecursionError) as exc:
        return None, f"the request body is not valid JSON ({type(exc).__name__}: {str(exc)[:200]})"


_TOOL_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ToolReply, "description": text} for code, text in (
        (200, "The call ran."), (400, "Refused (see `error`)."), (401, "No or wrong run key."),
        (402, "insufficient_budget: the worst case does not fit."), (403, "The run's key does not allow it."),
        (404, "unknown_tool"), (409, "episode_over"), (410, "The run is closed or interrupted."),
        (422, "invalid_args / malformed_action"), (429, "Too many calls at once on this run."))}


def create_app(service: SessionService, *, mounts: Mapping[str, Any] | None = None,
               extra_routes: Sequence[BaseRoute] = (),
               lifespan: Callable[[FastAPI], Any] | None = None,
               max_body_bytes: int = MAX_BODY_BYTES, worker_threads: int = WORKER_THREADS) -> FastAPI:
    """The REST app of ``service`` (see the module docstring).

    Args:
        mounts: path → ASGI app mounted into this app (e.g. ``{"/mcp": mcp_app}``).
        extra_routes: Starlette routes added as they are.
        lifespan: an async context manager factory ``(app) -> ...`` run inside this app's own
            lifespan (a mounted app's lifespan is not run by Starlette otherwise).
        max_body_bytes: larger request bodies get 413 (before they are read, when they say their size).
        worker_threads: threads that run calls; each call blocks one while it runs.
    """
    limiter = anyio.CapacityLimiter(worker_threads)

    @asynccontextmanager
    async def app_lifespan(app: FastAPI) -> AsyncIterator[None]:
        if lifespan is None:
            yield
        else:
            async with lifespan(app):
                yield

    def error_body(status: int, message: str) -> Response:
        return _error("payload_too_large" if status == 413 else "bad_request", message, status)

    app = FastAPI(title="RSIGym session service", version="1", lifespan=app_lifespan,
                  description=__doc__.split("\n\n")[0] if __doc__ else None,
                  middleware=[Middleware(BodyLimitMiddleware, max_bytes=max_body_bytes, error=error_body)])

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return _error(exc.code, exc.message, exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(map(str, e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors())
        return _error("invalid_args", problems[:2000], 422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "bad_request")
        return _error(code, f"{request.method} {request.url.path}: {exc.detail}", exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return _error("internal_error", f"{type(exc).__name__} (the service keeps running)", 500)

    def run_id_of(request: Request) -> str | None:
        return service.run_for_key(bearer_token(request.headers.get("authorization")))

    def require_run(request: Request) -> str:
        run_id = run_id_of(request)
        if run_id is None:
            raise GatewayError("unauthorized", "a valid run key is required: Authorization: Bearer $RSIGYM_RUN_KEY", 401)
        return run_id

    def require_admin(request: Request) -> None:
        if not service.check_admin(bearer_token(request.headers.get("authorization"))):
            raise GatewayError("unauthorized", "the admin token is required: Authorization: Bearer <admin token>", 401)

    async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)

    async def tool_call(name: str, request: Request) -> Response:
        run_id = run_id_of(request)
        if run_id is None:
            return _reply(refusal(name, "unauthorized", "a valid run key is required: "
                                                        "Authorization: Bearer $RSIGYM_RUN_KEY"))
        args, problem = parse_args(await request.body())
        if problem is not None:
            return _reply(await in_thread(service.refusal, run_id, name, "malformed_action", problem))
        return _reply(await in_thread(service.call, run_id, name, args))

    auth = [Depends(_BEARER)]  # documents the bearer scheme in OpenAPI; checking is done per route

    for cls in TOOLS:
        def make(name: str) -> Callable[[Request], Any]:
            async def endpoint(request: Request) -> Response:
                return await tool_call(name, request)
            endpoint.__name__ = f"tool_{name}"
            return endpoint

        doc = " ".join((cls.__doc__ or "").split())
        app.add_api_route(
            f"/v1/tools/{cls.name}", make(cls.name), methods=["POST"], summary=doc.split(". ")[0],
            description=doc, tags=["tools"], dependencies=auth, responses=_TOOL_RESPONSES,
            response_class=Response, operation_id=f"tool_{cls.name}",
            openapi_extra={"requestBody": {"required": False, "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{cls.__name__}"}}}}})

    @app.post("/v1/tools/{name}", include_in_schema=False)
    async def unknown_tool(request: Request, name: str) -> Response:
        return await tool_call(name, request)  # the run refuses it as unknown_tool (audited, like in-process)

    @app.get("/v1/balance", tags=["run"], dependencies=auth)
    async def balance(request: Request) -> dict[str, float]:
        """The run's money: budget, spent, reserved for running jobs, remaining."""
        return await in_thread(service.balance, require_run(request))

    @app.get("/v1/jobs", tags=["run"], dependencies=auth)
    async def jobs(request: Request) -> dict[str, Any]:
        """Every job of the run: running ones with elapsed and expected seconds, then finished ones."""
        return {"jobs": await in_thread(service.jobs, require_run(request))}

    @app.get("/v1/jobs/{job_id}", tags=["run"], dependencies=auth)
    async def job(request: Request, job_id: str = PathParam(max_length=64)) -> dict[str, Any]:
        """One job of the run, with its result once finished."""
        found = await in_thread(service.job, require_run(request), job_id)
        if found is None:
            raise GatewayError("unknown_job", f"this run has no job {job_id!r} (GET /v1/jobs lists them)", 404)
        return found

    @app.get("/v1/observation", tags=["run"], dependencies=auth)
    async def observation(request: Request) -> dict[str, Any]:
        """The last observation: log, budget and time left, step, dev scores, running jobs, action mask."""
        return await in_thread(service.observation, require_run(request))

    @app.get("/v1/run", tags=["run"], dependencies=auth)
    async def run_info(request: Request) -> dict[str, Any]:
        """This run: id, scenario, state, steps, balance, the tools its key allows."""
        run_id = require_run(request)
        summary = await in_thread(service.researcher_summary, run_id)  # no seed, no host path, no secret
        return {**summary, "tools": service.tools(run_id)}

    @app.get("/v1/tools", tags=["run"], dependencies=auth)
    async def tools(request: Request) -> dict[str, Any]:
        """Function-calling schemas of the tools this run's key allows."""
        return {"tools": tool_schemas(service.tools(require_run(request)))}

    @app.get("/v1/audit", tags=["records"], dependencies=auth)
    async def audit(request: Request) -> dict[str, Any]:
        """The run's audit log and its chain check, once the episode is over (409 before)."""
        return await in_thread(service.audit, require_run(request))

    @app.get("/v1/ledger", tags=["records"], dependencies=auth)
    async def ledger(request: Request) -> dict[str, Any]:
        """The run's ledger accounts and open reservations, once the episode is over (409 before)."""
        return await in_thread(service.ledger, require_run(request))

    @app.get("/v1/ledger.sqlite", tags=["records"], dependencies=auth, response_class=Response)
    async def ledger_file(request: Request) -> Response:
        """A copy of the run's ledger database (books and audit log), once the episode is over (409 before)."""
        data = await in_thread(service.ledger_snapshot, require_run(request))
        return Response(data, media_type="application/vnd.sqlite3",
                        headers={"Content-Disposition": 'attachment; filename="ledger.sqlite"'})

    @app.get("/v1/trajectory", tags=["records"], dependencies=auth)
    async def trajectory(request: Request) -> dict[str, Any]:
        """The run's episode as an ATIF trajectory, once the episode is over (409 before)."""
        return await in_thread(service.trajectory, require_run(request))

    @app.post("/v1/runs", tags=["admin"], dependencies=auth, status_code=201,
              openapi_extra={"requestBody": {"required": False, "content": {
                  "application/json": {"schema": {"$ref": "#/components/schemas/RunRequest"}}}}})
    async def create_run(request: Request) -> dict[str, Any]:
        """Create a run (admin). The reply's `run_key` is shown only here."""
        require_admin(request)  # before the body is even parsed
        args, problem = parse_args(await request.body())
        if problem is not None:
            raise GatewayError("invalid_args", problem, 422)
        try:
            body = RunRequest.model_validate(args)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(body)'}: {e['msg']}"
                                 for e in exc.errors(include_url=False))
            raise GatewayError("invalid_args", problems[:2000], 422) from None
        return await in_thread(service.create_run, body)

    @app.get("/v1/runs", tags=["admin"], dependencies=auth)
    async def list_runs(request: Request) -> dict[str, Any]:
        """Every run, with its state (admin)."""
        require_admin(request)
        return {"runs": await in_thread(service.list_runs)}

    @app.get("/v1/runs/{run_id}", tags=["admin"], dependencies=auth)
    async def get_run(request: Request, run_id: str = PathParam(max_length=64)) -> dict[str, Any]:
        require_admin(request)
        return await in_thread(service.run_summary, run_id)

    @app.delete("/v1/runs/{run_id}", tags=["admin"], dependencies=auth)
    async def delete_run(request: Request, run_id: str = PathParam(max_length=64)) -> dict[str, Any]:
        """Close a run (admin): its running jobs are settled, its record kept."""
        require_admin(request)
        return await in_thread(service.close_run, run_id, "deleted")

    @app.get("/health", include_in_schema=False)
    async def health() -> dict[str, Any]:
        return {"ok": True}

    for path, sub in (mounts or {}).items():
        app.mount(path, sub)
    app.router.routes.extend(extra_routes)

    base_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = base_openapi()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for cls in (*TOOLS, RunRequest):
                components[cls.__name__] = cls.model_json_schema(ref_template="#/components/schemas/{model}")
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
