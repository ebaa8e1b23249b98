"""The RL researcher's rollouts through the vector sim (``Args.vector``: the array env for the policy, the
per-env route for the expert) give the episodes of its ``DiscreteMenu`` rollouts: the expert's and the greedy
shipped policy's are the same step for step."""

from __future__ import annotations

import numpy as np
import pytest

from rsigym_env.baselines.rl_researcher import Args, Trainer, collect, collect_vector, default_policy_path, load_policy
from rsigym_env.menu_vector import MenuArrayEnv

KEYS = ("return", "calls", "spend")
ARRAYS = ("obs", "mask", "actions", "rewards")


def by_job(episodes: list[dict]) -> dict[tuple, dict]:
    return {(e["track"], e["benchmark"], e["budget"], e["seed"]): e for e in episodes}


@pytest.mark.parametrize("player", ["expert", "shipped"])
def test_vector_rollouts_equal_the_menu_rollouts(player, monkeypatch):
    """The policy's rollouts go through the array env (``MenuArrayEnv``), the expert's through the per-env route."""
    params = None if player == "expert" else load_policy(default_policy_path())
    jobs = [(t, b, 500.0, 1_000_000 + k) for k, (t, b) in enumerate(
        [("joint", "aime"), ("data", "gpqa-diamond"), ("harness", "skillsbench"), ("joint", "swe-bench-verified"),
         ("joint", "aime"), ("joint", "aime"), ("data", "terminal-bench-2")])]
    array_steps = []
    step = MenuArrayEnv.step
    monkeypatch.setattr(MenuArrayEnv, "step", lambda self, actions: array_steps.append(1) or step(self, actions))
    scalar, vector = by_job(collect(params, jobs, 3, None)), by_job(collect_vector(params, jobs, 2, None))
    assert bool(array_steps) == (player == "shipped")
    assert set(scalar) == set(vector) and len(scalar) == len(jobs)
    for job, a in scalar.items():
        b = vector[job]
        assert [a[k] for k in KEYS] == [b[k] for k in KEYS], job
        for k in ARRAYS:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{job} {k}")
        # the critic's values come from matrix products over differently composed batches (BLAS blocks
        # rows by the batch's shape): equal to the last bits or so, not bit for bit
        np.testing.assert_allclose(a["values"], b["values"], rtol=1e-12, atol=1e-15)


def test_training_through_the_vector_sim_is_deterministic():
    args = Args(iterations=2, episodes_per_iteration=8, num_envs=4, workers=1, bc_episodes=8, bc_epochs=2,
                eval_every=0, hidden=16, benchmarks=("aime", "gpqa-diamond"), vector=True)
    runs = []
    for _ in range(2):
        trainer = Trainer(args)
        curve = trainer.run(log=False)
        runs.append((trainer.params, curve))
    assert all(np.array_equal(runs[0][0][k], runs[1][0][k]) for k in runs[0][0])
    assert [r["mean_return"] for r in runs[0][1]] == [r["mean_return"] for r in runs[1][1]]
