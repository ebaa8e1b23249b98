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

import functools
import time
from typing import Callable, TypeVar

import tenacity

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


_Types = tuple[type[BaseException], ...]


@functools.cache
def _sdk_errors() -> dict[str, _Types]:
    """The providers' typed errors by kind, from the SDKs that are installed (the remote world's
    ``services`` extra: openai and tinker (both Stainless clients), httpx, e2b).

    ``unreachable_first`` is checked before ``timeout``: e2b's ``SandboxUnreachableException`` is a
    subclass of its ``TimeoutException``; ``other`` holds errors never retried, whatever their base
    (a sandbox that is no longer running)."""
    kinds: dict[str, list[type[BaseException]]] = {
        "other": [], "unreachable_first": [], "timeout": [TimeoutError], "rate_limited": [],
        "unreachable": [ConnectionError], "server": []}
    for sdk in ("openai", "tinker"):
        try:
            module = __import__(sdk)
        except ImportError:
            continue
        kinds["timeout"].append(module.APITimeoutError)
        kinds["rate_limited"].append(module.RateLimitError)
        kinds["unreachable"].append(module.APIConnectionError)  # after timeout: APITimeoutError is one
        kinds["server"].append(module.InternalServerError)
    try:
        import httpx

        kinds["timeout"].append(httpx.TimeoutException)
        kinds["unreachable"].append(httpx.ConnectError)
    except ImportError:
        pass
    try:
        from e2b import exceptions as e2b

        kinds["other"].append(e2b.SandboxNotRunningException)
        kinds["unreachable_first"].append(e2b.SandboxUnreachableException)
        kinds["timeout"].append(e2b.TimeoutException)
        kinds["rate_limited"].append(e2b.RateLimitException)
        kinds["server"].append(e2b.ServiceBusyException)
    except ImportError:
        pass
    return {kind: tuple(types) for kind, types in kinds.items()}


def _kind(exc: BaseException) -> str:
    """'timeout' | 'unreachable' | 'rate_limited' | 'server' | 'client' | 'other', by the SDKs' error
    types and else the HTTP status the exception carries (429: rate limited, 5xx: server, 4xx: client)."""
    errors = _sdk_errors()
    if isinstance(exc, errors["other"]):
        return "other"
    if isinstance(exc, errors["unreachable_first"]):
        return "unreachable"
    if isinstance(exc, errors["timeout"]):
        return "timeout"
    status = _status(exc)
    if status == 429 or isinstance(exc, errors["rate_limited"]):
        return "rate_limited"
    if isinstance(exc, errors["unreachable"]):
        return "unreachable"
    if status is not None:
        return "server" if status >= 500 else "client"
    if isinstance(exc, errors["server"]):
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
    """``fn()``, retried where safe (see :func:`retryable`) up to ``attempts`` times in all, waiting
    ``backoff_s``, then twice as long each time; its last failure translated by :func:`translate`
    (an ``ActionError`` is raised as it is, never retried)."""
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_exponential(multiplier=backoff_s, exp_base=2),
        retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, Exception) and not isinstance(exc, ActionError)
                                          and retryable(exc, idempotent)),
        sleep=sleep, reraise=True)
    try:
        return retrying(fn)
    except ActionError:
        raise
    except Exception as exc:  # noqa: BLE001 - every provider failure becomes a typed error
        raise translate(exc, what) from exc


__all__ = ["CODES", "MissingCredentials", "call_with_retries", "retryable", "translate"]
