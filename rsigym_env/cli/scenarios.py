"""``rsigym scenarios [--track T]``: the bundled scenarios."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from ..catalog import TRACKS
from ..scenario import list_scenarios, load_scenario


def cmd_scenarios(args: argparse.Namespace, console: Console) -> int:
    table = Table(title="bundled scenarios (rsigym run --scenario NAME)")
    for col in ("name", "track", "world", "benchmark", "budget", "time", "steps"):
        table.add_column(col, justify="right" if col in ("budget", "time", "steps") else "left")
    for name in list_scenarios():
        s = load_scenario(name)
        if args.track and s.track != args.track:
            continue
        table.add_row(name, s.track, s.world, s.benchmark, f"${s.budget_usd:g}", f"{s.time_limit_h:g} h", str(s.max_steps))
    console.print(table)
    return 0


def register(sub: Any) -> None:
    """Add this module's command(s) to ``rsigym``'s subparsers."""
    scen = sub.add_parser("scenarios", help="list the bundled scenarios")
    scen.add_argument("--track", choices=list(TRACKS))
    scen.set_defaults(func=cmd_scenarios)
