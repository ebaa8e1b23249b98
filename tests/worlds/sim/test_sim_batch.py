"""The array core's evaluation (``SimBatch``) equals the scalar sim's, world by world, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from rsigym_env.services import EvalRequest
from rsigym_env.worlds.sim import BENCHMARKS, SimWorld
from rsigym_env.worlds.sim.batch import HarnessArrays, SimBatch
from rsigym_env.worlds.sim.model import FAILURE_MODES, ModelState

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
    """The same worlds twice: one set evaluated by the scalar sim, the other through the batch. Some
    seeds get a trained checkpoint "ckpt" (another skill, dev memory)."""
    pairs = [(SimWorld(benchmark, s), SimWorld(benchmark, s)) for s in SEEDS]
    for s, pair in zip(SEEDS, pairs):
        for w in pair:
            skill = w.base_skill + 0.4 * (s % 3) - 0.3
            w.add_checkpoint("ckpt", ModelState(skill, dev_memory=0.1 * (s % 2)), ready_at=0.0)
    return [a for a, _ in pairs], SimBatch([b for _, b in pairs])


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_batch_evaluation_equals_the_scalar_sim(benchmark: str) -> None:
    scalar, batch = _twins(benchmark)
    rng = np.random.default_rng(len(benchmark))
    for split, k, n_tasks in (("official", 3, None), ("dev", 1, None), ("dev", 3, 7), ("official", 1, None),
                              ("dev", 3, None)):
        refs = [("base", "ckpt")[int(rng.integers(2))] for _ in SEEDS]
        tomls = [HARNESSES[int(rng.integers(len(HARNESSES)))] for _ in SEEDS]
        states = [w.model_state(ref) for w, ref in zip(batch.worlds, refs)]
        harness = HarnessArrays.of([_files(w, t) for w, t in zip(batch.worlds, tomls)])
        out = batch.evaluate(np.array([s.skill for s in states]), np.array([s.dev_memory for s in states]),
                             harness, k=k, split=split, n_tasks=n_tasks)
        for i, (world, ref, toml) in enumerate(zip(scalar, refs, tomls)):
            req = EvalRequest(checkpoint=ref, harness_version="v", harness_files=_files(world, toml), k=k,
                              split=split, n_tasks=n_tasks)
            billed = world.evaluation._run(req, official=split == "official")
            value = billed.value
            assert out.score[i] == value.score
            assert out.success[i].astype(float).tolist() == value.rewards
            labels = [[FAILURE_MODES[j] if j >= 0 else "" for j in row] for row in out.label[i].tolist()]
            assert labels == [[f.split(":")[0] for f in row] for row in value.failures]
            counts = {m: int(c) for m, c in zip(FAILURE_MODES, out.failure_counts[i]) if c}
            assert counts == value.failure_modes
            assert (out.usd[i], out.seconds[i], out.tokens[i], out.sandbox_seconds[i]) == (
                billed.cost_usd, billed.seconds, value.tokens, value.sandbox_seconds)
    # both sets drew the same numbers from their eval streams: what they draw next is equal too
    for a, b in zip(scalar, batch.worlds):
        assert a.rng("eval").random() == b.rng("eval").random()


def test_a_row_does_not_depend_on_the_others() -> None:
    """World 2's result is the same alone as in a batch of three (other seeds, skills, harnesses)."""
    alone = SimBatch.make("terminal-bench-2", [7])
    many = SimBatch.make("terminal-bench-2", [3, 5, 7])
    files = alone.worlds[0].initial_harness()
    one = alone.evaluate(alone.base_skill, [0.2], HarnessArrays.of([files]), k=3)
    three = many.evaluate(many.base_skill + [1.0, -1.0, 0.0], [0.0, 0.5, 0.2],
                          HarnessArrays.of([_files(many.worlds[0], HARNESSES[2]), files, files]), k=3)
    assert np.array_equal(one.success[0], three.success[2]) and one.usd[0] == three.usd[2]
    assert one.score[0] == three.score[2]


def test_bad_arguments_are_refused() -> None:
    batch = SimBatch.make("aime", [0])
    harness = HarnessArrays.of([batch.worlds[0].initial_harness()])
    with pytest.raises(ValueError, match="k must be"):
        batch.evaluate(batch.base_skill, [0.0], harness, k=9)
    with pytest.raises(ValueError, match="split"):
        batch.evaluate(batch.base_skill, [0.0], harness, k=1, split="test")
    with pytest.raises(ValueError, match="n_tasks"):
        batch.evaluate(batch.base_skill, [0.0], harness, k=1, n_tasks=0)
    with pytest.raises(ValueError, match="one skill, memory and harness per world"):
        batch.evaluate(batch.base_skill, [0.0, 0.1], harness, k=1)
    with pytest.raises(ValueError, match="share benchmark"):
        SimBatch([SimWorld("aime", 0), SimWorld("gpqa-diamond", 0)])
