"""Peak memory of the main job and of the session service: a local research episode, and
``rsigym serve`` with N sim runs driven at once.

Memory is sampled every 0.2 s over the whole process tree (the command, its sampling workers,
sandboxes, servers): the proportional set size (PSS, ``/proc/PID/smaps_rollup``: shared pages are
split between the processes sharing them, so forked workers are not counted twice) summed over the
tree, and the largest single resident set (RSS). The goal (issue 15): a local episode under 1.5 GiB.

    .venv/bin/python bench/bench_memory.py [--benchmark terminal-bench-2] [--runs 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
GIB = 1 << 30


def _tree(root: int) -> list[int]:
    """``root`` and every descendant (from /proc/*/stat's parent ids)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def _kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeMemory:
    """Samples a process tree's memory in a thread until stopped: ``peak_pss``, ``peak_rss``, ``peak_processes``."""

    def __init__(self, pid: int, interval_s: float = 0.2):
        self.pid, self.interval_s = pid, interval_s
        self.peak_pss = self.peak_rss = self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = _tree(self.pid)
            self.peak_pss = max(self.peak_pss, sum(_kib(p, "Pss") for p in pids) * 1024)
            self.peak_rss = max(self.peak_rss, max((_kib(p, "Rss") for p in pids), default=0) * 1024)
            self.peak_processes = max(self.peak_processes, len(pids))
            self._stop.wait(self.interval_s)

    def figures(self) -> dict[str, float]:
        return {"peak_tree_pss_gib": round(self.peak_pss / GIB, 3), "peak_process_rss_gib": round(self.peak_rss / GIB, 3),
                "peak_processes": self.peak_processes}


def measure_episode(benchmark: str = "terminal-bench-2") -> dict[str, Any]:
    """``rsigym run`` (local world, scripted researcher, seed 0) as a child process, cold: in a fresh
    ``$RSIGYM_HOME`` (no cached evaluation, as on a fresh machine) with a fixed split secret."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rsigym-mem-") as tmp:
        cmd = [sys.executable, "-m", "rsigym_env.cli", "run", "--world", "local", "--benchmark", benchmark,
               "--seed", "0", "--run-dir", str(Path(tmp) / "run"), "--quiet"]
        env = {**os.environ, "RSIGYM_HOME": str(Path(tmp) / "home"), "RSIGYM_SPLIT_SECRET": "bench-memory"}
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        with TreeMemory(proc.pid) as memory:
            _, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"rsigym run failed ({proc.returncode}): {err[-2000:]}")
        return {"benchmark": benchmark, "wall_s": round(time.perf_counter() - started, 1), **memory.figures(),
                "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def measure_serve(runs: int = 16, steps: int = 200) -> dict[str, Any]:
    """``rsigym serve`` with ``runs`` sim runs, each driven through ``steps`` REST calls at once."""
    import bench_gateway

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rsigym-mem-serve-") as tmp:
        proc, url = bench_gateway.start_server(Path(tmp) / "state", None)
        try:
            with TreeMemory(proc.pid) as memory:
                rest = bench_gateway.through_rest(url, bench_gateway.script(steps), runs)
        finally:
            proc.terminate()
            proc.wait(30)
    return {"runs": runs, "steps": steps, "errors": len(rest["errors"]), **memory.figures(),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def measure(benchmark: str = "terminal-bench-2", runs: int = 16) -> dict[str, Any]:
    return {"episode": measure_episode(benchmark), "serve": measure_serve(runs)}


def table(m: dict[str, Any]) -> list[str]:
    e, s = m["episode"], m["serve"]
    return [
        "| workload | peak memory of the process tree (PSS) | largest process (RSS) | processes at most | load before → after |",
        "|---|---:|---:|---:|---|",
        f"| local episode ({e['benchmark']}, `rsigym run`, {e['wall_s']:.0f} s) | {e['peak_tree_pss_gib']:.2f} GiB | "
        f"{e['peak_process_rss_gib']:.2f} GiB | {e['peak_processes']} | {e['loadavg_before'][0]:.2f} → {e['loadavg_after'][0]:.2f} |",
        f"| `rsigym serve`, {s['runs']} sim runs × {s['steps']} calls at once ({s['errors']} errors) | "
        f"{s['peak_tree_pss_gib']:.2f} GiB | {s['peak_process_rss_gib']:.2f} GiB | {s['peak_processes']} | "
        f"{s['loadavg_before'][0]:.2f} → {s['loadavg_after'][0]:.2f} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", default="terminal-bench-2")
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    figures = measure(args.benchmark, args.runs)
    print("\n".join(table(figures)))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
