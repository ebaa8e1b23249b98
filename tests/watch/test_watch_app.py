"""The ``rsigym watch`` web app over HTTP (no browser): pages, JSON, live streams, service runs.

Everything is served by uvicorn on loopback in a thread and read with httpx, authenticated as an API
client would be (``Authorization: Bearer <the dashboard's token>``; the browser tests open the token
URL instead); run directories are real sim episodes written by ``RunRecorder`` or by today's ``rsigym run``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import gymnasium as gym
import httpx
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.baselines import make_researcher
from rsigym_env.cli import main as rsigym_main
from rsigym_env.episode import run_episode
from rsigym_env.gateway.host import StepLog
from rsigym_env.report import write_report
from rsigym_env.serving.asgi import ThreadedASGIServer
from rsigym_env.sweep import make_grid, sweep
from rsigym_env.watch.app import create_app
from rsigym_env.watch.catalog import URLSource
from rsigym_env.watch.cli import register
from rsigym_env.watch.record import RunRecorder

ADMIN = "rsa_watch-test-admin-token-0123"
TOKEN = "rsw_watch-test-dashboard-token-4567"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
get = functools.partial(httpx.get, headers=AUTH)
"""``httpx.get`` with the dashboard's token."""


def record_run(run_dir: Path, benchmark: str = "aime", agent: str = "scripted", seed: int = 0) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    env = gym.make("RSIGym/Joint-v0", benchmark=benchmark, ledger_path=run_dir / "ledger.sqlite", run_dir=run_dir)
    env = StepLog(RunRecorder(env, run_dir, researcher=agent, surface="test"), run_dir / "steps.jsonl")
    run_episode(env, make_researcher(agent), seed=seed)
    env.close()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("watched")
    record_run(root / "runs" / "a-scripted", "swe-bench-verified", "scripted", 0)
    record_run(root / "runs" / "b-random", "aime", "random", 1)
    assert rsigym_main(["run", "--benchmark", "gpqa-diamond", "--run-dir", str(root / "runs" / "c-legacy"), "-q"]) == 0
    (root / "runs" / "c-legacy" / "record.jsonl").unlink()  # as a run directory written before run records existed
    # seeds 1 and 2: sim worlds (result version 6) where the random researcher ends below the initial system
    # and no best cell is also below it (on 3 and 4 one was, which the page marks "★ ▼")
    data = sweep(make_grid(["random", "scripted"], ["aime", "terminal-bench-2"], [1, 2]), local=True)
    data.save(root / "sweep-1" / "results.json")
    write_report(data.to_dict(), root / "sweep-1")
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[str]:
    with ThreadedASGIServer(create_app([root], poll_s=0.1, admin_token=TOKEN), name="watch-test", graceful_s=0.5) as srv:
        yield srv.url


def sse_events(url: str, event: str, until: Any, timeout_s: float = 20.0,
               headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Read server-sent ``event`` payloads from ``url`` until ``until(events)`` is true (bounded)."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    with httpx.stream("GET", url, timeout=httpx.Timeout(timeout_s, read=2.0), headers=headers or AUTH) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        name = None
        lines = reply.iter_lines()
        while time.monotonic() < deadline:
            try:
                line = next(lines)
            except httpx.ReadTimeout:
                continue
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and name == event:
                events.append(json.loads(line.split(":", 1)[1]))
                if until(events):
                    return events
    raise AssertionError(f"no {event!r} event satisfied the condition within {timeout_s} s: {events!r:.500}")


def test_the_runs_list_shows_every_run_with_its_figures(server: str, root: Path):
    data = get(f"{server}/api/runs").json()
    rows = {r["key"]: r for r in data["runs"]}
    assert set(rows) == {"a-scripted", "b-random", "c-legacy"}
    result = json.loads((root / "runs" / "c-legacy" / "result.json").read_text())
    assert rows["c-legacy"]["gain"] == pytest.approx(result["reward"]) and rows["c-legacy"]["status"] == "finished"
    assert rows["a-scripted"]["benchmark"] == "swe-bench-verified" and rows["b-random"]["researcher"] == "random"
    assert [s["key"] for s in data["sweeps"]] == ["sweep-1"] and data["sweeps"][0]["episodes"] == 8
    html = get(server + "/").text
    for key, row in rows.items():
        assert f'href="/runs/{key}"' in html and f'data-status="{row["status"]}"' in html
    assert re.search(r'<select name="researcher">.*<option>random</option>.*<option>scripted</option>', html, re.S)
    assert "Content-Security-Policy" in get(server + "/").headers


def test_a_run_page_has_its_timeline_jobs_datasets_harness_result_and_audit(server: str, root: Path):
    reply = get(f"{server}/runs/a-scripted")
    assert reply.status_code == 200
    html = reply.text
    view = get(f"{server}/api/runs/a-scripted").json()
    assert view["audit"]["ok"] is True and "chain intact" in html
    assert html.count('class="step ') == view["n_steps"] == len(view["steps"])
    for job in view["jobs"]:
        assert f'data-job="{job["id"]}"' in html
    assert any(j["kind"] == "train" and j["result"]["loss_curve"] for j in view["jobs"])
    assert any(j["kind"] == "evaluate" and j["result"]["tasks"] for j in view["jobs"])
    assert view["charts"]["loss"] and view["charts"]["candidates"] and view["charts"]["world_h"]
    for ds in view["datasets"]:
        assert f'data-dataset="{ds["id"]}"' in html
    assert 'class="dadd"' in html and 'class="ddel"' in html  # a harness diff
    assert "official score (held out)" in html and view["end"]["normalized_gain"] == view["row"]["gain"]
    # the full observation of a step, on demand
    log = next(r for r in (root / "runs" / "a-scripted" / "record.jsonl").read_text().splitlines()
               if '"step":3,' in r)
    assert get(f"{server}/runs/a-scripted/steps/3").text == json.loads(log)["log"]
    # harness versions compared
    versions = [v["version"] for v in view["versions"]]
    diff = get(f"{server}/runs/a-scripted/diff", params={"a": versions[0], "b": versions[-1]})
    assert diff.status_code == 200 and "harness.toml" in diff.text
    # the trajectory export
    t = get(f"{server}/runs/a-scripted/trajectory.json")
    assert t.status_code == 200 and len(t.json()["steps"]) == view["n_steps"] + 1


def test_an_older_run_page_shows_what_it_can(server: str):
    html = get(f"{server}/runs/c-legacy").text
    view = get(f"{server}/api/runs/c-legacy").json()
    assert view["legacy"] and "An older run directory" in html and view["audit"]["ok"] is True
    assert view["charts"]["world_h"] is None and view["charts"]["candidates"]
    text = get(f"{server}/runs/c-legacy/steps/1").text
    assert "the observation text itself was not recorded" in text


def test_a_sweep_page_marks_the_best_and_what_fell_below_the_initial_system(server: str):
    html = get(f"{server}/sweeps/sweep-1").text
    view = get(f"{server}/api/sweeps/sweep-1").json()
    best = [c for row in view["table"]["rows"] for c in row["cells"] if c["best"]]
    below = [c for row in view["table"]["rows"] for c in row["cells"] if c["below"]]
    table = html[html.index('<table class="figure2"'):]
    table = table[: table.index("</table>")]
    assert best and table.count(" ★</td>") == len(best)
    assert below and table.count(" ▼</td>") == len(below)  # a random researcher falls below it somewhere
    below_episodes = [e for e in view["episodes"] if e["below"]]
    assert html.count('<tr class="below">') == len(below_episodes)
    assert len(view["anytime"]) == 2 and len(view["heatmap"]["y"]) == 2
    for i in range(8):
        assert f'href="/sweeps/sweep-1/episodes/{i}"' in html
    episode = get(f"{server}/sweeps/sweep-1/episodes/3")
    assert episode.status_code == 200 and "Anytime curve" in episode.text
    assert get(f"{server}/sweeps/sweep-1/files/heatmap.png").headers["content-type"] == "image/png"
    for bad in ("..%2F..%2Fruns%2Fa-scripted%2Fledger.sqlite", "ledger.sqlite", "%2Fetc%2Fpasswd"):
        assert get(f"{server}/sweeps/sweep-1/files/{bad}").status_code == 404
    assert get(f"{server}/sweeps/sweep-1/episodes/99").status_code == 404
    assert get(f"{server}/runs/nope").status_code == 404


def test_the_list_stream_brings_a_new_run_and_its_steps(server: str, root: Path):
    gen = get(f"{server}/api/runs").json()["generation"]
    run_dir = root / "runs" / "d-live"
    env = RunRecorder(gym.make("RSIGym/Joint-v0", benchmark="aime"), run_dir, researcher="live-one")
    stop = threading.Event()

    def go() -> None:
        env.reset(seed=0)
        while not stop.is_set():
            env.step({"tool": "read", "args": {"ref": "budget"}})
            time.sleep(0.2)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    try:
        def steps_of(events: list[dict[str, Any]]) -> list[int]:
            return [int(m.group(1)) for e in events if "d-live" in e["rows"]
                    for m in [re.search(r'data-v="(\d+)">\1<small', e["rows"]["d-live"])] if m]

        events = sse_events(f"{server}/events?gen={gen}", "rows", lambda ev: len(set(steps_of(ev))) >= 2)
        assert "d-live" in events[0]["keys"] and 'data-researcher="live-one"' in events[0]["rows"]["d-live"]
        assert steps_of(events) == sorted(steps_of(events))
        # the run's own stream: new steps as they come
        after = get(f"{server}/api/runs/d-live").json()["n_steps"]
        parts = sse_events(f"{server}/runs/d-live/events?after={after}", "run", lambda ev: len(ev) >= 2)
        assert parts[0]["after"] > after and f'data-step="{after + 1}"' in parts[0]["rows"]
        assert parts[1]["after"] > parts[0]["after"] and set(parts[1]["sections"]) >= {"header", "jobs", "result"}
    finally:
        stop.set()
        thread.join(10)
        env.close()


def test_the_dashboard_mounts_into_the_session_service_and_lists_its_live_runs(tmp_path: Path):
    from rsigym_env.gateway.cli import serve_app
    from rsigym_env.gateway.service import RunRequest, SessionService
    from rsigym_env.serving.listen import BackgroundServer

    service = SessionService(tmp_path / "state", admin_token=ADMIN, start_reaper=False)
    try:
        created = service.create_run(RunRequest(benchmark="aime", budget_usd=50, seed=2, label="claude-code"))
        other = service.create_run(RunRequest(benchmark="aime", budget_usd=50, seed=3, label="someone-else"))
        run = service.backend_for_key(created["run_key"])
        run.call("evaluate", {"k": 1, "n_tasks": 5})
        admin = {"Authorization": f"Bearer {ADMIN}"}
        with BackgroundServer(serve_app(service, watch=True)) as srv:  # as `rsigym serve --watch` builds it
            assert httpx.get(f"{srv.url}/watch/api/runs").status_code == 401  # no key: nothing
            rows = {r["key"]: r for r in httpx.get(f"{srv.url}/watch/api/runs", headers=admin).json()["runs"]}
            row = rows[created["run_id"]]
            assert set(rows) == {created["run_id"], other["run_id"]} and row["seed"] == 2
            assert row["state"] == "active" and row["researcher"] == "claude-code"
            assert row["status"] == "running" and row["steps"] == 1
            html = httpx.get(f"{srv.url}/watch/", headers=admin).text
            assert f'href="/watch/runs/{created["run_id"]}"' in html and 'src="/watch/static/watch.js"' in html
            page = httpx.get(f"{srv.url}/watch/runs/{created['run_id']}", headers=admin)
            assert page.status_code == 200 and "evaluate" in page.text and "seed 2" in page.text
            # a run key: its own run, without seed or paths; another run is not found
            mine = {"Authorization": f"Bearer {created['run_key']}"}
            (only,) = httpx.get(f"{srv.url}/watch/api/runs", headers=mine).json()["runs"]
            assert only["key"] == created["run_id"] and "seed" not in only and "path" not in only
            page = httpx.get(f"{srv.url}/watch/runs/{created['run_id']}", headers=mine)
            assert page.status_code == 200 and "evaluate" in page.text and "seed 2" not in page.text
            assert str(tmp_path) not in page.text
            assert httpx.get(f"{srv.url}/watch/runs/{other['run_id']}", headers=mine).status_code == 404
            assert httpx.get(f"{srv.url}/watch/api/runs/{other['run_id']}", headers=mine).status_code == 404
            # the same service by URL, with the admin token; a wrong token is shown, not fatal
            for token, expect in ((ADMIN, 2), ("rsa_wrong-token-0123456789", 0)):
                source = URLSource(srv.url, token)
                app = create_app([tmp_path / "empty"], live=source, admin_token=TOKEN)
                with ThreadedASGIServer(app, name="watch-url") as w:
                    found = get(f"{w.url}/api/runs").json()["runs"]
                    assert len(found) == expect
                    if expect:
                        assert {r["kind"] for r in found} == {"live"} and sorted(r["steps"] for r in found) == [0, 1]
                        live = get(f"{w.url}/runs/{created['run_id']}").text
                        assert "a run of the session service" in live
                    else:
                        assert "401" in get(w.url + "/").text
    finally:
        service.shutdown()


def test_the_dashboard_needs_its_token_and_a_browser_gives_it_once(tmp_path: Path):
    record_run(tmp_path / "runs" / "mine")
    app = create_app([tmp_path / "runs"], admin_token=TOKEN, poll_s=0.1)
    with ThreadedASGIServer(app, name="watch-auth", graceful_s=0.5) as srv:
        for path in ("/", "/api/runs", "/runs/mine", "/api/runs/mine", "/runs/mine/steps/1", "/runs/mine/trajectory.json",
                     "/events?gen=0", "/runs/mine/events", "/no/such/page"):
            for headers in ({}, {"Authorization": "Bearer rsw_not-the-dashboards-token"}, {"Accept": "text/html"}):
                reply = httpx.get(srv.url + path, headers=headers)
                assert reply.status_code == 401, (path, headers, reply.status_code)
                assert "mine" not in reply.text and str(tmp_path) not in reply.text and "token" in reply.text
        for public in ("/health", "/static/watch.js", "/static/watch.css", "/static/plotly.min.js"):
            assert httpx.get(srv.url + public).status_code == 200, public
        # a browser opens the token URL once: a cookie (HttpOnly, SameSite=Strict), and the same URL without it
        with httpx.Client(timeout=30, base_url=srv.url, headers={"Accept": "text/html"}) as browser:
            opened = browser.get("/runs/mine", params={"token": TOKEN})
            assert opened.status_code == 303 and opened.headers["location"] == "/runs/mine"
            cookie = opened.headers["set-cookie"]
            assert TOKEN in cookie and "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and "Path=/" in cookie
            assert browser.get("/runs/mine").status_code == 200 and browser.get("/api/runs").json()["runs"]
            events = browser.get("/runs/mine/steps/1")
            assert events.status_code == 200
            assert browser.get("/", params={"token": "rsw_a-wrong-token-0123456789"}).status_code == 401
        # a program sends the header (or ?token= without being redirected)
        assert get(f"{srv.url}/api/runs").json()["runs"][0]["key"] == "mine"
        assert httpx.get(f"{srv.url}/api/runs", params={"token": TOKEN}).status_code == 200


def test_rsigym_watch_makes_a_token_keeps_it_and_prints_its_url(tmp_path: Path):
    """As Jupyter: the first start makes a token (0600, $RSIGYM_HOME/watch-token), every start prints the
    URL with ?token=, and opening that URL is all a browser needs."""
    home = tmp_path / "home"
    env = {**os.environ, "RSIGYM_HOME": str(home)}
    urls = []
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-m", "rsigym_env.watch.cli", str(tmp_path / "runs"), "--port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            line = ""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "rsigym watch: " not in line:
                line = proc.stdout.readline() if proc.stdout else ""
                if not line and proc.poll() is not None:
                    break
            match = re.search(r"rsigym watch: (http://127\.0\.0\.1:\d+)/\?token=(\S+)", line)
            assert match, f"no URL with a token printed: {line!r}"
            url, token = match.groups()
            urls.append(token)
            assert httpx.get(f"{url}/api/runs").status_code == 401
            with httpx.Client(timeout=30, headers={"Accept": "text/html"}, follow_redirects=True) as browser:
                page = browser.get(f"{url}/?token={token}")
                assert page.status_code == 200 and str(page.url) == f"{url}/" and "Runs" in page.text
        finally:
            proc.terminate()
            proc.wait(30)
    path = home / "watch-token"
    assert urls[0] == urls[1] == path.read_text().strip() and urls[0].startswith("rsw_")
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_token_file_is_read_and_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    import argparse

    from rich.console import Console

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    short = tmp_path / "short"
    short.write_text("abc\n")
    args = parser.parse_args(["watch", "runs", "--token-file", str(short), "--port", "0"])
    assert args.func(args, Console(width=200)) == 2
    assert "shorter than 16 characters" in capsys.readouterr().out
    missing = parser.parse_args(["watch", "runs", "--token-file", str(tmp_path / "nope")])
    assert missing.func(missing, Console(width=200)) == 2
    assert "cannot read the token file" in capsys.readouterr().out


def test_the_command_line_refuses_a_public_address_without_allow_remote(capsys: pytest.CaptureFixture[str]):
    import argparse

    from rich.console import Console

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["watch", "runs", "--host", "0.0.0.0"])
    assert args.port == 8766 and args.dirs == ["runs"]
    assert args.func(args, Console(width=200)) == 2
    assert "not a loopback address" in capsys.readouterr().out
