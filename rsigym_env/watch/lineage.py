"""What the lineage pages show: the archives of candidate researchers (:mod:`rsigym_env.archive`).

:func:`archives_index` lists the archives under a folder with their figures; :func:`archive_view`
gives one archive's summary, its nodes, its tree and the score-by-generation chart (an inline SVG
drawn here: no script, so it renders under the dashboard's CSP as it is); :func:`node_view` a node's
facts, its evaluations per split and its diff from its parent.

>>> import tempfile
>>> archives_index(tempfile.mkdtemp())
[]
"""

from __future__ import annotations

import html
import math
import os
import urllib.parse
from typing import Any, Sequence

import markupsafe

from ..archive import SPLITS, Archive, ArchiveError, Node, archives_root, list_archives
from .model import diff_files

STATUS_BADGE = {"evaluated": "running", "accepted": "finished", "rejected": "failed", "duplicate": "stalled"}
"""The badge class (colour) of each node status."""
STATUS_COLOUR = {"evaluated": "#2563eb", "accepted": "#15803d", "rejected": "#b91c1c", "duplicate": "#b45309"}


def split_order(splits: Sequence[str]) -> list[str]:
    """``train``, ``validation``, ``test`` first, then the transfer splits by name.

    >>> split_order(["transfer/x", "test", "train"])
    ['train', 'test', 'transfer/x']
    """
    order = {s: i for i, s in enumerate(SPLITS)}
    return sorted(set(splits), key=lambda s: (order.get(s, len(order)), s))


def _archive(root: str | os.PathLike[str] | None, name: str) -> Archive | None:
    try:
        archive = Archive(root, name=name)
    except ValueError:
        return None
    return archive if archive.exists() else None


def archives_index(root: str | os.PathLike[str] | None = None, split: str = "validation") -> list[dict[str, Any]]:
    """Every archive under ``root`` (default ``$RSIGYM_HOME/archives``) with its figures (no rebuild)."""
    out = []
    for name in list_archives(root):
        archive = Archive(root, name=name)
        try:
            summary = archive.summary(split, max_pairs_nodes=0)
        except ArchiveError as exc:
            out.append({"name": name, "error": str(exc)})
            continue
        out.append({"name": name, "error": None, **summary})
    return out


def _operator(node: Node) -> str:
    by = node.produced_by or {}
    return str(by.get("operator") or by.get("description") or "")


def node_row(node: Node) -> dict[str, Any]:
    """A node as a row of the archive's table."""
    return {"id": node.id, "parent": node.parent, "generation": node.generation, "chain": node.chain,
            "status": node.status, "badge": STATUS_BADGE[node.status], "cost_usd": node.cost_usd,
            "operator": _operator(node), "created": node.created,
            "scores": {s: {"mean": v.mean, "se": v.se, "n": v.n} for s, v in node.scores.items()}}


def archive_view(root: str | os.PathLike[str] | None, name: str, split: str = "validation",
                 base: str = "") -> dict[str, Any] | None:
    """Everything an archive's page renders (``None`` if there is no such archive)."""
    archive = _archive(root, name)
    if archive is None:
        return None
    nodes = archive.nodes()
    splits = split_order([s for n in nodes for s in n.scores] + ["validation"])
    summary = archive.summary(split)
    href = f"{base}/archives/{urllib.parse.quote(name, safe='')}/nodes/"
    return {"name": name, "path": str(archive.dir), "split": split, "splits": splits, "summary": summary,
            "rows": [node_row(n) for n in nodes], "tree": archive.tree(split), "badges": STATUS_BADGE,
            "chart": generation_chart(nodes, split, href)}


def node_view(root: str | os.PathLike[str] | None, name: str, ref: str) -> dict[str, Any] | None:
    """Everything a node's page renders (``None`` if there is no such archive or node)."""
    archive = _archive(root, name)
    if archive is None:
        return None
    try:
        node = archive.get(ref)
    except KeyError:
        return None
    view: dict[str, Any] = {"name": name, "node": node_row(node) | {"notes": node.notes,
                                                                   "produced_by": node.produced_by},
                            "full_scores": [(s, node.scores[s]) for s in split_order(list(node.scores))],
                            "children": [node_row(c) for c in archive.children(node.id)],
                            "patch_ops": {p: fp.op for p, fp in sorted(node.patch.items())},
                            "lineage": [], "diff": None, "error": None}
    try:
        view["lineage"] = [node_row(n) for n in archive.lineage(node.id)]
        after = archive.rebuild(node.id)
        before = archive.rebuild(node.parent) if node.parent is not None else {}
        view["diff"] = diff_files(before, after, node.parent or "empty", node.id)
        view["n_files"] = len(after)
    except ArchiveError as exc:
        view["error"] = str(exc)
    return view


# ------------------------------------------------------------------------------------ the chart


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    step = (hi - lo) / max(n - 1, 1)
    return [lo + i * step for i in range(n)]


def generation_chart(nodes: Sequence[Node], split: str, href: str = "", width: int = 720,
                     height: int = 280) -> markupsafe.Markup:
    """An inline SVG: every node scored on ``split`` at (generation, mean), coloured by status, linked to
    its page (``href`` + id) and joined to its parent; the line is the best score up to each generation.

    >>> str(generation_chart([], "validation"))[:40]
    '<p class="muted">No node has a validatio'
    """
    e = html.escape
    scored = [n for n in nodes if split in n.scores]
    if not scored:
        return markupsafe.Markup(f'<p class="muted">No node has a {e(split)} score yet.</p>')
    left, right, top, bottom = 56, 16, 14, 40
    gens = [n.generation for n in scored]
    g0, g1 = min(gens), max(gens)
    means = [n.scores[split].mean for n in scored]
    lo, hi = min(means), max(means)
    pad = (hi - lo) * 0.08 if hi > lo else max(abs(hi) * 0.05, 0.05)
    lo, hi = lo - pad, hi + pad

    def x(g: float) -> float:
        if g1 == g0:
            return left + (width - left - right) / 2
        return left + (g - g0) / (g1 - g0) * (width - left - right)

    def y(v: float) -> float:
        return top + (hi - v) / (hi - lo) * (height - top - bottom)

    by_gen: dict[int, list[Node]] = {}
    for n in scored:
        by_gen.setdefault(n.generation, []).append(n)
    spread = min(10.0, (width - left - right) / max(g1 - g0, 1) / 4)
    pos: dict[str, tuple[float, float]] = {}
    for g, group in by_gen.items():
        for i, n in enumerate(group):
            offset = (i - (len(group) - 1) / 2) * (2 * spread / max(len(group) - 1, 1)) if len(group) > 1 else 0.0
            pos[n.id] = (x(g) + offset, y(n.scores[split].mean))
    parts = [f'<svg class="lineage-chart" viewBox="0 0 {width} {height}" width="100%" role="img" '
             f'aria-label="{e(split)} score by generation" xmlns="http://www.w3.org/2000/svg">']
    for t in _ticks(lo, hi):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#eef0f3"/>'
                     f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end" font-size="11" fill="#6b7585">'
                     f'{t:.3f}</text>')
    every = max(1, math.ceil((g1 - g0 + 1) / 20))
    for g in range(g0, g1 + 1, every):
        parts.append(f'<text x="{x(g):.1f}" y="{height - bottom + 16}" text-anchor="middle" font-size="11" '
                     f'fill="#6b7585">{g}</text>')
    parts.append(f'<text x="{(left + width - right) / 2:.1f}" y="{height - 6}" text-anchor="middle" font-size="12" '
                 f'fill="#6b7585">generation</text>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{height - bottom}" stroke="#9ca3af"/>'
                 f'<line x1="{left}" x2="{width - right}" y1="{height - bottom}" y2="{height - bottom}" stroke="#9ca3af"/>')
    for n in scored:  # lineage edges
        if n.parent in pos:
            (px, py), (cx, cy) = pos[n.parent], pos[n.id]
            parts.append(f'<line x1="{px:.1f}" y1="{py:.1f}" x2="{cx:.1f}" y2="{cy:.1f}" stroke="#d1d5db"/>')
    best, points = -math.inf, []
    for g in sorted(by_gen):
        best = max(best, max(n.scores[split].mean for n in by_gen[g]))
        points.append(f"{x(g):.1f},{y(best):.1f}")
    parts.append(f'<polyline class="best" points="{" ".join(points)}" fill="none" stroke="#0f766e" stroke-width="2"/>')
    for n in scored:
        cx, cy = pos[n.id]
        s = n.scores[split]
        tip = f"{n.id} · generation {n.generation} · {n.status} · {split} {s.mean:.4f} ± {s.se:.4f} (n={s.n})"
        parts.append(f'<a href="{e(href + n.id)}"><circle class="node" data-node="{e(n.id)}" cx="{cx:.1f}" '
                     f'cy="{cy:.1f}" r="5" fill="{STATUS_COLOUR[n.status]}"><title>{e(tip)}</title></circle></a>')
    parts.append("</svg>")
    return markupsafe.Markup("".join(parts))


__all__ = ["archive_view", "archives_index", "archives_root", "generation_chart", "node_view", "split_order"]
