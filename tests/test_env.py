"""ResearchEnv: Gymnasium conformance, determinism, the result contract, and bad input that costs nothing."""

from __future__ import annotations

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rsigym_env
from rsigym_env.baselines import ScriptedResearcher
from rsigym_env.episode import run_episode
from rsigym_env.platform import verify_audit

END_KEYS = {"initial_score", "official_score", "normalized_gain", "best_dev_score", "spend_usd", "budget_usd", "submitted"}


@pytest.mark.parametrize("env_id", rsigym_env.ENV_IDS)
@pytest.mark.parametrize("benchmark", ["swe-bench-verified", "aime"])
def test_check_env_passes_for_every_registered_id(env_id, benchmark):
    env = gym.make(env_id, benchmark=benchmark, budget_usd=500, render_mode="ansi")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped, skip_render_check=False)
    env.close()
    env.close()  # closing twice is fine


def test_registration_kwargs_and_track_conflicts():
    env = gym.make("RSIGym/Joint-v0", world="sim", benchmark="aime", budget_usd=500, seed=3)
    assert (env.unwrapped.scenario.track, env.unwrapped.scenario.budget_usd) == ("joint", 500)
    env = gym.make("RSIGym/Data-v0", scenario="sim-data-gpqa-diamond-1000")
    assert env.unwrapped.scenario.benchmark == "gpqa-diamond"
    with pytest.raises(ValueError, match="data-track scenario; use RSIGym/Data-v0"):
        gym.make("RSIGym/Joint-v0", scenario="sim-data-aime-500")


def rollout(seed: int, actions: list) -> list:
    env = gym.make("RSIGym/Joint-v0", benchmark="terminal-bench-2", budget_usd=300)
    obs, info = env.reset(seed=seed)
    trace = [(obs, info)]
    for action in actions:
        trace.append(env.step(action))
    return trace


def assert_same(a, b):
    assert json.dumps(a, default=lambda x: x.tolist() if isinstance(x, np.ndarray) else str(x), sort_keys=True) == \
        json.dumps(b, default=lambda x: x.tolist() if isinstance(x, np.ndarray) else str(x), sort_keys=True)


def test_same_seed_same_actions_same_everything():
    env = gym.make("RSIGym/Joint-v0", benchmark="terminal-bench-2", budget_usd=300)
    recorded = []
    result = run_episode(env, ScriptedResearcher(), seed=11,
                         on_step=lambda i, action, obs, info: recorded.append(action))
    assert result.terminated and len(recorded) > 10
    first, second = rollout(11, recorded), rollout(11, recorded)
    assert_same(first, second)
    different = rollout(12, recorded)
    assert json.dumps(first[-1][-1], default=str) != json.dumps(different[-1][-1], default=str)


def test_fuzzing_step_never_raises_and_invalid_calls_cost_nothing(tmp_path):
    env = gym.make("RSIGym/Joint-v0", benchmark="swe-bench-verified", budget_usd=500, max_steps=10_000,
                   ledger_path=tmp_path / "ledger.sqlite")
    env.reset(seed=0)
    run = env.unwrapped.run
    ledger = run.platform.ledger
    rng = np.random.default_rng(0)
    malformed = ["", "{", "[]", "null", '{"tool": 3}', '{"tool": "train", "args": {"dataset": 1}}', 7, None,
                 {"tool": "submit", "args": {"checkpoint": "ckpt-999"}}, {"tool": "read", "args": {"ref": "x@y"}},
                 {"tool": "wait"}, {"tool": "edit_harness", "args": {"path": "../etc/passwd", "content": "x"}},
                 {"tool": "edit_harness", "args": {"path": "harness.toml", "old": "=", "new": "x"}},
                 {"tool": "transform_data", "args": {"operation": "filter", "datasets": ["ds-404"]}},
                 {"tool": "generate_data", "args": {"teacher": "gpt-2", "n_examples": 5}}]
    refused = 0
    for i in range(10_000):
        action = env.action_space.sample() if i % 2 else malformed[rng.integers(len(malformed))]
        before_records = ledger.audit_head()[0]
        before = run.platform.balance(run.key)
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs)
        assert "budget_left_usd" in info and info["budget_left_usd"] >= 0
        assert info.get("error") != "service_error", info
        if not info["ok"]:
            refused += 1
            after = run.platform.balance(run.key)
            assert info["cost_usd"] == 0 and info["error"] and info["message"]
            assert after.spent_usd == before.spent_usd or info.get("events")  # only finished jobs may settle
            assert f"ERROR {info['error']}" in obs["log"]
            assert ledger.audit_head()[0] >= before_records + 1  # every refusal is audited
        if terminated or truncated:
            assert END_KEYS <= info.keys()
            env.reset(seed=i)
            run, ledger = env.unwrapped.run, env.unwrapped.run.platform.ledger
    assert refused > 4000
    env.close()
    report = verify_audit(tmp_path / "ledger.sqlite")
    assert report.ok and report.records > refused, report


def test_result_contract_and_truncation_counts_the_initial_system():
    env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=100, max_steps=3)
    obs, info = env.reset(seed=5)
    assert info["budget_left_usd"] == 100
    obs, reward, terminated, truncated, info = env.step({"tool": "evaluate", "args": {"k": 3}})
    quote = info["result"]["quote_usd"]
    obs, reward, terminated, truncated, info = env.step({"tool": "sandbox_exec", "args": {"command": "sleep 300"}})
    assert not (terminated or truncated) and reward == 0
    sandbox_cost = info["cost_usd"]
    obs, reward, terminated, truncated, info = env.step({"tool": "read", "args": {"ref": "budget"}})
    assert truncated and not terminated and reward == 0.0
    assert END_KEYS <= info.keys()
    assert info["submitted"]["by"] == "default" and info["end_reason"] == "step limit"
    assert info["official_score"] == info["initial_score"]
    # the evaluation that was cut off is paid for the part that ran (300 s of it), not in full
    assert sandbox_cost < info["spend_usd"] < sandbox_cost + quote
    obs, reward, terminated, truncated, info = env.step({"tool": "read", "args": {"ref": "budget"}})
    assert info["error"] == "episode_over"


def test_unaffordable_call_is_refused_before_it_runs():
    env = gym.make("RSIGym/Joint-v0", benchmark="swe-bench-verified", budget_usd=1.0)
    env.reset(seed=0)
    obs, _, _, _, info = env.step({"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 5000}})
    assert info["error"] == "insufficient_budget" and info["cost_usd"] == 0
    assert obs["budget_left_usd"][0] == 1.0
    records = env.unwrapped.run.platform.ledger.audit_records()
    assert records[-1].event["decision"] == "refused" and records[-1].event["code"] == "insufficient_budget"


def test_jobs_are_asynchronous_and_wait_advances_the_clock():
    env = gym.make("RSIGym/Joint-v0", benchmark="gpqa-diamond", budget_usd=500)
    obs, _ = env.reset(seed=1)
    obs, _, _, _, info = env.step({"tool": "evaluate", "args": {"k": 1}})
    job = info["result"]["job"]
    assert obs["running_jobs"][0] == 1 and obs["dev_scores"][2] == -1
    time_before = obs["time_left_h"][0]
    obs, _, _, _, info = env.step({"tool": "wait", "args": {"job": job}})
    assert obs["time_left_h"][0] < time_before and obs["running_jobs"][0] == 0
    (event,) = info["events"]
    assert event["job"] == job and 0 <= event["score"] <= 1
    assert obs["dev_scores"][0] == obs["dev_scores"][1] == obs["dev_scores"][2] == event["score"]
    obs, _, _, _, info = env.step({"tool": "read", "args": {"ref": job}})
    assert "task  rewards  failures" in obs["log"]
    obs, _, _, _, info = env.step({"tool": "wait"})
    assert info["error"] == "no_running_jobs"
    assert obs["action_mask"][rsigym_env.tools.TOOL_NAMES.index("wait")] == 0


def test_run_view_is_a_read_only_snapshot_for_the_envs_owner():
    env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500)
    assert env.unwrapped.run_view() is None  # before reset
    _, info = env.reset(seed=0)
    before = env.unwrapped.run_view()
    assert (before.steps, before.best_dev, before.end_info, dict(before.running)) == (0, None, None, {})
    assert before.key_id == env.unwrapped.key_id and before.harness_versions == (info["harness"],)
    _, _, _, _, info = env.step({"tool": "evaluate", "args": {"k": 1}})
    during = env.unwrapped.run_view()
    assert before.steps == 0 and not before.running  # a snapshot: the step changed nothing in it
    (job,) = during.running.values()
    assert job.kind == "evaluate" and job.ready_at > job.started_at == before.world_s
    assert during.balance.reserved_usd > 0 and during.balance == env.unwrapped.run_view().balance
    with pytest.raises(TypeError):
        during.job_results["job-9"] = None  # type: ignore[index]
    with pytest.raises(AttributeError):
        during.steps = 5  # type: ignore[misc]
    files = during.harness_files("latest")
    files["prompt.md"] = "scribbled"
    assert env.unwrapped.harness_files()["prompt.md"] != "scribbled"
    env.step({"tool": "wait", "args": {}})
    _, _, terminated, _, info = env.step({"tool": "submit", "args": {}})
    after = env.unwrapped.run_view()
    assert terminated and after.best_dev == info["best_dev_score"] and list(after.job_results) == ["job-1"]
    assert after.end_info["normalized_gain"] == info["normalized_gain"]
    env.close()
    assert env.unwrapped.run_view() is None


def test_harness_track_mask_and_refusal():
    env = gym.make("RSIGym/Harness-v0", benchmark="aime")
    obs, _ = env.reset(seed=0)
    names = rsigym_env.tools.TOOL_NAMES
    assert obs["action_mask"][names.index("train")] == 0 and obs["action_mask"][names.index("edit_harness")] == 1
    obs, _, _, _, info = env.step({"tool": "train", "args": {"dataset": "ds-1"}})
    assert info["error"] == "forbidden_tool" and "harness track does not allow 'train'" in obs["log"]


def test_action_mask_is_a_fresh_writable_array_every_step():
    env = gym.make("RSIGym/Joint-v0", benchmark="aime")
    obs, _ = env.reset(seed=0)
    mask = obs["action_mask"].copy()
    obs["action_mask"][:] = 0  # a policy scribbling on its observation changes nothing for the next one
    obs, *_ = env.step({"tool": "read", "args": {"ref": "budget"}})
    assert obs["action_mask"].flags.writeable and np.array_equal(obs["action_mask"], mask)


def test_render_modes():
    env = gym.make("RSIGym/Joint-v0", benchmark="aime", render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert "Research run" in text and "Budget $500" in text
    with pytest.raises(ValueError, match="render_mode"), pytest.warns(UserWarning, match="not in the possible"):
        gym.make("RSIGym/Joint-v0", render_mode="rgb_array")


def test_printable_keeps_printable_text_and_marks_the_rest():
    import re
    import string

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from rsigym_env.env import printable

    reference = re.compile(f"[^{re.escape(string.printable)}]")

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=200))
    def check(text):
        assert printable(text, limit=10_000) == reference.sub("?", text)

    check()
