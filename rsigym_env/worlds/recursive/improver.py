"""The scripted improver: a researcher that improves a researcher spec in the recursive world.

:class:`ScriptedImprover` is a coordinate search over the target's numeric parameters
(``data_fraction``, ``k``, ``probe_examples``, ``max_examples``, ``submit_probability`` of the scripted
researcher; :data:`SEARCH`), one dev evaluation per proposal, keeping a change only when the dev index
rises; it submits the best version. A ``scripted`` spec acts as this improver when its harness is a
researcher spec (its ``improve_*`` parameters configure it; :class:`rsigym_env.agents.ScriptedAgent`)
and as the scripted researcher otherwise, so the same spec can be both the target and, in the next
round, the improver.

It is a researcher that only speaks the tool protocol: it imports nothing of the researcher layer
(the layering rule of :mod:`rsigym_env.worlds.recursive`); :func:`rsigym_env.agents.build_researcher`
builds it for the ``scripted`` kind.

>>> _neighbour("k", 3, up=True, step=1.5), _neighbour("data_fraction", 0.4, up=False, step=2.0)
(4, 0.2)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any, Generator

import tomli_w

from ...episode import PlanResearcher


@dataclass
class ImproverArgs:
    dev_k: int = 1               # seeds per dev task in each evaluation
    max_evaluations: int = 12    # dev evaluations per episode (the first measures the target as it is)
    min_gain: float = 0.0        # keep a change only if the dev index rises by more than this
    step: float = 1.5            # multiplicative step of float parameters
    passes: int = 2              # coordinate passes over the parameters


# parameter -> (kind, low, high): how the improver moves it ("mul": x*step or x/step, "add": x±1, "dbl": x*2 or x//2)
SEARCH: dict[str, tuple[str, float, float]] = {
    "data_fraction": ("mul", 0.05, 0.95),
    "k": ("add", 1, 8),
    "probe_examples": ("dbl", 2, 200),
    "max_examples": ("dbl", 500, 200_000),
    "submit_probability": ("mul", 0.005, 0.5),
}


def _neighbour(name: str, value: Any, up: bool, step: float) -> Any:
    how, lo, hi = SEARCH[name]
    if how == "mul":
        new = round(min(hi, max(lo, value * step if up else value / step)), 4)
    elif how == "add":
        new = int(min(hi, max(lo, value + (1 if up else -1))))
    else:
        new = int(min(hi, max(lo, value * 2 if up else value // 2)))
    return new


class ScriptedImprover(PlanResearcher):
    """Coordinate search over the target spec's parameters, measured on dev (see the module docstring).

    >>> ScriptedImprover(ImproverArgs(max_evaluations=3)).args.max_evaluations
    3
    """

    name = "scripted-improver"

    def __init__(self, args: ImproverArgs | None = None):
        self.args = args or ImproverArgs()
        self._plan: Generator[dict[str, Any], tuple[dict, dict], None] | None = None
        self.events: dict[str, dict[str, Any]] = {}
        self._first: dict[str, Any] | None = None
        self.log: list[dict[str, Any]] = []

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        self.log = []
        self.start(self.plan())

    def plan(self) -> Generator[dict[str, Any], tuple[dict, dict], None]:
        obs, info = yield {"tool": "read", "args": {"ref": "harness:latest/params.toml"}}
        text = obs["log"].split("\n", 1)[-1] if info.get("ok") else ""
        try:
            params = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            params = {}
        evaluations = [0]

        def evaluate(version: str) -> Generator[dict[str, Any], tuple[dict, dict], float | None]:
            if evaluations[0] >= self.args.max_evaluations:
                return None
            evaluations[0] += 1
            _, info = yield {"tool": "evaluate", "args": {"checkpoint": "base", "harness": version, "k": self.args.dev_k}}
            if not info.get("ok"):
                evaluations[0] = self.args.max_evaluations  # out of money (or refused): stop searching
                return None
            job = info["result"]["job"]
            while job not in self.events:
                _, info = yield {"tool": "wait", "args": {"job": job}}
                if not info.get("ok") and job not in self.events:
                    return None
            event = self.events[job]
            return float(event["score"]) if event.get("ok") else None

        best_version = "initial"
        best = yield from evaluate(best_version)
        if best is None:
            yield {"tool": "submit", "args": {}}
            return
        self.log.append({"params": dict(params), "dev": best})
        names = [n for n in SEARCH if n in params and isinstance(params[n], (int, float)) and not isinstance(params[n], bool)]
        for _pass in range(self.args.passes):
            moved = False
            for name in names:
                for up in (True, False):
                    while True:
                        value = _neighbour(name, params[name], up, self.args.step)
                        if value == params[name]:
                            break
                        trial = dict(params, **{name: value})
                        _, info = yield {"tool": "edit_harness", "args": {
                            "path": "params.toml", "content": tomli_w.dumps(trial), "base_version": best_version}}
                        if not info.get("ok"):
                            break
                        version = info["result"]["version"]
                        score = yield from evaluate(version)
                        if score is None:
                            break
                        self.log.append({"params": trial, "dev": score})
                        if score > best + self.args.min_gain:
                            best, best_version, params, moved = score, version, trial, True
                        else:
                            break
                    if evaluations[0] >= self.args.max_evaluations:
                        break
                if evaluations[0] >= self.args.max_evaluations:
                    break
            if not moved or evaluations[0] >= self.args.max_evaluations:
                break
        yield {"tool": "submit", "args": {"checkpoint": "base", "harness": best_version}}
