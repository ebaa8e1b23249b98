"""Every route of every surface is authorized, and nothing a researcher reaches carries a seed or a host path.

The class attacked (issue 25, class 1): an unauthenticated or cross-run read of run data on any route.
With ``rsigym serve --watch`` a client holding no key used to get every run from ``/watch/api/runs``
with its ``seed`` and host paths, and other runs' steps, trajectories and event streams; with a sim
run's seed the run can be replayed offline and any candidate's exact held-out score known before it
is submitted. The researcher's agent runs on this machine, so "loopback only" protects nothing.

The apps are the real ones, served on loopback: the session service's app as ``rsigym serve --watch``
builds it (REST, ``/mcp``, ``/watch``), the standalone dashboard of ``rsigym watch`` over a runs
directory (a real ``rsigym run`` sim run, a sweep) and the service's state directory, and the OpenEnv
server. Two service runs with distinctive seeds play a few steps through the public API (one is
submitted, so its records routes answer). Then the apps' routes are **enumerated** (Starlette routes
and mounts, walked; path parameters filled with real run ids, step numbers, job ids and sweep keys,
so a new route is covered without touching this file — a parameter it cannot fill fails loudly) and
each is called with no key, a wrong key, another run's key, the run's own key and the admin token
(the positive control). Every body, event streams included (read for a bounded time), is searched
for the seeds, the state directory, ``$RSIGYM_HOME``, the run directories and the split's secret.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.testclient import TestClient

import rsigym_env  # noqa: F401
from rsigym_env.cli import main as rsigym_main
from rsigym_env.gateway.cli import serve_app
from rsigym_env.gateway.local_runs import LocalRunFactory
from rsigym_env.gateway.openenv_server import openenv_app
from rsigym_env.gateway.service import SessionService
from rsigym_env.report import write_report
from rsigym_env.serving.asgi import ThreadedASGIServer
from rsigym_env.serving.listen import BackgroundServer
from rsigym_env.sweep import make_grid, sweep
from rsigym_env.watch.app import create_app as watch_app

SEED_A, SEED_B, SEED_RUN, SEED_OPENENV = 918273645, 564738291, 372819465, 683920174
"""The two service runs', the ``rsigym run`` run's and an OpenEnv session's seeds: numbers no page shows by chance."""
SPLIT_SECRET = "route-test-split-secret-5f3a9c2e71d4"
ADMIN = "rsa_route-test-admin-token-6b1d0e42"
WATCH_TOKEN = "rsw_route-test-watch-token-93c4aa17"
WRONG = ("rsa_route-test-wrong-token-00000000", "rsr_0123456789abcdef_" + "A" * 43, "not-a-token")
SSE_S = 1.2
"""How long an event stream is read (its first event comes at once)."""

PUBLIC = {
    "serve": {"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/watch/health",
              "/watch/static/plotly.min.js", "/watch/static"},
    "watch": {"/health", "/static/plotly.min.js", "/static"},
}
"""Routes that answer without a key (templates; a mount counts for its files): none holds run data."""
ADMIN_ONLY_REST = ("/v1/runs",)


@dataclass
class World:
    serve: str
    watch: str
    serve_app: Any
    watch_app: Any
    openenv_app: Any
    runs: dict[str, dict[str, Any]]  # "A"/"B" -> {run_id, run_key}
    run_key: str  # the rsigym run directory's key in the standalone dashboard
    sweep_key: str
    versions: dict[str, tuple[str, str]]  # owner -> two harness versions (for /diff)
    texts: list[str] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    played: list[bytes] = field(default_factory=list)  # the replies of the steps played through REST

    def leaks(self, body: bytes, *, allow: tuple[int, ...] = ()) -> list[str]:
        """The secrets found in ``body``: seeds (standing alone), host paths, the split's secret and id."""
        text = body.decode("utf-8", "replace")
        found = [t for t in self.texts if t in text]
        found += [str(n) for n in self.numbers if n not in allow and re.search(rf"(?<![\d.]){n}(?!\d)", text)]
        return found


def _record_seeds(run_dir: Path) -> list[int]:
    first = json.loads((run_dir / "record.jsonl").read_text().splitlines()[0])
    return [first[k] for k in ("seed", "episode_seed") if isinstance(first.get(k), int)]


def _call(client: httpx.Client, method: str, url: str, token: str | None = None, *, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes, httpx.Headers]:
    """One request; an event stream is read for at most :data:`SSE_S` seconds."""
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    chunks: list[bytes] = []
    with client.stream(method, url, headers=h, content=body, timeout=30.0) as reply:  # the headers: 30 s (a loaded machine)
        streaming = reply.headers.get("content-type", "").startswith("text/event-stream")
        if streaming:  # a stream's body is read for SSE_S at most (httpcore reads this dict when the body starts)
            reply.request.extensions["timeout"]["read"] = SSE_S
        deadline = time.monotonic() + SSE_S
        try:
            for chunk in reply.iter_raw():
                chunks.append(chunk)
                if streaming and (time.monotonic() > deadline or _one_event(b"".join(chunks))):
                    break
        except httpx.ReadTimeout:
            assert streaming, f"{method} {url}: no answer within {SSE_S} s"
        return reply.status_code, b"".join(chunks), reply.headers


def _one_event(data: bytes) -> bool:
    """Has ``data`` (an event stream so far) a whole event with data?"""
    _, sep, rest = data.replace(b"\r\n", b"\n").partition(b"data:")
    return bool(sep) and b"\n\n" in rest


# ------------------------------------------------------------------------------------ the world


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("route-test-rsigym-home")
        mp.setenv("RSIGYM_HOME", str(home))
        mp.setenv("RSIGYM_SPLIT_SECRET", SPLIT_SECRET)
        state = tmp_path_factory.mktemp("route-test-state-dir") / "gateway"
        watched = tmp_path_factory.mktemp("route-test-watched")
        service = SessionService(state, admin_token=ADMIN, start_reaper=False)
        try:
            app = serve_app(service, watch=True, poll_s=0.1)
            with BackgroundServer(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
                runs: dict[str, dict[str, Any]] = {}
                played: list[bytes] = []
                for name, seed in (("A", SEED_A), ("B", SEED_B)):
                    reply = http.post("/v1/runs", json={"world": "sim", "benchmark": "aime", "budget_usd": 50,
                                                        "seed": seed, "label": f"route-test-{name}"},
                                      headers={"Authorization": f"Bearer {ADMIN}"})
                    assert reply.status_code == 201, reply.text
                    runs[name] = {k: reply.json()[k] for k in ("run_id", "run_key")}
                    key = {"Authorization": f"Bearer {runs[name]['run_key']}"}
                    for tool, args in (("evaluate", {"k": 1, "n_tasks": 5}), ("wait", {}),
                                       ("edit_harness", {"path": "prompt.md", "content": f"Think step by step ({name}).\n"}),
                                       ("read", {"ref": "job-1"}), ("read", {"ref": "scenario"}),
                                       ("read", {"ref": "/etc/passwd"}), ("evaluate", {"k": "two"})):
                        reply = http.post(f"/v1/tools/{tool}", json=args, headers=key)
                        assert reply.status_code in (200, 400, 422), reply.text
                        played.append(reply.content)
                done = http.post("/v1/tools/submit", json={}, headers={"Authorization": f"Bearer {runs['B']['run_key']}"})
                assert done.json()["done"] is True  # B is over: its records routes answer; A is still running
                played.append(done.content)

                assert rsigym_main(["run", "--benchmark", "aime", "--seed", str(SEED_RUN), "--run-dir",
                                    str(watched / "runs" / "cli-run"), "-q"]) == 0
                data = sweep(make_grid(["scripted"], ["aime"], [SEED_RUN]), local=True)
                data.save(watched / "sweep-route-test" / "results.json")
                write_report(data.to_dict(), watched / "sweep-route-test")
                standalone = watch_app([watched, state], admin_token=WATCH_TOKEN, poll_s=0.1)
                openenv = openenv_app(LocalRunFactory(world="sim", benchmark="aime", budget_usd=50,
                                                      run_dir=str(state.parent / "openenv-run")), max_sessions=4)
                with ThreadedASGIServer(standalone, name="route-test-watch", graceful_s=0.5) as w:
                    versions = {}
                    for name, run in runs.items():
                        view = httpx.get(f"{srv.url}/watch/api/runs/{run['run_id']}",
                                         headers={"Authorization": f"Bearer {ADMIN}"}).json()
                        names = [v["version"] for v in view["versions"]]
                        versions[name] = (names[0], names[-1])
                    view = httpx.get(f"{w.url}/api/runs/cli-run", headers={"Authorization": f"Bearer {WATCH_TOKEN}"}).json()
                    versions["run"] = (view["versions"][0]["version"], view["versions"][-1]["version"])
                    run_dirs = [state / "runs" / r["run_id"] for r in runs.values()] + [watched / "runs" / "cli-run"]
                    numbers = sorted({SEED_A, SEED_B, SEED_RUN, SEED_OPENENV,
                                      *(s for d in run_dirs for s in _record_seeds(d))})
                    paths = {str(p) for p in (state, state.parent, home, watched, *run_dirs)}
                    paths |= {str(Path(p).resolve()) for p in paths}
                    yield World(serve=srv.url, watch=w.url, serve_app=app, watch_app=standalone, openenv_app=openenv,
                                runs=runs, run_key="cli-run", sweep_key="sweep-route-test", versions=versions,
                                texts=sorted(paths | {SPLIT_SECRET, hashlib.sha256(SPLIT_SECRET.encode()).hexdigest()[:16]}),
                                numbers=numbers, played=played)
        finally:
            service.shutdown()


# ------------------------------------------------------------------------------------ the routes


def routes_of(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, set[str], Any]]:
    """``(path template, methods, the mounted app or None)`` of every route, mounts walked."""
    for route in routes:
        if isinstance(route, Mount):
            inner = getattr(route.app, "routes", None) if not isinstance(route.app, StaticFiles) else None
            if inner:
                yield from routes_of(list(inner), prefix + route.path)
            else:  # a leaf app (static files, MCP): called at its mount path
                yield prefix + route.path, {"GET", "POST"}, route.app
        elif isinstance(route, WebSocketRoute):
            yield prefix + route.path, {"WEBSOCKET"}, None
        elif isinstance(route, Route):
            yield prefix + route.path, set(route.methods or {"GET"}) - {"HEAD"}, None
        else:
            pytest.fail(f"a route of a kind this test does not know: {route!r} (teach it to call it)")


@dataclass(frozen=True)
class Target:
    template: str
    method: str
    url: str
    owner: str | None  # "A"/"B" (a service run), "run" (the rsigym run), "sweep", or None (no run named)


def targets(app: Any, world: World, surface: str) -> list[Target]:
    """Every route of ``app`` as concrete requests (path parameters filled with real values)."""
    out = []
    for template, methods, leaf in routes_of(list(app.routes)):
        if isinstance(leaf, StaticFiles):
            fills: list[tuple[str, str | None]] = [(template + "/watch.css", None)]
        elif leaf is not None:  # another app (MCP): at its mount path (redirected) and below it
            fills = [(template, None), (template + "/", None)]
        else:
            fills = fill(template, world, surface)
        for method in sorted(methods):
            for url, owner in fills:
                out.append(Target(template, method, url, owner))
    return out


def fill(template: str, world: World, surface: str) -> list[tuple[str, str | None]]:
    names = re.findall(r"{(\w+)(?::\w+)?}", template)
    sweep_route = "/sweeps/" in template
    if "key" in names:
        if sweep_route:
            values = [(world.sweep_key, "sweep"), ("no-such-sweep", None)]
        else:
            values = [(r["run_id"], owner) for owner, r in world.runs.items()]
            if surface == "watch":
                values.append((world.run_key, "run"))
    elif "run_id" in names:
        values = [(r["run_id"], owner) for owner, r in world.runs.items()]
    else:
        values = [("", None)]
    out = []
    for value, owner in values:
        url = template
        for name in names:
            pattern = r"{" + name + r"(?::\w+)?}"
            if name in ("key", "run_id"):
                url = re.sub(pattern, value, url)
            elif name in ("n", "i"):
                url = re.sub(pattern, "1" if name == "n" else "0", url)
            elif name == "name":
                url = re.sub(pattern, "heatmap.png" if sweep_route else "no-such-archive" if "/archives/" in template
                             else "no_such_tool", url)
            elif name == "node":
                url = re.sub(pattern, "ag-0000000000000000", url)
            elif name == "job_id":
                url = re.sub(pattern, "job-1", url)
            else:
                pytest.fail(f"route {template}: no value for {{{name}}} (teach this test what to put there)")
        if url.endswith("/events"):
            url += "?after=0" if "{key}" in template else "?gen=0"
        elif url.endswith("/diff") and owner in world.versions:
            a, b = world.versions[owner]
            url += f"?a={a}&b={b}"
        out.append((url, owner))
    return out


def is_public(template: str, surface: str) -> bool:
    return template in PUBLIC[surface]


def body_for(method: str) -> bytes | None:
    """A request body that takes no step: calls with a run key must not move a run (a body that is not JSON
    is refused before it reaches the run, and searched like any reply)."""
    if method in ("POST", "PUT", "PATCH"):
        return b"{ this is not json"
    return None


# ------------------------------------------------------------------------------------ the attacks


def test_the_routes_are_enumerated(world: World):
    serve = {t.template for t in targets(world.serve_app, world, "serve")}
    watch = {t.template for t in targets(world.watch_app, world, "watch")}
    assert {"/watch/api/runs", "/watch/runs/{key}/events", "/watch/runs/{key}/trajectory.json", "/v1/tools/submit",
            "/v1/trajectory", "/mcp", "/v1/runs/{run_id}", "/watch/static"} <= serve
    assert {"/api/runs", "/events", "/sweeps/{key}/files/{name}", "/runs/{key}/steps/{n:int}"} <= watch
    assert len(serve) > 40 and len(watch) >= 16
    assert PUBLIC["serve"] <= serve and PUBLIC["watch"] <= watch  # the allow-list names real routes
    sockets = [t for app in (world.serve_app, world.watch_app) for t in targets(app, world, "serve")
               if t.method == "WEBSOCKET"]
    assert not sockets, f"a WebSocket route: teach this test to open it with each key ({sockets})"


@pytest.mark.parametrize("surface", ["serve", "watch"])
def test_no_key_and_a_wrong_key_get_401_and_nothing_else(world: World, surface: str):
    app, base = (world.serve_app, world.serve) if surface == "serve" else (world.watch_app, world.watch)
    keys: list[str | None] = [None, *WRONG]
    if surface == "watch":  # the standalone dashboard knows no run key of any service
        keys += [r["run_key"] for r in world.runs.values()] + [ADMIN]
    seen = 0
    with httpx.Client(timeout=30, base_url=base) as client:
        for t in targets(app, world, surface):
            for key in keys:
                for accept in ("application/json", "text/html"):
                    status, body, headers = _call(client, t.method, t.url, key, body=body_for(t.method),
                                                  headers={"Accept": accept})
                    seen += 1
                    assert not world.leaks(body), (t, key, world.leaks(body), body[:300])
                    if is_public(t.template, surface):
                        assert status in (200, 405), (t, status)
                        continue
                    if status in (307, 308) and not body:  # a mount's path without its slash: sent below it
                        assert headers["location"].endswith(t.url + "/"), (t, headers)
                        continue
                    assert status == 401, (t, key, status, body[:300])
                    assert "bearer" in headers.get("www-authenticate", "").lower(), (t, headers)
                    assert b"token" in body or b"key" in body, (t, body[:200])  # it says how to get in
    assert seen > 300


def test_a_run_key_sees_its_own_run_only_and_redacted(world: World):
    with httpx.Client(timeout=30, base_url=world.serve) as client:
        for me, other in (("A", "B"), ("B", "A")):
            key = world.runs[me]["run_key"]
            own_seed = SEED_A if me == "A" else SEED_B
            for t in targets(world.serve_app, world, "serve"):
                status, body, _ = _call(client, t.method, t.url, key, body=body_for(t.method),
                                        headers={"Accept": "text/html" if "/api/" not in t.url else "application/json"})
                assert not world.leaks(body), (me, t, world.leaks(body), body[:300])
                assert str(own_seed).encode() not in body, (me, t)
                assert world.runs[other]["run_id"].encode() not in body or t.owner == other and status == 404, (me, t)
                if t.template.startswith(ADMIN_ONLY_REST):
                    assert status == 401, (me, t, status)
                elif t.template.startswith("/watch") and not is_public(t.template, "serve"):
                    if t.owner == other:
                        assert status in (403, 404), (me, t, status, body[:200])
                    elif t.owner == "sweep" or "/sweeps/" in t.template or "/archives" in t.template:
                        assert status == 403, (me, t, status)  # sweeps and archives: the admin's only
                    elif t.owner == me and t.method == "GET":
                        assert status == 200, (me, t, status, body[:300])
                    elif t.owner is None and t.method == "GET":
                        assert status == 200 and world.runs[me]["run_id"].encode() in body, (me, t, status)
            # the list holds this run alone, without seed or path
            rows = client.get("/watch/api/runs", headers={"Authorization": f"Bearer {key}"}).json()
            assert [r["key"] for r in rows["runs"]] == [world.runs[me]["run_id"]] and rows["sweeps"] == []
            assert "seed" not in rows["runs"][0] and "path" not in rows["runs"][0]
            view = client.get(f"/watch/api/runs/{world.runs[me]['run_id']}", headers={"Authorization": f"Bearer {key}"})
            assert view.status_code == 200 and view.json()["n_steps"] >= 4 and "path" not in view.json()


def test_what_the_researcher_reads_over_rest_and_mcp_carries_no_seed_or_path(world: World):
    """The replies of the steps played (the briefing, read refs, refusals, the end of B's episode) and the
    same run over MCP (resources, tools) with its own key."""
    for reply in world.played:
        assert not world.leaks(reply), (world.leaks(reply), reply[:300])
    mcp = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    with httpx.Client(base_url=world.serve, headers=mcp, timeout=30) as client:
        for name, run in world.runs.items():
            calls = [("resources/read", {"uri": "rsigym://observation"}), ("resources/read", {"uri": "rsigym://budget"}),
                     ("resources/list", {}), ("tools/list", {}),
                     ("tools/call", {"name": "read", "arguments": {"ref": "scenario"}}),
                     ("tools/call", {"name": "read", "arguments": {"ref": "job-1"}})]
            for i, (method, params) in enumerate(calls):
                body = json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode()
                status, data, _ = _call(client, "POST", "/mcp/", run["run_key"], body=body)
                assert status == 200 and b'"result"' in data, (name, method, status, data[:300])
                assert not world.leaks(data), (name, method, world.leaks(data))
                other = world.runs["B" if name == "A" else "A"]["run_id"].encode()
                assert other not in data and b"route-test-" + (b"B" if name == "A" else b"A") not in data


def test_the_admin_token_sees_every_run_with_its_seed(world: World):
    """The positive control: the search above finds what it looks for where it is shown."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with httpx.Client(timeout=30, base_url=world.serve, headers=admin) as client:
        listed = client.get("/watch/api/runs")
        assert listed.status_code == 200
        assert {r["key"] for r in listed.json()["runs"]} == {r["run_id"] for r in world.runs.values()}
        assert {str(SEED_A), str(SEED_B)} <= set(world.leaks(listed.content))
        assert any(str(Path(p)) in listed.text for p in world.texts)  # its paths too
        assert str(SEED_A) in client.get("/v1/runs").text
        for t in targets(world.serve_app, world, "serve"):
            if t.method == "GET" and t.template.startswith("/watch") and "/sweeps/" not in t.template \
                    and "/archives/" not in t.template:  # (no archive exists here: its pages are 404)
                status, body, _ = _call(client, "GET", t.url, ADMIN)
                assert status == 200, (t, status, body[:200])
    with httpx.Client(timeout=30, base_url=world.watch) as client:
        for t in targets(world.watch_app, world, "watch"):
            if t.method == "GET" and (t.owner in ("A", "B", "run", "sweep") or "{" not in t.template):
                status, body, _ = _call(client, "GET", t.url, WATCH_TOKEN)
                assert status == 200, (t, status, body[:200])
        rows = client.get("/api/runs", headers={"Authorization": f"Bearer {WATCH_TOKEN}"}).json()
        assert {"cli-run", *(r["run_id"] for r in world.runs.values())} <= {r["key"] for r in rows["runs"]}
        assert str(SEED_RUN) in json.dumps(rows)


def test_a_browser_opens_the_token_url_once_and_the_cookie_does_the_rest(world: World):
    me, other = world.runs["A"], world.runs["B"]
    with httpx.Client(timeout=30, base_url=world.serve, headers={"Accept": "text/html"}) as browser:
        opened = browser.get(f"/watch/runs/{me['run_id']}", params={"token": me["run_key"], "x": "1"})
        assert opened.status_code == 303 and opened.headers["location"] == f"/watch/runs/{me['run_id']}?x=1"
        cookie = opened.headers["set-cookie"]
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Path=/watch" in cookie
        page = browser.get(opened.headers["location"])
        assert page.status_code == 200 and "Think step by step (A)" in page.text and not world.leaks(page.content)
        assert browser.get(f"/watch/runs/{other['run_id']}").status_code == 404  # the cookie opens run A only
        status, body, _ = _call(browser, "GET", f"/watch/runs/{me['run_id']}/events?after=0")
        assert status == 200 and b"event: run" in body and not world.leaks(body)
        assert browser.get("/watch/", params={"token": "rsa_wrong-token-but-long-enough"}).status_code == 401
        assert browser.get("/v1/balance").status_code == 401  # the dashboard's cookie is no key of the REST routes
    with httpx.Client(timeout=30, base_url=world.watch, headers={"Accept": "text/html"}) as browser:
        opened = browser.get("/", params={"token": WATCH_TOKEN})
        assert opened.status_code == 303 and "Path=/;" in opened.headers["set-cookie"] + ";"
        assert browser.get("/").status_code == 200 and "cli-run" in browser.get("/").text
        assert browser.get("/api/runs").status_code == 200
    # an API client may pass ?token= too: answered at once, no redirect, no cookie
    reply = httpx.get(f"{world.watch}/api/runs", params={"token": WATCH_TOKEN}, headers={"Accept": "application/json"})
    assert reply.status_code == 200 and "set-cookie" not in reply.headers


def test_openenv_sessions_see_their_own_run_and_no_host_path(world: World):
    """OpenEnv clients send no credentials: each WebSocket session is its own run (the session is the
    key), no route reads another session's, and nothing holds a host path or the split's secret. A
    client's own seed, which it chose, comes back in its ``state``; never another's, and a seed the
    server chose never."""
    public = {"/health", "/schema", "/metadata"}
    with TestClient(world.openenv_app) as http:
        found = {path for path, _, _ in routes_of(list(world.openenv_app.routes))}
        assert found == public | {"/ws"}, found
        for path in sorted(public) + ["/state", "/reset", "/step", "/runs"]:
            reply = http.get(path)
            assert reply.status_code == (200 if path in public else 404) and not world.leaks(reply.content), path
        with http.websocket_connect("/ws") as one, http.websocket_connect("/ws") as two, \
                http.websocket_connect("/ws") as three:
            got: dict[str, list[str]] = {"one": [], "two": [], "three": []}
            for name, ws, seed in (("one", one, SEED_A), ("two", two, SEED_B), ("three", three, None)):
                ws.send_json({"type": "reset", "data": {} if seed is None else {"seed": seed}})
                got[name].append(ws.receive_text())
            server = world.openenv_app.state.openenv
            chosen = [s.run.env.unwrapped.run.seed for s in server.sessions.values() if s.seed is None]
            assert len(chosen) == 1
            for name, ws in (("one", one), ("two", two), ("three", three)):
                for message in ({"type": "step", "data": {"tool": "evaluate", "args": {"k": 1, "n_tasks": 5}}},
                                {"type": "step", "data": {"tool": "wait", "args": {}}},
                                {"type": "step", "data": {"tool": "read", "args": {"ref": "scenario"}}},
                                {"type": "step", "data": {"tool": "read", "args": {"ref": "../../../etc"}}},
                                {"type": "state"}, {"type": "nonsense"}, {"type": "step", "data": {"tool": 1}}):
                    ws.send_json(message)
                    got[name].append(ws.receive_text())
            own = {"one": SEED_A, "two": SEED_B, "three": None}
            for name, texts in got.items():
                for text in texts:
                    allow = (own[name],) if own[name] is not None else ()
                    assert not world.leaks(text.encode(), allow=allow), (name, world.leaks(text.encode(), allow=allow))
                    assert str(chosen[0]) not in text, name  # the seed the server chose is nobody's to read
            assert json.loads(got["three"][-3])["data"]["seed"] is None


def test_the_refusals_say_nothing_about_runs(world: World):
    """A run key names its run id; a wrong one, or a well-formed key of no run, learns nothing."""
    fake = "rsr_" + world.runs["A"]["run_id"] + "_" + "B" * 43  # the right run id, a wrong secret
    with httpx.Client(timeout=30, base_url=world.serve) as client:
        for path in ("/watch/api/runs", f"/watch/api/runs/{world.runs['A']['run_id']}", "/v1/run", "/v1/observation"):
            reply = client.get(path, headers={"Authorization": f"Bearer {fake}"})
            assert reply.status_code == 401 and not world.leaks(reply.content)
            assert "route-test-A" not in reply.text and "sim-joint" not in reply.text
