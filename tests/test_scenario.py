"""Scenarios: bundled files load, tracks differ as RSIGym's do, bad files fail clearly."""

from __future__ import annotations

import pytest

from rsigym_env.scenario import TRACK_TOOLS, list_scenarios, load_scenario

BENCHMARKS = ["swe-bench-verified", "terminal-bench-2", "aime", "gpqa-diamond", "skillsbench"]


def test_three_tracks_by_five_benchmarks_by_two_budgets():
    names = list_scenarios()
    assert len([n for n in names if n.startswith("sim-")]) == 30
    for track in TRACK_TOOLS:
        for bench in BENCHMARKS:
            for budget in (500, 1000):
                s = load_scenario(f"sim-{track}-{bench}-{budget}")
                assert (s.track, s.benchmark, s.budget_usd, s.world) == (track, bench, budget, "sim")


def test_local_scenarios_cover_three_tracks_by_five_benchmarks_with_local_teachers():
    for track in TRACK_TOOLS:
        for bench in BENCHMARKS:
            s = load_scenario(f"local-{track}-{bench}")
            assert (s.track, s.benchmark, s.world) == (track, bench, "local")
            assert s.permissions.teachers == ["teacher-large", "teacher-small"]


def test_world_defaults_lie_under_the_scenario_and_follow_a_world_override():
    assert load_scenario(world="local").permissions.teachers == ["teacher-large", "teacher-small"]
    assert load_scenario(world="local").budget_usd == 5
    assert load_scenario("local-joint-aime", world="sim").permissions.teachers[0] == "claude-opus-5"
    assert load_scenario("sim-joint-aime-1000", world="local").budget_usd == 1000   # the scenario's own key wins
    assert load_scenario("sim-data-aime-500").permissions.train.lock["num_epochs"] == 1  # the track's keys stay


def test_tracks_allow_what_rsigym_allows():
    joint, data, harness = (load_scenario(track=t) for t in ("joint", "data", "harness"))
    assert len(joint.tools()) == 10
    assert "edit_harness" not in data.tools() and "train" in data.tools()
    assert not {"train", "generate_data", "transform_data"} & set(harness.tools())
    assert data.permissions.train.lock == {"lora_rank": 16, "learning_rate": 0.0003, "batch_size": 16, "num_epochs": 1}


def test_overrides_and_names():
    s = load_scenario("sim-joint-aime-500", budget_usd=42.0)
    assert s.budget_usd == 42.0 and s.name == "sim-joint-aime-500+overrides"
    assert load_scenario(track="harness", benchmark="aime", budget_usd=50).name == "sim-harness-aime-50"


def test_bad_scenarios_fail_with_the_file_and_field(tmp_path):
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        load_scenario("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("track: research\nbudget_usd: -1\n")
    with pytest.raises(ValueError, match=r"bad.yaml[\s\S]*track[\s\S]*budget_usd"):
        load_scenario(bad)
    bad.write_text("permissions:\n  train:\n    lock: {momentum: 0.9}\n")
    with pytest.raises(ValueError, match="unknown training fields"):
        load_scenario(bad)
    loop = tmp_path / "loop.yaml"
    loop.write_text("extends: loop.yaml\n")
    with pytest.raises(ValueError, match="extends itself"):
        load_scenario(loop)


def test_extends_merges_nested_mappings(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text(f"extends: {list_scenarios()['sim-joint-aime-500']}\npermissions:\n  sandbox:\n    network: true\n")
    s = load_scenario(child)
    assert s.permissions.sandbox.network is True
    assert s.permissions.sandbox.timeout_s == 600  # kept from the parent chain
    assert s.benchmark == "aime"
