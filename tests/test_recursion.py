"""Recursion: a world whose target system is a researcher, the scripted improver, rounds, and `rsigym recurse`."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from rsigym_env.agents import AgentRegistry, AgentSpec, build_researcher, builtin_spec, dump_toml
from rsigym_env.cli import main
from rsigym_env.episode import run_episode
from rsigym_env.worlds.recursive import RecursiveOptions, measure, recurse, split_tasks
from rsigym_env.scenario import list_scenarios, load_scenario
from rsigym_env.scoring import normalized_gain
from rsigym_env.worlds import WORLDS

TINY = {"dev_benchmarks": ["aime"], "official_benchmarks": ["aime", "gpqa-diamond"], "dev_seeds": 2, "official_seeds": 2,
        "budget_usd": 300}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    saved = dict(WORLDS)
    yield
    WORLDS.clear()
    WORLDS.update(saved)


def tiny_scenario(**options):
    s = load_scenario("recursive-scripted-small")
    return s.model_copy(update={"world_options": {**s.world_options, **TINY, **options}, "budget_usd": 4000})


def test_dev_and_official_splits_never_overlap_and_dev_follows_the_seed():
    opts = RecursiveOptions(**TINY)
    official = {s for _, s in split_tasks(opts, "official")}
    dev = [{s for _, s in split_tasks(opts, "dev", world_seed=w)} for w in (0, 1)]
    assert not (official & dev[0]) and dev[0] != dev[1]
    assert split_tasks(opts, "dev", 0, n_tasks=1) == [("aime", 1_000_000)]


def test_the_recursive_world_measures_a_researcher_spec_through_its_harness():
    env = gym.make("RSIGym/Harness-v0", scenario=tiny_scenario())
    obs, info = env.reset(seed=0)
    assert "spec.json" in obs["log"] and "params.toml" in obs["log"] and info["tools"] == [
        "edit_harness", "evaluate", "read", "wait", "submit"]
    obs, _, _, _, info = env.step({"tool": "read", "args": {"ref": "harness:latest/params.toml"}})
    assert "data_fraction = 0.4" in obs["log"]
    obs, _, _, _, info = env.step({"tool": "evaluate", "args": {"k": 1}})
    assert info["ok"] and info["result"]["quote_usd"] == 2 * 300           # worst case: episodes x their budget
    obs, _, _, _, info = env.step({"tool": "wait", "args": {}})
    (event,) = info["events"]
    m = measure(builtin_spec("scripted"), RecursiveOptions(**TINY), "dev", 1, env.unwrapped.run.seed)
    assert event["score"] == pytest.approx(max(0.0, m.index)) and 0 < info["cost_usd"] <= 600
    assert info["cost_usd"] == pytest.approx(m.spend_usd)                # billed what its episodes spent
    # a broken spec is refused before anything is reserved, with the reason
    _, _, _, _, info = env.step({"tool": "edit_harness", "args": {"path": "params.toml", "content": "k = 'three'\n"}})
    _, _, _, _, info = env.step({"tool": "evaluate", "args": {"k": 1}})
    assert info["error"] == "invalid_harness" and "parameter k must be int" in info["message"] and info["cost_usd"] == 0
    _, _, _, _, info = env.step({"tool": "edit_harness", "args": {"path": "params.toml", "content": dump_toml(
        {"data_fraction": 0.6, "k": 3, "max_examples": 20000, "probe_examples": 20})}})
    version = info["result"]["version"]
    obs, reward, term, _, info = env.step({"tool": "submit", "args": {"harness": version}})
    improved = builtin_spec("scripted").model_copy(update={"params": {**builtin_spec("scripted").params, "data_fraction": 0.6}})
    k = env.unwrapped.scenario.official_k
    before = measure(builtin_spec("scripted"), RecursiveOptions(**TINY), "official", k).index
    after = measure(improved, RecursiveOptions(**TINY), "official", k).index
    assert term and info["initial_score"] == pytest.approx(max(0, before)) and info["official_score"] == pytest.approx(max(0, after))
    assert reward == pytest.approx(normalized_gain(max(0, before), max(0, after)))
    env.close()


def test_unsupported_services_are_refused():
    scenario = tiny_scenario().model_copy(update={"permissions": tiny_scenario().permissions.model_copy(update={"tools": None})})
    env = gym.make("RSIGym/Harness-v0", scenario=scenario)
    env.reset(seed=0)
    _, _, _, _, info = env.step({"tool": "infer", "args": {"prompt": "hi"}})
    assert info["error"] == "not_supported" and "researcher spec" in info["message"]
    _, _, _, _, info = env.step({"tool": "evaluate", "args": {"checkpoint": "ckpt-1"}})
    assert info["error"] == "unknown_ref"


def test_a_scripted_spec_improves_itself_when_its_harness_is_a_spec():
    env = gym.make("RSIGym/Harness-v0", scenario=tiny_scenario())
    result = run_episode(env, build_researcher(builtin_spec("scripted").derive(params={"improve_max_evaluations": 4})), seed=2)
    run = env.unwrapped.run
    assert result.terminated and sum(len(c.scores) for c in run.candidates.values()) == 4
    submitted = AgentSpec.from_files(run.harness.files(result.info["submitted"]["harness"]))
    assert result.info["best_dev_score"] == max(s for c in run.candidates.values() for s in c.scores)
    assert result.info["metrics"]["selection"] == 0.0                       # it submits its best dev candidate
    assert set(submitted.params) == set(builtin_spec("scripted").params)


def test_rounds_register_each_improved_researcher_and_report_honest_gains():
    registry = AgentRegistry()
    result = recurse(tiny_scenario(), rounds=2, seeds=[0, 1], registry=registry)
    rows, chains = result["rows"], result["chains"]
    assert [(r["seed"], r["round"]) for r in rows] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    opts = RecursiveOptions(**TINY)
    for r in rows:
        improved = registry.get(r["improved"])
        assert r["index_after"] == measure(improved, opts, "official", 1).index     # recomputable, not stored guesses
        assert r["improver_gain"] == pytest.approx(r["index_after"] - r["index_before"])
        assert improved.parent == r["target"] or improved.id == r["target"]
    for chain in chains:
        seed_rows = [r for r in rows if r["seed"] == chain["seed"]]
        assert seed_rows[1]["target"] == seed_rows[0]["improved"]            # round t's output is round t+1's target
        assert chain["compounding"]["total"] == pytest.approx(chain["indices"][-1] - chain["indices"][0])
    assert result["summary"]["compounding_total"][2] == 2


def test_improver_mode_makes_the_improved_researcher_the_next_improver():
    result = recurse(tiny_scenario(), rounds=2, seeds=[0], mode="improver")
    first, second = result["rows"]
    assert second["improver"] == first["improved"] == second["target"]


def test_cli_recurse(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("extends: " + str(list_scenarios()["recursive-scripted-small"]) +
                    "\nbudget_usd: 4000\nworld_options:\n  dev_benchmarks: [aime]\n  official_benchmarks: [aime]\n"
                    "  official_seeds: 2\n  budget_usd: 300\n")
    assert main(["recurse", "--scenario", str(path), "--rounds", "2", "--seeds", "1", "--out", str(tmp_path / "o")]) == 0
    data = json.loads((tmp_path / "o" / "recursion.json").read_text())
    assert len(data["rows"]) == 2 and "rsigym recurse" in data["config"]["command"]
    assert "compounding" in (tmp_path / "o" / "recursion.md").read_text()
    assert main(["recurse", "--scenario", "sim-joint-aime-500"]) == 2
    capsys.readouterr()
    assert main(["agents", "list", "--json"]) == 0
    registered = {r["id"]: r["spec"] for r in json.loads(capsys.readouterr().out)}
    assert {row["improved"] for row in data["rows"]} <= registered.keys()
