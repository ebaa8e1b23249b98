"""Typed errors. A refused or malformed call becomes an observation, never an exception from `step`.

Every error has a short machine-readable ``code`` (it lands in ``info["error"]``) and a message a
person (or an LLM) can act on.

>>> err = ActionError("unknown_tool", "no tool named 'fly'")
>>> err.code, str(err)
('unknown_tool', "no tool named 'fly'")
"""

from __future__ import annotations


class ActionError(Exception):
    """A call that is refused before it costs anything.

    Codes used across the package:

    ``malformed_action``  the action is not a tool call at all (bad JSON, wrong shape)
    ``unknown_tool``      no tool has that name
    ``invalid_args``      the arguments fail the tool's schema
    ``forbidden_tool``    the run's key does not allow this tool (track)
    ``teacher_not_allowed``  the teacher model is not on the key's allowlist
    ``field_locked`` / ``field_not_allowed``  a training field the scenario locks or does not expose
    ``insufficient_budget``  the worst-case cost does not fit the balance
    ``unknown_ref``       a dataset, checkpoint, job, harness version or file that does not exist
    ``no_running_jobs``   `wait` with nothing to wait for
    ``harness_patch_failed``  an edit whose `old` text is not in the file exactly once
    ``not_supported``     the tool exists but this world cannot do that variant
    ``episode_over``      a step after the episode ended
    ``service_error``     the service failed; the reservation was released
    ``script_failed``     a script ran and failed (billed for what it used: :class:`WorkFailed`)
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class InsufficientBudget(ActionError):
    """The worst-case cost of a call does not fit the key's available balance (both in dollars)."""

    def __init__(self, message: str, requested_usd: float | None = None, available_usd: float | None = None):
        super().__init__("insufficient_budget", message)
        self.requested_usd = requested_usd
        self.available_usd = available_usd


class ServiceError(ActionError):
    """A service failed while running a call (its reservation is released)."""

    def __init__(self, message: str):
        super().__init__("service_error", message)


class WorkFailed(ActionError):
    """Work that ran and failed: the call is billed for what it used (``cost_usd``, ``seconds``) and
    the error is reported like a refusal (``info["error"]`` is ``code``; ``info["cost_usd"]`` what it cost).

    >>> err = WorkFailed("script_failed", "exit 1", cost_usd=0.002, seconds=3.0)
    >>> err.code, err.cost_usd
    ('script_failed', 0.002)
    """

    def __init__(self, code: str, message: str, *, cost_usd: float, seconds: float = 0.0):
        super().__init__(code, message)
        self.cost_usd = max(0.0, float(cost_usd))
        self.seconds = max(0.0, float(seconds))
