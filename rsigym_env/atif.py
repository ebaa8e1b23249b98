"""Research episodes as ATIF trajectories (Harbor's ``harbor.models.trajectories.Trajectory``).

Works on any run directory with a ``steps.jsonl``: those ``rsigym run`` writes (``{"step", "action",
"info"}`` per line, ``result.json`` at the end) and those of the session service (the same lines
plus ``"log"``, the text the researcher read; ``run.json`` and ``briefing.txt``). The trajectory has
a system step with the briefing, then one agent step per tool call: the call as an ATIF tool call,
what came back as its observation, and the call's cost, error code and budget left in the step's
``extra``; ``final_metrics`` has the spend and the reward (the normalized gain, once the episode
ended).

>>> import gymnasium as gym, json, tempfile, rsigym_env
>>> from rsigym_env.gateway.host import StepLog
>>> d = tempfile.mkdtemp()
>>> env = StepLog(gym.make("RSIGym/Joint-v0", world="sim", benchmark="aime", budget_usd=50), f"{d}/steps.jsonl")
>>> _ = env.reset(seed=0)
>>> _ = env.step({"tool": "evaluate", "args": {"k": 1, "n_tasks": 5}}); _ = env.step({"tool": "submit"})
>>> env.close()
>>> t = export_atif(d)
>>> [s.source for s in t.steps], t.steps[1].tool_calls[0].function_name, t.final_metrics.extra["reward"]
(['system', 'agent', 'agent'], 'evaluate', 0.0)
"""

from __future__ import annotations

import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from harbor.models.trajectories import (
    Agent, FinalMetrics, Observation, ObservationResult, Step, ToolCall, Trajectory,
)

from .scenario import Scenario
from .tools import TOOL_NAMES, tool_schemas
from .rundir import BRIEFING_FILE, RUN_FILE, STEPS_FILE, read_steps

END_KEYS = ("initial_score", "official_score", "normalized_gain", "end_reason", "spend_usd", "budget_usd",
            "best_dev_score", "submitted")


def _version() -> str:
    try:
        return version("rsigym-env")
    except PackageNotFoundError:
        return "0"


def _call(line: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The tool name and arguments of a recorded action, whatever form it was given in."""
    info = line.get("info") or {}
    action = line.get("action")
    if isinstance(action, str):
        try:
            action = json.loads(action)
        except ValueError:
            pass
    if isinstance(action, dict) and isinstance(action.get("args", {}), dict):
        name = action.get("tool", info.get("tool", "?"))
        return str(name), dict(action.get("args") or {})
    if isinstance(action, list) and len(action) == 2 and isinstance(action[0], int) and isinstance(action[1], dict):
        name = TOOL_NAMES[action[0]] if 0 <= action[0] < len(TOOL_NAMES) else "?"  # a space sample
        return str(info.get("tool", name)), {"space_sample": action[1]}
    return str(info.get("tool", "?")), {"action": action}


def _observed(line: dict[str, Any]) -> str:
    """What the researcher read: the recorded log, or (``rsigym run`` lines) a rendering of the info."""
    if isinstance(line.get("log"), str):
        return line["log"]
    info = line.get("info") or {}
    if not info.get("ok", False):
        text = f"ERROR {info.get('error')}: {info.get('message')}"
    else:
        text = json.dumps(info.get("result"), default=str)
    return "\n".join([text, *(str(e.get("text", "")) for e in info.get("events", []) if isinstance(e, dict))])


def export_atif(run_dir: str | os.PathLike[str]) -> Trajectory:
    """The ATIF trajectory of the episode recorded in ``run_dir`` (``ValueError`` if there is none)."""
    root = Path(run_dir)
    steps_path = root / STEPS_FILE
    if not steps_path.is_file():
        raise ValueError(f"{root} has no {STEPS_FILE}: not a run directory of `rsigym run` or `rsigym serve`")
    try:
        lines = read_steps(steps_path)
    except ValueError as exc:
        raise ValueError(f"{steps_path} is not JSON lines: {exc}") from None
    meta = json.loads((root / RUN_FILE).read_text()) if (root / RUN_FILE).is_file() else {}
    result = json.loads((root / "result.json").read_text()) if (root / "result.json").is_file() else {}
    scenario = meta.get("scenario") or {}
    name = scenario.get("name") or result.get("scenario") or root.name
    tools = Scenario.model_validate(scenario).tools() if scenario else list(TOOL_NAMES)
    briefing = (root / BRIEFING_FILE).read_text() if (root / BRIEFING_FILE).is_file() else (
        f"RSIGym research run '{name}'" + (f", seed {result['seed']}" if "seed" in result else ""))

    steps = [Step(step_id=1, source="system", message=briefing)]
    end: dict[str, Any] = {}
    spend = 0.0
    for line in lines:
        info = line.get("info") or {}
        tool, args = _call(line)
        call_id = f"call-{line.get('step', len(steps))}"
        extra = {k: info[k] for k in ("ok", "error", "message", "cost_usd", "budget_left_usd") if k in info}
        if info.get("result") is not None:
            extra["result"] = info["result"]
        if info.get("events"):
            extra["events"] = [{k: v for k, v in e.items() if k != "text"} for e in info["events"] if isinstance(e, dict)]
        steps.append(Step(step_id=len(steps) + 1, source="agent", message="",
                          tool_calls=[ToolCall(tool_call_id=call_id, function_name=tool, arguments=args)],
                          observation=Observation(results=[ObservationResult(source_call_id=call_id,
                                                                             content=_observed(line))]),
                          extra=extra or None))
        spend += float(info.get("cost_usd") or 0.0)
        if "normalized_gain" in info:
            end = {k: info[k] for k in END_KEYS if k in info}
    reward = end.get("normalized_gain", result.get("reward") if result else None)
    final_extra = {"reward": reward, **end}
    if meta.get("state"):
        final_extra["run_state"] = meta["state"] + (f" ({meta['code']})" if meta.get("code") else "")
    agent = Agent(name=meta.get("label") or result.get("researcher") or "rsigym-researcher", version=_version(),
                  tool_definitions=tool_schemas(tools),
                  extra={"surface": "rsigym serve" if meta else "rsigym run"})
    return Trajectory(
        session_id=meta.get("run_id") or root.name, agent=agent, steps=steps,
        final_metrics=FinalMetrics(total_steps=len(steps), total_cost_usd=round(spend, 9),
                                   extra=final_extra),
        notes="RSIGym research episode: one agent step per tool call; `extra` holds each call's cost, error "
              "code and budget left; final_metrics.total_cost_usd is the research spend (the official "
              "evaluation is outside the budget).",
        extra={"scenario": name, "track": scenario.get("track"), "world": scenario.get("world"),
               "benchmark": scenario.get("benchmark")})
