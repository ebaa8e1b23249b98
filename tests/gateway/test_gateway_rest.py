"""The session service over real HTTP (uvicorn on a loopback port): episodes, keys, refusals, isolation.

Every test here that takes the ``gateway`` fixture runs twice: runs in the service's process, and
runs in Ray actors (a local Ray, 2 CPUs).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gateway_helpers import oldest_python
from rsigym_env.gateway.backend import LocalRun, ToolReply
from rsigym_env.gateway.host import research_env
from rsigym_env.gateway.remote import RemoteRun
from rsigym_env.gateway.rest import STATUS, create_app
from rsigym_env.serving.listen import BackgroundServer
from rsigym_env.gateway.service import RunRequest, SessionService, resolve_scenario
from rsigym_env.gateway.skills import EXAMPLES, examples, write_skills
from rsigym_env.platform.audit import verify_audit
from rsigym_env.platform.ledger import Ledger
from rsigym_env.tools import TOOLS, TOOLS_BY_NAME

ADMIN = "rsa_test-admin-token-0123456789"
EPISODE = ["generate_data", "wait", "transform_data", "wait", "train", "wait", "infer", "edit_harness",
           "sandbox_exec", "evaluate", "read", "submit", "wait", "wait"]
"""The skill documents' example calls, in an order in which each one's ids exist: a whole episode (data
making and submit's official evaluation are jobs too, so a `wait` follows each; the last `wait`s end it)."""


@dataclass
class Gateway:
    url: str
    service: SessionService
    http: httpx.Client

    def create(self, **body: Any) -> dict[str, Any]:
        r = self.http.post("/v1/runs", json=body, headers=auth(ADMIN))
        assert r.status_code == 201, r.text
        return r.json()

    def call(self, key: str, tool: str, args: Any = None) -> tuple[int, dict[str, Any]]:
        r = self.http.post(f"/v1/tools/{tool}", json={} if args is None else args, headers=auth(key))
        return r.status_code, r.json()

    def get(self, key: str, path: str) -> httpx.Response:
        return self.http.get(path, headers=auth(key))

    def ledger(self, run_id: str) -> Path:
        return self.service.runs_dir / run_id / "ledger.sqlite"

    def run_dir(self, run_id: str) -> Path:
        return self.service.runs_dir / run_id


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.slow)])
def gateway(request: pytest.FixtureRequest, tmp_path: Path):
    ray_address = None
    if request.param == "ray":
        request.getfixturevalue("ray_session")
        ray_address = "auto"
    service = SessionService(tmp_path / "state", admin_token=ADMIN, ray_address=ray_address)
    try:
        with BackgroundServer(create_app(service)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
            yield Gateway(server.url, service, http)
    finally:
        service.shutdown()


def open_readonly(path: Path) -> Ledger:
    return Ledger(path, readonly=True) if "readonly" in Ledger.__init__.__code__.co_varnames else Ledger(path)


def ledger_key(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["ledger_key"]


def books_balance(run_dir: Path, spent_by_replies: float) -> None:
    """The audit chain verifies, nothing is left reserved, and the ledger's spend is what the replies said."""
    path = run_dir / "ledger.sqlite"
    assert verify_audit(path).ok
    with open_readonly(path) as ledger:
        balance = ledger.balance(ledger_key(run_dir))
        if hasattr(ledger, "books"):
            assert ledger.books().ok, ledger.books().problems
    assert balance.reserved_usd == 0.0
    assert balance.spent_usd == pytest.approx(spent_by_replies, abs=1e-6)
    assert balance.spent_usd + balance.available_usd == pytest.approx(balance.budget_usd)


def twin(request: RunRequest, calls: list[tuple[str, dict[str, Any]]]) -> list[ToolReply]:
    """The same calls on the same scenario and seed, in this process (no service)."""
    run = LocalRun(research_env(resolve_scenario(request)), seed=request.seed)
    try:
        return [run.call(tool, args) for tool, args in calls]
    finally:
        run.close()


# --------------------------------------------------------------------------------------------
# whole episodes


def test_a_whole_episode_runs_through_the_documented_curl_calls(gateway: Gateway):
    """Each tool skill's curl example, run by bash against the service, makes one step of an episode that
    ends in a submission; replies equal those of the same calls in-process; the books balance."""
    request = RunRequest(benchmark="aime", budget_usd=500, seed=11, label="curl")
    created = gateway.create(**request.model_dump(exclude_none=True))
    env = {**os.environ, "RSIGYM_URL": gateway.url, "RSIGYM_RUN_KEY": created["run_key"]}
    replies = []
    for tool in EPISODE:
        curl, _ = examples(TOOLS_BY_NAME[tool])
        done = subprocess.run(["bash", "-c", curl + " -w '\\n%{http_code}'"], env=env, capture_output=True, text=True,
                              timeout=60, check=True)
        body, status = done.stdout.rsplit("\n", 1)
        reply = ToolReply.model_validate_json(body)
        replies.append(reply)
        if reply.done:
            break
        assert (int(status), reply.ok) == (200, True), reply.text
    assert replies[-1].done and replies[-1].reward is not None and replies[-1].end["submitted"]["by"] == "agent"
    expected = twin(request, [(t, EXAMPLES[t]) for t in EPISODE[:len(replies)]])
    assert [r.text for r in replies] == [r.text for r in expected]
    assert replies[-1].reward == expected[-1].reward
    status, after = gateway.call(created["run_key"], "read", {"ref": "jobs"})
    assert (status, after["error"]) == (409, "episode_over")
    books_balance(gateway.run_dir(created["run_id"]), sum(r.cost_usd for r in replies))
    listed = {r["run_id"]: r for r in gateway.http.get("/v1/runs", headers=auth(ADMIN)).json()["runs"]}
    assert listed[created["run_id"]]["state"] == "done" and listed[created["run_id"]]["reward"] == replies[-1].reward


def test_a_whole_episode_runs_through_the_standalone_rsigym_call(gateway: Gateway, tmp_path: Path):
    """The client ``rsigym skills`` writes, run by an old Python without site-packages (-I -S: only the
    standard library), plays the documented rsigym-call forms to a submission; refusals exit 1 naming
    the code, views print JSON."""
    if gateway.service.ray_address is not None:
        pytest.skip("the client does not care where runs live; once is enough")
    write_skills(tmp_path / "skills")
    client = tmp_path / "skills" / "rsigym" / "scripts" / "rsigym-call"
    python = oldest_python()
    created = gateway.create(benchmark="gpqa-diamond", budget_usd=500, seed=5)
    env = {"PATH": os.environ["PATH"], "RSIGYM_URL": gateway.url, "RSIGYM_RUN_KEY": created["run_key"]}

    def cli(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([python, "-I", "-S", str(client), *argv], env=env, capture_output=True, text=True,
                              input=stdin, timeout=60)

    for tool in EPISODE:
        _, form = examples(TOOLS_BY_NAME[tool])
        done = cli(*shlex.split(form)[1:])
        assert done.stdout.startswith("[step "), done.stdout
        if "normalized gain" in done.stdout:
            break
        assert done.returncode == 0, (form, done.stdout, done.stderr)
    assert "normalized gain" in done.stdout
    refused = cli("read", "ref=jobs")
    assert refused.returncode == 1 and "rsigym-call: episode_over:" in refused.stderr
    balance = cli("balance")
    assert balance.returncode == 0 and json.loads(balance.stdout)["reserved_usd"] == 0.0
    whole = cli("--json", "read", "-", stdin='{"ref": "budget"}')
    assert whole.returncode == 1 and json.loads(whole.stdout)["error"] == "episode_over"
    assert cli("read", "ref").returncode == 2  # not NAME=VALUE
    env["RSIGYM_RUN_KEY"] = created["run_key"][:-2] + "xx"
    wrong = cli("read", "ref=budget")
    assert wrong.returncode == 1 and "unauthorized" in wrong.stderr
    env["RSIGYM_URL"] = "http://127.0.0.1:9"  # nothing listens on the discard port
    assert cli("read", "ref=budget").returncode == 3


# --------------------------------------------------------------------------------------------
# keys, permissions, money


def forged_keys(real: str, other: str) -> list[str | None]:
    """Keys an attacker might try: none, empty, malformed, this run's id with another secret, the other
    run's secret under this id, near misses of the real key, the admin token, something huge."""
    run_id, secret = real[4:20], real[21:]
    return [None, "", "Bearer", real[:-1], real + "A", real.upper(), real[:21] + other[21:],
            other[:21] + secret, f"rsr_{'0' * 16}_{secret}", ADMIN, "x" * 10_000, f"rsr_{run_id}_",
            real.replace("_", "-")]


def test_a_missing_or_wrong_key_is_401_everywhere_and_costs_the_run_nothing(gateway: Gateway):
    run = gateway.create(benchmark="aime", budget_usd=100, seed=1)
    other = gateway.create(benchmark="aime", budget_usd=100, seed=2)
    steps_before = gateway.get(run["run_key"], "/v1/observation").json()["step"]
    audit_before = len(verify_audit_records(gateway.ledger(run["run_id"])))
    for key in forged_keys(run["run_key"], other["run_key"]):
        headers = {} if key is None else {"Authorization": f"Bearer {key}".strip()}
        for method, path, body in [("POST", "/v1/tools/evaluate", {"k": 1}), ("POST", "/v1/tools/fly", {}),
                                   ("GET", "/v1/balance", None), ("GET", "/v1/jobs", None),
                                   ("GET", "/v1/jobs/job-1", None), ("GET", "/v1/observation", None),
                                   ("GET", "/v1/run", None), ("GET", "/v1/tools", None)]:
            r = gateway.http.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (key, path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert r.json()["error"] == "unauthorized"
            if method == "POST":
                ToolReply.model_validate(r.json())  # tool routes always answer a ToolReply
        for method, path in [("GET", "/v1/runs"), ("POST", "/v1/runs"), ("GET", f"/v1/runs/{run['run_id']}"),
                             ("DELETE", f"/v1/runs/{run['run_id']}")]:
            if key == ADMIN:
                continue
            r = gateway.http.request(method, path, json={"benchmark": "aime"}, headers=headers)
            assert r.status_code == 401, (key, path, r.text)
    for key in (run["run_key"], "Basic " + run["run_key"]):  # a run key is not an admin token, nor another scheme
        r = gateway.http.get("/v1/runs", headers={"Authorization": key if key.startswith("Basic") else f"Bearer {key}"})
        assert r.status_code == 401
    assert gateway.get(run["run_key"], "/v1/observation").json()["step"] == steps_before
    assert len(verify_audit_records(gateway.ledger(run["run_id"]))) == audit_before
    assert gateway.get(run["run_key"], "/v1/balance").json()["spent_usd"] == 0.0


def verify_audit_records(path: Path) -> list[Any]:
    with open_readonly(path) as ledger:
        return ledger.audit_records()


@pytest.mark.parametrize("track, tool, args, code", [
    ("harness", "generate_data", {"teacher": "claude-opus-5", "n_examples": 10}, "forbidden_tool"),
    ("harness", "train", {"dataset": "ds-1"}, "forbidden_tool"),
    ("data", "edit_harness", {"path": "harness.toml", "content": "x"}, "forbidden_tool"),
    ("data", "train", {"dataset": "ds-1", "learning_rate": 0.001}, "field_locked"),
    ("joint", "generate_data", {"teacher": "gpt-4-not-allowed", "n_examples": 10}, "teacher_not_allowed"),
])
def test_what_the_key_does_not_allow_is_403_audited_and_free(gateway: Gateway, track, tool, args, code):
    run = gateway.create(track=track, benchmark="aime", budget_usd=100, seed=3)
    assert (tool in run["tools"]) == (code != "forbidden_tool")
    status, reply = gateway.call(run["run_key"], tool, args)
    assert (status, reply["error"], reply["cost_usd"]) == (403, code, 0.0)
    assert gateway.get(run["run_key"], "/v1/balance").json() == {
        "budget_usd": 100.0, "spent_usd": 0.0, "reserved_usd": 0.0, "remaining_usd": 100.0}
    refused = [r.event for r in verify_audit_records(gateway.ledger(run["run_id"])) if r.event.get("decision") == "refused"]
    assert [(e["tool"], e["code"]) for e in refused] == [(tool, code)]


def test_an_exhausted_budget_is_402_insufficient_budget_and_never_goes_negative(gateway: Gateway):
    run = gateway.create(benchmark="swe-bench-verified", budget_usd=2.0, seed=4)
    key = run["run_key"]
    status, reply = gateway.call(key, "generate_data", {"teacher": "claude-opus-5", "n_examples": 5000})
    assert (status, reply["error"], reply["cost_usd"]) == (402, "insufficient_budget", 0.0)
    spent = []
    for _ in range(40):  # spend it down with small calls until the service refuses them
        status, reply = gateway.call(key, "generate_data", {"teacher": "claude-opus-5", "n_examples": 20,
                                                            "max_tokens_per_example": 2048})
        if reply.get("done"):
            break
        if status == 402:
            assert reply["error"] == "insufficient_budget"
            break
        assert status == 200, reply
        spent.append(reply["cost_usd"])
    else:
        pytest.fail("the budget never ran out")
    balance = gateway.get(key, "/v1/balance").json()
    assert balance["remaining_usd"] >= 0 and balance["spent_usd"] <= 2.0 and balance["reserved_usd"] == 0.0
    assert balance["spent_usd"] == pytest.approx(sum(spent), abs=1e-6)
    assert verify_audit(gateway.ledger(run["run_id"])).ok


# --------------------------------------------------------------------------------------------
# isolation


def test_concurrent_runs_cannot_see_or_touch_each_others_artifacts(gateway: Gateway):
    """Run A makes datasets, jobs, a checkpoint and a harness version while B runs at the same time;
    no id, ref or route lets B read or change any of A's things, and A's books are A's alone."""
    a = gateway.create(benchmark="aime", budget_usd=500, seed=7)
    b = gateway.create(benchmark="aime", budget_usd=500, seed=8)
    ka, kb = a["run_key"], b["run_key"]
    errors: list[str] = []

    def drive_b() -> None:  # B keeps calling while A works
        for _ in range(30):
            status, reply = gateway.call(kb, "read", {"ref": "artifacts"})
            if status != 200 or json.loads(reply["text"].split("\n", 1)[1])["datasets"]:
                errors.append(f"B saw {reply['text'][:200]}")

    thread = threading.Thread(target=drive_b)
    thread.start()
    _, ds = gateway.call(ka, "generate_data", {"teacher": "claude-opus-5", "n_examples": 50})
    _, _ = gateway.call(ka, "wait", {"job": ds["result"]["job"]})
    _, job = gateway.call(ka, "train", {"dataset": ds["result"]["dataset"]})
    _, _ = gateway.call(ka, "wait", {"job": job["result"]["job"]})
    _, edit = gateway.call(ka, "edit_harness", {"path": "harness.toml", "old": "persistent = false",
                                                "new": "persistent = true"})
    _, ev = gateway.call(ka, "evaluate", {"checkpoint": job["result"]["checkpoint"], "k": 1, "n_tasks": 5})
    thread.join()
    assert errors == []
    a_ids = {"dataset": ds["result"]["dataset"], "job": job["result"]["job"], "checkpoint": job["result"]["checkpoint"],
             "version": edit["result"]["version"], "eval": ev["result"]["job"]}
    for ref in [a_ids["dataset"], a_ids["job"], a_ids["checkpoint"], a_ids["eval"], f"harness:{a_ids['version']}",
                f"harness:{a_ids['version']}/harness.toml", f"{a_ids['eval']}/task-0",
                f"../{a['run_id']}/ledger.sqlite", f"{a_ids['dataset']}:rows"]:
        status, reply = gateway.call(kb, "read", {"ref": ref})
        assert (status, reply["error"]) == (400, "unknown_ref"), (ref, reply["text"])
    for tool, args in [("train", {"dataset": a_ids["dataset"]}), ("evaluate", {"checkpoint": a_ids["checkpoint"]}),
                       ("infer", {"model": a_ids["checkpoint"], "prompt": "hi"}),
                       ("wait", {"job": a_ids["eval"]}), ("submit", {"checkpoint": a_ids["checkpoint"]}),
                       ("edit_harness", {"path": "x.md", "content": "x", "base_version": a_ids["version"]})]:
        status, reply = gateway.call(kb, tool, args)
        assert reply["ok"] is False and reply["error"] == "unknown_ref" and reply["cost_usd"] == 0.0, (tool, reply)
    for job_id in (a_ids["job"], a_ids["eval"], "..", "%2e%2e", "job-1%2F..%2Fledger"):
        r = gateway.get(kb, f"/v1/jobs/{job_id}")
        assert r.status_code == 404 and r.json()["error"] in ("unknown_job", "not_found"), (job_id, r.text)
    assert gateway.get(kb, "/v1/jobs").json() == {"jobs": []}
    assert gateway.get(ka, f"/v1/jobs/{a_ids['job']}").json()["status"] == "finished"
    assert gateway.http.delete(f"/v1/runs/{a['run_id']}", headers=auth(kb)).status_code == 401
    balance_b = gateway.get(kb, "/v1/balance").json()
    assert balance_b["spent_usd"] == 0.0 and gateway.get(ka, "/v1/balance").json()["spent_usd"] > 0
    b_keys = {r.key for r in verify_audit_records(gateway.ledger(b["run_id"])) if r.key}
    assert b_keys == {ledger_key(gateway.run_dir(b["run_id"]))}  # B's books hold B's key only


# --------------------------------------------------------------------------------------------
# the schema, hostile input


def test_openapi_has_one_route_per_tool_whose_body_is_the_tool_model(gateway: Gateway):
    spec = gateway.http.get("/openapi.json").json()
    for cls in TOOLS:
        op = spec["paths"][f"/v1/tools/{cls.name}"]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert spec["components"]["schemas"][ref.rsplit("/", 1)[1]] == cls.model_json_schema()
        assert {"200", "401", "402", "403", "422"} <= set(op["responses"])
        assert op["security"] == [{"HTTPBearer": []}]
    assert "/v1/balance" in spec["paths"] and "/v1/runs" in spec["paths"]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                           max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(tool=st.sampled_from([c.name for c in TOOLS] + ["fly", "x" * 300, "..", "%00"]),
       args=st.dictionaries(st.sampled_from(["k", "ref", "job", "checkpoint", "teacher", "n_examples", "path",
                                             "content", "dataset", "datasets", "timeout_s", "extra"]),
                            json_values, max_size=4) | json_values)
def test_arbitrary_json_never_crashes_the_server_and_refusals_are_free(fuzz_gateway, tool, args):
    gateway, key = fuzz_gateway
    before = gateway.get(key, "/v1/balance").json()
    body = json.dumps(args)  # Infinity and -Infinity included: Python's json reads them
    r = gateway.http.post(f"/v1/tools/{tool}", content=body, headers={**auth(key), "Content-Type": "application/json"})
    assert r.status_code in {200, 400, 402, 403, 404, 409, 422}, r.text
    if r.json().get("error") == "not_found":  # ".." leaves the tool routes
        return
    reply = ToolReply.model_validate(r.json())
    assert r.status_code == (200 if reply.ok else STATUS.get(reply.error, 400))
    after = gateway.get(key, "/v1/balance").json()
    if not reply.ok:
        assert after["spent_usd"] == before["spent_usd"] and after["reserved_usd"] == before["reserved_usd"]
    assert after["remaining_usd"] >= 0


@pytest.fixture(scope="module")
def fuzz_gateway(tmp_path_factory: pytest.TempPathFactory):
    service = SessionService(tmp_path_factory.mktemp("fuzz"), admin_token=ADMIN)
    with BackgroundServer(create_app(service)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        gateway = Gateway(server.url, service, http)
        run = gateway.create(benchmark="aime", budget_usd=1000, max_steps=100_000, seed=9)
        yield gateway, run["run_key"]
    service.shutdown()


def test_malformed_bodies_are_refused_clearly_and_the_server_keeps_serving(gateway: Gateway):
    run = gateway.create(benchmark="aime", budget_usd=100, seed=10)
    key = run["run_key"]
    h = {**auth(key), "Content-Type": "application/json"}
    cases = [(b"{not json", 422, "malformed_action"), (b"[" * 200_000, 422, "malformed_action"),
             (b'"a string"', 422, "malformed_action"), (b"[1, 2]", 422, "malformed_action"),
             (b"\xff\xfe\x00garbage", 422, "malformed_action"), (b'{"ref": "\\ud800"}', None, None),
             (b'{"k": 1e999}', 422, "invalid_args"), (b'{"k": 1, "k": 2, "evil": true}', 422, "invalid_args")]
    for body, status, code in cases:
        r = gateway.http.post("/v1/tools/read" if b"ref" in body else "/v1/tools/evaluate", content=body, headers=h)
        if status is None:  # a lone surrogate: refused, whichever check sees it first
            assert (r.status_code, r.json()["error"]) in {(400, "unknown_ref"), (422, "invalid_args")}, body
        else:
            assert (r.status_code, r.json()["error"]) == (status, code), body[:40]
        assert r.json()["budget_left_usd"] == 100.0  # the run's money, even when the gateway refuses
    big = gateway.http.post("/v1/tools/read", content=b'{"ref": "' + b"x" * (2 << 20) + b'"}', headers=h)
    assert (big.status_code, big.json()["error"]) == (413, "payload_too_large")
    def chunks():
        for _ in range(40):
            yield b"x" * 65536
    streamed = gateway.http.post("/v1/tools/read", content=chunks(), headers=h)  # no Content-Length
    assert streamed.status_code == 413
    assert gateway.http.post("/v1/runs", content=b"{oops", headers=auth(ADMIN)).json()["error"] == "invalid_args"
    assert gateway.http.post("/v1/runs", json={"scenario": "../x"}, headers=auth(ADMIN)).status_code == 422
    assert gateway.http.post("/v1/runs", json={"scenario_yaml": "extends: /etc/passwd"},
                             headers=auth(ADMIN)).json()["error"] == "invalid_scenario"
    assert gateway.http.post("/v1/runs", json={"world": "nowhere"}, headers=auth(ADMIN)).json()["error"] == "invalid_scenario"
    assert gateway.http.get("/health").json() == {"ok": True}
    status, reply = gateway.call(key, "read", {"ref": "budget"})
    assert status == 200 and reply["cost_usd"] == 0.0
    assert gateway.get(key, "/v1/balance").json()["spent_usd"] == 0.0


# --------------------------------------------------------------------------------------------
# admin, closing, the Python client


def test_admin_lists_closes_and_limits_runs(gateway: Gateway):
    gateway.service.max_active_runs = 2
    a = gateway.create(benchmark="aime", seed=1, label="a")
    b = gateway.create(scenario="sim-harness-aime-500", seed=2)
    assert b["track"] == "harness" and "edit_harness" in b["tools"] and "train" not in b["tools"]
    r = gateway.http.post("/v1/runs", json={"benchmark": "aime"}, headers=auth(ADMIN))
    assert (r.status_code, r.json()["error"]) == (429, "too_many_runs")
    _, job = gateway.call(a["run_key"], "evaluate", {"k": 1})
    assert gateway.get(a["run_key"], "/v1/balance").json()["reserved_usd"] > 0
    closed = gateway.http.delete(f"/v1/runs/{a['run_id']}", headers=auth(ADMIN)).json()
    assert (closed["state"], closed["code"], closed["balance"]["reserved_usd"]) == ("closed", "deleted", 0.0)
    status, reply = gateway.call(a["run_key"], "read", {"ref": "jobs"})
    assert (status, reply["error"]) == (410, "run_closed")
    assert gateway.get(a["run_key"], "/v1/balance").status_code == 410
    events = [r.event for r in verify_audit_records(gateway.ledger(a["run_id"]))]
    assert events[-1]["tool"] == "run_closed" and verify_audit(gateway.ledger(a["run_id"])).ok
    gateway.create(benchmark="aime")  # a slot is free again
    runs = gateway.http.get("/v1/runs", headers=auth(ADMIN)).json()["runs"]
    assert [r["state"] for r in runs].count("closed") == 1 and len(runs) == 3
    assert gateway.http.get("/v1/runs/nope", headers=auth(ADMIN)).status_code == 404
    assert "seed" not in gateway.get(b["run_key"], "/v1/run").json()  # the researcher never learns the seed


def test_remote_run_is_a_run_backend_over_http(gateway: Gateway):
    created = gateway.create(benchmark="aime", budget_usd=50, seed=12)
    run = RemoteRun.from_env({"RSIGYM_URL": gateway.url, "RSIGYM_RUN_KEY": created["run_key"]})
    try:
        reply = run.call("evaluate", {"k": 1, "n_tasks": 5})
        assert reply.ok and reply.result["job"] == "job-1"
        assert run.observation()["running_jobs"] == 1 and run.jobs()[0]["status"] == "running"
        assert run.job("job-1")["kind"] == "evaluate" and run.job("job-9") is None
        assert run.balance()["reserved_usd"] > 0
        assert run.call("evaluate", {"k": "x"}).error == "invalid_args"
        assert run.call("wait", {}).events[0]["job"] == "job-1"
    finally:
        run.close()
    key = created["run_key"]
    wrong = RemoteRun(gateway.url, key[:-1] + ("Q" if key[-1] != "Q" else "R"))  # one character off
    assert wrong.call("read", {"ref": "budget"}).error == "unauthorized"
    assert RemoteRun("http://127.0.0.1:9", "k", timeout_s=2).call("read", {}).error == "service_unreachable"
    backend = gateway.service.backend_for_key(created["run_key"])
    assert backend is not None and backend.call("read", {"ref": "budget"}).ok
    assert gateway.service.backend_for_key(created["run_key"] + "x") is None


class _SlowSandbox:
    """The sim's sandbox, except that a command takes real time: a call that holds its run's lock."""

    def __init__(self, inner: Any, seconds: float):
        self.inner, self.seconds = inner, seconds

    def quote(self, call: Any) -> Any:
        return self.inner.quote(call)

    def exec(self, call: Any) -> Any:
        time.sleep(self.seconds)
        return self.inner.exec(call)


def test_one_key_cannot_tie_up_the_workers_every_run_shares(tmp_path: Path):
    """Many concurrent calls on one run: beyond the per-run limit they are refused at once (429), and
    another run keeps answering promptly meanwhile."""
    from rsigym_env.worlds import WORLDS, register_world, world_factory

    def slow_world(scenario, seed, run_dir):
        world = world_factory("sim")(scenario, seed, run_dir)
        world.sandbox = _SlowSandbox(world.sandbox, 1.0)
        return world

    register_world("slow-sim-test", slow_world)
    service = SessionService(tmp_path, admin_token=ADMIN, max_inflight_per_run=2)
    try:
        with BackgroundServer(create_app(service)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
            gateway = Gateway(server.url, service, http)
            slow = gateway.create(world="slow-sim-test", benchmark="aime", budget_usd=100, seed=1)
            fast = gateway.create(benchmark="aime", seed=2)
            statuses: list[int] = []

            def hammer() -> None:
                with httpx.Client(base_url=server.url, timeout=60) as own:
                    r = own.post("/v1/tools/sandbox_exec", json={"command": "true"}, headers=auth(slow["run_key"]))
                    statuses.append(r.status_code)

            threads = [threading.Thread(target=hammer) for _ in range(8)]
            for t in threads:
                t.start()
            time.sleep(0.2)
            status, _ = gateway.call(fast["run_key"], "read", {"ref": "budget"})
            admitted_done = statuses.count(200)
            for t in threads:
                t.join()
            assert status == 200 and admitted_done < 2  # the other run answered while the slow one was busy
            assert statuses.count(429) >= 5 and set(statuses) <= {200, 429}, statuses
    finally:
        service.shutdown()
        WORLDS.pop("slow-sim-test", None)
