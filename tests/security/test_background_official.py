"""The initial system's official evaluation runs beside the episode (the local world's ``early_official``):
a researcher's code running at the same time sees nothing of it.

Attacked as a researcher would: a spy harness (``redteam.SPY_AGENT``: every process it can see, mounts,
``/tmp``, the environment, the model server) runs in a dev evaluation while the official trials run on the
same machine, and reports what it saw in its trajectory, which the researcher reads.
"""

from __future__ import annotations

import json
import threading
import time

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.worlds.local.redteam import SPY_AGENT, SUSPICIOUS
from rsigym_env.worlds.local.sandbox import isolation

from .test_split_indistinguishable import read_all

pytestmark = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")


def test_a_spy_running_beside_the_background_official_evaluation_sees_nothing_of_it(tmp_path, monkeypatch):
    from rsigym_env.scenario import load_scenario
    from rsigym_env.worlds.common import evaluation, idle

    # its trials start at once instead of waiting for idle cores: the two evaluations surely overlap
    monkeypatch.setattr(evaluation, "IdleGate", lambda: idle.IdleGate(min_idle_cores=0.0, window_s=0.01))
    scenario = load_scenario("local-joint-aime").model_copy(update={"official_k": 1})
    env = gym.make("RSIGym/Joint-v0", scenario=scenario, run_dir=tmp_path / "run")
    try:
        env.reset(seed=0)
        world = env.unwrapped.run.world
        official = world.benchmark.split("official", world.split)
        assert env.step({"tool": "edit_harness", "args": {"path": "agent.py", "content": SPY_AGENT}})[4]["ok"]
        job = env.step({"tool": "evaluate", "args": {"k": 1}})[4]["result"]["job"]
        sandboxes, most, done = world.evaluation.sandboxes_dir, [0], threading.Event()

        def count() -> None:  # trials alive at once, dev and official (each has a sandbox directory)
            while not done.is_set():
                most[0] = max(most[0], sum(1 for p in sandboxes.iterdir() if p.is_dir()) if sandboxes.is_dir() else 0)
                time.sleep(0.02)

        watcher = threading.Thread(target=count, daemon=True)
        watcher.start()
        env.step({"tool": "wait", "args": {"job": job}})
        done.set()
        watcher.join()
        result = env.unwrapped.run.job_results[job]
        seen = []
        for task in result.task_ids:
            text = read_all(env, f"{job}/{task}")
            seen += [line for line in text.splitlines() if line.startswith("user: {")]
        end = env.step({"tool": "submit", "args": {}})[4]
    finally:
        env.close()
    assert most[0] > world.evaluation.concurrency  # official trials ran while the spy did
    assert result.score == 1.0, result.failure_modes  # the spy answers right only when it saw no tell
    records = [json.loads(line[len("user: "):]) for line in seen]
    assert len(records) == len(result.task_ids) and all(r["tells"] == [] for r in records)
    blob = json.dumps([r["obs"] for r in records])
    for token in (*SUSPICIOUS, *(p.id for p in official)):
        assert token not in blob, token
    for problem in official:  # no official instruction anywhere it looked
        assert problem.instruction.strip() not in blob
    cmdlines = {c for r in records for c in r["obs"]["cmdlines"]}
    assert not any("check.py" in c or "/tests/" in c for c in cmdlines)  # no verifier of any other trial in sight
    assert end["initial_official_cached"] is False and 0.0 <= end["initial_score"] <= 1.0
