"""bench/bench_v7_prototype.py (brief 28c): its per-code evaluation statistics are the model's per-task ones, and
its array step keeps the run's money and limits honest (never negative, never over budget, every finished episode
in the ledger once, books that balance). ~3 s."""

from __future__ import annotations

import doctest

import rsigym_env  # noqa: F401  (before NumPy)
import numpy as np
import pytest

from rsigym_env.wrappers.menu import MENU, MENU_INDEX

from bench_helpers import load_bench
from menu_helpers import masked_uniform


@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_v7_prototype")


def test_docstring_examples(bench):
    result = doctest.testmod(bench, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_per_code_stats_equal_the_models_per_task_stats(bench):
    assert bench.check(("aime",), worlds=40) < 1e-12


def test_masked_random_steps_keep_money_limits_and_ledger_honest(bench):
    n = 32
    env = bench.V7HarnessEnv(n, benchmark="aime", budget_usd=20.0, ledger=True)  # a small budget: refusals happen
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0)
    ended, refused = 0, 0
    for _ in range(150):
        mask = info["action_mask"]
        assert mask[:, [i for i, m in enumerate(MENU) if m.kind in ("gen", "clean", "train")]].sum() == 0
        actions = masked_uniform(rng, mask)
        obs, reward, terminated, truncated, info = env.step(actions)
        assert obs.shape == (n, 50) and obs.dtype == np.float32 and (np.abs(obs) <= 1).all()
        assert (env.spent >= 0).all() and (env.reserved >= 0).all()
        assert (env.spent + env.reserved <= env.budget_n).all()
        assert (env.steps <= env.scenario.max_steps).all()
        done = terminated | truncated
        assert not (terminated & truncated).any() and np.isfinite(reward[done]).all()
        ended += int(done.sum())
        refused += int((~info["ok"] & (info["n_calls"] > 0)).sum())
    assert ended > 100 and refused > 0
    assert env.ledger.books().ok
    listed = sum(len(r.event.get("episodes", [])) for r in env.ledger.audit_records())
    assert listed == ended


def test_a_fix_then_its_mask_and_a_second_fix_is_refused(bench):
    env = bench.V7HarnessEnv(2, benchmark="aime", ledger=False)
    obs, info = env.reset(seed=1)
    fix = MENU_INDEX["fix:truncated_output"]
    obs, _, _, _, info = env.step(np.array([fix, fix]))
    assert info["ok"].all() and info["n_calls"].tolist() == [2, 2]  # read the file, then edit it
    assert not info["action_mask"][:, fix].any() and (env.version & 1).all()
    obs, _, _, _, info = env.step(np.array([fix, MENU_INDEX["eval_latest_k1"]]))
    assert info["ok"].tolist() == [False, True] and env.refusals.tolist() == [1, 0]


def test_bad_actions_are_a_clear_error(bench):
    env = bench.V7HarnessEnv(2, benchmark="aime", ledger=False)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="one menu index"):
        env.step(np.array([0, len(MENU)]))
    with pytest.raises(ValueError, match="one menu index"):
        env.step(np.array([0.5, 1.0]))
