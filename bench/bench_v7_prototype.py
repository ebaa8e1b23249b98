"""A measured lower bound for a "result version 7" harness-track step of the vector sim (issue 27 item 1, brief 28c).

A self-contained prototype (bench code: nothing in ``rsigym_env`` changes) of what ``MenuArrayEnv`` does on the
HARNESS track (``eval_latest_k1``, ``eval_latest_k3``, ``eval_base_k3``, ``fix:<defect>`` x 5, ``wait``,
``submit_best``, ``submit_latest``; the data and training entries are masked there), built the way a version-7
sim would build it: every macro as one fixed pass over the rows that chose it, and an evaluation's statistics
per exposure code instead of per task. It does not reproduce today's (version 6) results: it is a different
version of the sim. It does the same kind and amount of work per row as a real step would:

* state per row (struct of arrays, the episode's scalars in one int64 and one float64 matrix so that a reset is
  two row assignments): the harness version as 5 bits (``fixed`` per defect), whether the harness file was read,
  the clock, money in int nano-dollars (``spent``, ``reserved``: reserved at the quote rounded up before the call,
  refused when it does not fit, settled at the bill and never above the hold, so never negative), steps,
  refusals, the evaluation job (start, ready, bill, score, counts; blocking as ``DiscreteMenu``'s evaluate:
  start, then ``wait``), the dev candidates (32 harness versions: number of scores, running sum, mean, the
  order first scored, for ``submit_best``'s tie rule), initial, best and last dev score, failure shares and cost
  of the last evaluation, evaluations, done and end reason, the episode's initial and final official score;
* the run's limits after each call in the run's order (steps, refusals, time, money), an ended episode's
  running job billed for the share that ran, the normalized gain as reward;
* evaluations with real statistics of the sim's model (``rsigym_env.worlds.sim.model``): a task's success
  chance is ``sigmoid(skill - d)`` times the chance that no active defect it is exposed to trips times the
  chance that no unneeded remedy interferes. On this track the skill is the world's base skill and there is no
  dev memory, so per world, split and "code assignment" the sums over tasks of ``q = sigmoid(skill - d)``,
  of ``q**2`` and the task count per 5-bit code are computed once when the world is drawn (``_world_tables``).
  A task's code has bit j from its exposure flag of defect j where the world has defect j (truncation: also
  while it is not fixed) and from its interference flag otherwise (only an unneeded remedy acts there, and a
  defect the world lacks never trips), so two assignments cover the 32 harness versions. An evaluation is then
  a few (M, 32) passes: the per-code factors ``exp(L @ bits.T)``, the expected successes and their variance
  (``sum F Q1``, ``sum F Q1 - sum F**2 Q2``), the failures blamed per defect (the model's ``blame`` per code,
  summed over the codes with the defect's bit; every sum in a fixed order, no BLAS: brief 29a) and the model's
  own aggregate draw
  (:func:`~rsigym_env.worlds.sim.model.draw_outcomes`) from counter-based uniforms
  (:func:`~rsigym_env.worlds.sim.draws.uniforms`: a dev evaluation the world's next ``eval`` draw, a submit the
  world's fixed ``official`` draw). Bills (usd, seconds) are the sim's own (``SimBatch.bill``), tabulated at
  start-up per (half, reply variant, harness version, k);
* autoreset (``NEXT_STEP``): the rows that ended take the next world of a buffer drawn ahead in batches
  (:func:`~rsigym_env.worlds.sim.model.draw_worlds` of ``AHEAD`` seeds, their per-code tables and their initial
  official score by the same per-code statistics, all in one pass per batch; the batches' cost is in the timing);
* the ledger: one ``Ledger.open_settled`` entry per step listing the episodes that ended in it
  (:func:`rsigym_env.menu_vector.write_episode_records` with ``per_step=True``, as ``write_episodes="step"``), or
  nothing (``ledger=False``);
* the observation: the (N, 50) float32 ``FEATURES`` matrix and the (N, 27) action mask, and the info arrays
  (``action_mask``, ``n_calls``, ``ok``, ``cost_usd``, ``budget_left_usd``, ``spent_usd``, and the 12 end keys
  for the rows that ended).

Left out, with what it would cost (estimates on this VM, ~1 us a NumPy call on 256 rows):

* episode seeds from each row's own Gymnasium generator (the real env draws a window of 16 per row, one
  ``integers`` call per row per 16 episodes: ~49/16 x ~5 us = ~15 us a step at N = 256); here one generator;
* the adapter's exact ``np.mean`` of a candidate scored 8 times or more (a per-candidate list; rare: here the
  running sum's mean);
* the string ``error`` column per row (``ok`` is kept), refused masked entries (gen, clean, train: the mask
  forbids them; a refusal is ~10 calls on the rows that send one), tools a scenario forbids (harness track:
  none), non-default harness edits, worker processes;
* the per-task text (the real array env has none either).

Together ~20-40 us a step at N = 256: inside the figures' noise.

    python bench/bench_v7_prototype.py [--sizes 64,256,1024] [--seconds 3] [--profile-steps 200] [--real]
    python bench/bench_v7_prototype.py --interleave 3 [--sizes 256,1024] [--seconds 2]
    python bench/bench_v7_prototype.py --check

Each size: CartPole-v1 (``bench_env.cartpole``, wall, and the same loop per CPU-second) for 1 s right before,
then the prototype with the per-step ledger entry, without a ledger, and without a ledger nor world draws (new
episodes recycle the first batch's worlds: the step's own arrays) (masked uniform actions, 20 steps of warm-up,
``--seconds`` of ``step`` by CPU time), and with ``--real`` today's ``MenuArrayEnv`` (harness track,
``write_episodes="step"``) the same way; then the NumPy/Python calls a step (cProfile's total calls over
``--profile-steps`` steps / steps; cProfile does not see operators such as ``a + b`` or ``a[rows]``, so they are
counted apart by opcode tracing) at each size. ``--interleave R``: R rounds of the four rows one after the
other at each size (CartPole's CPU rate before each round), and each row's medians: the A/B figures. ``--check``: the per-code statistics against the model's per-task
``evaluation_stats`` (300 worlds, every harness version, both splits; they differ by float rounding, ~3e-14).

>>> env = V7HarnessEnv(4, ledger=True)
>>> obs, info = env.reset(seed=0)
>>> obs.shape, info["action_mask"].shape, info["action_mask"][:, MENU_INDEX["wait"]].any()
((4, 50), (4, 27), np.False_)
>>> actions = np.array([MENU_INDEX[name] for name in ("eval_latest_k1", "fix:truncated_output", "wait",
...                                                   "submit_latest")])
>>> obs, reward, terminated, truncated, info = env.step(actions)
>>> info["n_calls"].tolist(), terminated.tolist(), info["ok"].tolist()
([2, 2, 1, 1], [False, False, False, True], [True, True, False, True])
>>> int(env.ledger.books().ok), len(env.ledger.audit_records())
(1, 1)
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import rsigym_env  # noqa: F401  (first: it pins NumPy's code; registers the ids)

import gymnasium as gym
import numpy as np
from threadpoolctl import threadpool_limits

from rsigym_env.catalog import DEFECTS, FAILURE_MODES
from rsigym_env.menu_vector import (END_KEYS, EpisodeRecords, MenuArrayEnv, _normalized_gains, nano_near, nano_up,
                                    round_digits, write_episode_records)
from rsigym_env.platform.ledger import NANO, Ledger
from rsigym_env.worlds.sim.draws import benchmark_key, seed_array, stream_keys, uniforms
from rsigym_env.worlds.sim.model import (EVAL_DRAWS, MAX_ATTEMPTS, EvalStats, draw_outcomes, draw_worlds,
                                         task_table)
from rsigym_env.wrappers.menu import FEATURES, MENU, MENU_INDEX

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import cartpole  # noqa: E402  (the same reference as bench_env.py and bench_menu_array.py)
from bench_menu_array import cartpole_cpu as cartpole_rates  # noqa: E402  ((steps/s, steps per CPU-second))

D = len(DEFECTS)
VERSIONS = 1 << D  # harness versions the menu's fixes make (bit j: DEFECTS[j] fixed)
BIT_CODES = np.array([c for j in range(D) for c in range(VERSIONS) if c >> j & 1])  # (5 x 16): codes with bit j
AHEAD = 4096  # worlds drawn ahead per batch
_F = {name: i for i, name in enumerate(FEATURES)}

# the menu's entries as numbers: what kind each is, its k, its defect
NONE, EVAL, FIX, WAIT, SUBMIT = -1, 0, 1, 2, 3
_KIND = np.array([{"eval_latest": EVAL, "eval_base": EVAL, "fix": FIX, "wait": WAIT, "submit_best": SUBMIT,
                   "submit_latest": SUBMIT}.get(m.kind, NONE) for m in MENU], np.int64)
_K = np.array([m.arg if m.kind in ("eval_latest", "eval_base") else 1 for m in MENU], np.int64)
_DEFECT = np.array([DEFECTS.index(m.arg) if m.kind == "fix" else 0 for m in MENU], np.int64)
_BEST = np.array([m.kind == "submit_best" for m in MENU])
_REASONS = np.array(["", "submitted", "step limit", "refusal limit", "time limit", "budget exhausted"], dtype=object)

# the episode's integer and float state: column names, and what a new episode starts with
_INTS = ("spent", "reserved", "steps", "refusals", "version", "read", "last_error", "n_cand", "evaluations", "done",
         "reason", "running", "eval_counter")
_FLOATS = ("clock", "initial_dev", "best_dev", "last_dev", "eval_cost", "job_start", "job_ready", "job_usd",
           "final")
_FLOAT_START = np.array([-1.0 if name in ("initial_dev", "best_dev", "last_dev") else 0.0 for name in _FLOATS])


@lru_cache(maxsize=None)
def task_codes(benchmark: str) -> tuple[np.ndarray, np.ndarray]:
    """For each of 64 keys (table half, reply variant, which of defects 1..4 the world has): each task's 6-bit
    code (bits 0-4: the 5-bit code of assignment 0, ``DEFECTS[j]`` at bit j; bit 5: its truncation remedy's
    interference flag, bit 0 of assignment 1), (64, n) int; and the task count per 6-bit code, (64, 64)."""
    table = task_table(benchmark)
    codes = np.zeros((2, 2, 16, table.n), np.intp)
    for half in (0, 1):
        interfered = table.interference_codes[half]
        for variant in (0, 1):
            code = table.minimal_codes[variant, half]  # the model's layout: bit 4 = truncation
            exposed = ((code & 15) << 1) | (code >> 4)  # bit j = DEFECTS[j]
            for has in range(16):
                keep = has << 1
                rest = (exposed & keep) | (interfered & ~keep & (VERSIONS - 2))
                codes[half, variant, has] = rest | (exposed & 1) | ((interfered & 1) << 5)
    codes = codes.reshape(64, table.n)
    counts = np.stack([np.bincount(row, minlength=64) for row in codes]).astype(float)
    for array in (codes, counts):
        array.flags.writeable = False
    return codes, counts


def _world_tables(benchmark: str, present: np.ndarray, half: np.ndarray, skill: np.ndarray) -> np.ndarray:
    """(W, 2 splits, 2 assignments, 3, 32): per world, split (0 dev, 1 official) and code assignment (1: the
    truncation bit from the interference flag, where the world lacks truncation and it is fixed) the sums over
    the split's tasks of ``q = sigmoid(skill - d)``, of ``q**2``, and the task counts per 5-bit code (bit j:
    ``DEFECTS[j]``; bit j from the exposure flag where the world has defect j, else from the interference
    flag). Two ``bincount`` passes over the W x 2 x n tasks by 6-bit code (:func:`task_codes`), then each
    assignment's 32 sums are sums of two 6-bit cells.

    >>> t = task_table("aime")
    >>> out = _world_tables("aime", np.ones((2, 5), bool), np.array([0, 1]), np.array([0.0, 1.0]))
    >>> out.shape, float(out[0, 0, 0, 2].sum()) == t.n
    ((2, 2, 2, 3, 32), True)
    >>> bool(np.isclose(out[1, 1, 0, 0].sum(), (1 / (1 + np.exp(t.difficulty[1] - 1.0))).sum()))
    True
    """
    table = task_table(benchmark)
    codes, counts = task_codes(benchmark)
    w, pairs = len(half), 2 * len(half)
    halves = np.stack([1 - half, half], axis=1)  # (W, 2): the dev half, then the official half
    q = table.exp_difficulty[halves] * np.exp(-skill)[:, None, None]
    q += 1.0
    np.divide(1.0, q, out=q)
    has = (present[:, 1:] << np.arange(D - 1)).sum(axis=1)
    key = ((halves * 2 + present[:, :1]) * 16 + has[:, None]).ravel()  # (2W,)
    cell = (codes[key] + 64 * np.arange(pairs)[:, None]).ravel()
    six = np.empty((3, pairs, 64))
    six[0] = np.bincount(cell, q.ravel(), 64 * pairs).reshape(pairs, 64)
    six[1] = np.bincount(cell, (q * q).ravel(), 64 * pairs).reshape(pairs, 64)
    six[2] = counts[key]
    six = six.reshape(3, pairs, 2, 16, 2)  # (interference bit 0, bits 1-4, exposure bit 0)
    out = np.empty((pairs, 2, 3, 16, 2))  # (assignment, sum, bits 1-4, bit 0)
    out[:, 0] = (six[:, :, 0] + six[:, :, 1]).transpose(1, 0, 2, 3)  # bit 0 from the exposure flag
    out[:, 1] = (six[..., 0] + six[..., 1]).transpose(1, 0, 3, 2)  # from the interference flag
    return out.reshape(w, 2, 2, 3, VERSIONS)


def per_code_products(values: np.ndarray) -> np.ndarray:
    """(M, 32): for every 5-bit code the product of ``values`` (M, 5) over its bits (bit j: column j), built by
    doubling in place (the codes below ``2**j`` times column j are the codes with bit j), no ``exp`` or ``log``.

    >>> per_code_products(np.array([[2.0, 3.0, 5.0, 7.0, 11.0]]))[0, [0, 1, 2, 3, 31]].tolist()
    [1.0, 2.0, 3.0, 6.0, 2310.0]
    """
    out = np.empty((len(values), VERSIONS))
    out[:, 0] = 1.0
    for j in range(D):
        np.multiply(out[:, :1 << j], values[:, j:j + 1], out=out[:, 1 << j:2 << j])
    return out


def per_code_sums(values: np.ndarray) -> np.ndarray:
    """(M, 32): for every 5-bit code the sum of ``values`` (M, 5) over its bits, added in the order of the bits
    (``((0 + v[j1]) + v[j2]) + ...``, j1 < j2 < ...), by doubling as :func:`per_code_products`: a fixed order,
    where a BLAS product's order depends on the CPU's kernels and on where the row falls in the matrix.

    >>> per_code_sums(np.array([[2.0, 3.0, 5.0, 7.0, 11.0]]))[0, [0, 1, 2, 3, 31]].tolist()
    [0.0, 2.0, 3.0, 5.0, 28.0]
    """
    out = np.empty((len(values), VERSIONS))
    out[:, 0] = 0.0
    for j in range(D):
        np.add(out[:, :1 << j], values[:, j:j + 1], out=out[:, 1 << j:2 << j])
    return out


def per_code_stats(tables: np.ndarray, split: np.ndarray, world: np.ndarray, active: np.ndarray,
                   applied: np.ndarray, m: int, rows: np.ndarray | None = None) -> EvalStats:
    """The :class:`~rsigym_env.worlds.sim.model.EvalStats` (the fields ``draw_outcomes`` reads: ``mean``, ``var``,
    ``causes``) of M evaluations from the worlds' per-code ``tables`` (``_world_tables``; ``rows``: the M worlds'
    rows in it, default all): the split per row, the world's ``[present (5), 1 - severity (5), 1 - harm (5),
    severity (5)]`` (M, 20) and the harness's ``active`` and ``applied`` (M, 5) defects and remedies, over ``m``
    tasks.

    >>> t = task_table("aime")
    >>> tab = _world_tables("aime", np.zeros((1, 5), bool), np.array([0]), np.array([0.0]))
    >>> world = np.concatenate([np.zeros(5), np.ones(5), np.ones(5), np.zeros(5)])[None]
    >>> s = per_code_stats(tab, np.array([1]), world, np.ones((1, 5), bool), np.zeros((1, 5), bool), t.n)
    >>> bool(np.isclose(s.mean[0], (1 / (1 + np.exp(t.difficulty[0]))).sum())), s.causes[0, :5].tolist()
    (True, [0.0, 0.0, 0.0, 0.0, 0.0])
    """
    size = len(split)
    present = world[:, :D] > 0
    counted = active & present
    counted[:, 0] = active[:, 0]  # truncation counts wherever the harness leaves it (long replies are rare)
    unneeded = applied & ~present
    keep = np.where(counted, world[:, D:2 * D], 1.0)  # the chance a counted defect does not trip
    trip = np.where(counted, world[:, 3 * D:], 0.0)
    # per code: no counted defect trips and no unneeded remedy interferes (exclusive); no counted defect trips
    both = per_code_products(np.concatenate([keep * np.where(unneeded, world[:, 2 * D:3 * D], 1.0), keep]))
    factor, passing = both[:size], both[size:]
    pick = tables[np.arange(size) if rows is None else rows, split, unneeded[:, 0].astype(np.intp)]  # (M, 3, 32)
    mean = (factor * pick[:, 0]).sum(axis=1)
    var = mean - (factor * factor * pick[:, 1]).sum(axis=1)
    trips = per_code_sums(trip)
    blame = (1.0 - passing) / np.maximum(trips, 1e-300)  # 0 where no counted defect: then passing is 1
    causes = np.empty((size, D + 1))
    # per defect the pairwise sum (NumPy's, over 16 contiguous values) of its 16 codes' blamed failures: a fixed
    # order (a matrix product's depends on the BLAS kernels and the row's place; a 3-d sum's on the shape)
    causes[:, :D] = (pick[:, 2] * blame)[:, BIT_CODES].reshape(size * D, VERSIONS // 2).sum(axis=1).reshape(
        size, D) * trip
    causes[:, D] = np.maximum(m - mean - causes[:, :D].sum(axis=1), 0.0)
    nothing = np.broadcast_to(0.0, (size, m))  # draw_outcomes reads only the shape of the per-task fields
    return EvalStats(nothing, nothing, nothing[:, :0], nothing[:, :0], mean, var, causes)


class V7HarnessEnv:
    """N harness-track episodes stepped as arrays in the version-7 style (module docstring); ``reset``/``step`` as
    a Gymnasium vector env's (``NEXT_STEP`` autoreset). ``ledger``: one ``open_settled`` entry per step for the
    episodes that ended in it, or none. ``recycle_worlds`` (a measurement, not a sim): new episodes take the first
    batch's worlds over and over, so the step is timed without drawing worlds."""

    def __init__(self, num_envs: int, *, benchmark: str = "swe-bench-verified", budget_usd: float = 500.0,
                 ledger: bool = True, recycle_worlds: bool = False):
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        real = MenuArrayEnv(1, track="harness", benchmark=benchmark, budget_usd=budget_usd, write_episodes=False)
        s = self.scenario = real.scenario  # constants: the scenario, limits, prices, harness versions, mask
        self.n = num_envs
        self.budget_n, self.min_n, self.time_limit_s = real.budget_n, real._min_n, real.time_limit_s
        self.static_mask = real._static_mask
        self.model, self.benchmark = real.batch.model, real.batch.model.benchmark
        self.table = task_table(benchmark)
        self.m = self.table.n
        h = real.harness_table
        self.active, self.applied = np.asarray(h.active), np.asarray(h.applied)  # (32, 5) per version
        # bills per (half, variant, version, k): the sim's own, tabulated once
        ks = sorted({1, 3, s.official_k})
        grid = np.array([(a, b, v, k) for a in (0, 1) for b in (0, 1) for v in range(VERSIONS) for k in ks])
        usd, seconds, _, _ = real.batch.bill(grid[:, 0], grid[:, 1], h.take(grid[:, 2]), grid[:, 3], self.m)
        self.bill = np.zeros((2, 2, VERSIONS, MAX_ATTEMPTS + 1, 2))
        self.bill[grid[:, 0], grid[:, 1], grid[:, 2], grid[:, 3]] = np.stack([usd, seconds], axis=1)
        real.close()
        self.bkey = benchmark_key(benchmark)
        self.ledger = Ledger(None) if ledger else None
        self.recycle = recycle_worlds
        self._keys = 0
        n = num_envs
        self.ints, self.floats = np.zeros((n, len(_INTS)), np.int64), np.zeros((n, len(_FLOATS)))
        for j, name in enumerate(_INTS):  # views: a write through them is a write into the matrix
            setattr(self, name, self.ints[:, j])
        for j, name in enumerate(_FLOATS):
            setattr(self, name, self.floats[:, j])
        self.n_scores, self.score_sum = np.zeros((n, VERSIONS), np.int64), np.zeros((n, VERSIONS))
        self.means, self.first_scored = np.zeros((n, VERSIONS)), np.zeros((n, VERSIONS), np.int64)
        self.fail_shares = np.zeros((n, len(FAILURE_MODES)))
        self.tables = np.zeros((n, 2, 2, 3, VERSIONS))  # the world's per-code sums (_world_tables)
        self.world = np.zeros((n, 4 * D))  # present, 1 - severity, 1 - harm, severity
        self.keys = np.zeros((n, 2), np.uint64)  # eval, official streams
        self.variant, self.half = np.zeros(n, np.intp), np.zeros(n, np.intp)
        self.initial_official, self.seeds = np.zeros(n), np.zeros(n, np.int64)
        self.reward = np.zeros(n)
        template = np.zeros(len(FEATURES), np.float32)
        for name in FEATURES:
            if name.startswith(("pass_rate:", "usd_per_100:")):
                template[_F[name]] = -1.0
        template[_F[f"benchmark:{benchmark}"]] = template[_F["track:harness"]] = 1.0
        self.template = template
        self._fix = slice(MENU_INDEX[f"fix:{DEFECTS[0]}"], MENU_INDEX[f"fix:{DEFECTS[-1]}"] + 1)

    # ------------------------------------------------------------------ worlds ahead

    def _draw_ahead(self) -> None:
        """``AHEAD`` new worlds in one pass: their draws, per-code tables, stream keys and initial official score."""
        seeds = seed_array(self._rng.integers(2**31 - 1, size=AHEAD))
        w = draw_worlds(self.benchmark, seeds)
        tables = _world_tables(self.benchmark.id, w.present, w.half, w.base_skill)
        world = np.concatenate([w.present, 1.0 - w.severity, 1.0 - w.harm, w.severity], axis=1)
        keys = np.stack([stream_keys(seeds, self.bkey, "eval"), stream_keys(seeds, self.bkey, "official")], axis=1)
        k = self.scenario.official_k
        stats = per_code_stats(tables, np.ones(AHEAD, np.intp), world, np.broadcast_to(self.active[0], (AHEAD, D)),
                               np.broadcast_to(self.applied[0], (AHEAD, D)), self.m)
        counts = draw_outcomes(stats, k, uniforms(keys[:, 1], np.zeros(AHEAD, np.uint64), EVAL_DRAWS))
        self._ahead = (seeds.astype(np.int64), tables, world, keys, w.present[:, 0].astype(np.intp), w.half,
                       counts[:, 0] / (self.m * k))
        self._at = 0

    def _take(self, count: int) -> slice:
        """The places in the buffer of worlds ahead of ``count`` new episodes (a new batch when it runs out)."""
        if self._at + count > AHEAD:
            if self.recycle:
                self._at = 0
            else:
                self._draw_ahead()
        self._at += count
        return slice(self._at - count, self._at)

    def _new_episodes(self, rows: np.ndarray) -> None:
        take = self._take(rows.size)
        for whole, part in zip((self.seeds, self.tables, self.world, self.keys, self.variant, self.half,
                                self.initial_official), self._ahead):
            whole[rows] = part[take]
        self.ints[rows] = 0
        self.floats[rows] = _FLOAT_START
        self.n_scores[rows] = 0  # score_sum, means and first_scored are read only where n_scores > 0
        self.fail_shares[rows] = 0.0

    # ------------------------------------------------------------------ the Gymnasium API

    def reset(self, *, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        self._rng = np.random.default_rng(seed)
        self._draw_ahead()
        self._new_episodes(np.arange(self.n))
        self.calls, self.ok = np.zeros(self.n, np.int64), np.ones(self.n, bool)
        obs, mask = self._view()
        return obs, {"action_mask": mask}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One menu index per row; a row that ended last step starts its next episode instead."""
        actions = self._checked(actions)
        n = self.n
        resetting = np.flatnonzero(self.done)
        if resetting.size:
            self._new_episodes(resetting)
        kind = _KIND[actions]
        kind[resetting] = NONE
        self.reward = np.zeros(n)
        self.terminated, self.truncated = np.zeros(n, bool), np.zeros(n, bool)
        self.calls, self.ok = np.zeros(n, np.int64), np.ones(n, bool)
        spent_before = self.spent.copy()
        self._fix_pass(np.flatnonzero(kind == FIX), actions)
        waits = np.flatnonzero(kind == WAIT)
        if waits.size:  # evaluations block, so a wait finds no job: the run refuses it
            self.calls[waits] += 1
            self._refuse(waits)
            self._limits(waits)
        self._evaluations(np.flatnonzero(kind == EVAL), np.flatnonzero(kind == SUBMIT), actions)
        acting = kind != NONE
        self.last_error[acting] = ~self.ok[acting]
        obs, mask = self._view()
        cost = np.zeros(n)
        paid = np.flatnonzero(self.spent != spent_before)
        cost[paid] = round_digits((self.spent[paid] - spent_before[paid]) / NANO, 9)
        info: dict[str, Any] = {"action_mask": mask, "n_calls": self.calls, "ok": self.ok, "cost_usd": cost,
                                "budget_left_usd": (self.budget_n - self.spent - self.reserved) / NANO,
                                "spent_usd": self.spent / NANO}
        ended = np.flatnonzero(acting & (self.done > 0))
        if ended.size:
            self._end_info(info, ended)
            if self.ledger is not None:
                self._write(ended)
        return obs, self.reward, self.terminated, self.truncated, info

    def _checked(self, actions: np.ndarray) -> np.ndarray:
        """``actions`` as an array of one menu index per row, or a ``ValueError``."""
        actions = np.asarray(actions)
        if actions.shape != (self.n,) or actions.dtype.kind not in "iu" or \
                not ((0 <= actions) & (actions < len(MENU))).all():
            raise ValueError(f"give one menu index (0..{len(MENU) - 1}) per env ({self.n}), got {actions!r}")
        return actions

    # ------------------------------------------------------------------ the macros' passes

    def _refuse(self, rows: np.ndarray) -> None:
        self.refusals[rows] += 1
        self.ok[rows] = False

    def _fix_pass(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """``fix:<defect>``: read the harness file first if not read (a free call), then the edit (refused where
        the option is already set)."""
        if not rows.size:
            return
        unread = rows[self.read[rows] == 0]
        if unread.size:
            self.calls[unread] += 1
            self.steps[unread] += 1
            self.read[unread] = 1
            self._limits(unread)
            rows = rows[self.done[rows] == 0]
        bit = 1 << _DEFECT[actions[rows]]
        self.calls[rows] += 1
        already = (self.version[rows] & bit) > 0
        self._refuse(rows[already])
        edit = rows[~already]
        self.version[edit] |= bit[~already]
        self.steps[edit] += 1
        self._limits(rows)

    def _evaluations(self, evals: np.ndarray, submits: np.ndarray, actions: np.ndarray) -> None:
        """Every evaluation of the step in one pass: the dev evaluations (quote, reserve or refuse, start, then
        ``wait`` for it: clock, settle, the candidate's score) and the submits (the official score ends the
        episode)."""
        if not evals.size and not submits.size:
            return
        self.calls[evals] += 1
        k = _K[actions[evals]]
        version = self.version[evals]
        hold = nano_up(self.bill[1 - self.half[evals], self.variant[evals], version, k, 0])
        fits = hold <= self.budget_n - self.spent[evals] - self.reserved[evals]
        self._refuse(evals[~fits])
        go, k, version, hold = evals[fits], k[fits], version[fits], hold[fits]
        self.steps[go] += 1
        self.calls[submits] += 1
        self.steps[submits] += 1
        latest = self.version[submits]
        scored = self.n_scores[submits] > 0
        mean = np.where(scored, self.means[submits], -np.inf)
        top = scored & (mean == mean.max(axis=1, keepdims=True))
        first = np.where(top, self.first_scored[submits], np.iinfo(np.int64).max).argmin(axis=1)
        cand = np.where(_BEST[actions[submits]] & scored.any(axis=1), first, latest)
        every = np.concatenate([go, submits])
        official = np.arange(every.size) >= go.size
        which = np.concatenate([version, cand])
        kk = np.concatenate([k, np.full(submits.size, self.scenario.official_k)])
        split = official.astype(np.intp)
        stats = per_code_stats(self.tables, split, self.world[every], self.active[which], self.applied[which],
                               self.m, every)
        counters = np.where(official, 0, self.eval_counter[every]).astype(np.uint64)
        counts = draw_outcomes(stats, kk, uniforms(self.keys[every, split], counters, EVAL_DRAWS))
        score = counts[:, 0] / (self.m * kk)
        bill = self.bill[np.where(official, self.half[every], 1 - self.half[every]), self.variant[every], which, kk]
        g = go.size
        if submits.size:
            self._end(submits, score[g:], 1)
        if not g:
            self._limits(evals)
            return
        self.eval_counter[go] += 1
        self.reserved[go] += hold
        self.running[go] = 1
        self.job_start[go] = self.clock[go]
        self.job_ready[go] = self.clock[go] + bill[:g, 1]
        self.job_usd[go] = bill[:g, 0]
        self._limits(evals)
        waiting = np.flatnonzero(self.done[go] == 0)  # DiscreteMenu's blocking evaluate: wait for the job
        wait = go[waiting]
        self.calls[wait] += 1
        self.steps[wait] += 1
        ready = np.maximum(self.job_ready[wait], self.clock[wait])
        ends = ready <= self.time_limit_s
        self.clock[wait] = np.where(ends, ready, np.maximum(self.clock[wait], self.time_limit_s))
        done_at = waiting[ends]  # the finished jobs' places in this pass
        self._collect(go[done_at], score[done_at], counts[done_at], version[done_at], k[done_at])
        self._limits(wait)

    def _collect(self, rows: np.ndarray, score: np.ndarray, counts: np.ndarray, cand: np.ndarray,
                 k: np.ndarray) -> None:
        """Finished evaluations: settle the bill (never above the hold), record the candidate's score."""
        if not rows.size:
            return
        self.spent[rows] += np.minimum(nano_near(self.job_usd[rows]), self.reserved[rows])
        self.reserved[rows] = 0
        self.running[rows] = 0
        count = self.n_scores[rows, cand]
        new = count == 0
        self.n_cand[rows[new]] += 1
        self.first_scored[rows[new], cand[new]] = self.n_cand[rows[new]]
        self.score_sum[rows, cand] = np.where(new, 0.0, self.score_sum[rows, cand]) + score
        count += 1
        self.n_scores[rows, cand] = count
        self.means[rows, cand] = self.score_sum[rows, cand] / count
        base = rows[(cand == 0) & (self.initial_dev[rows] < 0)]
        self.initial_dev[base] = score[(cand == 0) & (self.initial_dev[rows] < 0)]
        self.best_dev[rows] = np.maximum(score, self.best_dev[rows])
        self.last_dev[rows] = score
        self.fail_shares[rows] = counts[:, 1:] / (self.m * k)[:, None]
        self.eval_cost[rows] = self.job_usd[rows]
        self.evaluations[rows] += 1

    def _limits(self, rows: np.ndarray) -> None:
        """The run's limits after a call, in its order: steps, refusals, time, money."""
        if not rows.size:
            return
        s = self.scenario
        limits = np.stack([self.steps[rows] >= s.max_steps, self.refusals[rows] >= s.refusal_limit,
                           self.clock[rows] >= self.time_limit_s,
                           (self.spent[rows] + self.reserved[rows] > self.budget_n - self.min_n)
                           & (self.running[rows] == 0)])
        ending = limits.any(axis=0) & (self.done[rows] == 0)
        if ending.any():
            ends = rows[ending]
            self._end(ends, self.initial_official[ends], 2 + limits[:, ending].argmax(axis=0))

    def _end(self, rows: np.ndarray, final: np.ndarray, reason: int | np.ndarray) -> None:
        """The episode's result: a running job billed for the share that ran, the normalized gain."""
        busy = rows[self.running[rows] > 0]
        if busy.size:
            span = self.job_ready[busy] - self.job_start[busy]
            share = np.clip((self.clock[busy] - self.job_start[busy]) / np.where(span > 0, span, 1.0), 0.0, 1.0)
            self.spent[busy] += np.minimum(nano_near(self.job_usd[busy] * np.where(span > 0, share, 1.0)),
                                           self.reserved[busy])
            self.reserved[busy] = 0
            self.running[busy] = 0
        self.done[rows] = 1
        self.reason[rows] = reason
        self.final[rows] = final
        self.reward[rows] = _normalized_gains(self.initial_official[rows], self.final[rows])
        (self.terminated if np.ndim(reason) == 0 and reason == 1 else self.truncated)[rows] = True

    # ------------------------------------------------------------------ what the policy sees, and the ledger

    def _view(self) -> tuple[np.ndarray, np.ndarray]:
        """The (N, 50) float32 features (``MenuAdapter.features``) and the (N, 27) action mask."""
        n, s = self.n, self.scenario
        f = np.tile(self.template, (n, 1))
        f[:, 0] = np.minimum((self.budget_n - self.spent - self.reserved) / NANO, s.budget_usd) / s.budget_usd
        f[:, 1] = np.maximum(0.0, self.time_limit_s - self.clock) / self.time_limit_s
        f[:, 2] = np.minimum(self.steps, s.max_steps) / s.max_steps
        f[:, 3:6] = self.floats[:, 1:4]  # initial, best, last dev score
        latest = self.n_scores[np.arange(n), self.version] > 0
        f[:, 6] = f[:, 7] = np.where(latest, self.means[np.arange(n), self.version], -1.0)
        running = (self.running > 0) & (self.done == 0)
        f[:, _F["jobs_running"]] = running / 2
        f[:, _F["eval_running"]] = running
        fixed = ((self.version[:, None] >> np.arange(D)) & 1 & self.read[:, None]) > 0
        first = _F[f"unfixed:{DEFECTS[0]}"]
        f[:, first:first + D] = ~fixed
        first = _F[f"fail_share:{FAILURE_MODES[0]}"]
        f[:, first:first + len(FAILURE_MODES)] = self.fail_shares
        f[:, _F["eval_cost"]] = np.minimum(1.0, self.eval_cost / s.budget_usd)
        f[:, _F["evaluations"]] = np.minimum(self.evaluations, 5) / 5
        f[:, _F["last_error"]] = self.last_error
        f[:, _F["harness_read"]] = self.read
        np.maximum(f, -1.0, out=f)
        np.minimum(f, 1.0, out=f)
        mask = np.tile(self.static_mask, (n, 1))
        mask[:, self._fix] &= ~fixed
        mask[:, MENU_INDEX["wait"]] = running
        return f, mask

    def _end_info(self, info: dict[str, Any], rows: np.ndarray) -> None:
        present = np.zeros(self.n, bool)
        present[rows] = True
        values = {"initial_score": self.initial_official, "official_score": self.final, "normalized_gain": self.reward,
                  "best_dev_score": np.where(self.best_dev < 0, np.nan, self.best_dev),
                  "initial_dev_score": np.where(self.initial_dev < 0, np.nan, self.initial_dev),
                  "dev_evaluations": self.evaluations, "end_reason": _REASONS[self.reason], "steps": self.steps,
                  "refusals": self.refusals, "spend_usd": self.spent / NANO,
                  "budget_usd": np.full(self.n, self.scenario.budget_usd), "elapsed_h": self.clock / 3600.0}
        for key in END_KEYS:
            info[key], info[f"_{key}"] = np.array(values[key], copy=True), present

    def _write(self, rows: np.ndarray) -> None:
        """One ``open_settled`` entry listing the episodes that ended this step (``write_episodes="step"``)."""
        records = EpisodeRecords(rows, self.seeds[rows].tolist(), self.steps[rows].tolist(),
                                 self.refusals[rows].tolist(), _REASONS[self.reason[rows]].tolist(),
                                 (self.clock[rows] / 3600.0).tolist(), self.spent[rows].copy(),
                                 (self.initial_official[rows].tolist(), self.final[rows].tolist(),
                                  self.reward[rows].tolist()))
        self._keys += write_episode_records(self.ledger, records, per_step=True, budget_usd=self.scenario.budget_usd,
                                            budget_n=self.budget_n, secret="v7proto", first=self._keys + 1)


# ---------------------------------------------------------------------- measuring


def cartpole_cpu(seconds: float) -> float:
    """CartPole-v1 steps per CPU-second of this process (``bench_menu_array.cartpole_cpu``'s)."""
    return cartpole_rates(seconds)[1]


def run(env: Any, n: int, seconds: float) -> tuple[float, float, int]:
    """(CPU ms a step of ``step`` alone, episodes ended a step, steps) with masked uniform actions, after 20."""
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0)
    for _ in range(20):
        mask = info["action_mask"]
        obs, _, _, _, info = env.step(np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1))
    steps, cpu, ended = 0, 0.0, 0
    while cpu < seconds:
        mask = info["action_mask"]
        actions = np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)
        start = time.process_time()
        obs, _, terminated, truncated, info = env.step(actions)
        cpu += time.process_time() - start
        steps += 1
        ended += int((terminated | truncated).sum())
    return cpu / steps * 1e3, ended / steps, steps


PARTS = ("_draw_ahead", "_new_episodes", "_fix_pass", "_evaluations", "per_code_stats", "draw_outcomes", "_limits",
         "_view", "_end_info", "_write")


def calls_a_step(env: Any, steps: int) -> tuple[float, dict[str, float]]:
    """(cProfile's total calls (Python functions and NumPy's C functions) over ``steps`` steps / steps, the share
    of the profiled time in each of ``PARTS``, callees included)."""
    rng = np.random.default_rng(1)
    obs, info = env.reset(seed=1)
    for _ in range(20):
        mask = info["action_mask"]
        obs, _, _, _, info = env.step(np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1))
    profile = cProfile.Profile()
    for _ in range(steps):
        mask = info["action_mask"]
        actions = np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)
        profile.enable()
        obs, _, _, _, info = env.step(actions)
        profile.disable()
    stats = pstats.Stats(profile)
    total = stats.total_tt
    shares = {}
    for (_, _, name), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if name in PARTS:
            shares[name] = shares.get(name, 0.0) + cumulative / total
    return stats.total_calls / steps, shares


_OPERATORS = frozenset(("BINARY_OP", "BINARY_SUBSCR", "STORE_SUBSCR", "COMPARE_OP", "UNARY_INVERT", "UNARY_NEGATIVE",
                        "BINARY_SLICE", "STORE_SLICE"))


def operators_a_step(env: Any, steps: int) -> float:
    """Operators (arithmetic, comparisons, indexing: the NumPy work cProfile does not see as calls) executed in
    Python code a step, by opcode tracing over ``steps`` steps; operators on Python scalars count too, so this is an
    upper bound of the NumPy operators."""
    import dis

    rng = np.random.default_rng(2)
    obs, info = env.reset(seed=2)
    names: dict[Any, dict[int, str]] = {}
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            table = names.get(code)
            if table is None:
                table = names[code] = {i.offset: i.opname for i in dis.get_instructions(code)}
            count += table.get(frame.f_lasti, "") in _OPERATORS
        return tracer

    for _ in range(steps):
        mask = info["action_mask"]
        actions = np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)
        sys.settrace(tracer)
        try:
            obs, _, _, _, info = env.step(actions)
        finally:
            sys.settrace(None)
    return count / steps


def check(benchmarks: tuple[str, ...] = ("swe-bench-verified", "aime"), worlds: int = 300) -> float:
    """The largest difference, over ``worlds`` worlds, the 32 harness versions and both splits, between
    :func:`per_code_stats` and the model's per-task :func:`~rsigym_env.worlds.sim.model.evaluation_stats` (mean,
    variance, failures per cause) at base skill without dev memory: the per-code sums are the same statistics,
    added in another order."""
    from rsigym_env.menu_vector import harness_versions
    from rsigym_env.worlds.sim.batch import HarnessArrays, SimBatch
    from rsigym_env.worlds.sim.model import evaluation_stats

    worst = 0.0
    for benchmark in benchmarks:
        batch = SimBatch.make(benchmark, list(range(worlds)))
        w, table = batch.worlds, batch.table
        harness = HarnessArrays.of(harness_versions(batch)[1])
        tables = _world_tables(benchmark, w.present, w.half, w.base_skill)
        world = np.concatenate([w.present, 1.0 - w.severity, 1.0 - w.harm, w.severity], axis=1)
        for v in range(VERSIONS):
            active = np.repeat(harness.active[v:v + 1], worlds, axis=0)
            applied = np.repeat(harness.applied[v:v + 1], worlds, axis=0)
            for split in (0, 1):
                ref = evaluation_stats(table, w.half if split else 1 - w.half, w.variant, w.present, w.severity,
                                       w.harm, w.base_skill, np.zeros(worlds),
                                       np.full(worlds, harness.max_output_tokens[v]), active, applied)
                got = per_code_stats(tables, np.full(worlds, split), world, active, applied, table.n)
                for a, b in ((got.mean, ref.mean), (got.var, ref.var), (got.causes, ref.causes)):
                    worst = max(worst, float(np.abs(a - b).max()))
    return worst


def v7_rows(n: int) -> dict[str, Any]:
    """The rows of :func:`interleaved` at N = ``n``: name -> env maker."""
    return {"v7 ledger=step": partial(V7HarnessEnv, n, ledger=True),
            "v7 ledger=off": partial(V7HarnessEnv, n, ledger=False),
            "v7 off, no draw": partial(V7HarnessEnv, n, ledger=False, recycle_worlds=True),
            "today, step": partial(gym.make_vec, "RSIGym/Harness-v0", num_envs=n,
                                   vectorization_mode="vector_entry_point", menu=True,
                                   benchmark="swe-bench-verified", budget_usd=500, write_episodes="step")}


def interleaved(n: int, rounds: int, seconds: float, rows: Any = v7_rows) -> dict[str, tuple[float, float]]:
    """``rounds`` rounds of every row at N = ``n`` (``rows(n)``: name -> env maker), one after the other
    (CartPole's CPU rate before each round), then each row's median CPU ms a step and median ratio to CartPole: the
    A/B figures (the VM's speed drifts). Returns them: name -> (median ms, median ratio)."""
    makers = rows(n)
    ms: dict[str, list[float]] = {name: [] for name in makers}
    ratio: dict[str, list[float]] = {name: [] for name in makers}
    for r in range(rounds):
        cpu = cartpole_cpu(1.0)
        for name, make in makers.items():
            with threadpool_limits(limits=1, user_api="blas"):
                t, _, _ = run(make(), n, seconds)
            ms[name].append(t)
            ratio[name].append(n / (t / 1e3) / cpu)
        print(f"round {r} N={n}: CartPole {cpu:,.0f} steps per CPU-s; " + "; ".join(
            f"{name} {ms[name][-1]:.3f} ms" for name in makers) + f"; load {os.getloadavg()[0]:.2f}", flush=True)
    for name in makers:
        print(f"N={n:5d} {name:16s}: median {np.median(ms[name]):6.3f} ms CPU a step, {np.median(ratio[name]):5.2f}x "
              f"CartPole per CPU-s (rounds {', '.join(f'{v:.2f}' for v in ratio[name])})", flush=True)
    return {name: (float(np.median(ms[name])), float(np.median(ratio[name]))) for name in makers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--profile-steps", type=int, default=200)
    parser.add_argument("--real", action="store_true", help="also today's MenuArrayEnv (harness, write_episodes='step')")
    parser.add_argument("--interleave", type=int, default=0, help="rounds of every row, interleaved, at each size")
    parser.add_argument("--check", action="store_true", help="per-code statistics against the model's per-task ones")
    args = parser.parse_args()
    if args.check:
        print(f"per-code vs per-task statistics: largest difference {check():.3g}", flush=True)
        return
    sizes = [int(v) for v in args.sizes.split(",")]
    if args.interleave:
        print(f"load before {os.getloadavg()}; {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
        for n in sizes:
            interleaved(n, args.interleave, args.seconds)
        print(f"load after {os.getloadavg()}; {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
        return
    print(f"load before {os.getloadavg()}; {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
    for n in sizes:
        wall, cpu = cartpole(1.0), cartpole_cpu(1.0)
        print(f"N={n:5d} CartPole-v1 just before: {wall:,.0f} steps/s wall, {cpu:,.0f} steps per CPU-s", flush=True)
        rows = [("v7 ledger=step", partial(V7HarnessEnv, n, ledger=True)),
                ("v7 ledger=off ", partial(V7HarnessEnv, n, ledger=False)),
                ("v7 off, no draw", partial(V7HarnessEnv, n, ledger=False, recycle_worlds=True))]
        if args.real:
            rows.append(("today harness ", partial(gym.make_vec, "RSIGym/Harness-v0", num_envs=n,
                                                   vectorization_mode="vector_entry_point", menu=True,
                                                   benchmark="swe-bench-verified", budget_usd=500,
                                                   write_episodes="step")))
        for name, make in rows:
            env = make()
            with threadpool_limits(limits=1, user_api="blas"):  # (the step calls no BLAS since brief 29a)
                ms, ended, steps = run(env, n, args.seconds)
            rate = n / (ms / 1e3)
            print(f"N={n:5d} {name}: {ms:7.3f} ms CPU a step ({steps} steps), {rate:10,.0f} steps per CPU-s = "
                  f"{rate / cpu:6.2f}x CartPole's; {ended:6.1f} episodes end a step; load {os.getloadavg()[0]:.2f}",
                  flush=True)
    env = V7HarnessEnv(1, ledger=False)
    env.reset(seed=0)
    with threadpool_limits(limits=1, user_api="blas"):
        start = time.process_time()
        for _ in range(3):
            env._draw_ahead()
        whole = (time.process_time() - start) / 3
        start = time.process_time()
        for _ in range(3):
            draw_worlds(env.benchmark, np.arange(AHEAD))
        model = (time.process_time() - start) / 3
    print(f"worlds ahead: {whole / AHEAD * 1e6:.2f} us CPU a world ({AHEAD} a batch), of which draw_worlds "
          f"{model / AHEAD * 1e6:.2f} us (the model's draws and base-skill calibration)", flush=True)
    for n in sizes:
        for name, ledger in (("ledger=step", True), ("ledger=off", False)):
            with threadpool_limits(limits=1, user_api="blas"):
                calls, shares = calls_a_step(V7HarnessEnv(n, ledger=ledger), args.profile_steps)
                operators = operators_a_step(V7HarnessEnv(n, ledger=ledger), 50)
            parts = ", ".join(f"{part} {shares.get(part, 0.0):.0%}" for part in PARTS)
            print(f"N={n:5d} v7 {name:11s}: {calls:5.0f} calls a step (cProfile, {args.profile_steps} steps) and "
                  f"{operators:5.0f} operators (opcode trace, 50 steps); profiled time in: {parts}", flush=True)
    print(f"load after {os.getloadavg()}; {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)


if __name__ == "__main__":
    main()
