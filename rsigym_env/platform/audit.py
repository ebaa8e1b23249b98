"""Hash-chained audit log, kept in the ledger's SQLite database (table ``audit``).

Each record holds the canonical JSON of one event, the hash of the record before it and its own hash
``sha256(prev_hash + event_json)``; the first record links to 64 zeros. Changing, deleting or
re-linking a record breaks the chain there, and :func:`verify_audit` names the first such record.

>>> first = chain_hash(GENESIS, canonical_json({"op": "record", "seq": 1}))
>>> len(first), first == chain_hash(GENESIS, '{"op":"record","seq":1}')
(64, True)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import orjson

GENESIS = "0" * 64
"""The ``prev_hash`` of the first record."""

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS audit ("
    "seq INTEGER PRIMARY KEY, key TEXT, event TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL)"
)

_INSERT = "INSERT INTO audit (seq, key, event, prev_hash, hash) VALUES (?, ?, ?, ?, ?)"
_HEAD = "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1"
_ROWS = "SELECT seq, key, event, prev_hash, hash FROM audit ORDER BY seq"


@dataclass(frozen=True)
class AuditRecord:
    """One record of the log; ``event`` is the parsed JSON the hash covers."""

    seq: int
    key: str | None
    event: dict[str, Any]
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class AuditReport:
    """The outcome of :func:`verify_audit`; ``first_broken`` is the seq of the first bad record."""

    ok: bool
    records: int
    first_broken: int | None
    reason: str

    def __str__(self) -> str:
        if self.ok:
            return f"audit OK: {self.records} records, chain intact"
        if self.first_broken is None:
            return f"audit FAILED: {self.reason}"
        return f"audit BROKEN at record {self.first_broken}: {self.reason}"


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
# Every type orjson would write differently from the stdlib encoder (dataclasses, datetimes, subclasses
# of str/int/dict/list) is passed through to it, and with no ``default`` that raises ``TypeError``.
_ORJSON = (
    orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def canonical_json(event: dict[str, Any]) -> str:
    """The exact text an event is stored and hashed as: sorted keys, no spaces, ``str`` for other types.

    Written by orjson when the event is plain JSON (str keys; str, int, float, bool, None, list, tuple
    and dict values); otherwise by ``json.dumps(event, sort_keys=True, separators=(",", ":"),
    default=str)``, which also keeps ints beyond 64 bits, lone surrogates, non-string keys and NaN or
    ±Infinity (orjson would write null). Either way ``json.loads`` of the text gives the same values
    (one exception: orjson writes an ``Enum`` member as its value, the stdlib as ``str(member)``).
    :func:`verify_audit` hashes the stored text, so it does not matter which encoder wrote it.
    """
    try:
        text = orjson.dumps(event, option=_ORJSON)
    except TypeError:  # orjson.JSONEncodeError
        return _stdlib(event)
    if b"null" in text and _has_non_finite(event):
        return _stdlib(event)
    return text.decode()


def _stdlib(event: Any) -> str:
    try:
        return _ENCODER.encode(event)
    except TypeError:  # keys of mixed types cannot be sorted: sort them as the text they are written as
        return _ENCODER.encode(_str_keys(event))


def _str_keys(value: Any) -> Any:
    """``value`` with every dict key turned into the string JSON would write for it."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(k, default=str).strip('"'): _str_keys(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_str_keys(v) for v in value]
    return value


def _has_non_finite(value: Any) -> bool:
    """Whether a NaN or ±inf float is anywhere in ``value`` (lists, tuples and dict values)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return False
    return any(_has_non_finite(v) for v in value)


def chain_hash(prev_hash: str, event_json: str) -> str:
    """``sha256(prev_hash + event_json)`` as hex."""
    return hashlib.sha256((prev_hash + event_json).encode()).hexdigest()


def read_head(cur: sqlite3.Cursor) -> tuple[int, str]:
    """``(seq, hash)`` of the last record, ``(0, GENESIS)`` for an empty log."""
    row = cur.execute(_HEAD).fetchone()
    return (0, GENESIS) if row is None else (row[0], row[1])


Row = tuple[int, Optional[str], str, str, str]
"""An audit table row: ``(seq, key, event_json, prev_hash, hash)``."""


def chain_row(key: str | None, event: dict[str, Any], head: tuple[int, str]) -> Row:
    """The next row after ``head`` for ``event`` (setting its ``seq``), hash included."""
    seq, prev = head
    seq += 1
    event["seq"] = seq
    event_json = canonical_json(event)
    return seq, key, event_json, prev, chain_hash(prev, event_json)


def append(
    cur: sqlite3.Cursor, key: str | None, event: dict[str, Any], head: tuple[int, str] | None = None
) -> tuple[int, str]:
    """Append ``event`` (setting its ``seq``) inside the caller's write transaction; return the new head.

    ``head`` is the caller's cached ``(seq, hash)`` of the last record; ``None`` reads it from the table,
    which is required whenever another connection may append too.
    """
    row = chain_row(key, event, read_head(cur) if head is None else head)
    cur.execute(_INSERT, row)
    return row[0], row[4]


def insert_rows(cur: sqlite3.Cursor, rows: list[Row]) -> None:
    """Insert already-chained rows (an in-memory ledger's batch) in one statement."""
    cur.executemany(_INSERT, rows)


def read_records(cur: sqlite3.Cursor) -> list[AuditRecord]:
    """Every record in seq order."""
    return [AuditRecord(s, k, json.loads(e), p, h) for s, k, e, p, h in cur.execute(_ROWS).fetchall()]


def verify_audit(path: str | os.PathLike[str]) -> AuditReport:
    """Recompute the chain of the database at ``path`` (opened read-only) and name the first broken record.

    Never raises for a missing or foreign file: the report says what is wrong instead.
    """
    fspath = os.fspath(path)
    if not os.path.isfile(fspath):
        return AuditReport(False, 0, None, f"no database file at {fspath}")
    uri = f"file:{urllib.parse.quote(os.path.abspath(fspath))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        return AuditReport(False, 0, None, f"cannot open {fspath}: {exc}")
    try:
        has_table = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'audit'").fetchone()
        if has_table is None:
            return AuditReport(False, 0, None, f"no audit table in {fspath}")
        (count,) = conn.execute("SELECT count(*) FROM audit").fetchone()
        return _check_chain(conn.execute(_ROWS), count)
    except sqlite3.Error as exc:
        return AuditReport(False, 0, None, f"cannot read {fspath}: {exc}")
    finally:
        conn.close()


def _check_chain(rows: Iterable[tuple[int, str | None, str, str, str]], count: int) -> AuditReport:
    """Walk the rows in seq order; stop at the first record that is missing, re-linked or altered."""
    expected, prev = 1, GENESIS
    for seq, key, event_json, prev_hash, digest in rows:
        if seq != expected:
            return AuditReport(False, count, expected, f"record {expected} is missing (seq jumps to {seq})")
        if prev_hash != prev:
            return AuditReport(False, count, seq, f"link broken: prev_hash is not the hash of record {seq - 1}")
        if chain_hash(prev_hash, event_json) != digest:
            return AuditReport(False, count, seq, "hash does not match its content")
        try:
            event = json.loads(event_json)
        except ValueError:
            return AuditReport(False, count, seq, "event is not valid JSON")
        if not isinstance(event, dict) or event.get("seq") != seq or event.get("key") != key:
            return AuditReport(False, count, seq, "seq or key column does not match the hashed event")
        expected, prev = seq + 1, digest
    return AuditReport(True, count, None, "chain intact")
