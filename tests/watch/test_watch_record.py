"""The run record (``rsigym_env.watch.record``) and how ``rsigym watch`` reads run directories.

Real episodes on the sim world: what the record says is checked against what the run itself
holds (its harness versions, job results, datasets, end info), a run killed with SIGKILL midway
still shows every step it made, and run directories of today's ``rsigym run`` (steps.jsonl only)
show what they hold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.baselines import make_researcher
from rsigym_env.cli import main as rsigym_main
from rsigym_env.episode import run_episode
from rsigym_env.gateway.host import StepLog, ServedRun, read_steps
from rsigym_env.watch.model import RunReader, quick_summary, summary_of
from rsigym_env.watch.record import RECORD_FILE, RunRecorder, read_record

def test_the_record_of_a_scripted_episode_holds_what_the_run_held(tmp_path: Path):
    run_dir = tmp_path / "run"
    env = gym.make("RSIGym/Joint-v0", benchmark="swe-bench-verified", ledger_path=tmp_path / "ledger.sqlite",
                   run_dir=run_dir)
    recorder = RunRecorder(env, run_dir, researcher="scripted", surface="test", run_id="r-1")
    infos = []
    result = run_episode(recorder, make_researcher("scripted"), seed=3,
                         on_step=lambda n, a, obs, info: infos.append((obs["log"], info)))
    run = recorder.unwrapped.run
    records = read_record(run_dir / RECORD_FILE)
    kinds = [r["type"] for r in records]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("step") == result.steps == len(infos)
    start = records[0]
    assert start["researcher"] == "scripted" and start["run_id"] == "r-1" and start["seed"] == 3
    assert start["scenario"]["benchmark"] == "swe-bench-verified" and start["owner"]["pid"] == os.getpid()
    assert start["harness"]["files"] == run.harness.files(run.harness.initial)

    steps = [r for r in records if r["type"] == "step"]
    for step, (log, info) in zip(steps, infos):
        assert step["log"] == log and step["tool"] == info["tool"] and step["ok"] == info["ok"]
        assert step["cost_usd"] == info["cost_usd"] and step["budget_left_usd"] == info["budget_left_usd"]
        assert step.get("error") == info.get("error")
    assert steps[-1]["spent_usd"] == pytest.approx(result.info["spend_usd"])
    assert steps[-1]["dev"][1] == pytest.approx(result.info["best_dev_score"])
    assert all(b["world_s"] >= a["world_s"] for a, b in zip(steps, steps[1:]))  # the world's clock only moves on

    # every harness version, rebuilt from the record's changes, is exactly the run's
    state = RunReader(run_dir).state()
    assert set(state.versions) == set(run.harness.versions) and len(run.harness.versions) >= 2
    for version in run.harness.versions:
        assert state.versions[version]["files"] == run.harness.files(version)
    # datasets with their samples; jobs with loss curves and per-task results
    assert set(state.datasets) == set(run.datasets)
    assert all(state.datasets[d]["preview"] == run.datasets[d].model_dump(mode="json")["preview"] for d in run.datasets)
    for job_id, value in run.job_results.items():
        job = state.jobs[job_id]
        if hasattr(value, "loss_curve"):
            assert job["result"]["loss_curve"] == value.loss_curve and job["status"] == "finished"
        elif getattr(value, "split", None) == "dev":
            assert [t["task"] for t in job["result"]["tasks"]] == value.task_ids
            assert [t["failures"] for t in job["result"]["tasks"]] == value.failures
    assert state.end == json.loads(json.dumps(run.end_info))
    scores = sorted(c["score"] for points in state.candidates.values() for c in points)
    assert scores == sorted(s for cand in run.candidates.values() for s in cand.scores)
    recorder.close()


def test_a_run_killed_midway_shows_every_step_it_made_and_is_failed(tmp_path: Path):
    run_dir = tmp_path / "killed"
    script = textwrap.dedent(f"""
        import sys, time, gymnasium as gym, rsigym_env
        from rsigym_env.watch.record import RunRecorder
        env = RunRecorder(gym.make("RSIGym/Joint-v0", benchmark="aime"), {str(run_dir)!r}, researcher="slow")
        env.reset(seed=0)
        for n in range(1, 200):
            env.step({{"tool": "read", "args": {{"ref": "harness:latest/harness.toml"}}}})
            print(n, flush=True)
            time.sleep(0.05)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 5 and time.monotonic() < deadline:
            seen = int(proc.stdout.readline() or 0)
        assert seen >= 5, "the child did not step"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    state = RunReader(run_dir).state()
    assert len(state.steps) >= seen and [s["step"] for s in state.steps] == list(range(1, len(state.steps) + 1))
    assert all(n in state.logs for n in range(1, len(state.steps) + 1))  # the text it read, every step
    row = summary_of(run_dir, stall_after_s=3600)
    assert (row["status"], row["status_note"]) == ("failed", "its process is gone")
    assert row["steps"] == len(state.steps) and row["researcher"] == "slow"

    # a line torn by a crash mid-write is skipped, and the next writer starts on a clean line
    with (run_dir / RECORD_FILE).open("ab") as f:
        f.write(b'{"type": "step", "step": 9999, "tool": "re')
    assert len(RunReader(run_dir).state().steps) == len(state.steps)
    again = RunRecorder(gym.make("RSIGym/Joint-v0", benchmark="aime"), run_dir, researcher="again")
    again.reset(seed=1)
    again.step({"tool": "read", "args": {"ref": "budget"}})
    again.close()
    lines = (run_dir / RECORD_FILE).read_bytes().split(b"\n")
    assert all(json.loads(line) for line in lines if line)  # nothing torn is left
    state = RunReader(run_dir).state()  # the last episode is shown
    assert state.meta["researcher"] == "again" and len(state.steps) == 1


def test_a_replayed_run_records_nothing_twice_and_unconfirmed_steps_are_dropped(tmp_path: Path):
    """The session service's resume: the recorder replays silently (recording=False), then goes on."""
    run_dir = tmp_path / "served"
    actions = [{"tool": "evaluate", "args": {"k": 1, "n_tasks": 5}}, {"tool": "wait", "args": {}},
               {"tool": "read", "args": {"ref": "budget"}}]

    def served(recording: bool) -> tuple[ServedRun, RunRecorder, StepLog]:
        env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=50)
        recorder = RunRecorder(env, run_dir, researcher="agent", surface="rsigym serve", recording=recording)
        log = StepLog(recorder, run_dir / "steps.jsonl", recording=recording)
        return ServedRun(log, seed=4), recorder, log

    first, recorder, _ = served(True)
    for a in actions:
        first.call(a["tool"], a["args"])
    # a crash after the record line of a 4th step but before its steps.jsonl line
    recorder.step({"tool": "read", "args": {"ref": "jobs"}})
    first.shutdown()
    recorder.close_file()
    assert len(read_steps(run_dir / "steps.jsonl")) == 3 and len(RunReader(run_dir).state().steps) == 4

    again, recorder2, log2 = served(False)  # replay the 3 confirmed steps without writing
    for a in actions:
        again.call(a["tool"], a["args"])
    log2.recording = recorder2.recording = True
    again.call("submit", {})
    again.close()
    records = read_record(run_dir / RECORD_FILE)
    assert [r["type"] for r in records].count("start") == 1
    resume = next(r for r in records if r["type"] == "resume")
    assert resume["after_step"] == 3 and resume["owner"]["pid"] == os.getpid()
    state = RunReader(run_dir).state()
    assert [s["tool"] for s in state.steps] == ["evaluate", "wait", "read", "submit"]  # the unconfirmed read is gone
    assert state.end is not None and state.jobs["job-1"]["status"] == "finished"
    assert summary_of(run_dir)["steps"] == 4 and summary_of(run_dir)["status"] == "finished"


def test_older_run_directories_show_what_they_hold(tmp_path: Path):
    run_dir = tmp_path / "legacy"
    assert rsigym_main(["run", "--benchmark", "gpqa-diamond", "--seed", "1", "--run-dir", str(run_dir), "-q"]) == 0
    assert (run_dir / RECORD_FILE).exists()  # rsigym run writes the run record ...
    (run_dir / RECORD_FILE).unlink()          # ... which run directories of older versions do not have
    result = json.loads((run_dir / "result.json").read_text())
    lines = read_steps(run_dir / "steps.jsonl")
    row = summary_of(run_dir)
    assert row["status"] == "finished" and row["steps"] == len(lines) == result["steps"]
    assert row["researcher"] == "scripted" and row["world"] == "sim" and row["benchmark"] == "gpqa-diamond"
    assert row["gain"] == pytest.approx(result["reward"]) and row["best_dev"] == pytest.approx(result["info"]["best_dev_score"])
    assert row["spent_usd"] == pytest.approx(result["info"]["spend_usd"])
    state = RunReader(run_dir).state()
    assert state.legacy and len(state.steps) == len(lines)
    assert state.steps[-1]["spent_usd"] == pytest.approx(sum(line["info"]["cost_usd"] for line in lines))
    events = [e for line in lines for e in line["info"].get("events", []) if e.get("kind") == "evaluate"]
    assert sorted(c["score"] for v in state.candidates.values() for c in v) == sorted(e["score"] for e in events)
    assert state.end["normalized_gain"] == pytest.approx(result["reward"])
    assert any(v.get("files") is None for v in state.versions.values())  # edits known, contents not recorded


def test_the_list_row_from_the_record_s_ends_equals_the_full_read(tmp_path: Path):
    for i, (bench, agent) in enumerate([("aime", "scripted"), ("skillsbench", "random")]):
        run_dir = tmp_path / f"r{i}"
        env = RunRecorder(gym.make("RSIGym/Joint-v0", benchmark=bench, run_dir=run_dir), run_dir, researcher=agent)
        run_episode(env, make_researcher(agent), seed=i)
        env.close()
        now = time.time()
        quick = summary_of(run_dir, now=now)
        full = summary_of(run_dir, reader=RunReader(run_dir), now=now)
        assert quick_summary(run_dir) is not None
        assert quick == full and quick["status"] == "finished" and quick["steps"] > 0


def test_a_run_without_steps_for_a_while_is_stalled(tmp_path: Path):
    run_dir = tmp_path / "idle"
    env = RunRecorder(gym.make("RSIGym/Joint-v0", benchmark="aime"), run_dir, researcher="thinker")
    env.reset(seed=0)
    env.step({"tool": "evaluate", "args": {"k": 1}})
    last = RunReader(run_dir).state().last_t
    assert summary_of(run_dir, stall_after_s=60, now=last + 30)["status"] == "running"
    row = summary_of(run_dir, stall_after_s=60, now=last + 600)
    assert (row["status"], row["status_note"]) == ("stalled", "no step for 10 min")
    assert row["reserved_usd"] > 0  # the evaluation's money is held while it runs
    env.close()
