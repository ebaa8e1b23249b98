"""Sim env steps per second, measured side by side with CartPole-v1 in the same process and run.

Workloads:
* ``cartpole``: ``gym.make("CartPole-v1")`` with sampled actions (the reference).
* ``sampled``: the sim env with ``action_space.sample()`` (most calls are refused: parse, audit).
* ``scripted``: whole episodes of the scripted researcher (evaluations, data, training, submit),
  resets included: the realistic mix.
"""

from __future__ import annotations

import time
from typing import Callable

import gymnasium as gym

import rsigym_env  # noqa: F401  (registers the ids)
from rsigym_env.baselines import ScriptedResearcher


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


def sampled(seconds: float, benchmark: str = "swe-bench-verified") -> float:
    env = gym.make("RSIGym/Joint-v0", benchmark=benchmark, max_steps=1000)
    env.reset(seed=0)

    def loop() -> int:
        for _ in range(200):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        return 200

    return _rate(loop, seconds)


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


def measure(seconds: float = 3.0) -> dict[str, float]:
    """Steps per second of each workload and their ratio to CartPole (measured in this run)."""
    ref = cartpole(seconds)
    out = {"cartpole_steps_per_s": ref}
    for name, fn in (("sampled", sampled), ("scripted", scripted)):
        rate = fn(seconds)
        out[f"{name}_steps_per_s"] = rate
        out[f"{name}_vs_cartpole"] = rate / ref
    return out


if __name__ == "__main__":
    for key, value in measure().items():
        print(f"{key:28s} {value:12,.3f}")
