"""``rsigym archive list | show | tree | diff | summary``: the archive of candidate researchers.

    rsigym archive list [--archive NAME] [--root DIR] [--json]
    rsigym archive show ag-3f2a1 [--files] [--json]
    rsigym archive tree [--split validation]
    rsigym archive diff ag-3f2a1 ag-77c0e
    rsigym archive summary [--split validation] [--json]

An archive lives in ``<root>/<name>`` (default ``$RSIGYM_HOME/archives/default``, as ``rsigym agents``
keeps its registry under ``$RSIGYM_HOME``); ids may be given by a unique prefix of at least 5
characters. Errors print a message and exit with 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

SHOWN_SPLITS = ("train", "validation", "test")


def _archive(args: argparse.Namespace) -> Any:
    from ..archive import Archive

    archive = Archive(args.root, name=args.archive)
    if not archive.exists():
        raise KeyError(f"no archive {args.archive!r} under {archive.root} (nothing recorded yet?)")
    return archive


def _fmt(score: Any) -> str:
    if score is None:
        return "—"
    return f"{score.mean:.4f} ± {score.se:.4f}" if score.n > 1 else f"{score.mean:.4f}"


def _operator(node: Any) -> str:
    by = node.produced_by or {}
    text = str(by.get("operator") or by.get("description") or "")
    return text if len(text) <= 48 else text[:47] + "…"


def cmd_archive_list(args: argparse.Namespace, console: Console) -> int:
    archive = _archive(args)
    nodes = archive.nodes()
    if args.json:
        print(json.dumps([n.model_dump(mode="json", exclude={"patch"}) for n in nodes], indent=1))
        return 0
    table = Table(title=f"archive {archive.name} ({archive.dir}): {len(nodes)} nodes")
    for col in ("id", "parent", "gen", "chain", "status", *SHOWN_SPLITS, "cost", "made by"):
        table.add_column(col, justify="right" if col in (*SHOWN_SPLITS, "gen", "chain", "cost") else "left")
    for n in nodes:
        table.add_row(n.id, n.parent or "", str(n.generation), "" if n.chain is None else str(n.chain), n.status,
                      *(_fmt(n.scores.get(s)) for s in SHOWN_SPLITS), f"${n.cost_usd:,.2f}", escape(_operator(n)))
    console.print(table)
    return 0


def cmd_archive_show(args: argparse.Namespace, console: Console) -> int:
    archive = _archive(args)
    node = archive.get(args.node)
    if args.json:
        print(json.dumps(node.model_dump(mode="json"), indent=1))
        return 0
    if args.files:
        for path, text in sorted(archive.rebuild(node.id).items()):
            print(f"==> {path} <==\n{text}" + ("" if text.endswith("\n") else "\n"))
        return 0
    facts = [("id", node.id), ("parent", node.parent or "— (a root)"), ("generation", node.generation),
             ("chain", node.chain), ("status", node.status), ("created", node.created),
             ("cost", f"${node.cost_usd:,.2f}")]
    facts += [(f"produced_by.{k}", v) for k, v in (node.produced_by or {}).items()]
    for key, value in facts:
        if value is not None:
            console.print(f"[bold]{key}[/]: {escape(str(value))}", highlight=False)
    if node.notes:
        console.print(f"[bold]notes[/]: {escape(node.notes)}", highlight=False)
    if node.scores:
        table = Table(title="scores")
        for col in ("split", "mean", "se", "n", "values"):
            table.add_column(col, justify="left" if col in ("split", "values") else "right")
        order = {s: i for i, s in enumerate(SHOWN_SPLITS)}
        for split in sorted(node.scores, key=lambda s: (order.get(s, len(order)), s)):
            s = node.scores[split]
            values = ", ".join(f"{v:.3g}" for v in (s.values or [])[:12]) + (" …" if len(s.values or []) > 12 else "")
            table.add_row(split, f"{s.mean:.4f}", f"{s.se:.4f}", str(s.n), values)
        console.print(table)
    else:
        console.print("no scores recorded", style="dim")
    print(f"--- patch from {node.parent or 'nothing (a root: its full files)'} ---")
    print(archive.node_diff(node.id), end="")
    return 0


def cmd_archive_tree(args: argparse.Namespace, console: Console) -> int:
    archive = _archive(args)
    split = args.split

    def label(item: dict[str, Any]) -> str:
        scores = " ".join(f"{k[:5] if not k.startswith('transfer/') else k} {v:.3f}"
                          for k, v in sorted(item["scores"].items(), key=lambda kv: kv[0] != split))
        colour = {"accepted": "green", "rejected": "red", "duplicate": "yellow"}.get(item["status"], "white")
        op = str((item["produced_by"] or {}).get("operator") or "")
        return (f"[bold]{item['id']}[/] gen {item['generation']} [{colour}]{item['status']}[/]"
                + (f" · {escape(scores)}" if scores else "") + (f" [dim]{escape(op[:60])}[/]" if op else ""))

    def grow(branch: Tree, item: dict[str, Any]) -> None:
        sub = branch.add(label(item))
        for child in item["children"]:
            grow(sub, child)

    top = Tree(f"archive [bold]{escape(archive.name)}[/] ({len(archive)} nodes; {split} first)")
    for item in archive.tree(split):
        grow(top, item)
    console.print(top, highlight=False)
    return 0


def cmd_archive_diff(args: argparse.Namespace, console: Console) -> int:
    archive = _archive(args)
    a, b = archive.resolve(args.a), archive.resolve(args.b)
    text = archive.diff(a, b)
    print(text if text else f"{a} and {b} have the same files", end="" if text else "\n")
    return 0


def cmd_archive_summary(args: argparse.Namespace, console: Console) -> int:
    archive = _archive(args)
    s = archive.summary(args.split)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    d = s["diversity"]
    console.print(f"archive [bold]{escape(s['name'])}[/]: {s['nodes']} nodes ({s['accepted']} accepted, "
                  f"{s['by_status']['rejected']} rejected, {s['by_status']['duplicate']} duplicate), "
                  f"{s['generations']} generations, {s['roots']} root(s), evaluations ${s['cost_usd']:,.2f}",
                  highlight=False)
    distance = "—" if d["mean_gene_distance"] is None else f"{d['mean_gene_distance']:.3f}"
    console.print(f"diversity: {d['distinct_forms']} distinct code forms / {s['nodes']} nodes; mean pairwise gene "
                  f"distance {distance}", highlight=False)
    table = Table(title=f"best {s['split']} score per generation")
    for col in ("generation", "nodes", "best", "node"):
        table.add_column(col, justify="left" if col == "node" else "right")
    for g in s["by_generation"]:
        table.add_row(str(g["generation"]), str(g["nodes"]), "—" if g["best"] is None else f"{g['best']:.4f}",
                      g["best_id"] or "")
    console.print(table)
    return 0


def _guarded(fn: Any) -> Any:
    """Errors (unknown archive or node, a broken chain, a bad split) as a message and exit code 2."""
    from ..archive import ArchiveError

    def run(args: argparse.Namespace, console: Console) -> int:
        try:
            return int(fn(args, console))
        except KeyError as exc:
            console.print(f"[red]error:[/] {escape(str(exc.args[0] if exc.args else exc))}", highlight=False)
        except (ArchiveError, ValueError, OSError) as exc:
            console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return 2

    run.__name__ = fn.__name__
    return run


def register(sub: Any) -> None:
    """Add ``archive`` to ``rsigym``'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--archive", default="default", metavar="NAME", help="the archive's name (default: default)")
    common.add_argument("--root", default=None, metavar="DIR",
                        help="the folder of archives (default: $RSIGYM_HOME/archives)")
    ar = sub.add_parser("archive", help="the archive of candidate researchers (a tree of specs with their scores, "
                                        "in $RSIGYM_HOME/archives)")
    ar_sub = ar.add_subparsers(dest="archive_command", required=True)
    ls = ar_sub.add_parser("list", parents=[common], help="every node: id, parent, generation, status, scores")
    ls.add_argument("--json", action="store_true", help="the nodes as JSON (without their patches)")
    ls.set_defaults(func=_guarded(cmd_archive_list))
    show = ar_sub.add_parser("show", parents=[common], help="a node: its scores and its patch as a unified diff")
    show.add_argument("node", help="a node id or a unique prefix (at least 5 characters)")
    show.add_argument("--files", action="store_true", help="print its rebuilt files instead")
    show.add_argument("--json", action="store_true", help="the stored node as JSON")
    show.set_defaults(func=_guarded(cmd_archive_show))
    tree = ar_sub.add_parser("tree", parents=[common], help="the lineage tree with scores")
    tree.add_argument("--split", default="validation", help="the split shown first (default validation)")
    tree.set_defaults(func=_guarded(cmd_archive_tree))
    diff = ar_sub.add_parser("diff", parents=[common], help="unified diff of two nodes' rebuilt files")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.set_defaults(func=_guarded(cmd_archive_diff))
    summary = ar_sub.add_parser("summary", parents=[common], help="nodes, generations, diversity, best per generation")
    summary.add_argument("--split", default="validation", help="the split scores are compared on (default validation)")
    summary.add_argument("--json", action="store_true")
    summary.set_defaults(func=_guarded(cmd_archive_summary))


__all__ = ["register"]
