"""A local E2B: the control plane the unchanged ``e2b`` SDK calls, and the sandbox router it then talks to.

The SDK (e2b 2.63, not in debug mode) creates a sandbox with ``POST {E2B_API_URL}/v2/sandboxes`` and then
talks to its envd at ``get_sandbox_url()``: ``https://49983-{id}.{domain}`` — or, when ``E2B_SANDBOX_URL`` is
set, that one URL for every sandbox, each request carrying ``E2b-Sandbox-Id``, ``E2b-Sandbox-Port`` and the
sandbox's ``X-Access-Token`` headers (as to E2B's own ``sandbox.{domain}`` proxy). The per-sandbox host names
cannot reach loopback without the SDK changing (they are always ``https://``, on port 443, under a DNS name
per sandbox), so this counterpart is that single proxy: ``E2B_API_URL`` → :attr:`E2BCounterpart.api_url`,
``E2B_SANDBOX_URL`` → :attr:`E2BCounterpart.sandbox_url`, and nothing else differs.

Control plane (``X-API-KEY`` checked; bodies validated with the SDK's own ``e2b.api.client.models``; errors are
E2B's ``{"code", "message"}``):

* ``POST /v2/sandboxes`` (``NewSandboxV2``) → 201 ``Sandbox``: a bubblewrap sandbox (``/app`` and a writable
  ``/data``, the template's limits, internet only when ``allow_internet_access``) served by its own
  :class:`~rsigym_env.worlds.local.sandbox.envd.EnvdServer` app, with a fresh envd access token; it is killed
  when its ``timeout`` passes, as on E2B;
* ``GET /v2/sandboxes`` → ``ListedSandbox`` list (running ones; ``metadata`` filter); ``GET /sandboxes/{id}``;
* ``POST /sandboxes/{id}/timeout`` (``SandboxTimeoutRequest``): a new end, counted from now;
* ``DELETE /sandboxes/{id}`` → 204 (404 once gone);
* anything else (pause, resume, snapshots, fork, templates, volumes, network updates, metrics, logs): 400/404
  naming it (``e2b`` raises its typed exception with that message).

The router dispatches each envd request (Connect-RPC processes and file system, ``/files``) to the named sandbox's
envd in process, after checking its access token; an unknown or killed sandbox is a 502 (what E2B's proxy answers
for a sandbox that is gone), a wrong token 401.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..serving.asgi import ThreadedASGIServer

log = logging.getLogger("rsigym_env.counterparts.e2b")

ENVD_VERSION = "99.99.99"   # what e2b's debug mode assumes of the local envd (e2b.envd.versions.ENVD_DEBUG_FALLBACK)
DEFAULT_TEMPLATE = "base"   # e2b.Sandbox.default_template


@dataclass(frozen=True)
class Template:
    """A template this counterpart serves: its size (E2B templates have one) and the limits of its commands."""

    cpu_count: int = 2
    memory_mb: int = 2048
    disk_mb: int = 1024
    processes: int = 256


@dataclass
class _Box:
    id: str
    template: str
    token: str
    server: Any
    group: Any
    dir: Path
    started: dt.datetime
    end: float                          # time.time() when E2B would kill it
    metadata: dict[str, str] = field(default_factory=dict)
    network: bool = False


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def new_api_key() -> str:
    """A fresh E2B-shaped key (``e2b_`` + 40 random hex digits).

    >>> key = new_api_key(); key.startswith("e2b_"), len(key)
    (True, 44)
    """
    return "e2b_" + secrets.token_hex(20)


class E2BCounterpart:
    """E2B's control plane on ``api_url`` and its sandbox proxy on ``sandbox_url`` (see the module docstring).

    ``templates`` maps each served template name to its :class:`Template` (default: ``base``);
    ``max_sandboxes`` alive at once (more: 429, as E2B's concurrency limit); ``require_isolation``: refuse to
    start without bubblewrap (``False`` only for tests on machines without it).
    """

    def __init__(self, root: str | Path, *, api_key: str | None = None, host: str = "127.0.0.1",
                 templates: Mapping[str, Template] | None = None, max_sandboxes: int = 20,
                 require_isolation: bool = True, reap_interval_s: float = 1.0):
        from ..worlds.local.sandbox.isolation import INSTALL_HINT, IsolationUnavailable, bwrap_available

        if require_isolation and not bwrap_available():
            raise IsolationUnavailable(f"the E2B counterpart's sandboxes need bubblewrap. {INSTALL_HINT}")
        self.root = Path(root)
        self.api_key = api_key or new_api_key()
        self.templates = dict(templates or {DEFAULT_TEMPLATE: Template()})
        self.max_sandboxes, self.require_isolation = max_sandboxes, require_isolation
        self.client_id = "rsigym-counterpart"
        self._boxes: dict[str, _Box] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._reap_interval_s = reap_interval_s
        self._reaper: threading.Thread | None = None
        self._api = ThreadedASGIServer(self._control_app(), host=host, port=0, name="e2b-api")
        async def router(scope: dict, receive: Any, send: Any) -> None:  # a function: uvicorn sees ASGI 3
            await self._route(scope, receive, send)

        self._router = ThreadedASGIServer(router, host=host, port=0, name="e2b-sandboxes")

    # ---- lifecycle -----------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        """``E2B_API_URL``."""
        return self._api.url

    @property
    def sandbox_url(self) -> str:
        """``E2B_SANDBOX_URL``."""
        return self._router.url

    def start(self) -> "E2BCounterpart":
        self._api.start()
        self._router.start()
        self._reaper = threading.Thread(target=self._reap, name="e2b-reaper", daemon=True)
        self._reaper.start()
        return self

    def stop(self) -> None:
        """Kill every sandbox and stop serving (safe twice)."""
        self._stop.set()
        for box_id in list(self._boxes):
            self._kill(box_id)
        self._api.stop()
        self._router.stop()

    def __enter__(self) -> "E2BCounterpart":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _reap(self) -> None:
        while not self._stop.wait(self._reap_interval_s):
            now = time.time()
            for box in [b for b in list(self._boxes.values()) if b.end <= now]:
                log.info("sandbox %s reached its timeout: killed", box.id)
                self._kill(box.id)

    # ---- sandboxes -----------------------------------------------------------------------------

    def _create(self, template: str, timeout_s: int, network: bool, env: Mapping[str, str],
                metadata: Mapping[str, str]) -> _Box:
        from ..worlds.local.sandbox.envd import EnvdServer
        from ..worlds.local.sandbox.isolation import Limits, Mount, SandboxGroup

        spec = self.templates[template]
        box_id = f"i{next(self._ids):04d}{secrets.token_hex(6)}"
        directory = self.root / "sandboxes" / box_id
        group = SandboxGroup(directory, memory_mb=spec.memory_mb, processes=spec.processes, disk_mb=spec.disk_mb)
        try:
            server = EnvdServer(group.subdir("app"), network=network, limits=Limits(), env=dict(env),
                                mounts=[Mount(group.subdir("data"), "/data", writable=True)],
                                require_isolation=self.require_isolation, group=group)
        except BaseException:
            group.close()
            raise
        return _Box(box_id, template, secrets.token_urlsafe(24), server, group, directory,
                    dt.datetime.now(dt.timezone.utc), time.time() + timeout_s, dict(metadata), network)

    def _kill(self, box_id: str) -> bool:
        with self._lock:
            box = self._boxes.pop(box_id, None)
        if box is None:
            return False
        try:
            box.server.process.kill_all()
        finally:
            box.group.close()
            shutil.rmtree(box.dir, ignore_errors=True)
        return True

    def _listed(self, box: _Box) -> dict[str, Any]:
        from e2b.api.client.models import ListedSandbox, SandboxState

        spec = self.templates[box.template]
        return ListedSandbox(template_id=box.template, sandbox_id=box.id, client_id=self.client_id,
                             started_at=box.started,
                             end_at=dt.datetime.fromtimestamp(box.end, dt.timezone.utc),
                             cpu_count=spec.cpu_count, memory_mb=spec.memory_mb, disk_size_mb=spec.disk_mb,
                             state=SandboxState.RUNNING, envd_version=ENVD_VERSION, metadata=box.metadata).to_dict()

    # ---- the control plane ---------------------------------------------------------------------

    def _control_app(self) -> Starlette:
        async def guard(request: Request, handler: Any) -> Response:
            if request.headers.get("x-api-key") != self.api_key:
                return _error(401, "Invalid API key (X-API-KEY)")
            try:
                return await handler(request)
            except (KeyError, ValueError, TypeError) as exc:
                return _error(400, f"invalid request to {request.method} {request.url.path}: {exc}")

        def route(path: str, handler: Any, methods: list[str]) -> Route:
            async def endpoint(request: Request) -> Response:
                return await guard(request, handler)
            return Route(path, endpoint, methods=methods)

        async def unsupported(request: Request) -> Response:
            if request.headers.get("x-api-key") != self.api_key:
                return _error(401, "Invalid API key (X-API-KEY)")
            return _error(404, f"the E2B counterpart does not serve {request.method} {request.url.path} "
                               "(it serves create, list, get, set_timeout and kill)")

        return Starlette(routes=[
            route("/v2/sandboxes", self._post_sandbox, ["POST"]),
            route("/v2/sandboxes", self._list, ["GET"]),
            route("/sandboxes/{sandbox_id}", self._get, ["GET"]),
            route("/sandboxes/{sandbox_id}", self._delete, ["DELETE"]),
            route("/sandboxes/{sandbox_id}/timeout", self._timeout, ["POST"]),
            Route("/{path:path}", unsupported, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
        ])

    async def _post_sandbox(self, request: Request) -> Response:
        import anyio.to_thread
        from e2b.api.client.models import NewSandboxV2, Sandbox

        body = NewSandboxV2.from_dict(await request.json())
        if body.template_id not in self.templates:
            return _error(404, f"template '{body.template_id}' not found; templates served here: "
                               f"{', '.join(sorted(self.templates))} (the counterpart builds no templates)")
        for name in ("network", "mcp", "iam", "volume_mounts", "auto_resume"):
            value = getattr(body, name)
            if value and type(value).__name__ != "Unset":  # Unset, None and empty lists ask for nothing
                return _error(400, f"'{name}' is not supported by the E2B counterpart")
        if body.auto_pause is True:
            return _error(400, "'auto_pause' is not supported by the E2B counterpart (sandboxes are killed at their timeout)")
        timeout = body.timeout if isinstance(body.timeout, int) else 300
        if not 1 <= timeout <= 86_400:
            return _error(400, f"timeout must be between 1 and 86400 seconds, got {timeout}")
        with self._lock:
            if len(self._boxes) >= self.max_sandboxes:
                return _error(429, f"rate limit: at most {self.max_sandboxes} sandboxes may run at once")
        env = body.env_vars if isinstance(body.env_vars, dict) else {}
        metadata = body.metadata if isinstance(body.metadata, dict) else {}
        network = body.allow_internet_access is True
        box = await anyio.to_thread.run_sync(lambda: self._create(body.template_id, timeout, network,
                                                                   {str(k): str(v) for k, v in env.items()},
                                                                   {str(k): str(v) for k, v in metadata.items()}))
        with self._lock:
            self._boxes[box.id] = box
        reply = Sandbox(template_id=box.template, sandbox_id=box.id, client_id=self.client_id,
                        envd_version=ENVD_VERSION, envd_access_token=box.token, domain=None)
        return JSONResponse(reply.to_dict(), status_code=201)

    async def _list(self, request: Request) -> Response:
        wanted: dict[str, str] = {}
        query = request.query_params.get("metadata")
        if query:
            import urllib.parse

            wanted = dict(urllib.parse.parse_qsl(query))
        states = request.query_params.getlist("state")
        if states and "running" not in ",".join(states):
            return JSONResponse([])
        boxes = [b for b in list(self._boxes.values()) if all(b.metadata.get(k) == v for k, v in wanted.items())]
        return JSONResponse([self._listed(b) for b in boxes])

    def _box(self, request: Request) -> _Box | None:
        return self._boxes.get(request.path_params["sandbox_id"])

    async def _get(self, request: Request) -> Response:
        box = self._box(request)
        if box is None:
            return _error(404, f"sandbox '{request.path_params['sandbox_id']}' not found")
        detail = self._listed(box) | {"envdAccessToken": box.token, "allowInternetAccess": box.network}
        return JSONResponse(detail)

    async def _delete(self, request: Request) -> Response:
        import anyio.to_thread

        sandbox_id = request.path_params["sandbox_id"]
        if not await anyio.to_thread.run_sync(self._kill, sandbox_id):
            return _error(404, f"sandbox '{sandbox_id}' not found")
        return Response(status_code=204)

    async def _timeout(self, request: Request) -> Response:
        from e2b.api.client.models import SandboxTimeoutRequest

        body = SandboxTimeoutRequest.from_dict(await request.json())
        box = self._box(request)
        if box is None:
            return _error(404, f"sandbox '{request.path_params['sandbox_id']}' not found")
        if not 0 <= body.timeout <= 86_400:
            return _error(400, f"timeout must be between 0 and 86400 seconds, got {body.timeout}")
        box.end = time.time() + body.timeout
        return Response(status_code=204)

    # ---- the sandbox router --------------------------------------------------------------------

    async def _route(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            message = await receive()
            while message["type"] != "lifespan.shutdown":
                await send({"type": message["type"] + ".complete"})
                message = await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        box = self._boxes.get(headers.get("e2b-sandbox-id", ""))
        if box is None:
            reply = {"code": 502, "message": f"sandbox '{headers.get('e2b-sandbox-id', '')}' is not running (it "
                                            "was killed, timed out, or never existed)", "sandboxId":
                     headers.get("e2b-sandbox-id", "")}
            await _send_json(send, 502, reply)
            return
        if not secrets.compare_digest(headers.get("x-access-token", ""), box.token):
            await _send_json(send, 401, {"code": 401, "message": "invalid envd access token"})
            return
        await box.server.app(scope, receive, send)


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


__all__ = ["DEFAULT_TEMPLATE", "E2BCounterpart", "ENVD_VERSION", "Template", "new_api_key"]
