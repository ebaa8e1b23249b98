"""``rsigym tools [--json] [--max-length N]``: the researcher's tools."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from ..gateway.local_runs import MAX_LENGTH_HELP, max_length_arg
from ..tools import tool_schemas


def cmd_tools(args: argparse.Namespace, console: Console) -> int:
    try:
        schemas = tool_schemas(max_string_length=getattr(args, "max_length", "default"))
    except ValueError as exc:  # a bad $RSIGYM_SCHEMA_MAX_LENGTH
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return 2
    if args.json:
        print(json.dumps(schemas, indent=2))
        return 0
    table = Table(title="tools (each one pydantic model: validation, JSON schema, Gymnasium subspace)")
    table.add_column("tool", style="bold")
    table.add_column("arguments")
    table.add_column("what it does")
    for s in schemas:
        fn = s["function"]
        table.add_row(fn["name"], ", ".join(fn["parameters"].get("properties", {})), fn["description"].split(". ")[0])
    console.print(table)
    return 0


def register(sub: Any) -> None:
    """Add this module's command(s) to ``rsigym``'s subparsers."""
    tools = sub.add_parser("tools", help="list the researcher's tools")
    tools.add_argument("--json", action="store_true", help="print the function-calling schemas as JSON")
    tools.add_argument("--max-length", metavar="N", type=max_length_arg, default=argparse.SUPPRESS,
                       help=MAX_LENGTH_HELP)
    tools.set_defaults(func=cmd_tools)
