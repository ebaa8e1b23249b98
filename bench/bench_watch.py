"""``rsigym watch``: the runs list on 1,000 run directories, and what live-writing the record costs a step.

    .venv/bin/python bench/bench_watch.py [--runs 1000] [--seconds 3] [--json out.json]

Workloads (every figure is a ratio against a reference measured in the same run):

* ``list``: 1,000 run directories made by real sim episodes (scripted and random researchers on
  the five benchmarks; 90% with ``record.jsonl``, 10% older ones with ``steps.jsonl`` and
  ``result.json`` only). Timed: ``GET /`` of a fresh app (cold: every directory scanned and
  summarised), ``GET /`` again (warm: four ``stat`` calls per directory, rows from the cache), and
  ``GET /`` after 10 runs gained a step. Reference: reading and parsing every record file in full
  (what an index without the tail read and the cache would do).
* ``step``: scripted sim episodes, resets included, with and without :class:`RunRecorder` (and with
  ``fsync=True``), interleaved in the same process. Reference: the same episodes without it.

The load average (``os.getloadavg()``) before and after is reported: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import httpx
import orjson

import rsigym_env  # noqa: F401
from rsigym_env.baselines import ScriptedResearcher, make_researcher
from rsigym_env.catalog import BENCHMARKS as CATALOG_BENCHMARKS
from rsigym_env.episode import run_episode
from rsigym_env.gateway.host import StepLog
from rsigym_env.serving.asgi import ThreadedASGIServer
from rsigym_env.watch.app import create_app
from rsigym_env.watch.record import RECORD_FILE, RunRecorder

BENCHMARKS = list(CATALOG_BENCHMARKS)


def make_runs(root: Path, n: int) -> dict[str, Any]:
    """``n`` run directories from real sim episodes; returns their total size and count of legacy ones."""
    envs = {b: gym.make("RSIGym/Joint-v0", benchmark=b) for b in BENCHMARKS}
    legacy = 0
    for i in range(n):
        bench, agent = BENCHMARKS[i % 5], ("scripted", "random")[(i // 5) % 2]
        run_dir = root / f"run-{i:04d}-{bench}-{agent}"
        run_dir.mkdir(parents=True)
        if i % 10 == 9:  # an older run directory: steps.jsonl and result.json, as `rsigym run` writes today
            env = StepLog(envs[bench], run_dir / "steps.jsonl")
            result = run_episode(env, make_researcher(agent), seed=i)
            env.close_file()
            (run_dir / "result.json").write_text(json.dumps(result.to_dict(), default=str))
            legacy += 1
        else:
            env = RunRecorder(envs[bench], run_dir, researcher=agent, surface="bench")
            run_episode(env, make_researcher(agent), seed=i)
            env.close_file()
    for env in envs.values():
        env.close()
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return {"runs": n, "legacy": legacy, "bytes": size}


def full_read(root: Path) -> float:
    """Seconds to read and parse every record (or steps) file in full: the reference."""
    start = time.perf_counter()
    for run_dir in root.iterdir():
        path = run_dir / RECORD_FILE
        if not path.exists():
            path = run_dir / "steps.jsonl"
        for line in path.read_bytes().splitlines():
            orjson.loads(line)
    return time.perf_counter() - start


def timed_get(client: httpx.Client, url: str) -> tuple[float, int]:
    start = time.perf_counter()
    reply = client.get(url)
    reply.raise_for_status()
    return time.perf_counter() - start, len(reply.content)


def measure_list(n: int = 1000) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="rsigym-bench-watch-"))
    try:
        started = time.perf_counter()
        made = make_runs(root, n)
        made["make_s"] = time.perf_counter() - started
        reference = min(full_read(root) for _ in range(3))
        token = secrets.token_urlsafe(32)  # the dashboard's admin token: every route asks for one
        with ThreadedASGIServer(create_app([root], admin_token=token), name="bench-watch") as server, \
                httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}"}) as client:
            client.get(server.url + "/health").raise_for_status()  # the client's own start-up is not the list's
            cold, size = timed_get(client, server.url + "/")
            warm = []
            for _ in range(7):
                time.sleep(1.05)  # past the scan interval: every directory is checked again
                warm.append(timed_get(client, server.url + "/")[0])
            api = timed_get(client, server.url + "/api/runs")[0]
            touched = sorted(root.iterdir())[:10]
            for run_dir in touched:  # 10 runs gain a step
                env = RunRecorder(gym.make("RSIGym/Joint-v0", benchmark="aime"), run_dir, researcher="more")
                env.reset(seed=0)
                env.step({"tool": "read", "args": {"ref": "budget"}})
                env.close()
            time.sleep(1.05)
            after = timed_get(client, server.url + "/")[0]
            rows = client.get(server.url + "/api/runs").json()["runs"]
        assert len(rows) == n, f"{len(rows)} rows for {n} runs"
        return {**made, "cold_s": cold, "warm_s": statistics.median(warm), "api_warm_s": api,
                "after_10_changed_s": after, "html_bytes": size, "full_read_s": reference,
                "cold_vs_full_read": cold / reference, "warm_vs_full_read": statistics.median(warm) / reference}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _episodes(env: gym.Env, seconds: float, seeds: Any) -> tuple[int, float]:
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        agent = ScriptedResearcher()
        obs, info = env.reset(seed=next(seeds))
        agent.reset(obs, info)
        done = False
        while not done:
            obs, _, terminated, truncated, info = env.step(agent.act(obs, info))
            steps, done = steps + 1, terminated or truncated
    return steps, time.perf_counter() - start


class TimedRecorder(RunRecorder):
    """A :class:`RunRecorder` that also sums the time spent in its own work (building and writing lines)."""

    spent_s = 0.0

    def _records(self, *args: Any) -> Any:
        start = time.perf_counter()
        out = super()._records(*args)
        self.spent_s += time.perf_counter() - start
        return out

    def _write(self, records: Any) -> None:
        start = time.perf_counter()
        super()._write(records)
        self.spent_s += time.perf_counter() - start


def measure_step(seconds: float = 3.0, rounds: int = 20) -> dict[str, Any]:
    """Seconds per sim step without the recorder and with it (and with fsync), in interleaved short rounds
    (alternating which goes first); the median of the per-round ratios, and the recorder's own time."""
    root = Path(tempfile.mkdtemp(prefix="rsigym-bench-record-"))
    try:
        plain = gym.make("RSIGym/Joint-v0", benchmark="swe-bench-verified")
        recorded = TimedRecorder(gym.make("RSIGym/Joint-v0", benchmark="swe-bench-verified"), root / "a")
        synced = TimedRecorder(gym.make("RSIGym/Joint-v0", benchmark="swe-bench-verified"), root / "b", fsync=True)
        per: dict[str, list[float]] = {"plain": [], "recorded": [], "fsync": []}
        steps: dict[str, int] = {"plain": 0, "recorded": 0, "fsync": 0}
        seeds = iter(range(10**9))
        slice_s = seconds / rounds
        for i in range(rounds):
            order = [("plain", plain), ("recorded", recorded), ("fsync", synced)]
            for name, env in order if i % 2 == 0 else order[::-1]:
                n, took = _episodes(env, slice_s * (0.3 if name == "fsync" else 1.0), seeds)
                per[name].append(took / n)
                steps[name] += n
        lines = sum(1 for _ in (root / "a" / RECORD_FILE).open())
        size = (root / "a" / RECORD_FILE).stat().st_size
        for env in (plain, recorded, synced):
            env.close()
        ratio = statistics.median(r / p for r, p in zip(per["recorded"], per["plain"]))
        ratio_fsync = statistics.median(r / p for r, p in zip(per["fsync"], per["plain"]))
        return {"plain_us": 1e6 * statistics.median(per["plain"]), "recorded_us": 1e6 * statistics.median(per["recorded"]),
                "fsync_us": 1e6 * statistics.median(per["fsync"]), "recorded_vs_plain": ratio, "fsync_vs_plain": ratio_fsync,
                "recorder_own_us": 1e6 * recorded.spent_s / steps["recorded"],
                "recorder_own_fsync_us": 1e6 * synced.spent_s / steps["fsync"],
                "record_bytes_per_line": size / max(1, lines), "rounds": rounds, "steps": steps}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(seconds: float = 3.0, runs: int = 1000) -> dict[str, Any]:
    load_before = os.getloadavg()
    out = {"list": measure_list(runs), "step": measure_step(seconds)}
    out["loadavg_before"], out["loadavg_after"] = load_before, os.getloadavg()
    out["cpus"] = os.cpu_count()
    return out


def table(r: dict[str, Any]) -> list[str]:
    """The figures as Markdown."""
    lst, st = r["list"], r["step"]
    return [
        f"Dashboard (`bench_watch.py`): {lst['runs']} run directories ({lst['legacy']} older ones), "
        f"{lst['bytes'] / 1e6:.1f} MB; load {r['loadavg_before'][0]:.2f} → {r['loadavg_after'][0]:.2f}.",
        "",
        "| runs list | seconds | vs reading every record in full |",
        "|---|---:|---:|",
        f"| read + parse every record file in full (reference) | {lst['full_read_s']:.3f} | 1.00 |",
        f"| `GET /`, cold (fresh app) | {lst['cold_s']:.3f} | {lst['cold_vs_full_read']:.2f} |",
        f"| `GET /`, warm (median of 7) | {lst['warm_s']:.3f} | {lst['warm_vs_full_read']:.2f} |",
        f"| `GET /` after 10 runs gained a step | {lst['after_10_changed_s']:.3f} | {lst['after_10_changed_s'] / lst['full_read_s']:.2f} |",
        f"| `GET /api/runs`, warm | {lst['api_warm_s']:.3f} | {lst['api_warm_s'] / lst['full_read_s']:.2f} |",
        "",
        "| sim step (scripted episodes) | µs/step | vs without the record |",
        "|---|---:|---:|",
        f"| without the record (reference) | {st['plain_us']:.1f} | 1.00 |",
        f"| RunRecorder | {st['recorded_us']:.1f} | {st['recorded_vs_plain']:.3f} |",
        f"| RunRecorder, fsync every step | {st['fsync_us']:.1f} | {st['fsync_vs_plain']:.2f} |",
        "",
        f"The recorder's own work: {st['recorder_own_us']:.1f} µs per step ({st['recorder_own_us'] / st['plain_us']:.1%} "
        f"of a plain step), {st['recorder_own_fsync_us']:.0f} µs with fsync; {st['record_bytes_per_line']:,.0f} bytes "
        f"per line; median of {st['rounds']} interleaved rounds.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    r = measure(args.seconds, args.runs)
    print("\n".join(table(r)))
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
