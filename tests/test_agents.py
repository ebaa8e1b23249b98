"""The agent registry: content-addressed researcher specs that survive restarts and drive episodes and sweeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gymnasium as gym
import pytest
from hypothesis import given, settings, strategies as st

from rsigym_env.agents import (
    AgentRegistry, AgentSpec, build_researcher, builtin_spec, diff_specs, dump_toml,
)
from rsigym_env.cli import main
from rsigym_env.episode import run_episode

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,8}", fullmatch=True)
scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                    st.text(max_size=12))
specs = st.builds(
    AgentSpec,
    kind=st.sampled_from(["scripted", "llm", "rl", "random", "pkg.mod:Factory"]),
    name=st.text(max_size=10),
    model=st.none() | st.text(max_size=10),
    system_prompt=st.none() | st.text(max_size=40),
    tools=st.none() | st.lists(st.sampled_from(["evaluate", "read", "submit", "train"]), unique=True),
    skills=st.dictionaries(names, st.text(max_size=20), max_size=2),
    memory=st.dictionaries(names, st.text(max_size=20), max_size=2),
    params=st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True),
                           scalars | st.lists(scalars, max_size=3), max_size=4),
    parent=st.none() | st.from_regex(r"ag-[0-9a-f]{16}", fullmatch=True),
)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    return AgentRegistry()


@settings(max_examples=150, deadline=None)
@given(specs, specs)
def test_id_changes_when_and_only_when_the_content_does(a, b):
    assert (a.id == b.id) == (a.content() == b.content())
    assert AgentSpec.model_validate_json(a.model_dump_json()).id == a.id   # same content, same id


@settings(max_examples=100, deadline=None)
@given(specs, st.sampled_from(["name", "model", "system_prompt", "params", "skills", "parent"]))
def test_any_edit_changes_the_id(spec, field):
    changed = {"name": spec.name + "x", "model": (spec.model or "") + "m", "system_prompt": (spec.system_prompt or "") + "!",
               "params": {**spec.params, "zz_new": 1}, "skills": {**spec.skills, "zz-new": "s"},
               "parent": "ag-" + ("0" * 16 if spec.parent != "ag-" + "0" * 16 else "1" * 16)}[field]
    assert spec.model_copy(update={field: changed}).id != spec.id


@settings(max_examples=150, deadline=None)
@given(specs)
def test_files_view_round_trips(spec):
    assert AgentSpec.from_files(spec.to_files()) == spec
    assert AgentSpec.from_files(spec.to_files()).id == spec.id


@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), scalars, max_size=5))
def test_toml_writer_round_trips(params):
    import tomllib

    assert tomllib.loads(dump_toml(params)) == params


def test_registry_survives_a_restart_in_another_process(registry, tmp_path):
    spec = builtin_spec("scripted").derive(params={"data_fraction": 0.55}, name="df55")
    agent_id = registry.register(spec, note="first")
    assert registry.register(spec, note="second") == agent_id           # idempotent, first note kept
    env = {**os.environ, "RSIGYM_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "rsigym_env.cli", "agents", "show", agent_id[:9]], env=env,
                         capture_output=True, text=True, check=True).stdout
    shown = json.loads(out)
    assert shown["id"] == agent_id and shown["note"] == "first"
    assert AgentSpec.model_validate(shown["spec"]) == spec
    assert AgentRegistry().get(agent_id) == spec                           # a fresh registry object too
    assert AgentRegistry().lineage(agent_id) == [agent_id]                 # parent (bundled) not registered yet
    AgentRegistry().resolve("scripted")
    assert AgentRegistry().lineage(agent_id) == [agent_id, builtin_spec("scripted").id]


def test_tampered_record_and_ambiguous_prefix_are_refused(registry):
    a = registry.register(AgentSpec(kind="scripted", params={"k": 1}))
    path = registry.root / f"{a}.json"
    data = json.loads(path.read_text())
    data["spec"]["params"]["k"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="does not hash to its id"):
        registry.get(a)
    with pytest.raises(KeyError, match="unknown agent"):
        registry.get("nope")
    with pytest.raises(KeyError, match="no registered ids match"):
        registry.get("ag-ffffffff")


def test_specs_build_researchers_with_their_parameters_and_tools():
    spec = builtin_spec("scripted").derive(params={"k": 1, "data_fraction": 0.5}, tools=["evaluate", "wait", "read", "submit"])
    researcher = build_researcher(spec)
    assert researcher.name == spec.id and researcher.args.k == 1 and researcher.args.data_fraction == 0.5
    env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=200)
    used: set[str] = set()
    result = run_episode(env, researcher, seed=0, on_step=lambda n, action, obs, info: used.add(info["tool"]))
    assert result.terminated and used <= {"evaluate", "wait", "read", "submit"} and "evaluate" in used
    with pytest.raises(ValueError, match="unknown parameters"):
        build_researcher(AgentSpec(kind="scripted", params={"nope": 1}))
    with pytest.raises(ValueError, match="must be int"):
        build_researcher(AgentSpec(kind="scripted", params={"k": 1.5}))
    llm = build_researcher(builtin_spec("llm").derive(skills={"triage": "Fix the harness first."}, model="m"))
    assert "## Skill: triage\nFix the harness first." in llm.args.system_prompt and llm.args.model == "m"
    assert build_researcher(builtin_spec("random")).inner.name == "random"


def test_diff():
    a, b = builtin_spec("scripted"), builtin_spec("scripted").derive(params={"k": 2})
    text = diff_specs(a, b)
    assert "-k = 3\n+k = 2\n" in text and '+ "parent": "' + a.id in text
    assert diff_specs(a, a) == ""


def test_cli_agents_and_registered_agents_in_run_and_sweep(registry, tmp_path, capsys):
    assert main(["agents", "register", "--from", "scripted", "--set", "data_fraction=0.6", "--set", "k=2",
                 "--name", "tuned"]) == 0
    agent_id = capsys.readouterr().out.strip()
    spec = registry.get(agent_id)
    assert spec.params["data_fraction"] == 0.6 and spec.params["k"] == 2 and spec.parent == builtin_spec("scripted").id
    assert main(["agents", "register", "--from", "scripted", "--set", "nope=1"]) == 2
    assert "unknown parameters" in capsys.readouterr().out
    spec_dir = tmp_path / "spec"
    for path, text in spec.derive(params={"k": 1}).to_files().items():
        (spec_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (spec_dir / path).write_text(text)
    assert main(["agents", "register", str(spec_dir)]) == 0
    child = capsys.readouterr().out.strip()
    assert registry.get(child).parent == agent_id
    assert main(["agents", "list", "--json"]) == 0
    assert {r["id"] for r in json.loads(capsys.readouterr().out)} == {agent_id, child}
    assert main(["agents", "diff", agent_id, child]) == 0
    assert "-k = 2\n+k = 1" in capsys.readouterr().out
    assert main(["agents", "show", child[:10], "--files"]) == 0
    assert "==> params.toml <==" in capsys.readouterr().out

    out = tmp_path / "r.json"
    assert main(["run", "--agent", agent_id[:8] + agent_id[8:], "--benchmark", "aime", "--quiet", "--run-dir",
                 str(tmp_path / "run"), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["researcher"] == agent_id and result["terminated"]
    assert main(["run", "--agent", "ag-0000000", "--quiet", "--run-dir", str(tmp_path / "bad")]) == 2
    capsys.readouterr()
    assert main(["sweep", "--agents", f"scripted,{agent_id}", "--benchmarks", "aime", "--seeds", "2", "--local",
                 "--budget", "200", "--out", str(tmp_path / "sw"), "-q"]) == 0
    data = json.loads((tmp_path / "sw" / "results.json").read_text())
    mine = [e for e in data["episodes"] if e["agent"] == agent_id]
    assert len(mine) == 2 and all(e["ok"] for e in mine)
    assert data["aggregates"]["agents"][agent_id]["rsi_index"] is not None
