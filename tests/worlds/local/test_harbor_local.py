"""Evaluation through Harbor's real ``Job`` in the local world: bubblewrap environment, the harness as
a Harbor agent, the model over a unix socket, ``LocalEvalService``.

Fixtures are tiny: tasks "write N to /app/answer.txt" (checked by ``tests/test.sh``, with the answer
also in ``tests/expected.txt``), a stdlib toy harness that asks the model once, and a deterministic
model whose answer depends only on the request's seed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import re
import threading
import time
from pathlib import Path

import pytest

from rsigym_env.errors import ActionError
from rsigym_env.prices import DEFAULT_PRICES
from rsigym_env.serving.models import ChatChoice, ChatRequest, ModelRegistry, apply_limits
from rsigym_env.serving.openai_server import OpenAIServer, UsageMeter
from rsigym_env.services import Billed, EvalRequest, EvalResult
from rsigym_env.worlds.common import evaluation
from rsigym_env.worlds.common.idle import IdleGate
from rsigym_env.worlds.local.sandbox import isolation

pytestmark = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")

os.environ.setdefault("HARBOR_TELEMETRY", "0")

ANSWERS = {"t-add": 42, "t-mul": 56, "t-sub": 7}

TOY_HARNESS = r'''
import http.client, json, os, socket, subprocess, sys

class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.environ["RSIGYM_MODEL_SOCKET"])

mode = open("/harness/mode.txt").read().strip() if os.path.exists("/harness/mode.txt") else "normal"
instruction = open(os.environ["RSIGYM_INSTRUCTION_FILE"]).read()
steps = [{"role": "user", "content": instruction}]
snoop = {}
if mode == "snoop":
    for path in ("/tests", "/tests/expected.txt", "/solution/solve.sh"):
        try:
            snoop[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()
        except OSError as exc:
            snoop[path] = "ERR " + type(exc).__name__
    # a process left behind, hoping to outlive the harness and see the tests mounted later
    subprocess.Popen(["/bin/sh", "-c", "sleep 1.5; ls /tests > /logs/agent/late.txt 2>&1; echo $? >> /logs/agent/late.txt"],
                     start_new_session=True)
    try:
        os.symlink("/etc/hostname", "/logs/agent/escape")
    except OSError:
        pass
if mode == "crash":
    sys.exit(3)
if mode == "hang":
    import time
    time.sleep(60)
conn = Conn("localhost")
body = {"model": os.environ["RSIGYM_MODEL"], "messages": [{"role": "user", "content": instruction}],
        "seed": int(os.environ["RSIGYM_SEED"]), "max_tokens": 16}
conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
reply = json.loads(conn.getresponse().read())
text = reply["choices"][0]["message"]["content"]
steps.append({"role": "assistant", "content": text, "claimed_tokens": 10**9})
answer = text.split("ANSWER:")[-1].strip() if mode != "truncated" else "0"
with open(os.path.join(os.environ["RSIGYM_APP_DIR"], "answer.txt"), "w") as f:
    f.write(answer + "\n")
steps.append({"role": "agent", "command": "cat answer.txt", "output": answer})
end = "truncated" if mode == "truncated" else "answer"
json.dump({"end_reason": end, "steps": steps, "snoop": snoop, "seed": os.environ["RSIGYM_SEED"]},
          open("/logs/agent/trajectory.json", "w"))
'''


class SolverModel:
    """Answers "ANSWER: N" for "Write N ..." right with probability ``p``, decided by the request's seed only."""

    def __init__(self, p: float = 1.0):
        self.p = p

    def complete(self, request: ChatRequest) -> list[ChatChoice]:
        number = int(re.search(r"Write (\d+)", request.messages[-1].text).group(1))
        right = random.Random(request.seed).random() < self.p
        return [apply_limits(f"ANSWER: {number if right else number + 1}", request) for _ in range(request.n)]


def make_tasks(root: Path, answers: dict[str, int] = ANSWERS) -> Path:
    for name, answer in answers.items():
        task = root / name
        (task / "environment").mkdir(parents=True)
        (task / "tests").mkdir()
        (task / "solution").mkdir()
        (task / "task.toml").write_text('schema_version = "1.4"\n[verifier]\ntimeout_sec = 30.0\n'
                                        '[agent]\ntimeout_sec = 30.0\n')
        (task / "instruction.md").write_text(f"Write {answer} to /app/answer.txt\n")
        (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
        (task / "environment" / "notes.txt").write_text("the answer goes to answer.txt\n")
        (task / "tests" / "expected.txt").write_text(f"{answer}\n")
        (task / "tests" / "test.sh").write_text(
            '#!/bin/bash\nif [ "$(cat /app/answer.txt 2>/dev/null)" = "$(cat /tests/expected.txt)" ]; '
            'then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n')
        (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {answer} > /app/answer.txt\n")
    return root


def harness(mode: str = "normal") -> dict[str, str]:
    files = {"agent.py": TOY_HARNESS}
    if mode != "normal":
        files["mode.txt"] = mode
    return files


@pytest.fixture()
def tasks(tmp_path: Path) -> dict[str, Path]:
    return {"dev": make_tasks(tmp_path / "dev"), "official": make_tasks(tmp_path / "official", {"o-1": 11, "o-2": 12})}


def service(tmp_path: Path, tasks: dict[str, Path], p: float = 1.0, **kwargs):
    from rsigym_env.worlds.local.harbor.evaluation import LocalEvalService

    def model_for(checkpoint: str):
        if checkpoint not in ("base", "ckpt-1"):
            raise ActionError("unknown_ref", f"no checkpoint {checkpoint!r}")
        return SolverModel(p)

    return LocalEvalService(model_for=model_for, tasks=tasks, run_dir=tmp_path / "evals", prices=DEFAULT_PRICES,
                            private_dir=tmp_path / "private", **kwargs)


# ------------------------------------------------------------------ the server's unix socket and counters


def test_server_unix_socket_and_usage_meter(tmp_path):
    from rsigym_env.serving.openai_server import UnixHTTPConnection

    meter = UsageMeter()
    sock = tmp_path / "m.sock"
    with OpenAIServer(ModelRegistry({"solver": SolverModel()}), uds=sock, usage=meter) as server:
        assert server.port and sock.exists()   # TCP and the socket, one server
        conn = UnixHTTPConnection(sock)
        conn.request("POST", "/v1/chat/completions", json.dumps(
            {"model": "solver", "messages": [{"role": "user", "content": "Write 5 now"}], "seed": 1}))
        reply = json.loads(conn.getresponse().read())
        from openai import OpenAI
        OpenAI(base_url=server.base_url, api_key="x", max_retries=0).chat.completions.create(
            model="solver", messages=[{"role": "user", "content": "Write 6 now"}], seed=1)
    assert reply["choices"][0]["message"]["content"] == "ANSWER: 5"
    used = meter.get("solver")
    assert used.requests == 2 and used.completion_tokens == 2 * reply["usage"]["completion_tokens"]
    assert meter.reset("solver").requests == 2 and meter.get("solver").requests == 0
    assert not sock.exists()  # removed on stop
    with pytest.raises(ValueError):
        OpenAIServer({}, port=None)


def test_budgeted_model_caps_tokens():
    from rsigym_env.serving.models import EchoModel
    from rsigym_env.serving.models import ModelRequestError
    from rsigym_env.worlds.common.harbor_agent import BudgetedModel

    model = BudgetedModel(EchoModel(), budget=40)
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "one two three four five six seven"}])
    first = model.complete(request)          # 14 prompt + 7 completion tokens
    assert first[0].content.startswith("one") and model.used == 21
    second = model.complete(request)         # what is left cuts the completion short
    assert second[0].finish_reason == "length" and model.used == 40  # 5 of 7 words
    with pytest.raises(ModelRequestError) as err:
        model.complete(request)
    assert err.value.status == 429


# ------------------------------------------------------------------ Harbor's Job end to end


def run_job(tmp_path: Path, tasks_dir: Path, mode: str, *, k: int = 1, concurrency: int = 2, p: float = 1.0,
            agent_name: str = "harness"):
    """Harbor's Job over ``tasks_dir`` with the toy harness; returns (trial results, session)."""
    from harbor.job import Job
    from harbor.models.job.config import JobConfig
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig

    from rsigym_env.worlds.common.evaluation import list_tasks, write_harness
    from rsigym_env.worlds.common.harbor_agent import ModelSession, register_session, unregister_session

    harness_dir = tmp_path / f"harness-{mode}"
    write_harness(harness(mode), harness_dir)
    registry, meter = ModelRegistry(), UsageMeter()
    sock = tmp_path / f"{mode}.sock"
    key = f"test-{mode}-{time.monotonic_ns()}"
    with OpenAIServer(registry, port=None, uds=sock, usage=meter):
        session = ModelSession(socket=sock, registry=registry, meter=meter, model=SolverModel(p), seed=0,
                               tokens_per_trial=1000)
        register_session(key, session)
        agents = [AgentConfig(import_path="rsigym_env.worlds.common.harbor_agent:HarnessAgent",
                              kwargs={"harness_dir": str(harness_dir), "session": key, "attempt": a})
                  for a in range(k)]
        if agent_name == "oracle":
            agents = [AgentConfig(name="oracle")]
        config = JobConfig(job_name="job", jobs_dir=tmp_path / f"jobs-{mode}", n_concurrent_trials=concurrency,
                           quiet=True, tasks=[TaskConfig(path=t) for t in list_tasks(tasks_dir)], agents=agents,
                           environment=EnvironmentConfig(
                               import_path="rsigym_env.worlds.local.harbor.environment:BubblewrapEnvironment"))

        async def go():
            return (await (await Job.create(config)).run()).trial_results

        try:
            results = asyncio.run(go())
        finally:
            unregister_session(key)
    return results, session


def reward(result) -> float | None:
    return result.verifier_result.rewards["reward"] if result.verifier_result else None


def test_harbor_job_end_to_end_rewards_and_artifacts(tmp_path):
    tasks_dir = make_tasks(tmp_path / "tasks")
    results, session = run_job(tmp_path, tasks_dir, "normal")
    assert sorted(r.task_name for r in results) == sorted(ANSWERS)
    assert all(r.exception_info is None for r in results), [r.exception_info for r in results]
    assert [reward(r) for r in results] == [1.0] * 3
    for r in results:
        trial = Path(r.config.trials_dir) / r.trial_name
        atif = json.loads((trial / "agent" / "trajectory.json").read_text())
        assert atif["schema_version"].startswith("ATIF") and atif["steps"][-1]["tool_calls"][0]["function_name"] == "shell"
        assert (trial / "agent" / "harness-trajectory.json").exists()
        # tokens come from the server's counters, not from what the harness claims
        used = session.usage(r.agent_result.metadata["model"])
        assert used.requests == 1 and r.agent_result.n_output_tokens == used.completion_tokens < 10**9
        assert r.agent_result.n_input_tokens == used.prompt_tokens > 0
        assert json.loads((trial / "sandbox.json").read_text())["commands"] >= 2
        assert not (trial / "sandbox").exists()  # the sandbox directory is removed at stop
    # Dockerfile stays out of /app; environment files are in
    assert session.usage().requests == 3


def test_wrong_answer_scores_zero_and_oracle_scores_one(tmp_path):
    tasks_dir = make_tasks(tmp_path / "tasks")
    results, _ = run_job(tmp_path, tasks_dir, "normal", p=0.0)
    assert [reward(r) for r in results] == [0.0] * 3
    oracle, _ = run_job(tmp_path, tasks_dir, "oracle", agent_name="oracle")
    assert [reward(r) for r in oracle] == [1.0] * 3


@pytest.mark.slow
def test_harness_cannot_see_tests_solution_or_escape(tmp_path):
    tasks_dir = make_tasks(tmp_path / "tasks", {"t-add": 42})
    results, _ = run_job(tmp_path, tasks_dir, "snoop")
    (result,) = results
    trial = Path(result.config.trials_dir) / result.trial_name
    raw = json.loads((trial / "agent" / "harness-trajectory.json").read_text())
    assert raw["snoop"] == {"/tests": "ERR FileNotFoundError", "/tests/expected.txt": "ERR FileNotFoundError",
                            "/solution/solve.sh": "ERR FileNotFoundError"}
    assert reward(result) == 1.0  # the verifier did see its tests
    time.sleep(1.6)
    assert not (trial / "agent" / "late.txt").exists()  # the left-behind process died with the harness
    assert not (trial / "agent" / "escape").exists()     # symlinks out of the sandbox are removed


@pytest.mark.slow
def test_eval_service_dev_job_billed_and_deterministic(tmp_path, tasks):
    svc1 = service(tmp_path / "a", tasks, p=0.5, concurrency=1)
    svc2 = service(tmp_path / "b", tasks, p=0.5, concurrency=3)
    req = EvalRequest(checkpoint="ckpt-1", harness_version="v1", harness_files=harness(), split="dev", k=2)
    try:
        quote = svc1.quote(req)
        job = svc1.start(req, "ev-1")
        billed = job.future.result(timeout=60)
        other = svc2.start(req, "ev-1").future.result(timeout=60)
    finally:
        svc1.close()
        svc2.close()
    assert isinstance(billed, Billed) and isinstance(billed.value, EvalResult)
    value = billed.value
    assert job.kind == "evaluate" and value.split == "dev" and value.k == 2 and value.task_ids == sorted(ANSWERS)
    assert 0 < billed.cost_usd <= quote.usd and value.tokens > 0 and value.sandbox_seconds > 0
    assert value.score == pytest.approx(sum(sum(r) for r in value.rewards) / 6)
    assert value.rewards == other.value.rewards and value.failures == other.value.failures  # concurrency 1 vs 3
    assert {f for row in value.failures for f in row} <= {"", "wrong_answer"}
    assert 0 < value.score < 1  # p=0.5 over six attempts with these seeds: some right, some wrong
    summary = json.loads((tmp_path / "a" / "evals" / "ev-1" / "summary.json").read_text())
    assert summary["score"] == value.score and len(summary["trials"]) == 6
    trial_dir = tmp_path / "a" / "evals" / "ev-1" / summary["trials"][0]["dir"]
    assert (trial_dir / "agent" / "trajectory.json").exists()


@pytest.mark.slow
def test_spare_trials_on_an_idle_machine_run_more_trials_at_once_with_the_same_results(tmp_path, tasks, monkeypatch):
    """With spare trials and a machine that shows idle cores, an evaluation runs more than ``concurrency``
    trials at once (each waits before its sandbox exists), and its rewards and failure labels are those of
    the same evaluation run one trial at a time."""
    from rsigym_env.worlds.common import idle

    made: list = []

    class Quiet(idle.SpareCores):  # a machine that always shows idle cores
        def __init__(self, base: int, most: int):
            super().__init__(base, most, min_idle_cores=0.0, window_s=0.01)
            made.append(self)

    monkeypatch.setattr(evaluation, "SpareCores", Quiet)
    plain = service(tmp_path / "a", tasks, p=0.5, concurrency=1)
    spare = service(tmp_path / "b", tasks, p=0.5, concurrency=1, spare_trials=2)
    req = EvalRequest(checkpoint="ckpt-1", harness_version="v1", harness_files=harness(), split="dev", k=2)
    try:
        one = plain.start(req, "ev-1").future.result(timeout=120).value
        more = spare.start(req, "ev-1").future.result(timeout=120).value
    finally:
        plain.close()
        spare.close()
    assert (more.rewards, more.failures) == (one.rewards, one.failures)
    assert len(made) == 1 and made[0].peak > 1 and made[0].extra >= 1 and made[0].running == 0


def test_eval_service_failure_labels_and_official_keeps_score_only(tmp_path, tasks):
    svc = service(tmp_path, tasks)
    try:
        crashed = svc.start(EvalRequest(checkpoint="base", harness_version="v2", harness_files=harness("crash"),
                                        k=1, n_tasks=2), "ev-2").future.result(timeout=60).value
        truncated = svc.start(EvalRequest(checkpoint="base", harness_version="v3", harness_files=harness("truncated"),
                                          k=1, n_tasks=1), "ev-3")
        official = svc.official(EvalRequest(checkpoint="base", harness_version="v1", harness_files=harness(),
                                            split="official", k=1))
        with pytest.raises(ActionError):
            svc.quote(EvalRequest(checkpoint="ckpt-9", harness_version="v1", harness_files=harness()))
        truncated_value = truncated.future.result(timeout=60).value
    finally:
        svc.close()
    assert crashed.failures == [["harness_error"], ["harness_error"]] and crashed.failure_modes == {"harness_error": 2}
    assert crashed.score == 0.0
    assert truncated_value.rewards == [[0.0]] and truncated_value.failures == [["truncated_output"]]
    assert official.value.score == 1.0 and official.value.split == "official" and official.cost_usd > 0
    summary = json.loads((tmp_path / "evals" / "official-1" / "summary.json").read_text())
    assert set(summary) == {"id", "split", "checkpoint", "harness_version", "k", "score", "tasks"}
    assert sorted(p.name for p in (tmp_path / "evals" / "official-1").iterdir()) == ["summary.json"]
    assert not any(p.is_file() for p in (tmp_path / "private").rglob("*"))  # the official job and sandboxes are gone


@pytest.mark.slow
def test_eval_service_timeout_is_a_harness_error_and_close_cancels(tmp_path, tasks):
    svc = service(tmp_path / "t", tasks, agent_timeout_s=1.0)
    try:
        value = svc.start(EvalRequest(checkpoint="base", harness_version="v4", harness_files=harness("hang"), k=1,
                                      n_tasks=1), "ev-4").future.result(timeout=60).value
    finally:
        svc.close()
    assert value.failures == [["harness_error"]] and value.rewards == [[0.0]]
    summary = json.loads((tmp_path / "t" / "evals" / "ev-4" / "summary.json").read_text())
    assert "ran longer than 1 s" in summary["trials"][0]["harness_error"]  # killed by the sandbox's wall clock

    svc = service(tmp_path / "c", tasks, agent_timeout_s=30.0)
    job = svc.start(EvalRequest(checkpoint="base", harness_version="v4", harness_files=harness("hang"), k=1,
                                n_tasks=2), "ev-5")
    time.sleep(0.8)
    started = time.monotonic()
    svc.close()
    assert time.monotonic() - started < 10
    with pytest.raises(BaseException):  # noqa: B017 (cancelled or failed: either way it does not finish)
        job.future.result(timeout=1)
    with pytest.raises(ActionError):
        svc.start(EvalRequest(checkpoint="base", harness_version="v4", harness_files=harness()), "ev-6")
    assert not list((tmp_path / "c" / "evals" / "ev-5").rglob("sandbox/app"))  # sandboxes stopped and removed


@pytest.fixture
def ungated(monkeypatch):
    """Trials started ahead wait for idle cores (tests/worlds/common has the gate's own tests); on a busy
    machine, e.g. beside the suite's other worker, they could wait past these tests' deadlines. Here they
    start at once, as on an idle machine."""
    monkeypatch.setattr(evaluation, "IdleGate", functools.partial(IdleGate, min_idle_cores=0.0))


def official_request(files: dict[str, str], k: int = 2) -> EvalRequest:
    return EvalRequest(checkpoint="base", harness_version="v1", harness_files=files, split="official", k=k)


def official_runs(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "evals").glob("official-*"))


def test_an_official_evaluation_started_ahead_is_the_one_official_returns(tmp_path, tasks, ungated):
    ahead = service(tmp_path / "ahead", tasks, p=0.5, prefetch=True)
    try:
        ahead.prefetch_official(official_request(harness()))
        ahead.prefetch_official(official_request(harness()))  # asked twice: started once
        deadline = time.monotonic() + 60
        while not official_runs(tmp_path / "ahead") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert official_runs(tmp_path / "ahead") == ["official-1"]  # it ran before anyone asked for it
        got = ahead.official(official_request(harness()))
        other = ahead.official(official_request(harness(), k=1))  # another request: evaluated on its own
    finally:
        ahead.close()
    plain = service(tmp_path / "plain", tasks, p=0.5)
    try:
        plain.prefetch_official(official_request(harness()))  # without prefetch=True: a no-op
        time.sleep(0.3)
        assert official_runs(tmp_path / "plain") == []
        fresh = plain.official(official_request(harness()))
    finally:
        plain.close()
    assert official_runs(tmp_path / "ahead") == ["official-1", "official-2"]  # the prefetched one was not run again
    timing = {"sandbox_seconds"}  # (wall time: it varies run to run; everything else is the same evaluation)
    assert got.value.model_dump(exclude=timing) == fresh.value.model_dump(exclude=timing) and not got.value.cached
    assert 0.0 < got.value.score < 1.0 and other.value.k == 1


def test_official_evaluations_are_numbered_in_the_order_they_were_asked_for(tmp_path, tasks, ungated):
    """The one started ahead is official-1 however long it takes (the later request cannot take its name);
    one started ahead that is already cached takes no number: it makes no directory."""
    cache = {"cache_dir": tmp_path / "cache", "model_identity": lambda checkpoint: checkpoint}
    first = service(tmp_path / "a", tasks, prefetch=True, **cache)
    model_for = first.model_for

    def slow_ahead(checkpoint: str):  # the evaluation started ahead gets going only after the next request
        if threading.current_thread().name == "rsigym-official-prefetch":
            time.sleep(0.5)
        return model_for(checkpoint)

    first.model_for = slow_ahead
    try:
        first.prefetch_official(official_request(harness()))
        other = first.official(official_request(harness(), k=1))
        ahead = first.official(official_request(harness()))
    finally:
        first.close()
    summaries = {n: json.loads((tmp_path / "a" / "evals" / n / "summary.json").read_text())["k"]
                 for n in official_runs(tmp_path / "a")}
    assert summaries == {"official-1": ahead.value.k, "official-2": other.value.k} and ahead.value.k != other.value.k
    again = service(tmp_path / "b", tasks, prefetch=True, **cache)
    try:
        again.prefetch_official(official_request(harness()))  # cached: nothing runs, no number taken
        hit = again.official(official_request(harness()))
        fresh = again.official(official_request(harness(), k=3))
    finally:
        again.close()
    assert hit.value.cached and not fresh.value.cached and official_runs(tmp_path / "b") == ["official-1"]


def test_a_failed_prefetch_is_run_again_and_close_stops_one_running(tmp_path, tasks, ungated):
    svc = service(tmp_path / "f", tasks, prefetch=True)
    calls = {"n": 0}
    model_for = svc.model_for

    def flaky(checkpoint: str):  # fails the first time the prefetch's own thread asks
        if threading.current_thread().name == "rsigym-official-prefetch":
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("the model store was busy")
        return model_for(checkpoint)

    svc.model_for = flaky
    try:
        svc.prefetch_official(official_request(harness()))
        deadline = time.monotonic() + 30
        while calls["n"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        again = svc.official(official_request(harness()))  # the prefetch failed: evaluated afresh, not an error
    finally:
        svc.close()
    assert again.value.score == 1.0 and official_runs(tmp_path / "f") == ["official-1"]

    hanging = service(tmp_path / "c", tasks, agent_timeout_s=30.0, prefetch=True)
    hanging.prefetch_official(official_request(harness("hang")))
    deadline = time.monotonic() + 30
    while not list((tmp_path / "c" / "private" / "sandboxes").glob("*/app")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list((tmp_path / "c" / "private" / "sandboxes").glob("*/app"))  # a trial is running (hanging)
    started = time.monotonic()
    hanging.close()
    assert time.monotonic() - started < 10
    assert not any(p.is_file() for p in (tmp_path / "c" / "private").rglob("*"))  # sandboxes and the job removed
    hanging.prefetch_official(official_request(harness()))  # closed: nothing starts
    assert official_runs(tmp_path / "c") == []


def test_environment_phases_transfers_and_symlinks(tmp_path):
    """The environment on its own: agent mounts only before the tests arrive, tests only after, and host-side
    transfers that never follow a symlink made inside the sandbox."""
    from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from rsigym_env.worlds.local.harbor.environment import BubblewrapEnvironment

    task = make_tasks(tmp_path / "tasks", {"t-add": 42}) / "t-add"
    paths = TrialPaths(trial_dir=tmp_path / "trial")
    paths.mkdir()
    env = BubblewrapEnvironment(task / "environment", "t-add", "t-add__x__env", paths, TaskEnvironmentConfig())
    secret = tmp_path / "agent-only"
    secret.mkdir()
    (secret / "note.txt").write_text("for the agent\n")

    async def go():
        await env.start(force_build=False)
        env.add_agent_mount(secret, "/harness")
        agent = await env.exec("cat /harness/note.txt; ls /app; ls /tests 2>&1; ln -s /etc/hostname /app/link; "
                               "ln -s / /app/root; echo hi > /logs/agent/out.txt")
        with pytest.raises(PermissionError):
            await env.download_file("/app/link", tmp_path / "got")        # a symlink is not followed
        with pytest.raises(PermissionError):
            await env.upload_file(task / "instruction.md", "/app/root/etc/evil")  # nor written through
        with pytest.raises(ValueError):
            await env.download_file("/etc/passwd", tmp_path / "got")
        await env.upload_dir(task / "tests", "/tests")                    # the verifier phase begins
        verifier = await env.exec("cat /tests/expected.txt; cat /harness/note.txt 2>&1; echo 1 > /logs/verifier/reward.txt")
        await env.download_dir("/app", tmp_path / "app-copy")
        # the logs live in the sandbox's own opaque directories; Harbor downloads them (not mounted)
        await env.download_dir("/logs/verifier", paths.verifier_dir)
        await env.download_dir("/logs/agent", paths.agent_dir)
        await env.stop(delete=True)
        return agent, verifier

    agent, verifier = asyncio.run(go())
    assert agent.return_code == 0 and agent.stdout.startswith("for the agent\nnotes.txt\n")  # no Dockerfile in /app
    assert "No such file or directory" in agent.stdout  # ls /tests
    assert verifier.stdout.startswith("42\n") and "No such file or directory" in verifier.stdout  # harness gone
    assert (paths.verifier_dir / "reward.txt").read_text() == "1\n" and (paths.agent_dir / "out.txt").exists()
    assert sorted(p.name for p in (tmp_path / "app-copy").iterdir()) == ["notes.txt"]  # symlinks skipped
    assert not env.root.exists() and json.loads((paths.trial_dir / "sandbox.json").read_text())["commands"] == 2


def test_minimal_harness_on_a_generated_benchmark(tmp_path):
    """The real minimal harness, a generated benchmark and a solver-backed model: the contract holds end to end."""
    from rsigym_env.worlds.local import benchmarks
    from rsigym_env.worlds.local.harbor.evaluation import LocalEvalService
    from rsigym_env.worlds.common.harness import minimal_harness
    from rsigym_env.worlds.local.teachers import TeacherModel

    dirs = benchmarks.resolve("local-terminal").build(tmp_path / "tasks")
    svc = LocalEvalService(model_for=lambda c: TeacherModel("oracle-teacher", 1.0), tasks=dirs,
                           run_dir=tmp_path / "evals", prices=DEFAULT_PRICES, private_dir=tmp_path / "private")
    try:
        billed = svc.start(EvalRequest(checkpoint="base", harness_version="v0", harness_files=minimal_harness(), k=1,
                                       n_tasks=2), "ev-1").future.result(timeout=60)
    finally:
        svc.close()
    assert billed.value.score == 1.0 and billed.value.tokens > 0, billed.value
    summary = json.loads((tmp_path / "evals" / "ev-1" / "summary.json").read_text())
    atif = json.loads((tmp_path / "evals" / "ev-1" / summary["trials"][0]["dir"] / "agent" / "trajectory.json").read_text())
    assert [s["source"] for s in atif["steps"][:2]][-1] == "user" and atif["extra"]["end_reason"] in ("done", "answer")
    assert any(s.get("tool_calls") for s in atif["steps"])  # the harness ran commands in the sandbox


def test_tuned_harbor_hashes_exactly_as_harbor(tmp_path):
    """The memoized task hashes (evaluation.tune_harbor) equal Harbor's own, and follow a changed file."""
    import warnings

    from harbor.models.task.task import Task
    from harbor.publisher.packager import Packager

    task = make_tasks(tmp_path / "tasks", {"t-add": 42}) / "t-add"
    plain_hash, plain_files = Packager.compute_content_hash(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        plain_sum = Task(task).checksum
    from rsigym_env.worlds.common.evaluation import tune_harbor

    tune_harbor()
    assert Packager.compute_content_hash(task) == (plain_hash, plain_files)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert Task(task).checksum == plain_sum
        (task / "tests" / "expected.txt").write_text("43\n")
        changed = Task(task).checksum
    assert changed != plain_sum and Packager.compute_content_hash(task)[0] != plain_hash


def test_tuned_harbor_reads_task_toml_exactly_as_harbor(tmp_path):
    """The trial lock's memoized task.toml readers (evaluation.tune_harbor) give Harbor's own answers, follow a
    rewritten task.toml, and leave a task without one to Harbor."""
    import harbor.models.job.lock as job_lock

    from rsigym_env.worlds.common.evaluation import tune_harbor

    tune_harbor()
    readers = [job_lock._task_package_version, job_lock._task_verifier_environment_mode]
    assert all(hasattr(r, "__wrapped__") for r in readers)  # tuned (Harbor's own is the wrapped one)
    task = make_tasks(tmp_path / "tasks", {"t-add": 42}) / "t-add"
    toml = task / "task.toml"

    def answers() -> list:
        return [(r(task), r(task), r.__wrapped__(task)) for r in readers]

    first = answers()
    assert first == [(None, None, None), ("shared",) * 3]
    toml.write_text('schema_version = "1.4"\n[task]\nname = "org/t-add"\nversion = "2.1"\n'
                    '[verifier]\ntimeout_sec = 30.0\nenvironment_mode = "separate"\n[agent]\ntimeout_sec = 30.0\n')
    assert answers() == [("2.1",) * 3, ("separate",) * 3]
    toml.unlink()
    assert answers() == [(None,) * 3, (None,) * 3]


TUNED_FILTER_PROBE = r'''
import json, os, sys
from pathlib import Path
from harbor.models.task.file_filter import TaskFileFilter
from harbor.models.task.task import Task

task = Path(sys.argv[1])

def answers():
    out = {}
    f = TaskFileFilter(task)
    for path in sorted(task.rglob("*")):
        out[str(path.relative_to(task))] = f.is_excluded(path)
    sel = f.select(task / "tests")
    out["select"] = [str(p) for p in sel.relative_paths] + [sel.includes_all_entries]
    try:
        Task(task)
        out["task"] = "ok"
    except ValueError as exc:
        out["task"] = str(exc)
    return out

plain = answers()
from rsigym_env.worlds.common.evaluation import tune_harbor
tune_harbor()
tuned = [answers(), answers()]
(task / "tests" / ".harborignore").write_text("hidden.txt\nsecret/\n")
changed = [answers(), answers()]
os.symlink("/etc", task / "tests" / "escape")
def attempt():
    try:
        return answers()["task"]
    except ValueError as exc:
        return str(exc)
escaped = [attempt(), attempt()]
print(json.dumps({"plain": plain, "tuned": tuned, "changed": changed, "escaped": escaped}))
'''


def test_tuned_harbor_filters_task_files_exactly_as_harbor(tmp_path):
    """The memoized .harborignore checks (evaluation.tune_harbor) give Harbor's own answers, twice in a row,
    follow a changed .harborignore, and a task whose inputs leave it fails every time (in a fresh process, so
    that Harbor's own answers are computed untuned)."""
    import subprocess
    import sys

    task = make_tasks(tmp_path / "tasks", {"t-add": 42}) / "t-add"
    (task / "tests" / "secret").mkdir()
    (task / "tests" / "secret" / "key.txt").write_text("k\n")
    (task / "tests" / "hidden.txt").write_text("h\n")
    (task / "tests" / ".harborignore").write_text("hidden.txt\n")
    out = subprocess.run([sys.executable, "-c", TUNED_FILTER_PROBE, str(task)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["plain"]["tests/hidden.txt"] is True and seen["plain"]["tests/secret/key.txt"] is False
    assert seen["tuned"] == [seen["plain"]] * 2
    assert seen["changed"][0] == seen["changed"][1] and seen["changed"][0]["tests/secret/key.txt"] is True
    assert seen["changed"][0]["select"] != seen["plain"]["select"]
    assert all("must stay within the task" in e for e in seen["escaped"]), seen["escaped"]
