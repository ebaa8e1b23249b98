"""Measuring a researcher spec: the recursive world's tasks, its inner episodes and how they are billed.

A **task** is one sim research episode on one benchmark with one seed (:func:`split_tasks`); a
measurement runs the spec as the researcher of every task of a split, ``k`` seeds each
(:func:`measure`). Episodes are deterministic, so they are cached by (behaviour, benchmark, seed,
settings): a spec measured twice costs the same but computes once, and so do specs that differ only in
what their episodes never see (a program's memory, a spec's name and parent: :func:`behaviour_key`).

**Billing.** Given the :class:`~rsigym_env.services.CallFunding` of the outer call (the dev
evaluation's bill; :func:`rsigym_env.services.call_funding`), each inner episode gets a sub-key of
the outer run's key whose budget (the episode's ``budget_usd``) is carved out of that call's
reservation. An episode run here bills every call of its own to that sub-key, so its spend is in
the outer ledger and audit log and it cannot spend more than the sub-key holds; an episode replayed
from the cache, or run elsewhere by Ray (whose workers keep ledgers of their own), is charged on its
sub-key once, at what it spent (``tool: "inner_episode"``). Closing the sub-key returns its budget to
the reservation and its spend is charged with the call. Without funding (a measurement outside any
run, and the official evaluation, which is outside the budget) every episode runs on a platform of
its own, as a sweep does.

Layering: this module does not import :mod:`rsigym_env.agents`, :mod:`rsigym_env.sweep` or the env
at all; episodes are made and run by the :class:`~.ports.Researchers` it is handed (see
:mod:`rsigym_env.worlds.recursive`).

>>> from rsigym_env.worlds.recursive.world import RecursiveOptions
>>> from rsigym_env.agents import builtin_spec
>>> m = measure(builtin_spec("scripted"), RecursiveOptions(dev_benchmarks=["aime"], official_benchmarks=["aime"],
...             official_seeds=2), "official", k=1)
>>> len(m.records), m.index == sum(r.reward for r in m.records) / 2, m.billed_usd is None
(2, True, True)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...catalog import BENCHMARKS
from ...scoring import rsi_index
from ...services import CallFunding
from ...splits import OfficialSplit, load_secret
from .ports import Researchers, researchers

if TYPE_CHECKING:
    from .world import RecursiveOptions

ALL_BENCHMARKS = list(BENCHMARKS)
DEV_SEED_BASE = 1_000_000  # dev task seeds start here; public official ones at official_first_seed (0): never overlap
TEST_SEED_FLOOR = 2_000_000  # dev seeds stay below this (DEV_SEED_BASE + 9,999 x 100 + 99); public test seeds start here
HELD_OUT_SEED_BASE = 1 << 32  # secret validation seeds lie in [2^32, 2^32 + 2^40), secret test seeds in the next 2^40
HELD_OUT_SPAN = 1 << 40
HELD_OUT_SPLITS = ("official", "test")
MAX_K = 8
CACHE_MAX = 50_000

_CACHE: "OrderedDict[tuple, Any]" = OrderedDict()


@dataclass
class Measurement:
    """A spec's episodes on one split: ``tasks[i]`` = (benchmark, seed), ``records[i*k + j]`` its attempts.

    ``billed_usd``: what the episodes' sub-keys spent when the measurement was funded by a call
    (``None`` otherwise).
    """

    split: str
    tasks: list[tuple[str, int]]
    k: int
    records: list[Any]
    index: float                      # raw RSI-Index (mean over benchmarks of the mean gain); may be < 0
    per_benchmark: dict[str, float] = field(default_factory=dict)
    billed_usd: float | None = None

    @property
    def spend_usd(self) -> float:
        return sum(float(r.spend_usd or 0.0) for r in self.records if r.ok)

    def task_ids(self) -> list[str]:
        """The tasks as ids: ``aime/seed-1000300`` on dev (train seeds are the improver's to see), and by
        position on the held-out splits (``aime/task-0``: a validation or test seed is never named).

        >>> Measurement("official", [("aime", 9), ("gpqa", 9), ("aime", 4)], 1, [], 0.0).task_ids()
        ['aime/task-0', 'gpqa/task-0', 'aime/task-1']
        """
        if self.split not in HELD_OUT_SPLITS:
            return [f"{b}/seed-{seed}" for b, seed in self.tasks]
        order: dict[int, int] = {}
        return [f"{b}/task-{order.setdefault(seed, len(order))}" for b, seed in self.tasks]

    def task_values(self) -> list[float]:
        """Each task's gain averaged over its ``k`` attempts (a failed episode gains 0), in task order:
        what paired comparisons of two specs on the same split pair up."""
        k = max(self.k, 1)
        return [sum(float(r.reward) if r.ok else 0.0 for r in self.records[i * k:(i + 1) * k]) / k
                for i in range(len(self.tasks))]

    @property
    def attempts(self) -> list[str]:
        """The distinct tampering attempts its episodes' researcher made (program researchers)."""
        seen: list[str] = []
        for r in self.records:
            for event in getattr(r, "attempts", None) or []:
                if event not in seen:
                    seen.append(event)
        return seen

    @property
    def hours(self) -> float:
        return max([float(r.elapsed_h or 0.0) for r in self.records if r.ok] or [0.0])


def held_out_seeds(split: str, n: int, secret: str | None = None) -> list[int]:
    """The first ``n`` seeds of the held-out ``split`` (``official`` = validation, or ``test``) drawn from
    the platform's split secret (:func:`~rsigym_env.splits.load_secret` unless ``secret`` is given): keyed
    hashes, so an agent that has this package and runs the sim cannot tell which seeds they are. The same
    secret gives the same seeds (every candidate is compared on the same tasks); validation and test lie
    in disjoint ranges above every dev seed.

    >>> a = held_out_seeds("official", 3, secret="s1")
    >>> a == held_out_seeds("official", 3, secret="s1"), a == held_out_seeds("official", 3, secret="s2")
    (True, False)
    >>> all(HELD_OUT_SEED_BASE <= s < HELD_OUT_SEED_BASE + HELD_OUT_SPAN for s in a)
    True
    """
    if split not in HELD_OUT_SPLITS:
        raise ValueError(f"held-out splits are {HELD_OUT_SPLITS}, not {split!r}")
    return list(_keyed_seeds(secret if secret is not None else load_secret(), split, n))


@functools.lru_cache(maxsize=64)
def _keyed_seeds(secret: str, split: str, n: int) -> tuple[int, ...]:
    """:func:`held_out_seeds` for a given secret (computed once: every measurement asks for them)."""
    key = OfficialSplit("secret", secret).key(f"recursive-world:{split}")
    base = HELD_OUT_SEED_BASE + HELD_OUT_SPLITS.index(split) * HELD_OUT_SPAN
    seeds: list[int] = []
    i = 0
    while len(seeds) < n:
        seed = base + int.from_bytes(hmac.new(key, str(i).encode(), hashlib.sha256).digest()[:8], "big") % HELD_OUT_SPAN
        if seed not in seeds:
            seeds.append(seed)
        i += 1
    return tuple(seeds)


def split_tasks(opts: RecursiveOptions, split: str, world_seed: int = 0, n_tasks: int | None = None) -> list[tuple[str, int]]:
    """(benchmark, seed) tasks of a split, seed-major (so the first n tasks cover the benchmarks evenly).
    Dev seeds come from the episode's seed; validation (``official``) and test seeds from the split secret
    (:func:`held_out_seeds`), or from ``official_first_seed`` / ``test_first_seed`` when
    ``official_split="public"``.

    >>> from rsigym_env.worlds.recursive.world import RecursiveOptions
    >>> split_tasks(RecursiveOptions(dev_benchmarks=["aime", "skillsbench"]), "dev", world_seed=3)
    [('aime', 1000300), ('skillsbench', 1000300), ('aime', 1000301), ('skillsbench', 1000301)]
    >>> split_tasks(RecursiveOptions(official_benchmarks=["aime"], official_seeds=2, official_split="public"), "official")
    [('aime', 0), ('aime', 1)]
    """
    if split in HELD_OUT_SPLITS:
        n, first = (opts.official_seeds, opts.official_first_seed) if split == "official" else (opts.test_seeds, opts.test_first_seed)
        seeds = held_out_seeds(split, n) if opts.official_split == "secret" else [first + i for i in range(n)]
        benches = opts.official_benchmarks
    else:
        seeds = [DEV_SEED_BASE + (world_seed % 10_000) * 100 + i for i in range(min(opts.dev_seeds, 100))]
        benches = opts.dev_benchmarks
    tasks = [(b, s) for s in seeds for b in benches]
    return tasks[:n_tasks] if n_tasks else tasks


def behaviour_key(files: dict[str, str]) -> str:
    """What a spec's episodes depend on, as a string: for a program, its files without ``memory/`` (a
    program is built from its code, params and limits only; it never sees its memory) and without the
    spec's ``name`` and ``parent``; for other kinds (an ``llm`` reads its memory in its prompt) all
    files but those two fields. Two views with the same key play the same episodes.

    >>> a = {"spec.json": '{"kind": "program", "parent": "x"}', "code/researcher.py": "A = 1\\n"}
    >>> behaviour_key(a) == behaviour_key(dict(a, **{"memory/moves.md": "{}"}))
    True
    >>> behaviour_key(a) == behaviour_key(dict(a, **{"code/researcher.py": "A = 2\\n"}))
    False
    """
    try:
        head = json.loads(files.get("spec.json", "{}"))
    except ValueError:
        head = None
    if not isinstance(head, dict):
        return json.dumps(files, sort_keys=True)
    program = head.get("kind") == "program"
    rest = {p: t for p, t in files.items() if p != "spec.json" and not (program and p.startswith("memory/"))}
    return json.dumps({**rest, "spec.json": {k: v for k, v in head.items() if k not in ("name", "parent")}}, sort_keys=True)


def _cache_key(behaviour: str, s: Any) -> tuple:
    return (behaviour, s.benchmark, s.seed, s.track, s.budget_usd, s.world, s.max_steps)


def _behaviour_id(spec: Any) -> str:
    """The cache's name for what ``spec``'s episodes depend on (:func:`behaviour_key`): specs that differ
    only in a program's memory, name or parent share their episodes."""
    files = getattr(spec, "to_files", None)
    if files is None:
        return str(spec.id)
    return "b-" + hashlib.sha256(behaviour_key(files()).encode()).hexdigest()[:24]


def measure(spec: Any, opts: RecursiveOptions, split: str, k: int = 1, world_seed: int = 0,
            n_tasks: int | None = None, *, funding: CallFunding | None = None,
            using: Researchers | None = None) -> Measurement:
    """Run ``spec`` as the researcher of every task of ``split``, ``k`` seeds each (cached, deterministic).

    With ``funding`` every episode is billed to a sub-key carved out of that call's reservation (see
    the module docstring) and :attr:`Measurement.billed_usd` is their total spend. ``using``: what
    makes and runs the episodes (default: the installed :class:`~.ports.Researchers`).
    """
    using = using or researchers()
    tasks = split_tasks(opts, split, world_seed, n_tasks)
    specs = [using.episode(spec, bench, seed * MAX_K + j, opts.track, opts.budget_usd, opts.inner_world, opts.max_steps)
             for bench, seed in tasks for j in range(k)]
    behaviour = _behaviour_id(spec)
    keys = [_cache_key(behaviour, s) for s in specs]
    todo = [s for s, key in zip(specs, keys) if key not in _CACHE]
    elsewhere: dict[int, Any] = {}  # episodes that do not run here, on this process's platform
    if todo and (funding is None or opts.ray):
        records = using.run_elsewhere(todo, ray=opts.ray)
        elsewhere = dict(zip([id(s) for s in todo], records))
    out: list[Any] = []
    billed = 0.0
    for s, key in zip(specs, keys):
        cached = _CACHE.get(key)
        if cached is not None:
            record, source = cached, "cache"
            _CACHE.move_to_end(key)
            if getattr(record, "agent", spec.id) != spec.id and dataclasses.is_dataclass(record):
                record = dataclasses.replace(record, agent=spec.id)  # played by a sibling with the same behaviour
        elif id(s) in elsewhere:
            record, source = elsewhere[id(s)], "ray"
        else:
            record, source = None, "here"
        if funding is not None:
            if record is None:
                record, spent = _run_on_subkey(s, funding, using)
            else:
                spent = _charge_on_subkey(s, record, source, funding, using)
            billed += spent
        if record.ok:  # failures are not cached: a crash may be transient
            _CACHE[key] = record
        out.append(record)
    while len(_CACHE) > CACHE_MAX:
        _CACHE.popitem(last=False)
    by_bench: dict[str, list[float]] = {}
    for r in out:
        by_bench.setdefault(r.benchmark, []).append(float(r.reward) if r.ok else 0.0)
    per = {b: sum(v) / len(v) for b, v in by_bench.items()}
    return Measurement(split, tasks, k, out, rsi_index(list(per.values())) if per else 0.0, per,
                       billed if funding is not None else None)


def _run_on_subkey(s: Any, funding: CallFunding, using: Researchers) -> tuple[Any, float]:
    """Run one episode here, every call billed to a fresh sub-key of the funding call; (record, its spend)."""
    child = funding.mint_subkey(s.budget_usd, using.scenario(s))
    try:
        record = using.run_on(s, funding.platform, child)
    finally:
        spent = funding.close_subkey(child)
    return record, spent


def _charge_on_subkey(s: Any, record: Any, source: str, funding: CallFunding, using: Researchers) -> float:
    """Charge an episode that did not run here (``source``: ``"cache"`` or ``"ray"``) on a fresh sub-key
    of the funding call, at what it spent; returns that."""
    child = funding.mint_subkey(s.budget_usd, using.scenario(s))
    try:
        spend = float(record.spend_usd or 0.0) if record.ok else 0.0
        action = {"tool": "inner_episode", "args": {"benchmark": s.benchmark, "seed": s.seed, "replayed": source}}
        with funding.platform.charge(child, action, quote_usd=s.budget_usd) as bill:
            bill.settle(spend)
    finally:
        spent = funding.close_subkey(child)
    return spent


def failure(record: Any) -> str:
    """Why an inner episode gained nothing (``""`` when it gained): a per-task failure mode."""
    if not record.ok:
        return "episode_failed"
    if record.submitted_by != "agent":
        return "not_submitted"
    if record.reward < 0:
        return "negative_gain"
    if record.reward == 0:
        return "no_gain"
    return ""
