"""Tools: one pydantic model each → validation, JSON schema and Gymnasium subspace agree."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsigym_env.errors import ActionError
from rsigym_env.tools import (
    TOOL_NAMES, Evaluate, Train, action_space, from_space_sample, parse_action, to_space_sample, tool_schemas,
)

EXAMPLES = {
    "generate_data": {"teacher": "claude-opus-5", "n_examples": 100},
    "transform_data": {"operation": "mix", "datasets": ["ds-1", "ds-2"]},
    "train": {"dataset": "ds-1", "learning_rate": 1e-4, "num_epochs": 2},
    "infer": {"model": "base", "prompt": "hello"},
    "edit_harness": {"path": "harness.toml", "old": "a", "new": "b"},
    "sandbox_exec": {"command": "ls"},
    "evaluate": {"checkpoint": "ckpt-1", "k": 2, "n_tasks": 10},
    "read": {"ref": "job-1"},
    "wait": {"job": "job-1"},
    "submit": {"checkpoint": "ckpt-1", "harness": "h-123"},
}


def test_every_tool_has_an_example_and_a_schema():
    assert set(EXAMPLES) == set(TOOL_NAMES)
    schemas = {s["function"]["name"]: s["function"] for s in tool_schemas()}
    assert list(schemas) == list(TOOL_NAMES)
    for name, fn in schemas.items():
        assert fn["description"], name
        assert fn["parameters"]["type"] == "object"
        assert fn["parameters"]["additionalProperties"] is False
        assert set(EXAMPLES[name]) <= set(fn["parameters"]["properties"])
    train = schemas["train"]["parameters"]
    assert train["required"] == ["dataset"]
    assert train["properties"]["learning_rate"]["maximum"] == 0.01
    assert train["properties"]["lr_schedule"]["enum"] == ["constant", "linear", "cosine"]


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_all_action_forms_give_the_same_tool(name):
    as_dict = {"tool": name, "args": EXAMPLES[name]}
    tool = parse_action(as_dict)
    assert tool.name == name
    assert parse_action(json.dumps(as_dict)) == tool
    assert parse_action(tool) is tool
    assert parse_action(to_space_sample(tool)) == tool  # a space element round-trips
    assert action_space().contains(to_space_sample(tool))


@pytest.mark.parametrize(
    "action, code, fragment",
    [
        ("{not json", "malformed_action", "not valid JSON"),
        (42, "malformed_action", "got int"),
        ({"args": {}}, "malformed_action", '"tool" is missing'),
        ({"tool": "train", "args": {}, "extra": 1}, "malformed_action", "unexpected: extra"),
        ({"tool": "fly"}, "unknown_tool", "unknown tool 'fly'"),
        ({"tool": "train", "args": []}, "malformed_action", '"args" must be an object'),
        ({"tool": "train", "args": {}}, "invalid_args", "dataset: Field required"),
        ({"tool": "train", "args": {"dataset": "d", "learning_rate": 1.0}}, "invalid_args", "learning_rate"),
        ({"tool": "evaluate", "args": {"k": 0}}, "invalid_args", "k: Input should be greater than or equal to 1"),
        ({"tool": "wait", "args": {"jobb": "x"}}, "invalid_args", "jobb: Extra inputs are not permitted"),
        ((99, {}), "unknown_tool", "out of range"),
    ],
)
def test_bad_actions_say_exactly_what_is_wrong(action, code, fragment):
    with pytest.raises(ActionError) as err:
        parse_action(action)
    assert err.value.code == code
    assert fragment in err.value.message


def test_space_samples_are_mostly_valid_tools():
    space = action_space(seed=0)
    valid = 0
    for _ in range(2000):
        sample = space.sample()
        try:
            tool = from_space_sample(sample)
        except ActionError as err:  # e.g. an edit with neither content nor old/new: step reports it
            assert err.code == "invalid_args", err
        else:
            valid += 1
            assert tool.name == TOOL_NAMES[sample[0]]
    assert valid > 1800


def test_optional_fields_round_trip_as_none():
    tool = Evaluate(k=2)
    index, values = to_space_sample(tool)
    assert values["n_tasks"] < 1  # the sentinel below the range
    assert from_space_sample((index, values)).n_tasks is None
    assert Train.model_fields["lora_rank"].default == 16


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(
    JSONISH,
    st.fixed_dictionaries({"tool": st.sampled_from(TOOL_NAMES + ("nope",)), "args": JSONISH}),
    st.builds(lambda name, args: {"tool": name, "args": args}, st.sampled_from(TOOL_NAMES),
              st.dictionaries(st.sampled_from(["k", "n_tasks", "dataset", "teacher", "n_examples", "ref", "job",
                                               "learning_rate", "path", "content", "old", "new", "command"]),
                              JSONISH, max_size=5)),
    st.text(max_size=80),
    st.tuples(st.integers(-3, 12), JSONISH),
))
def test_parsing_never_raises_anything_but_action_error(action):
    try:
        tool = parse_action(action)
    except ActionError as err:
        assert err.code in {"malformed_action", "unknown_tool", "invalid_args"}
        assert err.message
    else:
        assert tool.name in TOOL_NAMES
        assert parse_action(tool.model_dump() and {"tool": tool.name, "args": tool.model_dump()}) == tool
