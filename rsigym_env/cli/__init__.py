"""``rsigym``: run research episodes, list scenarios, verify audit logs.

One module per command group (``run``, ``sweep``, ``ledger`` (with ``audit``), ``agents``,
``prices``, ``scenarios``, ``tools``, ``recurse``); the gateway's and the dashboard's commands live
in :mod:`rsigym_env.gateway.cli` and :mod:`rsigym_env.watch.cli` and are registered here.

    rsigym run --benchmark aime --agent scripted --seed 0 --json result.json
    rsigym run --scenario sim-data-swe-bench-verified-1000 --agent random
    rsigym scenarios
    rsigym audit verify runs/<run>/ledger.sqlite
    rsigym tools
    rsigym sweep --agents random,scripted --benchmarks all --seeds 3 --out bench/sweep
    rsigym sweep --report bench/sweep/results.json
    rsigym agents register --from scripted --set data_fraction=0.6 --name scripted-df06
    rsigym agents list | show ID | diff ID1 ID2
    rsigym run --agent ag-3f2a... --record tape.jsonl       rsigym run --replay tape.jsonl
    rsigym recurse --scenario recursive-scripted --rounds 3 --seeds 3 --out runs/recursion
    rsigym ledger show runs/<run>/ledger.sqlite       rsigym ledger recover runs/<run>/ledger.sqlite
    rsigym serve --port 8765                          rsigym mcp --scenario sim-joint-aime-500
    rsigym skills --out skills/                       rsigym export atif runs/<run>
    rsigym openenv --port 8000                        rsigym watch runs/ --port 8766
"""

from __future__ import annotations

import argparse
from typing import Sequence

from rich.console import Console

from . import agents, archive, counterparts, ledger, prices, recurse, run, scenarios, sweep, tools

COMMANDS = (run, prices, scenarios, ledger, tools, sweep, agents, recurse, archive, counterparts)
"""The command modules of this package, in the order ``rsigym --help`` lists them; each has
``register(subparsers)``, which adds its command(s) with ``func(args, console) -> exit code``."""


def build_parser() -> argparse.ArgumentParser:
    """``rsigym``'s parser: this package's commands, then the gateway's (serve, skills, export, mcp,
    openenv) and the dashboard's (watch), registered from where they live."""
    parser = argparse.ArgumentParser(prog="rsigym", description="RSIGym-Env: research runs as Gymnasium environments.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    # any agent as the researcher: serve, skills, export (rsigym_env.gateway), mcp, openenv
    from ..gateway import cli as gateway_cli
    from ..watch import cli as watch_cli

    gateway_cli.register(sub)
    watch_cli.register(sub)
    gateway_cli.register_mcp(sub)  # the servers themselves load when their command runs
    gateway_cli.register_openenv(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``rsigym``'s entry point (the console script and ``python -m rsigym_env.cli``); the exit code."""
    args = build_parser().parse_args(argv)
    console = Console()
    if not console.is_terminal:  # piped or captured: do not cut tables at 80 columns
        console = Console(width=160)
    return int(args.func(args, console))


__all__ = ["COMMANDS", "build_parser", "main"]
