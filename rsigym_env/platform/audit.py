"""Hash-chained audit log, kept in the ledger's SQLite database (table ``audit``).

Each record holds the canonical JSON of one event, the hash of the record before it and its own hash
``sha256(prev_hash + event_json)``; the first record links to 64 zeros. Changing, deleting or
re-linking a record breaks the chain there, and :func:`verify_audit` names the first such record.

What an event says: ``op`` (``reserve``, ``settle``, ``release``, ``refuse``, ``record``, ``mint``,
``close``, ``recover``), ``decision`` (``"allowed"`` or ``"refused"``, and it is true), ``tool`` and
``args`` (bounded by :func:`summarize`). Only a refusal carries ``code`` (the error code) and
``message``; a release or recovery says why in ``reason`` (``"cancelled"``, ``"job_failed"``,
``"start_failed"``, an exception's class name, ``"owner_gone"``).

>>> first = chain_hash(GENESIS, canonical_json({"op": "record", "seq": 1}))
>>> len(first), first == chain_hash(GENESIS, '{"op":"record","seq":1}')
(64, True)
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sqlite3
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import orjson

from ..canonical import canonical_dumps

GENESIS = "0" * 64
"""The ``prev_hash`` of the first record."""

AUDIT_TEXT_MAX = 256
"""Longer strings are audited as their length and hash (see :func:`short_text`)."""

AUDIT_MAX_DEPTH = 12
"""Containers nested deeper than this are audited as ``"<truncated: depth>"`` (see :func:`summarize`)."""

AUDIT_MAX_NODES = 512
"""At most this many values of one argument tree are audited; the rest is counted, not written."""

AUDIT_MAX_INT_BITS = 256
"""Larger integers are audited as ``"<int: N bits sha256:...>"``."""

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


_ENCODER = functools.partial(canonical_dumps, default=str)  # the stdlib fallback
# Every type orjson would write differently from the stdlib encoder (dataclasses, datetimes, subclasses
# of str/int/dict/list) is passed through to it, and with no ``default`` that raises ``TypeError``.
_ORJSON = (
    orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def canonical_json(event: dict[str, Any]) -> str:
    """The exact text an event is stored and hashed as: sorted keys, no spaces, ``str`` for other types.

    Written by orjson when the event is plain JSON (str keys; str, int, float, bool, None, list, tuple
    and dict values, at most :data:`ORJSON_MAX_DEPTH` deep); otherwise by ``json.dumps(event,
    sort_keys=True, separators=(",", ":"), default=str)``, which also keeps ints beyond 64 bits, lone
    surrogates, non-string keys and NaN or ±Infinity (orjson would write null). Either way
    ``json.loads`` of the text gives the same values. :func:`verify_audit` hashes the stored text, so
    it does not matter which encoder wrote it.

    It never raises (``Exception``) for any input: an event neither encoder can write (nested deeper
    than the recursion limit, self-referencing, an ``int`` too long to print, an object whose
    ``__str__`` raises, ...) is written as its :func:`summarize` form, keeping its ``seq`` and ``key``.

    >>> loop = {"a": 1}; loop["self"] = loop
    >>> canonical_json({"seq": 1, "key": None, "args": loop})
    '{"args":{"a":1,"self":"<truncated: cycle>"},"key":null,"seq":1}'
    """
    text = _encode(event)
    if text is None:
        safe = summarize(event)
        if isinstance(safe, dict) and isinstance(event, dict):
            for name in ("seq", "key"):  # verify_audit compares these with the row's columns
                value = event.get(name)
                if value is None or type(value) in (int, str):
                    safe[name] = value
        text = _encode(safe)
    return text if text is not None else '{"unencodable":true}'  # not reached: safe is plain JSON


ORJSON_MAX_DEPTH = 32
"""orjson is only given plain data at most this deep: orjson 3.13 overflows the C stack (the process
dies) on deeply nested tuples, or lists inside tuples, instead of raising (GHSA-hx9q-6w63-j58v)."""


def _orjson_safe(value: Any, depth: int) -> bool:
    """Whether ``value`` is exact str/int/float/bool/None/list/tuple/dict, nested at most
    :data:`ORJSON_MAX_DEPTH` deep, with no NaN or infinity (orjson writes those as null): what orjson
    writes exactly as the stdlib would. Everything else goes to the stdlib encoder."""
    t = type(value)
    if t is dict:
        children: Any = value.values()
    elif t is list or t is tuple:
        children = value
    elif t is float:
        return value - value == 0.0  # False for NaN and ±inf
    else:
        return t is str or t is int or value is None or t is bool
    if depth >= ORJSON_MAX_DEPTH:
        return False
    for v in children:
        t = type(v)
        if t is float:
            if v - v != 0.0:
                return False
        elif not (t is str or t is int or v is None or t is bool or _orjson_safe(v, depth + 1)):
            return False
    return True


def _encode(event: Any) -> str | None:
    """orjson's text, the stdlib's where orjson differs, or ``None`` if neither can write ``event``."""
    if not _orjson_safe(event, 0):
        return _stdlib(event)
    try:
        return orjson.dumps(event, option=_ORJSON).decode()
    except Exception:  # orjson.JSONEncodeError: non-str keys, ints beyond 64 bits, lone surrogates
        return _stdlib(event)


def _stdlib(event: Any) -> str | None:
    try:
        return _ENCODER(event)
    except TypeError:  # keys of mixed types cannot be sorted: sort them as the text they are written as
        try:
            return _ENCODER(_str_keys(event))
        except Exception:
            return None
    except Exception:  # RecursionError, circular reference, int too long to print, a raising __str__, ...
        return None


def _str_keys(value: Any) -> Any:
    """``value`` with every dict key turned into the string JSON would write for it."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(k, default=str).strip('"'): _str_keys(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_str_keys(v) for v in value]
    return value


def short_text(text: str, limit: int = AUDIT_TEXT_MAX) -> str:
    """``text`` itself, or ``<N chars sha256:...>`` when it is longer than ``limit`` (lone surrogates allowed).

    >>> short_text("abc"), short_text("x" * 300)
    ('abc', '<300 chars sha256:0d4e2ca9e9cbced7>')
    """
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"<{len(text)} chars sha256:{digest}>"


def summarize(
    value: Any, *, max_depth: int = AUDIT_MAX_DEPTH, max_nodes: int = AUDIT_MAX_NODES, max_text: int = AUDIT_TEXT_MAX
) -> Any:
    """A bounded, plain-JSON picture of ``value`` for the audit log; never raises (``Exception``).

    dicts (keys become strings), lists, tuples and sets are followed to ``max_depth`` levels and
    ``max_nodes`` values in all; strings longer than ``max_text`` become their length and hash (see
    :func:`short_text`), bytes likewise, ints beyond :data:`AUDIT_MAX_INT_BITS` their size and hash;
    floats (NaN and ±inf included), bools and None stay; anything else is ``str(value)``. What is
    left out is marked: ``"<truncated: depth>"``, ``"<truncated: cycle>"``, ``"<truncated: N more
    items>"`` (a dict gets the key ``"<truncated>"``), ``"<unprintable T>"``.

    >>> summarize({"a": [1, 2.5, None], 3: b"xy", "deep": [[[[1]]]]}, max_depth=3)
    {'a': [1, 2.5, None], '3': "b'xy'", 'deep': [['<truncated: depth>']]}
    >>> summarize(list(range(10**6)), max_nodes=3)
    [0, 1, '<truncated: 999998 more items>']
    """
    try:
        if _fits(value, 0, max_nodes - 1, max_depth, max_text) >= 0:
            return value  # already plain and within the bounds: its own summary (the common case)
        return _Summary(max_depth, max_nodes, max_text).walk(value, 0)
    except Exception as exc:  # e.g. a dict changed size while it was read
        return f"<unprintable {_type_name(value)}: {type(exc).__name__}>"


def _fits(v: Any, depth: int, left: int, max_depth: int, max_text: int) -> int:
    """The node budget left after ``v`` if it is plain JSON within the bounds (exact dict with str keys,
    list, tuple, str, int, float, bool, None), else -1. Reads, never copies: the cheap first look."""
    t = type(v)
    if t is dict or t is list or t is tuple:
        if depth >= max_depth:
            return -1
        is_dict = t is dict
        for x in v.items() if is_dict else v:
            left -= 1
            if left < 0:
                return -1
            if is_dict:
                k, x = x
                if type(k) is not str or len(k) > max_text:
                    return -1
            tx = type(x)
            if tx is str:
                if len(x) > max_text:
                    return -1
            elif tx is int:
                if x.bit_length() > AUDIT_MAX_INT_BITS:
                    return -1
            elif x is not None and tx is not bool and tx is not float:
                left = _fits(x, depth + 1, left, max_depth, max_text)
                if left < 0:
                    return -1
        return left
    if t is str:
        return left if len(v) <= max_text else -1
    if t is int:
        return left if v.bit_length() <= AUDIT_MAX_INT_BITS else -1
    return left if v is None or t is bool or t is float else -1


class _Summary:
    """One :func:`summarize` walk: the node budget left and the containers on the current path."""

    __slots__ = ("left", "max_depth", "max_text", "path")

    def __init__(self, max_depth: int, max_nodes: int, max_text: int) -> None:
        self.left, self.max_depth, self.max_text = max_nodes, max_depth, max_text
        self.path: set[int] = set()

    def walk(self, v: Any, depth: int) -> Any:
        self.left -= 1
        t = type(v)
        if t is str:
            return v if len(v) <= self.max_text else short_text(v, self.max_text)
        if v is None or t is bool or t is float:
            return v
        if t is int:
            return v if v.bit_length() <= AUDIT_MAX_INT_BITS else _big_int(v)
        if t is dict or t is list or t is tuple:
            return self.container(v, t, depth)
        if isinstance(v, str):
            return self.walk(str.__getitem__(v, slice(None)), depth)  # an exact str copy, no overrides
        if isinstance(v, int):  # IntEnum, numpy bools are not ints; bool cannot be subclassed
            return self.walk(int.__int__(v), depth)
        if isinstance(v, float):
            return float.__float__(v)
        if isinstance(v, (dict, list, tuple, set, frozenset)):
            return self.container(v, dict if isinstance(v, dict) else list, depth)
        if isinstance(v, (bytes, bytearray, memoryview)):
            return _bytes_text(v, self.max_text)
        if isinstance(v, Mapping):
            return self.container(v, Mapping, depth)
        return self.text(v)

    def container(self, v: Any, kind: type, depth: int) -> Any:
        if depth >= self.max_depth:
            return "<truncated: depth>"
        ident = id(v)
        if ident in self.path:
            return "<truncated: cycle>"
        self.path.add(ident)
        try:
            if kind is dict or kind is Mapping:
                items = dict.items(v) if kind is dict else v.items()
                out: Any = {}
                limit, walk, key = self.max_text, self.walk, self.key
                for taken, (k, item) in enumerate(items):
                    if self.left <= 0:
                        out["<truncated>"] = f"{len(v) - taken} more items"
                        break
                    if type(k) is not str or len(k) > limit:
                        k = key(k)
                    t = type(item)  # plain scalars inline: most arguments are just these
                    if ((t is str and len(item) <= limit) or item is None or t is bool or t is float
                            or (t is int and item.bit_length() <= AUDIT_MAX_INT_BITS)):
                        self.left -= 1
                        out[k] = item
                    else:
                        out[k] = walk(item, depth + 1)
                return out
            seq = list.__iter__(v) if isinstance(v, list) else tuple.__iter__(v) if isinstance(v, tuple) else iter(v)
            out = []
            for taken, item in enumerate(seq):
                if self.left <= 0:
                    out.append(f"<truncated: {len(v) - taken} more items>")
                    break
                out.append(self.walk(item, depth + 1))
            return out
        finally:
            self.path.discard(ident)

    def key(self, k: Any) -> str:
        """A dict key as JSON writes it: strings as they are, ``1`` as ``"1"``, ``None`` as ``"null"``."""
        t = type(k)
        if t is str:
            return k if len(k) <= self.max_text else short_text(k, self.max_text)
        if k is None or t is bool or t is float:
            return json.dumps(k)
        if isinstance(k, int):
            k = int.__int__(k)
            return str(k) if k.bit_length() <= AUDIT_MAX_INT_BITS else _big_int(k)
        if isinstance(k, str):
            return short_text(str.__getitem__(k, slice(None)), self.max_text)
        return self.text(k)

    def text(self, v: Any) -> str:
        try:
            text = str(v)
        except Exception:
            return f"<unprintable {_type_name(v)}>"
        return short_text(str.__getitem__(text, slice(None)), self.max_text)


def _big_int(v: int) -> str:
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return f"<int: {v.bit_length()} bits sha256:{hashlib.sha256(raw).hexdigest()[:16]}>"


def _bytes_text(v: bytes | bytearray | memoryview, limit: int) -> str:
    raw = bytes(v)
    if len(raw) * 4 + 3 <= limit:  # short: its repr, at most 4 characters a byte
        return repr(raw)
    return f"<{len(raw)} bytes sha256:{hashlib.sha256(raw).hexdigest()[:16]}>"


def _type_name(value: Any) -> str:
    try:
        return str(type(value).__name__)[:64]
    except Exception:
        return "object"


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
