"""Issue 11, item 5: every use of compute is billed, no failure loses work, loose input is refused.

Attacked as a researcher would: scripts that fail after burning CPU, submissions that cannot be
evaluated (harness paths like ``.``, NUL, files shadowing directories), a submit while jobs are
running or just finished, and loosely typed arguments.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.worlds.local.sandbox import isolation

BAD_PATHS = [".", "./x", "a//b", "/abs", "../up", "a/../b", "dir/", "a\x00b", "tab\tname", ".hidden", "-rf",
             "x" * 300, "a/" * 9 + "b", "", " ", "a b", "é"]


def sim_env(**kwargs):
    env = gym.make("RSIGym/Joint-v0", world="sim", benchmark="aime", budget_usd=500, **kwargs)
    env.reset(seed=0)
    return env


@pytest.mark.parametrize("path", BAD_PATHS)
def test_harness_paths_that_cannot_exist_are_refused_at_edit(path):
    env = sim_env()
    obs, _, _, _, info = env.step({"tool": "edit_harness", "args": {"path": path, "content": "x"}})
    assert info["error"] == "invalid_args" and info["cost_usd"] == 0.0, info


def test_files_shadowing_directories_are_refused():
    env = sim_env()
    assert env.step({"tool": "edit_harness", "args": {"path": "skills/run.py", "content": "x"}})[4]["ok"]
    for path in ("skills", "skills/run.py/deeper"):
        info = env.step({"tool": "edit_harness", "args": {"path": path, "content": "y"}})[4]
        assert info["error"] == "invalid_args", (path, info)


@pytest.mark.parametrize("args", [{"k": True}, {"k": "2"}, {"k": 2.0}, {"k": None}, {"n_tasks": "3"},
                                  {"checkpoint": 1}, {"harness": ["latest"]}])
def test_loose_coercions_are_refused(args):
    env = sim_env()
    info = env.step({"tool": "evaluate", "args": args})[4]
    assert info["error"] == "invalid_args" and info["cost_usd"] == 0.0, (args, info)


def test_an_unevaluable_submission_is_refused_before_anything_runs_and_loses_nothing():
    env = sim_env()
    run = env.unwrapped.run
    env.step({"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 200}})
    train = env.step({"tool": "train", "args": {"dataset": "ds-1"}})[4]["result"]
    spent = run.balance.spent_usd
    info = env.step({"tool": "submit", "args": {"checkpoint": train["checkpoint"]}})[4]  # not ready yet
    assert info["error"] == "unknown_ref" and not info.get("terminated") and run.end_info is None
    info = env.step({"tool": "submit", "args": {"harness": "h-nonexistent"}})[4]
    assert info["error"] == "unknown_ref"
    assert train["job"] in run.running and run.balance.spent_usd == spent  # the job goes on, nothing was charged


def test_submit_keeps_a_job_that_finished_and_bills_running_ones_for_what_ran():
    env = sim_env()
    run = env.unwrapped.run
    env.step({"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 200}})
    first = env.step({"tool": "train", "args": {"dataset": "ds-1"}})[4]["result"]
    env.step({"tool": "wait", "args": {"job": first["job"]}})
    second = env.step({"tool": "train", "args": {"dataset": "ds-1", "num_epochs": 3}})[4]["result"]
    before = run.balance.reserved_usd
    assert before > 0
    end = env.step({"tool": "submit", "args": {"checkpoint": first["checkpoint"]}})[4]
    assert end["submitted"]["checkpoint"] == first["checkpoint"] and first["checkpoint"] in run.checkpoints
    assert run.balance.reserved_usd == 0.0                       # nothing stays reserved
    assert run.job_results[second["job"]]["cost_usd"] >= 0.0     # the running one was settled, not dropped


@pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")
def test_failing_scripts_are_billed_for_the_compute_they_used(tmp_path):
    env = gym.make("RSIGym/Joint-v0", world="local", benchmark="aime", run_dir=tmp_path / "run")
    try:
        env.reset(seed=0)
        assert env.step({"tool": "generate_data", "args": {"teacher": "teacher-small", "n_examples": 4}})[4]["ok"]
        burn = "python3 -c 'import time; t = time.time()\nwhile time.time() - t < 2: pass'; exit 3"
        for script in (burn, burn.replace("exit 3", "echo not-json > /data/out.jsonl"),
                       burn.replace("exit 3", "mkfifo /data/out.jsonl")):
            obs, _, _, _, info = env.step({"tool": "transform_data",
                                           "args": {"operation": "script", "datasets": ["ds-1"], "script": script}})
            assert not info["ok"] and info["error"] in ("script_failed", "invalid_dataset"), info
            # two seconds of a 2-vCPU, 2-GiB sandbox at E2B's rates, and never more than the quote
            assert info["cost_usd"] >= 2 * (2 * 0.000014 + 2 * 0.0000045) * 0.9, info
            assert "charged" in obs["log"]
        bal = env.unwrapped.run.balance
        assert bal.reserved_usd == 0.0 and bal.spent_usd > 0
    finally:
        env.close()
