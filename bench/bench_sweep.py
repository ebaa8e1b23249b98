"""Sweep speed-up: the same episodes through Ray vs one after another in this process, same run.

    .venv/bin/python bench/bench_sweep.py [--seeds 40] [--repeats 2]

Workload: random + scripted × the five sim benchmarks × ``seeds`` seeds (400 episodes by default,
joint track, $500), each episode in its own env (own ledger, own platform key), exactly what
``rsigym sweep`` runs. Timed:

* ``sequential_s``: :func:`rsigym_env.sweep.run_local` in this process (the reference);
* ``ray_s``: :func:`rsigym_env.sweep.run_ray` on a local Ray with every core, default chunk size
  (and, for comparison, 1 and 5 episodes per task: Ray's per-task overhead against ms episodes);
* Ray start-up, reported separately and excluded from the speed-up: ``ray_init_s`` (``ray.init``)
  and ``ray_warmup_s`` (every worker imports the package and runs one short episode).

Each timing is the best of ``repeats``, sequential and Ray runs alternating. The Ray results are
checked to equal the sequential ones episode by episode.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from rsigym_env.sweep import (  # noqa: E402
    all_benchmarks, default_chunk, init_ray, make_grid, ray_workers, run_local, run_ray, run_spec, warm_up_workers,
)

AGENTS = ("random", "scripted")


def _timed(fn):
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def measure(seeds: int = 40, repeats: int = 3, chunks: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """Seconds for the sweep sequentially and through Ray, the speed-up, and Ray's start-up time.

    Each repeat runs sequential, Ray with the default chunk, then Ray with each of ``chunks``
    back to back (so a busy neighbour slows all of them alike); every figure is the best of ``repeats``.
    """
    import ray

    specs = make_grid(AGENTS, all_benchmarks(), seeds)
    run_spec(specs[0])  # warm this process's caches like the workers'
    started_here, init_s = init_ray()
    try:
        _, warmup_s = warm_up_workers()
        workers = ray_workers()
        chunk = default_chunk(len(specs), workers)
        sizes = [chunk, *[c for c in chunks if c != chunk]]
        seq_times: list[float] = []
        ray_times: dict[int, list[float]] = {c: [] for c in sizes}
        for _ in range(repeats):
            t, reference = _timed(lambda: run_local(specs))
            seq_times.append(t)
            for c in sizes:
                t, records = _timed(lambda: run_ray(specs, c))  # noqa: B023 (called at once)
                ray_times[c].append(t)
                assert all(r.ok for r in records), [r.error for r in records if not r.ok][:1]
                assert [r.reward for r in records] == [r.reward for r in reference], "Ray and in-process results differ"
        seq = min(seq_times)
        out = {
            "episodes": float(len(specs)), "cpus": float(workers), "chunk": float(chunk),
            "ray_init_s": init_s, "ray_warmup_s": warmup_s,
            "sequential_s": seq, "ray_s": min(ray_times[chunk]), "speedup": seq / min(ray_times[chunk]),
            "sequential_episodes_per_s": len(specs) / seq, "ray_episodes_per_s": len(specs) / min(ray_times[chunk]),
            "load_avg_1m": os.getloadavg()[0],
        }
        for c in sizes[1:]:
            out[f"ray_s_chunk{c}"] = min(ray_times[c])
            out[f"speedup_chunk{c}"] = seq / min(ray_times[c])
        return out
    finally:
        if started_here:
            ray.shutdown()


def measure_local(benchmarks: tuple[str, ...] = ("terminal-bench-2", "aime"), seeds: int = 2) -> dict[str, float]:
    """The scripted researcher on the local world, ``benchmarks`` × ``seeds``: in this process one after
    another, then as Ray tasks of one episode each, with the same results (rewards equal episode by
    episode). Each pass starts from an empty official-evaluation cache (a private ``$RSIGYM_HOME``
    whose task directories are generated once, before timing), so neither pass reuses the other's work. The
    official draw is pinned (``$RSIGYM_SPLIT_NONCE``) for both passes: unpinned, every episode draws official
    tasks of its own (issue 25) and the two passes' rewards could not be compared.
    """
    import shutil
    import tempfile

    import ray

    from unittest import mock

    from rsigym_env.splits import NONCE_ENV, official_split
    from rsigym_env.worlds.local import benchmarks as local_benchmarks
    from rsigym_env.worlds.local.world import tasks_cache

    home = Path(tempfile.mkdtemp(prefix="rsigym-bench-sweep-"))
    started_here = False
    # set before ray.init (the workers inherit both) and restored afterwards
    with mock.patch.dict(os.environ, {"RSIGYM_HOME": str(home), NONCE_ENV: "bench-sweep-local"}):
        try:
            specs = make_grid(["scripted"], list(benchmarks), seeds, world="local", budget_usd=5.0)
            for name in benchmarks:  # task directories once (both passes would otherwise pay it in turn)
                local_benchmarks.resolve(name).build(tasks_cache(), official_split("secret"))
            load_before = os.getloadavg()
            shutil.rmtree(home / "cache" / "evaluations", ignore_errors=True)
            seq_s, reference = _timed(lambda: run_local(specs))
            assert all(r.ok for r in reference), [r.error for r in reference if not r.ok][:1]
            started_here, init_s = init_ray()
            warm_up_workers()  # the package imported in every worker (excluded, as for the sim sweep)
            shutil.rmtree(home / "cache" / "evaluations", ignore_errors=True)
            ray_s, records = _timed(lambda: run_ray(specs, 1))
            assert all(r.ok for r in records), [r.error for r in records if not r.ok][:1]
            assert [r.reward for r in records] == [r.reward for r in reference], "Ray and in-process results differ"
            return {"episodes": float(len(specs)), "cpus": float(ray_workers()), "sequential_s": seq_s,
                    "ray_s": ray_s, "speedup": seq_s / ray_s, "ray_init_s": init_s,
                    "rewards": [r.reward for r in reference], "loadavg_before": list(load_before),
                    "loadavg_after": list(os.getloadavg())}
        finally:
            if started_here:
                ray.shutdown()
            shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunks", default="1,5", help="other chunk sizes to compare")
    parser.add_argument("--local-world", action="store_true",
                        help="instead: scripted local-world episodes (terminal-bench-2, aime × 2 seeds)")
    args = parser.parse_args()
    if args.local_world:
        m = measure_local()
        print(f"local world, {int(m['episodes'])} scripted episodes: one process {m['sequential_s']:.1f} s, "
              f"Ray {m['ray_s']:.1f} s ({m['speedup']:.2f}×; ray.init {m['ray_init_s']:.1f} s excluded); "
              f"load {m['loadavg_before'][0]:.2f} -> {m['loadavg_after'][0]:.2f}")
        return
    m = measure(args.seeds, args.repeats, tuple(int(c) for c in args.chunks.split(",") if c))
    n = int(m["episodes"])
    print(f"\n{n} episodes (random + scripted × 5 sim benchmarks × {args.seeds} seeds), {int(m['cpus'])} Ray CPUs; "
          f"Ray start-up (excluded): ray.init {m['ray_init_s']:.2f} s + worker warm-up {m['ray_warmup_s']:.2f} s; "
          f"best of {args.repeats}; load average at the end {m['load_avg_1m']:.2f}\n")
    print("| run | episodes per task | seconds | episodes/s | speed-up |")
    print("|---|---:|---:|---:|---:|")
    print(f"| one process, one after another | {n} | {m['sequential_s']:.2f} | {m['sequential_episodes_per_s']:.0f} | 1.00 |")
    rows = [(int(m["chunk"]), m["ray_s"])] + [(int(k[len("ray_s_chunk"):]), v) for k, v in m.items() if k.startswith("ray_s_chunk")]
    for c, t in sorted(rows):
        print(f"| Ray tasks{' (default chunk)' if c == int(m['chunk']) else ''} | {c} | {t:.2f} | {n / t:.0f} | "
              f"{m['sequential_s'] / t:.2f} |")


if __name__ == "__main__":
    main()
