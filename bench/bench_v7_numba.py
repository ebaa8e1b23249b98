"""What a JIT-compiled step buys the vector sim (issue 27 item 1, brief 29a): the version-7 harness-track step of
``bench_v7_prototype`` with its per-row work in one numba kernel.

:class:`V7NumbaEnv` is :class:`bench_v7_prototype.V7HarnessEnv` (a subclass: the same constants, state arrays,
worlds drawn ahead, end keys and ledger entries) whose ``step`` runs one ``@numba.njit(cache=True)`` kernel,
:func:`step_rows`, that loops over the rows once and does for each what the prototype's passes do for all: the
new episode of a row that ended (its world copied from the buffer drawn ahead), refusals, fixes, waits, the
evaluations (quote, reserve, the per-code statistics, the model's aggregate draw, the clock, collection), the
submits, the limits and ends, the reward, the features and the action mask, the info arrays. What a real env
would keep in Python stays there: drawing the worlds ahead (``draw_worlds`` and the per-code tables, a batch of
``AHEAD`` at a time, before the kernel when the buffer runs out), the ``info`` dict with its end keys, and the
ledger entry (``write_episode_records`` per step, or none).

The counter-based uniforms (:func:`rsigym_env.worlds.sim.draws.uniforms`) are integer hashing (SplitMix64 on
uint64, then 53 bits to a float): ported into the kernel, they give the same numbers. So are the normal quantile
(:func:`~rsigym_env.worlds.sim.draws.norm_ppf`, AS241 polynomials and in its tails one ``log``: numba calls the
C library's ``log``, which NumPy also calls at the AVX2 level the package pins; ``check_helpers`` compares them),
:func:`~rsigym_env.worlds.sim.model.draw_outcomes`, ``nano_up``/``nano_near``/``round_digits`` and the per-code
statistics, with every sum in NumPy's order (pairwise over 32 or 16 contiguous values, in order below 8). The
prototype's two per-code matrix products were replaced by fixed-order sums for this (a BLAS product's order
depended on the row's place in the matrix), so both envs are bit for bit the same (tests/test_bench_v7_numba.py).

Brief 29b: ``V7NumbaEnv(compiled_worlds=True)`` makes the worlds ahead with two more kernels, bit for bit the
NumPy path: :func:`_draw_into` (``model.draw_worlds``' fields the track reads: the world stream's uniforms, the
severities, the minimal harness's ceiling per code with ``log1p``/``exp``, the redraws, ``calibrate_worlds``'
``np.interp`` and 3 Newton steps) and :func:`_ahead_into` (the per-code tables, stream keys and initial official
score), 256 worlds at a time as the step reaches them; the seeds still come from the reset's NumPy Generator, a
batch of ``AHEAD`` per call as before. ``ledger_every=K`` writes the ledger's entry every K steps for the
episodes ended in them (every episode kept; ``flush_ledger`` for the rest).

    python bench/bench_v7_numba.py --interleave 3 [--sizes 1,16,256,1024] [--seconds 2] [--older PATH]
    python bench/bench_v7_numba.py --parts 256 [--steps 3000]   # and the world and ledger costs (brief 29b)
    python bench/bench_v7_numba.py --compile

``--interleave R``: ``bench_v7_prototype.interleaved``'s rounds with the rows (:func:`numba_rows`) numba with
compiled worlds ("cw") with the ledger per step, per 16 and per 64 steps and without ledger; brief 29a's numba
with the per-step ledger, without ledger, without ledger nor world draws; and the NumPy prototype with the
per-step ledger (CartPole-v1's CPU rate before each round, masked uniform actions, medians); ``--older``: also
another checkout's prototype (main's, before 29a's fixed-order sums). ``--parts N``: where a numba step's time
goes (perf_counter around each part over ``--steps`` steps; 29a's env, compiled worlds, compiled worlds with
the ledger per 64 steps) and the costs per finished episode, a world's cost each way (:func:`draw_cost`) and
the ledger entry's parts (:func:`ledger_parts`).
``--compile``: the cold compile time of the kernel (a fresh process with numba's cache in an empty directory).

>>> env = V7NumbaEnv(4, ledger=True)
>>> obs, info = env.reset(seed=0)
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
import math
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import rsigym_env  # noqa: F401  (first: it pins NumPy's code)

import numba
import numpy as np

from rsigym_env.catalog import DEFECTS, FAILURE_MODES
from rsigym_env.menu_vector import EpisodeRecords, write_episode_records
from rsigym_env.platform import audit
from rsigym_env.platform.core import PlatformKey
from rsigym_env.platform.ledger import NANO, Ledger
from rsigym_env.worlds.sim.draws import _A, _B, _C, _D, _E, _F, STREAMS, seed_array
from rsigym_env.worlds.sim.model import (CODE_AXES, EVAL_DRAWS, FEASIBLE_MODEL_ALONE, HARM_RATIO, SEVERITY_MAX,
                                         SEVERITY_SPREAD, SKILL_GRID, SYSTEM_DRAWS, Harness, draw_worlds,
                                         solve_curve, task_table)
from rsigym_env.wrappers.menu import FEATURES, MENU_INDEX

sys.path.insert(0, str(Path(__file__).parent))
import bench_v7_prototype  # noqa: E402  (its AHEAD read at each batch: the tests make it small)
from bench_v7_prototype import (_BEST, _DEFECT, _REASONS, _FLOAT_START, _FLOATS, _INTS, _K, _KIND, AHEAD, BIT_CODES,  # noqa: E402
                                D, EVAL, FIX, SUBMIT, VERSIONS, WAIT, V7HarnessEnv, interleaved, task_codes,
                                v7_rows)

# the state matrices' columns (bench_v7_prototype's _INTS and _FLOATS)
(SPENT, RESERVED, STEPS, REFUSALS, VERSION, READ, LAST_ERROR, N_CAND, EVALUATIONS, DONE, REASON, RUNNING,
 EVAL_COUNTER) = (_INTS.index(name) for name in ("spent", "reserved", "steps", "refusals", "version", "read",
                                                  "last_error", "n_cand", "evaluations", "done", "reason",
                                                  "running", "eval_counter"))
(CLOCK, INITIAL_DEV, BEST_DEV, LAST_DEV, EVAL_COST, JOB_START, JOB_READY, JOB_USD, FINAL) = (
    _FLOATS.index(name) for name in ("clock", "initial_dev", "best_dev", "last_dev", "eval_cost", "job_start",
                                     "job_ready", "job_usd", "final"))
_FI = {name: i for i, name in enumerate(FEATURES)}
# the feature columns the kernel writes (the rest are the template's)
(F_BUDGET, F_TIME, F_STEPS, F_DEV_INITIAL, F_DEV_LATEST, F_DEV_BASE_LATEST, F_JOBS, F_EVAL_RUNNING, F_UNFIXED,
 F_FAIL_SHARE, F_EVAL_COST, F_EVALUATIONS, F_LAST_ERROR, F_READ) = (_FI[name] for name in (
    "budget_left", "time_left", "steps_used", "dev_initial", "dev_latest_candidate", "dev_base_latest_harness",
    "jobs_running", "eval_running", f"unfixed:{DEFECTS[0]}", f"fail_share:{FAILURE_MODES[0]}", "eval_cost",
    "evaluations", "last_error", "harness_read"))
assert (F_DEV_INITIAL + 2, F_DEV_BASE_LATEST) == (_FI["dev_last"], F_DEV_LATEST + 1)
WAIT_COLUMN = MENU_INDEX["wait"]
FIX_COLUMN = MENU_INDEX[f"fix:{DEFECTS[0]}"]

# SplitMix64 (rsigym_env.worlds.sim.draws), as uint64 constants numba keeps unsigned
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))
_UNIT = 2.0**-53
# the AS241 coefficients (highest first), numerator and denominator of the three branches
_PPF = np.array([_A, _B, _C, _D, _E, _F])


# ---------------------------------------------------------------------- the kernel's scalar helpers


@numba.njit(cache=True)
def _mix64(z: np.uint64) -> np.uint64:  # pragma: no cover  (compiled)
    """SplitMix64's finalizer (``draws.mix64``) on one uint64."""
    z = z ^ (z >> _S30)
    z = z * _M1
    z = z ^ (z >> _S27)
    z = z * _M2
    return z ^ (z >> _S31)


@numba.njit(cache=True)
def _uniforms(key: np.uint64, counter: np.uint64, out: np.ndarray) -> None:  # pragma: no cover
    """``draws.uniforms`` of one row: draw number ``counter`` of stream ``key``, ``len(out)`` values."""
    state = _mix64(key ^ _mix64(counter * _GAMMA + _M2))
    for i in range(out.size):
        z = state + np.uint64(i + 1) * _GAMMA
        bits = _mix64(z) >> _S11
        value = np.float64(bits)
        value += 0.5
        out[i] = value * _UNIT


@numba.njit(cache=True)
def _poly_ratio(x: float, coefficients: np.ndarray, branch: int) -> tuple[float, float]:  # pragma: no cover
    """``draws._poly_pair``'s (top, bottom): both polynomials by Horner's rule in the same float steps."""
    top = x * coefficients[2 * branch, 0]
    bottom = x * coefficients[2 * branch + 1, 0]
    top += coefficients[2 * branch, 1]
    bottom += coefficients[2 * branch + 1, 1]
    for j in range(2, coefficients.shape[1]):
        top *= x
        bottom *= x
        top += coefficients[2 * branch, j]
        bottom += coefficients[2 * branch + 1, j]
    return top, bottom


@numba.njit(cache=True)
def _norm_ppf(p: float, coefficients: np.ndarray) -> float:  # pragma: no cover
    """``draws.norm_ppf`` of one value (each element there is computed as alone: the same steps)."""
    q = p - 0.5
    if abs(q) <= 0.425:
        top, bottom = _poly_ratio(0.180625 - q * q, coefficients, 0)
        return q * top / bottom
    rt = math.sqrt(-math.log(1.0 - p if q > 0.0 else p))
    if rt <= 5.0:
        top, bottom = _poly_ratio(rt - 1.6, coefficients, 1)
    else:
        top, bottom = _poly_ratio(rt - 5.0, coefficients, 2)
    x = top / bottom
    return -x if q < 0.0 else x


@numba.njit(cache=True)
def _maximum(a: float, b: float) -> float:  # pragma: no cover
    """``np.maximum`` of two floats (a NaN wins)."""
    if a != a or b != b:
        return a + b
    return a if a >= b else b


@numba.njit(cache=True)
def _minimum(a: float, b: float) -> float:  # pragma: no cover
    """``np.minimum`` of two floats (a NaN wins)."""
    if a != a or b != b:
        return a + b
    return a if a <= b else b


@numba.njit(cache=True)
def _pairwise(values: np.ndarray, start: int, step: int, n: int) -> float:  # pragma: no cover
    """NumPy's pairwise sum of ``n`` values ``values[start::step]`` (n <= 128: 8 accumulators, then a tree;
    below 8: in order)."""
    if n < 8:
        out = 0.0
        for i in range(n):
            out += values[start + i * step]
        return out
    r0, r1, r2, r3 = values[start], values[start + step], values[start + 2 * step], values[start + 3 * step]
    r4, r5, r6, r7 = (values[start + 4 * step], values[start + 5 * step], values[start + 6 * step],
                      values[start + 7 * step])
    i = 8
    while i < n - n % 8:
        at = start + i * step
        r0 += values[at]
        r1 += values[at + step]
        r2 += values[at + 2 * step]
        r3 += values[at + 3 * step]
        r4 += values[at + 4 * step]
        r5 += values[at + 5 * step]
        r6 += values[at + 6 * step]
        r7 += values[at + 7 * step]
        i += 8
    out = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        out += values[start + i * step]
        i += 1
    return out


@numba.njit(cache=True)
def _nano_near(usd: float) -> int:  # pragma: no cover
    """``menu_vector.nano_near`` of one amount."""
    return np.int64(np.rint(usd * 1e9))


@numba.njit(cache=True)
def _nano_up(usd: float) -> int:  # pragma: no cover
    """``menu_vector.nano_up`` of one amount."""
    exact = usd * 1e9
    near = np.rint(exact)
    return np.int64(near if abs(exact - near) <= 1e-6 + exact * 1e-15 else math.ceil(exact))


@numba.njit(cache=True)
def _eval_counts(tables: np.ndarray, world: np.ndarray, active: np.ndarray, applied: np.ndarray, m: int, k: int,
                 key: np.uint64, counter: np.uint64, coefficients: np.ndarray, work: np.ndarray,
                 counts: np.ndarray) -> None:  # pragma: no cover
    """One evaluation: ``per_code_stats`` of the row (``tables``: its world's (2 assignments, 3, 32) of the split)
    and ``draw_outcomes`` over ``k`` attempts from its uniforms, into ``counts`` (len(FAILURE_MODES) + 1).
    ``work``: (7, 32) scratch."""
    factor, passing, trips, blamed, terms = work[0], work[1], work[2], work[3], work[4]
    z, causes = work[5, :EVAL_DRAWS], work[6, :D + 1]
    unneeded0 = applied[0] and not world[0] > 0
    factor[0] = passing[0] = 1.0
    trips[0] = 0.0
    for j in range(D):
        present = world[j] > 0
        counted = active[j] and (present or j == 0)  # truncation counts wherever the harness leaves it
        keep = world[D + j] if counted else 1.0
        trip = world[3 * D + j] if counted else 0.0
        value = keep * (world[2 * D + j] if applied[j] and not present else 1.0)
        half = 1 << j
        for c in range(half):
            factor[half + c] = factor[c] * value
            passing[half + c] = passing[c] * keep
            trips[half + c] = trips[c] + trip
        causes[j] = trip  # for now: the defect's trip chance
    pick = tables[1 if unneeded0 else 0]
    for c in range(VERSIONS):
        terms[c] = factor[c] * pick[0, c]
    mean = _pairwise(terms, 0, 1, VERSIONS)
    for c in range(VERSIONS):
        terms[c] = factor[c] * factor[c] * pick[1, c]
    var = mean - _pairwise(terms, 0, 1, VERSIONS)
    for c in range(VERSIONS):
        blamed[c] = pick[2, c] * ((1.0 - passing[c]) / max(trips[c], 1e-300))
    total = 0.0
    for j in range(D):
        # the 16 codes with bit j in increasing order (the prototype's BIT_CODES), summed as NumPy sums them
        for t in range(VERSIONS // 2):
            terms[t] = blamed[BIT_CODES[j * (VERSIONS // 2) + t]]
        causes[j] = _pairwise(terms, 0, 1, VERSIONS // 2) * causes[j]
        total += causes[j]
    causes[D] = _maximum(m - mean - total, 0.0)
    _uniforms(key, counter, z)
    for j in range(EVAL_DRAWS):
        z[j] = _norm_ppf(z[j], coefficients)
    # draw_outcomes
    attempts = m * k
    wins = math.floor(k * mean + math.sqrt(k * var) * z[0] + 0.5)
    wins = _minimum(_maximum(wins, 0.0), attempts)
    counts[:] = 0
    counts[0] = np.int64(wins)
    left = attempts - wins
    rest = 0.0
    for j in range(D + 1):
        rest += causes[j]
    for j in range(D):
        share = 0.0
        if rest > 0:
            share = min(max(causes[j] / rest, 0.0), 1.0)  # np.clip
        mean_j = left * share
        count = math.floor(mean_j + math.sqrt(mean_j * (1.0 - share)) * z[1 + j] + 0.5)
        count = _minimum(_maximum(count, 0.0), left)
        counts[1 + j] = np.int64(count)
        left = left - count
        rest = rest - causes[j]
    counts[D + 1] = np.int64(left)  # wrong_answer (harness_error: 0, the harness parses)


@numba.njit(cache=True)
def _end(i: int, ints: np.ndarray, floats: np.ndarray, final: float, reason: int, initial_official: np.ndarray,
         reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:  # pragma: no cover
    """``V7HarnessEnv._end`` of row ``i``."""
    if ints[i, RUNNING] > 0:
        span = floats[i, JOB_READY] - floats[i, JOB_START]
        share = min(max((floats[i, CLOCK] - floats[i, JOB_START]) / (span if span > 0 else 1.0), 0.0), 1.0)
        ints[i, SPENT] += min(_nano_near(floats[i, JOB_USD] * (share if span > 0 else 1.0)), ints[i, RESERVED])
        ints[i, RESERVED] = 0
        ints[i, RUNNING] = 0
    ints[i, DONE] = 1
    ints[i, REASON] = reason
    floats[i, FINAL] = final
    initial = initial_official[i]
    reward[i] = 0.0 if initial >= 1.0 else (final - initial) / (1.0 - initial)
    if reason == 1:
        terminated[i] = True
    else:
        truncated[i] = True


@numba.njit(cache=True)
def _limits(i: int, ints: np.ndarray, floats: np.ndarray, limits: np.ndarray, initial_official: np.ndarray,
            reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:  # pragma: no cover
    """``V7HarnessEnv._limits`` of row ``i`` (``limits``: max steps, refusal limit, budget, min, as float64 and
    the time limit)."""
    if ints[i, DONE] != 0:
        return
    reason = 0
    if ints[i, STEPS] >= limits[0]:
        reason = 2
    elif ints[i, REFUSALS] >= limits[1]:
        reason = 3
    elif floats[i, CLOCK] >= limits[4]:
        reason = 4
    elif ints[i, SPENT] + ints[i, RESERVED] > np.int64(limits[2]) - np.int64(limits[3]) and ints[i, RUNNING] == 0:
        reason = 5
    if reason:
        _end(i, ints, floats, initial_official[i], reason, initial_official, reward, terminated, truncated)


@numba.njit(cache=True)
def _round9(x: float) -> tuple[float, bool]:  # pragma: no cover
    """``menu_vector.round_digits(x, 9)``'s fast value and whether it is near a half (then Python rounds it)."""
    y = x * 1e9
    size = abs(y)
    mantissa, exponent = math.frexp(size)
    spacing = math.ldexp(1.0, exponent - 53) if size > 0 else 5e-324
    return np.rint(y) / 1e9, abs(size - math.trunc(size) - 0.5) <= 4 * spacing


@numba.njit(cache=True)
def step_rows(actions: np.ndarray, ints: np.ndarray, floats: np.ndarray, n_scores: np.ndarray, score_sum: np.ndarray,
              means: np.ndarray, first_scored: np.ndarray, fail_shares: np.ndarray, tables: np.ndarray,
              world: np.ndarray, keys: np.ndarray, variant: np.ndarray, half: np.ndarray,
              initial_official: np.ndarray, seeds: np.ndarray, ahead_seeds: np.ndarray, ahead_tables: np.ndarray,
              ahead_world: np.ndarray, ahead_keys: np.ndarray, ahead_variant: np.ndarray, ahead_half: np.ndarray,
              ahead_initial: np.ndarray, at: int, kinds: np.ndarray, ks: np.ndarray, defects: np.ndarray,
              best: np.ndarray, active: np.ndarray, applied: np.ndarray, bill: np.ndarray, limits: np.ndarray, m: int,
              official_k: int, budget_usd: float, template: np.ndarray, static_mask: np.ndarray,
              float_start: np.ndarray, coefficients: np.ndarray) -> tuple[np.ndarray, ...]:  # pragma: no cover
    """One step of every row (``V7HarnessEnv.step``'s passes, row by row): a row that ended last step takes the
    next world of the buffer ahead (from place ``at``) instead of acting. Returns (obs, mask, reward, terminated,
    truncated, n_calls, ok, cost_usd, budget_left_usd, spent_usd, the rows whose episode ended, the rows whose
    cost is near a half)."""
    n = actions.size
    nf = fail_shares.shape[1]
    obs = np.empty((n, template.size), np.float32)
    mask = np.empty((n, static_mask.size), np.bool_)
    reward = np.zeros(n)
    terminated = np.zeros(n, np.bool_)
    truncated = np.zeros(n, np.bool_)
    calls = np.zeros(n, np.int64)
    ok = np.ones(n, np.bool_)
    cost = np.zeros(n)
    left_usd = np.empty(n)
    spent_usd = np.empty(n)
    ended = np.empty(n, np.int64)
    near_half = np.empty(n, np.int64)
    n_ended = n_near = 0
    work = np.empty((7, VERSIONS))
    counts = np.zeros(nf + 1, np.int64)
    budget_n, time_limit = np.int64(limits[2]), limits[4]
    for i in range(n):
        a = actions[i]
        kind = kinds[a]
        if ints[i, DONE]:  # the next episode (V7HarnessEnv._new_episodes)
            seeds[i] = ahead_seeds[at]
            tables[i] = ahead_tables[at]
            world[i] = ahead_world[at]
            keys[i] = ahead_keys[at]
            variant[i] = ahead_variant[at]
            half[i] = ahead_half[at]
            initial_official[i] = ahead_initial[at]
            at += 1
            ints[i] = 0
            floats[i] = float_start
            n_scores[i] = 0
            fail_shares[i] = 0.0
            kind = -1
        spent_before = ints[i, SPENT]
        if kind == FIX:  # read the harness file first if not read (a free call), then the edit
            go = True
            if ints[i, READ] == 0:
                calls[i] += 1
                ints[i, STEPS] += 1
                ints[i, READ] = 1
                _limits(i, ints, floats, limits, initial_official, reward, terminated, truncated)
                go = ints[i, DONE] == 0
            if go:
                bit = 1 << defects[a]
                calls[i] += 1
                if ints[i, VERSION] & bit:
                    ints[i, REFUSALS] += 1
                    ok[i] = False
                else:
                    ints[i, VERSION] |= bit
                    ints[i, STEPS] += 1
                _limits(i, ints, floats, limits, initial_official, reward, terminated, truncated)
        elif kind == WAIT:  # evaluations block: a wait finds no job, the run refuses it
            calls[i] += 1
            ints[i, REFUSALS] += 1
            ok[i] = False
            _limits(i, ints, floats, limits, initial_official, reward, terminated, truncated)
        elif kind == EVAL:
            calls[i] += 1
            k, version = ks[a], ints[i, VERSION]
            dev = 1 - half[i]
            hold = _nano_up(bill[dev, variant[i], version, k, 0])
            if hold <= budget_n - ints[i, SPENT] - ints[i, RESERVED]:
                ints[i, STEPS] += 1
                _eval_counts(tables[i, 0], world[i], active[version], applied[version], m, k, keys[i, 0],
                             np.uint64(ints[i, EVAL_COUNTER]), coefficients, work, counts)
                score = counts[0] / (m * k)
                ints[i, EVAL_COUNTER] += 1
                ints[i, RESERVED] += hold
                ints[i, RUNNING] = 1
                floats[i, JOB_START] = floats[i, CLOCK]
                floats[i, JOB_READY] = floats[i, CLOCK] + bill[dev, variant[i], version, k, 1]
                floats[i, JOB_USD] = bill[dev, variant[i], version, k, 0]
                _limits(i, ints, floats, limits, initial_official, reward, terminated, truncated)
                if ints[i, DONE] == 0:  # DiscreteMenu's blocking evaluate: wait for the job
                    calls[i] += 1
                    ints[i, STEPS] += 1
                    ready = _maximum(floats[i, JOB_READY], floats[i, CLOCK])
                    if ready <= time_limit:
                        floats[i, CLOCK] = ready
                        # collect: settle the bill (never above the hold), record the candidate's score
                        ints[i, SPENT] += min(_nano_near(floats[i, JOB_USD]), ints[i, RESERVED])
                        ints[i, RESERVED] = 0
                        ints[i, RUNNING] = 0
                        count = n_scores[i, version]
                        if count == 0:
                            ints[i, N_CAND] += 1
                            first_scored[i, version] = ints[i, N_CAND]
                            score_sum[i, version] = 0.0 + score
                        else:
                            score_sum[i, version] = score_sum[i, version] + score
                        count += 1
                        n_scores[i, version] = count
                        means[i, version] = score_sum[i, version] / count
                        if version == 0 and floats[i, INITIAL_DEV] < 0:
                            floats[i, INITIAL_DEV] = score
                        floats[i, BEST_DEV] = _maximum(score, floats[i, BEST_DEV])
                        floats[i, LAST_DEV] = score
                        for j in range(nf):
                            fail_shares[i, j] = counts[1 + j] / (m * k)
                        floats[i, EVAL_COST] = floats[i, JOB_USD]
                        ints[i, EVALUATIONS] += 1
                    else:
                        floats[i, CLOCK] = _maximum(floats[i, CLOCK], time_limit)
                    _limits(i, ints, floats, limits, initial_official, reward, terminated, truncated)
            else:
                ints[i, REFUSALS] += 1
                ok[i] = False
                _limits(i, ints, floats, limits, initial_official, reward, terminated, truncated)
        elif kind == SUBMIT:
            calls[i] += 1
            ints[i, STEPS] += 1
            cand = ints[i, VERSION]
            if best[a]:  # the best mean, ties to the first scored
                top = -1
                for c in range(VERSIONS):
                    if n_scores[i, c] > 0 and (top < 0 or means[i, c] > means[i, top] or (
                            means[i, c] == means[i, top] and first_scored[i, c] < first_scored[i, top])):
                        top = c
                if top >= 0:
                    cand = top
            _eval_counts(tables[i, 1], world[i], active[cand], applied[cand], m, official_k, keys[i, 1],
                         np.uint64(0), coefficients, work, counts)
            _end(i, ints, floats, counts[0] / (m * official_k), 1, initial_official, reward, terminated, truncated)
        if kind >= 0:
            ints[i, LAST_ERROR] = 0 if ok[i] else 1
            if ints[i, DONE]:
                ended[n_ended] = i
                n_ended += 1
        # the info arrays
        spent = ints[i, SPENT]
        if spent != spent_before:
            paid = (spent - spent_before) / 1e9
            cost[i], near = _round9(paid)
            if near:  # Python rounds it (in step)
                cost[i] = paid
                near_half[n_near] = i
                n_near += 1
        available = budget_n - spent - ints[i, RESERVED]
        left_usd[i] = available / 1e9
        spent_usd[i] = spent / 1e9
        # the features (MenuAdapter.features) and the mask
        f = obs[i]
        f[:] = template
        running = ints[i, RUNNING] > 0 and ints[i, DONE] == 0
        version = ints[i, VERSION]
        f[F_BUDGET] = min(available / 1e9, budget_usd) / budget_usd
        f[F_TIME] = max(0.0, time_limit - floats[i, CLOCK]) / time_limit
        f[F_STEPS] = min(ints[i, STEPS], limits[0]) / limits[0]
        f[F_DEV_INITIAL] = floats[i, INITIAL_DEV]
        f[F_DEV_INITIAL + 1] = floats[i, BEST_DEV]
        f[F_DEV_INITIAL + 2] = floats[i, LAST_DEV]
        f[F_DEV_LATEST] = f[F_DEV_BASE_LATEST] = means[i, version] if n_scores[i, version] > 0 else -1.0
        f[F_JOBS] = 0.5 if running else 0.0
        f[F_EVAL_RUNNING] = 1.0 if running else 0.0
        read = ints[i, READ]
        row_mask = mask[i]
        row_mask[:] = static_mask
        for j in range(D):
            fixed = (version >> j) & 1 & read
            f[F_UNFIXED + j] = 0.0 if fixed else 1.0
            if fixed:
                row_mask[FIX_COLUMN + j] = False
        row_mask[WAIT_COLUMN] = running
        for j in range(nf):
            f[F_FAIL_SHARE + j] = fail_shares[i, j]
        f[F_EVAL_COST] = min(1.0, floats[i, EVAL_COST] / budget_usd)
        f[F_EVALUATIONS] = min(ints[i, EVALUATIONS], 5) / 5
        f[F_LAST_ERROR] = ints[i, LAST_ERROR]
        f[F_READ] = read
        for j in range(f.size):
            f[j] = min(max(f[j], np.float32(-1.0)), np.float32(1.0))
    return (obs, mask, reward, terminated, truncated, calls, ok, cost, left_usd, spent_usd, ended[:n_ended],
            near_half[:n_near])


# ---------------------------------------------------------------------- the worlds ahead, compiled (brief 29b)

@numba.njit(cache=True)
def _interp(x: float, xp: np.ndarray, fp: np.ndarray) -> float:  # pragma: no cover
    """``np.interp(x, xp, fp)`` of one value (NumPy's steps: the last ``j`` with ``xp[j] <= x``, the slope
    ``(fp[j+1] - fp[j]) / (xp[j+1] - xp[j])``, then ``slope * (x - xp[j]) + fp[j]``; its NaN fallbacks)."""
    last = xp.size - 1
    if x != x:
        return x
    if x > xp[last]:
        return fp[last]
    if x < xp[0]:
        return fp[0]
    j = np.searchsorted(xp, x, side="right") - 1
    if j == last or xp[j] == x:
        return fp[j]
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    out = slope * (x - xp[j]) + fp[j]
    if out != out:
        out = slope * (x - xp[j + 1]) + fp[j + 1]
        if out != out and fp[j] == fp[j + 1]:
            out = fp[j]
    return out


@numba.njit(cache=True)
def _system(key: np.uint64, attempt: int, block: np.ndarray, relevant: np.ndarray, prevalence: np.ndarray,
            domain_severity: np.ndarray, coefficients: np.ndarray, present: np.ndarray,
            severity: np.ndarray) -> int:  # pragma: no cover
    """``draw_worlds``' ``systems`` of one world's block number ``attempt``: its present defects and severities
    (into ``present``, ``severity``) and its official half (returned)."""
    _uniforms(key, np.uint64(attempt), block)
    for j in range(D):
        present[j] = relevant[j] and block[j] < prevalence[j]
        z = _norm_ppf(block[D + j], coefficients)
        severity[j] = _minimum(SEVERITY_MAX, domain_severity[j] * math.exp(SEVERITY_SPREAD * z))
    return 1 if block[block.size - 1] < 0.5 else 0


@numba.njit(cache=True)
def _ceiling(present: np.ndarray, severity: np.ndarray, half: int, minimal_codes: np.ndarray,
             minimal_active: np.ndarray, logs: np.ndarray, passing: np.ndarray,
             ceiling: np.ndarray) -> float:  # pragma: no cover
    """``_minimal_ceiling`` of one world into ``ceiling`` (n,): ``exposure``'s ``passing`` per code (``per_code``
    over ``CODE_AXES`` of ``log1p(-severity)`` where the defect counts, the sums in ``DEFECTS`` order, then
    ``exp``) read at each official task's minimal code; returns its mean (pairwise sum / n)."""
    for j in range(D):
        counts = minimal_active[j] and (j == 0 or present[j])
        logs[j] = math.log1p(-severity[j]) if counts else 0.0
    for c in range(VERSIONS):
        total = 0.0
        for j in range(D):
            if (c >> _CODE_BIT[j]) & 1:
                total += logs[j]
        passing[c] = math.exp(total)
    codes = minimal_codes[1 if present[0] else 0, half]
    for t in range(ceiling.size):
        ceiling[t] = passing[codes[t]]
    return _pairwise(ceiling, 0, 1, ceiling.size) / ceiling.size


@numba.njit(cache=True)
def _draw_into(start: int, end: int, seeds: np.ndarray, bkey: np.uint64, width: int, relevant: np.ndarray,
               prevalence: np.ndarray, domain_severity: np.ndarray, minimal_codes: np.ndarray,
               minimal_active: np.ndarray, target: float, curve: np.ndarray, grid: np.ndarray,
               exp_difficulty: np.ndarray, coefficients: np.ndarray, present: np.ndarray, severity: np.ndarray,
               harm: np.ndarray, half: np.ndarray, skill: np.ndarray) -> None:  # pragma: no cover
    """:func:`draw_worlds_compiled` of the worlds ``start:end`` into the given arrays."""
    n = exp_difficulty.shape[1]
    block, logs, passing = np.empty(width), np.empty(D), np.empty(VERSIONS)
    ceiling, q, qf = np.empty(n), np.empty(n), np.empty(n)
    world_index = np.uint64(1)  # STREAMS.index("world") + 1
    bmix = bkey * _M1 + _GAMMA
    for i in range(start, end):
        z = _mix64(seeds[i] + _GAMMA)
        key = _mix64(_mix64(z ^ bmix) + world_index * _GAMMA)
        h = _system(key, 0, block, relevant, prevalence, domain_severity, coefficients, present[i], severity[i])
        mean = _ceiling(present[i], severity[i], h, minimal_codes, minimal_active, logs, passing, ceiling)
        attempt = 0
        while FEASIBLE_MODEL_ALONE * mean <= target:
            attempt += 1
            if attempt > 100:
                raise RuntimeError("no feasible target system")
            h = _system(key, attempt, block, relevant, prevalence, domain_severity, coefficients, present[i],
                        severity[i])
            mean = _ceiling(present[i], severity[i], h, minimal_codes, minimal_active, logs, passing, ceiling)
        half[i] = h
        for j in range(D):
            harm[i, j] = _minimum(SEVERITY_MAX, HARM_RATIO * severity[i, j]) if relevant[j] else 0.0
        s = _interp(target / mean, curve[h], grid)
        for _ in range(3):
            scale = math.exp(-s)
            for t in range(n):
                value = exp_difficulty[h, t] * scale
                value += 1.0
                value = 1.0 / value
                qf[t] = value * ceiling[t]
                q[t] = (1.0 - value) * qf[t]
            gap = _pairwise(qf, 0, 1, n) / n - target
            slope = _pairwise(q, 0, 1, n) / n
            s = s - gap / slope
        skill[i] = s


def draw_worlds_compiled(seeds: np.ndarray, bkey: np.uint64, width: int, relevant: np.ndarray,
                         prevalence: np.ndarray, domain_severity: np.ndarray, minimal_codes: np.ndarray,
                         minimal_active: np.ndarray, target: float, curve: np.ndarray, grid: np.ndarray,
                         exp_difficulty: np.ndarray, coefficients: np.ndarray) -> tuple[np.ndarray, ...]:
    """``model.draw_worlds``' fields the harness track reads, a world at a time (:func:`_draw_into`, compiled):
    (present (W, 5) bool, severity, harm (W, 5), half (W,), base skill (W,)). The world's block of ``width``
    uniforms from its ``world`` stream (redrawn from block ``attempt`` while ``FEASIBLE_MODEL_ALONE`` times the
    minimal harness's mean ceiling is at most ``target``), the severities, the minimal ceiling, and
    ``calibrate_worlds``: the solve curve's inverse (``np.interp``) refined by 3 Newton steps, every sum NumPy's
    pairwise one."""
    w = seeds.size
    out = (np.zeros((w, D), np.bool_), np.empty((w, D)), np.empty((w, D)), np.empty(w, np.intp), np.empty(w))
    _draw_into(0, w, seeds, bkey, width, relevant, prevalence, domain_severity, minimal_codes, minimal_active,
               target, curve, grid, exp_difficulty, coefficients, *out)
    return out



_CODE_BIT = np.array([5 - axis for axis in CODE_AXES], np.int64)  # defect j's bit in a 5-bit code
CHUNK = 256  # worlds made at a time (compiled_worlds)
_STREAM_INDEX = np.array([STREAMS.index("eval") + 1, STREAMS.index("official") + 1], np.uint64)


@numba.njit(cache=True)
def _ahead_into(start: int, end: int, seeds: np.ndarray, present: np.ndarray, severity: np.ndarray,
                harm: np.ndarray, half: np.ndarray, skill: np.ndarray, exp_difficulty: np.ndarray, codes: np.ndarray,
                counts: np.ndarray, bkey: np.uint64, stream_index: np.ndarray, active0: np.ndarray,
                applied0: np.ndarray, m: int, k: int, coefficients: np.ndarray, tables: np.ndarray, world: np.ndarray,
                keys: np.ndarray, initial: np.ndarray) -> None:  # pragma: no cover
    """:func:`worlds_ahead` of the worlds ``start:end`` into the given arrays."""
    n = exp_difficulty.shape[1]
    six = np.empty((3, 2 * VERSIONS))
    work = np.empty((7, VERSIONS))
    got = np.empty(D + 2, np.int64)
    bmix = bkey * _M1 + _GAMMA
    for i in range(start, end):
        has = 0
        for j in range(1, D):
            has += np.int64(present[i, j]) << (j - 1)
        scale = math.exp(-skill[i])
        for split in range(2):
            h = 1 - half[i] if split == 0 else half[i]
            key = (h * 2 + np.int64(present[i, 0])) * 16 + has
            six[:2] = 0.0
            for t in range(n):
                q = exp_difficulty[h, t] * scale
                q += 1.0
                q = 1.0 / q
                c = codes[key, t]
                six[0, c] += q
                six[1, c] += q * q
            six[2] = counts[key]
            for s in range(3):
                for c in range(VERSIONS):
                    tables[i, split, 0, s, c] = six[s, c] + six[s, c + VERSIONS]  # bit 0 from the exposure flag
                    cell = (c & 1) * VERSIONS + (c >> 1) * 2
                    tables[i, split, 1, s, c] = six[s, cell] + six[s, cell + 1]  # from the interference flag
        for j in range(D):
            world[i, j] = 1.0 if present[i, j] else 0.0
            world[i, D + j] = 1.0 - severity[i, j]
            world[i, 2 * D + j] = 1.0 - harm[i, j]
            world[i, 3 * D + j] = severity[i, j]
        z = _mix64(seeds[i] + _GAMMA)
        z = _mix64(z ^ bmix)
        for s in range(2):
            keys[i, s] = _mix64(z + stream_index[s] * _GAMMA)
        _eval_counts(tables[i, 1], world[i], active0, applied0, m, k, keys[i, 1], np.uint64(0), coefficients, work,
                     got)
        initial[i] = got[0] / (m * k)


def worlds_ahead(seeds: np.ndarray, present: np.ndarray, severity: np.ndarray, harm: np.ndarray, half: np.ndarray,
                 skill: np.ndarray, exp_difficulty: np.ndarray, codes: np.ndarray, counts: np.ndarray,
                 bkey: np.uint64, stream_index: np.ndarray, active0: np.ndarray, applied0: np.ndarray, m: int,
                 k: int, coefficients: np.ndarray) -> tuple[np.ndarray, ...]:
    """What ``V7HarnessEnv._draw_ahead`` makes of ``draw_worlds``' worlds, a world at a time (:func:`_ahead_into`,
    compiled): the per-code tables (``_world_tables``: the two ``bincount`` passes as running sums in task order,
    then the same cell pairs added), the world row ``[present, 1 - severity, 1 - harm, severity]``, the eval and
    official stream keys (``draws.streams_keys``) and the initial official score (``per_code_stats`` of the
    minimal harness on the official split and ``draw_outcomes`` with draw 0 of the official stream: the step
    kernel's ``_eval_counts``). Returns (tables (W, 2, 2, 3, 32), world (W, 20), keys (W, 2), initial official
    (W,))."""
    w = seeds.size
    out = (np.empty((w, 2, 2, 3, VERSIONS)), np.empty((w, 4 * D)), np.empty((w, 2), np.uint64), np.empty(w))
    _ahead_into(0, w, seeds, present, severity, harm, half, skill, exp_difficulty, codes, counts, bkey, stream_index,
                active0, applied0, m, k, coefficients, *out)
    return out


class V7NumbaEnv(V7HarnessEnv):
    """:class:`bench_v7_prototype.V7HarnessEnv` whose ``step`` is the numba kernel :func:`step_rows`; the worlds
    ahead, the ``info`` dict and the ledger entry stay in Python. ``timing``: a dict that ``step`` adds each part's
    perf_counter seconds to ("checks", "draws", "kernel", "info", "ledger"), or None. ``compiled_worlds``: True,
    the worlds ahead drawn by :func:`draw_worlds_compiled` and made by :func:`worlds_ahead`; "tables": only the
    latter, from the model's ``draw_worlds`` (either way the same arrays bit for bit; the seeds still from the
    reset's NumPy Generator). ``ledger_every``: K, the
    ledger's entry (``write_episode_records(per_step=True)``: one account, one audited entry listing every episode)
    written every K steps for the episodes that ended in them (``write_episodes="step"`` semantics over K steps;
    1: every step, the prototype's); :meth:`flush_ledger` writes the episodes still pending."""

    def __init__(self, num_envs: int, *, compiled_worlds: bool | str = False, ledger_every: int = 1, **kwargs: Any):
        if ledger_every < 1:
            raise ValueError(f"ledger_every is at least 1, got {ledger_every}")
        self.compiled_worlds, self.ledger_every = compiled_worlds, ledger_every
        self._pending: list[tuple[np.ndarray, ...]] = []
        self._since = 0
        super().__init__(num_envs, **kwargs)
        s = self.scenario
        self._limits_row = np.array([s.max_steps, s.refusal_limit, self.budget_n, self.min_n, self.time_limit_s],
                                    np.float64)
        self._consts = (_KIND, _K, _DEFECT, _BEST, self.active.astype(np.bool_), self.applied.astype(np.bool_),
                        self.bill, self._limits_row, self.m, s.official_k, float(s.budget_usd), self.template,
                        np.ascontiguousarray(self.static_mask), _FLOAT_START, _PPF)
        self.timing: dict[str, float] | None = None

    def _draw_ahead(self) -> None:
        """``AHEAD`` new worlds: the prototype's, or (``compiled_worlds``) their seeds now (the same Generator
        call) and the worlds themselves made a chunk at a time as :meth:`_take` reaches them (into buffers kept
        from batch to batch: no new pages to touch, and a chunk's arrays still in cache when the kernel copies
        them). ``"tables"``: the model's ``draw_worlds`` of the whole batch now, the rest by chunk."""
        if not self.compiled_worlds:
            return super()._draw_ahead()
        ahead = bench_v7_prototype.AHEAD
        seeds = seed_array(self._rng.integers(2**31 - 1, size=ahead))
        if getattr(self, "_buffers", None) is None or len(self._buffers[0]) != ahead:
            self._buffers = (np.zeros((ahead, D), np.bool_), np.empty((ahead, D)), np.empty((ahead, D)),
                             np.empty(ahead, np.intp), np.empty(ahead), np.empty((ahead, 2, 2, 3, VERSIONS)),
                             np.empty((ahead, 4 * D)), np.empty((ahead, 2), np.uint64), np.empty(ahead, np.intp),
                             np.empty(ahead))
        present, severity, harm, half, skill, tables, world, keys, variant, initial = self._buffers
        if self.compiled_worlds == "tables":
            w = draw_worlds(self.benchmark, seeds)
            for whole, part in zip((present, severity, harm, half, skill),
                                   (w.present, w.severity, w.harm, w.half, w.base_skill)):
                whole[:] = part
        self._seeds_ahead = seeds
        self._ahead = (seeds.astype(np.int64), tables, world, keys, variant, half, initial)
        self._at = self._made = 0
        return None

    def _take(self, count: int) -> slice:
        """The prototype's, then (``compiled_worlds``) the worlds up to the last place taken made, ``CHUNK`` or
        more at a time."""
        taken = super()._take(count)
        if self.compiled_worlds and self._at > self._made:
            start, end = self._made, min(len(self._seeds_ahead), max(self._at, self._made + CHUNK))
            self._make(start, end)
            self._made = end
        return taken

    def _make(self, start: int, end: int) -> None:
        """The worlds ``start:end`` of the batch ahead (compiled)."""
        present, severity, harm, half, skill, tables, world, keys, variant, initial = self._buffers
        if getattr(self, "_world_consts", None) is None:
            bid, domain = self.benchmark.id, self.benchmark.domain
            table, bkey = task_table(bid), np.uint64(self.bkey)
            self._world_consts = (
                (bkey, SYSTEM_DRAWS + len(domain.teacher_accuracy), np.asarray(domain.exposure) > 0,
                 np.asarray(domain.prevalence, np.float64), np.asarray(domain.severity, np.float64),
                 table.minimal_codes, Harness().active, float(self.benchmark.initial_score), solve_curve(bid),
                 SKILL_GRID, table.exp_difficulty, _PPF),
                (table.exp_difficulty, *task_codes(bid), bkey, _STREAM_INDEX, self._consts[4][0], self._consts[5][0],
                 self.m, self.scenario.official_k, _PPF))
        draw, ahead = self._world_consts
        seeds = self._seeds_ahead
        if self.compiled_worlds != "tables":
            _draw_into(start, end, seeds, *draw, present, severity, harm, half, skill)
        _ahead_into(start, end, seeds, present, severity, harm, half, skill, *ahead, tables, world, keys, initial)
        variant[start:end] = present[start:end, 0]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One menu index per row; a row that ended last step starts its next episode instead."""
        timing = self.timing
        start = time.perf_counter() if timing is not None else 0.0
        actions = self._checked(actions).astype(np.int64, copy=False)
        count = int(np.count_nonzero(self.done))
        if timing is not None:
            now = time.perf_counter()
            timing["checks"] = timing.get("checks", 0.0) + now - start
            start = now
        place = self._take(count).start  # a new batch ahead when it runs out
        if timing is not None:
            now = time.perf_counter()
            timing["draws"] = timing.get("draws", 0.0) + now - start
            start = now
        (obs, mask, self.reward, self.terminated, self.truncated, self.calls, self.ok, cost, left, spent, ended,
         near_half) = step_rows(actions, self.ints, self.floats, self.n_scores, self.score_sum, self.means,
                                self.first_scored, self.fail_shares, self.tables, self.world, self.keys, self.variant,
                                self.half, self.initial_official, self.seeds, *self._ahead, place, *self._consts)
        if timing is not None:
            now = time.perf_counter()
            timing["kernel"] = timing.get("kernel", 0.0) + now - start
            start = now
        if near_half.size:  # round_digits's rare values: Python's round
            cost[near_half] = [round(v, 9) for v in cost[near_half].tolist()]
        info: dict[str, Any] = {"action_mask": mask, "n_calls": self.calls, "ok": self.ok, "cost_usd": cost,
                                "budget_left_usd": left, "spent_usd": spent}
        if ended.size:
            self._end_info(info, ended)
        if timing is not None:
            now = time.perf_counter()
            timing["info"] = timing.get("info", 0.0) + now - start
            start = now
        if self.ledger is not None:
            if self.ledger_every == 1:
                if ended.size:
                    self._write(ended)
            else:
                if ended.size:
                    self._pending.append((ended, *(column[ended] for column in (
                        self.seeds, self.steps, self.refusals, self.reason, self.clock, self.spent,
                        self.initial_official, self.final, self.reward))))
                self._since += 1
                if self._since >= self.ledger_every:
                    self.flush_ledger()
            if timing is not None:
                timing["ledger"] = timing.get("ledger", 0.0) + time.perf_counter() - start
        return obs, self.reward, self.terminated, self.truncated, info

    def flush_ledger(self) -> None:
        """Write the episodes that ended since the last entry as one entry (``ledger_every`` > 1), if any."""
        self._since = 0
        if not self._pending:
            return
        rows, seeds, steps, refusals, reason, clock, spent, initial, final, gain = (
            np.concatenate(column) for column in zip(*self._pending))
        self._pending = []
        records = EpisodeRecords(rows, seeds.tolist(), steps.tolist(), refusals.tolist(), _REASONS[reason].tolist(),
                                 (clock / 3600.0).tolist(), spent, (initial.tolist(), final.tolist(), gain.tolist()))
        self._keys += write_episode_records(self.ledger, records, per_step=True, budget_usd=self.scenario.budget_usd,
                                            budget_n=self.budget_n, secret="v7proto", first=self._keys + 1)


# ---------------------------------------------------------------------- the scalar helpers against NumPy's


@numba.njit(cache=True)
def _helpers_many(p: np.ndarray, keys: np.ndarray, counters: np.ndarray, usd: np.ndarray,
                  coefficients: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                     np.ndarray]:  # pragma: no cover
    """The kernel's helpers over arrays: (log, norm_ppf of ``p``; uniforms of ``keys``/``counters``, 6 each;
    nano_up, nano_near, round9 of ``usd``)."""
    logs, ppf = np.empty(p.size), np.empty(p.size)
    for i in range(p.size):
        logs[i] = math.log(p[i])
        ppf[i] = _norm_ppf(p[i], coefficients)
    u = np.empty((keys.size, EVAL_DRAWS))
    for i in range(keys.size):
        _uniforms(keys[i], counters[i], u[i])
    up, near, rounded = np.empty(usd.size, np.int64), np.empty(usd.size, np.int64), np.empty(usd.size)
    for i in range(usd.size):
        up[i], near[i] = _nano_up(usd[i]), _nano_near(usd[i])
        value, half = _round9(usd[i])
        rounded[i] = np.nan if half else value  # NaN: near a half, Python rounds it
    return logs, ppf, u, up, near, rounded


@numba.njit(cache=True)
def _exp_log1p(x: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    """``math.exp`` of ``x`` and ``math.log1p(-p)``, as the worlds' kernels call them."""
    e, l1 = np.empty(x.size), np.empty(p.size)
    for i in range(x.size):
        e[i] = math.exp(x[i])
    for i in range(p.size):
        l1[i] = math.log1p(-p[i])
    return e, l1


def check_world_helpers(size: int = 200_000, seed: int = 0) -> dict[str, int]:
    """How many of ``size`` values the worlds' kernels' ``exp`` (of -40..40: skills, severities' spreads) and
    ``log1p`` (of minus severities in (0, 1)) give other bits than NumPy's at the pinned level.

    >>> check_world_helpers(2000)
    {'exp': 0, 'log1p': 0}
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(-40.0, 40.0, size)
    p = rng.random(size)
    e, l1 = _exp_log1p(x, p)
    return {"exp": int((e.view(np.uint64) != np.exp(x).view(np.uint64)).sum()),
            "log1p": int((l1.view(np.uint64) != np.log1p(-p).view(np.uint64)).sum())}


def check_helpers(size: int = 200_000, seed: int = 0) -> dict[str, int]:
    """How many of ``size`` values the kernel's helpers give other bits than NumPy's: ``log`` (the C library's
    in numba, NumPy's at the pinned AVX2 level), ``norm_ppf`` (uniforms from all of (0, 1), a tenth of them in
    the far tails below 1e-11), ``uniforms`` (random keys and counters), ``nano_up``, ``nano_near`` and
    ``round_digits(., 9)`` (its near-half values left to Python in both).

    >>> check_helpers(2000)
    {'log': 0, 'norm_ppf': 0, 'uniforms': 0, 'nano_up': 0, 'nano_near': 0, 'round9': 0}
    """
    from rsigym_env.menu_vector import nano_near, nano_up, round_digits
    from rsigym_env.worlds.sim.draws import norm_ppf, uniforms

    rng = np.random.default_rng(seed)
    p = rng.random(size)
    far = rng.random(size) < 0.1
    p[far] = 10.0 ** rng.uniform(-300, -11, far.sum())  # the lower far tail (rt > 5)
    upper = rng.random(size) < 0.05
    p[upper] = 1.0 - rng.integers(1, 2**20, upper.sum()) * 2.0**-53  # right next to 1: the upper far tail
    keys = rng.integers(0, 2**63, size // 10, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, size // 10,
                                                                                           dtype=np.uint64)
    counters = rng.integers(0, 2**40, size // 10, dtype=np.uint64)
    usd = np.concatenate([rng.random(size // 10) * 10.0 ** rng.integers(-9, 4, size // 10),
                          rng.integers(0, 10**6, size // 100) / 1e9 + 5e-10])  # the second: halves of a nano
    logs, ppf, u, up, near, rounded = _helpers_many(p, keys, counters, usd, _PPF)
    exact = round_digits(usd, 9)
    python = np.isnan(rounded)
    rounded[python] = [round(v, 9) for v in usd[python].tolist()]

    def differ(a: np.ndarray, b: np.ndarray) -> int:
        return int((a.view(np.uint64) != b.view(np.uint64)).sum())

    return {"log": differ(logs, np.log(p)), "norm_ppf": differ(ppf, norm_ppf(p)),
            "uniforms": differ(u, uniforms(keys, counters, EVAL_DRAWS)), "nano_up": differ(up, nano_up(usd)),
            "nano_near": differ(near, nano_near(usd)), "round9": differ(rounded, exact)}


# ---------------------------------------------------------------------- measuring


def numba_rows(n: int) -> dict[str, Any]:
    """The rows of ``--interleave`` at N = ``n`` (``bench_v7_prototype.interleaved``'s ``rows``): the numba env
    with compiled worlds (brief 29b) with the per-step ledger, an entry every 16 and 64 steps, and no ledger;
    then brief 29a's rows as the same run's reference: the numba env three ways and the NumPy prototype with the
    per-step ledger."""
    return {"cw ledger=step": partial(V7NumbaEnv, n, ledger=True, compiled_worlds=True),
            "cw ledger/16": partial(V7NumbaEnv, n, ledger=True, compiled_worlds=True, ledger_every=16),
            "cw ledger/64": partial(V7NumbaEnv, n, ledger=True, compiled_worlds=True, ledger_every=64),
            "cw ledger=off": partial(V7NumbaEnv, n, ledger=False, compiled_worlds=True),
            "numba ledger=step": partial(V7NumbaEnv, n, ledger=True),
            "numba ledger=off": partial(V7NumbaEnv, n, ledger=False),
            "numba off, no draw": partial(V7NumbaEnv, n, ledger=False, recycle_worlds=True),
            "numpy ledger=step": v7_rows(n)["v7 ledger=step"]}


def with_older(path: str) -> Any:
    """``numba_rows`` plus the row "numpy before 29a": the prototype of another checkout (``path``, e.g. main's
    bench/bench_v7_prototype.py, with its BLAS products) with the per-step ledger."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_v7_prototype_older", path)
    older = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(older)

    def rows(n: int) -> dict[str, Any]:
        return {**numba_rows(n), "numpy before 29a": partial(older.V7HarnessEnv, n, ledger=True)}
    return rows


PART_NAMES = ("checks", "draws", "kernel", "info", "ledger")


def parts(n: int, steps: int, **kwargs: Any) -> dict[str, float]:
    """Where a numba step's time goes at N = ``n`` (``V7NumbaEnv(n, ledger=True, **kwargs)``, masked uniform
    actions, after 50 steps): perf_counter seconds of each of ``PART_NAMES`` over ``steps`` steps (checks: the
    actions' check and counting the new episodes; draws: the worlds ahead; info: the dict and its end keys;
    ledger: the entry), and "episodes": the episodes that ended, "steps": ``steps``."""
    env = V7NumbaEnv(n, ledger=True, **kwargs)
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0)
    for _ in range(50):
        mask = info["action_mask"]
        obs, _, _, _, info = env.step(np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1))
    env.timing = timing = dict.fromkeys(PART_NAMES, 0.0)
    ended = 0
    whole = 0.0
    for _ in range(steps):
        mask = info["action_mask"]
        actions = np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)
        start = time.perf_counter()
        obs, _, terminated, truncated, info = env.step(actions)
        whole += time.perf_counter() - start
        ended += int((terminated | truncated).sum())
    return {**timing, "whole": whole, "episodes": float(ended), "steps": float(steps)}


def draw_cost(batches: int = 3) -> dict[str, float]:
    """perf_counter seconds a world: "numpy" of ``V7HarnessEnv._draw_ahead`` (``AHEAD`` worlds a batch),
    "draw_worlds" of the model's ``draw_worlds`` alone (its draws and base-skill calibration; the rest: the
    per-code tables, stream keys and the initial official score), "tables" of ``compiled_worlds="tables"``
    (``draw_worlds``, then :func:`worlds_ahead` by ``CHUNK``), "compiled" of ``compiled_worlds=True``, and
    "generator" of the batch's seeds alone (NumPy's Generator, in every one of them)."""
    out = {}
    for name, compiled in (("numpy", False), ("tables", "tables"), ("compiled", True)):
        env = V7NumbaEnv(1, ledger=False, compiled_worlds=compiled)
        env.reset(seed=0)
        start = time.perf_counter()
        for _ in range(batches):
            env._draw_ahead()
            if compiled:  # made a chunk at a time, as the step's _take makes them
                for at in range(0, AHEAD, CHUNK):
                    env._make(at, min(AHEAD, at + CHUNK))
        out[name] = (time.perf_counter() - start) / batches / AHEAD
    start = time.perf_counter()
    for b in range(batches):
        draw_worlds(env.benchmark, np.arange(b * AHEAD, (b + 1) * AHEAD, dtype=np.uint64))
    out["draw_worlds"] = (time.perf_counter() - start) / batches / AHEAD
    start = time.perf_counter()
    for _ in range(batches):
        seed_array(env._rng.integers(2**31 - 1, size=AHEAD))
    out["generator"] = (time.perf_counter() - start) / batches / AHEAD
    return out


LEDGER_PARTS = ("records", "events", "walk", "json", "hash", "whole", "col events", "col walk", "col json",
                "col hash")


def timed(into: dict[str, float], part: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, its perf_counter seconds added to ``into[part]``.

    >>> into = {"x": 0.0}; timed(into, "x", max, 2, 3), into["x"] >= 0.0
    (3, True)
    """
    begin = time.perf_counter()
    value = call(*args, **kwargs)
    into[part] += time.perf_counter() - begin
    return value


def entry(records: EpisodeRecords, first: int) -> dict[str, Any]:
    """A settled ledger entry listing ``records``' episodes as ``write_episode_records`` builds it (a dict an
    episode), for :func:`ledger_parts` to time its parts."""
    columns = [records.seeds, records.steps, records.refusals, records.end_reasons, records.elapsed_h, *records.result]
    events = [{"seed": seed, "steps": used, "refusals": refusals, "end_reason": reason, "elapsed_h": hours,
               "initial_score": initial, "official_score": final, "normalized_gain": gain}
              for seed, used, refusals, reason, hours, initial, final, gain in zip(*columns)]
    for event, nano in zip(events, records.spent_n.tolist()):
        event["spend_usd"] = nano / NANO
    return {"tool": "episodes", "decision": "allowed", "episodes": events, "key": PlatformKey.key_id(f"v7proto-{first}"),
            "op": "settle", "reservation_id": 1, "reserved_usd": 1.0, "charged_usd": 1.0, "available_usd": 1.0,
            "actual_usd": 1.0, "wall_time": 1.0, "seq": first}


def columns(records: EpisodeRecords) -> dict[str, list[Any]]:
    """``records``' episodes as columns (a list per field): the cheaper entry :func:`ledger_parts` measures."""
    return {"seed": records.seeds, "steps": records.steps, "refusals": records.refusals,
            "end_reason": records.end_reasons, "elapsed_h": records.elapsed_h, "initial_score": records.result[0],
            "official_score": records.result[1], "normalized_gain": records.result[2],
            "spend_usd": (records.spent_n / NANO).tolist()}


def ledger_parts(n: int, steps: int, ks: tuple[int, ...] = (1, 16, 64)) -> dict[int, dict[str, float]]:
    """Where the ledger entry's time goes (``write_episode_records(per_step=True)``), per finished episode, at
    N = ``n`` over ``steps`` steps of masked uniform actions, with an entry every K steps for K in ``ks``:
    perf_counter seconds per episode of "records" (``EpisodeRecords`` read from the arrays, as ``_write``),
    "events" (the per-episode dicts as ``write_episode_records`` builds them), "walk" (``audit._orjson_safe``'s
    check of the entry's event, a Python walk over every value), "json" (``audit.canonical_json`` minus the walk:
    orjson), "hash" (the chain's sha256), and "whole" (``write_episode_records`` into an in-memory ``Ledger``:
    the parts above but "records" plus the accounts' checks, SQLite and the rest); "col events", "col walk",
    "col json", "col hash": the same with the entry's episodes as columns (a list per field; ``spend_usd`` as
    one NumPy division), a format ``rsigym_env`` does not write; plus "episodes" and "entries". The parts are re-run apart on the same records, so they are what each costs, not a profile."""
    env = V7NumbaEnv(n, ledger=True, compiled_worlds=True)
    captured: list[EpisodeRecords] = []
    made = [0.0]

    def capture(rows: np.ndarray) -> None:
        start = time.perf_counter()
        records = EpisodeRecords(rows, env.seeds[rows].tolist(), env.steps[rows].tolist(),
                                 env.refusals[rows].tolist(), _REASONS[env.reason[rows]].tolist(),
                                 (env.clock[rows] / 3600.0).tolist(), env.spent[rows].copy(),
                                 (env.initial_official[rows].tolist(), env.final[rows].tolist(),
                                  env.reward[rows].tolist()))
        made[0] += time.perf_counter() - start
        captured.append(records)

    rng = np.random.default_rng(0)
    info = env.reset(seed=0)[1]
    env._write = capture  # type: ignore[method-assign]
    for _ in range(steps):
        mask = info["action_mask"]
        info = env.step(np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1))[4]
    episodes = sum(len(r.seeds) for r in captured)
    out = {}
    for k in ks:
        batches = [EpisodeRecords.concat(captured[i:i + k], [0] * len(captured[i:i + k]))
                   for i in range(0, len(captured), k)]
        got = dict.fromkeys(LEDGER_PARTS, 0.0)
        got["records"] = made[0]
        ledger = Ledger(None)
        first = 1
        for records in batches:
            first += timed(got, "whole", write_episode_records, ledger, records, per_step=True,
                           budget_usd=env.scenario.budget_usd, budget_n=env.budget_n, secret="v7proto", first=first)
            event = timed(got, "events", entry, records, first)
            timed(got, "walk", audit._orjson_safe, event, 0)
            text = timed(got, "json", audit.canonical_json, event)  # the walk again inside: taken out below
            timed(got, "hash", audit.chain_hash, "0" * 64, text)
            # the same entry with its episodes as columns (a list per field): not what rsigym_env writes
            event["episodes"] = timed(got, "col events", columns, records)
            timed(got, "col walk", audit._orjson_safe, event, 0)
            text = timed(got, "col json", audit.canonical_json, event)
            timed(got, "col hash", audit.chain_hash, "0" * 64, text)
        assert ledger.books().ok
        got["json"] -= got["walk"]
        got["col json"] -= got["col walk"]
        out[k] = {name: value / episodes for name, value in got.items()} | {"episodes": float(episodes),
                                                                            "entries": float(len(batches))}
    return out


_COMPILE = """
import time
start = time.perf_counter()
import rsigym_env, numpy as np, sys
sys.path.insert(0, {bench!r})
import bench_v7_numba as b
imported = time.perf_counter()
env = b.V7NumbaEnv(4, ledger=False)
env.reset(seed=0)
made = time.perf_counter()
env.step(np.array([0, 3, 24, 26]))
first = time.perf_counter()
env.step(np.array([1, 4, 0, 25]))
second = time.perf_counter()
print(imported - start, first - made, second - first)
"""


def compile_times() -> tuple[list[float], list[float]]:
    """(cold, warm): in a fresh process with numba's cache in a new empty directory, then again with that
    cache: seconds to import the module, of the first step (compiling or loading the kernel) and of the second."""
    with tempfile.TemporaryDirectory() as cache:
        environ = {**os.environ, "NUMBA_CACHE_DIR": cache}
        code = _COMPILE.format(bench=str(Path(__file__).parent))
        out = [[float(v) for v in subprocess.run([sys.executable, "-c", code], env=environ, check=True,
                                                  capture_output=True, text=True).stdout.split()] for _ in range(2)]
    return out[0], out[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,16,256,1024")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--interleave", type=int, default=0, help="rounds of every row, interleaved, at each size")
    parser.add_argument("--parts", type=int, default=0, help="N of the part breakdown")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--compile", action="store_true", help="the kernel's cold and warm compile times")
    parser.add_argument("--older", default="", help="also this checkout's bench_v7_prototype.py (a row)")
    args = parser.parse_args()
    stamp = lambda: f"load {os.getloadavg()}; {time.strftime('%H:%M:%S', time.gmtime())} UTC"  # noqa: E731
    print(f"before: {stamp()}; numba {numba.__version__}, NumPy {np.__version__}", flush=True)
    if args.compile:
        cold, warm = compile_times()
        print(f"cold cache: import {cold[0]:.2f} s, first step (compiles) {cold[1]:.2f} s, second {cold[2] * 1e3:.2f}"
              f" ms; warm cache: import {warm[0]:.2f} s, first step (loads) {warm[1]:.2f} s, second "
              f"{warm[2] * 1e3:.2f} ms", flush=True)
    if args.interleave:
        V7NumbaEnv(1).reset(seed=0)[0]  # the kernel from the cache before the first round
        for n in [int(v) for v in args.sizes.split(",")]:
            interleaved(n, args.interleave, args.seconds, with_older(args.older) if args.older else numba_rows)
    if args.parts:
        for label, kwargs in (("numba ledger=step (29a)", {}), ("cw ledger=step", {"compiled_worlds": True}),
                              ("cw ledger/64", {"compiled_worlds": True, "ledger_every": 64})):
            got = parts(args.parts, args.steps, **kwargs)
            steps, episodes = got["steps"], got["episodes"]
            accounted = sum(got[name] for name in PART_NAMES)
            print(f"N={args.parts} {label}, {int(steps)} steps (perf_counter): {got['whole'] / steps * 1e6:.1f} us "
                  f"a step, of which " + ", ".join(f"{name} {got[name] / steps * 1e6:.1f} us "
                                                   f"({got[name] / got['whole']:.0%})" for name in PART_NAMES)
                  + f", rest {(got['whole'] - accounted) / steps * 1e6:.1f} us; {episodes / steps:.1f} episodes end a "
                  f"step; per episode: draws {got['draws'] / episodes * 1e6:.2f} us, info "
                  f"{got['info'] / episodes * 1e6:.2f} us, ledger {got['ledger'] / episodes * 1e6:.2f} us, kernel "
                  f"{got['kernel'] / episodes * 1e6:.2f} us; {stamp()}", flush=True)
        cost = draw_cost()
        print("a world drawn ahead (per world, perf_counter): " + ", ".join(f"{name} {value * 1e6:.2f} us"
                                                                           for name, value in cost.items()), flush=True)
        for k, got in ledger_parts(args.parts, 1000).items():
            print(f"ledger entry every {k} steps ({int(got['entries'])} entries, {int(got['episodes'])} episodes), per "
                  "episode: " + ", ".join(f"{name} {got[name] * 1e6:.3f} us" for name in LEDGER_PARTS), flush=True)
    print(f"after: {stamp()}", flush=True)


if __name__ == "__main__":
    main()
