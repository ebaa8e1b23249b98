"""Policy-side wrappers: tool calls for LLM policies, flat observations, dev-score shaping, the JSONL recorder."""

from __future__ import annotations

import doctest
import importlib
import json
import string
import warnings
from types import SimpleNamespace
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import rsigym_env
from rsigym_env.baselines import RandomResearcher, ScriptedResearcher
from rsigym_env.episode import run_episode
from rsigym_env.platform import verify_audit
from rsigym_env.tools import Evaluate, Submit, TOOL_NAMES
from rsigym_env.wrappers import (
    DevScoreShaping, FlatObservation, RecordEpisode, ToolCallWrapper, load_actions, parse_tool_call, read_episode,
)
from rsigym_env.wrappers.recorder import to_jsonable

WRAPPER_MODULES = ["rsigym_env.wrappers", "rsigym_env.wrappers.tool_calls", "rsigym_env.wrappers.flatten",
                   "rsigym_env.wrappers.shaping", "rsigym_env.wrappers.recorder"]


def make(env_id: str = "RSIGym/Joint-v0", **kwargs: Any) -> gym.Env:
    return gym.make(env_id, **{"benchmark": "aime", "budget_usd": 300, **kwargs})


def dumps(value: Any) -> str:
    return json.dumps(to_jsonable(value), sort_keys=True)


def scripted_actions(env_id: str = "RSIGym/Joint-v0", seed: int = 3, **kwargs: Any) -> list[Any]:
    actions: list[Any] = []
    result = run_episode(make(env_id, **kwargs), ScriptedResearcher(), seed=seed,
                         on_step=lambda i, action, obs, info: actions.append(action))
    assert result.terminated and len(actions) > 10
    return actions


def base_trace(actions: list[Any], seed: int = 3, env_id: str = "RSIGym/Joint-v0", **kwargs: Any) -> list[tuple]:
    env = make(env_id, **kwargs)
    obs, info = env.reset(seed=seed)
    trace = [(obs, 0.0, False, False, info)]
    for action in actions:
        trace.append(env.step(action))
    return trace


@pytest.mark.parametrize("name", WRAPPER_MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------------------------------- tool calls

def _args_text(action: dict) -> str:
    return json.dumps(action.get("args", {}))


def _sdk_call(action: dict) -> Any:
    try:
        from openai.types.chat import ChatCompletionMessageToolCall
    except ImportError:  # the SDK is an optional extra; its objects only need .function.name/.arguments
        return SimpleNamespace(id="call_1", type="function",
                               function=SimpleNamespace(name=action["tool"], arguments=_args_text(action)))
    return ChatCompletionMessageToolCall(id="call_1", type="function",
                                         function={"name": action["tool"], "arguments": _args_text(action)})


SHAPES: dict[str, Callable[[dict], Any]] = {
    "name+arguments text": lambda a: {"name": a["tool"], "arguments": _args_text(a)},
    "name+arguments object": lambda a: {"name": a["tool"], "arguments": a.get("args", {})},
    "tool_calls entry": lambda a: {"id": "call_9", "type": "function",
                                   "function": {"name": a["tool"], "arguments": _args_text(a)}},
    "sdk object": _sdk_call,
    "duck-typed object": lambda a: SimpleNamespace(function=SimpleNamespace(name=a["tool"], arguments=_args_text(a))),
    "responses-api item": lambda a: SimpleNamespace(type="function_call", call_id="c", name=a["tool"],
                                                    arguments=_args_text(a)),
    "tool+args": lambda a: {"tool": a["tool"], "args": a.get("args", {})},
    "json of name+arguments": lambda a: json.dumps({"name": a["tool"], "arguments": _args_text(a)}),
    "json of tool_calls entry": lambda a: json.dumps({"type": "function", "function": {"name": a["tool"],
                                                                                       "arguments": a.get("args", {})}}),
    "json of tool+args in a code fence": lambda a: "```json\n" + json.dumps(a) + "\n```",
    "assistant message": lambda a: {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": a["tool"], "arguments": _args_text(a)}}]},
    "anthropic tool_use": lambda a: {"type": "tool_use", "id": "t", "name": a["tool"], "input": a.get("args", {})},
}


def test_a_valid_call_in_every_shape_does_what_the_dict_action_does():
    actions = scripted_actions()
    assert all(isinstance(a, dict) for a in actions)
    expected = base_trace(actions)
    for shape, convert in SHAPES.items():
        env = ToolCallWrapper(make())
        log, info = env.reset(seed=3)
        got = [(log, 0.0, False, False, info)]
        for action in actions:
            got.append(env.step(convert(action)))
        assert len(got) == len(expected)
        for (log, r, term, trunc, info), (obs, r0, term0, trunc0, info0) in zip(got, expected):
            assert isinstance(log, str) and env.observation_space.contains(log), shape
            assert log == obs["log"], shape
            assert (r, term, trunc) == (r0, term0, trunc0), shape
            numbers = info.pop("observation")
            assert dumps(numbers) == dumps({k: v for k, v in obs.items() if k != "log"}), shape
            info.pop("tool_call", None)
            assert dumps(info) == dumps(info0), shape
        assert got[-1][2] and got[-1][1] == expected[-1][1]


def test_the_parsed_call_is_reported_and_tool_objects_pass_through():
    env = ToolCallWrapper(make())
    env.reset(seed=0)
    _, _, _, _, info = env.step({"name": "evaluate", "arguments": '{"k": 1, "n_tasks": 5}'})
    assert info["ok"] and info["tool_call"] == {"name": "evaluate", "arguments": {"k": 1, "n_tasks": 5}}
    _, _, terminated, _, info = env.step(Submit())
    assert terminated and info["ok"]
    assert parse_tool_call(Evaluate(k=2)) == Evaluate(k=2)


MALFORMED: list[Any] = [
    "", "   ", "not json at all", "{", "null", "42", "[]", '["a", "b"]',
    '{"name": "evaluate", "arguments": "{\\"k\\": 1"}',        # arguments: broken JSON text
    {"name": "evaluate", "arguments": '{"k": 1'},
    {"name": "evaluate", "arguments": "[1, 2]"},                # arguments not an object
    {"name": "evaluate", "arguments": 5},
    {"arguments": "{}"},                                        # no name
    {"name": "", "arguments": "{}"},
    {"name": None, "arguments": {}},
    {"name": 7, "arguments": {}},
    {"type": "function", "function": {"arguments": "{}"}},
    {"type": "function", "function": {"name": "evaluate", "arguments": "{oops}"}},
    {"type": "function", "function": "evaluate"},
    {"tool_calls": []},
    {"tool_calls": [{"function": {"name": "wait"}}, {"function": {"name": "submit"}}]},
    [],
    [{"name": "wait"}, {"name": "submit"}],
    {"tool": "evaluate", "args": "{broken"},
    {"tool": "evaluate", "args": [1]},
    {"name": "fly", "arguments": {}},                           # unknown tool (the env's check)
    {"name": "evaluate", "arguments": {"k": 99}},               # invalid arguments (the env's check)
    {"name": "evaluate", "arguments": {"no_such_field": 1}},
    "```json\n{\"name\": \"evaluate\", \"arguments\": {bad}}\n```",
    SimpleNamespace(function=SimpleNamespace(name=None, arguments="{}")),
    SimpleNamespace(function=SimpleNamespace(name="evaluate", arguments="{nope")),
    SimpleNamespace(something="else"),
    object(), 42, 3.5, None, b"\xff\xfe", {"a": {"b": {"c": 1}}},
    json.dumps(json.dumps(json.dumps(json.dumps(json.dumps(json.dumps('{"name": "wait"}')))))),
]


def test_every_malformed_call_is_a_free_audited_error_observation(tmp_path):
    env = ToolCallWrapper(make(max_steps=1000, ledger_path=tmp_path / "ledger.sqlite"))
    env.reset(seed=0)
    ledger = env.unwrapped.run.platform.ledger
    budget = env.unwrapped.run.budget_left
    for call in MALFORMED:
        records = ledger.audit_head()[0]
        log, reward, terminated, truncated, info = env.step(call)  # never raises
        assert not (terminated or truncated) and reward == 0, call
        assert info["ok"] is False and info["error"] in {"malformed_action", "unknown_tool", "invalid_args"}, call
        assert info["cost_usd"] == 0 and info["budget_left_usd"] == budget, call
        assert info["message"] and f"ERROR {info['error']}: {info['message']}" in log, call
        assert env.observation_space.contains(log), call
        assert ledger.audit_head()[0] == records + 1, call  # audited
        if "tool_call_error" in info:  # the wrapper's own diagnosis replaced the env's generic one
            assert info["message"].startswith(info["tool_call_error"]) and "env_message" in info, call
    log, _, terminated, _, info = env.step('{"name": "submit", "arguments": ""}')  # the env still works
    assert terminated and info["ok"]
    log, _, terminated, _, info = env.step("{")  # after the end, the env's own error wins
    assert terminated and info["error"] == "episode_over" and "call reset()" in log and "tool_call_error" in info
    env.close()
    report = verify_audit(tmp_path / "ledger.sqlite")
    assert report.ok and report.records >= len(MALFORMED) + 1


def test_malformed_arguments_message_names_the_problem():
    env = ToolCallWrapper(make())
    env.reset(seed=0)
    log, _, _, _, info = env.step({"name": "evaluate", "arguments": '{"k": 1'})
    assert "arguments of 'evaluate' are not valid JSON" in info["message"] and info["message"] in log
    _, _, _, _, info = env.step({"tool_calls": [{"function": {"name": "wait"}}] * 2})
    assert "one function call per step, got 2" in info["message"]
    _, _, _, _, info = env.step({"name": "fly", "arguments": {}})
    assert info["error"] == "unknown_tool" and "tool_call_error" not in info  # the env's message is clear


NEAR_JSON = [  # (call, the action it is): what models write when the intent is unambiguous
    ({"name": "edit_harness", "arguments": '{"path": "prompt.md", "content": "line 1\nline 2\tend"}'},
     {"tool": "edit_harness", "args": {"path": "prompt.md", "content": "line 1\nline 2\tend"}}),   # raw control chars
    ({"name": "evaluate", "arguments": '```json\n{"k": 1}\n```'}, {"tool": "evaluate", "args": {"k": 1}}),
    ({"name": "evaluate", "arguments": 'Arguments: {"k": 1} (one sample).'}, {"tool": "evaluate", "args": {"k": 1}}),
    ('I will call {"name": "wait", "arguments": {}} now.', {"tool": "wait", "args": {}}),
    ('{"name": "read", "arguments": {"ref": "a\nb"}}', {"tool": "read", "args": {"ref": "a\nb"}}),
]
STILL_REFUSED = [
    {"name": "evaluate", "arguments": '{"k": 1} or {"k": 2}'},   # two objects: ambiguous
    {"name": "evaluate", "arguments": "{'k': 1}"},               # not JSON at all
    {"name": "evaluate", "arguments": '{"k": 1'},                # cut off
    '{"name": "wait"} {"name": "submit"}',
]


@pytest.mark.parametrize("call, action", NEAR_JSON)
def test_near_json_arguments_are_accepted_when_unambiguous(call, action):
    assert parse_tool_call(call) == action
    env = ToolCallWrapper(make())
    env.reset(seed=0)
    _, _, _, _, info = env.step(call)
    assert info["tool"] == action["tool"] and "tool_call_error" not in info, info.get("message")
    assert info["ok"] or info["error"] not in {"malformed_action", "unknown_tool", "invalid_args"}  # read, then ran


def test_parse_action_reads_near_json_text_and_arguments_as_text():
    from rsigym_env.errors import ActionError
    from rsigym_env.tools import EditHarness, parse_action

    assert parse_action('{"tool": "evaluate", "args": {"k": 2}}') == Evaluate(k=2)
    assert parse_action({"tool": "evaluate", "args": '{"k": 2}'}) == Evaluate(k=2)
    assert parse_action({"tool": "evaluate", "args": "  "}) == Evaluate()
    text = '{"tool": "edit_harness", "args": {"path": "prompt.md", "content": "a\nb"}}'
    assert parse_action(text) == EditHarness(path="prompt.md", content="a\nb")
    with pytest.raises(ActionError, match="arguments of 'evaluate' are not valid JSON"):
        parse_action({"tool": "evaluate", "args": "{broken"})
    with pytest.raises(ActionError, match="nested deeper"):
        parse_action({"tool": "evaluate", "args": "[" * 20 + "]" * 20})


@pytest.mark.parametrize("call", STILL_REFUSED)
def test_ambiguous_or_broken_calls_are_still_refused(call):
    env = ToolCallWrapper(make())
    env.reset(seed=0)
    log, _, _, _, info = env.step(call)
    assert info["ok"] is False and info["error"] == "malformed_action" and info["cost_usd"] == 0, call


def test_a_refused_call_keeps_the_tools_name(tmp_path):
    env = ToolCallWrapper(make(ledger_path=tmp_path / "ledger.sqlite"))
    env.reset(seed=0)
    steps: list = []
    for call in [{"name": "evaluate", "arguments": '{"k": 1'},
                 {"type": "function", "function": {"name": "read", "arguments": "[1, 2]"}},
                 SimpleNamespace(function=SimpleNamespace(name="wait", arguments="{nope"))]:
        steps.append(env.step(call)[-1])
    assert [i["tool"] for i in steps] == ["evaluate", "read", "wait"]
    assert all(i["error"] == "malformed_action" and "tool_call_error" in i for i in steps)
    assert "arguments of 'evaluate' are not valid JSON" in steps[0]["message"]
    ledger = env.unwrapped.run.platform.ledger
    refused = [r.event for r in ledger.audit_records() if r.event.get("decision") == "refused"]
    assert [r["tool"] for r in refused] == ["evaluate", "read", "wait"]  # the audit log keeps it too
    env.close()


@pytest.mark.parametrize("env_id", rsigym_env.ENV_IDS)
def test_tool_schemas_are_the_scenarios_tools(env_id):
    env = ToolCallWrapper(make(env_id))
    names = [s["function"]["name"] for s in env.tool_schemas]
    assert names == list(env.unwrapped.scenario.tools())
    assert all(s["type"] == "function" and s["function"]["parameters"]["type"] == "object" for s in env.tool_schemas)
    assert env.action_space == spaces.Text(max_length=100_000, min_length=0, charset=string.printable)
    if env_id == "RSIGym/Harness-v0":
        assert "train" not in names and "edit_harness" in names


def test_tool_call_wrapper_passes_the_env_checker():
    env = ToolCallWrapper(make(max_steps=1000))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version")  # it is a wrapper
        check_env(env, skip_render_check=True)


# ---------------------------------------------------------------------------------------------- flat observation

WELL_FORMED = [{"tool": "evaluate", "args": {"k": 1, "n_tasks": 10}}, {"tool": "wait", "args": {}},
               {"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 50}},
               {"tool": "sandbox_exec", "args": {"command": "ls", "timeout_s": 600}}, {"tool": "read", "args": {"ref": "jobs"}}]


@pytest.mark.parametrize("env_id", rsigym_env.ENV_IDS)
def test_flat_observation_stays_in_its_box_on_random_rollouts(env_id):
    env = FlatObservation(make(env_id, max_steps=60))
    sampler = env.unwrapped.action_space
    sampler.seed(0)
    space = env.observation_space
    assert space.shape == (len(FlatObservation.FEATURES),) and space.dtype == np.float32
    budget = env.unwrapped.scenario.budget_usd
    obs, info = env.reset(seed=0)
    ends = 0
    for i in range(400):
        assert obs.dtype == np.float32 and space.contains(obs), obs
        action = sampler.sample() if i % 3 else WELL_FORMED[(i // 3) % len(WELL_FORMED)]
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs[0] == pytest.approx(min(info["budget_left_usd"], budget) / budget, abs=1e-6)
        assert obs[2] == pytest.approx(env.unwrapped.run.steps / 60, abs=1e-6)
        if terminated or truncated:
            ends += 1
            obs, info = env.reset(seed=i)
            assert obs[:7].tolist() == [1, 1, 0, -1, -1, -1, 0]
    assert ends >= 3


def test_flat_observation_follows_a_scripted_episode():
    base = make("RSIGym/Joint-v0")
    flat = FlatObservation(base)
    rows: list[np.ndarray] = []
    dicts: list[dict] = []

    def on_step(i, action, obs, info):
        rows.append(flat.observation(obs))
        dicts.append(obs)

    run_episode(base, ScriptedResearcher(), seed=1, on_step=on_step)
    features = FlatObservation.FEATURES
    for row, obs in zip(rows, dicts):
        assert flat.observation_space.contains(row)
        named = dict(zip(features, row.tolist()))
        assert [named["dev_initial"], named["dev_best"], named["dev_last"]] == pytest.approx(obs["dev_scores"].tolist())
        assert named["running_jobs"] == obs["running_jobs"][0]
        assert [named[f"mask_{t}"] for t in TOOL_NAMES] == obs["action_mask"].tolist()
    assert any(r[features.index("dev_best")] > 0 for r in rows)             # dev scores get measured
    assert any(r[features.index("running_jobs")] >= 1 for r in rows)        # jobs run
    assert rows[-1][features.index("budget_left_frac")] < 1                 # money gets spent
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version")
        check_env(FlatObservation(make(max_steps=1000)), skip_render_check=True)


# ---------------------------------------------------------------------------------------------- shaping

def _shaped_episode(env_id: str, researcher: Any, seed: int, gamma: float, scale: float, **kwargs: Any):
    env = DevScoreShaping(make(env_id, **kwargs), gamma=gamma, scale=scale)
    steps: list[tuple[float, float, float]] = []  # (shaped, unshaped, potential after)
    obs, info = env.reset(seed=seed)
    phi0 = env.potential()
    researcher.reset(obs, info, seed=seed)
    terminated = truncated = False
    while not (terminated or truncated):
        phi_before = env.potential()
        obs, reward, terminated, truncated, info = env.step(researcher.act(obs, info))
        best = obs["dev_scores"][1]
        expected_phi = 0.0 if (terminated or truncated) else (0.0 if best < 0 else best)
        assert info["potential"] == pytest.approx(expected_phi)
        assert reward - info["reward_unshaped"] == pytest.approx(scale * (gamma * expected_phi - phi_before))
        steps.append((reward, info["reward_unshaped"], info["potential"]))
    return phi0, steps, terminated


@pytest.mark.parametrize("gamma,scale", [(1.0, 1.0), (0.9, 1.0), (0.99, 5.0)])
@pytest.mark.parametrize("env_id", rsigym_env.ENV_IDS)
def test_shaped_returns_telescope_to_the_unshaped_return(env_id, gamma, scale):
    for researcher, seed, kwargs in [(ScriptedResearcher(), 2, {}), (RandomResearcher(), 4, {"max_steps": 25})]:
        phi0, steps, terminated = _shaped_episode(env_id, researcher, seed, gamma, scale, **kwargs)
        assert phi0 == 0.0  # nothing is measured at the start
        shaped = sum(gamma**t * r for t, (r, _, _) in enumerate(steps))
        unshaped = sum(gamma**t * u for t, (_, u, _) in enumerate(steps))
        assert shaped == pytest.approx(unshaped - scale * phi0, abs=1e-9)
        if isinstance(researcher, ScriptedResearcher):
            assert terminated and any(p > 0 for _, _, p in steps)        # the shaping did something
            assert any(abs(r - u) > 1e-6 for r, u, _ in steps)


def test_shaping_keeps_the_env_reward_in_info():
    actions = scripted_actions(seed=5)
    plain = base_trace(actions, seed=5)
    env = DevScoreShaping(make(), gamma=0.95)
    env.reset(seed=5)
    for action, (_, reward, *_) in zip(actions, plain[1:]):
        _, _, _, _, info = env.step(action)
        assert info["reward_unshaped"] == reward
    with pytest.raises(ValueError):
        DevScoreShaping(make(), gamma=1.5)


# ---------------------------------------------------------------------------------------------- recorder

def test_recorded_episode_replays_into_the_same_trajectory(tmp_path):
    actions = scripted_actions(seed=6)
    actions[2] = rsigym_env.parse_action(actions[2])           # a tool object
    actions.insert(3, '{"tool": "read", "args": {"ref": "budget"}}')  # JSON text
    actions.insert(4, {"tool": "read", "args": {"ref": np.str_("jobs")}})  # numpy inside a dict
    env = RecordEpisode(make(), tmp_path)
    env.reset(seed=6)
    for action in actions:
        *_, terminated, truncated, _ = env.step(action)
    assert terminated
    path, = env.paths
    assert path.name == "episode-000000-seed-6.jsonl"
    lines = read_episode(path)
    assert [l["type"] for l in lines] == ["reset"] + ["step"] * len(actions) + ["summary"]
    assert lines[0]["seed"] == 6 and lines[0]["info"]["scenario"] == env.unwrapped.scenario.name
    assert lines[3]["action_kind"] == "tool" and lines[3]["action"]["tool"] == actions[2].name
    assert lines[4]["action_kind"] == "text"
    summary = lines[-1]
    assert summary["ended"] and summary["terminated"] and summary["steps"] == len(actions)
    assert summary["return"] == pytest.approx(lines[-2]["reward"]) and summary["end"]["normalized_gain"] == lines[-2]["reward"]

    replayed = base_trace(load_actions(path), seed=6)
    assert len(replayed) == len(lines) - 1
    for line, (obs, reward, terminated, truncated, info) in zip(lines[1:-1], replayed[1:]):
        assert line["log"] == obs["log"]
        assert (line["reward"], line["terminated"], line["truncated"]) == (reward, terminated, truncated)
        assert json.dumps(line["info"], sort_keys=True) == dumps(info)


def test_sampled_actions_are_recorded_and_replay_exactly(tmp_path):
    env = RecordEpisode(make(max_steps=40), tmp_path)
    sampler = env.action_space
    sampler.seed(1)
    env.reset(seed=1)
    done = False
    while not done:
        *_, terminated, truncated, _ = env.step(sampler.sample())
        done = terminated or truncated
    lines = read_episode(env.paths[0])
    steps = [l for l in lines if l["type"] == "step"]
    end = lines[-1]["end"]  # refused calls use no step: the episode ends after 40 that ran or 40 refusals
    assert len(steps) == end["steps"] + end["refusals"] and 40 in (end["steps"], end["refusals"])
    assert all(l["action_kind"] == "space_sample" for l in steps)
    replayed = base_trace(load_actions(env.paths[0]), seed=1, max_steps=40)
    for line, (obs, _reward, _, _, info) in zip(steps, replayed[1:]):
        assert line["log"] == obs["log"] and json.dumps(line["info"], sort_keys=True) == dumps(info)
    assert lines[-1]["truncated"] and end["end_reason"] in ("step limit", "refusal limit")


def test_recording_is_deterministic_flushed_and_closed(tmp_path):
    actions = scripted_actions(seed=8)
    contents = []
    for folder in (tmp_path / "a", tmp_path / "b"):
        env = RecordEpisode(make(), folder)
        env.reset(seed=8)
        for i, action in enumerate(actions):
            env.step(action)
            if i == 2:  # flushed per line: readable while the episode runs
                assert [l["type"] for l in read_episode(env.paths[0])] == ["reset", "step", "step", "step"]
        env.close()
        contents.append(env.paths[0].read_text())
    assert contents[0] == contents[1]
    assert all(json.loads(line) for line in contents[0].splitlines())


def test_episode_counter_cut_episodes_and_shared_folders(tmp_path):
    env = RecordEpisode(make(), tmp_path, name_prefix="run")
    env.reset(seed=1)
    env.step({"tool": "evaluate", "args": {"k": 1}})
    env.reset()                                   # the first episode is cut short
    env.step({"tool": "submit", "args": {}})      # the second one ends
    env.reset(seed=2)
    env.close()                                   # the third is cut by close()
    assert [p.name for p in env.paths] == ["run-000000-seed-1.jsonl", "run-000001-seed-none.jsonl",
                                           "run-000002-seed-2.jsonl"]
    summaries = [read_episode(p)[-1] for p in env.paths]
    assert [s["ended"] for s in summaries] == [False, True, False]
    assert [s["steps"] for s in summaries] == [1, 1, 0]
    other = RecordEpisode(make(), tmp_path, name_prefix="run")  # a second writer never overwrites
    other.reset(seed=1)
    other.close()
    assert other.paths[0].name == "run-000000-seed-1-1.jsonl"
    assert read_episode(env.paths[0])[1]["action"] == {"tool": "evaluate", "args": {"k": 1}}


def test_recorder_over_the_tool_call_wrapper_records_text_and_sdk_calls(tmp_path):
    env = RecordEpisode(ToolCallWrapper(make()), tmp_path)
    env.reset(seed=0)
    calls = [_sdk_call({"tool": "evaluate", "args": {"k": 1}}), '{"name": "wait", "arguments": "{}"}',
             '{"name": "evaluate", "arguments": "{oops"}', {"name": "submit", "arguments": {}}]
    for call in calls:
        env.step(call)
    lines = read_episode(env.paths[0])
    steps = [l for l in lines if l["type"] == "step"]
    assert steps[0]["action"]["function"]["name"] == "evaluate" and steps[2]["info"]["error"] == "malformed_action"
    assert steps[-1]["terminated"] and lines[-1]["ended"]
    replay = ToolCallWrapper(make())
    replay.reset(seed=0)
    for line, action in zip(steps, load_actions(env.paths[0])):
        log, *_, info = replay.step(action)
        assert log == line["log"] and dumps(info) == json.dumps(line["info"], sort_keys=True)
