"""The ``rsigym watch`` web app over HTTP (no browser): pages, JSON, live streams, service runs.

Everything is served by uvicorn on loopback in a thread and read with httpx; run directories are
real sim episodes written by ``RunRecorder`` or by today's ``rsigym run``.
"""

from __future__ import annotations

import json
import re
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
from rsigym_env.watch.catalog import ServiceSource, URLSource
from rsigym_env.watch.cli import register
from rsigym_env.watch.record import RunRecorder

ADMIN = "rsa_watch-test-admin-token-0123"


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
    data = sweep(make_grid(["random", "scripted"], ["aime", "terminal-bench-2"], 2), local=True)
    data.save(root / "sweep-1" / "results.json")
    write_report(data.to_dict(), root / "sweep-1")
    return root


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[str]:
    with ThreadedASGIServer(create_app([root], poll_s=0.1), name="watch-test", graceful_s=0.5) as srv:
        yield srv.url


def sse_events(url: str, event: str, until: Any, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """Read server-sent ``event`` payloads from ``url`` until ``until(events)`` is true (bounded)."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    with httpx.stream("GET", url, timeout=httpx.Timeout(timeout_s, read=2.0)) as reply:
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
    data = httpx.get(f"{server}/api/runs").json()
    rows = {r["key"]: r for r in data["runs"]}
    assert set(rows) == {"a-scripted", "b-random", "c-legacy"}
    result = json.loads((root / "runs" / "c-legacy" / "result.json").read_text())
    assert rows["c-legacy"]["gain"] == pytest.approx(result["reward"]) and rows["c-legacy"]["status"] == "finished"
    assert rows["a-scripted"]["benchmark"] == "swe-bench-verified" and rows["b-random"]["researcher"] == "random"
    assert [s["key"] for s in data["sweeps"]] == ["sweep-1"] and data["sweeps"][0]["episodes"] == 8
    html = httpx.get(server + "/").text
    for key, row in rows.items():
        assert f'href="/runs/{key}"' in html and f'data-status="{row["status"]}"' in html
    assert re.search(r'<select name="researcher">.*<option>random</option>.*<option>scripted</option>', html, re.S)
    assert "Content-Security-Policy" in httpx.get(server + "/").headers


def test_a_run_page_has_its_timeline_jobs_datasets_harness_result_and_audit(server: str, root: Path):
    reply = httpx.get(f"{server}/runs/a-scripted")
    assert reply.status_code == 200
    html = reply.text
    view = httpx.get(f"{server}/api/runs/a-scripted").json()
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
    assert httpx.get(f"{server}/runs/a-scripted/steps/3").text == json.loads(log)["log"]
    # harness versions compared
    versions = [v["version"] for v in view["versions"]]
    diff = httpx.get(f"{server}/runs/a-scripted/diff", params={"a": versions[0], "b": versions[-1]})
    assert diff.status_code == 200 and "harness.toml" in diff.text
    # the trajectory export
    t = httpx.get(f"{server}/runs/a-scripted/trajectory.json")
    assert t.status_code == 200 and len(t.json()["steps"]) == view["n_steps"] + 1


def test_an_older_run_page_shows_what_it_can(server: str):
    html = httpx.get(f"{server}/runs/c-legacy").text
    view = httpx.get(f"{server}/api/runs/c-legacy").json()
    assert view["legacy"] and "An older run directory" in html and view["audit"]["ok"] is True
    assert view["charts"]["world_h"] is None and view["charts"]["candidates"]
    text = httpx.get(f"{server}/runs/c-legacy/steps/1").text
    assert "the observation text itself was not recorded" in text


def test_a_sweep_page_marks_the_best_and_what_fell_below_the_initial_system(server: str):
    html = httpx.get(f"{server}/sweeps/sweep-1").text
    view = httpx.get(f"{server}/api/sweeps/sweep-1").json()
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
    episode = httpx.get(f"{server}/sweeps/sweep-1/episodes/3")
    assert episode.status_code == 200 and "Anytime curve" in episode.text
    assert httpx.get(f"{server}/sweeps/sweep-1/files/heatmap.png").headers["content-type"] == "image/png"
    for bad in ("..%2F..%2Fruns%2Fa-scripted%2Fledger.sqlite", "ledger.sqlite", "%2Fetc%2Fpasswd"):
        assert httpx.get(f"{server}/sweeps/sweep-1/files/{bad}").status_code == 404
    assert httpx.get(f"{server}/sweeps/sweep-1/episodes/99").status_code == 404
    assert httpx.get(f"{server}/runs/nope").status_code == 404


def test_the_list_stream_brings_a_new_run_and_its_steps(server: str, root: Path):
    gen = httpx.get(f"{server}/api/runs").json()["generation"]
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
        after = httpx.get(f"{server}/api/runs/d-live").json()["n_steps"]
        parts = sse_events(f"{server}/runs/d-live/events?after={after}", "run", lambda ev: len(ev) >= 2)
        assert parts[0]["after"] > after and f'data-step="{after + 1}"' in parts[0]["rows"]
        assert parts[1]["after"] > parts[0]["after"] and set(parts[1]["sections"]) >= {"header", "jobs", "result"}
    finally:
        stop.set()
        thread.join(10)
        env.close()


def test_the_dashboard_mounts_into_the_session_service_and_lists_its_live_runs(tmp_path: Path):
    from rsigym_env.gateway.rest import create_app as rest_app
    from rsigym_env.serving.listen import BackgroundServer
    from rsigym_env.gateway.service import RunRequest, SessionService

    service = SessionService(tmp_path / "state", admin_token=ADMIN, start_reaper=False)
    try:
        created = service.create_run(RunRequest(benchmark="aime", budget_usd=50, seed=2, label="claude-code"))
        run = service.backend_for_key(created["run_key"])
        run.call("evaluate", {"k": 1, "n_tasks": 5})
        watch = create_app([service.runs_dir], live=ServiceSource(service))
        with BackgroundServer(rest_app(service, mounts={"/watch": watch})) as srv:
            rows = httpx.get(f"{srv.url}/watch/api/runs").json()["runs"]
            (row,) = rows
            assert row["key"] == created["run_id"] and row["state"] == "active" and row["researcher"] == "claude-code"
            assert row["status"] == "running" and row["steps"] == 1
            html = httpx.get(f"{srv.url}/watch/").text
            assert f'href="/watch/runs/{created["run_id"]}"' in html and 'src="/watch/static/watch.js"' in html
            page = httpx.get(f"{srv.url}/watch/runs/{created['run_id']}")
            assert page.status_code == 200 and "evaluate" in page.text
            # the same service by URL, with the admin token; a wrong token is shown, not fatal
            for token, expect in ((ADMIN, 1), ("rsa_wrong-token-0123456789", 0)):
                source = URLSource(srv.url, token)
                with ThreadedASGIServer(create_app([tmp_path / "empty"], live=source), name="watch-url") as w:
                    found = httpx.get(f"{w.url}/api/runs").json()["runs"]
                    assert len(found) == expect
                    if expect:
                        assert found[0]["kind"] == "live" and found[0]["steps"] == 1
                        live = httpx.get(f"{w.url}/runs/{created['run_id']}").text
                        assert "a run of the session service" in live
                    else:
                        assert "401" in httpx.get(w.url + "/").text
    finally:
        service.shutdown()


def test_the_command_line_refuses_a_public_address_without_allow_remote(capsys: pytest.CaptureFixture[str]):
    import argparse

    from rich.console import Console

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["watch", "runs", "--host", "0.0.0.0"])
    assert args.port == 8766 and args.dirs == ["runs"]
    assert args.func(args, Console(width=200)) == 2
    assert "not a loopback address" in capsys.readouterr().out
