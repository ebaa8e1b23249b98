"""The OpenAI-compatible server, exercised through the official ``openai`` client (raw httpx only for
bodies the client cannot send)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from openai import OpenAI

import rsigym_env
from rsigym_env.serving import (
    Call, ChatChoice, ChatRequest, EchoModel, ModelRegistry, OpenAIServer, ScriptedChatModel, estimate_prompt_tokens,
    estimate_tokens,
)

USER = [{"role": "user", "content": "hello there, model"}]
TOOLS = rsigym_env.tool_schemas(["read", "wait", "submit"])


class Boom:
    def complete(self, request):
        raise RuntimeError("kaboom")


class Garbage:
    def complete(self, request):
        return [{"finish_reason": "exploded"}]


@pytest.fixture(scope="module")
def server():
    registry = ModelRegistry({"echo": EchoModel(), "boom": Boom(), "garbage": Garbage(),
                              "small": EchoModel(context_length=40), "slow": EchoModel(delay_s=0.6)})
    with OpenAIServer(registry) as srv:
        yield srv


@pytest.fixture()
def client(server):
    c = OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=10)
    yield c
    c.close()


def scripted(server, turns, name="scripted", **kwargs) -> ScriptedChatModel:
    model = ScriptedChatModel(turns, **kwargs)
    server.registry.add(name, model, replace=True)
    return model


# ------------------------------------------------------------------ lifecycle and models


def test_base_url_free_port_and_stop():
    srv = OpenAIServer({"echo": EchoModel()}).start()
    try:
        assert srv.port and srv.port > 0 and srv.running
        assert srv.base_url == f"http://127.0.0.1:{srv.port}/v1"
        assert httpx.get(f"{srv.url}/health").json()["status"] == "ok"
        with OpenAIServer({"echo": EchoModel()}) as other:  # two servers side by side
            assert other.port != srv.port
    finally:
        srv.stop()
    srv.stop()  # twice is fine
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{srv.port}/health", timeout=2)


def test_models_list_retrieve_and_live_registry(server, client):
    ids = [m.id for m in client.models.list()]
    assert {"echo", "boom", "small"} <= set(ids)
    assert client.models.retrieve("echo").object == "model"

    server.registry.add("ckpt-7", EchoModel(prefix="7: "), owned_by="local-world")
    try:
        assert "ckpt-7" in [m.id for m in client.models.list()]
        assert client.models.retrieve("ckpt-7").owned_by == "local-world"
        reply = client.chat.completions.create(model="ckpt-7", messages=USER)
        assert reply.choices[0].message.content == "7: hello there, model"
    finally:
        server.registry.remove("ckpt-7")
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="ckpt-7", messages=USER)
    assert err.value.code == "model_not_found" and err.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("ckpt-7")


def test_registry_refuses_duplicates_and_non_models():
    registry = ModelRegistry({"a": EchoModel()})
    with pytest.raises(ValueError):
        registry.add("a", EchoModel())
    with pytest.raises(TypeError):
        registry.add("b", object())  # type: ignore[arg-type]
    with pytest.raises(KeyError):
        registry.remove("nope")


# ------------------------------------------------------------------ completions


def test_completion_text_usage_and_shape(client):
    reply = client.chat.completions.create(model="echo", messages=USER)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-") and reply.model == "echo"
    choice = reply.choices[0]
    assert choice.index == 0 and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content == "hello there, model"
    assert choice.message.tool_calls is None
    prompt = estimate_prompt_tokens(ChatRequest(model="echo", messages=USER))
    assert reply.usage.prompt_tokens == prompt
    assert reply.usage.completion_tokens == estimate_tokens("hello there, model") == 4
    assert reply.usage.total_tokens == prompt + 4


def test_n_choices_and_usage(client):
    reply = client.chat.completions.create(model="echo", messages=USER, n=3)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage.completion_tokens == 3 * 4  # prompt counted once, completions summed


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_length_finish_reason(client, field):
    reply = client.chat.completions.create(model="echo", messages=USER, **{field: 2})
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content == "hello there"
    assert reply.usage.completion_tokens == 2


def test_stop_sequences(client):
    reply = client.chat.completions.create(model="echo", messages=USER, stop=[", m", "zzz"])
    assert reply.choices[0].message.content == "hello there"
    assert reply.choices[0].finish_reason == "stop"


def test_tool_calls_round_trip_and_what_the_model_was_sent(server, client):
    model = scripted(server, [
        Call("read", {"ref": "budget"}),
        Call("submit", '{"checkpoint": "base"'),  # malformed on purpose: passed through verbatim
        "all done",
    ])
    first = client.chat.completions.create(
        model="scripted", messages=USER, tools=TOOLS, tool_choice="auto", temperature=0.3, top_p=0.9, seed=7,
        stop=["\n\n"], parallel_tool_calls=False, max_completion_tokens=100)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "read" and call.id
    assert json.loads(call.function.arguments) == {"ref": "budget"}

    history = USER + [choice.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": call.id, "content": "budget: $500"}]
    second = client.chat.completions.create(model="scripted", messages=history, tools=TOOLS,
                                            tool_choice={"type": "function", "function": {"name": "submit"}})
    assert second.choices[0].message.tool_calls[0].function.arguments == '{"checkpoint": "base"'
    third = client.chat.completions.create(model="scripted", messages=history, tools=TOOLS, tool_choice="none")
    assert third.choices[0].message.content == "all done" and third.choices[0].finish_reason == "stop"

    sent = model.requests[0]
    assert sent.tool_names == ["read", "wait", "submit"] and sent.tool_choice == "auto"
    assert (sent.temperature, sent.top_p, sent.seed, sent.stop, sent.parallel_tool_calls) == (0.3, 0.9, 7, ["\n\n"], False)
    assert sent.completion_limit == 100
    assert [m.role for m in model.requests[1].messages] == ["user", "assistant", "tool"]
    assert model.requests[1].messages[2].tool_call_id == call.id
    assert model.requests[1].tool_choice.function.name == "submit"
    assert model.remaining == 0


def test_parallel_tool_calls_and_n(server, client):
    scripted(server, [[Call("read", {"ref": "jobs"}), Call("wait", {})]])
    reply = client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS, n=2)
    assert len(reply.choices) == 2
    for choice in reply.choices:
        assert [c.function.name for c in choice.message.tool_calls] == ["read", "wait"]
    ids = [c.id for ch in reply.choices for c in ch.message.tool_calls]
    assert len(set(ids)) == 4


# ------------------------------------------------------------------ streaming


def test_streaming_text_with_usage(client):
    text = "one two three four five six seven"
    chunks = list(client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": text}], stream=True,
        stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len(chunks) > 4  # really streamed in pieces
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 7
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_without_usage_and_length(client):
    chunks = list(client.chat.completions.create(model="echo", messages=USER, stream=True, max_tokens=1))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hello"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_streaming_tool_calls_accumulate_in_the_sdk(server, client):
    arguments = {"ref": "harness:latest/harness.toml", "note": "a fairly long argument to split in pieces"}
    scripted(server, [[Call("read", arguments), Call("wait", '{"job": ')]] * 2)
    with client.chat.completions.stream(model="scripted", messages=USER, tools=TOOLS) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["read", "wait"]
    assert json.loads(calls[0].function.arguments) == arguments
    assert calls[1].function.arguments == '{"job": '
    assert final.choices[0].finish_reason == "tool_calls"

    # the raw chunks, two choices interleaved by index
    chunks = list(client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS, stream=True, n=2))
    for index in (0, 1):
        deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].index == index]
        args = "".join(t.function.arguments or "" for d in deltas for t in d.tool_calls or [] if t.index == 0)
        assert json.loads(args) == arguments
        assert sum(1 for d in deltas for t in d.tool_calls or [] if t.id) == 2  # ids once per call


# ------------------------------------------------------------------ errors


def test_unknown_model(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-nope", messages=USER)
    assert err.value.status_code == 404 and err.value.code == "model_not_found"
    assert set(err.value.body) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", "{\"model\": \"echo\", \"messages\": \"hi\"}".encode()])
def test_malformed_bodies(server, body):
    response = httpx.post(f"{server.base_url}/chat/completions", content=body,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


BAD_MESSAGES = {
    "unknown role": ([{"role": "robot", "content": "hi"}], "messages[0].role"),
    "user without content": ([{"role": "user"}], "messages[0]"),
    "tool without call": ([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c1", "content": "x"}], "messages[1]"),
    "unanswered call": ([{"role": "user", "content": "hi"},
                         {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                               "function": {"name": "wait", "arguments": "{}"}}]},
                         {"role": "user", "content": "and?"}], "messages[2]"),
    "empty list": ([], "messages"),
    "image part": ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0]"),
}


@pytest.mark.parametrize("case", list(BAD_MESSAGES))
def test_invalid_messages(client, case):
    messages, param = BAD_MESSAGES[case]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="echo", messages=messages)
    assert err.value.status_code == 400
    if param:
        assert err.value.param == param


BAD_PARAMS = {
    "temperature": {"temperature": 3.0},
    "top_p": {"top_p": 1.5},
    "n": {"n": 0},
    "max_tokens": {"max_tokens": 0},
    "stop": {"stop": ["a", "b", "c", "d", "e"]},
    "tool_choice": {"tool_choice": "auto"},  # without tools
    "stream_options": {"stream_options": {"include_usage": True}},  # without stream
}


@pytest.mark.parametrize("name", list(BAD_PARAMS))
def test_bad_parameter_values(client, name):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="echo", messages=USER, **BAD_PARAMS[name])
    assert err.value.status_code == 400 and err.value.param == name
    assert name in err.value.message


def test_named_tool_choice_must_exist(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="echo", messages=USER, tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "fly"}})


def test_context_length_exceeded(client):
    assert client.chat.completions.create(model="small", messages=USER).choices[0].message.content
    long = [{"role": "user", "content": "word " * 100}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="small", messages=long)
    assert err.value.code == "context_length_exceeded" and "maximum context length is 40" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:  # the prompt fits, prompt + completion does not
        client.chat.completions.create(model="small", messages=USER, max_tokens=1000)
    assert err.value.code == "context_length_exceeded"


@pytest.mark.parametrize("name", ["boom", "garbage"])
def test_failing_model_gives_500_and_the_server_survives(client, name):
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model=name, messages=USER)
    assert err.value.status_code == 500 and err.value.code == "model_error"
    assert client.chat.completions.create(model="echo", messages=USER).choices[0].message.content


def test_scripted_check_and_exhaustion_are_500s(server, client):
    def no_tools(request):
        assert not request.tools, "tools were sent"

    model = scripted(server, ["ok"], check=no_tools)
    with pytest.raises(openai.InternalServerError, match="tools were sent"):
        client.chat.completions.create(model="scripted", messages=USER, tools=TOOLS)
    assert client.chat.completions.create(model="scripted", messages=USER).choices[0].message.content == "ok"
    with pytest.raises(openai.InternalServerError, match="ScriptExhausted"):
        client.chat.completions.create(model="scripted", messages=USER)
    assert len(model.requests) == 3


def test_unknown_route_and_method_are_in_openai_shape(server):
    response = httpx.get(f"{server.base_url}/nothing")
    assert response.status_code == 404 and set(response.json()["error"]) == {"message", "type", "param", "code"}
    response = httpx.get(f"{server.base_url}/chat/completions")
    assert response.status_code == 405 and "error" in response.json()


def test_slow_model_does_not_block_others(client):
    result = {}
    slow = threading.Thread(target=lambda: result.setdefault(
        "slow", client.chat.completions.create(model="slow", messages=USER)))
    slow.start()
    time.sleep(0.05)
    start = time.perf_counter()
    client.chat.completions.create(model="echo", messages=USER)
    assert time.perf_counter() - start < 0.4
    slow.join()
    assert result["slow"].choices[0].message.content == "hello there, model"


def test_model_timeout_gives_504():
    with OpenAIServer({"slow": EchoModel(delay_s=0.5), "echo": EchoModel()}, model_timeout_s=0.1) as srv:
        c = OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            c.chat.completions.create(model="slow", messages=USER)
        assert err.value.status_code == 504 and err.value.code == "model_timeout"
        assert c.chat.completions.create(model="echo", messages=USER).choices[0].message.content


def test_models_may_report_their_own_token_counts(server, client):
    class Counted:
        def count_prompt_tokens(self, request):
            return 11

        def complete(self, request):
            return [ChatChoice(content="hi", completion_tokens=5)]

    server.registry.add("counted", Counted(), replace=True)
    usage = client.chat.completions.create(model="counted", messages=USER).usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (11, 5, 16)


# ------------------------------------------------------------------ by hand


def test_command_line_server(tmp_path):
    script = tmp_path / "turns.jsonl"
    script.write_text('{"tool": "wait", "arguments": {}}\n{"say": "bye"}\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "rsigym_env.serving.openai_server", "--port", "0", "--scripted", str(script),
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONWARNINGS": "error::RuntimeWarning"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving echo, scripted at http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        base_url = line.split(" at ")[1].split()[0]
        c = OpenAI(base_url=base_url, api_key="x", max_retries=0)
        assert c.chat.completions.create(model="scripted", messages=USER).choices[0].message.tool_calls[0].function.name == "wait"
        assert c.chat.completions.create(model="scripted", messages=USER).choices[0].message.content == "bye"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    assert "Traceback" not in proc.stderr.read()
