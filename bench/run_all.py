"""Run every benchmark and rewrite the figures block of bench/README.md (and the cheating table of
the top-level README). Each section records the 1-minute load average before and after it.

    make bench            # or: python bench/run_all.py [--seconds 3] [--only env,sweep,...]
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

import bench_cheating  # noqa: E402
import bench_env  # noqa: E402
import bench_eval  # noqa: E402
import bench_gateway  # noqa: E402
import bench_local_episode  # noqa: E402
import bench_ledger  # noqa: E402
import bench_memory  # noqa: E402
import bench_model  # noqa: E402
import bench_sweep  # noqa: E402
import bench_watch  # noqa: E402

START, END = "<!-- figures:start -->", "<!-- figures:end -->"


SECTIONS = ("env", "ledger", "sweep", "model", "eval", "local_episodes", "local_sweep", "memory", "cheating",
            "gateway", "watch")


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per workload")
    parser.add_argument("--only", help=f"comma-separated sections (default all: {', '.join(SECTIONS)}); "
                                       "the others keep their figures from bench/results.json")
    args = parser.parse_args()
    wanted = SECTIONS if not args.only else tuple(args.only.split(","))
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    measures = {
        "env": lambda: bench_env.measure(args.seconds),
        "ledger": lambda: bench_ledger.measure(args.seconds),
        "sweep": bench_sweep.measure,
        "model": lambda: bench_model.measure(args.seconds),
        "eval": bench_eval.measure,
        "local_episodes": bench_local_episode.measure,
        "local_sweep": bench_sweep.measure_local,
        "memory": bench_memory.measure,
        "cheating": bench_cheating.measure,
        "gateway": bench_gateway.measure,
        "watch": lambda: bench_watch.measure(args.seconds),
    }
    old = json.loads((HERE / "results.json").read_text()) if (HERE / "results.json").exists() else {}
    results = {"date": date.today().isoformat(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "load": dict(old.get("load", {})), "dates": dict(old.get("dates", {}))}
    for name in SECTIONS:
        if name in wanted:
            before = _load()
            print(f"== {name} (load {before})", flush=True)
            results[name] = measures[name]()
            results["load"][name] = [before, _load()]
            results["dates"][name] = results["date"]
            (HERE / "results.json").write_text(json.dumps(results, indent=2))  # a later failure keeps this
        elif name in old:
            results[name] = old[name]
            results["dates"].setdefault(name, old.get("date", "?"))
    (HERE / "results.json").write_text(json.dumps(results, indent=2))
    load = results["load"]

    def loaded(name: str) -> str:
        b, a = load.get(name, ["?", "?"])
        return f"Measured {results['dates'].get(name, '?')}, load average (1 min) {b} → {a}."

    lines = [START, f"On {results['cpus']} cores, Python {results['python']} (`make bench`; `--only` remeasures some "
                    f"sections and keeps the others' figures and dates)."]
    if "env" in results:
        env = results["env"]
        lines += [
            "",
            f"Sim env. {loaded('env')}",
            "",
            "| workload | steps/s | vs CartPole-v1 (same run) |",
            "|---|---:|---:|",
            f"| CartPole-v1 via `gym.make` (reference) | {env['cartpole_steps_per_s']:,.0f} | 1.00 |",
            f"| sim env, `action_space.sample()` | {env['sampled_steps_per_s']:,.0f} | {env['sampled_vs_cartpole']:.3f} |",
            f"| sim env, scripted researcher episodes (resets included) | {env['scripted_steps_per_s']:,.0f} | {env['scripted_vs_cartpole']:.3f} |",
            *([f"| sim env, RL researcher episodes (policy and resets included) | {env['rl_steps_per_s']:,.0f} | {env['rl_vs_cartpole']:.3f} |"]
              if "rl_steps_per_s" in env else []),
        ]
        if "refused_us" in env:
            lines += ["", f"Of the sampled actions {env['refused_fraction']:.0%} are refused: a refused step takes "
                          f"{env['refused_us']:.1f} µs, an executed one {env['executed_us']:.1f} µs"
                          + (f" (medians {env['refused_median_us']:.1f} and {env['executed_median_us']:.1f} µs)."
                             if "refused_median_us" in env else ".")]
    if "ledger" in results:
        lines += ["", f"Ledger. {loaded('ledger')}", "", "| ledger operation | per second |", "|---|---:|",
                  *[f"| {k} | {v:,.0f} |" for k, v in results["ledger"].items()]]
    if "sweep" in results:
        sweep = results["sweep"]
        lines += [
            "",
            f"Sim sweep. {loaded('sweep')}",
            "",
            "| sweep (random + scripted × 5 benchmarks × 40 seeds) | seconds | speed-up |",
            "|---|---:|---:|",
            f"| one process, one episode after another (reference) | {sweep['sequential_s']:.2f} | 1.00 |",
            f"| Ray, {sweep['cpus']:.0f} CPUs, {sweep['chunk']:.0f} episodes per task | {sweep['ray_s']:.2f} | {sweep['speedup']:.2f}× |",
            f"| Ray start-up / worker warm-up (not counted above) | {sweep['ray_init_s']:.1f} / {sweep['ray_warmup_s']:.1f} | |",
        ]
    if "model" in results:
        model = results["model"]
        lines += ["", f"Local-world model ({model['params_millions']:.2f} M parameters, NumPy; MFU against a float32 "
                      f"matmul peak measured in the same run with the same thread count). {loaded('model')}", "",
                  bench_model.table(model)]
    if "eval" in results:
        lines += ["", *eval_table(results["eval"]), loaded("eval")]
    if "local_episodes" in results:
        lines += ["", "Local-world research episodes (`bench_local_episode.py`: scripted researcher, joint track, seed 0; "
                      f"seconds per phase, jobs run in the background so waiting on them shows under `wait`; each benchmark cold — an empty evaluation cache, as on a fresh machine — then warm). {loaded('local_episodes')}",
                  "", *bench_local_episode.table(results["local_episodes"])]
    if "local_sweep" in results:
        ls = results["local_sweep"]
        lines += ["", f"Local-world sweep (`bench_sweep.py --local-world`: scripted, terminal-bench-2 and aime × 2 seeds, "
                      f"each pass from an empty evaluation cache). {loaded('local_sweep')}", "",
                  "| run | seconds | speed-up |", "|---|---:|---:|",
                  f"| one process, one episode after another (reference) | {ls['sequential_s']:.1f} | 1.00 |",
                  f"| Ray, {ls['cpus']:.0f} CPUs, one episode per task (results equal) | {ls['ray_s']:.1f} | {ls['speedup']:.2f}× |"]
    if "memory" in results:
        lines += ["", f"Memory (`bench_memory.py`). {loaded('memory')}", "", *bench_memory.table(results["memory"])]
    if "gateway" in results:
        lines += ["", *bench_gateway.table(results["gateway"])]
    if "watch" in results:
        lines += ["", *bench_watch.table(results["watch"])]
    if "cheating" in results:
        lines += ["", f"Cheating harness vs honest harness (`bench_cheating.py`, official split, base model, avg@3). "
                      f"{loaded('cheating')}", "", *bench_cheating.table(results["cheating"])]
        if "cheating" in wanted:  # the README's block keeps its hand-written notes unless remeasured
            cheat = [*bench_cheating.table(results["cheating"]), "", loaded('cheating')]
            _replace_block(HERE.parent / "README.md", "<!-- cheating:start -->", "<!-- cheating:end -->", cheat)
    lines.append(END)
    _replace_block(HERE / "README.md", START, END, lines[1:-1])
    print("\n".join(lines[1:-1]))


def _replace_block(path: Path, start: str, end: str, body: list[str]) -> None:
    text = path.read_text()
    head, found, rest = text.partition(start)
    if not found:
        return
    _, _, tail = rest.partition(end)
    path.write_text(head + start + "\n" + "\n".join(body) + "\n" + end + tail)


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
        f"Medians of {e.get('rounds', 1)} interleaved rounds (trials/s of each round: Harbor "
        f"{', '.join(f'{x:.1f}' for x in h.get('rounds_per_s', []))}; direct "
        f"{', '.join(f'{x:.1f}' for x in d.get('rounds_per_s', []))}). CPU per trial, the whole machine's (sandboxes "
        f"and kernel included) / the evaluating process's: Harbor {h.get('machine_cpu_ms', 0):.0f} / "
        f"{h.get('process_cpu_ms', 0):.0f} ms, direct {d.get('machine_cpu_ms', 0):.0f} / {d.get('process_cpu_ms', 0):.0f} ms.",
        "",
        f"Per trial: environment start {h.get('env_start_ms', 0):.0f} ms, agent {h.get('agent_ms', 0):.0f} ms, verifier "
        f"{h.get('verifier_ms', 0):.0f} ms, Harbor's own bookkeeping {h.get('harbor_ms', 0):.0f} ms; an empty sandbox "
        f"starts in {e['sandbox_start_ms']:.0f} ms.",
        *([f"A trial's task work (load the task, check and select its tests): {e['task_work']['own_ms']:.1f} ms by "
           f"Harbor's own code, {e['task_work']['tuned_ms']:.1f} ms memoized by `tune_harbor` (same process)."]
          if "task_work" in e else []),
    ]


if __name__ == "__main__":
    main()
