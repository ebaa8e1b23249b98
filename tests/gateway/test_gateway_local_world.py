"""Local-world runs in the session service: real servers per run, real files, the wall-clock ``wait``
cap, isolation of what the world keeps on disk, and a restart that interrupts them cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from rsigym_env.gateway.rest import create_app
from rsigym_env.serving.listen import BackgroundServer
from rsigym_env.gateway.service import SessionService
from rsigym_env.platform.audit import verify_audit

ADMIN = "rsa_test-admin-token-0123456789"
pytestmark = pytest.mark.slow


def test_two_local_world_runs_side_by_side_then_a_restart(tmp_path: Path):
    service = SessionService(tmp_path, admin_token=ADMIN)
    try:
        with BackgroundServer(create_app(service)) as server, httpx.Client(base_url=server.url, timeout=120) as http:
            made = [http.post("/v1/runs", json={"world": "local", "benchmark": "terminal-bench-2", "seed": s},
                              headers={"Authorization": f"Bearer {ADMIN}"}).json() for s in (1, 2)]
            a, b = ({"Authorization": f"Bearer {m['run_key']}"} for m in made)
            assert http.post("/v1/tools/evaluate", json={"k": 1, "n_tasks": 2}, headers=a).json()["ok"]
            waited = http.post("/v1/tools/wait", json={}, headers=a).json()
            assert waited["ok"] and waited["events"][0]["kind"] == "evaluate"
            task = http.get("/v1/jobs/job-1", headers=a).json()["result"]["task_ids"][0]
            mine = http.post("/v1/tools/read", json={"ref": f"job-1/{task}"}, headers=a).json()
            assert mine["ok"] and "attempt 0" in mine["text"]
            theirs = http.post("/v1/tools/read", json={"ref": f"job-1/{task}"}, headers=b)
            assert (theirs.status_code, theirs.json()["error"]) == (400, "unknown_ref")  # B's job-1 does not exist
            for ref in (f"job-1/../../{made[0]['run_id']}/evals/job-1", f"job-1/{task}/../../ledger.sqlite"):
                assert http.post("/v1/tools/read", json={"ref": ref}, headers=b).json()["ok"] is False
            started = http.post("/v1/tools/evaluate", json={"k": 1, "n_tasks": 3}, headers=b).json()
            assert started["ok"]
            capped = http.post("/v1/tools/wait", json={"timeout_s": 600}, headers=b).json()  # over the cap
            assert capped["ok"]
            steps = (tmp_path / "runs" / made[1]["run_id"] / "steps.jsonl").read_text().splitlines()
            assert json.loads(steps[-1])["action"]["args"]["timeout_s"] == 30.0
            assert http.post("/v1/tools/evaluate", json={"k": 3}, headers=b).json()["ok"]  # still running at the stop
    finally:
        service.shutdown()
    again = SessionService(tmp_path, admin_token=ADMIN)
    try:
        for m in made:
            summary = again.run_summary(m["run_id"])
            assert (summary["state"], summary["code"], summary["balance"]["reserved_usd"]) == (
                "interrupted", "service_restarted", 0.0)
            assert verify_audit(tmp_path / "runs" / m["run_id"] / "ledger.sqlite").ok
        reply = again.backend_for_key(made[1]["run_key"]).call("read", {"ref": "jobs"})
        assert reply.error == "run_interrupted"
    finally:
        again.shutdown()
