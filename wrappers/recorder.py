"""``RecordEpisode``: write each episode's trajectory as JSONL, one file per episode.

Lines, each flushed as it is written:

* ``{"type": "reset", "episode", "seed", "options", "info"}``
* ``{"type": "step", "step", "action", "action_kind", "reward", "terminated", "truncated", "info", "log"}``
  (``log`` is the observation's text; an observation without one is written as ``observation``)
* ``{"type": "summary", "episode", "seed", "steps", "return", "terminated", "truncated", "ended", "end"}``

Actions are written so that :func:`load_actions` gives back actions that replay the episode:

>>> import gymnasium as gym, rsigym_env, tempfile
>>> from rsigym_env.tools import Evaluate
>>> folder = tempfile.mkdtemp()
>>> env = RecordEpisode(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=100), folder)
>>> _ = env.reset(seed=7)
>>> _ = env.step(Evaluate(k=1))
>>> _ = env.step('{"tool": "submit", "args": {}}')
>>> env.close()
>>> [p.name for p in env.paths]
['episode-000000-seed-7.jsonl']
>>> load_actions(env.paths[0])
[{'tool': 'evaluate', 'args': {'checkpoint': 'base', 'harness': 'latest', 'k': 1, 'n_tasks': None}}, '{"tool": "submit", "args": {}}']
>>> [line["type"] for line in read_episode(env.paths[0])]
['reset', 'step', 'step', 'summary']
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path
from typing import IO, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rsigym_env.tools import Tool

END_KEYS = ("initial_score", "official_score", "normalized_gain", "best_dev_score", "submitted_dev_score",
            "spend_usd", "budget_usd", "end_reason", "steps", "refusals")


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: pydantic models via ``model_dump``, numpy via ``tolist``, tuples as lists.

    Non-finite floats become strings (``"nan"``, ``"inf"``) so every line is strict JSON.

    >>> to_jsonable({"a": np.arange(3), "b": (np.float32(0.5), float("inf"))})
    {'a': [0, 1, 2], 'b': [0.5, 'inf']}
    """
    if isinstance(value, Tool):
        return {"tool": value.name, "args": to_jsonable(value.model_dump(mode="json"))}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (np.ndarray, np.generic)):
        return to_jsonable(value.tolist())
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, (Path, enum.Enum)):
        return str(value.value if isinstance(value, enum.Enum) else value)
    if hasattr(value, "model_dump"):
        return to_jsonable(value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    return repr(value)


# ------------------------------------------------------------------ space samples <-> JSON


def encode_sample(space: spaces.Space, sample: Any) -> Any:
    """A sample of ``space`` (Dict, Tuple, OneOf, Box, Discrete, MultiBinary, Text) as JSON data."""
    if isinstance(space, spaces.OneOf):
        index, value = sample
        return [int(index), encode_sample(space.spaces[int(index)], value)]
    if isinstance(space, spaces.Dict):
        return {k: encode_sample(space[k], v) for k, v in sample.items()}
    if isinstance(space, spaces.Tuple):
        return [encode_sample(s, v) for s, v in zip(space.spaces, sample, strict=True)]
    return to_jsonable(sample)


def decode_sample(space: spaces.Space, data: Any) -> Any:
    """Inverse of :func:`encode_sample`: JSON data back to a sample of ``space`` (same types, same dtypes)."""
    if isinstance(space, spaces.OneOf):
        index, value = data
        return int(index), decode_sample(space.spaces[int(index)], value)
    if isinstance(space, spaces.Dict):
        return {k: decode_sample(space[k], v) for k, v in data.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(decode_sample(s, v) for s, v in zip(space.spaces, data, strict=True))
    if isinstance(space, (spaces.Box, spaces.MultiBinary, spaces.MultiDiscrete)):
        return np.asarray(data, dtype=space.dtype)
    if isinstance(space, spaces.Discrete):
        return np.int64(data)
    return data


def _is_space_sample(space: spaces.Space, action: Any) -> bool:
    return (isinstance(space, spaces.OneOf) and isinstance(action, tuple) and len(action) == 2
            and isinstance(action[0], (int, np.integer)) and 0 <= int(action[0]) < len(space.spaces))


# ------------------------------------------------------------------ reading


def read_episode(path: str | Path) -> list[dict[str, Any]]:
    """All lines of one recorded episode."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load_actions(path: str | Path, action_space: spaces.Space | None = None) -> list[Any]:
    """The actions of a recorded episode, in forms ``step`` takes again (space samples need ``action_space``;
    by default the env's :func:`rsigym_env.action_space`)."""
    if action_space is None:
        from rsigym_env.tools import action_space as default_space
        action_space = default_space()
    actions = []
    for line in read_episode(path):
        if line["type"] != "step":
            continue
        if line.get("action_kind") == "space_sample":
            actions.append(decode_sample(action_space, line["action"]))
        else:
            actions.append(line["action"])
    return actions


# ------------------------------------------------------------------ the wrapper


class RecordEpisode(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Writes every episode to ``folder/<prefix>-<episode:06d>-seed-<seed>.jsonl`` (see the module docstring).

    The file of an episode is closed when the episode ends, on the next ``reset`` and on ``close()``;
    an episode cut short gets a summary with ``"ended": false``. File contents depend only on the seed
    and the actions. If a file name is taken (several envs writing to one folder), ``-1``, ``-2``, ...
    is appended. ``paths`` lists the files written.

    Args:
        env: any env (an RSIGym env, possibly wrapped).
        folder: the directory to write into (created if missing).
        name_prefix: the start of every file name.
    """

    def __init__(self, env: gym.Env, folder: str | Path, name_prefix: str = "episode"):
        gym.utils.RecordConstructorArgs.__init__(self, folder=str(folder), name_prefix=name_prefix)
        gym.Wrapper.__init__(self, env)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name_prefix = name_prefix
        self.paths: list[Path] = []
        self.episode = -1
        self._file: IO[str] | None = None
        self._seed: int | None = None
        self._steps = 0
        self._return = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self._finish(ended=False)
        obs, info = self.env.reset(seed=seed, options=options)
        self.episode += 1
        self._seed, self._steps, self._return = seed, 0, 0.0
        self._file = self._open(f"{self.name_prefix}-{self.episode:06d}-seed-{'none' if seed is None else seed}")
        self._write({"type": "reset", "episode": self.episode, "seed": seed, "options": options, "info": info})
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self._file is not None:
            self._steps += 1
            self._return += float(reward)
            line: dict[str, Any] = {"type": "step", "step": self._steps, **self._action(action),
                                    "reward": float(reward), "terminated": bool(terminated),
                                    "truncated": bool(truncated), "info": info}
            if isinstance(obs, dict) and "log" in obs:
                line["log"] = obs["log"]
            elif isinstance(obs, str):
                line["log"] = obs
            else:
                line["observation"] = obs
            self._write(line)
            if terminated or truncated:
                self._finish(ended=True, terminated=bool(terminated), truncated=bool(truncated), info=info)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._finish(ended=False)
        super().close()

    # ------------------------------------------------------------------ helpers

    def _action(self, action: Any) -> dict[str, Any]:
        if _is_space_sample(self.action_space, action):
            return {"action": encode_sample(self.action_space, action), "action_kind": "space_sample"}
        kind = ("tool" if isinstance(action, Tool) else "text" if isinstance(action, (str, bytes))
                else "dict" if isinstance(action, dict) else type(action).__name__)
        return {"action": to_jsonable(action), "action_kind": kind}

    def _open(self, stem: str) -> IO[str]:
        for n in range(10_000):
            path = self.folder / (f"{stem}.jsonl" if n == 0 else f"{stem}-{n}.jsonl")
            try:
                fh = open(path, "x", encoding="utf-8")  # "x": atomic, so parallel writers never share a file
            except FileExistsError:
                continue
            self.paths.append(path)
            return fh
        raise FileExistsError(f"no free file name for {stem!r} in {self.folder}")

    def _write(self, record: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(to_jsonable(record), allow_nan=False) + "\n")
        self._file.flush()

    def _finish(self, ended: bool, terminated: bool = False, truncated: bool = False,
                info: dict[str, Any] | None = None) -> None:
        if self._file is None:
            return
        end = {k: info[k] for k in END_KEYS if info is not None and k in info}
        self._write({"type": "summary", "episode": self.episode, "seed": self._seed, "steps": self._steps,
                     "return": self._return, "terminated": terminated, "truncated": truncated,
                     "ended": ended, "end": end})
        self._file.close()
        self._file = None
