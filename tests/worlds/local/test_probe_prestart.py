"""Issue 27, item 2: the probe of code under test started ahead (``prestart_probe``).

When the verifier phase of a code task begins, the trial's environment starts the probe's sandbox and
interpreter at once; the verifier's request then only copies ``/app`` in and hands the request to it. It
must give what a probe started at the request gives, byte for byte (exit code, output, the limit named),
for correct, wrong and hostile code under test, with its limits running from the request, and leave the
trial's later commands as they would have been. Each arm runs the same requests against a fresh trial.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from rsigym_env.worlds.local.sandbox import isolation

pytestmark = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")

os.environ.setdefault("HARBOR_TELEMETRY", "0")

# code under test (calc.py), keyed by what it does
HOSTILE = {
    "loops": "def __getattr__(name):\n    def f(*a):\n        while True:\n            pass\n    return f\n",
    "sleeps_at_import": "import time\ntime.sleep(30)\n",
    "memory": "x = bytearray(2 ** 30)\n",
    "threads": "import threading, time\nts = [threading.Thread(target=time.sleep, args=(1,)) for _ in range(200)]\n"
               "[t.start() for t in ts]\n",
    "kills_its_sandbox": "import os, signal\nos.kill(1, signal.SIGKILL)\nos.killpg(0, signal.SIGKILL)\n",
    "exits_early": "import os\nos._exit(3)\n",
    "fake_results": "import json, os, sys\nsys.stdout.write('\\n' + json.dumps({'results': [['value', 1]] * 5}) + '\\n')\n"
                    "sys.stdout.flush()\nos._exit(0)\n",
    "writes_app_and_tmp": "import os\nopen('/app/left.txt', 'w').write('x')\nopen('/tmp/t', 'w').write('y')\n"
                          "print(sorted(os.listdir('/app')), os.getuid() == os.stat('/app/calc.py').st_uid)\n",
    "reads_proc_and_env": "import os\nprint(sorted(os.listdir('/proc'))[:3], os.getppid(), os.environ.get('PYTHONDONTWRITEBYTECODE'))\n",
}


@pytest.fixture(scope="module")
def code_tasks(tmp_path_factory) -> list[Path]:
    from rsigym_env.worlds.common.evaluation import list_tasks
    from rsigym_env.worlds.local import benchmarks

    dirs = benchmarks.resolve("local-code").build(tmp_path_factory.mktemp("tasks"))
    return list_tasks(dirs["dev"])[:3]


def _environment(task: Path, trial: Path, prestart: bool):
    from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from rsigym_env.worlds.local.harbor.environment import BubblewrapEnvironment

    paths = TrialPaths(trial_dir=trial)
    paths.mkdir()
    return BubblewrapEnvironment(task / "environment", task.name, f"{task.name}__{trial.name}", paths,
                                 TaskEnvironmentConfig(), prestart_probe=prestart), paths


def _request(timeout_s: float = 10.0) -> bytes:
    from rsigym_env.worlds.local.harbor.environment import PROBE_ARGV

    stdin = json.dumps({"module": "calc", "calls": [["fold", [1]], ["span", [2, 3]]], "app": "/app"})
    return json.dumps({"argv": list(PROBE_ARGV), "stdin": stdin, "timeout_s": timeout_s}).encode() + b"\n"


def _trial(task: Path, trial: Path, prestart: bool, calc: str | None = None, solve: bool = False,
           requests: tuple[bytes, ...] = (), pause_s: float = 0.0) -> dict:
    """One trial: the agent phase leaves ``calc`` (or the reference fix), then the verifier phase runs the
    given probe requests directly (after ``pause_s``), then Harbor's verifier command; what came back."""
    env, paths = _environment(task, trial, prestart)

    async def go() -> dict:
        out: dict = {"probes": []}
        await env.start(force_build=False)
        try:
            if solve:
                await env.upload_dir(task / "solution", "/solution")
                assert (await env.exec("bash /solution/solve.sh")).return_code == 0
            if calc is not None:
                (env.app_dir / "calc.py").write_text(calc)
            await env.upload_dir(task / "tests", "/tests")  # the verifier phase begins
            out["started_ahead"] = env._ready_probe is not None
            await asyncio.sleep(pause_s)
            for line in requests:
                reply = await env._run_probe(line)
                out["probes"].append({k: reply[k] for k in ("exit_code", "stdout", "stderr", "limit")})
            out["left_ahead"] = env._ready_probe is not None
            verify = await env.exec("bash /tests/test.sh")
            out["verify"] = [verify.return_code, verify.stdout, verify.stderr]
            out["used_by_verifier"] = out["left_ahead"] and env._ready_probe is None
            out["reward"] = (env.host_path("/logs/verifier") / "reward.txt").read_text()
            out["app"] = sorted(p.name for p in env.app_dir.iterdir())
        finally:
            await env.stop(delete=True)
        out["root_gone"] = not env.root.exists()
        return out

    return asyncio.run(go())


def _both(task: Path, tmp_path: Path, name: str, **kwargs) -> tuple[dict, dict]:
    off = _trial(task, tmp_path / f"{name}-off", False, **kwargs)
    on = _trial(task, tmp_path / f"{name}-on", True, **kwargs)
    return off, on


def _same(off: dict, on: dict) -> None:
    keys = ("probes", "verify", "reward", "app", "root_gone")
    assert {k: off[k] for k in keys} == {k: on[k] for k in keys}
    assert on["started_ahead"] and not off["started_ahead"]
    # the first request took it: one made here, else the verifier's own (check.py's)
    assert not on["left_ahead"] if on["probes"] else on["used_by_verifier"]


def test_verifier_results_identical_with_and_without_the_probe_started_ahead(code_tasks, tmp_path):
    """The task as given (a bug), the reference fix, on three tasks: the same rewards, probe replies and files."""
    rewards = []
    for i, task in enumerate(code_tasks):
        for solve in (False, True):
            off, on = _both(task, tmp_path, f"{i}-{solve}", solve=solve)
            _same(off, on)
            rewards.append(off["reward"])
        off, on = _both(task, tmp_path, f"{i}-direct", requests=(_request(),))
        _same(off, on)
        assert off["probes"][0]["exit_code"] == 0 and '"results"' in off["probes"][0]["stdout"]
    assert rewards.count("1\n") == len(code_tasks) and rewards.count("0\n") == len(code_tasks)


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_hostile_code_under_test_gives_the_same_reply_and_leaves_the_trial_as_without(attack, code_tasks, tmp_path):
    """Each attack: the first request (the probe started ahead, on the "on" arm) and a second one (a fresh
    probe in both arms) reply the same, with the limit named; the verifier afterwards is unaffected."""
    timeout = 1.5 if attack in ("loops", "sleeps_at_import") else 10.0
    off, on = _both(code_tasks[0], tmp_path, attack, calc=HOSTILE[attack],
                    requests=(_request(timeout), _request(timeout)))
    _same(off, on)
    first = on["probes"][0]
    if attack in ("loops", "sleeps_at_import"):
        assert first["limit"] == "wall" and first["exit_code"] == isolation.WALL_EXIT
    if attack in ("memory", "threads"):  # refused by the probe's own limits (address space, processes)
        error = {"memory": "MemoryError", "threads": "RuntimeError"}[attack]
        assert json.loads(first["stdout"].strip().splitlines()[-1]) == {"import_error": error}
    if attack == "writes_app_and_tmp":
        assert "True" in first["stdout"]  # the copied files belong to the sandbox's user, as in a fresh probe
    assert on["reward"] == "0\n"


def test_the_limit_of_a_probe_started_ahead_runs_from_its_request(code_tasks, tmp_path):
    """Started, then idle for longer than the request's wall-clock limit: the probe still runs its whole
    limit from the request (a loop is stopped ~1 s after it, not at once), and a quick one is not cut."""
    pause = 1.5
    ok = _trial(code_tasks[0], tmp_path / "ok", True, requests=(_request(1.0),), pause_s=pause)
    assert ok["started_ahead"] and ok["probes"][0]["limit"] is None and ok["probes"][0]["exit_code"] == 0
    env, _ = _environment(code_tasks[0], tmp_path / "loop", True)

    async def go() -> tuple[float, dict]:
        await env.start(force_build=False)
        try:
            (env.app_dir / "calc.py").write_text(HOSTILE["loops"])
            await env.upload_dir(code_tasks[0] / "tests", "/tests")
            await asyncio.sleep(pause)
            t = time.monotonic()
            reply = await env._run_probe(_request(1.0))
            return time.monotonic() - t, reply
        finally:
            await env.stop(delete=True)

    took, reply = asyncio.run(go())
    assert reply["limit"] == "wall" and took >= 1.0


def test_an_unused_probe_started_ahead_is_killed_and_removed_with_the_trial(code_tasks, tmp_path):
    env, paths = _environment(code_tasks[0], tmp_path / "trial", True)

    async def go() -> tuple[int, bool]:
        await env.start(force_build=False)
        await env.upload_dir(code_tasks[0] / "tests", "/tests")
        work, proc = env._ready_probe
        assert proc.running and work.is_dir()
        await env.stop(delete=True)
        return proc.running, work.exists()

    running, exists = asyncio.run(go())
    assert not running and not exists and not env.root.exists()
    assert json.loads((paths.trial_dir / "sandbox.json").read_text())["commands"] == 0  # it was never a command


def test_only_code_tasks_start_a_probe_ahead_and_a_different_command_gets_a_fresh_one(code_tasks, tmp_path):
    """A task whose hidden data is not a "calls" one starts nothing; a request for another command than the
    one started ahead runs in a fresh sandbox, as without it."""
    task = tmp_path / "answer-task"
    shutil.copytree(code_tasks[0], task)
    (task / "tests" / "expected.json").write_text(json.dumps({"kind": "answer", "answer": "4"}))
    env, _ = _environment(task, tmp_path / "t1", True)
    env2, _ = _environment(code_tasks[0], tmp_path / "t2", True)
    other = json.dumps({"argv": ["python3", "-I", "-c", "print(6 * 7)"], "stdin": "-", "timeout_s": 5}).encode() + b"\n"

    async def go() -> tuple[bool, dict]:
        await env.start(force_build=False)
        await env.upload_dir(task / "tests", "/tests")
        ahead = env._ready_probe is not None
        await env.stop(delete=True)
        await env2.start(force_build=False)
        try:
            await env2.upload_dir(code_tasks[0] / "tests", "/tests")
            reply = await env2._run_probe(other)
            assert env2._ready_probe is None
        finally:
            await env2.stop(delete=True)
        return ahead, reply

    ahead, reply = asyncio.run(go())
    assert not ahead and reply["stdout"] == "42\n" and reply["exit_code"] == 0


@pytest.mark.slow
def test_dev_evaluation_identical_with_and_without_it_under_different_concurrency(tmp_path):
    """The real minimal harness and a teacher that errs on ~40% of episodes, 6 code tasks × k = 2: the rewards and
    failure modes of each attempt are the same with the probe started ahead or not, 1 or 3 trials at a time."""
    from rsigym_env.prices import DEFAULT_PRICES
    from rsigym_env.services import EvalRequest
    from rsigym_env.worlds.common.harness import minimal_harness
    from rsigym_env.worlds.local import benchmarks
    from rsigym_env.worlds.local.harbor.evaluation import LocalEvalService
    from rsigym_env.worlds.local.teachers import TeacherModel

    dirs = benchmarks.resolve("local-code").build(tmp_path / "tasks")
    results = {}
    for prestart, concurrency in ((False, 3), (True, 3), (True, 1)):
        name = f"{prestart}-{concurrency}"
        svc = LocalEvalService(model_for=lambda c: TeacherModel("teacher", 0.6), tasks=dirs, concurrency=concurrency,
                               run_dir=tmp_path / f"evals-{name}", prices=DEFAULT_PRICES,
                               private_dir=tmp_path / f"private-{name}",
                               environment_kwargs={"prestart_probe": prestart})
        try:
            billed = svc.start(EvalRequest(checkpoint="base", harness_version="v0", harness_files=minimal_harness(),
                                           k=2, n_tasks=6), "ev-1").future.result(timeout=300)
        finally:
            svc.close()
        results[name] = (billed.value.task_ids, billed.value.rewards, billed.value.failures)
    assert results["False-3"] == results["True-3"] == results["True-1"]
    rewards = [r for task in results["True-3"][1] for r in task]
    assert 0 < sum(rewards) < len(rewards)  # some attempts fixed the code, some did not


@pytest.mark.parametrize("prestart", [True, False])
def test_the_probe_copies_and_removes_a_small_app_on_the_event_loop_and_a_large_one_in_a_thread(code_tasks, tmp_path,
                                                                                               monkeypatch, prestart):
    """(bench/README.md, round 9) A small ``/app`` is copied into the probe's sandbox and the probe's directory removed
    without a hop to a worker thread; a large one still goes to a thread; the replies are the same either way."""
    from rsigym_env.worlds.local.harbor import environment

    hops: list[str] = []
    to_thread = asyncio.to_thread

    async def recording(func, *args, **kwargs):
        hops.append(getattr(func, "__name__", repr(func)))
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", recording)
    small = _trial(code_tasks[0], tmp_path / "small", prestart, solve=True, requests=(_request(),))
    small_hops = list(hops)
    monkeypatch.setattr(environment, "INLINE_MAX_ENTRIES", 1)
    hops.clear()
    large = _trial(code_tasks[0], tmp_path / "large", prestart, solve=True, requests=(_request(),))
    assert small["probes"] == large["probes"] and small["reward"] == large["reward"]
    copy = "_fill_probe_app" if prestart else "_copy_tree"
    assert copy not in small_hops and "rmtree" not in small_hops
    assert copy in hops and "rmtree" in hops
