"""Shared pieces of the seed program (standard library only): a researcher written as one generator,
and the tool-call helpers every plan needs (wait for a job, run a dataset call, evaluate).

Observations and ``info`` arrive as JSON: arrays are lists (``observation["budget_left_usd"]`` is
``[123.0]``), so read numbers with :func:`scalar`.

>>> class Once(PlanResearcher):
...     name = "once"
...     def reset(self, observation, info, seed=None):
...         self.start(self.plan())
...     def plan(self):
...         obs, info = yield {"tool": "read", "args": {"ref": "harness:latest/harness.toml"}}
>>> r = Once(); r.reset({}, {}); r.act({}, {})["tool"], r.act({}, {"events": [{"job": "job-1"}]})["tool"]
('read', 'submit')
"""

from __future__ import annotations

import re
from typing import Any, Generator

Action = dict[str, Any]
Step = tuple[dict[str, Any], dict[str, Any]]
Plan = Generator[Action, Step, None]

SUBMIT_DEFAULT: Action = {"tool": "submit", "args": {}}
SPEC_HARNESS = re.compile(r"^Harness h-\w+: files .*\bspec\.json\b", re.M)
"""The status line of a harness that is a researcher spec (the recursive world): then improve, do not research."""


def scalar(value: Any, default: float = 0.0) -> float:
    """A number from an observation field: ``[123.0]`` -> 123.0, ``5`` -> 5.0, missing -> ``default``."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if isinstance(value, bool) or value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def is_spec_harness(observation: dict[str, Any]) -> bool:
    """Whether the observation's log shows a harness that is a researcher spec (``spec.json``)."""
    return SPEC_HARNESS.search(str(observation.get("log", ""))) is not None


class PlanResearcher:
    """A researcher written as one generator: it yields actions and receives each step's
    ``(observation, info)``. Finished jobs' events are kept in ``events`` by job id; once the plan
    ends (or if it yields nothing), every further action is ``submit``.

    The same protocol as ``rsigym_env.episode.PlanResearcher``, without importing it.
    """

    name = "plan"

    def start(self, plan: Plan) -> None:
        """Begin a new episode with ``plan`` (its first action is computed now)."""
        self.events: dict[str, dict[str, Any]] = {}
        self._plan: Plan | None = plan
        try:
            self._first: Action | None = next(plan)
        except StopIteration:
            self._plan, self._first = None, None

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        """The next action; ``info["events"]`` are recorded first."""
        for event in info.get("events", []) or []:
            self.events[event["job"]] = event
        if self._first is not None:
            action, self._first = self._first, None
            return action
        if self._plan is None:
            return dict(SUBMIT_DEFAULT, args={})
        try:
            return self._plan.send((observation, info))
        except StopIteration:
            self._plan = None
            return dict(SUBMIT_DEFAULT, args={})


class ToolPlanResearcher(PlanResearcher):
    """A :class:`PlanResearcher` with the waiting and calling helpers of the scripted researcher
    (generators to ``yield from`` inside a plan)."""

    def wait_for(self, job: str) -> Generator[Action, Step, dict[str, Any] | None]:
        """Wait until ``job`` has finished; its event, or None if ``wait`` was refused first."""
        while job not in self.events:
            _, info = yield {"tool": "wait", "args": {"job": job}}
            if not info.get("ok") and job not in self.events:
                return None
        return self.events[job]

    def call(self, action: Action) -> Generator[Action, Step, dict[str, Any]]:
        """Run a dataset-making call; with ``async_jobs`` it returns a job, waited for here. The info of
        the finished call: ``ok``, ``result`` (``id``, ``n_examples``, ``stats``), ``cost_usd`` or the error."""
        _, info = yield action
        job = (info.get("result") or {}).get("job") if info.get("ok") else None
        if job is None:
            return info
        event = yield from self.wait_for(job)
        if not event or not event.get("ok"):
            return {"ok": False, "error": "job_failed", "cost_usd": (event or {}).get("cost_usd", 0.0)}
        return {"ok": True, "cost_usd": event.get("cost_usd", 0.0),
                "result": {"id": event["dataset"], "n_examples": event["n_examples"], "stats": event["stats"]}}

    def evaluate(self, checkpoint: str, harness: str, k: int) -> Generator[Action, Step, dict[str, Any] | None]:
        """Evaluate on all dev tasks (avg@k) and wait for the result event (None if it could not run)."""
        _, info = yield {"tool": "evaluate", "args": {"checkpoint": checkpoint, "harness": harness, "k": k}}
        if not info.get("ok"):
            return None
        event = yield from self.wait_for(info["result"]["job"])
        return event if event and event.get("ok") else None

    def start_evaluation(self, checkpoint: str, harness: str, k: int,
                         started: dict[tuple[str, str], str]) -> Generator[Action, Step, None]:
        """Start a dev evaluation (avg@k) without waiting: its job id goes into ``started`` (nothing if it
        was refused, e.g. while another job holds the budget; it is then evaluated later as usual)."""
        _, info = yield {"tool": "evaluate", "args": {"checkpoint": checkpoint, "harness": harness, "k": k}}
        if info.get("ok"):
            started[(checkpoint, harness)] = info["result"]["job"]
