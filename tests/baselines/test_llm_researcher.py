"""The LLM researcher, offline: a scripted chat model served over real HTTP on loopback drives
episodes of the sim world through tool calls."""

from __future__ import annotations

import json
import uuid

import gymnasium as gym
import pytest

from rsigym_env.baselines.llm_researcher import (
    NOT_EXECUTED, NUDGE, LLMArgs, LLMResearcher, RequestFailed, _context_error, estimate_tokens,
)
from rsigym_env.episode import run_episode
from rsigym_env.serving import (
    Call, ChatRequest, EchoModel, ModelRegistry, OpenAIServer, ScriptedChatModel, estimate_prompt_tokens,
)

FIX = {"path": "harness.toml", "old": 'on_truncation = "stop"', "new": 'on_truncation = "continue"'}


@pytest.fixture(scope="module")
def server():
    with OpenAIServer(ModelRegistry()) as srv:
        yield srv


@pytest.fixture()
def env():
    e = gym.make("RSIGym/Harness-v0", world="sim", benchmark="aime", budget_usd=500)
    yield e
    e.close()


def serve(server, turns, **kwargs) -> tuple[str, ScriptedChatModel]:
    name = f"scripted-{uuid.uuid4().hex[:8]}"
    model = ScriptedChatModel(turns, **kwargs)
    server.registry.add(name, model)
    return name, model


def researcher(server, model: str, **kwargs) -> LLMResearcher:
    return LLMResearcher(LLMArgs(base_url=server.base_url, api_key="x", model=model, max_retries=0, **kwargs))


def tool_messages(request) -> list:
    return [m for m in request.messages if m.role == "tool"]


def test_episode_end_to_end_with_tool_calls(server, env, tmp_path):
    name, model = serve(server, [
        Call("evaluate", {"k": 1}),
        Call("wait", {}),
        Call("edit_harness", FIX),
        Call("evaluate", {"k": 1}),
        Call("wait", {}),
        Call("submit", {}),
    ])
    transcript = tmp_path / "run" / "transcript.jsonl"
    agent = researcher(server, name, transcript=str(transcript))
    result = run_episode(env, agent, seed=3)  # a system whose replies get cut off: the fix pays

    assert result.terminated and not result.truncated and result.steps == 6
    assert result.info["submitted"]["by"] == "agent" and result.reward > 0
    assert result.info["submitted"]["harness"] != env.unwrapped.run.harness.initial  # the edited harness
    assert model.remaining == 0 and len(model.requests) == 6

    first = model.requests[0]
    assert first.tool_names == ["infer", "edit_harness", "sandbox_exec", "evaluate", "read", "wait", "submit"]
    assert first.tool_choice == "auto" and first.parallel_tool_calls is False and first.seed == 3
    assert [m.role for m in first.messages] == ["system", "user"]
    assert "one tool call per turn" in first.messages[0].text and "held-out" in first.messages[0].text
    assert "AIME" in first.messages[1].text  # the briefing
    # every result came back as the tool message for the call that caused it
    for i in range(1, 6):
        answer = tool_messages(model.requests[i])[-1]
        assert answer.tool_call_id == model.requests[i].messages[-2].tool_calls[0].id
        assert answer.text.startswith(f"[step {i}/")
    assert "finished: dev score" in tool_messages(model.requests[2])[-1].text  # the wait's result

    records = [json.loads(line) for line in transcript.read_text().splitlines()]
    events = [r["event"] for r in records]
    assert events[0] == "reset" and events.count("request") == events.count("response") == 6
    assert events.count("action") == 6
    request = next(r for r in records if r["event"] == "request" and r["step"] == 3)
    assert request["messages"][-1]["role"] == "tool" and request["model"] == name
    response = next(r for r in records if r["event"] == "response" and r["step"] == 3)
    assert response["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "edit_harness"
    assert "api_key" not in records[0]["args"]


def test_malformed_calls_and_chatter_are_survived(server, env):
    name, model = serve(server, [
        Call("read", '{"ref": "budget"'),               # not JSON
        Call("fly", {"to": "the moon"}),                # no such tool
        Call("evaluate", {"k": 99}),                    # invalid arguments
        Call("train", {"dataset": "ds-1"}),             # not allowed on the harness track
        "I think I should evaluate first.",             # no tool call at all
        [Call("read", {"ref": "jobs"}), Call("submit", {})],  # two calls: only the first runs
        Call("submit", ""),                             # empty arguments mean {}
    ])
    agent = researcher(server, name)
    infos: list = []
    result = run_episode(env, agent, seed=1, on_step=lambda n, action, obs, info: infos.append(info))
    assert result.terminated and result.steps == 7 and result.info["submitted"]["by"] == "agent"
    assert [i["tool"] for i in infos[:4]] == ["read", "fly", "evaluate", "train"]  # refusals keep the tool's name
    assert result.info["spend_usd"] == 0.0  # nothing was charged for the refused calls

    errors = [tool_messages(model.requests[i])[-1].text for i in range(1, 5)]
    assert "ERROR malformed_action" in errors[0] and "not valid JSON" in errors[0]
    assert "ERROR unknown_tool" in errors[1]
    assert "ERROR invalid_args" in errors[2]
    assert "ERROR forbidden_tool" in errors[3]
    assert all("$500.00 of $500 left" in e for e in errors)

    nudged = model.requests[5].messages
    assert nudged[-2].role == "assistant" and nudged[-2].text == "I think I should evaluate first."
    assert nudged[-1].role == "user" and nudged[-1].text.startswith(NUDGE) and '"available_usd": 500.0' in nudged[-1].text

    last = model.requests[6].messages
    assert [m.role for m in last[-3:]] == ["assistant", "tool", "tool"]
    assert last[-1].text == NOT_EXECUTED and "job" in last[-2].text
    assert [m.name for m in last[-2:]] == ["read", "submit"]  # tool results carry tool_call_id and name
    # what goes back is what every server takes: string content, strict JSON arguments ({} if unreadable)
    history = model.requests[6].messages
    assert all(isinstance(m.content, str) for m in history)
    assert history[2].tool_calls[0].function.arguments == "{}" and "shows them as {}" in history[3].text


def test_context_policy_bounds_the_messages(server, env):
    steps, keep = 40, 3
    name, model = serve(server, [Call("read", {"ref": "budget"})] * steps + [Call("submit", {})])
    result = run_episode(env, researcher(server, name, keep_turns=keep, summary_lines=10), seed=2)
    assert result.terminated and result.steps == steps + 1

    sizes = [len(r.messages) for r in model.requests]
    assert max(sizes) <= 2 + 1 + 2 * keep
    assert sizes[-1] == 2 + 1 + 2 * keep  # system, briefing, summary, three (assistant, tool) pairs
    last = model.requests[-1].messages
    summary = last[2].text
    assert last[2].role == "user" and summary.startswith(f"Summary of steps 1-{steps - keep}")
    assert "the first 27 steps are omitted" in summary and len(summary.splitlines()) == 11
    assert f"step {steps - keep}: read" in summary and '"available_usd":500.0' in summary
    assert [m.role for m in last[3:]] == ["assistant", "tool"] * keep
    assert tool_messages(model.requests[-1])[-1].text.startswith(f"[step {steps}/")


def test_context_length_exceeded_shrinks_the_window(server, env, tmp_path):
    # the briefing fits, a dozen verbatim exchanges (or, later, a long summary) do not: the researcher
    # halves its verbatim window, then its summary, and retries
    agent = researcher(server, "unused", keep_turns=12)
    agent.reset(*env.reset(seed=3), seed=3)  # no request yet: just the first context
    base = estimate_prompt_tokens(ChatRequest(model="m", messages=agent.context(), tools=agent.tools))
    name, model = serve(server, [Call("read", {"ref": "budget"})] * 20 + [Call("submit", {})], context_length=base + 500)
    transcript = tmp_path / "t.jsonl"
    result = run_episode(env, researcher(server, name, keep_turns=12, transcript=str(transcript)), seed=3)
    assert result.terminated and result.steps == 21
    records = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert any(r["event"] == "error" and r["code"] == "context_length_exceeded" for r in records)
    requests = [r for r in records if r["event"] == "request"]
    assert min(r["keep_turns"] for r in requests) == 0 and min(r["summary_lines"] for r in requests) < 200
    assert max(estimate_prompt_tokens(r) for r in model.requests) <= base + 500  # what got through fits


def test_configuration_from_environment_variables(server, env, monkeypatch):
    name, model = serve(server, [Call("submit", {})])
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    monkeypatch.setenv("RSIGYM_LLM_MODEL", name)
    result = run_episode(env, LLMResearcher(), seed=0)
    assert result.terminated and len(model.requests) == 1

    monkeypatch.delenv("RSIGYM_LLM_MODEL")
    with pytest.raises(ValueError, match="RSIGYM_LLM_MODEL"):
        run_episode(env, LLMResearcher(), seed=0)


def test_text_only_model_cannot_stall_the_run():
    # a model that never calls a tool: every reply is a free read, and the step limit ends the episode
    env = gym.make("RSIGym/Harness-v0", world="sim", benchmark="aime", budget_usd=500, max_steps=5)
    with OpenAIServer({"echo": EchoModel()}) as srv:
        result = run_episode(env, researcher(srv, "echo"), seed=0)
    assert result.truncated and result.steps == 5 and result.reward == 0.0
    assert result.info["spend_usd"] == 0.0


@pytest.mark.parametrize("status, body, expected", [
    (400, {"message": "This model's maximum context length is 2048 tokens. However, you requested 2733 tokens "
                      "(2733 in the messages, 0 in the completion).", "code": "context_length_exceeded"},
     (2048, 2733)),                                                                   # OpenAI, llama-cpp-python
    (400, {"object": "error", "message": "This model's maximum context length is 4096 tokens. However, you "
                                         "requested 5000 tokens (4800 in the messages, 200 in the completion).",
           "type": "BadRequestError", "code": 400}, (4096, 4800)),                    # vLLM
    (400, {"message": "The input (5000 tokens) is longer than the model's context length (4096 tokens)."},
     (4096, 5000)),                                                                   # SGLang
    (400, {"code": 400, "message": "the request exceeds the available context size, try increasing it",
           "type": "exceed_context_size_error", "n_prompt_tokens": 2733, "n_ctx": 2048}, (2048, 2733)),  # llama.cpp
    (400, {"message": "Trying to keep the first 2733 tokens when context the overflows. However, the model is "
                      "loaded with context length of only 2048 tokens, which is not enough."}, (2048, None)),  # LM Studio
    (400, {"message": "litellm.ContextWindowExceededError: prompt is too long"}, (None, None)),  # LiteLLM
    (500, {"message": "llama_decode failed: the KV cache is full"}, None),            # transient, not a context error
    (400, {"message": "Invalid 'messages[1].tool_calls': empty array."}, None),
])
def test_context_length_errors_of_every_server_are_recognised(status, body, expected):
    failure = RequestFailed("http", body["message"], status=status, code=str(body.get("code") or "") or None, body=body)
    assert _context_error(failure) == expected


def test_the_fixed_prompt_estimate_counts_the_tool_schemas(server, env):
    agent = researcher(server, "unused")
    agent.reset(*env.reset(seed=0), seed=0)
    assert agent.fixed_tokens == estimate_tokens(agent.fixed, agent.tools) > estimate_tokens(agent.fixed)
    assert all(node.get("maxLength", 0) <= 1000 for t in agent.tools
               for node in t["function"]["parameters"]["properties"].values())  # the schemas' default cap
