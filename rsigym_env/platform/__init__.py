"""The platform: one authorization service for keys, permissions, budget and audit.

``Platform`` (core) authorizes calls against a key's scenario and reserves, settles and audits them
on a SQLite ``Ledger``; ``verify_audit`` checks a ledger file's hash chain.
"""

from .audit import AuditRecord, AuditReport, verify_audit
from .core import Bill, Platform, PlatformKey
from .ledger import Balance, Ledger, Reservation
from .permissions import authorize

__all__ = [
    "AuditRecord", "AuditReport", "Balance", "Bill", "Ledger", "Platform", "PlatformKey", "Reservation",
    "authorize", "verify_audit",
]
