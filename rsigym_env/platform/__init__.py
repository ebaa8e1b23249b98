"""The platform: one authorization service for keys, permissions, budget and audit.

``Platform`` (core) authorizes calls against a key's scenario and reserves, settles and audits them
on a SQLite ``Ledger``; ``verify_audit`` checks a ledger file's hash chain; ``Ledger.books`` checks
that its accounts add up and ``Ledger.recover`` settles the reservations of processes that are gone.
"""

from .audit import AuditRecord, AuditReport, canonical_json, summarize, verify_audit
from .core import Bill, Platform, PlatformKey, audit_args, tool_label
from .ledger import (
    Account, Balance, BookLine, Books, Ledger, OpenReservation, Owner, Recovered, Recovery, Reservation,
    current_owner, owner_status,
)
from .permissions import authorize

__all__ = [
    "Account", "AuditRecord", "AuditReport", "Balance", "Bill", "BookLine", "Books", "Ledger", "OpenReservation",
    "Owner", "Platform", "PlatformKey", "Recovered", "Recovery", "Reservation", "audit_args", "authorize",
    "canonical_json", "current_owner", "owner_status", "summarize", "tool_label", "verify_audit",
]
