"""The sweep report: the paper's Figure-2 table (terminal and Markdown), a gain heatmap, anytime curves.

Everything here reads the ``results.json`` layout of :class:`rsigym_env.sweep.SweepResult` (a dict
with ``config``, ``timing``, ``aggregates`` and ``episodes``), so a saved sweep can be re-reported:

    rsigym sweep --report runs/sweep-.../results.json [--out DIR]

or from Python, ``write_report(load_results(path), out_dir)``.

>>> from rsigym_env.sweep import make_grid, sweep
>>> data = sweep(make_grid(["random", "scripted"], ["aime", "skillsbench"], 2), local=True).to_dict()
>>> header, rows = figure2(data)
>>> header[:3], [r.label for r in rows]
(['agent', 'AIME 2024/2025', 'SkillsBench'], ['initial system', 'random', 'scripted'])
>>> rows[2].cells[0].best and rows[2].cells[2].best     # scripted: best on AIME and on RSI-Index
True
>>> print(markdown_table(data).splitlines()[1])
|---|---:|---:|---:|---:|---:|
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

from .sweep import aggregate

BEST = "★"
# The RSIGym paper's Figure 2 (avg@3 %, real agents, $500): initial and best final per benchmark.
PAPER = {
    "swe-bench-verified": (17.67, 53.33), "terminal-bench-2": (10.49, 26.97), "aime": (31.67, 97.78),
    "gpqa-diamond": (51.33, 85.33), "skillsbench": (1.65, 22.14),
}
PAPER_BEST_RSI = ("Opus 5", 0.4809)


@dataclass
class Cell:
    """One table cell: its value (for ranking), its text, and whether it is the best of its column."""

    value: float | None
    text: str
    best: bool = False


@dataclass
class Row:
    label: str
    cells: list[Cell] = field(default_factory=list)
    ranked: bool = True  # reference rows (the initial system) are shown but never marked best


def _title(benchmark: str) -> str:
    try:
        from .worlds.sim import BENCHMARKS

        return BENCHMARKS[benchmark].title if benchmark in BENCHMARKS else benchmark
    except Exception:  # pragma: no cover - a world without the sim package
        return benchmark


def _aggregates(data: dict[str, Any]) -> dict[str, Any]:
    return data.get("aggregates") or aggregate(data["episodes"])


def figure2(data: dict[str, Any]) -> tuple[list[str], list[Row]]:
    """Header and rows of the Figure-2 table: final official score (%, mean over seeds) per benchmark,
    RSI-Index, mean spend, mean research time; the best per column is marked (highest score and
    index, lowest spend and time). A ``failed`` column appears when any episode failed.
    """
    agg = _aggregates(data)
    benches: list[str] = agg["benchmark_order"]
    cells = {(c["agent"], c["benchmark"]): c for c in agg["cells"]}
    any_failed = agg["failed"] > 0
    header = ["agent", *[_title(b) for b in benches], "RSI-Index", "spend ↓", "time ↓"] + (["failed"] if any_failed else [])
    rows: list[Row] = []

    initial = Row("initial system", ranked=False)
    for bench in benches:
        values = [c["initial_mean"] for c in agg["cells"] if c["benchmark"] == bench and c["initial_mean"] is not None]
        mean = sum(values) / len(values) if values else None
        initial.cells.append(Cell(mean, "—" if mean is None else f"{100 * mean:.2f}"))
    initial.cells += [Cell(None, "0"), Cell(None, "—"), Cell(None, "—")] + ([Cell(None, "")] if any_failed else [])
    rows.append(initial)

    for agent in agg["agent_order"]:
        a = agg["agents"][agent]
        row = Row(agent)
        for bench in benches:
            c = cells.get((agent, bench))
            v = None if c is None else c["official_mean"]
            if v is None:
                row.cells.append(Cell(None, "failed" if c is not None and c["failed"] else "—"))
            else:
                row.cells.append(Cell(v, f"{100 * v:.2f}"))
        rsi = a["rsi_index"]
        row.cells.append(Cell(rsi, "—" if rsi is None else f"{rsi:+.4f}"))
        spend, hours = a["spend_mean_usd"], a["elapsed_mean_h"]
        row.cells.append(Cell(None if spend is None else -spend, "—" if spend is None else f"${spend:,.0f}"))
        row.cells.append(Cell(None if hours is None else -hours, "—" if hours is None else f"{hours:.1f} h"))
        if any_failed:
            row.cells.append(Cell(None, f"{a['failed']}/{a['episodes']}" if a["failed"] else "0"))
        rows.append(row)

    ranked = [r for r in rows if r.ranked]
    for col in range(len(header) - 1):
        present = [r.cells[col] for r in ranked if r.cells[col].value is not None]
        if len(present) < 2:  # nothing to compare
            continue
        top = max(present, key=lambda c: c.value)
        for cell in present:
            cell.best = cell.text == top.text  # ties at the printed precision are all marked
    return header, rows


def rich_table(data: dict[str, Any]) -> Table:
    """The Figure-2 table for the terminal (best per column: bold green with a star)."""
    header, rows = figure2(data)
    cfg = data.get("config", {})
    title = (f"RSIGym Figure 2 on {'/'.join(cfg.get('worlds', ['sim']))}: final official score (%, mean of "
             f"{len(cfg.get('seeds', []))} seeds), {'/'.join(cfg.get('tracks', ['joint']))} track, "
             f"${'/'.join(f'{b:g}' for b in cfg.get('budgets_usd', [500]))}")
    table = Table(title=title, caption=f"{BEST} best per column (score, RSI-Index: highest; spend, time: lowest)")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right", style="bold" if i == 0 else None)
    for r in rows:
        texts = [f"[bold green]{c.text} {BEST}[/]" if c.best else (f"[dim]{c.text}[/]" if not r.ranked else c.text)
                 for c in r.cells]
        table.add_row(f"[dim]{r.label}[/]" if not r.ranked else r.label, *texts)
    return table


def markdown_table(data: dict[str, Any]) -> str:
    """The Figure-2 table as Markdown (best per column: **bold** with a star)."""
    header, rows = figure2(data)
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for r in rows:
        texts = [f"**{c.text} {BEST}**" if c.best else c.text for c in r.cells]
        label = f"*{r.label}*" if not r.ranked else r.label
        lines.append("| " + " | ".join([label, *texts]) + " |")
    return "\n".join(lines)


def gain_table(data: dict[str, Any]) -> str:
    """Normalized gain per cell as Markdown: mean ± standard error (n successful seeds)."""
    agg = _aggregates(data)
    benches = agg["benchmark_order"]
    cells = {(c["agent"], c["benchmark"]): c for c in agg["cells"]}
    lines = ["| agent | " + " | ".join(_title(b) for b in benches) + " | RSI-Index |",
             "|---" + "|---:" * (len(benches) + 1) + "|"]
    for agent in agg["agent_order"]:
        texts = []
        for b in benches:
            c = cells.get((agent, b))
            if c is None or c["reward_mean"] is None:
                texts.append("—")
            else:
                texts.append(f"{c['reward_mean']:+.3f} ± {c['reward_se']:.3f} (n={c['ok']})")
        rsi = agg["agents"][agent]["rsi_index"]
        lines.append(f"| {agent} | " + " | ".join(texts) + f" | {'—' if rsi is None else f'{rsi:+.4f}'} |")
    return "\n".join(lines)


def quality_table(data: dict[str, Any]) -> str:
    """Research-quality metrics per agent as Markdown (means over successful episodes that have them):
    discovery (best dev score), selection (official score of the submitted minus the best dev candidate),
    retention (final official minus best dev), efficiency (normalized gain per dollar). See
    :mod:`rsigym_env.metrics`. Empty when no episode carries metrics (results saved before they existed)."""
    agg = _aggregates(data)
    rows = agg["agents"]
    if not any(rows[a].get("discovery_mean") is not None or rows[a].get("efficiency_mean") is not None
               for a in agg["agent_order"]):
        return ""

    def fmt(value: float | None, spec: str) -> str:
        return "—" if value is None else format(value, spec)

    lines = ["| agent | discovery (best dev) | selection | retention | efficiency (gain / $1000) |",
             "|---|---:|---:|---:|---:|"]
    for agent in agg["agent_order"]:
        a = rows[agent]
        eff = a.get("efficiency_mean")
        lines.append(f"| {agent} | {fmt(a.get('discovery_mean'), '.4f')} | {fmt(a.get('selection_mean'), '+.4f')} | "
                     f"{fmt(a.get('retention_mean'), '+.4f')} | {fmt(None if eff is None else 1000 * eff, '+.4f')} |")
    return "\n".join(lines)


def failures(data: dict[str, Any]) -> list[tuple[str, str, list[tuple[str, int]]]]:
    """Failed episodes grouped by (agent, first error line): ``[(agent, error, [(benchmark, seed), ...])]``."""
    groups: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for e in data["episodes"]:
        if not e["ok"]:
            first = (e.get("error") or "?").splitlines()[0]
            groups.setdefault((e["agent"], first), []).append((e["benchmark"], e["seed"]))
    return [(a, err, where) for (a, err), where in groups.items()]


def print_report(data: dict[str, Any], console: Console | None = None) -> None:
    """The table, then any failures (agent, error, where), to the terminal."""
    console = console or Console()
    console.print(rich_table(data))
    for agent, error, where in failures(data):
        places = ", ".join(f"{b}/s{s}" for b, s in where[:6]) + (" …" if len(where) > 6 else "")
        console.print(f"[red]failed[/] {agent}: {len(where)} episode(s) ({places}): {error}", markup=True, highlight=False)


# ---------------------------------------------------------------------------------------- figures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def heatmap(data: dict[str, Any], path: str | Path) -> Path:
    """PNG heatmap of mean normalized gain, agents × benchmarks plus an RSI-Index column, cells annotated."""
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    plt = _pyplot()
    agg = _aggregates(data)
    benches, agents = agg["benchmark_order"], agg["agent_order"]
    cells = {(c["agent"], c["benchmark"]): c for c in agg["cells"]}
    values = np.full((len(agents), len(benches) + 1), np.nan)
    notes: dict[tuple[int, int], str] = {}
    for i, agent in enumerate(agents):
        for j, b in enumerate(benches):
            c = cells.get((agent, b))
            if c is not None and c["reward_mean"] is not None:
                values[i, j] = c["reward_mean"]
                notes[i, j] = f"{c['reward_mean']:+.3f}\n±{c['reward_se']:.3f}" + (f"\n{c['failed']} failed" if c["failed"] else "")
            else:
                notes[i, j] = "failed" if c is not None and c["failed"] else "—"
        rsi = agg["agents"][agent]["rsi_index"]
        if rsi is not None:
            values[i, -1] = rsi
        notes[i, len(benches)] = "—" if rsi is None else f"{rsi:+.3f}"
    finite = values[np.isfinite(values)]
    lo = min(-0.05, float(finite.min()) if finite.size else -0.05)
    hi = max(0.05, float(finite.max()) if finite.size else 0.05)
    fig, ax = plt.subplots(figsize=(1.6 * (len(benches) + 1) + 2.0, 0.75 * len(agents) + 1.8), dpi=150)
    cmap = plt.get_cmap("RdYlGn").with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=TwoSlopeNorm(vmin=lo, vcenter=0.0, vmax=hi), aspect="auto")
    ax.set_xticks(range(len(benches) + 1), [_title(b) for b in benches] + ["RSI-Index"], rotation=20, ha="right")
    ax.set_yticks(range(len(agents)), agents)
    ax.axvline(len(benches) - 0.5, color="white", linewidth=4)
    for (i, j), text in notes.items():
        ax.text(j, i, text, ha="center", va="center", fontsize=8,
                fontweight="bold" if j == len(benches) else "normal")
    cfg = data.get("config", {})
    ax.set_title(f"Normalized gain (final − initial) / (1 − initial), mean ± s.e. over {len(cfg.get('seeds', []))} seeds",
                 fontsize=10)
    bar = fig.colorbar(image, ax=ax, label="normalized gain", shrink=0.85)
    bar.set_ticks(sorted({round(lo, 2), 0.0, *(round(float(t), 2) for t in np.linspace(0.0, hi, 5)[1:])}))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def anytime_matrix(episodes: Sequence[dict[str, Any]], grid: Sequence[float]) -> list[list[float]]:
    """Each episode's best-dev-so-far on a dollar grid (one row per episode).

    At ``x`` dollars an episode counts its best dev score after the last step with spend ≤ ``x``;
    before its first dev measurement it counts its initial official score (it still holds the initial
    system), and after it stops it keeps its last value.

    >>> ep = {"initial_score": 0.2, "curve": [[0, -1], [10, 0.25], [40, 0.5]]}
    >>> anytime_matrix([ep], [0, 5, 10, 39, 40, 100])
    [[0.2, 0.2, 0.25, 0.25, 0.5, 0.5]]
    """
    out = []
    for e in episodes:
        start = float(e.get("initial_score") or 0.0)
        row, k, value = [], 0, start
        curve = e.get("curve") or []
        for x in grid:
            while k < len(curve) and curve[k][0] <= x + 1e-9:
                if curve[k][1] >= 0:
                    value = float(curve[k][1])
                k += 1
            row.append(value)
        out.append(row)
    return out


def anytime_curves(data: dict[str, Any], path: str | Path, points: int = 201) -> Path:
    """PNG: best dev score so far against dollars spent, one panel per benchmark, one line per agent
    (mean over successful seeds on a common dollar grid, band = ± s.e.)."""
    import numpy as np

    plt = _pyplot()
    agg = _aggregates(data)
    benches, agents = agg["benchmark_order"], agg["agent_order"]
    ok = [e for e in data["episodes"] if e["ok"]]
    budget = max([float(e["budget_usd"]) for e in data["episodes"]] or [500.0])
    grid = np.linspace(0.0, budget, points)
    cols = min(len(benches), 3) or 1
    nrows = math.ceil(len(benches) / cols) or 1
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.4 * nrows), dpi=150, squeeze=False)
    colors = plt.get_cmap("tab10")
    for n, bench in enumerate(benches):
        ax = axes[n // cols][n % cols]
        initial = [float(e["initial_score"]) for e in ok if e["benchmark"] == bench]
        if initial:
            ax.axhline(sum(initial) / len(initial), color="grey", linestyle=":", linewidth=1, label="initial (official)")
        for a, agent in enumerate(agents):
            eps = [e for e in ok if e["benchmark"] == bench and e["agent"] == agent]
            if not eps:
                continue
            m = np.asarray(anytime_matrix(eps, grid))
            mean = m.mean(axis=0)
            ax.plot(grid, mean, color=colors(a % 10), label=f"{agent} (n={len(eps)})", linewidth=1.6)
            if len(eps) > 1:
                se = m.std(axis=0, ddof=1) / math.sqrt(len(eps))
                ax.fill_between(grid, mean - se, mean + se, color=colors(a % 10), alpha=0.15, linewidth=0)
        ax.set_title(_title(bench), fontsize=10)
        ax.set_xlim(0, budget)
        ax.set_xlabel("dollars spent")
        ax.set_ylabel("best dev score so far")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
    for n in range(len(benches), nrows * cols):
        axes[n // cols][n % cols].axis("off")
    fig.suptitle("Anytime curves: best dev score vs dollars spent (mean over seeds, band ± s.e.)", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------- the bundle


def markdown_report(data: dict[str, Any], command: str | None = None) -> str:
    """``table.md``: the command that made it, the Figure-2 table, normalized gains, timing, failures."""
    cfg, timing = data.get("config", {}), data.get("timing", {})
    agg = _aggregates(data)
    lines = ["# Sweep: Figure-2 table", ""]
    if command:
        lines += ["Regenerate with:", "", "```bash", command, "```", ""]
    how = (f"Ran as Ray {cfg.get('ray_version')} tasks on {cfg.get('ray_cpus')} CPUs, {cfg.get('chunk')} episodes per task"
           if cfg.get("mode") == "ray" else "Ran in-process (`--local`)")
    lines += [
        f"{agg['episodes']} episodes ({len(agg['agent_order'])} agents × {len(agg['benchmark_order'])} benchmarks × "
        f"{len(cfg.get('seeds', []))} seeds {cfg.get('seeds')}), world {'/'.join(cfg.get('worlds', []))}, "
        f"track {'/'.join(cfg.get('tracks', []))}, budget ${'/'.join(f'{b:g}' for b in cfg.get('budgets_usd', []))}; "
        f"each episode in its own env (own in-memory ledger, own platform key). {how}; "
        f"{timing.get('sweep_s', float('nan')):.2f} s for the episodes"
        + (f" (+ {timing['ray_init_s']:.1f} s Ray start-up and {timing.get('ray_warmup_s', 0.0):.1f} s worker warm-up)"
           if "ray_init_s" in timing else "")
        + f"; {cfg.get('date', '')}.",
        "",
        "Final official score (avg@3 on the held-out split, %, mean over seeds); RSI-Index = mean normalized "
        "gain over benchmarks; spend = dollars billed to the key; time = research time on the world clock. "
        f"{BEST} = best per column (scores and RSI-Index: highest; spend and time: lowest).",
        "",
        markdown_table(data),
        "",
        "Normalized gain (final − initial) / (1 − initial), mean ± standard error:",
        "",
        gain_table(data),
        "",
    ]
    quality = quality_table(data)
    if quality:
        lines += ["Research quality (mean over episodes; see `rsigym_env.metrics`):", "", quality, ""]
    paper = [b for b in agg["benchmark_order"] if b in PAPER]
    if paper:
        lines += ["For reference, the RSIGym paper (real agents, $500): initial "
                  + ", ".join(f"{_title(b)} {PAPER[b][0]:.2f}" for b in paper) + "; best finals "
                  + ", ".join(f"{PAPER[b][1]:.2f}" for b in paper)
                  + f"; best RSI-Index {PAPER_BEST_RSI[1]:.4f} ({PAPER_BEST_RSI[0]}).", ""]
    fails = failures(data)
    if fails:
        lines += ["Failed episodes:", ""]
        for agent, error, where in fails:
            lines.append(f"* {agent}, {len(where)} episode(s) ({', '.join(f'{b}/s{s}' for b, s in where[:6])}"
                         f"{' …' if len(where) > 6 else ''}): `{error}`")
        lines.append("")
    lines += ["![normalized gain](heatmap.png)", "", "![anytime curves](anytime.png)", ""]
    return "\n".join(lines)


def write_report(data: dict[str, Any], out_dir: str | Path, command: str | None = None) -> dict[str, Path]:
    """Write ``table.md``, ``heatmap.png`` and ``anytime.png`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = command or data.get("config", {}).get("command")
    paths = {"table": out / "table.md", "heatmap": out / "heatmap.png", "anytime": out / "anytime.png"}
    paths["table"].write_text(markdown_report(data, command))
    heatmap(data, paths["heatmap"])
    anytime_curves(data, paths["anytime"])
    return paths


__all__ = ["anytime_curves", "anytime_matrix", "figure2", "gain_table", "heatmap", "markdown_report",
           "markdown_table", "print_report", "quality_table", "rich_table", "write_report"]
