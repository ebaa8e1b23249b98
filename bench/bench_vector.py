"""The vector sim's aggregate steps/s at N = 1, 16, 256 against one CartPole-v1, in the same run.

``gym.make_vec("RSIGym/Joint-v0", num_envs=N, vectorization_mode="vector_entry_point")``; the aggregate
rate is N x vector steps per second. Workloads:

* ``sampled``: a batch of ``action_space.sample()`` actions per step (drawn beforehand from a pool of
  2,000, untimed), ``include_log=False``; most are refused (parse, authorize, audit).
* ``scripted``: a :class:`~rsigym_env.baselines.ScriptedResearcher` per env choosing from its row of the
  batch (its own time included), whole episodes with next-step autoreset: the realistic mix.
* ``menu``: ``menu=True`` with the shipped RL policy, greedy, one batched forward pass per step
  (a step is a menu entry: one or more tool calls). Since issue 27 item 1 that builds the array env
  (``MenuArrayEnv``; ``bench_menu_array.py`` compares it with the per-env route, ``array=False``).

``same_result``: env 0's finished episodes (rewards) equal those of a scalar env given the same seed and
actions (the scalar env is replayed after the timing).

    python bench/bench_vector.py [--seconds 3] [--sizes 1,16,256]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import rsigym_env  # noqa: F401  (first: it pins NumPy's BLAS kernels; registers the ids)

import gymnasium as gym
import numpy as np

from rsigym_env.baselines import ScriptedResearcher
from rsigym_env.baselines.rl_researcher import default_policy_path, policy_actions, shared_policy
from rsigym_env.vector import sub_info

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import cartpole  # noqa: E402  (the same reference as bench_env.py)

KWARGS = {"benchmark": "swe-bench-verified", "budget_usd": 500}


def _row(obs: dict[str, Any], i: int) -> dict[str, Any]:
    return {key: value[i] for key, value in obs.items()}


def sampled(n: int, seconds: float) -> tuple[float, bool]:
    vec = gym.make_vec("RSIGym/Joint-v0", num_envs=n, vectorization_mode="vector_entry_point", include_log=False,
                       max_steps=1000, **KWARGS)
    vec.single_action_space.seed(0)
    pool = [vec.single_action_space.sample() for _ in range(2000)]
    vec.reset(seed=0)
    env0: list[Any] = []
    steps, start, t = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        batch = [pool[(t * n + i) % len(pool)] for i in range(n)]
        _, reward, terminated, truncated, _ = vec.step(batch)
        env0.append((batch[0], float(reward[0]), bool(terminated[0]), bool(truncated[0])))
        steps, t = steps + n, t + 1
    rate = steps / (time.perf_counter() - start)
    vec.close()
    return rate, _replays(env0, 0, include_log=False, max_steps=1000)


def scripted(n: int, seconds: float) -> tuple[float, bool]:
    vec = gym.make_vec("RSIGym/Joint-v0", num_envs=n, vectorization_mode="vector_entry_point", **KWARGS)
    obs, info = vec.reset(seed=0)
    agents = [ScriptedResearcher() for _ in range(n)]
    for i, agent in enumerate(agents):
        agent.reset(_row(obs, i), sub_info(info, i))
    done = np.zeros(n, dtype=bool)
    env0: list[Any] = []
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        actions = []
        for i, agent in enumerate(agents):
            if done[i]:  # this step resets env i (its action is ignored): a new researcher for it
                actions.append(None)
            else:
                actions.append(agent.act(_row(obs, i), sub_info(info, i)))
        obs, reward, terminated, truncated, info = vec.step(actions)
        for i in np.flatnonzero(done):
            agents[i] = ScriptedResearcher()
            agents[i].reset(_row(obs, i), sub_info(info, i))
        env0.append((actions[0], float(reward[0]), bool(terminated[0]), bool(truncated[0])))
        done = terminated | truncated
        steps += n
    rate = steps / (time.perf_counter() - start)
    vec.close()
    return rate, _replays(env0, 0)


def menu(n: int, seconds: float) -> tuple[float, bool]:
    params = shared_policy(default_policy_path())
    vec = gym.make_vec("RSIGym/Joint-v0", num_envs=n, vectorization_mode="vector_entry_point", menu=True, **KWARGS)
    obs, info = vec.reset(seed=0)
    env0: list[Any] = []
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        actions, _ = policy_actions(params, obs.astype(np.float64), info["action_mask"], None)
        obs, reward, terminated, truncated, info = vec.step(actions)
        env0.append((int(actions[0]), float(reward[0]), bool(terminated[0]), bool(truncated[0])))
        steps += n
    rate = steps / (time.perf_counter() - start)
    vec.close()
    return rate, _replays(env0, 0, menu=True)


def _replays(trace: list[tuple[Any, float, bool, bool]], seed: int, menu: bool = False, **kwargs: Any) -> bool:
    """Whether a scalar env, reset like env 0 (seed, then next-step autoresets), gives env 0's rewards and ends."""
    env: Any = gym.make("RSIGym/Joint-v0", **KWARGS, **kwargs)
    if menu:
        from rsigym_env.wrappers.menu import DiscreteMenu
        env = DiscreteMenu(env)
    env.reset(seed=seed)
    done = False
    for action, reward, terminated, truncated in trace:
        if done:
            env.reset()
            row = (0.0, False, False)
        else:
            _, r, te, tr, _ = env.step(action)
            row = (float(r), bool(te), bool(tr))
        if row != (reward, terminated, truncated):
            return False
        done = row[1] or row[2]
    env.close()
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sizes", default="1,16,256")
    args = parser.parse_args()
    print(f"load before {os.getloadavg()}")
    ref = cartpole(args.seconds)
    print(f"cartpole-v1 (gym.make, sampled): {ref:,.0f} steps/s")
    print(f"{'workload':10s} {'N':>5s} {'steps/s':>12s} {'x cartpole':>10s} same_result  load")
    for workload in (sampled, scripted, menu):
        for n in (int(s) for s in args.sizes.split(",")):
            rate, same = workload(n, args.seconds)
            print(f"{workload.__name__:10s} {n:5d} {rate:12,.0f} {rate / ref:10.3f} {str(same):11s} "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
    print(f"cartpole-v1 again: {cartpole(args.seconds):,.0f} steps/s; load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
