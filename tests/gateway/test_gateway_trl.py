"""The TRL ``environment_factory`` contract of :class:`RSIGymToolEnv`, checked the way TRL 1.16's
``GRPOTrainer`` uses it (read from its source): ``factory()``, ``inspect.getmembers(type(env),
inspect.isfunction)`` for the tools, ``reset(**row)``, ``tools[name](**arguments)``, ``get_reward()``."""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable

import pytest
from pydantic import ValidationError

from rsigym_env.gateway.trl_env import RSIGymToolEnv
from rsigym_env.tools import TOOL_NAMES, TOOLS_BY_NAME

FIX = {"path": "harness.toml", "old": 'on_truncation = "stop"', "new": 'on_truncation = "continue"'}


def trl_tools(env: Any) -> dict[str, Callable[..., Any]]:
    """What GRPOTrainer exposes as tools: public functions of the class except reset and get_reward."""
    members = inspect.getmembers(type(env), predicate=inspect.isfunction)
    assert "reset" in dict(members)
    methods = [getattr(env, n) for n, _ in members if n not in ("reset", "get_reward") and not n.startswith("_")]
    return {m.__name__: m for m in methods}


@pytest.fixture()
def env():
    with RSIGymToolEnv(benchmark="aime", budget_usd=50) as e:
        yield e


def test_the_tools_trl_finds_are_the_tool_models():
    env = RSIGymToolEnv()  # TRL calls the factory with no argument
    tools = trl_tools(env)
    assert sorted(tools) == sorted(TOOL_NAMES)
    for name, method in tools.items():
        model = TOOLS_BY_NAME[name]
        params = inspect.signature(method).parameters  # bound: no self
        assert list(params) == list(model.model_fields)
        for field_name, field in model.model_fields.items():
            param = params[field_name]
            assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.annotation == field.annotation
            assert param.default == (inspect.Parameter.empty if field.is_required() else field.default)
        # transformers' get_json_schema needs a description and an "Args:" line for every parameter
        doc = inspect.getdoc(method)
        assert doc.startswith(" ".join(model.__doc__.split())[:60])
        args_block = doc.split("Args:\n", 1)[1].split("\nReturns:", 1)[0]
        described = dict(re.findall(r"^\s+(\w+): (.+)$", args_block, flags=re.MULTILINE))
        assert described == {n: " ".join(f.description.split()) for n, f in model.model_fields.items()}
    assert callable(env.get_reward) and env.get_reward() == 0.0


def test_an_episode_played_as_trl_plays_it(env):
    briefing = env.reset(seed=3, prompt=[{"role": "user", "content": "improve it"}], answer=None, extra_column=3)  # seed 3: replies get cut off, so the fix pays (sim result version 5)
    assert "AIME" in briefing and "$50" in briefing
    tools = trl_tools(env)
    calls = [("evaluate", {"k": 1}), ("wait", {}), ("edit_harness", FIX), ("evaluate", {"k": 1}), ("wait", {})]
    texts = [str(tools[name](**arguments)) for name, arguments in calls]
    assert "started as job-1" in texts[0] and "finished: dev score" in texts[1]
    assert env.get_reward() == 0.0 and not env.done
    final = tools["submit"]()
    assert "submitted" in final and env.done
    assert env.get_reward() == env.reward == pytest.approx(env.last_reply.end["normalized_gain"]) and env.reward > 0
    assert "episode_over" in tools["read"](ref="budget")


def test_bad_tool_calls_return_the_refusal_and_cost_nothing(env):
    env.reset(seed=0)
    tools = trl_tools(env)
    bad = [("evaluate", {"k": "two"}, "invalid_args"), ("evaluate", {"k": 1, "admin": True}, "invalid_args"),
           ("generate_data", {}, "invalid_args"), ("read", {"ref": "job-7"}, "unknown_ref"),
           ("generate_data", {"teacher": "claude-opus-5", "n_examples": 20000}, "insufficient_budget"),
           ("train", {"dataset": "ds-1", "learning_rate": -1}, "invalid_args")]
    for name, arguments, code in bad:
        text = tools[name](**arguments)  # never raises: TRL would turn an exception into a bare error
        assert f"ERROR {code}" in text, (name, arguments, text)
    assert env.run.observation()["budget_left_usd"] == 50 and env.get_reward() == 0.0
    refused = [r.event for r in env._env.platform.ledger.audit_records() if r.event["decision"] == "refused"]
    assert [e["code"] for e in refused] == [code for _, _, code in bad]


def test_reset_starts_a_fresh_isolated_episode(env):
    first = env.reset(seed=0)
    env.evaluate(k=1)
    env.edit_harness(path="notes.md", content="episode one")
    assert env.reset(seed=0) == first  # same row, same episode
    assert env.run.observation()["budget_left_usd"] == 50 and env.reward == 0.0 and not env.done
    assert "ERROR unknown_ref" in env.read(ref="job-1")
    other = RSIGymToolEnv(benchmark="aime", budget_usd=50)  # one instance per rollout: runs do not mix
    other.reset(seed=0)
    env.evaluate(k=1)
    assert "no jobs yet" in other.read(ref="jobs")
    other._close()
    assert "GPQA" in env.reset(seed=1, benchmark="gpqa-diamond")  # a row may pick the benchmark
    with pytest.raises(ValidationError):
        env.reset(seed=-1)
    assert "ERROR no_episode" in RSIGymToolEnv().wait()
