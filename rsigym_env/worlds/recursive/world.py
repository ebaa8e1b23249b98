"""The recursive world (``world: recursive``): the target system is a researcher spec.

Its initial harness is a researcher spec's files view (``spec.json``, ``params.toml``, ``prompt.md``,
``skills/*.md``, ``memory/*.md``; see :mod:`rsigym_env.agents`), so an improver changes the target
researcher with ``edit_harness`` and measures it with ``evaluate`` like any other harness. There are
no weights (``checkpoint`` is always ``base``); data, training, inference and the sandbox are refused
with ``not_supported``. :mod:`rsigym_env.worlds` builds it for ``world: recursive`` from
:class:`RecursiveOptions` (the scenario's ``world_options``), as it builds the other worlds.

* **dev** = ``dev_seeds`` seeds per dev benchmark, chosen from the outer episode's seed (different
  seeds in every round); **official** (validation) = ``official_seeds`` held-out seeds per official
  benchmark, the same for every candidate, drawn from the platform's split secret (``official_split``;
  :func:`~.measure.held_out_seeds`) so that no improver, not even one with this package and the sim,
  can tell which seeds they are; they are never shown, and results name them by position
  (``official/aime/task-0``). Dev, validation and test seeds never overlap.
* **score** = the target's RSI-Index on that split (mean over benchmarks of the mean gain), floored at
  0 to fit an evaluation score (any researcher can reach 0 by submitting the initial system); the raw
  per-episode gains are the per-task rewards. The outer reward is the normalized gain of that index.
* **cost**: a dev evaluation reserves its worst case (episodes × their budget) on the run's key; each
  inner episode runs on a sub-key carved out of that reservation (:mod:`.measure`) and the evaluation
  is charged what they spent. Its duration is the longest episode's research time (they run in
  parallel). The official evaluation is outside the budget, as always.

>>> world = RecursiveWorld(RecursiveOptions(dev_benchmarks=["aime"]), seed=0)
>>> world.name, "spec.json" in world.initial_harness(), world.evaluation.quote(EvalRequest(
...     checkpoint="base", harness_version="h-1", harness_files=world.initial_harness(), split="dev", k=1)).usd
('recursive', True, 1000.0)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...errors import ActionError
from ...services import Billed, EvalRequest, EvalResult, Job, Quote, call_funding, resolved
from ...splits import SplitMode
from ..lifecycle import WorldLifecycle
from ..sim.clock import SimClock
from .measure import ALL_BENCHMARKS, DEV_SEED_BASE, MAX_K, TEST_SEED_FLOOR, Measurement, failure, measure, split_tasks
from .ports import Researchers, researchers


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
    official_split: SplitMode = Field("secret", description="Where the validation (official) and test seeds come "
                                      "from: 'secret' = keyed by the platform's split secret (an agent with this package "
                                      "cannot compute them); 'public' = official_first_seed... and test_first_seed... "
                                      "(the same everywhere, for examples; not held out from such an agent).")
    official_seeds: int = Field(8, ge=1, description="Held-out (validation) tasks per benchmark.")
    official_first_seed: int = Field(0, ge=0, description="The first validation seed when official_split='public'.")
    test_seeds: int = Field(8, ge=1, description="Test tasks per benchmark: no episode of this world ever runs them; "
                                                 "only `rsigym recurse` reports them.")
    test_first_seed: int = Field(2_000_000, ge=0, description="The first test seed when official_split='public' "
                                                              "(dev seeds lie in [1,000,000, 2,000,000)).")
    transfer_benchmarks: list[str] = Field(default_factory=list,
                                           description="Held out of dev and official: reported as transfer by `rsigym recurse`.")
    ray: bool = Field(False, description="Run the measuring episodes as Ray tasks.")

    @model_validator(mode="after")
    def _disjoint_splits(self) -> "RecursiveOptions":
        """Train (dev), validation (official) and test seeds never overlap, whatever the episode seed; the
        public split's first seeds are refused with a secret split (they would be silently unused)."""
        if self.official_split == "secret":
            given = [name for name in ("official_first_seed", "test_first_seed")
                     if getattr(self, name) != type(self).model_fields[name].default]
            if given:
                raise ValueError(f"{' and '.join(given)} apply to official_split='public' only: with the secret "
                                 "split, validation and test seeds are drawn from the platform's split secret")
            return self  # held_out_seeds: disjoint ranges above every dev seed
        ranges = {"dev": (DEV_SEED_BASE, TEST_SEED_FLOOR),
                  "official": (self.official_first_seed, self.official_first_seed + self.official_seeds),
                  "test": (self.test_first_seed, self.test_first_seed + self.test_seeds)}
        names = list(ranges)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                (a0, a1), (b0, b1) = ranges[a], ranges[b]
                if a0 < b1 and b0 < a1:
                    raise ValueError(f"the {a} seeds [{a0}, {a1}) and the {b} seeds [{b0}, {b1}) overlap")
        return self

    def spec(self, registry: Any = None, using: Researchers | None = None) -> Any:
        """The initial target (an :class:`~rsigym_env.agents.AgentSpec`): ``target_spec`` if given, else
        ``target`` looked up in ``registry`` (default: the agent registry)."""
        return (using or researchers()).target(self.target, self.target_spec, registry)


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

    def __init__(self, world: RecursiveWorld):
        self.world = world

    def _spec(self, req: EvalRequest) -> Any:
        if req.checkpoint != "base":
            raise ActionError("unknown_ref", "a researcher has no checkpoints; evaluate checkpoint 'base'")
        try:
            spec = self.world.researchers.from_files(req.harness_files)
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

    def _run(self, req: EvalRequest, *, billed: bool) -> Billed[EvalResult]:
        """Measure the request's spec; ``billed``: its episodes run on sub-keys of the call's bill."""
        spec, w, k = self._spec(req), self.world, self._k(req)
        funding = call_funding() if billed else None
        m = measure(spec, w.opts, req.split, k, w.seed, None if req.split == "official" else req.n_tasks,
                    funding=funding, using=w.researchers)
        rewards = [[float(r.reward) if r.ok else 0.0 for r in m.records[i * k:(i + 1) * k]] for i in range(len(m.tasks))]
        failures = [[failure(r) for r in m.records[i * k:(i + 1) * k]] for i in range(len(m.tasks))]
        modes: dict[str, int] = {}
        for row in failures:
            for f in row:
                if f:
                    modes[f] = modes.get(f, 0) + 1
        w.measurements[(spec.id, req.split, req.n_tasks)] = m
        value = EvalResult(split=req.split, checkpoint="base", harness_version=req.harness_version, k=k,
                           score=min(1.0, max(0.0, m.index)), task_ids=[f"{req.split}/{t}" for t in m.task_ids()],
                           rewards=rewards, failures=failures, failure_modes=modes, tokens=0, sandbox_seconds=0.0)
        cost = m.billed_usd if m.billed_usd is not None else m.spend_usd
        return Billed[EvalResult](value=value, cost_usd=cost, seconds=m.hours * 3600.0)

    def start(self, req: EvalRequest, job_id: str) -> Job:
        if req.split != "dev":
            raise ActionError("not_supported", "only the platform evaluates the official split (at submit)")
        billed = self._run(req, billed=True)
        now = self.world.clock.now()
        return Job(id=job_id, kind="evaluate", started_at=now, future=resolved(billed), ready_at=now + billed.seconds,
                   meta={"checkpoint": "base", "harness_version": req.harness_version, "split": "dev"})

    def official(self, req: EvalRequest) -> Billed[EvalResult]:
        return self._run(req, billed=False)

    def prefetch_official(self, req: EvalRequest) -> None:
        """Not started ahead: the inner episodes it would run are billed to the outer key when they run."""


class RecursiveWorld(WorldLifecycle):
    """A world whose target system is a researcher spec (see the module docstring).

    ``registry``: where ``target`` is looked up; ``using``: what parses specs and runs inner
    episodes (:mod:`.ports`; default: the one ``import rsigym_env`` installs)."""

    name = "recursive"

    def __init__(self, opts: RecursiveOptions, seed: int, registry: Any = None, using: Researchers | None = None):
        self.researchers = using or researchers()  # injected: specs and inner episodes (ports)
        self.opts, self.seed = opts, seed
        self.target = opts.spec(registry, self.researchers)
        self.researchers.check(self.target)
        self.clock = SimClock()
        self.rollout = _NotSupported("data generation")
        self.train = _NotSupported("training")
        self.inference = _NotSupported("inference")
        self.sandbox = _NotSupported("the sandbox")
        self.evaluation = RecursiveEvaluation(self)
        self.measurements: dict[tuple[str, str, int | None], Measurement] = {}  # (spec id, split, n_tasks)

    def initial_harness(self) -> dict[str, str]:
        return self.target.to_files()

    def describe(self) -> str:
        o = self.opts
        return (
            f"recursive world: the target system is a researcher, spec {self.target.id} (kind {self.target.kind}"
            f"{', ' + self.target.name if self.target.name else ''}). Its harness files are its spec: spec.json "
            "(kind, name, model, tools, parent), params.toml (its parameters), prompt.md, skills/<name>.md, "
            "memory/<name>.md and, for a program (kind program), its source code/<name>.py (code/researcher.py "
            "defines make_researcher(params); it runs in a sandbox of its own).\n"
            f"evaluate runs it as the researcher of {o.inner_world} episodes ({o.track} track, ${o.budget_usd:g} each): "
            f"dev (train) = {o.dev_seeds} seed(s) per benchmark on {', '.join(o.dev_benchmarks)} (new seeds each episode; "
            "per-task detail); the official split (validation: this episode's reward, a score) = "
            f"{o.official_seeds} held-out seeds per benchmark on {', '.join(o.official_benchmarks)}; further test "
            "seeds, never run here, are only reported by `rsigym recurse`. "
            "avg@k runs each task with k seeds. Score = its RSI-Index (mean over benchmarks of the normalized gain "
            "it reaches), floored at 0; per-task rewards are the raw gains. A dev evaluation costs what its "
            "episodes spend (worst case reserved: episodes x budget) and lasts as long as the longest episode.\n"
            "Always evaluate checkpoint 'base'; there is no data, training, inference or sandbox here."
        )


def make_recursive_world(scenario: Any, seed: int, run_dir: Any = None) -> RecursiveWorld:
    """The world factory :mod:`rsigym_env.worlds` registers as ``recursive``."""
    return RecursiveWorld(RecursiveOptions.model_validate(scenario.world_options), seed)
