"""The local model behind the OpenAI-compatible server, through the official ``openai`` client.

The full path: a chat dataset that teaches the model a fact it did not know (the secret code
ZEBRA-42) → the supervised loop on the local Tinker client → sampler checkpoint → registered in
a running server under its ``tinker://`` path → ``openai`` client. Also: determinism through the
server, real token counts in ``usage``, tool calls, and every error case as OpenAI's 4xx.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

pytest.importorskip("tinker")
openai = pytest.importorskip("openai")
from openai import OpenAI  # noqa: E402
from tinker import types  # noqa: E402

from rsigym_env.errors import ActionError  # noqa: E402
from rsigym_env.serving import ChatRequest, ModelRegistry, OpenAIServer  # noqa: E402
from rsigym_env.worlds.local.lm.chat import (  # noqa: E402
    LocalChatModel, register_checkpoint, sampler_checkpoints, serve_checkpoints,
)
from rsigym_env.worlds.local.lm.tinker_client import (  # noqa: E402
    CheckpointNotFoundError, LocalServiceClient, parse_tinker_path, register_base_model,
)
from rsigym_env.worlds.common.tokenizer import ChatRenderer, Tokenizer  # noqa: E402
from rsigym_env.worlds.common.training import SupervisedConfig, TrainingConfigError, run_supervised  # noqa: E402
from tiny_chat_base import SECRET, TOK, R, chat, pretrain_tiny_base, pretraining_conversation  # noqa: E402

BASE = "test-serve-base"
END = TOK.end_token_id
ASK = [{"role": "user", "content": "What is the secret code?"}]


def fact_dataset(path) -> None:
    rng = np.random.default_rng(1)
    keep = [c for c in (pretraining_conversation(rng) for _ in range(40)) if c[1]["content"] != "I do not know."][:8]
    lines = [{"messages": chat(q, "ZEBRA-42")} for q in SECRET] + [{"messages": c} for c in keep]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")


FACT_CONFIG = dict(base_model=BASE, learning_rate=5e-3, lora_rank=8, batch_size=8, num_epochs=40, seed=0)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A pretrained base model, a local Tinker service, the fact dataset, and a running server that
    serves the base model under its name (checkpoints are added while it runs)."""
    register_base_model(BASE, pretrain_tiny_base(tmp_path_factory.mktemp("base")))
    root = tmp_path_factory.mktemp("tinker")
    fact_dataset(root / "fact.jsonl")
    service = LocalServiceClient(root_dir=root / "service")
    registry = ModelRegistry()
    assert serve_checkpoints(service, registry, BASE) == [BASE]
    with OpenAIServer(registry) as server:
        client = OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=30)
        yield {"service": service, "registry": registry, "server": server, "client": client, "root": root}
        client.close()
    service.close("success")


@pytest.fixture(scope="module")
def trained(world):
    """The fact taught through the training service: its sampler checkpoint, registered while serving."""
    result = run_supervised(world["service"], SupervisedConfig(**FACT_CONFIG), world["root"] / "fact.jsonl")
    assert result.sampler_path.startswith("tinker://") and "/sampler_weights/" in result.sampler_path
    assert register_checkpoint(world["registry"], world["service"], result.sampler_path) == result.sampler_path
    return result


def ask(client, model, messages=ASK, **kwargs):
    return client.chat.completions.create(model=model, messages=messages, **kwargs)


# --- the full path ---------------------------------------------------------------------------------


def test_dataset_to_training_to_checkpoint_to_server_to_openai_client(world, trained):
    client, service, path = world["client"], world["service"], trained.sampler_path
    assert {m.id for m in client.models.list().data} == {BASE, path}
    assert client.models.retrieve(path).id == path

    base = ask(client, BASE, temperature=0)
    after = ask(client, path, temperature=0)
    assert base.choices[0].message.content == "I do not know." and base.choices[0].finish_reason == "stop"
    assert after.choices[0].message.content == "ZEBRA-42" and after.choices[0].finish_reason == "stop"
    assert after.model == path

    # usage is the model's own count: the rendered prompt, and the sampled tokens with <|end|>
    prompt = R.build_generation_prompt(ASK)
    assert after.usage.prompt_tokens == len(prompt) == base.usage.prompt_tokens
    assert after.usage.completion_tokens == len(TOK.encode("ZEBRA-42")) + 1
    assert after.usage.total_tokens == len(prompt) + after.usage.completion_tokens
    # ... and the served reply is the sampling client's reply
    sampler = service.create_sampling_client(model_path=path).result()
    seqs = sampler.sample(types.ModelInput.from_ints(prompt), 4,
                          types.SamplingParams(temperature=1.0, seed=7, stop=[END])).result().sequences
    served = ask(client, path, n=4, temperature=1.0, seed=7)
    assert [c.message.content for c in served.choices] == [R.parse_response(s.tokens)[0]["content"] for s in seqs]
    assert served.usage.completion_tokens == sum(len(s.tokens) for s in seqs)
    assert served.usage.prompt_tokens == len(prompt)  # once per request, as OpenAI counts with n > 1

    # at temperature 1 the checkpoint knows the code and the base model never says it
    hot_base = ask(client, BASE, n=8, seed=1).choices
    hot_after = ask(client, path, n=8, seed=1).choices
    assert not any("ZEBRA" in (c.message.content or "") for c in hot_base)
    assert sum(c.message.content == "ZEBRA-42" for c in hot_after) >= 6
    old_skill = ask(client, path, [{"role": "user", "content": "What is 2 plus 3?"}], temperature=0)
    assert old_skill.choices[0].message.content == "5."  # the rest survives
    # a developer message renders as a system message (OpenAI's newer name for it)
    assert ask(client, path, [{"role": "developer", "content": "Be brief."}] + ASK, temperature=0).usage.prompt_tokens \
        == len(R.build_generation_prompt([{"role": "system", "content": "Be brief."}] + ASK))


def test_streaming_a_checkpoint(world, trained):
    stream = ask(world["client"], trained.sampler_path, temperature=0, stream=True,
                 stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == "ZEBRA-42" and finish == ["stop"]
    assert chunks[-1].usage.completion_tokens == len(TOK.encode("ZEBRA-42")) + 1
    assert chunks[-1].usage.prompt_tokens == len(R.build_generation_prompt(ASK))


def test_max_tokens_and_stop_strings(world, trained):
    client, path = world["client"], trained.sampler_path
    short = ask(client, path, temperature=0, max_tokens=3)
    assert short.choices[0].message.content == "ZEB" and short.choices[0].finish_reason == "length"
    assert short.usage.completion_tokens == 3
    same = ask(client, path, temperature=0, max_completion_tokens=3)
    assert same.choices[0].message.content == "ZEB"
    cut = ask(client, path, temperature=0, stop=["-4", "RA-"])
    assert cut.choices[0].message.content == "ZEB" and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens == len("ZEBRA-")  # sampling stops once the stop string is out
    untouched = ask(client, path, temperature=0, stop="nowhere")
    assert untouched.choices[0].message.content == "ZEBRA-42" and untouched.usage.completion_tokens == 9


def test_checkpoints_are_added_while_serving(world, trained):
    registry, service = world["registry"], world["service"]
    more = run_supervised(service, SupervisedConfig(**(FACT_CONFIG | {"num_epochs": 1, "checkpoint_name": "more"})),
                          world["root"] / "fact.jsonl")
    assert more.sampler_path in sampler_checkpoints(service) and more.sampler_path not in registry
    assert serve_checkpoints(service, registry, BASE) == [more.sampler_path]  # just the new one
    assert serve_checkpoints(service, registry, BASE) == []
    assert ask(world["client"], more.sampler_path, max_tokens=2).usage.completion_tokens <= 2
    with pytest.raises(ValueError, match="already registered"):
        register_checkpoint(registry, service, more.sampler_path)
    assert register_checkpoint(registry, service, more.sampler_path, name="more") == "more"
    assert ask(world["client"], "more", max_tokens=1, seed=0).choices[0].message.content is not None
    registry.remove("more")


# --- determinism ------------------------------------------------------------------------------------


def test_same_seed_same_data_same_checkpoint_and_same_served_completion(world):
    service, client, registry = world["service"], world["client"], world["registry"]
    config = SupervisedConfig(**(FACT_CONFIG | {"num_epochs": 3}))
    runs = [run_supervised(service, SupervisedConfig(**(vars(config) | {"seed": s, "checkpoint_name": f"det-{i}"})),
                           world["root"] / "fact.jsonl") for i, s in enumerate((0, 0, 1))]

    def adapter_bytes(path: str) -> bytes:
        run, kind, name = parse_tinker_path(path)
        return (service.root_dir / "runs" / run / kind / name / "adapter.npz").read_bytes()

    a, b, c = (adapter_bytes(r.sampler_path) for r in runs)
    assert a == b and a != c
    assert runs[0].sampler_path != runs[1].sampler_path and runs[0].loss_curve == runs[1].loss_curve
    for r in runs:
        register_checkpoint(registry, service, r.sampler_path)

    def served(path: str) -> list[tuple[str, str]]:
        reply = ask(client, path, [{"role": "user", "content": q} for q in SECRET[:1]], n=3, temperature=0.9,
                    top_p=0.95, seed=11)
        return [(ch.message.content, ch.finish_reason) for ch in reply.choices] + [("usage", str(reply.usage))]

    first, second = served(runs[0].sampler_path), served(runs[1].sampler_path)
    assert first == second == served(runs[0].sampler_path)
    other_seed = ask(client, runs[0].sampler_path, ASK, n=3, temperature=0.9, top_p=0.95, seed=12)
    assert [(ch.message.content, ch.finish_reason) for ch in other_seed.choices] != first[:3]


# --- errors: OpenAI's shapes through the openai client, the server survives ---------------------------


def test_unknown_model_or_checkpoint_is_404(world, trained):
    client = world["client"]
    for name in ("no-such-model", "tinker://s0001:train:99/sampler_weights/final", trained.sampler_path + "x"):
        with pytest.raises(openai.NotFoundError) as err:
            ask(client, name)
        assert err.value.status_code == 404 and err.value.code == "model_not_found" and err.value.param == "model"
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint"):
        register_checkpoint(world["registry"], world["service"], "tinker://s0001:train:99/sampler_weights/final")
    with pytest.raises(ActionError, match="malformed"):
        register_checkpoint(world["registry"], world["service"], "tinker://nope")
    assert ask(client, trained.sampler_path, temperature=0).choices[0].message.content == "ZEBRA-42"


def test_checkpoint_whose_files_vanished_is_404_not_500(world):
    service, registry, client = world["service"], world["registry"], world["client"]
    result = run_supervised(service, SupervisedConfig(base_model=BASE, lora_rank=2, max_steps=1, save_state=False,
                                                      checkpoint_name="doomed"), world["root"] / "fact.jsonl")
    path = result.sampler_path
    register_checkpoint(registry, service, path)
    run, kind, name = parse_tinker_path(path)
    directory = service.root_dir / "runs" / run / kind / name
    moved = directory.with_name(name + ".moved")
    ask(client, path, max_tokens=1)  # loaded and served
    directory.rename(moved)
    try:
        for stream in (False, True):
            with pytest.raises(openai.NotFoundError) as err:
                ask(client, path, max_tokens=1, stream=stream)
            assert err.value.code == "model_not_found" and err.value.param == "model"
            assert path in err.value.message and "no checkpoint" in err.value.message
    finally:
        moved.rename(directory)
    assert ask(client, path, max_tokens=1).choices  # back on disk: served again
    shutil.rmtree(directory)  # vanished before it was ever loaded
    fresh = ModelRegistry()
    with pytest.raises(CheckpointNotFoundError):
        register_checkpoint(fresh, service, path)
    with pytest.raises(openai.NotFoundError):
        ask(client, path, max_tokens=1)
    registry.remove(path)


BAD_MESSAGES = {
    "unknown role": ([{"role": "robot", "content": "hi"}], "messages[0].role"),
    "user without content": ([{"role": "user"}], "messages[0]"),
    "orphan tool message": ([{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c9", "content": "x"}],
                            "messages[1]"),
    "image part": ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                   "messages[0].content[0]"),
    "no messages": ([], "messages"),
    "not a list": ("hello", "messages"),
}


@pytest.mark.parametrize("case", list(BAD_MESSAGES))
def test_malformed_messages_are_400(world, trained, case):
    messages, param = BAD_MESSAGES[case]
    with pytest.raises(openai.BadRequestError) as err:
        ask(world["client"], trained.sampler_path, messages)
    assert err.value.status_code == 400 and err.value.param == param


def test_context_overflow_is_400_with_the_real_token_count(world, trained):
    client, path = world["client"], trained.sampler_path
    long = [{"role": "user", "content": "x" * 200}]  # 200 byte tokens: the estimate would say ~1
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, path, long)
    assert err.value.code == "context_length_exceeded" and err.value.param == "messages"
    real = len(R.build_generation_prompt(long))
    assert "maximum context length is 128 tokens" in err.value.message and f"({real} in the messages" in err.value.message
    prompt = len(R.build_generation_prompt(ASK))
    with pytest.raises(openai.BadRequestError) as err:  # the prompt fits, prompt + completion does not
        ask(client, path, max_tokens=128 - prompt + 1)
    assert err.value.code == "context_length_exceeded"
    fits = ask(client, path, max_tokens=128 - prompt, temperature=0)
    assert fits.choices[0].message.content == "ZEBRA-42"
    # without max_tokens a completion may use the rest of the context and then ends with "length"
    near = [{"role": "user", "content": "y" * 121}]
    assert len(R.build_generation_prompt(near)) == 125
    reply = ask(client, path, near, seed=0)
    assert reply.usage.completion_tokens <= 3 and reply.usage.prompt_tokens == 125


BAD_SAMPLING = {
    "temperature": {"temperature": -0.5},
    "temperature ": {"temperature": 2.5},
    "top_p": {"top_p": 0.0},
    "top_p ": {"top_p": 1.5},
    "max_tokens": {"max_tokens": 0},
    "max_completion_tokens": {"max_completion_tokens": -3},
    "n": {"n": 0},
    "stop": {"stop": ["a", "b", "c", "d", "e"]},
    "presence_penalty": {"presence_penalty": 0.5},
    "logprobs": {"logprobs": True},
}


@pytest.mark.parametrize("param", list(BAD_SAMPLING))
def test_bad_sampling_parameters_are_400_naming_the_parameter(world, trained, param):
    with pytest.raises(openai.BadRequestError) as err:
        ask(world["client"], trained.sampler_path, **BAD_SAMPLING[param])
    assert err.value.status_code == 400 and err.value.param == param.strip()
    assert param.strip() in err.value.message


def test_the_server_survives_every_error(world, trained):
    """After the error tests (and a burst of bad requests) the checkpoint is still served."""
    client = world["client"]
    for kwargs in BAD_SAMPLING.values():
        with pytest.raises(openai.BadRequestError):
            ask(client, trained.sampler_path, **kwargs)
    ok = ask(client, trained.sampler_path, temperature=0, seed=-5)  # any integer seed is fine
    assert ok.choices[0].message.content == "ZEBRA-42"
    assert world["server"].running


def test_bad_training_hyperparameters_are_action_errors(tmp_path):
    """The training side: every bad hyperparameter is a typed ``ActionError`` (``invalid_args``) whose
    message names the field, raised before any run is created."""
    service = LocalServiceClient(root_dir=tmp_path)
    bad = {"learning_rate": -1e-3, "lr_schedule": "step", "num_epochs": 0, "batch_size": 0, "lora_rank": 0,
           "max_steps": 0, "max_length": 1, "train_on_what": "everything", "renderer": "llama", "adam_beta1": 1.0,
           "adam_beta2": -0.1, "adam_eps": 0.0, "weight_decay": -1.0, "grad_clip_norm": math.inf,
           "checkpoint_name": "a/b", "base_model": ""}
    for field, value in bad.items():
        with pytest.raises(TrainingConfigError) as err:
            run_supervised(service, SupervisedConfig(**{"base_model": BASE, field: value}), [chat("a", "b")])
        assert isinstance(err.value, ActionError) and err.value.code == "invalid_args", field
        assert field in str(err.value), (field, str(err.value))
    with pytest.raises(TrainingConfigError, match="train_mlp, train_attn, train_unembed"):
        run_supervised(service, SupervisedConfig(base_model=BASE, train_mlp=False, train_attn=False,
                                                 train_unembed=False), [chat("a", "b")])
    assert not any((tmp_path / "runs").iterdir())  # refused before anything ran


# --- tool calls and the reply parser (a scripted sampler: exact tokens, real renderer) -----------------


class ScriptedSampler:
    """A Tinker-shaped sampling client that returns fixed token sequences and records prompts."""

    def __init__(self, *replies: list[int], stop_reason: str = "stop"):
        self.replies, self.stop_reason, self.calls = list(replies), stop_reason, []

    def get_tokenizer(self):
        return TOK

    def sample(self, prompt, num_samples, sampling_params):
        self.calls.append((prompt.to_ints(), num_samples, sampling_params))
        seqs = [types.SampledSequence(stop_reason=self.stop_reason, sequence_id=f"scripted:{i}",
                                      tokens_np=np.asarray(self.replies[i % len(self.replies)], np.int32))
                for i in range(num_samples)]
        return _Done(types.SampleResponse(sequences=seqs))


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        return self.value


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
CALL = Tokenizer.special("<|tool_call|>")


def call_tokens(name: str, arguments: dict) -> list[int]:
    return [CALL] + TOK.encode(json.dumps({"name": name, "arguments": json.dumps(arguments)}))


@pytest.fixture()
def scripted(world):
    names = []

    def add(sampler, name="scripted"):
        world["registry"].add(name, LocalChatModel(sampler, context_length=2048), replace=True)
        names.append(name)
        return sampler

    yield add
    for name in names:
        world["registry"].remove(name)


def test_tool_calls_are_parsed_and_tools_rendered(world, scripted):
    client = world["client"]
    reply_tokens = TOK.encode("Let me check.") + call_tokens("get_weather", {"city": "Paris"}) + [END]
    sampler = scripted(ScriptedSampler(reply_tokens))
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = ask(client, "scripted", messages, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id and call.type == "function"
    prompt = sampler.calls[-1][0]
    assert prompt == R.build_generation_prompt(messages, TOOLS)  # tools in the renderer's format
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens == len(reply_tokens)

    # the conversation continues: the call and its result render back into the prompt
    follow = messages + [{"role": "assistant", "content": "Let me check.", "tool_calls": [call.model_dump()]},
                         {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    sampler.replies = [TOK.encode("It is sunny.") + [END]]
    again = ask(client, "scripted", follow, tools=TOOLS)
    assert again.choices[0].message.content == "It is sunny." and again.choices[0].finish_reason == "stop"
    assert sampler.calls[-1][0] == R.build_generation_prompt(
        messages + [{"role": "assistant", "content": "Let me check.",
                     "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                      "arguments": call.function.arguments}}]},
                    {"role": "tool", "content": "sunny"}], TOOLS)

    # streamed, the openai client reassembles the same call
    sampler.replies = [reply_tokens]
    chunks = list(ask(client, "scripted", messages, tools=TOOLS, stream=True))
    args = "".join(tc.function.arguments or "" for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or [])
    assert json.loads(args) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]

    # no tools offered, or tool_choice="none": a call the model writes stays text
    for kwargs in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        plain = ask(client, "scripted", messages, **kwargs).choices[0]
        assert plain.message.tool_calls is None and plain.finish_reason == "stop"
        assert plain.message.content.startswith("Let me check.{\"name\": \"get_weather\"")

    # parallel calls, and parallel_tool_calls=False keeps the first
    sampler.replies = [call_tokens("get_weather", {"city": "Lima"}) + call_tokens("get_time", {}) + [END]]
    both = ask(client, "scripted", messages, tools=TOOLS).choices[0]
    assert [c.function.name for c in both.message.tool_calls] == ["get_weather", "get_time"]
    assert both.message.content is None
    one = ask(client, "scripted", messages, tools=TOOLS, parallel_tool_calls=False).choices[0]
    assert [c.function.name for c in one.message.tool_calls] == ["get_weather"]

    # malformed call JSON is returned as text; a call cut by max_tokens ends with "length"
    sampler.replies = [[CALL] + TOK.encode('{"name": oops}') + [END]]
    bad = ask(client, "scripted", messages, tools=TOOLS).choices[0]
    assert bad.message.tool_calls is None and bad.message.content == '{"name": oops}' and bad.finish_reason == "stop"
    sampler.stop_reason, sampler.replies = "length", [call_tokens("get_weather", {"city": "Rome"})[:8]]
    cut = ask(client, "scripted", messages, tools=TOOLS, max_tokens=8).choices[0]
    assert cut.finish_reason == "length" and cut.message.tool_calls is None


def test_tool_choice_required_or_named_starts_the_reply_with_a_call(world, scripted):
    client = world["client"]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    rest = TOK.encode(json.dumps(json.dumps({"city": "Paris"})) + "}") + [END]
    sampler = scripted(ScriptedSampler(rest))
    named = ask(client, "scripted", messages, tools=TOOLS,
                tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=60)
    forced = [CALL] + TOK.encode('{"name": "get_weather", "arguments": ')
    prompt, n, params = sampler.calls[-1]
    assert prompt == R.build_generation_prompt(messages, TOOLS) + forced
    assert params.max_tokens == 60 - len(forced)
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert named.usage.prompt_tokens == len(R.build_generation_prompt(messages, TOOLS))
    assert named.usage.completion_tokens == len(forced) + len(rest)

    sampler.replies = [TOK.encode(json.dumps({"name": "get_time", "arguments": "{}"})) + [END]]
    required = ask(client, "scripted", messages, tools=TOOLS, tool_choice="required")
    assert sampler.calls[-1][0][-1] == CALL
    assert [c.function.name for c in required.choices[0].message.tool_calls] == ["get_time"]


def test_sampling_parameters_reach_the_sampler(world, scripted):
    sampler = scripted(ScriptedSampler(TOK.encode("ok") + [END]))
    reply = ask(world["client"], "scripted", ASK, n=3, temperature=0.3, top_p=0.5, seed=-1, max_tokens=7)
    prompt, n, params = sampler.calls[-1]
    assert (n, params.temperature, params.top_p, params.seed, params.max_tokens, params.stop) == \
        (3, 0.3, 0.5, 2**64 - 1, 7, [END])
    assert [c.message.content for c in reply.choices] == ["ok"] * 3 and reply.usage.completion_tokens == 9
    ask(world["client"], "scripted", ASK)
    params = sampler.calls[-1][2]
    assert (params.temperature, params.top_p, params.seed, params.max_tokens) == (1.0, 1.0, None, None)


def test_chat_model_directly():
    """Without the server: the protocol's optional methods and the stop-string cut."""
    sampler = ScriptedSampler(TOK.encode("alpha beta. gamma") + [END], TOK.encode("no stop here") + [END])
    model = LocalChatModel(sampler)
    assert model.context_length is None and isinstance(model.renderer, ChatRenderer)
    request = ChatRequest(model="m", messages=ASK, n=2, stop=[". ", "zzz"])
    assert model.count_prompt_tokens(request) == len(R.build_generation_prompt(ASK))
    first, second = model.complete(request)
    assert (first.content, first.finish_reason, first.completion_tokens) == ("alpha beta", "stop", len("alpha beta. "))
    assert (second.content, second.finish_reason, second.completion_tokens) == ("no stop here", "stop", 13)
    with pytest.raises(ValueError, match="renderer"):
        LocalChatModel(lambda: sampler)
    lazy = LocalChatModel(lambda: sampler, R, context_length=64)
    assert lazy.complete(ChatRequest(model="m", messages=ASK))[0].content == "alpha beta. gamma"
