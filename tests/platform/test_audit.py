"""The hash-chained audit log: an intact chain verifies, and each kind of tampering is named."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from rsigym_env.platform.audit import GENESIS, AuditReport, canonical_json, chain_hash, verify_audit
from rsigym_env.platform.ledger import Ledger

AUDIT = {"tool": "train", "args": {"steps": 10}, "decision": "allowed"}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A closed ledger file with 10 audit records: 4 reserve/settle pairs, a refusal and a record."""
    path = tmp_path / "ledger.db"
    with Ledger(path) as led:
        led.open_account("run", 1.0)
        for _ in range(4):
            led.settle(led.reserve("run", 0.2, audit=AUDIT), 0.1, audit=AUDIT)
        with pytest.raises(Exception):  # noqa: B017 (whatever the ledger raises, nothing is reserved)
            led.reserve("run", 5.0, audit=AUDIT)
        led.record({"key": "run", "tool": "list_datasets"})
    return path


def raw(path: Path, sql: str, *params: object) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(sql, params)
    conn.close()


def event_of(path: Path, seq: int) -> tuple[str, str]:
    """(event_json, prev_hash) of one record."""
    conn = sqlite3.connect(path)
    row = conn.execute("SELECT event, prev_hash FROM audit WHERE seq = ?", (seq,)).fetchone()
    conn.close()
    return row


def test_chain_hash_and_canonical_json() -> None:
    event = {"b": [1, 2], "a": Path("/x")}
    assert canonical_json(event) == '{"a":"/x","b":[1,2]}'
    assert canonical_json(event) == json.dumps(event, sort_keys=True, separators=(",", ":"), default=str)
    assert chain_hash(GENESIS, '{"a":1}') == hashlib.sha256((GENESIS + '{"a":1}').encode()).hexdigest()


STDLIB_ONLY = {  # values orjson refuses or writes differently: the stdlib encoder writes these events
    "nan": float("nan"), "inf": [1, {"x": float("-inf")}], "big int": 2**64, "surrogate": "\ud800",
    "int key": {2: "b", 1: "a"}, "numpy": [np.float64(0.5), np.int64(3)], "datetime": datetime(2026, 1, 2),
    "dataclass": AuditReport(True, 0, None, "x"), "str subclass": type("Label", (str,), {})("x"),
}


@pytest.mark.parametrize("value", STDLIB_ONLY.values(), ids=STDLIB_ONLY.keys())
def test_canonical_json_falls_back_to_the_stdlib(value: object) -> None:
    event = {"b": value, "a": None}
    assert canonical_json(event) == json.dumps(event, sort_keys=True, separators=(",", ":"), default=str)


def test_canonical_json_of_plain_events_reads_back_the_same() -> None:
    event = {"b": [1, 2.5, None, True, (3, "é")], "a": {"z": "ü\n\"", "y": -0.0}, "c": 1e-7, "d": 2**63}
    text = canonical_json(event)
    assert json.loads(text) == json.loads(json.dumps(event, sort_keys=True, default=str))
    assert list(json.loads(text)) == ["a", "b", "c", "d"] and ": " not in text and ", " not in text
    assert "é" in text  # written by orjson (the stdlib would escape it)
    assert canonical_json(json.loads(text)) == text  # re-encoding a stored event gives its text back


def test_chain_of_every_kind_of_event_verifies(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.db") as led:
        for value in [*STDLIB_ONLY.values(), "plain", "é"]:
            led.record({"value": value})
        assert [r.event["seq"] for r in led.audit_records()] == list(range(1, len(STDLIB_ONLY) + 3))
    assert verify_audit(tmp_path / "ledger.db") == AuditReport(True, len(STDLIB_ONLY) + 2, None, "chain intact")


def test_intact_chain_verifies(db: Path) -> None:
    report = verify_audit(db)
    assert report == AuditReport(True, 10, None, "chain intact")
    assert str(report) == "audit OK: 10 records, chain intact"
    with Ledger(db) as led:
        records = led.audit_records()
    assert records[0].prev_hash == GENESIS
    assert all(b.prev_hash == a.hash for a, b in zip(records, records[1:]))
    assert [r.event["op"] for r in records[-2:]] == ["refuse", "record"]


def test_verifies_while_a_writer_has_the_file_open(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as led:
        led.open_account("run", 1.0)
        led.record({"key": "run"})
        assert verify_audit(path).ok
        led.record({"key": "run"})
        assert verify_audit(path).records == 2


def test_empty_log_is_ok(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.db"):
        pass
    assert verify_audit(tmp_path / "ledger.db") == AuditReport(True, 0, None, "chain intact")


def test_changed_event_is_named(db: Path) -> None:
    event_json, _ = event_of(db, 4)
    raw(db, "UPDATE audit SET event = ? WHERE seq = 4", event_json.replace('"charged_usd":0.1', '"charged_usd":0.0'))
    report = verify_audit(db)
    assert not report.ok and report.first_broken == 4 and report.records == 10
    assert str(report) == "audit BROKEN at record 4: hash does not match its content"


def test_deleted_record_is_a_gap(db: Path) -> None:
    raw(db, "DELETE FROM audit WHERE seq = 6")
    report = verify_audit(db)
    assert (report.ok, report.first_broken, report.records) == (False, 6, 9)
    assert "record 6 is missing" in report.reason


def test_deleted_first_record_is_a_gap(db: Path) -> None:
    raw(db, "DELETE FROM audit WHERE seq = 1")
    assert verify_audit(db).first_broken == 1


def test_rewritten_record_with_its_hash_breaks_the_next_link(db: Path) -> None:
    event_json, prev_hash = event_of(db, 3)
    forged = json.loads(event_json) | {"reserved_usd": 0.0}
    forged_json = canonical_json(forged)
    raw(db, "UPDATE audit SET event = ?, hash = ? WHERE seq = 3", forged_json, chain_hash(prev_hash, forged_json))
    report = verify_audit(db)
    assert (report.ok, report.first_broken) == (False, 4)
    assert report.reason.startswith("link broken")


def test_key_column_is_covered(db: Path) -> None:
    raw(db, "UPDATE audit SET key = 'someone-else' WHERE seq = 2")
    report = verify_audit(db)
    assert report.first_broken == 2 and "key column" in report.reason


def test_missing_file_or_foreign_database(tmp_path: Path) -> None:
    missing = verify_audit(tmp_path / "nope.db")
    assert (missing.ok, missing.records, missing.first_broken) == (False, 0, None)
    assert str(missing).startswith("audit FAILED: no database file")
    other = tmp_path / "other.db"
    raw(other, "CREATE TABLE t (x)")
    assert not verify_audit(other).ok and "no audit table" in verify_audit(other).reason
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    report = verify_audit(junk)
    assert not report.ok and report.first_broken is None


def test_in_memory_ledger_queues_rows_and_keeps_the_chain_whole():
    from rsigym_env.platform.audit import GENESIS, canonical_json, chain_hash
    from rsigym_env.platform.ledger import PENDING_MAX, Ledger

    with Ledger() as ledger:
        ledger.open_account("k", 1000.0)
        n = 2 * PENDING_MAX + 7
        for i in range(n):
            if i % 3:
                ledger.record({"key": "k", "tool": "read", "i": i})
            else:
                ledger.settle(ledger.reserve("k", 0.5, audit={"tool": "infer"}), 0.25, audit={"tool": "infer"})
        records = ledger.audit_records()
        assert ledger.audit_head() == (records[-1].seq, records[-1].hash)
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    prev = GENESIS
    for r in records:
        assert r.prev_hash == prev and r.hash == chain_hash(prev, canonical_json(r.event))
        prev = r.hash


def test_arguments_with_keys_of_mixed_types_are_audited_not_crashed():
    import gymnasium as gym

    env = gym.make("RSIGym/Joint-v0", benchmark="aime")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step({"tool": "train", "args": {1: 2, "a": 3, None: [{3: 1, "x": 2}]}})
    assert info["error"] == "invalid_args" and "Keys should be strings" in obs["log"] and reward == 0
    assert canonical_json({1: 2, "a": 3}) == '{"1":2,"a":3}'
