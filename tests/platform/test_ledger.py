"""The budget ledger: every method and error, a random-interleaving model check, threads and processes."""

from __future__ import annotations

import math
import multiprocessing
import random
import shutil
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ledger_helpers import ledger_state, open_settled_one_by_one

from rsigym_env.errors import ActionError, InsufficientBudget
from rsigym_env.platform.audit import GENESIS, AuditRecord, chain_hash, canonical_json, verify_audit
from rsigym_env.platform.ledger import NANO, Balance, Ledger, Reservation, _nano_up

AUDIT = {"tool": "infer", "args": {"model": "m"}, "decision": "allowed"}


def nano(usd: float) -> int:
    return round(usd * NANO)


def chain_intact(records: list[AuditRecord]) -> bool:
    """The in-memory counterpart of verify_audit."""
    prev = GENESIS
    for i, rec in enumerate(records, start=1):
        if rec.seq != i or rec.prev_hash != prev or chain_hash(prev, canonical_json(rec.event)) != rec.hash:
            return False
        prev = rec.hash
    return True


@pytest.fixture(params=["memory", "file"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    with Ledger(None if request.param == "memory" else tmp_path / "ledger.db") as led:
        led.open_account("run", 10.0)
        yield led


# --- accounts -----------------------------------------------------------------------------------


def test_open_account_and_balance(ledger: Ledger) -> None:
    assert ledger.balance("run") == Balance(10.0, 0.0, 0.0, 0.0, 10.0, False)
    with pytest.raises(ValueError, match="already has an account"):
        ledger.open_account("run", 1.0)
    with pytest.raises(ActionError) as err:
        ledger.balance("nobody")
    assert err.value.code == "unknown_key"


@pytest.mark.parametrize("amount", [-0.01, math.nan, math.inf, 2e9])
def test_bad_amounts_are_value_errors(ledger: Ledger, amount: float) -> None:
    with pytest.raises(ValueError, match="amount must be"):
        ledger.open_account("other", amount)
    with pytest.raises(ValueError, match="amount must be"):
        ledger.reserve("run", amount)
    res = ledger.reserve("run", 1.0)
    with pytest.raises(ValueError, match="amount must be"):
        ledger.settle(res, amount)
    with pytest.raises(ValueError, match="amount must be"):
        ledger.mint_subkey("run", "child", amount)
    assert ledger.balance("run").reserved_usd == 1.0  # the reservation is still open


def test_path_attribute_and_close_is_idempotent(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "x.db")
    assert led.path == str(tmp_path / "x.db")
    led.close()
    led.close()
    with Ledger() as mem:
        assert mem.path is None


def test_file_ledger_is_wal_and_persists(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as led:
        led.open_account("run", 5.0)
        led.settle(led.reserve("run", 2.0, audit=AUDIT), 1.5, audit=AUDIT)
        mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"
    with Ledger(path) as again:
        assert again.balance("run").spent_usd == 1.5
        again.record({"key": "run", "tool": "list_datasets"})
        assert [r.seq for r in again.audit_records()] == [1, 2, 3]
    assert verify_audit(path).ok


def test_check_constraints_back_up_the_guards(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path) as led:
        led.open_account("run", 1.0)
    raw = sqlite3.connect(path, isolation_level=None)
    for sql in (
        "UPDATE accounts SET spent = -1",
        "UPDATE accounts SET reserved = -1",
        "UPDATE accounts SET granted = -1",
        f"UPDATE accounts SET spent = {NANO // 2}, reserved = {NANO // 2}, granted = 1",
    ):
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            raw.execute(sql)
    raw.close()


# --- reserve / settle / release -----------------------------------------------------------------


def test_reserve_settle_release(ledger: Ledger) -> None:
    res = ledger.reserve("run", 3.0)
    assert res == Reservation(res.id, "run", 3.0)
    assert ledger.balance("run") == Balance(10.0, 0.0, 3.0, 0.0, 7.0)
    assert ledger.settle(res, 1.25) == 1.25
    assert ledger.balance("run") == Balance(10.0, 1.25, 0.0, 0.0, 8.75)
    other = ledger.reserve("run", 2.0)
    assert other.id != res.id
    assert ledger.release(other) is None
    assert ledger.balance("run") == Balance(10.0, 1.25, 0.0, 0.0, 8.75)


def test_settling_or_releasing_twice_is_a_value_error(ledger: Ledger) -> None:
    res = ledger.reserve("run", 1.0)
    ledger.settle(res, 0.5)
    for again in (lambda: ledger.settle(res, 0.5), lambda: ledger.release(res)):
        with pytest.raises(ValueError, match="not open"):
            again()
    released = ledger.reserve("run", 1.0)
    ledger.release(released)
    with pytest.raises(ValueError, match="not open"):
        ledger.settle(released, 0.1)
    forged = Reservation(ledger.reserve("run", 1.0).id, "someone-else", 1.0)
    with pytest.raises(ValueError, match="not open"):
        ledger.settle(forged, 0.1)
    assert ledger.balance("run").spent_usd == 0.5


def test_overrun_is_clamped_and_noted(ledger: Ledger) -> None:
    res = ledger.reserve("run", 1.0, audit=AUDIT)
    assert ledger.settle(res, 1.5, audit=AUDIT) == 1.0
    assert ledger.balance("run") == Balance(10.0, 1.0, 0.0, 0.0, 9.0)
    event = ledger.audit_records()[-1].event
    assert event["op"] == "settle" and event["charged_usd"] == 1.0 and event["overrun_usd"] == 0.5
    ledger.settle(ledger.reserve("run", 1.0, audit=AUDIT), 0.2, audit=AUDIT)
    assert "overrun_usd" not in ledger.audit_records()[-1].event


def test_insufficient_budget(ledger: Ledger) -> None:
    held = ledger.reserve("run", 9.5)
    with pytest.raises(InsufficientBudget) as err:
        ledger.reserve("run", 0.50001)
    assert err.value.code == "insufficient_budget"
    assert "$0.5000" in err.value.message and "needs" in err.value.message and "available" in err.value.message
    assert ledger.balance("run").reserved_usd == 9.5
    exact = ledger.reserve("run", 0.5)  # an exact fit is allowed
    assert ledger.balance("run").available_usd == 0.0
    with pytest.raises(InsufficientBudget):
        ledger.reserve("run", 1e-9)
    ledger.release(exact)
    ledger.release(held)
    assert ledger.audit_records() == []  # no audit dict, nothing logged


def test_refusal_is_audited_when_asked(ledger: Ledger) -> None:
    with pytest.raises(InsufficientBudget):
        ledger.reserve("run", 11.0, audit={**AUDIT, "decision": "allowed"})
    (rec,) = ledger.audit_records()
    assert rec.key == "run"
    assert rec.event["op"] == "refuse" and rec.event["decision"] == "refused"
    assert rec.event["code"] == "insufficient_budget" and "$11.0000" in rec.event["message"]
    assert rec.event["requested_usd"] == 11.0 and rec.event["available_usd"] == 10.0
    assert rec.event["tool"] == "infer"
    assert ledger.balance("run") == Balance(10.0, 0.0, 0.0, 0.0, 10.0)


def test_unknown_key(ledger: Ledger) -> None:
    with pytest.raises(ActionError) as err:
        ledger.reserve("nobody", 1.0, audit=AUDIT)
    assert err.value.code == "unknown_key"
    assert ledger.audit_records()[-1].event["code"] == "unknown_key"


def test_rounding_reserves_up_and_covers_the_charge(ledger: Ledger) -> None:
    assert ledger.reserve("run", 0.1 + 0.2).usd == 0.3  # float noise is not a nano-dollar
    tiny = ledger.reserve("run", 1e-10)  # a tenth of a nano-dollar reserves a whole one
    assert tiny.usd == 1e-9
    assert ledger.settle(tiny, 1e-10) == 0.0
    odd = ledger.reserve("run", 1.0000000004)
    assert odd.usd == 1.000000001
    assert ledger.settle(odd, 1.0000000004) == 1.0
    same = ledger.reserve("run", 0.123456789)
    assert ledger.settle(same, 0.123456789) == 0.123456789
    bal = ledger.balance("run")
    assert nano(bal.spent_usd) == NANO + 123456789 and nano(bal.reserved_usd) == 300_000_000


def test_audit_fields(ledger: Ledger) -> None:
    caller = {"tool": "train", "args": {"lr": 1e-4, "path": Path("/x")}, "decision": "allowed"}
    res = ledger.reserve("run", 2.0, audit=caller)
    ledger.settle(res, 0.5, audit=caller)
    ledger.release(ledger.reserve("run", 1.0, audit=caller), audit=caller)
    assert caller == {"tool": "train", "args": {"lr": 1e-4, "path": Path("/x")}, "decision": "allowed"}
    reserve, settle, _, release = (r.event for r in ledger.audit_records())
    assert reserve["op"] == "reserve" and reserve["reserved_usd"] == 2.0 and reserve["available_usd"] == 8.0
    assert reserve["reservation"] == res.id and reserve["seq"] == 1 and reserve["key"] == "run"
    assert reserve["args"] == {"lr": 1e-4, "path": "/x"}  # not JSON -> str
    assert reserve["wall_time"] == round(reserve["wall_time"], 3)
    assert settle["op"] == "settle" and settle["charged_usd"] == 0.5 and settle["available_usd"] == 9.5
    assert release["op"] == "release" and release["charged_usd"] == 0.0 and release["available_usd"] == 9.5
    assert chain_intact(ledger.audit_records())


def test_record(ledger: Ledger) -> None:
    ledger.record({"key": "run", "tool": "list_datasets", "decision": "allowed"})
    ledger.record({"tool": "fly", "decision": "refused", "code": "unknown_tool", "message": "no tool named 'fly'"})
    first, second = ledger.audit_records()
    assert first.key == "run" and first.event["op"] == "record" and first.event["available_usd"] == 10.0
    assert second.key is None and "available_usd" not in second.event and second.event["code"] == "unknown_tool"
    assert chain_intact([first, second])


def test_balances_follow_every_write(ledger: Ledger) -> None:
    """In memory, balances are cached between writes: every write must be seen by the next read."""
    seen = []

    def read(key: str) -> None:
        ledger.record({"key": key})
        seen.append(ledger.balance(key).available_usd)

    read("run")
    hold = ledger.reserve("run", 2.5)
    read("run")
    ledger.mint_subkey("run", "sub", 1.0)
    read("run"), read("sub")
    ledger.settle(hold, 1.0)
    read("run")
    ledger.close_subkey("sub")
    read("run"), read("sub")
    with pytest.raises(InsufficientBudget):
        ledger.reserve("run", 100.0, audit={})
    read("run")
    assert seen == [10.0, 7.5, 6.5, 1.0, 8.0, 9.0, 0.0, 9.0]
    assert [r.event["available_usd"] for r in ledger.audit_records() if r.event["op"] == "record"] == seen
    assert ledger.balance("run") == Balance(10.0, 1.0, 0.0, 0.0, 9.0, False)


class Boom:
    def __str__(self) -> str:
        raise RuntimeError("boom")


class Abort(BaseException):
    """Not an ``Exception``: the audit encoder lets it through (like KeyboardInterrupt), nothing else."""


class Interrupting:
    def __str__(self) -> str:
        raise Abort("interrupted")


def test_an_exception_mid_call_leaves_nothing_behind(ledger: Ledger) -> None:
    ledger.record({"key": "run"})
    bad = {"args": Interrupting()}  # interrupts while the audit row is built, after the balance moved
    with pytest.raises(Abort, match="interrupted"):
        ledger.reserve("run", 1.0, audit=bad)
    assert ledger.balance("run") == Balance(10.0, 0.0, 0.0, 0.0, 10.0)
    res = ledger.reserve("run", 1.0)
    with pytest.raises(Abort):
        ledger.settle(res, 0.5, audit=bad)
    with pytest.raises(Abort):
        ledger.mint_subkey("run", "child", 1.0, audit=bad)
    with pytest.raises(ActionError):
        ledger.balance("child")
    assert ledger.settle(res, 0.5) == 0.5  # the reservation survived the failed settle
    ledger.record({"key": "run"})
    records = ledger.audit_records()
    assert [r.seq for r in records] == [1, 2] and chain_intact(records)


def test_an_unprintable_audit_value_is_audited_not_raised(ledger: Ledger) -> None:
    res = ledger.reserve("run", 1.0, audit={"args": Boom(), "tool": "x"})
    ledger.settle(res, 0.5, audit={"args": {"deep": Boom()}})
    reserve, settle = (r.event for r in ledger.audit_records())
    assert reserve["args"] == "<unprintable Boom>" and settle["args"] == {"deep": "<unprintable Boom>"}
    assert reserve["reservation"] == res.id and ledger.balance("run").spent_usd == 0.5
    if ledger.path is not None:
        assert verify_audit(ledger.path).ok


def test_an_audit_key_must_be_text(ledger: Ledger) -> None:
    with pytest.raises(TypeError, match="key is a str or None"):
        ledger.record({"key": ["run"]})
    assert ledger.audit_records() == []


# --- sub-keys -----------------------------------------------------------------------------------


def test_mint_and_close_subkey(ledger: Ledger) -> None:
    ledger.mint_subkey("run", "child", 4.0, audit=AUDIT)
    assert ledger.balance("run") == Balance(10.0, 0.0, 0.0, 4.0, 6.0)
    assert ledger.balance("child") == Balance(4.0, 0.0, 0.0, 0.0, 4.0)
    ledger.settle(ledger.reserve("child", 2.0), 1.5)
    assert ledger.close_subkey("child", audit=AUDIT) == 2.5
    assert ledger.balance("run") == Balance(10.0, 1.5, 0.0, 0.0, 8.5)
    assert ledger.balance("child") == Balance(4.0, 1.5, 0.0, 0.0, 0.0, closed=True)
    mint, close = (r.event for r in ledger.audit_records())
    assert mint["op"] == "mint" and mint["child"] == "child" and mint["granted_usd"] == 4.0
    assert close["op"] == "close" and close["remainder_usd"] == 2.5 and close["available_usd"] == 8.5
    with pytest.raises(ActionError) as err:
        ledger.reserve("child", 0.1)
    assert err.value.code == "key_closed"
    with pytest.raises(ActionError) as err:
        ledger.close_subkey("child")
    assert err.value.code == "key_closed"
    with pytest.raises(ActionError) as err:
        ledger.mint_subkey("child", "grandchild", 0.1)
    assert err.value.code == "key_closed"


def test_mint_errors(ledger: Ledger) -> None:
    ledger.mint_subkey("run", "child", 4.0)
    with pytest.raises(InsufficientBudget, match=r"needs \$7\.0000 but only \$6\.0000"):
        ledger.mint_subkey("run", "big", 7.0, audit=AUDIT)
    assert ledger.audit_records()[-1].event["child"] == "big"
    with pytest.raises(ValueError, match="already has an account"):
        ledger.mint_subkey("run", "child", 1.0)
    with pytest.raises(ActionError) as err:
        ledger.mint_subkey("nobody", "x", 1.0)
    assert err.value.code == "unknown_key"
    assert ledger.balance("run") == Balance(10.0, 0.0, 0.0, 4.0, 6.0)  # nothing moved


def test_a_subkey_carved_out_of_a_reservation_returns_into_it(ledger: Ledger) -> None:
    hold = ledger.reserve("run", 6.0, audit=AUDIT)
    ledger.mint_subkey_from(hold, "inner", 4.0, audit=AUDIT)
    assert ledger.balance("run") == Balance(10.0, 0.0, 2.0, 4.0, 4.0)  # available did not move
    assert ledger.balance("inner") == Balance(4.0, 0.0, 0.0, 0.0, 4.0)
    assert ledger.books().ok, ledger.books().problems
    with pytest.raises(InsufficientBudget):
        ledger.reserve("inner", 4.5)  # the sub-key is the inner work's ceiling
    ledger.settle(ledger.reserve("inner", 3.0), 1.5)
    assert ledger.close_subkey_into("inner", hold, audit=AUDIT) == 1.5
    assert ledger.balance("run") == Balance(10.0, 0.0, 6.0, 0.0, 4.0)  # the whole budget is back in the hold
    assert ledger.balance("inner") == Balance(4.0, 1.5, 0.0, 0.0, 0.0, closed=True)
    assert [r.usd for r in ledger.open_reservations()] == [6.0] and ledger.open_reservations()[0].used_usd == 1.5
    assert ledger.books().ok, ledger.books().problems
    ledger.settle(hold, 1.5, audit=AUDIT)
    assert ledger.balance("run") == Balance(10.0, 1.5, 0.0, 0.0, 8.5)
    ops = [(r.key, r.event["op"]) for r in ledger.audit_records()]
    assert ops == [("run", "reserve"), ("run", "mint"), ("run", "close"), ("run", "settle")]
    assert ledger.books().ok


def test_carving_errors(ledger: Ledger) -> None:
    hold = ledger.reserve("run", 3.0)
    with pytest.raises(InsufficientBudget, match="does not fit reservation"):
        ledger.mint_subkey_from(hold, "big", 3.5, audit=AUDIT)
    assert ledger.audit_records()[-1].event["op"] == "refuse"
    ledger.progress(hold, 2.0)  # recorded work cannot be carved away
    with pytest.raises(InsufficientBudget):
        ledger.mint_subkey_from(hold, "big", 1.5)
    ledger.mint_subkey_from(hold, "inner", 1.0)
    with pytest.raises(ValueError, match="already has an account"):
        ledger.mint_subkey_from(hold, "inner", 0.0)
    other = ledger.reserve("run", 1.0)
    with pytest.raises(ValueError, match="not an open hold"):
        ledger.close_subkey_into("inner", Reservation(other.id + 100, "run", 1.0))
    ledger.close_subkey_into("inner", hold)
    ledger.release(other)
    ledger.settle(hold, 2.0)
    with pytest.raises(ValueError, match="not open"):
        ledger.mint_subkey_from(hold, "late", 1.0)
    assert ledger.balance("run") == Balance(10.0, 2.0, 0.0, 0.0, 8.0) and ledger.books().ok


def test_close_subkey_errors(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="not a sub-key"):
        ledger.close_subkey("run")
    with pytest.raises(ActionError) as err:
        ledger.close_subkey("nobody")
    assert err.value.code == "unknown_key"
    ledger.mint_subkey("run", "child", 4.0)
    free = ledger.reserve("child", 0.0)  # a zero hold still counts as open
    with pytest.raises(ValueError, match="open reservations"):
        ledger.close_subkey("child")
    ledger.release(free)
    ledger.mint_subkey("child", "grandchild", 1.0)
    with pytest.raises(ValueError, match="open sub-keys"):
        ledger.close_subkey("child")
    ledger.settle(ledger.reserve("grandchild", 0.5), 0.25)
    assert ledger.close_subkey("grandchild") == 0.75
    assert ledger.balance("child") == Balance(4.0, 0.25, 0.0, 0.0, 3.75)
    assert ledger.close_subkey("child") == 3.75
    assert ledger.balance("run") == Balance(10.0, 0.25, 0.0, 0.0, 9.75)


# --- model check --------------------------------------------------------------------------------


@dataclass
class Account:
    budget: int
    parent: str | None = None
    spent: int = 0
    reserved: int = 0
    granted: int = 0
    closed: bool = False

    @property
    def available(self) -> int:
        return 0 if self.closed else self.budget - self.spent - self.reserved - self.granted


amounts = st.integers(0, 3 * NANO) | st.integers(0, 1000)
picks = st.integers(0, 10_000)


class LedgerMachine(RuleBasedStateMachine):
    """Random interleavings of every write against a model kept in exact nano-dollars."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.path = Path(self.dir) / "ledger.db"
        self.ledger = Ledger(self.path)
        self.model: dict[str, Account] = {}
        self.open: dict[int, tuple[Reservation, int]] = {}
        self.done: list[Reservation] = []
        self.used: dict[int, int] = {}
        self.carved: dict[str, Reservation] = {}  # sub-keys carved out of a reservation -> that reservation
        self.audited = 0

    def teardown(self) -> None:
        self.ledger.close()
        report = verify_audit(self.path)
        shutil.rmtree(self.dir)
        assert report.ok and report.records == self.audited, str(report)

    def pick(self, names: list[str], i: int) -> str | None:
        return names[i % len(names)] if names else None

    @initialize(budget=st.integers(NANO, 5 * NANO))
    def first_account(self, budget: int) -> None:
        self.open_account(budget)

    @rule(budget=amounts)
    def open_account(self, budget: int) -> None:
        key = f"root{len(self.model)}"
        self.ledger.open_account(key, budget / NANO)
        self.model[key] = Account(budget)

    @rule(i=picks, amount=amounts)
    def mint(self, i: int, amount: int) -> None:
        parent = self.pick(list(self.model), i)
        if parent is None:
            return
        child, acct = f"sub{len(self.model)}", self.model[parent]
        self.audited += 1
        event(f"mint: {'closed' if acct.closed else 'refused' if amount > acct.available else 'ok'}")
        if acct.closed:
            with pytest.raises(ActionError, match="closed"):
                self.ledger.mint_subkey(parent, child, amount / NANO, audit={})
        elif amount > acct.available:
            with pytest.raises(InsufficientBudget):
                self.ledger.mint_subkey(parent, child, amount / NANO, audit={})
        else:
            self.ledger.mint_subkey(parent, child, amount / NANO, audit={})
            acct.granted += amount
            self.model[child] = Account(amount, parent=parent)

    @rule(i=picks)
    def close(self, i: int) -> None:
        child = self.pick([k for k, a in self.model.items() if a.parent is not None], i)
        if child is None:
            return
        acct = self.model[child]
        busy = acct.granted or any(res.key == child for res, _ in self.open.values())
        event(f"close: {'closed' if acct.closed else 'busy' if busy else 'ok'}")
        if acct.closed:
            with pytest.raises(ActionError, match="closed"):
                self.ledger.close_subkey(child, audit={})
        elif busy:
            with pytest.raises(ValueError):
                self.ledger.close_subkey(child, audit={})
        else:
            assert nano(self.ledger.close_subkey(child, audit={})) == acct.budget - acct.spent
            parent = self.model[acct.parent]
            parent.granted -= acct.budget
            parent.spent += acct.spent
            acct.closed = True
            self.audited += 1

    @rule(i=picks, amount=amounts)
    def carve(self, i: int, amount: int) -> None:
        if not self.open:
            return
        rid = sorted(self.open)[i % len(self.open)]
        res, held = self.open[rid]
        child, acct = f"sub{len(self.model)}", self.model[res.key]
        self.audited += 1
        fits = amount <= held - self.used[rid]
        event(f"carve: {'ok' if fits else 'refused'}")
        if not fits:
            with pytest.raises(InsufficientBudget):
                self.ledger.mint_subkey_from(res, child, amount / NANO, audit={})
            return
        self.ledger.mint_subkey_from(res, child, amount / NANO, audit={})
        self.open[rid] = (res, held - amount)
        acct.reserved -= amount
        acct.granted += amount
        self.model[child] = Account(amount, parent=res.key)
        self.carved[child] = res

    @rule(i=picks)
    def close_into(self, i: int) -> None:
        child = self.pick(sorted(k for k in self.carved if not self.model[k].closed), i)
        if child is None:
            return
        res, acct = self.carved[child], self.model[child]
        busy = acct.granted or any(r.key == child for r, _ in self.open.values())
        event(f"close_into: {'busy' if busy else 'hold gone' if res.id not in self.open else 'ok'}")
        if busy or res.id not in self.open:
            with pytest.raises(ValueError):
                self.ledger.close_subkey_into(child, res, audit={})
            return
        assert nano(self.ledger.close_subkey_into(child, res, audit={})) == acct.spent
        _, held = self.open[res.id]
        self.open[res.id] = (res, held + acct.budget)
        self.used[res.id] += acct.spent
        parent = self.model[acct.parent]
        parent.reserved += acct.budget
        parent.granted -= acct.budget
        acct.closed = True
        self.audited += 1

    @rule(i=picks, amount=amounts)
    def reserve(self, i: int, amount: int) -> None:
        key = self.pick(list(self.model), i)
        if key is None:
            return
        acct = self.model[key]
        self.audited += 1
        event(f"reserve: {'closed' if acct.closed else 'refused' if amount > acct.available else 'ok'}")
        if acct.closed or amount > acct.available:
            with pytest.raises(ActionError, match="closed" if acct.closed else "needs"):
                self.ledger.reserve(key, amount / NANO, audit={})
            return
        res = self.ledger.reserve(key, amount / NANO, audit={})
        assert nano(res.usd) == amount
        acct.reserved += amount
        self.open[res.id] = (res, amount)
        self.used[res.id] = 0

    @rule(i=picks, amount=amounts)
    def progress(self, i: int, amount: int) -> None:
        if not self.open:
            return
        res, held = self.open[sorted(self.open)[i % len(self.open)]]
        self.used[res.id] = max(self.used[res.id], min(amount, held))
        assert nano(self.ledger.progress(res, amount / NANO)) == self.used[res.id]

    @rule(i=picks, factor=st.floats(0.0, 2.0))
    def settle(self, i: int, factor: float) -> None:
        if not self.open:
            return
        res, held = self.open.pop(sorted(self.open)[i % len(self.open)])
        actual = round(held * factor)
        charged = min(actual, held)
        event(f"settle: {'overrun' if actual > held else 'within'}")
        assert nano(self.ledger.settle(res, actual / NANO, audit={})) == charged
        acct = self.model[res.key]
        acct.reserved -= held
        acct.spent += charged
        self.done.append(res)
        self.audited += 1

    @rule(i=picks)
    def release(self, i: int) -> None:
        if not self.open:
            return
        res, held = self.open.pop(sorted(self.open)[i % len(self.open)])
        self.ledger.release(res, audit={})
        self.model[res.key].reserved -= held
        self.done.append(res)
        self.audited += 1

    @rule(i=picks)
    def settle_again(self, i: int) -> None:
        if self.done:
            with pytest.raises(ValueError, match="not open"):
                self.ledger.settle(self.done[i % len(self.done)], 0.0, audit={})

    @invariant()
    def balances_match_the_model(self) -> None:
        for key, acct in self.model.items():
            bal = self.ledger.balance(key)
            got = (nano(bal.budget_usd), nano(bal.spent_usd), nano(bal.reserved_usd), nano(bal.granted_usd))
            assert got == (acct.budget, acct.spent, acct.reserved, acct.granted), key
            assert nano(bal.available_usd) == acct.available and bal.closed == acct.closed
            assert min(got) >= 0 and bal.available_usd >= 0
            assert acct.spent + acct.reserved + acct.granted <= acct.budget

    @invariant()
    def books_balance_and_holds_are_listed(self) -> None:
        books = self.ledger.books()
        assert books.ok, books.problems
        listed = {r.id: (nano(r.usd), nano(r.used_usd), r.status) for r in self.ledger.open_reservations()}
        assert listed == {rid: (held, self.used[rid], "alive") for rid, (_, held) in self.open.items()}

    @invariant()
    def money_is_conserved(self) -> None:
        """Every root's budget is its available plus what is spent, held or out in open sub-keys."""
        for key, acct in self.model.items():
            if acct.parent is None:
                total = self.ledger.balance(key)
                parts = (total.available_usd, total.spent_usd, total.reserved_usd, total.granted_usd)
                assert sum(map(nano, parts)) == acct.budget


class MemoryLedgerMachine(LedgerMachine):
    """The same against an in-memory ledger, which caches balances between writes and queues audit rows."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger.close()
        self.ledger = Ledger()

    def teardown(self) -> None:
        records = self.ledger.audit_records()
        self.ledger.close()
        shutil.rmtree(self.dir)
        assert chain_intact(records) and len(records) == self.audited


TestLedgerMachine = LedgerMachine.TestCase
TestMemoryLedgerMachine = MemoryLedgerMachine.TestCase
TestLedgerMachine.settings = TestMemoryLedgerMachine.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _random_session(ledger: Ledger, seed: int) -> list[Any]:
    """Many calls between reads, so that an in-memory ledger's mirror runs far ahead of its tables."""
    rng = random.Random(seed)
    ledger.open_account("a", 50.0)
    ledger.open_account("b", 5.0)
    holds: list[Reservation] = []
    subkeys: list[tuple[str, Reservation | None]] = []
    seen: list[Any] = []
    for i in range(400):
        op = rng.random()
        key = rng.choice(["a", "b", "nobody"])
        try:
            if op < 0.35:
                holds.append(ledger.reserve(key, rng.uniform(0.0, 3.0), audit={"tool": "t", "i": i} if rng.random() < 0.8
                                            else None, label=rng.choice([None, "lbl"])))
            elif op < 0.6 and holds:
                res = holds.pop(rng.randrange(len(holds)))
                seen.append(ledger.settle(res, rng.uniform(0.0, 4.0), audit={"tool": "t"} if rng.random() < 0.8 else None))
                if rng.random() < 0.2:
                    ledger.settle(res, 0.1)  # not open any more
            elif op < 0.7 and holds:
                ledger.release(holds.pop(rng.randrange(len(holds))), audit={"tool": "t", "reason": "x"})
            elif op < 0.8 and holds:
                seen.append(ledger.progress(rng.choice(holds), rng.uniform(0.0, 3.0)))
            elif op < 0.85:
                ledger.record({"key": key if key != "nobody" else None, "tool": "r"})
            elif op < 0.9 and holds and len(subkeys) < 6:
                hold = rng.choice(holds)
                child = f"c{i}"
                ledger.mint_subkey_from(hold, child, rng.uniform(0.0, 1.0), audit={"tool": "m"})
                subkeys.append((child, hold))
                holds.append(ledger.reserve(child, rng.uniform(0.0, 0.5), audit={"tool": "t"}))
            elif op < 0.93 and len(subkeys) < 6:
                child = f"s{i}"
                ledger.mint_subkey(key, child, rng.uniform(0.0, 2.0), audit={"tool": "m"})
                subkeys.append((child, None))
            elif op < 0.96 and subkeys:
                child, hold = subkeys.pop(rng.randrange(len(subkeys)))
                for res in [h for h in holds if h.key == child]:
                    holds.remove(res)
                    ledger.settle(res, rng.uniform(0.0, 0.5), audit={"tool": "t"})
                seen.append(ledger.close_subkey(child, audit={"tool": "c"}) if hold is None
                            else ledger.close_subkey_into(child, hold, audit={"tool": "c"}))
            elif op < 0.98:
                seen.append(ledger.books().ok)
            else:
                seen.append([(r.id, r.key, r.usd, r.used_usd, r.label) for r in ledger.open_reservations()])
        except (ActionError, ValueError) as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
        if rng.random() < 0.3:
            seen.append(ledger.balance(rng.choice(["a", "b"])))
    seen.append([(a.key, a.parent, a.balance) for a in ledger.accounts()])
    seen.append([(r.id, r.key, r.usd, r.used_usd, r.label) for r in ledger.open_reservations()])
    books = ledger.books()
    seen.append((books.ok, books.problems))
    seen.append([({k: v for k, v in r.event.items() if k != "wall_time"}, r.key, r.seq) for r in ledger.audit_records()])
    return seen


@pytest.mark.parametrize("seed", range(6))
def test_memory_ledger_matches_a_file_ledger_call_for_call(tmp_path: Path, seed: int) -> None:
    """The in-memory ledger (its mirror of accounts and holds, written back in batches) answers every
    call exactly as a file ledger does, and ends with the same tables and audit events."""
    with Ledger() as memory, Ledger(tmp_path / "ledger.db") as disk:
        assert _random_session(memory, seed) == _random_session(disk, seed)
        assert memory.books().ok


# --- concurrency --------------------------------------------------------------------------------


def spend(ledger: Ledger, rng: random.Random, rounds: int) -> tuple[int, int, int]:
    """reserve -> settle (with overruns) ``rounds`` times on key "run"; (charged nano, allowed, refused)."""
    charged = allowed = refused = 0
    for _ in range(rounds):
        worst = rng.uniform(0.001, 0.05)
        try:
            res = ledger.reserve("run", worst, audit=AUDIT)
        except InsufficientBudget:
            refused += 1
            continue
        allowed += 1
        time.sleep(0)  # let other threads in while the hold is open
        charged += nano(ledger.settle(res, worst * rng.uniform(0.3, 1.5), audit=AUDIT))
    return charged, allowed, refused


def check_spend(path: Path, budget: float, results: list[tuple[int, int, int]]) -> None:
    with Ledger(path) as led:
        bal = led.balance("run")
        held: set[int] = set()
        most_held = 0  # holds open at once: more than one means the workers really interleaved
        for rec in led.audit_records():
            if rec.event["op"] == "reserve":
                held.add(rec.event["reservation"])
            elif rec.event["op"] == "settle":
                held.remove(rec.event["reservation"])
            most_held = max(most_held, len(held))
    assert most_held > 1 and not held
    charged, allowed, refused = map(sum, zip(*results))
    assert nano(bal.spent_usd) == charged
    assert bal.spent_usd <= budget and bal.reserved_usd == 0.0
    assert refused > 0 and bal.available_usd < 0.05  # the budget, not the number of rounds, was the limit
    report = verify_audit(path)
    assert report.ok, str(report)
    assert report.records == 2 * allowed + refused


def test_threads_share_one_file_ledger(tmp_path: Path) -> None:
    path, budget = tmp_path / "ledger.db", 12.0
    results: list[tuple[int, int, int]] = []
    with Ledger(path) as led:
        led.open_account("run", budget)

        def work(seed: int) -> None:
            results.append(spend(led, random.Random(seed), 150))

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(results) == 8
    check_spend(path, budget, results)


def _spend_worker(path: str, seed: int, rounds: int, start: Any, out: Any) -> None:
    """One process: its own Ledger on the shared file (runs in a 'spawn' child)."""
    with Ledger(path) as led:
        start.wait(timeout=60)
        out.put(spend(led, random.Random(seed), rounds))


def test_processes_share_one_file(tmp_path: Path) -> None:
    path, budget = tmp_path / "ledger.db", 12.0
    with Ledger(path) as led:
        led.open_account("run", budget)
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_spend_worker, args=(str(path), seed, 300, start, out)) for seed in range(4)]
    for p in procs:
        p.start()
    for p in procs:  # results are a few bytes each, so joining before reading the queue cannot block
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 4
    results = [out.get(timeout=10) for _ in procs]
    check_spend(path, budget, results)


# --- finished runs written in one go (open_settled) -----------------------------------------------


@pytest.mark.parametrize(("entries", "error", "match"), [
    ([("a", 5.0, 1.0, AUDIT), ("a", 5.0, 1.0, AUDIT)], ValueError, "repeats"),
    ([("new", 5.0, 1.0, AUDIT), ("run", 5.0, 1.0, AUDIT)], ValueError, "'run' already has an account"),
    ([("new", 5.0, 1.0, AUDIT), (7, 5.0, 1.0, AUDIT)], TypeError, "key is a str"),
    ([("new", 5.0, 1.0, AUDIT), ("b", 5.0, math.nan, AUDIT)], ValueError, "amount must be"),
    ([("new", 5.0, 1.0, AUDIT), ("b", -1.0, 0.0, AUDIT)], ValueError, "amount must be"),
    ([("new", 5.0, 1.0, AUDIT), ("b", 5.0, 5.000000001, AUDIT)], InsufficientBudget, "reserve needs"),
])
def test_settled_accounts_refuse_a_bad_entry_and_write_nothing(ledger: Ledger, entries: list, error: type,
                                                               match: str) -> None:
    before = ledger_state(ledger)
    with pytest.raises(error, match=match):
        ledger.open_settled(entries)
    assert ledger_state(ledger) == before
    ledger.open_settled([("new", 5.0, 5.0, AUDIT)])  # the ledger is still usable, and a spend of the whole budget fits
    assert ledger.balance("new").available_usd == 0.0 and ledger.books().ok


_AMOUNT = st.one_of(st.just(0.0), st.floats(0.0, 20.0), st.integers(0, 20_000_000_000).map(lambda n: n / NANO))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.parametrize("where", ["memory", "file"])
@given(before=st.lists(st.tuples(st.floats(0.0, 5.0), st.booleans()), max_size=6),
       entries=st.lists(st.tuples(_AMOUNT, _AMOUNT, st.sampled_from([{"tool": "episode", "decision": "allowed", "seed": 3},
                                                                      {"tool": "episodes", "episodes": [{"steps": 1}]}])),
                        max_size=8),
       pending=st.booleans())
def test_settled_accounts_in_one_go_equal_the_calls_one_by_one(tmp_path_factory: pytest.TempPathFactory, where: str,
                                                                before: list[tuple[float, bool]],
                                                                entries: list[tuple[float, float, dict[str, Any]]],
                                                                pending: bool) -> None:
    """``open_settled`` gives, entry for entry, the audit rows (hashes included, at one wall time), accounts and
    reservation ids of ``open_account`` + ``reserve``/``settle`` (or ``record`` for no spend) one by one, after any
    history (holds left open, settled ones, audit rows not yet flushed); a spend over its budget writes nothing."""
    from unittest import mock

    from rsigym_env.platform import ledger as ledger_module

    folder = tmp_path_factory.mktemp("ledgers")
    items = [(f"ep-{i}", budget, spend, audit) for i, (budget, spend, audit) in enumerate(entries)]
    states = []
    with mock.patch.object(ledger_module, "time", mock.Mock(time=lambda: 1_800_000_000.25)):
        for bulk in (True, False):
            with Ledger(None if where == "memory" else folder / f"{bulk}.db") as ledger:
                ledger.open_account("run", 30.0)
                for usd, settle in before:  # history: holds settled or left open, some before a flush
                    hold = ledger.reserve("run", usd, audit={"tool": "t"})
                    if settle:
                        ledger.settle(hold, usd / 2, audit={"tool": "t"})
                if not pending:
                    ledger.books()  # an in-memory ledger writes its mirror and queue back here
                over = any(_nano_up(spend) > round(budget * NANO) for _, budget, spend, _ in items if spend)
                if bulk and over:
                    kept = ledger_state(ledger)
                    with pytest.raises(InsufficientBudget):
                        ledger.open_settled(items)
                    assert ledger_state(ledger) == kept  # nothing written
                    return
                (ledger.open_settled if bulk else partial(open_settled_one_by_one, ledger))(items)
                after = ledger.reserve("run", 0.0)  # the next reservation id
                states.append((ledger_state(ledger), after, ledger.books().ok))
    assert states[0] == states[1] and states[0][2]
    if where == "file":
        assert verify_audit(folder / "True.db").ok
