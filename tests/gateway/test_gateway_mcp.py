"""The MCP surface, driven by the official ``mcp`` SDK's own client: a real ``rsigym mcp`` subprocess over
stdio, and the streamable-HTTP app served by uvicorn on loopback with per-request run keys."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import httpx2
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from starlette.testclient import TestClient

from gateway_helpers import serve_in_thread
from rsigym_env.gateway.backend import LocalRun, ToolReply
from rsigym_env.gateway.cli import register_mcp, run_mcp
from rsigym_env.gateway.local_runs import LocalRunFactory
from rsigym_env.gateway.mcp_server import (
    BUDGET_URI, backend_maker, build_mcp_server, main, mcp_http_app,
)
from rsigym_env.platform.audit import verify_audit
from rsigym_env.tools import TOOL_NAMES, tool_schemas

FIX = {"path": "harness.toml", "old": 'on_truncation = "stop"', "new": 'on_truncation = "continue"'}
SIM = dict(world="sim", benchmark="aime", budget_usd=50)


def sim_run(seed: int = 0, **overrides: Any) -> LocalRun:
    return LocalRunFactory(**{**SIM, **overrides})(seed=seed)


def audit_of(run: LocalRun) -> list[dict[str, Any]]:
    return [r.event for r in run.env.platform.ledger.audit_records()]


async def assert_tool_listing(client: Client) -> None:
    listed = (await client.list_tools()).tools
    expected = [s["function"] for s in tool_schemas()]
    assert [t.name for t in listed] == [f["name"] for f in expected] == list(TOOL_NAMES)
    for tool, schema in zip(listed, expected):
        assert tool.input_schema == schema["parameters"]
        assert tool.description == schema["description"]
        assert tool.output_schema == ToolReply.model_json_schema()


async def play_episode(client: Client) -> dict[str, Any]:
    """A whole sim episode through MCP tool calls: evaluate, fix the harness, evaluate, submit."""
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async def call(tool: str, args: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        result = await client.call_tool(tool, args, **kwargs)
        assert not result.is_error, result.content
        assert result.content[0].text == result.structured_content["text"]
        return result.structured_content

    start = json.loads((await client.read_resource(BUDGET_URI)).contents[0].text)
    job = (await call("evaluate", {"k": 1}))["result"]["job"]
    waited = await call("wait", {}, progress_callback=on_progress)
    assert [e["job"] for e in waited["events"]] == [job] and "finished: dev score" in waited["text"]
    assert [m for _, _, m in progress] == ["waiting for a job to finish", f"wait returned ({job} finished)"]
    await call("edit_harness", FIX)
    second = (await call("evaluate", {"k": 1}))["result"]["job"]
    await call("wait", {"job": second})
    assert "dev score" in (await call("read", {"ref": second}))["text"]
    budget = json.loads((await client.read_resource(BUDGET_URI)).contents[0].text)
    assert 0 < budget["budget_left_usd"] < 50 and budget["step"] == start["step"] + 6 and budget["done"] is False
    done = await call("submit", {})
    assert done["done"] and done["end"]["end_reason"] == "submitted"
    assert done["reward"] == pytest.approx(done["end"]["normalized_gain"]) and done["reward"] > 0
    after = await client.call_tool("read", {"ref": "budget"})
    assert after.is_error and after.structured_content["error"] == "episode_over"
    return done


# ------------------------------------------------------------------------------------------------ stdio


def stdio_server(tmp_path: Path, *flags: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSIGYM_")}
    return StdioServerParameters(command=sys.executable, args=["-m", "rsigym_env.gateway.mcp_server", *flags],
                                 env=env, cwd=str(tmp_path))


def test_stdio_subprocess_lists_the_tools_and_plays_an_episode(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    params = stdio_server(tmp_path, "--world", "sim", "--benchmark", "aime", "--budget", "50", "--seed", "3",
                          "--ledger", str(ledger))

    async def session() -> dict[str, Any]:
        async with Client(params, read_timeout_seconds=30) as client:
            await assert_tool_listing(client)
            refused = await client.call_tool("evaluate", {"k": "two", "bogus": 1})
            assert refused.is_error and refused.structured_content["error"] == "invalid_args"
            assert "ERROR invalid_args" in refused.content[0].text and refused.structured_content["cost_usd"] == 0
            return await play_episode(client)

    done = anyio.run(session)
    assert done["end"]["spend_usd"] > 0
    # the subprocess kept the ledger: intact chain, the refusal and every call audited under one key
    assert verify_audit(ledger).ok
    from rsigym_env.platform.ledger import Ledger

    with Ledger(ledger) as book:
        events = [r.event for r in book.audit_records()]
    assert {e["key"] for e in events} == {events[0]["key"]}
    assert [e["tool"] for e in events if e["op"] != "settle"] == [
        "evaluate", "evaluate", "wait", "edit_harness", "evaluate", "wait", "read", "official_evaluation", "submit"]
    assert events[0]["decision"] == "refused" and events[0]["code"] == "invalid_args"


def test_stdio_command_refuses_a_bad_configuration_before_serving(tmp_path, capsys, monkeypatch):
    from rsigym_env.gateway import mcp_server

    monkeypatch.delenv("RSIGYM_RUN_KEY", raising=False)
    monkeypatch.delenv("RSIGYM_URL", raising=False)
    monkeypatch.setattr(mcp_server, "_interactive", lambda: True)  # a person at a terminal: the error, then exit 2
    assert main(["--scenario", "no-such-scenario"]) == 2
    assert "unknown scenario 'no-such-scenario'" in capsys.readouterr().err
    assert main(["--world", "sim", "--progress-interval", "0"]) == 2
    assert "--progress-interval must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--schema-max-length", "lots"])
    assert "expected a number of characters" in capsys.readouterr().err

    parser = argparse.ArgumentParser()
    register_mcp(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["mcp", "--benchmark", "aime"])
    assert args.func is run_mcp and args.seed is None  # which imports the server and calls cmd_mcp when it runs
    with pytest.raises(ValueError, match="RSIGYM_URL"):
        backend_maker(parser.parse_args(["mcp"]), {"RSIGYM_RUN_KEY": "k"})
    with pytest.raises(ValueError, match="RSIGYM_RUN_KEY"):
        backend_maker(parser.parse_args(["mcp"]), {"RSIGYM_URL": "http://127.0.0.1:9/"})
    remote = backend_maker(parser.parse_args(["mcp"]), {"RSIGYM_RUN_KEY": "k", "RSIGYM_URL": "http://127.0.0.1:9/"})()
    try:  # a run of the session service (nothing is contacted until the first call)
        assert type(remote).__name__ == "RemoteRun" and remote.url == "http://127.0.0.1:9"
    finally:
        remote.close()
    local = backend_maker(parser.parse_args(["mcp", "--world", "sim", "--budget", "7"]), {})()
    try:
        assert local.observation()["budget_left_usd"] == 7
    finally:
        local.close()


def test_run_flags_win_over_an_exported_run_key(tmp_path):
    """docs/agents.md has users export RSIGYM_URL and RSIGYM_RUN_KEY; a flag of an in-process run still means one."""
    parser = argparse.ArgumentParser()
    register_mcp(parser.add_subparsers(dest="command"))
    service = {"RSIGYM_RUN_KEY": "rsr_0123456789abcdef_" + "k" * 43, "RSIGYM_URL": "http://127.0.0.1:9"}
    for flags, named in [(["--benchmark", "aime", "--budget", "7"], "--benchmark, --budget"), (["--seed", "3"], "--seed"),
                         (["--run-dir", str(tmp_path / "run")], "--run-dir")]:
        notes: list[str] = []
        make = backend_maker(parser.parse_args(["mcp", *flags]), service, notice=notes.append)
        assert notes == [f"{named} given: serving an in-process run; RSIGYM_RUN_KEY and RSIGYM_URL in the environment "
                         "are ignored"]
        if "--run-dir" not in flags:
            run = make()
            try:
                assert type(run).__name__ == "LocalRun" and run.call("read", {"ref": "budget"}).ok
            finally:
                run.close()
    notes = []
    backend_maker(parser.parse_args(["mcp", "--world", "sim"]), {"RSIGYM_RUN_KEY": "k"}, notice=notes.append)
    assert notes == ["--world given: serving an in-process run; RSIGYM_RUN_KEY in the environment is ignored"]


def test_stdio_with_an_exported_run_key_and_a_scenario_serves_the_scenario(tmp_path):
    """The reported case: `rsigym mcp --scenario ...` with RSIGYM_RUN_KEY exported used to exit 2 before the
    handshake (the client saw a closed connection); now it serves the scenario and says so on stderr."""
    params = stdio_server(tmp_path, "--scenario", "sim-joint-aime-500", "--seed", "0")
    params.env.update(RSIGYM_RUN_KEY="rsr_0123456789abcdef_" + "k" * 43)
    errlog = tmp_path / "stderr.txt"

    async def session() -> Any:
        with errlog.open("w") as err:
            async with Client(stdio_client(params, errlog=err), read_timeout_seconds=30) as client:
                return await client.call_tool("evaluate", {"k": 1})

    started = anyio.run(session)
    assert not started.is_error and started.structured_content["result"]["job"] == "job-1"
    notice = [line for line in errlog.read_text().splitlines() if line.strip()]
    assert notice == ["rsigym mcp: --scenario, --seed given: serving an in-process run; RSIGYM_RUN_KEY in the "
                      "environment is ignored"]


@pytest.mark.parametrize("flags, extra_env, reason", [
    ([], {"RSIGYM_RUN_KEY": "rsr_0123456789abcdef_" + "k" * 43}, "RSIGYM_URL (the session service's address"),
    (["--scenario", "no-such-scenario"], {}, "unknown scenario 'no-such-scenario'"),
])
def test_a_server_that_has_no_run_tells_the_client_why(tmp_path, flags, extra_env, reason):
    """A configuration without a run is not a closed connection: the server starts, lists the tools, and answers
    every call with an error result that carries the reason (also its instructions and resources); it exits 2."""
    params = stdio_server(tmp_path, *flags)
    params.env.update(extra_env)

    async def session() -> tuple[str | None, list[str], list[Any], str]:
        async with Client(stdio_client(params, errlog=(tmp_path / "stderr.txt").open("w")),
                          read_timeout_seconds=30) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            results = [await client.call_tool("read", {"ref": "budget"}), await client.call_tool("submit", {})]
            with pytest.raises(MCPError) as resource:
                await client.read_resource(BUDGET_URI)
            return client.instructions, names, results, str(resource.value)

    instructions, names, results, resource_error = anyio.run(session)
    assert names == list(TOOL_NAMES)
    assert reason in instructions and reason in resource_error
    for result in results:
        assert result.is_error and result.structured_content["error"] == "run_unavailable"
        assert reason in result.structured_content["message"]
        assert result.content[0].text.startswith("ERROR run_unavailable: rsigym mcp has no research run: ")
    assert reason in (tmp_path / "stderr.txt").read_text()
    env = params.env
    done = subprocess.run([sys.executable, "-m", "rsigym_env.gateway.mcp_server", *flags], input=b"", env=env,
                          cwd=tmp_path, capture_output=True, timeout=120)
    assert done.returncode == 2 and done.stdout == b"" and reason.encode() in done.stderr


def test_a_run_that_fails_to_start_is_an_error_result_not_a_closed_connection(tmp_path):
    code = ("import anyio, sys\n"
            "from rsigym_env.gateway.mcp_server import serve_stdio\n"
            "def start():\n"
            "    raise RuntimeError('the sandbox host is down')\n"
            "sys.exit(0 if anyio.run(lambda: serve_stdio(start, on_failure=lambda r: print(r, file=sys.stderr))) else 1)\n")
    params = stdio_server(tmp_path)
    params = StdioServerParameters(command=sys.executable, args=["-c", code], env=params.env, cwd=str(tmp_path))

    async def session() -> Any:
        async with Client(stdio_client(params, errlog=(tmp_path / "stderr.txt").open("w")),
                          read_timeout_seconds=30) as client:
            return client.instructions, await client.call_tool("evaluate", {"k": 1})

    instructions, result = anyio.run(session)
    reason = "the run could not start: RuntimeError: the sandbox host is down"
    assert reason in instructions and result.is_error and reason in result.structured_content["message"]
    assert reason in (tmp_path / "stderr.txt").read_text()


def test_tool_list_caps_string_limits_and_the_run_still_takes_longer_text():
    """The listed schemas compile under grammar engines (maxLength at most 1,000 by default); the run validates
    with the tool models' own limits, so a client that sends more is not refused, and long files go in parts."""
    run = sim_run()

    async def session(server: Any) -> tuple[dict[str, Any], list[Any]]:
        async with Client(server) as client:
            tools = {t.name: t.input_schema for t in (await client.list_tools()).tools}
            text = "".join(f"line {i}: {'x' * 40}\n" for i in range(120))  # 6,010 characters
            replies = [await client.call_tool("edit_harness", {"path": "long.md", "content": text})]
            parts = [text[i:i + 900] for i in range(0, len(text), 900)]  # as the content field's description says
            replies.append(await client.call_tool("edit_harness", {"path": "parts.md", "content": parts[0]}))
            for before, part in zip(parts, parts[1:]):
                tail = before.rsplit("\n", 2)[-2] + "\n" + before.rsplit("\n", 2)[-1]
                replies.append(await client.call_tool("edit_harness", {"path": "parts.md", "old": tail, "new": tail + part}))
            return tools, replies

    try:
        capped, replies = anyio.run(session, build_mcp_server(run))
        exact, _ = anyio.run(session, build_mcp_server(run, schema_max_length=None))
        files = run.env.unwrapped.run_view().harness_files("latest")
    finally:
        run.close()
    assert max(_max_lengths(capped)) == 1000 and max(_max_lengths(exact)) == 200_000
    content = capped["edit_harness"]["properties"]["content"]
    assert content["anyOf"][0]["maxLength"] == 1000 and "the tool accepts up to 200,000" in content["description"]
    assert exact["edit_harness"]["properties"]["content"]["anyOf"][0]["maxLength"] == 200_000
    assert all(not r.is_error for r in replies), [r.content[0].text for r in replies if r.is_error]
    assert files["long.md"] == files["parts.md"] and len(files["long.md"]) == 6010


def _max_lengths(schema: Any) -> list[int]:
    if isinstance(schema, dict):
        return ([schema["maxLength"]] if "maxLength" in schema else []) + [n for v in schema.values() for n in _max_lengths(v)]
    if isinstance(schema, list):
        return [n for v in schema for n in _max_lengths(v)]
    return []


def test_run_dir_of_an_mcp_episode_is_what_rsigym_run_writes(tmp_path):
    """`rsigym mcp --run-dir` writes the step log, the run record, the result, the briefing and the ledger as
    `rsigym run` does: the scripted researcher's episode replayed through MCP leaves the same steps.jsonl lines
    (plus the text the client read), the same record, and the dashboard lists it."""
    from rsigym_env.cli import main as rsigym
    from rsigym_env.rundir import read_steps
    from rsigym_env.watch.catalog import Catalog
    from rsigym_env.watch.record import read_record

    ran, served = tmp_path / "runs" / "ran", tmp_path / "runs" / "served"
    assert rsigym(["run", "--benchmark", "aime", "--budget", "50", "--seed", "0", "--run-dir", str(ran), "-q"]) == 0
    expected = read_steps(ran / "steps.jsonl")
    assert len(expected) > 10 and expected[-1]["action"]["tool"] == "submit"
    params = stdio_server(tmp_path, "--benchmark", "aime", "--budget", "50", "--seed", "0", "--run-dir", str(served),
                          "--label", "claude-code", "--schema-max-length", "500")

    async def session() -> tuple[list[Any], list[str]]:
        async with Client(params, read_timeout_seconds=30) as client:
            listed = (await client.list_tools()).tools
            texts = []
            for line in expected:
                result = await client.call_tool(line["action"]["tool"], line["action"]["args"])
                assert not result.is_error, result.content
                texts.append(result.content[0].text)
            return listed, texts

    listed, texts = anyio.run(session)
    assert max(n for t in listed for n in _max_lengths(t.input_schema)) == 500  # --schema-max-length
    got = read_steps(served / "steps.jsonl")
    assert [set(line) for line in got] == [set(line) | {"log"} for line in expected]  # rsigym run's keys, and the log
    assert [{k: line[k] for k in ("step", "action", "info")} for line in got] == expected
    assert [line["log"] for line in got] == texts  # the text the client read
    record, reference = read_record(served / "record.jsonl"), read_record(ran / "record.jsonl")
    assert [r["type"] for r in record] == [r["type"] for r in reference]
    assert (record[0]["surface"], record[0]["researcher"], reference[0]["surface"]) == ("rsigym mcp", "claude-code", "rsigym run")
    drop = {"t", "wall_s", "owner", "surface", "researcher", "key"}  # key: the platform key id, random
    assert [{k: v for k, v in r.items() if k not in drop} for r in record] == \
        [{k: v for k, v in r.items() if k not in drop} for r in reference]
    result, reference_result = (json.loads((d / "result.json").read_text()) for d in (served, ran))
    assert set(result) == set(reference_result) and result["researcher"] == "claude-code"
    same = ("scenario", "seed", "reward", "steps", "terminated", "truncated", "info")
    assert {k: result[k] for k in same} == {k: reference_result[k] for k in same}
    assert result["ledger"] == str(served / "ledger.sqlite") and verify_audit(served / "ledger.sqlite").ok
    assert (served / "briefing.txt").read_text() == record[0]["briefing"]
    rows = {row["key"]: row for row in Catalog([tmp_path / "runs"]).rows()}
    assert {key: row["status"] for key, row in rows.items()} == {"ran": "finished", "served": "finished"}


# ------------------------------------------------------------------------------------------------ HTTP


class Keys:
    """A test key resolver: run keys -> in-process runs; counts every lookup."""

    def __init__(self, runs: dict[str, LocalRun]):
        self.runs = runs
        self.lookups: list[str] = []

    def __call__(self, token: str) -> LocalRun | None:
        self.lookups.append(token)
        if token == "explode":
            raise RuntimeError("the key store is down")
        return self.runs.get(token)


@pytest.fixture()
def served():
    keys = Keys({secrets.token_urlsafe(24): sim_run(seed=3), secrets.token_urlsafe(24): sim_run(),  # seed 3: replies get cut off, so the fix pays (sim result version 5)
                 secrets.token_urlsafe(24): sim_run(budget_usd=0.5)})
    app = mcp_http_app(keys, max_request_body_size=64 * 1024)
    with serve_in_thread(app) as url:
        yield f"{url}/mcp", keys
    for run in keys.runs.values():
        run.close()


@contextlib.asynccontextmanager
async def http_client(url: str, key: str | None) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP, sending ``key`` as the bearer token."""
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def test_http_lists_the_tools_and_plays_an_episode(served):
    url, keys = served
    key, run = next(iter(keys.runs.items()))

    async def session() -> dict[str, Any]:
        async with http_client(url, key) as client:
            await assert_tool_listing(client)
            return await play_episode(client)

    done = anyio.run(session)
    assert run.done and run.observation()["end"]["normalized_gain"] == done["reward"]
    assert set(keys.lookups) == {key} and len(keys.lookups) > 10  # the key was checked on every request


def contains(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, kind):
        return True
    return isinstance(exc, BaseExceptionGroup) and any(contains(e, kind) for e in exc.exceptions)


def test_http_refuses_every_request_without_a_valid_run_key(served):
    url, keys = served
    real_key = next(iter(keys.runs))
    before = {k: (len(audit_of(r)), r.observation()["budget_left_usd"]) for k, r in keys.runs.items()}
    attempts = {
        "no header": None, "wrong key": "not-a-run-key", "a key's prefix": real_key[:-1],
        "a key with a suffix": real_key + "x", "over-long key": "k" * 5000,
    }

    async def attempt(key: str | None) -> BaseException:
        try:
            async with http_client(url, key) as client:
                await client.call_tool("submit", {})
        except BaseException as exc:  # the SDK raises inside its task groups
            return exc
        raise AssertionError(f"a request with key {key!r:.20} was served")

    for label, key in attempts.items():
        assert contains(anyio.run(attempt, key), MCPError), label
    for scheme in (f"Basic {real_key}", f"bearer{real_key}", "Bearer", real_key):
        response = httpx2.post(url, headers={"Authorization": scheme}, json={})
        assert response.status_code == 401, scheme
        assert response.json()["error"] == "invalid_token"
        assert response.headers["www-authenticate"].startswith("Bearer ")
    # the key store failing is a 503, not a crash, and not a pass
    down = httpx2.post(url, headers={"Authorization": "Bearer explode"}, json={})
    assert down.status_code == 503 and down.json()["error"] == "temporarily_unavailable"
    assert "k" * 5000 not in keys.lookups  # an over-long token is refused before the lookup
    # nothing reached a run: no audit record, no money, and the server still serves a good key
    after = {k: (len(audit_of(r)), r.observation()["budget_left_usd"]) for k, r in keys.runs.items()}
    assert after == before

    async def still_serving() -> bool:
        async with http_client(url, real_key) as client:
            return (await client.call_tool("read", {"ref": "budget"})).is_error

    assert anyio.run(still_serving) is False


BAD_CALLS = [
    ("evaluate", {"k": "two"}, "invalid_args"),
    ("evaluate", {"k": 99}, "invalid_args"),
    ("evaluate", {"k": 1, "admin": True}, "invalid_args"),
    ("generate_data", {"teacher": "claude-opus-5"}, "invalid_args"),
    ("read", {"ref": ["job-1"]}, "invalid_args"),
    ("fly", {"to": "the moon"}, "unknown_tool"),
    ("read", {"ref": "job-999"}, "unknown_ref"),
    ("generate_data", {"teacher": "claude-opus-5", "n_examples": 20000}, "insufficient_budget"),
]


def test_http_refusals_are_error_results_with_their_code_and_cost_nothing(served):
    url, keys = served
    key, run = [(k, r) for k, r in keys.runs.items() if r.env.scenario.budget_usd == 0.5][0]

    async def session() -> list[Any]:
        async with http_client(url, key) as client:
            return [await client.call_tool(tool, args) for tool, args, _ in BAD_CALLS]

    results = anyio.run(session)
    for (tool, args, code), result in zip(BAD_CALLS, results):
        assert result.is_error, (tool, args)
        assert result.structured_content["error"] == code, (tool, args, result.structured_content)
        assert result.structured_content["cost_usd"] == 0 and f"ERROR {code}" in result.content[0].text
    assert run.observation()["budget_left_usd"] == 0.5
    refused = [e for e in audit_of(run) if e["decision"] == "refused"]
    assert [e["code"] for e in refused] == [code for _, _, code in BAD_CALLS]  # every refusal audited


def test_http_body_over_the_limit_is_refused_before_it_reaches_the_run(served):
    url, keys = served
    key, run = next(iter(keys.runs.items()))

    async def session() -> tuple[BaseException | None, bool]:
        async with http_client(url, key) as client:
            error = None
            try:
                await client.call_tool("infer", {"prompt": "x" * 200_000})
            except BaseException as exc:
                error = exc
            return error, (await client.call_tool("read", {"ref": "budget"})).is_error

    error, read_refused = anyio.run(session)
    assert error is not None and not read_refused
    assert [e["tool"] for e in audit_of(run)] == ["read"]  # the oversized call never reached the run


def test_http_runs_of_different_keys_cannot_read_each_others_artifacts(served):
    url, keys = served
    (key_a, run_a), (key_b, run_b) = list(keys.runs.items())[:2]
    secret = f"SECRET-{secrets.token_hex(8)}"
    leaked: dict[str, str] = {}
    a_done = anyio.Event()

    async def researcher_a() -> None:
        async with http_client(url, key_a) as client:
            edit = await client.call_tool("edit_harness", {"path": "notes.md", "content": secret})
            leaked["version"] = edit.structured_content["result"]["version"]
            leaked["job"] = (await client.call_tool("evaluate", {"k": 1})).structured_content["result"]["job"]
            await client.call_tool("wait", {})
            a_done.set()

    async def researcher_b() -> list[Any]:
        async with http_client(url, key_b) as client:
            await client.call_tool("read", {"ref": "artifacts"})  # both sessions open at once
            await a_done.wait()
            return [await client.call_tool("read", {"ref": ref}) for ref in (
                f"harness:{leaked['version']}/notes.md", f"harness:{leaked['version']}", leaked["job"], "artifacts", "jobs")]

    async def both() -> list[Any]:
        out: list[Any] = []
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(researcher_a)
                tg.start_soon(researcher_b_into, out)
        return out

    async def researcher_b_into(out: list[Any]) -> None:
        out.extend(await researcher_b())

    stolen_file, stolen_version, stolen_job, artifacts, jobs = anyio.run(both)
    for result in (stolen_file, stolen_version, stolen_job):
        assert result.is_error and result.structured_content["error"] == "unknown_ref"
    for result in (stolen_file, stolen_version, stolen_job, artifacts, jobs):
        assert secret not in json.dumps(result.structured_content), result.structured_content
    for result in (artifacts, jobs):  # B's listings know nothing of A's version or job
        assert not result.is_error and leaked["version"] not in json.dumps(result.structured_content)
        assert "evaluate" not in result.content[0].text.split("\n", 1)[1]
    assert secret in json.dumps(run_a.call("read", {"ref": f"harness:{leaked['version']}/notes.md"}).model_dump())
    assert all(e["key"] != audit_of(run_a)[0]["key"] for e in audit_of(run_b))


def test_http_app_refuses_requests_until_started(served):
    url, keys = served
    app = mcp_http_app(keys)
    response = TestClient(app).post("/mcp", headers={"Authorization": f"Bearer {next(iter(keys.runs))}"}, json={})
    assert response.status_code == 503 and response.json()["error"] == "not_started"
    with pytest.raises(ValueError):
        build_mcp_server(progress_interval_s=1.0)  # neither a run nor a way to find one


def test_an_unreachable_run_is_an_error_result_not_a_crash():
    from rsigym_env.gateway.remote import RemoteRun

    with socket.socket() as sock:  # a port that was just freed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    run = RemoteRun(dead, "rsr_key", timeout_s=2)

    async def session() -> tuple[Any, BaseException | None, Any]:
        async with Client(build_mcp_server(run)) as client:
            first = await client.call_tool("evaluate", {"k": 1})
            try:
                await client.read_resource(BUDGET_URI)
                error = None
            except MCPError as exc:
                error = exc
            return first, error, await client.call_tool("submit", {})

    try:
        first, error, again = anyio.run(session)
    finally:
        run.close()
    assert first.is_error and first.structured_content["error"] == "service_unreachable"
    assert isinstance(error, MCPError) and "run unavailable" in str(error)
    assert again.is_error  # the server is still answering


# ------------------------------------------------------------------------------------------------ progress


class SlowWaits:
    """A real run whose ``wait`` takes ``seconds`` of wall time, as the local world's waits do."""

    def __init__(self, run: LocalRun, seconds: float):
        self.run, self.seconds = run, seconds

    def call(self, tool: str, args: dict[str, Any] | None = None) -> ToolReply:
        if tool == "wait":
            time.sleep(self.seconds)
        return self.run.call(tool, args)

    def observation(self) -> dict[str, Any]:
        return self.run.observation()

    def close(self) -> None:
        self.run.close()


def test_a_long_wait_sends_progress_notifications_while_it_runs():
    run = SlowWaits(sim_run(), seconds=0.65)
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    async def session() -> Any:
        async with Client(build_mcp_server(run, progress_interval_s=0.15)) as client:
            await client.call_tool("evaluate", {"k": 1})
            return await client.call_tool("wait", {}, progress_callback=on_progress)

    try:
        result = anyio.run(session)
    finally:
        run.close()
    assert not result.is_error and result.structured_content["events"]
    heartbeats = [(v, m) for v, m in progress if m and "still running" in m]
    assert 3 <= len(heartbeats) <= 5, progress
    values = [v for v, _ in progress]
    assert values == sorted(values) and progress[-1][1] == "wait returned (job-1 finished)"


# ------------------------------------------------------------------------------------------------ an agent framework


def test_openai_agents_sdk_completes_an_episode_through_the_stdio_server(tmp_path):
    """The OpenAI Agents SDK (not written here) gets `rsigym mcp` as its MCP server and a scripted chat model
    served by this package's OpenAI-compatible server; every action it takes is an MCP tool call."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from agents.mcp import MCPServerStdio
    from openai import AsyncOpenAI

    from rsigym_env.platform.ledger import Ledger
    from rsigym_env.serving import Call, ModelRegistry, OpenAIServer, ScriptedChatModel

    set_tracing_disabled(True)
    script = ScriptedChatModel([
        Call("evaluate", {"k": 1}), Call("wait", {}), Call("edit_harness", FIX), Call("evaluate", {"k": 99}),
        Call("evaluate", {"k": 1}), Call("wait", {}), Call("submit", {}), "Submitted the fixed harness.",
    ])
    ledger = tmp_path / "ledger.sqlite"
    params = stdio_server(tmp_path, "--world", "sim", "--benchmark", "aime", "--budget", "50", "--seed", "3",
                          "--ledger", str(ledger))  # seed 3: replies get cut off, so the fix pays (sim result version 5)

    async def episode(base_url: str) -> Any:
        async with AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as openai_client, \
                MCPServerStdio(params=params.model_dump(include={"command", "args", "env", "cwd"}),
                               client_session_timeout_seconds=30, cache_tools_list=True) as server:
            model = OpenAIChatCompletionsModel(model="researcher", openai_client=openai_client)
            agent = Agent(name="researcher", instructions="Improve the target system, then submit.",
                          mcp_servers=[server], model=model)
            return await Runner.run(agent, "Start the research run.", max_turns=12)

    with OpenAIServer(ModelRegistry({"researcher": script})) as chat:
        result = anyio.run(episode, chat.base_url)

    assert result.final_output == "Submitted the fixed harness." and script.remaining == 0
    first = script.requests[0]
    assert first.tool_names == list(TOOL_NAMES)  # the framework offered the model exactly the MCP tools
    answers = [[m for m in r.messages if m.role == "tool"][-1].text for r in script.requests[1:]]
    assert "started as job-1" in answers[0] and "finished: dev score" in answers[1]
    assert "invalid_args" in answers[3]  # the refusal reached the model as the tool's answer
    assert "submitted base + h-" in answers[6] and "normalized gain +0." in answers[6]
    assert verify_audit(ledger).ok
    with Ledger(ledger) as book:
        events = [r.event for r in book.audit_records()]
    assert [e["tool"] for e in events if e["op"] != "settle"] == [
        "evaluate", "wait", "edit_harness", "evaluate", "evaluate", "wait", "official_evaluation", "submit"]
    assert next(e for e in events if e["tool"] == "submit")["decision"] == "allowed"


# ------------------------------------------------------------------------------------------------ in the session service


def test_mounted_in_the_session_service_over_http_and_stdio(tmp_path):
    """The same tools on `rsigym serve`: the HTTP app mounted at /mcp resolving the service's run keys, and
    `rsigym mcp` over stdio driving the same run through RSIGYM_URL and RSIGYM_RUN_KEY."""
    from rsigym_env.gateway.rest import create_app
    from rsigym_env.gateway.service import RunRequest, SessionService

    service = SessionService(tmp_path / "state", admin_token=secrets.token_urlsafe(24))
    try:
        key = service.create_run(RunRequest(world="sim", benchmark="aime", budget_usd=50, seed=0))["run_key"]
        other = service.create_run(RunRequest(world="sim", benchmark="aime", budget_usd=50, seed=0))["run_key"]
        mcp_app = mcp_http_app(service.backend_for_key)
        app = create_app(service, mounts={"/mcp": mcp_app}, lifespan=lambda _: mcp_app.lifespan())
        with serve_in_thread(app) as url:
            async def over_http() -> Any:
                async with http_client(f"{url}/mcp", key) as client:
                    await assert_tool_listing(client)
                    return await client.call_tool("evaluate", {"k": 1})

            started = anyio.run(over_http)
            assert not started.is_error and started.structured_content["result"]["job"] == "job-1"
            env = {k: v for k, v in os.environ.items() if not k.startswith("RSIGYM_")}
            params = StdioServerParameters(command=sys.executable, args=["-m", "rsigym_env.gateway.mcp_server"],
                                           env={**env, "RSIGYM_URL": url, "RSIGYM_RUN_KEY": key}, cwd=str(tmp_path))

            async def over_stdio() -> list[Any]:
                async with Client(params, read_timeout_seconds=30) as client:
                    return [await client.call_tool("wait", {}), await client.call_tool("submit", {})]

            waited, submitted = anyio.run(over_stdio)
            assert "job-1 (evaluate) finished" in waited.structured_content["text"]  # the run HTTP started
            assert submitted.structured_content["done"] and submitted.structured_content["end"]["end_reason"] == "submitted"
            assert service.backend_for_key(other).observation()["step"] == 0  # the other key's run was untouched
    finally:
        service.shutdown()
