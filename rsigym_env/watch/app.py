"""The ``rsigym watch`` web app (Starlette): the runs list, a run's page, a sweep's page, live updates.

Pages are rendered on the server (Jinja2); one small script (``static/watch.js``) sorts and filters
the list, draws the charts with plotly.js (served from the ``plotly`` Python package, no build step,
nothing from the network) and keeps pages current through server-sent events:

* ``GET /`` — runs and sweeps; ``GET /events?gen=N`` streams the list rows changed after generation N.
* ``GET /runs/{key}`` — a run; ``GET /runs/{key}/events?after=N`` streams its new steps and sections;
  ``GET /runs/{key}/steps/{n}`` is step n's full observation text; ``GET /runs/{key}/diff?a=&b=``
  the harness diff between two versions; ``GET /runs/{key}/trajectory.json`` the ATIF export.
* ``GET /sweeps/{key}``, ``GET /sweeps/{key}/episodes/{i}``, ``GET /sweeps/{key}/files/{name}``.
* ``GET /archives`` — the archives of candidate researchers (:mod:`rsigym_env.archive`);
  ``GET /archives/{name}`` one archive's score by generation, tree and nodes;
  ``GET /archives/{name}/nodes/{node}`` a node's evaluations per split and its diff from its parent.
* ``GET /api/runs``, ``GET /api/runs/{key}``, ``GET /api/sweeps/{key}``, ``GET /api/archives``,
  ``GET /api/archives/{name}`` — the same as JSON.

Every route but ``/static/...`` and ``/health`` needs a token (:mod:`.auth`: the admin token sees
everything; under ``rsigym serve --watch`` a run key sees its own run, redacted; anything else is 401).
Each route says what it shows (``run``: the run ``{key}``; ``list``: the rows the viewer may see;
``admin``: sweeps and archives; ``public``), and the app refuses to build with a route that does not.

>>> import httpx, tempfile
>>> from rsigym_env.serving.asgi import ThreadedASGIServer
>>> with ThreadedASGIServer(create_app([tempfile.mkdtemp()], admin_token="rsw_example-token-0123"), name="watch") as server:
...     httpx.get(server.url + "/api/runs").status_code, httpx.get(server.url + "/api/runs",
...         headers={"Authorization": "Bearer rsw_example-token-0123"}).json()
(401, {'runs': [], 'sweeps': [], 'generation': 0})
"""

from __future__ import annotations

import html
import importlib.util
import json
import math
import os
import time
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

import anyio
import anyio.to_thread
import jinja2
import markupsafe
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .auth import CSP, Redactor, Viewer, WatchAuth, WatchAuthMiddleware, host_paths, run_seeds, split_secrets, \
    viewer_of, wants_html
from .catalog import Catalog, LiveSource
from .tokens import new_token
from .model import STALL_AFTER_S, signature
from .sweeps import FILES, load_sweep, sweep_view
from .views import run_view

HERE = Path(__file__).resolve().parent
POLL_S = 0.5
"""How often a live page's stream looks for changes."""
TIMELINE_MAX = 2000
"""A run page lists at most this many steps (the last ones); the JSON API has them all."""
ACCESS = ("public", "list", "run", "admin")
"""What a route shows: nothing of any run, the rows its viewer may see, the run ``{key}``, or sweeps (admin)."""


def plotly_js() -> Path | None:
    """``plotly.min.js`` as the ``plotly`` package ships it (``None`` if it is not installed)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "package_data" / "plotly.min.js"
    return path if path.is_file() else None


# ------------------------------------------------------------------------------------ formatting


def _money(value: Any) -> str:
    if value is None or isinstance(value, jinja2.Undefined):
        return "—"
    value = float(value)
    return f"${value:,.2f}" if abs(value) >= 0.995 or value == 0 else f"${value:,.4f}"


def _pct(value: Any) -> str:
    return "—" if value is None or isinstance(value, jinja2.Undefined) else f"{100 * float(value):.2f}%"


def _score(value: Any) -> str:
    return "—" if value is None or isinstance(value, jinja2.Undefined) else f"{float(value):.3f}"


def _gain(value: Any) -> str:
    return "—" if value is None or isinstance(value, jinja2.Undefined) else f"{float(value):+.4f}"


def _when(t: Any) -> str:
    if not isinstance(t, (int, float)) or not math.isfinite(t):
        return "—"
    return datetime.fromtimestamp(t, timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _hours(seconds: Any) -> str:
    return "—" if seconds is None or isinstance(seconds, jinja2.Undefined) else f"{float(seconds) / 3600:.2f} h"


def _tojson(value: Any) -> markupsafe.Markup:
    """JSON safe inside a ``<script type="application/json">`` element."""
    text = json.dumps(value, default=str, allow_nan=False) if _finite(value) else json.dumps(_nan_free(value), default=str)
    return markupsafe.Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, default=str, allow_nan=False)
        return True
    except ValueError:
        return False


def _nan_free(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _nan_free(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_free(v) for v in value]
    return value


_ORDER = {"running": 0, "stalled": 1, "failed": 2, "finished": 3}


def render_row(r: dict[str, Any], base: str = "") -> str:
    """One row of the runs list (the hot path of a list of thousands: plain Python, not a template).

    >>> render_row({"key": "r<1>", "status": "running", "status_note": "", "last_t": None, "kind": "run",
    ...             "scenario": "s", "world": "sim", "benchmark": "aime", "researcher": "me", "steps": 2,
    ...             "max_steps": 9, "spend_frac": 0.5, "spent_usd": 1.0, "budget_usd": 2.0, "best_dev": None,
    ...             "official": None, "gain": None})[:64]
    '<tr data-key="r&lt;1&gt;" data-status="running" data-scenario="s'
    """
    e = html.escape
    status, key = str(r["status"]), str(r["key"])
    note = f' <small class="muted">{e(str(r["status_note"]))}</small>' if r.get("status_note") else ""
    last_t = r.get("last_t")
    ago = f'<br><small class="muted" data-ago="{last_t}">{_when(last_t)}</small>' if last_t else ""
    service = ' <small class="muted">(service)</small>' if r.get("kind") == "live" else ""
    world, bench = r.get("world") or "", r.get("benchmark") or ""
    frac, spent, gain = r.get("spend_frac"), r.get("spent_usd"), r.get("gain")
    if spent is not None:
        width = min(100.0 * (frac or 0.0), 100.0)
        spend = (f'<span class="bar" title="{100 * (frac or 0):.1f}% of the budget"><i style="width: {width:.1f}%"></i>'
                 f'</span>{_money(spent)}' + (f' <small class="muted">of {_money(r["budget_usd"])}</small>'
                                              if r.get("budget_usd") else ""))
    else:
        spend = "—"
    steps = f'{r["steps"]}' + (f'<small class="muted">/{r["max_steps"]}</small>' if r.get("max_steps") else "")
    trend = " up" if gain is not None and gain > 0 else " down" if gain is not None and gain < 0 else ""
    num = lambda v, none: none if v is None else v  # noqa: E731
    return (
        f'<tr data-key="{e(key)}" data-status="{e(status)}" data-scenario="{e(str(r["scenario"]))}" '
        f'data-researcher="{e(str(r["researcher"]))}" data-world="{e(world)}" class="st-{e(status)}">\n'
        f'  <td data-v="{_ORDER.get(status, 9)}"><span class="badge {e(status)}">{e(status)}</span>{note}{ago}</td>\n'
        f'  <td data-v="{e(key)}"><a href="{e(base)}/runs/{urllib.parse.quote(key, safe="")}">{e(key)}</a>{service}</td>\n'
        f'  <td data-v="{e(str(r["scenario"]))}">{e(str(r["scenario"]))}</td>\n'
        f'  <td data-v="{e(world)}">{e(world) or "—"}</td>\n'
        f'  <td data-v="{e(bench)}">{e(bench) or "—"}</td>\n'
        f'  <td data-v="{e(str(r["researcher"]))}">{e(str(r["researcher"]))}</td>\n'
        f'  <td class="num" data-v="{r["steps"]}">{steps}</td>\n'
        f'  <td class="num" data-v="{num(frac, -1)}">{spend}</td>\n'
        f'  <td class="num" data-v="{num(r.get("best_dev"), -1)}">{_score(r.get("best_dev"))}</td>\n'
        f'  <td class="num" data-v="{num(r.get("official"), -1)}">{_pct(r.get("official"))}</td>\n'
        f'  <td class="num{trend}" data-v="{num(gain, -9)}">{_gain(gain)}</td>\n'
        "</tr>\n")


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=jinja2.select_autoescape(default=True), trim_blocks=True, lstrip_blocks=True)
    env.filters.update(money=_money, pct=_pct, score=_score, gain=_gain, when=_when, hours=_hours, tojson=_tojson)
    return env


# ------------------------------------------------------------------------------------ the app


def create_app(roots: Iterable[str | os.PathLike[str]] = ("runs",), *, stall_after_s: float = STALL_AFTER_S,
               live: LiveSource | None = None, catalog: Catalog | None = None, poll_s: float = POLL_S,
               title: str = "rsigym watch", admin_token: str | None = None, auth: WatchAuth | None = None,
               private_paths: Iterable[str | os.PathLike[str]] = (),
               archives: str | os.PathLike[str] | None = None) -> Starlette:
    """The watch app over ``roots`` (run directories, sweep directories or folders of them).

    Args:
        stall_after_s: a running run with no step for this long is shown as stalled.
        live: runs of a session service (:class:`~.catalog.ServiceSource`, :class:`~.catalog.URLSource`).
        catalog: use this catalog instead of making one from ``roots``.
        poll_s: how often live pages look for changes.
        admin_token: the token that sees everything (default: a new random one, ``app.state.admin_token``).
        auth: who may see what (:class:`~.auth.WatchAuth`; e.g. ``WatchAuth.for_service(service)``);
            default: ``admin_token`` alone.
        private_paths: more host paths never shown to a run key (besides the roots, ``$RSIGYM_HOME``,
            the home and working directories).
        archives: the folder of archives the lineage pages show (default ``$RSIGYM_HOME/archives``,
            read at each request); they are the admin's alone, as sweeps are.
    """
    catalog = catalog or Catalog(list(roots), stall_after_s=stall_after_s, live=live)
    if auth is None:
        admin_token = admin_token or new_token("rsw_")
        auth = WatchAuth(admin_token)
    hidden = [*catalog.roots, *private_paths, *getattr(auth, "private_paths", ())]
    redactor = Redactor(host_paths(hidden), split_secrets())
    env = templates()
    plotly = plotly_js()
    state: dict[str, Any] = {"stop": False}

    def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        html = env.get_template(name).render(base=base, title=title, plotly=plotly is not None, now=time.time(),
                                             stall_after_s=catalog.stall_after_s, **context)
        return HTMLResponse(html, status_code=status_code, headers={"Content-Security-Policy": CSP})

    def not_found(request: Request, what: str) -> HTMLResponse:
        return page(request, "missing.html", 404, what=what)

    rendered: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}

    def row_html(row: dict[str, Any], base: str, viewer: Viewer) -> str:
        """A list row's HTML, rendered again only when the catalog has a new row object for it."""
        if not viewer.admin:
            return render_row(row, base)  # a redacted copy: not cached
        cached = rendered.get((row["key"], base))
        if cached is not None and cached[0] is row:
            return cached[1]
        text = render_row(row, base)
        rendered[(row["key"], base)] = (row, text)
        if len(rendered) > 4 * max(1024, len(catalog.keys())):
            rendered.clear()
        return text

    async def thread(fn: Any, *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    # ---------------------------------------------------------------- who sees what

    def scrubber(viewer: Viewer) -> Redactor:
        """The redactor of a run key's views: host paths, secrets and its run's seeds."""
        return redactor.with_numbers(run_seeds(viewer.run_dir))

    def own_row(row: dict[str, Any], viewer: Viewer) -> dict[str, Any]:
        return scrubber(viewer).data({k: v for k, v in row.items() if k != "path"})

    def visible_rows(viewer: Viewer, since: int | None = None) -> list[dict[str, Any]]:
        """The list rows ``viewer`` may see (a run key: its own run's alone, redacted)."""
        rows = catalog.rows(since)
        if viewer.admin:
            return rows
        mine = [r for r in rows if r["key"] == viewer.run_id]
        if not mine or not viewer.may_see(catalog.entry(viewer.run_id or "")):
            return []
        return [own_row(r, viewer) for r in mine]

    def visible_keys(viewer: Viewer) -> set[str]:
        keys = catalog.keys()
        if viewer.admin:
            return keys
        return {k for k in keys if k == viewer.run_id and viewer.may_see(catalog.entry(k))}

    def refused(request: Request, status: int, what: str, message: str) -> Response:
        if wants_html(request):
            return page(request, "missing.html", status, what=what)
        return JSONResponse({"ok": False, "error": "not_found" if status == 404 else "forbidden", "message": message},
                            status_code=status)

    def access(kind: str, what: str = "sweep") -> Any:
        """The route's guard: ``run`` routes show the run ``{key}`` only to a viewer who may see it
        (another run is not found: 404), ``admin`` routes (a ``what``: sweeps, archives) only to the admin (403)."""
        assert kind in ACCESS

        def wrap(fn: Any) -> Any:
            async def endpoint(request: Request) -> Response:
                viewer = viewer_of(request) if kind != "public" else None
                if kind == "admin" and not viewer.admin:  # type: ignore[union-attr]
                    return refused(request, 403, f"{what} for this key (a run key opens its own run only)",
                                   f"{what}s need the dashboard's admin token (a run key opens its own run only)")
                if kind == "run" and not viewer.admin:  # type: ignore[union-attr]
                    key = request.path_params["key"]
                    if not viewer.may_see(await thread(catalog.entry, key)):  # type: ignore[union-attr]
                        return refused(request, 404, f"run {key!r} for this key",
                                       f"no run {key!r} for this key (a run key opens its own run only)")
                return await fn(request, viewer)

            endpoint.__name__ = fn.__name__
            endpoint.access = kind  # type: ignore[attr-defined]
            return endpoint
        return wrap

    # ---------------------------------------------------------------- the list

    def _index(base: str, viewer: Viewer) -> dict[str, Any]:
        rows = visible_rows(viewer)
        return {"rows_html": markupsafe.Markup("".join(row_html(r, base, viewer) for r in rows)), "n_rows": len(rows),
                "scenarios": sorted({str(r["scenario"]) for r in rows}),
                "researchers": sorted({str(r["researcher"]) for r in rows}),
                "sweeps": catalog.sweeps() if viewer.admin else [], "generation": catalog.generation}

    @access("list")
    async def index(request: Request, viewer: Viewer) -> Response:
        context = await thread(_index, request.scope.get("root_path", "").rstrip("/"), viewer)
        live_error = getattr(catalog.live, "error", None) if catalog.live is not None and viewer.admin else None
        roots = [str(r) for r in catalog.roots] if viewer.admin else []
        return page(request, "runs.html", roots=roots, live_error=live_error, admin=viewer.admin, **context)

    @access("list")
    async def api_runs(request: Request, viewer: Viewer) -> Response:
        rows = await thread(visible_rows, viewer)
        return JSONResponse({"runs": _nan_free(rows), "sweeps": await thread(catalog.sweeps) if viewer.admin else [],
                             "generation": catalog.generation})

    @access("list")
    async def list_events(request: Request, viewer: Viewer) -> Response:
        from sse_starlette import EventSourceResponse

        try:
            since = int(request.query_params.get("gen", "0"))
        except ValueError:
            since = 0
        base = request.scope.get("root_path", "").rstrip("/")

        async def stream() -> AsyncIterator[dict[str, Any]]:
            nonlocal since
            keys: set[str] | None = None
            while not state["stop"]:
                generation = await thread(catalog.refresh)
                if generation != since:
                    rows = await thread(visible_rows, viewer, since)
                    now_keys = await thread(visible_keys, viewer)
                    payload: dict[str, Any] = {"gen": generation,
                                               "rows": {r["key"]: row_html(r, base, viewer) for r in rows}}
                    if keys is not None and now_keys != keys or keys is None:
                        payload["keys"] = sorted(now_keys)
                    keys = now_keys
                    since = generation
                    yield {"event": "rows", "data": json.dumps(payload)}
                await anyio.sleep(poll_s)

        return EventSourceResponse(stream(), ping=15, send_timeout=30)

    # ---------------------------------------------------------------- a run

    def _view(key: str, viewer: Viewer) -> dict[str, Any] | None:
        entry = catalog.entry(key)
        if entry is None or entry.path is None or not viewer.may_see(entry):
            return None
        reader = catalog.reader(key)
        assert reader is not None
        view = run_view(entry.path, reader, catalog.stall_after_s, key=key, live=catalog.live_run(key))
        if viewer.admin:
            return view
        view = {k: v for k, v in view.items() if k != "path"}
        view["row"] = {k: v for k, v in view["row"].items() if k != "path"}
        return scrubber(viewer).data(view)

    def _parts(view: dict[str, Any], base: str, after: int) -> dict[str, Any]:
        steps = [s for s in view["steps"] if s["step"] > after]
        ctx = {"v": view, "base": base, "now": time.time()}
        return {
            "after": view["n_steps"], "status": view["row"]["status"],
            "rows": env.get_template("_steps.html").render(steps=steps[-TIMELINE_MAX:], **ctx),
            "sections": {name: env.get_template(f"_{name}.html").render(**ctx)
                         for name in ("header", "jobs", "datasets", "harness", "result")},
            "charts": _nan_free(view["charts"]),
        }

    def _live_run(key: str, viewer: Viewer) -> dict[str, Any] | None:
        run = catalog.live_run(key)
        return run if viewer.admin or run is None else scrubber(viewer).data(run)

    @access("run")
    async def run_page(request: Request, viewer: Viewer) -> Response:
        key = request.path_params["key"]
        entry = await thread(catalog.entry, key)
        if entry is not None and entry.kind == "live":
            return page(request, "live.html", key=key, run=await thread(_live_run, key, viewer))
        view = await thread(_view, key, viewer)
        if view is None:
            return not_found(request, f"run {key!r}")
        shown = view["steps"][-TIMELINE_MAX:]
        return page(request, "run.html", v=view, shown=shown, hidden=len(view["steps"]) - len(shown))

    @access("run")
    async def api_run(request: Request, viewer: Viewer) -> Response:
        view = await thread(_view, request.path_params["key"], viewer)
        if view is None:
            return JSONResponse({"error": "unknown_run"}, status_code=404)
        return JSONResponse(_nan_free({k: v for k, v in view.items() if k != "versions"}
                                      | {"versions": [{k: x for k, x in v.items() if k != "files"}
                                                      for v in view["versions"]]}))

    @access("run")
    async def run_events(request: Request, viewer: Viewer) -> Response:
        from sse_starlette import EventSourceResponse

        key = request.path_params["key"]
        entry = await thread(catalog.entry, key)
        if entry is None or entry.path is None:
            return JSONResponse({"error": "unknown_run"}, status_code=404)
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            after = 0
        base = request.scope.get("root_path", "").rstrip("/")
        path = entry.path

        async def stream() -> AsyncIterator[dict[str, Any]]:
            nonlocal after
            seen: Any = None
            while not state["stop"]:
                sig = await thread(signature, path)
                row = await thread(catalog.row, key)
                mark = (sig, (row or {}).get("status"), (row or {}).get("status_note"))
                if mark != seen:
                    view = await thread(_view, key, viewer)
                    if view is None:
                        return
                    if seen is not None or view["n_steps"] != after:
                        parts = await thread(_parts, view, base, after)
                        after = parts["after"]
                        yield {"event": "run", "data": json.dumps(parts, default=str)}
                    seen = mark
                await anyio.sleep(poll_s)

        return EventSourceResponse(stream(), ping=15, send_timeout=30)

    @access("run")
    async def observation(request: Request, viewer: Viewer) -> Response:
        key, n = request.path_params["key"], request.path_params["n"]
        reader = await thread(catalog.reader, key)
        if reader is None:
            return PlainTextResponse("no such run", status_code=404)
        st = await thread(reader.state)
        text = st.logs.get(n)
        if text is None:
            step = next((s for s in st.steps if s["step"] == n), None)
            if step is None:
                return PlainTextResponse(f"no step {n}", status_code=404)
            text = _rendered(step)
        return PlainTextResponse(text if viewer.admin else scrubber(viewer).text(text))

    @access("run")
    async def harness_diff(request: Request, viewer: Viewer) -> Response:
        reader = await thread(catalog.reader, request.path_params["key"])
        if reader is None:
            return PlainTextResponse("no such run", status_code=404)
        st = await thread(reader.state)
        a, b = request.query_params.get("a", ""), request.query_params.get("b", "")
        diff = st.harness_diff(a, b)
        if diff is not None and not viewer.admin:
            diff = scrubber(viewer).data(diff)
        html = env.get_template("_diff.html").render(diff=diff, a=a, b=b)
        return HTMLResponse(html, status_code=200 if diff is not None else 404)

    @access("run")
    async def trajectory(request: Request, viewer: Viewer) -> Response:
        entry = await thread(catalog.entry, request.path_params["key"])
        if entry is None or entry.path is None:
            return JSONResponse({"error": "unknown_run"}, status_code=404)
        try:
            from ..atif import export_atif

            t = await thread(export_atif, entry.path)
        except ImportError as exc:
            return JSONResponse({"error": "unavailable", "message": f"the ATIF export needs harbor: {exc}"}, 501)
        except (ValueError, OSError) as exc:
            message = str(exc) if viewer.admin else scrubber(viewer).text(str(exc))
            return JSONResponse({"error": "no_trajectory", "message": message}, status_code=404)
        data = t.to_json_dict()
        if not viewer.admin:
            data = scrubber(viewer).data(data)
        return Response(json.dumps(data, indent=1, ensure_ascii=False), media_type="application/json",
                        headers={"Content-Disposition": f'attachment; filename="{entry.key}.atif.json"'})

    # ---------------------------------------------------------------- sweeps (the admin's alone)

    def _sweep(key: str) -> tuple[Any, dict[str, Any]] | None:
        entry = catalog.entry(key)
        if entry is None or entry.kind != "sweep" or entry.path is None:
            return None
        data = load_sweep(entry.path)
        return entry, sweep_view(data)

    @access("admin")
    async def sweep_page(request: Request, viewer: Viewer) -> Response:
        found = await thread(_sweep, request.path_params["key"])
        if found is None:
            return not_found(request, f"sweep {request.path_params['key']!r}")
        entry, view = found
        files = {name: (entry.path / name).is_file() for name in FILES}
        runs = catalog.keys()
        return page(request, "sweep.html", s=view, key=entry.key, path=str(entry.path), files=files, runs=runs)

    @access("admin")
    async def episode_page(request: Request, viewer: Viewer) -> Response:
        found = await thread(_sweep, request.path_params["key"])
        i = request.path_params["i"]
        if found is None or not 0 <= i < len(found[1]["episodes"]):
            return not_found(request, f"episode {i} of sweep {request.path_params['key']!r}")
        entry, view = found
        data = await thread(load_sweep, entry.path)
        episode = data["episodes"][i]
        run_key = Path(str(episode.get("run_dir"))).name if episode.get("run_dir") else None
        return page(request, "episode.html", key=entry.key, i=i, e=episode, n=len(view["episodes"]),
                    run_key=run_key if run_key in catalog.keys() else None)

    @access("admin")
    async def api_sweep(request: Request, viewer: Viewer) -> Response:
        found = await thread(_sweep, request.path_params["key"])
        if found is None:
            return JSONResponse({"error": "unknown_sweep"}, status_code=404)
        return JSONResponse(_nan_free({k: v for k, v in found[1].items() if k != "aggregates"}))

    @access("admin")
    async def sweep_file(request: Request, viewer: Viewer) -> Response:
        entry = await thread(catalog.entry, request.path_params["key"])
        name = request.path_params["name"]
        if entry is None or entry.kind != "sweep" or entry.path is None or name not in FILES:
            return PlainTextResponse("not found", status_code=404)
        path = entry.path / name
        if not path.is_file():
            return PlainTextResponse("not found", status_code=404)
        return FileResponse(path)

    # ---------------------------------------------------------------- archives: lineage (the admin's alone)

    def _split(request: Request) -> str | None:
        from ..archive import check_split

        try:
            return check_split(request.query_params.get("split", "validation"))
        except ValueError:
            return None

    def _archives_root() -> Path:
        from .lineage import archives_root

        return archives_root(archives)

    @access("admin", "archive")
    async def archives_page(request: Request, viewer: Viewer) -> Response:
        from .lineage import archives_index

        split = _split(request) or "validation"
        rows = await thread(archives_index, _archives_root(), split)
        return page(request, "archives.html", archives=rows, root=str(_archives_root()), split=split)

    @access("admin", "archive")
    async def api_archives(request: Request, viewer: Viewer) -> Response:
        from .lineage import archives_index

        rows = await thread(archives_index, _archives_root(), _split(request) or "validation")
        return JSONResponse({"archives": _nan_free(rows), "root": str(_archives_root())})

    @access("admin", "archive")
    async def archive_page(request: Request, viewer: Viewer) -> Response:
        from .lineage import archive_view

        name, split = request.path_params["name"], _split(request)
        base = request.scope.get("root_path", "").rstrip("/")
        view = await thread(archive_view, _archives_root(), name, split, base) if split else None
        if view is None:
            return not_found(request, f"archive {name!r}" + ("" if split else " split"))
        return page(request, "archive.html", a=view)

    @access("admin", "archive")
    async def api_archive(request: Request, viewer: Viewer) -> Response:
        from .lineage import archive_view

        name, split = request.path_params["name"], _split(request)
        view = await thread(archive_view, _archives_root(), name, split) if split else None
        if view is None:
            return JSONResponse({"error": "unknown_archive" if split else "unknown_split"}, status_code=404)
        return JSONResponse(_nan_free({k: v for k, v in view.items() if k not in ("chart", "badges")}))

    @access("admin", "archive")
    async def archive_node_page(request: Request, viewer: Viewer) -> Response:
        from .lineage import node_view

        name, ref = request.path_params["name"], request.path_params["node"]
        view = await thread(node_view, _archives_root(), name, ref)
        if view is None:
            return not_found(request, f"node {ref!r} of archive {name!r}")
        return page(request, "archive_node.html", v=view)

    # ---------------------------------------------------------------- static (public: no run data)

    @access("public")
    async def plotly_file(request: Request, viewer: None) -> Response:
        if plotly is None:
            return PlainTextResponse("// plotly is not installed: pip install plotly", media_type="text/javascript",
                                     status_code=404)
        return FileResponse(plotly, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    @access("public")
    async def health(request: Request, viewer: None) -> Response:
        return JSONResponse({"ok": True})

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["stop"] = False
        yield
        state["stop"] = True

    routes = [
        Route("/", index), Route("/api/runs", api_runs), Route("/events", list_events),
        Route("/runs/{key}", run_page), Route("/api/runs/{key}", api_run), Route("/runs/{key}/events", run_events),
        Route("/runs/{key}/steps/{n:int}", observation), Route("/runs/{key}/diff", harness_diff),
        Route("/runs/{key}/trajectory.json", trajectory),
        Route("/sweeps/{key}", sweep_page), Route("/sweeps/{key}/episodes/{i:int}", episode_page),
        Route("/api/sweeps/{key}", api_sweep), Route("/sweeps/{key}/files/{name}", sweep_file),
        Route("/archives", archives_page), Route("/archives/{name}", archive_page),
        Route("/archives/{name}/nodes/{node}", archive_node_page), Route("/api/archives", api_archives),
        Route("/api/archives/{name}", api_archive),
        Route("/static/plotly.min.js", plotly_file), Route("/health", health),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    for route in routes:  # every route says what it shows; a new one without a guard is a bug, caught here
        if isinstance(route, Route):
            kind = getattr(route.endpoint, "access", None)
            assert kind in ACCESS, f"route {route.path} has no access rule"
            assert (kind == "public") == (route.path in ("/health", "/static/plotly.min.js")), route.path
            assert kind != "run" or "{key}" in route.path, route.path
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(WatchAuthMiddleware, auth=auth, redactor=redactor)])
    app.state.catalog = catalog
    app.state.auth = auth
    app.state.admin_token = admin_token
    return app


def _rendered(step: dict[str, Any]) -> str:
    """What an older record's step showed, where its text was not recorded."""
    if not step.get("ok"):
        text = f"ERROR {step.get('error')}: {step.get('message')}"
    else:
        text = json.dumps(step.get("result"), indent=1, default=str)
    events = [str(e.get("text", "")) for e in step.get("events") or [] if isinstance(e, dict)]
    return "\n".join([text, *events]) + "\n\n(older run: the observation text itself was not recorded)"


__all__ = ["create_app", "plotly_js", "templates"]
