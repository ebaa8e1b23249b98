"""The discrete-menu wrapper: valid tool calls in every track, honest masks, a Box observation, check_env."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rsigym_env  # noqa: F401  (registers the ids)
from rsigym_env.tools import parse_action
from rsigym_env.wrappers.menu import FEATURES, MENU, MENU_INDEX, DiscreteMenu, MenuAdapter

TRACKS = ["Joint", "Data", "Harness"]
# errors that mean "the menu chose something that cannot work": an unmasked entry must never cause them
MENU_ERRORS = {"unknown_ref", "forbidden_tool", "teacher_not_allowed", "field_locked", "field_not_allowed",
               "harness_patch_failed", "no_running_jobs", "invalid_args", "malformed_action", "unknown_tool"}


def make(track: str, benchmark: str = "aime", blocking: bool = True, **kw) -> DiscreteMenu:
    return DiscreteMenu(gym.make(f"RSIGym/{track}-v0", benchmark=benchmark, budget_usd=500, **kw), blocking=blocking)


class CallLog(gym.Wrapper):
    """Records every tool call the menu sends to the env."""

    def __init__(self, env):
        super().__init__(env)
        self.calls: list = []

    def step(self, action):
        self.calls.append(action)
        return self.env.step(action)


@pytest.mark.parametrize("track", TRACKS)
def test_every_macro_maps_to_valid_tool_calls(track):
    """From a state where data and a checkpoint exist, every entry sends calls that parse as tools,
    and every unmasked entry runs without a menu error."""
    for index, macro in enumerate(MENU):
        logged = CallLog(gym.make(f"RSIGym/{track}-v0", benchmark="gpqa-diamond", budget_usd=500))
        env = DiscreteMenu(logged)
        obs, info = env.reset(seed=index)
        if track != "Harness":
            for prep in ("gen:claude-opus-5:50", "clean", "gen:claude-opus-5:50", "train:lr=0.0003"):
                obs, _, _, _, info = env.step(MENU_INDEX[prep])
        logged.calls.clear()
        allowed = bool(info["action_mask"][index])
        obs, reward, terminated, truncated, info = env.step(index)
        assert logged.calls, macro.name
        for call in logged.calls:
            parse_action(call)  # raises if the menu built a malformed call
        if allowed:
            assert not MENU_ERRORS & set(info["errors"]), (track, macro.name, info["errors"], info.get("message"))
        else:
            assert info["errors"] and not info["ok"], (track, macro.name)
        env.close()


@pytest.mark.parametrize("track", TRACKS)
@pytest.mark.parametrize("blocking", [True, False])
def test_masks_are_honest_in_random_rollouts(track, blocking):
    """Masked entries really fail (and cost nothing); unmasked ones never fail for menu reasons;
    nothing raises and the observation stays in its Box."""
    rng = np.random.default_rng(0)
    env = make(track, benchmark="swe-bench-verified", blocking=blocking)
    masked_tried = unmasked_tried = 0
    for seed in range(6):
        obs, info = env.reset(seed=seed)
        assert env.observation_space.contains(obs)
        done = False
        while not done:
            mask = info["action_mask"]
            assert mask.dtype == bool and mask.shape == (len(MENU),) and mask.any()
            np.testing.assert_array_equal(mask, env.action_masks())
            if (~mask).any() and rng.random() < 0.3:
                action = int(rng.choice(np.flatnonzero(~mask)))
                budget = float(env.unwrapped.run.budget_left)
                obs, reward, terminated, truncated, info = env.step(action)
                assert info["errors"] and not info["ok"], MENU[action].name
                assert reward == 0.0 and float(env.unwrapped.run.budget_left) == budget
                masked_tried += 1
            else:
                # avoid ending every episode early: submit rarely
                choices = [i for i in np.flatnonzero(mask) if not MENU[i].name.startswith("submit")]
                action = int(rng.choice(choices)) if choices and rng.random() > 0.05 else MENU_INDEX["submit_best"]
                obs, reward, terminated, truncated, info = env.step(action)
                assert not MENU_ERRORS & set(info["errors"]), (MENU[action].name, info["errors"], info.get("message"))
                unmasked_tried += 1
            assert env.observation_space.contains(obs), obs
            done = terminated or truncated
    assert masked_tried > 10 and unmasked_tried > 30
    env.close()


def test_invalid_choice_returns_the_envs_error():
    env = make("Joint")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(len(MENU) + 3)
    assert not info["ok"] and info["errors"] and not terminated and reward == 0.0
    assert env.observation_space.contains(obs)
    obs, reward, terminated, truncated, info = env.step(MENU_INDEX["train:lr=0.0003"])  # no dataset yet
    assert info["error"] == "unknown_ref"
    env.close()


def test_track_masks():
    data, harness = make("Data"), make("Harness")
    _, info = data.reset(seed=0)
    names = {m.name for m, ok in zip(MENU, info["action_mask"]) if ok}
    assert not any(n.startswith("fix:") for n in names)
    data.step(MENU_INDEX["gen:claude-opus-5:50"])
    names = {m.name for m, ok in zip(MENU, data.action_masks()) if ok}
    assert "train:lr=0.0003" in names and "train:lr=0.0006" not in names and "train:lr=0.00015" not in names
    _, info = harness.reset(seed=0)
    names = {m.name for m, ok in zip(MENU, info["action_mask"]) if ok}
    assert not any(n.startswith(("gen:", "train:")) for n in names) and "clean" not in names
    assert {f"fix:{d}" for d in ("truncated_output", "action_loop")} <= names
    data.close(), harness.close()


def test_a_good_plan_through_the_menu_gains():
    env = make("Joint", benchmark="swe-bench-verified")
    obs, info = env.reset(seed=3)
    plan = [f"fix:{m.arg}" for m in MENU if m.kind == "fix"] + [
        "gen:claude-opus-5:max", "clean", "train:lr=0.0003", "eval_base_k3", "eval_latest_k3", "submit_best"]
    total = 0.0
    for name in plan:
        assert env.action_masks()[MENU_INDEX[name]], name
        obs, reward, terminated, truncated, info = env.step(MENU_INDEX[name])
        total += reward
        if name.startswith("fix:"):
            assert obs[FEATURES.index(f"unfixed:{name[4:]}")] == 0.0
            assert not env.action_masks()[MENU_INDEX[name]]  # fixed: masked now
    assert terminated and total == info["normalized_gain"] > 0.2
    assert info["submitted"]["checkpoint"] == "ckpt-1" or info["best_dev_score"] is not None
    env.close()


@pytest.mark.parametrize("track", TRACKS)
def test_check_env_passes(track):
    env = make(track)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version")  # it is a wrapper
        check_env(env, skip_render_check=True)
    env.close()


def test_adapter_alone_drives_the_raw_env_like_the_wrapper():
    """The same menu choices through MenuAdapter on the raw env give the same run as the wrapper."""
    choices = ["eval_latest_k1", "fix:truncated_output", "gen:gpt-6-astra:500", "clean", "train:lr=0.00015",
               "eval_latest_k3", "submit_best"]
    wrapped = make("Joint", benchmark="aime")
    wrapped.reset(seed=5)
    for name in choices:
        feats, r1, *_ , info1 = wrapped.step(MENU_INDEX[name])
    raw = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500)
    obs, info = raw.reset(seed=5)
    adapter = MenuAdapter()
    adapter.reset(obs, info)
    for name in choices:
        plan = adapter.plan(MENU_INDEX[name])
        action = next(plan)
        while True:
            obs, r2, term, trunc, info = raw.step(action)
            adapter.observe(action, obs, info)
            if term or trunc:
                break
            try:
                action = plan.send((obs, info))
            except StopIteration:
                break
    assert r1 == r2 and info1["official_score"] == info["official_score"]
    np.testing.assert_array_equal(feats, adapter.features())
    wrapped.close(), raw.close()
