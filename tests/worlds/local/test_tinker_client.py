"""The Tinker-shaped local client: tinker 0.38's signatures, real ``tinker.types`` in and out,
futures, gradient accumulation, checkpoints on disk that survive a restart, and clear errors."""

from __future__ import annotations

import asyncio
import inspect

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from rsigym_env.errors import ActionError  # noqa: E402
from rsigym_env.worlds.local.lm.model import ContextOverflowError, ModelConfig, load_npz  # noqa: E402
from rsigym_env.worlds.local.lm.tinker_client import (  # noqa: E402
    CheckpointNotFoundError,
    LocalSamplingClient,
    LocalServiceClient,
    LocalTrainingClient,
    UnknownModelError,
    _check_data,
    _chunks,
    make_random_base,
    parse_tinker_path,
    register_base_model,
)
from rsigym_env.worlds.common.tokenizer import ChatRenderer, Tokenizer  # noqa: E402

BASE = "test-client-tiny"
TOK = Tokenizer()
R = ChatRenderer(TOK)


@pytest.fixture(scope="module", autouse=True)
def base_model(tmp_path_factory):
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=64)
    register_base_model(BASE, make_random_base(tmp_path_factory.mktemp("base"), cfg, seed=1))


@pytest.fixture
def service(tmp_path):
    with LocalServiceClient(root_dir=tmp_path) as svc:
        yield svc


def datum(text: str, answer: str) -> types.Datum:
    tokens, weights = R.build_supervised_example([{"role": "user", "content": text}, {"role": "assistant", "content": answer}])
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]})


DATA = [datum("hi", "hello"), datum("2+2?", "4"), datum("name?", "tiny model"), datum("ok", "ok!")]


# --- signatures and types ------------------------------------------------------------------------

PAIRS = [
    (tinker.ServiceClient, LocalServiceClient, ["create_lora_training_client", "create_sampling_client",
                                                "create_training_client_from_state",
                                                "create_training_client_from_state_with_optimizer", "close"]),
    (tinker.TrainingClient, LocalTrainingClient, ["forward", "forward_backward", "forward_backward_custom", "optim_step",
                                                  "save_state", "save_weights_for_sampler",
                                                  "save_weights_and_get_sampling_client", "create_sampling_client",
                                                  "get_info", "get_tokenizer"]),
    (tinker.SamplingClient, LocalSamplingClient, ["sample", "compute_logprobs", "get_tokenizer", "get_base_model"]),
]


@pytest.mark.parametrize("real, local, method", [(r, l, m) for r, l, ms in PAIRS for m in ms])
def test_signatures_match_tinker(real, local, method):
    sig = lambda f: [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]  # noqa: E731
    assert sig(getattr(local, method)) == sig(getattr(real, method))


def test_service_constructor_accepts_tinkers_arguments():
    local = inspect.signature(LocalServiceClient.__init__).parameters
    for name, p in inspect.signature(tinker.ServiceClient.__init__).parameters.items():
        assert name in local and local[name].kind == p.kind and local[name].default == p.default, name


def test_clients_come_as_tinker_futures(service):
    fut = service.create_lora_training_client(base_model=BASE, rank=4, seed=0)
    assert isinstance(fut, tinker.APIFuture)
    tc = fut.result()
    assert isinstance(tc, LocalTrainingClient) and fut.future().done()
    with pytest.warns(FutureWarning):
        assert fut.model_id == tc.model_id  # deprecated use of the future as the client, as in 0.38
    sc = asyncio.run(_await(service.create_sampling_client(base_model=BASE)))
    assert isinstance(sc, LocalSamplingClient) and sc.get_base_model() == BASE
    info = tc.get_info()
    assert isinstance(info, types.GetInfoResponse) and info.lora_rank == 4 and info.model_data.model_name == BASE


async def _await(fut):
    return await fut


def test_forward_backward_returns_real_types(service):
    tc = service.create_lora_training_client(BASE, rank=4, seed=0).result()
    fut = tc.forward_backward(DATA, "cross_entropy")
    assert isinstance(fut, tinker.APIFuture)
    out = fut.result()
    assert isinstance(out, types.ForwardBackwardOutput) and len(out.loss_fn_outputs) == len(DATA)
    total = 0.0
    for d, o in zip(DATA, out.loss_fn_outputs):
        lp, el = o["logprobs"], o["elementwise_loss"]
        assert isinstance(lp, types.TensorData) and lp.dtype == "float32" and lp.shape == [d.model_input.length]
        w = d.loss_fn_inputs["weights"].to_numpy()
        assert np.allclose(el.to_numpy(), -lp.to_numpy() * w, atol=1e-6)
        total += float(el.to_numpy().sum())
    assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-5)
    # tinker's own helpers accept the output (as tinker-cookbook's compute_mean_nll reads it)
    from tinker.lib.chunked_fwdbwd_helpers import combine_fwd_bwd_output_results
    assert combine_fwd_bwd_output_results([out, out]).metrics["loss:sum"] == pytest.approx(2 * total)
    # forward gives the same numbers without touching the gradients
    fwd = tc.forward(DATA, "cross_entropy").result()
    for a, b in zip(fwd.loss_fn_outputs, out.loss_fn_outputs):
        assert np.allclose(a["logprobs"].to_numpy(), b["logprobs"].to_numpy(), atol=1e-6)


def test_sample_returns_real_types_and_honours_params(service):
    sc = service.create_sampling_client(base_model=BASE).result()
    prompt = types.ModelInput.from_ints(R.build_generation_prompt([{"role": "user", "content": "hi"}]))
    fut = sc.sample(prompt, 3, types.SamplingParams(max_tokens=6, seed=1, stop=[]), include_prompt_logprobs=True)
    assert isinstance(fut, tinker.APIFuture)
    resp = fut.result()
    assert isinstance(resp, types.SampleResponse) and len(resp.sequences) == 3
    for s in resp.sequences:
        assert isinstance(s, types.SampledSequence) and s.stop_reason == "length" and len(s.tokens) == 6
        assert len(s.logprobs) == 6 and all(lp <= 0 for lp in s.logprobs)
    assert len({s.sequence_id for s in resp.sequences}) == 3
    assert resp.prompt_logprobs[0] is None and len(resp.prompt_logprobs) == prompt.length
    again = sc.compute_logprobs(prompt).result()
    assert again[0] is None and np.allclose(again[1:], resp.prompt_logprobs[1:], atol=1e-6)
    # same seed, same samples; greedy is greedy
    resp2 = sc.sample(prompt, 3, types.SamplingParams(max_tokens=6, seed=1, stop=[])).result()
    assert [s.tokens for s in resp2.sequences] == [s.tokens for s in resp.sequences]
    greedy = sc.sample(prompt, 2, types.SamplingParams(max_tokens=5, temperature=0.0, stop=[])).result()
    assert greedy.sequences[0].tokens == greedy.sequences[1].tokens


def test_stop_semantics(service):
    sc = service.create_sampling_client(base_model=BASE).result()
    prompt = types.ModelInput.from_ints([TOK.bos_token_id, TOK.special("<|user|>")])
    free = sc.sample(prompt, 1, types.SamplingParams(max_tokens=30, temperature=0.0, stop=[])).result().sequences[0]
    tok = free.tokens[4]
    by_token = sc.sample(prompt, 1, types.SamplingParams(max_tokens=30, temperature=0.0, stop=[tok])).result().sequences[0]
    assert by_token.stop_reason == "stop" and by_token.tokens[-1] == tok and by_token.tokens == free.tokens[:len(by_token.tokens)]
    text = TOK.decode(free.tokens[3:5])
    if "\ufffd" not in text:
        by_text = sc.sample(prompt, 1, types.SamplingParams(max_tokens=30, temperature=0.0, stop=text)).result().sequences[0]
        assert by_text.stop_reason == "stop" and text in TOK.decode(by_text.tokens)
    # stop=None stops at <|end|>: force it with a model whose every answer is <|end|>
    eos = sc.sample(prompt, 1, types.SamplingParams(max_tokens=30, temperature=0.0)).result().sequences[0]
    assert (eos.stop_reason == "stop") == (TOK.end_token_id in eos.tokens)


# --- training semantics --------------------------------------------------------------------------


def test_optim_step_changes_only_after_gradients_and_accumulates(service):
    a = service.create_lora_training_client(BASE, rank=4, seed=3).result()
    b = service.create_lora_training_client(BASE, rank=4, seed=3).result()
    adam = types.AdamParams(learning_rate=1e-2)
    # one call on all data == two calls on halves (gradients add up until optim_step)
    a.forward_backward(DATA, "cross_entropy")
    a.optim_step(adam).result()
    b.forward_backward(DATA[:2], "cross_entropy")
    b.forward_backward(DATA[2:], "cross_entropy")
    resp = b.optim_step(adam).result()
    assert isinstance(resp, types.OptimStepResponse) and resp.metrics["grad_norm:mean"] > 0
    for k in a._model.lora:
        assert np.allclose(a._model.lora[k], b._model.lora[k], atol=1e-6)
    before = a.forward(DATA, "cross_entropy").result().metrics["loss:sum"]
    for _ in range(5):
        a.forward_backward(DATA, "cross_entropy")
        a.optim_step(adam)
    after = a.forward(DATA, "cross_entropy").result().metrics["loss:sum"]
    assert after < before


def test_importance_sampling_at_ratio_one_equals_cross_entropy(service):
    ce = service.create_lora_training_client(BASE, rank=4, seed=5).result()
    isc = service.create_lora_training_client(BASE, rank=4, seed=5).result()
    fwd = ce.forward(DATA, "cross_entropy").result()
    is_data = [types.Datum(model_input=d.model_input,
                           loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"],
                                           "logprobs": o["logprobs"], "advantages": d.loss_fn_inputs["weights"]})
               for d, o in zip(DATA, fwd.loss_fn_outputs)]
    ce.forward_backward(DATA, "cross_entropy").result()
    out = isc.forward_backward(is_data, "importance_sampling").result()
    assert out.metrics["loss:sum"] == pytest.approx(-sum(float(d.loss_fn_inputs["weights"].to_numpy().sum()) for d in DATA), rel=1e-5)
    for k, g in ce._grads.items():
        assert np.allclose(g, isc._grads[k], atol=1e-5)


def test_a_batchs_gradient_is_its_micro_batches_added_in_order_however_they_run(service):
    """A batch's micro-batches run at once on the shard threads (here with two other clients' batches
    queued beside them); their gradients are added in group order, so every client ends with the
    bits of running the groups one after another in this thread."""
    data = DATA * 3
    clients = [service.create_lora_training_client(BASE, rank=4, seed=9).result() for _ in range(3)]
    futures = [c.forward_backward(data, "cross_entropy") for c in clients]  # all in flight at once
    losses = [f.result().metrics["loss:sum"] for f in futures]
    reference = service.create_lora_training_client(BASE, rank=4, seed=9).result()
    batch = _check_data(data, "cross_entropy", reference._base.config)
    lengths = [t.size for t in batch.tokens]
    groups = _chunks(lengths, service.max_tokens_per_chunk)
    assert len(groups) == 2 and sorted(sum(groups, [])) == list(range(len(data)))
    expected: dict[str, np.ndarray] = {}
    for group in groups:
        for name, g in reference._group(batch, group, lengths, "cross_entropy", True)[1].items():
            expected[name] = expected[name] + g if name in expected else g
    assert losses[0] == losses[1] == losses[2]
    for client in clients:
        assert set(client._grads) == set(expected)
        assert all(np.array_equal(client._grads[k], expected[k]) for k in expected)


def test_micro_batches_depend_on_the_lengths_alone_and_keep_the_token_bound():
    lengths = [30, 7, 19, 30, 12, 25, 3]
    groups = _chunks(lengths, max_tokens=64)
    assert groups == _chunks(list(lengths), max_tokens=64) and len(groups) % 2 == 0
    assert sorted(sum(groups, [])) == list(range(len(lengths)))
    assert all(len(g) * max(lengths[i] for i in g) <= 64 for g in groups)
    assert _chunks(lengths, max_tokens=10_000) == [[0, 5, 4, 6], [3, 2, 1]]  # two groups, longest dealt first


def test_custom_loss_needs_torch(service):
    tc = service.create_lora_training_client(BASE, rank=4, seed=0).result()
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="PyTorch is not installed"):
            tc.forward_backward_custom(DATA, lambda data, lps: (sum(-lp.sum() for lp in lps), {}))
        return
    out = tc.forward_backward_custom(DATA, lambda data, lps: (sum(-lp.sum() for lp in lps), {"custom/n:sum": 1.0})).result()
    assert "surrogate_loss:sum" in out.metrics and out.metrics["custom/n:sum"] == 1.0


# --- checkpoints ---------------------------------------------------------------------------------


def test_checkpoint_paths_and_files(service, tmp_path):
    tc = service.create_lora_training_client(BASE, rank=4, seed=0).result()
    state = tc.save_state("s1").result()
    sampler = tc.save_weights_for_sampler("w1").result()
    assert isinstance(state, types.SaveWeightsResponse) and isinstance(sampler, types.SaveWeightsForSamplerResponse)
    assert state.path == f"tinker://{tc.model_id}/weights/s1"
    assert sampler.path == f"tinker://{tc.model_id}/sampler_weights/w1"
    parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(sampler.path)  # tinker's own parser agrees
    assert parsed.training_run_id == tc.model_id and parsed.checkpoint_type == "sampler"
    assert parse_tinker_path(state.path) == (tc.model_id, "weights", "s1")
    run = tmp_path / "runs" / tc.model_id
    assert (run / "weights" / "s1" / "optimizer.npz").exists() and (run / "sampler_weights" / "w1" / "adapter.npz").exists()
    with pytest.raises(FileExistsError):
        tc.save_weights_for_sampler("w1").result()
    assert tc.save_state("s1", overwrite=True).result().path == state.path
    with pytest.raises(ValueError, match="checkpoint name"):
        tc.save_state("../escape")


def test_checkpoints_survive_a_restart(tmp_path):
    prompt = types.ModelInput.from_ints(R.build_generation_prompt([{"role": "user", "content": "hi"}]))
    params = types.SamplingParams(max_tokens=8, seed=4, stop=[])
    with LocalServiceClient(root_dir=tmp_path) as svc:
        tc = svc.create_lora_training_client(BASE, rank=4, seed=0).result()
        for _ in range(3):
            tc.forward_backward(DATA, "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=1e-2))
        path = tc.save_weights_for_sampler("final").result().path
        live = tc.save_weights_and_get_sampling_client().result().sample(prompt, 2, params).result()
        first = svc.create_sampling_client(model_path=path).result().sample(prompt, 2, params).result()
    with LocalServiceClient(root_dir=tmp_path) as svc2:  # a new process would do the same
        assert svc2.session_id != svc.session_id
        again = svc2.create_sampling_client(model_path=path).result().sample(prompt, 2, params).result()
    tokens = lambda r: [s.tokens for s in r.sequences]  # noqa: E731
    assert tokens(again) == tokens(first) == tokens(live)


def test_resuming_with_optimizer_state_continues_exactly(service):
    adam = types.AdamParams(learning_rate=1e-2, weight_decay=0.01, grad_clip_norm=1.0)
    straight = service.create_lora_training_client(BASE, rank=4, seed=2).result()
    split = service.create_lora_training_client(BASE, rank=4, seed=2).result()
    for _ in range(2):
        for tc in (straight, split):
            tc.forward_backward(DATA, "cross_entropy")
            tc.optim_step(adam)
    path = split.save_state("mid").result().path
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    fresh_opt = service.create_training_client_from_state(path).result()
    for tc in (straight, resumed, fresh_opt):
        tc.forward_backward(DATA, "cross_entropy")
        tc.optim_step(adam).result()
    for k in straight._model.lora:
        assert np.array_equal(straight._model.lora[k], resumed._model.lora[k])
    assert any(not np.allclose(straight._model.lora[k], fresh_opt._model.lora[k]) for k in straight._model.lora)
    assert resumed.model_id != split.model_id and resumed.get_info().lora_rank == 4


# --- errors --------------------------------------------------------------------------------------


def test_unknown_models_and_paths_are_typed_errors(service):
    with pytest.raises(UnknownModelError) as e:
        service.create_lora_training_client("no-such-model")
    assert isinstance(e.value, ActionError) and e.value.code == "unknown_ref" and BASE in str(e.value)
    for bad in ("not-a-path", "tinker://run/other/x", "tinker://run/weights"):
        with pytest.raises(CheckpointNotFoundError):
            service.create_sampling_client(model_path=bad)
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint"):
        service.create_training_client_from_state("tinker://s9999:train:0/weights/none")
    with pytest.raises(ValueError, match="Either model_path or base_model"):
        service.create_sampling_client()
    register_base_model("test-client-missing", service.root_dir / "nowhere")
    with pytest.raises(UnknownModelError, match="no checkpoint"):
        service.create_sampling_client(base_model="test-client-missing")


def test_bad_requests_are_refused_before_running(service):
    tc = service.create_lora_training_client(BASE, rank=4, seed=0).result()
    with pytest.raises(ValueError, match="No data provided"):
        tc.forward_backward([], "cross_entropy")
    with pytest.raises(ValueError, match="not supported"):
        tc.forward_backward(DATA, "ppo")
    short = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": [2, 3]})
    with pytest.raises(ValueError, match="entries for 3 input tokens"):
        tc.forward_backward([short], "cross_entropy")
    too_long = types.Datum(model_input=types.ModelInput.from_ints([1] * 65), loss_fn_inputs={"target_tokens": [1] * 65})
    with pytest.raises(ContextOverflowError):
        tc.forward_backward([too_long], "cross_entropy")
    with pytest.raises(ValueError, match="importance_sampling"):
        tc.forward_backward(DATA, "importance_sampling")
    with pytest.raises(TypeError):
        tc.optim_step({"learning_rate": 1e-3})
    with pytest.raises(ValueError):
        tc.optim_step(types.AdamParams(learning_rate=-1.0))
    with pytest.raises(ValueError, match="rank"):
        service.create_lora_training_client(BASE, rank=0)
    with pytest.raises(ValueError, match="At least one"):
        service.create_lora_training_client(BASE, train_mlp=False, train_attn=False, train_unembed=False)
    sc = service.create_sampling_client(base_model=BASE).result()
    with pytest.raises(ContextOverflowError):
        sc.sample(types.ModelInput.from_ints([1] * 64), 1, types.SamplingParams(max_tokens=1))
    with pytest.raises(NotImplementedError):
        sc.sample(types.ModelInput.from_ints([1]), 1, types.SamplingParams(max_tokens=1), topk_prompt_logprobs=2)
    with pytest.raises(ValueError):
        sc.sample(types.ModelInput.from_ints([1]), 1, types.SamplingParams(max_tokens=1, stop=[1.5]))


def test_closed_service_refuses_new_clients(tmp_path):
    svc = LocalServiceClient(root_dir=tmp_path)
    svc.close("success").result()
    with pytest.raises(RuntimeError, match="closed"):
        svc.create_lora_training_client(BASE, rank=2)


def test_default_base_model_is_deterministic(tmp_path):
    a = LocalServiceClient(root_dir=tmp_path / "a").base_model("rsigym-tiny")
    assert a.config == ModelConfig() and a.tokenizer.vocab_size == a.config.vocab_size
    assert "rsigym-tiny" in LocalServiceClient(root_dir=tmp_path / "b").list_base_models()


def test_adapter_bytes_depend_only_on_seed_and_data(tmp_path):
    paths = []
    for name in ("x", "y"):
        with LocalServiceClient(root_dir=tmp_path / name) as svc:
            tc = svc.create_lora_training_client(BASE, rank=4, seed=11).result()
            tc.forward_backward(DATA, "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=1e-2))
            run, kind, ckpt = parse_tinker_path(tc.save_weights_for_sampler("w").result().path)
            paths.append(tmp_path / name / "runs" / run / kind / ckpt / "adapter.npz")
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert set(load_npz(paths[0])) == set(LocalServiceClient(root_dir=tmp_path / "z").create_lora_training_client(
        BASE, rank=4, seed=0).result()._model.lora)
