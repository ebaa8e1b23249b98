"""SQLite budget ledger: each platform key's budget, spend, open reservations and sub-key grants.

Money is stored as integer nano-dollars; the API speaks float dollars. A call reserves its worst case
(rounded *up* to the next nano-dollar) before it runs and settles its actual cost (rounded to the
nearest nano-dollar and clamped to the reservation) afterwards, so a reservation always covers its
charge. Every change and its audit record (see :mod:`.audit`) are one ``BEGIN IMMEDIATE`` transaction,
so concurrent writers - threads sharing a :class:`Ledger`, or processes each opening the same file -
serialize, and an exception in the middle of a call leaves nothing behind.

Invariants, checked by the ``WHERE`` guards and again by ``CHECK`` constraints on ``accounts``:
``spent >= 0``, ``reserved >= 0``, ``granted >= 0`` and ``spent + reserved + granted <= budget``.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Iterator, Optional

from ..errors import ActionError, InsufficientBudget
from . import audit as _audit
from .audit import AuditRecord

NANO = 1_000_000_000
"""Nano-dollars per dollar."""

MAX_USD = 1e9
"""Largest single amount accepted, so sums stay far inside SQLite's 64-bit integers."""

BUSY_TIMEOUT_S = 30.0

PENDING_MAX = 512
"""An in-memory ledger inserts its queued audit rows once this many are waiting (or when read)."""

_Logged = Optional[tuple[tuple[int, str], Optional[_audit.Row]]]
"""What :meth:`Ledger._log` returns: the new chain head and, for an in-memory ledger, the row to queue."""

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS accounts (
        key TEXT PRIMARY KEY,
        parent TEXT,
        budget INTEGER NOT NULL CHECK (budget >= 0),
        spent INTEGER NOT NULL DEFAULT 0 CHECK (spent >= 0),
        reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
        granted INTEGER NOT NULL DEFAULT 0 CHECK (granted >= 0),
        closed INTEGER NOT NULL DEFAULT 0 CHECK (closed IN (0, 1)),
        CHECK (spent + reserved + granted <= budget)
    ) WITHOUT ROWID, STRICT""",
    """CREATE TABLE IF NOT EXISTS reservations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        key TEXT NOT NULL,
        nano INTEGER NOT NULL CHECK (nano >= 0)
    ) STRICT""",
    _audit.SCHEMA,
)

_AVAILABLE = "budget - spent - reserved - granted"
_FITS = "WHERE key = ? AND closed = 0 AND spent + reserved + granted + ? <= budget"
_RESERVE = f"UPDATE accounts SET reserved = reserved + ? {_FITS} RETURNING {_AVAILABLE}"
_GRANT = f"UPDATE accounts SET granted = granted + ? {_FITS} RETURNING {_AVAILABLE}"
_INSERT_RESERVATION = "INSERT INTO reservations (key, nano) VALUES (?, ?)"
_TAKE_RESERVATION = "DELETE FROM reservations WHERE id = ? AND key = ? RETURNING nano"
_CHARGE = f"UPDATE accounts SET reserved = reserved - ?, spent = spent + ? WHERE key = ? RETURNING {_AVAILABLE}"
_OPEN = "INSERT INTO accounts (key, parent, budget) VALUES (?, ?, ?)"
_STATE = f"SELECT {_AVAILABLE}, closed FROM accounts WHERE key = ?"
_SUBKEY = "SELECT parent, budget, spent, granted, closed FROM accounts WHERE key = ?"
_HAS_RESERVATIONS = "SELECT 1 FROM reservations WHERE key = ? LIMIT 1"
_CLOSE = "UPDATE accounts SET closed = 1 WHERE key = ?"
_RETURN_GRANT = (
    f"UPDATE accounts SET granted = granted - ?, spent = spent + ? WHERE key = ? RETURNING {_AVAILABLE}"
)
_BALANCE = "SELECT budget, spent, reserved, granted, closed FROM accounts WHERE key = ?"


@dataclass(frozen=True)
class Reservation:
    """An open hold of ``usd`` dollars on ``key``; settle or release it exactly once."""

    id: int
    key: str
    usd: float


@dataclass(frozen=True)
class Balance:
    """A key's account in dollars; ``available = budget - spent - reserved - granted`` (0 once closed)."""

    budget_usd: float
    spent_usd: float
    reserved_usd: float
    granted_usd: float
    available_usd: float
    closed: bool = False


def _checked(usd: float) -> float:
    """``usd`` if it is a finite amount in ``[0, MAX_USD]``, else ``ValueError``."""
    if not (0.0 <= usd <= MAX_USD):  # also rejects NaN
        raise ValueError(f"amount must be between 0 and {MAX_USD:g} dollars, got {usd!r}")
    return usd


def _nano_up(usd: float) -> int:
    """Dollars to nano-dollars rounded up, ignoring float noise (``0.1`` is 100_000_000, not one more)."""
    exact = usd * NANO
    near = round(exact)
    return near if abs(exact - near) <= 1e-6 + exact * 1e-15 else math.ceil(exact)


def _nano_near(usd: float) -> int:
    """Dollars to the nearest nano-dollar (never above :func:`_nano_up` of the same amount)."""
    return round(usd * NANO)


class Ledger:
    """Budget accounts for platform keys, with reservations, sub-keys and a hash-chained audit log.

    ``path=None`` keeps everything in memory; a path opens (or creates) a WAL-mode SQLite file that
    other processes may open at the same time. One instance is safe to share between threads.

    >>> ledger = Ledger()
    >>> ledger.open_account("run-1", 10.0)
    >>> hold = ledger.reserve("run-1", 2.5, audit={"tool": "train", "decision": "allowed"})
    >>> ledger.balance("run-1").available_usd
    7.5
    >>> ledger.settle(hold, 1.75, audit={"tool": "train", "decision": "allowed"})
    1.75
    >>> ledger.balance("run-1")
    Balance(budget_usd=10.0, spent_usd=1.75, reserved_usd=0.0, granted_usd=0.0, available_usd=8.25, closed=False)
    >>> [r.event["op"] for r in ledger.audit_records()]
    ['reserve', 'settle']
    >>> ledger.close()
    """

    path: str | None

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = None if path is None else os.fspath(path)
        if self.path is None:
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        else:
            # timeout= is SQLite's busy_timeout: a writer waits this long for another's BEGIN IMMEDIATE.
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
        self._conn = conn
        self._cur = conn.cursor()
        self._lock = threading.Lock()
        self._closed = False
        # Only an in-memory log has a single writer, so only there may the chain head live in Python,
        # only there are audit rows queued (chained at once, inserted in batches): a database that
        # lives in this process's memory is exactly as durable as the queue; and only there are
        # balances cached between writes (every write goes through this object and clears them).
        self._head: tuple[int, str] | None = None
        self._pending: list[_audit.Row] = []
        self._balances: dict[str, Balance] = {}
        with self._transaction():
            for statement in _SCHEMA:
                self._cur.execute(statement)
            if self.path is None:
                self._head = _audit.read_head(self._cur)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- accounts -------------------------------------------------------------------------------

    def open_account(self, key: str, budget_usd: float) -> None:
        """Create a top-level account for the opaque key id ``key``; a duplicate key is a ``ValueError``."""
        budget = _nano_near(_checked(budget_usd))
        with self._lock:
            self._balances.clear()
            try:
                self._cur.execute(_OPEN, (key, None, budget))
            except sqlite3.IntegrityError:
                raise ValueError(f"key {key!r} already has an account") from None

    def mint_subkey(self, parent: str, child: str, budget_usd: float, *, audit: dict[str, Any] | None = None) -> None:
        """Move ``budget_usd`` of ``parent``'s available balance into a new account ``child``.

        Raises :class:`InsufficientBudget` if it does not fit (logged when ``audit`` is given) and
        ``ValueError`` if ``child`` already exists.
        """
        nano = _nano_near(_checked(budget_usd))
        with self._transaction() as logged:
            cur = self._cur
            row = cur.execute(_GRANT, (nano, parent, nano)).fetchone()
            if row is None:
                err, entry = self._refuse(parent, nano, audit, {"request": "mint", "child": child})
                logged.append(entry)
            else:
                err = None
                try:
                    cur.execute(_OPEN, (child, parent, nano))
                except sqlite3.IntegrityError:
                    raise ValueError(f"key {child!r} already has an account") from None
                fields = {"op": "mint", "child": child, "granted_usd": nano / NANO, "available_usd": row[0] / NANO}
                logged.append(self._log(parent, audit, fields))
        if err is not None:
            raise err

    def close_subkey(self, child: str, *, audit: dict[str, Any] | None = None) -> float:
        """Close ``child`` and give its unspent remainder back to its parent; return the remainder.

        The parent's ``granted`` drops by the child's budget and its ``spent`` rises by the child's
        spend. ``ValueError`` if ``child`` is not an open sub-key or still has open reservations or
        sub-keys of its own; ``ActionError("key_closed")`` if it is already closed.
        """
        with self._transaction() as logged:
            cur = self._cur
            row = cur.execute(_SUBKEY, (child,)).fetchone()
            if row is None:
                raise ActionError("unknown_key", f"no account for key {child!r}")
            parent, budget, spent, granted, closed = row
            if parent is None:
                raise ValueError(f"key {child!r} is not a sub-key")
            if closed:
                raise ActionError("key_closed", f"key {child!r} is already closed")
            if granted:
                raise ValueError(f"sub-key {child!r} still has open sub-keys of its own")
            if cur.execute(_HAS_RESERVATIONS, (child,)).fetchone() is not None:
                raise ValueError(f"sub-key {child!r} still has open reservations")
            cur.execute(_CLOSE, (child,))
            (available,) = cur.execute(_RETURN_GRANT, (budget, spent, parent)).fetchone()
            fields = {"op": "close", "child": child, "charged_usd": spent / NANO,
                      "remainder_usd": (budget - spent) / NANO, "available_usd": available / NANO}
            logged.append(self._log(parent, audit, fields))
        return (budget - spent) / NANO

    # --- reservations ---------------------------------------------------------------------------

    def reserve(self, key: str, usd: float, *, audit: dict[str, Any] | None = None) -> Reservation:
        """Hold ``usd`` (rounded up to the nano-dollar) on ``key`` until it is settled or released.

        Raises :class:`InsufficientBudget` if it does not fit, ``ActionError("unknown_key")`` or
        ``ActionError("key_closed")``; with ``audit`` given, the refusal is logged all the same.
        """
        nano = _nano_up(_checked(usd))
        with self._transaction() as logged:
            cur = self._cur
            row = cur.execute(_RESERVE, (nano, key, nano)).fetchone()
            if row is None:
                err, entry = self._refuse(key, nano, audit, {"request": "reserve"})
                logged.append(entry)
            else:
                err = None
                cur.execute(_INSERT_RESERVATION, (key, nano))
                rid = cur.lastrowid
                fields = {"op": "reserve", "reservation": rid, "reserved_usd": nano / NANO,
                          "available_usd": row[0] / NANO}
                logged.append(self._log(key, audit, fields))
        if err is not None:
            raise err
        return Reservation(rid, key, nano / NANO)

    def settle(self, res: Reservation, usd: float, *, audit: dict[str, Any] | None = None) -> float:
        """Charge the actual cost (nearest nano-dollar, at most the reservation), release the rest.

        Returns the dollars charged. An overrun is clamped to the reservation and noted as
        ``overrun_usd`` in the audit event. ``ValueError`` if ``res`` is not open.
        """
        return self._finish(res, _nano_near(_checked(usd)), "settle", audit)

    def release(self, res: Reservation, *, audit: dict[str, Any] | None = None) -> None:
        """Drop a reservation without charging anything. ``ValueError`` if ``res`` is not open."""
        self._finish(res, 0, "release", audit)

    def record(self, audit: dict[str, Any]) -> None:
        """Append an audit-only record (a free call, or one refused before it reached the ledger).

        ``audit.get("key")`` names the key it belongs to; if that key has an account, its current
        ``available_usd`` is added.
        """
        key = audit.get("key")
        if self._head is not None:  # in memory: one writer, so a single read needs no transaction
            with self._lock:
                self._advance(self._log(key, audit, self._state_fields(key)))
            return
        with self._transaction() as logged:
            logged.append(self._log(key, audit, self._state_fields(key)))

    def _state_fields(self, key: str | None) -> dict[str, Any]:
        fields: dict[str, Any] = {"op": "record"}
        balance = None if key is None else self._read_balance(key)
        if balance is not None:
            fields["available_usd"] = balance.available_usd
        return fields

    # --- reading ----------------------------------------------------------------------------------

    def balance(self, key: str) -> Balance:
        """The account of ``key``; ``ActionError("unknown_key")`` if there is none."""
        with self._lock:
            balance = self._read_balance(key)
        if balance is None:
            raise ActionError("unknown_key", f"no account for key {key!r}")
        return balance

    def _read_balance(self, key: str) -> Balance | None:
        """The account of ``key`` or ``None`` (lock held). In memory it is cached until the next write."""
        balance = self._balances.get(key)
        if balance is not None:
            return balance
        row = self._cur.execute(_BALANCE, (key,)).fetchone()
        if row is None:
            return None
        budget, spent, reserved, granted, closed = row
        available = 0 if closed else budget - spent - reserved - granted
        balance = Balance(budget / NANO, spent / NANO, reserved / NANO, granted / NANO, available / NANO, bool(closed))
        if self._head is not None:
            self._balances[key] = balance
        return balance

    def audit_head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last audit record (``(0, GENESIS)`` if none): anchor it elsewhere to
        detect truncation of the log's tail."""
        with self._lock:
            return self._head if self._head is not None else _audit.read_head(self._cur)

    def audit_records(self) -> list[AuditRecord]:
        """Every audit record, in order."""
        with self._lock:
            self._flush()
            return _audit.read_records(self._cur)

    def close(self) -> None:
        """Close the database connection (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._balances.clear()
                self._cur.close()
                self._conn.close()

    # --- internals (called with the lock held, inside a write transaction) -----------------------

    def _finish(self, res: Reservation, actual: int, op: str, audit: dict[str, Any] | None) -> float:
        """Close reservation ``res``, charging ``min(actual, reserved)`` nano-dollars; return dollars charged."""
        with self._transaction() as logged:
            cur = self._cur
            row = cur.execute(_TAKE_RESERVATION, (res.id, res.key)).fetchone()
            if row is None:
                raise ValueError(f"reservation {res.id} on key {res.key!r} is not open (settled or released)")
            reserved = row[0]
            charged = min(actual, reserved)
            (available,) = cur.execute(_CHARGE, (reserved, charged, res.key)).fetchone()
            if audit is not None:
                fields = {"op": op, "reservation": res.id, "reserved_usd": reserved / NANO,
                          "charged_usd": charged / NANO, "available_usd": available / NANO}
                if actual > reserved:
                    fields["overrun_usd"] = (actual - reserved) / NANO
                logged.append(self._log(res.key, audit, fields))
        return charged / NANO

    def _refuse(
        self, key: str, nano: int, audit: dict[str, Any] | None, fields: dict[str, Any]
    ) -> tuple[ActionError, tuple[int, str] | None]:
        """Explain why a guarded update on ``key`` matched nothing; log the refusal if ``audit`` is given."""
        row = self._cur.execute(_STATE, (key,)).fetchone()
        if row is None:
            err = ActionError("unknown_key", f"no account for key {key!r}")
        elif row[1]:
            err = ActionError("key_closed", f"key {key!r} is closed")
        else:
            err = InsufficientBudget(
                f"{fields['request']} needs ${nano / NANO:.4f} but only ${row[0] / NANO:.4f} "
                "is available on this key", requested_usd=nano / NANO, available_usd=row[0] / NANO
            )
        fields = {**fields, "op": "refuse", "decision": "refused", "code": err.code, "message": err.message,
                  "requested_usd": nano / NANO}
        if row is not None:
            fields["available_usd"] = 0.0 if row[1] else row[0] / NANO
        return err, self._log(key, audit, fields)

    def _log(self, key: str | None, audit: dict[str, Any] | None, fields: dict[str, Any]) -> _Logged:
        """Chain the caller's ``audit`` dict plus the ledger's ``fields``: a file ledger inserts the row in
        the current transaction; an in-memory one returns it for :meth:`_advance` to queue after commit."""
        if audit is None:
            return None
        event = {**audit, **fields, "key": key, "wall_time": round(time.time(), 3)}
        if self._head is None:
            return _audit.append(self._cur, key, event), None
        row = _audit.chain_row(key, event, self._head)
        return (row[0], row[4]), row

    def _advance(self, logged: _Logged) -> None:
        """After a commit: move the cached chain head and queue the row (in-memory ledgers only)."""
        if logged is None or self._head is None:
            return
        self._head, row = logged
        if row is not None:
            self._pending.append(row)
            if len(self._pending) >= PENDING_MAX:
                self._flush()

    def _flush(self) -> None:
        """Insert the queued audit rows (called with the lock held)."""
        if self._pending:
            self._cur.execute("BEGIN IMMEDIATE")
            try:
                _audit.insert_rows(self._cur, self._pending)
                self._cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            self._pending.clear()

    @contextmanager
    def _transaction(self) -> Iterator[list[_Logged]]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` under the lock, rolled back on any exception. Audit entries
        appended to the yielded list are advanced (head moved, row queued) only after the commit."""
        with self._lock:
            self._cur.execute("BEGIN IMMEDIATE")
            logged: list[_Logged] = []
            try:
                yield logged
                self._cur.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
            finally:
                self._balances.clear()
            for entry in logged:
                self._advance(entry)

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            self._cur.execute("ROLLBACK")
