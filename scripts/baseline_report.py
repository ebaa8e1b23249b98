"""Random vs scripted researcher on every sim benchmark, and the sim's initial scores vs the paper's.

    .venv/bin/python scripts/baseline_report.py [--seeds 50] [--track joint] [--budget 500]

Prints a Markdown table (the README's "Figures" section holds its output).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import rsigym_env  # noqa: F401
from rsigym_env.baselines import make_researcher
from rsigym_env.catalog import TRACKS, env_id
from rsigym_env.episode import run_episode
from rsigym_env.metrics import mean_se as mean_se_n
from rsigym_env.scoring import rsi_index
from rsigym_env.worlds.sim import BENCHMARKS


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (``rsigym_env.metrics.mean_se`` without the count)."""
    mean, se, _ = mean_se_n(values)
    return mean, se


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--track", default="joint", choices=list(TRACKS))
    parser.add_argument("--budget", type=float, default=500.0)
    args = parser.parse_args()
    started = time.perf_counter()
    rows, index = [], {"random": [], "scripted": []}
    for bench_id, bench in BENCHMARKS.items():
        env = gym.make(env_id(args.track), benchmark=bench_id, budget_usd=args.budget)
        results = {name: [run_episode(env, make_researcher(name), seed=s) for s in range(args.seeds)]
                   for name in ("random", "scripted")}
        env.close()
        initial = mean_se([r.info["initial_score"] for r in results["scripted"]])
        cells = [bench_id, f"{bench.initial_score:.4f}", f"{initial[0]:.4f} ± {initial[1]:.4f}"]
        for name in ("random", "scripted"):
            gain = mean_se([r.reward for r in results[name]])
            spend = np.mean([r.info["spend_usd"] for r in results[name]])
            index[name].append(gain[0])
            cells += [f"{gain[0]:+.3f} ± {gain[1]:.3f}", f"${spend:,.0f}"]
        rows.append(cells)
    print(f"{args.track} track, ${args.budget:g} budget, {args.seeds} seeds per cell (mean ± standard error); "
          f"{time.perf_counter() - started:.1f} s wall\n")
    print("| benchmark | paper initial | sim initial official avg@3 | random gain | random spend | scripted gain | scripted spend |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    print(f"| **RSI-Index** | | | **{rsi_index(index['random']):+.3f}** | | **{rsi_index(index['scripted']):+.3f}** | |")


if __name__ == "__main__":
    main()
