"""``rsigym audit verify PATH`` and ``rsigym ledger show | recover PATH``: a run's ledger file."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..platform.audit import verify_audit


def cmd_audit_verify(args: argparse.Namespace, console: Console) -> int:
    path = Path(args.path)
    if path.is_dir():
        path = path / "ledger.sqlite"
    report = verify_audit(path)
    console.print(("[green]" if report.ok else "[red]") + str(report))
    return 0 if report.ok else 1


def cmd_ledger(args: argparse.Namespace, console: Console) -> int:
    """``ledger show``: accounts, open reservations, the books and the audit chain (exit 1 unless all are
    right); ``ledger recover``: settle the reservations of processes that are gone and say what moved."""
    import sqlite3

    from ..platform.ledger import Ledger

    path = Path(args.path)
    if path.is_dir():
        path = path / "ledger.sqlite"
    if not path.is_file():
        console.print(f"[red]error:[/] no ledger file at {path}")
        return 1
    try:
        ledger = Ledger(path, readonly=True)  # checks that it is a ledger before anything is written
        if args.ledger_command == "recover":
            ledger.close()
            ledger = Ledger(path, recover=False)
    except (ValueError, OSError, sqlite3.Error) as exc:
        console.print(f"[red]error:[/] cannot open {path} as a ledger: {exc}")
        return 1
    with ledger:
        if args.ledger_command == "recover":
            recovery = ledger.recover(unowned=args.unowned)
            table = Table(title=f"settled ({len(recovery.settled)})")
            for col in ("id", "key", "tool", "owner", "reserved", "charged", "released", "reason"):
                table.add_column(col, justify="right" if col in ("reserved", "charged", "released") else "left")
            for done in recovery.settled:
                r = done.reservation
                owner = f"{r.owner.pid}@{r.owner.host}" if r.owner else "?"
                table.add_row(str(r.id), r.key, r.label or "", owner, f"${r.usd:,.4f}", f"${done.charged_usd:,.4f}",
                              f"${done.released_usd:,.4f}", done.reason)
            console.print(table)
            for r in recovery.left:
                where = f"{r.owner.pid}@{r.owner.host}" if r.owner else "no owner recorded (--unowned settles it)"
                console.print(f"[yellow]left alone:[/] reservation {r.id} on {r.key} (${r.usd:,.4f}), owner {where}: "
                              f"{r.status}")
            return 0
        accounts, holds, books = ledger.accounts(), ledger.open_reservations(), ledger.books()
    money = lambda usd: f"${usd:,.4f}"  # noqa: E731
    table = Table(title=f"accounts ({path})")
    for col in ("key", "parent", "budget", "spent", "reserved", "granted", "available", "closed"):
        table.add_column(col, justify="left" if col in ("key", "parent", "closed") else "right")
    for a in accounts:
        b = a.balance
        table.add_row(a.key, a.parent or "", money(b.budget_usd), money(b.spent_usd), money(b.reserved_usd),
                      money(b.granted_usd), money(b.available_usd), "yes" if b.closed else "")
    console.print(table)
    table = Table(title=f"open reservations ({len(holds)})")
    for col in ("id", "key", "amount", "used so far", "tool", "owner pid", "host", "owner", "age"):
        table.add_column(col, justify="right" if col in ("id", "amount", "used so far", "age") else "left")
    now = time.time()
    for r in holds:
        age = "?" if r.created is None else f"{max(0.0, now - r.created):,.0f} s"
        style = {"alive": "green", "gone": "red"}.get(r.status, "yellow")
        table.add_row(str(r.id), r.key, money(r.usd), money(r.used_usd), r.label or "",
                      str(r.owner.pid) if r.owner else "?", r.owner.host if r.owner else "?",
                      f"[{style}]{r.status}[/]", age)
    console.print(table)
    gone = [r for r in holds if r.status == "gone"]
    if gone:
        console.print(f"[yellow]{len(gone)} reservation(s) of processes that are gone, ${sum(r.usd for r in gone):,.4f}: "
                      f"rsigym ledger recover {path}[/]")
    table = Table(title="the books")
    for col in ("key", "spent+reserved+granted+available = budget", "open reservations = reserved",
                "sub-key budgets = granted"):
        table.add_column(col)
    mark = lambda ok, text: f"[green]ok[/] {text}" if ok else f"[red]NO[/] {text}"  # noqa: E731
    for line in books.lines:
        total = line.spent_usd + line.reserved_usd + line.granted_usd + line.available_usd
        table.add_row(line.key, mark(line.balances, f"{money(total)} = {money(line.budget_usd)}" + (" (closed)" if line.closed else "")),
                      mark(line.reservations_match, f"{money(line.reservations_usd)} = {money(line.reserved_usd)}"),
                      mark(line.subkeys_match, f"{money(line.subkeys_usd)} = {money(line.granted_usd)}"))
    console.print(table)
    for problem in books.problems:
        console.print(f"[red]books:[/] {problem}", highlight=False)
    report = verify_audit(path)
    console.print(("[green]" if report.ok else "[red]") + str(report))
    ok = books.ok and report.ok
    console.print("[green]the books balance and the audit chain is intact[/]" if ok
                  else "[red]the books do not balance or the audit chain is broken[/]")
    return 0 if ok else 1


def register(sub: Any) -> None:
    """Add this module's command(s) to ``rsigym``'s subparsers."""
    audit = sub.add_parser("audit", help="audit-log commands")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_sub.add_parser("verify", help="check a run's hash-chained audit log; names the first broken record")
    verify.add_argument("path", help="a ledger.sqlite file or a run directory")
    verify.set_defaults(func=cmd_audit_verify)

    led = sub.add_parser("ledger", help="ledger commands: the books, open reservations, recovery after a crash")
    led_sub = led.add_subparsers(dest="ledger_command", required=True)
    led_show = led_sub.add_parser("show", help="accounts, open reservations (owner alive or gone), the books and the "
                                               "audit chain; exit 1 unless everything balances and the chain is intact")
    led_show.add_argument("path", help="a ledger.sqlite file or a run directory")
    led_show.set_defaults(func=cmd_ledger)
    led_rec = led_sub.add_parser("recover", help="settle reservations of processes that are gone (for the work they "
                                                 "recorded; the rest is released) and print what was settled")
    led_rec.add_argument("path", help="a ledger.sqlite file or a run directory")
    led_rec.add_argument("--unowned", action="store_true", help="also settle reservations that record no owner "
                                                                "(ledgers written before owners were recorded)")
    led_rec.set_defaults(func=cmd_ledger)
