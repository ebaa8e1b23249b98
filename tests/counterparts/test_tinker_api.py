"""The Tinker counterpart driven by the unchanged ``tinker`` SDK: training, checkpoints, sampling, errors."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types

from rsigym_env.counterparts.tinker_api import (
    TinkerCounterpart, forward_backward_output_to_proto, forward_backward_request_from_proto, sample_response_to_proto,
)
from rsigym_env.worlds.local.lm import tinker_client
from rsigym_env.worlds.local.lm.model import ModelConfig

MODEL = "Qwen/Qwen3-8B"  # a Tinker id; the counterpart serves a tiny local base under it


@pytest.fixture(scope="module")
def counterpart(tmp_path_factory):
    root = tmp_path_factory.mktemp("tinker-counterpart")
    tinker_client.register_base_model("counterpart-tiny", tinker_client.make_random_base(
        root / "base", ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=128)))
    with TinkerCounterpart(root, {MODEL: "counterpart-tiny"}, long_poll_s=2.0) as server:
        yield server


@pytest.fixture(scope="module")
def service(counterpart):
    client = tinker.ServiceClient(base_url=counterpart.url, api_key=counterpart.api_key)
    yield client
    # finish the session while the counterpart still runs: otherwise the SDK heartbeats it for the life of the process
    client.close("success", detail="test module done").result(timeout=30)


def _datum(tokens=(256, 104, 105), targets=(104, 105, 257), weights=(0.0, 1.0, 1.0)) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(list(tokens)),
                       loss_fn_inputs={"target_tokens": list(targets), "weights": list(weights)})


def test_protobuf_round_trips_through_the_sdks_own_codecs():
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

    request = types.ForwardBackwardRequest(forward_backward_input=types.ForwardBackwardInput(
        data=[_datum(), _datum((256, 1), (1, 257), (1.0, 1.0))], loss_fn="cross_entropy"), model_id="m", seq_id=3)
    decoded, forward_only = forward_backward_request_from_proto(forward_backward_request_to_proto(request).SerializeToString())
    assert not forward_only and decoded.model_id == "m" and decoded.seq_id == 3
    assert [d.model_input.to_ints() for d in decoded.forward_backward_input.data] == [[256, 104, 105], [256, 1]]
    assert decoded.forward_backward_input.data[1].loss_fn_inputs["weights"].tolist() == [1.0, 1.0]

    out = types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics={"loss:sum": 2.5}, loss_fn_outputs=[
        {"logprobs": types.TensorData.from_numpy(np.array([-1.0, -2.0], np.float32))},
        {"logprobs": types.TensorData.from_numpy(np.array([-3.0], np.float32))}])
    back = deserialize_forward_backward_output(forward_backward_output_to_proto(out))
    assert back.metrics == {"loss:sum": 2.5}
    assert [d["logprobs"].tolist() for d in back.loss_fn_outputs] == [[-1.0, -2.0], [-3.0]]

    resp = types.SampleResponse(sequences=[types.SampledSequence(stop_reason="length", sequence_id="s", tokens_np=np.array([5, 6], np.int32),
                                                                logprobs_np=np.array([-0.5, -1.5], np.float32))])
    seq = deserialize_sample_response(sample_response_to_proto(resp)).sequences[0]
    assert (list(seq.tokens), list(seq.logprobs), seq.stop_reason) == ([5, 6], [-0.5, -1.5], "length")


def test_train_save_sample_and_resume_with_the_unchanged_sdk(service, counterpart):
    with pytest.warns(FutureWarning):  # deprecated in 0.38, still served
        caps = service.get_server_capabilities()
    assert [m.model_name for m in caps.supported_models] == [MODEL]
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()
    info = tc.get_info()
    assert info.model_data.model_name == MODEL and info.lora_rank == 4
    tokenizer = tc.get_tokenizer()  # Hugging Face's AutoTokenizer on the directory the counterpart reports
    assert tokenizer.encode("hi", add_special_tokens=False) == [104, 105]

    first = tc.forward_backward([_datum()], "cross_entropy").result()
    assert first.metrics["loss:sum"] > 0 and first.loss_fn_outputs[0]["logprobs"].shape == [3]
    assert tc.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics is not None
    second = tc.forward_backward([_datum()], "cross_entropy").result()
    assert second.metrics["loss:sum"] < first.metrics["loss:sum"]  # the step trained the LoRA weights

    sampler_path = tc.save_weights_for_sampler("step-1").result().path
    state_path = tc.save_state("state-1").result().path
    assert sampler_path.startswith("tinker://") and sampler_path.endswith("/sampler_weights/step-1")
    sampler = service.create_sampling_client(model_path=sampler_path).result()
    params = types.SamplingParams(max_tokens=4, seed=0, temperature=1.0)
    one = sampler.sample(types.ModelInput.from_ints([256, 259, 104]), 2, params).result()
    again = sampler.sample(types.ModelInput.from_ints([256, 259, 104]), 2, params).result()
    assert [len(s.tokens) for s in one.sequences] == [4, 4] and one.sequences[0].stop_reason == "length"
    assert [list(s.tokens) for s in one.sequences] == [list(s.tokens) for s in again.sequences]  # seeded

    listed = tinker.RestClient(base_url=counterpart.url, api_key=counterpart.api_key).list_checkpoints(
        tc.model_id).result()
    assert sorted(c.tinker_path for c in listed.checkpoints) == sorted([sampler_path, state_path])
    assert {c.checkpoint_type for c in listed.checkpoints} == {"training", "sampler"}

    snapshot = tc.save_weights_and_get_sampling_client().result()  # a sampling session over the current weights
    assert len(snapshot.sample(types.ModelInput.from_ints([256]), 1, params).result().sequences[0].tokens) == 4
    base = service.create_sampling_client(base_model=MODEL).result()
    logprobs = base.compute_logprobs(types.ModelInput.from_ints([256, 104, 105])).result()
    assert logprobs[0] is None and all(lp < 0 for lp in logprobs[1:])

    resumed = service.create_training_client_from_state_with_optimizer(state_path).result()
    assert resumed.forward_backward([_datum()], "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        second.metrics["loss:sum"], rel=1e-6)  # the saved state is the trained one


def test_failures_reach_the_sdk_named(service, counterpart):
    tc = service.create_lora_training_client(base_model=MODEL, rank=2, seed=0).result()
    with pytest.raises(tinker.RequestFailedError, match="ppo"):
        tc.forward_backward([_datum()], "ppo").result()  # refused in the future, naming the loss
    with pytest.raises(Exception, match="not served here"):
        service.create_lora_training_client(base_model="meta-llama/Llama-3.1-8B", rank=2).result()
    with pytest.raises(Exception, match="does not exist|no checkpoint|unknown"):
        service.create_sampling_client(model_path="tinker://nope/sampler_weights/x").result()


def test_the_key_is_checked_and_unknown_routes_are_named(counterpart):
    import httpx

    with httpx.Client(base_url=counterpart.url, timeout=10) as http:
        assert http.get("/api/v1/healthz").json() == {"status": "ok"}
        assert http.post("/api/v1/create_session", json={}).status_code == 401
        reply = http.post("/api/v1/copy_weights", json={}, headers={"X-API-Key": counterpart.api_key})
        assert reply.status_code == 404 and "copy_weights" in reply.json()["detail"]
        bad = http.post("/api/v1/optim_step", json={"model_id": 3}, headers={"X-API-Key": counterpart.api_key})
        assert bad.status_code == 400 and "optim_step" in bad.json()["detail"]
    with pytest.raises(tinker.AuthenticationError, match="API key"):
        tinker.ServiceClient(base_url=counterpart.url, api_key="tml-wrong").create_lora_training_client(MODEL, rank=2)


def test_the_openai_compatible_endpoint_serves_the_base_and_checkpoints_by_path(service, counterpart):
    import openai

    tc = service.create_lora_training_client(base_model=MODEL, rank=2, seed=1).result()
    tc.forward_backward([_datum()], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = tc.save_weights_for_sampler("oai-1").result().path
    client = openai.OpenAI(base_url=counterpart.oai_base_url, api_key=counterpart.api_key, max_retries=0, timeout=30)
    for model in (MODEL, path):
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3, seed=0)
        assert reply.usage.completion_tokens <= 3 and reply.choices[0].finish_reason in ("stop", "length")
    assert counterpart.usage.get(path).completion_tokens > 0
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="tinker://nope/sampler_weights/x", max_tokens=1,
                                       messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=counterpart.oai_base_url, api_key="tml-wrong", max_retries=0).chat.completions.create(
            model=MODEL, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
