"""The authorization service: one platform key per run binds permissions and a budget.

Every call goes through it: authorized against the key's scenario, its worst case reserved on the
ledger (refused if that does not fit), run, then settled at its actual cost with the rest
released. Every call, allowed or refused, leaves a hash-chained audit record.

>>> from rsigym_env.scenario import load_scenario
>>> platform = Platform()
>>> key = platform.issue_key(load_scenario(budget_usd=10))
>>> with platform.charge(key, {"tool": "infer"}, quote_usd=1.0) as bill:
...     charged = bill.settle(0.25)
>>> round(platform.balance(key).available_usd, 2)
9.75
"""

from __future__ import annotations

import hashlib
import secrets
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import ActionError
from ..scenario import Scenario
from ..tools import TOOLS, Tool
from .audit import AUDIT_TEXT_MAX, short_text, summarize
from .ledger import Balance, Ledger, Reservation
from .permissions import authorize

_FLAT_TOOLS = frozenset(TOOLS)

__all__ = ["AUDIT_TEXT_MAX", "Bill", "Platform", "PlatformKey", "audit_args", "tool_label"]


@dataclass(frozen=True)
class PlatformKey:
    """A run's key. ``secret`` is what a client would hold; the ledger only sees ``id`` (its hash)."""

    secret: str = field(repr=False)
    id: str
    scenario: Scenario = field(repr=False)

    @staticmethod
    def key_id(secret: str) -> str:
        return hashlib.sha256(secret.encode()).hexdigest()[:16]


def audit_args(tool: Tool | Any) -> dict[str, Any]:
    """A call's arguments for the audit log, bounded (see :func:`~.audit.summarize`); never raises.

    A tool's fields, an action dict's entries, or ``{"raw": ...}`` for anything else (the ``repr`` of
    a string action). Long strings become ``<N chars sha256:...>``; deep, huge or self-referencing
    structures are cut with ``"<truncated: ...>"`` markers.

    >>> audit_args({"tool": "train", "args": {"lr": "x" * 300, 2: [1, 2]}})
    {'tool': 'train', 'args': {'lr': '<300 chars sha256:0d4e2ca9e9cbced7>', '2': [1, 2]}}
    >>> audit_args("not json")
    {'raw': "'not json'"}
    """
    try:
        if isinstance(tool, Tool):  # validated fields, a handful of them: scalars as they are, the rest bounded
            out = {}
            # the ten tools' fields are scalars and lists of strings: their __dict__ is model_dump's dict
            fields = tool.__dict__ if type(tool) in _FLAT_TOOLS else tool.model_dump()
            for name, value in fields.items():
                t = type(value)
                if t is str:
                    out[name] = value if len(value) <= AUDIT_TEXT_MAX else _short(value)
                elif value is None or t is bool or t is float or (t is int and -(2**63) <= value < 2**63):
                    out[name] = value
                else:
                    out[name] = summarize(list(value) if t is list else value)
            return out
        raw = tool
        if isinstance(raw, str):
            return {"raw": _short(repr(str.__getitem__(raw, slice(None))))}
        out = summarize(raw)
        return out if isinstance(out, dict) else {"raw": out}
    except Exception as exc:  # model_dump or isinstance itself failed on a hostile object
        return {"raw": f"<unauditable: {type(exc).__name__}>"}


def _short(text: str) -> str:
    return text if len(text) <= AUDIT_TEXT_MAX else short_text(text, AUDIT_TEXT_MAX)


def _text(value: Any) -> str:
    """``value`` as bounded text, whatever it is (error codes and messages of a hostile error)."""
    out = summarize(value)
    return out if isinstance(out, str) else _short(str(out))


def tool_label(tool: Tool | Any) -> str:
    """The tool a call names, for logs: a tool's name, an action dict's ``"tool"`` (64 characters at
    most) or ``"?"``; never raises.

    >>> tool_label({"tool": "train", "args": {}}), tool_label([1, 2])
    ('train', '?')
    """
    try:
        if isinstance(tool, Tool):
            return str(tool.name)
        if isinstance(tool, dict):
            name = dict.get(tool, "tool")
            if isinstance(name, str):
                return str.__getitem__(name, slice(None, 64))
    except Exception:
        pass
    return "?"


class Bill:
    """The open reservation of one paid call; settle it with the actual cost.

    A call whose work runs under keys of its own (the recursive world's inner episodes) carves them
    out of this reservation with :meth:`mint_subkey` and closes them with :meth:`close_subkey`; what
    they spent is the least the bill then charges, settled or released.
    """

    def __init__(self, platform: "Platform", key: PlatformKey, reservation: Reservation, event: dict[str, Any]):
        self._platform, self._key, self.reservation, self._event = platform, key, reservation, event
        self.charged_usd: float | None = None
        self.subkeys_spent_usd = 0.0
        """What the sub-keys closed into this bill spent: the floor of its charge."""
        self._subkeys: dict[str, PlatformKey] = {}

    @property
    def platform(self) -> "Platform":
        return self._platform

    @property
    def key(self) -> PlatformKey:
        return self._key

    def mint_subkey(self, budget_usd: float, scenario: Scenario | None = None) -> PlatformKey:
        """A sub-key of the bill's key whose ``budget_usd`` is carved out of this reservation (the key's
        available balance does not move); it is bound to ``scenario`` (default: the key's)."""
        return self._platform.mint_subkey(self._key, budget_usd, scenario, bill=self)

    def close_subkey(self, child: PlatformKey) -> float:
        """Close a sub-key made by :meth:`mint_subkey`: its budget goes back into the reservation and
        its spend is charged with the bill. Returns that spend."""
        return self._platform.close_subkey(child, bill=self)

    def settle(self, usd: float) -> float:
        """Charge ``usd`` (at least what closed sub-keys spent, at most the reservation); the rest is
        released. Open sub-keys are closed first. Returns the charge."""
        self._close_subkeys()
        usd = max(usd, self.subkeys_spent_usd)
        self.charged_usd = self._platform.ledger.settle(self.reservation, usd, audit=dict(self._event))
        return self.charged_usd

    def progress(self, used_usd: float) -> float:
        """Record that ``used_usd`` of the work is done (see :meth:`Ledger.progress`): should this
        process die, recovery charges that much and releases the rest. Returns the recorded amount."""
        return self._platform.ledger.progress(self.reservation, used_usd)

    def _close_subkeys(self) -> None:
        for child in list(self._subkeys.values()):
            self.close_subkey(child)


class Platform:
    """Keys, permissions, budget and audit for any number of runs (one ledger)."""

    def __init__(self, ledger: Ledger | None = None):
        self.ledger = ledger or Ledger()

    def issue_key(self, scenario: Scenario, budget_usd: float | None = None) -> PlatformKey:
        """A new key bound to ``scenario`` with its budget (or ``budget_usd``)."""
        secret = "rsk-" + secrets.token_hex(16)
        key = PlatformKey(secret, PlatformKey.key_id(secret), scenario)
        self.ledger.open_account(key.id, scenario.budget_usd if budget_usd is None else budget_usd)
        return key

    def mint_subkey(self, parent: PlatformKey, budget_usd: float, scenario: Scenario | None = None, *,
                    bill: Bill | None = None) -> PlatformKey:
        """A child key carrying ``budget_usd`` of the parent's budget, bound to ``scenario`` (default the
        parent's; it authorizes the child's calls).

        The budget comes out of the parent's available balance, or, with ``bill`` (an open bill of
        ``parent``), out of that bill's reservation. Audited on the parent (``tool: "mint_subkey"``);
        :class:`~rsigym_env.errors.InsufficientBudget` if it does not fit.

        >>> from rsigym_env.scenario import load_scenario
        >>> platform = Platform()
        >>> run = platform.issue_key(load_scenario(budget_usd=10))
        >>> inner = platform.mint_subkey(run, 4.0)
        >>> platform.balance(run).available_usd, platform.balance(inner).available_usd
        (6.0, 4.0)
        >>> with platform.charge(inner, {"tool": "infer"}, quote_usd=1.0) as bill:
        ...     _ = bill.settle(0.5)
        >>> platform.close_subkey(inner), platform.balance(run).spent_usd, platform.balance(run).available_usd
        (0.5, 0.5, 9.5)
        """
        if bill is not None and bill.key.id != parent.id:
            raise ValueError("a bill funds sub-keys of its own key only")
        secret = "rsk-" + secrets.token_hex(16)
        child = PlatformKey(secret, PlatformKey.key_id(secret), scenario or parent.scenario)
        audit = {"tool": "mint_subkey", "decision": "allowed"}
        if bill is None:
            self.ledger.mint_subkey(parent.id, child.id, budget_usd, audit=audit)
        else:
            if bill.charged_usd is not None:
                raise ValueError("the bill is already settled or released")
            self.ledger.mint_subkey_from(bill.reservation, child.id, budget_usd, audit=audit)
            bill._subkeys[child.id] = child
        return child

    def close_subkey(self, child: PlatformKey, *, bill: Bill | None = None) -> float:
        """Close a sub-key; returns what it spent. Without ``bill`` the parent is charged that and gets
        the remainder back; with the ``bill`` that funded it, its whole budget returns to the bill's
        reservation and the spend is charged when the bill is settled (see :meth:`Bill.settle`)."""
        audit = {"tool": "close_subkey", "decision": "allowed"}
        if bill is None:
            self.ledger.close_subkey(child.id, audit=audit)
            return self.ledger.balance(child.id).spent_usd
        if bill._subkeys.pop(child.id, None) is None:
            raise ValueError(f"sub-key {child.id} was not minted from this bill (or is closed)")
        spent = self.ledger.close_subkey_into(child.id, bill.reservation, audit=audit)
        bill.subkeys_spent_usd += spent
        return spent

    def balance(self, key: PlatformKey) -> Balance:
        return self.ledger.balance(key.id)

    def authorize(self, key: PlatformKey, tool: Tool) -> Tool:
        """The tool with locked fields applied, or :class:`ActionError` (not yet audited)."""
        return authorize(key.scenario, tool)

    def refuse(self, key: PlatformKey, action: Any, error: ActionError) -> None:
        """Audit a refused or malformed call (any ``action`` at all); it costs nothing.

        The record says ``decision: "refused"`` with the error's ``code`` and (bounded) ``message``.
        """
        code, message = getattr(error, "code", None), getattr(error, "message", None)
        self.ledger.record({
            "key": key.id, "tool": tool_label(action), "args": audit_args(action), "decision": "refused",
            "code": code if type(code) is str else _text(code),
            "message": _short(message) if type(message) is str else _text(message),
        })

    def record(self, key: PlatformKey, tool: Tool | Any, **extra: Any) -> None:
        """Audit a free call that ran: ``decision: "allowed"``, its arguments and ``extra`` fields
        (bounded like the arguments)."""
        event = {"key": key.id, "tool": tool_label(tool), "args": audit_args(tool), "decision": "allowed"}
        for name, value in extra.items():
            event.setdefault(name, summarize(value))
        self.ledger.record(event)

    def open(self, key: PlatformKey, tool: Tool | dict[str, Any], quote_usd: float) -> Bill:
        """Reserve ``quote_usd`` for a call; settle or :meth:`release` the returned bill when it ends.

        Raises :class:`~rsigym_env.errors.InsufficientBudget` (audited) if the worst case does not fit.
        """
        event = {"tool": tool_label(tool), "args": audit_args(tool), "decision": "allowed", "quote_usd": quote_usd}
        # the ledger logs a refusal with decision "refused" and the error's code in place of "allowed"
        reservation = self.ledger.reserve(key.id, quote_usd, audit=event, label=event["tool"])
        return Bill(self, key, reservation, event)

    @contextmanager
    def charge(self, key: PlatformKey, tool: Tool | dict[str, Any], quote_usd: float) -> Iterator[Bill]:
        """:meth:`open` a bill around a synchronous call; on an exception, or if left unsettled, release it."""
        bill = self.open(key, tool, quote_usd)
        try:
            yield bill
        except BaseException as exc:
            self.release(bill, type(exc).__name__)
            raise
        self.release(bill, "unsettled")

    def release(self, bill: Bill, reason: str) -> None:
        """Release an open bill without charging (a cancelled or failed job); ``reason`` says why
        (``"cancelled"``, ``"job_failed"``, ``"start_failed"``, an exception's class name, ...).

        What its sub-keys spent cannot be given back: a bill funding sub-keys is settled at that."""
        if bill.charged_usd is None:
            bill._close_subkeys()
            if bill.subkeys_spent_usd > 0:
                bill.charged_usd = self.ledger.settle(bill.reservation, bill.subkeys_spent_usd,
                                                      audit={**bill._event, "reason": reason})
                return
            self.ledger.release(bill.reservation, audit={**bill._event, "reason": reason})
            bill.charged_usd = 0.0
