"""The array core's evaluation (``SimBatch``) equals the scalar sim's, world by world, bit for bit (sim result
version 6: score, failure counts and bill; the per-attempt text is the scalar sim's, consistent with them)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rsigym_env.services import EvalRequest
from rsigym_env.worlds.sim import BENCHMARKS, SimWorld
from rsigym_env.worlds.sim import batch as batch_module
from rsigym_env.worlds.sim.batch import HarnessArrays, SimBatch
from rsigym_env.worlds.sim.model import FAILURE_MODES, ModelState, draw_worlds

HARNESSES = (
    "",  # every option at the minimal harness's value
    '[generation]\non_truncation = "continue"\n[completion]\nverify_before_submit = true',
    "[generation]\nmax_output_tokens = 16384\n[shell]\npersistent = true\n[loop]\ndetect = true\n[edits]\ncheck = true",
    "[generation]\nmax_output_tokens = 512\n[edits]\ncheck = true",
    "[shell]\npersistent = maybe",  # does not parse: every attempt fails with harness_error
)
SEEDS = range(6)


def _files(world: SimWorld, toml: str) -> dict[str, str]:
    return {**world.initial_harness(), "harness.toml": toml}


def _twins(benchmark: str) -> tuple[list[SimWorld], SimBatch]:
    """The same worlds twice: scalar worlds, and a batch drawn from the same seeds. Every world gets a
    checkpoint "ckpt" (another skill, dev memory)."""
    scalar = [SimWorld(benchmark, s) for s in SEEDS]
    for s, w in zip(SEEDS, scalar):
        w.add_checkpoint("ckpt", ModelState(w.base_skill + 0.4 * (s % 3) - 0.3, dev_memory=0.1 * (s % 2)), 0.0)
    return scalar, SimBatch.make(benchmark, list(SEEDS))


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_batch_evaluation_equals_the_scalar_sim(benchmark: str) -> None:
    scalar, batch = _twins(benchmark)
    assert batch.base_skill.tolist() == [w.base_skill for w in scalar]
    rng = np.random.default_rng(len(benchmark))
    for split, k, n_tasks in (("official", 3, None), ("dev", 1, None), ("dev", 3, 7), ("official", 1, None),
                              ("dev", 3, None)):
        refs = [("base", "ckpt")[int(rng.integers(2))] for _ in SEEDS]
        tomls = [HARNESSES[int(rng.integers(len(HARNESSES)))] for _ in SEEDS]
        states = [w.model_state(ref) for w, ref in zip(scalar, refs)]
        harness = HarnessArrays.of([_files(w, t) for w, t in zip(scalar, tomls)])
        out = batch.evaluate(np.array([s.skill for s in states]), np.array([s.dev_memory for s in states]),
                             harness, k=k, split=split, n_tasks=n_tasks)
        for i, (world, ref, toml) in enumerate(zip(scalar, refs, tomls)):
            req = EvalRequest(checkpoint=ref, harness_version="v", harness_files=_files(world, toml), k=k,
                              split=split, n_tasks=n_tasks)
            billed = world.evaluation._run(req, official=split == "official")
            value = billed.value
            assert out.score[i] == value.score
            assert out.counts[i, 0] == sum(map(sum, value.rewards))  # the text shows the drawn successes
            counts = {m: int(c) for m, c in zip(FAILURE_MODES, out.failure_counts[i]) if c}
            assert counts == value.failure_modes
            shown = Counter(f.split(":")[0] for row in value.failures for f in row if f)
            assert shown == counts  # ... and the drawn failures, by mode
            assert (out.usd[i], out.seconds[i], out.tokens[i], out.sandbox_seconds[i]) == (
                billed.cost_usd, billed.seconds, value.tokens, value.sandbox_seconds)
    # both drew as often from their eval streams: what they draw next is equal too
    assert batch.eval_counters.tolist() == [w.streams.counters["eval"] for w in scalar]


def test_a_row_does_not_depend_on_the_others() -> None:
    """World 2's result is the same alone as in a batch of three (other seeds, skills, harnesses)."""
    alone = SimBatch.make("terminal-bench-2", [7])
    many = SimBatch.make("terminal-bench-2", [3, 5, 7])
    files = alone.initial_harness()
    one = alone.evaluate(alone.base_skill, [0.2], HarnessArrays.of([files]), k=3)
    three = many.evaluate(many.base_skill + [1.0, -1.0, 0.0], [0.0, 0.5, 0.2],
                          HarnessArrays.of([{**files, "harness.toml": HARNESSES[2]}, files, files]), k=3)
    assert np.array_equal(one.counts[0], three.counts[2]) and one.usd[0] == three.usd[2]
    assert one.score[0] == three.score[2]


def test_a_row_does_not_depend_on_the_batch_size_or_its_neighbours() -> None:
    """Every evaluation of 300 worlds (mixed splits, k, harnesses, skills, memories) equals each world
    evaluated alone: no reduction or product of the kernel mixes rows."""
    seeds = list(range(300))
    rng = np.random.default_rng(0)
    many = SimBatch.make("swe-bench-verified", seeds)
    files = [{**many.initial_harness(), "harness.toml": HARNESSES[int(i)]} for i in rng.integers(0, 5, 300)]
    skill = many.base_skill + rng.normal(0, 1, 300)
    memory = rng.random(300) * (rng.random(300) < 0.3)
    k, official = rng.integers(1, 9, 300), rng.random(300) < 0.4
    out = many.evaluate(skill, memory, HarnessArrays.of(files), k=k, split=official)
    for i in range(0, 300, 23):
        alone = SimBatch.make("swe-bench-verified", [i])
        one = alone.evaluate(skill[[i]], memory[[i]], HarnessArrays.of([files[i]]), k=int(k[i]),
                             split="official" if official[i] else "dev")
        assert np.array_equal(one.counts[0], out.counts[i]) and one.usd[0] == out.usd[i], i


def test_bad_arguments_are_refused() -> None:
    batch = SimBatch.make("aime", [0])
    harness = HarnessArrays.of([batch.initial_harness()])
    with pytest.raises(ValueError, match="k must be"):
        batch.evaluate(batch.base_skill, [0.0], harness, k=9)
    with pytest.raises(ValueError, match="split"):
        batch.evaluate(batch.base_skill, [0.0], harness, k=1, split="test")
    with pytest.raises(ValueError, match="n_tasks"):
        batch.evaluate(batch.base_skill, [0.0], harness, k=1, n_tasks=0)
    with pytest.raises(ValueError, match="one skill, memory, harness and split per world"):
        batch.evaluate(batch.base_skill, [0.0, 0.1], harness, k=1)
    with pytest.raises(ValueError, match="at least one world"):
        SimBatch("aime", [])
    with pytest.raises(ValueError, match="world seeds"):
        SimBatch("aime", [-1])


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_a_world_drawn_alone_equals_its_row_in_a_batch(benchmark: str) -> None:
    """Reset independence: every array of world 5 is the same drawn alone as among 40 other seeds."""
    alone, many = draw_worlds(BENCHMARKS[benchmark], [5]), draw_worlds(BENCHMARKS[benchmark], range(40))
    for name in ("present", "severity", "harm", "teacher_shift", "transfer", "threshold", "damage_scale", "half",
                 "base_skill"):
        assert np.array_equal(getattr(alone, name)[0], getattr(many, name)[5]), name
    for official in (True, False):
        a, b = alone.tasks(0, official), many.tasks(5, official)
        for name in ("difficulty", "reply_tokens", "flags", "interference", "present"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (official, name)


def test_evaluating_some_rows_and_resetting_rows_act_as_on_those_worlds_alone() -> None:
    """An autoreset redraws only its rows; an evaluation of a subset equals those rows of a full one."""
    batch, twin = SimBatch.make("skillsbench", [0, 1, 2, 3]), SimBatch.make("skillsbench", [0, 9, 2, 8])
    batch.reset([1, 3], [9, 8])
    assert np.array_equal(batch.base_skill, twin.base_skill) and batch.seeds.tolist() == [0, 9, 2, 8]
    files = batch.initial_harness()
    full = twin.evaluate(twin.base_skill, np.zeros(4), HarnessArrays.of([files] * 4), k=3)
    some = batch.evaluate(batch.base_skill[[3, 1]], np.zeros(2), HarnessArrays.of([files] * 2), k=3, rows=[3, 1])
    assert np.array_equal(some.counts, full.counts[[3, 1]]) and np.array_equal(some.usd, full.usd[[3, 1]])
    assert batch.eval_counters.tolist() == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="one seed per row"):
        batch.reset([0], [1, 2])


@pytest.mark.parametrize("benchmark", ["aime", "swe-bench-verified"])
def test_remembered_stats_give_every_evaluation_bit_for_bit(monkeypatch, benchmark: str) -> None:
    """``remember_stats``: 300 evaluations of random rows (a call's rows and inputs often again, duplicates in one
    call, both splits, dev memory, a few skills and harnesses, harnesses that do not parse), worlds redrawn
    (``reset``) and taken from another batch (``take``) in between: every score, count and bill equals the batch
    that computes every evaluation's stats, and most evaluations were remembered ones."""
    n, rng = 8, np.random.default_rng(4)
    plain, memo, ahead = SimBatch.make(benchmark, range(n)), SimBatch.make(benchmark, range(n)), SimBatch.make(benchmark, [50, 51])
    memo.remember_stats(slots=2)
    files = [_files(plain.model, toml) for toml in HARNESSES]
    skills = [plain.base_skill, plain.base_skill + 0.5, plain.base_skill - 0.25]
    computed = {id(plain): 0, id(memo): 0}  # rows whose stats each batch computed
    real, calling = batch_module.evaluation_stats, [plain]

    def counting(*args):
        computed[id(calling[0])] += len(args[1])
        return real(*args)

    monkeypatch.setattr(batch_module, "evaluation_stats", counting)
    for step in range(300):
        if step == 0 or rng.random() < 0.4:  # else the call before's rows and inputs again (its own draws)
            rows = rng.integers(0, n, size=int(rng.integers(1, 6)))
            harness = HarnessArrays.of([files[i] for i in rng.integers(0, len(files), size=rows.size)])
            skill = np.stack(skills)[rng.integers(0, len(skills), size=rows.size), rows]
            memory = rng.choice([0.0, 0.2], size=rows.size)
            split = rng.random(rows.size) < 0.3
        k = rng.integers(1, 4, size=rows.size)
        outs = []
        for b in (plain, memo):
            calling[0] = b
            outs.append(b.evaluate(skill, memory, harness, k=k, split=split, rows=rows))
        for field in ("score", "counts", "usd", "seconds", "tokens", "sandbox_seconds"):
            assert getattr(outs[0], field).tobytes() == getattr(outs[1], field).tobytes(), (step, field)
        if step % 20 == 19:  # the rows just evaluated: redrawn, or a world of another batch put there
            for b in (plain, memo):
                if step % 40 == 39:
                    b.reset(rows[:2], [1000 + step, 2000 + step][:rows[:2].size])
                else:
                    b.take(rows[:1], ahead, [step % 2])
    assert computed[id(memo)] < computed[id(plain)] / 2  # most evaluations were remembered ones


def test_per_defect_is_the_strided_running_sum() -> None:
    """``per_defect`` (a running sum over a (32, N, 5) product) gives the floats of the (N, 32, 5) product's reduce
    it replaced, zeros and all, for any number of rows (one row too, where NumPy would sum the codes pairwise)."""
    from rsigym_env.worlds.sim.model import CODE_BITS, per_defect

    rng = np.random.default_rng(7)
    for size in (0, 1, 2, 3, 17, 130, 2500):
        for _ in range(20):
            w = rng.random((size, 32)) * 10.0 ** rng.uniform(-6, 3, (size, 32))
            w[rng.random((size, 32)) < rng.random()] = 0.0
            assert per_defect(w).tobytes() == (w[:, None, :] * CODE_BITS.T).sum(axis=-1).tobytes()


def test_exposure_codes_at_the_minimal_limit_are_the_tabulated_ones() -> None:
    """The codes tabulated per task table (replies cut off at the minimal limit) are the ones worked out per row;
    a row with another limit in the same call is worked out (and the others' codes do not change)."""
    from rsigym_env.worlds.sim.model import MINIMAL_MAX_OUTPUT_TOKENS, exposure, task_table

    table = task_table("swe-bench-verified")
    half, variant = np.array([0, 1, 1, 0]), np.array([1, 1, 0, 0])
    present, severity, active = np.ones((4, 5), bool), np.full((4, 5), 0.3), np.ones((4, 5), bool)
    expected = table.codes[half] + 16 * (table.reply_tokens[variant, half] > MINIMAL_MAX_OUTPUT_TOKENS)
    assert (table.minimal_codes[variant, half] == expected).all()
    usual = exposure(table, half, variant, present, severity, np.full(4, MINIMAL_MAX_OUTPUT_TOKENS), active, table.n)
    mixed = exposure(table, half, variant, present, severity, np.array([4096, 512, 4096, 65536]), active, table.n)
    assert (usual.code == expected).all() and (mixed.code[[0, 2]] == expected[[0, 2]]).all()
    assert (mixed.code[1] == table.codes[1] + 16 * (table.reply_tokens[1, 1] > 512)).all()
    assert (mixed.code[3] == table.codes[0]).all()  # nothing is cut off at 65536 tokens


def test_harness_take_gathers_the_derived_arrays() -> None:
    """``HarnessArrays.take`` gives the options at the index with the derived arrays (made once, read-only) of
    those harnesses, as a new object computes them."""
    world = SimWorld("aime", 0)
    table = HarnessArrays.of([_files(world, toml) for toml in HARNESSES])
    derived = ("active", "applied", "bill_code", "memo_code")
    for name in derived:
        assert not getattr(table, name).flags.writeable
    index = np.array([4, 0, 2, 2, 1, 3])
    taken = table.take(index)
    fresh = HarnessArrays.of([_files(world, HARNESSES[i]) for i in index.tolist()])
    for name in derived:
        assert name in taken.__dict__  # gathered, not made again
        assert getattr(taken, name).tobytes() == getattr(fresh, name).tobytes(), name
    for field in ("max_output_tokens", "cont", "verify", "persistent", "detect", "check", "valid"):
        assert (getattr(taken, field) == getattr(fresh, field)).all(), field


def test_take_carries_the_remembered_stats_and_repeat_makes_room() -> None:
    """Worlds taken from a batch that remembers their evaluations are remembered where they go: the same
    evaluation there computes no stats and gives what a batch of those worlds alone gives."""
    seeds = [11, 12, 13]
    ahead, room = SimBatch.make("gpqa-diamond", seeds), SimBatch.repeat("gpqa-diamond", 0, 5)
    assert len(room) == 5 and (room.seeds == 0).all()
    ahead.remember_stats()
    room.remember_stats()
    harness = HarnessArrays.of([ahead.initial_harness()] * 3)
    ahead.evaluate(ahead.base_skill, np.zeros(3), harness, k=3, split="official")
    room.take([4, 0, 2], ahead, [0, 1, 2])
    calls = []
    real = batch_module.evaluation_stats
    try:
        batch_module.evaluation_stats = lambda *args: calls.append(len(args[1])) or real(*args)
        out = room.evaluate(room.base_skill[[4, 0, 2]], np.zeros(3), harness, k=3, split="official", rows=[4, 0, 2])
    finally:
        batch_module.evaluation_stats = real
    alone = SimBatch.make("gpqa-diamond", seeds).evaluate(ahead.base_skill, np.zeros(3), harness, k=3, split="official")
    assert calls == [] and out.score.tobytes() == alone.score.tobytes() and out.counts.tobytes() == alone.counts.tobytes()
