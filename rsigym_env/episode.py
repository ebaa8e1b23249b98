"""Run one episode of a researcher in an env, and the researcher protocol that makes that possible.

>>> import gymnasium as gym, rsigym_env
>>> from rsigym_env.baselines import make_researcher
>>> env = gym.make("RSIGym/Harness-v0", benchmark="aime", budget_usd=50)
>>> result = run_episode(env, make_researcher("scripted"), seed=0)
>>> result.terminated, result.info["submitted"]["by"]
(True, 'agent')
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Generator, Protocol, runtime_checkable

import gymnasium as gym


@runtime_checkable
class Researcher(Protocol):
    """A policy over research actions. ``act`` returns any action form ``step`` accepts."""

    name: str

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None: ...

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any: ...


Action = Any
Plan = Generator[Action, "tuple[dict[str, Any], dict[str, Any]]", None]


class PlanResearcher:
    """A researcher written as one generator: it yields actions and receives each step's
    ``(observation, info)``. Finished jobs' events are kept in ``events`` by job id; once the plan
    ends, every further action is ``submit``.

    >>> class Once(PlanResearcher):
    ...     name = "once"
    ...     def reset(self, observation, info, seed=None):
    ...         self.start(self.plan())
    ...     def plan(self):
    ...         obs, info = yield {"tool": "read", "args": {"ref": "harness:latest/harness.toml"}}
    >>> r = Once(); r.reset({}, {}); r.act({}, {})["tool"], r.act({}, {"events": [{"job": "job-1"}]})["tool"], list(r.events)
    ('read', 'submit', ['job-1'])
    """

    name = "plan"

    def start(self, plan: Plan) -> None:
        """Begin a new episode with ``plan`` (its first action is computed now)."""
        self.events: dict[str, dict[str, Any]] = {}
        self._plan: Plan | None = plan
        self._first: Action | None = next(plan)

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        for event in info.get("events", []):
            self.events[event["job"]] = event
        if self._first is not None:
            action, self._first = self._first, None
            return action
        assert self._plan is not None, "reset() first"
        try:
            return self._plan.send((observation, info))
        except StopIteration:
            return {"tool": "submit", "args": {}}


@dataclass
class EpisodeResult:
    """The end of one episode: return, how it ended, and the final ``info`` (scores, spend, ...)."""

    researcher: str
    scenario: str
    seed: int | None
    reward: float
    steps: int
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


StepCallback = Callable[[int, Any, dict[str, Any], dict[str, Any]], None]


def run_episode(
    env: gym.Env, researcher: Researcher, seed: int | None = None, on_step: StepCallback | None = None,
) -> EpisodeResult:
    """Reset ``env`` with ``seed`` and let ``researcher`` act until the episode ends.

    ``on_step(step, action, observation, info)`` is called after every step (for progress bars and
    recorders).
    """
    obs, info = env.reset(seed=seed)
    researcher.reset(obs, info, seed=seed)
    total, steps = 0.0, 0
    terminated = truncated = False
    while not (terminated or truncated):
        action = researcher.act(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        total += float(reward)
        steps += 1
        if on_step is not None:
            on_step(steps, action, obs, info)
    scenario = env.unwrapped.scenario.name if hasattr(env.unwrapped, "scenario") else ""
    return EpisodeResult(researcher.name, scenario, seed, total, steps, terminated, truncated, info)
