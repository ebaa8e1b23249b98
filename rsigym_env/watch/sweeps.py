"""Reading sweep output directories (``results.json`` of ``rsigym sweep``) for ``rsigym watch``.

:func:`sweep_view` gives what a sweep's page shows: the Figure-2 table of :mod:`rsigym_env.report`
with the best cell of each column and every score below its initial system marked, the normalized
gain heatmap, the anytime curves (best dev score against dollars spent, mean over seeds) and one row
per episode.

>>> from rsigym_env.sweep import make_grid, sweep
>>> data = sweep(make_grid(["random", "scripted"], ["aime"], 2), local=True).to_dict()
>>> view = sweep_view(data)
>>> [row["label"] for row in view["table"]["rows"]], len(view["episodes"])
(['initial system', 'random', 'scripted'], 4)
>>> [c["best"] for c in view["table"]["rows"][2]["cells"]][:2]        # scripted: best on AIME and RSI-Index
[True, True]
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from ..report import _title, anytime_matrix, figure2
from ..sweep import aggregate

RESULTS_FILE = "results.json"
FILES = ("heatmap.png", "anytime.png", "table.md", RESULTS_FILE)
"""The files of a sweep directory the watcher serves (nothing else in it is reachable)."""


def load_sweep(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A sweep directory's (or file's) ``results.json`` with its aggregates recomputed."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    data = orjson.loads(path.read_bytes())
    if not isinstance(data, dict) or not isinstance(data.get("episodes"), list):
        raise ValueError(f"{path} is not a sweep's results.json (no episodes)")
    data["aggregates"] = aggregate(data["episodes"])
    return data


def sweep_row(key: str, path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The list row of a sweep."""
    cfg, agg = data.get("config") or {}, data["aggregates"]
    ranked = [(a, v["rsi_index"]) for a, v in agg["agents"].items() if v.get("rsi_index") is not None]
    best = max(ranked, key=lambda kv: kv[1]) if ranked else None
    return {"key": key, "kind": "sweep", "path": str(path), "episodes": agg["episodes"], "failed": agg["failed"],
            "agents": agg["agent_order"], "benchmarks": agg["benchmark_order"], "seeds": len(cfg.get("seeds") or []),
            "world": "/".join(cfg.get("worlds") or []), "track": "/".join(cfg.get("tracks") or []),
            "budget": "/".join(f"${b:g}" for b in cfg.get("budgets_usd") or []), "date": cfg.get("date"),
            "best_agent": best[0] if best else None, "best_rsi": best[1] if best else None}


def sweep_view(data: dict[str, Any], points: int = 101) -> dict[str, Any]:
    """Table, heatmap, anytime curves and episodes of a sweep (see the module docstring)."""
    agg = data.get("aggregates") or aggregate(data["episodes"])
    data = {**data, "aggregates": agg}
    header, rows = figure2(data)
    benches, agents = agg["benchmark_order"], agg["agent_order"]
    cells = {(c["agent"], c["benchmark"]): c for c in agg["cells"]}
    table_rows = []
    for row in rows:
        out = []
        for j, cell in enumerate(row.cells):
            below = False
            if row.ranked and j < len(benches) and (c := cells.get((row.label, benches[j]))) is not None:
                below = (c["official_mean"] is not None and c["initial_mean"] is not None
                         and c["official_mean"] < c["initial_mean"] - 1e-12)
            out.append({"text": cell.text, "best": cell.best, "below": below})
        table_rows.append({"label": row.label, "ranked": row.ranked, "cells": out})
    z, notes = [], []
    for agent in agents:
        zr, nr = [], []
        for bench in benches:
            c = cells.get((agent, bench))
            value = None if c is None else c["reward_mean"]
            zr.append(value)
            nr.append("failed" if value is None and c and c["failed"] else "—" if value is None
                      else f"{value:+.3f} ± {c['reward_se'] or 0:.3f}")
        rsi = agg["agents"][agent]["rsi_index"]
        zr.append(rsi)
        nr.append("—" if rsi is None else f"{rsi:+.3f}")
        z.append(zr)
        notes.append(nr)
    heat = {"x": [_title(b) for b in benches] + ["RSI-Index"], "y": agents, "z": z, "text": notes}
    ok = [e for e in data["episodes"] if e.get("ok")]
    budget = max([float(e.get("budget_usd") or 0) for e in data["episodes"]] or [500.0]) or 500.0
    grid = [budget * i / (points - 1) for i in range(points)]
    anytime = []
    for bench in benches:
        panel: dict[str, Any] = {"benchmark": bench, "title": _title(bench), "traces": []}
        initial = [float(e["initial_score"]) for e in ok if e["benchmark"] == bench and e.get("initial_score") is not None]
        panel["initial"] = sum(initial) / len(initial) if initial else None
        for agent in agents:
            eps = [e for e in ok if e["benchmark"] == bench and e["agent"] == agent]
            if not eps:
                continue
            m = anytime_matrix(eps, grid)
            mean = [sum(col) / len(col) for col in zip(*m)]
            panel["traces"].append({"agent": agent, "n": len(eps), "x": grid, "y": mean})
        anytime.append(panel)
    episodes = []
    for i, e in enumerate(data["episodes"]):
        episodes.append({"i": i, **{k: e.get(k) for k in (
            "agent", "benchmark", "seed", "track", "world", "budget_usd", "ok", "error", "reward", "initial_score",
            "official_score", "best_dev_score", "spend_usd", "elapsed_h", "steps", "end_reason", "submitted_by",
            "wall_s", "run_dir")}, "below": e.get("ok") and e.get("official_score") is not None
            and e.get("initial_score") is not None and e["official_score"] < e["initial_score"]})
    return {"table": {"header": header, "rows": table_rows}, "heatmap": heat, "anytime": anytime,
            "episodes": episodes, "config": data.get("config") or {}, "timing": data.get("timing") or {},
            "aggregates": agg}


__all__ = ["FILES", "RESULTS_FILE", "load_sweep", "sweep_row", "sweep_view"]
