"""Baseline researchers. Each is one readable file with a typed arguments dataclass.

>>> sorted(RESEARCHERS)
['llm', 'random', 'rl', 'scripted']
>>> make_researcher("scripted").name
'scripted'
"""

from __future__ import annotations

from typing import Callable

from rsigym_env.episode import Researcher

from .llm_researcher import LLMArgs, LLMResearcher
from .random_researcher import RandomArgs, RandomResearcher
from .rl_researcher import RLResearcher, RLResearcherArgs
from .scripted_researcher import ScriptedArgs, ScriptedResearcher

RESEARCHERS: dict[str, Callable[[], Researcher]] = {
    "llm": LLMResearcher,
    "random": RandomResearcher,
    "rl": RLResearcher,
    "scripted": ScriptedResearcher,
}


def make_researcher(name: str) -> Researcher:
    """A fresh researcher by name."""
    if name not in RESEARCHERS:
        raise ValueError(f"unknown researcher {name!r}; known: {', '.join(sorted(RESEARCHERS))}")
    return RESEARCHERS[name]()


__all__ = ["RESEARCHERS", "LLMArgs", "LLMResearcher", "RLResearcher", "RLResearcherArgs", "RandomArgs", "RandomResearcher", "ScriptedArgs", "ScriptedResearcher", "make_researcher"]
