"""``rsigym agents register | list | show | diff``: the registry of researcher specs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    import tomllib

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value  # a bare string
    return out


def cmd_agents_register(args: argparse.Namespace, console: Console) -> int:
    from ..agents import AgentRegistry, builtin_spec, spec_from_ref

    registry = AgentRegistry()
    try:
        if args.source and args.base:
            raise ValueError("give a source or --from, not both")
        ref = args.source or args.base or "scripted"
        base = builtin_spec(ref) if ref in ("scripted", "llm", "rl", "random") else spec_from_ref(ref, registry)
        changes: dict[str, Any] = {}
        if args.set:
            changes["params"] = _parse_set(args.set)
        for field, value in (("name", args.name), ("model", args.model)):
            if value is not None:
                changes[field] = value
        if args.prompt_file:
            changes["system_prompt"] = Path(args.prompt_file).read_text()
        spec = base.derive(**changes) if changes else base
        from ..agents import check_buildable

        check_buildable(spec)
    except (ValueError, KeyError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    agent_id = registry.register(spec, note=args.note)
    print(agent_id)
    return 0


def cmd_agents_list(args: argparse.Namespace, console: Console) -> int:
    from ..agents import AgentRegistry

    records = list(AgentRegistry())
    if args.json:
        print(json.dumps([{"id": r["id"], "registered_at": r["registered_at"], "note": r["note"],
                           "spec": r["spec"].model_dump(mode="json")} for r in records], indent=1))
        return 0
    table = Table(title=f"registered researchers ({AgentRegistry().root})")
    for col in ("id", "name", "kind", "parent", "params", "registered", "note"):
        table.add_column(col)
    for r in records:
        s = r["spec"]
        params = ", ".join(f"{k}={v}" for k, v in list(s.params.items())[:6])
        table.add_row(r["id"], s.name, s.kind, s.parent or "", params, r["registered_at"], r["note"])
    console.print(table)
    return 0


def cmd_agents_show(args: argparse.Namespace, console: Console) -> int:
    from ..agents import AgentRegistry

    try:
        record = AgentRegistry().record(args.agent)
    except KeyError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    spec = record["spec"]
    if args.files:
        for path, text in spec.to_files().items():
            print(f"==> {path} <==\n{text}" + ("" if text.endswith("\n") else "\n"))
    else:
        print(json.dumps({"id": spec.id, "registered_at": record["registered_at"], "note": record["note"],
                          "spec": spec.model_dump(mode="json")}, indent=1))
    return 0


def cmd_agents_diff(args: argparse.Namespace, console: Console) -> int:
    from ..agents import AgentRegistry, diff_specs

    registry = AgentRegistry()
    try:
        a, b = registry.get(args.a), registry.get(args.b)
    except KeyError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    text = diff_specs(a, b)
    print(text if text else f"{a.id} and {b.id} have the same content", end="" if text else "\n")
    return 0


def register(sub: Any) -> None:
    """Add this module's command(s) to ``rsigym``'s subparsers."""
    ag = sub.add_parser("agents", help="the registry of researcher specs (content-addressed, in $RSIGYM_HOME/agents)")
    ag_sub = ag.add_subparsers(dest="agents_command", required=True)
    reg = ag_sub.add_parser("register", help="register a spec; prints its id")
    reg.add_argument("source", nargs="?", help="a spec JSON file, a directory of spec files (spec.json, params.toml, "
                                                "prompt.md, skills/, memory/) or a registered id to derive from")
    reg.add_argument("--from", dest="base", help="derive from a bundled researcher (scripted, llm, rl, random) or an id")
    reg.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a parameter (TOML value)")
    reg.add_argument("--name", help="the spec's name")
    reg.add_argument("--model", help="the model (LLM researchers)")
    reg.add_argument("--prompt-file", help="system prompt from this file")
    reg.add_argument("--note", default="", help="a note kept with the registration (not part of the content)")
    reg.set_defaults(func=cmd_agents_register)
    ls = ag_sub.add_parser("list", help="list registered specs")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_agents_list)
    show = ag_sub.add_parser("show", help="show a spec (JSON, or its files)")
    show.add_argument("agent")
    show.add_argument("--files", action="store_true", help="print the files view")
    show.set_defaults(func=cmd_agents_show)
    diff = ag_sub.add_parser("diff", help="unified diff of two specs' files")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.set_defaults(func=cmd_agents_diff)
