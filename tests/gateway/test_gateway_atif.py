"""Episodes as ATIF trajectories, from run directories of ``rsigym run`` and of the session service."""

from __future__ import annotations

import json
from pathlib import Path

from harbor.models.trajectories import Trajectory

from rsigym_env.cli import main as rsigym_main
from rsigym_env.atif import export_atif
from rsigym_env.gateway.cli import main as gateway_main
from rsigym_env.gateway.service import RunRequest, SessionService

ADMIN = "rsa_test-admin-token-0123456789"


def check_against_steps(trajectory: Trajectory, run_dir: Path) -> list[dict]:
    """One agent step per recorded line, in order, with the call, its cost and errors; valid ATIF."""
    lines = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    again = Trajectory.model_validate(trajectory.to_json_dict())  # what a Harbor consumer would load
    assert again == trajectory
    assert trajectory.steps[0].source == "system" and len(trajectory.steps) == len(lines) + 1
    for step, line in zip(trajectory.steps[1:], lines):
        (call,) = step.tool_calls
        assert step.source == "agent" and call.function_name == line["info"]["tool"]
        assert call.arguments == line["action"]["args"]
        assert step.observation.results[0].source_call_id == call.tool_call_id
        assert step.extra["cost_usd"] == line["info"]["cost_usd"] and step.extra["ok"] == line["info"]["ok"]
        if not line["info"]["ok"]:
            assert step.extra["error"] == line["info"]["error"]
    spend = sum(line["info"]["cost_usd"] for line in lines)
    assert abs(trajectory.final_metrics.total_cost_usd - spend) < 1e-6
    assert trajectory.final_metrics.total_steps == len(trajectory.steps)
    return lines


def test_a_run_directory_of_rsigym_run_exports_as_a_valid_trajectory(tmp_path: Path):
    run_dir = tmp_path / "run"
    assert rsigym_main(["run", "--world", "sim", "--benchmark", "gpqa-diamond", "--seed", "2",
                        "--run-dir", str(run_dir), "-q"]) == 0
    trajectory = export_atif(run_dir)
    lines = check_against_steps(trajectory, run_dir)
    result = json.loads((run_dir / "result.json").read_text())
    assert trajectory.final_metrics.extra["reward"] == result["reward"] == lines[-1]["info"]["normalized_gain"]
    assert trajectory.agent.name == "scripted" and trajectory.extra["scenario"] == result["scenario"]
    assert gateway_main(["export", "atif", str(run_dir), "--out", str(tmp_path / "t.json")]) == 0
    assert Trajectory.model_validate_json((tmp_path / "t.json").read_text()) == trajectory


def test_a_service_run_exports_what_the_researcher_read(tmp_path: Path):
    service = SessionService(tmp_path / "state", admin_token=ADMIN)
    created = service.create_run(RunRequest(track="harness", benchmark="aime", seed=3, label="claude-code"))
    run = service.backend_for_key(created["run_key"])
    calls = [("read", {"ref": "harness:latest/harness.toml"}), ("generate_data", {"teacher": "x", "n_examples": 1}),
             ("edit_harness", {"path": "harness.toml", "old": 'on_truncation = "stop"', "new": 'on_truncation = "continue"'}),
             ("evaluate", {"k": 1, "n_tasks": 10}), ("wait", {}), ("submit", {})]
    replies = [run.call(tool, args) for tool, args in calls]
    service.shutdown()
    run_dir = tmp_path / "state" / "runs" / created["run_id"]
    trajectory = export_atif(run_dir)
    check_against_steps(trajectory, run_dir)
    assert [s.observation.results[0].content for s in trajectory.steps[1:]] == [r.text for r in replies]
    assert trajectory.steps[0].message == created["briefing"]
    assert trajectory.steps[2].extra["error"] == "forbidden_tool"
    assert trajectory.final_metrics.extra["reward"] == replies[-1].reward
    assert trajectory.agent.name == "claude-code" and trajectory.session_id == created["run_id"]
    assert {t["function"]["name"] for t in trajectory.agent.tool_definitions} == set(created["tools"])


def test_export_refuses_what_is_not_a_run_directory_and_skips_a_torn_last_line(tmp_path: Path, capsys):
    assert gateway_main(["export", "atif", str(tmp_path)]) == 2
    assert "no steps.jsonl" in capsys.readouterr().out
    (tmp_path / "steps.jsonl").write_text(json.dumps({"step": 1, "action": {"tool": "read", "args": {"ref": "budget"}},
                                                      "info": {"tool": "read", "ok": True, "cost_usd": 0.0}})
                                          + "\n" + '{"step": 2, "act')
    trajectory = export_atif(tmp_path)
    assert len(trajectory.steps) == 2 and trajectory.final_metrics.extra["reward"] is None
