"""``ResearchVectorEnv``: N research episodes behind one Gymnasium 1.x ``VectorEnv``.

What ``gym.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point")`` builds for the three
ids (and what ``make_vec`` builds by default, without a mode), through :func:`make_vector_env`; with
``menu=True`` on the sim world that builds the array env instead
(:class:`~rsigym_env.menu_vector.MenuArrayEnv`), and this one with ``array=False``. Every sub-env is a
:class:`~rsigym_env.env.ResearchEnv`, the scalar env itself, so the dynamics are the scalar env's by
construction: for the same seeds and actions every row of the batch equals the scalar env's
observation, reward, termination and info (``tests/test_vector_sim.py`` checks it on every track and
benchmark). What the vector env adds:

* **one platform**: all sub-envs bill one :class:`~rsigym_env.platform.core.Platform` (one ledger and
  one audit chain; ``ledger_path`` keeps them in a file that ``rsigym audit verify`` accepts), each
  episode on a key of its own. Money works as in the scalar env: reserved before a call runs, never
  negative, a refused call costs nothing and is counted. The per-env money is kept in arrays:
  :attr:`budget_left_usd`, :attr:`spent_usd`, :attr:`refusals` and :attr:`episodes`.
* **batched observations**: the numeric entries are ``(N, ...)`` arrays; ``log`` is a tuple of N
  strings, or absent with ``include_log=False`` (nothing is rendered then).
* **a menu**: ``menu=True, array=False`` steps :class:`~rsigym_env.wrappers.menu.DiscreteMenu` sub-envs: the action
  is one menu index per env (``MultiDiscrete``), the observation an ``(N, len(FEATURES))`` float32
  matrix and ``info["action_mask"]`` an ``(N, len(MENU))`` bool matrix (what the RL researcher reads).
* **autoreset**: ``AutoresetMode.NEXT_STEP`` (Gymnasium's default: a finished env is reset by the next
  ``step``, which ignores its action), ``SAME_STEP`` (``final_obs``/``final_info`` in ``info``) or
  ``DISABLED`` (reset finished envs with ``reset(options={"reset_mask": mask})``).
* **infos** batched as Gymnasium does (``VectorEnv._add_info``: an array per key and a ``_key`` mask);
  :func:`sub_info` gives one env's info back as the scalar env's dict.

Seeds: ``reset(seed=s)`` seeds env i with ``s + i`` (Gymnasium's convention); a list gives each its own.

>>> import gymnasium as gym, rsigym_env
>>> vec = gym.make_vec("RSIGym/Joint-v0", num_envs=2, vectorization_mode="vector_entry_point",
...                    benchmark="aime", budget_usd=100, include_log=False)
>>> obs, info = vec.reset(seed=0)
>>> sorted(obs)[:3], obs["budget_left_usd"].shape, info["benchmark"].tolist(), info["_seed"].tolist()
(['action_mask', 'budget_left_usd', 'dev_scores'], (2, 1), ['aime', 'aime'], [True, True])
>>> obs, reward, terminated, truncated, info = vec.step([{"tool": "submit"}, {"tool": "nonsense"}])
>>> terminated.tolist(), info["ok"].tolist(), vec.refusals.tolist(), vec.episodes.tolist()
([True, False], [True, False], [0, 1], [1, 0])
>>> vec.close()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .env import ResearchEnv, resolve_scenario
from .platform.core import Platform
from .platform.ledger import Ledger

__all__ = ["ARRAY_ARGS", "ResearchVectorEnv", "make_vector_env", "sub_info"]


def sub_info(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s info out of a batched ``infos`` (the inverse of ``VectorEnv._add_info``).

    >>> sub_info({"ok": np.array([True, False]), "_ok": np.array([True, True]),
    ...           "result": {"k": np.array([3, 0]), "_k": np.array([True, False])}, "_result": np.array([True, True])}, 0)
    {'ok': True, 'result': {'k': 3}}
    """
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") or not infos.get(f"_{key}", np.zeros(i + 1, bool))[i]:
            continue
        if isinstance(value, dict):
            out[key] = sub_info(value, i)
        else:
            item = value[i]
            out[key] = item.item() if isinstance(item, np.generic) else item
    return out


ARRAY_ARGS = frozenset({"scenario", "track", "world", "benchmark", "budget_usd", "max_steps", "time_limit_h",
                        "world_options", "ledger_path", "autoreset_mode", "write_episodes"})
"""The arguments :class:`~rsigym_env.menu_vector.MenuArrayEnv` takes; any other one needs the per-env route."""


def make_vector_env(num_envs: int = 1, *, menu: bool = False, array: bool | None = None,
                    include_log: bool | None = None, num_workers: int = 1, **kwargs: Any) -> VectorEnv:
    """What ``gym.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point", ...)`` builds (the ids'
    vector entry point).

    * ``menu=True`` on the sim world: :class:`~rsigym_env.menu_vector.MenuArrayEnv`, the N episodes
      stepped as arrays (the fast path; no text is rendered, ``info`` keeps the numeric keys).
    * ``array=False`` (or anything the array env cannot do: another world, ``include_log=True``, an
      argument outside :data:`ARRAY_ARGS`): :class:`ResearchVectorEnv` over ``DiscreteMenu`` sub-envs, the
      scalar env itself per row, with its whole ``info`` (``result``, ``message``, ``events``, ``calls``
      ...). ``array=True`` insists on the array env and says why when it cannot be built.
    * ``num_workers=W`` (array env only; 1..N, default 1: this process): W > 1 cuts the N rows into W contiguous
      shards, each a ``MenuArrayEnv`` in a worker process (:class:`~rsigym_env.menu_workers.MenuWorkersEnv`:
      the same interface and, row for row, the same results; one ledger, in this process), so the aggregate
      rate grows with the cores.
    * ``menu=False``: :class:`ResearchVectorEnv` (tool calls; ``include_log`` defaults to True).

    >>> import gymnasium as gym, rsigym_env
    >>> fast = gym.make_vec("RSIGym/Joint-v0", num_envs=4, vectorization_mode="vector_entry_point", menu=True,
    ...                     benchmark="aime", budget_usd=100)
    >>> type(fast.unwrapped).__name__, fast.observation_space.shape
    ('MenuArrayEnv', (4, 50))
    >>> per_env = gym.make_vec("RSIGym/Joint-v0", num_envs=4, menu=True, array=False, benchmark="aime")
    >>> type(per_env.unwrapped).__name__
    'ResearchVectorEnv'
    >>> fast.close(); per_env.close()
    """
    kwargs.pop("max_episode_steps", None)  # make_vec passes the spec's (None here); the env has its own limits
    if array not in (None, True, False) or menu not in (True, False):
        raise TypeError(f"menu is True or False and array is None, True or False, got menu={menu!r}, array={array!r}")
    if array and not menu:
        raise ValueError("the array env steps the menu: give menu=True with array=True")
    if menu and array is not False:
        why = _not_array(include_log, kwargs)
        if why is None:
            if isinstance(num_workers, bool) or num_workers != 1:  # MenuWorkersEnv checks it (1..N)
                from .menu_workers import MenuWorkersEnv

                return MenuWorkersEnv(num_envs, num_workers=num_workers, **kwargs)
            from .menu_vector import MenuArrayEnv  # the policy layer, only when asked for

            return MenuArrayEnv(num_envs, **kwargs)
        if array:
            raise ValueError(f"the array env (array=True) cannot run this: {why}; use array=False for the "
                             "per-env route (ResearchVectorEnv over DiscreteMenu)")
    if isinstance(num_workers, bool) or num_workers != 1:
        raise ValueError("num_workers runs the array env's rows on processes: it needs menu=True on the sim world "
                         f"with the array env's arguments (here: {why if menu and array is not False else 'menu=False or array=False'})")
    return ResearchVectorEnv(num_envs, include_log=True if include_log is None else include_log, menu=menu, **kwargs)


def _not_array(include_log: bool | None, kwargs: dict[str, Any]) -> str | None:
    """Why the array env cannot run these arguments, or None if it can."""
    if include_log:
        return "include_log=True (the array env renders no text)"
    other = sorted(k for k, v in kwargs.items() if k not in ARRAY_ARGS and v is not None)
    if other:
        return f"argument(s) {other} (it takes {sorted(ARRAY_ARGS)})"
    scenario = resolve_scenario(**{k: kwargs.get(k) for k in ARRAY_ARGS - {"ledger_path", "autoreset_mode",
                                                                          "write_episodes"}})
    if scenario.world != "sim":
        return f"the {scenario.world!r} world (it runs the sim world)"
    return None


class ResearchVectorEnv(VectorEnv):
    """``num_envs`` research episodes stepped as one batch (see the module docstring).

    Args:
        num_envs: how many episodes run side by side.
        include_log: put the text ``log`` in the observation (default True; False renders no text). With
            ``menu=True`` the observation never has it, and the sub-envs keep rendering it: the menu reads
            the harness file out of the log of its ``read`` call.
        menu: step menu indices (:class:`~rsigym_env.wrappers.menu.DiscreteMenu`) instead of tool calls.
        ledger_path: an SQLite file for the shared ledger and audit chain (default: in memory).
        autoreset_mode: ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (enum or its value).
        **env_kwargs: every sub-env's :class:`~rsigym_env.env.ResearchEnv` arguments (``track``,
            ``benchmark``, ``budget_usd``, ``scenario``, ``world_options`` ...).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 1, *, include_log: bool = True, menu: bool = False,
                 ledger_path: str | Path | None = None,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, **env_kwargs: Any):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        for name in ("platform", "key", "render_mode"):
            if env_kwargs.get(name) is not None:
                raise ValueError(f"{name} is not a vector env argument (the sub-envs share one platform)")
        env_kwargs.pop("max_episode_steps", None)  # make_vec passes the spec's (None here); the env has its own limits
        self.num_envs = int(num_envs)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": self.autoreset_mode}
        self.include_log, self.menu = include_log, menu
        self.platform = Platform(Ledger(ledger_path))
        first = ResearchEnv(platform=self.platform, include_log=include_log or menu, **env_kwargs)
        # the others start from its scenario (read once, not once per env; the overrides apply again, unchanged)
        rest = {**env_kwargs, "scenario": first.scenario}
        envs: list[Any] = [first] + [ResearchEnv(platform=self.platform, include_log=include_log or menu, **rest)
                                     for _ in range(self.num_envs - 1)]
        if menu:
            from .wrappers.menu import DiscreteMenu  # the policy layer, only when asked for
            envs = [DiscreteMenu(env) for env in envs]
        self.envs = envs
        self.scenario = envs[0].unwrapped.scenario
        self.single_action_space = envs[0].action_space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        single = envs[0].observation_space
        if not menu and not include_log:
            single = spaces.Dict({k: v for k, v in single.spaces.items() if k != "log"})
        self.single_observation_space = single
        self.observation_space = batch_space(single, self.num_envs)
        self.budget_left_usd = np.zeros(self.num_envs)
        self.spent_usd = np.zeros(self.num_envs)
        self.refusals = np.zeros(self.num_envs, dtype=np.int64)
        self.episodes = np.zeros(self.num_envs, dtype=np.int64)
        self._done = np.zeros(self.num_envs, dtype=bool)
        self._started = False

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every env (or those in ``options["reset_mask"]``); ``seed``: an int (env i gets
        ``seed + i``) or one seed per env."""
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds: list[int | None] = [None if seed is None else int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"give one seed per env ({self.num_envs}), got {len(seeds)}")
        options = dict(options or {})
        mask = np.asarray(options.pop("reset_mask", np.ones(self.num_envs, dtype=bool)), dtype=bool)
        if mask.shape != (self.num_envs,):
            raise ValueError(f"reset_mask must be a bool array of shape ({self.num_envs},)")
        if not self._started and not mask.all():
            raise ValueError("the first reset must reset every env")
        observations, infos = [], {}
        for i, env in enumerate(self.envs):
            if mask[i]:
                obs, info = env.reset(seed=seeds[i], options=options or None)
                self._track(i)
                self._done[i] = False
                infos = self._add_info(infos, info, i)
            else:
                obs = self._last_obs[i]
            observations.append(obs)
        self._started = True
        self._last_obs = observations
        return self._batch(observations), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One action per env (a batch of the action space: a tuple, list or array of N actions)."""
        if not self._started:
            raise gym.error.ResetNeeded("call reset() before step()")
        actions = list(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"give one action per env ({self.num_envs}), got {len(actions)}")
        rewards = np.zeros(self.num_envs)
        terminations = np.zeros(self.num_envs, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        observations, infos = [], {}
        for i, env in enumerate(self.envs):
            if self._done[i] and self.autoreset_mode == AutoresetMode.NEXT_STEP:
                obs, info = env.reset()
                self._track(i)
            elif self._done[i] and self.autoreset_mode == AutoresetMode.DISABLED:
                raise gym.error.ResetNeeded(f"env {i} has ended: reset it (options={{'reset_mask': ...}})")
            else:
                obs, rewards[i], terminations[i], truncations[i], info = env.step(actions[i])
                self._track(i, ended=bool(terminations[i] or truncations[i]))
                if self.autoreset_mode == AutoresetMode.SAME_STEP and (terminations[i] or truncations[i]):
                    final = self._strip(obs)
                    obs, reset_info = env.reset()
                    self._track(i)
                    infos = self._add_info(infos, {"final_obs": final, "final_info": info}, i)
                    info = reset_info
            infos = self._add_info(infos, info, i)
            observations.append(obs)
        self._done = terminations | truncations
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            self._done[:] = False
        self._last_obs = observations
        return self._batch(observations), rewards, terminations, truncations, infos

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()
        self.platform.ledger.close()

    def _add_info(self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int) -> dict[str, Any]:
        """Gymnasium's batching of ``info``, safe where envs disagree on a key's type: a key that is a
        dict in one env and not in another (``None`` before a result, say) becomes an object array of
        each env's value, and a number that does not fit its array's dtype (0.5 after an int) widens it
        instead of being cut. :func:`sub_info` gives each env's value back either way."""
        for key, value in env_info.items():
            have = vector_infos.get(key)
            if isinstance(have, np.ndarray) and have.dtype != object and not isinstance(value, dict):
                kind = np.asarray(value).dtype
                if not np.can_cast(kind, have.dtype, "safe"):
                    numeric = kind.kind in "biuf" and have.dtype.kind in "biuf"
                    vector_infos[key] = have.astype(np.result_type(have.dtype, kind) if numeric else object)
            elif have is not None and key != "final_obs" and isinstance(have, dict) != isinstance(value, dict):
                if isinstance(have, dict):
                    objects = np.full(self.num_envs, None, dtype=object)
                    for j in np.flatnonzero(vector_infos[f"_{key}"]):
                        objects[j] = sub_info(have, int(j))
                    have = objects
                elif have.dtype != object:
                    have = have.astype(object)
                have[env_num] = value
                vector_infos[key] = have
                vector_infos[f"_{key}"][env_num] = True
                continue
            super()._add_info(vector_infos, {key: value}, env_num)
        return vector_infos

    # ------------------------------------------------------------------ helpers

    def _track(self, i: int, *, ended: bool = False) -> None:
        """Keep env i's money in the arrays (its run's balance and refusal count)."""
        run = self.envs[i].unwrapped.run
        self.budget_left_usd[i] = run.balance.available_usd
        self.spent_usd[i] = run.balance.spent_usd
        self.refusals[i] = run.refusals
        self.episodes[i] += int(ended)

    def _strip(self, obs: Any) -> Any:
        if self.menu or self.include_log:
            return obs
        return {k: v for k, v in obs.items() if k != "log"}

    def _batch(self, observations: list[Any]) -> Any:
        if self.menu:
            return np.stack(observations)
        out: dict[str, Any] = {}
        for key in self.single_observation_space.spaces:
            if key == "log":
                out[key] = tuple(obs[key] for obs in observations)
            else:
                out[key] = np.stack([obs[key] for obs in observations])
        return out
