"""Authorization: tracks, teacher allowlists, RSIGym allow/lock, sandbox limits."""

from __future__ import annotations

import pytest

from rsigym_env.errors import ActionError
from rsigym_env.platform.permissions import authorize
from rsigym_env.scenario import Scenario, load_scenario
from rsigym_env.tools import EditHarness, GenerateData, SandboxExec, Train


def code_of(scenario: Scenario, tool) -> str | None:
    try:
        authorize(scenario, tool)
    except ActionError as err:
        return err.code
    return None


def test_track_tools():
    assert code_of(load_scenario(track="data"), EditHarness(path="a", content="x")) == "forbidden_tool"
    assert code_of(load_scenario(track="harness"), Train(dataset="d")) == "forbidden_tool"
    assert code_of(load_scenario(track="joint"), Train(dataset="d")) is None


def test_teacher_allowlist():
    s = load_scenario(permissions={"teachers": ["deepseek-v4.1-flash"]})
    assert code_of(s, GenerateData(teacher="claude-opus-5", n_examples=1)) == "teacher_not_allowed"
    assert code_of(s, GenerateData(teacher="deepseek-v4.1-flash", n_examples=1)) is None


def test_lock_forces_values_and_refuses_others():
    data = load_scenario(track="data")
    assert authorize(data, Train(dataset="d")).num_epochs == 1
    assert authorize(data, Train(dataset="d", learning_rate=3e-4)).learning_rate == 3e-4  # same value is fine
    assert code_of(data, Train(dataset="d", learning_rate=1e-3)) == "field_locked"


def test_allow_lists_and_unexposed_fields():
    s = load_scenario(permissions={"train": {"allow": {"num_epochs": [1, 2], "learning_rate": True}}})
    assert code_of(s, Train(dataset="d", num_epochs=2, learning_rate=1e-3)) is None
    assert code_of(s, Train(dataset="d", num_epochs=3)) == "field_not_allowed"
    assert code_of(s, Train(dataset="d", lora_rank=64)) == "field_not_allowed"
    assert code_of(s, Train(dataset="d", lora_rank=16)) is None  # the default is always fine


def test_sandbox_timeout_limit():
    s = load_scenario(permissions={"sandbox": {"timeout_s": 30}})
    assert code_of(s, SandboxExec(command="ls", timeout_s=31)) == "limit_exceeded"
    with pytest.raises(ActionError, match="exceeds the scenario's limit of 30 s"):
        authorize(s, SandboxExec(command="ls", timeout_s=600))
