"""The reference :meth:`~rsigym_env.platform.ledger.Ledger.open_settled` must equal, and what a ledger holds
(``tests/platform/test_ledger.py``, ``tests/test_menu_vector_api.py``)."""

from __future__ import annotations

from typing import Any, Iterable

from rsigym_env.platform.ledger import Ledger


def open_settled_one_by_one(ledger: Ledger, entries: Iterable[tuple[str, float, float, dict[str, Any]]]) -> None:
    """Each entry opened, then reserved and settled (a spend above 0) or recorded, one call at a time."""
    for key, budget, spend, audit in entries:
        ledger.open_account(key, budget)
        if spend:
            ledger.settle(ledger.reserve(key, spend, label=audit["tool"]), spend, audit=audit)
        else:
            ledger.record({**audit, "key": key})


def ledger_state(ledger: Ledger) -> tuple[Any, ...]:
    """Everything a ledger holds: audit rows (hashes too), accounts and open holds."""
    rows = [(r.seq, r.key, r.event, r.prev_hash, r.hash) for r in ledger.audit_records()]
    holds = [(r.id, r.key, r.usd, r.used_usd, r.label) for r in ledger.open_reservations()]
    accounts = [(a.key, a.parent, a.balance) for a in ledger.accounts()]
    return rows, accounts, holds
