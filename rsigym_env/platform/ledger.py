"""SQLite budget ledger: each platform key's budget, spend, open reservations and sub-key grants.

Money is stored as integer nano-dollars; the API speaks float dollars. A call reserves its worst case
(rounded *up* to the next nano-dollar) before it runs and settles its actual cost (rounded to the
nearest nano-dollar and clamped to the reservation) afterwards, so a reservation always covers its
charge. Every change and its audit record (see :mod:`.audit`) are one ``BEGIN IMMEDIATE`` transaction,
so concurrent writers - threads sharing a :class:`Ledger`, or processes each opening the same file -
serialize, and an exception in the middle of a call leaves nothing behind. (An in-memory ledger has
one writer, this object: its reserve, settle, release and progress apply the same guards to a Python
copy of the rows under its lock and reach the tables, with their audit rows, in one transaction before
anything reads or writes them otherwise - the ``CHECK`` constraints then check them again.)

Invariants, checked by the ``WHERE`` guards and again by ``CHECK`` constraints on ``accounts``:
``spent >= 0``, ``reserved >= 0``, ``granted >= 0`` and ``spent + reserved + granted <= budget``;
:meth:`Ledger.books` checks the rest (``reserved`` is the sum of the open reservations, ``granted``
the sum of the open sub-keys' budgets), ``rsigym ledger show`` prints it.

**Crashes.** Each reservation records its owner (pid, the process's start time, the machine's boot
id, hostname, pid namespace), when it was made, a label (the tool) and the work done so far
(:meth:`Ledger.progress`). A reservation whose owner is gone - the pid is dead, a zombie or reused
by a younger process, or the machine has rebooted since - is settled for the work recorded and the
rest released when a file ledger is next opened, or by :meth:`Ledger.recover`; each such settlement
is audited (``op: "recover"``, ``reason: "owner_gone"``). Owners on other hosts (or in another pid
namespace, whose processes this one cannot see) are left alone and reported.

**fork.** A connection is never shared across ``fork()``. The protection tracks the connections, not
the ledgers: every connection to a file is registered when it opens and leaves when it closes, because a
``Ledger`` dropped without ``close()`` is freed at once while its connection lives on in a reference
cycle until the garbage collector runs. Before a fork every ledger's lock is taken (so no transaction is
half done). In the child every registered connection is the parent's: an idle one - its ledger's lock
was held by the fork, or its ledger is gone and no transaction is open - is closed at once, before the
child opens one of its own. That drops only the child's copy (the parent's locks on the file stay), and
it must be done: SQLite keeps one lock state per file and process, so with the parent's connection kept
open the child's own would take no file locks and the parent, closing its last connection, would
checkpoint and delete the WAL under them. A connection whose state is not known (its ledger's lock was
busy past ``FORK_WAIT_S``) is never used or closed, only kept referenced forever; and a connection
opened by another process is never closed or finalised here (``close()`` and the garbage collector keep
it). The child's ledgers open fresh connections at their first call. A fork that skipped Python's
at-fork handlers (libc's ``fork()`` called directly) is noticed by the pid at the child's first call,
which does the same, a ledger whose lock is free counting as idle. An in-memory ledger in a child is
the child's private copy: spending there never reaches the parent.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Iterable, Iterator, Optional

from ..errors import ActionError, InsufficientBudget
from ..owners import Owner, OwnerStatus, current_owner, owner_status
from . import audit as _audit
from .audit import AuditRecord

NANO = 1_000_000_000
"""Nano-dollars per dollar."""

MAX_USD = 1e9
"""Largest single amount accepted, so sums stay far inside SQLite's 64-bit integers."""

BUSY_TIMEOUT_S = 30.0

PENDING_MAX = 512
"""An in-memory ledger inserts its queued audit rows once this many are waiting (or when read)."""

FORK_WAIT_S = BUSY_TIMEOUT_S + 5.0
"""How long ``fork()`` waits for a ledger's lock (a transaction in another thread) before going ahead."""

LABEL_MAX = 64
"""A reservation's label (the tool) is cut to this many characters."""

log = logging.getLogger(__name__)

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

_RESERVATION_COLUMNS = (  # added to ``reservations`` by ALTER TABLE when a file is older than them
    ("label", "TEXT"),
    ("created", "REAL"),
    ("used", "INTEGER NOT NULL DEFAULT 0 CHECK (used >= 0 AND used <= nano)"),
    ("owner_pid", "INTEGER"),
    ("owner_start", "INTEGER"),
    ("owner_boot", "TEXT"),
    ("owner_host", "TEXT"),
    ("owner_pidns", "TEXT"),
)

_AVAILABLE = "budget - spent - reserved - granted"
_FITS = "WHERE key = ? AND closed = 0 AND spent + reserved + granted + ? <= budget"
_RESERVE = f"UPDATE accounts SET reserved = reserved + ? {_FITS} RETURNING {_AVAILABLE}"
_GRANT = f"UPDATE accounts SET granted = granted + ? {_FITS} RETURNING {_AVAILABLE}"
_INSERT_RESERVATION = (
    "INSERT INTO reservations (key, nano, label, created, owner_pid, owner_start, owner_boot, owner_host, owner_pidns)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_HOLD = (  # an in-memory ledger's reservation, written at a flush with the id it was given
    "INSERT INTO reservations (id, key, nano, label, created, used, owner_pid, owner_start, owner_boot, owner_host,"
    " owner_pidns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_TAKE_RESERVATION = "DELETE FROM reservations WHERE id = ? AND key = ? RETURNING nano, used"
_PROGRESS = "UPDATE reservations SET used = max(used, min(nano, ?)) WHERE id = ? AND key = ? RETURNING used"
_ACCOUNTS = "SELECT key, parent, budget, spent, reserved, granted, closed FROM accounts ORDER BY key"
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
_CARVE = "UPDATE reservations SET nano = nano - ? WHERE id = ? AND key = ? AND nano - used >= ? RETURNING nano"
_HOLD = "SELECT nano, used FROM reservations WHERE id = ? AND key = ?"
_OPEN_SPENT = "INSERT INTO accounts (key, parent, budget, spent) VALUES (?, ?, ?, ?)"
_LAST_RID = ("SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'reservations'), 0),"
             " coalesce((SELECT max(id) FROM reservations), 0))")
_SET_RID = "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'reservations'"
_CARVE_ACCOUNT = (
    f"UPDATE accounts SET reserved = reserved - ?, granted = granted + ? WHERE key = ? AND closed = 0 RETURNING {_AVAILABLE}"
)
_REFILL = "UPDATE reservations SET nano = nano + ?, used = used + ? WHERE id = ? AND key = ? RETURNING nano, used"
_REFILL_ACCOUNT = f"UPDATE accounts SET reserved = reserved + ?, granted = granted - ? WHERE key = ? RETURNING {_AVAILABLE}"


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





@dataclass(frozen=True)
class OpenReservation:
    """A reservation that is neither settled nor released, as :meth:`Ledger.open_reservations` lists it.

    ``status`` is :func:`owner_status` of ``owner`` when it was listed; ``created`` is a Unix time.
    """

    id: int
    key: str
    usd: float
    used_usd: float
    label: str | None
    created: float | None
    owner: Owner | None
    status: OwnerStatus

    @property
    def reservation(self) -> Reservation:
        return Reservation(self.id, self.key, self.usd)


@dataclass(frozen=True)
class Recovered:
    """One reservation settled by :meth:`Ledger.recover`: ``charged_usd`` (its recorded work) was
    spent and ``released_usd`` given back."""

    reservation: OpenReservation
    charged_usd: float
    released_usd: float
    reason: str


@dataclass(frozen=True)
class Recovery:
    """What :meth:`Ledger.recover` did: ``settled`` reservations of owners that are gone, and ``left``
    ones whose owner it cannot judge (another host or pid namespace, or none recorded)."""

    settled: tuple[Recovered, ...] = ()
    left: tuple[OpenReservation, ...] = ()


@dataclass(frozen=True)
class Account:
    """One account as :meth:`Ledger.accounts` lists it."""

    key: str
    parent: str | None
    balance: Balance


@dataclass(frozen=True)
class BookLine:
    """One account checked against the rows that should add up to it (dollars)."""

    key: str
    parent: str | None
    closed: bool
    budget_usd: float
    spent_usd: float
    reserved_usd: float
    granted_usd: float
    available_usd: float
    reservations_usd: float
    """The sum of the account's open reservations; equals ``reserved_usd`` when the books balance."""
    subkeys_usd: float
    """The sum of the budgets of the account's open sub-keys; equals ``granted_usd`` when the books balance."""
    balances: bool
    """``spent + reserved + granted + available == budget`` with nothing negative (a closed account: the
    remainder went back to its parent, so ``spent + available`` may be less, but nothing is held)."""
    reservations_match: bool
    subkeys_match: bool
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Books:
    """:meth:`Ledger.books`: every account's line and every problem found (none when ``ok``)."""

    lines: tuple[BookLine, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


# --- owners (rsigym_env.owners) ---------------------------------------------------------------------



def _owner_of(row: tuple[Any, ...]) -> Owner | None:
    pid, start, boot, host, pidns = row
    return None if pid is None or host is None else Owner(pid, start, boot, host, pidns)


def _owner_fields(owner: Owner | None) -> dict[str, Any] | None:
    if owner is None:
        return None
    return {"pid": owner.pid, "start": owner.start, "boot_id": owner.boot_id, "host": owner.host,
            "pid_ns": owner.pid_ns}


def _label(label: Any, audit: dict[str, Any] | None) -> str | None:
    if label is None and audit is not None:
        label = audit.get("tool")
    return str.__getitem__(label, slice(None, LABEL_MAX)) if isinstance(label, str) else None


# --- fork -------------------------------------------------------------------------------------------


_CONNECTIONS: "weakref.WeakSet[_Connection]" = weakref.WeakSet()
"""Every connection to a ledger file this process opened (or inherited) and has not closed."""


class _Connection(sqlite3.Connection):
    """A connection to a ledger file, in :data:`_CONNECTIONS` while it is open. Only the process that
    opened it closes or finalises it: in another (a forked child) ``close()`` keeps it open for good
    (:func:`_abandon`) and so does the garbage collector, leaving it registered for the child to disown."""

    _pid: int | None = None  # the process that opened it (None until registered)
    # bound here, not looked up as module globals: __del__ may run at interpreter exit
    _getpid = staticmethod(os.getpid)
    _incref = staticmethod(ctypes.pythonapi.Py_IncRef)
    _py_object = staticmethod(ctypes.py_object)
    _registry = _CONNECTIONS
    _kept: "list[_Connection]" = []

    def close(self) -> None:
        if self._pid not in (None, os.getpid()):
            _abandon(self)
            return
        _CONNECTIONS.discard(self)
        super().close()

    def __del__(self) -> None:
        if self._pid not in (None, self._getpid()):  # resurrected: never finalised by a child
            self._kept.append(self)
            self._incref(self._py_object(self))
            self._registry.add(self)  # the collector may have dropped it (a fork that skipped the handlers)
            return
        finalize = getattr(super(), "__del__", None)  # sqlite3.Connection has one from Python 3.12 on
        if finalize is not None:
            finalize()


_LEDGERS: "weakref.WeakSet[Ledger]" = weakref.WeakSet()
_FORK_HELD: list["Ledger"] = []  # ledgers whose lock the fork in progress holds
_FORK_SERIAL = threading.Lock()  # one fork at a time takes the ledgers' locks
_ABANDONED: list[Any] = []
_PID = os.getpid()  # the process the registry belongs to


def _before_fork() -> None:
    _FORK_SERIAL.acquire()
    for ledger in sorted(_LEDGERS, key=id):
        if not ledger._closed and ledger._lock.acquire(timeout=FORK_WAIT_S):
            _FORK_HELD.append(ledger)


def _after_fork_in_parent() -> None:
    while _FORK_HELD:
        _FORK_HELD.pop()._lock.release()
    _FORK_SERIAL.release()


def _after_fork_in_child() -> None:
    held = {id(ledger) for ledger in _FORK_HELD}
    _FORK_HELD.clear()
    _disown_all(lambda ledger: id(ledger) in held)


def _after_unannounced_fork() -> None:
    """The first call in a child whose fork skipped the at-fork handlers: what they would have done,
    a ledger whose lock is free counting as idle (no statement of it was running)."""
    if _PID != os.getpid():
        _disown_all(lambda ledger: ledger._lock.acquire(blocking=False))


def _disown_all(idle: Callable[["Ledger"], bool]) -> None:
    """In a child, before it opens a connection of its own: disown every connection of the parent,
    each live ledger's (idle if ``idle(ledger)``), then those of ledgers that are gone."""
    global _PID, _FORK_SERIAL
    _PID = os.getpid()
    _FORK_SERIAL = threading.Lock()
    for ledger in list(_LEDGERS):
        if ledger._pid != _PID:
            ledger._forked(idle=idle(ledger))
    for conn in list(_CONNECTIONS):  # its ledger was dropped without close(): nothing is running on it
        try:
            quiet = not conn.in_transaction
        except sqlite3.Error:
            quiet = False
        _disown(conn, idle=quiet)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


def _disown(conn: Any, *cursors: Any, idle: bool) -> None:
    """A parent's connection in a child: closed now if ``idle`` (only the child's copy: the parent's
    file locks stay), else kept open for good; either way it leaves the registry."""
    _CONNECTIONS.discard(conn)
    if idle:
        try:
            for cur in cursors:
                cur.close()
            conn._pid = os.getpid()  # adopted, to be closed here
            conn.close()
            return
        except Exception:
            pass
    _abandon(conn, *cursors)


def _abandon(*objects: Any) -> None:
    """Keep SQLite objects inherited in a state we cannot know alive for good: never used, closed or
    finalised (not even at interpreter exit, which would close the connection)."""
    for obj in objects:
        if isinstance(obj, _Connection):
            _CONNECTIONS.discard(obj)
        _ABANDONED.append(obj)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


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


class _Hold:
    """An open reservation in an in-memory ledger's mirror; ``row`` is its table row while it is not
    in the table yet (made since the last flush), else ``None``."""

    __slots__ = ("key", "nano", "used", "row", "progressed")

    def __init__(self, key: str, nano: int, used: int, row: tuple[Any, ...] | None) -> None:
        self.key, self.nano, self.used, self.row, self.progressed = key, nano, used, row, False


class Ledger:
    """Budget accounts for platform keys, with reservations, sub-keys and a hash-chained audit log.

    ``path=None`` keeps everything in memory; a path opens (or creates) a WAL-mode SQLite file that
    other processes may open at the same time, migrating an older file's tables, and settles the
    reservations of owners that are gone (:attr:`recovery`; ``recover=False`` skips it).
    ``readonly=True`` opens an existing file for reading only (no migration, no recovery). One
    instance is safe to share between threads, and across ``fork()`` (see the module docstring).

    >>> ledger = Ledger()
    >>> ledger.open_account("run-1", 10.0)
    >>> hold = ledger.reserve("run-1", 2.5, audit={"tool": "train", "decision": "allowed"})
    >>> ledger.balance("run-1").available_usd
    7.5
    >>> ledger.progress(hold, 0.5)  # should this process die now, recovery charges $0.50
    0.5
    >>> ledger.settle(hold, 1.75, audit={"tool": "train", "decision": "allowed"})
    1.75
    >>> ledger.balance("run-1")
    Balance(budget_usd=10.0, spent_usd=1.75, reserved_usd=0.0, granted_usd=0.0, available_usd=8.25, closed=False)
    >>> [r.event["op"] for r in ledger.audit_records()]
    ['reserve', 'settle']
    >>> ledger.books().ok
    True
    >>> ledger.close()
    """

    path: str | None
    readonly: bool
    recovery: Recovery
    """What opening the file settled (:meth:`recover`); empty for an in-memory or read-only ledger."""

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, readonly: bool = False, recover: bool = True
    ) -> None:
        self.path = None if path is None else os.fspath(path)
        self.readonly = readonly
        if readonly and self.path is None:
            raise ValueError("a read-only ledger needs a path")
        if readonly and not os.path.isfile(self.path):
            raise FileNotFoundError(f"no ledger file at {self.path}")
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        self._cur: sqlite3.Cursor | None = None
        # Only an in-memory log has a single writer, so only there may the chain head live in Python,
        # only there are audit rows queued (chained at once, inserted in batches): a database that
        # lives in this process's memory is exactly as durable as the queue; and only there are
        # balances cached between writes (every write goes through this object and clears them).
        self._head: tuple[int, str] | None = None
        self._pending: list[_audit.Row] = []
        self._balances: dict[str, Balance] = {}
        # In memory, reserve / settle / release / progress also run on a Python mirror of the rows they
        # touch (the same guards, in the same order), and their writes reach the tables with the queued
        # audit rows (:meth:`_flush`) - before any other write transaction and before anything reads the
        # tables. Between flushes the mirror is the truth; afterwards it equals the tables.
        self._accts: dict[str, list[int]] = {}  # key -> [budget, spent, reserved, granted, closed]
        self._holds: dict[int, _Hold] = {}
        self._dirty: set[str] = set()  # accounts changed since the last flush
        self._dropped: set[int] = set()  # reservations in the table closed since the last flush
        self._next_rid: int | None = None  # the last reservation id handed out (AUTOINCREMENT's)
        self._rid_flushed = 0
        self.recovery = Recovery()
        if self.path is not None:
            _after_unannounced_fork()  # the parent's connections go before this process opens its own
        with _FORK_SERIAL:  # not while a fork walks the set
            _LEDGERS.add(self)
        try:
            with self._lock:  # a fork waits until the new connection is set up
                self._connect(create=True)
            self._prepare()
        except BaseException:
            self.close()
            raise
        if self.path is not None and recover and not readonly:
                self.recovery = self.recover()
                for done in self.recovery.settled:
                    r = done.reservation
                    log.warning("ledger %s: reservation %d on %s (%s) of a process that is gone: charged $%.4f "
                                "of $%.4f, released $%.4f", self.path, r.id, r.key, r.label, done.charged_usd,
                                r.usd, done.released_usd)

    def _prepare(self) -> None:
        """Check a read-only file is a ledger; otherwise create or migrate the tables."""
        if self.readonly:
            self._columns = self._reservation_columns()
            if not {"accounts", "reservations"} <= self._tables():
                raise ValueError(f"{self.path} is not a ledger file (no accounts and reservations tables)")
            return
        with self._transaction():
            for statement in _SCHEMA:
                self._cur.execute(statement)
            have = self._reservation_columns()
            for name, decl in _RESERVATION_COLUMNS:
                if name not in have:  # a file written before these columns existed
                    self._cur.execute(f"ALTER TABLE reservations ADD COLUMN {name} {decl}")
            if self.path is None:
                self._head = _audit.read_head(self._cur)
        self._columns = {name for name, _ in _RESERVATION_COLUMNS}

    def _connect(self, *, create: bool) -> None:
        """Open this process's connection (``create=False``: the file must still exist), lock held."""
        if self.path is None:
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        else:
            mode = "ro" if self.readonly else ("rwc" if create else "rw")
            uri = f"file:{urllib.parse.quote(os.path.abspath(self.path))}?mode={mode}"
            # timeout= is SQLite's busy_timeout: a writer waits this long for another's BEGIN IMMEDIATE.
            conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False, factory=_Connection)
            conn._pid = os.getpid()
            _CONNECTIONS.add(conn)
            try:
                if not self.readonly:
                    conn.execute("PRAGMA journal_mode = WAL")
                    conn.execute("PRAGMA synchronous = NORMAL")
            except BaseException:
                conn.close()
                raise
        self._conn, self._cur = conn, conn.cursor()

    def _forked(self, *, idle: bool) -> None:
        """In a child process: a new lock, and never the parent's connection again (see the module doc).

        ``idle``: the fork held this ledger's lock, so no statement of the inherited connection was
        running and closing it cannot touch the file (it only drops the child's copy)."""
        self._lock = threading.Lock()
        self._pid = os.getpid()
        if self._closed or self._conn is None or self.path is None:
            return  # in memory: the child's private copy of the database, used as it is
        conn, cur = self._conn, self._cur
        self._conn = self._cur = None  # a fresh connection at the first call
        _disown(conn, cur, idle=idle)

    def _unannounced_fork(self) -> None:
        """This process is a child whose fork skipped the at-fork handlers (see the module doc)."""
        _after_unannounced_fork()
        if self._pid != os.getpid():  # made while another thread disowned the parent's ledgers
            self._forked(idle=False)

    def _live(self) -> None:
        """At the start of every call: adopt a fork that skipped the at-fork handlers, and reconnect
        after a fork. Costs one ``getpid`` when nothing happened."""
        if self._pid != os.getpid():
            self._unannounced_fork()
        if self._cur is None:
            with self._lock:
                if self._closed:
                    raise sqlite3.ProgrammingError("Cannot operate on a closed ledger.")
                if self._cur is None:
                    self._connect(create=False)

    def _tables(self) -> set[str]:
        return {r[0] for r in self._cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def _reservation_columns(self) -> set[str]:
        return {r[1] for r in self._cur.execute("PRAGMA table_info(reservations)")}

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
        self._live()
        with self._lock:
            self._writable()
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
                err, entry = self._refuse(parent, nano, audit, {"request": "mint", "child": child},
                                          cur.execute(_STATE, (parent,)).fetchone())
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

    @staticmethod
    def _closable_subkey(cur: sqlite3.Cursor, child: str) -> tuple[str, int, int]:
        """``child``'s parent, budget and spend (nano-dollars), if it is an open sub-key that can close
        now: no open reservations or sub-keys of its own. Raises otherwise (nothing changed)."""
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
        return parent, budget, spent

    def close_subkey(self, child: str, *, audit: dict[str, Any] | None = None) -> float:
        """Close ``child`` and give its unspent remainder back to its parent; return the remainder.

        The parent's ``granted`` drops by the child's budget and its ``spent`` rises by the child's
        spend. ``ValueError`` if ``child`` is not an open sub-key or still has open reservations or
        sub-keys of its own; ``ActionError("key_closed")`` if it is already closed.
        """
        with self._transaction() as logged:
            cur = self._cur
            parent, budget, spent = self._closable_subkey(cur, child)
            cur.execute(_CLOSE, (child,))
            (available,) = cur.execute(_RETURN_GRANT, (budget, spent, parent)).fetchone()
            fields = {"op": "close", "child": child, "charged_usd": spent / NANO,
                      "remainder_usd": (budget - spent) / NANO, "available_usd": available / NANO}
            logged.append(self._log(parent, audit, fields))
        return (budget - spent) / NANO

    def mint_subkey_from(
        self, reservation: Reservation, child: str, budget_usd: float, *, audit: dict[str, Any] | None = None
    ) -> None:
        """Carve a new sub-key ``child`` of ``budget_usd`` out of an open ``reservation`` of its parent.

        The hold shrinks by the budget and the parent's ``granted`` grows by it, so the parent's
        available balance does not move: work a call has reserved for runs under sub-keys of their
        own (the recursive world's inner episodes). Close it with :meth:`close_subkey_into`.
        :class:`InsufficientBudget` if the hold (less the work it has recorded) is smaller than the
        budget (logged when ``audit`` is given); ``ValueError`` if ``reservation`` is not open or
        ``child`` exists.

        >>> ledger = Ledger()
        >>> ledger.open_account("run", 10.0)
        >>> hold = ledger.reserve("run", 6.0)
        >>> ledger.mint_subkey_from(hold, "inner", 4.0)
        >>> ledger.balance("run").reserved_usd, ledger.balance("run").granted_usd, ledger.balance("inner").budget_usd
        (2.0, 4.0, 4.0)
        """
        nano = _nano_near(_checked(budget_usd))
        parent = reservation.key
        with self._transaction() as logged:
            cur = self._cur
            row = cur.execute(_CARVE, (nano, reservation.id, parent, nano)).fetchone()
            if row is None:
                held = cur.execute(_HOLD, (reservation.id, parent)).fetchone()
                if held is None:
                    raise ValueError(f"reservation {reservation.id} on key {parent!r} is not open (settled or released)")
                free = held[0] - held[1]
                err: ActionError | None = InsufficientBudget(
                    f"a sub-key of ${nano / NANO:.4f} does not fit reservation {reservation.id}, which holds "
                    f"${free / NANO:.4f} not yet used", requested_usd=nano / NANO, available_usd=free / NANO)
                logged.append(self._log(parent, audit, {
                    "op": "refuse", "decision": "refused", "code": err.code, "message": err.message,
                    "request": "mint", "child": child, "reservation": reservation.id, "requested_usd": nano / NANO}))
            else:
                err = None
                moved = cur.execute(_CARVE_ACCOUNT, (nano, nano, parent)).fetchone()
                if moved is None:
                    raise ActionError("key_closed", f"key {parent!r} is closed")
                try:
                    cur.execute(_OPEN, (child, parent, nano))
                except sqlite3.IntegrityError:
                    raise ValueError(f"key {child!r} already has an account") from None
                fields = {"op": "mint", "child": child, "granted_usd": nano / NANO, "reservation": reservation.id,
                          "reserved_usd": row[0] / NANO, "available_usd": moved[0] / NANO}
                logged.append(self._log(parent, audit, fields))
        if err is not None:
            raise err

    def close_subkey_into(self, child: str, reservation: Reservation, *, audit: dict[str, Any] | None = None) -> float:
        """Close a sub-key made by :meth:`mint_subkey_from`, returning its whole budget to ``reservation``.

        The child's spend is recorded as work done on the hold (:meth:`progress`), so the hold's
        settlement - or its recovery, should this process die - covers it; the parent's ``spent``
        rises when the hold is settled, not before. Returns the child's spend. The errors of
        :meth:`close_subkey`, and ``ValueError`` if ``reservation`` is not an open hold of the parent.

        >>> ledger = Ledger()
        >>> ledger.open_account("run", 10.0)
        >>> hold = ledger.reserve("run", 6.0)
        >>> ledger.mint_subkey_from(hold, "inner", 4.0)
        >>> ledger.settle(ledger.reserve("inner", 3.0), 1.25)
        1.25
        >>> ledger.close_subkey_into("inner", hold)
        1.25
        >>> ledger.settle(hold, 1.25), ledger.balance("run").spent_usd, ledger.books().ok
        (1.25, 1.25, True)
        """
        with self._transaction() as logged:
            cur = self._cur
            parent, budget, spent = self._closable_subkey(cur, child)
            back = cur.execute(_REFILL, (budget, spent, reservation.id, parent)).fetchone()
            if back is None:
                raise ValueError(f"reservation {reservation.id} is not an open hold of {child!r}'s parent {parent!r}")
            cur.execute(_CLOSE, (child,))
            (available,) = cur.execute(_REFILL_ACCOUNT, (budget, budget, parent)).fetchone()
            fields = {"op": "close", "child": child, "charged_usd": spent / NANO, "remainder_usd": (budget - spent) / NANO,
                      "reservation": reservation.id, "reserved_usd": back[0] / NANO, "progress_usd": back[1] / NANO,
                      "available_usd": available / NANO}
            logged.append(self._log(parent, audit, fields))
        return spent / NANO

    # --- reservations ---------------------------------------------------------------------------

    def reserve(
        self, key: str, usd: float, *, audit: dict[str, Any] | None = None, label: str | None = None
    ) -> Reservation:
        """Hold ``usd`` (rounded up to the nano-dollar) on ``key`` until it is settled or released.

        The hold records this process as its owner, the time and ``label`` (default: the audit's
        ``tool``), so that :meth:`recover` can settle it should the process die. Raises
        :class:`InsufficientBudget` if it does not fit, ``ActionError("unknown_key")`` or
        ``ActionError("key_closed")``; with ``audit`` given, the refusal is logged all the same.
        """
        nano = _nano_up(_checked(usd))
        owner = current_owner()
        if self._head is not None:
            return self._reserve_in_memory(key, nano, audit, label, owner)
        with self._transaction() as logged:
            cur = self._cur
            row = cur.execute(_RESERVE, (nano, key, nano)).fetchone()
            if row is None:
                err, entry = self._refuse(key, nano, audit, {"request": "reserve"}, cur.execute(_STATE, (key,)).fetchone())
                logged.append(entry)
            else:
                err = None
                cur.execute(_INSERT_RESERVATION, (key, nano, _label(label, audit), round(time.time(), 3), owner.pid,
                                                  owner.start, owner.boot_id, owner.host, owner.pid_ns))
                rid = cur.lastrowid
                fields = {"op": "reserve", "reservation": rid, "reserved_usd": nano / NANO,
                          "available_usd": row[0] / NANO}
                logged.append(self._log(key, audit, fields))
        if err is not None:
            raise err
        return Reservation(rid, key, nano / NANO)

    def _reserve_in_memory(
        self, key: str, nano: int, audit: dict[str, Any] | None, label: str | None, owner: Owner
    ) -> Reservation:
        """:meth:`reserve` on the mirror: ``_RESERVE``'s guard, then the row ``_INSERT_RESERVATION`` writes."""
        self._live()
        with self._lock:
            account = self._account(key)
            if account is None or account[4] or account[1] + account[2] + account[3] + nano > account[0]:
                state = None if account is None else (account[0] - account[1] - account[2] - account[3], account[4])
                err, entry = self._refuse(key, nano, audit, {"request": "reserve"}, state)
                self._advance(entry)
                raise err
            rid = self._last_rid() + 1
            available = account[0] - account[1] - account[2] - nano - account[3]
            row = (rid, key, nano, _label(label, audit), round(time.time(), 3), owner.pid, owner.start, owner.boot_id,
                   owner.host, owner.pid_ns)
            logged = self._log(key, audit, {"op": "reserve", "reservation": rid, "reserved_usd": nano / NANO,
                                            "available_usd": available / NANO})
            account[2] += nano
            self._next_rid = rid
            self._holds[rid] = _Hold(key, nano, 0, row)
            self._touched(key)
            self._advance(logged)
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

    def progress(self, res: Reservation, used_usd: float) -> float:
        """Record that ``used_usd`` of an open reservation's work is done; return the amount recorded.

        Should the owner die before it settles, :meth:`recover` charges this much and releases the
        rest. The amount is clamped to the reservation and never goes down (a smaller figure keeps the
        larger one). One ``UPDATE``, no audit record: the settle, release or recover record that ends
        the reservation carries the last figure (``progress_usd``). ``ValueError`` if ``res`` is not
        open or the amount is not a finite non-negative number.
        """
        used = _nano_near(_checked(used_usd))
        self._live()
        with self._lock:
            self._writable()
            if self._head is not None:
                hold = self._hold(res)
                if hold is not None:
                    hold.used = max(hold.used, min(hold.nano, used))
                    hold.progressed = True
                    return hold.used / NANO
                row = None
            else:
                row = self._cur.execute(_PROGRESS, (used, res.id, res.key)).fetchone()
        if row is None:
            raise ValueError(f"reservation {res.id} on key {res.key!r} is not open (settled or released)")
        return row[0] / NANO

    def open_reservations(self) -> list[OpenReservation]:
        """Every reservation not yet settled or released, oldest first, with its owner's status now."""
        self._live()
        cols = self._columns
        pick = ", ".join(c if c in cols else ("0" if c == "used" else "NULL") for c, _ in _RESERVATION_COLUMNS)
        with self._lock:
            self._flush()
            rows = self._cur.execute(f"SELECT id, key, nano, {pick} FROM reservations ORDER BY id").fetchall()
        out = []
        for rid, key, nano, label, created, used, *owner_row in rows:
            owner = _owner_of(tuple(owner_row))
            out.append(OpenReservation(rid, key, nano / NANO, used / NANO, label, created, owner, owner_status(owner)))
        return out

    def recover(self, *, unowned: bool = False) -> Recovery:
        """Settle every open reservation whose owner is gone for the work it recorded (:meth:`progress`)
        and release the rest; audit each (``op: "recover"``, ``decision: "allowed"``,
        ``reason: "owner_gone"``, ``charged_usd``).

        Reservations of live owners are not touched; those of owners on another host or in another
        pid namespace are left alone and listed in ``left``. ``unowned=True`` also settles the
        reservations that record no owner (made by a version of this package before owners were
        recorded; ``reason: "owner_unknown"``) - only when you know their process is gone.
        """
        settled: list[Recovered] = []
        left: list[OpenReservation] = []
        for res in self.open_reservations():
            if res.status == "gone" or (unowned and res.owner is None):
                done = self._recover_one(res, "owner_gone" if res.status == "gone" else "owner_unknown")
                if done is not None:
                    settled.append(done)
            elif res.status != "alive":
                left.append(res)
        return Recovery(tuple(settled), tuple(left))

    def _recover_one(self, res: OpenReservation, reason: str) -> Recovered | None:
        """Settle one reservation at its recorded work, in its own transaction; ``None`` if it was
        settled meanwhile or cannot be (its account's ``reserved`` does not cover it: see :meth:`books`)."""
        try:
            with self._transaction() as logged:
                cur = self._cur
                row = cur.execute(_TAKE_RESERVATION, (res.id, res.key)).fetchone()
                if row is None:
                    return None
                nano, used = row
                charged = min(used, nano)
                account = cur.execute(_CHARGE, (nano, charged, res.key)).fetchone()
                if account is None:
                    raise _Inconsistent
                fields = {"op": "recover", "reservation": res.id, "reserved_usd": nano / NANO,
                          "charged_usd": charged / NANO, "released_usd": (nano - charged) / NANO,
                          "available_usd": account[0] / NANO, "owner": _owner_fields(res.owner),
                          "reserved_at": res.created}
                audit = {"tool": res.label or "?", "decision": "allowed", "reason": reason}
                logged.append(self._log(res.key, audit, fields))
        except (_Inconsistent, sqlite3.IntegrityError):
            log.warning("ledger %s: reservation %d on %r cannot be recovered: its account does not hold it",
                        self.path, res.id, res.key)
            return None
        return Recovered(res, charged / NANO, (nano - charged) / NANO, reason)

    def record(self, audit: dict[str, Any]) -> None:
        """Append an audit-only record (a free call, or one refused before it reached the ledger).

        ``audit.get("key")`` names the key it belongs to; if that key has an account, its current
        ``available_usd`` is added.
        """
        key = audit.get("key")
        if key is not None and type(key) is not str:
            raise TypeError(f"an audit record's key is a str or None, not {type(key).__name__}")
        self._live()
        if self._head is not None:  # in memory: one writer, so a single read needs no transaction
            with self._lock:
                self._advance(self._log(key, audit, self._state_fields(key)))
            return
        with self._transaction() as logged:
            logged.append(self._log(key, audit, self._state_fields(key)))

    def open_settled(self, entries: Iterable[tuple[str, float, float, dict[str, Any]]]) -> None:
        """Open an account per entry ``(key, budget_usd, spend_usd, audit)`` with its whole spend charged, all in
        one transaction with one append to the audit chain: entry for entry what ``open_account(key, budget_usd)``
        then ``settle(reserve(key, spend_usd), spend_usd, audit=audit)`` (a spend above 0) or
        ``record({**audit, "key": key})`` (a spend of 0) give, in order: the same accounts, reservation ids
        and audit records (but ``wall_time``, read once). For runs written when they are over (the vector
        sim's finished episodes).

        Every entry is checked before anything is written: a key that is not a ``str`` is a ``TypeError``, a bad
        amount or a key that has an account (or repeats) a ``ValueError``, a spend whose reservation (rounded
        up, as :meth:`reserve` rounds it) exceeds its budget :class:`InsufficientBudget`; then nothing is written.

        >>> ledger = Ledger()
        >>> ledger.open_settled([("ep-1", 10.0, 2.5, {"tool": "episode", "decision": "allowed"}),
        ...                      ("ep-2", 10.0, 0.0, {"tool": "episode", "decision": "allowed"})])
        >>> ledger.balance("ep-1").spent_usd, [(r.key, r.event["op"]) for r in ledger.audit_records()]
        (2.5, [('ep-1', 'settle'), ('ep-2', 'record')])
        >>> ledger.books().ok
        True
        """
        accounts, charges = [], []
        for key, budget_usd, spend_usd, audit in entries:
            if type(key) is not str:
                raise TypeError(f"an account's key is a str, not {type(key).__name__}")
            budget = _nano_near(_checked(budget_usd))
            reserved = _nano_up(_checked(spend_usd)) if spend_usd else 0
            if reserved > budget:
                raise InsufficientBudget(f"reserve needs ${reserved / NANO:.4f} but only ${budget / NANO:.4f} is "
                                         f"available on key {key!r}", requested_usd=reserved / NANO,
                                         available_usd=budget / NANO)
            actual = _nano_near(spend_usd)
            charged = min(actual, reserved)
            accounts.append((key, None, budget, charged))
            charges.append((bool(spend_usd), reserved, charged, actual, audit))
        if len({a[0] for a in accounts}) < len(accounts):
            raise ValueError("a key repeats among the accounts to open")
        if not accounts:
            return
        wall_time = round(time.time(), 3)
        try:
            self._open_settled(accounts, charges, wall_time)
        except sqlite3.IntegrityError:  # rolled back: name the first key that has an account
            for key, *_ in accounts:
                try:
                    self.balance(key)
                except ActionError:
                    continue
                raise ValueError(f"key {key!r} already has an account") from None
            raise

    def _open_settled(self, accounts: list[tuple[str, None, int, int]],
                      charges: list[tuple[bool, int, int, int, dict[str, Any]]], wall_time: float) -> None:
        """:meth:`open_settled`'s transaction, its entries checked."""
        with self._transaction() as logged:
            cur = self._cur
            cur.executemany(_OPEN_SPENT, accounts)
            head = self._head if self._head is not None else _audit.read_head(cur)
            (rid,) = cur.execute(_LAST_RID).fetchone()  # in memory too: the transaction flushed the mirror
            rows = []
            for (key, _, budget, _), (spends, reserved, charged, actual, audit) in zip(accounts, charges):
                if spends:
                    rid += 1
                    fields = _finish_fields("settle", Reservation(rid, key, reserved / NANO), reserved, charged,
                                            budget - charged, actual, 0)
                else:
                    fields = {"op": "record", "available_usd": budget / NANO}
                row = _audit.chain_row(key, {**audit, **fields, "key": key, "wall_time": wall_time}, head)
                head = row[0], row[4]
                rows.append(row)
            _audit.insert_rows(cur, rows)
            if any(c[0] for c in charges):  # reservation ids were taken
                cur.execute(_SET_RID, (rid,))
                if cur.rowcount == 0:
                    cur.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('reservations', ?)", (rid,))
            logged.append((head, None))  # in memory: the cached head moves after the commit (rows are in)

    def _state_fields(self, key: str | None) -> dict[str, Any]:
        fields: dict[str, Any] = {"op": "record"}
        balance = None if key is None else self._read_balance(key)
        if balance is not None:
            fields["available_usd"] = balance.available_usd
        return fields

    # --- reading ----------------------------------------------------------------------------------

    def balance(self, key: str) -> Balance:
        """The account of ``key``; ``ActionError("unknown_key")`` if there is none."""
        self._live()
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
        if self._head is not None:
            account = self._account(key)
            if account is None:
                return None
            balance = self._balances[key] = _balance(*account)
            return balance
        row = self._cur.execute(_BALANCE, (key,)).fetchone()
        return None if row is None else _balance(*row)

    def audit_head(self) -> tuple[int, str]:
        """``(seq, hash)`` of the last audit record (``(0, GENESIS)`` if none): anchor it elsewhere to
        detect truncation of the log's tail."""
        self._live()
        with self._lock:
            return self._head if self._head is not None else _audit.read_head(self._cur)

    def audit_records(self) -> list[AuditRecord]:
        """Every audit record, in order."""
        self._live()
        with self._lock:
            self._flush()
            return _audit.read_records(self._cur)

    def accounts(self) -> list[Account]:
        """Every account, sorted by key."""
        self._live()
        with self._lock:
            self._flush()
            rows = self._cur.execute(_ACCOUNTS).fetchall()
        return [Account(key, parent, _balance(budget, spent, reserved, granted, closed))
                for key, parent, budget, spent, reserved, granted, closed in rows]

    def books(self) -> Books:
        """Check that the books balance, from one consistent snapshot, in exact nano-dollars.

        Per account: ``spent + reserved + granted + available == budget`` with nothing negative (an
        open account) or nothing held or granted (a closed one); ``reserved`` is the sum of its open
        reservations; ``granted`` the sum of its open sub-keys' budgets. Also: every reservation and
        parent names an account, and no reservation's recorded work exceeds it.
        """
        self._live()
        used = "used" if "used" in self._columns else "0"
        with self._lock:
            self._flush()
            self._cur.execute("BEGIN")
            try:
                accounts = self._cur.execute(_ACCOUNTS).fetchall()
                holds = self._cur.execute(f"SELECT id, key, nano, {used} FROM reservations ORDER BY id").fetchall()
            finally:
                self._rollback()
        return _check_books(accounts, holds)

    def close(self) -> None:
        """Close the database connection (idempotent). In a forked child it never closes the parent's."""
        if self._pid != os.getpid():
            self._unannounced_fork()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._balances.clear()
                if self._cur is not None:
                    self._cur.close()
                    self._conn.close()

    # --- internals (called with the lock held, inside a write transaction) -----------------------

    def _finish(self, res: Reservation, actual: int, op: str, audit: dict[str, Any] | None) -> float:
        """Close reservation ``res``, charging ``min(actual, reserved)`` nano-dollars; return dollars charged."""
        if self._head is not None:
            return self._finish_in_memory(res, actual, op, audit)
        with self._transaction() as logged:
            cur = self._cur
            row = cur.execute(_TAKE_RESERVATION, (res.id, res.key)).fetchone()
            if row is None:
                raise ValueError(f"reservation {res.id} on key {res.key!r} is not open (settled or released)")
            reserved, used = row
            charged = min(actual, reserved)
            (available,) = cur.execute(_CHARGE, (reserved, charged, res.key)).fetchone()
            if audit is not None:
                logged.append(self._log(res.key, audit, _finish_fields(op, res, reserved, charged, available, actual, used)))
        return charged / NANO

    def _finish_in_memory(self, res: Reservation, actual: int, op: str, audit: dict[str, Any] | None) -> float:
        """:meth:`_finish` on the mirror (``_TAKE_RESERVATION``, then ``_CHARGE``)."""
        self._live()
        with self._lock:
            hold = self._hold(res)
            if hold is None:
                raise ValueError(f"reservation {res.id} on key {res.key!r} is not open (settled or released)")
            account = self._account(res.key)
            if account is None:
                raise ValueError(f"reservation {res.id} is on {res.key!r}, which has no account")
            reserved, used = hold.nano, hold.used
            charged = min(actual, reserved)
            logged = None
            if audit is not None:
                available = account[0] - (account[1] + charged) - (account[2] - reserved) - account[3]
                logged = self._log(res.key, audit, _finish_fields(op, res, reserved, charged, available, actual, used))
            account[2] -= reserved
            account[1] += charged
            del self._holds[res.id]
            if hold.row is None:  # in the table: delete it there at the next flush
                self._dropped.add(res.id)
            self._touched(res.key)
            self._advance(logged)
        return charged / NANO

    # --- the in-memory mirror (lock held) ----------------------------------------------------------

    def _account(self, key: str) -> list[int] | None:
        """The mirror's row of ``key`` (read from the table the first time), ``None`` if it has no account."""
        account = self._accts.get(key)
        if account is None:
            row = self._cur.execute(_BALANCE, (key,)).fetchone()
            if row is None:
                return None
            account = self._accts[key] = list(row)
        return account

    def _hold(self, res: Reservation) -> _Hold | None:
        """The mirror's open reservation ``res`` (read from the table the first time), ``None`` if it is not open."""
        hold = self._holds.get(res.id)
        if hold is None:
            if res.id in self._dropped:  # closed, still in the table until the next flush
                return None
            row = self._cur.execute(_HOLD, (res.id, res.key)).fetchone()
            if row is None:
                return None
            hold = self._holds[res.id] = _Hold(res.key, row[0], row[1], None)
        return hold if hold.key == res.key else None

    def _last_rid(self) -> int:
        if self._next_rid is None:
            row = self._cur.execute("SELECT seq FROM sqlite_sequence WHERE name = 'reservations'").fetchone()
            self._next_rid = self._rid_flushed = row[0] if row else 0
        return self._next_rid

    def _touched(self, key: str) -> None:
        self._dirty.add(key)
        self._balances.pop(key, None)

    def _forget(self) -> None:
        """Drop the mirror (it has been flushed): a write transaction is about to change the tables."""
        self._accts.clear()
        self._holds.clear()
        self._balances.clear()
        self._next_rid = None

    def _refuse(
        self, key: str, nano: int, audit: dict[str, Any] | None, fields: dict[str, Any],
        row: tuple[int, int] | None,
    ) -> tuple[ActionError, tuple[int, str] | None]:
        """Explain why a guarded update on ``key`` matched nothing, from its ``(available, closed)`` state
        (``None``: no account); log the refusal if ``audit`` is given."""
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
        """Write what an in-memory ledger holds back - the mirror's changes and the queued audit rows - in
        one transaction (called with the lock held; nothing to do for a file ledger)."""
        new_rid = self._next_rid is not None and self._next_rid > self._rid_flushed
        if not (self._pending or self._dirty or self._dropped or new_rid
                or any(h.row is not None or h.progressed for h in self._holds.values())):
            return
        cur = self._cur
        cur.execute("BEGIN IMMEDIATE")
        try:
            if self._dropped:
                cur.executemany("DELETE FROM reservations WHERE id = ?", [(rid,) for rid in sorted(self._dropped)])
            holds = list(self._holds.values())
            new = [h.row[:5] + (h.used,) + h.row[5:] for h in holds if h.row is not None]
            if new:
                cur.executemany(_INSERT_HOLD, new)
            moved = [(h.used, rid) for rid, h in self._holds.items() if h.progressed and h.row is None]
            if moved:
                cur.executemany("UPDATE reservations SET used = ? WHERE id = ?", moved)
            if self._dirty:
                cur.executemany("UPDATE accounts SET spent = ?, reserved = ? WHERE key = ?",
                                [(self._accts[k][1], self._accts[k][2], k) for k in self._dirty])
            if new_rid:
                cur.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'reservations'", (self._next_rid,))
                if cur.rowcount == 0:
                    cur.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('reservations', ?)", (self._next_rid,))
            if self._pending:
                _audit.insert_rows(cur, self._pending)
            cur.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        self._pending.clear()
        self._dirty.clear()
        self._dropped.clear()
        for h in holds:
            h.row, h.progressed = None, False
        if self._next_rid is not None:
            self._rid_flushed = self._next_rid

    @contextmanager
    def _transaction(self) -> Iterator[list[_Logged]]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` under the lock, rolled back on any exception. Audit entries
        appended to the yielded list are advanced (head moved, row queued) only after the commit."""
        self._live()
        with self._lock:
            self._writable()
            if self._head is not None:  # in memory: the mirror's changes go first, then the tables are the truth
                self._flush()
                self._forget()
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

    def _writable(self) -> None:
        if self.readonly:
            raise ValueError(f"ledger {self.path} is open read-only")


class _Inconsistent(Exception):
    """A reservation whose account is missing (raised inside a transaction to roll it back)."""


def _balance(budget: int, spent: int, reserved: int, granted: int, closed: int) -> Balance:
    available = 0 if closed else budget - spent - reserved - granted
    return Balance(budget / NANO, spent / NANO, reserved / NANO, granted / NANO, available / NANO, bool(closed))


def _finish_fields(op: str, res: Reservation, reserved: int, charged: int, available: int, actual: int,
                   used: int) -> dict[str, Any]:
    """The audit fields of a settle or release (nano-dollar amounts in, dollars out)."""
    fields = {"op": op, "reservation": res.id, "reserved_usd": reserved / NANO, "charged_usd": charged / NANO,
              "available_usd": available / NANO}
    if actual > reserved:
        fields["overrun_usd"] = (actual - reserved) / NANO
    if used:
        fields["progress_usd"] = used / NANO
    return fields


def _usd(nano: int) -> str:
    return f"${nano / NANO:,.9f}"


def _check_books(accounts: list[tuple[Any, ...]], holds: list[tuple[int, str, int, int]]) -> Books:
    """The :meth:`Ledger.books` checks over rows of ``accounts`` and ``reservations`` (nano-dollars)."""
    held: dict[str, int] = {}
    problems: list[str] = []
    known = {row[0] for row in accounts}
    for rid, key, nano, used in holds:
        held[key] = held.get(key, 0) + nano
        if key not in known:
            problems.append(f"reservation {rid} is on {key!r}, which has no account")
        if not 0 <= used <= nano:
            problems.append(f"reservation {rid} on {key!r} records work {_usd(used)} outside 0..{_usd(nano)}")
    granted_to: dict[str, int] = {}
    for _key, parent, budget, _spent, _reserved, _granted, closed in accounts:
        if parent is not None and not closed:
            granted_to[parent] = granted_to.get(parent, 0) + budget
    lines = []
    for key, parent, budget, spent, reserved, granted, closed in accounts:
        own: list[str] = []
        available = 0 if closed else budget - spent - reserved - granted
        balances = min(budget, spent, reserved, granted) >= 0 and available >= 0
        if min(budget, spent, reserved, granted) < 0:
            own.append("a negative amount")
        if available < 0:
            own.append(f"spent + reserved + granted is {_usd(spent + reserved + granted)}, over its budget {_usd(budget)}")
        if closed and (reserved or granted or spent > budget):
            balances = False
            own.append(f"closed but holds {_usd(reserved)} reserved and {_usd(granted)} granted, or spent over budget")
        reservations_match = reserved == held.get(key, 0)
        if not reservations_match:
            own.append(f"reserved {_usd(reserved)} but its open reservations sum to {_usd(held.get(key, 0))}")
        subkeys_match = granted == granted_to.get(key, 0)
        if not subkeys_match:
            own.append(f"granted {_usd(granted)} but its open sub-keys' budgets sum to {_usd(granted_to.get(key, 0))}")
        if parent is not None and parent not in known:
            own.append(f"its parent {parent!r} has no account")
        problems.extend(f"{key}: {p}" for p in own)
        lines.append(BookLine(key, parent, bool(closed), budget / NANO, spent / NANO, reserved / NANO, granted / NANO,
                              max(available, 0) / NANO, held.get(key, 0) / NANO, granted_to.get(key, 0) / NANO,
                              balances, reservations_match, subkeys_match, tuple(own)))
    return Books(tuple(lines), tuple(problems))
