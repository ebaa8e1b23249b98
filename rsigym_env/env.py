"""``ResearchEnv``: one episode is one research run.

The env is thin: it turns an action into a call on the run (:mod:`rsigym_env.run`) and the result
into an observation. Policy conveniences live in ``rsigym_env.wrappers``.

>>> import gymnasium as gym, rsigym_env
>>> env = gym.make("RSIGym/Joint-v0", world="sim", benchmark="aime", budget_usd=100)
>>> obs, info = env.reset(seed=0)
>>> obs, reward, terminated, truncated, info = env.step({"tool": "submit", "args": {}})
>>> terminated, reward, info["official_score"] == info["initial_score"]
(True, 0.0, True)

Action Space
    ``OneOf`` over the ten tools' ``Dict`` subspaces (:func:`rsigym_env.tools.action_space`).
    ``step`` also takes a tool object, ``{"tool": name, "args": {...}}`` or its JSON text.

Observation Space
    ``Dict`` with ``log`` (printable text: the rendered result of the last call), ``budget_left_usd``,
    ``time_left_h``, ``step``, ``dev_scores`` (initial, best, last; -1 where not measured yet),
    ``running_jobs`` and ``action_mask`` (one entry per tool: allowed by the key and usable now).

Rewards
    0 on every step until the episode ends; then the normalized gain
    ``(official - initial) / (1 - initial)`` of the submitted system on the held-out official split.

Episode End
    Terminated on ``submit``. Truncated when steps, time or money run out; the initial system then
    counts as submitted (reward 0). ``info`` at the end has ``initial_score``, ``official_score``,
    ``normalized_gain``, ``best_dev_score``, ``spend_usd``, ``budget_usd``, ``submitted``
    (``checkpoint``, ``harness``, ``by``), ``dev_evaluations`` (dev scores measured) and
    ``official_split`` (``mode``, and the split's hash where the world draws one).

Info
    What callers (sweeps, the CLI, the menu wrapper, recursion) need is in ``info``; they read nothing
    inside the env. At ``reset``: ``scenario`` (its name), ``world``, ``track``, ``benchmark``,
    ``budget_usd``, ``time_limit_h``, ``max_steps``, ``seed`` (the episode's), ``budget_left_usd``,
    ``tools``, ``teachers``, ``train_locks`` (``{field: value}``) and ``harness`` (the initial version).
    After every step: ``tool``, ``ok`` (then ``result``, else ``error`` and ``message``), ``cost_usd``
    (of this step), ``spent_usd`` (billed so far, reservations not included), ``budget_left_usd`` and
    ``events`` of jobs that finished; at the end also the result keys above and ``best_candidate``,
    ``end_reason``, ``official_eval_usd``, ``elapsed_h``, ``steps`` and ``metrics``.
    Everything in ``info`` is deterministic for a seed (``check_env`` compares it). What is not, or is
    large, is an accessor for the env's owner: :attr:`ResearchEnv.key_id` (the run's platform key, random),
    :meth:`ResearchEnv.harness_files` (a harness version's files) and :meth:`ResearchEnv.run_view` (a
    read-only snapshot of the run: balance, clock, jobs, datasets, harness versions, end ``info``; what
    wrappers, the run record and the session service read instead of the run itself).

>>> _, info = env.reset(seed=0)
>>> info["world"], info["track"], info["benchmark"], info["max_steps"]
('sim', 'joint', 'aime', 200)
>>> len(env.unwrapped.key_id), sorted(env.unwrapped.harness_files(info["harness"]))
(16, ['harness.toml', 'prompt.md'])
>>> view = env.unwrapped.run_view()
>>> view.steps, view.best_dev, view.harness_initial == info["harness"], view.end_info is None
(0, None, True, True)
"""

from __future__ import annotations

import functools
import re
import string
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .catalog import env_id
from .platform.core import Platform, PlatformKey
from .platform.ledger import Ledger
from .run import ResearchRun, RunView
from .scenario import Scenario, load_scenario
from .tools import TOOL_NAMES, action_space
from .worlds import WorldFactory, make_world

LOG_MAX = 8000
_NOT_PRINTABLE = re.compile(f"[^{re.escape(string.printable)}]")
_ASCII_TO_PRINTABLE = bytes(c if chr(c) in string.printable else ord("?") for c in range(256))


def printable(text: str, limit: int = LOG_MAX) -> str:
    """``text`` reduced to ``string.printable`` and cut to ``limit`` characters (saying so).

    >>> printable("naïve ok"), printable("bell\x07 tab\t")
    ('na?ve ok', 'bell? tab\t')
    """
    if text.isascii():  # the common case: a C byte translation, ~6x faster than the regex
        clean = text.encode("ascii").translate(_ASCII_TO_PRINTABLE).decode("ascii")
    else:
        clean = _NOT_PRINTABLE.sub("?", text)
    if len(clean) <= limit:
        return clean
    note = f"\n... ({len(clean) - limit + 80} more characters; read with @offset to continue)"
    return clean[: limit - len(note)] + note


@functools.cache
def _action_mask(allowed: tuple[str, ...]) -> np.ndarray:
    """The ``action_mask`` of ``allowed`` tools (shared and read-only: copy it for an observation)."""
    mask = np.array([name in allowed for name in TOOL_NAMES], dtype=np.int8)
    mask.flags.writeable = False
    return mask


def resolve_scenario(scenario: str | Path | Scenario | None = None, *, track: str | None = None,
                     world: str | None = None, benchmark: str | None = None, budget_usd: float | None = None,
                     max_steps: int | None = None, time_limit_h: float | None = None,
                     world_options: dict[str, Any] | None = None) -> Scenario:
    """The scenario :class:`ResearchEnv` runs for these arguments (a name, file or ``Scenario``, then the
    overrides; a scenario of another track than ``track`` is a ``ValueError``). The array env resolves
    its scenario here too, so both run the same one.

    >>> s = resolve_scenario(track="data", benchmark="aime", budget_usd=50)
    >>> s.track, s.world, s.benchmark, s.budget_usd == 50
    ('data', 'sim', 'aime', True)
    """
    overrides = dict(track=track, world=world, benchmark=benchmark, budget_usd=budget_usd,
                     max_steps=max_steps, time_limit_h=time_limit_h)
    if isinstance(scenario, Scenario):
        base = scenario
    else:
        base = load_scenario(scenario, **{**overrides, "track": None if scenario is not None else track})
    if track is not None and base.track != track:
        raise ValueError(f"scenario {base.name!r} is a {base.track}-track scenario; use "
                         f"{env_id(base.track)} (or ResearchEnv) for it")
    out = base.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    if world_options:
        out = out.model_copy(update={"world_options": {**out.world_options, **world_options}})
    return out


class ResearchEnv(gym.Env[dict[str, Any], Any]):
    """A research run as a Gymnasium environment (see the module docstring for the spaces).

    Args:
        scenario: a bundled scenario name, a YAML path or a :class:`Scenario`; default: the track's base.
        track, world, benchmark, budget_usd, max_steps, time_limit_h: override the scenario.
        seed: the seed of the first ``reset`` when it is given none.
        ledger_path: an SQLite file to keep the ledger and audit log in (default: in memory).
        render_mode: ``"ansi"`` (``render()`` returns the log) or ``"human"`` (prints it).
        world_options: merged over the scenario's ``world_options`` (e.g. the local world's
            ``base_model`` or ``eval_concurrency``).
        async_jobs: run ``generate_data``, ``transform_data`` and ``submit`` as jobs too (each returns a
            job id at once; ``wait`` for it), so no call blocks for long — what clients that time out
            need (the agent gateway uses it). Default: those calls block until done, as RL loops like.
        world_factory: builds each episode's world, ``(scenario, seed, run_dir) -> World``; default:
            the registered world the scenario names. The attribute of that name may be replaced before
            a ``reset`` to wrap the world (record/replay does).
        platform, key: run on this platform (its ledger stays open when the env closes) and bill every
            episode to ``key``, one of its keys (a sub-key carved out of an outer run's budget: the
            recursive world's inner episodes). Default: a platform of its own, a new key per episode.
        include_log: put the text ``log`` in the observation (default True). False leaves it out of the
            space and renders no text: for policies that read only the numeric entries.
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(
        self,
        scenario: str | Path | Scenario | None = None,
        *,
        track: str | None = None,
        world: str | None = None,
        benchmark: str | None = None,
        budget_usd: float | None = None,
        max_steps: int | None = None,
        time_limit_h: float | None = None,
        seed: int | None = None,
        ledger_path: str | Path | None = None,
        run_dir: str | Path | None = None,
        render_mode: str | None = None,
        world_options: dict[str, Any] | None = None,
        async_jobs: bool = False,
        world_factory: WorldFactory | None = None,
        platform: Platform | None = None,
        key: PlatformKey | None = None,
        include_log: bool = True,
    ):
        self.scenario = resolve_scenario(scenario, track=track, world=world, benchmark=benchmark,
                                         budget_usd=budget_usd, max_steps=max_steps, time_limit_h=time_limit_h,
                                         world_options=world_options)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.render_mode = render_mode
        self._first_seed = seed
        self.run_dir = Path(run_dir) if run_dir is not None else None
        if key is not None and platform is None:
            raise ValueError("a key needs the platform it belongs to")
        if platform is not None and ledger_path is not None:
            raise ValueError("give a platform or a ledger_path, not both")
        self._owns_platform = platform is None
        self.platform = platform if platform is not None else Platform(Ledger(ledger_path))
        self._key = key
        self.action_space = action_space()
        budget = self.scenario.budget_usd
        self.include_log = include_log
        log_space = {"log": spaces.Text(max_length=LOG_MAX, min_length=0, charset=string.printable)} if include_log else {}
        self.observation_space = spaces.Dict({
            **log_space,
            "budget_left_usd": spaces.Box(0.0, budget, shape=(1,), dtype=np.float64),
            "time_left_h": spaces.Box(0.0, self.scenario.time_limit_h, shape=(1,), dtype=np.float64),
            "step": spaces.Box(0, self.scenario.max_steps, shape=(1,), dtype=np.int64),
            "dev_scores": spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float64),
            "running_jobs": spaces.Box(0, self.scenario.max_steps, shape=(1,), dtype=np.int64),
            "action_mask": spaces.MultiBinary(len(TOOL_NAMES)),
        })
        self.async_jobs = async_jobs
        self.world_factory: WorldFactory = world_factory or make_world
        self.run: ResearchRun | None = None
        self._log = ""

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        if seed is None and self._first_seed is not None and self.run is None:
            seed = self._first_seed
        super().reset(seed=seed)
        episode_seed = int(self.np_random.integers(2**31 - 1))
        if self.run is not None:  # running jobs are billed for the part that ran, as at truncation
            self.run.abandon("reset")
            self.run.world.close()
        self.run = ResearchRun(self.scenario, episode_seed, self.platform, self.run_dir, async_jobs=self.async_jobs,
                               world_factory=self.world_factory, key=self._key)
        self._log = self.run.briefing() if self._keeps_log() else ""
        s = self.scenario
        info = {"scenario": s.name, "world": s.world, "track": s.track, "benchmark": s.benchmark,
                "budget_usd": s.budget_usd, "time_limit_h": s.time_limit_h, "max_steps": s.max_steps,
                "seed": episode_seed, "budget_left_usd": self.run.budget_left, "tools": s.tools(),
                "teachers": list(s.permissions.teachers), "train_locks": dict(s.permissions.train.lock),
                "harness": self.run.harness.initial}
        return self._observation(), info

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self.run is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        outcome = self.run.execute(action)
        if self._keeps_log():
            self._log = f"{self.run.status_line()}\n{outcome.log}"
        if self.render_mode == "human":
            self.render()
        return self._observation(), float(outcome.reward), outcome.terminated, outcome.truncated, outcome.info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return printable(self._log)
        if self.render_mode == "human":
            print(printable(self._log))
        return None

    def close(self) -> None:
        if self.run is not None:  # running jobs are billed for the part that ran, as at truncation
            self.run.abandon("closed")
            self.run.world.close()
            self.run = None
        if self._owns_platform:
            self.platform.ledger.close()

    # ------------------------------------------------------------------ the run, for its owner

    @property
    def key_id(self) -> str | None:
        """The id of the current episode's platform key (its ledger account); ``None`` before ``reset``.
        Random per episode (a secret's hash), so it is not in ``info``."""
        return self.run.key.id if self.run is not None else None

    def harness_files(self, version: str = "latest") -> dict[str, str]:
        """The files (path -> text) of a harness version of the current episode, e.g. the submitted one
        (``info["submitted"]["harness"]`` at the end); readable until the next ``reset`` or ``close``."""
        if self.run is None:
            raise gym.error.ResetNeeded("call reset() before harness_files()")
        return self.run.harness.files(version)

    def run_view(self) -> RunView | None:
        """A read-only snapshot of the current episode's run (:class:`~rsigym_env.run.RunView`), ``None``
        before ``reset``; take a new one after every step."""
        return self.run.view() if self.run is not None else None

    # ------------------------------------------------------------------ helpers

    def _keeps_log(self) -> bool:
        return self.include_log or self.render_mode is not None

    def _observation(self) -> dict[str, Any]:
        run = self.run
        assert run is not None
        def score(value: float | None) -> float:
            return -1.0 if value is None else value
        allowed = tuple(run.allowed_tools()) if run.end_info is None else ()
        max_steps = self.scenario.max_steps
        # two arrays cut into the entries (one array each costs more than the rest of the observation)
        floats = np.array([min(run.budget_left, self.scenario.budget_usd), run.time_left / 3600.0,
                           score(run.initial_dev), score(run.best_dev), score(run.last_dev)], dtype=np.float64)
        ints = np.array([min(run.steps, max_steps), min(len(run.running), max_steps)], dtype=np.int64)
        observation = {"log": printable(self._log)} if self.include_log else {}
        return {
            **observation,
            "budget_left_usd": floats[0:1],
            "time_left_h": floats[1:2],
            "step": ints[0:1],
            "dev_scores": floats[2:5],
            "running_jobs": ints[1:2],
            "action_mask": _action_mask(allowed).copy(),
        }
