"""bench/bench_blind_recipes.py (issue 30's yardstick): its recipes run on the sim, give finite numbers,
and the blind ones evaluate nothing; flip-everything spends nothing. Two seeds, two benchmarks: ~1 s."""

from __future__ import annotations

import doctest
import math
import tomllib
from pathlib import Path

import rsigym_env  # noqa: F401  (before NumPy)
import gymnasium as gym
import pytest

from rsigym_env.episode import run_episode

from bench_helpers import load_bench

@pytest.fixture(scope="module")
def bench():
    return load_bench("bench_blind_recipes")


def test_docstring_examples(bench):
    result = doctest.testmod(bench, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_flip_fixes_every_defect_of_the_sim_harness(bench):
    from rsigym_env.worlds.sim.model import parse_harness_toml
    from rsigym_env.worlds.sim.world import MINIMAL_HARNESS_TOML

    new, changes = bench.flip_harness_toml(MINIMAL_HARNESS_TOML)
    harness = parse_harness_toml(new)
    assert not harness.active.any() and harness.max_output_tokens == 4 * 4096
    assert len(changes) == 6 and new.count("#") == MINIMAL_HARNESS_TOML.count("#")  # comments kept


def test_flip_turns_on_every_switch_of_the_local_harness(bench):
    text = (Path(rsigym_env.__file__).parent / "worlds/common/harness/harness.toml").read_text()
    doc = tomllib.loads(bench.flip_harness_toml(text)[0])
    old = tomllib.loads(text)
    assert doc["generation"]["on_truncation"] == "continue"
    for section, table in doc.items():
        for key, value in table.items():
            if isinstance(value, bool):
                assert value is True, (section, key)
            elif isinstance(value, int):
                assert value == 4 * old[section][key]
            elif isinstance(value, float):
                assert value == old[section][key]  # temperatures are not limits


def test_blind_recipes_never_evaluate(bench):
    env = gym.make("RSIGym/Joint-v0", world="sim", benchmark="swe-bench-verified", budget_usd=500)
    try:
        for name in ("flip-everything", "distil+flip"):
            tools: list[str] = []
            researcher = bench.make_researcher(name)
            result = run_episode(env, researcher, seed=0,
                                 on_step=lambda step, action, obs, info, tools=tools: tools.append(action["tool"]))
            assert result.terminated and result.info["submitted"]["by"] == "agent"
            assert not {"evaluate", "infer"} & set(tools), tools
            assert result.info["dev_evaluations"] == 0
            if name == "flip-everything":
                assert tools == ["read", "edit_harness", "submit"] and result.info["spend_usd"] == 0
                assert result.info["submitted"]["harness"] != env.unwrapped.run.harness.initial
            else:
                assert researcher.checkpoint not in (None, "base") and result.info["spend_usd"] > 300
    finally:
        env.close()


def test_measure_and_table(bench):
    names = ["flip-everything", "distil+flip", "scripted", "rl"]
    rows = bench.measure(seeds=2, benchmarks=["aime", "gpqa-diamond"], recipes=names)
    assert [r["name"] for r in rows] == names
    for r in rows:
        assert all(math.isfinite(r[k]) for k in ("rsi_index", "rsi_se", "spend_usd", "eval_share"))
        assert r["episodes"] == 4
    by = {r["name"]: r for r in rows}
    assert by["flip-everything"]["spend_usd"] == 0 and by["flip-everything"]["eval_share"] == 0
    assert by["scripted"]["eval_share"] == 1
    head = bench.headline(rows)
    assert head["best_blind"] in ("flip-everything", "distil+flip") and math.isfinite(head["gap"])
    lines = bench.table(rows)
    assert any("Headline gap" in line for line in lines) and any("flip-everything" in line for line in lines)


def test_table_local_rows_per_recipe(bench):
    """The local-world table: one row per recipe, each benchmark's mean gain with each seed's, the
    RSI-Index over seeds with its s.e."""
    rows = [{"recipe": r, "benchmark": b, "seed": s, "gain": g, "spend": 0.0 if r != "scripted" else 2.0,
             "flipped": ["persistent: false -> true"] if r != "scripted" else None}
            for r, gains in (("flip:bools", (0.1, -0.1, 0.3, 0.1)), ("scripted", (0.5, 0.3, 0.7, 0.5)))
            for (b, s), g in zip((("aime", 0), ("skillsbench", 0), ("aime", 1), ("skillsbench", 1)), gains)]
    lines = bench.table_local(rows)
    assert lines[0].startswith("| recipe | aime (local-math) | skillsbench (local-skills) |")
    bools = next(line for line in lines if line.startswith("| flip:bools"))
    assert "+0.200 (+0.100, +0.300)" in bools and "**+0.100** ± 0.100 (2)" in bools and "$0.00" in bools
    assert "**+0.500** ± 0.100 (2) | $2.00 |" in next(line for line in lines if line.startswith("| scripted"))
    assert "`persistent: false -> true`" in lines[-1]
