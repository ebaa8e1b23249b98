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
  mean is the adapter's ``np.mean`` of the scores: below 8 scores NumPy adds them one by one, which is a
  running sum (``score_sum``); from 8 on its pairwise sum, so each row keeps its episode's dev scores in
  order with their candidates (``score_log``, ``score_cand``: (N, evaluations so far), grown on demand) and a
  candidate scored 8 times or more gets its list, its first 7 from there (rare); ``initial_dev``,
  ``best_dev``, ``last_dev``;
* one running job per row (the menu's evaluations and trainings block: start, then ``wait`` for it):
  ready time, cost, and its result (an evaluation's score and failure counts, drawn when it starts as
  the scalar world does; a training's checkpoint state);
* datasets, struct-of-arrays: slot j of a row is the j-th dataset its episode made (``ds-(j+1)``), with
  the sim's counts (``ds_n``, ``ds_correct``, ``ds_dup``, ``ds_tokens``; no dev prompts: the menu generates
  synthetic data only) and teacher skill, and the adapter's record of it (teacher, pass rate to 4 digits
  as ``stats()`` gives it, made by a transform, cleaned); per row the train set, the pool per teacher,
  the dataset of the newest checkpoint and of the running training, best pass rate and dollars per
  example per teacher, generations and trainings; each world's ``data`` and ``train`` stream keys and
  counters, teacher accuracies (drawn with the world) and calibrated teacher skills (at first use);
* the adapter's memory for the features: ``harness_read``, failure shares and cost of the last finished
  evaluation, evaluations finished, ``last_error``. Features and mask are computed from the arrays.

Every macro runs as array passes over the rows that chose it; no per-row object (``SimWorld``,
``Dataset``, plan generator) is on the path. ``gen`` and ``clean`` follow the adapter's plans
(``MenuAdapter._gen``, ``._clean``) a phase at a time: each phase is one pass over the rows still in their
plan (a generation round, :meth:`MenuArrayEnv._generate`: the full-size call and, for the rows the budget
refused, the cut-to-fit call, billed; a max generation is up to four rounds, and the draws of all the
macro's calls are made at its end in one pass, :meth:`MenuArrayEnv._record_generations`, since a cost is a
function of the size alone and nothing in the plan reads a dataset; a clean: filter,
then dedupe, of the k-th raw dataset of the newest raw one's teacher, then the mix into the pool, one call
per row each, :meth:`~MenuArrayEnv._transform`; the filters and dedupes of all a step's datasets first run
as two passes, as if every call ran — the draws are counter-based, so the k-th filter's is number
``counter + 2k`` — and a row keeps them up to its first call where that is not so, :meth:`~MenuArrayEnv._clean_ahead`),
and a call is: permission (once per teacher or
operation), quote, reserve or refuse, the world's aggregate draw from its own ``data`` stream
(``generate_datasets``, ``filter_datasets``, ``dedupe_datasets`` and ``mix_datasets`` as element-wise
NumPy over the rows), bill, time, the adapter's record, the run's limits. ``train`` always starts from
base, so ``train_model``'s lineage terms vanish and a checkpoint is a closed form of the dataset's counts
and the world's ``train`` draw (its ``math.exp`` and ``**`` stay Python's, per training row). The step's
evaluations (dev ones and submits' official ones) are one ``SimBatch.evaluate`` pass; each row's stats of its
last two distinct evaluations are remembered (``SimBatch.remember_stats``: a submit of the unchanged initial
system, a dev evaluation repeated). A new episode's world and its initial official score are drawn ahead
(:meth:`MenuArrayEnv._draw_ahead`): the seeds a row's generator will give are known, so when some row runs out,
every autoresetting row gets up to ``_WORLDS_AHEAD`` worlds ahead in one pass over all of them (each world is
what its seed gives alone) and a reset takes its world from there (``SimBatch.take``, remembered stats and all). Python's
own ``round``, ``_nano_up`` and ``_nano_near`` are NumPy passes that give the same floats (``round_digits``,
``nano_up``, ``nano_near``).

Shared with the scalar env (parity by construction): the menu, mask and feature definitions
(``wrappers/menu.py``: ``MENU``, ``FEATURES``, ``FIT_SHARE``), scenario loading, the episode seed
(Gymnasium's ``np_random``, as ``ResearchEnv.reset``), world draws, evaluation kernels and bills
(``SimBatch``), the data model's draws and constants (``binomial``, ``norm_ppf``, ``calibrate_skill``,
``truncated_mean_tokens``, stream keys), tool validation and permissions, harness version ids, prices,
``normalized_gain``, the run's ``MIN_USD``.

Re-implemented (parity by test): the run's call sequence per macro (``ResearchRun.execute``: step count,
refusals, limits in the run's order — steps, refusals, time, money), the ledger's reserve/settle
arithmetic, the clock's ``wait``, the run's dev bookkeeping, the adapter's features, mask and macro
plans, the sim's generate/transform/train bookkeeping on counts (``SimRollout``, ``SimTrain``). ``tests/test_menu_vector.py`` plays seeded random action sequences over the whole menu (mostly
unmasked entries, some masked ones that the env refuses) and the shipped RL policy through this env
and through ``DiscreteMenu`` on the scalar env, on every track and benchmark, and compares every row.

Money and audit: the money lives in the arrays above (:attr:`MenuArrayEnv.budget_left_usd`,
:attr:`~MenuArrayEnv.spent_usd`, :attr:`~MenuArrayEnv.refusals`, :attr:`~MenuArrayEnv.episodes`, as
``ResearchVectorEnv`` names them). Each finished episode (and one a ``reset`` or ``close`` cuts short) is
written to a ledger at the end of the step it ends in: an account of its own (a fresh platform key with the
scenario's budget), its whole spend reserved and settled, the settlement audited with its seed, steps,
refusals, end and official result, on a hash-chained audit log that ``rsigym audit verify`` accepts
(``ledger_path=``: a file; default: in memory). That is batched per episode, not per tool call: the
per-call trail (each reserve, settle and refusal) is the scalar env's and the per-env route's. The episodes
that end in a step are written in one transaction (``Ledger.open_settled``: the same accounts and audit
records as opening, reserving and settling each in turn). ``write_episodes="step"`` batches further: one account and one audited entry per step listing the episodes
that ended in it (each one's spend checked against its budget first); ``False`` writes nothing.

Autoreset: ``NEXT_STEP`` (default), ``SAME_STEP`` (``final_obs``/``final_info``) and ``DISABLED``
(``reset(options={"reset_mask": mask})``), as ``ResearchVectorEnv``.

Not here (use ``array=False``): the text log and the rest of the scalar ``info`` (``result``, ``message``,
``events``, ``calls``, ``macro``, ``metrics``, the reset keys but ``seed``), ``blocking=False``, non-sim
worlds. Speed: ``bench/README.md`` ("The vector sim"). Per-row Python left on the path: a row's episode
seeds, drawn from its Gymnasium generator a window at a time, a training row's two ``math`` calls, Python's ``round`` where a
value is within float noise of a half, and the audit event (its JSON and hash) per finished episode (default).

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
import secrets
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import gymnasium as gym

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from .catalog import DEFECTS, FAILURE_MODES
from .errors import ActionError
from .harness import HarnessStore
from .platform.permissions import authorize
from .platform.ledger import NANO, _nano_near
from .prices import PER_M
from .run import MIN_USD
from .env import resolve_scenario
from .platform.core import Platform, PlatformKey
from .platform.ledger import Ledger
from .scenario import Scenario
from .tools import GenerateData, Train, parse_action
from .worlds.sim.batch import HarnessArrays, SimBatch
from .worlds.sim.benchmarks import TEACHER_DUPLICATES
from .worlds.sim.draws import binomial, norm_ppf, uniforms
from .worlds.sim.model import (DEDUPE_RECALL, DUPLICATE_WEIGHT, FILTER_FALSE_PASS, FILTER_RECALL, GENERATE_DRAWS,
                               INTENSITY_SCALE, TRAIN_NOISE, TrainSettings, calibrate_skill, truncated_mean_tokens)
from .worlds.sim.world import TRANSFORM_SECONDS_PER_EXAMPLE, TRANSFORM_STARTUP_S
from .wrappers.menu import (DEFAULT_LR, FEATURES, FIT_SHARE, FIXES, GEN_SIZES, MAX_CHUNKS,
                            MAX_RESERVE, MENU, MENU_INDEX, MISSING, TEACHERS, _option_line)

__all__ = ["ARRAY_MACROS", "INFO_KEYS", "EpisodeRecords", "MenuArrayEnv", "menu_actions", "reset_args",
           "write_episode_records"]

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
_GROUP = np.array([{"eval_latest": "eval", "eval_base": "eval", "submit_best": "submit",
                    "submit_latest": "submit"}.get(m.kind, m.kind) for m in MENU])
_GROUPS = sorted(set(_GROUP.tolist()))  # the macro groups in the order a step runs them
_GROUP_ID = np.array([_GROUPS.index(group) for group in _GROUP.tolist()], np.int64)
_K = np.array([m.arg if m.kind in ("eval_latest", "eval_base") else 0 for m in MENU], np.int64)
_TEACHER = np.array([TEACHERS.index(m.arg[0]) if m.kind == "gen" else -1 for m in MENU], np.int64)
_GEN_N = np.array([m.arg[1] if m.kind == "gen" else 0 for m in MENU], np.int64)
_MEAN_EXACT = 8  # from this many scores on, a candidate's mean is NumPy's (pairwise), below it a running sum
_MAX_TOKENS = GenerateData.model_fields["max_tokens_per_example"].default  # the menu's generations leave it
_SEEDS_AHEAD = 16  # a row's window of episode seeds (and worlds) drawn ahead: integers() in batches is the same draws
_WORLDS_AHEAD = 8  # an autoresetting row's worlds drawn ahead when some row runs out (MenuArrayEnv._draw_ahead)
_DRAW_CHUNK = 2048  # worlds drawn (and officially evaluated) per pass ahead: bounds the passes' memory
_EPISODE_START: tuple[tuple[str, float], ...] = (  # what a new episode starts with (MenuArrayEnv._reset_rows)
    *((name, 0) for name in ("clock", "spent_n", "reserved_n", "steps", "refusals", "fixed", "version", "harness_read",
                             "last_error", "n_candidates", "running", "fail_shares", "eval_cost", "evaluations", "done",
                             "n_ckpt", "n_ds", "generations", "trainings", "data_counter", "train_counter")),
    *((name, -1) for name in ("train_set", "ckpt_ds", "job_ds", "pools", "pass_rates", "initial_dev", "best_dev",
                              "last_dev")),
    ("usd_per_example", np.nan), ("teacher_skill", np.nan))


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


def nano_up(usd: np.ndarray) -> np.ndarray:
    """The ledger's :func:`~rsigym_env.platform.ledger._nano_up` of each dollar amount (the same float steps).

    >>> from rsigym_env.platform.ledger import _nano_up
    >>> values = np.array([0.1, 1e-9, 0.3333333333, 2.5e-10, 123.456789012])
    >>> nano_up(values).tolist() == [_nano_up(v) for v in values.tolist()]
    True
    """
    exact = np.asarray(usd, float) * NANO
    near = np.rint(exact)
    return np.where(np.abs(exact - near) <= 1e-6 + exact * 1e-15, near, np.ceil(exact)).astype(np.int64)


def nano_near(usd: np.ndarray) -> np.ndarray:
    """The ledger's :func:`~rsigym_env.platform.ledger._nano_near` (``round``: half to even) of each amount.

    >>> nano_near(np.array([2.5e-9, 3.5e-9, 0.1])).tolist() == [_nano_near(v) for v in (2.5e-9, 3.5e-9, 0.1)]
    True
    """
    return np.rint(np.asarray(usd, float) * NANO).astype(np.int64)


def round_digits(x: np.ndarray, digits: int) -> np.ndarray:
    """Python's ``round(v, digits)`` of each value (correctly rounded, half to even on the exact binary value):
    ``rint(v * 10**digits) / 10**digits``, which is the same wherever the product is not within float noise
    of a half; those few values are rounded by Python itself.

    >>> values = np.array([0.12345, 0.00005, 2.675, 1 / 3, 0.5, 1234.56785])
    >>> round_digits(values, 4).tolist() == [round(v, 4) for v in values.tolist()]
    True
    """
    x = np.asarray(x, float)
    scale = 10.0 ** digits
    y = x * scale
    out = np.rint(y) / scale
    size = np.abs(y)  # |y| - trunc(|y|) is |y - trunc(y)| exactly (both subtractions are exact)
    near_half = np.abs(size - np.trunc(size) - 0.5) <= 4 * np.spacing(size)  # the product's rounding
    if near_half.any():
        out[near_half] = [round(v, digits) for v in x[near_half].tolist()]
    return out


def _normalized_gains(initial: np.ndarray, final: np.ndarray) -> np.ndarray:
    """:func:`~rsigym_env.scoring.normalized_gain` of each pair (the same IEEE operations, element-wise).

    >>> from rsigym_env.scoring import normalized_gain
    >>> i, f = np.array([0.2, 1.0, 0.5]), np.array([0.6, 1.0, 0.25])
    >>> _normalized_gains(i, f).tolist() == [normalized_gain(a, b) for a, b in zip(i.tolist(), f.tolist())]
    True
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(initial >= 1.0, 0.0, (final - initial) / (1.0 - initial))


def _first_true(mask: np.ndarray, count: int) -> np.ndarray:
    """(M, count): the column indices of the first ``count`` True entries of each row, in order (-1 past the
    row's last).

    >>> _first_true(np.array([[False, True, True], [False, False, False]]), 2).tolist()
    [[1, 2], [-1, -1]]
    """
    order = np.argsort(~mask, axis=1, kind="stable")[:, :count]
    return np.where(np.take_along_axis(mask, order, axis=1), order, -1)


def _log1p_table(size: int) -> np.ndarray:
    """``math.log1p(n) / math.log1p(20_000)`` for n < size: ``MenuAdapter.features``' train_set_size, by
    ``math`` as there."""
    top = math.log1p(20_000)
    return np.array([math.log1p(n) / top for n in range(size)])


def array_scenario(scenario: str | Path | Scenario | None = None, **kwargs: Any) -> Scenario:
    """The scenario of an array env (``resolve_scenario``'s arguments); the world must be the sim.

    >>> array_scenario(track="harness", benchmark="aime").world
    'sim'
    """
    s = resolve_scenario(scenario, **kwargs)
    if s.world != "sim":
        raise ValueError(f"the array env runs the sim world only, not {s.world!r}")
    return s


def check_write_episodes(write_episodes: Any) -> None:
    """``write_episodes`` is ``True``/``"episode"``, ``"step"`` or ``False``; anything else is a ValueError."""
    if write_episodes not in (True, False, "episode", "step"):
        raise ValueError(f"write_episodes is True, False, 'episode' or 'step', got {write_episodes!r}")


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
        write_episodes: write each finished episode to the ledger (default, ``True`` or ``"episode"``: an
            account and an audited entry per episode); ``"step"``: one account and one audited entry per step
            for the episodes that ended in it; ``False`` skips it (a training run nobody audits). The money
            is reserved, refused and settled in the arrays all the same (``bench/README.md``: what each costs).

    Money per env, in arrays (as ``ResearchVectorEnv``'s): :attr:`budget_left_usd`, :attr:`spent_usd`,
    :attr:`refusals` (the current episode's) and :attr:`episodes` (finished ones).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 1, *, scenario: str | Path | Scenario | None = None, track: str | None = None,
                 world: str | None = None, benchmark: str | None = None, budget_usd: float | None = None,
                 max_steps: int | None = None, time_limit_h: float | None = None,
                 world_options: dict[str, Any] | None = None, ledger_path: str | Path | None = None,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, write_episodes: bool | str = True):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        s = self.scenario = array_scenario(scenario, track=track, world=world, benchmark=benchmark,
                                           budget_usd=budget_usd, max_steps=max_steps, time_limit_h=time_limit_h,
                                           world_options=world_options)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": self.autoreset_mode}
        self.platform = Platform(Ledger(ledger_path))
        n = self.num_envs = int(num_envs)
        self.single_action_space = spaces.Discrete(len(MENU))
        self.action_space = spaces.MultiDiscrete(np.full(n, len(MENU)))
        self.single_observation_space = spaces.Box(-1.0, 1.0, shape=(len(FEATURES),), dtype=np.float32)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(n, len(FEATURES)), dtype=np.float32)
        self.budget_n = _nano_near(s.budget_usd)
        # available / NANO < MIN_USD, in nano-dollars: the smallest integer whose dollars are not below it
        self._min_n = next(v for v in range(math.floor(MIN_USD * NANO) - 2, math.ceil(MIN_USD * NANO) + 3)
                           if v / NANO >= MIN_USD)
        self.time_limit_s = s.time_limit_h * 3600.0
        self.tools = set(s.tools())
        sandbox = s.permissions.sandbox
        self.world_kwargs = dict(vcpus=sandbox.vcpus, memory_gib=sandbox.memory_gib, options=s.world_options)
        self.batch = SimBatch.make(s.benchmark, [0] * n, **self.world_kwargs)  # what from_scenario builds
        self.batch.remember_stats()  # a row re-evaluating a candidate (a submit of an evaluated one, ...) skips its stats
        self.version_ids, files = harness_versions(self.batch)
        self.harness_table = HarnessArrays.of(files)
        for derived in ("active", "applied", "bill_code", "memo_code"):  # made once: _harness gathers them
            getattr(self.harness_table, derived)
        self.n_dev = self.batch.n_tasks
        self._static_mask = self._mask_constants()
        self._rngs: list[np.random.Generator | None] = [None] * n
        z = lambda dtype=float: np.zeros(n, dtype)  # noqa: E731
        # each row's next episode seeds, drawn from its generator ahead (the same numbers as one integers() call
        # per reset, which is what ResearchEnv.reset makes), and the worlds they give with their initial official
        # scores, drawn ahead in passes over many rows (_draw_ahead): slot j of row i is _store row i * S + j.
        # Row i's seeds are in slots [_seed_at, _seed_end), its worlds in [_seed_at, _world_end); _auto: it was
        # reset without a seed since its generator was made (worlds are drawn ahead only for such rows)
        self._seeds_ahead = np.zeros((n, _SEEDS_AHEAD), np.int64)
        self._seed_at, self._seed_end, self._world_end, self._auto = z(np.int64), z(np.int64), z(np.int64), z(bool)
        self._store = SimBatch.repeat(s.benchmark, 0, n * _SEEDS_AHEAD, **self.world_kwargs)
        self._store.remember_stats()  # the initial official evaluation's stats come along to the episode's world
        self._store_initial, self._store_keys = np.zeros(n * _SEEDS_AHEAD), np.zeros((2, n * _SEEDS_AHEAD), np.uint64)
        self.episode_seeds = np.zeros(n, np.int64)
        self.initial_official, self._final, self.clock, self.done = z(), z(), z(), z(bool)
        self.spent_n, self.reserved_n, self.steps, self.refusals = z(np.int64), z(np.int64), z(np.int64), z(np.int64)
        self.end_reason = np.full(n, "", dtype=object)
        self.fixed = np.zeros((n, len(DEFECTS)), bool)
        self.version = z(np.int64)  # fixed as bits: the latest harness version
        self.harness_read, self.last_error = z(bool), z(bool)
        # checkpoints: index 0 is base; n_ckpt finished ones follow (skill and dev memory of each)
        self.ckpt_skill, self.ckpt_memory, self.n_ckpt = np.zeros((n, 1)), np.zeros((n, 1)), z(np.int64)
        # candidates: checkpoint index * N_VERSIONS + harness version
        self.n_scores = np.zeros((n, N_VERSIONS), np.int64)
        self.means = np.zeros((n, N_VERSIONS))
        self.first_scored = np.zeros((n, N_VERSIONS), np.int64)  # 0: never; else the order (1, 2, ...)
        self.score_sum = np.zeros((n, N_VERSIONS))  # running sum of a candidate's scores (below _MEAN_EXACT)
        # each row's dev scores of the episode in the order they came, and their candidates (score i: the i-th
        # evaluation finished), for NumPy's mean from 8 scores on
        self.score_log, self.score_cand = np.zeros((n, 8)), np.zeros((n, 8), np.int64)
        self._score_lists: dict[tuple[int, int], list[float]] = {}  # (row, candidate) -> scores, from 8 on
        self.n_candidates = z(np.int64)
        self.initial_dev, self.best_dev, self.last_dev = z(), z(), z()
        # the running job (one at most: the menu's evaluations and trainings wait for theirs)
        self.running, self.job_train, self.job_start, self.job_ready, self.job_usd = z(bool), z(bool), z(), z(), z()
        self.job_score, self.job_cand, self.job_k = z(), z(np.int64), z(np.int64)
        self.job_counts = np.zeros((n, 1 + len(FAILURE_MODES)), np.int64)
        self.job_skill, self.job_memory = z(), z()
        self.fail_shares = np.zeros((n, len(FAILURE_MODES)))
        self.eval_cost, self.evaluations = z(), z(np.int64)
        self.episodes = z(np.int64)
        self._open = z(bool)  # an episode is under way and not yet written to the ledger
        check_write_episodes(write_episodes)
        self.write_episodes = "episode" if write_episodes is True else write_episodes
        self._key_secret, self._keys = secrets.token_hex(16), 0  # episode i's account: key_id(f"{secret}-{i}")
        self._deferred: list[EpisodeRecords] | None = None  # defer_episodes(): records kept, not written
        self._tools: dict[tuple, Any] = {}  # a data call's arguments -> its authorized tool (or refusal)
        self._drawn: list[tuple[np.ndarray, ...]] = []  # a gen macro's draws, made at its end (_record_generations)
        # datasets: slot j of a row is the j-th dataset its episode made (counts as the sim's Dataset; the
        # adapter's record: teacher, rounded pass rate, made by a transform, cleaned); grown on demand
        self.n_ds = z(np.int64)
        self.ds_n, self.ds_correct, self.ds_dup, self.ds_tokens, self.ds_teacher = (
            np.zeros((n, 8), np.int64) for _ in range(5))
        self.ds_skill, self.ds_rate = np.zeros((n, 8)), np.zeros((n, 8))
        self.ds_clean, self.ds_cleaned = np.zeros((n, 8), bool), np.zeros((n, 8), bool)
        n_teachers = len(TEACHERS)
        self.train_set, self.ckpt_ds, self.job_ds = z(np.int64) - 1, z(np.int64) - 1, z(np.int64) - 1
        self.pools = np.full((n, n_teachers), -1, np.int64)  # the adapter's pool per teacher (a slot)
        self.pass_rates, self.usd_per_example = np.full((n, n_teachers), -1.0), np.full((n, n_teachers), np.nan)
        self.generations, self.trainings = z(np.int64), z(np.int64)
        self.teacher_acc, self.teacher_skill = np.zeros((n, n_teachers)), np.full((n, n_teachers), np.nan)
        self.data_keys, self.train_keys = z(np.uint64), z(np.uint64)  # each world's data and train streams
        self.data_counter, self.train_counter = z(np.uint64), z(np.uint64)
        self._data_constants()
        self._size_table = _log1p_table(1 << 16)
        self._episode_blocks()
        self._started = False

    def _episode_blocks(self) -> None:
        """The arrays an episode's reset sets to their start values (``_EPISODE_START``) become column views of
        one block per dtype, so a reset writes each block's rows once (``_blocks``: block and its start row)."""
        n, by_dtype = self.num_envs, {}
        for name, start in _EPISODE_START:
            by_dtype.setdefault(getattr(self, name).dtype, []).append((name, start))
        self._blocks = []
        for dtype, members in by_dtype.items():
            widths = [1 if getattr(self, name).ndim == 1 else getattr(self, name).shape[1] for name, _ in members]
            block, at = np.empty((n, sum(widths)), dtype), 0
            for (name, _), width in zip(members, widths):
                view = block[:, at] if getattr(self, name).ndim == 1 else block[:, at:at + width]
                view[...] = getattr(self, name)
                setattr(self, name, view)
                at += width
            self._blocks.append((block, np.repeat([start for _, start in members], widths).astype(dtype)))

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (or those in ``options["reset_mask"]``); ``seed``: an int (env i gets ``seed + i``)
        or one seed per env. An episode cut short here is written to the ledger as ended by ``"reset"``."""
        seeds, mask = reset_args(self.num_envs, seed, options, started=self._started)
        rows = np.flatnonzero(mask)
        self._abandon(rows, "reset")
        self._reset_rows(rows, [seeds[i] for i in rows.tolist()])
        self._started = True
        obs, action_mask = self._view()
        return obs, {"action_mask": action_mask, "_action_mask": mask.copy(), "seed": self.episode_seeds.copy(),
                     "_seed": mask.copy()}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One menu index per env. With ``NEXT_STEP`` an env that ended is reset instead (its action
        ignored); with ``SAME_STEP`` it is reset in the step it ends (``final_obs``, ``final_info``); with
        ``DISABLED`` stepping an ended env is ``gym.error.ResetNeeded``."""
        if not self._started:
            raise gym.error.ResetNeeded("call reset() before step()")
        n = self.num_envs
        actions = menu_actions(actions, n)
        resetting = np.flatnonzero(self.done)
        if resetting.size:
            if self.autoreset_mode == AutoresetMode.DISABLED:
                raise _reset_needed(resetting)
            self._reset_rows(resetting, [None] * resetting.size)
        self._reward = np.zeros(n)
        self._terminated, self._truncated = np.zeros(n, bool), np.zeros(n, bool)
        self._ok, self._spent_before = np.ones(n, bool), self.spent_n.copy()
        self._error = np.full(n, "", dtype=object)
        self._calls = np.zeros(n, np.int64)
        acting = np.ones(n, bool)
        acting[resetting] = False
        group = np.where(acting, _GROUP_ID[actions], -1)
        by_group = np.argsort(group, kind="stable")  # each group's rows in order, after the resetting ones (-1)
        at = resetting.size
        self._staged: dict[str, tuple[np.ndarray, ...]] = {}
        for kind, count in zip(_GROUPS, np.bincount(group[acting], minlength=len(_GROUPS)).tolist()):
            if count:
                rows = by_group[at:at + count]
                at += count
                getattr(self, "_macro_" + kind)(rows, actions[rows])
        self._evaluations()  # every evaluation of the step, one pass
        self.last_error[acting] = ~self._ok[acting]
        obs, action_mask = self._view()
        info: dict[str, Any] = {"action_mask": action_mask, "n_calls": self._calls.copy(),
                                "_action_mask": np.ones(n, bool), "_n_calls": acting.copy()}
        balance = self._available_usd()
        spent = self.spent_n / NANO
        cost = np.zeros(n)  # the run's round(after - before, 9), where the last call spent anything
        paid = np.flatnonzero(self.spent_n != self._spent_before)
        cost[paid] = round_digits(self.spent_n[paid] / NANO - self._spent_before[paid] / NANO, 9)
        for key, value in (("ok", self._ok), ("error", self._error), ("cost_usd", cost),
                           ("budget_left_usd", balance), ("spent_usd", spent)):
            info[key], info[f"_{key}"] = value, acting.copy()
        ended = np.flatnonzero(acting & self.done)
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
        obs, info["action_mask"] = self._view()
        info["final_obs"], info["_final_obs"] = final_obs, gone.copy()
        info["final_info"], info["_final_info"] = final_info, gone.copy()
        return obs, info

    # ------------------------------------------------------------------ macros (rows do one each)

    def _macro_eval(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """``eval_latest_k*`` (the latest checkpoint) and ``eval_base_k*`` (base), with the latest harness: run
        in the step's evaluation pass (:meth:`_evaluations`)."""
        latest = _KIND[actions] == "eval_latest"
        self._staged["eval"] = (rows, _K[actions], np.where(latest, self.n_ckpt[rows], 0))

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
            self.version[edit] |= 1 << defect[~done]  # _version: bit j of a version is DEFECTS[j] fixed
            self._ran(edit)
        self._after_call(rows)

    def _macro_wait(self, rows: np.ndarray, actions: np.ndarray) -> None:
        self._call(rows)
        self._wait(rows)

    def _macro_submit(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """``submit_latest``: the latest checkpoint and harness; ``submit_best``: the adapter's best candidate,
        the highest mean dev score, the first scored on a tie (else the latest)."""
        latest = self.n_ckpt[rows] * N_VERSIONS + self._version(rows)
        width = (int(self.n_ckpt[rows].max(initial=0)) + 1) * N_VERSIONS  # no later checkpoint's candidate is scored
        scored = self.n_scores[rows, :width] > 0
        mean = np.where(scored, self.means[rows, :width], -np.inf)
        top = scored & (mean == mean.max(axis=1, keepdims=True))
        order = np.where(top, self.first_scored[rows, :width], np.iinfo(np.int64).max)
        best = np.where(scored.any(axis=1), order.argmin(axis=1), latest)
        self._staged["submit"] = (rows, np.where(_KIND[actions] == "submit_best", best, latest))

    def _macro_gen(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """``MenuAdapter._gen`` for every row at once: a size below the largest is one ``generate_data`` call,
        and if the budget refuses it one cut to fit; ``max`` is up to ``MAX_CHUNKS`` rounds of (the largest
        size, refused, then a call cut to fit what is left above ``MAX_RESERVE`` of the budget). Each round
        is one array pass (:meth:`_generate`: the full-size call and, for the rows it refused, the cut one)
        over the rows still in their plan; the calls' draws and datasets are one pass at the end
        (:meth:`_record_generations`)."""
        teacher, n = _TEACHER[actions], _GEN_N[actions]
        self._calibrate(rows, teacher)
        is_max = n == GEN_SIZES[-1]
        reserve = np.where(is_max, MAX_RESERVE * self.scenario.budget_usd, 0.0)
        self._drawn = []
        for chunk in range(MAX_CHUNKS):
            if not rows.size:
                break
            fitted = self._generate(rows, teacher, n, reserve, np.where(is_max & (chunk > 0), GEN_SIZES[0], 1))
            go_on = is_max & fitted & ~self.done[rows]
            rows, teacher, n, is_max, reserve = rows[go_on], teacher[go_on], n[go_on], is_max[go_on], reserve[go_on]
        self._record_generations()

    def _macro_clean(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """``MenuAdapter._clean`` for every row at once: the raw datasets of the newest raw one's teacher,
        oldest first, each filtered then deduplicated (a refusal, an empty result or the end of the episode
        stops that dataset; the end stops the row), then the pool and the cleaned ones mixed (at most 8)
        into the teacher's new pool. The filters and dedupes run ahead in two passes (:meth:`_clean_ahead`);
        what a row has left after its first call that did not go as assumed is a pass per dataset and
        operation (:meth:`_transform`) over the rows that have it."""
        raw = self._raws(rows)
        has = raw.any(axis=1)
        missing = rows[~has]
        if missing.size:  # nothing to clean: a filter of a dataset no run has, refused
            self._call(missing)
            self._refuse(missing, self._transform_error["filter"] or "unknown_ref")
            self._after_call(missing)
        rows, raw = rows[has], raw[has]
        if not rows.size:
            return
        d = raw.shape[1]
        newest = d - 1 - np.argmax(raw[:, ::-1], axis=1)
        teacher = self.ds_teacher[rows, newest]
        raw &= self.ds_teacher[rows, :d] == teacher[:, None]
        count = raw.sum(axis=1)
        todo = _first_true(raw, int(count.max()))
        cleaned = np.full(todo.shape, -1, np.int64)
        done_ahead = self._clean_ahead(rows, todo, count, cleaned)
        alive = np.ones(rows.size, bool)
        for k in range(int(done_ahead.min(initial=0)), todo.shape[1]):  # the rest, a pass per dataset and operation
            at = np.flatnonzero(alive & (count > k) & (done_ahead <= k))
            current = todo[at, k]
            for operation in ("filter", "dedupe"):
                if not at.size:
                    break
                made = self._transform(rows[at], operation, current[:, None])
                ended = self.done[rows[at]]
                alive[at[ended]] = False
                good = ~ended & (made >= 0)
                good[good] = self.ds_n[rows[at[good]], made[good]] > 0
                at, current = at[good], made[good]
            cleaned[at, k] = current
        # the parts: the teacher's pool, then what was cleaned, in order
        rows, teacher, cleaned = rows[alive], teacher[alive], cleaned[alive]
        parts = np.concatenate([self.pools[rows, teacher][:, None], cleaned], axis=1)
        parts = np.take_along_axis(parts, np.argsort(parts < 0, axis=1, kind="stable"), axis=1)
        n_parts = (parts >= 0).sum(axis=1)
        last = parts[np.arange(rows.size), np.maximum(n_parts - 1, 0)]
        mixing = np.flatnonzero(n_parts > 1)
        if mixing.size:
            made = self._transform(rows[mixing], "mix", parts[mixing, :8])
            last[mixing] = np.where(made >= 0, made, last[mixing])
        kept = n_parts > 0
        self.pools[rows[kept], teacher[kept]] = last[kept]

    def _macro_train(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """``MenuAdapter._train``: ``train`` on the row's train set from ``base`` (the tool as authorized for
        the learning rate; no train set: a dataset no run has, refused), then wait for the job. The new
        checkpoint is ``train_model`` from base on the dataset's counts, drawn from the world's ``train``
        stream."""
        self._call(rows)
        lr = np.array([_ARG[a] for a in actions.tolist()])
        go = np.ones(rows.size, bool)
        terms = np.zeros((rows.size, 4))  # per row, its tool's (epochs, intensity, learnable, ramp)
        for value in set(lr.tolist()):
            at = lr == value
            tool = self._train_tool(value)
            if isinstance(tool, ActionError):
                self._refuse(rows[at], tool.code)
                go[at] = False
            else:
                terms[at] = self._train_terms[value]
        unknown = go & (self.train_set[rows] < 0)
        self._refuse(rows[unknown], "unknown_ref")
        go &= ~unknown
        rows_go, terms = rows[go], terms[go]
        if rows_go.size:
            data = self.train_set[rows_go]
            epochs = terms[:, 0].astype(np.int64)
            tokens = self.ds_tokens[rows_go, data] * epochs
            usd = tokens * self.prices.model_price.train * PER_M
            hold = nano_up(usd)
            fits = hold <= self.budget_n - self.spent_n[rows_go] - self.reserved_n[rows_go]
            self._refuse(rows_go[~fits], "insufficient_budget")
            rows_go, terms, data, tokens, usd, hold = (a[fits] for a in (rows_go, terms, data, tokens, usd, hold))
        if rows_go.size:
            self.reserved_n[rows_go] += hold
            self._ran(rows_go)
            options = self.batch.model.options
            seconds = tokens / options.train_tokens_per_second + options.train_overhead_s
            self.running[rows_go], self.job_train[rows_go] = True, True
            self.job_start[rows_go], self.job_ready[rows_go] = self.clock[rows_go], self.clock[rows_go] + seconds
            self.job_usd[rows_go] = usd
            self.job_skill[rows_go] = self._trained_skill(rows_go, data, terms)
            self.job_memory[rows_go] = 0.0  # synthetic data only: no dev prompts to remember
            self.job_ds[rows_go] = data
            self.trainings[rows_go] += 1
        self._after_call(rows)
        waiting = rows_go[~self.done[rows_go]]
        while waiting.size:
            self._call(waiting)
            self._wait(waiting)
            waiting = waiting[~self.done[waiting] & self.running[waiting]]

    def _trained_skill(self, rows: np.ndarray, data: np.ndarray, terms: np.ndarray) -> np.ndarray:
        """``SimTrain.start``'s checkpoint skill: ``train_model`` from base (no exposure, intensity or memory
        yet, so none of its lineage terms) on the dataset's counts, toward the world's distillation target,
        with the normal of the world's next ``train`` draw. The ``math`` calls stay ``math`` (as there);
        ``terms``: each row's tool terms (:meth:`_train_tool`)."""
        u = uniforms(self.train_keys[rows], self.train_counter[rows], 1)[:, 0]
        self.train_counter[rows] += 1
        z = norm_ppf(u)
        w, domain = self.batch.worlds, self.batch.model.domain
        n, correct = self.ds_n[rows, data], self.ds_correct[rows, data]
        effective = n - (1.0 - DUPLICATE_WEIGHT) * self.ds_dup[rows, data]
        intensity, learnable, ramp = terms[:, 1], terms[:, 2], terms[:, 3]
        scale = domain.examples_scale
        enough = np.array([1.0 - math.exp(-e / scale) for e in effective.tolist()])
        step = learnable * enough * ramp
        excess = np.maximum(0.0, intensity - w.threshold[rows])
        damage = np.minimum(6.0, w.damage_scale[rows] * np.array([e ** 0.25 for e in excess.tolist()]))
        base = w.base_skill[rows]
        pass_rate = correct / n  # a train set is never empty
        gap = (self.ds_skill[rows, data] - domain.incorrect_penalty * (1.0 - pass_rate)) - base
        goal = base + np.where(gap > 0, w.transfer[rows] * gap, gap)
        return base + step * (goal - base) - damage + TRAIN_NOISE * z

    # ------------------------------------------------------------------ calls (the run's execute)

    def _call(self, rows: np.ndarray) -> None:
        """A call of a macro begins: counted in ``n_calls``; the step's ``cost_usd`` is the last call's."""
        if not rows.size:
            return
        self._calls[rows] += 1
        self._ok[rows], self._error[rows] = True, ""
        self._spent_before[rows] = self.spent_n[rows]

    def _ran(self, rows: np.ndarray) -> None:
        if rows.size:
            self.steps[rows] += 1

    def _refuse(self, rows: np.ndarray, code: str) -> None:
        if rows.size:
            self.refusals[rows] += 1
            self._ok[rows], self._error[rows] = False, code

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

    def _data_constants(self) -> None:
        """What a data call's quote, bill and permission depend on besides its row: per teacher (its
        ``generate_data`` refusal, prices, duplicate rate, accuracy logit), per transform its refusal, the
        sandbox price per second, the tokens of a generated example."""
        m, domain = self.batch.model, self.batch.model.domain
        self.prices = m.prices
        self._gen_error = np.full(len(TEACHERS), "", dtype=object)
        price_in, price_out, logit, shift = [], [], [], []
        ranked = sorted(domain.teacher_accuracy)
        for j, teacher in enumerate(TEACHERS):
            try:
                tool = self._tool("generate_data", {"teacher": teacher, "n_examples": 1})
                m.rollout.quote_generate(tool)
            except ActionError as err:
                self._gen_error[j] = err.code
            price = m.prices.teachers.get(teacher)
            price_in.append(price.input if price else 0.0)
            price_out.append(price.output if price else 0.0)
            mean = domain.teacher_accuracy.get(teacher, 0.5)
            logit.append(math.log(mean / (1.0 - mean)))
            shift.append(ranked.index(teacher) if teacher in ranked else 0)
        self._gen_barred = self._gen_error != ""  # per teacher: generate_data refused
        self._price_in, self._price_out = np.array(price_in), np.array(price_out)
        self._acc_logit, self._shift_column = np.array(logit), np.array(shift, np.intp)
        self._dup_rate = np.array([TEACHER_DUPLICATES.get(t, 0.0) for t in TEACHERS])
        self._mean_tokens, self._over = truncated_mean_tokens(domain.example_completion_median,
                                                              domain.example_completion_sigma, _MAX_TOKENS)
        self._transform_error: dict[str, str] = {}
        for operation in ("filter", "dedupe", "mix"):
            try:
                self._tool("transform_data", {"operation": operation, "datasets": ["ds-1"]})
                self._transform_error[operation] = ""
            except ActionError as err:
                self._transform_error[operation] = err.code
        self._sandbox_per_s = m.prices.sandbox_usd(1.0, m.vcpus, m.memory_gib)
        table = self.batch.table.difficulty  # a teacher's calibration runs on official then dev tasks
        self._both_halves = np.stack([np.concatenate([table[0], table[1]]), np.concatenate([table[1], table[0]])])
        self._train_tools: dict[float, Any] = {}
        self._train_terms: dict[float, tuple[float, float, float, float]] = {}

    def _train_tool(self, lr: float) -> Any:
        """The authorized ``train`` tool of the menu's entry for ``lr`` (on any dataset), or its refusal; its
        terms (epochs, ``TrainSettings`` intensity and learnable, ``1 - exp(-intensity / INTENSITY_SCALE)``)
        in ``_train_terms[lr]``, the same ``math`` as ``_trained_skill`` did per row."""
        if lr not in self._train_tools:
            args: dict[str, Any] = {"dataset": MISSING}
            if lr != DEFAULT_LR:
                args["learning_rate"] = lr
            try:
                tool = self._tool("train", args)
                if tool.base != "base":  # a scenario locking another base: no such checkpoint here
                    raise ActionError("unknown_ref", f"no checkpoint {tool.base!r}")
            except ActionError as err:
                tool = err
            self._train_tools[lr] = tool
            if not isinstance(tool, ActionError):
                settings = TrainSettings.of(tool)
                self._train_terms[lr] = (settings.num_epochs, settings.intensity, settings.learnable,
                                         1.0 - math.exp(-settings.intensity / INTENSITY_SCALE))
        return self._train_tools[lr]

    def _raws(self, rows: np.ndarray | slice) -> np.ndarray:
        """(M, slots): ``MenuAdapter._raws``, the generated datasets not cleaned yet (and not empty); ``rows``
        may be ``slice(None)`` (every row, without a copy of the arrays)."""
        d = max(1, int(self.n_ds[rows].max(initial=0)))
        return ((np.arange(d) < self.n_ds[rows, None]) & ~self.ds_clean[rows, :d] & ~self.ds_cleaned[rows, :d]
                & (self.ds_n[rows, :d] > 0))

    def _new_datasets(self, rows: np.ndarray, n: np.ndarray, correct: np.ndarray, duplicate: np.ndarray,
                      tokens: np.ndarray, skill: np.ndarray, teacher: np.ndarray, clean: bool) -> np.ndarray:
        """Store one new dataset per row (its next slot; the adapter's pass rate is the sim's ``stats()``, 4
        digits) and make it the train set if it is not empty; returns the slots."""
        slot = self.n_ds[rows].copy()
        self._put_datasets(rows, slot, n, correct, duplicate, tokens, skill, teacher, clean)
        self.n_ds[rows] += 1
        full = n > 0
        self.train_set[rows[full]] = slot[full]
        return slot

    def _put_datasets(self, rows: np.ndarray, slot: np.ndarray, n: np.ndarray, correct: np.ndarray,
                      duplicate: np.ndarray, tokens: np.ndarray, skill: np.ndarray, teacher: np.ndarray,
                      clean: bool) -> None:
        """Write datasets at ``(rows, slot)`` (the arrays grown to hold them): counts, teacher skill and the
        adapter's record (teacher, pass rate to 4 digits as ``stats()`` gives it, made by a transform, not
        cleaned yet)."""
        if slot.size and slot.max() >= self.ds_n.shape[1]:
            self._grow_datasets(max(2 * self.ds_n.shape[1], int(slot.max()) + 1))
        self.ds_n[rows, slot], self.ds_correct[rows, slot], self.ds_dup[rows, slot] = n, correct, duplicate
        self.ds_tokens[rows, slot], self.ds_skill[rows, slot], self.ds_teacher[rows, slot] = tokens, skill, teacher
        self.ds_rate[rows, slot] = round_digits(np.where(n > 0, correct / np.maximum(n, 1), 0.0), 4)
        self.ds_clean[rows, slot], self.ds_cleaned[rows, slot] = clean, False

    def _calibrate(self, rows: np.ndarray, teacher: np.ndarray) -> None:
        """``SimWorld.teacher_skill`` of each row's teacher where it is not known yet, in one ``calibrate_skill``
        call (its rows stop on their own, as ``teacher_skills``): the skill at which the teacher solves the
        world's tasks (official, then dev) as often as its accuracy on the world says."""
        missing = np.isnan(self.teacher_skill[rows, teacher]) > self._gen_barred[teacher]  # a & ~b
        if missing.any():
            r, t = rows[missing], teacher[missing]
            self.teacher_skill[r, t] = calibrate_skill(self._both_halves[self.batch.worlds.half[r]], 1.0,
                                                       self.teacher_acc[r, t])

    def _grow_datasets(self, slots: int) -> None:
        pad = ((0, 0), (0, slots - self.ds_n.shape[1]))
        for name in ("ds_n", "ds_correct", "ds_dup", "ds_tokens", "ds_teacher", "ds_skill", "ds_rate", "ds_clean",
                     "ds_cleaned"):
            setattr(self, name, np.pad(getattr(self, name), pad))

    def _generate(self, rows: np.ndarray, teacher: np.ndarray, n: np.ndarray, reserve: np.ndarray,
                  least: np.ndarray) -> np.ndarray:
        """A round of the adapter's generation plan per row, in one pass: the ``generate_data`` call of ``n``
        examples (``teacher`` index) and, where the budget refused it, the call cut to fit (``_fit`` of the
        refusal message's amounts above ``reserve``) if that is at least ``least`` examples and the episode
        goes on. Each call as the run executes it (:meth:`_ask`, then :meth:`_draw_generations` for the calls
        that fit, then the run's limits); a row's calls keep their order, rows are independent. Returns which
        rows ran a cut-to-fit call."""
        go, hold, input_tokens, short, needs, available = self._ask_generate(rows, teacher, n)
        self._after_call(rows[~go])  # the refused call's limits, before its row's cut-to-fit call
        fit = _fit(n, needs, available, reserve)
        again = np.flatnonzero(short & ~self.done[rows] & (fit >= least))
        fitted = np.zeros(rows.size, bool)
        run = np.flatnonzero(go)
        sizes, holds, tokens = n[run], hold[run], input_tokens[run]
        refused = run[:0]
        if again.size:
            go2, hold2, tokens2, *_ = self._ask_generate(rows[again], teacher[again], fit[again])
            refused = again[~go2]  # their limits with the others' below: no row's call reads another row
            fitted[again[go2]] = True
            run = np.concatenate([run, again[go2]])
            sizes = np.concatenate([sizes, fit[again[go2]]])
            holds, tokens = np.concatenate([holds, hold2[go2]]), np.concatenate([tokens, tokens2[go2]])
        if run.size:
            self._draw_generations(rows[run], teacher[run], sizes, tokens, holds)
        self._after_call(rows[np.concatenate([refused, run])] if refused.size else rows[run])
        return fitted

    def _ask_generate(self, rows: np.ndarray, teacher: np.ndarray, n: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A ``generate_data`` call begins per row (``teacher`` index, ``n`` examples): permission and quote
        (refused per teacher), the worst case reserved or refused. Returns (fits, the hold in nano-dollars,
        the input tokens, refused for money, and the refusal message's two amounts as the adapter reads them:
        needed, available)."""
        self._call(rows)
        barred = self._gen_barred[teacher]
        if barred.any():
            code = self._gen_error[teacher]
            for value in set(code[barred].tolist()):
                self._refuse(rows[code == value], value)
        domain = self.batch.model.domain
        input_tokens = np.rint(n * domain.example_prompt_tokens * domain.teacher_input_factor)
        hold = nano_up((input_tokens * self._price_in[teacher] + (n * _MAX_TOKENS) * self._price_out[teacher]) * PER_M)
        left = self.budget_n - self.spent_n[rows] - self.reserved_n[rows]
        fits = hold <= left
        short = ~(barred | fits)
        needs, available = np.zeros(rows.size), np.zeros(rows.size)
        if short.any():  # both amounts in one pass
            both = round_digits(np.concatenate([hold[short], left[short]]) / NANO, 4)
            needs[short], available[short] = both[:both.size // 2], both[both.size // 2:]
            self._refuse(rows[short], "insufficient_budget")
        return fits & ~barred, hold, input_tokens, short, needs, available

    def _draw_generations(self, r: np.ndarray, t: np.ndarray, k: np.ndarray, input_tokens: np.ndarray,
                          hold: np.ndarray) -> None:
        """The calls that fit (rows ``r``, teachers ``t``, ``k`` examples): the world's aggregate draw
        (``generate_datasets``: three uniforms of its ``data`` stream), the bill settled (at most the hold),
        its time passed, the adapter's dollars per example and generations. The draw itself (its counter taken
        now) and the datasets it makes wait for :meth:`_record_generations`, at the end of the macro: nothing
        in a generation plan reads them, and a cost is a function of the size alone."""
        domain = self.batch.model.domain
        self._calibrate(r, t)
        self._drawn.append((r, t, k, self.data_counter[r].copy()))
        self.data_counter[r] += 1
        output_tokens = np.rint(k * self._mean_tokens)
        cost = (input_tokens * self._price_in[t] + output_tokens * self._price_out[t]) * PER_M
        before = self.spent_n[r].copy()
        self.spent_n[r] += np.minimum(nano_near(cost), hold)
        options = self.batch.model.options
        self.clock[r] += np.ceil(k / options.generate_concurrency) * domain.generate_seconds
        self._ran(r)
        self.usd_per_example[r, t] = round_digits(self.spent_n[r] / NANO - before / NANO, 9) / np.maximum(k, 1)
        self.generations[r] += 1

    def _record_generations(self) -> None:
        """The draws of the macro's generations (``generate_datasets``: three uniforms of the row's ``data``
        stream at the call's counter) in one pass, element-wise, and their datasets stored in the order each
        row made them (its next slots; the last non-empty one the train set; the teacher's best pass rate)."""
        if not self._drawn:
            return
        r, t, k, counter = (np.concatenate(part) for part in zip(*self._drawn))
        self._drawn = []
        order = np.argsort(r, kind="stable")  # a row's calls in the order they ran
        r, t, k, counter = r[order], t[order], k[order], counter[order]
        u = uniforms(self.data_keys[r], counter, GENERATE_DRAWS)
        size = k.astype(float)
        cut, duplicate = binomial(np.concatenate([size, size]),  # element-wise: one pass for two draws
                                  np.concatenate([np.full(r.size, self._over), self._dup_rate[t]]),
                                  np.concatenate([u[:, 0], u[:, 2]])).reshape(2, -1)
        correct = binomial(k - cut, self.teacher_acc[r, t], u[:, 1])
        tokens = k * self.batch.model.domain.example_prompt_tokens + np.rint(k * self._mean_tokens).astype(np.int64)
        if r.size == np.unique(r).size:
            slot = self._new_datasets(r, k, correct, duplicate, tokens, self.teacher_skill[r, t], t, clean=False)
            self.pass_rates[r, t] = np.maximum(self.ds_rate[r, slot], self.pass_rates[r, t])
            return
        first = np.flatnonzero(np.append(True, r[1:] != r[:-1]))
        rank = np.arange(r.size) - np.repeat(first, np.diff(np.append(first, r.size)))
        slot = self.n_ds[r] + rank
        last = np.append(first[1:], r.size) - 1
        self._put_datasets(r, slot, k, correct, duplicate, tokens, self.teacher_skill[r, t], t, clean=False)
        self.n_ds[r[last]] = slot[last] + 1
        full = np.flatnonzero(k > 0)
        if full.size:  # each row's last non-empty one, in the order made
            r_full = r[full]
            ends = np.flatnonzero(np.append(r_full[1:] != r_full[:-1], True))
            self.train_set[r_full[ends]] = slot[full[ends]]
        np.maximum.at(self.pass_rates, (r, t), self.ds_rate[r, slot])

    def _clean_ahead(self, rows: np.ndarray, todo: np.ndarray, count: np.ndarray, cleaned: np.ndarray) -> np.ndarray:
        """The filter, then dedupe, of each row's datasets ``todo[:, :count]`` in two passes over all of them, as if
        every call ran: the k-th filter draws number ``counter + 2k`` of the row's ``data`` stream and its dedupe
        ``counter + 2k + 1``, the spend and the clock add up call after call (``cumsum``: the same sums, in the
        same order). A row keeps the datasets before its first one where that is not so (a call refused for
        money, a limit reached after a call, a filter that keeps nothing, so no dedupe), and they are recorded
        as :meth:`_transform` records them one call at a time; the rest is left to it. Returns how many of its
        datasets each row cleaned here; ``cleaned[i, k]`` gets the deduplicated slot (if not empty)."""
        m, width = todo.shape
        kept = np.zeros(m, np.int64)
        if not width or self._transform_error["filter"] or self._transform_error["dedupe"]:
            return kept
        ri, ki = np.nonzero(np.arange(width) < count[:, None])  # row by row, each row's datasets in order
        r, source = rows[ri], todo[ri, ki]
        n0, c0, d0, t0 = (a[r, source] for a in (self.ds_n, self.ds_correct, self.ds_dup, self.ds_tokens))
        skill = np.where(n0 > 0, self.ds_skill[r, source] * n0 / np.maximum(n0, 1), self.ds_skill[r, source])
        counter = self.data_counter[r] + (2 * ki).astype(np.uint64)
        usd0, wall0, hold0 = self._transform_price("filter", n0)
        n1, c1, d1, t1 = self._transform_draw("filter", r, counter, n0, c0, d0, t0)
        skill1 = np.where(n1 > 0, skill * n1 / np.maximum(n1, 1), skill)
        usd1, wall1, hold1 = self._transform_price("dedupe", n1)
        n2, c2, d2, t2 = self._transform_draw("dedupe", r, counter + np.uint64(1), n1, c1, d1, t1)
        # the calls in the run's order, (M, 2 width): filter 0, dedupe 0, filter 1, ...
        calls = 2 * width
        hold, charge, wall = np.zeros((m, calls), np.int64), np.zeros((m, calls), np.int64), np.zeros((m, calls))
        hold[ri, 2 * ki], hold[ri, 2 * ki + 1] = hold0, hold1
        charge[ri, 2 * ki], charge[ri, 2 * ki + 1] = np.minimum(nano_near(usd0), hold0), np.minimum(nano_near(usd1), hold1)
        wall[ri, 2 * ki], wall[ri, 2 * ki + 1] = wall0, wall1
        g = rows
        spent_after = self.spent_n[g, None] + np.cumsum(charge, axis=1)
        spent_before = spent_after - charge
        left = self.budget_n - self.reserved_n[g, None]
        clock_after = np.cumsum(np.concatenate([self.clock[g, None], wall], axis=1), axis=1)[:, 1:]
        s = self.scenario
        stop = ((hold > left - spent_before)
                | (self.steps[g, None] + np.arange(1, calls + 1) >= s.max_steps)
                | (self.refusals[g] >= s.refusal_limit)[:, None]
                | (clock_after >= self.time_limit_s)
                | (~self.running[g, None] & (left - spent_after < self._min_n)))
        stop[ri[n1 == 0], 2 * ki[n1 == 0]] = True  # no dedupe after it: the next counters are not these
        stop &= np.arange(calls) < 2 * count[:, None]
        kept[:] = np.where(stop.any(axis=1), np.argmax(stop, axis=1), 2 * count) // 2
        done = ki < kept[ri]
        rows_c = np.flatnonzero(kept)
        if not rows_c.size:
            return kept
        last = 2 * kept[rows_c] - 1
        g = rows[rows_c]
        self._calls[g] += 2 * kept[rows_c]
        self._ok[g], self._error[g] = True, ""
        self._spent_before[g] = spent_before[rows_c, last]
        self.spent_n[g], self.clock[g] = spent_after[rows_c, last], clock_after[rows_c, last]
        self.steps[g] += 2 * kept[rows_c]
        self.data_counter[g] += (2 * kept[rows_c]).astype(np.uint64)
        # the new datasets, in the order they were made: slot n_ds + 2k the filtered one, + 1 the deduplicated
        r, ki, source = r[done], ki[done], source[done]
        slot = self.n_ds[r] + 2 * ki
        teacher = self.ds_teacher[r, source]
        self.ds_cleaned[r, source] = True
        for made, parts in ((slot, (n1, c1, d1, t1, skill)), (slot + 1, (n2, c2, d2, t2, skill1))):
            self._put_datasets(r, made, *(a[done] for a in parts), teacher, clean=True)
        self.n_ds[g] += 2 * kept[rows_c]
        full = n2[done] > 0
        cleaned[ri[done][full], ki[full]] = slot[full] + 1
        # the train set: the last non-empty dataset made (each filtered one is; a deduplicated one may be empty)
        last_of_row = np.flatnonzero(np.append(r[1:] != r[:-1], True))
        self.train_set[r[last_of_row]] = np.where(full, slot + 1, slot)[last_of_row]
        return kept

    def _transform(self, rows: np.ndarray, operation: str, sources: np.ndarray) -> np.ndarray:
        """One ``transform_data`` call per row (``sources``: (M, P) slots, -1 padded), as the run executes it:
        permission, the quote reserved or refused, the sources merged (``mix_datasets``), filtered or
        deduplicated from the world's ``data`` stream (``filter_datasets``, ``dedupe_datasets``), the bill
        settled, its time passed, the adapter's record (a filtered source is cleaned), the run's limits.
        Returns each row's new slot (-1: refused)."""
        self._call(rows)
        made = np.full(rows.size, -1, np.int64)
        if self._transform_error[operation]:
            self._refuse(rows, self._transform_error[operation])
            self._after_call(rows)
            return made
        at = np.maximum(sources, 0)
        if sources.shape[1] == 1:  # filter, dedupe: one source
            one = at[:, 0]
            n, correct, duplicate, tokens = (a[rows, one] for a in (self.ds_n, self.ds_correct, self.ds_dup,
                                                                    self.ds_tokens))
            weighted = self.ds_skill[rows, one] * n
        else:
            valid = sources >= 0
            r2 = rows[:, None]
            n, correct, duplicate, tokens = (np.where(valid, a[r2, at], 0).sum(axis=1)
                                             for a in (self.ds_n, self.ds_correct, self.ds_dup, self.ds_tokens))
            parts = np.where(valid, self.ds_skill[r2, at] * self.ds_n[r2, at], 0.0)
            weighted = parts[:, 0].copy()  # sum(d.teacher_skill * d.n for d in parts), one part after the other
            for j in range(1, sources.shape[1]):
                weighted += parts[:, j]
        skill = np.where(n > 0, weighted / np.maximum(n, 1), self.ds_skill[rows, at[:, 0]])
        usd, wall, hold = self._transform_price(operation, n)
        fits = hold <= self.budget_n - self.spent_n[rows] - self.reserved_n[rows]
        self._refuse(rows[~fits], "insufficient_budget")
        go = np.flatnonzero(fits)
        if go.size:
            r = rows[go]
            if go.size < rows.size:
                n, correct, duplicate, tokens, skill, hold, usd, wall, at = (
                    a[go] for a in (n, correct, duplicate, tokens, skill, hold, usd, wall, at))
            if operation != "mix":
                n, correct, duplicate, tokens = self._transform_draw(operation, r, self.data_counter[r], n, correct,
                                                                     duplicate, tokens)
                self.data_counter[r] += 1
            self.spent_n[r] += np.minimum(nano_near(usd), hold)
            self.clock[r] += wall
            self._ran(r)
            if operation == "filter":
                self.ds_cleaned[r, at[:, 0]] = True
            made[go] = self._new_datasets(r, n, correct, duplicate, tokens, skill, self.ds_teacher[r, at[:, 0]],
                                          clean=True)
        self._after_call(rows)
        return made

    def _transform_price(self, operation: str, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A ``transform_data`` call on ``n`` examples: its cost in dollars, its seconds and its hold (nano-dollars)."""
        domain, options = self.batch.model.domain, self.batch.model.options
        if operation == "filter":
            per_example, parallel = domain.check_seconds, options.transform_concurrency
        else:
            per_example, parallel = TRANSFORM_SECONDS_PER_EXAMPLE[operation], 1
        usd = (TRANSFORM_STARTUP_S + n * per_example) * self._sandbox_per_s
        return usd, TRANSFORM_STARTUP_S + np.ceil(n / parallel) * per_example, nano_up(usd)

    def _transform_draw(self, operation: str, r: np.ndarray, counter: np.ndarray, n: np.ndarray, correct: np.ndarray,
                        duplicate: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, ...]:
        """A filter's or dedupe's counts (``filter_datasets``, ``dedupe_datasets``) from draw ``counter`` of each
        row's ``data`` stream (element-wise: rows ``r`` may repeat); returns (n, correct, duplicate, tokens)."""
        u = uniforms(self.data_keys[r], counter, 2 if operation == "filter" else 1)
        share_of = n
        if operation == "filter":
            kept_correct, kept_incorrect = binomial(
                np.concatenate([correct, n - correct]).astype(float),
                np.repeat([FILTER_RECALL, FILTER_FALSE_PASS], r.size), u.T.ravel()).reshape(2, -1)
            kept = kept_correct + kept_incorrect
            duplicate = np.rint(duplicate * np.where(n > 0, kept / np.maximum(n, 1), 0.0)).astype(np.int64)
            correct = kept_correct
        else:
            removed = binomial(duplicate.astype(float), DEDUPE_RECALL, u[:, 0])
            pass_rate = np.where(n > 0, correct / np.maximum(n, 1), 0.0)
            removed_correct = np.rint(removed * pass_rate).astype(np.int64)
            kept = n - removed
            duplicate = duplicate - removed
            correct = correct - removed_correct
        share = np.where(share_of > 0, kept / np.maximum(share_of, 1), 0.0)
        tokens = np.rint(tokens * share).astype(np.int64)
        return kept, correct, np.minimum(duplicate, kept), tokens

    def _evaluations(self) -> None:
        """The step's evaluations in one ``SimBatch.evaluate`` pass (rows are independent, so this is what
        each gives alone): the staged ``evaluate`` calls (reserve the quote or refuse it; draw the result; a
        job, then ``wait`` for it) and the staged ``submit`` calls (the official score ends the episode). (The
        initial official score of a new episode comes with its world, drawn ahead: ``_draw_ahead``.)"""
        empty = np.zeros(0, np.int64)
        rows, k, ckpt = self._staged.get("eval", (empty, empty, empty))
        go = hold = version = empty
        if rows.size:
            self._call(rows)
            if "evaluate" not in self.tools:  # every track has it; kept for other scenarios
                self._refuse(rows, "forbidden_tool")
                self._after_call(rows)
                rows = empty
            else:
                version = self._version(rows)
                hold = nano_up(self.batch.dev_bill(rows, self._harness(version), k)[0])
                fits = hold <= self.budget_n - self.spent_n[rows] - self.reserved_n[rows]
                self._refuse(rows[~fits], "insufficient_budget")
                go, ckpt, version, k, hold = rows[fits], ckpt[fits], version[fits], k[fits], hold[fits]
                self._ran(go)
        submits, cand = self._staged.get("submit", (empty, empty))
        if submits.size:
            self._call(submits)
            if "submit" not in self.tools:
                self._refuse(submits, "forbidden_tool")
                self._after_call(submits)
                submits, cand = empty, empty
            else:
                self._ran(submits)
        every = np.concatenate([go, submits])
        if every.size:
            official = np.arange(every.size) >= go.size
            which = np.concatenate([ckpt * N_VERSIONS + version, cand])
            c, v = np.divmod(which, N_VERSIONS)
            out = self.batch.evaluate(self.ckpt_skill[every, c], np.where(official, 0.0, self.ckpt_memory[every, c]),
                                      self._harness(v), k=np.concatenate([k, np.full(every.size - go.size,
                                                                                     self.scenario.official_k)]),
                                      split=official, rows=every)
            g, s = go.size, go.size + submits.size
            if g:
                self.reserved_n[go] += hold
                self.running[go], self.job_train[go] = True, False
                self.job_start[go], self.job_ready[go] = self.clock[go], self.clock[go] + out.seconds[:g]
                self.job_usd[go], self.job_score[go], self.job_counts[go] = out.usd[:g], out.score[:g], out.counts[:g]
                self.job_cand[go], self.job_k[go] = which[:g], k
            if submits.size:
                self._end(submits, out.score[g:s], terminated=True, reason="submitted")
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
        charge = np.minimum(nano_near(self.job_usd[rows]), self.reserved_n[rows])
        self._settle(rows, charge)
        self.running[rows] = False
        trained = rows[self.job_train[rows]]
        if trained.size:
            index = self.n_ckpt[trained] + 1
            if index.max() >= self.ckpt_skill.shape[1]:  # doubled: a copy of the wide arrays per doubling
                self._grow(max(2 * self.ckpt_skill.shape[1], int(index.max()) + 1))
            self.ckpt_skill[trained, index], self.ckpt_memory[trained, index] = (self.job_skill[trained],
                                                                                 self.job_memory[trained])
            self.n_ckpt[trained] = index
            self.ckpt_ds[trained] = self.job_ds[trained]
        rows = rows[~self.job_train[rows]]
        if not rows.size:
            return
        score, c = self.job_score[rows], self.job_cand[rows]
        count = self.n_scores[rows, c]
        first = count == 0
        self.n_candidates[rows[first]] += 1
        self.first_scored[rows[first], c[first]] = self.n_candidates[rows[first]]
        count += 1
        self.n_scores[rows, c] = count
        # the adapter's np.mean of a candidate's scores: below 8 values NumPy adds one by one (a running sum,
        # as reduce(add), not sum(), which compensates since Python 3.12); from 8 on its pairwise sum
        total = self.score_sum[rows, c] + score
        self.score_sum[rows, c] = total
        self.means[rows, c] = total / count
        at = self.evaluations[rows]  # this score's place in the row's log
        if at.max() >= self.score_log.shape[1]:
            pad = ((0, 0), (0, self.score_log.shape[1]))
            self.score_log, self.score_cand = np.pad(self.score_log, pad), np.pad(self.score_cand, pad)
        self.score_log[rows, at], self.score_cand[rows, at] = score, c
        early = count < _MEAN_EXACT
        for i, j, value, seen, place in zip(rows[~early].tolist(), c[~early].tolist(), score[~early].tolist(),
                                            count[~early].tolist(), at[~early].tolist()):
            scores = self._score_lists.get((i, j))
            if scores is None:  # its 8th score: the first 7 from the log
                log = self.score_log[i, :place]
                scores = self._score_lists[i, j] = log[self.score_cand[i, :place] == j].tolist()
            scores.append(value)
            assert len(scores) == seen
            self.means[i, j] = float(np.mean(scores))
        base = rows[(c == 0) & (self.initial_dev[rows] < 0)]
        self.initial_dev[base] = self.job_score[base]
        self.best_dev[rows] = np.where(score > self.best_dev[rows], score, self.best_dev[rows])
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
        self.n_scores, self.means, self.first_scored, self.score_sum = (
            np.pad(a, pad) for a in (self.n_scores, self.means, self.first_scored, self.score_sum))

    def _settle(self, rows: np.ndarray, charge: np.ndarray) -> None:
        self.spent_n[rows] += charge
        self.reserved_n[rows] = 0

    def _after_call(self, rows: np.ndarray) -> None:
        """The run's limits after a call, in its order: steps, refusals, time, money."""
        if not rows.size:
            return
        s = self.scenario
        # the limits over all N rows (as cheap as over a few: the cost is per NumPy call), then the callers'
        # (integers: left < min is spent + reserved > budget - min; on bools, a > b is a & ~b)
        limits = [self.steps >= s.max_steps, self.refusals >= s.refusal_limit, self.clock >= self.time_limit_s,
                  (self.spent_n + self.reserved_n > self.budget_n - self._min_n) > self.running]
        ending = (limits[0] | limits[1] | limits[2] | limits[3])[rows] > self.done[rows]
        if ending.any():
            ends = rows[ending]
            reason = np.select([c[ends] for c in limits], ["step limit", "refusal limit", "time limit",
                                                           "budget exhausted"], "")
            self._end(ends, self.initial_official[ends], terminated=False, reason=reason)

    def _end(self, rows: np.ndarray, final: np.ndarray, *, terminated: bool, reason: Any) -> None:
        """The episode's result: running jobs billed for the share that ran, the normalized gain."""
        self._bill_running(rows)
        self.done[rows] = True
        self.end_reason[rows] = reason
        self._final[rows] = final
        self._reward[rows] = _normalized_gains(self.initial_official[rows], np.asarray(final, float))
        (self._terminated if terminated else self._truncated)[rows] = True

    def _bill_running(self, rows: np.ndarray) -> None:
        """Cancel the running jobs of ``rows``, billed for the share of their duration that ran
        (``ResearchRun._settle_running``)."""
        busy = rows[self.running[rows]]
        if busy.size:
            span = self.job_ready[busy] - self.job_start[busy]
            fraction = np.where(span > 0, np.minimum(1.0, np.maximum(0.0, (self.clock[busy] - self.job_start[busy])
                                                                    / np.where(span > 0, span, 1.0))), 1.0)
            charge = np.minimum(nano_near(self.job_usd[busy] * fraction), self.reserved_n[busy])
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
        """Write the episodes of ``rows`` (ended; ``result``: with their official result, not cut short) to the
        ledger: their :class:`EpisodeRecords` (:meth:`episode_records`) through :func:`write_episode_records`,
        which says how (per episode or per step, one transaction). With :meth:`defer_episodes` the records wait
        for :meth:`take_episodes` instead (a worker of ``MenuWorkersEnv``, whose main process writes them)."""
        if not self.write_episodes or not rows.size:
            self._open[rows] = False
            return
        records = self.episode_records(rows, result=result)
        if self._deferred is not None:
            self._deferred.append(records)
        else:
            self._keys += write_episode_records(self.platform.ledger, records, per_step=self.write_episodes == "step",
                                                budget_usd=self.scenario.budget_usd, budget_n=self.budget_n,
                                                secret=self._key_secret, first=self._keys + 1)
        self._open[rows] = False

    def episode_records(self, rows: np.ndarray, *, result: bool = True) -> EpisodeRecords:
        """The ledger's columns of the episodes of ``rows``, read from the arrays (clock / 3600 in NumPy: the same
        IEEE division); an ended episode's normalized gain is its reward (``_end`` stored
        ``normalized_gain(initial, final)`` of these very values)."""
        return EpisodeRecords(
            rows.astype(np.int64), self.episode_seeds[rows].tolist(), self.steps[rows].tolist(),
            self.refusals[rows].tolist(), [str(reason) for reason in self.end_reason[rows].tolist()],
            (self.clock[rows] / 3600.0).tolist(), self.spent_n[rows].copy(),
            (self.initial_official[rows].tolist(), self._final[rows].tolist(), self._reward[rows].tolist())
            if result else None)

    def defer_episodes(self) -> None:
        """Keep finished episodes' records (:meth:`take_episodes`) instead of writing them to this env's ledger."""
        self._deferred = []

    def take_episodes(self) -> list[EpisodeRecords]:
        """The records kept since the last call (one per ``_write``: a step's, a reset's or ``close``'s)."""
        taken, self._deferred = self._deferred or [], []
        return taken

    # ------------------------------------------------------------------ state

    def _reset_rows(self, rows: np.ndarray, seeds: Sequence[int | None]) -> None:
        """New episodes at ``rows``: the episode seed as ``ResearchEnv.reset`` draws it, the world it gives and
        the initial system's official score (drawn ahead, :meth:`_draw_ahead`; taken from there)."""
        fresh = []
        for i, seed in zip(rows.tolist(), seeds):
            if seed is not None or self._rngs[i] is None:
                self._rngs[i], _ = seeding.np_random(seed)
                fresh.append(i)
        self._auto[rows] = True
        if fresh:  # a new generator: nothing drawn from it yet
            self._seed_at[fresh] = self._seed_end[fresh] = self._world_end[fresh] = 0
            self._auto[fresh] = False
        missing = rows[self._world_end[rows] <= self._seed_at[rows]]
        if missing.size:
            self._draw_ahead(missing)
        at = self._seed_at[rows]
        episode, source = self._seeds_ahead[rows, at], rows * _SEEDS_AHEAD + at
        self._seed_at[rows] += 1
        if self._score_lists:
            gone = set(rows.tolist())
            self._score_lists = {key: v for key, v in self._score_lists.items() if key[0] not in gone}
        self.episode_seeds[rows] = episode
        self.batch.take(rows, self._store, source)  # the world its seed gives, streams and remembered stats
        self.data_keys[rows], self.train_keys[rows] = self._store_keys[:, source]
        self.initial_official[rows] = self._store_initial[source]
        # the candidates an episode scored are those of its checkpoints (index <= n_ckpt): the rest is still 0
        used = (int(self.n_ckpt[rows].max(initial=0)) + 1) * N_VERSIONS
        for name in ("n_scores", "means", "first_scored", "score_sum"):
            getattr(self, name)[rows, :used] = 0
        self.ds_n[rows, :int(self.n_ds[rows].max(initial=0))] = 0  # the slots it made; the others are still 0
        for block, start in self._blocks:  # counters, money, clock, flags, slots, teacher records: _EPISODE_START
            block[rows] = start
        shift = self.batch.worlds.teacher_shift[rows][:, self._shift_column]
        self.teacher_acc[rows] = 1.0 / (1.0 + np.exp(-(self._acc_logit + shift)))  # SimWorld.teacher_accuracy
        self.ckpt_skill[rows] = self.ckpt_memory[rows] = np.nan
        self.ckpt_skill[rows, 0], self.ckpt_memory[rows, 0] = self.batch.base_skill[rows], 0.0
        self.end_reason[rows] = ""
        self._open[rows] = True

    def _draw_ahead(self, missing: np.ndarray) -> None:
        """Worlds ahead: for the rows in ``missing`` their next seed's world, and for every row that autoresets
        up to ``_WORLDS_AHEAD`` worlds ahead, each with its initial official score (base skill, the initial
        harness, the world's fixed official draw), in passes of many rows (rows are independent: each world is
        what its seed gives alone, as ``SimBatch.reset`` draws it). A row's seed window moves to the front of its
        slots when the worlds would pass its end; seeds are drawn from the row's generator as the window needs."""
        size = _SEEDS_AHEAD
        want = np.where(self._auto & (self._world_end - self._seed_at < _WORLDS_AHEAD), _WORLDS_AHEAD, 0)
        want[missing] = np.maximum(want[missing], 1)  # worlds wanted ahead of each row's next seed
        grow = np.flatnonzero(self._seed_at + want > self._world_end)
        move = grow[self._seed_at[grow] + want[grow] > size]
        if move.size:  # the window to the front: the seeds and the worlds not used yet (slots past them: unread)
            at = self._seed_at[move]
            self._seeds_ahead[move] = self._seeds_ahead[move[:, None], np.minimum(at[:, None] + np.arange(size), size - 1)]
            keep = np.maximum(self._world_end[move] - at, 0)
            if keep.any():
                row, first = np.repeat(move, keep), np.repeat(at, keep)
                offset = np.arange(int(keep.sum())) - np.repeat(np.cumsum(keep) - keep, keep)
                src, dst = row * size + first + offset, row * size + offset
                self._store.take(dst, self._store, src)
                self._store_initial[dst] = self._store_initial[src]
                self._store_keys[:, dst] = self._store_keys[:, src]
            self._seed_end[move] -= at
            self._world_end[move] = keep
            self._seed_at[move] = 0
        stop = self._seed_at[grow] + want[grow]
        for i, have, need in zip(grow.tolist(), self._seed_end[grow].tolist(), stop.tolist()):
            if have < need:  # the rest of the window from the row's generator (in a batch: the same draws)
                self._seeds_ahead[i, have:] = self._rngs[i].integers(2**31 - 1, size=size - have)
                self._seed_end[i] = size
        start = np.maximum(self._world_end[grow], self._seed_at[grow])
        counts = stop - start
        row = np.repeat(grow, counts)
        slot = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts - start, counts)
        index, seeds = row * size + slot, self._seeds_ahead[row, slot]
        for first in range(0, index.size, _DRAW_CHUNK):
            part, part_seeds = index[first:first + _DRAW_CHUNK], seeds[first:first + _DRAW_CHUNK]
            self._store_keys[:, part] = self._store.reset(part, part_seeds, streams=("data", "train"))
            self._store_initial[part] = self._store.evaluate(
                self._store.base_skill[part], np.zeros(part.size), self._harness(np.zeros(part.size, np.intp)),
                k=self.scenario.official_k, split="official", rows=part).score
        self._world_end[grow] = stop

    def _version(self, rows: np.ndarray) -> np.ndarray:
        """The latest harness version (its bit pattern, ``fixed`` as bits) of each row."""
        return self.version[rows]

    def _harness(self, version: np.ndarray) -> HarnessArrays:
        return self.harness_table.take(version)  # with its derived arrays, made once per version in __init__

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

    def _view(self) -> tuple[np.ndarray, np.ndarray]:
        """(features, action mask) of every row, as :meth:`_features` and :meth:`_mask` give them (which rows have
        raw data is worked out once for both)."""
        has_raw = self._raws(slice(None)).any(axis=1)
        return self._features(has_raw), self._mask(has_raw)

    def _mask(self, has_raw: np.ndarray) -> np.ndarray:
        """``MenuAdapter.mask`` per row (``has_raw``: which rows have raw data, ``_raws``)."""
        mask = np.tile(self._static_mask, (self.num_envs, 1))
        fix = slice(MENU_INDEX[f"fix:{DEFECTS[0]}"], MENU_INDEX[f"fix:{DEFECTS[-1]}"] + 1)
        mask[:, fix] &= ~(self.fixed & self.harness_read[:, None])
        mask[:, MENU_INDEX["clean"]] &= has_raw
        train = slice(MENU_INDEX[MENU[_KIND.tolist().index("train")].name], MENU_INDEX["wait"])
        mask[:, train] &= (self.train_set >= 0)[:, None]
        mask[:, MENU_INDEX["wait"]] = ("wait" in self.tools) & self.running & ~self.done
        return mask

    def _data_features(self, f: np.ndarray, has_raw: np.ndarray) -> None:
        """The data and training features (``MenuAdapter.features``) of every row, into ``f``."""
        every = np.arange(self.num_envs)
        budget = max(self.scenario.budget_usd, 1e-9)
        f[:, _F["has_raw_data"]] = has_raw
        ts = self.train_set
        has = ts >= 0
        at = np.maximum(ts, 0)
        size = self.ds_n[every, at]
        if size.max() >= self._size_table.size:
            self._size_table = _log1p_table(2 * int(size.max()) + 1)
        f[:, _F["has_train_set"]] = has
        f[:, _F["train_set_size"]] = np.where(has, self._size_table[size], 0.0)
        f[:, _F["train_set_pass_rate"]] = np.where(has, self.ds_rate[every, at], -1.0)
        f[:, _F["train_set_clean"]] = has & self.ds_clean[every, at]
        newest = self.n_ckpt > 0
        f[:, _F["has_checkpoint"]] = newest
        f[:, _F["checkpoint_current"]] = newest & (self.ckpt_ds == ts)
        f[:, _F["trainings"]] = np.minimum(self.trainings, 3) / 3
        first = _F[f"pass_rate:{TEACHERS[0]}"]
        f[:, first:first + len(TEACHERS)] = self.pass_rates
        first = _F[f"usd_per_100:{TEACHERS[0]}"]
        known = ~np.isnan(self.usd_per_example)
        f[:, first:first + len(TEACHERS)] = np.where(known, np.minimum(1.0, 100 * self.usd_per_example / budget),
                                                     -1.0)
        f[:, _F["generations"]] = np.minimum(self.generations, 5) / 5

    def _features(self, has_raw: np.ndarray) -> np.ndarray:
        """``MenuAdapter.features`` per row (each value computed in float64, then float32 and clipped as there: a
        float64 value stored in a float32 array is the same single rounding as ``astype``)."""
        n, s = self.num_envs, self.scenario
        f = np.zeros((n, len(FEATURES)), np.float32)
        self._data_features(f, has_raw)
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
        np.maximum(f, -1.0, out=f)  # np.clip(f, -1, 1): the same floats, without clip's Python wrapper
        return np.minimum(f, 1.0, out=f)

    def _end_info(self, info: dict[str, Any], rows: np.ndarray) -> None:
        """The end keys of the rows whose episode ended this step (``_key`` masks mark them)."""
        n = self.num_envs
        values = self.end_values()
        present = np.zeros(n, bool)
        present[rows] = True
        for key in END_KEYS:
            info[key], info[f"_{key}"] = np.array(values[key], copy=True), present.copy()

    def end_values(self) -> dict[str, np.ndarray]:
        """Every row's value of each of ``END_KEYS`` as the arrays hold them now (what ``info`` gets for the rows
        that ended; the arrays themselves, not copies)."""
        n, s = self.num_envs, self.scenario
        return {
            "initial_score": self.initial_official, "official_score": self._final,
            "normalized_gain": self._reward, "best_dev_score": np.where(self.best_dev < 0, np.nan, self.best_dev),
            "initial_dev_score": np.where(self.initial_dev < 0, np.nan, self.initial_dev),
            # n_scores.sum(axis=1): each finished evaluation adds one score and one to evaluations (both 0 at reset)
            "dev_evaluations": self.evaluations, "end_reason": self.end_reason, "steps": self.steps,
            "refusals": self.refusals, "spend_usd": self.spent_n / NANO, "budget_usd": np.full(n, s.budget_usd),
            "elapsed_h": self.clock / 3600.0,
        }



class EpisodeRecords(NamedTuple):
    """Finished episodes as the ledger gets them, a column per field and an entry per episode (in row order):
    what :meth:`MenuArrayEnv.episode_records` reads from the arrays and :func:`write_episode_records` writes.
    ``result`` (initial official score, final official score, normalized gain) is None for episodes a reset or
    ``close`` cut short. Plain lists and two small arrays, so a worker process can hand them over a pipe."""

    rows: np.ndarray  # int64: the episodes' rows (for messages)
    seeds: list[int]
    steps: list[int]
    refusals: list[int]
    end_reasons: list[str]
    elapsed_h: list[float]
    spent_n: np.ndarray  # int64 nano-dollars
    result: tuple[list[float], list[float], list[float]] | None

    @staticmethod
    def concat(parts: Sequence[EpisodeRecords], offsets: Sequence[int]) -> EpisodeRecords:
        """One record of several (the same ``result`` kind), ``offsets[j]`` added to part j's rows.

        >>> a = EpisodeRecords(np.array([0]), [7], [3], [0], ["submitted"], [0.5], np.array([10]), None)
        >>> b = a._replace(seeds=[8])
        >>> both = EpisodeRecords.concat([a, b], [0, 4])
        >>> both.rows.tolist(), both.seeds, both.spent_n.tolist()
        ([0, 4], [7, 8], [10, 10])
        """
        if len({part.result is None for part in parts}) > 1:
            raise ValueError("records of ended episodes and of episodes cut short are written apart")
        result = None if parts[0].result is None else tuple(
            [value for part in parts for value in part.result[j]] for j in range(3))  # type: ignore[index]
        return EpisodeRecords(
            np.concatenate([part.rows + offset for part, offset in zip(parts, offsets)]),
            *([value for part in parts for value in getattr(part, field)]
              for field in ("seeds", "steps", "refusals", "end_reasons", "elapsed_h")),
            np.concatenate([part.spent_n for part in parts]), result)  # type: ignore[arg-type]


def write_episode_records(ledger: Ledger, records: EpisodeRecords, *, per_step: bool, budget_usd: float,
                          budget_n: int, secret: str, first: int) -> int:
    """Write finished episodes to ``ledger``; returns how many key ids it numbered (episode keys are
    ``PlatformKey.key_id(f"{secret}-{i}")`` from ``i = first``).

    Per episode (``per_step=False``, the default of ``MenuArrayEnv``): one account each (the scenario's budget,
    a key id of its own), the episode's whole spend reserved and settled, the settlement audited with its seed,
    steps, refusals, end and (for an episode that ended, not one cut short) its official result; an episode that
    spent nothing is one audit record. Per step (``write_episodes="step"``): one account for the episodes of the
    step (their budgets together), their spend reserved and settled at once, one audited entry listing each
    episode as above with its spend; each episode's spend is checked against its own budget first. Either way
    the entries are one :meth:`~rsigym_env.platform.ledger.Ledger.open_settled` (one transaction, the same records
    as writing each account, reserve and settle in turn). The chain is ``rsigym audit verify``'s; the ledger's
    own guards check again that no account spent more than its budget.

    >>> ledger = Ledger(None)
    >>> ended = EpisodeRecords(np.array([0, 1]), [11, 12], [4, 9], [0, 1], ["submitted", "step limit"], [0.25, 1.5],
    ...                        np.array([2_000_000_000, 0]), ([0.1, 0.2], [0.3, 0.2], [0.25, 0.0]))
    >>> write_episode_records(ledger, ended, per_step=False, budget_usd=20.0, budget_n=20 * NANO, secret="s",
    ...                       first=1)
    2
    >>> sorted(a.balance.spent_usd for a in ledger.accounts()), ledger.books().ok
    ([0.0, 2.0], True)
    """
    spent_n = records.spent_n
    if per_step and (spent_n > budget_n).any():  # the arrays' guard failed: never write such an entry
        raise RuntimeError(f"episodes {records.rows[spent_n > budget_n].tolist()} spent more than their budget")
    columns: list[list[Any]] = [records.seeds, records.steps, records.refusals, records.end_reasons, records.elapsed_h]
    if records.result is not None:
        columns += list(records.result)
        events = [{"seed": seed, "steps": steps, "refusals": refusals, "end_reason": reason, "elapsed_h": hours,
                   "initial_score": initial, "official_score": final, "normalized_gain": gain}
                  for seed, steps, refusals, reason, hours, initial, final, gain in zip(*columns)]
    else:
        events = [{"seed": seed, "steps": steps, "refusals": refusals, "end_reason": reason, "elapsed_h": hours}
                  for seed, steps, refusals, reason, hours in zip(*columns)]
    if per_step:
        for event, nano in zip(events, spent_n.tolist()):
            event["spend_usd"] = nano / NANO
        key = PlatformKey.key_id(f"{secret}-{first}")
        entries = [(key, len(events) * budget_n / NANO, int(spent_n.sum()) / NANO,
                    {"tool": "episodes", "decision": "allowed", "episodes": events, "key": key})]
    else:
        entries = []
        for i, event, nano in zip(range(first, first + len(events)), events, spent_n.tolist()):
            key = event["key"] = PlatformKey.key_id(f"{secret}-{i}")
            event["tool"], event["decision"] = "episode", "allowed"
            entries.append((key, budget_usd, nano / NANO, event))
    ledger.open_settled(entries)  # one transaction: as open_account, reserve and settle (or record) each
    return len(entries)


def reset_args(num_envs: int, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None, *,
               started: bool) -> tuple[list[int | None], np.ndarray]:
    """``reset``'s arguments checked: (one seed per env, the reset mask). An int ``seed`` gives env i ``seed + i``.

    >>> reset_args(3, 5, None, started=False)[0], reset_args(2, [1, None], {"reset_mask": np.array([True, False])},
    ...                                                    started=True)[1].tolist()
    ([5, 6, 7], [True, False])
    """
    n = num_envs
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
    if not started and not mask.all():
        raise ValueError("the first reset must reset every env")
    return seeds, mask


def menu_actions(actions: Any, num_envs: int) -> np.ndarray:
    """``step``'s actions checked: one menu index per env, as int64 (no silent cast: 1.5 is not entry 1).

    >>> menu_actions([0, 3], 2).dtype, menu_actions(np.array([1]), 1).tolist()
    (dtype('int64'), [1])
    """
    given = np.asarray(actions)
    if (given.shape != (num_envs,) or not np.issubdtype(given.dtype, np.integer)
            or ((given < 0) | (given >= len(MENU))).any()):
        raise ValueError(f"give one menu index (an integer 0..{len(MENU) - 1}) per env ({num_envs}), got {actions!r}")
    return given.astype(np.int64)


def _reset_needed(rows: np.ndarray) -> gym.error.ResetNeeded:
    return gym.error.ResetNeeded(f"envs {rows.tolist()} have ended: reset them (options={{'reset_mask': ...}})")


def _fit(n: np.ndarray, needs: np.ndarray, available: np.ndarray, reserve: np.ndarray) -> np.ndarray:
    """``MenuAdapter._fit`` per row, from the two amounts of its refusal message: examples whose worst case fits
    ``FIT_SHARE`` of (available - reserve); 0 if nothing was needed.

    >>> _fit(np.array([500]), np.array([10.0]), np.array([4.0]), np.array([0.0])).tolist()
    [170]
    """
    fit = n * FIT_SHARE * np.maximum(0.0, available - reserve) / np.where(needs > 0, needs, 1.0)
    return np.where(needs > 0, np.trunc(fit), 0).astype(np.int64)
