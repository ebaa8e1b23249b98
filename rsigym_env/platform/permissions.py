"""Authorization: may this key make this call? Checks run before anything is reserved.

>>> from rsigym_env.scenario import load_scenario
>>> from rsigym_env.tools import Train
>>> data = load_scenario(track="data", benchmark="aime")
>>> authorize(data, Train(dataset="ds-1")).learning_rate     # locked value applied
0.0003
>>> authorize(data, Train(dataset="ds-1", num_epochs=3))
Traceback (most recent call last):
...
rsigym_env.errors.ActionError: train: 'num_epochs' is locked to 1 by this scenario (asked for 3)
"""

from __future__ import annotations

from typing import Any

from ..errors import ActionError
from ..scenario import TRAIN_FIELDS, Scenario
from ..tools import GenerateData, SandboxExec, Tool, Train


def authorize(scenario: Scenario, tool: Tool) -> Tool:
    """Return ``tool`` with locked training fields applied, or raise :class:`ActionError`."""
    allowed = scenario.tools()
    if tool.name not in allowed:
        raise ActionError(
            "forbidden_tool",
            f"the {scenario.track} track does not allow '{tool.name}'; allowed tools: {', '.join(allowed)}",
        )
    perms = scenario.permissions
    if isinstance(tool, GenerateData) and tool.teacher not in perms.teachers:
        raise ActionError(
            "teacher_not_allowed",
            f"teacher {tool.teacher!r} is not allowed; allowed teachers: {', '.join(perms.teachers)}",
        )
    if isinstance(tool, Train):
        return _authorize_train(scenario, tool)
    if isinstance(tool, SandboxExec) and tool.timeout_s > perms.sandbox.timeout_s:
        raise ActionError(
            "limit_exceeded",
            f"sandbox_exec: timeout_s={tool.timeout_s} exceeds the scenario's limit of {perms.sandbox.timeout_s} s",
        )
    return tool


def _authorize_train(scenario: Scenario, tool: Train) -> Train:
    policy = scenario.permissions.train
    asked = tool.model_fields_set
    for field, value in policy.lock.items():
        if field in asked and getattr(tool, field) != value:
            raise ActionError(
                "field_locked",
                f"train: {field!r} is locked to {value!r} by this scenario (asked for {getattr(tool, field)!r})",
            )
    if policy.allow != "*":
        for field in sorted((asked & set(TRAIN_FIELDS)) - set(policy.lock)):
            rule: Any = policy.allow.get(field, False)
            value = getattr(tool, field)
            default = Train.model_fields[field].default
            if rule is False and value != default:
                raise ActionError(
                    "field_not_allowed",
                    f"train: {field!r} is not exposed by this scenario; leave it at its default {default!r}",
                )
            if isinstance(rule, list) and value not in rule:
                raise ActionError(
                    "field_not_allowed",
                    f"train: {field}={value!r} is not allowed; allowed values: {rule}",
                )
    return tool.model_copy(update=policy.lock) if policy.lock else tool
