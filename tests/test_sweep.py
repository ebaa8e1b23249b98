"""Sweeps (``rsigym_env.sweep``), their report (``rsigym_env.report``) and ``rsigym sweep``."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap

import pytest

from rsigym_env.cli import main
from rsigym_env.report import figure2, markdown_table, write_report
from rsigym_env.sweep import (
    EpisodeRecord, aggregate, default_chunk, load_results, make_grid, run_ray, sweep,
)

SAME = ("agent", "benchmark", "seed", "ok", "reward", "initial_score", "official_score", "best_dev_score",
        "spend_usd", "elapsed_h", "steps", "end_reason", "curve")


def outcome(record: EpisodeRecord) -> tuple:
    """Everything a sweep keeps that must not depend on where the episode ran."""
    d = record.to_dict()
    return tuple(d[k] for k in SAME) + ((d["error"] or "").split("\n")[0],)


CRASHING = textwrap.dedent('''
    class Crashing:
        """Acts like the scripted researcher, then raises on its third action."""
        name = "crashing"

        def __init__(self):
            from rsigym_env.baselines import make_researcher
            self.inner, self.calls = make_researcher("scripted"), 0

        def reset(self, observation, info, seed=None):
            self.inner.reset(observation, info, seed)

        def act(self, observation, info):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("boom in act")
            return self.inner.act(observation, info)
''')


class Poison:
    """Pickles fine, fails to unpickle anywhere (``int("poison")``): a Ray task that cannot even start."""

    def __reduce__(self):
        return (int, ("poison",))


# ------------------------------------------------------------------------------------ in-process


def test_grid_order_and_chunk_size():
    grid = make_grid(["a", "b"], ["x", "y"], 2, budget_usd=100)
    assert [(s.agent, s.benchmark, s.seed) for s in grid][:3] == [("a", "x", 0), ("a", "x", 1), ("a", "y", 0)]
    assert len(grid) == 8 and {s.budget_usd for s in grid} == {100.0}
    assert [s.seed for s in make_grid(["a"], ["x"], [5, 7])] == [5, 7]
    assert default_chunk(400, 2) == 25 and default_chunk(30, 2) == 4 and default_chunk(3, 8) == 1


def test_local_episode_records_have_scores_spend_time_and_anytime_curves():
    result = sweep(make_grid(["random", "scripted"], ["aime", "gpqa-diamond"], 2), local=True)
    records = result.records
    assert all(r.ok and r.error is None for r in records)
    assert len({r.key_id for r in records}) == len(records)  # one platform key per episode
    for r in records:
        assert r.steps == len(r.curve) > 0 and r.wall_s > 0 and r.elapsed_h > 0
        assert 0 <= r.initial_score <= 1 and 0 <= r.official_score <= 1
        spends, best = [p[0] for p in r.curve], [p[1] for p in r.curve]
        assert spends == sorted(spends) and spends[-1] == pytest.approx(r.spend_usd)
        measured = [b for b in best if b >= 0]
        assert measured == sorted(measured) and all(b == -1 for b in best[: len(best) - len(measured)])
    scripted = [r for r in records if r.agent == "scripted"]
    assert all(r.submitted_by == "agent" for r in scripted) and sum(r.reward for r in scripted) > 0
    agg = result.to_dict()["aggregates"]
    assert agg["agents"]["scripted"]["rsi_index"] > agg["agents"]["random"]["rsi_index"]
    assert result.timing["sweep_s"] > 0 and result.config["mode"] == "local"


def test_failed_episodes_are_reported_and_the_rest_finish(tmp_path, monkeypatch):
    (tmp_path / "crashy_agent.py").write_text(CRASHING)
    monkeypatch.syspath_prepend(str(tmp_path))
    grid = make_grid(["scripted", "nope", "crashy_agent:Crashing"], ["aime"], 2)
    grid.append(dataclasses.replace(grid[0], benchmark="no-such-benchmark"))
    records = sweep(grid, local=True).records
    by_agent = {a: [r for r in records if r.agent == a] for a in ("scripted", "nope", "crashy_agent:Crashing")}
    assert [r.ok for r in by_agent["scripted"]] == [True, True, False]
    assert "no-such-benchmark" in by_agent["scripted"][2].error
    assert all(not r.ok and r.error.startswith("ValueError: unknown researcher 'nope'") for r in by_agent["nope"])
    for r in by_agent["crashy_agent:Crashing"]:  # crashed mid-episode: error, traceback, the steps it made
        assert not r.ok and r.error.startswith("RuntimeError: boom in act") and "Traceback" in r.error
        assert r.steps == 2 and len(r.curve) == 2 and r.reward is None
    agg = aggregate(records)
    assert agg["failed"] == 5 and agg["agents"]["nope"]["rsi_index"] is None
    # every seed of one benchmark failed: no RSI-Index for that agent rather than a mean over fewer benchmarks
    assert agg["agents"]["scripted"]["failed"] == 1 and agg["agents"]["scripted"]["rsi_index"] is None
    assert agg["agents"]["scripted"]["complete"] is False


# ------------------------------------------------------------------------------------ report


def fake_episode(agent: str, bench: str, seed: int, official: float, spend: float, hours: float, ok: bool = True) -> dict:
    initial = 0.2
    return EpisodeRecord(agent, bench, seed, "joint", 500.0, "sim", ok, None if ok else "ValueError: x\ntrace",
                         reward=(official - initial) / (1 - initial) if ok else None, initial_score=initial,
                         official_score=official if ok else None, spend_usd=spend if ok else None,
                         elapsed_h=hours if ok else None, steps=3,
                         curve=[[10.0, -1.0], [spend / 2, initial], [spend, official]]).to_dict()


def test_table_marks_the_best_of_each_column():
    episodes = [
        fake_episode("a", "aime", 0, 0.60, 300, 9), fake_episode("a", "aime", 1, 0.80, 300, 9),   # aime 70 (best)
        fake_episode("a", "skillsbench", 0, 0.30, 300, 9),                                         # 30
        fake_episode("b", "aime", 0, 0.50, 100, 2),                                                # 50
        fake_episode("b", "skillsbench", 0, 0.40, 100, 2),                                         # 40 (best), cheapest, fastest
        fake_episode("c", "aime", 0, 0.70, 400, 9), fake_episode("c", "skillsbench", 0, 0.1, 400, 9, ok=False),
    ]
    data = {"config": {"seeds": [0, 1]}, "episodes": episodes}
    header, rows = figure2(data)
    assert header == ["agent", "AIME 2024/2025", "SkillsBench", "RSI-Index", "spend ↓", "time ↓", "failed"]
    marks = {r.label: [c.best for c in r.cells] for r in rows}
    assert marks["initial system"] == [False] * 6  # a reference row, never ranked
    assert marks["a"] == [True, False, True, False, False, False]   # RSI a = (0.625 + 0.125) / 2 > b's 0.3125
    assert marks["b"] == [False, True, False, True, True, False]
    assert marks["c"] == [True, False, False, False, False, False]  # ties at the printed precision are all marked
    assert {r.label: r.cells[2].text for r in rows}["c"] == "—"      # a benchmark with no successful seed: no index
    md = markdown_table(data)
    assert "| a | **70.00 ★** | 30.00 | **+0.3750 ★** | $300 | 9.0 h | 0 |" in md
    assert "| c | **70.00 ★** | failed | — | $400 | 9.0 h | 1/2 |" in md


def test_report_files_are_written_and_regenerable(tmp_path):
    result = sweep(make_grid(["random", "scripted"], ["aime", "skillsbench", "gpqa-diamond", "terminal-bench-2"], 2),
                   local=True)
    result.save(tmp_path / "results.json")
    paths = write_report(load_results(tmp_path / "results.json"), tmp_path / "out", command="rsigym sweep --x")
    for name in ("heatmap", "anytime"):
        data = paths[name].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    table = paths["table"].read_text()
    assert table.index("rsigym sweep --x") < table.index("| agent |") and "★" in table


# ------------------------------------------------------------------------------------ CLI


def test_cli_sweep_local_end_to_end(tmp_path, capsys):
    out = tmp_path / "sweep"
    code = main(["sweep", "--local", "--agents", "random,scripted,nope", "--benchmarks", "aime,skillsbench",
                 "--seeds", "2", "--budget", "300", "--out", str(out), "-q"])
    assert code == 0
    text = capsys.readouterr().out
    assert "unknown agent 'nope'" in text and "RSI-Index" in text and "★" in text and "failed nope: 4 episode(s)" in text
    data = json.loads((out / "results.json").read_text())
    assert len(data["episodes"]) == 12 and data["aggregates"]["failed"] == 4
    assert data["config"]["mode"] == "local" and "--local" in data["config"]["command"]
    assert {e["budget_usd"] for e in data["episodes"]} == {300.0}
    assert all((out / f).stat().st_size > 0 for f in ("table.md", "heatmap.png", "anytime.png"))
    assert main(["sweep", "--local", "--agents", "nope", "--benchmarks", "aime", "--seeds", "1", "--strict",
                 "--out", str(tmp_path / "strict"), "-q"]) == 1

    (out / "table.md").unlink()
    assert main(["sweep", "--report", str(out / "results.json")]) == 0
    assert "rsigym sweep --agents random,scripted,nope" in (out / "table.md").read_text()


# ------------------------------------------------------------------------------------ Ray
# One test function, so that under pytest-xdist only one worker process starts a Ray.


def test_ray_sweep_matches_local_survives_failures_and_runs_from_the_cli(ray_session, tmp_path, capsys):
    grid = make_grid(["random", "scripted", "nope"], ["aime", "skillsbench"], 2)
    local = sweep(grid, local=True)
    remote = sweep(grid, chunk=3)  # chunks mix good and failing episodes
    assert remote.config["mode"] == "ray" and remote.config["chunk"] == 3
    assert [outcome(r) for r in remote.records] == [outcome(r) for r in local.records]
    assert sum(not r.ok for r in remote.records) == 4
    assert all(not r.worker.endswith(f":{os.getpid()}") for r in remote.records)  # ran in Ray workers
    assert len({r.key_id for r in remote.records if r.ok}) == 8
    assert ray_session.is_initialized()  # a Ray the sweep did not start is left running

    # a task that cannot even start (an argument that fails to unpickle) fails only its own chunk
    specs = make_grid(["scripted"], ["aime"], 4)
    specs[1] = dataclasses.replace(specs[1], world=Poison())
    records = run_ray(specs, chunk=2)
    assert [r.ok for r in records] == [False, False, True, True]
    assert records[0].error.startswith("Ray task for 2 episode(s) failed") and "poison" in records[0].error

    # the command, through the same Ray
    out = tmp_path / "sweep"
    assert main(["sweep", "--agents", "scripted", "--benchmarks", "aime,gpqa-diamond", "--seeds", "2",
                 "--chunk", "2", "--out", str(out), "-q"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["config"]["mode"] == "ray" and data["config"]["chunk"] == 2 and data["aggregates"]["failed"] == 0
    assert data["aggregates"]["agents"]["scripted"]["rsi_index"] > 0
    assert "4 episodes in" in capsys.readouterr().out
    assert ray_session.is_initialized()
