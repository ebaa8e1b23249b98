"""Policy-side conveniences around the thin env: each one a Gymnasium wrapper.

* :class:`ToolCallWrapper`: text function calls in, the env's log text out (LLM policies).
* :class:`FlatObservation`: a float32 ``Box`` observation (standard RL libraries).
* :class:`DevScoreShaping`: potential-based shaping with the best dev score so far.
* :class:`RecordEpisode`: each episode's trajectory as JSONL.
* :class:`DiscreteMenu`: ``Discrete`` macro-actions with an action mask (RL policies).

>>> import gymnasium as gym, rsigym_env
>>> from rsigym_env.wrappers import DevScoreShaping, FlatObservation
>>> env = DevScoreShaping(FlatObservation(gym.make("RSIGym/Data-v0", benchmark="aime", budget_usd=100)))
>>> env.reset(seed=0)[0].shape == (len(FlatObservation.FEATURES),)
True
"""

from __future__ import annotations

from .flatten import FlatObservation
from .menu import DiscreteMenu, MenuAdapter
from .recorder import RecordEpisode, load_actions, read_episode, to_jsonable
from .shaping import DevScoreShaping
from .tool_calls import ToolCallError, ToolCallWrapper, parse_tool_call

__all__ = [
    "DevScoreShaping",
    "DiscreteMenu",
    "MenuAdapter",
    "FlatObservation",
    "RecordEpisode",
    "ToolCallError",
    "ToolCallWrapper",
    "load_actions",
    "parse_tool_call",
    "read_episode",
    "to_jsonable",
]
