"""A prototype of the array env's hot path (issue 27 item 1), to measure before building the env.

NOT the array env: no ledger, no audit, no platform, no datasets or training, a reduced menu. It steps
N sim episodes of one benchmark as arrays with the sim's own array kernels (``SimBatch``: worlds drawn
at once, evaluations in one pass, official scores at submit) and the money and clock the scalar env
keeps (an evaluation is quoted, refused and counted when the balance cannot cover it, else billed; the
clock advances by the job's seconds; a step limit truncates), a feature matrix and an action mask per
step, and autoreset (Gymnasium's ``NEXT_STEP``: a finished env is reset by the next step, its action
ignored, from worlds drawn ahead in batches with their initial official scores), so every evaluation of a
step (dev ones and submits' official ones, mixed k) is one ``SimBatch.evaluate`` call (sim result version 6).

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
    """N prototype episodes as arrays (see the module docstring). Autoreset is Gymnasium's ``NEXT_STEP``:
    an env that finished is reset by the next step (its action ignored), so every evaluation of a step —
    dev evaluations, submits' official ones and the reset envs' initial official ones — is one
    ``SimBatch.evaluate`` call."""

    def __init__(self, benchmark: str, n: int, seed: int = 0):
        self.n, self.next_seed = n, seed + n
        self.batch = SimBatch.make(benchmark, list(range(seed, seed + n)))
        self.steps_total = 0
        self.budget, self.clock = np.full(n, BUDGET_USD), np.zeros(n)
        self.steps, self.refusals = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.fixed = np.zeros((n, 5), bool)
        self.shares = np.full((n, len(FAILURE_MODES)), -1.0)
        self.best_dev, self.initial = np.full(n, -1.0), np.zeros(n)
        self.done = np.zeros(n, bool)
        rows = np.arange(n)
        self.initial[:] = self.batch.evaluate(self.batch.base_skill, np.zeros(n), self._harness(rows), k=3,
                                              split="official").score
        self.ahead_size = max(4 * n, 64)
        self._draw_ahead()

    def _draw_ahead(self) -> None:
        """The next worlds of the autoresets, drawn (and their initial official score evaluated) in one
        batch: the same worlds and scores as drawing each alone at its reset."""
        seeds = list(range(self.next_seed, self.next_seed + self.ahead_size))
        self.next_seed += self.ahead_size
        if hasattr(self, "ahead"):
            self.ahead.reset(np.arange(self.ahead_size), seeds)
        else:
            self.ahead = SimBatch.make(self.batch.model.benchmark.id, seeds)
        m = self.ahead_size
        minimal = HarnessArrays(np.full(m, 4096), *(np.zeros((5, m), bool)), np.ones(m, bool))
        self.ahead_initial = self.ahead.evaluate(self.ahead.base_skill, np.zeros(m), minimal, k=3,
                                                 split="official").score
        self.ahead_next = 0

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
        resetting = self.done
        actions = np.where(resetting, -1, actions)
        reset_rows = np.flatnonzero(resetting)
        if reset_rows.size:
            if self.ahead_next + reset_rows.size > self.ahead_size:
                self._draw_ahead()
            taken = np.arange(self.ahead_next, self.ahead_next + reset_rows.size)
            self.ahead_next += reset_rows.size
            self.batch.take(reset_rows, self.ahead, taken)
            self.initial[reset_rows] = self.ahead_initial[taken]
            self.budget[reset_rows], self.clock[reset_rows] = BUDGET_USD, 0.0
            self.steps[reset_rows], self.refusals[reset_rows] = 0, 0
            self.fixed[reset_rows], self.shares[reset_rows], self.best_dev[reset_rows] = False, -1.0, -1.0
        fix = np.flatnonzero((actions >= FIX0) & (actions < SUBMIT))
        self.fixed[fix, actions[fix] - FIX0] = True
        dev = np.flatnonzero((actions >= 0) & (actions <= 1))
        k_dev = np.where(actions[dev] == 0, 1, 3)
        quote = self.batch.dev_bill(dev, self._harness(dev), k_dev)[0]
        ok = quote <= self.budget[dev]
        self.refusals[dev[~ok]] += 1  # refused: nothing billed, nothing drawn
        dev, k_dev = dev[ok], k_dev[ok]
        submit = np.flatnonzero(actions == SUBMIT)
        rows = np.concatenate([dev, submit])
        official = np.concatenate([np.zeros(dev.size, bool), np.ones(submit.size, bool)])
        k = np.concatenate([k_dev, np.full(submit.size, 3)])
        terminated = np.zeros(self.n, bool)
        if rows.size:
            out = self.batch.evaluate(self.batch.base_skill[rows], np.zeros(rows.size), self._harness(rows), k=k,
                                      split=official, rows=rows)
            d = slice(0, dev.size)
            self.budget[dev] -= out.usd[d]
            self.clock[dev] += out.seconds[d]
            self.shares[dev] = out.failure_counts[d] / (self.batch.n_tasks * k_dev[:, None])
            self.best_dev[dev] = np.maximum(self.best_dev[dev], out.score[d])
            final = out.score[dev.size :]
            start = self.initial[submit]
            gain = final - start
            reward[submit] = np.where(gain >= 0, gain / np.maximum(1.0 - start, 1e-9), gain / np.maximum(start, 1e-9))
            terminated[submit] = True
        self.steps += ~resetting
        truncated = (self.steps >= MAX_STEPS) & ~terminated
        self.done = terminated | truncated
        self.steps_total += self.n
        obs, mask = self.observe()
        return obs, reward, terminated, mask


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
        phase[core.done | (core.steps == 0)] = 0
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
            near = cartpole(args.seconds / 2)  # the machine's load moves: also a CartPole run right before each row
            rate, per_episode = measure(args.benchmark, n, args.seconds, policy)
            print(f"{policy:8s} N={n:4d}: {rate:10,.0f} steps/s ({rate / ref:5.2f}x cartpole, {rate / near:5.2f}x the "
                  f"cartpole run just before: {near:,.0f}/s), {per_episode:4.1f} steps/episode, "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"cartpole-v1 again: {cartpole(args.seconds):,.0f} steps/s; load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
