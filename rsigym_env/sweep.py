"""Sweeps: agents × benchmarks × seeds, as Ray tasks or in-process, one fresh env (key, ledger) per episode.

Every episode builds its **own** env with :func:`gymnasium.make`, so it gets its own in-memory ledger
and its own platform key (its ``key_id`` is kept in the record); episodes share nothing, which is
what lets them run anywhere. Episodes take milliseconds, so they are grouped into chunks, one Ray
task per chunk (:func:`default_chunk`). Nothing here raises for a bad episode: an unknown agent, a
bad benchmark or a crashing researcher gives a record with ``ok=False`` and the error text, and a
chunk whose Ray task dies marks each of its episodes failed the same way.

>>> grid = make_grid(["scripted", "nope"], ["aime"], seeds=2)
>>> [(s.agent, s.seed) for s in grid]
[('scripted', 0), ('scripted', 1), ('nope', 0), ('nope', 1)]
>>> result = sweep(grid, local=True)                     # in-process: the reference, no Ray
>>> [(r.agent, r.ok) for r in result.records]
[('scripted', True), ('scripted', True), ('nope', False), ('nope', False)]
>>> result.records[2].error.startswith("ValueError: unknown researcher 'nope'")
True
>>> len({r.key_id for r in result.records[:2]})          # one platform key per episode
2

Agents are names in :data:`rsigym_env.baselines.RESEARCHERS` (resolved in the worker, so a newly
registered researcher needs no change here) or import paths ``"package.module:Factory"``.
Ray is imported only when a sweep runs through it; ``ray.init`` gets ``address=`` to join a cluster
(whose workers must be able to import ``rsigym_env``), otherwise a local instance starts.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import re
import socket
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import gymnasium as gym

from .catalog import BENCHMARKS_BY_WORLD, TRACK_ENV_IDS
from .episode import Researcher, run_episode
from .metrics import mean_se
from .platform.core import Platform, PlatformKey
from .scenario import Scenario, load_scenario
from .scoring import rsi_index

ERROR_TEXT_MAX = 4000
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
TRACKS = TRACK_ENV_IDS  # joint/data/harness → id


@dataclass(frozen=True)
class EpisodeSpec:
    """One cell of the grid: which researcher, where, which seed."""

    agent: str
    benchmark: str
    seed: int
    track: str = "joint"
    budget_usd: float = 500.0
    world: str = "sim"
    max_steps: int | None = None
    agent_spec: str | None = None  # a researcher spec's JSON (rsigym_env.agents): wins over the name; no registry needed


@dataclass
class EpisodeRecord:
    """What a sweep keeps of one episode (``ok=False`` and ``error`` when it failed).

    ``curve`` is the anytime curve: ``[dollars spent, best dev score so far]`` after every step
    (spent = billed to the key so far; money only reserved by a running job counts once it is
    settled; −1 = no dev score yet). ``key_id`` is the episode's own platform key.
    """

    agent: str
    benchmark: str
    seed: int
    track: str
    budget_usd: float
    world: str
    ok: bool
    error: str | None = None
    reward: float | None = None
    initial_score: float | None = None
    official_score: float | None = None
    best_dev_score: float | None = None
    spend_usd: float | None = None
    elapsed_h: float | None = None
    steps: int = 0
    wall_s: float = 0.0
    end_reason: str | None = None
    submitted_by: str | None = None
    key_id: str | None = None
    worker: str = ""
    curve: list[list[float]] = field(default_factory=list)
    metrics: dict[str, Any] | None = None  # research-quality metrics (rsigym_env.metrics) at the episode's end
    attempts: list[str] = field(default_factory=list)  # a program researcher's tampering attempts (event names)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def all_benchmarks(world: str = "sim") -> list[str]:
    """The benchmark ids of a world (only ``sim`` has them bundled today)."""
    if world != "sim":
        raise ValueError(f"no benchmark list for world {world!r}; name them explicitly")
    return list(BENCHMARKS_BY_WORLD[world])


def all_agents() -> list[str]:
    """Every registered researcher name, e.g. ``['random', 'scripted']`` (plus ``rl`` once it exists)."""
    from .baselines import RESEARCHERS

    return sorted(RESEARCHERS)


def make_grid(
    agents: Sequence[str], benchmarks: Sequence[str], seeds: int | Iterable[int], *, track: str = "joint",
    budget_usd: float = 500.0, world: str = "sim", max_steps: int | None = None,
) -> list[EpisodeSpec]:
    """agents × benchmarks × seeds in that order; ``seeds=3`` means seeds 0, 1, 2.

    Names are not checked here: an unknown one becomes failed episodes, not an exception.
    """
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    return [EpisodeSpec(a, b, s, track, float(budget_usd), world, max_steps)
            for a in agents for b in benchmarks for s in seed_list]


def resolve_agent(name: str) -> Callable[[], Researcher]:
    """A researcher factory: a registered name, or ``"module:attr"`` naming a class or factory.

    >>> resolve_agent("scripted")().name
    'scripted'
    >>> resolve_agent("rsigym_env.baselines:RandomResearcher")().name
    'random'
    """
    from .baselines import RESEARCHERS, make_researcher

    if name.startswith("ag-"):  # a registered researcher spec (rsigym_env.agents)
        from .agents import AgentRegistry, build_researcher

        spec = AgentRegistry().get(name)
        return lambda: build_researcher(spec)
    if name in RESEARCHERS or ":" not in name:
        return lambda: make_researcher(name)  # raises the registry's "unknown researcher" error
    module, _, attr = name.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    if not callable(factory):
        raise TypeError(f"{name!r} is not callable")
    return factory


def _worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _error_text(exc: BaseException) -> str:
    """``Type: message`` first (what a table shows), then the traceback (cut to a readable size)."""
    head = f"{type(exc).__name__}: {exc}"
    tail = "".join(traceback.format_exception(exc))
    text = _ANSI.sub("", head + "\n" + tail)
    return text if len(text) <= ERROR_TEXT_MAX else text[: ERROR_TEXT_MAX - 20] + "\n... (cut)"


def episode_scenario(spec: EpisodeSpec) -> Scenario:
    """The scenario an episode of ``spec`` runs in (what :func:`run_spec` builds its env from).

    >>> s = episode_scenario(EpisodeSpec("scripted", "aime", 0, budget_usd=100))
    >>> s.track, s.world, s.benchmark, s.budget_usd
    ('joint', 'sim', 'aime', 100.0)
    """
    if spec.track not in TRACKS:
        raise ValueError(f"unknown track {spec.track!r}; known: {', '.join(TRACKS)}")
    overrides = {"track": spec.track, "world": spec.world, "benchmark": spec.benchmark,
                 "budget_usd": float(spec.budget_usd), "max_steps": spec.max_steps}
    return load_scenario(**{k: v for k, v in overrides.items() if v is not None})


def run_spec(spec: EpisodeSpec, *, platform: Platform | None = None, key: PlatformKey | None = None) -> EpisodeRecord:
    """Run one episode in a fresh env (own ledger, own key). Never raises.

    With ``platform`` and ``key`` (one of its keys, typically a sub-key of an outer run: see
    :meth:`Platform.mint_subkey`) the episode is billed to that key instead and runs in the key's
    scenario (build it with :func:`episode_scenario`).

    >>> r = run_spec(EpisodeSpec("scripted", "aime", 0, budget_usd=100))
    >>> r.ok, r.steps == len(r.curve), r.curve[-1][0] == r.spend_usd
    (True, True, True)
    """
    record = EpisodeRecord(spec.agent, spec.benchmark, spec.seed, spec.track, spec.budget_usd, spec.world,
                           ok=False, worker=_worker_name())
    started = time.perf_counter()
    env = researcher = None
    try:
        if spec.track not in TRACKS:
            raise ValueError(f"unknown track {spec.track!r}; known: {', '.join(TRACKS)}")
        if spec.agent_spec is not None:
            from .agents import AgentSpec, build_researcher

            researcher = build_researcher(AgentSpec.model_validate_json(spec.agent_spec),
                                          scenario=key.scenario if key is not None else None)
        else:
            researcher = resolve_agent(spec.agent)()
        kwargs: dict[str, Any] = {"world": spec.world, "benchmark": spec.benchmark, "budget_usd": spec.budget_usd}
        if spec.max_steps is not None:
            kwargs["max_steps"] = spec.max_steps
        if key is not None:
            env = gym.make(TRACKS[spec.track], scenario=key.scenario, platform=platform, key=key)
        else:
            env = gym.make(TRACKS[spec.track], **kwargs)

        def on_step(step: int, action: Any, obs: dict[str, Any], info: dict[str, Any]) -> None:
            record.curve.append([float(info["spent_usd"]), float(obs["dev_scores"][1])])  # billed so far
            record.steps = step
            if record.key_id is None:
                record.key_id = env.get_wrapper_attr("key_id")

        result = run_episode(env, researcher, seed=spec.seed, on_step=on_step)
        info = result.info
        record.ok = True
        record.reward = float(result.reward)
        record.initial_score = info.get("initial_score")
        record.official_score = info.get("official_score")
        record.best_dev_score = info.get("best_dev_score")
        record.spend_usd = info.get("spend_usd")
        record.elapsed_h = info.get("elapsed_h")
        record.end_reason = info.get("end_reason")
        record.submitted_by = (info.get("submitted") or {}).get("by")
        record.steps = result.steps
        record.metrics = info.get("metrics")
    except Exception as exc:  # a failed episode is data, not a crash
        record.ok, record.error = False, _error_text(exc)
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass
        record.attempts = _attempts_of(researcher)
        if researcher is not None and hasattr(researcher, "close"):
            try:
                researcher.close()
            except Exception:
                pass
        record.wall_s = time.perf_counter() - started
    return record


def _attempts_of(researcher: Any, cap: int = 20) -> list[str]:
    """The distinct tampering attempts a program researcher made this episode (event names, at most ``cap``)."""
    inner = getattr(researcher, "inner", researcher)
    seen: list[str] = []
    for attempt in getattr(inner, "attempts", None) or []:
        event = str(attempt.get("event", "?") if isinstance(attempt, dict) else attempt)
        if event not in seen:
            seen.append(event)
    return seen[:cap]


def run_chunk(specs: Sequence[EpisodeSpec], pause_s: float = 0.0) -> list[EpisodeRecord]:
    """Run episodes one after another (the body of one Ray task, and of ``--local``).

    ``pause_s``: sleep afterwards (warm-up tasks use it so that they land on different workers).
    """
    records = [run_spec(spec) for spec in specs]
    if pause_s > 0:
        time.sleep(pause_s)
    return records


WARM_UP_SPEC = EpisodeSpec("scripted", "aime", 0, budget_usd=50)


def default_chunk(n_episodes: int, n_workers: int) -> int:
    """Episodes per Ray task: about 4 tasks per worker (load balance), at most 25 (~0.2 s of work each).

    >>> default_chunk(30, 2), default_chunk(400, 2), default_chunk(1, 2)
    (4, 25, 1)
    """
    return max(1, min(25, math.ceil(n_episodes / (4 * max(1, n_workers)))))


# ---------------------------------------------------------------------------------------------- Ray

_REMOTE: dict[str, Any] = {}


def _remote(name: str) -> Any:
    """The package's functions as Ray remote functions (made once, on first use)."""
    if name not in _REMOTE:
        import ray

        fn = {"run_chunk": run_chunk}[name]
        _REMOTE[name] = ray.remote(num_cpus=1)(fn)
    return _REMOTE[name]


def init_ray(address: str | None = None, num_cpus: int | None = None) -> tuple[bool, float]:
    """Connect to ``address`` or start a local Ray (``num_cpus`` default: all cores), unless one is up.

    Returns ``(started_here, seconds)``; a caller that started Ray should shut it down.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if ray.is_initialized():
        return False, 0.0
    started = time.perf_counter()
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
    return True, time.perf_counter() - started


def ray_workers() -> int:
    """CPUs the connected cluster offers (the number of chunks that can run at once)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def warm_up_workers(n: int | None = None) -> tuple[list[str], float]:
    """Have ``n`` workers at once (default: every CPU) load :func:`run_chunk` and run one short episode,
    so the function's export, the package import and first-use caches are paid before any timing.
    Returns the workers' names and the seconds it took.
    """
    import ray

    n = n or ray_workers()
    started = time.perf_counter()
    batches = ray.get([_remote("run_chunk").remote([WARM_UP_SPEC], 0.3) for _ in range(n)])
    return [batch[0].worker for batch in batches], time.perf_counter() - started


OnDone = Callable[[list[EpisodeRecord]], None]


def run_ray(specs: Sequence[EpisodeSpec], chunk: int | None = None, on_done: OnDone | None = None) -> list[EpisodeRecord]:
    """Run ``specs`` as Ray tasks of ``chunk`` episodes on the connected cluster; results in ``specs`` order.

    ``on_done(records)`` is called as each chunk finishes. A task that dies (worker crash, lost node,
    unpicklable researcher) marks its episodes failed with the error text.
    """
    import ray

    size = chunk or default_chunk(len(specs), ray_workers())
    chunks = [list(specs[i: i + size]) for i in range(0, len(specs), size)]
    remote = _remote("run_chunk")
    pending = {remote.remote(c): (i, c) for i, c in enumerate(chunks)}
    done: dict[int, list[EpisodeRecord]] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            i, c = pending.pop(ref)
            try:
                records = ray.get(ref)
            except Exception as exc:
                message = f"Ray task for {len(c)} episode(s) failed: " + _error_text(exc)
                records = [EpisodeRecord(str(s.agent), str(s.benchmark), s.seed, str(s.track), s.budget_usd, str(s.world),
                                         ok=False, error=message[:ERROR_TEXT_MAX]) for s in c]
            done[i] = records
            if on_done is not None:
                on_done(records)
    return [r for i in range(len(chunks)) for r in done[i]]


def run_local(specs: Sequence[EpisodeSpec], on_done: OnDone | None = None) -> list[EpisodeRecord]:
    """The same episodes in this process, one after another (the reference for Ray)."""
    out = []
    for spec in specs:
        record = run_spec(spec)
        out.append(record)
        if on_done is not None:
            on_done([record])
    return out


# ------------------------------------------------------------------------------------- the result


@dataclass
class SweepResult:
    """Episodes plus how they were run; :meth:`to_dict` is the ``results.json`` layout."""

    records: list[EpisodeRecord]
    config: dict[str, Any]
    timing: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "timing": self.timing, "aggregates": aggregate(self.records),
                "episodes": [r.to_dict() for r in self.records]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


def sweep(
    specs: Sequence[EpisodeSpec], *, local: bool = False, address: str | None = None, num_cpus: int | None = None,
    chunk: int | None = None, on_done: OnDone | None = None, on_ready: Callable[[dict[str, Any]], None] | None = None,
    shutdown: bool | None = None, warm: bool = True,
) -> SweepResult:
    """Run ``specs`` through Ray (default) or in-process (``local=True``) and time it.

    Ray: joins ``address`` if given, else reuses a running Ray, else starts a local one with
    ``num_cpus`` and shuts it down afterwards (``shutdown`` overrides). With ``warm``, every worker
    first imports the package and runs one short episode, timed as start-up (``ray_warmup_s``), so
    ``sweep_s`` is the episodes alone. ``on_ready(timing)`` is called once the cluster is up, before
    the first episode (for progress displays).
    """
    timing: dict[str, float] = {}
    config: dict[str, Any] = {
        "mode": "local" if local else "ray", "address": address, "episodes": len(specs),
        "agents": list(dict.fromkeys(s.agent for s in specs)),
        "benchmarks": list(dict.fromkeys(s.benchmark for s in specs)),
        "seeds": sorted({s.seed for s in specs}),
        "tracks": sorted({s.track for s in specs}), "budgets_usd": sorted({s.budget_usd for s in specs}),
        "worlds": sorted({s.world for s in specs}),
        "date": datetime.now().isoformat(timespec="seconds"), "host": socket.gethostname(), "cpus": os.cpu_count(),
    }
    if local:
        if on_ready is not None:
            on_ready(timing)
        started = time.perf_counter()
        records = run_local(specs, on_done)
        timing["sweep_s"] = time.perf_counter() - started
    else:
        import ray

        started_here, timing["ray_init_s"] = init_ray(address, num_cpus)
        try:
            workers = ray_workers()
            if warm:
                _, timing["ray_warmup_s"] = warm_up_workers(min(workers, len(specs)))
            size = chunk or default_chunk(len(specs), workers)
            config.update(ray_version=ray.__version__, ray_cpus=workers, chunk=size)
            if on_ready is not None:
                on_ready(timing)
            started = time.perf_counter()
            records = run_ray(specs, size, on_done)
            timing["sweep_s"] = time.perf_counter() - started  # before shutting Ray down
        finally:
            if shutdown or (shutdown is None and started_here):
                ray.shutdown()
    timing["episodes_per_s"] = len(specs) / timing["sweep_s"] if timing["sweep_s"] > 0 else 0.0
    return SweepResult(records, config, timing)


# ------------------------------------------------------------------------------------- aggregates


def _mean(values: list[float]) -> float | None:
    """The mean (:func:`~.metrics.mean_se`), ``None`` for no values."""
    return mean_se(values)[0]


def _se(values: list[float]) -> float | None:
    """The standard error of the mean (:func:`~.metrics.mean_se`): 0 for one value, ``None`` for none."""
    return mean_se(values)[1]


def aggregate(records: Iterable[EpisodeRecord | dict[str, Any]]) -> dict[str, Any]:
    """Per (agent, benchmark) cell: means over successful seeds; per agent: RSI-Index, spend, time.

    The RSI-Index is the mean over benchmarks of the mean normalized gain; an agent with a benchmark
    where every seed failed gets ``rsi_index=None`` (``complete=False``).
    """
    rows = [r.to_dict() if isinstance(r, EpisodeRecord) else r for r in records]
    agents = list(dict.fromkeys(r["agent"] for r in rows))
    benchmarks = list(dict.fromkeys(r["benchmark"] for r in rows))
    cells: list[dict[str, Any]] = []
    per_agent: dict[str, dict[str, Any]] = {}
    for agent in agents:
        gains: list[float] = []
        complete = True
        mine = [r for r in rows if r["agent"] == agent]
        for bench in benchmarks:
            group = [r for r in mine if r["benchmark"] == bench]
            if not group:
                continue
            ok = [r for r in group if r["ok"]]
            reward = [float(r["reward"]) for r in ok]
            cell = {
                "agent": agent, "benchmark": bench, "episodes": len(group), "ok": len(ok), "failed": len(group) - len(ok),
                "reward_mean": _mean(reward), "reward_se": _se(reward),
                "official_mean": _mean([float(r["official_score"]) for r in ok]),
                "initial_mean": _mean([float(r["initial_score"]) for r in ok]),
                "spend_mean_usd": _mean([float(r["spend_usd"]) for r in ok]),
                "elapsed_mean_h": _mean([float(r["elapsed_h"]) for r in ok]),
                "steps_mean": _mean([float(r["steps"]) for r in ok]),
            } | _metric_means(ok)
            cells.append(cell)
            if cell["reward_mean"] is None:
                complete = False
            else:
                gains.append(cell["reward_mean"])
        ok_all = [r for r in mine if r["ok"]]
        per_agent[agent] = {
            "rsi_index": rsi_index(gains) if complete and gains else None, "complete": complete,
            "spend_mean_usd": _mean([float(r["spend_usd"]) for r in ok_all]),
            "elapsed_mean_h": _mean([float(r["elapsed_h"]) for r in ok_all]),
            "episodes": len(mine), "failed": len(mine) - len(ok_all),
        } | _metric_means(ok_all)
    return {"agents": per_agent, "cells": cells, "benchmark_order": benchmarks, "agent_order": agents,
            "failed": sum(1 for r in rows if not r["ok"]), "episodes": len(rows)}


def _metric_means(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """``<metric>_mean`` over the rows that have it (discovery, selection, retention, efficiency)."""
    from .metrics import METRIC_KEYS

    out: dict[str, float | None] = {}
    for key in METRIC_KEYS:
        values = [float(m[key]) for r in rows if (m := r.get("metrics")) and m.get(key) is not None]
        out[f"{key}_mean"] = _mean(values)
    return out


def load_results(path: str | Path) -> dict[str, Any]:
    """A saved ``results.json`` (aggregates recomputed from its episodes, so hand edits stay consistent)."""
    data = json.loads(Path(path).read_text())
    data["aggregates"] = aggregate(data["episodes"])
    return data


__all__ = [
    "EpisodeRecord", "EpisodeSpec", "SweepResult", "aggregate", "all_agents", "all_benchmarks", "default_chunk",
    "init_ray", "load_results", "make_grid", "resolve_agent", "run_chunk", "run_local", "run_ray", "run_spec",
    "sweep", "warm_up_workers",
]
