"""Recursion: the target system is a researcher, and the researcher that improves it is one too.

**The recursive world** (``world: recursive``; register it with :func:`register`, which the CLI does).
Its initial harness is a researcher spec's files view (``spec.json``, ``params.toml``, ``prompt.md``,
``skills/*.md``, ``memory/*.md``; see :mod:`rsigym_env.agents`), so an improver changes the target
researcher with ``edit_harness`` and measures it with ``evaluate`` like any other harness. There are
no weights (``checkpoint`` is always ``base``); data, training, inference and the sandbox are refused
with ``not_supported``.

* A **task** is one sim research episode on one benchmark with one seed; its reward is the normalized
  gain the target researcher reaches in it (joint track, ``budget_usd`` per episode by default).
  ``avg@k`` runs each task with ``k`` seeds.
* **dev** = ``dev_seeds`` seeds per dev benchmark, chosen from the outer episode's seed (different
  seeds in every round); **official** = ``official_seeds`` fixed held-out seeds (0, 1, ...) per official
  benchmark, never shown to the improver. Dev and official seeds never overlap.
* **score** = the target's RSI-Index on that split (mean over benchmarks of the mean gain), floored at
  0 to fit an evaluation score (any researcher can reach 0 by submitting the initial system); the raw
  per-episode gains are the per-task rewards. The outer reward is the normalized gain of that index.
* **cost**: a dev evaluation is billed what its episodes spent (worst case reserved: episodes × their
  budget); its duration is the longest episode's research time (they run in parallel). The official
  evaluation is outside the budget, as always.

Episodes run through the sweep machinery (:func:`rsigym_env.sweep.run_spec`; Ray with ``ray: true``)
and are cached by (spec id, benchmark, seed, settings): they are deterministic, so a spec measured twice
costs the same but computes once.

**The scripted improver** (:class:`ScriptedImprover`): a coordinate search over the target's numeric
parameters (``data_fraction``, ``k``, ``probe_examples``, ``max_examples`` of the scripted researcher),
one dev evaluation per proposal, keeping a change only when the dev index rises; it submits the best
version. A ``scripted`` spec acts as this improver when its harness is a researcher spec (its
``improve_*`` parameters configure it) and as the scripted researcher otherwise, so the same spec can
be both the target and, in the next round, the improver.

**Rounds** (:func:`recurse`, ``rsigym recurse``): round ``t`` improves the current target; the submitted
spec is registered (``parent`` = the target) and becomes round ``t+1``'s target (``mode="target"``) or
its improver *and* target (``mode="improver"``: the researcher improves itself).

>>> opts = RecursiveOptions(dev_benchmarks=["aime"], official_benchmarks=["aime"], official_seeds=2)
>>> from rsigym_env.agents import builtin_spec
>>> m = measure(builtin_spec("scripted"), opts, "official", k=1)
>>> len(m.records), m.index == sum(r.reward for r in m.records) / 2
(2, True)
"""

from __future__ import annotations

import json
import re
import tomllib
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any, Generator, Sequence

from pydantic import BaseModel, ConfigDict, Field

from .catalog import BENCHMARKS
from .agents import AgentRegistry, AgentSpec, build_researcher, check_buildable, dump_toml, make_args
from .errors import ActionError
from .metrics import compounding, improver_gain, mean_se
from .scenario import Scenario
from .scoring import rsi_index
from .services import Billed, EvalRequest, EvalResult, Job, Quote, resolved
from .worlds.sim.clock import SimClock

ALL_BENCHMARKS = list(BENCHMARKS)
DEV_SEED_BASE = 1_000_000  # dev task seeds start here; official ones at official_first_seed (0): never overlap
MAX_K = 8


class RecursiveOptions(BaseModel):
    """``world_options`` of a recursive scenario."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field("scripted", description="The initial target: a registered id (or prefix) or a bundled name.")
    target_spec: dict[str, Any] | None = Field(None, description="The target inline (wins over `target`).")
    inner_world: str = "sim"
    track: str = Field("joint", description="Track of the measuring episodes.")
    budget_usd: float = Field(500.0, gt=0, description="Budget of each measuring episode.")
    max_steps: int | None = None
    time_limit_h: float | None = None
    dev_benchmarks: list[str] = Field(default_factory=lambda: list(ALL_BENCHMARKS))
    official_benchmarks: list[str] = Field(default_factory=lambda: list(ALL_BENCHMARKS))
    dev_seeds: int = Field(2, ge=1, description="Dev tasks per benchmark (seeds drawn from the outer seed).")
    official_seeds: int = Field(8, ge=1, description="Held-out tasks per benchmark: seeds official_first_seed...")
    official_first_seed: int = Field(0, ge=0)
    ray: bool = Field(False, description="Run the measuring episodes as Ray tasks.")

    def spec(self, registry: AgentRegistry | None = None) -> AgentSpec:
        if self.target_spec is not None:
            return AgentSpec.model_validate(self.target_spec)
        return (registry or AgentRegistry()).get(self.target)


# ------------------------------------------------------------------------------------ measuring

_CACHE: "OrderedDict[tuple, Any]" = OrderedDict()
CACHE_MAX = 50_000


@dataclass
class Measurement:
    """A spec's episodes on one split: ``tasks[i]`` = (benchmark, seed), ``records[i*k + j]`` its attempts."""

    split: str
    tasks: list[tuple[str, int]]
    k: int
    records: list[Any]
    index: float                      # raw RSI-Index (mean over benchmarks of the mean gain); may be < 0
    per_benchmark: dict[str, float] = field(default_factory=dict)

    @property
    def spend_usd(self) -> float:
        return sum(float(r.spend_usd or 0.0) for r in self.records if r.ok)

    @property
    def hours(self) -> float:
        return max([float(r.elapsed_h or 0.0) for r in self.records if r.ok] or [0.0])


def split_tasks(opts: RecursiveOptions, split: str, world_seed: int = 0, n_tasks: int | None = None) -> list[tuple[str, int]]:
    """(benchmark, seed) tasks of a split, seed-major (so the first n tasks cover the benchmarks evenly).

    >>> split_tasks(RecursiveOptions(dev_benchmarks=["aime", "skillsbench"]), "dev", world_seed=3)
    [('aime', 1000300), ('skillsbench', 1000300), ('aime', 1000301), ('skillsbench', 1000301)]
    """
    if split == "official":
        seeds = [opts.official_first_seed + i for i in range(opts.official_seeds)]
        benches = opts.official_benchmarks
    else:
        seeds = [DEV_SEED_BASE + (world_seed % 10_000) * 100 + i for i in range(min(opts.dev_seeds, 100))]
        benches = opts.dev_benchmarks
    tasks = [(b, s) for s in seeds for b in benches]
    return tasks[:n_tasks] if n_tasks else tasks


def measure(spec: AgentSpec, opts: RecursiveOptions, split: str, k: int = 1, world_seed: int = 0,
            n_tasks: int | None = None) -> Measurement:
    """Run ``spec`` as the researcher of every task of ``split``, ``k`` seeds each (cached, deterministic)."""
    from .sweep import EpisodeSpec, run_local, sweep

    tasks = split_tasks(opts, split, world_seed, n_tasks)
    content = spec.content()
    specs = [EpisodeSpec(spec.id, bench, seed * MAX_K + j, opts.track, opts.budget_usd, opts.inner_world,
                         opts.max_steps, agent_spec=content)
             for bench, seed in tasks for j in range(k)]
    keys = [(spec.id, s.benchmark, s.seed, s.track, s.budget_usd, s.world, s.max_steps) for s in specs]
    todo = [s for s, key in zip(specs, keys) if key not in _CACHE]
    if todo:
        records = sweep(todo, local=False, num_cpus=2).records if opts.ray else run_local(todo)
        for s, r in zip(todo, records):
            if r.ok:  # failures are not cached: a crash may be transient
                _CACHE[(spec.id, s.benchmark, s.seed, s.track, s.budget_usd, s.world, s.max_steps)] = r
            else:
                _CACHE.pop((spec.id, s.benchmark, s.seed, s.track, s.budget_usd, s.world, s.max_steps), None)
        fresh = dict(zip([id(s) for s in todo], records))
    else:
        fresh = {}
    out = []
    for s, key in zip(specs, keys):
        out.append(_CACHE[key] if key in _CACHE else fresh[id(s)])
        if key in _CACHE:
            _CACHE.move_to_end(key)
    while len(_CACHE) > CACHE_MAX:
        _CACHE.popitem(last=False)
    by_bench: dict[str, list[float]] = {}
    for r in out:
        by_bench.setdefault(r.benchmark, []).append(float(r.reward) if r.ok else 0.0)
    per = {b: sum(v) / len(v) for b, v in by_bench.items()}
    return Measurement(split, tasks, k, out, rsi_index(list(per.values())) if per else 0.0, per)


def _failure(record: Any) -> str:
    if not record.ok:
        return "episode_failed"
    if record.submitted_by != "agent":
        return "not_submitted"
    if record.reward < 0:
        return "negative_gain"
    if record.reward == 0:
        return "no_gain"
    return ""


# ------------------------------------------------------------------------------------ the world


class _NotSupported:
    """Data, training, inference and sandbox of the recursive world: refused before anything is reserved."""

    def __init__(self, what: str):
        self.what = what

    def _refuse(self, *_: Any) -> Any:
        raise ActionError("not_supported", f"{self.what}: the recursive world's target is a researcher spec "
                                           "(no weights, no sandbox); change it with edit_harness")

    quote = quote_generate = quote_transform = generate = transform = start = complete = exec = _refuse


class RecursiveEvaluation:
    """Dev evaluations (jobs) and the official evaluation of a researcher spec."""

    def __init__(self, world: "RecursiveWorld"):
        self.world = world

    def _spec(self, req: EvalRequest) -> AgentSpec:
        if req.checkpoint != "base":
            raise ActionError("unknown_ref", "a researcher has no checkpoints; evaluate checkpoint 'base'")
        try:
            spec = AgentSpec.from_files(req.harness_files)
            check_buildable(spec)
        except Exception as exc:
            raise ActionError("invalid_harness", f"the spec in harness {req.harness_version} is not a valid "
                                                 f"researcher: {exc}") from None
        return spec

    def _k(self, req: EvalRequest) -> int:
        return min(req.k, MAX_K)

    def quote(self, req: EvalRequest) -> Quote:
        self._spec(req)
        w = self.world
        n = len(split_tasks(w.opts, req.split, w.seed, req.n_tasks)) * self._k(req)
        limit_h = w.opts.time_limit_h or 48.0
        return Quote(usd=n * w.opts.budget_usd, seconds=limit_h * 3600.0)

    def _run(self, req: EvalRequest) -> Billed[EvalResult]:
        spec, w, k = self._spec(req), self.world, self._k(req)
        m = measure(spec, w.opts, req.split, k, w.seed, None if req.split == "official" else req.n_tasks)
        rewards = [[float(r.reward) if r.ok else 0.0 for r in m.records[i * k:(i + 1) * k]] for i in range(len(m.tasks))]
        failures = [[_failure(r) for r in m.records[i * k:(i + 1) * k]] for i in range(len(m.tasks))]
        modes: dict[str, int] = {}
        for row in failures:
            for f in row:
                if f:
                    modes[f] = modes.get(f, 0) + 1
        w.measurements[(spec.id, req.split)] = m
        value = EvalResult(split=req.split, checkpoint="base", harness_version=req.harness_version, k=k,
                           score=min(1.0, max(0.0, m.index)), task_ids=[f"{req.split}/{b}/seed-{s}" for b, s in m.tasks],
                           rewards=rewards, failures=failures, failure_modes=modes, tokens=0, sandbox_seconds=0.0)
        return Billed[EvalResult](value=value, cost_usd=m.spend_usd, seconds=m.hours * 3600.0)

    def start(self, req: EvalRequest, job_id: str) -> Job:
        if req.split != "dev":
            raise ActionError("not_supported", "only the platform evaluates the official split (at submit)")
        billed = self._run(req)
        now = self.world.clock.now()
        return Job(id=job_id, kind="evaluate", started_at=now, future=resolved(billed), ready_at=now + billed.seconds,
                   meta={"checkpoint": "base", "harness_version": req.harness_version, "split": "dev"})

    def official(self, req: EvalRequest) -> Billed[EvalResult]:
        return self._run(req)


class RecursiveWorld:
    """A world whose target system is a researcher spec (see the module docstring)."""

    name = "recursive"

    def __init__(self, opts: RecursiveOptions, seed: int, registry: AgentRegistry | None = None):
        self.opts, self.seed = opts, seed
        self.target = opts.spec(registry)
        check_buildable(self.target)
        self.clock = SimClock()
        self.rollout = _NotSupported("data generation")
        self.train = _NotSupported("training")
        self.inference = _NotSupported("inference")
        self.sandbox = _NotSupported("the sandbox")
        self.evaluation = RecursiveEvaluation(self)
        self.measurements: dict[tuple[str, str], Measurement] = {}

    def initial_harness(self) -> dict[str, str]:
        return self.target.to_files()

    def describe(self) -> str:
        o = self.opts
        return (
            f"recursive world: the target system is a researcher, spec {self.target.id} (kind {self.target.kind}"
            f"{', ' + self.target.name if self.target.name else ''}). Its harness files are its spec: spec.json "
            "(kind, name, model, tools, parent), params.toml (its parameters), prompt.md, skills/<name>.md, "
            "memory/<name>.md.\n"
            f"evaluate runs it as the researcher of {o.inner_world} episodes ({o.track} track, ${o.budget_usd:g} each): "
            f"dev = {o.dev_seeds} seed(s) per benchmark on {', '.join(o.dev_benchmarks)} (new seeds each episode); "
            f"the official split = {o.official_seeds} held-out seeds per benchmark on {', '.join(o.official_benchmarks)}. "
            "avg@k runs each task with k seeds. Score = its RSI-Index (mean over benchmarks of the normalized gain "
            "it reaches), floored at 0; per-task rewards are the raw gains. A dev evaluation costs what its "
            "episodes spend (worst case reserved: episodes x budget) and lasts as long as the longest episode.\n"
            "Always evaluate checkpoint 'base'; there is no data, training, inference or sandbox here."
        )

    def close(self) -> None:
        """Nothing to release."""


# ------------------------------------------------------------------------------------ the improver


@dataclass
class ImproverArgs:
    dev_k: int = 1               # seeds per dev task in each evaluation
    max_evaluations: int = 12    # dev evaluations per episode (the first measures the target as it is)
    min_gain: float = 0.0        # keep a change only if the dev index rises by more than this
    step: float = 1.5            # multiplicative step of float parameters
    passes: int = 2              # coordinate passes over the parameters


# parameter -> (kind, low, high): how the improver moves it ("mul": x*step or x/step, "add": x±1, "dbl": x*2 or x//2)
SEARCH: dict[str, tuple[str, float, float]] = {
    "data_fraction": ("mul", 0.05, 0.95),
    "k": ("add", 1, 8),
    "probe_examples": ("dbl", 2, 200),
    "max_examples": ("dbl", 500, 200_000),
    "submit_probability": ("mul", 0.005, 0.5),
}


def _neighbour(name: str, value: Any, up: bool, step: float) -> Any:
    how, lo, hi = SEARCH[name]
    if how == "mul":
        new = round(min(hi, max(lo, value * step if up else value / step)), 4)
    elif how == "add":
        new = int(min(hi, max(lo, value + (1 if up else -1))))
    else:
        new = int(min(hi, max(lo, value * 2 if up else value // 2)))
    return new


class ScriptedImprover:
    """Coordinate search over the target spec's parameters, measured on dev (see the module docstring)."""

    name = "scripted-improver"

    def __init__(self, args: ImproverArgs | None = None):
        self.args = args or ImproverArgs()
        self._plan: Generator[dict[str, Any], tuple[dict, dict], None] | None = None
        self.events: dict[str, dict[str, Any]] = {}
        self.log: list[dict[str, Any]] = []

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        self.events, self.log = {}, []
        self._plan = self.plan()
        self._first: dict[str, Any] | None = next(self._plan)

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        for event in info.get("events", []):
            self.events[event["job"]] = event
        if self._first is not None:
            action, self._first = self._first, None
            return action
        assert self._plan is not None
        try:
            return self._plan.send((observation, info))
        except StopIteration:
            return {"tool": "submit", "args": {}}

    def plan(self) -> Generator[dict[str, Any], tuple[dict, dict], None]:
        obs, info = yield {"tool": "read", "args": {"ref": "harness:latest/params.toml"}}
        text = obs["log"].split("\n", 1)[-1] if info.get("ok") else ""
        try:
            params = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            params = {}
        evaluations = [0]

        def evaluate(version: str) -> Generator[dict[str, Any], tuple[dict, dict], float | None]:
            if evaluations[0] >= self.args.max_evaluations:
                return None
            evaluations[0] += 1
            _, info = yield {"tool": "evaluate", "args": {"checkpoint": "base", "harness": version, "k": self.args.dev_k}}
            if not info.get("ok"):
                evaluations[0] = self.args.max_evaluations  # out of money (or refused): stop searching
                return None
            job = info["result"]["job"]
            while job not in self.events:
                _, info = yield {"tool": "wait", "args": {"job": job}}
                if not info.get("ok") and job not in self.events:
                    return None
            event = self.events[job]
            return float(event["score"]) if event.get("ok") else None

        best_version = "initial"
        best = yield from evaluate(best_version)
        if best is None:
            yield {"tool": "submit", "args": {}}
            return
        self.log.append({"params": dict(params), "dev": best})
        names = [n for n in SEARCH if n in params and isinstance(params[n], (int, float)) and not isinstance(params[n], bool)]
        for _pass in range(self.args.passes):
            moved = False
            for name in names:
                for up in (True, False):
                    while True:
                        value = _neighbour(name, params[name], up, self.args.step)
                        if value == params[name]:
                            break
                        trial = dict(params, **{name: value})
                        _, info = yield {"tool": "edit_harness", "args": {
                            "path": "params.toml", "content": dump_toml(trial), "base_version": best_version}}
                        if not info.get("ok"):
                            break
                        version = info["result"]["version"]
                        score = yield from evaluate(version)
                        if score is None:
                            break
                        self.log.append({"params": trial, "dev": score})
                        if score > best + self.args.min_gain:
                            best, best_version, params, moved = score, version, trial, True
                        else:
                            break
                    if evaluations[0] >= self.args.max_evaluations:
                        break
                if evaluations[0] >= self.args.max_evaluations:
                    break
            if not moved or evaluations[0] >= self.args.max_evaluations:
                break
        yield {"tool": "submit", "args": {"checkpoint": "base", "harness": best_version}}


class ScriptedAgent:
    """The ``scripted`` kind built from a spec: the scripted researcher on an ordinary harness, the
    scripted improver when the harness is a researcher spec. Parameters ``improve_<x>`` go to
    :class:`ImproverArgs` (as ``x``), the others to :class:`~rsigym_env.baselines.ScriptedArgs`."""

    name = "scripted"

    def __init__(self, params: dict[str, Any]):
        from .baselines import ScriptedArgs, ScriptedResearcher

        improve = {k[len("improve_"):]: v for k, v in params.items() if k.startswith("improve_")}
        research = {k: v for k, v in params.items() if not k.startswith("improve_")}
        self.args = make_args(ScriptedArgs, research)
        self.improve_args = make_args(ImproverArgs, improve)
        self.researcher = ScriptedResearcher(self.args)
        self.improver = ScriptedImprover(self.improve_args)
        self.active: Any = self.researcher

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        is_spec = re.search(r"^Harness h-\w+: files .*\bspec\.json\b", observation["log"], re.M) is not None
        self.active = self.improver if is_spec else self.researcher
        self.active.reset(observation, info, seed=seed)

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any:
        return self.active.act(observation, info)


# ------------------------------------------------------------------------------------ rounds


def _official_index(spec: AgentSpec, opts: RecursiveOptions, k: int) -> Measurement:
    return measure(spec, opts, "official", k)


def recurse(
    scenario: Scenario, *, rounds: int = 3, seeds: Sequence[int] = (0, 1, 2), improver: str | AgentSpec = "scripted",
    target: str | AgentSpec | None = None, mode: str = "target", registry: AgentRegistry | None = None,
    ray: bool | None = None, on_round: Any = None,
) -> dict[str, Any]:
    """Run ``rounds`` rounds of improvement for each chain seed; register every improved spec.

    Returns ``{"config", "rows", "chains", "summary"}``: one row per (seed, round) with the target and
    improver ids, the official index before and after (raw, unfloored), the improver gain, the outer
    episode's reward and research-quality metrics; per chain the indices and :func:`compounding`; the
    summary has mean ± s.e. over chains of the first-round improver gain and of the compounded gain.
    """
    import gymnasium as gym

    from .catalog import env_id as env_id_of
    from .episode import run_episode

    if mode not in ("target", "improver"):
        raise ValueError(f"mode must be 'target' or 'improver', got {mode!r}")
    registry = registry or AgentRegistry()
    opts = RecursiveOptions.model_validate(scenario.world_options)
    if ray is not None:
        opts = opts.model_copy(update={"ray": ray})
    first_target = (target if isinstance(target, AgentSpec)
                    else registry.get(target) if target is not None else opts.spec(registry))
    first_improver = improver if isinstance(improver, AgentSpec) else registry.get(improver)
    registry.register(first_target)
    registry.register(first_improver)
    env_id = env_id_of(scenario.track)
    k = scenario.official_k
    rows: list[dict[str, Any]] = []
    chains: list[dict[str, Any]] = []
    for seed in seeds:
        tgt, imp = first_target, first_improver
        indices = [_official_index(tgt, opts, k).index]
        ids = [tgt.id]
        for r in range(rounds):
            scen = scenario.model_copy(update={"world_options": opts.model_copy(update={
                "target_spec": tgt.model_dump(mode="json")}).model_dump(mode="json")})
            env = gym.make(env_id, scenario=scen)
            result = run_episode(env, build_researcher(imp), seed=seed * 1000 + r)
            run = env.unwrapped.run
            sub = result.info["submitted"]
            files = run.harness.files(sub["harness"])
            env.close()
            if files == tgt.to_files():
                improved = tgt
            else:
                improved = AgentSpec.from_files(files).model_copy(update={"parent": tgt.id})
                improved = AgentSpec.model_validate(improved.model_dump())  # re-validate (id from content)
            registry.register(improved, note=f"recurse: seed {seed} round {r + 1} from {tgt.id}")
            before, after = indices[-1], _official_index(improved, opts, k).index
            indices.append(after)
            ids.append(improved.id)
            row = {
                "seed": seed, "round": r + 1, "mode": mode, "improver": imp.id, "target": tgt.id, "improved": improved.id,
                "changed": improved.id != tgt.id, "index_before": before, "index_after": after,
                "improver_gain": improver_gain(before, after), "reward": result.reward,
                "dev_evaluations": sum(1 for c in run.candidates.values() for _ in c.scores),
                "spend_usd": result.info["spend_usd"], "steps": result.steps,
                "best_dev_score": result.info.get("best_dev_score"), "metrics": result.info.get("metrics", {}),
                "params": {k2: v for k2, v in improved.params.items()},
            }
            rows.append(row)
            if on_round is not None:
                on_round(row)
            if mode == "target":
                tgt = improved
            else:
                imp = tgt = improved
        chains.append({"seed": seed, "ids": ids, "indices": indices, "compounding": compounding(indices)})
    first = [row["improver_gain"] for row in rows if row["round"] == 1]
    total = [c["compounding"]["total"] for c in chains]
    later = [c["compounding"]["later_rounds"] for c in chains]
    per_round = {r: mean_se([row["improver_gain"] for row in rows if row["round"] == r]) for r in range(1, rounds + 1)}
    summary = {
        "original_index": chains[0]["indices"][0] if chains else None,
        "first_round_improver_gain": mean_se(first), "compounding_total": mean_se(total),
        "compounding_later_rounds": mean_se(later), "improver_gain_by_round": per_round,
        "final_index": mean_se([c["indices"][-1] for c in chains]),
    }
    config = {"scenario": scenario.name, "rounds": rounds, "seeds": list(seeds), "mode": mode,
              "improver": first_improver.id, "target": first_target.id, "official_k": k,
              "options": opts.model_dump(mode="json", exclude={"target_spec"})}
    return {"config": config, "rows": rows, "chains": chains, "summary": summary}


def markdown(result: dict[str, Any], command: str | None = None) -> str:
    """The recursion result as Markdown: the command, a row per (seed, round), the summary."""
    cfg, s = result["config"], result["summary"]

    def ms(v: tuple) -> str:
        return "—" if v[0] is None else f"{v[0]:+.4f} ± {v[1]:.4f} (n={v[2]})"

    lines = ["# Recursion", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    o = cfg["options"]
    lines += [f"Scenario `{cfg['scenario']}`, mode `{cfg['mode']}`, {cfg['rounds']} rounds × seeds {cfg['seeds']}; "
              f"improver {cfg['improver']}, original target {cfg['target']}. Index = official RSI-Index over "
              f"{', '.join(o['official_benchmarks'])} × {o['official_seeds']} held-out seeds × avg@{cfg['official_k']} "
              f"({o['track']} track, ${o['budget_usd']:g} per episode); dev = {o['dev_seeds']} seed(s) per benchmark "
              "on " + ", ".join(o["dev_benchmarks"]) + ".", "",
              "| seed | round | target | improved | index before | index after | improver gain | best dev | dev evals | spend | params |",
              "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items() if k in SEARCH)
        best_dev = "—" if r["best_dev_score"] is None else f"{r['best_dev_score']:.4f}"
        lines.append(f"| {r['seed']} | {r['round']} | {r['target'][:11]} | {r['improved'][:11]} | {r['index_before']:+.4f} | "
                     f"{r['index_after']:+.4f} | {r['improver_gain']:+.4f} | {best_dev} | {r['dev_evaluations']} | "
                     f"${r['spend_usd']:,.0f} | {params} |")
    lines += ["", f"* original index: {s['original_index']:+.4f}",
              f"* improver gain, round 1 (mean ± s.e. over seeds): {ms(s['first_round_improver_gain'])}",
              *[f"* improver gain, round {r}: {ms(v)}" for r, v in s["improver_gain_by_round"].items() if int(r) > 1],
              f"* compounding (index after the last round − original): {ms(s['compounding_total'])}",
              f"* of which rounds 2..N: {ms(s['compounding_later_rounds'])}",
              f"* final index: {ms(s['final_index'])}", ""]
    return "\n".join(lines)


def to_json(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))


__all__ = ["ImproverArgs", "Measurement", "RecursiveOptions", "RecursiveWorld", "ScriptedAgent", "ScriptedImprover",
           "markdown", "measure", "recurse", "split_tasks", "to_json"]
