"""N sim worlds as ``(N, ...)`` arrays, and their evaluation as one NumPy pass (issue 27's array core).

:class:`SimBatch` draws N worlds of one benchmark at once (:func:`~.model.draw_worlds`: their tasks,
target systems, base skills and official uniforms) and evaluates all of them in one pass: each world
with its own checkpoint skill, dev memory and harness options (:class:`HarnessArrays`). The kernels are
the scalar sim's own (:func:`~.model.outcome_thresholds`, :func:`~.model.attempt_labels`,
:func:`~.world.evaluation_bill`) with a leading batch dimension, and a dev evaluation draws from each
world's own ``eval`` stream (counter-based, :mod:`.draws`), so row i is what ``SimWorld.evaluation``
gives world i, bit for bit (``tests/worlds/sim/test_sim_batch.py``).

>>> batch = SimBatch.make("aime", seeds=[0, 1, 2])
>>> harness = HarnessArrays.of([batch.initial_harness()] * 3)
>>> out = batch.evaluate(batch.base_skill, np.zeros(3), harness, k=3, split="official")
>>> out.score.shape, out.success.shape, bool((out.usd > 0).all())
((3,), (3, 60, 3), True)
>>> from rsigym_env.services import EvalRequest
>>> request = EvalRequest(checkpoint="base", harness_version="v0", harness_files=batch.initial_harness(),
...                       split="official", k=3)
>>> float(out.score[0]) == SimWorld("aime", 0).evaluation.official(request).value.score
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .draws import benchmark_key, seed_array, stream_keys, uniforms
from .model import (
    FAILURE_MODES,
    HARNESS_ERROR,
    MAX_ATTEMPTS,
    Harness,
    HarnessError,
    TaskSet,
    attempt_labels,
    draw_worlds,
    exposed_mask,
    interfered_mask,
    outcome_thresholds,
    parse_harness,
    sigmoid,
)
from .world import SimWorld, evaluation_bill

__all__ = ["EvalArrays", "HarnessArrays", "SimBatch", "task_exposure"]

_HARNESS_ERROR_LABEL = FAILURE_MODES.index(HARNESS_ERROR)


@dataclass(frozen=True)
class HarnessArrays:
    """N harnesses' options as arrays (``valid`` False: its harness.toml did not parse).

    >>> h = HarnessArrays.of([{"harness.toml": "[shell]\\npersistent = true"}, {"harness.toml": "oops"}])
    >>> h.valid.tolist(), h.active[0].tolist(), h.max_output_tokens.tolist()
    ([True, False], [True, True, False, True, True], [4096, 4096])
    """

    max_output_tokens: np.ndarray  # (N,) int
    cont: np.ndarray  # (N,) bool: on_truncation = "continue"
    verify: np.ndarray  # (N,) bool
    persistent: np.ndarray  # (N,) bool
    detect: np.ndarray  # (N,) bool
    check: np.ndarray  # (N,) bool
    valid: np.ndarray  # (N,) bool

    @classmethod
    def of(cls, harnesses: Sequence[Harness | HarnessError | Mapping[str, str]]) -> HarnessArrays:
        """From parsed harnesses, parse errors, or harness files (parsed here, as the sim parses them)."""
        parsed: list[Harness | HarnessError] = []
        for h in harnesses:
            if isinstance(h, (Harness, HarnessError)):
                parsed.append(h)
                continue
            try:
                parsed.append(parse_harness(h))
            except HarnessError as exc:
                parsed.append(exc)
        ok = [h if isinstance(h, Harness) else Harness() for h in parsed]
        return cls(
            max_output_tokens=np.array([h.max_output_tokens for h in ok], dtype=np.int64),
            cont=np.array([h.on_truncation == "continue" for h in ok]),
            verify=np.array([h.verify_before_submit for h in ok]),
            persistent=np.array([h.persistent for h in ok]),
            detect=np.array([h.detect for h in ok]),
            check=np.array([h.check for h in ok]),
            valid=np.array([isinstance(h, Harness) for h in parsed]),
        )

    @property
    def active(self) -> np.ndarray:
        """(N, 5): the defects (``DEFECTS`` order) each harness leaves in place (``Harness.active``)."""
        return ~np.column_stack([self.cont, self.verify, self.persistent, self.detect, self.check])

    @property
    def applied(self) -> np.ndarray:
        """(N, 5): the remedies each harness applies (``Harness.applied``)."""
        longer = self.cont | (self.max_output_tokens > Harness().max_output_tokens)
        return np.column_stack([longer, self.verify, self.persistent, self.detect, self.check])


def task_exposure(tasks: TaskSet, harness: HarnessArrays) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, interfered), each (N, n, 5): ``TaskSet.exposed`` and ``TaskSet.interfered`` per world."""
    return (exposed_mask(tasks.reply_tokens, tasks.flags, tasks.present, harness.max_output_tokens, harness.active),
            interfered_mask(tasks.interference, tasks.present, harness.applied))


@dataclass(frozen=True)
class EvalArrays:
    """N evaluations' outcomes: per world its avg@k ``score`` and bill, per attempt its outcome."""

    score: np.ndarray  # (N,)
    success: np.ndarray  # (N, n, k) bool
    label: np.ndarray  # (N, n, k): index in FAILURE_MODES, -1 on success
    failure_counts: np.ndarray  # (N, len(FAILURE_MODES))
    usd: np.ndarray  # (N,)
    seconds: np.ndarray  # (N,)
    tokens: np.ndarray  # (N,) int
    sandbox_seconds: np.ndarray  # (N,)


class SimBatch:
    """N sim worlds of one benchmark: their latent state as arrays, their evaluations as one pass.

    Args:
        benchmark: a key of ``BENCHMARKS``.
        seeds: one world seed per world.
        world_kwargs: :class:`~.world.SimWorld`'s keyword arguments (prices, sandbox size, options),
            shared by the N worlds.
    """

    def __init__(self, benchmark: str, seeds: Sequence[int], **world_kwargs: Any):
        if not len(seeds):
            raise ValueError("a SimBatch needs at least one world")
        self.model = SimWorld(benchmark, int(seeds[0]), **world_kwargs)  # prices, options, bill constants
        self.domain, self.n_tasks = self.model.domain, self.model.benchmark.n_tasks
        self.seeds = seed_array(seeds)
        drawn = draw_worlds(self.model.benchmark, self.seeds)
        self.worlds = drawn
        self.official, self.dev = drawn.official, drawn.dev
        self.severity, self.harm, self.base_skill = drawn.severity, drawn.harm, drawn.base_skill
        self.eval_keys = stream_keys(self.seeds, benchmark_key(benchmark), "eval")
        self.eval_counters = np.zeros(len(self.seeds), np.uint64)

    @classmethod
    def make(cls, benchmark: str, seeds: Sequence[int], **world_kwargs: Any) -> SimBatch:
        """One world per seed."""
        return cls(benchmark, seeds, **world_kwargs)

    def __len__(self) -> int:
        return len(self.seeds)

    def initial_harness(self) -> dict[str, str]:
        return self.model.initial_harness()

    def reset(self, rows: Sequence[int] | np.ndarray, seeds: Sequence[int] | np.ndarray) -> None:
        """Draw new worlds in place at ``rows`` (one seed each): what an autoreset of those envs needs.
        Each redrawn row is the world its seed gives alone (:func:`~.model.draw_worlds`), its ``eval``
        stream at its first draw; the other rows are untouched.

        >>> batch = SimBatch.make("aime", [0, 1, 2])
        >>> batch.reset([1], [7])
        >>> bool(batch.base_skill[1] == SimBatch.make("aime", [7]).base_skill[0]), batch.seeds.tolist()
        (True, [0, 7, 2])
        """
        rows = np.asarray(rows, dtype=np.intp)
        seeds = seed_array(seeds)
        if rows.shape != seeds.shape:
            raise ValueError(f"give one seed per row: {rows.size} rows, {seeds.size} seeds")
        if not rows.size:
            return
        drawn = draw_worlds(self.model.benchmark, seeds)
        for name in ("present", "severity", "harm", "teacher_shift", "transfer", "threshold", "damage_scale",
                     "base_skill", "official_u"):
            getattr(self.worlds, name)[rows] = getattr(drawn, name)
        for split in ("official", "dev"):
            for name in ("difficulty", "reply_tokens", "flags", "interference"):
                getattr(getattr(self.worlds, split), name)[rows] = getattr(getattr(drawn, split), name)
        self.seeds[rows] = seeds
        self.eval_keys[rows] = stream_keys(seeds, benchmark_key(self.model.benchmark.id), "eval")
        self.eval_counters[rows] = 0

    def evaluate(self, skill: np.ndarray, memory: np.ndarray, harness: HarnessArrays, k: int,
                 split: str = "dev", n_tasks: int | None = None,
                 rows: Sequence[int] | np.ndarray | None = None) -> EvalArrays:
        """avg@k of every world (or of the worlds at ``rows``, in that order): its checkpoint ``skill``
        and dev ``memory`` with its harness, one each per world evaluated.

        ``split="official"`` uses each world's fixed official uniforms (and all its tasks, no memory);
        ``"dev"`` the first ``n_tasks`` dev tasks and the next draw of each world's ``eval`` stream
        (none for a world whose harness does not parse, as in the scalar sim).
        """
        if not 1 <= k <= MAX_ATTEMPTS:
            raise ValueError(f"k must be from 1 to {MAX_ATTEMPTS}, got {k}")
        official = split == "official"
        if not official and split != "dev":
            raise ValueError(f"split must be 'dev' or 'official', got {split!r}")
        if n_tasks is not None and n_tasks < 1:
            raise ValueError(f"n_tasks must be at least 1, got {n_tasks}")
        picked = slice(None) if rows is None else np.asarray(rows, dtype=np.intp)
        size = len(self) if rows is None else len(picked)
        skill, memory = np.asarray(skill, dtype=float), np.asarray(memory, dtype=float)
        if skill.shape != (size,) or memory.shape != (size,) or harness.valid.shape != (size,):
            raise ValueError(f"give one skill, memory and harness per world ({size}): got shapes {skill.shape}, "
                             f"{memory.shape} and {harness.valid.shape}")
        tasks = self.official if official else self.dev.head(n_tasks or self.n_tasks)
        if rows is not None:
            tasks = TaskSet(tasks.difficulty[picked], tasks.reply_tokens[picked], tasks.flags[picked],
                            tasks.interference[picked], tasks.present[picked])
        n = tasks.difficulty.shape[1]
        if official:
            u = self.worlds.official_u[picked, :, :k]
            memory = np.zeros(size)
        else:
            u = uniforms(self.eval_keys[picked], self.eval_counters[picked], n * k).reshape(size, n, k)
            self.eval_counters[picked] += harness.valid  # a harness that does not parse draws nothing
        exposed, interfered = task_exposure(tasks, harness)
        solve = sigmoid(skill[:, None] - tasks.difficulty)
        thresholds = outcome_thresholds(solve, exposed, self.severity[picked], memory, interfered, self.harm[picked])
        label = attempt_labels(u, thresholds)
        label[~harness.valid] = _HARNESS_ERROR_LABEL
        success = label < 0
        width = len(FAILURE_MODES) + 1  # column 0 counts the successes (label -1)
        rows = label.reshape(size, -1) + (np.arange(size)[:, None] * width + 1)
        counts = np.bincount(rows.ravel(), minlength=size * width).reshape(size, width)
        score = np.count_nonzero(success.reshape(size, -1), axis=1) / (n * k)
        return EvalArrays(score, success, label, counts[:, 1:], *self._bill(tasks, harness, k))

    def _bill(self, tasks: TaskSet, harness: HarnessArrays, k: int) -> tuple[np.ndarray, ...]:
        """(usd, seconds, tokens, sandbox seconds) per world: the scalar sim's :func:`~.world.evaluation_bill`."""
        return evaluation_bill(self.model, tasks.reply_tokens, k, harness.max_output_tokens, harness.cont,
                               harness.verify, harness.check, harness.valid)
