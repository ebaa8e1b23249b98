"""A research run as a TRL ``environment_factory`` environment (``GRPOTrainer(environment_factory=...)``).

TRL's contract (trl 1.16, read from its source): the factory is called with no argument; the class
has a ``reset(**row)`` returning ``None`` or text (appended to the prompt); every other public
function defined on the class is a tool, called as ``method(**arguments)``, its ``str`` result sent
back to the model; ``get_reward()`` scores the finished rollout. Tools are found with
``inspect.getmembers(type(env), inspect.isfunction)`` and described by their signature and
Google-style docstring (``transformers.utils.get_json_schema``).

:class:`RSIGymToolEnv` has one method per tool, named as in :func:`rsigym_env.tools.tool_schemas`,
whose signature (names, types, defaults) and ``Args:`` docstring come from the tool's pydantic model.
Each call goes through the run (validation, billing, audit); a refused call returns its error text
(``ERROR invalid_args: ...``) rather than raising. The reward is 0 until ``submit``; then the
normalized gain on the held-out split (an episode that never submits scores 0, as a truncated one).

>>> env = RSIGymToolEnv(benchmark="aime", budget_usd=50)
>>> "AIME" in env.reset(seed=0, prompt="ignored")
True
>>> print(env.evaluate(k="two").splitlines()[-1])
ERROR invalid_args: evaluate: k: Input should be a valid integer
>>> "submitted" in env.submit(), env.get_reward() == env.reward, env.done
(True, True, True)
>>> env._close()

For another scenario, bind keyword arguments: ``environment_factory=functools.partial(RSIGymToolEnv,
scenario="sim-data-aime-500")``; a dataset row may also carry ``seed`` (and the other keyword
arguments) to vary episodes.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from ..tools import TOOLS, Tool
from .backend import LocalRun
from .local_runs import LocalRunFactory


class _RowOptions(BaseModel):
    """What a dataset row may choose (other columns, such as ``prompt``, are ignored)."""

    model_config = ConfigDict(extra="ignore")
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    scenario: str | None = None
    world: str | None = None
    benchmark: str | None = None
    track: str | None = None
    budget_usd: float | None = Field(None, gt=0)
    max_steps: int | None = Field(None, ge=1)


def _docstring(cls: type[Tool]) -> str:
    """The tool's description and a Google-style ``Args:`` block from its fields' descriptions."""
    lines = [" ".join((cls.__doc__ or cls.name).split()), "", "Args:"]
    for name, field in cls.model_fields.items():
        lines.append(f"    {name}: {' '.join((field.description or name).split())}")
    lines += ["", "Returns:", "    What the researcher reads: a status line and the call's result, or ERROR <code>: <why>."]
    return "\n".join(lines)


def _tool_method(cls: type[Tool]) -> Callable[..., str]:
    """A method named ``cls.name`` whose signature and docstring are the tool model's; it calls the run."""
    fields = cls.model_fields
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name, field in fields.items():
        default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=field.annotation))
    tool_name = cls.name

    def method(self: "RSIGymToolEnv", **arguments: Any) -> str:
        return self._call(tool_name, arguments)

    method.__name__ = tool_name
    method.__qualname__ = f"RSIGymToolEnv.{tool_name}"
    method.__doc__ = _docstring(cls)
    method.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = {name: field.annotation for name, field in fields.items()} | {"return": str}
    return method


class RSIGymToolEnv:
    """One research run per rollout, its tools as methods (see the module docstring).

    Keyword arguments (all optional) choose the scenario: ``scenario``, ``world`` (default: the scenario's, sim),
    ``benchmark``, ``track``, ``budget_usd``, ``max_steps``; ``seed`` is the default reset seed.

    Attributes:
        reward: 0.0 until the episode ends, then the normalized gain (TRL reads :meth:`get_reward`).
        done: True once the episode has ended.
        last_reply: the :class:`~rsigym_env.gateway.backend.ToolReply` of the last call.
    """

    def __init__(self, *, scenario: str | None = None, world: str | None = None, benchmark: str | None = None,
                 track: str | None = None, budget_usd: float | None = None, max_steps: int | None = None,
                 seed: int | None = None):
        self._defaults = _RowOptions(seed=seed, scenario=scenario, world=world, benchmark=benchmark, track=track,
                                     budget_usd=budget_usd, max_steps=max_steps)
        self._factory: LocalRunFactory | None = None
        self._env: Any = None
        self.run: LocalRun | None = None
        self.reward = 0.0
        self.done = False
        self.last_reply: Any = None

    def reset(self, **row: Any) -> str:
        """Start a new episode; returns the briefing. ``row`` is a dataset row: ``seed`` and the scenario
        keyword arguments are read from it, every other column is ignored."""
        options = _RowOptions.model_validate({**self._defaults.model_dump(exclude_none=True),
                                              **{k: v for k, v in row.items() if v is not None}})
        factory = LocalRunFactory(scenario=options.scenario, world=options.world, benchmark=options.benchmark,
                                  track=options.track, budget_usd=options.budget_usd, max_steps=options.max_steps)
        if factory != self._factory:  # a new scenario: a new env; otherwise the env resets itself
            self._close()
            self._env, self._factory = factory.make_env(), factory
        self.run = LocalRun(self._env, seed=options.seed)
        self.reward, self.done, self.last_reply = 0.0, False, None
        return str(self.run.observation()["log"])

    def get_reward(self) -> float:
        """The rollout's reward: the normalized gain once submitted, else 0."""
        return self.reward

    def __enter__(self) -> "RSIGymToolEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        """End the run and free its world (also done by the next ``reset`` of another scenario).

        Private, as every public function of the class is a tool to TRL; ``with RSIGymToolEnv() as env:``
        closes it too."""
        if self._env is not None:
            self._env.close()
        self._env = self._factory = self.run = None

    def _call(self, tool: str, arguments: dict[str, Any]) -> str:
        if self.run is None:
            return "ERROR no_episode: call reset() first"
        reply = self.run.call(tool, arguments)
        self.last_reply = reply
        if reply.done:
            self.done = True
            if reply.reward is not None:
                self.reward = float(reply.reward)
        return reply.text


for _tool in TOOLS:
    setattr(RSIGymToolEnv, _tool.name, _tool_method(_tool))
del _tool
