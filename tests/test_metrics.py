"""Research-quality metrics: in every episode's end info, in sweep records and reports."""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import given, strategies as st

from rsigym_env.baselines import make_researcher
from rsigym_env.episode import run_episode
from rsigym_env.metrics import compounding, episode_metrics, improver_gain, mean_se
from rsigym_env.report import markdown_report, quality_table
from rsigym_env.sweep import make_grid, sweep


def test_scripted_episode_metrics_are_consistent_with_its_end_info():
    env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500)
    info = run_episode(env, make_researcher("scripted"), seed=0).info
    m = info["metrics"]
    assert m["discovery"] == info["best_dev_score"] > 0
    assert m["selection"] == 0.0 and m["best_candidate_official_score"] == info["official_score"]  # it submits its best
    assert m["retention"] == pytest.approx(info["official_score"] - info["best_dev_score"])
    assert m["efficiency"] == pytest.approx(info["normalized_gain"] / info["spend_usd"]) and m["selection_eval_usd"] == 0


@pytest.mark.parametrize("seed", [0, 1])  # seed 0: the fixed harness wins on dev; seed 1: the initial one does
def test_selection_measures_the_best_candidate_officially_when_another_was_submitted(seed):
    env = gym.make("RSIGym/Harness-v0", benchmark="swe-bench-verified", budget_usd=500)
    env.reset(seed=seed)
    _, _, _, _, info = env.step({"tool": "edit_harness", "args": {
        "path": "harness.toml", "old": "verify_before_submit = false", "new": "verify_before_submit = true"}})
    fixed = info["result"]["version"]
    for harness in ("initial", fixed):
        env.step({"tool": "evaluate", "args": {"harness": harness, "k": 1}})
        env.step({"tool": "wait", "args": {}})
    run = env.unwrapped.run
    best_harness = run.best.harness
    worse = fixed if best_harness != fixed else "initial"
    _, _, _, _, info = env.step({"tool": "submit", "args": {"harness": worse}})   # keeps the dev loser
    m = info["metrics"]
    assert info["best_candidate"]["harness"] == best_harness
    assert (m["selection_eval_usd"] > 0) == (best_harness != run.harness.initial)  # the initial's official is known
    best = run.world.evaluation.official(run._eval_request("base", best_harness, "official", 3, None)).value.score
    assert m["best_candidate_official_score"] == best and m["selection"] == pytest.approx(info["official_score"] - best)


def test_no_dev_evaluation_means_no_discovery_selection_or_retention():
    env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=100)
    env.reset(seed=0)
    info = env.step({"tool": "submit", "args": {}})[4]
    assert info["metrics"] | {} == {"discovery": None, "selection": None, "retention": None, "efficiency": 0.0,
                                    "best_candidate_official_score": None, "selection_eval_usd": 0.0}


@given(st.lists(st.floats(-1, 1), min_size=1, max_size=8))
def test_compounding_adds_up(indices):
    c = compounding(indices)
    assert c["total"] == pytest.approx(sum(c["per_round"]), abs=1e-9)
    assert c["later_rounds"] == pytest.approx(sum(c["per_round"][1:]), abs=1e-9)
    assert len(c["per_round"]) == len(indices) - 1 and 0 <= c["rounds_improved"] <= len(indices) - 1
    assert improver_gain(indices[0], indices[-1]) == pytest.approx(c["total"], abs=1e-9)


def test_episode_metrics_and_mean_se_edge_cases():
    assert episode_metrics({"official_score": 0.3, "spend_usd": 0.0})["efficiency"] == 0.0
    assert mean_se([]) == (None, None, 0) and mean_se([None, 2.0]) == (2.0, 0.0, 1)


def test_sweep_records_and_reports_carry_the_metrics():
    data = sweep(make_grid(["random", "scripted"], ["aime"], 2, budget_usd=200), local=True).to_dict()
    assert all(e["metrics"] is not None for e in data["episodes"])
    scripted = data["aggregates"]["agents"]["scripted"]
    discovered = [e["metrics"]["discovery"] for e in data["episodes"] if e["agent"] == "scripted"]
    assert scripted["discovery_mean"] == pytest.approx(sum(discovered) / 2) and scripted["selection_mean"] == 0.0
    table = quality_table(data)
    assert table.splitlines()[0].startswith("| agent | discovery") and "| scripted |" in table
    assert "Research quality" in markdown_report(data)
    old = {**data, "aggregates": None, "episodes": [{**e, "metrics": None} for e in data["episodes"]]}
    assert quality_table(old) == ""                                        # results saved before metrics existed
