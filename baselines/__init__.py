"""Baseline researchers. Each is one readable file with a typed arguments dataclass.

The modules load on first use (PEP 562), so ``python -m rsigym_env.baselines.rl_researcher`` runs its
module once, without runpy's "found in sys.modules" warning.

>>> sorted(RESEARCHERS)
['llm', 'random', 'rl', 'scripted']
>>> make_researcher("scripted").name
'scripted'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from rsigym_env.episode import Researcher

    from .llm_researcher import LLMArgs, LLMResearcher
    from .random_researcher import RandomArgs, RandomResearcher
    from .rl_researcher import RLResearcher, RLResearcherArgs
    from .scripted_researcher import ScriptedArgs, ScriptedResearcher

_MODULE_OF = {
    "LLMArgs": "llm_researcher", "LLMResearcher": "llm_researcher",
    "RandomArgs": "random_researcher", "RandomResearcher": "random_researcher",
    "RLResearcher": "rl_researcher", "RLResearcherArgs": "rl_researcher",
    "ScriptedArgs": "scripted_researcher", "ScriptedResearcher": "scripted_researcher",
}


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _lazy(class_name: str) -> Callable[[], Researcher]:
    def make() -> Researcher:
        return __getattr__(class_name)()
    make.__name__ = class_name
    return make


RESEARCHERS: dict[str, Callable[[], Researcher]] = {
    "llm": _lazy("LLMResearcher"),
    "random": _lazy("RandomResearcher"),
    "rl": _lazy("RLResearcher"),
    "scripted": _lazy("ScriptedResearcher"),
}


def make_researcher(name: str) -> Researcher:
    """A fresh researcher by name."""
    if name not in RESEARCHERS:
        raise ValueError(f"unknown researcher {name!r}; known: {', '.join(sorted(RESEARCHERS))}")
    return RESEARCHERS[name]()


__all__ = ["RESEARCHERS", "LLMArgs", "LLMResearcher", "RLResearcher", "RLResearcherArgs", "RandomArgs", "RandomResearcher", "ScriptedArgs", "ScriptedResearcher", "make_researcher"]
