"""The local world end to end through ``gymnasium.make(..., world="local")``.

The fast tests run on a tiny random base model (registered under its own name, so the shipped
``rsigym-base`` is untouched); one slow test runs a whole scripted episode on the shipped base.
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.baselines import ScriptedResearcher
from rsigym_env.episode import run_episode
from rsigym_env.worlds.local.lm import tinker_client
from rsigym_env.worlds.local.lm.model import ModelConfig

TINY = "rsigym-test-tiny"


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("tiny-base")
    tinker_client.register_base_model(TINY, tinker_client.make_random_base(
        root / "base", ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=512)))
    return TINY


@pytest.fixture
def env(tiny_base: str, tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    env = gym.make("RSIGym/Joint-v0", world="local", benchmark="aime",
                   world_options={"base_model": tiny_base})
    yield env
    env.close()


def step(env, tool: str, **args):
    obs, reward, terminated, truncated, info = env.step({"tool": tool, "args": args})
    return obs, info


def test_make_local_gives_local_teachers_tasks_and_the_minimal_harness(env):
    obs, info = env.reset(seed=0)
    assert "local world: local-math (mirrors aime" in obs["log"]
    assert info["teachers"] == ["teacher-large", "teacher-small"]
    obs, info = step(env, "read", ref="harness:latest/harness.toml")
    assert info["ok"] and 'on_truncation = "stop"' in obs["log"]


def test_data_sandbox_and_inference_are_real_and_billed(env):
    env.reset(seed=0)
    obs, info = step(env, "generate_data", teacher="teacher-small", n_examples=8)
    assert info["ok"], obs["log"]
    ds = info["result"]["id"]
    assert info["result"]["n_examples"] == 8 and 0 < info["cost_usd"] <= info["result"]["tokens"]
    # a script over the dataset runs in the sandbox and its output becomes a dataset
    obs, info = step(env, "transform_data", operation="script", datasets=[ds],
                     script="head -n 3 /data/in_0.jsonl > /data/out.jsonl")
    assert info["ok"], obs["log"]
    assert info["result"]["n_examples"] == 3
    obs, info = step(env, "sandbox_exec", command="echo hi > f.txt && cat f.txt && ls /work", timeout_s=10)
    assert info["ok"] and "hi" in info["result"]["stdout"] and info["result"]["exit_code"] != 0  # /work is invisible
    obs, info = step(env, "infer", model="base", prompt="Compute left to right: 1 + 2", max_tokens=8)
    assert info["ok"] and info["result"]["completion_tokens"] >= 1 and info["cost_usd"] > 0


def test_bad_local_calls_are_refused_free_and_clear(env):
    env.reset(seed=0)
    budget = None
    for args, code in [({"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 5}}, "teacher_not_allowed"),
                       ({"tool": "train", "args": {"dataset": "ds-9"}}, "unknown_ref"),
                       ({"tool": "infer", "args": {"model": "ckpt-7", "prompt": "x"}}, "unknown_ref"),
                       ({"tool": "transform_data", "args": {"operation": "script", "datasets": ["ds-1"]}}, "unknown_ref")]:
        obs, reward, terminated, truncated, info = env.step(args)
        assert not info["ok"] and info["error"] == code, obs["log"]
        budget = budget or info["budget_left_usd"]
        assert info["budget_left_usd"] == budget and info["cost_usd"] == 0


def test_train_evaluate_and_read_a_trajectory(env):
    env.reset(seed=0)
    _, info = step(env, "generate_data", teacher="teacher-large", n_examples=16)
    _, info = step(env, "train", dataset=info["result"]["id"], num_epochs=1, batch_size=8)
    assert info["ok"]
    _, info = step(env, "wait", job=info["result"]["job"])
    event = info["events"][0]
    assert event["ok"] and event["checkpoint"] == "ckpt-1" and np.isfinite(event["final_loss"])
    _, info = step(env, "evaluate", checkpoint="ckpt-1", k=1, n_tasks=3)
    job = info["result"]["job"]
    _, info = step(env, "wait", job=job)
    event = info["events"][0]
    assert event["ok"] and event["n_tasks"] == 3 and 0.0 <= event["score"] <= 1.0
    obs, info = step(env, "read", ref=f"{job}/no-such-task")
    assert not info["ok"] and "tasks:" in obs["log"]            # an unknown task names the ones there are
    task = obs["log"].split("tasks: ")[1].split(",")[0].strip()
    obs, info = step(env, "read", ref=f"{job}/{task}")
    assert info["ok"] and f"== {job}/{task} attempt 0" in obs["log"] and "user: " in obs["log"]


def test_same_seed_same_actions_same_scores_on_a_wall_clock_world(tiny_base, tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    scores = []
    for _ in range(2):
        env = gym.make("RSIGym/Joint-v0", world="local", benchmark="terminal-bench-2",
                       world_options={"base_model": tiny_base})
        try:
            env.reset(seed=5)
            _, info = step(env, "generate_data", teacher="teacher-large", n_examples=12)
            dataset_rows = info["result"]["preview"]
            _, info = step(env, "evaluate", k=2, n_tasks=4)
            _, info = step(env, "wait")
            dev = info["events"][0]["score"]
            _, info = step(env, "submit")
            scores.append((dataset_rows, dev, info["initial_score"], info["official_score"]))
        finally:
            env.close()
    assert scores[0] == scores[1]


@pytest.mark.slow
def test_a_recorded_scripted_episode_on_the_shipped_base_is_real_and_replays_identically(tmp_path, monkeypatch):
    from rsigym_env.replay import ReplayWorld, TapeWrapper

    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    tape = tmp_path / "tape.jsonl"
    live = run_episode(TapeWrapper(gym.make("RSIGym/Joint-v0", world="local", benchmark="terminal-bench-2"),
                                   record=tape), recorder := Recorder(ScriptedResearcher()), seed=0)
    assert live.terminated and live.info["end_reason"] == "submitted"
    assert 0.05 <= live.info["initial_score"] <= 0.6                    # the bar for the initial system
    assert live.info["spend_usd"] > 0 and live.info["best_dev_score"] is not None
    replay_env = TapeWrapper(gym.make("RSIGym/Joint-v0", world="local", benchmark="terminal-bench-2"), replay=tape)
    again = run_episode(replay_env, Replayer(recorder.actions), seed=0)
    assert isinstance(replay_env.unwrapped.run.world, ReplayWorld) and not replay_env.unwrapped.run.world.diverged
    assert again.info == live.info and again.reward == live.reward
    assert recorder.observations == Recorder.last_observations


class Recorder:
    """Wraps a researcher and keeps its actions and the log it saw at each step."""

    last_observations: list[str] = []

    def __init__(self, inner):
        self.inner, self.name, self.actions, self.observations = inner, inner.name, [], []

    def reset(self, obs, info, seed=None):
        self.inner.reset(obs, info, seed=seed)
        self.observations.append(obs["log"])

    def act(self, obs, info):
        self.observations.append(obs["log"])
        action = self.inner.act(obs, info)
        self.actions.append(action)
        return action


class Replayer:
    """Plays back recorded actions, keeping the logs it sees (in ``Recorder.last_observations``)."""

    name = "replayer"

    def __init__(self, actions):
        self.actions = list(actions)
        Recorder.last_observations = []

    def reset(self, obs, info, seed=None):
        Recorder.last_observations.append(obs["log"])

    def act(self, obs, info):
        Recorder.last_observations.append(obs["log"])
        return self.actions.pop(0)


def test_training_in_a_process_of_its_own_gives_the_same_checkpoint(tiny_base, tmp_path, monkeypatch):
    """world_options.training_process: the job trains in lm/train_worker, and its checkpoint is the one in-process
    training makes (same loss curve, same weights), servable by the world at once."""
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    seen = []
    for flag in (False, True):
        env = gym.make("RSIGym/Joint-v0", world="local", benchmark="aime", run_dir=tmp_path / f"run-{flag}",
                       world_options={"base_model": tiny_base, "training_process": flag})
        try:
            env.reset(seed=0)
            world = env.unwrapped.run.world
            assert (world.train.runner is not None) == flag
            _, info = step(env, "generate_data", teacher="teacher-large", n_examples=16)
            _, info = step(env, "train", dataset=info["result"]["id"], num_epochs=1, batch_size=8)
            _, info = step(env, "wait", job=info["result"]["job"])
            assert info["events"][0]["ok"], info["events"]
            result = env.unwrapped.run.job_results[info["events"][0]["job"]]
            _, reply = step(env, "infer", model="ckpt-1", prompt="What is 2 + 2?", max_tokens=8)
            assert reply["ok"], reply
            checkpoint = world.tinker.checkpoint_dir(world.train.checkpoints["ckpt-1"])
            seen.append((result.loss_curve, tinker_client.weights_identity(checkpoint, tiny_base)))
        finally:
            env.close()
    assert seen[0] == seen[1] and seen[0][1] is not None


def test_the_initial_systems_official_evaluation_starts_with_the_episode(tiny_base, tmp_path, monkeypatch):
    """world_options.early_official (default on): the initial system's official evaluation is started when the
    episode starts (at reset, before any step) and submit waits for that one; off, nothing starts early and
    submit runs the submission's first. Either way the episode ends with the same scores, and the official
    evaluations are numbered in the order they were asked for (on: the initial system's is official-1)."""
    from rsigym_env.scenario import load_scenario
    from rsigym_env.worlds.common.evaluation import HarborEvalService

    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    started: list[str] = []
    prefetch = HarborEvalService.prefetch_official

    def spy(self, req):
        if self.prefetch:
            started.append(req.harness_version)
        return prefetch(self, req)

    monkeypatch.setattr(HarborEvalService, "prefetch_official", spy)
    ends, early_starts = {}, {}
    for early in (True, False):
        scenario = load_scenario("local-joint-aime").model_copy(update={
            "official_k": 1, "world_options": {"base_model": tiny_base, "early_official": early}})
        env = gym.make("RSIGym/Joint-v0", scenario=scenario, run_dir=tmp_path / f"run-{early}")
        try:
            started.clear()
            env.reset(seed=4)
            early_starts[early] = list(started)
            initial = env.unwrapped.run.harness.initial
            _, info = step(env, "edit_harness", path="harness.toml", old="persistent = false", new="persistent = true")
            _, end = step(env, "submit", harness=info["result"]["version"])
        finally:
            env.close()
        evals = tmp_path / f"run-{early}" / "evals"
        versions = {json.loads((evals / name / "summary.json").read_text())["harness_version"]
                    for name in ("official-1", "official-2")}
        assert versions == {initial, info["result"]["version"]}
        first = json.loads((evals / "official-1" / "summary.json").read_text())["harness_version"]
        assert (first == initial) is early  # off: submit evaluates the submission first
        ends[early] = (end["initial_score"], end["official_score"], end["normalized_gain"],
                       sorted(p.name for p in evals.glob("official-*")))
    assert early_starts == {True: [initial], False: []}
    assert ends[True] == ends[False] and ends[True][3] == ["official-1", "official-2"]


def test_training_moves_to_a_process_of_its_own_when_this_one_has_other_blas_kernels(tiny_base, tmp_path, monkeypatch):
    """training_process left at None: in process while this process computes with the pinned OpenBLAS kernels,
    in a worker (which loads them) when NumPy was loaded with others first (rsigym_env.numerics)."""
    from rsigym_env.worlds.local import world as local_world

    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    runners = []
    for pinned in (True, False):
        monkeypatch.setattr(local_world, "blas_core_is_pinned", lambda pinned=pinned: pinned)
        env = gym.make("RSIGym/Joint-v0", world="local", benchmark="aime", run_dir=tmp_path / f"run-{pinned}",
                       world_options={"base_model": tiny_base})
        try:
            env.reset(seed=0)
            runners.append(env.unwrapped.run.world.train.runner)
        finally:
            env.close()
    assert runners[0] is None and runners[1] is not None
