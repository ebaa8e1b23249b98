"""The vector sim (``make_vec(..., vectorization_mode="vector_entry_point")``) against the scalar env.

Every row of the batch must equal what the scalar env gives for the same seed and actions: observations,
rewards, terminations, truncations and infos, over all three tracks and five benchmarks, with the
scripted, the RL and a sampling researcher choosing the actions, through an autoreset. Then the per-env menu
route (``menu=True, array=False``) against ``DiscreteMenu``, the money arrays, the shared ledger's audit chain, and the autoreset modes.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import rsigym_env
from rsigym_env.baselines import RLResearcher, ScriptedResearcher
from rsigym_env.baselines.rl_researcher import policy_actions, shared_policy, default_policy_path
from rsigym_env.catalog import BENCHMARKS, TRACK_ENV_IDS
from rsigym_env.vector import ResearchVectorEnv, sub_info
from rsigym_env.wrappers.menu import DiscreteMenu

PAD = {"tool": "read", "args": {"ref": "budget"}}  # what an env is sent after its first episode


def same(a: Any, b: Any, where: str = "") -> None:
    """``a == b`` for nested dicts, lists, arrays and numbers; names the first difference. Numbers compare by
    value: Gymnasium's ``_add_info`` puts a key's values in one array, so an int may come back as a float."""
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict) and set(a) == set(b), f"{where}: keys {set(a) ^ set(b)}"
        for key in a:
            same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple, np.ndarray)) or isinstance(b, (list, tuple, np.ndarray)):
        np.testing.assert_array_equal(np.asarray(a, dtype=object), np.asarray(b, dtype=object), err_msg=where)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):  # a batched number takes its array's dtype
        assert a == b and isinstance(a, bool) == isinstance(b, bool), f"{where}: {a!r} != {b!r}"
    else:
        assert a == b and type(a) is type(b), f"{where}: {a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"


class Sampler:
    """A researcher that sends seeded samples of the action space (most are refused)."""

    name = "sampler"

    def __init__(self, seed: int):
        self.space = rsigym_env.action_space()
        self.space.seed(seed)

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        pass

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any:
        return self.space.sample()


def scalar_trace(env_id: str, seed: int, researcher: Any, steps: int, **kwargs: Any) -> tuple[list, list]:
    """(rows, actions) of ``steps`` steps of the scalar env: the researcher's episode, then a reset without a
    seed (what next-step autoreset does) and ``PAD`` calls."""
    env = gym.make(env_id, **kwargs)
    obs, info = env.reset(seed=seed)
    researcher.reset(obs, info, seed=seed)
    rows, actions, playing, done = [(obs, 0.0, False, False, info)], [], True, False
    for _ in range(steps):
        if done:
            obs, info = env.reset()
            rows.append((obs, 0.0, False, False, info))
            actions.append(PAD)
            done, playing = False, False
            continue
        action = researcher.act(obs, info) if playing else PAD
        obs, reward, terminated, truncated, info = env.step(action)
        rows.append((obs, reward, terminated, truncated, info))
        actions.append(action)
        done = terminated or truncated
    env.close()
    return rows, actions


def check_rows(vec: ResearchVectorEnv, expected: list[tuple[list, list]], seeds: list[int]) -> None:
    steps = len(expected[0][1])
    rows = [(*vec.reset(seed=seeds),)]
    for t in range(steps):
        rows.append(vec.step([actions[t] for _, actions in expected]))
    for t, row in enumerate(rows):
        obs, info = row[0], row[-1]
        assert vec.observation_space.contains(obs)
        for i, (single_rows, _) in enumerate(expected):
            single = single_rows[t]
            for key, value in single[0].items():
                if key in obs:
                    same(obs[key][i], value, f"t={t} env={i} obs.{key}")
            if t > 0:
                assert (row[1][i], row[2][i], row[3][i]) == single[1:4], f"t={t} env={i}"
            same(sub_info(info, i), single[4], f"t={t} env={i} info")


RESEARCHERS = {"scripted": lambda s: ScriptedResearcher(), "rl": lambda s: RLResearcher(), "sampled": Sampler}


@pytest.mark.parametrize("track", sorted(TRACK_ENV_IDS))
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_every_row_equals_the_scalar_env(track, benchmark):
    env_id, kwargs = TRACK_ENV_IDS[track], {"benchmark": benchmark, "budget_usd": 500}
    seeds, steps = [3, 4, 5], 24
    expected = [scalar_trace(env_id, seed, RESEARCHERS[name](seed), steps, **kwargs)
                for seed, name in zip(seeds, RESEARCHERS)]
    assert any(row[2] or row[3] for row in expected[0][0]), "the scripted episode should end within the steps"
    vec = gym.make_vec(env_id, num_envs=3, vectorization_mode="vector_entry_point", **kwargs)
    assert isinstance(vec.unwrapped, ResearchVectorEnv)
    check_rows(vec.unwrapped, expected, seeds)
    vec.close()


def test_without_the_log_the_numbers_are_the_same():
    kwargs = {"benchmark": "swe-bench-verified", "budget_usd": 300}
    expected = [scalar_trace("RSIGym/Data-v0", 7 + i, ScriptedResearcher(), 30, **kwargs) for i in range(2)]
    vec = gym.make_vec("RSIGym/Data-v0", num_envs=2, include_log=False, **kwargs)  # the default mode: the vector entry point
    assert isinstance(vec, ResearchVectorEnv)
    assert "log" not in vec.single_observation_space.spaces
    check_rows(vec, expected, [7, 8])
    scalar = gym.make("RSIGym/Data-v0", include_log=False, **kwargs)
    obs, _ = scalar.reset(seed=7)
    assert "log" not in obs and scalar.observation_space.contains(obs)
    vec.close()


@pytest.mark.parametrize("track", sorted(TRACK_ENV_IDS))
def test_menu_mode_plays_the_shipped_policy_as_the_scalar_env(track):
    """The shipped RL policy, greedy, over the per-env menu route (``menu=True, array=False``) and over
    ``DiscreteMenu`` on the scalar env: the same features, masks, rewards, returns and whole infos on every
    benchmark. (``menu=True`` alone builds the array env: ``tests/test_menu_vector.py``.)"""
    params = shared_policy(default_policy_path())
    env_id = TRACK_ENV_IDS[track]
    n = len(BENCHMARKS)
    vecs = [gym.make_vec(env_id, num_envs=1, menu=True, array=False, benchmark=b, budget_usd=500) for b in BENCHMARKS]
    singles = [DiscreteMenu(gym.make(env_id, benchmark=b, budget_usd=500)) for b in BENCHMARKS]
    for seed in (1, 2):  # at sim result version 5, seed 0's five systems leave the harness track nothing to fix
        returns = np.zeros((2, n))
        for j, (vec, single) in enumerate(zip(vecs, singles)):
            obs, info = vec.reset(seed=seed)
            s_obs, s_info = single.reset(seed=seed)
            done = False
            while not done:
                np.testing.assert_array_equal(obs[0], s_obs)
                np.testing.assert_array_equal(info["action_mask"][0], s_info["action_mask"])
                action, _ = policy_actions(params, obs.astype(np.float64), info["action_mask"], None)
                obs, reward, terminated, truncated, info = vec.step(action)
                s_obs, s_reward, s_term, s_trunc, s_info = single.step(int(action[0]))
                assert (reward[0], terminated[0], truncated[0]) == (s_reward, s_term, s_trunc)
                same(sub_info(info, 0), s_info)
                returns[0, j] += reward[0]
                returns[1, j] += s_reward
                done = s_term or s_trunc
        np.testing.assert_array_equal(returns[0], returns[1])
        assert returns[0].mean() > 0  # the policy still gains
    for env in vecs + singles:
        env.close()


def test_money_in_arrays_and_one_audited_ledger(tmp_path):
    path = tmp_path / "ledger.sqlite"
    vec = ResearchVectorEnv(4, track="joint", benchmark="aime", budget_usd=20, ledger_path=path, include_log=False)
    vec.reset(seed=0)
    expensive = {"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 20000}}
    batch = [{"tool": "evaluate", "args": {"k": 1}}, expensive, "not a call", {"tool": "submit"}]
    obs, reward, terminated, truncated, info = vec.step(batch)
    assert info["ok"].tolist() == [True, False, False, True]
    assert info["error"][1] == "insufficient_budget" and info["error"][2] == "malformed_action"
    assert vec.refusals.tolist() == [0, 1, 1, 0] and vec.episodes.tolist() == [0, 0, 0, 1]
    assert vec.spent_usd[1] == vec.spent_usd[2] == 0.0 and info["cost_usd"][1] == info["cost_usd"][2] == 0.0
    np.testing.assert_array_equal(vec.budget_left_usd, obs["budget_left_usd"][:, 0])
    for _ in range(30):  # everyone asks for more than is left: refused at no cost, never negative
        obs, *_ = vec.step([expensive if i % 2 else {"tool": "evaluate", "args": {"k": 8}} for i in range(4)])
        assert (vec.budget_left_usd >= 0).all() and (obs["budget_left_usd"] >= 0).all()
    assert (vec.refusals >= 20).all() and vec.spent_usd[[1, 3]].tolist() == [0.0, 0.0] and vec.budget_left_usd[0] < 20
    vec.step([{"tool": "submit"}] * 4)
    assert vec.episodes.tolist() == [1, 1, 1, 2]
    vec.close()
    verify = subprocess.run([sys.executable, "-m", "rsigym_env.cli", "audit", "verify", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_autoreset_modes():
    kwargs = dict(track="harness", benchmark="gpqa-diamond", budget_usd=100)
    same_step = ResearchVectorEnv(2, autoreset_mode="SameStep", **kwargs)
    same_step.reset(seed=0)
    obs, reward, terminated, truncated, info = same_step.step([{"tool": "submit"}, PAD])
    assert terminated.tolist() == [True, False] and info["_final_obs"].tolist() == [True, False]
    assert obs["step"][0, 0] == 0 and info["final_obs"][0]["step"][0] == 1  # already the next episode
    assert info["final_info"]["submitted"]["by"][0] == "agent"
    same_step.close()

    disabled = ResearchVectorEnv(2, autoreset_mode=AutoresetMode.DISABLED, **kwargs)
    disabled.reset(seed=0)
    disabled.step([{"tool": "submit"}, PAD])
    with pytest.raises(gym.error.ResetNeeded):
        disabled.step([PAD, PAD])
    obs, info = disabled.reset(options={"reset_mask": np.array([True, False])})
    assert info["_seed"].tolist() == [True, False] and obs["step"][:, 0].tolist() == [0, 1]
    disabled.step([PAD, PAD])
    with pytest.raises(ValueError, match="num_envs"):
        ResearchVectorEnv(0)
    with pytest.raises(ValueError, match="one action per env"):
        disabled.step([PAD])
    disabled.close()


def test_infos_whose_types_differ_between_envs_batch_without_loss():
    vec = ResearchVectorEnv(3, track="joint", benchmark="aime", budget_usd=100)
    infos: dict = {}
    for i, info in enumerate([{"best": None, "cost": 1, "ok": True, "n": {"a": 1}},
                              {"best": {"score": 0.5}, "cost": 0.25, "ok": 2, "n": 7},
                              {"best": {"score": 0.75}, "cost": 3, "ok": "no", "n": {"a": 2}}]):
        infos = vec._add_info(infos, info, i)
    assert [sub_info(infos, i) for i in range(3)] == [
        {"best": None, "cost": 1, "ok": True, "n": {"a": 1}},
        {"best": {"score": 0.5}, "cost": 0.25, "ok": 2, "n": 7},
        {"best": {"score": 0.75}, "cost": 3, "ok": "no", "n": {"a": 2}}]
    assert infos["cost"].dtype == np.float64  # widened, not cut to an int
    vec.close()
