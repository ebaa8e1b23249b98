"""Tools: one pydantic model each → validation, JSON schema and Gymnasium subspace agree."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsigym_env.errors import ActionError
from rsigym_env.tools import (
    SCHEMA_MAX_LENGTH, SCHEMA_MAX_LENGTH_ENV, TOOL_NAMES, TOOLS, Evaluate, Train, action_space, from_space_sample,
    parse_action, to_space_sample, tool_schemas,
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


# --------------------------------------------------------------------------------------------
# LLM-facing schemas: string limits that grammar-constrained decoders compile


def _string_limits(schema: Any) -> list[int]:
    if isinstance(schema, dict):
        own = [schema["maxLength"]] if "maxLength" in schema else []
        return own + [n for value in schema.values() for n in _string_limits(value)]
    if isinstance(schema, list):
        return [n for value in schema for n in _string_limits(value)]
    return []


def _parameters(**options: Any) -> dict[str, dict[str, Any]]:
    return {s["function"]["name"]: s["function"]["parameters"] for s in tool_schemas(**options)}


def test_llm_schemas_cap_string_limits_and_validation_keeps_the_models(monkeypatch):
    monkeypatch.delenv(SCHEMA_MAX_LENGTH_ENV, raising=False)
    capped, exact = _parameters(), _parameters(max_string_length=None)
    assert SCHEMA_MAX_LENGTH == 1000
    assert max(n for p in capped.values() for n in _string_limits(p)) == 1000
    assert exact == {t.name: {k: v for k, v in t.model_json_schema().items() if k not in ("title", "description")}
                     | {"properties": {n: {k: v for k, v in prop.items() if k != "title"}
                                       for n, prop in t.model_json_schema()["properties"].items()}}
                     for t in TOOLS}  # None: exactly the models' schemas
    assert max(_string_limits(exact["edit_harness"])) == 200_000 and max(_string_limits(exact["infer"])) == 50_000
    content = capped["edit_harness"]["properties"]["content"]
    assert content["anyOf"][0]["maxLength"] == 1000
    assert content["description"].startswith("New full content of the file. At most 1,000 characters in this schema "
                                              "(the tool accepts up to 200,000). A longer file goes in parts")
    assert "`cat >> job.sh" in capped["sandbox_exec"]["properties"]["command"]["description"]
    assert capped["read"] == exact["read"] and capped["train"] == exact["train"]  # nothing over the cap: unchanged
    for name in TOOL_NAMES:  # only limits and descriptions differ
        assert capped[name]["required" if "required" in capped[name] else "type"] == \
            exact[name]["required" if "required" in exact[name] else "type"]
        assert list(capped[name]["properties"]) == list(exact[name]["properties"])
    # the tools still take what their models take: a client that sends more than the schema shows is not refused
    assert len(parse_action({"tool": "edit_harness", "args": {"path": "p.md", "content": "x" * 150_000}}).content) == 150_000
    with pytest.raises(ActionError, match="content"):
        parse_action({"tool": "edit_harness", "args": {"path": "p.md", "content": "x" * 200_001}})


def test_schema_string_limit_options(monkeypatch):
    monkeypatch.delenv(SCHEMA_MAX_LENGTH_ENV, raising=False)
    assert set(n for p in _parameters(max_string_length=64).values() for n in _string_limits(p)) == {64}
    assert max(_string_limits(_parameters(max_string_length=0)["edit_harness"])) == 200_000  # 0: no cap
    monkeypatch.setenv(SCHEMA_MAX_LENGTH_ENV, "300")
    assert max(n for p in _parameters().values() for n in _string_limits(p)) == 300
    assert max(_string_limits(_parameters(max_string_length=700)["infer"])) == 700  # an explicit value wins
    monkeypatch.setenv(SCHEMA_MAX_LENGTH_ENV, "none")
    assert max(_string_limits(_parameters()["edit_harness"])) == 200_000
    monkeypatch.setenv(SCHEMA_MAX_LENGTH_ENV, "lots")
    with pytest.raises(ValueError, match=r"\$RSIGYM_SCHEMA_MAX_LENGTH must be a whole number"):
        tool_schemas()
    with pytest.raises(ValueError, match="max_string_length must be"):
        tool_schemas(max_string_length=-5)


def test_rsigym_tools_json_takes_a_max_length(capsys, monkeypatch):
    from rsigym_env.cli import main

    monkeypatch.delenv(SCHEMA_MAX_LENGTH_ENV, raising=False)
    for flags, top in (([], 1000), (["--max-length", "250"], 250), (["--max-length", "none"], 200_000)):
        assert main(["tools", "--json", *flags]) == 0
        assert max(n for s in json.loads(capsys.readouterr().out) for n in _string_limits(s)) == top


def test_llm_schemas_stay_within_llama_cpp_repetition_limit():
    """llama.cpp compiles ``maxLength: N`` to ``char{0,N}`` (``maxItems`` likewise) and its GBNF parser refuses
    a repetition of ``MAX_REPETITION_THRESHOLD`` (2000) or more (older builds crash generating under it)."""
    for params in _parameters().values():
        assert all(n < 2000 for n in _string_limits(params))
        assert all(n < 2000 for n in _limits(params, "maxItems"))


def _limits(schema: Any, key: str) -> list[int]:
    if isinstance(schema, dict):
        return ([schema[key]] if key in schema else []) + [n for v in schema.values() for n in _limits(v, key)]
    if isinstance(schema, list):
        return [n for v in schema for n in _limits(v, key)]
    return []


def _sample(schema: dict[str, Any], required_first: bool = False) -> Any:
    """Schema-valid arguments with every string at its maxLength (properties in schema order, or required first
    as llama.cpp orders them)."""
    if "anyOf" in schema:
        return _sample(next(s for s in schema["anyOf"] if s.get("type") != "null"), required_first)
    if "enum" in schema:
        return schema["enum"][-1]
    kind = schema.get("type")
    if kind == "string":
        return "a" * schema.get("maxLength", 8)
    if kind in ("integer", "number"):
        return schema.get("maximum", schema.get("minimum", 1))
    if kind == "array":
        return [_sample(schema["items"], required_first) for _ in range(schema.get("maxItems", 1))]
    props = schema.get("properties", {})
    required = schema.get("required", [])
    order = [*required, *(k for k in props if k not in required)] if required_first else list(props)
    return {k: _sample(props[k], required_first) for k in order}


def _any_call(params: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One schema for any tool call, as servers build their tool-call grammars."""
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": name}, "arguments": p},
                       "required": ["name", "arguments"], "additionalProperties": False} for name, p in params.items()]}


VOCAB = [chr(c) for c in range(32, 127)] + ['{"', '"}', '": "', '", "', '":', '",', "aaaa", "null"]
EOS = len(VOCAB)


def _tokens(text: str) -> list[int]:
    index = {t: i for i, t in enumerate(VOCAB)}
    out, i = [], 0
    while i < len(text):
        n = next(n for n in (4, 3, 2, 1) if text[i:i + n] in index)
        out.append(index[text[i:i + n]])
        i += n
    return out


def _llguidance(schema: dict[str, Any], text: str) -> bool:
    llguidance = pytest.importorskip("llguidance")

    class Tokenizer:
        eos_token_id, bos_token_id, special_token_ids = EOS, None, [EOS]
        tokens = [t.encode() for t in VOCAB] + [b"<eos>"]

        def __call__(self, s: Any) -> list[int]:
            return _tokens(s.decode() if isinstance(s, bytes) else s)

    matcher = llguidance.LLMatcher(llguidance.LLTokenizer(llguidance.TokenizerWrapper(Tokenizer())),
                                   llguidance.LLMatcher.grammar_from_json_schema(schema))
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(_tokens(text)) and matcher.is_accepting()


def _outlines_core(schema: dict[str, Any], text: str) -> bool:
    outlines_core = pytest.importorskip("outlines_core")
    from outlines_core.json_schema import build_regex_from_schema

    index = outlines_core.Index(build_regex_from_schema(json.dumps(schema)),
                                outlines_core.Vocabulary(EOS, {t: [i] for i, t in enumerate(VOCAB)}))
    state = index.get_initial_state()
    for token in _tokens(text):
        state = index.get_next_state(state, token)
        if state is None:
            return False
    return index.is_final_state(state)


def _xgrammar(schema: dict[str, Any], text: str) -> bool:
    xgr = pytest.importorskip("xgrammar")  # needs PyTorch to import
    info = xgr.TokenizerInfo([*VOCAB, "<eos>"], vocab_type=xgr.VocabType.RAW, stop_token_ids=[EOS])
    compiled = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False).compile_json_schema(
        json.dumps(schema), any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    return matcher.accept_string(json.dumps(json.loads(text))) and matcher.accept_token(EOS)


@pytest.mark.parametrize("engine", [_llguidance, _outlines_core, _xgrammar], ids=["llguidance", "outlines-core", "xgrammar"])
def test_every_tool_schema_compiles_under_grammar_engines(engine):
    """Each tool's LLM-facing schema, and one grammar over all of them, compiles with the grammar engine, which
    then accepts a call whose every string is at its (capped) maxLength; skipped where the engine is not installed."""
    params = _parameters(max_string_length=SCHEMA_MAX_LENGTH)
    for name, schema in params.items():
        assert engine(schema, json.dumps(_sample(schema), separators=(",", ":"))), name
    call = {"name": "edit_harness", "arguments": _sample(params["edit_harness"])}
    assert engine(_any_call(params), json.dumps(call, separators=(",", ":")))
