"""A prototype of the array env's hot path (issue 27 item 1), to measure before building the env.

NOT the array env: no ledger, no audit, no platform, no datasets or training, a reduced menu. It steps
N sim episodes of one benchmark as arrays with the sim's own array kernels (``SimBatch``: worlds drawn
at once, evaluations in one pass, official scores at submit) and the money and clock the scalar env
keeps (an evaluation is quoted, refused and counted when the balance cannot cover it, else billed; the
clock advances by the job's seconds; a step limit truncates), a feature matrix and an action mask per
step, and autoreset (``NEXT_STEP``-like: finished envs get new worlds at the end of the step).

Menu of the prototype: 0 ``eval k=1``, 1 ``eval k=3``, 2–6 ``fix:<defect>`` (switch the option on),
7 ``submit`` (official avg@3 of the latest harness; reward = normalized gain over the initial system).
Actions: ``sampled`` (uniform over the 8 entries) and ``scripted`` (eval k=1, fix every defect whose
failure share is above zero, eval k=3, submit: the scripted researcher's harness recipe).

CartPole-v1 (``gym.make``, sampled actions) is measured at the start and the end of the same run.

    python bench/bench_array_core.py [--seconds 2] [--sizes 1,16,256] [--benchmark swe-bench-verified]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import rsigym_env  # noqa: F401  (first: it pins NumPy's code)

import numpy as np

from rsigym_env.worlds.sim.batch import HarnessArrays, SimBatch
from rsigym_env.worlds.sim.model import FAILURE_MODES

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import cartpole  # noqa: E402  (the same reference as bench_env.py)

BUDGET_USD, MAX_STEPS, N_ACTIONS = 500.0, 30, 8
SUBMIT, FIX0 = 7, 2


class ArrayCore:
    """N prototype episodes as arrays (see the module docstring)."""

    def __init__(self, benchmark: str, n: int, seed: int = 0):
        self.n, self.next_seed = n, seed + n
        self.batch = SimBatch.make(benchmark, list(range(seed, seed + n)))
        self.minimal = HarnessArrays.of([self.batch.initial_harness()])
        self.steps_total = 0
        self._reset_rows(np.arange(n))

    def _reset_rows(self, rows: np.ndarray) -> None:
        if not hasattr(self, "budget"):
            n = self.n
            self.budget, self.clock = np.full(n, BUDGET_USD), np.zeros(n)
            self.steps, self.refusals = np.zeros(n, np.int64), np.zeros(n, np.int64)
            self.fixed = np.zeros((n, 5), bool)
            self.shares = np.full((n, len(FAILURE_MODES)), -1.0)
            self.best_dev, self.initial = np.full(n, -1.0), np.zeros(n)
        else:
            seeds = np.arange(self.next_seed, self.next_seed + rows.size)
            self.next_seed += rows.size
            self.batch.reset(rows, seeds)
            self.budget[rows], self.clock[rows], self.steps[rows], self.refusals[rows] = BUDGET_USD, 0.0, 0, 0
            self.fixed[rows], self.shares[rows], self.best_dev[rows] = False, -1.0, -1.0
        h = self._harness(rows)
        self.initial[rows] = self.batch.evaluate(self.batch.base_skill[rows], np.zeros(rows.size), h, k=3,
                                                 split="official", rows=rows).score

    def _harness(self, rows: np.ndarray) -> HarnessArrays:
        f = self.fixed[rows]
        m = rows.size
        return HarnessArrays(np.full(m, 4096), f[:, 0], f[:, 1], f[:, 2], f[:, 3], f[:, 4], np.ones(m, bool))

    def observe(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, 16) float32 features and (N, 8) bool mask."""
        obs = np.empty((self.n, 16), np.float32)
        obs[:, 0] = self.budget / BUDGET_USD
        obs[:, 1] = self.steps / MAX_STEPS
        obs[:, 2] = self.best_dev
        obs[:, 3:8] = ~self.fixed
        obs[:, 8:15] = self.shares[:, :7]
        obs[:, 15] = self.clock / 86_400.0
        mask = np.ones((self.n, N_ACTIONS), bool)
        mask[:, FIX0 : FIX0 + 5] = ~self.fixed
        return obs, mask

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        reward = np.zeros(self.n)
        done = np.zeros(self.n, bool)
        fix = (actions >= FIX0) & (actions < SUBMIT)
        rows = np.flatnonzero(fix)
        self.fixed[rows, actions[rows] - FIX0] = True
        for k, action in ((1, 0), (3, 1)):
            rows = np.flatnonzero(actions == action)
            if rows.size:
                self._evaluate(rows, k)
        rows = np.flatnonzero(actions == SUBMIT)
        if rows.size:
            out = self.batch.evaluate(self.batch.base_skill[rows], np.zeros(rows.size), self._harness(rows), k=3,
                                      split="official", rows=rows)
            gain = out.score - self.initial[rows]
            reward[rows] = np.where(gain >= 0, gain / np.maximum(1.0 - self.initial[rows], 1e-9),
                                    gain / np.maximum(self.initial[rows], 1e-9))
            done[rows] = True
        self.steps += 1
        truncated = (self.steps >= MAX_STEPS) & ~done
        finished = np.flatnonzero(done | truncated)
        self.steps_total += self.n
        if finished.size:
            self._reset_rows(finished)
        obs, mask = self.observe()
        return obs, reward, done, mask

    def _evaluate(self, rows: np.ndarray, k: int) -> None:
        h = self._harness(rows)
        quote = self.batch._bill(self._tasks(rows), h, k)[0]
        ok = quote <= self.budget[rows]
        self.refusals[rows[~ok]] += 1  # refused: nothing billed, nothing drawn
        rows, h = rows[ok], self._harness(rows[ok])
        if not rows.size:
            return
        out = self.batch.evaluate(self.batch.base_skill[rows], np.zeros(rows.size), h, k=k, rows=rows)
        self.budget[rows] -= out.usd
        self.clock[rows] += out.seconds
        self.shares[rows] = out.failure_counts / (self.batch.n_tasks * k)
        self.best_dev[rows] = np.maximum(self.best_dev[rows], out.score)

    def _tasks(self, rows: np.ndarray):  # noqa: ANN202
        dev = self.batch.dev
        return type(dev)(dev.difficulty[rows], dev.reply_tokens[rows], dev.flags[rows], dev.interference[rows],
                         dev.present[rows])


def scripted(obs: np.ndarray, mask: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """eval k=1, then fix each defect its failure shares show, eval k=3, submit (per env, in arrays)."""
    shares = obs[:, 8:13]
    wanted = (shares > 0) & mask[:, FIX0 : FIX0 + 5]
    action = np.where(phase == 0, 0, np.where(wanted.any(axis=1), FIX0 + wanted.argmax(axis=1), 1))
    action = np.where(phase >= 2, SUBMIT, action)
    return action


def measure(benchmark: str, n: int, seconds: float, policy: str) -> tuple[float, float]:
    core = ArrayCore(benchmark, n)
    obs, mask = core.observe()
    rng = np.random.default_rng(0)
    phase = np.zeros(n, np.int64)
    done_eps, start, steps = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        if policy == "sampled":
            actions = rng.integers(0, N_ACTIONS, n)
        else:
            actions = scripted(obs, mask, phase)
            phase = np.where(actions == 1, 2, np.where(actions == 0, 1, phase))
        obs, reward, done, mask = core.step(actions)
        phase[done | (core.steps == 0)] = 0
        done_eps += int(done.sum())
        steps += n
    elapsed = time.perf_counter() - start
    return steps / elapsed, steps / max(done_eps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--sizes", default="1,16,256")
    parser.add_argument("--benchmark", default="swe-bench-verified")
    args = parser.parse_args()
    print(f"load before {os.getloadavg()}")
    ref = cartpole(args.seconds)
    print(f"cartpole-v1 (gym.make, sampled): {ref:,.0f} steps/s")
    for policy in ("sampled", "scripted"):
        for n in (int(s) for s in args.sizes.split(",")):
            rate, per_episode = measure(args.benchmark, n, args.seconds, policy)
            print(f"{policy:8s} N={n:4d}: {rate:10,.0f} steps/s ({rate / ref:5.2f}x cartpole), "
                  f"{per_episode:4.1f} steps/episode, load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"cartpole-v1 again: {cartpole(args.seconds):,.0f} steps/s; load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
