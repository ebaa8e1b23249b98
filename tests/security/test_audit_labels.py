"""The audit says what happened: every record's ``decision`` (and ``code``) is true.

A whole sim episode with the scripted researcher, interleaved with deliberate refusals (malformed
JSON, an unknown tool, bad arguments, an unaffordable ``generate_data``, a tool the harness track
forbids), on a file ledger. Each step's records are the ones whose ``seq`` it added. A refused step
has exactly one refused record, whose ``code`` is the step's ``info["error"]``; every other record
(reserve, settle, release, record of calls that ran) says ``allowed`` and carries no error code;
releases say why in ``reason``.

Before the fix every successful reservation was audited as ``decision: "refused"``, ``code:
"insufficient_budget"`` and every release as ``code: <reason>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401  (registers the environments)
from rsigym_env.baselines import make_researcher
from rsigym_env.errors import InsufficientBudget
from rsigym_env.platform.audit import verify_audit
from rsigym_env.platform.core import Platform
from rsigym_env.scenario import load_scenario
from rsigym_env.tools import parse_action

MALFORMED = '{"tool": "evaluate", "args": {'
UNKNOWN = {"tool": "fly", "args": {}}
BAD_ARGS = {"tool": "evaluate", "args": {"k": "many", "n_tasks": -3}}
UNAFFORDABLE = {"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 20_000,
                                                   "max_tokens_per_example": 32_768}}
FORBIDDEN = {"tool": "train", "args": {"dataset": "ds-1"}}  # the harness track has no train

INJECT = {0: MALFORMED, 2: UNKNOWN, 4: BAD_ARGS, 5: UNAFFORDABLE, 7: MALFORMED.encode()}
EXPECTED = {0: "malformed_action", 2: "unknown_tool", 4: "invalid_args", 5: "insufficient_budget",
            7: "malformed_action"}


def run(track: str, ledger_path: Path, inject: dict[int, Any]) -> tuple[list[tuple[Any, dict[str, Any], range]], Any]:
    """Play the scripted researcher, stepping ``inject[i]`` instead at step ``i``; per step (action,
    info, the audit seqs it added)."""
    env = gym.make(f"RSIGym/{track}-v0", world="sim", benchmark="aime", budget_usd=50, ledger_path=ledger_path)
    researcher = make_researcher("scripted")
    obs, info = env.reset(seed=3)  # a system with the defects the scripted researcher fixes: a long episode
    researcher.reset(obs, info, seed=3)
    ledger = env.unwrapped.platform.ledger
    steps: list[tuple[Any, dict[str, Any], range]] = []
    seen = (obs, info)  # the researcher only sees the results of its own actions
    done = False
    while not done:
        i = len(steps)
        action = inject[i] if i in inject else researcher.act(*seen)
        before = ledger.audit_head()[0]
        obs, _, terminated, truncated, step_info = env.step(action)
        steps.append((action, step_info, range(before + 1, ledger.audit_head()[0] + 1)))
        if i not in inject:
            seen = (obs, step_info)
        done = terminated or truncated
        assert len(steps) < 300
    return steps, env


@pytest.mark.parametrize("track", ["Joint", "Harness"])
def test_every_record_says_what_happened(tmp_path: Path, track: str) -> None:
    inject = dict(INJECT)
    expected = dict(EXPECTED)
    if track == "Harness":  # generate_data is forbidden there too: the key refuses it before the budget
        expected[5] = "forbidden_tool"
        inject[9], expected[9] = FORBIDDEN, "forbidden_tool"
    path = tmp_path / "ledger.sqlite"
    steps, env = run(track, path, inject)
    records = {r.seq: r.event for r in env.unwrapped.platform.ledger.audit_records()}
    env.close()
    assert verify_audit(path).ok

    owned = set()
    for i, (_action, info, seqs) in enumerate(steps):
        events = [records[s] for s in seqs]
        owned.update(seqs)
        refused = [e for e in events if e["decision"] == "refused"]
        if i in expected:
            assert not info["ok"] and info["error"] == expected[i], (i, info)
        if not info["ok"]:
            assert len(refused) == 1, (i, info, events)
            assert refused[0]["code"] == info["error"] and refused[0]["tool"] == info["tool"]
        else:
            assert refused == [], (i, info, refused)
        for e in events:
            assert e["decision"] in ("allowed", "refused"), e
            if e["decision"] == "allowed":
                assert "code" not in e and "message" not in e, e
            if e["op"] == "release":
                assert isinstance(e.get("reason"), str) and e["reason"], e
            if e["op"] in ("reserve", "settle", "release", "recover"):
                assert e["decision"] == "allowed", e
            if e["op"] == "refuse":
                assert e["decision"] == "refused" and e["code"] == info["error"], e
    assert owned == set(records), "records outside any step"
    assert set(expected) <= {i for i, (_, info, _) in enumerate(steps) if not info["ok"]}
    ops = {e["op"] for e in records.values()}
    allowed_paid = [e for e in records.values() if e["op"] == "reserve"]
    assert "refuse" in ops or track == "Harness"
    assert allowed_paid and all(e["decision"] == "allowed" and "code" not in e for e in allowed_paid)
    assert steps[-1][1].get("submitted", {}).get("by") == "agent"  # the researcher got to the end


def test_releases_carry_their_reason_not_an_error_code() -> None:
    platform = Platform()
    key = platform.issue_key(load_scenario(budget_usd=10))
    tool = parse_action({"tool": "infer", "args": {"model": "base", "prompt": "hi"}})
    with pytest.raises(ZeroDivisionError):
        with platform.charge(key, tool, quote_usd=1.0):
            1 / 0  # noqa: B018 (raises)
    with platform.charge(key, tool, quote_usd=1.0):
        pass  # never settled
    with platform.charge(key, tool, quote_usd=1.0) as bill:
        bill.settle(0.25)
    bill = platform.open(key, tool, quote_usd=1.0)
    platform.release(bill, "job_failed")
    platform.release(bill, "job_failed")  # once only
    events = [r.event for r in platform.ledger.audit_records()]
    assert [(e["op"], e.get("reason")) for e in events] == [
        ("reserve", None), ("release", "ZeroDivisionError"), ("reserve", None), ("release", "unsettled"),
        ("reserve", None), ("settle", None), ("reserve", None), ("release", "job_failed")]
    assert all(e["decision"] == "allowed" and "code" not in e and e["tool"] == "infer" for e in events)
    with pytest.raises(InsufficientBudget):
        platform.open(key, tool, quote_usd=100.0)
    refusal = platform.ledger.audit_records()[-1].event
    assert (refusal["op"], refusal["decision"], refusal["code"]) == ("refuse", "refused", "insufficient_budget")
