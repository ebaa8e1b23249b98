"""The local world's sampling pool: worker processes answer exactly what the in-process sampler
answers, for base models and checkpoints, keep errors by kind, and survive a worker's death."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from rsigym_env.worlds.local.lm.chat import chat_model  # noqa: E402
from rsigym_env.worlds.local.lm.inference_pool import InferencePool  # noqa: E402
from rsigym_env.worlds.local.lm.model import ContextOverflowError  # noqa: E402
from rsigym_env.worlds.local.lm.tinker_client import CheckpointNotFoundError, LocalServiceClient  # noqa: E402
from rsigym_env.worlds.common.training import SupervisedConfig, run_supervised  # noqa: E402
from rsigym_env.serving import ChatRequest  # noqa: E402

BASE = "rsigym-base"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A service with one trained sampler checkpoint and a two-worker pool over its directory."""
    root = tmp_path_factory.mktemp("pool")
    data = root / "data.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"Say {w}."},
                                                       {"role": "assistant", "content": w}]})
                              for w in ("alpha", "beta", "gamma", "delta")) + "\n")
    service = LocalServiceClient(root_dir=root / "tinker")
    result = run_supervised(service, SupervisedConfig(base_model=BASE, lora_rank=4, max_steps=2, batch_size=4,
                                                      learning_rate=1e-2, save_state=False), data)
    pool = InferencePool(root / "tinker", workers=2)
    yield service, pool, result.sampler_path
    pool.close()
    service.close("success")


def sample(client, tokens, seed, temperature=1.0, num_samples=2):
    params = types.SamplingParams(max_tokens=12, temperature=temperature, seed=seed)
    response = client.sample(types.ModelInput.from_ints(tokens), num_samples, params).result()
    return [(list(s.tokens), [round(x, 5) for x in s.logprobs], s.stop_reason) for s in response.sequences]


@pytest.mark.parametrize("which", ["base", "checkpoint"])
def test_pooled_samples_equal_in_process_samples(setup, which):
    service, pool, path = setup
    model_path, base_model = (None, BASE) if which == "base" else (path, None)
    local = service.create_sampling_client(model_path=model_path, base_model=base_model).result()
    pooled = pool.client(model_path=model_path, base_model=base_model, tokenizer=local.get_tokenizer())
    prompt = local.get_tokenizer().encode("Say alpha.")
    requests = [(seed, temp) for seed in (0, 1, 7) for temp in (0.0, 1.0)]
    futures = [pooled.sample(types.ModelInput.from_ints(prompt), 2,
                             types.SamplingParams(max_tokens=12, temperature=t, seed=s)) for s, t in requests]
    got = [[(list(q.tokens), [round(x, 5) for x in q.logprobs], q.stop_reason) for q in f.result(60).sequences]
           for f in futures]  # in flight at once: served by both workers, in any order
    assert got == [sample(local, prompt, s, t) for s, t in requests]


def test_a_served_chat_model_answers_the_same_through_the_pool(setup):
    service, pool, path = setup
    request = ChatRequest.model_validate({"model": path, "messages": [{"role": "user", "content": "Say beta."}],
                                          "max_tokens": 10, "seed": 3, "n": 3})
    direct = chat_model(service, model_path=path).complete(request)
    pooled = chat_model(service, model_path=path, pool=pool).complete(request)
    assert [c.model_dump() for c in pooled] == [c.model_dump() for c in direct]


def test_errors_keep_their_kind(setup):
    service, pool, path = setup
    tokenizer = service.create_sampling_client(base_model=BASE).result().get_tokenizer()
    missing = pool.client(model_path=path.replace("final", "nope"), base_model=None, tokenizer=tokenizer)
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint"):
        sample(missing, [1, 2, 3], 0)
    base = pool.client(base_model=BASE, tokenizer=tokenizer)
    with pytest.raises(ContextOverflowError):
        sample(base, [1] * 100_000, 0)
    assert sample(base, [1, 2, 3], 0)  # the workers still serve


def test_a_dead_worker_is_replaced(setup):
    service, pool, _ = setup
    tokenizer = service.create_sampling_client(base_model=BASE).result().get_tokenizer()
    base = pool.client(base_model=BASE, tokenizer=tokenizer)
    before = sample(base, [5, 6, 7], 4)
    for worker in pool._threads:
        if worker.proc is not None:
            worker.proc.kill()
            worker.proc.wait()
    assert [sample(base, [5, 6, 7], 4) for _ in range(4)] == [before] * 4


def test_a_started_pool_has_its_processes_before_any_request_and_samples_the_same(setup, tmp_path):
    """``start()`` spawns every worker process at once (no request yet); their samples are those of the pool that
    starts its workers at the first request; a started pool closes cleanly, with its processes gone."""
    import time

    service, pool, path = setup
    started = InferencePool(pool.root_dir, workers=2).start()
    try:
        deadline = time.monotonic() + 30
        while any(w.proc is None for w in started._threads) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(started._threads) == 2 and all(w.proc is not None and w.proc.poll() is None
                                                  for w in started._threads)
        assert started.start() is started and len(started._threads) == 2  # (twice: the same workers)
        procs = [w.proc for w in started._threads]
        tokenizer = service.create_sampling_client(base_model=BASE).result().get_tokenizer()
        for model_path, base_model in ((None, BASE), (path, None)):
            a = started.client(model_path=model_path, base_model=base_model, tokenizer=tokenizer)
            b = pool.client(model_path=model_path, base_model=base_model, tokenizer=tokenizer)
            assert [sample(a, [5, 6, 7], s) for s in (0, 3)] == [sample(b, [5, 6, 7], s) for s in (0, 3)]
        assert [w.proc for w in started._threads] == procs  # the requests went to the processes started ahead
    finally:
        started.close()
    assert all(p.poll() is not None for p in procs)
    with pytest.raises(RuntimeError, match="closed"):
        started.start()


def test_a_partly_started_pool_starts_the_rest_at_the_first_request(setup):
    import time

    service, pool, _ = setup
    started = InferencePool(pool.root_dir, workers=2).start(1)
    try:
        deadline = time.monotonic() + 30
        while started._threads[0].proc is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert started._threads[0].proc is not None and started._threads[1].proc is None
        tokenizer = service.create_sampling_client(base_model=BASE).result().get_tokenizer()
        a = started.client(base_model=BASE, tokenizer=tokenizer)
        b = pool.client(base_model=BASE, tokenizer=tokenizer)
        futures = [a.sample(types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=12, temperature=1.0, seed=s))
                   for s in range(6)]  # in flight at once: the second worker starts to take its share
        got = [[list(q.tokens) for q in f.result(60).sequences] for f in futures]
        assert got == [[t for t, _, _ in sample(b, [5, 6, 7], s, num_samples=1)] for s in range(6)]
    finally:
        started.close()


def test_a_pool_closed_while_its_workers_start_leaves_no_process(tmp_path, monkeypatch):
    from rsigym_env.worlds.local.lm import inference_pool

    spawned = []
    start = inference_pool._Worker._start
    monkeypatch.setattr(inference_pool._Worker, "_start", lambda self: spawned.append(start(self)) or spawned[-1])
    pool = InferencePool(tmp_path, workers=2).start()
    workers = list(pool._threads)
    pool.close()  # (at once: the processes may still be importing)
    assert len(spawned) == 2 and all(p.poll() is not None for p in spawned)
    assert all(w.proc is None and not w.thread.is_alive() for w in workers)


def test_a_closed_pool_refuses_new_work(tmp_path):
    pool = InferencePool(tmp_path, workers=1)
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(None, BASE, [1], 1, {"max_tokens": 1})
    pool.close()


def exactly(response) -> list[tuple[list[int], list[float], str]]:
    return [(list(s.tokens), list(s.logprobs), s.stop_reason) for s in response.sequences]


@pytest.mark.parametrize("which", ["base", "checkpoint"])
def test_a_shared_prefill_changes_no_sample(setup, which):
    """The same prompt in one scope is prefilled once — requests in flight at once wait for it — and
    every sample is bit for bit what it is without sharing, in the pool and in-process."""
    service, pool, path = setup
    model_path, base_model = (None, BASE) if which == "base" else (path, None)
    local = service.create_sampling_client(model_path=model_path, base_model=base_model).result()
    pooled = pool.client(model_path=model_path, base_model=base_model, tokenizer=local.get_tokenizer())
    prompt = types.ModelInput.from_ints(local.get_tokenizer().encode(f"Say beta, then gamma ({which})."))
    params = [types.SamplingParams(max_tokens=m, temperature=1.0, seed=s) for s in (0, 1, 2) for m in (6, 14)]
    plain = [exactly(local.sample(prompt, 2, p).result()) for p in params]
    reused = pool.reused
    futures = [pooled.sample_scoped(prompt, 2, p, f"eval-{which}") for p in params]
    assert [exactly(f.result(60)) for f in futures] == plain
    assert pool.reused - reused == len(params) - 1  # one prefill for all of them
    assert [exactly(local.sample_scoped(prompt, 2, p, "s").result()) for p in params] == plain


def test_prefills_are_never_shared_across_scopes(setup):
    """One evaluation's prefills are not another's: how fast a reply comes tells a harness nothing
    about what other evaluations asked."""
    service, pool, _ = setup
    local = service.create_sampling_client(base_model=BASE).result()
    pooled = pool.client(base_model=BASE, tokenizer=local.get_tokenizer())
    prompt = types.ModelInput.from_ints(local.get_tokenizer().encode("Say delta."))
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    first = exactly(pooled.sample_scoped(prompt, 1, params, "dev-eval").result(60))
    reused = pool.reused
    assert exactly(pooled.sample_scoped(prompt, 1, params, "official-eval").result(60)) == first
    assert pool.reused == reused  # computed afresh in the other scope
    assert exactly(pooled.sample_scoped(prompt, 1, params, "official-eval").result(60)) == first
    assert pool.reused == reused + 1
    assert exactly(pooled.sample(prompt, 1, params).result(60)) == first and pool.reused == reused + 1  # no scope: none


def test_every_evaluation_session_has_its_own_prefill_scope(tmp_path):
    from rsigym_env.serving import ModelRegistry
    from rsigym_env.serving.openai_server import UsageMeter
    from rsigym_env.worlds.common.harbor_agent import BudgetedModel, ModelSession

    class Model:
        supports_prefill_scope = True

    one, two = (ModelSession(socket=tmp_path / "m.sock", registry=ModelRegistry(), meter=UsageMeter(), model=Model())
                for _ in range(2))
    assert one.prefill_scope != two.prefill_scope and len(one.prefill_scope) == 32
    one.open("task", 0)
    assert {e.model.prefill_scope for e in one.registry.entries()} == {one.prefill_scope}
    assert BudgetedModel(object(), 10, "s").prefill_scope is None  # a model without scopes gets none


def conversation_prompts(tokenizer, n_turns: int = 4) -> list[list[int]]:
    """Prompts as a harness sends them: each turn repeats the one before (its reply, the output) and
    two conversations start alike, so they share prefill blocks at every depth."""
    prompts = []
    for who in ("alpha", "beta"):
        text = "<|system|>Reply with one line: $ <command>, ANSWER: <answer>, or DONE.<|end|>" \
               "<|user|>Make a directory named logs and list it, then say DONE.<|end|>"
        for turn in range(n_turns):
            text += f"<|assistant|>$ mkdir -p logs/{who}{turn} && ls logs<|end|><|user|>OUT: {who}{turn}<|end|>"
            prompts.append(tokenizer.encode(text + "<|assistant|>"))
    return prompts


def test_prefill_blocks_change_no_sample_whatever_the_concurrency(setup):
    """Determinism of the shared prefill blocks: conversations whose turns repeat each other, sampled
    (a) in-process without any cache, (b) through a one-worker pool one request at a time, in order,
    (c) through a two-worker pool all in flight at once, in a shuffled order, twice (the second time
    every request finds blocks) — every sample is bit for bit the same."""
    import random

    service, pool, path = setup
    local = service.create_sampling_client(model_path=path).result()
    tokenizer = local.get_tokenizer()
    prompts = conversation_prompts(tokenizer)
    assert all(len(p) > 64 for p in prompts)  # several blocks each
    params = [types.SamplingParams(max_tokens=10, temperature=1.0, seed=s) for s in range(len(prompts))]
    plain = [exactly(local.sample(types.ModelInput.from_ints(p), 2, s).result()) for p, s in zip(prompts, params)]
    one = InferencePool(pool.root_dir, workers=1)
    try:
        alone = one.client(model_path=path, tokenizer=tokenizer)
        got = [exactly(alone.sample_scoped(types.ModelInput.from_ints(p), 2, s, "eval-a").result(60))
               for p, s in zip(prompts, params)]
        assert got == plain and one.reused >= len(prompts) - 2  # every later turn reused its earlier blocks
    finally:
        one.close()
    pooled = pool.client(model_path=path, tokenizer=tokenizer)
    order = list(range(len(prompts)))
    random.Random(5).shuffle(order)
    for _wave in (1, 2):  # the second wave finds the first's blocks
        reused = pool.reused
        futures = {i: pooled.sample_scoped(types.ModelInput.from_ints(prompts[i]), 2, params[i], "eval-b") for i in order}
        assert [exactly(futures[i].result(60)) for i in range(len(prompts))] == plain
    assert pool.reused - reused == len(prompts)


def test_a_worker_is_sent_only_the_blocks_it_does_not_hold(setup):
    """A worker keeps the blocks it computed or was sent: a conversation's earlier turns are named to it,
    not pickled and piped again. With a budget that keeps about one block (evictions on every request),
    two workers in flight at once, and a worker killed on the way, every sample is still bit for bit the
    in-process one, and the pool's record of each worker's store stays within the budget."""
    import random

    service, pool, path = setup
    local = service.create_sampling_client(model_path=path).result()
    tokenizer = local.get_tokenizer()
    prompts = conversation_prompts(tokenizer)
    params = [types.SamplingParams(max_tokens=10, temperature=1.0, seed=s) for s in range(len(prompts))]
    plain = [exactly(local.sample(types.ModelInput.from_ints(p), 2, s).result()) for p, s in zip(prompts, params)]
    one = InferencePool(pool.root_dir, workers=1)
    try:
        alone = one.client(model_path=path, tokenizer=tokenizer)
        got = [exactly(alone.sample_scoped(types.ModelInput.from_ints(p), 2, s, "eval-c").result(60))
               for p, s in zip(prompts, params)]
        (worker,) = one._threads
        assert got == plain
        assert worker.sent == 0 and worker.named >= len(prompts) - 2  # it computed every block it was asked for
    finally:
        one.close()
    small = InferencePool(pool.root_dir, workers=2, worker_block_bytes=300_000)  # ~1.5 blocks of this model
    try:
        pooled = small.client(model_path=path, tokenizer=tokenizer)
        order = list(range(len(prompts)))
        random.Random(7).shuffle(order)
        # Which worker takes which request is the scheduler's choice: under load one worker may take a whole
        # wave (everything named, nothing sent). So the waves go on, bounded, until a block was sent too.
        for wave in range(1, 9):
            if wave == 3:
                small._threads[0].proc.kill()  # its store is gone: the pool's record of it must go too
                small._threads[0].proc.wait()
            futures = {i: pooled.sample_scoped(types.ModelInput.from_ints(prompts[i]), 2, params[i], "eval-d")
                       for i in order}
            assert [exactly(futures[i].result(60)) for i in range(len(prompts))] == plain
            assert all(w.held_bytes <= small.worker_block_bytes for w in small._threads)
            if wave >= 3 and sum(w.sent for w in small._threads) > 0:
                break
            random.Random(wave).shuffle(order)
        assert sum(w.named for w in small._threads) > 0 and sum(w.sent for w in small._threads) > 0
    finally:
        small.close()


def test_prefill_blocks_are_functions_of_their_tokens_alone():
    """A block computed as the tail of a short prompt, taken from a cache for a long one, or computed
    in a long one's prefill: the same floats; so is every sample, hit or miss."""
    import numpy as np
    from rsigym_env.worlds.local.lm import model as M

    cfg = M.ModelConfig(vocab_size=272, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=160)
    m = M.Transformer(cfg, M.init_params(cfg, 3))
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 256, 120).tolist()
    kw = dict(max_tokens=12, temperature=1.0, seed=4)

    def run(p, cache=None):
        return [(g.tokens, g.logprobs, g.stop_reason) for g in m.generate([p], prefill_cache=cache, prefill_key="k", **kw)[0]]

    fresh = run(prompt)
    cache = M.PrefillCache()
    run(prompt[:70], cache)  # blocks ending at 32, 64 and 70
    run(prompt[:64] + [7] * 30, cache)  # shares 32 and 64, then differs
    assert run(prompt, cache) == fresh and cache.hits >= 2
    assert run(prompt, cache) == fresh  # every block a hit
    block = cache.get(("k", tuple(prompt[:64])))
    other = M.PrefillCache()
    run(prompt[:64], other)  # the same block as the end of a prompt
    again = other.get(("k", tuple(prompt[:64])))
    assert all(np.array_equal(a, b) for a, b in zip(block[0] + block[1] + [block[2]], again[0] + again[1] + [again[2]]))


def test_requests_waiting_on_a_failed_prefill_fail_alike_and_do_not_hang(setup):
    """The same prompt in flight twice waits for the first's blocks; when the first fails (a prompt too
    long for the context), the one waiting is served (and fails the same way) instead of waiting forever."""
    service, pool, _ = setup
    tokenizer = service.create_sampling_client(base_model=BASE).result().get_tokenizer()
    pooled = pool.client(base_model=BASE, tokenizer=tokenizer)
    prompt = types.ModelInput.from_ints([5] * 600)
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=0)
    futures = [pooled.sample_scoped(prompt, 1, params, "eval-fails") for _ in range(3)]
    for future in futures:
        with pytest.raises(ContextOverflowError):
            future.result(60)
    assert not pool._computing and not pool._owners


def test_a_request_waiting_for_a_prompt_goes_when_it_is_prefilled_not_when_it_is_answered(setup):
    """The k attempts at a task start with the same prompt: the first computes its blocks, the others wait
    for them — for its prefill only. A one-token request for a prompt that a 400-token request is
    prefilling is answered (from that request's blocks, on the other worker) while the long one still
    decodes, and both samples are bit for bit the in-process ones."""
    service, pool, _ = setup
    local = service.create_sampling_client(base_model=BASE).result()
    pooled = pool.client(base_model=BASE, tokenizer=local.get_tokenizer())
    for _ in range(20):  # both worker processes up before the clock matters
        warm = [pooled.sample(types.ModelInput.from_ints([5, 6, 7]), 1, types.SamplingParams(max_tokens=40, seed=i))
                for i in range(4)]
        [f.result(60) for f in warm]
        if all(w.proc is not None and w.proc.poll() is None for w in pool._threads):
            break
    assert len(pool._threads) == 2 and all(w.proc.poll() is None for w in pool._threads)
    prompt = types.ModelInput.from_ints(local.get_tokenizer().encode("Say epsilon, then zeta, then eta. " * 3))
    assert len(prompt.to_ints()) > 64  # several blocks
    long, short = (types.SamplingParams(max_tokens=m, temperature=1.0, seed=9, stop=[]) for m in (400, 1))
    reused = pool.reused
    first = pooled.sample_scoped(prompt, 1, long, "eval-early")
    second = pooled.sample_scoped(prompt, 1, short, "eval-early")
    got = exactly(second.result(60))
    assert not first._future.done()  # still decoding its 400 tokens
    assert pool.reused == reused + 1  # the second used the first's blocks
    assert got == exactly(local.sample(prompt, 1, short).result())
    assert exactly(first.result(60)) == exactly(local.sample(prompt, 1, long).result())
    assert len(exactly(first.result(60))[0][0]) == 400
    assert not pool._computing and not pool._owners
