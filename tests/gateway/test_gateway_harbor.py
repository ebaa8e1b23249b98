"""A research run as a Harbor task (``rsigym export harbor``), run by Harbor's own ``Job`` against a real
``rsigym serve`` (a subprocess on loopback) on the local bubblewrap environment, offline.

* Harbor's oracle agent plays ``solution/solve.sh`` (the scripted researcher's calls through
  ``rsigym-call``): the reward is the in-process scripted researcher's normalized gain.
* Harbor's terminus-2, its model answered by this package's scripted chat model over the
  OpenAI-compatible server, types the same calls into its tmux session: the same reward. It needs the
  session environment (one sandbox for the agent phase); on the per-exec environment its tmux server
  dies after each command and it gives up at once (reward 0: the run is ended with the initial system).
* An agent that writes reward files and a fake "submitted" record gets the service's reward.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway_helpers import listening_url
from rsigym_env.worlds.local.sandbox import isolation

pytestmark = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

SCENARIO = "sim-harness-aime-500"
SEED = 3  # seed 3: a system whose replies get cut off, so the fix pays (sim result version 5)
ADMIN = "harbor-test-admin-token-0123456789"
PER_EXEC_ENV = "rsigym_env.worlds.local.harbor.environment:BubblewrapEnvironment"
SESSION_ENV = "rsigym_env.gateway.harbor_session_env:SessionBubblewrapEnvironment"
RECORDS = ("audit.json", "ledger.json", "ledger.sqlite", "trajectory.json")


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> str:
    """``rsigym serve`` as a user starts it, on a free loopback port; its URL."""
    root = tmp_path_factory.mktemp("serve")
    token = root / "admin-token"
    token.write_text(ADMIN)
    token.chmod(0o600)
    proc = subprocess.Popen([sys.executable, "-m", "rsigym_env.cli", "serve", "--port", "0", "--state-dir",
                             str(root / "state"), "--admin-token-file", str(token)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = listening_url(proc, 90)
    try:
        assert url, "rsigym serve did not start"
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def new_run(url: str, label: str, **overrides: Any) -> dict[str, Any]:
    body = {"scenario": SCENARIO, "seed": SEED, "label": label, **overrides}
    reply = httpx.post(f"{url}/v1/runs", json=body, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
    assert reply.status_code == 201, reply.text
    return reply.json()


def run_record(url: str, run_id: str) -> dict[str, Any]:
    """The service's own view of a run (admin route)."""
    return httpx.get(f"{url}/v1/runs/{run_id}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).json()


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    """The task as the CLI writes it."""
    from rsigym_env.gateway.cli import main

    out = tmp_path_factory.mktemp("export") / "research-task"
    assert main(["export", "harbor", "--scenario", SCENARIO, "--out", str(out), "--seed", str(SEED)]) == 0
    return out


@pytest.fixture(scope="module")
def expected() -> tuple[float, int]:
    """The in-process scripted researcher's normalized gain and step count on the scenario and seed,
    computed here, independently of the exporter, on an env built as the service builds its runs."""
    from rsigym_env.baselines import make_researcher
    from rsigym_env.episode import run_episode
    from rsigym_env.gateway.host import research_env
    from rsigym_env.gateway.service import RunRequest, resolve_scenario

    env = research_env(resolve_scenario(RunRequest(scenario=SCENARIO)))
    result = run_episode(env, make_researcher("scripted"), seed=SEED)
    env.close()
    assert result.terminated and result.info["normalized_gain"] > 0.1
    return float(result.info["normalized_gain"]), result.steps


def run_job(task_dir: Path, agent: Any, env_import: str, jobs_dir: Path, url: str, key: str,
            monkeypatch: pytest.MonkeyPatch) -> Any:
    """Harbor's Job with one trial of ``task_dir``; Harbor substitutes ``${RSIGYM_URL}`` and ``${RSIGYM_RUN_KEY}``
    from this process's environment."""
    from harbor.job import Job
    from harbor.models.job.config import JobConfig
    from harbor.models.trial.config import EnvironmentConfig, TaskConfig

    monkeypatch.setenv("RSIGYM_URL", url)
    monkeypatch.setenv("RSIGYM_RUN_KEY", key)
    config = JobConfig(job_name="research", jobs_dir=jobs_dir, n_attempts=1, n_concurrent_trials=1, quiet=True,
                       tasks=[TaskConfig(path=task_dir)], agents=[agent],
                       environment=EnvironmentConfig(import_path=env_import, kwargs={"network": True}))

    async def go():
        return list((await (await Job.create(config)).run()).trial_results)

    results = asyncio.run(asyncio.wait_for(go(), 120))
    assert len(results) == 1
    return results[0]


def reward(result: Any) -> float | None:
    return result.verifier_result.rewards["reward"] if result.verifier_result else None


def trial_dir(jobs_dir: Path) -> Path:
    (found,) = [p for p in (jobs_dir / "research").iterdir() if p.is_dir()]
    return found


def collected(trial: Path) -> Path:
    """Where the trial keeps the records collected after the agent (Harbor's artifacts)."""
    (found,) = list((trial / "artifacts").rglob("rsigym"))
    return found


def assert_records(trial: Path, gain: float, steps: int) -> dict[str, Any]:
    """The trial's artifacts hold the run's ledger, audit log and ATIF trajectory, as the service has them."""
    from harbor.models.trajectories import Trajectory

    from rsigym_env.platform.audit import verify_audit

    kept = collected(trial)
    assert all((kept / name).is_file() for name in RECORDS), sorted(p.name for p in kept.iterdir())
    assert verify_audit(kept / "ledger.sqlite").ok  # the database itself, as `rsigym audit verify` reads it
    audit = json.loads((kept / "audit.json").read_text())
    assert audit["verified"]["ok"] and audit["records"][-1]["event"]["tool"] == "official_evaluation"
    ledger = json.loads((kept / "ledger.json").read_text())
    assert ledger["open_reservations"] == [] and len(ledger["accounts"]) == 1
    trajectory = Trajectory.model_validate(json.loads((kept / "trajectory.json").read_text()))
    assert len(trajectory.steps) == steps + 1  # the briefing, then one step per call
    assert trajectory.final_metrics.extra["reward"] == pytest.approx(gain, abs=1e-12)
    report = json.loads((trial / "verifier" / "rsigym" / "report.json").read_text())
    assert report["collected_records"] == {name: "match" for name in RECORDS}
    assert report["reward"] == pytest.approx(gain, abs=1e-12)
    return report


# ---------------------------------------------------------------------------------------------- the export


def test_export_writes_a_harbor_task_that_harbor_loads(task, tmp_path):
    from harbor.models.task.config import TaskConfig as TaskToml
    from harbor.models.task.task import Task

    from rsigym_env.gateway import harbor_verifier
    from rsigym_env.gateway.cli import main
    from rsigym_env.gateway.skills import check_skills

    loaded = Task(task)  # Harbor's own loader
    config = loaded.config
    assert config.environment.env == {"RSIGYM_URL": "${RSIGYM_URL}", "RSIGYM_RUN_KEY": "${RSIGYM_RUN_KEY}"}
    assert config.verifier.env == config.environment.env
    assert config.verifier.environment_mode.value == "separate"
    (mcp,) = config.environment.mcp_servers
    assert (mcp.name, mcp.transport, mcp.command, mcp.args) == ("rsigym", "stdio", "rsigym", ["mcp"])
    assert config.environment.skills_dir == "/app/skills" and config.environment.network_mode.value == "public"
    assert "fresh --scenario" in config.environment.healthcheck.command
    (hook,) = config.verifier.collect
    assert hook.command.startswith("python3 -I - collect --out /logs/artifacts/rsigym")
    assert Path(harbor_verifier.__file__).read_text().strip() in hook.command  # the script itself, not a path in /app
    assert "Research run 'sim-harness-aime-500'" in loaded.instruction  # the briefing
    assert check_skills(task / "environment" / "skills") == []  # the skills match the tool models
    for copy in (task / "tests" / "rsigym_verify.py", task / "environment" / ".rsigym" / "rsigym_verify.py"):
        assert copy.read_text() == Path(harbor_verifier.__file__).read_text()
    assert "FROM python:3.12-slim" in (task / "environment" / "Dockerfile").read_text()
    assert os.access(task / "tests" / "test.sh", os.X_OK) and os.access(task / "solution" / "solve.sh", os.X_OK)
    assert TaskToml.model_validate_toml((task / "task.toml").read_text()) == config

    assert main(["export", "harbor", "--scenario", "no-such-scenario", "--out", str(tmp_path / "x")]) == 2
    assert main(["export", "harbor", "--scenario", "local-harness-aime", "--no-solution",
                 "--out", str(tmp_path / "local")]) == 0  # no oracle for a wall-clock world; the rest is the same
    assert not (tmp_path / "local" / "solution").exists()
    assert "rsigym-call observation" in (tmp_path / "local" / "instruction.md").read_text()


# ---------------------------------------------------------------------------------------------- Harbor's agents


def test_oracle_job_scores_the_scripted_researchers_gain(task, service, expected, tmp_path, monkeypatch):
    from harbor.models.trial.config import AgentConfig

    gain, steps = expected
    run = new_run(service, "oracle")
    result = run_job(task, AgentConfig(name="oracle"), PER_EXEC_ENV, tmp_path / "jobs", service, run["run_key"],
                     monkeypatch)
    assert result.exception_info is None, result.exception_info
    assert reward(result) == pytest.approx(gain, abs=1e-12)
    served = run_record(service, run["run_id"])
    assert (served["state"], served["steps"]) == ("done", steps)
    assert served["reward"] == pytest.approx(gain, abs=1e-12)
    report = assert_records(trial_dir(tmp_path / "jobs"), gain, steps)
    assert report["ended_by_verifier"]["was"] == "done"  # the agent itself submitted


def _text(message: Any) -> str:
    content = message.content
    if isinstance(content, list):
        return "".join(getattr(p, "text", "") or "" for p in content)
    return content or ""


def test_terminus_2_job_drives_the_run_through_tmux(task, service, expected, tmp_path, monkeypatch):
    from harbor.models.trial.config import AgentConfig

    from rsigym_env.gateway.harbor_task import scripted_solution
    from rsigym_env.serving import ModelRegistry, OpenAIServer, ScriptedChatModel

    gain, steps = expected
    calls = scripted_solution(SCENARIO, SEED).actions

    def reply(commands: list[str], done: bool = False, wait: float = 0.5) -> str:
        return json.dumps({"analysis": "RSIGym research run", "plan": "call the run's tools with rsigym-call",
                           "commands": [{"keystrokes": c, "duration": wait} for c in commands],
                           "task_complete": done})

    def until_submitted(request: Any) -> str:  # finish only once the terminal shows the service's verdict
        return reply([], done="normalized gain" in _text(request.messages[-1]), wait=1.0)

    turns: list[Any] = [reply(["export PATH=/app/skills/rsigym/scripts:$PATH\n"])]
    turns += [reply([f"echo {shlex.quote(json.dumps(c['args']))} | rsigym-call {c['tool']} -\n"]) for c in calls]
    turns += [until_submitted]
    model = ScriptedChatModel(turns, repeat_last=True)
    run = new_run(service, "terminus-2")
    with OpenAIServer(ModelRegistry({"scripted-researcher": model})) as server:
        agent = AgentConfig(name="terminus-2", model_name="openai/scripted-researcher",
                            kwargs={"api_base": server.base_url, "llm_kwargs": {"api_key": "sk-local"},
                                    "record_terminal_session": False, "enable_summarize": False, "max_turns": 40})
        result = run_job(task, agent, SESSION_ENV, tmp_path / "jobs", service, run["run_key"], monkeypatch)
    assert result.exception_info is None, result.exception_info
    assert reward(result) == pytest.approx(gain, abs=1e-12)
    served = run_record(service, run["run_id"])
    assert (served["state"], served["steps"]) == ("done", steps)  # exactly the scripted researcher's calls
    first = _text(model.requests[0].messages[-1])
    assert "Research run 'sim-harness-aime-500'" in first  # instruction.md, the briefing
    assert "<available_skills>" in first and "rsigym-evaluate" in first  # skills_dir
    assert "rsigym: stdio transport, command: rsigym mcp" in first  # the task's MCP entry
    trial = trial_dir(tmp_path / "jobs")
    assert_records(trial, gain, steps)
    assert (trial / "agent" / "trajectory.json").is_file()  # terminus-2's own ATIF


def test_terminus_2_needs_the_session_environment(task, service, tmp_path, monkeypatch):
    """On the per-exec environment terminus-2's tmux server dies with the command that started it: the
    agent stops before asking its model anything, and the run is ended with the initial system."""
    from harbor.models.trial.config import AgentConfig

    from rsigym_env.serving import ModelRegistry, OpenAIServer, ScriptedChatModel

    model = ScriptedChatModel([json.dumps({"analysis": "", "plan": "", "commands": [], "task_complete": True})],
                              repeat_last=True)
    run = new_run(service, "terminus-2-per-exec")
    with OpenAIServer(ModelRegistry({"m": model})) as server:
        agent = AgentConfig(name="terminus-2", model_name="openai/m",
                            kwargs={"api_base": server.base_url, "llm_kwargs": {"api_key": "sk-local"},
                                    "record_terminal_session": False})
        result = run_job(task, agent, PER_EXEC_ENV, tmp_path / "jobs", service, run["run_key"], monkeypatch)
    assert model.requests == []
    assert "Session has ended" in (trial_dir(tmp_path / "jobs") / "trial.log").read_text()
    assert reward(result) == 0.0
    served = run_record(service, run["run_id"])
    assert (served["state"], served["steps"], served["reward"]) == ("done", 1, 0.0)  # one call: the initial system


# ---------------------------------------------------------------------------------------------- a hostile agent


HOSTILE = r"""#!/bin/sh
# Claims a perfect score every way a file could: none of it may count.
mkdir -p /logs/verifier /logs/artifacts/rsigym 2>/dev/null
echo 1.0 > /logs/verifier/reward.txt 2>/dev/null
echo '{"reward": 1.0}' > /logs/verifier/reward.json 2>/dev/null
echo '{"submitted": true, "reward": 1.0, "normalized_gain": 1.0}' > /app/submitted.json
echo '{"submitted": true, "reward": 1.0}' > /logs/artifacts/submitted.json
echo '{"final_metrics": {"extra": {"reward": 1.0}}, "forged": true}' > /logs/artifacts/rsigym/trajectory.json
printf 'import sys\nprint("fresh")\nsys.exit(0)\n' > /app/.rsigym/rsigym_verify.py
printf '#!/bin/sh\necho 1.0 > /logs/verifier/reward.txt\n' > /app/skills/rsigym/scripts/rsigym-call
# a process left behind to forge the reward and the records collected after the agent (the session
# environment must kill it when the agent phase ends)
nohup sh -c 'for i in $(seq 30); do sleep 0.2; echo 1.0 > /logs/verifier/reward.txt;
  echo "{\"forged\": true}" > /logs/artifacts/rsigym/trajectory.json; done' >/dev/null 2>&1 &
"""


@pytest.mark.parametrize("plays", [False, True], ids=["never-submits", "submits-and-forges"])
def test_files_the_agent_writes_never_make_the_reward(plays, task, service, expected, tmp_path, monkeypatch):
    from harbor.models.trial.config import AgentConfig

    gain, steps = expected
    hostile = tmp_path / "hostile-task"
    shutil.copytree(task, hostile)
    solve = hostile / "solution" / "solve.sh"
    honest = solve.read_text().split("\n", 1)[1]  # the scripted researcher's calls, without the #! line
    work = honest if plays else "python3 /app/skills/rsigym/scripts/rsigym-call evaluate k=1\n"
    solve.write_text("#!/bin/sh\n" + work + HOSTILE.split("\n", 1)[1])  # the calls, then the forgeries
    run = new_run(service, "hostile")
    result = run_job(hostile, AgentConfig(name="oracle"), SESSION_ENV, tmp_path / "jobs", service, run["run_key"],
                     monkeypatch)
    assert result.exception_info is None, result.exception_info
    served = run_record(service, run["run_id"])
    assert served["state"] == "done"
    assert reward(result) == pytest.approx(served["reward"], abs=1e-12)  # the service's, whatever the files say
    trial = trial_dir(tmp_path / "jobs")
    if plays:
        assert reward(result) == pytest.approx(gain, abs=1e-12)
        assert_records(trial, gain, steps)
    else:
        assert reward(result) == 0.0 and served["steps"] == 2  # its evaluate, then the initial system
        report = json.loads((trial / "verifier" / "rsigym" / "report.json").read_text())
        assert report["collected_records"] == {name: "match" for name in RECORDS}
        finish = json.loads((collected(trial) / "finish.json").read_text())
        assert finish["submitted_initial"] and finish["was"] == "active"  # ended right after the agent
    assert "forged" not in (collected(trial) / "trajectory.json").read_text()
    assert (trial / "verifier" / "reward.txt").read_text().strip() == repr(served["reward"])


# ---------------------------------------------------------------------------------------------- the pieces


def _verify(argv: list[str], url: str, key: str, monkeypatch: pytest.MonkeyPatch) -> int:
    from rsigym_env.gateway.harbor_verifier import main

    monkeypatch.setenv("RSIGYM_URL", url)
    monkeypatch.setenv("RSIGYM_RUN_KEY", key)
    return main(argv)


def test_verifier_script_against_the_service(service, tmp_path, monkeypatch, capsys):
    # a run closed by the admin before anything was submitted: reward 0, nothing else to end
    closed = new_run(service, "closed")
    assert _verify(["fresh", "--scenario", SCENARIO], service, closed["run_key"], monkeypatch) == 0
    assert _verify(["fresh", "--scenario", "sim-data-aime-500"], service, closed["run_key"], monkeypatch) == 2
    httpx.delete(f"{service}/v1/runs/{closed['run_id']}", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    assert _verify(["fresh"], service, closed["run_key"], monkeypatch) == 1
    out = tmp_path / "v1"
    assert _verify(["verify", "--scenario", SCENARIO, "--out", str(out)], service, closed["run_key"], monkeypatch) == 0
    assert (out / "reward.txt").read_text() == "0.0\n"
    report = json.loads((out / "rsigym" / "report.json").read_text())
    assert report["state"] == "closed" and not report["ended_by_verifier"]["submitted_initial"]
    assert report["collected_records"] == {name: "missing" for name in RECORDS}

    # another scenario's run, an unreachable service: no reward file at all
    other = new_run(service, "other", scenario="sim-data-aime-500")
    out = tmp_path / "v2"
    assert _verify(["verify", "--scenario", SCENARIO, "--out", str(out)], service, other["run_key"], monkeypatch) == 2
    assert not (out / "reward.txt").exists()
    assert _verify(["verify", "--out", str(out)], "http://127.0.0.1:9", other["run_key"], monkeypatch) == 3
    assert _verify(["verify", "--out", str(out)], service, "rsr_wrong_key", monkeypatch) == 3
    assert not (out / "reward.txt").exists()

    # collect ends an open run with the initial system and writes its records; verify then agrees with them
    used = new_run(service, "collect")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "trajectory.json").symlink_to("/etc/passwd")  # replaced, never followed
    assert _verify(["collect", "--out", str(kept)], service, used["run_key"], monkeypatch) == 0
    assert json.loads((kept / "finish.json").read_text())["submitted_initial"]
    out = tmp_path / "v3"
    assert _verify(["verify", "--out", str(out), "--collected", str(kept)], service, used["run_key"], monkeypatch) == 0
    assert json.loads((out / "rsigym" / "report.json").read_text())["collected_records"] == {n: "match" for n in RECORDS}
    (kept / "ledger.json").write_text('{"accounts": []}')
    assert _verify(["verify", "--out", str(out), "--collected", str(kept)], service, used["run_key"], monkeypatch) == 0
    assert json.loads((out / "rsigym" / "report.json").read_text())["collected_records"]["ledger.json"] == "differs"
    assert run_record(service, used["run_id"])["steps"] == 1  # verify did not end it twice


def test_records_endpoints_need_the_key_and_an_ended_episode(service):
    from rsigym_env.platform.audit import verify_audit

    one, two = new_run(service, "records-1"), new_run(service, "records-2")
    key = {"Authorization": f"Bearer {one['run_key']}"}
    for path in ("/v1/audit", "/v1/ledger", "/v1/ledger.sqlite", "/v1/trajectory"):
        assert httpx.get(f"{service}{path}", timeout=30).status_code == 401
        early = httpx.get(f"{service}{path}", headers=key, timeout=30)
        assert early.status_code == 409 and early.json()["error"] == "episode_not_over"
    httpx.post(f"{service}/v1/tools/evaluate", json={"k": 1}, headers=key, timeout=30)
    httpx.post(f"{service}/v1/tools/wait", json={}, headers=key, timeout=30)
    assert httpx.post(f"{service}/v1/tools/submit", json={}, headers=key, timeout=60).json()["done"]
    audit = httpx.get(f"{service}/v1/audit", headers=key, timeout=30).json()
    assert audit["verified"] == {"ok": True, "records": len(audit["records"]), "first_broken": None,
                                 "reason": "chain intact"}
    assert {r["event"]["tool"] for r in audit["records"]} >= {"evaluate", "submit", "official_evaluation"}
    database = httpx.get(f"{service}/v1/ledger.sqlite", headers=key, timeout=30)
    assert database.headers["content-type"] == "application/vnd.sqlite3" and database.content[:15] == b"SQLite format 3"
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ledger-{one['run_id']}.sqlite"
    path.write_bytes(database.content)
    try:
        assert verify_audit(path).records == len(audit["records"])
    finally:
        path.unlink()
    (account,) = httpx.get(f"{service}/v1/ledger", headers=key, timeout=30).json()["accounts"]
    assert account["spent_usd"] > 0 and account["reserved"] == 0
    trajectory = httpx.get(f"{service}/v1/trajectory", headers=key, timeout=30).json()
    assert [s["tool_calls"][0]["function_name"] for s in trajectory["steps"][1:]] == ["evaluate", "wait", "submit"]
    # the other run's key reads only its own run (still open: nothing yet)
    other = httpx.get(f"{service}/v1/trajectory", headers={"Authorization": f"Bearer {two['run_key']}"}, timeout=30)
    assert other.status_code == 409


def test_the_tasks_mcp_entry_drives_the_served_run(task, service):
    """The MCP server entry of task.toml, started as an MCP client starts it with the agent's environment."""
    import anyio
    from harbor.models.task.task import Task
    from mcp import Client, StdioServerParameters

    (entry,) = Task(task).config.environment.mcp_servers
    run = new_run(service, "mcp")
    command = shutil.which(entry.command) or str(Path(sys.executable).with_name(entry.command))
    params = StdioServerParameters(command=command, args=list(entry.args),
                                   env={"RSIGYM_URL": service, "RSIGYM_RUN_KEY": run["run_key"],
                                        "PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")})

    async def talk():
        async with Client(params) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            started = await client.call_tool("evaluate", {"k": 1})
            return names, started

    names, started = anyio.run(talk)
    assert {"evaluate", "submit", "wait"} <= names
    assert not started.is_error and started.structured_content["result"]["job"] == "job-1"
    assert run_record(service, run["run_id"])["steps"] == 1  # the served run took the call
