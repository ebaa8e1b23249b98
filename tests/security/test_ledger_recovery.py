"""Money is never locked forever: a process killed with SIGKILL in the middle of a paid call leaves a
reservation that the next opening of the ledger (or ``Ledger.recover``, or ``rsigym ledger recover``)
settles for the work it recorded and releases the rest, audited; a live process's reservation is
never touched; owners this machine cannot see are left alone and reported.

Before the fix a ``kill -9`` during a long paid call left $25.34 of $50 reserved for good.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from rsigym_env.cli import main
from rsigym_env.platform.audit import verify_audit
from rsigym_env.platform.ledger import Ledger, Reservation, current_owner, owner_status

AUDIT = {"tool": "train", "args": {"dataset": "ds-1"}, "decision": "allowed"}

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="owners are checked in /proc")

CHILD = textwrap.dedent('''
    import sys, time
    from rsigym_env.platform.ledger import Ledger
    ledger = Ledger(sys.argv[1])
    res = ledger.reserve("run", 25.34, audit={"tool": "train", "decision": "allowed"})
    ledger.progress(res, 3.21)
    ledger.progress(res, 1.0)  # never goes down
    print("ready", res.id, flush=True)
    time.sleep(600)
''')


def wait_for_state(pid: int, states: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0].decode() in states:
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not reach state {states}")


def test_a_killed_process_s_reservation_is_settled_for_its_work_on_reopen(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as led:
        led.open_account("run", 50.0)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().split()
        assert line[:1] == ["ready"], line
        rid = int(line[1])

        with Ledger(path) as led:  # opening (and recover) leaves a live owner's reservation alone
            assert led.recovery.settled == () and led.recover().settled == ()
            (hold,) = led.open_reservations()
            assert (hold.id, hold.key, hold.usd, hold.used_usd, hold.label) == (rid, "run", 25.34, 3.21, "train")
            assert hold.owner.pid == child.pid and hold.status == "alive"
            assert led.balance("run").available_usd == pytest.approx(24.66)
        assert main(["ledger", "show", str(path)]) == 0
        shown = capsys.readouterr().out
        assert "alive" in shown and "$25.3400" in shown and "$3.2100" in shown and "chain intact" in shown

        os.kill(child.pid, signal.SIGKILL)
        wait_for_state(child.pid, "ZX")  # dead but not reaped: a zombie is gone too
        assert main(["ledger", "show", str(path)]) == 0  # the books still balance; show changes nothing
        shown = capsys.readouterr().out
        assert "gone" in shown and "rsigym ledger recover" in shown
        with Ledger(path, readonly=True) as ro:
            assert [r.status for r in ro.open_reservations()] == ["gone"]

        with Ledger(path) as led:  # the next opening settles it
            (done,) = led.recovery.settled
            assert (done.reservation.id, done.charged_usd, done.released_usd, done.reason) == (
                rid, 3.21, pytest.approx(22.13), "owner_gone")
            assert led.open_reservations() == []
            bal = led.balance("run")
            assert (bal.spent_usd, bal.reserved_usd, bal.available_usd) == (3.21, 0.0, pytest.approx(46.79))
            event = led.audit_records()[-1].event
            assert event["op"] == "recover" and event["decision"] == "allowed" and event["reason"] == "owner_gone"
            assert event["charged_usd"] == 3.21 and event["reservation"] == rid and event["tool"] == "train"
            assert event["owner"]["pid"] == child.pid and "code" not in event
        with Ledger(path) as again:
            assert again.recovery.settled == ()  # once only
    finally:
        child.kill()
        child.wait()
    assert verify_audit(path).ok
    assert main(["ledger", "show", str(path)]) == 0
    assert "open reservations (0)" in capsys.readouterr().out


def _forked_spender(ledger: Ledger, ready: Any) -> None:
    res = ledger.reserve("run", 5.0, audit=AUDIT)
    ledger.progress(res, 0.75)
    ready.set()
    time.sleep(600)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_is_the_owner_of_its_reservations(tmp_path: Path) -> None:
    """The owner is the process that reserved, not the parent whose ledger it inherited."""
    with Ledger(tmp_path / "ledger.db") as led:
        led.open_account("run", 10.0)
        mine = led.reserve("run", 1.0, audit=AUDIT)
        ctx = multiprocessing.get_context("fork")
        ready = ctx.Event()
        child = ctx.Process(target=_forked_spender, args=(led, ready))
        child.start()
        assert ready.wait(timeout=30)
        assert {r.owner.pid: r.status for r in led.open_reservations()} == {os.getpid(): "alive", child.pid: "alive"}
        child.kill()
        child.join(timeout=30)
        (done,) = led.recover().settled
        assert done.reservation.owner.pid == child.pid and done.charged_usd == 0.75
        assert [r.id for r in led.open_reservations()] == [mine.id]  # our own is untouched
        assert led.balance("run").reserved_usd == 1.0 and led.balance("run").spent_usd == 0.75


def _set_owner(path: Path, rid: int, **columns: Any) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for name, value in columns.items():
        conn.execute(f"UPDATE reservations SET {name} = ? WHERE id = ?", (value, rid))
    conn.close()


def test_who_counts_as_gone(tmp_path: Path) -> None:
    """A reused pid (same pid, another start time) and a reboot are gone; another host or pid namespace
    is left alone and reported; a live owner is untouched."""
    path = tmp_path / "ledger.db"
    with Ledger(path) as led:
        led.open_account("run", 10.0)
        holds = {name: led.reserve("run", 1.0, audit=AUDIT) for name in
                 ("alive", "reused_pid", "rebooted", "other_host", "other_ns", "bad_pid")}
        me = current_owner()
        _set_owner(path, holds["reused_pid"].id, owner_start=me.start - 1)
        _set_owner(path, holds["rebooted"].id, owner_boot="00000000-0000-0000-0000-000000000000")
        _set_owner(path, holds["other_host"].id, owner_host="elsewhere.example", owner_pid=1)
        _set_owner(path, holds["other_ns"].id, owner_pidns="pid:[1]")
        _set_owner(path, holds["bad_pid"].id, owner_pid=-1)
        status = {r.id: r.status for r in led.open_reservations()}
        assert {name: status[res.id] for name, res in holds.items()} == {
            "alive": "alive", "reused_pid": "gone", "rebooted": "gone", "other_host": "other_host",
            "other_ns": "other_pid_namespace", "bad_pid": "unknown"}
        recovery = led.recover()
        assert sorted(d.reservation.id for d in recovery.settled) == sorted(
            [holds["reused_pid"].id, holds["rebooted"].id])
        assert sorted(r.id for r in recovery.left) == sorted(
            [holds["other_host"].id, holds["other_ns"].id, holds["bad_pid"].id])
        assert led.balance("run").reserved_usd == 4.0 and led.balance("run").spent_usd == 0.0
        assert led.books().ok
    assert owner_status(None) == "unknown"


def test_progress_is_clamped_monotonic_and_refuses_nonsense() -> None:
    with Ledger() as led:
        led.open_account("run", 10.0)
        res = led.reserve("run", 2.0)
        assert led.progress(res, 0.5) == 0.5
        assert led.progress(res, 0.25) == 0.5  # never down
        assert led.progress(res, 1e6) == 2.0  # clamped to the hold
        for bad in (math.nan, math.inf, -0.01, 2e9):
            with pytest.raises(ValueError, match="amount must be"):
                led.progress(res, bad)
        with pytest.raises(ValueError, match="not open"):
            led.progress(Reservation(res.id, "someone-else", 2.0), 0.1)  # a forged reservation
        assert led.settle(res, 1.5, audit=AUDIT) == 1.5
        assert led.audit_records()[-1].event["progress_usd"] == 2.0
        with pytest.raises(ValueError, match="not open"):
            led.progress(res, 0.1)
        assert led.balance("run").spent_usd == 1.5 and led.open_reservations() == []


OLD_SCHEMA = (  # the tables as this package wrote them before reservations recorded owners
    """CREATE TABLE accounts (key TEXT PRIMARY KEY, parent TEXT, budget INTEGER NOT NULL CHECK (budget >= 0),
        spent INTEGER NOT NULL DEFAULT 0 CHECK (spent >= 0), reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
        granted INTEGER NOT NULL DEFAULT 0 CHECK (granted >= 0), closed INTEGER NOT NULL DEFAULT 0 CHECK (closed IN (0, 1)),
        CHECK (spent + reserved + granted <= budget)) WITHOUT ROWID, STRICT""",
    "CREATE TABLE reservations (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, nano INTEGER NOT NULL CHECK (nano >= 0)) STRICT",
    "CREATE TABLE audit (seq INTEGER PRIMARY KEY, key TEXT, event TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL)",
    "INSERT INTO accounts (key, budget, spent, reserved) VALUES ('run', 50000000000, 1000000000, 25340000000)",
    "INSERT INTO reservations (key, nano) VALUES ('run', 25340000000)",
)


def test_an_old_ledger_file_opens_and_its_stuck_reservation_can_be_released(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "ledger.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in OLD_SCHEMA:
        conn.execute(statement)
    conn.close()
    assert main(["ledger", "show", str(path)]) == 0  # read-only: an old file is shown as it is
    assert "unknown" in capsys.readouterr().out
    with Ledger(path) as led:  # migrates; an owner it does not know is not judged
        (hold,) = led.open_reservations()
        assert (hold.owner, hold.status, hold.used_usd, hold.label) == (None, "unknown", 0.0, None)
        assert led.recovery.settled == () and [r.id for r in led.recovery.left] == [hold.id]
        led.settle(led.reserve("run", 1.0, audit=AUDIT), 0.5, audit=AUDIT)  # the new columns work
    assert main(["ledger", "recover", str(path)]) == 0
    assert "settled (0)" in capsys.readouterr().out
    assert main(["ledger", "recover", str(tmp_path), "--unowned"]) == 0  # a run directory works too
    out = capsys.readouterr().out
    assert "settled (1)" in out and "owner_unknown" in out and "$25.3400" in out
    with Ledger(path) as led:
        assert led.balance("run").available_usd == 48.5 and led.open_reservations() == []
        assert led.audit_records()[-1].event["reason"] == "owner_unknown"
    assert verify_audit(path).ok


def test_ledger_show_fails_when_the_books_or_the_chain_do_not_add_up(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as led:
        led.open_account("run", 10.0)
        led.mint_subkey("run", "sub", 2.0, audit=AUDIT)
        led.settle(led.reserve("sub", 1.0, audit=AUDIT), 0.5, audit=AUDIT)
        led.reserve("run", 1.0, audit=AUDIT)
    assert main(["ledger", "show", str(path)]) == 0
    capsys.readouterr()

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE accounts SET reserved = reserved + 1000 WHERE key = 'run'")  # money held by nothing
    conn.execute("UPDATE accounts SET budget = budget + 5, granted = granted + 5 WHERE key = 'run'")  # a grant to nobody
    conn.close()
    assert main(["ledger", "show", str(path)]) == 1
    out = capsys.readouterr().out
    assert "open reservations sum to" in out and "sub-keys' budgets sum to" in out

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("UPDATE accounts SET reserved = reserved - 1000, budget = budget - 5, granted = granted - 5 WHERE key = 'run'")
    conn.execute("UPDATE audit SET event = replace(event, 'train', 'trainX') WHERE seq = 2")
    conn.close()
    assert main(["ledger", "show", str(path)]) == 1
    assert "BROKEN at record 2" in capsys.readouterr().out

    assert main(["ledger", "show", str(tmp_path / "missing.sqlite")]) == 1
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"no database here" * 64)
    assert main(["ledger", "show", str(junk)]) == 1
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    assert main(["ledger", "show", str(other)]) == 1
    assert main(["ledger", "recover", str(other)]) == 1
    out = capsys.readouterr().out
    assert out.count("error:") == 4 and not (tmp_path / "missing.sqlite").exists()
    tables = sqlite3.connect(other).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("t",)]  # recover did not turn a foreign database into a ledger
