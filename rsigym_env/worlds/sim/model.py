"""The sim world's latent model, as pure functions over NumPy arrays (no I/O, no clock, no billing).

Each world seed draws a target system (:class:`SystemProfile`): which harness defects it has, how
severe each is, how good each teacher is on it and how well distilled data transfer to it. A task
has a difficulty ``d``, per defect an exposure flag (it counts only where the system has the
defect) and per remedy an interference flag (it counts only where the system does not: a remedy
applied where its defect is absent breaks some tasks). A model has a skill ``s`` (logit). One
attempt succeeds when the model solves the task (probability ``sigmoid(s - d)``), no active defect
it is exposed to trips and no unneeded remedy interferes, so

    p = sigmoid(s - d) * prod_j (1 - exposed_j * active_j * severity_j) * prod_j (1 - interfered_j * applied_j * harm_j)

Training distils toward the data's level (scaled by the system's transfer) and can over-train; data
carry a pass rate, duplicates and a share of dev-split prompts. ``CALIBRATION.md`` gives the source
of every constant.

Sim result version 6 (issue 27) is designed for arrays: a benchmark's tasks are a fixed table
(:func:`task_table`), N worlds are drawn at once from a few counter-based uniforms each (:mod:`.draws`,
:func:`draw_worlds`), an evaluation is drawn per world from its statistics (:func:`evaluation_stats`,
:func:`draw_outcomes`), and data are drawn in aggregate. The scalar sim is the same code with N = 1.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from functools import lru_cache
from types import MappingProxyType
from typing import Iterable, Literal, Mapping, Sequence

import numpy as np

from ...catalog import FAILURE_MODES, HARNESS_ERROR, WRONG_ANSWER  # noqa: F401  (HARNESS_ERROR: re-exported)
from .benchmarks import BENCHMARKS, DEFECTS, MINIMAL_MAX_OUTPUT_TOKENS, TEACHER_DUPLICATES, Benchmark, Domain
from .draws import benchmark_key, binomial, norm_ppf, seed_array, stream_keys, uniforms

# Harness costs (fractions of an attempt's tokens / sandbox time).
VERIFY_OVERHEAD = 0.15
CHECK_OVERHEAD = 0.03
# Task sampling.
REPLY_DIFFICULTY_CORRELATION = 0.3  # harder tasks need longer replies
FEASIBLE_MODEL_ALONE = 0.9  # the minimal harness's score must be reachable by a model solving < 90% alone
# Data.
FILTER_RECALL = 0.97  # a correct example passes the checker
FILTER_FALSE_PASS = 0.01  # an incorrect example passes the checker
DEDUPE_RECALL = 0.95
DUPLICATE_WEIGHT = 0.2  # a duplicate counts as this much of a fresh example
DEV_PROMPT_DUPLICATION = 0.5  # share of repeated dev prompts that count as near-duplicates
# Target systems (drawn per world seed).
SEVERITY_SPREAD = 0.25  # log-sd over seeds of a defect's severity around the domain's
SEVERITY_MAX = 0.95
HARM_RATIO = 1.35  # an unneeded remedy fails its interfered tasks as often as the defect fails its exposed ones
ABSENT_TRUNCATION = 0.005  # share of replies over 4096 tokens where truncation is not one of the system's defects
TEACHER_SPREAD = 0.5  # logit sd over seeds of a teacher's accuracy on the target's tasks
TRANSFER_MEAN, TRANSFER_SD = 0.5, 0.8  # share of the gap to the data's level that distillation can close
# Training.
REFERENCE_LR = 3e-4
REFERENCE_BATCH = 16
REFERENCE_RANK = 16
SCHEDULE_INTENSITY = MappingProxyType({"constant": 1.15, "linear": 1.0, "cosine": 0.95})
RANK_CAP_MAX = 0.85  # learnable fraction with an unlimited rank
RANK_HALF = 4.0  # rank that reaches half of it
INTENSITY_SCALE = 1.0  # cumulative intensity at which 63% of the learnable fraction is reached
RANK_INTENSITY_EXPONENT = 0.5  # larger rank, larger effective update
BATCH_INTENSITY_EXPONENT = 0.5  # smaller batch, more optimizer steps
THRESHOLD_RANGE = (0.8, 1.8)  # u*: cumulative intensity a seed tolerates before damage
DAMAGE_SCALE_MEDIAN = 0.6  # kappa (logits), median over seeds
DAMAGE_SCALE_SPREAD = 0.8  # log-sd of kappa over seeds
DAMAGE_EXPONENT = 0.25
DAMAGE_MAX = 6.0
TRAIN_NOISE = 0.06  # logits
DEV_MEMORY_MAX = 0.9
DEV_MEMORY_RATE = 0.35


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


# --------------------------------------------------------------------------------------------
# Harness


class HarnessError(ValueError):
    """harness.toml cannot be read; every attempt fails with this message."""


@dataclass(frozen=True)
class Harness:
    """The parsed options of ``harness.toml``; the defaults are the minimal harness."""

    max_output_tokens: int = MINIMAL_MAX_OUTPUT_TOKENS
    on_truncation: Literal["stop", "continue"] = "stop"
    verify_before_submit: bool = False
    persistent: bool = False
    detect: bool = False
    check: bool = False

    @property
    def active(self) -> np.ndarray:
        """Which defects (in ``DEFECTS`` order) the harness leaves in place."""
        fixed = (self.on_truncation == "continue", self.verify_before_submit, self.persistent, self.detect, self.check)
        return ~np.array(fixed)

    @property
    def applied(self) -> np.ndarray:
        """Which remedies (in ``DEFECTS`` order) the harness applies: a longer reply limit or "continue"
        for truncation, each switch for the others."""
        longer = self.on_truncation == "continue" or self.max_output_tokens > MINIMAL_MAX_OUTPUT_TOKENS
        return np.array((longer, self.verify_before_submit, self.persistent, self.detect, self.check))


HARNESS_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "generation": ("max_output_tokens", "on_truncation"),
        "completion": ("verify_before_submit",),
        "shell": ("persistent",),
        "loop": ("detect",),
        "edits": ("check",),
    }
)
"""The keys of each section of harness.toml (each key is a field of :class:`Harness`)."""
MAX_OUTPUT_TOKENS_RANGE = (256, 131_072)


@lru_cache(maxsize=512)
def parse_harness_toml(text: str) -> Harness:
    """Read harness.toml; unknown sections or keys, wrong types or values raise :class:`HarnessError`.

    >>> parse_harness_toml('[shell]\\npersistent = true').persistent
    True
    >>> parse_harness_toml('[shell]\\npersistent = "yes"')
    Traceback (most recent call last):
    ...
    rsigym_env.worlds.sim.model.HarnessError: harness.toml: [shell] persistent must be true or false, got 'yes'
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(f"harness.toml is not valid TOML: {exc}") from None
    values: dict[str, object] = {}
    for section, table in doc.items():
        if section not in HARNESS_KEYS:
            raise HarnessError(f"harness.toml: unknown section [{section}]; sections are {', '.join(HARNESS_KEYS)}")
        if not isinstance(table, dict):
            raise HarnessError(f"harness.toml: [{section}] must be a table")
        for key, value in table.items():
            if key not in HARNESS_KEYS[section]:
                known = ", ".join(HARNESS_KEYS[section])
                raise HarnessError(f"harness.toml: unknown key [{section}] {key}; keys are {known}")
            values[key] = _checked(section, key, value)
    return Harness(**values)


def _checked(section: str, key: str, value: object) -> object:
    where = f"harness.toml: [{section}] {key}"
    if key == "max_output_tokens":
        low, high = MAX_OUTPUT_TOKENS_RANGE
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise HarnessError(f"{where} must be an integer from {low} to {high}, got {value!r}")
    elif key == "on_truncation":
        if value not in ("stop", "continue"):
            raise HarnessError(f'{where} must be "stop" or "continue", got {value!r}')
    elif not isinstance(value, bool):
        raise HarnessError(f"{where} must be true or false, got {value!r}")
    return value


def parse_harness(files: Mapping[str, str]) -> Harness:
    """The harness options from a harness's files (only ``harness.toml`` is read)."""
    if "harness.toml" not in files:
        raise HarnessError("the harness has no harness.toml")
    return parse_harness_toml(files["harness.toml"])


# --------------------------------------------------------------------------------------------
# Tasks and attempts


@dataclass(frozen=True)
class SystemProfile:
    """One world seed's target system (drawn by :func:`draw_worlds`; never shown to a researcher)."""

    present: np.ndarray  # (5,) bool: the system has the defect
    severity: np.ndarray  # (5,) chance an exposed attempt fails because of the defect (where present)
    harm: np.ndarray  # (5,) chance an interfered attempt fails when the remedy is applied where the defect is absent
    teacher_shift: Mapping[str, float]  # logit shift of each teacher's accuracy on this system's tasks
    transfer: float  # share of the gap to the data's level that distillation can close (can be < 0)


@dataclass(frozen=True)
class TaskSet:
    """The latent properties of a split's tasks on one target system, or on N systems with a leading
    dimension (``difficulty`` (N, n) and so on)."""

    difficulty: np.ndarray  # (n,) logits
    reply_tokens: np.ndarray  # (n,) longest reply an attempt needs
    flags: np.ndarray  # (n, 4) exposure to the defects after truncation (where the system has them)
    interference: np.ndarray  # (n, 5) the remedy breaks the task where the system lacks the defect
    present: np.ndarray  # (5,) the system's defects

    def __len__(self) -> int:
        return self.difficulty.shape[-1]

    def exposed(self, harness: Harness) -> np.ndarray:
        """(n, 5) bool: the task is exposed to the defect and the harness leaves it active."""
        return exposed_mask(self.reply_tokens, self.flags, self.present, harness.max_output_tokens, harness.active)

    def interfered(self, harness: Harness) -> np.ndarray:
        """(n, 5) bool: the harness applies a remedy the system does not need, and it breaks the task."""
        return interfered_mask(self.interference, self.present, harness.applied)

    def head(self, n: int) -> TaskSet:
        """The first ``n`` tasks (of every world)."""
        return TaskSet(self.difficulty[..., :n], self.reply_tokens[..., :n], self.flags[..., :n, :],
                       self.interference[..., :n, :], self.present)

    def row(self, i: int) -> TaskSet:
        """World ``i``'s tasks (of N)."""
        return TaskSet(self.difficulty[i], self.reply_tokens[i], self.flags[i], self.interference[i], self.present[i])


def exposed_mask(reply_tokens: np.ndarray, flags: np.ndarray, present: np.ndarray, max_output_tokens: int | np.ndarray,
                 active: np.ndarray) -> np.ndarray:
    """(n, 5) bool: each task is exposed to the defect (a reply over ``max_output_tokens``, else its flag
    where the system has the defect) and the harness leaves the defect ``active``. With leading
    dimensions (N worlds: ``reply_tokens`` (N, n), ``flags`` (N, n, 4), ``present`` (N, 5),
    ``max_output_tokens`` (N,), ``active`` (N, 5)) it gives (N, n, 5), each row as alone.

    >>> exposed_mask(np.array([100.0, 9000.0]), np.ones((2, 4), bool), np.array([1, 0, 1, 1, 1], bool), 4096,
    ...              np.ones(5, bool)).astype(int).tolist()
    [[0, 0, 1, 1, 1], [1, 0, 1, 1, 1]]
    """
    truncated = reply_tokens > np.asarray(max_output_tokens)[..., None]
    exposed = np.concatenate([truncated[..., None], flags & present[..., None, 1:]], axis=-1)
    return exposed & active[..., None, :]


def interfered_mask(interference: np.ndarray, present: np.ndarray, applied: np.ndarray) -> np.ndarray:
    """(n, 5) bool: the harness ``applied`` a remedy the system (``present``) does not need and it
    breaks the task; batched like :func:`exposed_mask`."""
    return interference & (applied & ~present)[..., None, :]


TASK_DRAWS = 4 + len(DEFECTS) - 1 + len(DEFECTS)
"""Uniforms per task: two stratified normals (a rank key and a jitter each), one per exposure flag,
one per interference flag."""


def stratified_normal(keys: np.ndarray, jitter: np.ndarray) -> np.ndarray:
    """(..., n) standard normals, one from each of n equal-probability strata in a random order: the
    stratum of an element is its rank in ``keys``, its place in the stratum ``jitter`` (uniforms)."""
    n = keys.shape[-1]
    order = keys.argsort(axis=-1, kind="stable")
    return norm_ppf((order + jitter) / n)


def draw_tasks(u: np.ndarray, domain: Domain, present: np.ndarray) -> TaskSet:
    """Tasks of a domain on N systems with the defects ``present`` (N, 5), from uniforms ``u``
    (N, TASK_DRAWS, n): stratified normal difficulty, log-normal reply length (longer when harder;
    rarely over 4096 tokens where truncation is not a defect), per defect an exposure flag and per
    remedy an interference flag, each on a random ``round(rate * n)`` of the tasks."""
    n, n_defects = u.shape[-1], len(DEFECTS)
    z = stratified_normal(u[..., 0, :], u[..., 1, :])
    noise = stratified_normal(u[..., 2, :], u[..., 3, :])
    rho = REPLY_DIFFICULTY_CORRELATION
    median = np.where(present[..., :1], domain.reply_log_median, domain.reply_log_median_at(ABSENT_TRUNCATION))
    log_reply = median + domain.reply_sigma * (rho * z + math.sqrt(1 - rho**2) * noise)
    rates = np.asarray(domain.exposure)
    counts = np.round(np.concatenate([rates[1:], rates]) * n).astype(np.intp)
    chosen = np.swapaxes(smallest(u[..., 4:, :], counts), -1, -2)  # (..., n, 9): exact rates in every split
    flags, interference = chosen[..., : n_defects - 1], chosen[..., n_defects - 1 :]
    return TaskSet(domain.difficulty_sd * z, np.exp(log_reply), flags, interference, present)


def smallest(keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(..., m, n) bool: per row j of the last two axes, the ``counts[j]`` elements with the smallest keys
    (a random subset of that size when the keys are uniforms; distinct keys assumed).

    >>> smallest(np.array([[0.3, 0.1, 0.2], [0.3, 0.1, 0.2]]), np.array([2, 0])).astype(int).tolist()
    [[0, 1, 1], [0, 0, 0]]
    """
    ordered = np.sort(keys, axis=-1)
    last = ordered[..., np.arange(len(counts)), np.maximum(counts - 1, 0)]
    return (keys <= last[..., None]) & (counts > 0)[:, None]


# --------------------------------------------------------------------------------------------
# Sim result version 6: a benchmark's fixed task table, worlds as a few numbers, evaluations per world


@dataclass(frozen=True)
class TaskTable:
    """A benchmark's tasks, drawn once from its id (sim result version 6): two halves of ``n`` tasks; a
    world takes one half as its official split and the other as its dev split. Reply lengths come in two
    variants (index 0: truncation is not one of the system's defects, so long replies are rare; 1: it is).

    >>> t = task_table("aime")
    >>> t.difficulty.shape, t.reply_tokens.shape, t.flags.shape, t.interference.shape, t.codes.shape
    ((2, 60), (2, 2, 60), (2, 60, 4), (2, 60, 5), (2, 60))
    >>> bool((task_table("aime").difficulty == t.difficulty).all())  # fixed per benchmark
    True
    """

    difficulty: np.ndarray  # (2, n) logits, per half
    reply_tokens: np.ndarray  # (2 variants, 2 halves, n)
    flags: np.ndarray  # (2, n, 4) exposure to the defects after truncation (where the system has them)
    interference: np.ndarray  # (2, n, 5)
    exp_difficulty: np.ndarray  # (2, n): exp(difficulty), so that sigmoid(s - d) = 1 / (1 + exp(d) exp(-s))
    codes: np.ndarray  # (2, n) int: each task's flags as bits (bit j - 1: defect j's flag, j = 1..4)
    interference_codes: np.ndarray  # (2, n) int: each task's interference flags as bits (bit j: remedy j)
    minimal_codes: np.ndarray  # (2 variants, 2, n) int: ``codes`` + 16 where a reply is cut off at the minimal limit

    @property
    def n(self) -> int:
        return self.difficulty.shape[-1]

    def tasks(self, half: int, variant: int, present: np.ndarray) -> TaskSet:
        """One half as a :class:`TaskSet` of a system with the defects ``present`` (5,)."""
        return TaskSet(self.difficulty[half], self.reply_tokens[variant, half], self.flags[half],
                       self.interference[half], present)


@lru_cache(maxsize=None)
def task_table(benchmark_id: str) -> TaskTable:
    """The benchmark's :class:`TaskTable`: the task draws of version 5 (stratified difficulty, log-normal
    reply lengths, exact exposure rates per half) from the benchmark's own ``table`` stream."""
    benchmark = BENCHMARKS[benchmark_id]  # keyed by id: the table is cached once per benchmark
    domain, n = benchmark.domain, benchmark.n_tasks
    key = stream_keys(seed_array([0]), benchmark_key(benchmark_id), "table")
    u = uniforms(key, np.zeros(1, np.uint64), 2 * TASK_DRAWS * n).reshape(2, TASK_DRAWS, n)
    with_truncation = np.ones((2, len(DEFECTS)), bool)
    without = with_truncation.copy()
    without[:, 0] = False
    drawn = draw_tasks(u, domain, with_truncation)
    reply = np.stack([draw_tasks(u, domain, without).reply_tokens, drawn.reply_tokens])
    arrays = (drawn.difficulty, reply, drawn.flags, drawn.interference, np.exp(drawn.difficulty),
              (drawn.flags << np.arange(len(DEFECTS) - 1)).sum(axis=-1),
              (drawn.interference << np.arange(len(DEFECTS))).sum(axis=-1))
    arrays += (arrays[5] + 16 * (reply > MINIMAL_MAX_OUTPUT_TOKENS),)
    for array in arrays:
        array.flags.writeable = False
    return TaskTable(*arrays)


@dataclass(frozen=True)
class Worlds:
    """N worlds of one benchmark, drawn at once (:func:`draw_worlds`): arrays with a leading N, over the
    benchmark's fixed :class:`TaskTable`."""

    table: TaskTable
    present: np.ndarray  # (N, 5) bool
    severity: np.ndarray  # (N, 5)
    harm: np.ndarray  # (N, 5)
    teacher_shift: np.ndarray  # (N, T) in ``sorted(domain.teacher_accuracy)`` order
    transfer: np.ndarray  # (N,)
    threshold: np.ndarray  # (N,) robustness: cumulative intensity before damage
    damage_scale: np.ndarray  # (N,)
    half: np.ndarray  # (N,) int: the table half that is the world's official split (the other is dev)
    base_skill: np.ndarray  # (N,) calibrated so that the minimal harness's expected official avg is the paper's

    def __len__(self) -> int:
        return len(self.transfer)

    @property
    def variant(self) -> np.ndarray:
        """(N,) int: the reply-length variant of each world (1 where truncation is a defect)."""
        return self.present[:, 0].astype(np.intp)

    def profile(self, i: int, domain: Domain) -> SystemProfile:
        shift = dict(zip(sorted(domain.teacher_accuracy), self.teacher_shift[i].tolist()))
        arrays = (self.present[i].copy(), self.severity[i].copy(), self.harm[i].copy())
        for array in arrays:
            array.flags.writeable = False
        return SystemProfile(*arrays, MappingProxyType(shift), float(self.transfer[i]))

    def tasks(self, i: int, official: bool) -> TaskSet:
        """World ``i``'s official or dev split as a :class:`TaskSet`."""
        half = int(self.half[i]) if official else 1 - int(self.half[i])
        return self.table.tasks(half, int(self.variant[i]), self.present[i])


MAX_ATTEMPTS = 8  # EvalRequest.k's upper bound
SYSTEM_DRAWS = 2 * len(DEFECTS) + 3 + 1  # uniforms of a system besides its teachers': present, severity,
# transfer, threshold, damage scale, the official half


def draw_worlds(benchmark: Benchmark, seeds: Sequence[int] | np.ndarray, world_keys: np.ndarray | None = None
                ) -> Worlds:
    """N worlds (one per seed) from a few uniforms each, every transform batched over N.

    A world is a target system (each defect the domain can have present with its prevalence, a severity
    log-normal around the domain's, an unneeded remedy harming ``HARM_RATIO`` times as much; each
    teacher's accuracy shifted in logits; a transfer share), its model's robustness, which half of the
    benchmark's fixed task table is its official split, and the base skill calibrated on that split
    (:func:`calibrate_worlds`). A system whose defects alone forbid the paper's score is redrawn (rarely)
    from the world's next block. Row i depends on seed i only. ``world_keys``: the seeds' ``world`` stream keys
    if the caller has them (:func:`~.draws.streams_keys`).
    """
    domain = benchmark.domain
    seeds = seed_array(seeds)
    size, n_defects = len(seeds), len(DEFECTS)
    teachers = len(domain.teacher_accuracy)
    table = task_table(benchmark.id)
    key_world = stream_keys(seeds, benchmark_key(benchmark.id), "world") if world_keys is None else world_keys
    width = SYSTEM_DRAWS + teachers
    block = uniforms(key_world, np.zeros(size, np.uint64), width)
    relevant = np.asarray(domain.exposure) > 0
    target = benchmark.initial_score

    def systems(block: np.ndarray) -> tuple[np.ndarray, ...]:
        u_present, z = block[:, :n_defects], norm_ppf(block[:, n_defects : width - 2])
        present = relevant & (u_present < np.asarray(domain.prevalence))
        severity = np.minimum(SEVERITY_MAX, np.asarray(domain.severity) * np.exp(SEVERITY_SPREAD * z[:, :n_defects]))
        half = (block[:, -1] < 0.5).astype(np.intp)
        return present, severity, z, block[:, -2], half

    present, severity, z, u_threshold, half = systems(block)
    ceiling = _minimal_ceiling(table, present, severity, half)
    n_tasks = ceiling.shape[-1]
    ceiling_mean = np.add.reduce(ceiling, axis=-1) / n_tasks  # ceiling.mean(axis=-1): the same floats
    redraw = np.flatnonzero(FEASIBLE_MODEL_ALONE * ceiling_mean <= target)
    attempt = 0
    while redraw.size:  # the (rare) systems whose defects alone forbid the paper's score
        attempt += 1
        if attempt > 100:
            raise RuntimeError(f"no feasible target system for seeds {seeds[redraw].tolist()}")
        more = systems(uniforms(key_world[redraw], np.full(redraw.size, attempt, np.uint64), width))
        for whole, part in zip((present, severity, z, u_threshold, half), more):
            whole[redraw] = part
        ceiling[redraw] = _minimal_ceiling(table, present[redraw], severity[redraw], half[redraw])
        ceiling_mean[redraw] = np.add.reduce(ceiling[redraw], axis=-1) / n_tasks
        redraw = redraw[FEASIBLE_MODEL_ALONE * ceiling_mean[redraw] <= target]
    harm = np.where(relevant, np.minimum(SEVERITY_MAX, HARM_RATIO * severity), 0.0)
    shift = TEACHER_SPREAD * z[:, n_defects : n_defects + teachers]
    transfer = TRANSFER_MEAN + TRANSFER_SD * z[:, n_defects + teachers]
    low, high = THRESHOLD_RANGE
    threshold = low + (high - low) * u_threshold
    damage_scale = DAMAGE_SCALE_MEDIAN * np.exp(DAMAGE_SCALE_SPREAD * z[:, -1])
    base_skill = calibrate_worlds(benchmark.id, half, ceiling, target, factor_mean=ceiling_mean)
    return Worlds(table, present, severity, harm, shift, transfer, threshold, damage_scale, half, base_skill)


CODES = 2 ** len(DEFECTS)
"""Exposure codes of a task: 5 bits (its four flags, then whether its reply is cut off)."""
CODE_BITS = np.array([[(c >> 4) & 1, *((c >> j) & 1 for j in range(4))] for c in range(CODES)], dtype=float)
"""(32, 5): which defects (``DEFECTS`` order) a task with each exposure code is exposed to."""
_DEFECT_CODES = np.array([np.flatnonzero(CODE_BITS[:, j]) for j in range(len(DEFECTS))])  # (5, 16), ascending


def per_defect(weighted: np.ndarray) -> np.ndarray:
    """(N, 5): for each defect the sum of ``weighted`` (N, 32, every value >= 0) over the exposure codes that have
    it, added in code order one after the other: what ``(weighted[:, None, :] * CODE_BITS.T).sum(axis=-1)`` gives
    (its product is laid out (N, 32, 5), so NumPy reduces the codes axis as a running sum, the zero terms adding
    nothing). Here each defect's 16 codes are gathered as (5, 16, N) and reduced over the middle axis, again a
    running sum, one row of N at a time; a single row is reduced as two, since NumPy would sum a lone row's 16
    contiguous codes pairwise.

    >>> w = np.arange(64.0).reshape(2, 32) / 7
    >>> bool((per_defect(w) == (w[:, None, :] * CODE_BITS.T).sum(axis=-1)).all()), per_defect(w[:1]).shape
    (True, (1, 5))
    """
    if len(weighted) == 1:
        return per_defect(np.concatenate([weighted, weighted]))[:1]
    return np.add.reduce(np.ascontiguousarray(weighted.T)[_DEFECT_CODES], axis=1).T


CODE_AXES = (1, 5, 4, 3, 2)
"""The axis of each defect's bit in a (N, 2, 2, 2, 2, 2) view of (N, 32) exposure codes (truncation is bit 4)."""
INTERFERENCE_AXES = (5, 4, 3, 2, 1)
"""The same for interference codes (remedy j is bit j)."""


def per_code(values: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """(N, 32): for every code, the sum of ``values`` (N, 5) over the defects it has, added in ``DEFECTS``
    order (``axes``: :data:`CODE_AXES` or :data:`INTERFERENCE_AXES`); element-wise, so a row's sums never
    depend on the other rows. The table doubles once per defect (contiguous passes; the same sums, in the
    same order, as adding each defect's value to the half of the codes that have it).

    >>> per_code(np.array([[1.0, 2.0, 4.0, 8.0, 16.0]]), CODE_AXES)[0, [0, 1, 16, 31]].tolist()
    [0.0, 2.0, 1.0, 31.0]
    """
    size = len(values)
    out = np.zeros((size, 1, 1, 1, 1, 1))
    for j, axis in enumerate(axes):  # the codes without the bit, then the same plus the defect's value
        out = np.concatenate([out, out + values[:, j].reshape(size, 1, 1, 1, 1, 1)], axis=axis)
    return out.reshape(size, CODES)


@dataclass(frozen=True)
class Exposure:
    """N worlds' defects on the first ``m`` tasks of a table half under their harnesses: each task's
    exposure code, and per world and code the chance that no defect trips (``passing``), the sum of the
    trip chances (``trips``), and per defect the trip chance of an exposed attempt (``trip``)."""

    code: np.ndarray  # (N, m) int
    cell: np.ndarray  # (N, m) int: ``code + 32 * row``, the index of a task's code in the flattened (N, 32) tables
    passing: np.ndarray  # (N, 32)
    trips: np.ndarray  # (N, 32)
    trip: np.ndarray  # (N, 5): severity where the defect counts (truncation: the harness leaves it active)

    def task_pass(self) -> np.ndarray:
        """(N, m): each task's chance that no active defect it is exposed to trips."""
        return np.take(self.passing, self.cell)


_OFFSETS = np.zeros((0, 1), np.int64)


def _row_offsets(size: int) -> np.ndarray:
    """(size, 1): ``CODES * row``, the start of each row's codes in a flattened (size, 32) table (read-only)."""
    global _OFFSETS
    if len(_OFFSETS) < size:
        _OFFSETS = CODES * np.arange(max(size, 2 * len(_OFFSETS)), dtype=np.int64)[:, None]
        _OFFSETS.flags.writeable = False
    return _OFFSETS[:size]


def exposure(table: TaskTable, half: np.ndarray, variant: np.ndarray, present: np.ndarray, severity: np.ndarray,
             max_output_tokens: np.ndarray, active: np.ndarray, m: int) -> Exposure:
    """The :class:`Exposure` of N worlds (one table half, reply variant, system and harness each): a reply
    longer than ``max_output_tokens`` is exposed to truncation, a flagged task to its defect where the
    system has it; the harness leaves the defects ``active``.

    >>> t = task_table("aime")
    >>> e = exposure(t, np.array([0]), np.array([1]), np.ones((1, 5), bool), np.full((1, 5), 0.5),
    ...              np.array([4096]), np.ones((1, 5), bool), 60)
    >>> e.code.shape, float(e.passing[0, 0]), float(e.passing[0, 16]), float(e.trips[0, 31])
    ((1, 60), 1.0, 0.5, 2.5)
    """
    max_output_tokens = np.asarray(max_output_tokens)
    if (max_output_tokens == MINIMAL_MAX_OUTPUT_TOKENS).all():  # the usual limit: the codes are tabulated
        code = table.minimal_codes[variant, half, :m]
    else:
        code = table.codes[half, :m] + 16 * (table.reply_tokens[variant, half, :m] > max_output_tokens[:, None])
    cell = code + _row_offsets(len(half))
    counts = np.concatenate([active[:, :1], present[:, 1:] & active[:, 1:]], axis=1)
    trip = np.where(counts, severity, 0.0)
    size = len(half)  # both tables in one per_code pass (its rows are independent)
    both = per_code(np.concatenate([np.where(counts, np.log1p(-severity), 0.0), trip]), CODE_AXES)
    return Exposure(code, cell, np.exp(both[:size]), both[size:], trip)


def _minimal_ceiling(table: TaskTable, present: np.ndarray, severity: np.ndarray, half: np.ndarray) -> np.ndarray:
    """(N, n): each official task's chance that no defect of the minimal harness trips (its score ceiling)."""
    minimal = Harness()
    size = len(half)
    return exposure(table, half, present[:, 0].astype(np.intp), present, severity,
                    np.full(size, minimal.max_output_tokens), np.broadcast_to(minimal.active, (size, 5)),
                    table.n).task_pass()


SKILL_GRID = np.linspace(-20.0, 20.0, 4001)
"""Skills (logits) at which a task table's mean solve rate is tabulated (:func:`solve_curve`)."""


@lru_cache(maxsize=None)
def solve_curve(benchmark_id: str) -> np.ndarray:
    """(2, len(SKILL_GRID)): each table half's mean ``sigmoid(s - d)`` at every grid skill (increasing)."""
    d = task_table(benchmark_id).difficulty
    curve = (1.0 / (1.0 + np.exp(d[:, None, :] - SKILL_GRID[:, None]))).mean(axis=-1)
    curve.flags.writeable = False
    return curve


def calibrate_worlds(benchmark_id: str, half: np.ndarray, factor: np.ndarray, target: float,
                     steps: int = 3, factor_mean: np.ndarray | None = None) -> np.ndarray:
    """The skill ``s`` with ``mean(sigmoid(s - d) * factor) == target`` per world, ``d`` the official half
    ``half`` (N,) of the benchmark's table and ``factor`` (N, n): the tabulated inverse of the half's mean
    solve rate at ``target / mean(factor)`` (:func:`solve_curve`), refined by ``steps`` Newton steps on every
    row at once (a fixed count: no row waits for another). ``factor_mean``: ``factor.mean(axis=-1)`` if the
    caller has it.

    >>> s = calibrate_worlds("aime", np.array([0, 1]), np.ones((2, 60)), 0.3167)
    >>> d = task_table("aime").difficulty
    >>> [round(float((1 / (1 + np.exp(d[h] - s[h]))).mean()), 10) for h in (0, 1)]
    [0.3167, 0.3167]
    """
    curve = solve_curve(benchmark_id)
    exp_difficulty = task_table(benchmark_id).exp_difficulty[half]
    n = factor.shape[-1]  # a mean is np.mean's: the sum (add.reduce), then / n
    ratio = target / (np.add.reduce(factor, axis=-1) / n if factor_mean is None else factor_mean)
    s = np.where(half == 1, np.interp(ratio, curve[1], SKILL_GRID), np.interp(ratio, curve[0], SKILL_GRID))
    for _ in range(steps):  # the same operations as written out, in place (1 + x is x + 1)
        q = exp_difficulty * np.exp(-s)[:, None]
        q += 1.0
        np.divide(1.0, q, out=q)  # q = 1 / (1 + exp(d) exp(-s))
        qf = q * factor
        gap = np.add.reduce(qf, axis=-1) / n - target
        np.subtract(1.0, q, out=q)
        q *= qf  # qf * (1 - q)
        slope = np.add.reduce(q, axis=-1) / n
        s = s - gap / slope
    return s


def calibrate_skill(difficulty: np.ndarray, factor: np.ndarray, target: float | np.ndarray) -> np.ndarray:
    """The skill ``s`` with ``mean(sigmoid(s - d) * factor) == target`` (safeguarded Newton), per row
    of ``difficulty`` (..., n); each row stops on its own, so a row's result does not depend on the others
    (the live rows' arrays are kept packed and cut only when some row stops: the same floats, fewer calls).

    >>> float(calibrate_skill(np.zeros(4), np.ones(4), 0.5))
    0.0
    """
    difficulty = np.asarray(difficulty, dtype=float)
    unit = np.ndim(factor) == 0 and float(factor) == 1.0  # q * 1.0 is q: those products are left out
    factor = np.broadcast_to(np.asarray(factor, dtype=float), difficulty.shape)
    shape, n = difficulty.shape[:-1], difficulty.shape[-1]
    d, f = difficulty.reshape(-1, n), factor.reshape(-1, n)
    goal = np.broadcast_to(np.asarray(target, dtype=float), shape).reshape(-1)
    ceiling = np.add.reduce(f, axis=-1) / n
    if not ((0.0 < goal) & (goal < ceiling)).all():
        raise ValueError(f"target {goal.tolist()} is not reachable (ceiling {ceiling.round(4).tolist()})")
    rows = len(goal)
    s = np.zeros(rows)
    live = np.arange(rows)
    low, high, sl = np.full(rows, -60.0), np.full(rows, 60.0), s.copy()
    for _ in range(200):
        q = 1.0 / (1.0 + np.exp(-(sl[:, None] - d)))
        gap = np.add.reduce(q if unit else q * f, axis=-1) / n - goal
        going = np.abs(gap) >= 1e-13
        if not going.all():
            s[live] = sl
            live, d, goal, q, gap = live[going], d[going], goal[going], q[going], gap[going]
            sl, low, high = sl[going], low[going], high[going]
            f = f if unit else f[going]
            if not live.size:
                break
        above = gap > 0
        high = np.where(above, sl, high)
        low = np.where(above, low, sl)
        slope = np.add.reduce(q * (1.0 - q) if unit else q * (1.0 - q) * f, axis=-1) / n
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where(slope > 0, sl - gap / slope, np.nan)
        inside = (low < step) & (step < high)
        sl = np.where(inside, step, 0.5 * (low + high))
    s[live] = sl
    return s.reshape(shape)


OUTCOMES = 1 + len(DEFECTS) + 1
"""Outcome categories of an attempt: success, each defect, wrong_answer."""
EVAL_DRAWS = 1 + len(DEFECTS)
"""Uniforms of one evaluation's aggregate draw: the success count, then the failures' split by cause."""


@dataclass(frozen=True)
class EvalStats:
    """What an evaluation of N worlds is drawn from: per task its success chance, per world the expected
    successes and failures by cause per attempt round (sums over tasks)."""

    success: np.ndarray  # (N, m) per task: chance an attempt succeeds
    code: np.ndarray  # (N, m) per task: its exposure code (:class:`Exposure`)
    blame: np.ndarray  # (N, 32) per code: (1 - memory) * (chance some defect trips) / (sum of trip chances)
    trip: np.ndarray  # (N, 5) per defect: the trip chance of an exposed attempt
    mean: np.ndarray  # (N,) expected successes per attempt round
    var: np.ndarray  # (N,) their variance
    causes: np.ndarray  # (N, 6) expected failures per round blamed on each defect, then wrong_answer


def evaluation_stats(
    table: TaskTable, half: np.ndarray, variant: np.ndarray, present: np.ndarray, severity: np.ndarray,
    harm: np.ndarray, skill: np.ndarray, memory: np.ndarray, max_output_tokens: np.ndarray, active: np.ndarray,
    applied: np.ndarray, n_tasks: int | None = None,
) -> EvalStats:
    """The per-world statistics of an evaluation of N worlds (one harness, skill and dev memory each) on
    the first ``n_tasks`` tasks of each world's table half. An attempt succeeds when the model solves the
    task (``sigmoid(skill - d)``), no active defect it is exposed to trips and no unneeded remedy
    interferes, or when a dev task is recalled (``memory``); a failure where some defect tripped is blamed
    on one of them, defect j in proportion to its trip chance, otherwise it is a wrong answer. The defect
    terms are per exposure code (32 per world) and gathered per task, so a task costs a handful of
    element-wise operations and no row depends on another.

    >>> t = task_table("aime")
    >>> s = evaluation_stats(t, np.array([0]), np.array([0]), np.zeros((1, 5), bool), np.zeros((1, 5)),
    ...                      np.zeros((1, 5)), np.array([0.0]), np.array([0.0]), np.array([4096]),
    ...                      np.ones((1, 5), bool), np.zeros((1, 5), bool))
    >>> bool(np.isclose(s.mean[0], (1 / (1 + np.exp(t.difficulty[0]))).sum())), s.causes[0, :5].tolist()
    (True, [0.0, 0.0, 0.0, 0.0, 0.0])
    """
    size = len(half)
    m = table.n if n_tasks is None else min(n_tasks, table.n)
    e = exposure(table, half, variant, present, severity, max_output_tokens, active, m)
    p = e.task_pass()
    unneeded = applied & ~present
    hit = np.flatnonzero(unneeded.any(axis=1))  # the other rows' factor is exp(0) = 1 for every task: p * 1.0 is p
    if hit.size == size:
        interference = np.exp(per_code(np.where(unneeded, np.log1p(-harm), 0.0), INTERFERENCE_AXES))
        p *= np.take(interference, table.interference_codes[half, :m] + _row_offsets(size))
    elif hit.size:
        interference = np.exp(per_code(np.where(unneeded[hit], np.log1p(-harm[hit]), 0.0), INTERFERENCE_AXES))
        p[hit] *= np.take(interference, table.interference_codes[half[hit], :m] + _row_offsets(hit.size))
    odds = table.exp_difficulty[half, :m]
    odds *= np.exp(-skill)[:, None]
    odds += 1.0
    p /= odds
    memory = np.asarray(memory, dtype=float)
    remembered = memory.any()
    success = p + memory[:, None] * (1.0 - p) if remembered else p
    with np.errstate(divide="ignore", invalid="ignore"):
        blame = np.where(e.trips > 0, (1.0 - e.passing) / e.trips, 0.0)
    if remembered:
        blame *= 1.0 - memory[:, None]
    weighted = np.bincount(e.cell.ravel(), minlength=CODES * size).reshape(size, CODES) * blame
    causes = np.empty((size, OUTCOMES - 1))
    causes[:, :5] = per_defect(weighted)  # per defect, a sum over its codes
    causes[:, :5] *= e.trip
    mean = success.sum(axis=-1)
    causes[:, 5] = np.maximum(m - mean - causes[:, :5].sum(axis=-1), 0.0)
    var = mean - (success * success).sum(axis=-1)
    return EvalStats(success, e.code, blame, e.trip, mean, var, causes)


def draw_outcomes(stats: EvalStats, k: int | np.ndarray, u: np.ndarray, valid: np.ndarray | None = None
                  ) -> np.ndarray:
    """(N, len(FAILURE_MODES) + 1) counts of an avg@k evaluation's attempts drawn from ``stats`` with
    ``EVAL_DRAWS`` uniforms per world ``u`` (N, EVAL_DRAWS): column 0 the successes, then the failures per
    ``FAILURE_MODES``. The success count is the normal approximation of its Poisson-binomial law
    (rounded, clipped to 0..n k); the failures are split by cause as one multinomial (sequential
    binomials, :func:`~.draws.binomial`) in proportion to the expected failures per cause. A world whose
    harness does not parse (``valid`` False) fails every attempt with ``harness_error``.

    >>> s = EvalStats(np.full((1, 10), 0.5), np.zeros((1, 10), int), np.zeros((1, 32)), np.zeros((1, 5)),
    ...               np.array([5.0]), np.array([2.5]), np.array([[0, 0, 0, 0, 0, 5.0]]))
    >>> draw_outcomes(s, 3, np.full((1, EVAL_DRAWS), 0.5)).tolist()
    [[15, 0, 0, 0, 0, 0, 15, 0]]
    """
    size, m = stats.success.shape
    k = np.asarray(k)
    attempts = m * k
    z = norm_ppf(u)
    wins = np.floor(k * stats.mean + np.sqrt(k * stats.var) * z[:, 0] + 0.5)
    wins = np.minimum(np.maximum(wins, 0.0), attempts)  # as np.clip (a zero's sign aside: the counts are integers)
    out = np.zeros((size, len(FAILURE_MODES) + 1), np.int64)
    out[:, 0] = wins
    left = attempts - wins
    weights = stats.causes[:, : OUTCOMES - 2]
    causes = weights.shape[1]
    rest = np.empty((size, causes))  # the expected failures of this cause and the ones after it
    rest[:, 0] = stats.causes.sum(axis=-1)
    for j in range(1, causes):
        rest[:, j] = rest[:, j - 1] - weights[:, j - 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(rest > 0, np.clip(weights / rest, 0.0, 1.0), 0.0)  # of the failures left
    keep = 1.0 - share
    for j in range(causes):  # a binomial of the failures left for each cause in turn
        mean = left * share[:, j]
        count = np.floor(mean + np.sqrt(mean * keep[:, j]) * z[:, 1 + j] + 0.5)
        count = np.minimum(np.maximum(count, 0.0), left)
        out[:, 1 + j] = count
        left = left - count
    out[:, OUTCOMES - 1] = left  # wrong_answer
    if valid is not None and not valid.all():
        broken = ~np.asarray(valid)
        out[broken] = 0
        out[broken, len(FAILURE_MODES)] = np.broadcast_to(attempts, (size,))[broken]
    return out


def render_attempts(stats: EvalStats, counts: np.ndarray, k: int, u: np.ndarray) -> np.ndarray:
    """(m, k) one world's attempt labels given its drawn ``counts`` (a row of :func:`draw_outcomes`): -1
    on success, else the index in ``FAILURE_MODES`` of the failure. The successes go to attempts drawn
    without replacement with weights the tasks' odds of success, each defect's failures to the remaining
    attempts with weights the tasks' chance of being blamed on it (``u``: ``EVAL_DRAWS`` m k uniforms),
    the rest are wrong answers. This is what the text shows per task; the counts, the score and
    everything a policy reads come from :func:`draw_outcomes` alone.

    >>> s = EvalStats(np.array([[1.0, 0.0]]), np.zeros((1, 2), int), np.zeros((1, 32)), np.zeros((1, 5)),
    ...               np.array([1.0]), np.array([0.0]), np.array([[0, 0, 0, 0, 0, 1.0]]))
    >>> render_attempts(s, np.array([1, 0, 0, 0, 0, 0, 1, 0]), 1, np.full(2 * EVAL_DRAWS, 0.5)).tolist()
    [[-1], [5]]
    """
    m = stats.success.shape[1]
    slots = m * k
    if counts[len(FAILURE_MODES)]:
        return np.full((m, k), len(FAILURE_MODES) - 1, dtype=np.intp)  # harness_error
    label = np.full(slots, FAILURE_MODES.index(WRONG_ANSWER), dtype=np.intp)  # unless chosen below
    u = u.reshape(EVAL_DRAWS, slots)
    p, code = stats.success[0], stats.code[0]
    with np.errstate(divide="ignore"):
        odds = np.repeat(np.where(p > 0, p / np.maximum(1.0 - p, 1e-300), 0.0), k)
        free = np.arange(slots)
        for j in range(EVAL_DRAWS):
            c = int(counts[j])
            if not c:
                continue
            weight = odds if j == 0 else np.repeat(stats.blame[0, code] * CODE_BITS[code, j - 1] * stats.trip[0, j - 1],
                                                   k)
            key = np.where(weight[free] > 0, np.log(u[j, free]) / weight[free], -np.inf)
            chosen = np.argsort(-key, kind="stable")[:c]
            label[free[chosen]] = j - 1
            free = np.delete(free, chosen)
    return label.reshape(m, k)


def attempt_tokens(
    domain: Domain, reply_tokens: np.ndarray, cap: int | np.ndarray, cont: bool | np.ndarray,
    verify: bool | np.ndarray, check: bool | np.ndarray,
) -> tuple[np.ndarray, np.ndarray, float | np.ndarray]:
    """(prefill tokens, sampled tokens, time factor) of one attempt per task under the harness options
    ``cap`` (max_output_tokens), ``cont`` (on_truncation = "continue"), ``verify`` and ``check``; the
    options are scalars, or (N, 1) arrays over ``reply_tokens`` (N, n) for N worlds at once.

    >>> from rsigym_env.worlds.sim.benchmarks import BENCHMARKS
    >>> prefill, sampled, factor = attempt_tokens(BENCHMARKS["aime"].domain, np.array([100.0, 9000.0]), 4096,
    ...                                           True, False, False)
    >>> float((prefill[1] - prefill[0]) / BENCHMARKS["aime"].domain.context_tokens), factor
    (2.0, 1.0)
    """
    cont = np.asarray(cont)
    continuations = np.where(cont, np.ceil(reply_tokens / cap) - 1.0, 0.0)
    reply = np.where(cont, reply_tokens, np.minimum(reply_tokens, cap))
    token_factor = 1.0 + VERIFY_OVERHEAD * verify + CHECK_OVERHEAD * check
    time_factor = 1.0 + VERIFY_OVERHEAD * verify
    prefill = (domain.prefill_tokens + continuations * domain.context_tokens) * token_factor
    return prefill, (domain.other_sampled_tokens + reply) * token_factor, time_factor


# --------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class Dataset:
    """What the sim knows about a dataset: counts, tokens and the level of its teachers."""

    origin: str
    n: int
    n_correct: int
    n_duplicate: int
    n_dev: int
    tokens: int
    teacher_skill: float  # example-weighted mean skill (logit) of the teachers
    teacher: str  # teacher id, or "mixed"
    roots: frozenset[str]  # ids of the generated datasets its examples come from

    @property
    def pass_rate(self) -> float:
        return self.n_correct / self.n if self.n else 0.0

    @property
    def effective_size(self) -> float:
        return self.n - (1.0 - DUPLICATE_WEIGHT) * self.n_duplicate

    def target(self, incorrect_penalty: float) -> float:
        """The skill distillation moves toward: incorrect examples pull it down."""
        return self.teacher_skill - incorrect_penalty * (1.0 - self.pass_rate)

    def stats(self) -> dict[str, float]:
        n = max(self.n, 1)
        return {
            "pass_rate": round(self.pass_rate, 4),
            "duplicate_fraction": round(self.n_duplicate / n, 4),
            "dev_fraction": round(self.n_dev / n, 4),
            "mean_tokens": round(self.tokens / n, 1),
        }


@dataclass(frozen=True)
class Generation:
    """A generated dataset and the teacher tokens it was billed for."""

    dataset: Dataset
    input_tokens: int
    output_tokens: int


GENERATE_DRAWS = 3
"""Uniforms per generated dataset: cut completions, correct ones, duplicates."""


def truncated_mean_tokens(median: float, sigma: float, cap: float) -> tuple[float, float]:
    """(mean of ``min(X, cap)``, chance ``X > cap``) for a log-normal completion length ``X``.

    >>> mean, over = truncated_mean_tokens(1000.0, 0.5, 1e9)
    >>> round(mean / (1000.0 * math.exp(0.125)), 6), round(over, 6)
    (1.0, 0.0)
    """
    mu = math.log(median)
    z = (math.log(cap) - mu) / sigma
    over = 0.5 * math.erfc(z / math.sqrt(2.0))
    below = 0.5 * math.erfc(-(z - sigma) / math.sqrt(2.0))
    return math.exp(mu + sigma * sigma / 2.0) * below + cap * over, over


def generate_dataset(
    u: np.ndarray,
    domain: Domain,
    teacher: str,
    teacher_skill: float,
    n: int,
    source: Literal["synthetic", "dev"],
    max_tokens: int,
    dataset_id: str,
    n_dev_tasks: int,
    accuracy: float | None = None,
) -> Generation:
    """Teacher examples, drawn in aggregate from ``GENERATE_DRAWS`` uniforms ``u``: a completion longer
    than the cap is cut off (log-normal lengths), an uncut one is correct with the teacher's accuracy on
    the system's tasks (default: the domain's); the completion tokens are their expected total."""
    mean_tokens, over = truncated_mean_tokens(domain.example_completion_median, domain.example_completion_sigma,
                                              max_tokens)
    cut = int(binomial(n, over, u[0]))
    acc = domain.teacher_accuracy[teacher] if accuracy is None else accuracy
    n_correct = int(binomial(n - cut, acc, u[1]))
    duplicate_rate = TEACHER_DUPLICATES[teacher]
    if source == "dev":
        repeated = max(0.0, 1.0 - n_dev_tasks / n)
        duplicate_rate += (1.0 - duplicate_rate) * DEV_PROMPT_DUPLICATION * repeated
    output_tokens = round(n * mean_tokens)
    dataset = Dataset(
        origin=f"{teacher} x {n} ({source})",
        n=n,
        n_correct=n_correct,
        n_duplicate=int(binomial(n, duplicate_rate, u[2])),
        n_dev=n if source == "dev" else 0,
        tokens=n * domain.example_prompt_tokens + output_tokens,
        teacher_skill=teacher_skill,
        teacher=teacher,
        roots=frozenset({dataset_id}),
    )
    input_tokens = round(n * domain.example_prompt_tokens * domain.teacher_input_factor)
    return Generation(dataset, input_tokens, output_tokens)


def generate_datasets(
    u: np.ndarray,
    domain: Domain,
    teacher: str,
    teacher_skill: np.ndarray,
    n: int,
    source: Literal["synthetic", "dev"],
    max_tokens: int,
    dataset_ids: Sequence[str],
    n_dev_tasks: int,
    accuracy: np.ndarray,
) -> list[Generation]:
    """:func:`generate_dataset` for M worlds at once: row j is ``generate_dataset(u[j], ..., teacher_skill[j],
    ..., dataset_ids[j], accuracy=accuracy[j])`` (its draws are element-wise, so a row never depends on the
    others); ``u`` is (M, ``GENERATE_DRAWS``).

    >>> from rsigym_env.worlds.sim.benchmarks import BENCHMARKS
    >>> d, u = BENCHMARKS["aime"].domain, np.array([[0.3, 0.6, 0.9], [0.5, 0.1, 0.2]])
    >>> many = generate_datasets(u, d, "claude-opus-5", np.array([1.0, 2.0]), 200, "synthetic", 4096, ["a", "b"], 30,
    ...                          np.array([0.7, 0.8]))
    >>> [many[j] == generate_dataset(u[j], d, "claude-opus-5", s, 200, "synthetic", 4096, i, 30, a)
    ...  for j, (s, i, a) in enumerate([(1.0, "a", 0.7), (2.0, "b", 0.8)])]
    [True, True]
    """
    mean_tokens, over = truncated_mean_tokens(domain.example_completion_median, domain.example_completion_sigma,
                                              max_tokens)
    size = np.full(len(dataset_ids), float(n))
    cut = binomial(size, over, u[:, 0])
    n_correct = binomial(n - cut, np.asarray(accuracy, dtype=np.float64), u[:, 1])
    duplicate_rate = TEACHER_DUPLICATES[teacher]
    if source == "dev":
        repeated = max(0.0, 1.0 - n_dev_tasks / n)
        duplicate_rate += (1.0 - duplicate_rate) * DEV_PROMPT_DUPLICATION * repeated
    n_duplicate = binomial(size, duplicate_rate, u[:, 2])
    output_tokens = round(n * mean_tokens)
    input_tokens = round(n * domain.example_prompt_tokens * domain.teacher_input_factor)
    return [
        Generation(Dataset(origin=f"{teacher} x {n} ({source})", n=n, n_correct=correct, n_duplicate=duplicate,
                           n_dev=n if source == "dev" else 0, tokens=n * domain.example_prompt_tokens + output_tokens,
                           teacher_skill=skill, teacher=teacher, roots=frozenset({dataset_id})),
                   input_tokens, output_tokens)
        for correct, duplicate, skill, dataset_id in zip(n_correct.tolist(), n_duplicate.tolist(),
                                                         np.asarray(teacher_skill, dtype=np.float64).tolist(),
                                                         dataset_ids)
    ]


def mix_datasets(datasets: Iterable[Dataset], origin: str) -> Dataset:
    """Concatenation: counts add up, the teacher level is example-weighted."""
    parts = list(datasets)
    n = sum(d.n for d in parts)
    teachers = {d.teacher for d in parts}
    return Dataset(
        origin=origin,
        n=n,
        n_correct=sum(d.n_correct for d in parts),
        n_duplicate=sum(d.n_duplicate for d in parts),
        n_dev=sum(d.n_dev for d in parts),
        tokens=sum(d.tokens for d in parts),
        teacher_skill=sum(d.teacher_skill * d.n for d in parts) / n if n else parts[0].teacher_skill,
        teacher=teachers.pop() if len(teachers) == 1 else "mixed",
        roots=frozenset().union(*(d.roots for d in parts)),
    )


def _kept(data: Dataset, n_correct: int, n_incorrect: int, n_duplicate: int, origin: str) -> Dataset:
    """``data`` reduced to the given counts; dev share and tokens shrink in proportion."""
    n = n_correct + n_incorrect
    share = n / data.n if data.n else 0.0
    return Dataset(
        origin=origin,
        n=n,
        n_correct=n_correct,
        n_duplicate=min(n_duplicate, n),
        n_dev=round(data.n_dev * share),
        tokens=round(data.tokens * share),
        teacher_skill=data.teacher_skill,
        teacher=data.teacher,
        roots=data.roots,
    )


def filter_dataset(u: np.ndarray, data: Dataset, origin: str) -> Dataset:
    """Keep the examples that pass the domain's checker (which is right most of the time); two uniforms."""
    kept_correct = int(binomial(data.n_correct, FILTER_RECALL, u[0]))
    kept_incorrect = int(binomial(data.n - data.n_correct, FILTER_FALSE_PASS, u[1]))
    share = (kept_correct + kept_incorrect) / data.n if data.n else 0.0
    return _kept(data, kept_correct, kept_incorrect, round(data.n_duplicate * share), origin)


def dedupe_dataset(u: np.ndarray, data: Dataset, origin: str) -> Dataset:
    """Drop the near-duplicates the dedupe finds; one uniform."""
    removed = int(binomial(data.n_duplicate, DEDUPE_RECALL, u[0]))
    removed_correct = round(removed * data.pass_rate)
    n_correct = data.n_correct - removed_correct
    n_incorrect = data.n - data.n_correct - (removed - removed_correct)
    return _kept(data, n_correct, n_incorrect, data.n_duplicate - removed, origin)


def filter_datasets(u: np.ndarray, datasets: Sequence[Dataset], origins: Sequence[str]) -> list[Dataset]:
    """:func:`filter_dataset` of M datasets at once (row j: ``filter_dataset(u[j], datasets[j], origins[j])``;
    ``u`` is (M, 2)).

    >>> d = mix_datasets([Dataset("x", 100, 60, 10, 0, 5000, 1.0, "t", frozenset({"x"}))], "x")
    >>> u = np.array([[0.2, 0.7], [0.9, 0.1]])
    >>> filter_datasets(u, [d, d], ["f", "g"]) == [filter_dataset(u[0], d, "f"), filter_dataset(u[1], d, "g")]
    True
    """
    correct = np.array([d.n_correct for d in datasets], dtype=np.float64)
    incorrect = np.array([d.n - d.n_correct for d in datasets], dtype=np.float64)
    kept_correct = binomial(correct, FILTER_RECALL, u[:, 0]).tolist()
    kept_incorrect = binomial(incorrect, FILTER_FALSE_PASS, u[:, 1]).tolist()
    out = []
    for data, c, i, origin in zip(datasets, kept_correct, kept_incorrect, origins):
        share = (c + i) / data.n if data.n else 0.0
        out.append(_kept(data, c, i, round(data.n_duplicate * share), origin))
    return out


def dedupe_datasets(u: np.ndarray, datasets: Sequence[Dataset], origins: Sequence[str]) -> list[Dataset]:
    """:func:`dedupe_dataset` of M datasets at once (row j: ``dedupe_dataset(u[j], datasets[j], origins[j])``;
    ``u`` is (M, 1)).

    >>> d = mix_datasets([Dataset("x", 100, 60, 10, 0, 5000, 1.0, "t", frozenset({"x"}))], "x")
    >>> u = np.array([[0.2], [0.9]])
    >>> dedupe_datasets(u, [d, d], ["f", "g"]) == [dedupe_dataset(u[0], d, "f"), dedupe_dataset(u[1], d, "g")]
    True
    """
    duplicates = np.array([d.n_duplicate for d in datasets], dtype=np.float64)
    out = []
    for data, removed, origin in zip(datasets, binomial(duplicates, DEDUPE_RECALL, u[:, 0]).tolist(), origins):
        removed_correct = round(removed * data.pass_rate)
        n_correct = data.n_correct - removed_correct
        n_incorrect = data.n - data.n_correct - (removed - removed_correct)
        out.append(_kept(data, n_correct, n_incorrect, data.n_duplicate - removed, origin))
    return out


# --------------------------------------------------------------------------------------------
# Training


@dataclass(frozen=True)
class ModelState:
    """A checkpoint as the sim sees it."""

    skill: float
    intensity: float = 0.0  # cumulative update intensity over the lineage
    dev_memory: float = 0.0  # chance a dev attempt succeeds from memory
    exposure: Mapping[str, float] = field(default_factory=dict)  # intensity already spent per data root


@dataclass(frozen=True)
class Robustness:
    """How much updating a world's model tolerates (drawn per seed)."""

    threshold: float  # u*: cumulative intensity before damage starts
    damage_scale: float  # kappa, logits

    def damage(self, intensity: float) -> float:
        excess = max(0.0, intensity - self.threshold)
        return min(DAMAGE_MAX, self.damage_scale * excess**DAMAGE_EXPONENT)


@dataclass(frozen=True)
class TrainSettings:
    """The training fields the model responds to."""

    learning_rate: float = REFERENCE_LR
    num_epochs: int = 1
    lora_rank: int = REFERENCE_RANK
    batch_size: int = REFERENCE_BATCH
    lr_schedule: str = "linear"

    @property
    def intensity(self) -> float:
        """Update intensity u of one run; the defaults give 1."""
        return (
            self.learning_rate / REFERENCE_LR
            * self.num_epochs
            * (REFERENCE_BATCH / self.batch_size) ** BATCH_INTENSITY_EXPONENT
            * (self.lora_rank / REFERENCE_RANK) ** RANK_INTENSITY_EXPONENT
            * SCHEDULE_INTENSITY[self.lr_schedule]
        )

    @property
    def learnable(self) -> float:
        """cap(rank): the largest fraction of the gap to the data's level a run can close."""
        return RANK_CAP_MAX * self.lora_rank / (self.lora_rank + RANK_HALF)

    @classmethod
    def of(cls, call: object) -> TrainSettings:
        return cls(**{f.name: getattr(call, f.name) for f in fields(cls)})


def learned_fraction(settings: TrainSettings, effective_size: float, scale: float, intensity: float) -> float:
    """Fraction of the gap to the data's level closed after cumulative ``intensity`` on the data."""
    enough_data = 1.0 - math.exp(-effective_size / scale)
    return settings.learnable * enough_data * (1.0 - math.exp(-intensity / INTENSITY_SCALE))


def train_model(
    z: float,
    parent: ModelState,
    data: Dataset,
    settings: TrainSettings,
    domain: Domain,
    robustness: Robustness,
    n_dev_tasks: int,
    target: float | None = None,
) -> ModelState:
    """One training run: move toward ``target`` (default: the data's level), lose skill past the seed's
    tolerance, add noise (``z``: a standard normal)."""
    u = settings.intensity
    seen = float(np.mean([parent.exposure.get(root, 0.0) for root in data.roots]))
    before = learned_fraction(settings, data.effective_size, domain.examples_scale, seen)
    after = learned_fraction(settings, data.effective_size, domain.examples_scale, seen + u)
    step = (after - before) / (1.0 - before)
    total = parent.intensity + u
    damage = robustness.damage(total) - robustness.damage(parent.intensity)
    goal = data.target(domain.incorrect_penalty) if target is None else target
    pull = step * (goal - parent.skill)
    skill = parent.skill + pull - damage + TRAIN_NOISE * z
    coverage = 1.0 - math.exp(-data.n_dev / n_dev_tasks)
    recall = min(DEV_MEMORY_MAX, DEV_MEMORY_RATE * math.sqrt(u)) * (data.n_dev / data.n) * coverage
    exposure = dict(parent.exposure)
    for root in data.roots:
        exposure[root] = exposure.get(root, 0.0) + u
    return ModelState(
        skill=skill,
        intensity=total,
        dev_memory=1.0 - (1.0 - parent.dev_memory) * (1.0 - recall),
        exposure=MappingProxyType(exposure),
    )


def loss_curve(
    u: np.ndarray, steps: int, settings: TrainSettings, gap: float, pass_rate: float, max_points: int = 200
) -> list[float]:
    """A plausible noisy training loss: fast early drop, a step down at each new epoch, noise ~ 1/sqrt(batch)
    (from uniforms ``u``, at least ``max_points`` of them)."""
    at = np.unique(np.linspace(1, steps, min(steps, max_points)).round().astype(int))
    progress = at / steps * settings.num_epochs  # epochs done
    start = 0.5 + 0.1 * max(gap, 0.0) + 0.6 * (1.0 - pass_rate)
    floor = 0.3 + 0.5 * (1.0 - pass_rate)
    speed = 4.0 * min(settings.learning_rate / REFERENCE_LR, 3.0)
    epochs_done = np.floor(np.minimum(progress, settings.num_epochs - 1e-9))
    loss = floor + (start - floor) * np.exp(-speed * progress) - 0.06 * epochs_done
    noise = 0.03 * math.sqrt(REFERENCE_BATCH / settings.batch_size) * norm_ppf(u[: len(at)])
    return [round(v, 4) for v in np.maximum(loss + noise, 0.01).tolist()]
