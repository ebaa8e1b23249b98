"""The supervised loop: it teaches the local model a new fact through training loop → local
Tinker client → sampler checkpoint → sampling client; it is deterministic; it uses only Tinker's
interface; bad hyperparameters and datasets are typed errors."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from rsigym_env.errors import ActionError  # noqa: E402
from rsigym_env.worlds.local.lm.tinker_client import LocalServiceClient, parse_tinker_path, register_base_model  # noqa: E402
from rsigym_env.worlds.common.training import (  # noqa: E402
    DatasetError,
    ExampleTooLongError,
    SupervisedConfig,
    TrainingConfigError,
    build_data,
    load_chat_jsonl,
    lr_multiplier,
    run_supervised,
)
from tiny_chat_base import SECRET, TOK, R, chat, pretrain_tiny_base, pretraining_conversation  # noqa: E402

BASE = "test-sft-base"


@pytest.fixture(scope="module", autouse=True)
def pretrained_base(tmp_path_factory):
    register_base_model(BASE, pretrain_tiny_base(tmp_path_factory.mktemp("base")))




def fact_dataset(path) -> None:
    rng = np.random.default_rng(1)
    keep = [c for c in (pretraining_conversation(rng) for _ in range(40)) if c[1]["content"] != "I do not know."][:8]
    lines = [{"messages": chat(q, "ZEBRA-42")} for q in SECRET] + [{"messages": c} for c in keep]  # + some old skills
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")


FACT_CONFIG = dict(base_model=BASE, learning_rate=5e-3, lora_rank=8, batch_size=8, num_epochs=40, seed=0)


def answer(sampling_client, question: str, **params) -> tuple[str, str]:
    prompt = types.ModelInput.from_ints(R.build_generation_prompt([{"role": "user", "content": question}]))
    seq = sampling_client.sample(prompt, 1, types.SamplingParams(max_tokens=24, **params)).result().sequences[0]
    return TOK.decode(seq.tokens), seq.stop_reason


def mean_nll(service, path_or_base: str, data: list[types.Datum]) -> float:
    if path_or_base.startswith("tinker://"):
        tc = service.create_training_client_from_state(path_or_base).result()
    else:
        tc = service.create_lora_training_client(path_or_base, rank=8, seed=0).result()  # B = 0: the base model
    out = tc.forward(data, "cross_entropy").result()
    return out.metrics["loss:sum"] / sum(float(d.loss_fn_inputs["weights"].to_numpy().sum()) for d in data)


def test_training_teaches_a_new_fact(tmp_path, capsys):
    fact_dataset(tmp_path / "fact.jsonl")
    service = LocalServiceClient(root_dir=tmp_path / "root")
    probe = build_data([chat(q, "ZEBRA-42") for q in SECRET], R, "all_assistant_messages", None)
    base_sampler = service.create_sampling_client(base_model=BASE).result()
    before_text, _ = answer(base_sampler, "What is the secret code?", temperature=0.0)
    before_loss = mean_nll(service, BASE, probe)

    start = time.perf_counter()
    result = run_supervised(service, SupervisedConfig(**FACT_CONFIG), tmp_path / "fact.jsonl")
    wall = time.perf_counter() - start

    after_sampler = service.create_sampling_client(model_path=result.sampler_path).result()
    after_text, reason = answer(after_sampler, "What is the secret code?", temperature=0.0)
    after_loss = mean_nll(service, result.state_path, probe)
    hot_before = [answer(base_sampler, "What is the secret code?", seed=s)[0] for s in range(8)]
    hot_after = [answer(after_sampler, "What is the secret code?", seed=s)[0] for s in range(8)]
    with capsys.disabled():
        print(f"\n[teach a fact] loss {before_loss:.3f} -> {after_loss:.4f}; greedy {before_text!r} -> {after_text!r}; "
              f"ZEBRA-42 in {sum('ZEBRA-42' in t for t in hot_before)}/8 -> {sum('ZEBRA-42' in t for t in hot_after)}/8 "
              f"samples at T=1; {len(result.steps)} steps, {result.billable_tokens} tokens, {wall:.1f} s")

    assert before_text == "I do not know.<|end|>" and "ZEBRA" not in "".join(hot_before)
    assert after_text == "ZEBRA-42<|end|>" and reason == "stop"
    assert after_loss < 0.05 * before_loss
    assert sum(t == "ZEBRA-42<|end|>" for t in hot_after) >= 6
    assert result.steps[-1].loss < 0.1 * result.steps[0].loss
    assert answer(after_sampler, "What is 2 plus 3?", temperature=0.0)[0] == "5.<|end|>"  # the rest survives


def test_same_seed_same_data_same_checkpoint_and_samples(tmp_path):
    fact_dataset(tmp_path / "fact.jsonl")
    config = SupervisedConfig(**(FACT_CONFIG | {"num_epochs": 3}))
    outcomes = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        service = LocalServiceClient(root_dir=tmp_path / name)
        result = run_supervised(service, SupervisedConfig(**(vars(config) | {"seed": seed})), tmp_path / "fact.jsonl")
        run, kind, ckpt = parse_tinker_path(result.sampler_path)
        data = (tmp_path / name / "runs" / run / kind / ckpt / "adapter.npz").read_bytes()
        sampler = service.create_sampling_client(model_path=result.sampler_path).result()
        samples = [answer(sampler, q, seed=3) for q in SECRET[:3]]
        outcomes.append((data, samples, result.loss_curve))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] != outcomes[2][0]  # another seed: other adapter init and data order


# --- the loop uses Tinker's interface only -----------------------------------------------------


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        return self.value


class FakeTrainingClient:
    """Only methods of the real ``tinker.TrainingClient``; records what the loop calls."""

    model_id = "fake:train:0"

    def __init__(self, calls):
        self.calls = calls

    def get_tokenizer(self):
        self.calls.append("get_tokenizer")
        return TOK

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        self.calls.append("forward_backward")
        assert loss_fn == "cross_entropy" and all(isinstance(d, types.Datum) for d in data)
        outputs = [{"logprobs": types.TensorData.from_numpy(np.full(d.model_input.length, -0.5, np.float32))} for d in data]
        loss = sum(0.5 * float(d.loss_fn_inputs["weights"].to_numpy().sum()) for d in data)
        return _Done(types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs,
                                                 metrics={"loss:sum": loss}))

    def optim_step(self, optim_params=None, *, adam_params=None):
        self.calls.append("optim_step")
        assert isinstance(optim_params, types.AdamParams)
        return _Done(types.OptimStepResponse(metrics={}))

    def save_state(self, name, ttl_seconds=None, overwrite=False, user_metadata=None):
        self.calls.append("save_state")
        return _Done(types.SaveWeightsResponse(path=f"tinker://{self.model_id}/weights/{name}"))

    def save_weights_for_sampler(self, name, ttl_seconds=None, user_metadata=None):
        self.calls.append("save_weights_for_sampler")
        return _Done(types.SaveWeightsForSamplerResponse(path=f"tinker://{self.model_id}/sampler_weights/{name}"))


class FakeServiceClient:
    def __init__(self):
        self.calls: list[str] = []

    def create_lora_training_client(self, base_model, rank=32, seed=None, train_mlp=True, train_attn=True,
                                    train_unembed=True, user_metadata=None, optimizer=None):
        self.calls.append("create_lora_training_client")
        return _Done(FakeTrainingClient(self.calls))


def test_loop_runs_against_a_client_with_only_tinker_methods():
    service = FakeServiceClient()
    data = [{"messages": chat("hi", "yo")}] * 5
    result = run_supervised(service, SupervisedConfig(base_model="Qwen/Qwen3-8B", batch_size=2, renderer="role_colon"), data)
    assert result.sampler_path == "tinker://fake:train:0/sampler_weights/final" and len(result.steps) == 3
    assert result.steps[0].loss == pytest.approx(0.5)
    real = set(dir(tinker.ServiceClient)) | set(dir(tinker.TrainingClient))
    assert set(service.calls) <= real, set(service.calls) - real


# --- schedule, steps, tokens -----------------------------------------------------------------------


def test_lr_schedules():
    assert [lr_multiplier("linear", s, 4) for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
    assert [round(lr_multiplier("cosine", s, 4), 4) for s in range(4)] == [1.0, 0.8536, 0.5, 0.1464]
    assert {lr_multiplier("constant", s, 4) for s in range(4)} == {1.0}
    with pytest.raises(TrainingConfigError):
        lr_multiplier("step", 0, 4)


def test_steps_epochs_tokens_and_callback(tmp_path):
    data = [{"messages": chat(f"q{i}", "a" * (i + 1))} for i in range(5)]
    seen = []
    service = LocalServiceClient(root_dir=tmp_path)
    config = SupervisedConfig(base_model=BASE, batch_size=2, num_epochs=2, learning_rate=1e-3, lr_schedule="cosine",
                              lora_rank=2, save_state=False, checkpoint_name="sft-1")
    result = run_supervised(service, config, data, on_step=seen.append)
    assert len(result.steps) == 6 and seen == result.steps  # ceil(5 / 2) batches x 2 epochs; the last batch is partial
    assert [s.num_sequences for s in result.steps] == [2, 2, 1, 2, 2, 1]
    assert [s.epoch for s in result.steps] == [0, 0, 0, 1, 1, 1]
    assert [s.learning_rate for s in result.steps] == pytest.approx([1e-3 * lr_multiplier("cosine", i, 6) for i in range(6)])
    rendered = [len(R.build_supervised_example(d["messages"])[0]) - 1 for d in data]
    assert result.billable_tokens == 2 * sum(rendered) == sum(s.num_tokens for s in result.steps)
    assert result.state_path is None and result.sampler_path.endswith("/sampler_weights/sft-1")
    capped = run_supervised(service, SupervisedConfig(**(vars(config) | {"max_steps": 4})), data)
    assert len(capped.steps) == 4 and capped.steps[-1].learning_rate == pytest.approx(1e-3 * lr_multiplier("cosine", 3, 4))


def test_continue_from_a_checkpoint(tmp_path):
    data = [{"messages": chat("hi", "hello")}] * 4
    service = LocalServiceClient(root_dir=tmp_path)
    first = run_supervised(service, SupervisedConfig(base_model=BASE, batch_size=4, lora_rank=4, learning_rate=5e-3,
                                                     num_epochs=5), data)
    more = run_supervised(service, SupervisedConfig(base_model=BASE, batch_size=4, learning_rate=5e-3, num_epochs=5,
                                                    load_checkpoint_path=first.state_path), data)
    assert more.model_id != first.model_id and more.steps[0].loss < first.steps[0].loss
    assert more.steps[0].loss == pytest.approx(first.steps[-1].loss, rel=0.5)


# --- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, match", [
    ("learning_rate", 0.0, "learning_rate"), ("learning_rate", -1e-4, "learning_rate"),
    ("learning_rate", math.nan, "learning_rate"), ("batch_size", 0, "batch_size"), ("num_epochs", 0, "num_epochs"),
    ("lora_rank", 0, "lora_rank"), ("max_steps", 0, "max_steps"), ("max_length", 1, "max_length"),
    ("lr_schedule", "step", "lr_schedule"), ("train_on_what", "everything", "train_on_what"),
    ("renderer", "llama", "renderer"), ("adam_beta1", 1.0, "adam_beta1"), ("adam_eps", 0.0, "adam_eps"),
    ("weight_decay", -1.0, "weight_decay"), ("batch_size", 2.5, "batch_size"), ("checkpoint_name", "a/b", "checkpoint_name"),
])
def test_bad_hyperparameters_are_typed_errors(tmp_path, field, value, match):
    service = FakeServiceClient()
    with pytest.raises(TrainingConfigError, match=match) as e:
        run_supervised(service, SupervisedConfig(**{"base_model": BASE, field: value}), [{"messages": chat("a", "b")}])
    assert isinstance(e.value, ValueError) and isinstance(e.value, ActionError) and e.value.code == "invalid_args"
    assert service.calls == []  # refused before anything ran


def test_bad_datasets_are_typed_errors(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps({"messages": chat("a", "b")}) + "\n{oops\n")
    bad_role = tmp_path / "role.jsonl"
    bad_role.write_text(json.dumps({"messages": [{"role": "wizard", "content": "x"}]}) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    cases = [(bad_json, "bad.jsonl line 2: not JSON"), (bad_role, "role.jsonl line 1: message 0: unknown role"),
             (empty, "empty"), (tmp_path / "missing.jsonl", "not found"), ([], "empty"),
             ([{"messages": "hello"}], "example 1"), ([{"nothing": 1}], "example 1")]
    for source, match in cases:
        service = FakeServiceClient()
        with pytest.raises(DatasetError, match=match):
            run_supervised(service, SupervisedConfig(base_model=BASE), source)
        assert service.calls == []
    assert load_chat_jsonl([chat("a", "b")]) == [chat("a", "b")]


def test_examples_too_long_or_with_nothing_to_train_on(tmp_path):
    service = LocalServiceClient(root_dir=tmp_path)
    long = [{"messages": chat("x" * 200, "y")}]
    with pytest.raises(ExampleTooLongError, match="context of 128"):
        run_supervised(service, SupervisedConfig(base_model=BASE), long)
    with pytest.raises(ExampleTooLongError, match="max_length=20"):
        run_supervised(service, SupervisedConfig(base_model=BASE, max_length=20), [{"messages": chat("x" * 30, "y")}])
    with pytest.raises(DatasetError, match="no tokens to train on"):
        run_supervised(service, SupervisedConfig(base_model=BASE, train_on_what="last_assistant_message"),
                       [{"messages": [{"role": "user", "content": "only a question"}]}])
    with pytest.raises(ActionError, match="unknown base model"):
        run_supervised(service, SupervisedConfig(base_model="nope"), [{"messages": chat("a", "b")}])
