"""The OpenEnv surface, driven by OpenEnv's own clients (``openenv-core`` 0.3) over a real WebSocket on
loopback; malformed frames (which OpenEnv's client cannot send) through Starlette's test client."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from starlette.testclient import TestClient

from gateway_helpers import serve_in_thread
from rsigym_env.gateway.local_runs import LocalRunFactory
from rsigym_env.gateway.openenv_server import (
    ResearchAction, ResearchObservation, ResearchState, openenv_app,
)

try:  # OpenEnv's client: the test extra installs openenv-core (without its server-side dependencies)
    from openenv.core import GenericEnvClient

    from rsigym_env.gateway.openenv_client import RSIGymEnv
except ImportError:
    GenericEnvClient = RSIGymEnv = None
needs_openenv = pytest.mark.skipif(GenericEnvClient is None, reason="openenv-core (OpenEnv's client) is not installed")

FIX = {"path": "harness.toml", "old": 'on_truncation = "stop"', "new": 'on_truncation = "continue"'}
FACTORY = LocalRunFactory(world="sim", benchmark="aime", budget_usd=50)


@pytest.fixture()
def served():
    app = openenv_app(FACTORY, max_sessions=3, session_timeout_s=30)
    with serve_in_thread(app) as url:
        yield url, app.state.openenv


@needs_openenv
def test_generic_client_runs_reset_steps_submit_over_ws(served):
    url, server = served
    with GenericEnvClient(base_url=url, message_timeout_s=20).sync() as env:
        first = env.reset(seed=3, episode_id="ep-1")  # seed 3: replies get cut off, so the fix pays (sim result version 5)
        assert not first.done and first.reward is None and "AIME" in first.observation["text"]
        assert first.observation["budget_left_usd"] == 50 and first.observation["step"] == 0
        steps = [env.step({"tool": tool, "args": args}) for tool, args in [
            ("evaluate", {"k": 1}), ("wait", {}), ("edit_harness", FIX), ("evaluate", {"k": 1}), ("wait", {})]]
        assert all(s.observation["ok"] and not s.done and s.reward is None for s in steps)
        assert steps[1].observation["events"][0]["job"] == "job-1"
        refused = env.step({"tool": "fly", "args": {}})
        assert not refused.observation["ok"] and refused.observation["error"] == "unknown_tool"
        assert refused.observation["cost_usd"] == 0
        last = env.step({"tool": "submit", "args": {}})
        state = env.state()
    assert last.done and last.reward > 0 and last.reward == pytest.approx(last.observation["end"]["normalized_gain"])
    assert last.observation["end"]["end_reason"] == "submitted"
    assert state == {"episode_id": "ep-1", "step_count": 7, "seed": 3, "done": True,
                     "budget_left_usd": last.observation["budget_left_usd"]}
    deadline = time.monotonic() + 5
    while server.sessions and time.monotonic() < deadline:  # the session ends when the client closes
        time.sleep(0.01)
    assert not server.sessions


@needs_openenv
def test_typed_client_and_the_schema_endpoints(served):
    url, _ = served
    with RSIGymEnv(base_url=url).sync() as env:
        result = env.reset(seed=3)
        assert isinstance(result.observation, ResearchObservation) and result.observation.action_mask[0] == 1
        result = env.step(ResearchAction(tool="read", args={"ref": "budget"}))
        assert result.observation.ok and result.observation.tool == "read"
        result = env.step(ResearchAction(tool="submit"))
        assert result.done and result.reward == 0.0
        assert isinstance(env.state(), ResearchState)
    schema = httpx.get(f"{url}/schema").json()
    assert schema == {"action": ResearchAction.model_json_schema(), "observation": ResearchObservation.model_json_schema(),
                      "state": ResearchState.model_json_schema()}
    assert httpx.get(f"{url}/health").json() == {"status": "healthy"}
    assert httpx.get(f"{url}/metadata").json()["name"] == "rsigym"


@needs_openenv
def test_concurrent_sessions_are_isolated_runs(served):
    url, server = served
    secret = f"SECRET-{secrets.token_hex(8)}"

    async def both() -> tuple[list[Any], list[Any], set[str]]:
        a, b = GenericEnvClient(base_url=url), GenericEnvClient(base_url=url)
        async with a, b:
            await asyncio.gather(a.reset(seed=0), b.reset(seed=0))
            keys = {s.run.env.run.key.id for s in server.sessions.values()}  # two runs, two platform keys
            edit, b_eval = await asyncio.gather(
                a.step({"tool": "edit_harness", "args": {"path": "notes.md", "content": secret}}),
                b.step({"tool": "evaluate", "args": {"k": 1}}))
            version = edit.observation["result"]["version"]
            stolen = [await b.step({"tool": "read", "args": {"ref": ref}}) for ref in
                      (f"harness:{version}/notes.md", f"harness:{version}", "artifacts")]
            a_job = await a.step({"tool": "read", "args": {"ref": "job-1"}})  # B's job id, asked by A
            states = await asyncio.gather(a.state(), b.state())
        return [edit, b_eval, a_job, *states], stolen, keys

    (edit, b_eval, a_job, a_state, b_state), stolen, keys = asyncio.run(both())
    assert len(keys) == 2
    assert edit.observation["ok"] and b_eval.observation["ok"]
    assert [s.observation["error"] for s in stolen[:2]] == ["unknown_ref", "unknown_ref"]
    assert all(secret not in json.dumps(s.observation) for s in stolen)
    assert edit.observation["result"]["version"] not in stolen[2].observation["text"]
    assert not a_job.observation["ok"] and a_job.observation["error"] == "unknown_ref"
    assert a_state["budget_left_usd"] == 50 and b_state["budget_left_usd"] < 50  # each run pays its own calls
    assert a_state["episode_id"] != b_state["episode_id"] and (a_state["step_count"], b_state["step_count"]) == (2, 4)


@needs_openenv
def test_capacity_idle_reaping_and_factory_failure():
    def broken(seed: int | None) -> Any:
        raise ValueError("no world today")

    app = openenv_app(FACTORY, max_sessions=1, session_timeout_s=0.4)
    with serve_in_thread(app) as url:
        holder = GenericEnvClient(base_url=url, message_timeout_s=5).sync()
        holder.connect()
        holder.reset(seed=0)
        (session,) = app.state.openenv.sessions.values()
        env = session.run.env
        with GenericEnvClient(base_url=url, message_timeout_s=5).sync() as extra:
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                extra.reset()
        time.sleep(0.8)  # the holder stays silent past the timeout: its session is closed, its run ended
        assert not app.state.openenv.sessions and env.run is None  # reaped: the run was closed
        with pytest.raises(ConnectionClosed):
            holder.step({"tool": "read", "args": {"ref": "budget"}})
        holder.close()
        with GenericEnvClient(base_url=url, message_timeout_s=5).sync() as fresh:  # the slot is free again
            assert fresh.reset(seed=1).observation["step"] == 0
    with serve_in_thread(openenv_app(broken)) as url:
        with GenericEnvClient(base_url=url, message_timeout_s=5).sync() as env:
            with pytest.raises(RuntimeError, match="FACTORY_ERROR"):
                env.reset()


BAD_FRAMES = [
    ("{not json", "INVALID_JSON"),
    (b"\xff\xfe\x00binary", "INVALID_JSON"),
    ("[1, 2]", "VALIDATION_ERROR"),
    ('{"type": "teleport"}', "UNKNOWN_TYPE"),
    ('{"type": "step", "data": [1]}', "VALIDATION_ERROR"),
    ('{"type": "step", "data": {"tool": "read", "args": {"ref": "budget"}, "sudo": true}}', "VALIDATION_ERROR"),
    ('{"type": "step", "data": {"tool": "read", "args": "budget"}}', "VALIDATION_ERROR"),
    ('{"type": "step", "data": {"tool": "' + "x" * 100 + '"}}', "VALIDATION_ERROR"),
    ('{"type": "reset", "data": {"seed": -1}}', "VALIDATION_ERROR"),
    ('{"type": "reset", "data": {"seed": "zero"}}', "VALIDATION_ERROR"),
    ('{"type": "reset", "data": {"seed": 99999999999999999999}}', "VALIDATION_ERROR"),
    ('{"type": "reset", "data": {"episode_id": "' + "e" * 300 + '"}}', "VALIDATION_ERROR"),
    ('{"type": "step", "data": {"tool": "read", "args": {"ref": "' + "r" * 3000 + '"}}}', "VALIDATION_ERROR"),
]


def test_malformed_frames_get_an_error_and_the_session_goes_on():
    app = openenv_app(FACTORY, max_message_bytes=2048)
    with TestClient(app) as http, http.websocket_connect("/ws") as ws:
        ws.send_json({"type": "step", "data": {"tool": "read", "args": {"ref": "budget"}}})
        assert ws.receive_json() == {"type": "error", "data": {"message": "no episode yet: send a reset first",
                                                               "code": "SESSION_ERROR"}}
        ws.send_json({"type": "reset", "data": {"seed": 0, "budget_usd": 1e9, "world": "remote"}})  # not the client's to pick
        reset = ws.receive_json()["data"]["observation"]
        assert reset["budget_left_usd"] == 50 and "sim world" in reset["text"]
        for frame, code in BAD_FRAMES:
            ws.send_bytes(frame) if isinstance(frame, bytes) else ws.send_text(frame)
            reply = ws.receive_json()
            assert reply["type"] == "error" and reply["data"]["code"] == code, (frame[:60], reply)
        ws.send_json({"type": "step", "data": {"tool": "evaluate", "args": {"k": "two"}}})  # the run's own refusal
        refused = ws.receive_json()["data"]["observation"]
        assert not refused["ok"] and refused["error"] == "invalid_args" and refused["cost_usd"] == 0
        ws.send_json({"type": "state"})
        state = ws.receive_json()["data"]
        assert state["step_count"] == 1 and state["budget_left_usd"] == 50  # none of the bad frames was a step
        ws.send_json({"type": "close"})


def test_every_reset_is_a_new_run_and_the_server_bounds_how_many(capsys):
    app = openenv_app(FACTORY, max_runs=2)
    with TestClient(app) as http, http.websocket_connect("/ws") as ws:
        replies = []
        for seed in range(3):  # a client cannot refill its budget by resetting forever
            ws.send_json({"type": "reset", "data": {"seed": seed}})
            replies.append(ws.receive_json())
    assert [r["type"] for r in replies] == ["observation", "observation", "error"]
    assert replies[2]["data"]["code"] == "FACTORY_ERROR" and "limit of 2 runs" in replies[2]["data"]["message"]
    assert not app.state.openenv.sessions

    from rsigym_env.gateway.openenv_server import main

    assert main(["--host", "0.0.0.0", "--world", "sim"]) == 2  # no credentials on the wire: loopback only by default
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["--scenario", "no-such-scenario"]) == 2
    assert "unknown scenario" in capsys.readouterr().err


def test_keyed_seeds_repeat_an_episode_on_this_server_and_never_show_its_seed():
    """``rsigym openenv``'s default: a client's seed picks the episode through a keyed hash, so the same seed
    gives the same episode here, but the seed a client could replay offline is never the episode's."""
    from rsigym_env.gateway.openenv_server import keyed_seed

    key, seeds = secrets.token_bytes(32), []

    def make_run(seed):
        seeds.append(seed)
        return FACTORY(seed)

    app = openenv_app(make_run, max_sessions=2, seed_key=key)
    with TestClient(app) as http:
        texts = []
        for _ in range(2):
            with http.websocket_connect("/ws") as ws:
                ws.send_json({"type": "reset", "data": {"seed": 5}})
                texts.append(ws.receive_text())
                seeds += [s.run.env.unwrapped.run.seed for s in app.state.openenv.sessions.values()]
                for message in ({"type": "step", "data": {"tool": "read", "args": {"ref": "scenario"}}},
                                {"type": "step", "data": {"tool": "submit", "args": {}}}, {"type": "state"}):
                    ws.send_json(message)
                    texts.append(ws.receive_text())
    assert seeds[0] == seeds[2] == keyed_seed(key, 5) != 5 and seeds[1] == seeds[3]  # (episode seeds: the run's own)
    assert texts[0] == texts[4]                       # the same seed, the same episode
    assert not any(str(seed) in text for seed in seeds for text in texts)
    assert json.loads(texts[3])["data"]["seed"] == 5  # the state says what the client sent
