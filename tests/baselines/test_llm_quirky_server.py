"""The ``llm`` researcher against a server with the quirks of the servers people run.

:class:`Quirks` is ASGI middleware in front of the project's own OpenAI-compatible app
(:func:`rsigym_env.serving.openai_server.create_app` serving a :class:`ScriptedChatModel`), served over
real HTTP on loopback by :class:`ThreadedASGIServer`. It answers as real servers do:

* HTTP 500 when a message has ``"content": null`` (llama-cpp-python's chat templates concatenate it;
  Ollama answers 400 "invalid message content type: <nil>");
* HTTP 400 when a message has ``"tool_calls": []`` (the OpenAI API: "empty array");
* HTTP 500 when an earlier tool call's ``arguments`` are not strict JSON (llama.cpp parses them again
  with nlohmann::json);
* HTTP 400 when a tool message has no ``name`` (Gemini's OpenAI-compatible endpoint);
* HTTP 500 when a tool schema has a ``maxLength`` over 1,000 (llama.cpp's grammar compiler);
* one transient HTTP 500 on the Nth request;

and the scripted model writes its tool-call arguments as models do: raw newlines inside JSON strings,
JSON in a markdown fence.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any

import gymnasium as gym
import pytest
from starlette.responses import JSONResponse

from rsigym_env.baselines.llm_researcher import LLMArgs, LLMResearcher
from rsigym_env.episode import run_episode
from rsigym_env.serving import Call, ModelRegistry, ScriptedChatModel
from rsigym_env.serving.asgi import ThreadedASGIServer
from rsigym_env.serving.openai_server import create_app

HARNESS_TOML = """\
# Minimal harness, edited: continue cut-off replies, verify before submitting.
[generation]
max_output_tokens = 4096
on_truncation = "continue"
[completion]
verify_before_submit = true
[shell]
persistent = false
[loop]
detect = false
[edits]
check = false
"""
# the arguments as a model writes them: the file's newlines raw inside the JSON string (not JSON)
RAW_EDIT = '{"path": "harness.toml", "content": "' + HARNESS_TOML.replace('"', '\\"') + '"}'
FENCED = '```json\n{"k": 1}\n```'


def _walk(value: Any):
    yield value
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        yield from _walk(child)


class Quirks:
    """ASGI middleware that refuses chat completion requests as real servers do (see the module docstring)."""

    def __init__(self, app: Any, *, schema_max_length: int | None = 1000, transient_at: tuple[int, ...] = (),
                 require_tool_name: bool = True):
        self.app = app
        self.schema_max_length = schema_max_length
        self.transient_at = set(transient_at)
        self.require_tool_name = require_tool_name
        self.requests = 0
        self.refused: list[tuple[int, int, str]] = []  # (request number, status, quirk)
        self.bodies: list[dict[str, Any]] = []

    def problem(self, n: int, body: dict[str, Any]) -> tuple[int, str, str] | None:
        for i, message in enumerate(body.get("messages", [])):
            if "content" in message and message["content"] is None:
                return 500, "null_content", "TypeError: can only concatenate str (not \"NoneType\") to str"
            if message.get("tool_calls") == []:
                return 400, "empty_tool_calls", (f"Invalid 'messages[{i}].tool_calls': empty array. Expected an "
                                                 "array with minimum length 1, but got an empty array instead.")
            for call in message.get("tool_calls") or []:
                try:
                    json.loads(call["function"]["arguments"])
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    return 500, "history_arguments", f"[json.exception.parse_error.101] parse error: {exc}"
            if message.get("role") == "tool" and self.require_tool_name and not message.get("name"):
                return 400, "tool_name", f"* GenerateContentRequest.contents[{i}].parts[0].function_response.name: Name cannot be empty."
        if self.schema_max_length is not None:
            for node in _walk(body.get("tools") or []):
                if isinstance(node, dict) and isinstance(node.get("maxLength"), int) \
                        and node["maxLength"] > self.schema_max_length:
                    return 500, "schema", ("failed to parse grammar: number of repetitions exceeds sane defaults, "
                                           f"please reduce the number of repetitions ({node['maxLength']})")
        if n in self.transient_at:
            self.transient_at.discard(n)
            return 500, "transient", "llama_decode failed: the KV cache is full, try again"
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        self.requests += 1
        body = json.loads(raw)
        self.bodies.append(body)
        problem = self.problem(self.requests, body)
        if problem is not None:
            status, quirk, text = problem
            self.refused.append((self.requests, status, quirk))
            kind = "server_error" if status >= 500 else "invalid_request_error"
            await JSONResponse({"error": {"code": status, "message": text, "type": kind}}, status_code=status)(
                scope, receive, send)
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class QuirkyServer:
    """A scripted model behind :class:`Quirks`, on loopback; ``base_url`` for the researcher."""

    def __init__(self, turns: list[Any], **quirks: Any):
        self.name = f"quirky-{uuid.uuid4().hex[:6]}"
        context_length = quirks.pop("context_length", None)
        self.model = ScriptedChatModel(turns, context_length=context_length)
        self.quirks = Quirks(create_app(ModelRegistry({self.name: self.model})), **quirks)
        self.http = ThreadedASGIServer(self.quirks, name="quirky")

    @property
    def base_url(self) -> str:
        return f"{self.http.url}/v1"

    def __enter__(self) -> "QuirkyServer":
        self.http.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.stop()


def make_env(**kwargs: Any) -> gym.Env:
    return gym.make("RSIGym/Harness-v0", world="sim", benchmark="aime", budget_usd=500, **kwargs)


def fast(**kwargs: Any) -> dict[str, Any]:
    """Retries that take milliseconds, not seconds."""
    return {"max_retries": 3, "retry_initial_s": 0.01, "retry_max_s": 0.05, "retry_budget_s": 1.0} | kwargs


def records(path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_episode_plays_to_submit_against_a_quirky_server(tmp_path):
    turns = [
        Call("evaluate", {"k": 1}),
        Call("wait", {}),
        Call("edit_harness", RAW_EDIT),      # raw newlines inside the JSON string
        Call("evaluate", FENCED),            # JSON in a markdown fence
        Call("wait", {}),
        Call("submit", {}),
    ]
    transcript = tmp_path / "transcript.jsonl"
    env = make_env()
    steps: list[tuple[Any, dict[str, Any]]] = []
    with QuirkyServer(turns, transient_at=(3,)) as server:
        researcher = LLMResearcher(LLMArgs(base_url=server.base_url, api_key="x", model=server.name,
                                           transcript=str(transcript), **fast()))
        result = run_episode(env, researcher, seed=3, on_step=lambda n, a, o, info: steps.append((a, info)))  # truncation: the fix pays
    initial = env.unwrapped.run.harness.initial
    edited = env.unwrapped.run.harness.files(env.unwrapped.run.harness.latest)["harness.toml"]
    env.close()

    assert result.terminated and result.steps == 6 and researcher.stop_reason is None
    assert result.info["submitted"]["by"] == "agent" and result.info["submitted"]["harness"] != initial
    assert result.reward > 0
    assert all(info["ok"] for _, info in steps), [info.get("message") for _, info in steps]
    assert steps[2][0] == {"tool": "edit_harness", "args": {"path": "harness.toml", "content": HARNESS_TOML}}
    assert edited == HARNESS_TOML and steps[3][0] == {"tool": "evaluate", "args": {"k": 1}}

    # one transient 500, retried; every other request passed every quirk
    assert server.quirks.refused == [(3, 500, "transient")] and server.quirks.requests == 7
    assert server.model.remaining == 0
    last = server.quirks.bodies[-1]["messages"]
    assistants = [m for m in last if m["role"] == "assistant"]
    assert assistants and all(m["content"] == "" and m["tool_calls"] for m in assistants)
    assert all(m["name"] for m in last if m["role"] == "tool")
    edit = next(m for m in last if m["role"] == "assistant" and m["tool_calls"][0]["function"]["name"] == "edit_harness")
    assert json.loads(edit["tool_calls"][0]["function"]["arguments"])["content"] == HARNESS_TOML  # strict JSON now
    assert all(node.get("maxLength", 0) <= 1000 for node in _walk(last) if isinstance(node, dict))

    log = records(transcript)
    errors = [r for r in log if r["event"] == "error"]
    assert len(errors) == 1
    error = errors[0]
    assert error["step"] == 3 and error["status"] == 500 and error["attempt"] == 1 and error["transient"]
    assert "KV cache is full" in error["message"] and error["retry_in_s"] is not None
    assert [r["event"] for r in log].count("response") == 6 and not any(r["event"] == "stop" for r in log)
    raw = next(r for r in log if r["event"] == "response" and r["step"] == 3)
    assert raw["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == RAW_EDIT  # as sent


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AlwaysDown:
    """An endpoint that answers every request 503 (with a Retry-After the researcher must cap)."""

    def __init__(self):
        self.requests = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.requests += 1
        await JSONResponse({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
                           status_code=503, headers={"Retry-After": "120"})(scope, receive, send)


@pytest.mark.parametrize("down", ["connection_refused", "always_503", "oversized_schemas"])
def test_an_endpoint_that_stays_down_ends_the_episode_cleanly(down, tmp_path):
    transcript = tmp_path / "transcript.jsonl"
    env = make_env()
    stack: Any = None
    if down == "connection_refused":
        base_url = f"http://127.0.0.1:{_closed_port()}/v1"
    elif down == "always_503":
        stack = ThreadedASGIServer(AlwaysDown(), name="down").start()
        base_url = f"{stack.url}/v1"
    else:  # the schemas as the tools' own limits (200,000 characters): llama.cpp cannot compile them, every time
        stack = QuirkyServer([Call("submit", {})]).__enter__()
        base_url = stack.base_url
    args = LLMArgs(base_url=base_url, api_key="x", model="m", transcript=str(transcript),
                   **fast(schema_max_length=None if down == "oversized_schemas" else "default"))
    researcher = LLMResearcher(args)
    started = time.monotonic()
    try:
        result = run_episode(env, researcher, seed=0)  # no exception escapes
    finally:
        if isinstance(stack, QuirkyServer):
            stack.__exit__()
        elif stack is not None:
            stack.stop()
    took = time.monotonic() - started
    initial = env.unwrapped.run.harness.initial
    env.close()

    assert took < 30
    assert result.terminated and result.steps == 1 and result.reward == 0.0
    assert result.info["submitted"] == {"checkpoint": "base", "harness": initial, "by": "agent"}
    assert result.info["spend_usd"] == 0.0
    reason = researcher.stop_reason
    assert reason is not None and reason.startswith("llm_unavailable: ") and "after 4 attempts" in reason
    expected = {"connection_refused": "connection", "always_503": "HTTP 503", "oversized_schemas": "HTTP 500"}[down]
    assert expected in reason, reason
    log = records(transcript)
    errors = [r for r in log if r["event"] == "error"]
    assert [e["attempt"] for e in errors] == [1, 2, 3, 4] and errors[-1]["retry_in_s"] is None
    assert all(e["retry_in_s"] <= 0.05 for e in errors[:-1])  # Retry-After: 120 capped at retry_max_s
    if down != "connection_refused":
        assert all(e["status"] == int(expected[-3:]) and e["message"] for e in errors)
    stops = [r for r in log if r["event"] == "stop"]
    assert len(stops) == 1 and stops[0]["reason"] == reason
    assert log[-1] == {"event": "action", "step": 1, "stopped": reason,
                       "action": {"tool": "submit", "args": {"checkpoint": "base", "harness": initial}}}
    if down == "oversized_schemas":
        assert stack.quirks.refused == [(n, 500, "schema") for n in range(1, 5)]


def test_a_context_too_small_for_the_fixed_prompt_fails_at_once(tmp_path):
    # known beforehand (LLMArgs.context_tokens / $RSIGYM_LLM_CONTEXT): no request is sent at all
    env = make_env()
    with QuirkyServer([Call("submit", {})]) as server:
        transcript = tmp_path / "known.jsonl"
        researcher = LLMResearcher(LLMArgs(base_url=server.base_url, api_key="x", model=server.name,
                                           context_tokens=1024, transcript=str(transcript), **fast()))
        result = run_episode(env, researcher, seed=0)
        assert server.quirks.requests == 0
    fixed = researcher.fixed_tokens
    assert 1024 < fixed < 4000
    reason = researcher.stop_reason
    assert reason.startswith("llm_context_too_small: ") and f"needs ~{fixed:,} tokens" in reason
    assert f"at least {fixed + 512:,} tokens" in reason and "is 1,024 tokens" in reason
    assert result.terminated and result.steps == 1 and result.reward == 0.0
    assert [r["event"] for r in records(transcript)] == ["reset", "stop", "action"]

    # told by the server (a 2,048-token context): one request, no retry, no futile shrinking
    with QuirkyServer([Call("submit", {})], context_length=2048) as server:
        transcript = tmp_path / "told.jsonl"
        researcher = LLMResearcher(LLMArgs(base_url=server.base_url, api_key="x", model=server.name,
                                           transcript=str(transcript), **fast()))
        started = time.monotonic()
        result = run_episode(env, researcher, seed=0)
        assert time.monotonic() - started < 10 and server.quirks.requests == 1
    env.close()
    reason = researcher.stop_reason
    assert reason.startswith("llm_context_too_small: ") and "(the server's count)" in reason, reason
    assert "the server's is 2,048 tokens" in reason and "context_length_exceeded" in reason
    needed = int(reason.split("needs ")[1].split(" tokens")[0].replace(",", ""))
    assert needed > 2048 and f"at least {needed + 512:,} tokens" in reason
    log = records(transcript)
    assert [r["event"] for r in log] == ["reset", "request", "error", "stop", "action"]
    assert log[2]["status"] == 400 and log[2]["retry_in_s"] is None and not log[2]["transient"]
    assert result.terminated and result.steps == 1 and result.info["submitted"]["by"] == "agent"


def test_rsigym_run_with_the_endpoint_down_leaves_a_consistent_run_directory(tmp_path, monkeypatch, capsys):
    import functools

    import rsigym_env.baselines
    from rsigym_env.cli import main
    from rsigym_env.platform import verify_audit

    monkeypatch.setattr(rsigym_env.baselines, "LLMArgs", functools.partial(LLMArgs, **fast()))
    run_dir = tmp_path / "run"
    code = main(["run", "--agent", "llm", "--benchmark", "aime", "--budget", "50", "--run-dir", str(run_dir), "-q",
                 "--llm-base-url", f"http://127.0.0.1:{_closed_port()}/v1", "--llm-model", "m", "--llm-api-key", "x"])
    out = capsys.readouterr()
    assert code == 0 and "Traceback" not in out.out + out.err
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 1 and result["terminated"] and result["reward"] == 0.0
    assert result["info"]["submitted"]["checkpoint"] == "base" and result["info"]["spend_usd"] == 0.0
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 1 and steps[0]["action"]["tool"] == "submit" and steps[0]["info"]["ok"]
    log = records(run_dir / "transcript.jsonl")
    assert [r["event"] for r in log] == ["reset", "request", "error", "error", "error", "error", "stop", "action"]
    assert log[-2]["reason"].startswith("llm_unavailable: connection")
    assert verify_audit(run_dir / "ledger.sqlite").ok
