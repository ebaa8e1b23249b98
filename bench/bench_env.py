"""Sim env steps per second, measured side by side with CartPole-v1 in the same process and run.

Workloads:
* ``cartpole``: ``gym.make("CartPole-v1")`` with sampled actions (the reference).
* ``sampled``: the sim env stepping through a pool of 2000 ``action_space.sample()`` actions drawn
  beforehand (most are refused: parse, authorize, audit). Drawing them is timed separately
  (``sampling_per_s``): 512-character random strings cost more than the step that refuses them.
  The refused and the executed steps of that pool are also timed apart (``refused_us``,
  ``executed_us``: mean microseconds per step; ``refused_median_us``, ``executed_median_us``: medians).
* ``scripted``: whole episodes of the scripted researcher (evaluations, data, training, submit),
  resets included: the realistic mix.
* ``rl``: whole episodes of the shipped RL researcher (PPO policy over the ``DiscreteMenu``
  wrapper), resets and the policy's own forward passes included.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import rsigym_env  # noqa: F401  (first: it pins NumPy's BLAS kernels; registers the ids)

import gymnasium as gym
from rsigym_env.baselines import ScriptedResearcher
from rsigym_env.episode import run_episode
from rsigym_env.sweep import resolve_agent


def _rate(loop: Callable[[], int], seconds: float) -> float:
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        steps += loop()
    return steps / (time.perf_counter() - start)


def cartpole(seconds: float) -> float:
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    env.action_space.seed(0)

    def loop() -> int:
        for _ in range(1000):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        return 1000

    return _rate(loop, seconds)


def sampled(seconds: float, benchmark: str = "swe-bench-verified") -> tuple[float, float]:
    """(steps/s over pre-drawn sampled actions, samples/s of ``action_space.sample()``)."""
    env = gym.make("RSIGym/Joint-v0", benchmark=benchmark, max_steps=1000)
    env.reset(seed=0)
    env.action_space.seed(0)
    start = time.perf_counter()
    pool = [env.action_space.sample() for _ in range(2000)]
    sampling = len(pool) / (time.perf_counter() - start)
    position = 0

    def loop() -> int:
        nonlocal position
        for _ in range(200):
            _, _, terminated, truncated, _ = env.step(pool[position])
            position = (position + 1) % len(pool)
            if terminated or truncated:
                env.reset()
        return 200

    return _rate(loop, seconds), sampling


def sampled_paths(benchmark: str = "swe-bench-verified", n: int = 4000) -> dict[str, float]:
    """Microseconds per step of the refused and of the executed steps among sampled actions."""
    env = gym.make("RSIGym/Joint-v0", benchmark=benchmark, max_steps=100_000)
    env.reset(seed=1)
    env.action_space.seed(1)
    pool = [env.action_space.sample() for _ in range(n)]
    times: dict[bool, list[float]] = {True: [], False: []}
    for action in pool:
        start = time.perf_counter()
        _, _, terminated, truncated, info = env.step(action)
        times[bool(info.get("ok"))].append(time.perf_counter() - start)
        if terminated or truncated:
            env.reset()
    mean = lambda xs: 1e6 * sum(xs) / max(len(xs), 1)  # noqa: E731
    median = lambda xs: 1e6 * statistics.median(xs) if xs else 0.0  # noqa: E731
    # the means carry the cyclic collector's pauses (a full collection takes tens of ms here) into
    # whichever steps they fall in: with ~2% of the steps executed, one pause moves their mean a lot
    return {"refused_us": mean(times[False]), "executed_us": mean(times[True]),
            "refused_fraction": len(times[False]) / n,
            "refused_median_us": median(times[False]), "executed_median_us": median(times[True])}


def scripted(seconds: float, benchmark: str = "swe-bench-verified") -> float:
    env = gym.make("RSIGym/Joint-v0", benchmark=benchmark)
    seed = iter(range(10**9))

    def loop() -> int:
        agent = ScriptedResearcher()
        obs, info = env.reset(seed=next(seed))
        agent.reset(obs, info)
        steps, done = 0, False
        while not done:
            obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
            steps, done = steps + 1, terminated or truncated
        return steps

    return _rate(loop, seconds)


def rl(seconds: float, benchmark: str = "swe-bench-verified") -> float:
    env = gym.make("RSIGym/Joint-v0", benchmark=benchmark)
    factory = resolve_agent("rl")
    seed = iter(range(10**9))

    def loop() -> int:
        return run_episode(env, factory(), seed=next(seed)).steps

    return _rate(loop, seconds)


def measure(seconds: float = 3.0) -> dict[str, float]:
    """Steps per second of each workload and their ratio to CartPole (measured in this run, side by side)."""
    ref = cartpole(seconds)
    rate, sampling = sampled(seconds)
    script = scripted(seconds)
    policy = rl(seconds)
    return {"cartpole_steps_per_s": ref, "sampled_steps_per_s": rate, "sampled_vs_cartpole": rate / ref,
            "scripted_steps_per_s": script, "scripted_vs_cartpole": script / ref,
            "rl_steps_per_s": policy, "rl_vs_cartpole": policy / ref, "sampling_per_s": sampling,
            **sampled_paths()}


if __name__ == "__main__":
    import os

    before = os.getloadavg()[0]
    for key, value in measure().items():
        print(f"{key:28s} {value:12,.3f}")
    print(f"{'load_1min':28s} {before:12,.2f} -> {os.getloadavg()[0]:,.2f}")
