"""Issue 11, item 4: one cheap call cannot exhaust the host.

Attacked through the public API: a ``transform_data`` script that writes 200 MB of rows, many
processes that together want more memory than the sandbox has, a command that fills the disk,
and a harness that does both inside an evaluation trial. The sandbox's aggregate limits (memory,
processes, disk) hold, the host process stays small, and quotes never read whole datasets.
"""

from __future__ import annotations

import resource
import textwrap

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.scenario import load_scenario
from rsigym_env.worlds.local.sandbox import isolation

pytestmark = [pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here"),
              pytest.mark.slow]

HOG = "python3 -c 'b = bytearray({mb} << 20); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; import time; time.sleep(3)'"


def local_env(tmp_path, memory_gib: float = 2.0, disk_gib: float = 0.25):
    scenario = load_scenario("local-joint-aime")
    sandbox = scenario.permissions.sandbox.model_copy(update={"memory_gib": memory_gib, "disk_gib": disk_gib})
    scenario = scenario.model_copy(update={"permissions": scenario.permissions.model_copy(update={"sandbox": sandbox}),
                                           "official_k": 1})
    env = gym.make("RSIGym/Joint-v0", scenario=scenario, run_dir=tmp_path / "run")
    env.reset(seed=0)
    return env


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_huge_transform_output_is_refused_without_loading_it(tmp_path):
    env = local_env(tmp_path)
    try:
        assert env.step({"tool": "generate_data", "args": {"teacher": "teacher-small", "n_examples": 4}})[4]["ok"]
        before = peak_rss_mb()
        row = '{"messages": [{"role": "user", "content": "' + "x" * 1000 + '"}]}'
        script = f"python3 -c 'import sys\nrow = sys.argv[1] + chr(10)\nopen(\"/data/out.jsonl\", \"w\").write(row * 200000)' '{row}'"
        info = env.step({"tool": "transform_data", "args": {"operation": "script", "datasets": ["ds-1"], "script": script}})[4]
        assert info["error"] == "dataset_too_large" and info["cost_usd"] > 0, info
        assert peak_rss_mb() - before < 100  # 200 MB was never held by the host process
        assert env.step({"tool": "read", "args": {"ref": "budget"}})[4]["ok"]   # later calls answer at once
    finally:
        env.close()


def test_processes_together_cannot_take_more_memory_than_the_sandbox(tmp_path):
    env = local_env(tmp_path, memory_gib=1.0)
    try:
        command = " & ".join([HOG.format(mb=700)] * 6) + " & wait; echo done"
        obs, _, _, _, info = env.step({"tool": "sandbox_exec", "args": {"command": command, "timeout_s": 60}})
        assert info["ok"], info
        group = env.unwrapped.run.world.sandbox.group
        assert group.mode != "rlimits"  # a real cgroup on this machine
        assert group.usage().memory_peak_bytes <= (1 << 30) + (16 << 20)
        assert "Killed" in obs["log"] or "memory" in obs["log"].lower()
    finally:
        env.close()


def test_a_disk_hog_stops_at_the_sandbox_quota(tmp_path):
    env = local_env(tmp_path, disk_gib=0.25)
    try:
        obs, _, _, _, info = env.step({"tool": "sandbox_exec", "args": {
            "command": "for i in $(seq 1 13); do head -c 100000000 /dev/zero > f$i || break; done; du -sm /app", "timeout_s": 60}})
        assert info["ok"] and "No space left" in obs["log"], obs["log"][-500:]
        group = env.unwrapped.run.world.sandbox.group
        assert group.usage().disk_bytes <= 256 << 20
    finally:
        env.close()


def test_quotes_do_not_read_the_dataset(tmp_path):
    env = local_env(tmp_path)
    try:
        assert env.step({"tool": "generate_data", "args": {"teacher": "teacher-small", "n_examples": 4}})[4]["ok"]
        run = env.unwrapped.run
        run.world.dataset_path("ds-1").unlink()  # gone from disk: a quote that read it would fail
        quote = run.world.train.quote(rsigym_env.tools.Train(dataset="ds-1", num_epochs=2))
        assert quote.usd > 0
    finally:
        env.close()


def test_a_harness_cannot_exhaust_the_host_from_an_evaluation(tmp_path):
    hog = textwrap.dedent(f'''
        import json, subprocess
        procs = [subprocess.Popen(["bash", "-c", {HOG.format(mb=700)!r}]) for _ in range(4)]
        subprocess.run(["bash", "-c", "head -c 900000000 /dev/zero > /app/fill; head -c 900000000 /dev/zero > /logs/agent/fill"])
        for p in procs:
            p.wait()
        json.dump({{"end_reason": "done", "steps": []}}, open("/logs/agent/trajectory.json", "w"))
    ''')
    env = local_env(tmp_path)
    try:
        before = peak_rss_mb()
        assert env.step({"tool": "edit_harness", "args": {"path": "agent.py", "content": hog}})[4]["ok"]
        job = env.step({"tool": "evaluate", "args": {"k": 1, "n_tasks": 2}})[4]["result"]["job"]
        env.step({"tool": "wait", "args": {"job": job}})
        result = env.unwrapped.run.job_results[job]
        assert result.score == 0.0 and peak_rss_mb() - before < 100
        kept = sum(p.stat().st_size for p in (tmp_path / "run" / "evals" / job).rglob("*") if p.is_file())
        assert kept < 2 * 3 * (8 << 20) + (8 << 20)  # at most 8 MB per log directory per trial is kept
    finally:
        env.close()


def test_evaluation_logs_stay_under_the_run_quota(tmp_path):
    """Dev evaluations keep their trials' logs until the run's quota; then the oldest are deleted, scores kept."""
    import os
    import time

    from rsigym_env.prices import DEFAULT_PRICES
    from rsigym_env.worlds.local.harbor.evaluation import LocalEvalService

    evals = tmp_path / "evals"
    for i in (1, 2, 3):
        (evals / f"job-{i}" / "harbor" / "t").mkdir(parents=True)
        (evals / f"job-{i}" / "harbor" / "t" / "log").write_bytes(b"x" * 1000)
        (evals / f"job-{i}" / "summary.json").write_text("{}")
        os.utime(evals / f"job-{i}", (time.time() + i, time.time() + i))
    svc = LocalEvalService(model_for=lambda c: None, tasks={}, run_dir=evals, prices=DEFAULT_PRICES,
                           private_dir=tmp_path / "private", logs_quota_bytes=2500)
    try:
        assert svc.prune_logs() == 1000
    finally:
        svc.close()
    assert not (evals / "job-1" / "harbor").exists() and (evals / "job-1" / "summary.json").exists()
    assert (evals / "job-1" / "PRUNED").exists() and (evals / "job-3" / "harbor" / "t" / "log").exists()
