"""Where the time of a local-world research episode goes, phase by phase.

One scripted-researcher episode per benchmark through ``gymnasium.make(..., world="local")``: the
wall time of ``reset`` (servers up, task directories built or found in the cache), then of every
step grouped by tool. Jobs (training, dev evaluations) run in the background, so the time the
researcher spends blocked on them shows up under ``wait``; ``submit`` is the two official
evaluations (initial and submitted system). The reference is the whole episode (shares of it).
``cpu_s`` is the CPU time of this process and of every process it started and reaped during the
episode (sampling workers, sandboxes, verifiers), ``cores`` that over the wall time: how much of the
two cores the episode kept busy. ``getrusage`` misses most of the sandboxes' CPU (their processes live in PID
namespaces of their own), so ``machine_cpu_s`` is the whole machine's busy CPU over the episode (``/proc/stat``,
as ``bench_eval.CpuMeter``): run nothing else beside it. This VM's speed moves by a third and more between hours
with nothing else running, so each episode also records the load before it and CartPole-v1's steps per
CPU-second over the second before it (``bench_menu_array.cartpole_cpu``), the machine's speed at that moment.

Each benchmark runs twice in a private ``$RSIGYM_HOME``: **cold** (an empty evaluation cache, as on
a fresh machine: task directories built) and **warm** (the same episode again: the dev evaluations of
systems already seen come from the cache). The official split's secret is fixed (``--secret``, through
``$RSIGYM_SPLIT_SECRET``). By default every episode draws official tasks of its own, as ``make run``
does, so the two official evaluations are computed in every episode, cold or warm, and two runs end
with different official scores; the researcher's trajectory up to ``submit`` (its calls and its dev
scores; not the bills of time-billed calls) is seeded and must be the same, and the rows say whether
it was. ``--nonce N`` pins the draw (``$RSIGYM_SPLIT_NONCE``): the same work run to run, official
results cached when warm, and the same result required of cold and warm.

    python bench/bench_local_episode.py [--benchmarks aime gpqa-diamond] [--seed 0] [--secret S] [--nonce N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import rsigym_env  # noqa: F401  (first: it pins NumPy's BLAS kernels; registers the ids)

import gymnasium as gym
from rsigym_env.baselines import ScriptedResearcher
from rsigym_env.catalog import BENCHMARKS as CATALOG_BENCHMARKS
from rsigym_env.splits import NONCE_ENV, SECRET_ENV

sys.path.insert(0, str(Path(__file__).parent))
from bench_eval import CpuMeter  # noqa: E402  (the whole machine's busy CPU, /proc/stat)
from bench_menu_array import cartpole_cpu  # noqa: E402  (the same reference as the vector-sim benches)

BENCHMARKS = list(CATALOG_BENCHMARKS)


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its reaped children so far."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def episode_phases(benchmark: str, seed: int = 0, world_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Seconds per phase of one scripted local episode, the episode's total, CPU time and result."""
    phases: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    load, reference = os.getloadavg()[0], cartpole_cpu(1.0)[1]
    meter, cpu0, t0 = CpuMeter(), _cpu_seconds(), time.perf_counter()
    env = gym.make("RSIGym/Joint-v0", world="local", benchmark=benchmark, world_options=world_options or {})
    researcher = ScriptedResearcher()
    trajectory: list[Any] = []
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
            if not done:  # what the researcher did and saw up to submit (dev scores included): seeded
                trajectory.append([tool, obs["dev_scores"].tolist(), info.get("cost_usd")])
    finally:
        t = time.perf_counter()
        env.close()
        phases["close"] += time.perf_counter() - t
    total, cpu, machine = time.perf_counter() - t0, _cpu_seconds() - cpu0, meter.used()[0]
    return {"benchmark": benchmark, "total_s": total, "cpu_s": cpu, "cores": cpu / total,
            "machine_cpu_s": machine, "load_before": load, "cartpole_cpu_rate": reference,
            "phases_s": dict(phases), "calls": dict(calls),
            "reward": float(reward), "initial": info.get("initial_score"), "official": info.get("official_score"),
            "draw": (info.get("official_split") or {}).get("draw"), "trajectory": trajectory}


SECRET = "bench-local-episode"


def same(cold: dict[str, Any], warm: dict[str, Any]) -> bool:
    """Did two runs of an episode do the same? The trajectory up to submit (each call and the dev scores
    after it) always; with a fixed draw, the result too. The bills are not compared: ``transform_data``
    is billed by the seconds it ran, which move with the machine's load.

    >>> row = {"trajectory": [["transform_data", [0.4], 3.9e-06]], "draw": "fixed", "reward": 0.1, "initial": 0.2, "official": 0.3}
    >>> same(row, row | {"trajectory": [["transform_data", [0.4], 3.1e-06]]}), same(row, row | {"official": 0.4})
    (True, False)
    """
    results = ("reward", "initial", "official") if cold["draw"] == "fixed" else ()
    return ([step[:2] for step in cold["trajectory"]] == [step[:2] for step in warm["trajectory"]]
            and all(cold[k] == warm[k] for k in results))


def measure(benchmarks: list[str] | None = None, seed: int = 0, secret: str = SECRET,
            world_options: dict[str, Any] | None = None, warm: bool = True,
            nonce: str | None = None) -> list[dict[str, Any]]:
    """Every benchmark cold, then warm, in a private ``$RSIGYM_HOME`` with the split secret ``secret`` and,
    if given, the draw pinned by ``nonce`` (the environment is restored afterwards); ``world_options`` of
    the local world (e.g. to compare one off)."""
    rows = []
    saved = {name: os.environ.get(name) for name in ("RSIGYM_HOME", SECRET_ENV, NONCE_ENV)}
    os.environ[SECRET_ENV] = secret
    if nonce is None:
        os.environ.pop(NONCE_ENV, None)
    else:
        os.environ[NONCE_ENV] = nonce
    try:
        for benchmark in benchmarks or BENCHMARKS:
            with tempfile.TemporaryDirectory(prefix="rsigym-bench-home-") as home:
                os.environ["RSIGYM_HOME"] = home
                cold = episode_phases(benchmark, seed, world_options) | {"cache": "cold"}
                if not warm:
                    rows.append(cold | {"same_result": None})
                    print(f"{benchmark}: cold {cold['total_s']:.1f} s", flush=True)
                    continue
                again = episode_phases(benchmark, seed, world_options) | {"cache": "warm"}
            alike = same(cold, again)
            rows += [cold | {"same_result": alike}, again | {"same_result": alike}]
            print(f"{benchmark}: cold {cold['total_s']:.1f} s, warm {again['total_s']:.1f} s, same "
                  f"{'result' if cold['draw'] == 'fixed' else 'trajectory up to submit'}: {alike}", flush=True)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return rows


def table(rows: list[dict[str, Any]]) -> list[str]:
    """A Markdown table: one row per benchmark and cache state, seconds per phase and the total."""
    phases = sorted({p for r in rows for p in r["phases_s"]}, key=lambda p: (p.startswith("close"), p))
    lines = ["| benchmark | cache | " + " | ".join(phases) + " | total s | CPU s (cores) | machine busy core-s | "
             "load before | CartPole-v1 k steps/CPU-s before | initial → official | draw | "
             "same (trajectory; result if fixed) |",
             "|---|---|" + "---:|" * (len(phases) + 5) + "---:|---|---|"]
    for r in rows:
        cells = [f"{r['phases_s'].get(p, 0.0):.1f}" for p in phases]
        same = {True: "yes", False: "**no**", None: ""}[r.get("same_result")]
        cpu = f"{r['cpu_s']:.0f} ({r['cores']:.2f})" if "cpu_s" in r else ""
        machine = (f"{r['machine_cpu_s']:.0f} | {r['load_before']:.1f} | {r['cartpole_cpu_rate'] / 1000:.0f}"
                   if "machine_cpu_s" in r else " |  | ")
        lines.append(f"| {r['benchmark']} | {r.get('cache', '')} | " + " | ".join(cells) +
                     f" | **{r['total_s']:.1f}** | {cpu} | {machine} | {r['initial']:.3f} → {r['official']:.3f} | "
                     f"{r.get('draw') or ''} | {same} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", nargs="*", default=BENCHMARKS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--secret", default=SECRET, help="the official split's secret (the same work run to run)")
    parser.add_argument("--world-options", type=json.loads, default={}, metavar="JSON",
                        help='local world options, e.g. \'{"early_official": false}\'')
    parser.add_argument("--cold-only", action="store_true", help="skip the warm run of each benchmark")
    parser.add_argument("--nonce", help="pin the official draw (default: every episode draws its own, as make run)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = measure(args.benchmarks, args.seed, args.secret, args.world_options, warm=not args.cold_only,
                   nonce=args.nonce)
    print("\n".join(table(rows)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
