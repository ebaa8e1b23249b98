"""The array core's kernels (``SimBatch``) per world and second, against the scalar sim and CartPole-v1.

What the array core's two heaviest kernels cost at sim result version 5 (counter-based draws): for
N = 1, 16, 256 worlds of one benchmark,

* ``eval dev k=3 batch``: ``SimBatch.evaluate`` of all N worlds (each its own skill, memory and
  harness; the next draw of each world's ``eval`` stream), in evaluations per second;
* ``eval dev k=3 scalar``: the same N evaluations by each ``SimWorld.evaluation`` (``_run``: no
  run, no ledger, no env around it);
* ``draws only``: the batch's uniforms of one evaluation (``draws.uniforms``, N x n x 3);
* ``reset``: ``draw_worlds`` of N seeds (the world draw of a reset, every transform batched), worlds
  per second.

``same``: the batch's scores, bills and attempts equal the scalar's (twin worlds, same seeds).
CartPole-v1 (``gym.make``, sampled actions) is measured at the start and end of the same run.

    python bench/bench_sim_batch.py [--seconds 2] [--sizes 1,16,256] [--benchmark swe-bench-verified]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

import rsigym_env  # noqa: F401  (first: it pins NumPy's BLAS kernels)

import numpy as np

from rsigym_env.catalog import FAILURE_MODES
from rsigym_env.services import EvalRequest
from rsigym_env.worlds.sim import BENCHMARKS, SimWorld
from rsigym_env.worlds.sim.batch import HarnessArrays, SimBatch
from rsigym_env.worlds.sim.draws import uniforms
from rsigym_env.worlds.sim.model import ModelState, draw_worlds

sys.path.insert(0, str(Path(__file__).parent))
from bench_env import cartpole  # noqa: E402  (the same reference as bench_env.py)

TOMLS = ("", "[shell]\npersistent = true", '[generation]\non_truncation = "continue"\n[edits]\ncheck = true')


def _rate(work: Callable[[], int], seconds: float) -> float:
    """Items per second of ``work`` (it returns how many it did) repeated for about ``seconds``."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or done == 0:
        done += work()
    return done / (time.perf_counter() - start)


def measure(benchmark: str, n: int, seconds: float) -> dict[str, float | bool]:
    seeds = list(range(n))
    twin, batch = [SimWorld(benchmark, s) for s in seeds], SimBatch.make(benchmark, seeds)
    files = [{**batch.initial_harness(), "harness.toml": TOMLS[i % len(TOMLS)]} for i in range(n)]
    harness = HarnessArrays.of(files)
    skill, memory = batch.base_skill + 0.1 * (np.arange(n) % 3), 0.05 * (np.arange(n) % 2)
    requests = [EvalRequest(checkpoint="base", harness_version="v", harness_files=f, k=3) for f in files]
    for w, s, m in zip(twin, skill, memory):  # the twin's checkpoint has the batch's skill and memory
        w.add_checkpoint("base", ModelState(float(s), dev_memory=float(m)), 0.0)

    out = batch.evaluate(skill, memory, harness, k=3)
    same = True
    for i, (w, req) in enumerate(zip(twin, requests)):
        billed = w.evaluation._run(req, official=False)
        same &= bool(out.score[i] == billed.value.score and out.usd[i] == billed.cost_usd
                     and out.counts[i, 0] == sum(map(sum, billed.value.rewards))
                     and dict(zip(FAILURE_MODES, out.failure_counts[i].tolist())) == {
                         mode: billed.value.failure_modes.get(mode, 0) for mode in FAILURE_MODES})

    def batched() -> int:
        batch.evaluate(skill, memory, harness, k=3)
        return n

    def scalar() -> int:
        for w, req in zip(twin, requests):
            w.evaluation._run(req, official=False)
        return n

    def draws() -> int:
        uniforms(batch.eval_keys, batch.eval_counters, batch.n_tasks * 3)
        return n

    def reset() -> int:
        draw_worlds(BENCHMARKS[benchmark], seeds)
        return n

    return {"batch": _rate(batched, seconds), "scalar": _rate(scalar, seconds), "draws": _rate(draws, seconds),
            "reset": _rate(reset, seconds), "same": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--sizes", default="1,16,256")
    parser.add_argument("--benchmark", default="swe-bench-verified")
    args = parser.parse_args()
    print(f"load before {os.getloadavg()}")
    ref = cartpole(args.seconds)
    print(f"cartpole-v1 (gym.make, sampled): {ref:,.0f} steps/s")
    print(f"{args.benchmark}: per second (x cartpole)")
    print(f"{'N':>5s} {'eval batch':>18s} {'eval scalar':>18s} {'draws only':>18s} {'reset':>16s} same  load")
    for n in (int(s) for s in args.sizes.split(",")):
        r = measure(args.benchmark, n, args.seconds)
        cells = " ".join(f"{r[k]:10,.0f} ({r[k] / ref:5.3f})" for k in ("batch", "scalar", "draws"))
        print(f"{n:5d} {cells} {r['reset']:8,.0f} ({r['reset'] / ref:5.3f}) {str(r['same']):5s} "
              f"{os.getloadavg()[0]:.2f}", flush=True)
    print(f"cartpole-v1 again: {cartpole(args.seconds):,.0f} steps/s; load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
