"""The session service's life: idle runs closed and settled, restarts (clean and SIGKILL) that keep the books,
records that do not reproduce them, worlds that cannot resume, and the ``wait`` cap on wall clocks."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from rsigym_env.gateway.backend import LocalRun
from rsigym_env.gateway.host import RunHost, RunMeta, research_env
from rsigym_env.gateway.service import RunRequest, SessionService, resolve_scenario
from rsigym_env.platform.audit import verify_audit
from rsigym_env.platform.ledger import Ledger
from rsigym_env.scenario import load_scenario
from rsigym_env.worlds import WORLDS, register_world, world_factory

ADMIN = "rsa_test-admin-token-0123456789"
BEFORE = [("evaluate", {"k": 1}), ("generate_data", {"teacher": "claude-opus-5", "n_examples": 100}),
          ("wait", {"job": "job-2"}), ("train", {"dataset": "ds-1", "num_epochs": 2}),
          ("edit_harness", {"path": "harness.toml", "old": "persistent = false", "new": "persistent = true"})]
"""Calls before a restart: jobs (a training, maybe the evaluation) are still running when it comes."""
AFTER = [("wait", {}), ("wait", {}), ("evaluate", {"checkpoint": "ckpt-1", "k": 1}), ("read", {"ref": "jobs"}),
         ("submit", {"checkpoint": "ckpt-1"}), ("wait", {}), ("wait", {}), ("wait", {})]
"""... and after it: the jobs end, a submission whose official evaluation is a job, waits until it ends."""
REQUEST = RunRequest(benchmark="aime", budget_usd=500, seed=21)


def ledger_state(run_dir: Path) -> tuple[Any, list[dict[str, Any]]]:
    key = json.loads((run_dir / "run.json").read_text())["ledger_key"]
    kwargs = {"readonly": True} if "readonly" in Ledger.__init__.__code__.co_varnames else {}
    with Ledger(run_dir / "ledger.sqlite", **kwargs) as ledger:
        if hasattr(ledger, "books"):
            assert ledger.books().ok, ledger.books().problems
        return ledger.balance(key), [r.event for r in ledger.audit_records()]


def twin_texts(calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The replies of the same calls on the same scenario and seed, in this process, never restarted."""
    run = LocalRun(research_env(resolve_scenario(REQUEST)), seed=REQUEST.seed)
    try:
        return [run.call(tool, args).text for tool, args in calls]
    finally:
        run.close()


def wait_until(predicate: Any, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.slow)])
def ray_address(request: pytest.FixtureRequest) -> str | None:
    """``None``: runs in the service's process; ``"auto"``: runs in actors of the suite's local Ray."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
        return "auto"
    return None


# --------------------------------------------------------------------------------------------
# idle runs


def test_an_idle_run_is_closed_by_the_reaper_and_its_jobs_settled(tmp_path: Path, ray_address):
    timeout = 0.6 if ray_address is None else 8.0  # an actor call takes a while to start (4 s was too short under a load of 10)
    service = SessionService(tmp_path, admin_token=ADMIN, idle_timeout_s=timeout, reap_interval_s=0.05,
                             ray_address=ray_address)
    try:
        idle = service.create_run(RunRequest(benchmark="aime", seed=1))
        busy = service.create_run(RunRequest(benchmark="aime", seed=2))
        idle_run, busy_run = service.backend_for_key(idle["run_key"]), service.backend_for_key(busy["run_key"])
        assert idle_run.call("train", {"dataset": "ds-1"}).error == "unknown_ref"
        idle_run.call("generate_data", {"teacher": "claude-opus-5", "n_examples": 50})
        idle_run.call("wait", {})
        assert idle_run.call("train", {"dataset": "ds-1"}).ok and idle_run.balance()["reserved_usd"] > 0
        started = time.monotonic()
        while time.monotonic() - started < 2.5 * timeout:  # the busy run keeps calling: it must stay open
            assert busy_run.call("read", {"ref": "budget"}).ok
            time.sleep(0.1)
        assert wait_until(lambda: service.run_summary(idle["run_id"])["state"] == "closed")
        summary = service.run_summary(idle["run_id"])
        assert (summary["code"], summary["balance"]["reserved_usd"]) == ("idle_timeout", 0.0)
        assert service.run_summary(busy["run_id"])["state"] == "active"
        balance, events = ledger_state(service.runs_dir / idle["run_id"])
        assert balance.reserved_usd == 0.0 and balance.spent_usd == summary["balance"]["spent_usd"]
        assert events[-1]["tool"] == "run_closed" and events[-1]["code"] == "idle_timeout"
        assert [e.get("reason") or e.get("code") for e in events if e.get("op") in ("settle", "release")][-1:] \
            in (["cancelled"], [None])  # the running train job was cancelled (charged for the part that ran)
        assert verify_audit(service.runs_dir / idle["run_id"] / "ledger.sqlite").ok
        assert idle_run.call("read", {"ref": "jobs"}).error == "run_closed"
    finally:
        service.shutdown()


# --------------------------------------------------------------------------------------------
# restarts


def test_a_restart_resumes_sim_runs_and_keeps_the_books(tmp_path: Path, ray_address):
    """Stop the service with jobs running, start another on the same state: every run is listed with its
    state, the open sim run continues exactly as if nothing happened (a second restart too), and its
    books balance with the spend of an identical run that never stopped."""
    first = SessionService(tmp_path, admin_token=ADMIN, ray_address=ray_address)
    created = first.create_run(REQUEST)
    closed = first.create_run(RunRequest(benchmark="gpqa-diamond", seed=3))
    first.close_run(closed["run_id"])
    run = first.backend_for_key(created["run_key"])
    texts = [run.call(tool, args).text for tool, args in BEFORE]
    running = [run.observation()["running_jobs"]]
    assert running[0] >= 1
    first.shutdown()

    second = SessionService(tmp_path, admin_token=ADMIN, ray_address=ray_address)
    states = {r["run_id"]: (r["state"], r["code"]) for r in second.list_runs()}
    assert states == {created["run_id"]: ("active", None), closed["run_id"]: ("closed", "deleted")}
    run = second.backend_for_key(created["run_key"])
    assert [j["status"] for j in run.jobs()].count("running") == running[0]
    middle = [("wait", {}), ("evaluate", {"k": 1, "n_tasks": 5})]
    texts += [run.call(tool, args).text for tool, args in middle]
    running.append(run.observation()["running_jobs"])
    assert running[1] >= 1  # jobs still run across the second restart
    second.shutdown()

    third = SessionService(tmp_path, admin_token=ADMIN, ray_address=ray_address)
    run = third.backend_for_key(created["run_key"])
    end = [("wait", {}), ("wait", {}), ("wait", {}), ("read", {"ref": "jobs"}), ("submit", {"checkpoint": "ckpt-1"}),
           ("wait", {}), ("wait", {}), ("wait", {})]
    replies = [run.call(tool, args) for tool, args in end]
    texts += [r.text for r in replies]
    replies = replies[:next(i for i, r in enumerate(replies) if r.done) + 1]  # the reply that ended it
    assert replies[-1].done and third.run_summary(created["run_id"])["state"] == "done"
    assert texts == twin_texts(BEFORE + middle + end)
    balance, events = ledger_state(tmp_path / "runs" / created["run_id"])
    assert balance.reserved_usd == 0.0 and balance.spent_usd == pytest.approx(replies[-1].end["spend_usd"])
    handed_over = [e for e in events if e.get("reason") == "resumed"]
    assert len(handed_over) == 2 * sum(running)  # each running job: released and reserved again, per restart
    assert verify_audit(tmp_path / "runs" / created["run_id"] / "ledger.sqlite").ok
    assert third.backend_for_key(closed["run_key"]).call("read", {"ref": "budget"}).error == "run_closed"
    third.shutdown()


def test_a_killed_service_restarts_and_the_run_goes_on(tmp_path: Path):
    """SIGKILL the service process mid-run (two jobs holding money); a new process on the same state
    resumes the run over HTTP and ends it with the same replies and books as a run never killed."""
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN)
    token_file.chmod(0o600)

    def start() -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen([sys.executable, "-m", "rsigym_env.gateway.cli", "serve", "--port", "0",
                                 "--state-dir", str(tmp_path / "state"), "--admin-token-file", str(token_file)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        for line in proc.stdout:
            if "listening on" in line:
                return proc, line.rsplit(" ", 1)[1].strip()
            if time.monotonic() > deadline:
                break
        proc.kill()
        pytest.fail("rsigym serve did not start")

    proc, url = start()
    try:
        created = httpx.post(f"{url}/v1/runs", json=REQUEST.model_dump(exclude_none=True),
                             headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60).json()
        key = {"Authorization": f"Bearer {created['run_key']}"}
        texts = [httpx.post(f"{url}/v1/tools/{t}", json=a, headers=key, timeout=60).json()["text"] for t, a in BEFORE]
        assert httpx.get(f"{url}/v1/balance", headers=key).json()["reserved_usd"] > 0
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    proc, url = start()
    try:
        runs = httpx.get(f"{url}/v1/runs", headers={"Authorization": f"Bearer {ADMIN}"}).json()["runs"]
        assert [(r["run_id"], r["state"]) for r in runs] == [(created["run_id"], "active")]
        replies = [httpx.post(f"{url}/v1/tools/{t}", json=a, headers=key, timeout=60).json() for t, a in AFTER]
        texts += [r["text"] for r in replies]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    replies = replies[:next(i for i, r in enumerate(replies) if r["done"]) + 1]  # the reply that ended it
    assert replies[-1]["done"] and texts == twin_texts(BEFORE + AFTER)
    balance, _ = ledger_state(tmp_path / "state" / "runs" / created["run_id"])
    assert balance.reserved_usd == 0.0 and balance.spent_usd == pytest.approx(replies[-1]["end"]["spend_usd"])
    assert verify_audit(tmp_path / "state" / "runs" / created["run_id"] / "ledger.sqlite").ok


@pytest.mark.parametrize("damage", ["lost_last_line", "edited_action", "torn_last_line", "extra_line"])
def test_a_record_that_does_not_reproduce_the_books_interrupts_the_run_and_frees_its_money(tmp_path: Path, damage):
    """Whatever happened to steps.jsonl (a crash between the ledger's commit and the line, a torn write,
    an edit), a run whose replay does not match its ledger is interrupted, with its held money released
    and the audit chain intact; nothing it did is charged twice."""
    service = SessionService(tmp_path, admin_token=ADMIN)
    created = service.create_run(REQUEST)
    run = service.backend_for_key(created["run_key"])
    for tool, args in BEFORE:
        run.call(tool, args)
    spent = run.balance()["spent_usd"]
    service.shutdown()
    steps = tmp_path / "runs" / created["run_id"] / "steps.jsonl"
    lines = steps.read_text().splitlines(keepends=True)
    if damage == "lost_last_line":
        steps.write_text("".join(lines[:-1]))
    elif damage == "edited_action":
        line = json.loads(lines[1])
        line["action"]["args"]["n_examples"] = 99
        lines[1] = json.dumps(line) + "\n"
        steps.write_text("".join(lines))
    elif damage == "torn_last_line":
        steps.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    else:
        steps.write_text("".join(lines) + lines[-1])

    again = SessionService(tmp_path, admin_token=ADMIN)
    try:
        summary = again.run_summary(created["run_id"])
        assert (summary["state"], summary["code"]) == ("interrupted", "replay_diverged")
        balance, events = ledger_state(tmp_path / "runs" / created["run_id"])
        assert balance.reserved_usd == 0.0 and balance.spent_usd == pytest.approx(spent)
        assert events[-1]["tool"] == "run_interrupted"
        assert verify_audit(tmp_path / "runs" / created["run_id"] / "ledger.sqlite").ok
        reply = again.backend_for_key(created["run_key"]).call("read", {"ref": "jobs"})
        assert reply.error == "run_interrupted" and "replay_diverged" in reply.message
    finally:
        again.shutdown()


def test_a_run_of_a_world_that_cannot_resume_is_interrupted_on_restart(tmp_path: Path):
    """A non-sim world's servers and jobs die with the service: after a restart such a run is listed as
    interrupted (service_restarted) and the money its jobs held is released."""
    register_world("sim-but-not-resumable", WORLDS["sim"])
    try:
        service = SessionService(tmp_path, admin_token=ADMIN)
        created = service.create_run(RunRequest(world="sim-but-not-resumable", benchmark="aime", budget_usd=100, seed=4))
        run = service.backend_for_key(created["run_key"])
        assert run.call("evaluate", {"k": 1}).ok and run.balance()["reserved_usd"] > 0
        service.shutdown()
        again = SessionService(tmp_path, admin_token=ADMIN)
        summary = again.run_summary(created["run_id"])
        assert (summary["state"], summary["code"], summary["balance"]["reserved_usd"]) == (
            "interrupted", "service_restarted", 0.0)
        assert verify_audit(tmp_path / "runs" / created["run_id"] / "ledger.sqlite").ok
        again.shutdown()
    finally:
        WORLDS.pop("sim-but-not-resumable", None)


# --------------------------------------------------------------------------------------------
# wait on wall clocks


class _WallishClock:
    """The sim's clock, but not a SimClock: what the service sees of a world whose time is real."""

    def __init__(self, inner: Any):
        self.inner = inner

    def now(self) -> float:
        return self.inner.now()

    def spend(self, seconds: float) -> None:
        self.inner.spend(seconds)

    def wait(self, jobs: Any, deadline: float) -> Any:
        return self.inner.wait(jobs, deadline)


def test_wait_is_capped_on_a_wall_clock_world_and_not_in_sim(tmp_path: Path):
    def wallish(scenario, seed, run_dir):
        world = world_factory("sim")(scenario, seed, run_dir)
        world.clock = _WallishClock(world.clock)
        return world

    register_world("wallish-test", wallish)
    try:
        for world, capped in (("wallish-test", True), ("sim", False)):
            scenario = load_scenario(world=world, benchmark="aime", budget_usd=100)
            host = RunHost(str(tmp_path / world), RunMeta.new(world, "0" * 64, scenario, seed=0).model_dump())
            (tmp_path / world).mkdir()
            host.start(resume=False)
            host.call("evaluate", {"k": 1})
            for given in (None, 600.0, "abc", 5.0):
                args = {} if given is None else {"timeout_s": given}
                reply = host.call("wait", args)
                # in sim a wait is instant and the tool's own bound (<= 30) applies as in-process
                refused = given == "abc" or (given == 600.0 and not capped)
                assert (reply.error == "invalid_args") == refused, (world, given, reply.text)
                if capped and given != "abc":  # 30 s of a 16-minute evaluation: it is still running
                    assert reply.ok and "still running" in reply.text
            recorded = [json.loads(line)["action"]["args"] for line in (tmp_path / world / "steps.jsonl").open()][1:]
            if capped:
                assert [a.get("timeout_s") for a in recorded] == [30.0, 30.0, "abc", 5.0]
            else:
                assert [a.get("timeout_s") for a in recorded] == [None, 600.0, "abc", 5.0]
            host.close()
    finally:
        WORLDS.pop("wallish-test", None)


@pytest.mark.slow
def test_a_run_whose_ray_actor_dies_is_interrupted_and_its_money_released(tmp_path: Path, ray_session):
    service = SessionService(tmp_path, admin_token=ADMIN, ray_address="auto")
    try:
        created = service.create_run(RunRequest(benchmark="aime", budget_usd=100, seed=6))
        run = service.backend_for_key(created["run_key"])
        assert run.call("evaluate", {"k": 1}).ok and run.balance()["reserved_usd"] > 0
        ray_session.kill(service._entries[created["run_id"]].host.actor, no_restart=True)  # the node is gone
        deadline = time.monotonic() + 30  # ray.kill is asynchronous: a call may still reach the actor first
        while (reply := run.call("read", {"ref": "jobs"})).ok and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reply.error == "run_interrupted" and "actor_lost" in reply.message
        summary = service.run_summary(created["run_id"])
        assert (summary["state"], summary["code"], summary["balance"]["reserved_usd"]) == ("interrupted", "actor_lost", 0.0)
        assert verify_audit(tmp_path / "runs" / created["run_id"] / "ledger.sqlite").ok
    finally:
        service.shutdown()


def test_keys_never_reach_the_disk_and_serve_stays_on_loopback_unless_told(tmp_path: Path, capsys):
    """The run key and the admin token are on no file the service writes (only their sha256 is), and
    `rsigym serve` refuses a non-loopback address without both --allow-remote and a token file."""
    from rsigym_env.gateway.auth import secret_hash
    from rsigym_env.gateway.cli import main as gateway_main

    service = SessionService(tmp_path / "state", admin_token=ADMIN)
    created = service.create_run(RunRequest(benchmark="aime", budget_usd=50, seed=1))
    run = service.backend_for_key(created["run_key"])
    run.call("read", {"ref": "budget"})
    service.shutdown()
    prefix, run_id, secret = created["run_key"].split("_", 2)  # rsr_<run id>_<token_urlsafe(32)>, which may hold "_"
    assert (prefix, run_id, len(secret)) == ("rsr", created["run_id"], 43)
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert secret.encode() not in data and ADMIN.encode() not in data, path
    meta = json.loads((tmp_path / "state" / "runs" / created["run_id"] / "run.json").read_text())
    assert meta["key_sha256"] == secret_hash(created["run_key"])
    token = tmp_path / "token"
    token.write_text(ADMIN)
    for argv in (["--host", "0.0.0.0"], ["--host", "0.0.0.0", "--allow-remote"],
                 ["--host", "192.0.2.1", "--admin-token-file", str(token)]):
        assert gateway_main(["serve", "--state-dir", str(tmp_path / "s2"), "--port", "0", *argv]) == 2
        assert "not a loopback address" in capsys.readouterr().out
