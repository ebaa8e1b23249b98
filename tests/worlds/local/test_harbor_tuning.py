"""The main process's per-trial work in Harbor evaluations (bench/README.md, round 7): host transfers on the event
loop when small, a phase's mount skeleton made once, Harbor's per-trial progress writes skipped, the sandbox's system
options looked up once, and official trial directories in RAM when there is room for them — none of it changes what
a trial sees, does or scores."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from pathlib import Path

import pytest

from rsigym_env.prices import DEFAULT_PRICES
from rsigym_env.services import EvalRequest
from rsigym_env.worlds.common import evaluation
from rsigym_env.worlds.local.harbor import environment
from rsigym_env.worlds.local.harbor.evaluation import LocalEvalService
from rsigym_env.worlds.local.sandbox import isolation

from test_harbor_local import SolverModel, harness, make_tasks, reward, run_job

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


# ------------------------------------------------------------------ official trial directories in RAM

shm = pytest.mark.skipif(not evaluation._is_tmpfs(evaluation.SCRATCH_ROOT), reason="no tmpfs at /dev/shm here")


@shm
def test_scratch_sets_room_aside_and_falls_back_to_the_disk_loudly(monkeypatch, caplog):
    monkeypatch.setattr(evaluation, "_scratch_warned", set())
    monkeypatch.delenv(evaluation.SCRATCH_ENV, raising=False)
    assert evaluation.Scratch().take(1) is None  # off by default
    monkeypatch.setenv(evaluation.SCRATCH_ENV, "ram")
    scratch = evaluation.Scratch()
    free = os.statvfs(evaluation.SCRATCH_ROOT)
    room = free.f_bavail * free.f_frsize - evaluation.SCRATCH_MARGIN_BYTES
    try:
        first = scratch.take(room // 2 + 1)
        assert first is not None and first.parent == evaluation.SCRATCH_ROOT and (first.stat().st_mode & 0o777) == 0o700
        with caplog.at_level(logging.WARNING, logger="rsigym_env.evaluation"):
            assert scratch.take(room // 2 + 1) is None  # what the first took is not there for a second
        assert "go to the disk" in caplog.text
        scratch.give_back(room // 2 + 1)
        assert scratch.take(room // 2 + 1) == first
    finally:
        scratch.close()
    assert not first.exists()
    with caplog.at_level(logging.WARNING, logger="rsigym_env.evaluation"):
        assert evaluation.Scratch(root=Path("/proc")).take(1) is None  # not a tmpfs
    assert "/proc is not a tmpfs" in caplog.text
    monkeypatch.setenv(evaluation.SCRATCH_ENV, "disk")
    assert evaluation.Scratch().take(1) is None


@shm
def test_scratch_left_by_a_dead_process_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv(evaluation.SCRATCH_ENV, "ram")
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    left = evaluation.SCRATCH_ROOT / f"{evaluation.SCRATCH_PREFIX}{pid}-test"
    mine = evaluation.SCRATCH_ROOT / f"{evaluation.SCRATCH_PREFIX}{os.getpid()}-test"
    other = evaluation.SCRATCH_ROOT / f"rsigym-other-{pid}-test"
    for d in (left, mine, other):
        (d / "official-1").mkdir(parents=True, exist_ok=True)
    try:
        scratch = evaluation.Scratch()
        assert scratch.take(1) is not None
        scratch.close()
        assert not left.exists() and mine.exists() and other.exists()
    finally:
        for d in (left, mine, other):
            import shutil

            shutil.rmtree(d, ignore_errors=True)


@shm
def test_an_official_evaluation_in_ram_scores_as_on_disk_and_leaves_nothing(tmp_path, monkeypatch):
    tasks = {"dev": make_tasks(tmp_path / "dev"), "official": make_tasks(tmp_path / "official", {"o-1": 11, "o-2": 12})}
    where: list[Path] = []
    discard = evaluation.discard_private
    monkeypatch.setattr(evaluation, "discard_private", lambda path: (where.append(path), discard(path)))
    scores, dirs = [], []
    for mode in ("ram", "disk"):
        monkeypatch.setenv(evaluation.SCRATCH_ENV, mode)
        svc = LocalEvalService(model_for=lambda c: SolverModel(0.5), tasks=tasks, run_dir=tmp_path / mode / "evals",
                               prices=DEFAULT_PRICES)  # a private directory of its own
        try:
            got = svc.official(EvalRequest(checkpoint="base", harness_version="v1", harness_files=harness(),
                                           split="official", k=2))
            dirs.append((svc.private_dir, svc._scratch._dir))
        finally:
            svc.close()
        scores.append((got.value.score, got.value.rewards, got.value.failures))
        assert not svc.private_dir.exists() and (svc._scratch._dir is None)
    assert scores[0] == scores[1]
    (ram_private, ram), (disk_private, disk_scratch) = dirs
    assert where[0].parent == ram and ram.parent == evaluation.SCRATCH_ROOT and not ram.exists()
    assert where[1].parent == disk_private and disk_scratch is None
    assert not where[0].exists() and not where[1].exists()
