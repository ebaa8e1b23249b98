"""bench/bench_v7_numba.py (brief 29a): the numba-compiled step of the version-7 prototype gives bit for bit what the
NumPy prototype (bench/bench_v7_prototype.py) gives: observations, rewards, ends, every info array and the
ledger's books and audit records, under masked uniform actions and under a policy that rarely submits (episodes
end by the limits), at N = 1, 7, 64; its helpers (log, normal quantile, uniforms, nano and cent rounding) equal
NumPy's. Brief 29b: the compiled worlds ahead (``compiled_worlds``) equal the NumPy path's on every benchmark,
redraws included, and step the same; a ledger entry per K steps keeps every episode and a chain ``rsigym audit
verify``'s check accepts. ~9 s with numba's cache warm, 25-27 s cold (load < 1); the first run compiles."""

from __future__ import annotations

import doctest

import rsigym_env  # noqa: F401  (before NumPy)
import numpy as np
import pytest

from rsigym_env.catalog import BENCHMARKS
from rsigym_env.wrappers.menu import MENU_INDEX

from bench_helpers import load_bench
from menu_helpers import assert_a_changed_byte_breaks_the_audit, masked_uniform

pytest.importorskip("numba")


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_v7_numba")


@pytest.fixture(scope="module")
def proto():
    return load_bench("bench_v7_prototype")


def same_bits(a: object, b: object) -> bool:
    """Same dtype, shape and bytes (so -0.0 differs from 0.0, and NaNs compare by their bits)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _audit(ledger) -> list[tuple]:
    """The audit records without their wall-clock time (and so without the hash chain over it)."""
    return [(r.seq, r.key, {k: v for k, v in r.event.items() if k != "wall_time"}) for r in ledger.audit_records()]


def run_both(bench, proto, n: int, seed: int, steps: int, rarely_submit: bool = False, compiled_worlds: bool = False,
             **kwargs) -> tuple[int, int]:
    """Step the NumPy prototype and the numba env (``compiled_worlds``: its worlds ahead from the compiled
    ``worlds_ahead``) side by side with the same actions; assert every output equal bit for bit and money never
    negative; return (episodes ended, refusals)."""
    a = proto.V7HarnessEnv(n, **kwargs)
    b = bench.V7NumbaEnv(n, compiled_worlds=compiled_worlds, **kwargs)
    (obs_a, info_a), (obs_b, info_b) = a.reset(seed=seed), b.reset(seed=seed)
    assert same_bits(obs_a, obs_b) and same_bits(info_a["action_mask"], info_b["action_mask"])
    rng = np.random.default_rng(seed + 1000)
    ended = refused = 0
    submits = [MENU_INDEX["submit_best"], MENU_INDEX["submit_latest"]]
    for step in range(steps):
        mask = info_a["action_mask"].copy()
        if rarely_submit:
            mask[:, submits] &= rng.random((n, 1)) < 0.01
        actions = masked_uniform(rng, mask)
        out_a, out_b = a.step(actions), b.step(actions)
        for name, x, y in zip(("obs", "reward", "terminated", "truncated"), out_a[:4], out_b[:4]):
            assert same_bits(x, y), (name, n, seed, step)
        info_a, info_b = out_a[4], out_b[4]
        assert info_a.keys() == info_b.keys(), (n, seed, step)
        for key in info_a:
            assert same_bits(info_a[key], info_b[key]), (key, n, seed, step)
        assert (b.spent >= 0).all() and (b.reserved >= 0).all() and (b.spent + b.reserved <= b.budget_n).all()
        ended += int((out_b[2] | out_b[3]).sum())
        refused += int((~info_b["ok"] & (info_b["n_calls"] > 0)).sum())
    if a.ledger is not None:
        assert a.ledger.books() == b.ledger.books() and b.ledger.books().ok
        assert _audit(a.ledger) == _audit(b.ledger)
        assert sum(len(r.event.get("episodes", [])) for r in b.ledger.audit_records()) == ended
    return ended, refused


@pytest.mark.parametrize("n, seeds, steps", [(1, range(3), 500), (7, range(2), 400), (64, range(2), 250)])
def test_masked_uniform_steps_equal_the_numpy_prototype_bit_for_bit(bench, proto, n, seeds, steps):
    ended = 0
    for seed in seeds:
        ended += run_both(bench, proto, n, seed, steps)[0]
    assert ended > 50 * n


@pytest.mark.parametrize("n, seed", [(7, 5), (64, 6)])
def test_limits_refusals_and_billed_shares_equal_the_numpy_prototype(bench, proto, n, seed):
    """Submits rare: episodes end by the time limit (a running job billed for its share), the refusal limit (a
    small budget: evaluations refused), and run many steps."""
    ended, refused = run_both(bench, proto, n, seed, 400, rarely_submit=True)
    assert ended > 2 * n
    ended, refused = run_both(bench, proto, n, seed, 300, rarely_submit=True, benchmark="aime", budget_usd=2.0)
    assert ended > n and refused > 50 * n
    run_both(bench, proto, n, seed, 150, ledger=False, benchmark="gpqa-diamond", budget_usd=20.0)


@pytest.mark.parametrize("n, ahead, recycle", [(7, 40, False), (64, 100, False), (64, 100, True)])
def test_new_batches_of_worlds_ahead_equal_the_numpy_prototype(bench, proto, monkeypatch, n, ahead, recycle):
    """A small buffer ahead: the step draws a new batch (or recycles the first) every few steps, as it does every
    ~80 steps at N = 256 with the real 4096."""
    monkeypatch.setattr(proto, "AHEAD", ahead)
    env = bench.V7NumbaEnv(n, ledger=False, recycle_worlds=recycle)
    env.reset(seed=0)
    batches = []
    monkeypatch.setattr(env, "_draw_ahead", lambda real=env._draw_ahead: batches.append(1) or real())
    rng = np.random.default_rng(0)
    for _ in range(100):
        env.step(masked_uniform(rng, env._view()[1]))
    assert (len(batches) >= 2) != recycle
    ended, _ = run_both(bench, proto, n, 9, 120, ledger=False, recycle_worlds=recycle)
    assert ended > 2 * ahead


def test_helpers_equal_numpys_bit_for_bit(bench):
    assert bench.check_helpers(200_000) == dict.fromkeys(("log", "norm_ppf", "uniforms", "nano_up", "nano_near",
                                                          "round9"), 0)


def test_world_helpers_equal_numpys_bit_for_bit(bench):
    assert bench.check_world_helpers(200_000) == {"exp": 0, "log1p": 0}


def test_docstring_examples(bench):
    result = doctest.testmod(bench, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_the_comparison_sees_a_changed_draw(bench, proto):
    """The equality is not vacuous: a numba env whose rows draw from other stream keys gives other scores."""
    a, b = proto.V7HarnessEnv(8, ledger=False), bench.V7NumbaEnv(8, ledger=False)
    a.reset(seed=0)
    b.reset(seed=0)
    b.keys[:, 0] ^= np.uint64(1)  # the dev evaluations' stream
    actions = np.full(8, MENU_INDEX["eval_latest_k3"])
    obs_a, obs_b = a.step(actions)[0], b.step(actions)[0]
    assert not same_bits(obs_a, obs_b)


def test_bad_actions_are_a_clear_error(bench):
    env = bench.V7NumbaEnv(2, benchmark="aime", ledger=False)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="one menu index"):
        env.step(np.array([0, 27]))


# ---------------------------------------------------------------------- brief 29b: compiled worlds, ledger per K


@pytest.mark.parametrize("benchmark", list(BENCHMARKS))
def test_compiled_worlds_ahead_equal_numpys_bit_for_bit(bench, benchmark):
    """A whole batch of worlds ahead (4096), drawn compiled (``compiled_worlds=True``) or only made into tables
    compiled (``"tables"``): seeds, per-code tables, world rows, stream keys, variants, halves and initial official
    scores, byte for byte the NumPy prototype's, on every benchmark."""
    a = bench.V7NumbaEnv(3, benchmark=benchmark, ledger=False)
    a.reset(seed=11)
    assert len(a._ahead) == 7 and len(np.unique(a._ahead[6])) > 5  # the initial scores vary
    for compiled in (True, "tables"):
        b = bench.V7NumbaEnv(3, benchmark=benchmark, ledger=False, compiled_worlds=compiled)
        b.reset(seed=11)
        assert b._made == bench.CHUNK  # made a chunk at a time: the rest now
        b._make(b._made, len(b._ahead[0]))
        for x, y in zip(a._ahead, b._ahead, strict=True):
            assert same_bits(x, y), compiled


def test_compiled_draw_worlds_redraws_infeasible_systems_as_the_model(bench):
    """At a paper score of 0.6 most systems are redrawn (from the world's next blocks) before they are feasible:
    present, severity, harm, half and base skill still equal ``draw_worlds``' bit for bit."""
    import dataclasses

    from rsigym_env.worlds.sim import model

    env = bench.V7NumbaEnv(1, ledger=False)
    benchmark = dataclasses.replace(env.benchmark, initial_score=0.6)
    seeds = np.arange(300, dtype=np.uint64)
    want, usual = model.draw_worlds(benchmark, seeds), model.draw_worlds(env.benchmark, seeds)
    assert (want.half != usual.half).sum() > 50  # redrawn
    domain, table = benchmark.domain, model.task_table(benchmark.id)
    got = bench.draw_worlds_compiled(seeds, np.uint64(env.bkey), model.SYSTEM_DRAWS + len(domain.teacher_accuracy),
                                     np.asarray(domain.exposure) > 0, np.asarray(domain.prevalence, float),
                                     np.asarray(domain.severity, float), table.minimal_codes, model.Harness().active,
                                     0.6, model.solve_curve(benchmark.id), model.SKILL_GRID, table.exp_difficulty,
                                     bench._PPF)
    for x, y in zip((want.present, want.severity, want.harm, want.half, want.base_skill), got, strict=True):
        assert same_bits(x, y)


@pytest.mark.parametrize("n, ahead, kwargs", [(7, 40, {}), (64, 100, {"benchmark": "aime", "budget_usd": 2.0})])
def test_steps_with_compiled_worlds_equal_the_numpy_prototype(bench, proto, monkeypatch, n, ahead, kwargs):
    """With the compiled worlds and a small buffer ahead (a new compiled batch every few steps): obs, rewards,
    ends, every info array and the ledger equal the NumPy prototype's."""
    monkeypatch.setattr(proto, "AHEAD", ahead)
    ended, _ = run_both(bench, proto, n, 4, 150, compiled_worlds=True, **kwargs)
    assert ended > 2 * ahead


def _episodes(ledger) -> list[dict]:
    return [e for r in ledger.audit_records() for e in r.event.get("episodes", [])]


@pytest.mark.parametrize("k", [16, 64])
def test_a_ledger_entry_per_k_steps_keeps_every_episode_and_a_verified_chain(bench, tmp_path, capsys, k):
    """``ledger_every=K``: the same episodes, in the same order and with the same fields, as an entry every step;
    one entry (and one account) per K steps; the same total spend; the books balance and ``rsigym audit
    verify``'s check accepts the file; a changed byte breaks it."""
    from rsigym_env.platform.audit import verify_audit
    from rsigym_env.platform.ledger import Ledger

    steps, n = 3 * k + 5, 16
    a = bench.V7NumbaEnv(n, ledger=True)
    b = bench.V7NumbaEnv(n, ledger=True, ledger_every=k)
    path = tmp_path / "ledger.sqlite"
    b.ledger = Ledger(path)
    rng = np.random.default_rng(k)
    info = a.reset(seed=k)[1]
    b.reset(seed=k)
    for _ in range(steps):
        actions = masked_uniform(rng, info["action_mask"])
        out = a.step(actions)
        assert all(same_bits(x, y) for x, y in zip(out[:4], b.step(actions)[:4]))
        info = out[4]
    b.flush_ledger()
    b.flush_ledger()  # nothing pending: no entry
    assert len(_episodes(a.ledger)) > 5 * n and _episodes(a.ledger) == _episodes(b.ledger)
    assert len(b.ledger.accounts()) == -(-steps // k) and len(b.ledger.audit_records()) == -(-steps // k)
    spent = [sum(line.spent_usd for line in ledger.books().lines) for ledger in (a.ledger, b.ledger)]
    assert spent[1] == pytest.approx(spent[0], rel=1e-12) and spent[0] > 0 and b.ledger.books().ok
    b.ledger.close()
    assert verify_audit(path).ok
    assert_a_changed_byte_breaks_the_audit(path, capsys)
