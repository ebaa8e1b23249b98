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
from ..tools import Tool
from .ledger import Balance, Ledger, Reservation
from .permissions import authorize

AUDIT_TEXT_MAX = 256  # longer argument strings are audited as their length and hash


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
    """A tool's arguments for the audit log; long strings become ``<N chars sha256:...>``."""
    raw = tool.model_dump() if isinstance(tool, Tool) else tool
    if not isinstance(raw, dict):
        return {"raw": _short(repr(raw))}
    return {str(k): _short(v) if isinstance(v, str) else v for k, v in raw.items()}


def _short(text: str) -> str:
    if len(text) <= AUDIT_TEXT_MAX:
        return text
    return f"<{len(text)} chars sha256:{hashlib.sha256(text.encode()).hexdigest()[:16]}>"


def tool_label(tool: Tool | Any) -> str:
    if isinstance(tool, Tool):
        return tool.name
    if isinstance(tool, dict) and isinstance(tool.get("tool"), str):
        return tool["tool"][:64]
    return "?"


class Bill:
    """The open reservation of one paid call; settle it with the actual cost."""

    def __init__(self, platform: "Platform", key: PlatformKey, reservation: Reservation, event: dict[str, Any]):
        self._platform, self._key, self.reservation, self._event = platform, key, reservation, event
        self.charged_usd: float | None = None

    def settle(self, usd: float) -> float:
        """Charge ``usd`` (clamped to the reservation); the rest is released. Returns the charge."""
        self.charged_usd = self._platform.ledger.settle(self.reservation, usd, audit=dict(self._event))
        return self.charged_usd


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

    def mint_subkey(self, parent: PlatformKey, budget_usd: float, scenario: Scenario | None = None) -> PlatformKey:
        """A child key carrying ``budget_usd`` of the parent's budget (same or narrower scenario)."""
        secret = "rsk-" + secrets.token_hex(16)
        child = PlatformKey(secret, PlatformKey.key_id(secret), scenario or parent.scenario)
        self.ledger.mint_subkey(parent.id, child.id, budget_usd, audit={"tool": "mint_subkey", "decision": "allowed"})
        return child

    def balance(self, key: PlatformKey) -> Balance:
        return self.ledger.balance(key.id)

    def authorize(self, key: PlatformKey, tool: Tool) -> Tool:
        """The tool with locked fields applied, or :class:`ActionError` (not yet audited)."""
        return authorize(key.scenario, tool)

    def refuse(self, key: PlatformKey, action: Any, error: ActionError) -> None:
        """Audit a refused or malformed call; it costs nothing."""
        self.ledger.record({
            "key": key.id, "tool": tool_label(action), "args": audit_args(action), "decision": "refused",
            "code": error.code, "message": _short(error.message),
        })

    def record(self, key: PlatformKey, tool: Tool, **extra: Any) -> None:
        """Audit a free call that ran."""
        self.ledger.record({"key": key.id, "tool": tool.name, "args": audit_args(tool), "decision": "allowed", **extra})

    def open(self, key: PlatformKey, tool: Tool | dict[str, Any], quote_usd: float) -> Bill:
        """Reserve ``quote_usd`` for a call; settle or :meth:`release` the returned bill when it ends.

        Raises :class:`~rsigym_env.errors.InsufficientBudget` (audited) if the worst case does not fit.
        """
        event = {"tool": tool_label(tool), "args": audit_args(tool), "decision": "allowed", "quote_usd": quote_usd}
        reservation = self.ledger.reserve(
            key.id, quote_usd, audit={**event, "decision": "refused", "code": "insufficient_budget"}
        )
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
        """Release an open bill without charging (a cancelled or failed job)."""
        if bill.charged_usd is None:
            self.ledger.release(bill.reservation, audit={**bill._event, "code": reason})
            bill.charged_usd = 0.0

