"""Run every benchmark and rewrite the figures block of bench/README.md.

    make bench            # or: python bench/run_all.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_env  # noqa: E402
import bench_eval  # noqa: E402
import bench_local_episode  # noqa: E402
import bench_ledger  # noqa: E402
import bench_model  # noqa: E402
import bench_sweep  # noqa: E402

START, END = "<!-- figures:start -->", "<!-- figures:end -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per workload")
    args = parser.parse_args()
    env = bench_env.measure(args.seconds)
    ledger = bench_ledger.measure(args.seconds)
    sweep = bench_sweep.measure()
    model = bench_model.measure(args.seconds)
    evaluation = bench_eval.measure()
    episodes = bench_local_episode.measure()
    results = {"date": date.today().isoformat(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "env": env, "ledger": ledger, "sweep": sweep, "model": model, "eval": evaluation,
               "local_episodes": episodes}
    (HERE / "results.json").write_text(json.dumps(results, indent=2))
    lines = [
        START,
        f"Measured {results['date']} on {results['cpus']} cores, Python {results['python']} (`make bench`).",
        "",
        "| workload | steps/s | vs CartPole-v1 (same run) |",
        "|---|---:|---:|",
        f"| CartPole-v1 via `gym.make` (reference) | {env['cartpole_steps_per_s']:,.0f} | 1.00 |",
        f"| sim env, `action_space.sample()` | {env['sampled_steps_per_s']:,.0f} | {env['sampled_vs_cartpole']:.3f} |",
        f"| sim env, scripted researcher episodes (resets included) | {env['scripted_steps_per_s']:,.0f} | {env['scripted_vs_cartpole']:.3f} |",
        "",
        "| ledger operation | per second |",
        "|---|---:|",
        *[f"| {k} | {v:,.0f} |" for k, v in ledger.items()],
        "",
        "| sweep (random + scripted × 5 benchmarks × 40 seeds) | seconds | speed-up |",
        "|---|---:|---:|",
        f"| one process, one episode after another (reference) | {sweep['sequential_s']:.2f} | 1.00 |",
        f"| Ray, {sweep['cpus']:.0f} CPUs, {sweep['chunk']:.0f} episodes per task | {sweep['ray_s']:.2f} | {sweep['speedup']:.2f}× |",
        f"| Ray start-up / worker warm-up (not counted above) | {sweep['ray_init_s']:.1f} / {sweep['ray_warmup_s']:.1f} | |",
        "",
        f"Local-world model ({model['params_millions']:.2f} M parameters, NumPy; MFU against a float32 matmul "
        "peak measured in the same run with the same thread count):",
        "",
        bench_model.table(model),
        "",
        *eval_table(evaluation),
        "",
        "Local-world research episodes (`bench_local_episode.py`: scripted researcher, joint track, seed 0; "
        "seconds per phase, jobs run in the background so waiting on them shows under `wait`):",
        "",
        *bench_local_episode.table(episodes),
        END,
    ]
    readme = HERE / "README.md"
    text = readme.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    readme.write_text(head + "\n".join(lines) + tail)
    print("\n".join(lines[1:-1]))


def eval_table(e: dict) -> list[str]:
    if "skipped" in e:
        return [f"Local evaluation: skipped ({e['skipped']})."]
    h, d = e["harbor"], e["direct"]
    return [
        f"Local evaluation ({e['n_tasks']} tasks × k={e['k']}, {e['concurrency']} trials at once, a trivial harness):",
        "",
        "| path | trials/s | vs direct (same run) |",
        "|---|---:|---:|",
        f"| the same trial commands straight through `run_isolated` (reference) | {d['trials_per_s']:.1f} | 1.00 |",
        f"| Harbor's `Job` (environment, agent, verifier, bookkeeping) | {h['trials_per_s']:.1f} | "
        f"{h['trials_per_s'] / d['trials_per_s']:.2f} |",
        "",
        f"Per trial: environment start {h.get('env_start_ms', 0):.0f} ms, agent {h.get('agent_ms', 0):.0f} ms, verifier "
        f"{h.get('verifier_ms', 0):.0f} ms, Harbor's own bookkeeping {h.get('harbor_ms', 0):.0f} ms; an empty sandbox "
        f"starts in {e['sandbox_start_ms']:.0f} ms.",
    ]


if __name__ == "__main__":
    main()
