"""``rsigym prices show | refresh``: the remote world's price list (Tinker's models.json)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def cmd_prices(args: argparse.Namespace, console: Console) -> int:
    """``prices show`` (the price list in use) and ``prices refresh`` (download Tinker's models.json)."""
    from ..worlds.remote import pricing

    if args.prices_command == "refresh":
        try:
            path = pricing.refresh(args.url, Path(args.out) if args.out else None)
        except (OSError, ValueError) as exc:
            console.print(f"[red]error:[/] could not refresh from {args.url}: {exc}")
            return 1
        console.print(f"Tinker price list: {path} ({len(pricing.load_tinker_models(path))} models)")
        return 0
    path, meta = pricing.price_source()
    table = Table(title=f"Tinker prices, $ per million tokens ({path}, {meta.get('retrieved', 'undated')})")
    for col in ("model", "context", "prefill", "cached", "sample", "train"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for row in pricing.load_tinker_models(path):
        price = pricing.model_price(row["tinker_id"], [row])
        table.add_row(row["tinker_id"], str(row.get("context", "")), f"{price.prefill:g}", f"{price.cached:g}",
                      f"{price.sample:g}", f"{price.train:g}")
    console.print(table)
    return 0


def register(sub: Any) -> None:
    """Add this module's command(s) to ``rsigym``'s subparsers."""
    pr = sub.add_parser("prices", help="the remote world's price list (Tinker's models.json)")
    pr_sub = pr.add_subparsers(dest="prices_command", required=True)
    pr_sub.add_parser("show", help="the price list in use and its date").set_defaults(func=cmd_prices)
    refresh = pr_sub.add_parser("refresh", help="download Tinker's live models.json (needs the network)")
    refresh.add_argument("--url", default="https://tinker-docs.thinkingmachines.ai/tinker/models.json")
    refresh.add_argument("--out", help="where to write it (default: $RSIGYM_HOME/prices/tinker_models.json)")
    refresh.set_defaults(func=cmd_prices)
