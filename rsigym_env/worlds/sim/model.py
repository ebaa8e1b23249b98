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
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from functools import lru_cache
from statistics import NormalDist
from types import MappingProxyType
from typing import Iterable, Literal, Mapping

import numpy as np

from ...catalog import FAILURE_MODES, HARNESS_ERROR, WRONG_ANSWER  # noqa: F401  (HARNESS_ERROR: re-exported)
from .benchmarks import DEFECTS, MINIMAL_MAX_OUTPUT_TOKENS, TEACHER_DUPLICATES, Domain

# Harness costs (fractions of an attempt's tokens / sandbox time).
VERIFY_OVERHEAD = 0.15
CHECK_OVERHEAD = 0.03
# Task sampling.
REPLY_DIFFICULTY_CORRELATION = 0.3  # harder tasks need longer replies
STANDARD_NORMAL = NormalDist()
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
    """One world seed's target system (drawn by :func:`draw_profile`; never shown to a researcher)."""

    present: np.ndarray  # (5,) bool: the system has the defect
    severity: np.ndarray  # (5,) chance an exposed attempt fails because of the defect (where present)
    harm: np.ndarray  # (5,) chance an interfered attempt fails when the remedy is applied where the defect is absent
    teacher_shift: Mapping[str, float]  # logit shift of each teacher's accuracy on this system's tasks
    transfer: float  # share of the gap to the data's level that distillation can close (can be < 0)


def draw_profile(rng: np.random.Generator, domain: Domain) -> SystemProfile:
    """A target system: each defect the domain can have is present with its prevalence, with a severity
    log-normal around the domain's; an unneeded remedy harms ``HARM_RATIO`` times as much."""
    n = len(DEFECTS)
    relevant = np.asarray(domain.exposure) > 0
    present = relevant & (rng.random(n) < np.asarray(domain.prevalence))
    severity = np.minimum(SEVERITY_MAX, np.asarray(domain.severity) * np.exp(SEVERITY_SPREAD * rng.standard_normal(n)))
    harm = np.where(relevant, np.minimum(SEVERITY_MAX, HARM_RATIO * severity), 0.0)
    shift = {t: float(TEACHER_SPREAD * rng.standard_normal()) for t in sorted(domain.teacher_accuracy)}
    transfer = float(TRANSFER_MEAN + TRANSFER_SD * rng.standard_normal())
    for array in (present, severity, harm):
        array.flags.writeable = False
    return SystemProfile(present, severity, harm, MappingProxyType(shift), transfer)


@dataclass(frozen=True)
class TaskSet:
    """The latent properties of a split's tasks on one target system."""

    difficulty: np.ndarray  # (n,) logits
    reply_tokens: np.ndarray  # (n,) longest reply an attempt needs
    flags: np.ndarray  # (n, 4) exposure to the defects after truncation (where the system has them)
    interference: np.ndarray  # (n, 5) the remedy breaks the task where the system lacks the defect
    present: np.ndarray  # (5,) the system's defects

    def __len__(self) -> int:
        return len(self.difficulty)

    def exposed(self, harness: Harness) -> np.ndarray:
        """(n, 5) bool: the task is exposed to the defect and the harness leaves it active."""
        return exposed_mask(self.reply_tokens, self.flags, self.present, harness.max_output_tokens, harness.active)

    def interfered(self, harness: Harness) -> np.ndarray:
        """(n, 5) bool: the harness applies a remedy the system does not need, and it breaks the task."""
        return interfered_mask(self.interference, self.present, harness.applied)

    def head(self, n: int) -> TaskSet:
        return TaskSet(self.difficulty[:n], self.reply_tokens[:n], self.flags[:n], self.interference[:n], self.present)


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


def stratified_normal(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` standard normal draws, one from each of ``n`` equal-probability strata, in random order."""
    inv_cdf = STANDARD_NORMAL.inv_cdf
    return np.array([inv_cdf(u) for u in ((rng.permutation(n) + rng.random(n)) / n).tolist()])


def draw_tasks(rng: np.random.Generator, domain: Domain, n: int, present: np.ndarray | None = None) -> TaskSet:
    """``n`` tasks of a domain on a system with the defects ``present`` (default: all the domain's):
    stratified normal difficulty, log-normal reply length (longer when harder; rarely over 4096 tokens
    where truncation is not a defect), per defect an exposure flag and per remedy an interference flag,
    each on a random ``round(rate * n)`` of the tasks."""
    if present is None:
        present = np.asarray(domain.exposure) > 0
    z, noise = stratified_normal(rng, n), stratified_normal(rng, n)
    rho = REPLY_DIFFICULTY_CORRELATION
    median = domain.reply_log_median if present[0] else domain.reply_log_median_at(ABSENT_TRUNCATION)
    log_reply = median + domain.reply_sigma * (rho * z + math.sqrt(1 - rho**2) * noise)
    rates = np.asarray(domain.exposure)
    exposed_count = np.round(rates[1:] * n)  # each rate holds exactly in every split
    flags = rng.random((n, len(DEFECTS) - 1)).argsort(axis=0) < exposed_count
    interference = rng.random((n, len(DEFECTS))).argsort(axis=0) < np.round(rates * n)
    return TaskSet(domain.difficulty_sd * z, np.exp(log_reply), flags, interference, np.asarray(present, dtype=bool))


def defect_pass(tasks: TaskSet, harness: Harness, severity: np.ndarray, harm: np.ndarray | None = None) -> np.ndarray:
    """(n,) chance that no active defect trips and no unneeded remedy interferes on an attempt."""
    p = np.prod(1.0 - tasks.exposed(harness) * severity, axis=1)
    if harm is not None:
        p = p * np.prod(1.0 - tasks.interfered(harness) * harm, axis=1)
    return p


def success_prob(
    skill: float, tasks: TaskSet, harness: Harness, severity: np.ndarray, memory: float = 0.0,
    harm: np.ndarray | None = None,
) -> np.ndarray:
    """(n,) success chance of one attempt; ``memory`` is the dev-split memorisation (dev tasks only)."""
    p = sigmoid(skill - tasks.difficulty) * defect_pass(tasks, harness, severity, harm)
    return p + memory * (1.0 - p)


def calibrate_skill(difficulty: np.ndarray, factor: np.ndarray, target: float) -> float:
    """The skill ``s`` with ``mean(sigmoid(s - d) * factor) == target`` (safeguarded Newton)."""
    n, total = len(difficulty), np.add.reduce  # float(total(x)) / n is np.mean(x), bit for bit, minus its overhead
    if not 0.0 < target < float(total(factor)) / n:
        raise ValueError(f"target {target} is not reachable (ceiling {np.mean(factor):.4f})")
    ones = bool((factor == 1.0).all())  # x * 1.0 is x: skip those products
    low, high, s = -60.0, 60.0, 0.0
    for _ in range(200):
        q = 1.0 / (1.0 + np.exp(-(s - difficulty)))  # sigmoid
        gap = float(total(q if ones else q * factor)) / n - target
        if abs(gap) < 1e-13:
            break
        low, high = (low, s) if gap > 0 else (s, high)
        spread = q * (1.0 - q)
        slope = float(total(spread if ones else spread * factor)) / n
        step = s - gap / slope if slope > 0 else math.nan
        s = step if low < step < high else 0.5 * (low + high)
    return s


ATTEMPT_DRAWS = 2 * len(DEFECTS) + 3
"""Uniforms per attempt: solve, one per defect, dev memory, which triggered defect to blame, one per remedy."""
_HARM_DRAWS = slice(len(DEFECTS) + 3, 2 * len(DEFECTS) + 3)


def _blame_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Look-up tables over the set of triggered defects as a bit mask (bit j: defect j):
    ``(bits, count, blame)`` with ``count[mask]`` its size and ``blame[mask, p]`` the ``p``-th (0-based)
    defect in it; ``wrong_answer`` for the empty set, 0 past its size (``argmax`` of nothing true)."""
    n = len(DEFECTS)
    count = np.zeros(1 << n, dtype=np.intp)
    blame = np.zeros((1 << n, n + 1), dtype=np.intp)
    blame[0] = FAILURE_MODES.index(WRONG_ANSWER)
    for mask in range(1, 1 << n):
        on = [j for j in range(n) if mask >> j & 1]
        count[mask] = len(on)
        blame[mask, : len(on)] = on
    return 1 << np.arange(n, dtype=np.intp), count, blame


_DEFECT_BITS, _TRIGGERED_COUNT, _BLAME = _blame_tables()


def simulate_attempts(
    draws: np.ndarray, solve: np.ndarray, exposed: np.ndarray, severity: np.ndarray, memory: float | np.ndarray,
    interfered: np.ndarray | None = None, harm: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Outcomes of attempts from uniforms ``draws`` (n, k, ATTEMPT_DRAWS).

    Returns ``success`` (n, k) and ``label`` (n, k): the index in ``FAILURE_MODES`` of the cause of
    each failure (a triggered defect picked at random, else ``wrong_answer``), -1 on success.
    An unneeded remedy that interferes (``interfered`` (n, 5), each with its ``harm``) fails the
    attempt as ``wrong_answer`` unless a defect also tripped. Outcomes are monotone in skill, in the
    defects fixed and in the unneeded remedies removed, for fixed draws.

    The blamed defect is the ``floor(u * n_triggered)``-th triggered one (``u`` the attempt's last
    uniform), read from a table indexed by the triggered defects' bit mask.

    Batched: with leading dimensions (N worlds, say) on every argument (``draws`` (N, n, k, D),
    ``solve`` (N, n), ``exposed`` (N, n, 5), ``severity`` (N, 5), ``memory`` (N,) ...) each row is
    what the unbatched call on that row gives, element for element (the array core, issue 27).
    """
    n_defects = len(DEFECTS)
    severity, memory = np.asarray(severity), np.asarray(memory)
    triggered = exposed[..., None, :] & (draws[..., 1 : 1 + n_defects] < severity[..., None, None, :])
    mask = triggered @ _DEFECT_BITS  # (n, k): which defects tripped, one bit each
    pick = np.floor(draws[..., 2 + n_defects] * _TRIGGERED_COUNT[mask]).astype(np.intp)
    success = (draws[..., 0] < solve[..., None]) & (mask == 0)
    if interfered is not None and harm is not None and interfered.any():
        harmed = interfered[..., None, :] & (draws[..., _HARM_DRAWS] < np.asarray(harm)[..., None, None, :])
        success &= ~harmed.any(axis=-1)
    if (memory > 0.0).any():  # uniforms are never below 0: nothing is recalled without memory
        success |= draws[..., 1 + n_defects] < memory[..., None, None]
    return success, np.where(success, -1, _BLAME[mask, pick])


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


def generate_dataset(
    rng: np.random.Generator,
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
    """Teacher examples: each is correct with the teacher's accuracy on the system's tasks (default: the
    domain's) unless its completion hits the cap."""
    completion = rng.lognormal(math.log(domain.example_completion_median), domain.example_completion_sigma, n)
    cut = completion > max_tokens
    correct = ~cut & (rng.random(n) < (domain.teacher_accuracy[teacher] if accuracy is None else accuracy))
    duplicate_rate = TEACHER_DUPLICATES[teacher]
    if source == "dev":
        repeated = max(0.0, 1.0 - n_dev_tasks / n)
        duplicate_rate += (1.0 - duplicate_rate) * DEV_PROMPT_DUPLICATION * repeated
    output_tokens = int(np.minimum(completion, max_tokens).sum())
    dataset = Dataset(
        origin=f"{teacher} x {n} ({source})",
        n=n,
        n_correct=int(correct.sum()),
        n_duplicate=int(rng.binomial(n, duplicate_rate)),
        n_dev=n if source == "dev" else 0,
        tokens=n * domain.example_prompt_tokens + output_tokens,
        teacher_skill=teacher_skill,
        teacher=teacher,
        roots=frozenset({dataset_id}),
    )
    input_tokens = round(n * domain.example_prompt_tokens * domain.teacher_input_factor)
    return Generation(dataset, input_tokens, output_tokens)


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


def filter_dataset(rng: np.random.Generator, data: Dataset, origin: str) -> Dataset:
    """Keep the examples that pass the domain's checker (which is right most of the time)."""
    kept_correct = int(rng.binomial(data.n_correct, FILTER_RECALL))
    kept_incorrect = int(rng.binomial(data.n - data.n_correct, FILTER_FALSE_PASS))
    share = (kept_correct + kept_incorrect) / data.n if data.n else 0.0
    return _kept(data, kept_correct, kept_incorrect, round(data.n_duplicate * share), origin)


def dedupe_dataset(rng: np.random.Generator, data: Dataset, origin: str) -> Dataset:
    """Drop the near-duplicates the dedupe finds."""
    removed = int(rng.binomial(data.n_duplicate, DEDUPE_RECALL))
    removed_correct = round(removed * data.pass_rate)
    n_correct = data.n_correct - removed_correct
    n_incorrect = data.n - data.n_correct - (removed - removed_correct)
    return _kept(data, n_correct, n_incorrect, data.n_duplicate - removed, origin)


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


def draw_robustness(rng: np.random.Generator) -> Robustness:
    return Robustness(
        threshold=float(rng.uniform(*THRESHOLD_RANGE)),
        damage_scale=float(DAMAGE_SCALE_MEDIAN * math.exp(DAMAGE_SCALE_SPREAD * rng.standard_normal())),
    )


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
    rng: np.random.Generator,
    parent: ModelState,
    data: Dataset,
    settings: TrainSettings,
    domain: Domain,
    robustness: Robustness,
    n_dev_tasks: int,
    target: float | None = None,
) -> ModelState:
    """One training run: move toward ``target`` (default: the data's level), lose skill past the seed's
    tolerance, add noise."""
    u = settings.intensity
    seen = float(np.mean([parent.exposure.get(root, 0.0) for root in data.roots]))
    before = learned_fraction(settings, data.effective_size, domain.examples_scale, seen)
    after = learned_fraction(settings, data.effective_size, domain.examples_scale, seen + u)
    step = (after - before) / (1.0 - before)
    total = parent.intensity + u
    damage = robustness.damage(total) - robustness.damage(parent.intensity)
    goal = data.target(domain.incorrect_penalty) if target is None else target
    pull = step * (goal - parent.skill)
    skill = parent.skill + pull - damage + TRAIN_NOISE * rng.standard_normal()
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
    rng: np.random.Generator, steps: int, settings: TrainSettings, gap: float, pass_rate: float, max_points: int = 200
) -> list[float]:
    """A plausible noisy training loss: fast early drop, a step down at each new epoch, noise ~ 1/sqrt(batch)."""
    at = np.unique(np.linspace(1, steps, min(steps, max_points)).round().astype(int))
    progress = at / steps * settings.num_epochs  # epochs done
    start = 0.5 + 0.1 * max(gap, 0.0) + 0.6 * (1.0 - pass_rate)
    floor = 0.3 + 0.5 * (1.0 - pass_rate)
    speed = 4.0 * min(settings.learning_rate / REFERENCE_LR, 3.0)
    epochs_done = np.floor(np.minimum(progress, settings.num_epochs - 1e-9))
    loss = floor + (start - floor) * np.exp(-speed * progress) - 0.06 * epochs_done
    noise = 0.03 * math.sqrt(REFERENCE_BATCH / settings.batch_size) * rng.standard_normal(len(at))
    return [round(v, 4) for v in np.maximum(loss + noise, 0.01).tolist()]
