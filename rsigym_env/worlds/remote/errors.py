"""Typed errors of the remote world: provider failures become :class:`~rsigym_env.errors.ActionError` codes.

The run turns an ``ActionError`` raised by a service into an observation (``info["error"]`` is the
code) and releases the call's reservation, so a failed call costs nothing. Codes:

``missing_credentials``  an environment variable the world needs is not set (raised before anything runs)
``service_unreachable``  the endpoint could not be reached (DNS, connection refused, TLS)
``rate_limited``         the provider answered 429 (after the retries that were safe)
``service_timeout``      the provider did not answer in time
``provider_error``       the provider refused or failed the request (4xx other than 429, or 5xx)

:func:`call_with_retries` retries what is safe to retry (a request that never reached the
provider, a 429, a 5xx on an idempotent call) with exponential backoff, then translates.

>>> translate(TimeoutError("read timed out")).code
'service_timeout'
>>> calls = []
>>> def flaky():
...     calls.append(1)
...     if len(calls) < 3:
...         raise ConnectionError("refused")
...     return "ok"
>>> call_with_retries(flaky, what="demo", attempts=3, backoff_s=0.0), len(calls)
('ok', 3)
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

from ...errors import ActionError

T = TypeVar("T")

CODES = ("missing_credentials", "service_unreachable", "rate_limited", "service_timeout", "provider_error")


class MissingCredentials(ActionError):
    """One or more environment variables the remote world needs are unset."""

    def __init__(self, variables: list[str], why: str = ""):
        self.variables = list(variables)
        super().__init__("missing_credentials", f"set {', '.join(self.variables)}{f' ({why})' if why else ''}; "
                                                "nothing was spent")


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def _kind(exc: BaseException) -> str:
    """'timeout' | 'unreachable' | 'rate_limited' | 'server' | 'client' | 'other'."""
    name = type(exc).__name__
    names = {c.__name__ for c in type(exc).__mro__}
    if isinstance(exc, TimeoutError) or "APITimeoutError" in names or name in ("TimeoutException", "ReadTimeout",
                                                                                  "ConnectTimeout"):
        return "timeout"
    status = _status(exc)
    if status == 429 or "RateLimitError" in names or "RateLimitException" in names:
        return "rate_limited"
    if "APIConnectionError" in names or isinstance(exc, ConnectionError) or name in ("ConnectError",
                                                                                      "SandboxUnreachableException"):
        return "unreachable"
    if status is not None:
        return "server" if status >= 500 else "client"
    if "InternalServerError" in names or "ServiceBusyException" in names:
        return "server"
    return "other"


def translate(exc: BaseException, what: str = "the provider") -> ActionError:
    """The typed error for a provider exception (an ``ActionError`` is returned unchanged)."""
    if isinstance(exc, ActionError):
        return exc
    kind = _kind(exc)
    detail = f"{type(exc).__name__}: {str(exc)[:300]}"
    if kind == "timeout":
        return ActionError("service_timeout", f"{what} did not answer in time ({detail}); nothing was charged")
    if kind == "rate_limited":
        return ActionError("rate_limited", f"{what} is rate limiting this key ({detail}); try again later; "
                                           "nothing was charged")
    if kind == "unreachable":
        return ActionError("service_unreachable", f"cannot reach {what} ({detail}); nothing was charged")
    status = _status(exc)
    where = f" (HTTP {status})" if status else ""
    return ActionError("provider_error", f"{what} failed the request{where}: {detail}; nothing was charged")


def retryable(exc: BaseException, idempotent: bool = True) -> bool:
    """Safe to try again: never reached the provider, rate limited, or a server error on an idempotent call."""
    kind = _kind(exc)
    return kind in ("unreachable", "rate_limited") or (idempotent and kind in ("server", "timeout"))


def call_with_retries(fn: Callable[[], T], *, what: str, attempts: int = 3, backoff_s: float = 1.0,
                      idempotent: bool = True, sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, retried where safe (see :func:`retryable`), its last failure translated by :func:`translate`."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except ActionError:
            raise
        except Exception as exc:  # noqa: BLE001 - every provider failure becomes a typed error
            if attempt < attempts and retryable(exc, idempotent):
                sleep(backoff_s * 2 ** (attempt - 1))
                continue
            raise translate(exc, what) from exc
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["CODES", "MissingCredentials", "call_with_retries", "retryable", "translate"]
