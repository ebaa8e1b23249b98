"""Baseline researchers. Each is one readable file with a typed arguments dataclass.

>>> sorted(RESEARCHERS)
['llm', 'random', 'scripted']
>>> make_researcher("scripted").name
'scripted'
"""

from __future__ import annotations

from typing import Callable

from rsigym_env.episode import Researcher

from .llm_researcher import LLMArgs, LLMResearcher
from .random_researcher import RandomArgs, RandomResearcher
from .scripted_researcher import ScriptedArgs, ScriptedResearcher

RESEARCHERS: dict[str, Callable[[], Researcher]] = {
    "llm": LLMResearcher,
    "random": RandomResearcher,
    "scripted": ScriptedResearcher,
}


def make_researcher(name: str) -> Researcher:
    """A fresh researcher by name."""
    if name not in RESEARCHERS:
        raise ValueError(f"unknown researcher {name!r}; known: {', '.join(sorted(RESEARCHERS))}")
    return RESEARCHERS[name]()


__all__ = ["RESEARCHERS", "LLMArgs", "LLMResearcher", "RandomArgs", "RandomResearcher", "ScriptedArgs", "ScriptedResearcher", "make_researcher"]
