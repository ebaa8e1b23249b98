"""What a run's page shows, built from a :class:`~.model.RunState` and the run's other files.

:func:`run_view` gives the header figures, the timeline, jobs (with per-task results of dev
evaluations and loss curves of training), datasets with samples, harness versions with their diffs,
the end, the audit chain's status and the chart data (budget over steps and over world time, dev
scores of every candidate over time, loss curves, failure modes per evaluation).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from ..rundir import LEDGER_FILE, STEPS_FILE
from .model import RunReader, RunState, stat_sig, summary_of

_AUDIT: dict[str, tuple[Any, dict[str, Any]]] = {}
_AUDIT_LOCK = threading.Lock()


def audit_status(run_dir: Path) -> dict[str, Any]:
    """:func:`~rsigym_env.platform.audit.verify_audit` of the run's ledger (cached by the files' stats)."""
    from ..platform.audit import verify_audit

    ledger = run_dir / LEDGER_FILE
    sig = (stat_sig(ledger), stat_sig(Path(f"{ledger}-wal")))
    if sig[0] is None:
        return {"present": False, "ok": None, "text": "no ledger.sqlite in this run directory"}
    with _AUDIT_LOCK:
        cached = _AUDIT.get(str(ledger))
    if cached is not None and cached[0] == sig:
        return cached[1]
    report = verify_audit(ledger)
    out = {"present": True, "ok": report.ok, "records": report.records, "first_broken": report.first_broken,
           "text": str(report)}
    with _AUDIT_LOCK:
        _AUDIT[str(ledger)] = (sig, out)
        while len(_AUDIT) > 512:
            _AUDIT.pop(next(iter(_AUDIT)))
    return out


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600.0


def _legacy_evals(run_dir: Path, state: RunState) -> None:
    """Per-task results of older local-world runs, from ``evals/<job>/summary.json``."""
    for job in state.jobs.values():
        if job.get("kind") != "evaluate" or (job.get("result") or {}).get("tasks"):
            continue
        path = run_dir / "evals" / job["id"] / "summary.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        result = data.get("result") or {}
        if result.get("split") != "dev" or not result.get("task_ids"):
            continue
        job["result"] = {"kind": "evaluate", "ok": True, "split": "dev", "score": result.get("score"),
                         "checkpoint": result.get("checkpoint"), "harness": result.get("harness_version"),
                         "k": result.get("k"), "failure_modes": result.get("failure_modes") or {},
                         "tasks": [{"task": t, "rewards": r, "failures": f} for t, r, f in
                                   zip(result["task_ids"], result.get("rewards") or [], result.get("failures") or [])]}


def charts(state: RunState, budget: float | None) -> dict[str, Any]:
    """The chart data of a run's page (plotly traces are made from these in the browser)."""
    steps = state.steps
    xs = [s["step"] for s in steps]
    spent = [s.get("spent_usd") for s in steps]
    reserved = [s.get("reserved_usd") or 0.0 for s in steps]
    left = [s.get("budget_left_usd") for s in steps]
    world = [_hours(s.get("world_s")) for s in steps]
    has_world = any(w is not None for w in world)
    best = [s["dev"][1] for s in steps]
    candidates = []
    for name, points in state.candidates.items():
        use_world = has_world and all(p.get("world_s") is not None for p in points)
        candidates.append({"name": name, "x": [_hours(p["world_s"]) if use_world else p["step"] for p in points],
                           "y": [p["score"] for p in points], "jobs": [p["job"] for p in points],
                           "steps": [p["step"] for p in points]})
    loss = []
    for job in state.jobs.values():
        curve = (job.get("result") or {}).get("loss_curve")
        if curve:
            loss.append({"name": f"{job['id']} → {(job.get('result') or {}).get('checkpoint') or job.get('target')}",
                         "y": curve})
    evals = [j for j in state.jobs.values() if j.get("kind") == "evaluate"
             and ((j.get("result") or {}).get("failure_modes") is not None
                  or (j.get("event") or {}).get("failure_modes") is not None)]
    modes: dict[str, list[int]] = {}
    for i, job in enumerate(evals):
        found = (job.get("result") or {}).get("failure_modes") or (job.get("event") or {}).get("failure_modes") or {}
        for mode, n in found.items():
            modes.setdefault(mode, [0] * len(evals))[i] = int(n)
    return {
        "budget": budget, "steps": xs, "spent": spent, "reserved": reserved, "left": left,
        "world_h": world if has_world else None, "best": best, "candidates": candidates,
        "dev_x": "world hours" if has_world else "step", "loss": loss,
        "failures": {"jobs": [j["id"] for j in evals], "modes": modes},
    }


def run_view(run_dir: Path, reader: RunReader, stall_after_s: float, *, key: str,
             live: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the run page renders (see the module docstring)."""
    state = reader.state()
    row = summary_of(run_dir, stall_after_s, reader=reader)
    row["key"] = key
    if live is not None and row["status"] != "finished":
        row["state"] = live.get("state")
    _legacy_evals(run_dir, state)
    scenario = state.scenario or (reader.run_json or {}).get("scenario") or {}
    end = state.end
    if end is None and reader.result and "normalized_gain" in (reader.result.get("info") or {}):
        end = reader.result["info"]
    if end is None and reader.run_json and reader.run_json.get("end"):
        end = reader.run_json["end"]
    jobs = sorted(state.jobs.values(), key=lambda j: (j.get("started_step") or j.get("ended_step") or 0, j["id"]))
    versions = list(state.versions.values())
    for v in versions:
        base = v.get("base_version")
        v["diff"] = state.harness_diff(base, v["version"]) if base else None
    budget = row["budget_usd"]
    return {
        "key": key, "row": row, "scenario": scenario, "meta": state.meta, "steps": state.steps, "jobs": jobs,
        "datasets": list(state.datasets.values()), "versions": versions, "end": end, "legacy": state.legacy,
        "audit": audit_status(run_dir), "charts": charts(state, budget), "path": str(run_dir),
        "has_steps_file": (run_dir / STEPS_FILE).is_file(), "run_json": reader.run_json, "live": live,
        "n_steps": len(state.steps),
    }


__all__ = ["audit_status", "charts", "run_view"]
