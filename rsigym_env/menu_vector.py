"""``MenuArrayEnv``: N sim episodes behind the menu interface, stepped as arrays (issue 27 item 1).

What ``gym.make_vec("RSIGym/Joint-v0", num_envs=N, vectorization_mode="vector_entry_point", menu=True)`` (and
the Data and Harness ids) builds on the sim world (:func:`rsigym_env.vector.make_vector_env`; ``array=False``
gives the per-env route, ``ResearchVectorEnv`` over ``DiscreteMenu``). Every menu entry is stepped
(``ARRAY_MACROS``) with parity against the scalar env (``tests/test_menu_vector.py``).

What it is: every sub-env is ``DiscreteMenu(gym.make(env_id, scenario/track, benchmark, budget_usd, ...))``
on the sim world (one benchmark and one scenario for the N envs), without the text log: the action is a
menu index per env, the observation an ``(N, len(FEATURES))`` float32 matrix, ``info["action_mask"]`` an
``(N, len(MENU))`` bool matrix. For the same seeds and menu actions, row i's features, mask, reward,
termination, truncation and the info keys it keeps (``INFO_KEYS``, ``n_calls``, and ``END_KEYS`` when an
episode ends; ``None`` there is NaN) equal the scalar env's.

Design
------
State arrays (row i = env i; see ``MenuArrayEnv.__init__``):

* worlds: a :class:`~rsigym_env.worlds.sim.batch.SimBatch` (each row the world its episode seed gives
  alone, streams and all; a reset redraws its rows), the initial system's official score per row;
* money, in integer nano-dollars as the ledger keeps it: ``spent_n``, ``reserved_n`` (one running job's
  hold) against the scenario's ``budget_n``; a call is reserved at ``_nano_up(quote)`` before it runs and
  refused (free, counted in ``refusals``, no step) when that exceeds what is available, and settled at
  ``_nano_near(cost)`` (at most the hold); a job cancelled at the end is billed for the share of its
  duration that ran, as ``ResearchRun._settle_running`` does;
* clock (seconds), ``steps`` (calls that ran), ``refusals`` and the end (``done``, ``end_reason``);
* harness: ``fixed`` (N, 5) — which defects the latest harness fixes. The menu's fixes only switch an
  option on, so a harness version is one of 32 bit patterns; their version ids and parsed options are
  computed once per benchmark with the scalar code (``HarnessStore.edit`` of the menu's own edit,
  ``version_id``, ``HarnessArrays.of``), so version ids and evaluated options match by construction;
* checkpoints: index 0 is base, then the finished ones in order: skill and dev memory (N, 1 + K), K
  grown on demand;
* dev candidates, index ``checkpoint * 32 + harness version``: number of scores, mean and the order a
  candidate was first scored in (the adapter's and the run's dict order, for ties), (N, 32 (1 + K)); the
  scores themselves in a list per row and candidate, averaged by ``np.mean`` as the adapter does when
  one is added (a zero-padded array summed along an axis rounds differently from ``np.mean`` of the list
  from 4 values on: measured); ``initial_dev``, ``best_dev``, ``last_dev``;
* one running job per row (the menu's evaluations and trainings block: start, then ``wait`` for it):
  ready time, cost, and its result (an evaluation's score and failure counts, drawn when it starts as
  the scalar world does; a training's checkpoint state);
* the adapter's memory for the features: ``harness_read``, failure shares and cost of the last finished
  evaluation, evaluations finished, ``last_error``; the data and training features (``data_features``)
  and mask bits (``can_clean``, ``has_train_set``), written when a data or training call changes them.

The frequent macros (evaluate, fix, wait, submit) run as array operations over the rows that chose them.
The data and training macros (``gen``, ``clean``, ``train``) keep per-row state (``_Rows``) and run on the
row's own :class:`~rsigym_env.worlds.sim.world.SimWorld` (made from the batch's draw of its episode seed
at its first data call, its clock set to the row's), through the scalar tool models and permission checks
(``parse_action``, ``authorize``, once per argument set) and the same bookkeeping as ``MenuAdapter``; their
money, clock, steps and limits go through the same arrays as the rest. ``gen`` and ``clean`` are a plan
per row (the adapter's, as a generator that asks for one call at a time); the calls all rows ask for at
once run as one batch (``generate_batch``, ``transform_batch``: each world's own stream draws, element-wise,
so a row's result is what its world alone gives). ``train`` runs row by row.

Shared with the scalar env (parity by construction): the menu, mask and feature definitions
(``wrappers/menu.py``: ``MENU``, ``FEATURES``, ``Dataset``, ``MenuAdapter._fit``), scenario loading,
the episode seed (Gymnasium's ``np_random``, as ``ResearchEnv.reset``), world draws, evaluation kernels
and bills (``SimBatch``), data generation, transforms and training (``SimWorld``), tool validation and
permissions, harness version ids, the ledger's nano-dollar rounding and refusal message,
``normalized_gain``, the run's ``MIN_USD``.

Re-implemented (parity by test): the run's call sequence per macro (``ResearchRun.execute``: step count,
refusals, limits in the run's order — steps, refusals, time, money), the ledger's reserve/settle
arithmetic, the clock's ``wait``, the run's dev bookkeeping, the adapter's features, mask and macro
plans. ``tests/test_menu_vector.py`` plays seeded random action sequences over the whole menu (mostly
unmasked entries, some masked ones that the env refuses) and the shipped RL policy through this env
and through ``DiscreteMenu`` on the scalar env, on every track and benchmark, and compares every row.

Money and audit: the money lives in the arrays above (:attr:`MenuArrayEnv.budget_left_usd`,
:attr:`~MenuArrayEnv.spent_usd`, :attr:`~MenuArrayEnv.refusals`, :attr:`~MenuArrayEnv.episodes`, as
``ResearchVectorEnv`` names them). Each finished episode (and one a ``reset`` or ``close`` cuts short) is
written to a ledger at the end of the step it ends in: an account of its own (a fresh platform key with the
scenario's budget), its whole spend reserved and settled in one audited entry (its seed, steps, refusals,
end) and its official result as a record, on a hash-chained audit log that ``rsigym audit verify`` accepts
(``ledger_path=``: a file; default: in memory). That is batched per episode, not per tool call: the
per-call trail (each reserve, settle and refusal) is the scalar env's and the per-env route's.

Autoreset: ``NEXT_STEP`` (default), ``SAME_STEP`` (``final_obs``/``final_info``) and ``DISABLED``
(``reset(options={"reset_mask": mask})``), as ``ResearchVectorEnv``.

Not here (use ``array=False``): the text log and the rest of the scalar ``info`` (``result``, ``message``,
``events``, ``calls``, ``macro``, ``metrics``, the reset keys but ``seed``), ``blocking=False``, non-sim
worlds. Speed: ``bench/README.md`` ("The vector sim"); the per-row Python of the data macros
(``Dataset`` records, features) and ``train`` is what is left of a Python loop per row.

>>> env = MenuArrayEnv(2, track="harness", benchmark="aime", budget_usd=500)
>>> obs, info = env.reset(seed=0)
>>> obs.shape, info["action_mask"].shape
((2, 50), (2, 27))
>>> obs, reward, terminated, truncated, info = env.step(np.array([MENU_INDEX["eval_latest_k1"],
...                                                               MENU_INDEX["submit_latest"]]))
>>> terminated.tolist(), info["n_calls"].tolist(), bool(info["cost_usd"][0] > 0)
([False, True], [2, 1], True)
"""

from __future__ import annotations

import math
import operator
import secrets
from functools import reduce
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from .catalog import DEFECTS, FAILURE_MODES
from .errors import ActionError
from .harness import HarnessStore
from .platform.permissions import authorize
from .platform.ledger import NANO, _nano_near, _nano_up
from .run import MIN_USD
from .env import resolve_scenario
from .platform.core import Platform, PlatformKey
from .platform.ledger import Ledger
from .scenario import Scenario
from .scoring import normalized_gain
from .tools import Train, parse_action
from .worlds.sim.batch import HarnessArrays, SimBatch
from .worlds.sim.clock import SimClock
from .worlds.sim.world import SimWorld, generate_batch, transform_batch
from .wrappers.menu import (DEFAULT_LR, FEATURES, FIXES, GEN_SIZES, MAX_CHUNKS,
                            MAX_RESERVE, MENU, MENU_INDEX, MISSING, TEACHERS, Dataset, MenuAdapter, _option_line)

__all__ = ["ARRAY_MACROS", "INFO_KEYS", "MenuArrayEnv"]

ARRAY_MACROS: tuple[str, ...] = ("eval_latest", "eval_base", "fix", "wait", "submit_best", "submit_latest", "gen",
                                 "clean", "train")
INFO_KEYS: tuple[str, ...] = ("ok", "error", "cost_usd", "budget_left_usd", "spent_usd")
END_KEYS: tuple[str, ...] = ("initial_score", "official_score", "normalized_gain", "best_dev_score",
                             "initial_dev_score", "dev_evaluations", "end_reason", "steps", "refusals",
                             "spend_usd", "budget_usd", "elapsed_h")
N_VERSIONS = 1 << len(DEFECTS)  # harness versions the menu's fixes can make
_KIND = np.array([m.kind for m in MENU])
_ARG = [m.arg for m in MENU]
_F = {name: i for i, name in enumerate(FEATURES)}


def _drive(plans: dict[int, Any], run: Any) -> None:
    """Step every row's plan (a generator yielding its next call) together: the calls the rows ask for at once
    run as one batch (``run``: row -> call in, row -> answer out), each answer sent back to its row's plan.

    >>> def plan(n):
    ...     total = yield n
    ...     yield total
    >>> seen = []
    >>> _drive({0: plan(1), 1: plan(2)}, lambda asks: (seen.append(dict(asks)), {i: a * 10 for i, a in asks.items()})[1])
    >>> seen
    [{0: 1, 1: 2}, {0: 10, 1: 20}]
    """
    asks = {i: next(plan) for i, plan in plans.items()}
    while asks:
        answers = run(asks)
        asks = {}
        for i, answer in answers.items():
            try:
                asks[i] = plans[i].send(answer)
            except StopIteration:
                pass


def harness_versions(batch: SimBatch) -> tuple[list[str], list[dict[str, str]]]:
    """The version ids and files of the 32 harnesses the menu's fixes make from the initial one (bit j of
    the index: ``DEFECTS[j]`` fixed), made with the scalar run's own ``HarnessStore.edit`` of the edit
    ``DiscreteMenu`` sends, so ids and texts are the scalar env's.

    >>> ids, files = harness_versions(SimBatch.make("aime", [0]))
    >>> len(set(ids)), 'on_truncation = "continue"' in files[1]["harness.toml"]
    (32, True)
    """
    ids, files = [], []
    for bits in range(N_VERSIONS):
        store = HarnessStore(batch.initial_harness())
        for j, defect in enumerate(DEFECTS):
            if bits >> j & 1:
                key, fixed, _ = FIXES[defect]
                line = _option_line(store.files()["harness.toml"], key)
                assert line is not None, f"the minimal harness has no {key}"
                store.edit("harness.toml", old=line.group(0), new=f"{key} = {fixed}")
        ids.append(store.latest)
        files.append(store.files())
    return ids, files


def _nano(values: np.ndarray, convert: Any) -> np.ndarray:
    """The ledger's scalar rounding (``_nano_up`` or ``_nano_near``) of each dollar amount."""
    return np.array([convert(v) for v in values.tolist()], dtype=np.int64)


class _Rows:
    """The per-row memory of the rare macros (data and training), as the run and the adapter keep it.

    ``world`` is the row's own :class:`~rsigym_env.worlds.sim.world.SimWorld` (made at the row's first
    data call from its episode seed): generation, transforms and training run on it, so their results
    are the scalar world's; evaluations stay in the batch."""

    __slots__ = ("world", "datasets", "train_set", "pools", "ckpt_data", "counters", "pass_rates", "usd_per_example",
                 "generations", "trainings", "pending")

    def __init__(self) -> None:
        self.world: SimWorld | None = None
        self.datasets: dict[str, Dataset] = {}  # the adapter's view: id -> Dataset
        self.train_set: str | None = None
        self.pools: dict[str, str] = {}
        self.ckpt_data: dict[int, str] = {}  # checkpoint index -> dataset it was trained on
        self.counters: dict[str, int] = {}  # the run's id counters
        self.pass_rates: dict[str, float] = {}
        self.usd_per_example: dict[str, float] = {}
        self.generations = self.trainings = 0
        self.pending: tuple[str, str] | None = None  # the running train job's (checkpoint id, dataset)

    def next(self, prefix: str) -> str:
        self.counters[prefix] = self.counters.get(prefix, 0) + 1
        return f"{prefix}-{self.counters[prefix]}"


class MenuArrayEnv(VectorEnv):
    """``num_envs`` sim episodes of one scenario through the menu interface, as arrays (module docstring).

    Args:
        num_envs: episodes side by side.
        scenario, track, world, benchmark, budget_usd, max_steps, time_limit_h, world_options: as for
            ``ResearchEnv`` (the world must be ``"sim"``).
        ledger_path: an SQLite file for the ledger and audit chain the finished episodes are written to
            (default: in memory); ``rsigym audit verify`` accepts it.
        autoreset_mode: ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (enum or its value), as
            ``ResearchVectorEnv``.
        write_episodes: write each finished episode to the ledger (default). False skips it (a training
            run nobody audits: ~1/3 of a step's time on the harness track at N = 256); the money is
            reserved, refused and settled in the arrays all the same.

    Money per env, in arrays (as ``ResearchVectorEnv``'s): :attr:`budget_left_usd`, :attr:`spent_usd`,
    :attr:`refusals` (the current episode's) and :attr:`episodes` (finished ones).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 1, *, scenario: str | Path | Scenario | None = None, track: str | None = None,
                 world: str | None = None, benchmark: str | None = None, budget_usd: float | None = None,
                 max_steps: int | None = None, time_limit_h: float | None = None,
                 world_options: dict[str, Any] | None = None, ledger_path: str | Path | None = None,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, write_episodes: bool = True):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        s = self.scenario = resolve_scenario(scenario, track=track, world=world, benchmark=benchmark,
                                             budget_usd=budget_usd, max_steps=max_steps, time_limit_h=time_limit_h,
                                             world_options=world_options)
        if s.world != "sim":
            raise ValueError(f"the array env runs the sim world only, not {s.world!r}")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": self.autoreset_mode}
        self.platform = Platform(Ledger(ledger_path))
        n = self.num_envs = int(num_envs)
        self.single_action_space = spaces.Discrete(len(MENU))
        self.action_space = spaces.MultiDiscrete(np.full(n, len(MENU)))
        self.single_observation_space = spaces.Box(-1.0, 1.0, shape=(len(FEATURES),), dtype=np.float32)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(n, len(FEATURES)), dtype=np.float32)
        self.budget_n = _nano_near(s.budget_usd)
        self.time_limit_s = s.time_limit_h * 3600.0
        self.tools = set(s.tools())
        sandbox = s.permissions.sandbox
        self.world_kwargs = dict(vcpus=sandbox.vcpus, memory_gib=sandbox.memory_gib, options=s.world_options)
        self.batch = SimBatch.make(s.benchmark, [0] * n, **self.world_kwargs)  # what from_scenario builds
        self.version_ids, files = harness_versions(self.batch)
        self.harness_table = HarnessArrays.of(files)
        self.n_dev = self.batch.n_tasks
        self._static_mask = self._mask_constants()
        self._rngs: list[np.random.Generator | None] = [None] * n
        self.episode_seeds = np.zeros(n, np.int64)
        z = lambda dtype=float: np.zeros(n, dtype)  # noqa: E731
        self.initial_official, self._final, self.clock, self.done = z(), z(), z(), z(bool)
        self.spent_n, self.reserved_n, self.steps, self.refusals = z(np.int64), z(np.int64), z(np.int64), z(np.int64)
        self.end_reason = np.full(n, "", dtype=object)
        self.fixed = np.zeros((n, len(DEFECTS)), bool)
        self.harness_read, self.last_error = z(bool), z(bool)
        # checkpoints: index 0 is base; n_ckpt finished ones follow (skill and dev memory of each)
        self.ckpt_skill, self.ckpt_memory, self.n_ckpt = np.zeros((n, 1)), np.zeros((n, 1)), z(np.int64)
        # candidates: checkpoint index * N_VERSIONS + harness version
        self.score_lists: list[dict[int, list[float]]] = [{} for _ in range(n)]  # row -> candidate -> scores
        self.n_scores = np.zeros((n, N_VERSIONS), np.int64)
        self.means = np.zeros((n, N_VERSIONS))
        self.first_scored = np.zeros((n, N_VERSIONS), np.int64)  # 0: never; else the order (1, 2, ...)
        self.n_candidates = z(np.int64)
        self.initial_dev, self.best_dev, self.last_dev = z(), z(), z()
        # the running job (one at most: the menu's evaluations and trainings wait for theirs)
        self.running, self.job_train, self.job_start, self.job_ready, self.job_usd = z(bool), z(bool), z(), z(), z()
        self.job_score, self.job_cand, self.job_k = z(), z(np.int64), z(np.int64)
        self.job_counts = np.zeros((n, 1 + len(FAILURE_MODES)), np.int64)
        self.job_skill, self.job_memory = z(), z()
        self.fail_shares = np.zeros((n, len(FAILURE_MODES)))
        self.eval_cost, self.evaluations = z(), z(np.int64)
        self.rows = [_Rows() for _ in range(n)]
        self.data_features = np.tile(self._no_data_features(), (n, 1))  # features 8-15 and 31-36, 39 per row
        self.can_clean, self.has_train_set = z(bool), z(bool)
        self.episodes = z(np.int64)
        self._open = z(bool)  # an episode is under way and not yet written to the ledger
        self.write_episodes = write_episodes
        self._key_secret, self._keys = secrets.token_hex(16), 0  # episode i's account: key_id(f"{secret}-{i}")
        self._tools: dict[tuple, Any] = {}  # a data call's arguments -> its authorized tool (or refusal)
        self._started = False

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (or those in ``options["reset_mask"]``); ``seed``: an int (env i gets ``seed + i``)
        or one seed per env. An episode cut short here is written to the ledger as ended by ``"reset"``."""
        n = self.num_envs
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds: list[int | None] = [None if seed is None else int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"give one seed per env ({n}), got {len(seeds)}")
        options = dict(options or {})
        mask = np.asarray(options.pop("reset_mask", np.ones(n, dtype=bool)))
        if mask.shape != (n,) or mask.dtype != bool:
            raise ValueError(f"reset_mask must be a bool array of shape ({n},)")
        if options:
            raise ValueError(f"unknown reset options {sorted(options)} (the array env takes reset_mask only)")
        if not self._started and not mask.all():
            raise ValueError("the first reset must reset every env")
        rows = np.flatnonzero(mask)
        self._abandon(rows, "reset")
        self._reset_rows(rows, [seeds[i] for i in rows.tolist()])
        self._started = True
        return self._features(), {"action_mask": self._mask(), "_action_mask": mask.copy(),
                                  "seed": self.episode_seeds.copy(), "_seed": mask.copy()}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One menu index per env. With ``NEXT_STEP`` an env that ended is reset instead (its action
        ignored); with ``SAME_STEP`` it is reset in the step it ends (``final_obs``, ``final_info``); with
        ``DISABLED`` stepping an ended env is ``gym.error.ResetNeeded``."""
        if not self._started:
            raise gym.error.ResetNeeded("call reset() before step()")
        n = self.num_envs
        given = np.asarray(actions)
        if (given.shape != (n,) or not np.issubdtype(given.dtype, np.integer)
                or ((given < 0) | (given >= len(MENU))).any()):  # no silent cast: 1.5 is not entry 1
            raise ValueError(f"give one menu index (an integer 0..{len(MENU) - 1}) per env ({n}), got {actions!r}")
        actions = given.astype(np.int64)
        resetting = np.flatnonzero(self.done)
        if resetting.size:
            if self.autoreset_mode == AutoresetMode.DISABLED:
                raise gym.error.ResetNeeded(f"envs {resetting.tolist()} have ended: reset them "
                                            "(options={'reset_mask': ...})")
            self._reset_rows(resetting, [None] * resetting.size)
        self._reward = np.zeros(n)
        self._terminated, self._truncated = np.zeros(n, bool), np.zeros(n, bool)
        self._ok, self._spent_before = np.ones(n, bool), self.spent_n.copy()
        self._error = np.full(n, "", dtype=object)
        self._calls = np.zeros(n, np.int64)
        acting = np.ones(n, bool)
        acting[resetting] = False
        kinds = _KIND[actions]
        for kind in np.unique(kinds[acting]).tolist():
            rows = np.flatnonzero(acting & (kinds == kind))
            getattr(self, "_macro_" + kind)(rows, actions[rows])
        self.last_error[acting] = ~self._ok[acting]
        info: dict[str, Any] = {"action_mask": self._mask(), "n_calls": self._calls.copy(),
                                "_action_mask": np.ones(n, bool), "_n_calls": acting.copy()}
        balance = self._available_usd()
        spent = self.spent_n / NANO
        cost = np.zeros(n)  # the run's round(after - before, 9), where the last call spent anything
        paid = np.flatnonzero(self.spent_n != self._spent_before)
        cost[paid] = [round(a / NANO - b / NANO, 9) for a, b in zip(self.spent_n[paid].tolist(),
                                                                     self._spent_before[paid].tolist())]
        for key, value in (("ok", self._ok), ("error", self._error), ("cost_usd", cost),
                           ("budget_left_usd", balance), ("spent_usd", spent)):
            info[key], info[f"_{key}"] = value, acting.copy()
        ended = np.flatnonzero(acting & self.done)
        obs = self._features()
        if ended.size:
            self._end_info(info, ended)
            self.episodes[ended] += 1
            self._write(ended)
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                obs, info = self._reset_same_step(ended, obs, info)
        return obs, self._reward, self._terminated, self._truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        """Episodes still running are written to the ledger as ended by ``"closed"``; the ledger closes."""
        if self._started:
            self._abandon(np.arange(self.num_envs), "closed")
        self.platform.ledger.close()

    @property
    def budget_left_usd(self) -> np.ndarray:
        """What each env's episode may still spend (budget - spent - reserved), in dollars."""
        return self._available_usd()

    @property
    def spent_usd(self) -> np.ndarray:
        """What each env's episode has spent, in dollars."""
        return self.spent_n / NANO

    def _reset_same_step(self, ended: np.ndarray, obs: np.ndarray, info: dict[str, Any]) -> tuple[np.ndarray, dict]:
        """``SAME_STEP``: the ended rows start their next episode now; their step's observation and info
        move to ``final_obs`` and ``final_info`` (Gymnasium's layout: a ``_key`` mask per key)."""
        n = self.num_envs
        gone = np.zeros(n, bool)
        gone[ended] = True
        final_obs = np.full(n, None, dtype=object)
        for i in ended.tolist():
            final_obs[i] = obs[i]
        final_info: dict[str, Any] = {}
        for key, value in list(info.items()):
            if key.startswith("_"):
                continue
            final_info[key], final_info[f"_{key}"] = value.copy(), info[f"_{key}"] & gone
            if key in END_KEYS:
                del info[key], info[f"_{key}"]
            elif key != "action_mask":
                info[f"_{key}"] = info[f"_{key}"] & ~gone
        self._reset_rows(ended, [None] * ended.size)
        info["action_mask"] = self._mask()
        info["final_obs"], info["_final_obs"] = final_obs, gone.copy()
        info["final_info"], info["_final_info"] = final_info, gone.copy()
        return self._features(), info

    # ------------------------------------------------------------------ macros (rows do one each)

    def _macro_eval_latest(self, rows: np.ndarray, actions: np.ndarray) -> None:
        self._evaluate(rows, np.array([_ARG[a] for a in actions.tolist()], np.int64), self.n_ckpt[rows])

    def _macro_eval_base(self, rows: np.ndarray, actions: np.ndarray) -> None:
        self._evaluate(rows, np.array([_ARG[a] for a in actions.tolist()], np.int64), np.zeros(rows.size, np.int64))

    def _macro_fix(self, rows: np.ndarray, actions: np.ndarray) -> None:
        defect = np.array([DEFECTS.index(_ARG[a]) for a in actions.tolist()], np.intp)
        unread = ~self.harness_read[rows]
        if unread.any():
            first = rows[unread]
            self._call(first)  # read harness:latest/harness.toml: free, a step
            self._ran(first)
            self.harness_read[first] = True
            self._after_call(first)
            go = ~self.done[rows]
            rows, defect = rows[go], defect[go]
        if not rows.size:
            return
        self._call(rows)
        if "edit_harness" not in self.tools:
            self._refuse(rows, "forbidden_tool")
        else:
            done = self.fixed[rows, defect]
            self._refuse(rows[done], "harness_patch_failed")
            edit = rows[~done]
            self.fixed[edit, defect[~done]] = True
            self._ran(edit)
        self._after_call(rows)

    def _macro_wait(self, rows: np.ndarray, actions: np.ndarray) -> None:
        self._call(rows)
        self._wait(rows)

    def _macro_submit_latest(self, rows: np.ndarray, actions: np.ndarray) -> None:
        self._submit(rows, self.n_ckpt[rows] * N_VERSIONS + self._version(rows))

    def _macro_submit_best(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """The adapter's best candidate: the highest mean dev score, the first scored on a tie (else latest)."""
        scored = self.n_scores[rows] > 0
        mean = np.where(scored, self.means[rows], -np.inf)
        top = scored & (mean == mean.max(axis=1, keepdims=True))
        order = np.where(top, self.first_scored[rows], np.iinfo(np.int64).max)
        best = order.argmin(axis=1)
        latest = self.n_ckpt[rows] * N_VERSIONS + self._version(rows)
        self._submit(rows, np.where(scored.any(axis=1), best, latest))

    def _macro_gen(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """``MenuAdapter._gen``: each row's plan (:meth:`_gen_plan`) asks for its calls one at a time; the
        calls all rows ask for at once run as one batch per (teacher, size) (:meth:`_generate_rows`)."""
        _drive({i: self._gen_plan(i, *_ARG[a]) for i, a in zip(rows.tolist(), actions.tolist())}, self._generate_rows)

    def _gen_plan(self, i: int, teacher: str, n: int) -> Any:
        """Row i's ``MenuAdapter._gen``: yields ``(teacher, n_examples)`` per call, is sent its ``(code, message)``."""
        if n < GEN_SIZES[-1]:
            error, message = yield teacher, n
            if error == "insufficient_budget" and not self.done[i]:
                fit = _fit(n, message, 0.0)
                if fit >= 1:
                    yield teacher, fit
            return
        reserve = MAX_RESERVE * self.scenario.budget_usd
        for chunk in range(MAX_CHUNKS):
            error, message = yield teacher, n
            if error != "insufficient_budget" or self.done[i]:
                break
            fit = _fit(n, message, reserve)
            if fit < (1 if chunk == 0 else GEN_SIZES[0]):
                break
            error, _ = yield teacher, fit
            if error or self.done[i]:
                break

    def _macro_clean(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """``MenuAdapter._clean``: each row's plan (:meth:`_clean_plan`) asks for its calls one at a time;
        the calls all rows ask for at once run as one batch per operation (:meth:`_transform_rows`)."""
        _drive({i: self._clean_plan(i) for i in rows.tolist()}, self._transform_rows)

    def _clean_plan(self, i: int) -> Any:
        """Row i's ``MenuAdapter._clean``: yields ``(operation, datasets)`` per call, is sent the adapter's
        record of the new dataset (None if refused); it stops when the row's episode ends."""
        r = self.rows[i]
        raws = _raws(r)
        if not raws:
            yield "filter", [MISSING]
            return
        teacher = raws[-1].teacher
        cleaned = []
        for raw in [d for d in raws if d.teacher == teacher]:
            current = raw.id
            for operation in ("filter", "dedupe"):
                made = yield operation, [current]
                if self.done[i]:
                    return
                if made is None or made.n == 0:
                    current = ""
                    break
                current = made.id
            if current:
                cleaned.append(current)
        parts = ([r.pools[teacher]] if teacher in r.pools else []) + cleaned
        if len(parts) > 1:
            made = yield "mix", parts[:8]
            if made is not None:
                parts = [made.id]
        if parts:
            r.pools[teacher] = parts[-1]

    def _macro_train(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """``MenuAdapter._train``: start a training job on the row's world, then wait for it."""
        waiting = []
        for i, a in zip(rows.tolist(), actions.tolist()):
            lr, r = _ARG[a], self.rows[i]
            args: dict[str, Any] = {"dataset": r.train_set or MISSING}
            if lr != DEFAULT_LR:
                args["learning_rate"] = lr
            self._call_row(i)
            try:
                tool = self._tool("train", args)
                if tool.dataset not in r.datasets:
                    raise ActionError("unknown_ref", f"no dataset {tool.dataset!r}")
                world = self._world(i)
                quote = world.train.quote(tool)
                job_id, ckpt = r.next("job"), r.next("ckpt")
                self._hold(i, quote.usd)
            except ActionError as err:
                self._refuse_row(i, err.code)
                self._after_row(i)
                continue
            self.steps[i] += 1
            job = world.train.start(tool, job_id, ckpt)
            state = world.model_state(ckpt, require_ready=False)
            self.running[i], self.job_train[i] = True, True
            self.job_start[i], self.job_ready[i] = job.started_at, job.ready_at
            self.job_usd[i] = job.future.result().cost_usd
            self.job_skill[i], self.job_memory[i] = state.skill, state.dev_memory
            r.pending = (ckpt, tool.dataset)
            r.trainings += 1
            self._update_data_features(i)
            self._after_row(i)
            if not self.done[i]:
                waiting.append(i)
        waiting_rows = np.array(waiting, np.intp)
        while waiting_rows.size:
            self._call(waiting_rows)
            self._wait(waiting_rows)
            waiting_rows = waiting_rows[~self.done[waiting_rows] & self.running[waiting_rows]]

    # ------------------------------------------------------------------ calls (the run's execute)

    def _call(self, rows: np.ndarray) -> None:
        """A call of a macro begins: counted in ``n_calls``; the step's ``cost_usd`` is the last call's."""
        self._calls[rows] += 1
        self._ok[rows], self._error[rows] = True, ""
        self._spent_before[rows] = self.spent_n[rows]

    def _ran(self, rows: np.ndarray) -> None:
        self.steps[rows] += 1

    def _refuse(self, rows: np.ndarray, code: str) -> None:
        self.refusals[rows] += 1
        self._ok[rows], self._error[rows] = False, code

    # one row at a time (the data macros' calls): the same bookkeeping as the array forms, in plain Python

    def _call_row(self, i: int) -> None:
        self._calls[i] += 1
        self._ok[i], self._error[i] = True, ""
        self._spent_before[i] = self.spent_n[i]

    def _refuse_row(self, i: int, code: str) -> None:
        self.refusals[i] += 1
        self._ok[i], self._error[i] = False, code

    def _after_row(self, i: int) -> None:
        """:meth:`_after_call` for one row."""
        if self.done[i]:
            return
        s = self.scenario
        if self.steps[i] >= s.max_steps:
            reason = "step limit"
        elif self.refusals[i] >= s.refusal_limit:
            reason = "refusal limit"
        elif self.clock[i] >= self.time_limit_s:
            reason = "time limit"
        elif not self.running[i] and float(self.budget_n - self.spent_n[i] - self.reserved_n[i]) / NANO < MIN_USD:
            reason = "budget exhausted"
        else:
            return
        row = np.array([i])
        self._end(row, self.initial_official[row], terminated=False, reason=reason)

    def _tool(self, name: str, args: dict[str, Any]) -> Any:
        """``authorize(scenario, parse_action(...))`` of a data call, remembered per arguments (the same
        tool object, or the same ``ActionError`` raised again)."""
        key = (name, *((k, tuple(v) if isinstance(v, list) else v) for k, v in args.items()))
        tool = self._tools.get(key)
        if tool is None:
            try:
                tool = authorize(self.scenario, parse_action({"tool": name, "args": args}))
            except ActionError as err:
                tool = err
            self._tools[key] = tool
        if isinstance(tool, ActionError):
            raise ActionError(tool.code, tool.message)
        return tool

    def _hold(self, i: int, usd: float) -> int:
        """Reserve ``usd`` on row ``i`` as the ledger does, or raise its ``insufficient_budget`` refusal."""
        hold = _nano_up(usd)
        available = self.budget_n - int(self.spent_n[i]) - int(self.reserved_n[i])
        if hold > available:
            raise ActionError("insufficient_budget", f"reserve needs ${hold / NANO:.4f} but only "
                                                     f"${available / NANO:.4f} is available on this key")
        self.reserved_n[i] += hold
        return hold

    def _world(self, i: int) -> SimWorld:
        """Row i's own world (its episode seed's), its clock set to the row's."""
        r = self.rows[i]
        if r.world is None:
            r.world = self.batch.world(i)  # SimWorld(benchmark, episode seed, ...) from the row's draw
        r.world.clock = SimClock(float(self.clock[i]))
        return r.world

    def _generate_rows(self, asks: dict[int, tuple[str, int]]) -> dict[int, tuple[str, str]]:
        """One ``generate_data`` call per row of ``asks`` (row -> (teacher, n_examples)), batched per
        (teacher, n_examples) (``generate_batch`` on the rows' worlds); each row's ``("", "")`` if its call ran,
        else the refusal's (code, message). The run's sequence per call: parse and authorize, quote, reserve
        (or refuse), run, settle, let its time pass; then the adapter's record of the new dataset."""
        out: dict[int, tuple[str, str]] = {}
        groups: dict[tuple[str, int], list[int]] = {}
        for i, ask in asks.items():
            groups.setdefault(ask, []).append(i)
        for (teacher, n), members in groups.items():
            rows = np.array(members, np.intp)
            self._call(rows)
            try:
                tool = self._tool("generate_data", {"teacher": teacher, "n_examples": n})
                worlds = [self._world(i) for i in members]
                hold = _nano_up(worlds[0].rollout.quote_generate(tool).usd)
            except ActionError as err:
                self._refuse(rows, err.code)
                self._after_call(rows)
                out.update(dict.fromkeys(members, (err.code, err.message)))
                continue
            available = self.budget_n - self.spent_n[rows] - self.reserved_n[rows]
            fits = hold <= available
            for i, left in zip(rows[~fits].tolist(), available[~fits].tolist()):
                out[i] = ("insufficient_budget", f"reserve needs ${hold / NANO:.4f} but only ${left / NANO:.4f} "
                                                 "is available on this key")
            self._refuse(rows[~fits], "insufficient_budget")
            go = rows[fits]
            if go.size:
                ids = [self.rows[i].next("ds") for i in go.tolist()]
                cost, seconds = generate_batch([worlds[j] for j in np.flatnonzero(fits).tolist()], tool, ids)
                spent_before = self.spent_n[go].copy()
                self.spent_n[go] += min(_nano_near(cost), hold)
                self.clock[go] += seconds
                self.steps[go] += 1
                for i, ds_id, before in zip(go.tolist(), ids, spent_before.tolist()):
                    r = self.rows[i]
                    data = r.world.datasets[ds_id]
                    rate = float(data.stats().get("pass_rate", 0.0))
                    r.datasets[ds_id] = Dataset(ds_id, teacher, data.n, rate, clean=False)
                    r.pass_rates[teacher] = max(rate, r.pass_rates.get(teacher, -1.0))
                    r.usd_per_example[teacher] = round(int(self.spent_n[i]) / NANO - before / NANO, 9) / max(data.n, 1)
                    r.generations += 1
                    if data.n > 0:
                        r.train_set = ds_id
                    self._update_data_features(i)
                    out[i] = ("", "")
            self._after_call(rows)
        return out

    def _transform_rows(self, asks: dict[int, tuple[str, list[str]]]) -> dict[int, Dataset | None]:
        """One ``transform_data`` call per row of ``asks`` (row -> (operation, datasets)), batched per operation
        (``transform_batch`` on the rows' worlds); each row's adapter record of the new dataset, or None if
        refused. The run's sequence per call as :meth:`_generate_rows`."""
        out: dict[int, Dataset | None] = {}
        groups: dict[str, list[int]] = {}
        for i, (operation, _) in asks.items():
            groups.setdefault(operation, []).append(i)
        for operation, members in groups.items():
            rows = np.array(members, np.intp)
            self._call(rows)
            go, tools, holds = [], [], []
            for i in members:
                r = self.rows[i]
                try:
                    tool = self._tool("transform_data", {"operation": operation, "datasets": asks[i][1]})
                    for ref in tool.datasets:
                        if ref not in r.datasets:
                            raise ActionError("unknown_ref", f"no dataset {ref!r}")
                    hold = self._hold(i, self._world(i).rollout.quote_transform(tool).usd)
                except ActionError as err:
                    self._refuse_row(i, err.code)
                    out[i] = None
                    continue
                go.append(i)
                tools.append(tool)
                holds.append(hold)
            if go:
                ids = [self.rows[i].next("ds") for i in go]
                bills = transform_batch([self.rows[i].world for i in go], tools, ids)
                for i, ds_id, hold, (cost, seconds) in zip(go, ids, holds, bills):
                    self.reserved_n[i] -= hold
                    self.spent_n[i] += min(_nano_near(cost), hold)
                    self.clock[i] += seconds
                    self.steps[i] += 1
                    r = self.rows[i]
                    data = r.world.datasets[ds_id]
                    sources = [r.datasets[d] for d in asks[i][1] if d in r.datasets]
                    made = Dataset(ds_id, sources[0].teacher if sources else "", data.n,
                                   float(data.stats().get("pass_rate", 0.0)), clean=True)
                    r.datasets[made.id] = made
                    for src in sources:
                        src.cleaned = True
                    if made.n > 0:
                        r.train_set = made.id
                    self._update_data_features(i)
                    out[i] = made
            self._after_call(rows)
        return out

    def _evaluate(self, rows: np.ndarray, k: np.ndarray, ckpt: np.ndarray) -> None:
        """``evaluate`` (reserve the quote or refuse it; draw the result; a job), then ``wait`` for it."""
        self._call(rows)
        if "evaluate" not in self.tools:  # every track has it; kept for other scenarios
            self._refuse(rows, "forbidden_tool")
            self._after_call(rows)
            return
        for i in rows.tolist():  # the run takes a job id before it reserves
            self.rows[i].next("job")
        version = self._version(rows)
        harness = self._harness(version)
        usd = self.batch.dev_bill(rows, harness, k)[0]
        hold = _nano(usd, _nano_up)
        fits = hold <= self.budget_n - self.spent_n[rows] - self.reserved_n[rows]
        self._refuse(rows[~fits], "insufficient_budget")
        go, ckpt = rows[fits], ckpt[fits]
        if go.size:
            self._ran(go)
            out = self.batch.evaluate(self.ckpt_skill[go, ckpt], self.ckpt_memory[go, ckpt],
                                      self._harness(version[fits]), k=k[fits], split="dev", rows=go)
            self.reserved_n[go] += hold[fits]
            self.running[go], self.job_train[go] = True, False
            self.job_start[go], self.job_ready[go] = self.clock[go], self.clock[go] + out.seconds
            self.job_usd[go], self.job_score[go], self.job_counts[go] = out.usd, out.score, out.counts
            self.job_cand[go], self.job_k[go] = ckpt * N_VERSIONS + version[fits], k[fits]
        self._after_call(rows)
        waiting = go[~self.done[go]]
        while waiting.size:  # DiscreteMenu's blocking evaluate: wait until the job is in
            self._call(waiting)
            self._wait(waiting)
            waiting = waiting[~self.done[waiting] & self.running[waiting]]

    def _wait(self, rows: np.ndarray) -> None:
        """``wait`` for the running job (the clock jumps to it, or to the time limit)."""
        idle = ~self.running[rows]
        self._refuse(rows[idle], "no_running_jobs")
        go = rows[~idle]
        self._ran(go)
        ready = np.maximum(self.job_ready[go], self.clock[go])
        ends = ready <= self.time_limit_s
        self.clock[go] = np.where(ends, ready, np.maximum(self.clock[go], self.time_limit_s))
        self._collect(go[ends])
        self._after_call(rows)

    def _collect(self, rows: np.ndarray) -> None:
        """Finished jobs: settle their bills; record dev scores (run and adapter) or the new checkpoint."""
        if not rows.size:
            return
        charge = np.minimum(_nano(self.job_usd[rows], _nano_near), self.reserved_n[rows])
        self._settle(rows, charge)
        self.running[rows] = False
        trained = rows[self.job_train[rows]]
        for i in trained.tolist():
            r = self.rows[i]
            index = int(self.n_ckpt[i]) + 1
            if index >= self.ckpt_skill.shape[1]:
                self._grow(index + 1)
            self.ckpt_skill[i, index], self.ckpt_memory[i, index] = self.job_skill[i], self.job_memory[i]
            self.n_ckpt[i] = index
            assert r.pending is not None
            r.ckpt_data[index] = r.pending[1]
            r.pending = None
            self._update_data_features(i)
        rows = rows[~self.job_train[rows]]
        if not rows.size:
            return
        score, cand = self.job_score[rows], self.job_cand[rows]
        for i, c, value in zip(rows.tolist(), cand.tolist(), score.tolist()):  # one finished evaluation each
            scores = self.score_lists[i].setdefault(c, [])
            if not scores:
                self.n_candidates[i] += 1
                self.first_scored[i, c] = self.n_candidates[i]
            scores.append(value)
            self.n_scores[i, c] = len(scores)
            # the adapter's np.mean: below 8 values NumPy adds one by one, as reduce(add) does (not sum(),
            # which compensates since Python 3.12)
            self.means[i, c] = (reduce(operator.add, scores) / len(scores) if len(scores) < 8
                                else float(np.mean(scores)))
            if c == 0 and self.initial_dev[i] < 0:
                self.initial_dev[i] = value
            if value > self.best_dev[i]:
                self.best_dev[i] = value
        self.last_dev[rows] = score
        attempts = np.maximum(1, self.n_dev * self.job_k[rows])
        self.fail_shares[rows] = self.job_counts[rows, 1:] / attempts[:, None]
        self.eval_cost[rows] = self.job_usd[rows]
        self.evaluations[rows] += 1

    def _grow(self, checkpoints: int) -> None:
        """Room for ``checkpoints`` checkpoint indices (base included) in the per-checkpoint arrays."""
        extra = checkpoints - self.ckpt_skill.shape[1]
        pad = ((0, 0), (0, extra))
        self.ckpt_skill, self.ckpt_memory = np.pad(self.ckpt_skill, pad), np.pad(self.ckpt_memory, pad)
        self.ckpt_skill[:, -extra:] = self.ckpt_memory[:, -extra:] = np.nan
        pad = ((0, 0), (0, extra * N_VERSIONS))
        self.n_scores, self.means, self.first_scored = (np.pad(a, pad) for a in
                                                        (self.n_scores, self.means, self.first_scored))

    def _settle(self, rows: np.ndarray, charge: np.ndarray) -> None:
        self.spent_n[rows] += charge
        self.reserved_n[rows] = 0

    def _submit(self, rows: np.ndarray, cand: np.ndarray) -> None:
        self._call(rows)
        if "submit" not in self.tools:
            self._refuse(rows, "forbidden_tool")
            self._after_call(rows)
            return
        self._ran(rows)
        final = self._official(rows, cand)
        self._end(rows, final, terminated=True, reason="submitted")

    def _after_call(self, rows: np.ndarray) -> None:
        """The run's limits after a call, in its order: steps, refusals, time, money."""
        rows = rows[~self.done[rows]]
        if not rows.size:
            return
        s = self.scenario
        reason = np.select(
            [self.steps[rows] >= s.max_steps, self.refusals[rows] >= s.refusal_limit,
             self.clock[rows] >= self.time_limit_s, ~self.running[rows] & (self._available_usd(rows) < MIN_USD)],
            ["step limit", "refusal limit", "time limit", "budget exhausted"], "")
        ending = reason != ""
        if ending.any():
            ends = rows[ending]
            self._end(ends, self.initial_official[ends], terminated=False, reason=reason[ending])

    def _end(self, rows: np.ndarray, final: np.ndarray, *, terminated: bool, reason: Any) -> None:
        """The episode's result: running jobs billed for the share that ran, the normalized gain."""
        self._bill_running(rows)
        self.done[rows] = True
        self.end_reason[rows] = reason
        self._final[rows] = final
        self._reward[rows] = [normalized_gain(i, f) for i, f in zip(self.initial_official[rows].tolist(),
                                                                   np.asarray(final, float).tolist())]
        (self._terminated if terminated else self._truncated)[rows] = True

    def _bill_running(self, rows: np.ndarray) -> None:
        """Cancel the running jobs of ``rows``, billed for the share of their duration that ran
        (``ResearchRun._settle_running``)."""
        busy = rows[self.running[rows]]
        if busy.size:
            span = self.job_ready[busy] - self.job_start[busy]
            fraction = np.where(span > 0, np.minimum(1.0, np.maximum(0.0, (self.clock[busy] - self.job_start[busy])
                                                                    / np.where(span > 0, span, 1.0))), 1.0)
            charge = np.minimum(_nano(self.job_usd[busy] * fraction, _nano_near), self.reserved_n[busy])
            self._settle(busy, charge)
            self.running[busy] = False

    def _abandon(self, rows: np.ndarray, reason: str) -> None:
        """Episodes of ``rows`` cut short (a reset or ``close``): running jobs billed for the share that
        ran, as the scalar env's ``abandon``, and the episode written to the ledger."""
        rows = rows[self._open[rows]]
        if rows.size:
            self._bill_running(rows)
            self.end_reason[rows] = reason
            self._write(rows, result=False)

    def _write(self, rows: np.ndarray, *, result: bool = True) -> None:
        """Write the episodes of ``rows`` (ended) to the ledger, one account each (the scenario's budget, a
        key id of its own): the episode's whole spend reserved and settled in one entry, audited with its
        seed, steps, refusals, end and (for an episode that ended here, not one cut short) its official
        result; an episode that spent nothing is one audit record. The chain is ``rsigym audit verify``'s;
        the ledger's own guards check again that no episode spent more than its budget."""
        if not self.write_episodes:
            self._open[rows] = False
            return
        ledger, budget = self.platform.ledger, self.scenario.budget_usd
        for i in rows.tolist():
            self._keys += 1
            key = PlatformKey.key_id(f"{self._key_secret}-{self._keys}")
            ledger.open_account(key, budget)
            event: dict[str, Any] = {
                "key": key, "tool": "episode", "decision": "allowed", "seed": int(self.episode_seeds[i]),
                "steps": int(self.steps[i]), "refusals": int(self.refusals[i]), "end_reason": str(self.end_reason[i]),
                "elapsed_h": float(self.clock[i]) / 3600.0}
            if result:
                initial, final = float(self.initial_official[i]), float(self._final[i])
                event.update(initial_score=initial, official_score=final, normalized_gain=normalized_gain(initial, final))
            spent = int(self.spent_n[i]) / NANO
            if spent:
                ledger.settle(ledger.reserve(key, spent, audit=event, label="episode"), spent, audit=event)
            else:
                ledger.record(event)
        self._open[rows] = False

    # ------------------------------------------------------------------ state

    def _reset_rows(self, rows: np.ndarray, seeds: Sequence[int | None]) -> None:
        """New episodes at ``rows``: the episode seed as ``ResearchEnv.reset`` draws it, the world it gives."""
        episode = []
        for i, seed in zip(rows.tolist(), seeds):
            if seed is not None or self._rngs[i] is None:
                self._rngs[i], _ = seeding.np_random(seed)
            episode.append(int(self._rngs[i].integers(2**31 - 1)))
            self.score_lists[i] = {}
            self.rows[i] = _Rows()
        self.episode_seeds[rows] = episode
        self.batch.reset(rows, episode)
        for name in ("clock", "spent_n", "reserved_n", "steps", "refusals", "fixed", "harness_read", "last_error",
                     "n_scores", "means", "first_scored", "n_candidates", "running", "fail_shares", "eval_cost",
                     "evaluations", "done", "n_ckpt", "can_clean", "has_train_set"):
            getattr(self, name)[rows] = 0
        self.ckpt_skill[rows] = self.ckpt_memory[rows] = np.nan
        self.ckpt_skill[rows, 0], self.ckpt_memory[rows, 0] = self.batch.base_skill[rows], 0.0
        self.data_features[rows] = self._no_data_features()
        self.end_reason[rows] = ""
        self._open[rows] = True
        self.initial_dev[rows] = self.best_dev[rows] = self.last_dev[rows] = -1.0
        self.initial_official[rows] = self._official(rows, np.zeros(rows.size, np.int64))

    def _official(self, rows: np.ndarray, cand: np.ndarray) -> np.ndarray:
        """The official avg@k of a candidate (checkpoint and harness version; the world's fixed draw)."""
        ckpt, version = np.divmod(cand, N_VERSIONS)
        return self.batch.evaluate(self.ckpt_skill[rows, ckpt], np.zeros(rows.size), self._harness(version),
                                   k=self.scenario.official_k, split="official", rows=rows).score

    def _version(self, rows: np.ndarray) -> np.ndarray:
        """The latest harness version (its bit pattern) of each row."""
        return self.fixed[rows] @ (1 << np.arange(len(DEFECTS)))

    def _harness(self, version: np.ndarray) -> HarnessArrays:
        t = self.harness_table
        return HarnessArrays(*(getattr(t, f)[version] for f in HarnessArrays.__dataclass_fields__))

    def _available_usd(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        return (self.budget_n - self.spent_n[rows] - self.reserved_n[rows]) / NANO

    def _mask_constants(self) -> np.ndarray:
        """The mask entries that depend only on the scenario (tools, teachers, locks); ``MenuAdapter.mask``."""
        s, tools = self.scenario, self.tools
        out = np.zeros(len(MENU), bool)
        for i, m in enumerate(MENU):
            if m.kind in ("eval_latest", "eval_base"):
                out[i] = "evaluate" in tools
            elif m.kind == "fix":
                out[i] = "edit_harness" in tools
            elif m.kind == "gen":
                out[i] = "generate_data" in tools and m.arg[0] in s.permissions.teachers
            elif m.kind == "clean":
                out[i] = "transform_data" in tools
            elif m.kind == "train":
                try:
                    authorize(s, Train(dataset="x", **({} if m.arg == DEFAULT_LR else {"learning_rate": m.arg})))
                    out[i] = "train" in tools
                except ActionError:
                    out[i] = False
            elif m.kind in ("submit_best", "submit_latest"):
                out[i] = "submit" in tools
        return out

    def _mask(self) -> np.ndarray:
        """``MenuAdapter.mask`` per row."""
        mask = np.tile(self._static_mask, (self.num_envs, 1))
        fix = slice(MENU_INDEX[f"fix:{DEFECTS[0]}"], MENU_INDEX[f"fix:{DEFECTS[-1]}"] + 1)
        mask[:, fix] &= ~(self.fixed & self.harness_read[:, None])
        mask[:, MENU_INDEX["clean"]] &= self.can_clean
        train = slice(MENU_INDEX[MENU[_KIND.tolist().index("train")].name], MENU_INDEX["wait"])
        mask[:, train] &= self.has_train_set[:, None]
        mask[:, MENU_INDEX["wait"]] = ("wait" in self.tools) & self.running & ~self.done
        return mask

    @staticmethod
    def _no_data_features() -> np.ndarray:
        out = np.zeros(len(FEATURES))
        out[_F["train_set_pass_rate"]] = -1.0
        out[_F[f"pass_rate:{TEACHERS[0]}"]:_F[f"usd_per_100:{TEACHERS[-1]}"] + 1] = -1.0
        return out

    def _update_data_features(self, i: int) -> None:
        """Row i's data and training features and mask bits (``MenuAdapter.features``), after a data call."""
        r, f, budget = self.rows[i], self.data_features[i], max(self.scenario.budget_usd, 1e-9)
        raws = bool(_raws(r))
        ts = r.datasets.get(r.train_set) if r.train_set else None
        f[_F["has_raw_data"]], f[_F["has_train_set"]] = float(raws), float(ts is not None)
        f[_F["train_set_size"]] = math.log1p(ts.n) / math.log1p(20_000) if ts else 0.0
        f[_F["train_set_pass_rate"]] = ts.pass_rate if ts else -1.0
        f[_F["train_set_clean"]] = float(ts.clean) if ts else 0.0
        newest = int(self.n_ckpt[i])
        f[_F["has_checkpoint"]] = float(newest > 0)
        f[_F["checkpoint_current"]] = float(newest > 0 and r.ckpt_data.get(newest) == r.train_set)
        f[_F["trainings"]] = min(r.trainings, 3) / 3
        for t in TEACHERS:
            f[_F[f"pass_rate:{t}"]] = r.pass_rates.get(t, -1.0)
            f[_F[f"usd_per_100:{t}"]] = min(1.0, 100 * r.usd_per_example[t] / budget) if t in r.usd_per_example else -1.0
        f[_F["generations"]] = min(r.generations, 5) / 5
        self.can_clean[i], self.has_train_set[i] = raws, r.train_set is not None

    def _features(self) -> np.ndarray:
        """``MenuAdapter.features`` per row (float64, then float32 and clipped as there)."""
        n, s = self.num_envs, self.scenario
        f = self.data_features.copy()
        f[:, 0] = np.minimum(self._available_usd(), s.budget_usd) / max(s.budget_usd, 1e-9)
        time_h = self.time_limit_s / 3600.0
        f[:, 1] = (np.maximum(0.0, self.time_limit_s - self.clock) / 3600.0) / max(time_h, 1e-9)
        f[:, 2] = np.minimum(self.steps, s.max_steps) / max(s.max_steps, 1)
        f[:, 3], f[:, 4], f[:, 5] = self.initial_dev, self.best_dev, self.last_dev
        every = np.arange(n)
        version = self._version(every)
        for column, cand in ((6, self.n_ckpt * N_VERSIONS + version), (7, version)):
            scored = self.n_scores[every, cand] > 0
            f[:, column] = np.where(scored, self.means[every, cand], -1.0)
        running = self.running & ~self.done
        f[:, _F["jobs_running"]] = running / 2
        f[:, _F["train_running"]] = running & self.job_train
        f[:, _F["eval_running"]] = running & ~self.job_train
        f[:, _F[f"unfixed:{DEFECTS[0]}"]:_F[f"unfixed:{DEFECTS[-1]}"] + 1] = ~(self.fixed & self.harness_read[:, None])
        f[:, _F[f"fail_share:{FAILURE_MODES[0]}"]:_F[f"fail_share:{FAILURE_MODES[-1]}"] + 1] = self.fail_shares
        f[:, _F["eval_cost"]] = np.minimum(1.0, self.eval_cost / max(s.budget_usd, 1e-9))
        f[:, _F["evaluations"]] = np.minimum(self.evaluations, 5) / 5
        f[:, _F[f"benchmark:{s.benchmark}"]] = 1.0
        f[:, _F[f"track:{s.track}"]] = 1.0
        f[:, _F["last_error"]] = self.last_error
        f[:, _F["harness_read"]] = self.harness_read
        return np.clip(f.astype(np.float32), -1.0, 1.0)

    def _end_info(self, info: dict[str, Any], rows: np.ndarray) -> None:
        """The end keys of the rows whose episode ended this step (``_key`` masks mark them)."""
        n = self.num_envs
        s = self.scenario
        values = {
            "initial_score": self.initial_official, "official_score": self._final,
            "normalized_gain": self._reward, "best_dev_score": np.where(self.best_dev < 0, np.nan, self.best_dev),
            "initial_dev_score": np.where(self.initial_dev < 0, np.nan, self.initial_dev),
            "dev_evaluations": self.n_scores.sum(axis=1), "end_reason": self.end_reason, "steps": self.steps,
            "refusals": self.refusals, "spend_usd": self.spent_n / NANO, "budget_usd": np.full(n, s.budget_usd),
            "elapsed_h": self.clock / 3600.0,
        }
        present = np.zeros(n, bool)
        present[rows] = True
        for key in END_KEYS:
            info[key], info[f"_{key}"] = np.array(values[key], copy=True), present.copy()


def _raws(r: _Rows) -> list[Dataset]:
    """``MenuAdapter._raws``: generated datasets not cleaned yet, oldest first."""
    return [d for d in r.datasets.values() if not d.clean and not d.cleaned and d.n > 0]


def _fit(n: int, message: str, reserve: float) -> int:
    """``MenuAdapter._fit`` of a refusal's message."""
    return MenuAdapter._fit(n, {"message": message}, reserve)
