"""Where the time of a local-world research episode goes, phase by phase.

One scripted-researcher episode per benchmark through ``gymnasium.make(..., world="local")``: the
wall time of ``reset`` (servers up, task directories built or found in the cache), then of every
step grouped by tool. Jobs (training, dev evaluations) run in the background, so the time the
researcher spends blocked on them shows up under ``wait``; ``submit`` is the two official
evaluations (initial and submitted system). The reference is the whole episode (shares of it).
``cpu_s`` is the CPU time of this process and of every process it started and reaped during the
episode (sampling workers, sandboxes, verifiers), ``cores`` that over the wall time: how much of the
two cores the episode kept busy.

Each benchmark runs twice in a private ``$RSIGYM_HOME``: **cold** (an empty evaluation cache, as on
a fresh machine: a new official-split secret, task directories built) and **warm** (the same
episode again: the evaluations of systems already seen come from the cache). Both must end with
the same result; the rows say whether they did.

    python bench/bench_local_episode.py [--benchmarks aime gpqa-diamond] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from collections import defaultdict
from typing import Any

import gymnasium as gym

import rsigym_env  # noqa: F401  (registers the ids)
from rsigym_env.baselines import ScriptedResearcher
from rsigym_env.catalog import BENCHMARKS as CATALOG_BENCHMARKS

BENCHMARKS = list(CATALOG_BENCHMARKS)


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its reaped children so far."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def episode_phases(benchmark: str, seed: int = 0) -> dict[str, Any]:
    """Seconds per phase of one scripted local episode, the episode's total, CPU time and result."""
    phases: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    env = gym.make("RSIGym/Joint-v0", world="local", benchmark=benchmark)
    researcher = ScriptedResearcher()
    try:
        t = time.perf_counter()
        obs, info = env.reset(seed=seed)
        phases["reset (servers, tasks)"] += time.perf_counter() - t
        researcher.reset(obs, info, seed=seed)
        done = False
        while not done:
            action = researcher.act(obs, info)
            tool = action["tool"] if isinstance(action, dict) else getattr(action, "name", "?")
            t = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(action)
            phases[tool] += time.perf_counter() - t
            calls[tool] += 1
            done = terminated or truncated
    finally:
        t = time.perf_counter()
        env.close()
        phases["close"] += time.perf_counter() - t
    total, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    return {"benchmark": benchmark, "total_s": total, "cpu_s": cpu, "cores": cpu / total,
            "phases_s": dict(phases), "calls": dict(calls),
            "reward": float(reward), "initial": info.get("initial_score"), "official": info.get("official_score")}


def measure(benchmarks: list[str] | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Every benchmark cold, then warm, in a private ``$RSIGYM_HOME`` (restored afterwards)."""
    rows = []
    saved = os.environ.get("RSIGYM_HOME")
    try:
        for benchmark in benchmarks or BENCHMARKS:
            with tempfile.TemporaryDirectory(prefix="rsigym-bench-home-") as home:
                os.environ["RSIGYM_HOME"] = home
                cold = episode_phases(benchmark, seed) | {"cache": "cold"}
                warm = episode_phases(benchmark, seed) | {"cache": "warm"}
            same = all(cold[k] == warm[k] for k in ("reward", "initial", "official"))
            rows += [cold | {"same_result": same}, warm | {"same_result": same}]
            print(f"{benchmark}: cold {cold['total_s']:.1f} s, warm {warm['total_s']:.1f} s, same result: {same}",
                  flush=True)
    finally:
        if saved is None:
            os.environ.pop("RSIGYM_HOME", None)
        else:
            os.environ["RSIGYM_HOME"] = saved
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table: one row per benchmark and cache state, seconds per phase and the total."""
    phases = sorted({p for r in rows for p in r["phases_s"]}, key=lambda p: (p.startswith("close"), p))
    lines = ["| benchmark | cache | " + " | ".join(phases) + " | total s | CPU s (cores) | initial → official | same result |",
             "|---|---|" + "---:|" * (len(phases) + 2) + "---:|---|"]
    for r in rows:
        cells = [f"{r['phases_s'].get(p, 0.0):.1f}" for p in phases]
        same = {True: "yes", False: "**no**", None: ""}[r.get("same_result")]
        cpu = f"{r['cpu_s']:.0f} ({r['cores']:.2f})" if "cpu_s" in r else ""
        lines.append(f"| {r['benchmark']} | {r.get('cache', '')} | " + " | ".join(cells) +
                     f" | **{r['total_s']:.1f}** | {cpu} | {r['initial']:.3f} → {r['official']:.3f} | {same} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", nargs="*", default=BENCHMARKS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = measure(args.benchmarks, args.seed)
    print("\n".join(table(rows)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
