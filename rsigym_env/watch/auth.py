"""Who may see what on the dashboard: one rule, applied to every route of the watch app.

* **The admin token** sees everything: every run, sweep, step, file and stream, seeds and paths
  included. Under ``rsigym watch`` it is the dashboard's own token (``$RSIGYM_HOME/watch-token`` or
  ``--token-file``); under ``rsigym serve --watch`` the service's admin token.
* **A run key** of the session service (``rsigym serve --watch`` only) sees its own run and nothing
  else: its page, JSON, live stream, steps, harness diffs and trajectory, and a runs list holding its
  row alone. Another run is "not found" (404), a sweep is refused (403). What it sees is
  **redacted**: no seed, episode seed, split id or secret, key hash or writing process, and no host
  path (the run directory, the state directory, ``$RSIGYM_HOME``, any absolute path) — in pages,
  JSON and streams alike. With the seed a sim run could be replayed offline and any candidate's
  held-out score known before it is submitted; the researcher's agent runs on this machine, so
  "loopback only" protects nothing by itself.
* **No key or a wrong one**: 401 with a message, nothing else.

Static assets (``/static/...``: css, js, plotly) and ``/health`` are public; they hold no run data.

A token is accepted as ``Authorization: Bearer <token>``, or once as ``?token=<token>`` in a URL a
browser opens: that sets an HttpOnly, ``SameSite=Strict`` cookie scoped to the dashboard's path and
redirects to the same URL without the token (as Jupyter does); the pages' own requests (``fetch``,
``EventSource``) then carry the cookie. Tokens are compared in constant time (their sha256 digests,
:func:`~.tokens.matches`).

>>> auth = WatchAuth("rsw_example-token-0123456789")
>>> auth.viewer("rsw_example-token-0123456789").admin, auth.viewer("rsw_wrong-token-0123456789"), auth.viewer(None)
(True, None, None)
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, MutableMapping
from urllib.parse import quote, unquote, urlencode

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from .redact import REDACTED_KEYS, Redactor, host_paths, run_seeds, split_secrets  # noqa: F401
from .tokens import MIN_TOKEN_CHARS, bearer_token, matches, secret_hash

VIEWER_SCOPE = "rsigym.viewer"
"""The ASGI scope entry holding the request's :class:`Viewer` (set by :class:`WatchAuthMiddleware`)."""
COOKIE_PREFIX = "rsigym-watch"
MAX_TOKEN_CHARS = 4096
CSP = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def is_public(path: str) -> bool:
    """Routes that hold no run data and need no token: static assets and the health check.

    >>> is_public("/static/watch.js"), is_public("/health"), is_public("/api/runs"), is_public("/static/../api")
    (True, True, False, False)
    """
    return path == "/health" or (path.startswith("/static/") and "/.." not in path and "\\" not in path)


# ------------------------------------------------------------------------------------ viewers


@dataclass(frozen=True)
class Viewer:
    """Who a request is: the admin, or the holder of one run's key (``run_id``, its directory)."""

    admin: bool
    run_id: str | None = None
    run_dir: Path | None = None

    def may_see(self, entry: Any) -> bool:
        """May this viewer see the catalog entry ``entry`` (a run, a sweep, a live service run)?"""
        if self.admin:
            return True
        if entry is None or self.run_id is None or entry.key != self.run_id:
            return False
        if entry.kind == "live":
            return entry.path is None
        if entry.kind != "run" or entry.path is None or self.run_dir is None:
            return False
        return os.path.realpath(entry.path) == os.path.realpath(self.run_dir)


ADMIN = Viewer(admin=True)


class WatchAuth:
    """The dashboard's credentials: the admin token (its sha256 only) and, under a session service,
    its run keys (``run_for_key(key) -> run id | None``, the run's directory ``runs_dir/<id>``).

    Args:
        admin_token: the token that sees everything (at least 16 characters); or give ``check_admin``.
        check_admin: ``token -> bool`` (constant time), e.g. ``SessionService.check_admin``.
        run_for_key: ``key -> run id or None``, e.g. ``SessionService.run_for_key``.
        runs_dir: where the service keeps run directories (``<runs_dir>/<run id>``).
        hint: how to get the token, said in every 401 (no paths: it is shown to anyone).
    """

    def __init__(self, admin_token: str | None = None, *, check_admin: Callable[[str | None], bool] | None = None,
                 run_for_key: Callable[[str | None], str | None] | None = None,
                 runs_dir: str | os.PathLike[str] | None = None, hint: str | None = None):
        if check_admin is None:
            if not isinstance(admin_token, str) or len(admin_token) < MIN_TOKEN_CHARS:
                raise ValueError(f"the dashboard's admin token must be a string of at least {MIN_TOKEN_CHARS} characters")
            stored = secret_hash(admin_token)
            check_admin = lambda token: matches(token, stored)  # noqa: E731
        self.check_admin = check_admin
        self.run_for_key = run_for_key
        self.runs_dir = Path(runs_dir) if runs_dir is not None else None
        self.private_paths: list[Path] = [self.runs_dir] if self.runs_dir is not None else []
        """Host paths never shown to a run key (the app adds its roots, ``$RSIGYM_HOME`` and more)."""
        self.hint = hint or ("open the URL `rsigym watch` printed (it ends in ?token=...), or send "
                             "Authorization: Bearer <token>")

    @classmethod
    def for_service(cls, service: Any) -> "WatchAuth":
        """The rule of ``rsigym serve --watch``: the service's admin token sees all, a run key its own run."""
        auth = cls(check_admin=service.check_admin, run_for_key=service.run_for_key, runs_dir=service.runs_dir,
                   hint="open /watch/?token=<the service's admin token> (or a run key: that run only), or send "
                        "Authorization: Bearer <token>")
        auth.private_paths.append(Path(service.state_dir))
        return auth

    def viewer(self, token: str | None) -> Viewer | None:
        """The viewer ``token`` makes, or ``None`` (no token, a wrong one)."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            return None
        if self.check_admin(token):
            return ADMIN
        if self.run_for_key is not None:
            run_id = self.run_for_key(token)
            if run_id is not None:
                return Viewer(admin=False, run_id=run_id,
                              run_dir=self.runs_dir / run_id if self.runs_dir is not None else None)
        return None


# ------------------------------------------------------------------------------------ the middleware


def route_path(scope: MutableMapping[str, Any]) -> str:
    """The request's path inside the app (a mounted app's prefix, ``root_path``, taken off).

    >>> route_path({"path": "/watch/api/runs", "root_path": "/watch"}), route_path({"path": "/watch", "root_path": "/watch"})
    ('/api/runs', '/')
    """
    path, root = scope.get("path", "/"), (scope.get("root_path") or "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return path or "/"


def wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def cookie_name(request: Request) -> str:
    """The cookie of this dashboard: its port in the name (browsers share cookies across ports)."""
    port = request.url.port or (request.scope.get("server") or (None, None))[1] or 0
    return f"{COOKIE_PREFIX}-{port}"


def unauthorized(request: Request, message: str, hint: str) -> Response:
    """401, saying what is wrong and how to get in; nothing else."""
    headers = {"WWW-Authenticate": 'Bearer realm="rsigym watch"', "Cache-Control": "no-store"}
    if wants_html(request):
        body = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>401 · rsigym watch</title></head>'
                f"<body><h1>401 Unauthorized</h1><p>{html.escape(message)}</p><p>{html.escape(hint)}</p></body></html>")
        return HTMLResponse(body, status_code=401, headers={**headers, "Content-Security-Policy": CSP})
    return JSONResponse({"ok": False, "error": "unauthorized", "message": f"{message}; {hint}"}, status_code=401,
                        headers=headers)


class WatchAuthMiddleware:
    """Authenticates every request of the watch app (ASGI) and, for a run key, scrubs what goes out.

    Public routes (:func:`is_public`) pass; any other request needs a token (see the module docstring)
    and gets its :class:`Viewer` in ``scope["rsigym.viewer"]``; the routes decide what that viewer may
    see. A run key's responses also pass :meth:`Redactor.bytes` (host paths, secrets, its seeds).
    """

    def __init__(self, app: Any, auth: WatchAuth, redactor: Redactor):
        self.app, self.auth, self.redactor = app, auth, redactor

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # the dashboard has no websockets
            await send({"type": "websocket.close", "code": 1008})
            return
        path = route_path(scope)
        if is_public(path):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        query_token = request.query_params.get("token")
        if query_token is not None:
            token, source = query_token, "query"
        elif request.headers.get("authorization"):
            token, source = bearer_token(request.headers.get("authorization")), "header"
        else:
            cookie = request.cookies.get(cookie_name(request))
            token, source = (unquote(cookie) if cookie else None), "cookie"
        viewer = self.auth.viewer(token)
        if viewer is None:
            message = ("no token" if not token else
                       "a wrong token" + (" (the cookie of an earlier token?)" if source == "cookie" else ""))
            await unauthorized(request, f"this dashboard needs its token, and the request has {message}",
                               self.auth.hint)(scope, receive, send)
            return
        if source == "query" and request.method == "GET" and wants_html(request):
            await self._set_cookie(request, token)(scope, receive, send)  # type: ignore[arg-type]
            return
        scope[VIEWER_SCOPE] = viewer
        if viewer.admin:
            await self.app(scope, receive, send)
            return
        redactor = self.redactor.with_numbers(run_seeds(viewer.run_dir))

        async def scrubbed(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [(k, v) for k, v in message.get("headers") or []
                                                  if bytes(k).lower() != b"content-length"]}
            elif message["type"] == "http.response.body" and message.get("body"):
                message = {**message, "body": redactor.bytes(bytes(message["body"]))}
            await send(message)

        await self.app(scope, receive, scrubbed)

    def _set_cookie(self, request: Request, token: str) -> Response:
        """303 to the same URL without ``token``, setting the dashboard's cookie (HttpOnly, SameSite=Strict)."""
        url = URL(scope=request.scope)
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = (url.path or "/") + (f"?{urlencode(query)}" if query else "")
        reply = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
        root = (request.scope.get("root_path") or "").rstrip("/") or "/"
        reply.set_cookie(cookie_name(request), quote(token, safe=""), path=root, httponly=True, samesite="strict",
                         secure=request.url.scheme == "https")
        return reply


def viewer_of(request: Request) -> Viewer:
    """The request's viewer (set by :class:`WatchAuthMiddleware`; a request without one sees nothing)."""
    viewer = request.scope.get(VIEWER_SCOPE)
    if not isinstance(viewer, Viewer):
        raise PermissionError("no viewer: the watch app serves run data only behind WatchAuthMiddleware")
    return viewer


__all__ = ["ADMIN", "REDACTED_KEYS", "Redactor", "Viewer", "WatchAuth", "WatchAuthMiddleware", "host_paths",
           "is_public", "run_seeds", "split_secrets", "viewer_of"]
