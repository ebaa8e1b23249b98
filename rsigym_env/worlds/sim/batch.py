"""N sim worlds as ``(N, ...)`` arrays, and their evaluation as one NumPy pass (issue 27's array core).

:class:`SimBatch` draws N worlds of one benchmark at once (:func:`~.model.draw_worlds`: their target
systems, official halves of the benchmark's fixed task table and base skills) and evaluates all of them
in one pass: each world with its own checkpoint skill, dev memory and harness options
(:class:`HarnessArrays`). The kernels are the scalar sim's own (:func:`~.model.evaluation_stats`,
:func:`~.model.draw_outcomes`, :func:`~.world.evaluation_bill`) and a world draws from its own ``eval``
and ``official`` streams (counter-based, :mod:`.draws`), so row i is what ``SimWorld.evaluation`` gives
world i: its score, failure counts and bill, bit for bit (``tests/worlds/sim/test_sim_batch.py``). The
per-task text of an evaluation is the scalar sim's alone (:func:`~.model.render_attempts`).

>>> batch = SimBatch.make("aime", seeds=[0, 1, 2])
>>> harness = HarnessArrays.of([batch.initial_harness()] * 3)
>>> out = batch.evaluate(batch.base_skill, np.zeros(3), harness, k=3, split="official")
>>> out.score.shape, out.failure_counts.shape, bool((out.usd > 0).all())
((3,), (3, 7), True)
>>> from rsigym_env.services import EvalRequest
>>> request = EvalRequest(checkpoint="base", harness_version="v0", harness_files=batch.initial_harness(),
...                       split="official", k=3)
>>> float(out.score[0]) == SimWorld("aime", 0).evaluation.official(request).value.score
True
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np

from .draws import benchmark_key, seed_array, stream_keys, streams_keys, uniforms
from .model import (
    EVAL_DRAWS,
    OUTCOMES,
    MAX_ATTEMPTS,
    EvalStats,
    Harness,
    HarnessError,
    TaskSet,
    draw_outcomes,
    Worlds,
    draw_worlds,
    evaluation_stats,
    exposed_mask,
    interfered_mask,
    parse_harness,
)
from .world import SimWorld, evaluation_bill

__all__ = ["EvalArrays", "HarnessArrays", "SimBatch", "task_exposure"]

_WORLD_ARRAYS = ("present", "severity", "harm", "teacher_shift", "transfer", "threshold", "damage_scale", "half",
                 "base_skill")


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

    # The derived arrays are made once per object (read-only); :meth:`take` gathers them with the options.

    @cached_property
    def active(self) -> np.ndarray:
        """(N, 5): the defects (``DEFECTS`` order) each harness leaves in place (``Harness.active``)."""
        return _read_only(~np.column_stack([self.cont, self.verify, self.persistent, self.detect, self.check]))

    @cached_property
    def applied(self) -> np.ndarray:
        """(N, 5): the remedies each harness applies (``Harness.applied``)."""
        longer = self.cont | (self.max_output_tokens > Harness().max_output_tokens)
        return _read_only(np.column_stack([longer, self.verify, self.persistent, self.detect, self.check]))

    @cached_property
    def bill_code(self) -> np.ndarray:
        """(N,) int: each harness's part of its evaluation bill's key (:meth:`SimBatch.bill`)."""
        return _read_only(self.max_output_tokens.astype(np.int64) * 1024 + 4 * self.cont + 8 * self.verify
                          + 16 * self.check + 32 * self.valid)

    @cached_property
    def memo_code(self) -> np.ndarray:
        """(N,) int: each harness's part of its remembered statistics' key (:meth:`SimBatch.remember_stats`)."""
        bits = self.cont + 2 * self.verify + 4 * self.persistent + 8 * self.detect + 16 * self.check
        return _read_only((self.max_output_tokens.astype(np.int64) * 64 + bits) * 4096)

    def take(self, index: np.ndarray) -> HarnessArrays:
        """The harnesses at ``index`` (an index array: a copy), with the derived arrays made so far.

        >>> table = HarnessArrays.of([{"harness.toml": ""}, {"harness.toml": "[loop]\\ndetect = true"}])
        >>> table.active.shape, table.take(np.array([1, 1, 0])).active[:, 3].tolist()
        ((2, 5), [False, False, True])
        """
        out = HarnessArrays(*(getattr(self, f.name)[index] for f in fields(self)))
        for name in _DERIVED:
            if name in self.__dict__:
                out.__dict__[name] = self.__dict__[name][index]
        return out


_DERIVED = ("active", "applied", "bill_code", "memo_code")


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def task_exposure(tasks: TaskSet, harness: HarnessArrays) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, interfered), each (N, n, 5): ``TaskSet.exposed`` and ``TaskSet.interfered`` per world."""
    return (exposed_mask(tasks.reply_tokens, tasks.flags, tasks.present, harness.max_output_tokens, harness.active),
            interfered_mask(tasks.interference, tasks.present, harness.applied))


@dataclass(frozen=True)
class EvalArrays:
    """N evaluations' outcomes: per world its avg@k ``score``, attempt counts and bill."""

    score: np.ndarray  # (N,)
    counts: np.ndarray  # (N, 1 + len(FAILURE_MODES)): successes, then failures per mode
    usd: np.ndarray  # (N,)
    seconds: np.ndarray  # (N,)
    tokens: np.ndarray  # (N,) int
    sandbox_seconds: np.ndarray  # (N,)

    @property
    def failure_counts(self) -> np.ndarray:
        """(N, len(FAILURE_MODES)): failed attempts per mode."""
        return self.counts[:, 1:]


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
        self.worlds = draw_worlds(self.model.benchmark, self.seeds)
        self.table = self.worlds.table
        key = benchmark_key(benchmark)
        self.eval_keys = stream_keys(self.seeds, key, "eval")
        self.official_keys = stream_keys(self.seeds, key, "official")
        self.eval_counters = np.zeros(len(self.seeds), np.uint64)
        self._bills: dict[int, tuple[float, float, int, float]] = {}  # bill code -> the bill
        self._bill_keys, self._bill_values = np.zeros(0, np.int64), np.zeros((0, 4))
        self._memo: tuple[np.ndarray, ...] | None = None  # remember_stats: per world its latest evaluations' stats
        self._nothing = np.zeros((0, 0))  # the placeholder of the stats' per-task fields draw_outcomes does not read

    def remember_stats(self, slots: int = 2) -> None:
        """Remember, per world, the statistics of its last ``slots`` distinct evaluations (what an evaluation is
        drawn from: a function of the world, its split, skill, dev memory, harness options and task count), so an
        evaluation with the same inputs as one of those skips :func:`~.model.evaluation_stats` and draws from
        them: the same numbers (its own draw), less arithmetic. A world's memory is forgotten when it is redrawn
        (:meth:`reset`, :meth:`take`); change ``worlds`` only through those while this is on.

        >>> batch = SimBatch.make("aime", [0, 1])
        >>> harness = HarnessArrays.of([batch.initial_harness()] * 2)
        >>> first = batch.evaluate(batch.base_skill, np.zeros(2), harness, k=3, split="official").score
        >>> batch.remember_stats()
        >>> again = [batch.evaluate(batch.base_skill, np.zeros(2), harness, k=3, split="official").score for _ in "ab"]
        >>> bool((again[0] == first).all() and (again[1] == first).all())
        True
        """
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        n = len(self.seeds)
        # per world and slot: skill, memory, the code of (harness options, split, task count; -1: empty), the
        # stats (mean, var, causes); and the slot the next new one goes to
        self._memo = (np.zeros((n, slots)), np.zeros((n, slots)), np.full((n, slots), -1, np.int64),
                      np.zeros((n, slots, 2 + OUTCOMES - 1)), np.zeros(n, np.int64))

    def _forget(self, rows: np.ndarray) -> None:
        if self._memo is not None:
            self._memo[2][rows] = -1

    @classmethod
    def make(cls, benchmark: str, seeds: Sequence[int], **world_kwargs: Any) -> SimBatch:
        """One world per seed."""
        return cls(benchmark, seeds, **world_kwargs)

    @classmethod
    def repeat(cls, benchmark: str, seed: int, size: int, **world_kwargs: Any) -> SimBatch:
        """``size`` copies of one seed's world (drawn once): room for worlds to :meth:`reset` or :meth:`take` into.

        >>> room = SimBatch.repeat("aime", 3, 4)
        >>> len(room), bool((room.base_skill == SimBatch.make("aime", [3]).base_skill[0]).all())
        (4, True)
        """
        if size < 1:
            raise ValueError(f"a SimBatch needs at least one world, got size {size}")
        batch = cls(benchmark, [seed], **world_kwargs)
        w = batch.worlds
        batch.worlds = Worlds(table=w.table, **{name: np.repeat(getattr(w, name), size, axis=0) for name in _WORLD_ARRAYS})
        for name in ("seeds", "eval_keys", "official_keys", "eval_counters"):
            setattr(batch, name, np.repeat(getattr(batch, name), size))
        return batch

    def __len__(self) -> int:
        return len(self.seeds)

    @property
    def base_skill(self) -> np.ndarray:
        return self.worlds.base_skill

    def initial_harness(self) -> dict[str, str]:
        return self.model.initial_harness()

    def reset(self, rows: Sequence[int] | np.ndarray, seeds: Sequence[int] | np.ndarray,
              streams: tuple[str, ...] = ()) -> np.ndarray:
        """Draw new worlds in place at ``rows`` (one seed each): what an autoreset of those envs needs.
        Each redrawn row is the world its seed gives alone (:func:`~.model.draw_worlds`), its ``eval``
        stream at its first draw; the other rows are untouched. Returns the new worlds' keys of ``streams``
        ((len(streams), rows), :func:`~.draws.streams_keys`: made with the world's own in one pass).

        >>> batch = SimBatch.make("aime", [0, 1, 2])
        >>> batch.reset([1], [7], streams=("data",)).shape
        (1, 1)
        >>> bool(batch.base_skill[1] == SimBatch.make("aime", [7]).base_skill[0]), batch.seeds.tolist()
        (True, [0, 7, 2])
        """
        rows = np.asarray(rows, dtype=np.intp)
        seeds = seed_array(seeds)
        if rows.shape != seeds.shape:
            raise ValueError(f"give one seed per row: {rows.size} rows, {seeds.size} seeds")
        if not rows.size:
            return np.zeros((len(streams), 0), np.uint64)
        keys = streams_keys(seeds, benchmark_key(self.model.benchmark.id), ("world", "eval", "official", *streams))
        drawn = draw_worlds(self.model.benchmark, seeds, world_keys=keys[0])
        for name in _WORLD_ARRAYS:
            getattr(self.worlds, name)[rows] = getattr(drawn, name)
        self.seeds[rows] = seeds
        self.eval_keys[rows], self.official_keys[rows] = keys[1], keys[2]
        self.eval_counters[rows] = 0
        self._forget(rows)
        return keys[3:]

    def world(self, row: int) -> SimWorld:
        """Row ``row``'s world as a :class:`~.world.SimWorld` (``SimWorld(benchmark, seed, ...)``, from the row's
        draw: a row is the world its seed gives alone), for the services the batch does not run.

        >>> batch = SimBatch.make("aime", [0, 3])
        >>> bool(batch.world(1).base_skill == SimWorld("aime", 3).base_skill == batch.base_skill[1])
        True
        """
        one = Worlds(table=self.worlds.table, **{name: getattr(self.worlds, name)[row:row + 1].copy()
                                                 for name in _WORLD_ARRAYS})
        m = self.model
        return SimWorld(m.benchmark.id, int(self.seeds[row]), prices=m.prices, vcpus=m.vcpus, memory_gib=m.memory_gib,
                        options=m.options, drawn=one)

    def take(self, rows: Sequence[int] | np.ndarray, source: SimBatch, source_rows: Sequence[int] | np.ndarray
             ) -> None:
        """Put ``source``'s worlds at ``source_rows`` (same benchmark) in place at ``rows``, streams and all:
        an autoreset from worlds drawn ahead in one larger batch (the same worlds as :meth:`reset` draws). Where
        both batches remember statistics (:meth:`remember_stats`, as many slots), the source's memory of those
        worlds comes along (what they evaluated there, remembered here).

        >>> batch, ahead = SimBatch.make("aime", [0, 1]), SimBatch.make("aime", [5, 6, 7])
        >>> batch.take([1], ahead, [2])
        >>> bool(batch.base_skill[1] == SimBatch.make("aime", [7]).base_skill[0]), batch.seeds.tolist()
        (True, [0, 7])
        """
        rows, source_rows = np.asarray(rows, dtype=np.intp), np.asarray(source_rows, dtype=np.intp)
        if source.model.benchmark.id != self.model.benchmark.id or rows.shape != source_rows.shape:
            raise ValueError("take worlds of the same benchmark, one source row per row")
        for name in _WORLD_ARRAYS:
            getattr(self.worlds, name)[rows] = getattr(source.worlds, name)[source_rows]
        for name in ("seeds", "eval_keys", "official_keys", "eval_counters"):
            getattr(self, name)[rows] = getattr(source, name)[source_rows]
        if self._memo is not None and source._memo is not None and source._memo[0].shape[1] == self._memo[0].shape[1]:
            for mine, theirs in zip(self._memo, source._memo):
                mine[rows] = theirs[source_rows]
        else:
            self._forget(rows)

    def evaluate(self, skill: np.ndarray, memory: np.ndarray, harness: HarnessArrays, k: int | np.ndarray,
                 split: str | np.ndarray = "dev", n_tasks: int | None = None,
                 rows: Sequence[int] | np.ndarray | None = None) -> EvalArrays:
        """avg@k of every world (or of the worlds at ``rows``, in that order): its checkpoint ``skill``
        and dev ``memory`` with its harness, one each per world evaluated; ``k`` and ``split`` are one for
        all or one per world (``split``: "dev", "official", or a bool array, True for official), so every
        evaluation of a step is one pass.

        An official evaluation uses its world's fixed official draw (and all its tasks, no memory); a dev
        one the first ``n_tasks`` dev tasks and the next draw of its world's ``eval`` stream (none for a
        world whose harness does not parse, as in the scalar sim).
        """
        picked = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.intp)
        size = len(picked)
        k = np.asarray(k, dtype=np.int64)
        k = np.full(size, k) if k.ndim == 0 else k
        if size and not ((1 <= k) & (k <= MAX_ATTEMPTS)).all():
            raise ValueError(f"k must be from 1 to {MAX_ATTEMPTS}, got {sorted(set(k.tolist()))}")
        if isinstance(split, str):
            if split not in ("dev", "official"):
                raise ValueError(f"split must be 'dev' or 'official', got {split!r}")
            official = np.full(size, split == "official")
        else:
            official = np.asarray(split, dtype=bool)
        if n_tasks is not None and n_tasks < 1:
            raise ValueError(f"n_tasks must be at least 1, got {n_tasks}")
        if n_tasks is not None and official.any() and not official.all():
            raise ValueError("n_tasks applies to dev evaluations: evaluate official ones in another call")
        skill, memory = np.asarray(skill, dtype=float), np.asarray(memory, dtype=float)
        if skill.shape != (size,) or memory.shape != (size,) or harness.valid.shape != (size,) or \
                official.shape != (size,):
            raise ValueError(f"give one skill, memory, harness and split per world ({size}): got shapes "
                             f"{skill.shape}, {memory.shape}, {harness.valid.shape} and {official.shape}")
        m = self.n_tasks if official.all() or n_tasks is None else min(n_tasks, self.n_tasks)
        w = self.worlds
        half = np.where(official, w.half[picked], 1 - w.half[picked])
        memory = np.where(official, 0.0, memory)
        keys = np.where(official, self.official_keys[picked], self.eval_keys[picked])
        u = uniforms(keys, np.where(official, 0, self.eval_counters[picked]).astype(np.uint64), EVAL_DRAWS)
        self.eval_counters[picked] += ~official & harness.valid  # a harness that does not parse draws nothing
        present = w.present[picked]
        variant = present[:, 0].astype(np.intp)
        if self._memo is None or m >= 4096:  # the memory's key packs the task count in 12 bits
            stats = evaluation_stats(self.table, half, variant, present, w.severity[picked], w.harm[picked], skill,
                                     memory, harness.max_output_tokens, harness.active, harness.applied, m)
        else:
            stats = self._remembered_stats(picked, half, variant, present, skill, memory, harness, official, m)
        counts = draw_outcomes(stats, k, u, harness.valid)
        score = counts[:, 0] / (m * k)
        return EvalArrays(score, counts, *self.bill(half, variant, harness, k, m))

    def _remembered_stats(self, picked: np.ndarray, half: np.ndarray, variant: np.ndarray, present: np.ndarray,
                          skill: np.ndarray, memory: np.ndarray, harness: HarnessArrays, official: np.ndarray,
                          m: int) -> EvalStats:
        """:func:`~.model.evaluation_stats` of the worlds at ``picked``, from memory where a world evaluated the same
        inputs lately (:meth:`remember_stats`), computed for the others (rows are independent) and remembered.
        Only the fields :func:`~.model.draw_outcomes` reads are filled (``success`` is a placeholder of its shape)."""
        skills, memories, codes, values, upcoming = self._memo
        code = harness.memo_code + official * (32 * 4096) + m  # ((tokens * 2 + official) * 32 + options) * 4096 + m
        match = (codes[picked] == code[:, None]) & (skills[picked] == skill[:, None]) & (memories[picked] == memory[:, None])
        hit = match.any(axis=1)
        out = values[picked, np.argmax(match, axis=1)]  # (M, 8); the misses' rows are filled below
        miss = np.flatnonzero(~hit)
        if miss.size:
            every = miss.size == picked.size
            r = picked if every else picked[miss]
            h = harness if every else harness.take(miss)
            w = self.worlds
            fresh = evaluation_stats(self.table, half[miss], variant[miss], present[miss], w.severity[r], w.harm[r],
                                     skill[miss], memory[miss], h.max_output_tokens, h.active, h.applied, m)
            out[miss, 0], out[miss, 1], out[miss, 2:] = fresh.mean, fresh.var, fresh.causes
            slot = upcoming[r]
            upcoming[r] = (slot + 1) % skills.shape[1]
            skills[r, slot], memories[r, slot], codes[r, slot], values[r, slot] = skill[miss], memory[miss], code[miss], out[miss]
        size = picked.size
        if self._nothing.shape[0] < size or self._nothing.shape[1] != m:  # a read-only placeholder of (size, m)
            self._nothing = np.zeros((max(size, 2 * self._nothing.shape[0]), m))
            self._nothing.flags.writeable = False
        nothing = self._nothing[:size]
        return EvalStats(nothing, nothing, nothing[:, :0], nothing[:, :0], out[:, 0], out[:, 1], out[:, 2:])

    def bill(self, half: np.ndarray, variant: np.ndarray, harness: HarnessArrays, k: int | np.ndarray,
             n_tasks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(usd, seconds, tokens, sandbox seconds) per world of evaluating the first ``n_tasks`` tasks of
        table half ``half`` in reply variant ``variant`` (one each per world) k times: the scalar sim's
        :func:`~.world.evaluation_bill`, looked up per distinct (half, variant, harness options, k)."""
        k = np.asarray(k, dtype=np.int64)
        # (tokens * 1024 + half + 2 variant + 4 cont + 8 verify + 16 check + 32 valid + 64 k) * 4096 + n_tasks
        codes = (harness.bill_code + half + 2 * variant + 64 * k) * 4096 + n_tasks
        at = np.searchsorted(self._bill_keys, codes)
        known = at < len(self._bill_keys)
        known[known] = self._bill_keys[at[known]] == codes[known]
        if not known.all():  # a new (harness, split, k): the scalar sim's bill, computed once
            for code in np.unique(codes[~known]).tolist():
                rest, m = divmod(code, 4096)
                cap, bits_j = divmod(rest, 1024)
                h, v, cont, verify, check, valid = ((bits_j >> b) & 1 for b in range(6))
                usd, seconds, tokens, sandbox = evaluation_bill(
                    self.model, self.table.reply_tokens[v, h, :m], bits_j >> 6, cap, bool(cont), bool(verify),
                    bool(check), bool(valid))
                self._bills[code] = (float(usd), float(seconds), int(tokens), float(sandbox))
            self._bill_keys = np.array(sorted(self._bills), dtype=np.int64)
            self._bill_values = np.array([self._bills[c] for c in self._bill_keys.tolist()]).reshape(-1, 4)
            at = np.searchsorted(self._bill_keys, codes)
        out = self._bill_values[at]
        return out[:, 0], out[:, 1], out[:, 2].astype(np.int64), out[:, 3]

    def dev_bill(self, rows: np.ndarray, harness: HarnessArrays, k: int | np.ndarray, n_tasks: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The bill (a quote) of a dev evaluation of the worlds at ``rows``, without drawing anything."""
        w = self.worlds
        m = self.n_tasks if n_tasks is None else min(n_tasks, self.n_tasks)
        return self.bill(1 - w.half[rows], w.present[rows, 0].astype(np.intp), harness, k, m)
