"""The main process's per-trial work in Harbor evaluations (bench/README.md, round 7): host transfers on the event
loop when small, a phase's mount skeleton made once, Harbor's per-trial progress writes skipped, the sandbox's system
options looked up once — none of it changes what a trial sees, does or scores."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest

from rsigym_env.worlds.common import evaluation
from rsigym_env.worlds.local.harbor import environment
from rsigym_env.worlds.local.sandbox import isolation

from test_harbor_local import make_tasks, reward, run_job

pytestmark = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")


def test_small_transfers_run_on_the_event_loop_and_large_ones_in_a_thread(tmp_path, monkeypatch):
    small, large = tmp_path / "small", tmp_path / "large"
    for d, n in ((small, 3), (large, 5)):
        (d / "sub").mkdir(parents=True)
        for i in range(n):
            (d / "sub" / f"f{i}").write_text("x")
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (environment.INLINE_MAX_FILE_BYTES + 1))
    monkeypatch.setattr(environment, "INLINE_MAX_ENTRIES", 4)
    seen = {}

    async def go():
        loop_thread = threading.get_ident()
        for name, path in (("small", small), ("large", large), ("file", small / "sub" / "f0"), ("big", big),
                           ("missing", tmp_path / "nope")):
            seen[name] = await environment._host_io(path, threading.get_ident) == loop_thread
    asyncio.run(go())
    # small: 4 entries (sub + 3 files) at the limit; large: 6 entries; a file over 1 MiB; a missing source fails inline
    assert seen == {"small": True, "large": False, "file": True, "big": False, "missing": True}
    assert environment.few_entries(small, limit=4) and not environment.few_entries(large, limit=5)


def test_a_phase_mount_skeleton_is_made_once_and_the_verifier_phase_adds_its_points(tmp_path):
    from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    task = make_tasks(tmp_path / "tasks", {"t-add": 42}) / "t-add"
    paths = TrialPaths(trial_dir=tmp_path / "trial")
    paths.mkdir()
    env = environment.BubblewrapEnvironment(task / "environment", "t-add", "t-add__x__env", paths,
                                            TaskEnvironmentConfig())
    changes = []

    def skeleton() -> tuple[list[str], int]:
        base = env.root / "skeleton" / "logs"
        return sorted(p.name for p in base.iterdir()), os.stat(base).st_ctime_ns

    async def go():
        await env.start(force_build=False)
        outs = [await env.exec("ls /logs; echo a > /logs/agent/a.txt")]
        changes.append(skeleton())
        outs.append(await env.exec("ls /logs"))
        changes.append(skeleton())
        await env.upload_dir(task / "tests", "/tests")
        outs.append(await env.exec("ls /logs; cat /tests/expected.txt"))
        changes.append(skeleton())
        outs.append(await env.exec("ls /logs"))
        changes.append(skeleton())
        await env.stop(delete=True)
        return outs

    outs = asyncio.run(go())
    assert [o.return_code for o in outs] == [0] * 4
    assert outs[0].stdout == outs[1].stdout == "agent\nartifacts\n"
    assert outs[2].stdout == "agent\nartifacts\nverifier\n42\n" and outs[3].stdout == "agent\nartifacts\nverifier\n"
    # made once per phase: a second command of the same phase does not touch it (its ctime would move with a chmod)
    assert changes[0] == changes[1] and changes[2] == changes[3] and changes[1][1] != changes[2][1]


def test_the_system_part_of_a_sandbox_command_line_is_what_a_fresh_lookup_gives():
    isolation._system_options()
    assert isolation._system_options() == isolation._system_options.__wrapped__()
    argv = isolation._bwrap_options(workdir=Path("/tmp"), cwd="/app", mounts=(), env=None, network=False,
                                    limits=isolation.Limits(), uid=os.geteuid())
    system, _ = isolation._system_options()
    assert tuple(argv[9:9 + len(system)]) == system  # after the namespace options and --unshare-net


def test_a_harbor_job_writes_its_progress_file_when_it_starts_and_ends_only(tmp_path, monkeypatch):
    from harbor.job import Job

    evaluation.tune_harbor()
    writes = []
    write = Job._write_job_result

    def counted(self, *, exclude_trial_results: bool = False) -> None:
        writes.append(exclude_trial_results)
        write(self, exclude_trial_results=exclude_trial_results)

    monkeypatch.setattr(Job, "_write_job_result", counted)
    results, _ = run_job(tmp_path, make_tasks(tmp_path / "tasks"), "normal", k=2)
    assert [reward(r) for r in results] == [1.0] * 6
    assert writes == [True, True]  # Harbor's own would also write at each of the 6 trials' start and end
    job = json.loads(next((tmp_path / "jobs-normal").glob("*/result.json")).read_text())
    assert job["finished_at"] is not None and job["n_total_trials"] == 6
    assert job["stats"]["n_completed_trials"] == 6 and job["stats"]["n_running_trials"] == 0
