"""One research run: the episode's state and the execution of every tool call.

A call is parsed, authorized against the run's key, quoted by the world's service (which checks
references), reserved at its worst case on the ledger, executed, settled at its actual cost, and
audited. Anything refused becomes an :class:`Outcome` with an error code and costs nothing.

>>> from rsigym_env.scenario import load_scenario
>>> run = ResearchRun(load_scenario(benchmark="aime", budget_usd=100), seed=0)
>>> out = run.execute({"tool": "evaluate", "args": {"k": 1, "n_tasks": 10}})
>>> out.info["ok"], out.info["result"]["job"]
(True, 'job-1')
>>> run.execute({"tool": "wait"}).info["events"][0]["kind"]
'evaluate'
>>> end = run.execute({"tool": "submit"})
>>> end.terminated, end.info["normalized_gain"], end.info["dev_evaluations"]
(True, 0.0, 1)

What the run holds is read through :meth:`ResearchRun.view`, a frozen :class:`RunView` (what the env
hands its wrappers and recorders as ``env.unwrapped.run_view()``):

>>> view = run.view()
>>> view.steps, view.best_dev == end.info["best_dev_score"], list(view.job_results), view.end_info["end_reason"]
(3, True, ['job-1'], 'submitted')
>>> sorted(view.harness_files(view.harness_initial))
['harness.toml', 'prompt.md']

Each tool has one handler, looked up by the tool's name in :attr:`ResearchRun.HANDLERS` (built once,
with the class; a name that is not a tool is refused by :func:`~rsigym_env.tools.parse_action` first):

>>> from rsigym_env.tools import TOOL_NAMES
>>> ResearchRun.HANDLERS["submit"].__name__, sorted(ResearchRun.HANDLERS) == sorted(TOOL_NAMES)
('_submit', True)
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, ClassVar, TypeVar

from .errors import ActionError, InsufficientBudget, WorkFailed
from .harness import HarnessStore
from .platform.core import Bill, Platform, PlatformKey, tool_label
from .platform.ledger import Balance
from .scenario import Scenario
from .scoring import normalized_gain
from .services import (
    Billed, DatasetInfo, EvalRequest, EvalResult, Job, Quote, TrainResult, funding_call, reporting_progress,
)
from .tools import (
    EditHarness, Evaluate, GenerateData, Infer, Read, SandboxExec, Submit, Tool, Train,
    TransformData, Wait, parse_action,
)
from .worlds import WorldFactory, make_world

T = TypeVar("T")
ToolHandler = Callable[["ResearchRun", Any], "tuple[str, dict[str, Any]]"]  # (log text, info["result"])
MIN_USD = 0.01  # less than this available (and nothing running) means the money has run out
CANCEL_WAIT_S = 30.0  # how long a cancelled call-job may take to finish before it is billed by elapsed time


@dataclass
class Outcome:
    """What one step produced: the text a researcher reads and the structured ``info``."""

    log: str
    info: dict[str, Any]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False


@dataclass
class RunningJob:
    job: Job
    bill: Bill | None  # None for a submission (its official evaluation is outside the budget)
    tool: Tool
    target: str  # the checkpoint or dataset id the job will produce; "" for evaluations


@dataclass(frozen=True, slots=True)
class JobView:
    """A running job as :class:`RunView` shows it: its kind, when it started and when it is expected to end
    (seconds on the world's clock; ``ready_at`` on a simulated clock, ``eta_s`` the expected duration)."""

    kind: str
    started_at: float
    ready_at: float | None
    eta_s: float | None


@dataclass(frozen=True, slots=True)
class RunView:
    """A read-only snapshot of a run, as of the moment :meth:`ResearchRun.view` made it (take a new one
    after a step). For the run's owner: wrappers, the run record, the session service; never in ``info``.

    ``balance`` is the key's account as of the end of the last step (what the observation shows);
    ``world_s`` the world's clock; ``running`` the jobs still running, ``job_results`` the finished ones
    (result objects, or ``{"error": ...}`` for a failed or cancelled one); ``end_info`` the end ``info``
    once the episode is over, else ``None``; ``harness_*`` the initial and latest harness versions and all
    versions made so far, :meth:`harness_files` a version's files.
    """

    seed: int
    key_id: str
    steps: int
    best_dev: float | None
    balance: Balance
    world_s: float
    running: Mapping[str, JobView]
    job_results: Mapping[str, Any]
    datasets: Mapping[str, DatasetInfo]
    harness_initial: str
    harness_latest: str
    harness_versions: tuple[str, ...]
    end_info: Mapping[str, Any] | None
    _harness: HarnessStore = field(repr=False, compare=False)

    def harness_files(self, version: str = "latest") -> dict[str, str]:
        """The files (path -> text, a copy) of a harness version: an id, ``"initial"`` or ``"latest"``
        (as of the snapshot)."""
        return self._harness.files(self.harness_latest if version == "latest" else version)


@dataclass
class Candidate:
    """A (checkpoint, harness version) pair and the dev scores measured for it."""

    checkpoint: str
    harness: str
    scores: list[float] = field(default_factory=list)


class ResearchRun:
    """The state of one episode. ``execute`` takes any action form and never raises.

    ``world_factory`` builds the episode's world, ``(scenario, seed, run_dir) -> World``; default: the
    registered world the scenario names (:func:`rsigym_env.worlds.make_world`). Wrapping it wraps the
    world, as :class:`rsigym_env.replay.TapeWrapper` does to record or replay one.

    ``key``: bill the run to this key of ``platform`` (a sub-key, e.g. an inner episode of the
    recursive world) instead of a new one of the scenario's budget.
    """

    def __init__(self, scenario: Scenario, seed: int, platform: Platform | None = None, run_dir: Path | None = None,
                 *, async_jobs: bool = False, world_factory: WorldFactory = make_world, key: PlatformKey | None = None):
        self.scenario = scenario
        self.seed = seed
        self.async_jobs = async_jobs  # generate_data, transform_data and submit as jobs (no call blocks long)
        self._pool: cf.ThreadPoolExecutor | None = None
        self.world = world_factory(scenario, seed, run_dir)
        self.platform = platform or Platform()
        self.key = key if key is not None else self.platform.issue_key(scenario)
        self.harness = HarnessStore(self.world.initial_harness())
        self.time_limit_s = scenario.time_limit_h * 3600.0
        self.steps = 0  # calls that ran (a refused call uses no step)
        self.refusals = 0  # calls refused before anything ran
        self.running: dict[str, RunningJob] = {}
        self.job_results: dict[str, Any] = {}
        self.datasets: dict[str, DatasetInfo] = {}
        self.checkpoints: dict[str, TrainResult] = {}
        self.candidates: dict[tuple[str, str], Candidate] = {}
        self.initial_dev: float | None = None
        self.last_dev: float | None = None
        self.best: Candidate | None = None
        self.end_info: dict[str, Any] | None = None
        self._counters: dict[str, int] = {}
        self._pending_events: list[dict[str, Any]] = []
        self.balance = self.platform.balance(self.key)  # refreshed once per step
        # the initial system's official evaluation: every episode's reward needs it, no action changes it
        self.world.evaluation.prefetch_official(
            self._eval_request("base", self.harness.initial, "official", scenario.official_k, None))

    # ------------------------------------------------------------------ state the env observes

    @property
    def budget_left(self) -> float:
        """Available dollars as of the end of the last step."""
        return self.balance.available_usd

    @property
    def time_left(self) -> float:
        return max(0.0, self.time_limit_s - self.world.clock.now())

    @property
    def best_dev(self) -> float | None:
        return max(self.best.scores) if self.best else None

    @property
    def dev_evaluations(self) -> int:
        """How many dev evaluations have finished (every score of every candidate)."""
        return sum(len(c.scores) for c in self.candidates.values())

    @property
    def submitting(self) -> bool:
        """True while a submission's official evaluation runs as a job (``async_jobs``)."""
        return bool(self.running) and any(r.job.kind == "submit" for r in self.running.values())

    def view(self) -> RunView:
        """The run as it stands, read-only (see :class:`RunView`)."""
        running = {j: JobView(r.job.kind, r.job.started_at, r.job.ready_at, r.job.meta.get("eta_s"))
                   for j, r in self.running.items()}
        return RunView(
            seed=self.seed, key_id=self.key.id, steps=self.steps, best_dev=self.best_dev, balance=self.balance,
            world_s=self.world.clock.now(), running=MappingProxyType(running),
            job_results=MappingProxyType(dict(self.job_results)), datasets=MappingProxyType(dict(self.datasets)),
            harness_initial=self.harness.initial, harness_latest=self.harness.latest,
            harness_versions=tuple(self.harness.versions),
            end_info=MappingProxyType(dict(self.end_info)) if self.end_info is not None else None,
            _harness=self.harness)

    def allowed_tools(self) -> list[str]:
        """Tools worth offering now: allowed by the key, ``wait`` only with jobs running, only ``read``
        and ``wait`` while a submission is being evaluated."""
        tools = self.scenario.tools()
        if self.submitting:
            return [t for t in tools if t in ("read", "wait")]
        return [t for t in tools if t != "wait" or self.running]

    def status_line(self) -> str:
        jobs = ", ".join(f"{j} ({r.job.kind})" for j, r in self.running.items()) or "none"
        return (
            f"[step {self.steps}/{self.scenario.max_steps} | ${self.budget_left:.2f} of "
            f"${self.scenario.budget_usd:g} left | {self.world.clock.now() / 3600:.1f} h of "
            f"{self.scenario.time_limit_h:g} h | running: {jobs}]"
        )

    def briefing(self) -> str:
        """What the researcher is told at the start of the episode."""
        s = self.scenario
        locks = ", ".join(f"{k}={v}" for k, v in s.permissions.train.lock.items()) or "none"
        return "\n".join([
            f"Research run '{s.name}' ({s.track} track, {s.world} world).",
            self.world.describe(),
            f"Budget ${s.budget_usd:g}; time limit {s.time_limit_h:g} h; at most {s.max_steps} tool calls. A refused "
            f"call (malformed, forbidden, over budget) costs nothing and uses no step; after {s.refusal_limit} "
            "refusals the run ends.",
            f"Tools: {', '.join(s.tools())}.",
            f"Teachers: {', '.join(s.permissions.teachers)}. Locked training fields: {locks}.",
            f"Harness {self.harness.initial}: files {', '.join(sorted(self.harness.files()))} "
            f"(read harness:latest/<file>).",
            "Reward: the normalized gain of what you submit on the held-out official split.",
        ])

    # ------------------------------------------------------------------ one step

    def execute(self, action: Any) -> Outcome:
        """Run one call. Bad input comes back as an error outcome, costs nothing and is audited."""
        if self.end_info is not None:
            return Outcome("ERROR episode_over: the episode has ended; call reset()",
                           {"ok": False, "error": "episode_over", "message": "the episode has ended; call reset()",
                            "cost_usd": 0.0, "budget_left_usd": self.budget_left,
                            "spent_usd": self.balance.spent_usd}, terminated=True)
        self.steps += 1
        tool: Tool | None = None
        spent_before = self.balance.spent_usd
        try:
            tool = parse_action(action)
            tool = self.platform.authorize(self.key, tool)
            if self.submitting and tool.name not in ("read", "wait"):
                raise ActionError("submission_pending", f"{tool.name}: the submission is being evaluated; "
                                                        "only read and wait until it finishes")
            text, result = self.HANDLERS[tool.name](self, tool)
            if not tool.paid:
                self.platform.record(self.key, tool)
            info: dict[str, Any] = {"tool": tool.name, "ok": True, "result": result}
        except ActionError as err:
            if isinstance(err, WorkFailed):  # it ran and was billed; its settle record says so
                text = f"ERROR {err.code}: {err.message} (charged ${err.cost_usd:.4f} for what ran)"
            else:
                if not isinstance(err, InsufficientBudget):  # the ledger audits its own refusals
                    self.platform.refuse(self.key, tool if tool is not None else action, err)
                self.steps -= 1  # refused: nothing ran, no step used; the refusal limit counts it
                self.refusals += 1
                text = f"ERROR {err.code}: {err.message}"
            info = {"tool": tool_label(tool if tool is not None else action), "ok": False,
                    "error": err.code, "message": err.message}
            if isinstance(err, InsufficientBudget) and err.requested_usd is not None:
                info.update(requested_usd=err.requested_usd, available_usd=err.available_usd)
        except Exception as exc:  # a service failed: nothing stays reserved (charge/open release on error)
            err = ActionError("service_error", f"{type(exc).__name__}: {exc}")
            self.platform.refuse(self.key, tool if tool is not None else action, err)
            text = f"ERROR service_error: {err.message}"
            info = {"tool": tool_label(tool if tool is not None else action), "ok": False,
                    "error": "service_error", "message": err.message}
        events = self._pending_events + self._collect()
        self._pending_events = []
        self.balance = self.platform.balance(self.key)
        if events:
            info["events"] = events
            text += "\n" + "\n".join(e["text"] for e in events)
        outcome = Outcome(text, info)
        if self.end_info is None:
            try:
                self._check_limits()
            except ActionError as err:  # the limit's official evaluation failed: the next step tries again
                outcome.log += f"\nERROR {err.code}: {err.message}"
        if self.end_info is not None:
            outcome.terminated = self.end_info["submitted"]["by"] == "agent"
            outcome.truncated = not outcome.terminated
            outcome.reward = self.end_info["normalized_gain"]
            info.update(self.end_info)
            if outcome.truncated:
                outcome.log += f"\nEpisode over ({self.end_info['end_reason']}): {self.end_summary()}"
        info["cost_usd"] = round(self.balance.spent_usd - spent_before, 9)
        info["budget_left_usd"] = self.balance.available_usd
        info["spent_usd"] = self.balance.spent_usd  # billed so far (reservations not included)
        return outcome

    # ------------------------------------------------------------------ tools

    def _paid(self, tool: Tool, quote: Quote, call: Callable[[], Billed[T]]) -> Billed[T]:
        """Reserve the quote, run a synchronous call, settle what it cost, let its time pass.

        Work that ran and failed (:class:`~rsigym_env.errors.WorkFailed`) is settled at what it used;
        any other failure releases the reservation."""
        with self.platform.charge(self.key, tool, quote.usd) as bill, reporting_progress(_throttled(bill.progress)):
            try:
                billed = call()
            except WorkFailed as err:
                bill.settle(err.cost_usd)
                self.world.clock.spend(err.seconds)
                raise
            bill.settle(billed.cost_usd)
        self.world.clock.spend(billed.seconds)
        return billed

    def _generate_data(self, tool: GenerateData) -> tuple[str, dict[str, Any]]:
        rollout = self.world.rollout
        quote = rollout.quote_generate(tool)
        if self.async_jobs:
            return self._start_call(tool, quote, lambda ds: rollout.generate(tool, ds), f"{tool.teacher} x {tool.n_examples}")
        return self._new_dataset(self._paid(tool, quote, lambda: rollout.generate(tool, self._next("ds"))))

    def _transform_data(self, tool: TransformData) -> tuple[str, dict[str, Any]]:
        for ds in tool.datasets:
            self._dataset(ds)
        rollout = self.world.rollout
        quote = rollout.quote_transform(tool)
        if self.async_jobs:
            return self._start_call(tool, quote, lambda ds: rollout.transform(tool, ds),
                                    f"{tool.operation}({', '.join(tool.datasets)})")
        return self._new_dataset(self._paid(tool, quote, lambda: rollout.transform(tool, self._next("ds"))))

    def _background(self, call: Callable[[], T], kind: str, job_id: str, eta_s: float) -> Job:
        """``call`` as a job: computed at once and ready after its duration on a simulated clock (so the
        episode stays deterministic), else run in the run's own worker thread."""
        now = self.world.clock.now()
        if getattr(self.world.clock, "simulated", False):
            future: cf.Future = cf.Future()
            try:
                value = call()
                future.set_result(value)
                seconds = float(getattr(value, "seconds", 0.0))
            except Exception as exc:  # noqa: BLE001 - the job fails, as a threaded one would
                future.set_exception(exc)
                seconds = float(getattr(exc, "seconds", 0.0))
            return Job(id=job_id, kind=kind, started_at=now, future=future, ready_at=now + seconds,  # type: ignore[arg-type]
                       meta={"eta_s": seconds})
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="rsigym-run-job")
        future = self._pool.submit(contextvars.copy_context().run, call)  # with the call's progress reporter

        def cancel() -> float | None:
            """A call cannot be stopped midway: wait a little for it (then its cost), else None (the share of
            its quote by the time that passed is billed)."""
            cf.wait([future], timeout=CANCEL_WAIT_S)
            if future.done():
                exc = future.exception()
                return exc.cost_usd if isinstance(exc, WorkFailed) else (0.0 if exc else future.result().cost_usd)
            return None

        return Job(id=job_id, kind=kind, started_at=now, future=future, meta={"eta_s": eta_s},  # type: ignore[arg-type]
                   cancel=cancel)

    def _start_call(self, tool: Tool, quote: Quote, call: Callable[[str], Billed[DatasetInfo]],
                    what: str) -> tuple[str, dict[str, Any]]:
        """A dataset-making call started as a job (``async_jobs``); ``wait`` for it, then read the dataset.
        Ids are taken only once the reservation holds (a refused call uses none, as in blocking mode)."""
        made: list[str] = []

        def start() -> Job:
            made.append(self._next("ds"))
            return self._background(lambda: call(made[0]), tool.name, self._next("job"), quote.seconds)

        job = self._start(tool, quote, start, "")
        dataset = made[0]
        self.running[job.id].target = dataset
        return (f"{tool.name} started as {job.id}: {what} -> {dataset} when done "
                f"(reserved ${quote.usd:.2f}, ~{quote.seconds / 60:.0f} min; wait {job.id})",
                {"job": job.id, "dataset": dataset, "quote_usd": quote.usd, "eta_s": quote.seconds})

    def _new_dataset(self, billed: Billed[DatasetInfo]) -> tuple[str, dict[str, Any]]:
        ds = billed.value
        self.datasets[ds.id] = ds
        stats = ", ".join(f"{k} {v:.3g}" for k, v in ds.stats.items())
        return (f"{ds.id}: {ds.n_examples} examples, {ds.tokens:,} tokens ({ds.origin}); {stats}; "
                f"cost ${billed.cost_usd:.2f}", ds.model_dump())

    def _train(self, tool: Train) -> tuple[str, dict[str, Any]]:
        self._dataset(tool.dataset)
        self._checkpoint(tool.base)
        quote = self.world.train.quote(tool)
        job_id, ckpt = self._next("job"), self._next("ckpt")
        job = self._start(tool, quote, lambda: self.world.train.start(tool, job_id, ckpt), ckpt)
        return (f"train started as {job.id}: {tool.dataset} from {tool.base}, lr {tool.learning_rate:g}, "
                f"{tool.num_epochs} epoch(s), rank {tool.lora_rank} -> {ckpt} when done "
                f"(reserved ${quote.usd:.2f}, ~{quote.seconds / 60:.0f} min)",
                {"job": job.id, "checkpoint": ckpt, "quote_usd": quote.usd, "eta_s": quote.seconds})

    def _evaluate(self, tool: Evaluate) -> tuple[str, dict[str, Any]]:
        request = self._eval_request(tool.checkpoint, tool.harness, "dev", tool.k, tool.n_tasks)
        quote = self.world.evaluation.quote(request)
        job_id = self._next("job")
        job = self._start(tool, quote, lambda: self.world.evaluation.start(request, job_id), "")
        scope = f"first {tool.n_tasks} dev tasks" if tool.n_tasks else "all dev tasks"
        return (f"evaluate started as {job.id}: {request.checkpoint} + {request.harness_version} on {scope}, "
                f"avg@{tool.k} (reserved ${quote.usd:.2f}, ~{quote.seconds / 60:.0f} min)",
                {"job": job.id, "quote_usd": quote.usd, "eta_s": quote.seconds})

    def _start(self, tool: Tool, quote: Quote, start: Any, target: str) -> Job:
        bill = self.platform.open(self.key, tool, quote.usd)
        try:
            # a world captures both as its job starts: where to report progress, and the bill funding the call
            with reporting_progress(_throttled(bill.progress)), funding_call(bill):
                job = start()
        except BaseException:
            self.platform.release(bill, "start_failed")
            raise
        job.meta.setdefault("eta_s", quote.seconds)
        self.running[job.id] = RunningJob(job, bill, tool, target)
        return job

    def _infer(self, tool: Infer) -> tuple[str, dict[str, Any]]:
        self._checkpoint(tool.model)
        inference = self.world.inference
        billed = self._paid(tool, inference.quote(tool), lambda: inference.complete(tool))
        c = billed.value
        return (f"{tool.model} ({c.prompt_tokens}+{c.completion_tokens} tokens, {c.finish_reason}, "
                f"${billed.cost_usd:.4f}):\n{c.text}", c.model_dump())

    def _sandbox_exec(self, tool: SandboxExec) -> tuple[str, dict[str, Any]]:
        sandbox = self.world.sandbox
        billed = self._paid(tool, sandbox.quote(tool), lambda: sandbox.exec(tool))
        r = billed.value
        return (f"exit {r.exit_code} after {r.duration_s:.1f} s (${billed.cost_usd:.4f})\n"
                f"--- stdout\n{r.stdout}" + (f"\n--- stderr\n{r.stderr}" if r.stderr else ""), r.model_dump())

    def _edit_harness(self, tool: EditHarness) -> tuple[str, dict[str, Any]]:
        before = self.harness.resolve(tool.base_version)
        version = self.harness.edit(tool.path, content=tool.content, old=tool.old, new=tool.new,
                                    base_version=tool.base_version)
        change = (f"wrote {tool.path} ({len(tool.content or '')} characters)" if tool.content is not None
                  else f"{tool.path}: {_quote(tool.old)} -> {_quote(tool.new)}")
        same = " (same content as an existing version)" if version == before else ""
        return f"harness {version} (from {before}){same}: {change}", {
            "version": version, "base_version": before, "path": tool.path}

    def _read(self, tool: Read) -> tuple[str, dict[str, Any]]:
        ref, _, offset_text = tool.ref.partition("@")
        try:
            offset = int(offset_text or 0)
        except ValueError:
            raise ActionError("invalid_args", f"read: offset after '@' must be an integer, got {offset_text!r}") from None
        body = self._render_ref(ref.strip())
        return body[offset:], {"ref": tool.ref, "chars": len(body), "offset": offset}

    def _wait(self, tool: Wait) -> tuple[str, dict[str, Any]]:
        if tool.job is not None:
            if tool.job not in self.running:
                done = " (it has already finished)" if tool.job in self.job_results else ""
                raise ActionError("unknown_ref", f"wait: no running job {tool.job!r}{done}; running: "
                                                 f"{', '.join(self.running) or 'none'}")
            jobs = [self.running[tool.job].job]
        else:
            if not self.running:
                raise ActionError("no_running_jobs", "wait: no job is running")
            jobs = [r.job for r in self.running.values()]
        deadline = self.time_limit_s
        if tool.timeout_s is not None:
            deadline = min(deadline, self.world.clock.now() + tool.timeout_s)
        finished = self.world.clock.wait(jobs, deadline)
        if finished is None:
            if deadline < self.time_limit_s:
                now = self.world.clock.now()
                progress = {j.id: self._progress(j, now) for j in jobs}
                text = "; ".join(f"{j} {p['elapsed_s']:.0f} s" + (f" of ~{p['eta_s']:.0f} s" if p.get("eta_s") else "")
                                 for j, p in progress.items())
                return (f"still running after {tool.timeout_s:g} s: {text}; call wait again",
                        {"finished": None, "still_running": list(progress), "progress": progress})
            return "the time limit came before the job finished", {"finished": None}
        return f"waited until {self.world.clock.now() / 3600:.2f} h", {"finished": finished.id}

    def _progress(self, job: Job, now: float) -> dict[str, Any]:
        """How far along a running job is: seconds since it started and, where known, its expected length."""
        out: dict[str, Any] = {"kind": job.kind, "elapsed_s": round(max(0.0, now - job.started_at), 3)}
        eta = job.meta.get("eta_s") if job.ready_at is None else job.ready_at - job.started_at
        if eta:
            out["eta_s"] = round(float(eta), 3)
        return out

    def _submit(self, tool: Submit) -> tuple[str, dict[str, Any]]:
        checkpoint = self._checkpoint(tool.checkpoint)
        version = self.harness.resolve(tool.harness)
        self._validate_official(checkpoint, version)  # a submission that cannot be evaluated is refused, free
        if self.async_jobs:  # the official evaluation as a job; the episode ends when it finishes
            job_id = self._next("job")
            job = self._background(lambda: self._official_evaluations(checkpoint, version), "submit", job_id, 0.0)
            job.meta.update(checkpoint=checkpoint, harness=version)
            self.running[job.id] = RunningJob(job, None, tool, "")
            return (f"submit started as {job.id}: the official evaluation of {checkpoint} + {version}; the episode "
                    f"ends when it finishes (wait {job.id})", {"job": job.id, "checkpoint": checkpoint, "harness": version})
        self._finish(checkpoint, version, by="agent", reason="submitted")
        return f"submitted {checkpoint} + {version}: {self.end_summary()}", {"submitted": self.end_info["submitted"]}

    def _validate_official(self, checkpoint: str, version: str) -> None:
        """Everything the official evaluation of (checkpoint, version) needs, checked before anything runs."""
        k = self.scenario.official_k
        for pair in {("base", self.harness.initial), (checkpoint, version)}:
            self.world.evaluation.quote(self._eval_request(*pair, "official", k, None))

    HANDLERS: ClassVar[dict[str, ToolHandler]] = {  # the tool's wire name -> what runs it
        tool.name: handler for tool, handler in (
            (GenerateData, _generate_data), (TransformData, _transform_data), (Train, _train), (Evaluate, _evaluate),
            (Infer, _infer), (SandboxExec, _sandbox_exec), (EditHarness, _edit_harness), (Read, _read),
            (Wait, _wait), (Submit, _submit),
        )
    }

    # ------------------------------------------------------------------ helpers

    def _next(self, prefix: str) -> str:
        self._counters[prefix] = self._counters.get(prefix, 0) + 1
        return f"{prefix}-{self._counters[prefix]}"

    def _dataset(self, ref: str) -> DatasetInfo:
        if ref not in self.datasets:
            raise ActionError("unknown_ref", f"no dataset {ref!r}; datasets: {', '.join(self.datasets) or 'none yet'}")
        return self.datasets[ref]

    def _checkpoint(self, ref: str) -> str:
        if ref == "base" or ref in self.checkpoints:
            return ref
        pending = [j for j, r in self.running.items() if r.target == ref]
        why = f" (it is not ready: {pending[0]} is still running)" if pending else ""
        raise ActionError("unknown_ref", f"no checkpoint {ref!r}{why}; checkpoints: "
                                         f"{', '.join(['base', *self.checkpoints])}")

    def _eval_request(self, checkpoint: str, harness: str, split: str, k: int, n_tasks: int | None) -> EvalRequest:
        ckpt = self._checkpoint(checkpoint)
        version = self.harness.resolve(harness)
        return EvalRequest(checkpoint=ckpt, harness_version=version, harness_files=self.harness.files(version),
                           split=split, k=k, n_tasks=n_tasks)

    def _collect(self) -> list[dict[str, Any]]:
        """Settle and record every job that has finished by now."""
        now = self.world.clock.now()
        events = []
        for job_id, running in list(self.running.items()):
            if not running.job.is_done(now):
                continue
            del self.running[job_id]
            if running.bill is None:  # a submission
                events.append(self._submission_event(job_id, running))
                continue
            try:
                billed: Billed = running.job.future.result()
            except Exception as exc:
                if isinstance(exc, WorkFailed):
                    charged = running.bill.settle(exc.cost_usd)
                    paid = f"charged ${charged:.4f} for what ran"
                else:
                    self.platform.release(running.bill, "job_failed")
                    charged, paid = 0.0, "nothing was charged"
                self.job_results[job_id] = {"error": f"{type(exc).__name__}: {exc}", "cost_usd": charged}
                events.append({"job": job_id, "kind": running.job.kind, "ok": False, "cost_usd": charged,
                               "text": f"{job_id} ({running.job.kind}) FAILED: {exc}; {paid}"})
                continue
            running.bill.settle(billed.cost_usd)
            self.job_results[job_id] = billed.value
            events.append(self._job_event(job_id, billed))
        return events

    def _submission_event(self, job_id: str, running: RunningJob) -> dict[str, Any]:
        """A finished submission ends the episode; a failed one leaves it going on."""
        meta = running.job.meta
        try:
            evaluations = running.job.future.result()
        except Exception as exc:  # noqa: BLE001
            message = exc.message if isinstance(exc, ActionError) else f"{type(exc).__name__}: {exc}"
            self.job_results[job_id] = {"error": message}
            return {"job": job_id, "kind": "submit", "ok": False,
                    "text": f"{job_id} (submit) FAILED: {message}; the episode goes on, submit again"}
        self._conclude(meta["checkpoint"], meta["harness"], evaluations, by="agent", reason="submitted")
        self.job_results[job_id] = {"submitted": self.end_info["submitted"]} if self.end_info else {}
        return {"job": job_id, "kind": "submit", "ok": True,
                "text": f"{job_id} (submit) finished: submitted {meta['checkpoint']} + {meta['harness']}: {self.end_summary()}"}

    def _job_event(self, job_id: str, billed: Billed) -> dict[str, Any]:
        value = billed.value
        if isinstance(value, DatasetInfo):
            text, _ = self._new_dataset(billed)
            return {"job": job_id, "kind": "dataset", "ok": True, "dataset": value.id, "n_examples": value.n_examples,
                    "stats": dict(value.stats), "cost_usd": billed.cost_usd, "text": f"{job_id} finished: {text}"}
        if isinstance(value, TrainResult):
            self.checkpoints[value.checkpoint] = value
            return {"job": job_id, "kind": "train", "ok": True, "checkpoint": value.checkpoint,
                    "final_loss": value.loss_curve[-1] if value.loss_curve else None, "cost_usd": billed.cost_usd,
                    "text": f"{job_id} (train) finished: {value.checkpoint} after {value.steps} steps, final loss "
                            f"{value.loss_curve[-1]:.3f}, ${billed.cost_usd:.2f}"}
        assert isinstance(value, EvalResult)
        self._record_dev(value)
        modes = ", ".join(f"{m} {n}" for m, n in sorted(value.failure_modes.items(), key=lambda kv: -kv[1]))
        return {"job": job_id, "kind": "evaluate", "ok": True, "score": value.score, "checkpoint": value.checkpoint,
                "harness": value.harness_version, "n_tasks": len(value.task_ids), "k": value.k,
                "failure_modes": dict(value.failure_modes), "cost_usd": billed.cost_usd,
                "text": f"{job_id} (evaluate) finished: dev score {value.score:.3f} for {value.checkpoint} + "
                        f"{value.harness_version} ({len(value.task_ids)} tasks x {value.k}), ${billed.cost_usd:.2f}; "
                        f"failed attempts by mode: {modes or 'none'} (read {job_id} for per-task results)"}

    def _record_dev(self, result: EvalResult) -> None:
        key = (result.checkpoint, result.harness_version)
        candidate = self.candidates.setdefault(key, Candidate(*key))
        candidate.scores.append(result.score)
        self.last_dev = result.score
        if key == ("base", self.harness.initial) and self.initial_dev is None:
            self.initial_dev = result.score
        if self.best is None or max(candidate.scores) > max(self.best.scores):
            self.best = candidate

    def _render_ref(self, ref: str) -> str:
        if ref in self.running:
            r = self.running[ref]
            eta = f", ready at {r.job.ready_at / 3600:.2f} h" if r.job.ready_at is not None else ""
            return f"{ref}: {r.job.kind} running since {r.job.started_at / 3600:.2f} h{eta}"
        if ref in self.job_results:
            value = self.job_results[ref]
            if isinstance(value, EvalResult):
                return _render_eval(ref, value)
            return _dump(value)
        if ref in self.datasets:
            return _dump(self.datasets[ref])
        if ref in self.checkpoints:
            return _dump(self.checkpoints[ref])
        if ref.startswith("harness:"):
            version, _, path = ref[len("harness:"):].partition("/")
            files = self.harness.files(version or "latest")
            if not path:
                return f"harness {self.harness.resolve(version or 'latest')}: " + ", ".join(sorted(files))
            if path not in files:
                raise ActionError("unknown_ref", f"read: no file {path!r} in the harness; files: {', '.join(sorted(files))}")
            return files[path]
        if ref == "jobs":
            lines = [f"{j}: running ({r.job.kind})" for j, r in self.running.items()]
            lines += [f"{j}: finished" for j in self.job_results]
            return "\n".join(lines) or "no jobs yet"
        if ref == "artifacts":
            return _dump({
                "datasets": list(self.datasets), "checkpoints": ["base", *self.checkpoints],
                "harness_versions": self.harness.versions, "latest_harness": self.harness.latest,
                "dev_scores": {f"{c}+{h}": cand.scores for (c, h), cand in self.candidates.items()},
            })
        if ref == "budget":
            return _dump(self.platform.balance(self.key).__dict__)
        if ref == "scenario":
            return _dump(self.scenario.model_dump())
        if (text := self.world.read(ref)) is not None:  # world artifacts, e.g. a dev evaluation's trajectories
            return text
        raise ActionError("unknown_ref", f"read: nothing called {ref!r}; try a job, dataset or checkpoint id, "
                                         "harness:latest/<file>, jobs, artifacts, budget or scenario")

    def _check_limits(self) -> None:
        if self.submitting:  # the submission ends the episode when its evaluation finishes
            return
        if self.steps >= self.scenario.max_steps:
            reason = "step limit"
        elif self.refusals >= self.scenario.refusal_limit:
            reason = "refusal limit"
        elif self.world.clock.now() >= self.time_limit_s:
            reason = "time limit"
        elif not self.running and self.budget_left < MIN_USD:
            reason = "budget exhausted"
        else:
            return
        self._finish("base", self.harness.initial, by="default", reason=reason)

    def _finish(self, checkpoint: str, version: str, *, by: str, reason: str) -> None:
        """Run the official evaluation, then settle the jobs and freeze the episode's result.

        The official evaluation comes first: if it fails, nothing has changed (jobs keep running, the
        episode goes on) and the caller sees a ``service_error``. Then jobs that have finished are
        collected (billed in full, results kept) and the rest cancelled and billed for the part that ran.
        """
        self._conclude(checkpoint, version, self._official_evaluations(checkpoint, version), by=by, reason=reason)

    def _official_evaluations(self, checkpoint: str, version: str) -> tuple[Billed, Billed, Billed | None]:
        """The initial system's and the submission's official evaluations, and the best dev candidate's
        (for the selection metric) when it is neither; ``service_error`` if one fails."""
        k = self.scenario.official_k
        best = (self.best.checkpoint, self.best.harness) if self.best is not None else None
        try:  # the submission's first: the initial system's may still be finishing beside it (prefetch_official)
            final = self.world.evaluation.official(self._eval_request(checkpoint, version, "official", k, None))
            if (checkpoint, version) == ("base", self.harness.initial):
                initial = final
            else:
                initial = self.world.evaluation.official(self._eval_request("base", self.harness.initial, "official", k, None))
        except ActionError:
            raise
        except Exception as exc:
            raise ActionError("service_error", f"the official evaluation failed ({type(exc).__name__}: {exc}); "
                                               "nothing changed: running jobs go on and the episode continues") from exc
        extra = None
        if best is not None and best not in ((checkpoint, version), ("base", self.harness.initial)):
            try:  # outside the budget like the submission; a metric must never break the end of an episode
                extra = self.world.evaluation.official(self._eval_request(*best, "official", k, None))
            except Exception:  # noqa: BLE001
                extra = None
        return initial, final, extra

    def _conclude(self, checkpoint: str, version: str, evaluations: tuple[Billed, Billed, Billed | None], *,
                  by: str, reason: str) -> None:
        """Freeze the episode's result from its official evaluations; settle every job first."""
        initial, final, extra = evaluations
        self._pending_events.extend(self._collect())
        self._settle_running("cancelled at the end of the episode")
        now = self.world.clock.now()
        balance = self.balance = self.platform.balance(self.key)
        submitted_dev = self.candidates.get((checkpoint, version))
        gain = normalized_gain(initial.value.score, final.value.score)
        self.end_info = {
            "initial_score": initial.value.score,
            "official_score": final.value.score,
            "normalized_gain": gain,
            "initial_dev_score": self.initial_dev,
            "best_dev_score": self.best_dev,
            "best_candidate": {"checkpoint": self.best.checkpoint, "harness": self.best.harness} if self.best else None,
            "submitted_dev_score": max(submitted_dev.scores) if submitted_dev else None,
            "dev_evaluations": self.dev_evaluations,
            "submitted": {"checkpoint": checkpoint, "harness": version, "by": by},
            "end_reason": reason,
            "spend_usd": balance.spent_usd,
            "budget_usd": balance.budget_usd,
            "gain_per_usd": gain / balance.spent_usd if balance.spent_usd > 0 else 0.0,
            "official_eval_usd": initial.cost_usd + (final.cost_usd if final is not initial else 0.0),
            "initial_official_cached": initial.value.cached,
            "steps": self.steps,
            "refusals": self.refusals,
            "elapsed_h": now / 3600.0,
            "official_split": dict(getattr(self.world, "official_split", None) or {"mode": "world-seed"}),
        }
        # research-quality metrics (rsigym_env.metrics): the best dev candidate's official score
        from .metrics import episode_metrics

        best_official, extra_usd = None, 0.0
        if self.best is not None:
            best_key = (self.best.checkpoint, self.best.harness)
            if best_key == (checkpoint, version):
                best_official = final.value.score
            elif best_key == ("base", self.harness.initial):
                best_official = initial.value.score
            elif extra is not None:
                best_official, extra_usd = extra.value.score, extra.cost_usd
        self.end_info["metrics"] = episode_metrics(self.end_info, best_official) | {"selection_eval_usd": extra_usd}
        self.platform.ledger.record({"key": self.key.id, "tool": "official_evaluation", "decision": "allowed", "billed": "outside budget",
                                     "submitted": self.end_info["submitted"], "official_score": final.value.score,
                                     "initial_score": initial.value.score, "cost_usd": self.end_info["official_eval_usd"]})

    def _settle_running(self, why: str) -> None:
        """Cancel every running job and bill the part that ran (never more than its reservation)."""
        now = self.world.clock.now()
        for job_id, running in list(self.running.items()):
            job = running.job
            del self.running[job_id]
            if running.bill is None:  # a submission: nothing reserved
                self.job_results[job_id] = {"error": why}
                continue
            try:
                if job.ready_at is not None and job.future.done() and job.ready_at > job.started_at:
                    fraction = min(1.0, max(0.0, (now - job.started_at) / (job.ready_at - job.started_at)))
                    cost = job.future.result().cost_usd * fraction  # a simulated job: its share of the result's cost
                elif job.cancel is not None and (measured := job.cancel()) is not None:
                    cost = measured  # the world stopped the work and says what the part that ran cost
                else:  # no measure of the work: the share of the expected duration that passed, of the quote
                    eta = float(job.meta.get("eta_s") or 0.0)
                    fraction = min(1.0, (now - job.started_at) / eta) if eta > 0 else 1.0
                    cost = running.bill.reservation.usd * max(0.0, fraction)
                charged = running.bill.settle(cost)
            except Exception as exc:  # noqa: BLE001 - a broken job must not leave money locked
                self.platform.release(running.bill, f"cancel_failed: {type(exc).__name__}")
                charged = 0.0
            self.job_results[job_id] = {"error": why, "cost_usd": charged}

    def abandon(self, why: str) -> None:
        """End the run without a submission (the env was reset or closed): running jobs are cancelled and
        billed for the part that ran, as at truncation; nothing stays reserved. Safe to call twice."""
        if self.end_info is not None or not self.running:
            return
        self._settle_running(f"cancelled: the run was {why}")
        self.balance = self.platform.balance(self.key)

    def end_summary(self) -> str:
        e = self.end_info or {}
        return (f"official score {e['official_score']:.4f} vs initial {e['initial_score']:.4f} -> normalized gain "
                f"{e['normalized_gain']:+.4f}; spent ${e['spend_usd']:.2f} of ${e['budget_usd']:g}")


def _throttled(record: Callable[[float], Any], interval_s: float = 1.0) -> Callable[[float], None]:
    """``record`` (a reservation's progress) called at most once per ``interval_s``: progress is cheap
    but not free, and a crash loses at most that much of the record."""
    last = [-interval_s]

    def report(usd: float) -> None:
        now = time.monotonic()
        if now - last[0] >= interval_s:
            last[0] = now
            try:
                record(usd)
            except ValueError:  # the reservation has just been settled
                pass

    return report


def _quote(text: str | None, limit: int = 60) -> str:
    text = repr(text or "")
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def _dump(value: Any) -> str:
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    return json.dumps(value, indent=1, default=str)


def _render_eval(job_id: str, result: EvalResult) -> str:
    lines = [f"{job_id}: {result.split} score {result.score:.4f} avg@{result.k} for {result.checkpoint} + "
             f"{result.harness_version}; {result.tokens:,} tokens, {result.sandbox_seconds:,.0f} sandbox-seconds",
             "failure modes: " + (", ".join(f"{m}={n}" for m, n in result.failure_modes.items()) or "none"),
             "task  rewards  failures"]
    for task, rewards, failures in zip(result.task_ids, result.rewards, result.failures):
        marks = "".join("1" if r >= 1 else ("0" if r <= 0 else "~") for r in rewards)
        lines.append(f"{task}  {marks}  {'; '.join(f for f in failures if f)}")
    return "\n".join(lines)

