"""N sim worlds as ``(N, ...)`` arrays, and their evaluation as one NumPy pass (issue 27's array core, part 1).

:class:`SimBatch` stacks the latent state of N :class:`~rsigym_env.worlds.sim.world.SimWorld`\\ s of one
benchmark (their tasks, target systems and official draws) and evaluates all of them at once: each
world with its own checkpoint skill, dev memory and harness options (:class:`HarnessArrays`). The
kernels are the scalar sim's own functions (:func:`~.model.simulate_attempts`,
:func:`~.world.evaluation_bill`) run with a leading batch dimension, and a dev evaluation draws from
each world's own ``eval`` stream, so row i is what ``SimWorld.evaluation`` gives world i, bit for bit
(``tests/worlds/sim/test_sim_batch.py``), and the scalar world's later draws are unchanged.

What it is not (yet): an environment. Data, training, the run's money and clock and the menu are not
array code, and a world's reset is still one :class:`SimWorld` per env (bench/README.md, "The array core, part 1").

>>> batch = SimBatch.make("aime", seeds=[0, 1, 2])
>>> harness = HarnessArrays.of([batch.worlds[0].initial_harness()] * 3)
>>> out = batch.evaluate(batch.base_skill, np.zeros(3), harness, k=3, split="official")
>>> out.score.shape, out.success.shape, bool((out.usd > 0).all())
((3,), (3, 60, 3), True)
>>> from rsigym_env.services import EvalRequest
>>> request = EvalRequest(checkpoint="base", harness_version="v0", harness_files=batch.worlds[0].initial_harness(),
...                       split="official", k=3)
>>> float(out.score[0]) == batch.worlds[0].evaluation.official(request).value.score
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .model import (
    ATTEMPT_DRAWS,
    FAILURE_MODES,
    HARNESS_ERROR,
    Harness,
    HarnessError,
    TaskSet,
    exposed_mask,
    interfered_mask,
    parse_harness,
    sigmoid,
    simulate_attempts,
)
from .world import MAX_ATTEMPTS, SimWorld, evaluation_bill

__all__ = ["EvalArrays", "HarnessArrays", "SimBatch", "TaskArrays"]

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


@dataclass(frozen=True)
class TaskArrays:
    """N worlds' task sets of one split, stacked: ``difficulty`` (N, n) and so on (see :class:`~.model.TaskSet`)."""

    difficulty: np.ndarray  # (N, n)
    reply_tokens: np.ndarray  # (N, n)
    flags: np.ndarray  # (N, n, 4)
    interference: np.ndarray  # (N, n, 5)
    present: np.ndarray  # (N, 5)

    @classmethod
    def of(cls, tasks: Sequence[TaskSet]) -> TaskArrays:
        return cls(*(np.stack([getattr(t, name) for t in tasks]) for name in
                     ("difficulty", "reply_tokens", "flags", "interference", "present")))

    def head(self, n: int) -> TaskArrays:
        return TaskArrays(self.difficulty[:, :n], self.reply_tokens[:, :n], self.flags[:, :n],
                          self.interference[:, :n], self.present)

    def exposure(self, harness: HarnessArrays) -> tuple[np.ndarray, np.ndarray]:
        """(exposed, interfered), each (N, n, 5): ``TaskSet.exposed`` and ``TaskSet.interfered`` per world."""
        return (exposed_mask(self.reply_tokens, self.flags, self.present, harness.max_output_tokens, harness.active),
                interfered_mask(self.interference, self.present, harness.applied))


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
        worlds: the worlds (one benchmark, price list, sandbox size and options); a dev evaluation
            draws from each one's ``eval`` stream, as its own ``evaluation`` would.
    """

    def __init__(self, worlds: Sequence[SimWorld]):
        if not worlds:
            raise ValueError("a SimBatch needs at least one world")
        first = worlds[0]
        for w in worlds:
            same = (w.benchmark, w.prices, w.vcpus, w.memory_gib, w.options)
            if same != (first.benchmark, first.prices, first.vcpus, first.memory_gib, first.options):
                raise ValueError("the worlds of a SimBatch share benchmark, prices, sandbox size and options")
        self.worlds = list(worlds)
        self.domain, self.n_tasks = first.domain, first.benchmark.n_tasks
        self.official = TaskArrays.of([w.official_tasks for w in worlds])
        self.dev = TaskArrays.of([w.dev_tasks for w in worlds])
        self.severity = np.stack([w.severity for w in worlds])
        self.harm = np.stack([w.harm for w in worlds])
        self.base_skill = np.array([w.base_skill for w in worlds])
        self.official_draws = np.stack([w.official_draws for w in worlds])

    @classmethod
    def make(cls, benchmark: str, seeds: Sequence[int], **world_kwargs: Any) -> SimBatch:
        """One world per seed (``world_kwargs``: :class:`SimWorld`'s keyword arguments)."""
        return cls([SimWorld(benchmark, int(seed), **world_kwargs) for seed in seeds])

    def __len__(self) -> int:
        return len(self.worlds)

    def evaluate(self, skill: np.ndarray, memory: np.ndarray, harness: HarnessArrays, k: int,
                 split: str = "dev", n_tasks: int | None = None) -> EvalArrays:
        """avg@k of every world: its checkpoint ``skill`` (N,) and dev ``memory`` (N,) with its harness.

        ``split="official"`` uses each world's fixed official draws (and all its tasks, no memory);
        ``"dev"`` the first ``n_tasks`` dev tasks and fresh draws from each world's ``eval`` stream
        (none for a world whose harness does not parse, as in the scalar sim).
        """
        if not 1 <= k <= MAX_ATTEMPTS:
            raise ValueError(f"k must be from 1 to {MAX_ATTEMPTS}, got {k}")
        official = split == "official"
        if not official and split != "dev":
            raise ValueError(f"split must be 'dev' or 'official', got {split!r}")
        if n_tasks is not None and n_tasks < 1:
            raise ValueError(f"n_tasks must be at least 1, got {n_tasks}")
        size = len(self)
        skill, memory = np.asarray(skill, dtype=float), np.asarray(memory, dtype=float)
        if skill.shape != (size,) or memory.shape != (size,) or harness.valid.shape != (size,):
            raise ValueError(f"give one skill, memory and harness per world ({size}): got shapes {skill.shape}, "
                             f"{memory.shape} and {harness.valid.shape}")
        tasks = self.official if official else self.dev.head(n_tasks or self.n_tasks)
        n = tasks.difficulty.shape[1]
        if official:
            draws = self.official_draws[:, :, :k]
            memory = np.zeros(size)
        else:
            draws = np.zeros((size, n, k, ATTEMPT_DRAWS))
            for i in np.flatnonzero(harness.valid):
                draws[i] = self.worlds[i].rng("eval").random((n, k, ATTEMPT_DRAWS))
        exposed, interfered = tasks.exposure(harness)
        solve = sigmoid(skill[:, None] - tasks.difficulty)
        success, label = simulate_attempts(draws, solve, exposed, self.severity, memory, interfered, self.harm)
        broken = ~harness.valid
        success[broken], label[broken] = False, _HARNESS_ERROR_LABEL
        width = len(FAILURE_MODES) + 1  # column 0 counts the successes (label -1)
        rows = label.reshape(size, -1) + (np.arange(size)[:, None] * width + 1)
        counts = np.bincount(rows.ravel(), minlength=size * width).reshape(size, width)
        score = np.count_nonzero(success.reshape(size, -1), axis=1) / (n * k)
        return EvalArrays(score, success, label, counts[:, 1:], *self._bill(tasks, harness, k))

    def _bill(self, tasks: TaskArrays, harness: HarnessArrays, k: int) -> tuple[np.ndarray, ...]:
        """(usd, seconds, tokens, sandbox seconds) per world: the scalar sim's :func:`~.world.evaluation_bill`."""
        return evaluation_bill(self.worlds[0], tasks.reply_tokens, k, harness.max_output_tokens, harness.cont,
                               harness.verify, harness.check, harness.valid)

