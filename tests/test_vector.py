"""Vectorised envs: ``gymnasium.make_vec`` for every registered id, sync and async.

How to batch actions: the single action space is a ``OneOf``, which gymnasium batches as a ``Tuple`` of
``num_envs`` copies, so a batch of actions is a tuple (or list) with one action per env, each in any form
``step`` takes (dict, JSON text, tool object, space sample).

Text observations: ``AsyncVectorEnv`` with its default ``shared_memory=True`` reads a ``Text`` space
out of shared memory once, at construction, so every later ``log`` comes back as stale filler
(gymnasium 1.4). Use ``vector_kwargs={"shared_memory": False}`` for the env's ``Dict`` observation;
with :class:`FlatObservation` (no text) shared memory is fine.
"""

from __future__ import annotations

import json
import multiprocessing
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rsigym_env
from rsigym_env.tools import Evaluate
from rsigym_env.wrappers import DevScoreShaping, FlatObservation, RecordEpisode, read_episode, to_jsonable

KWARGS = {"benchmark": "aime", "budget_usd": 200}
# forkserver: forking a multi-threaded test process (pytest-xdist) is unsafe; it is also the default from Python 3.14
FORK = {"context": "forkserver"}
multiprocessing.set_forkserver_preload(["rsigym_env"])  # workers start with the package imported (fast)
# and the ids' own vector env (rsigym_env.vector, also make_vec's default): the same conventions
MODES = [("sync", {}), ("async", {"shared_memory": False, **FORK}), ("vector_entry_point", {})]

# one row per vector step, one action per env, in several forms
BATCHES: list[tuple[Any, Any]] = [
    ({"tool": "evaluate", "args": {"k": 1, "n_tasks": 10}}, '{"tool": "read", "args": {"ref": "budget"}}'),
    ({"tool": "wait", "args": {}}, Evaluate(k=1, n_tasks=5)),
    ('{"tool": "read", "args": {"ref": "jobs"}}', {"tool": "wait"}),
    ({"tool": "submit", "args": {}}, "this is not a tool call"),
]


def single_trace(env_id: str, seed: int, actions: list[Any]) -> list[tuple]:
    env = gym.make(env_id, **KWARGS)
    obs, info = env.reset(seed=seed)
    trace = [(obs, 0.0, False, False, info)]
    for action in actions:
        trace.append(env.step(action))
    env.close()
    return trace


def make_vec(env_id: str, mode: str, vector_kwargs: dict, **kwargs: Any) -> gym.vector.VectorEnv:
    return gym.make_vec(env_id, num_envs=2, vectorization_mode=mode, vector_kwargs=vector_kwargs, **KWARGS, **kwargs)


@pytest.mark.parametrize("mode,vector_kwargs", MODES)
@pytest.mark.parametrize("env_id", rsigym_env.ENV_IDS)
def test_make_vec_steps_batches_and_keeps_text_observations_intact(env_id, mode, vector_kwargs):
    vec = make_vec(env_id, mode, vector_kwargs)
    assert isinstance(vec.action_space, gym.spaces.Tuple) and len(vec.action_space) == 2
    assert all(isinstance(s, gym.spaces.OneOf) for s in vec.action_space)
    expected = [single_trace(env_id, 10 + i, [batch[i] for batch in BATCHES]) for i in range(2)]
    obs, info = vec.reset(seed=[10, 11])
    assert isinstance(obs["log"], tuple) and len(obs["log"]) == 2
    rows = [(obs, np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), info)]
    for batch in BATCHES:
        rows.append(vec.step(batch))
    for t, (obs, reward, terminated, truncated, info) in enumerate(rows):
        assert vec.observation_space.contains(obs)
        assert reward.shape == terminated.shape == truncated.shape == (2,)
        for i in range(2):
            single_obs, single_reward, single_term, single_trunc, single_info = expected[i][t]
            assert obs["log"][i] == single_obs["log"]  # the text arrives intact, not truncated or stale
            assert vec.single_observation_space["log"].contains(obs["log"][i])
            for key in ("budget_left_usd", "time_left_h", "step", "dev_scores", "running_jobs", "action_mask"):
                np.testing.assert_array_equal(obs[key][i], single_obs[key])
            assert (reward[i], terminated[i], truncated[i]) == (single_reward, single_term, single_trunc)
            if t > 0:
                assert info["ok"][i] == single_info["ok"] and info["_ok"][i]
    assert rows[-1][2][0] and rows[-1][4]["error"][1] == "malformed_action"
    assert rows[2][4]["events"][0][0]["kind"] == "evaluate"  # structured info survives the batching

    # the env that submitted is reset on the next step (gymnasium's next-step autoreset)
    obs, reward, terminated, truncated, info = vec.step(vec.action_space.sample())
    assert obs["log"][0].startswith("Research run") and obs["step"][0][0] == 0
    ran = sum(bool(row[4]["ok"][1]) for row in rows[1:]) + bool(info["ok"][1])  # a refused call uses no step
    assert obs["step"][1][0] == ran < len(BATCHES) + 1
    vec.close()


@pytest.mark.parametrize("mode,vector_kwargs", MODES)
def test_sampled_batches_run_to_the_end(mode, vector_kwargs):
    vec = make_vec("RSIGym/Joint-v0", mode, vector_kwargs, max_steps=15)
    vec.action_space.seed(0)
    vec.reset(seed=0)
    ends = 0
    for _ in range(40):
        obs, reward, terminated, truncated, info = vec.step(vec.action_space.sample())
        assert vec.observation_space.contains(obs) and all(isinstance(log, str) and log for log in obs["log"])
        ends += int(np.sum(terminated | truncated))
    assert ends >= 4
    vec.close()


def test_async_default_shared_memory_garbles_text_observations():
    """The pitfall the module docstring describes; if gymnasium fixes it, this test says so."""
    vec = gym.make_vec("RSIGym/Joint-v0", num_envs=2, vectorization_mode="async", vector_kwargs=FORK, **KWARGS)
    obs, _ = vec.reset(seed=0)
    single = gym.make("RSIGym/Joint-v0", **KWARGS)
    single_obs, _ = single.reset(seed=0)
    assert obs["log"][0] != single_obs["log"]
    vec.close()


@pytest.mark.parametrize("mode,vector_kwargs", [("sync", {}), ("async", FORK), ("async", {"shared_memory": False, **FORK})])
def test_flat_observation_vectorises_to_a_float_matrix(mode, vector_kwargs):
    vec = gym.make_vec("RSIGym/Data-v0", num_envs=2, vectorization_mode=mode, vector_kwargs=vector_kwargs,
                       wrappers=[FlatObservation, DevScoreShaping], **KWARGS)
    n = len(FlatObservation.FEATURES)
    obs, _ = vec.reset(seed=3)
    assert isinstance(obs, np.ndarray) and obs.shape == (2, n) and obs.dtype == np.float32
    assert vec.observation_space.shape == (2, n) and vec.observation_space.contains(obs)
    np.testing.assert_array_equal(obs[:, :7], [[1, 1, 0, -1, -1, -1, 0]] * 2)
    for batch in BATCHES[:3]:
        obs, reward, terminated, truncated, info = vec.step(batch)
        assert obs.shape == (2, n) and obs.dtype == np.float32 and vec.observation_space.contains(obs)
        assert reward.dtype == np.float64 and "reward_unshaped" in info
    assert obs[0, FlatObservation.FEATURES.index("dev_best")] > 0  # env 0 waited for its evaluation
    assert obs[0, 0] < 1  # and paid for it
    vec.close()


def test_recorder_in_async_envs_writes_one_file_per_episode(tmp_path):
    vec = gym.make_vec("RSIGym/Harness-v0", num_envs=2, vectorization_mode="async",
                       vector_kwargs={"shared_memory": False, **FORK},
                       wrappers=[lambda env: RecordEpisode(env, tmp_path)], **KWARGS)
    vec.reset(seed=[5, 6])
    vec.step(({"tool": "evaluate", "args": {"k": 1}}, {"tool": "submit", "args": {}}))
    vec.step(({"tool": "submit", "args": {}}, {"tool": "read", "args": {"ref": "budget"}}))  # env 1 autoresets
    vec.close()
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == 3  # two seeded episodes, and env 1's autoreset one (cut by close)
    by_seed = {read_episode(f)[0]["seed"]: read_episode(f) for f in files}
    assert set(by_seed) == {5, 6, None}
    assert [l["type"] for l in by_seed[5]] == ["reset", "step", "step", "summary"] and by_seed[5][-1]["terminated"]
    assert by_seed[6][-1]["steps"] == 1 and by_seed[None][-1]["ended"] is False
    assert json.dumps(to_jsonable(by_seed[5][1]["action"])) == '{"tool": "evaluate", "args": {"k": 1}}'
