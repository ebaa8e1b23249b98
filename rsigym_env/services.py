"""One protocol per service, with pydantic request/response models. Worlds implement them.

Nothing above a world knows which world it talks to: the run (platform side) asks a service for a
worst-case :class:`Quote`, reserves that on the ledger, calls the service, and settles the
:class:`Billed` cost it reports. ``quote`` methods validate references (unknown dataset,
checkpoint, teacher...) by raising :class:`~rsigym_env.errors.ActionError`, so a bad call is
refused before anything is reserved.

Asynchronous work (training, evaluation) returns a :class:`Job` at once. A world owns its
:class:`Clock`: simulated seconds in ``sim`` (a job is ready when the clock reaches ``ready_at``),
wall time elsewhere (a job is ready when its future is done).
"""

from __future__ import annotations

from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, Literal, Protocol, Sequence, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from .tools import GenerateData, Infer, SandboxExec, Train, TransformData

T = TypeVar("T")


class Quote(BaseModel):
    """What a call may cost at most (reserved before it runs) and how long it is expected to take."""

    usd: float = Field(ge=0.0, description="Worst-case cost in dollars.")
    seconds: float = Field(ge=0.0, description="Expected duration in the world's clock.")


class Billed(BaseModel, Generic[T]):
    """A service result with its actual cost (never above the quote) and duration."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    value: T
    cost_usd: float = Field(ge=0.0)
    seconds: float = Field(ge=0.0)


class DatasetInfo(BaseModel):
    """A dataset the researcher can train on or transform."""

    id: str
    n_examples: int
    tokens: int = Field(description="Total tokens (prompt + completion) over all examples.")
    origin: str = Field(description="How it was made, e.g. 'claude-opus-5 x 500 (synthetic)' or 'filter(ds-1)'.")
    stats: dict[str, float] = Field(default_factory=dict, description="Measured properties, e.g. pass rate.")
    preview: list[dict[str, Any]] = Field(default_factory=list, description="A few examples (chat messages).")


class TrainResult(BaseModel):
    """A finished training job."""

    checkpoint: str
    steps: int
    tokens: int = Field(description="Billed training tokens.")
    loss_curve: list[float]
    config: dict[str, Any]


class Completion(BaseModel):
    """One chat completion."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length"]


class CommandResult(BaseModel):
    """A finished sandbox command."""

    stdout: str
    stderr: str
    exit_code: int
    duration_s: float


class EvalRequest(BaseModel):
    """Evaluate a (checkpoint, harness) on a split. The harness travels as its files."""

    checkpoint: str
    harness_version: str
    harness_files: dict[str, str]
    split: Literal["dev", "official"] = "dev"
    k: int = Field(3, ge=1, le=8)
    n_tasks: int | None = None


class TaskResult(BaseModel):
    """One task: the reward of each attempt and, for each failed attempt, what went wrong."""

    task: str
    rewards: list[float]
    failures: list[str] = Field(description="Failure mode per attempt ('' where it succeeded).")


class EvalResult(BaseModel):
    """A finished evaluation: avg@k over tasks, per-task rewards and a histogram of failure modes.

    Per-task results are stored as columns (cheap to build for hundreds of tasks); ``tasks`` gives
    them as one :class:`TaskResult` per task.
    """

    split: Literal["dev", "official"]
    checkpoint: str
    harness_version: str
    k: int
    score: float = Field(ge=0.0, le=1.0, description="Mean over tasks of the mean reward over k attempts.")
    task_ids: list[str]
    rewards: list[list[float]] = Field(description="Per task, the reward of each attempt.")
    failures: list[list[str]] = Field(description="Per task, the failure mode of each attempt ('' if it succeeded).")
    failure_modes: dict[str, int] = Field(description="Failed attempts per failure mode.")
    tokens: int
    sandbox_seconds: float
    cached: bool = Field(False, description="A stored result of the very same evaluation (same system, tasks, seeds).")

    @property
    def tasks(self) -> list[TaskResult]:
        """One :class:`TaskResult` per task."""
        return [TaskResult(task=t, rewards=r, failures=f) for t, r, f in zip(self.task_ids, self.rewards, self.failures)]


# Pydantic caches parametrized generics weakly; building one costs ~0.6 ms. Keep the ones the
# services return alive so every `Billed[X]` after the first is a cache hit.
BILLED_TYPES = tuple(Billed[t] for t in (DatasetInfo, TrainResult, Completion, CommandResult, EvalResult))


@dataclass
class Job:
    """A running asynchronous call. ``future`` resolves to a :class:`Billed` result.

    ``ready_at`` is set by worlds with a simulated clock: the job counts as finished only when the
    clock reaches it, even if the future already holds the result. ``cancel`` (worlds whose jobs
    really run) stops the work and returns what the part that ran cost, in dollars (None: unknown);
    without a measure a cancelled job is billed by the share of its expected duration that passed.
    """

    id: str
    kind: Literal["train", "evaluate", "generate_data", "transform_data", "submit"]
    started_at: float
    future: Future
    ready_at: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    cancel: Callable[[], float | None] | None = None

    def is_done(self, now: float) -> bool:
        """True once the result is available at clock time ``now``."""
        if self.ready_at is not None and now < self.ready_at:
            return False
        return self.future.done()


@runtime_checkable
class Clock(Protocol):
    """A world's notion of time, in seconds since the run began.

    ``simulated`` (optional, default False): time moves only by ``spend`` and ``wait``, so work can
    be computed at once and made ready later (``Job.ready_at``) instead of running in a thread.
    """

    def now(self) -> float: ...

    def spend(self, seconds: float) -> None:
        """A synchronous call took ``seconds`` (a simulated clock advances; a wall clock already has)."""

    def wait(self, jobs: Sequence[Job], deadline: float) -> Job | None:
        """Block until the first of ``jobs`` is done and return it; ``None`` if ``deadline`` comes first."""


@runtime_checkable
class RolloutService(Protocol):
    """Teacher rollouts and dataset transforms."""

    def quote_generate(self, call: GenerateData) -> Quote: ...
    def generate(self, call: GenerateData, dataset_id: str) -> Billed[DatasetInfo]: ...
    def quote_transform(self, call: TransformData) -> Quote: ...
    def transform(self, call: TransformData, dataset_id: str) -> Billed[DatasetInfo]: ...


@runtime_checkable
class TrainService(Protocol):
    """LoRA fine-tuning. ``start`` returns a job whose future is ``Billed[TrainResult]``."""

    def quote(self, call: Train) -> Quote: ...
    def start(self, call: Train, job_id: str, checkpoint_id: str) -> Job: ...


@runtime_checkable
class InferenceService(Protocol):
    """Chat completions from the base model or a checkpoint."""

    def quote(self, call: Infer) -> Quote: ...
    def complete(self, call: Infer) -> Billed[Completion]: ...


@runtime_checkable
class SandboxService(Protocol):
    """Commands in the run's isolated sandbox."""

    def quote(self, call: SandboxExec) -> Quote: ...
    def exec(self, call: SandboxExec) -> Billed[CommandResult]: ...


@runtime_checkable
class EvalService(Protocol):
    """Benchmark evaluation. Dev evaluations are jobs; the official one is run by the platform only."""

    def quote(self, req: EvalRequest) -> Quote: ...
    def start(self, req: EvalRequest, job_id: str) -> Job: ...
    def official(self, req: EvalRequest) -> Billed[EvalResult]: ...

    def prefetch_official(self, req: EvalRequest) -> None:
        """A hint, given when an episode starts: :meth:`official` will be asked for ``req`` (the initial
        system's evaluation). A service may start it now so the answer is ready by then; it must be the same
        evaluation either way. Returns at once and never raises; doing nothing is a valid answer."""


@runtime_checkable
class World(Protocol):
    """Five services, a clock, a price list and the initial system (base model + harness files)."""

    name: str
    clock: Clock
    rollout: RolloutService
    train: TrainService
    inference: InferenceService
    sandbox: SandboxService
    evaluation: EvalService

    def initial_harness(self) -> dict[str, str]:
        """The minimal harness's files (path → text) that a run starts from."""

    def describe(self) -> str:
        """A short text for the researcher: the benchmark, its domain, what the world models."""

    def read(self, ref: str) -> str | None:
        """A world artifact the researcher can ``read`` (e.g. a dev evaluation's trajectories), ``None`` if ``ref``
        names none (:class:`rsigym_env.worlds.lifecycle.WorldLifecycle` gives every world this default)."""

    def close(self) -> None:
        """Stop the world's jobs and release what it holds; safe to call twice."""


_PROGRESS: ContextVar[Callable[[float], None] | None] = ContextVar("rsigym_progress", default=None)


def progress_reporter() -> Callable[[float], None]:
    """Where a service reports what a running call has used so far, in dollars (the run records it on
    the call's reservation, so a crash bills exactly that). Capture it when a job starts, in the
    caller's thread; a no-op outside a run.

    >>> seen = []
    >>> with reporting_progress(seen.append):
    ...     progress_reporter()(0.25)
    >>> progress_reporter()(1.0); seen
    [0.25]
    """
    return _PROGRESS.get() or _ignore


def _ignore(usd: float) -> None:
    """No run is listening."""


@contextmanager
def reporting_progress(sink: Callable[[float], None]) -> Iterator[None]:
    """Make ``sink`` the :func:`progress_reporter` of calls in this context."""
    token = _PROGRESS.set(sink)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


class CallFunding(Protocol):
    """The open bill of the paid call in progress, as a service sees it (:func:`call_funding`): it
    can carve sub-keys out of the call's reservation for work that runs under keys of its own (the
    recursive world's inner episodes), and close them so that their spend is charged with the call.
    :class:`rsigym_env.platform.core.Bill` is one."""

    @property
    def platform(self) -> Any: ...

    def mint_subkey(self, budget_usd: float, scenario: Any = None) -> Any: ...

    def close_subkey(self, child: Any) -> float: ...


_FUNDING: ContextVar[CallFunding | None] = ContextVar("rsigym_funding", default=None)


def call_funding() -> CallFunding | None:
    """The bill funding the paid call in progress (see :class:`CallFunding`); ``None`` outside a run.
    Capture it when a job starts, in the caller's thread.

    >>> call_funding() is None
    True
    """
    return _FUNDING.get()


@contextmanager
def funding_call(bill: CallFunding) -> Iterator[None]:
    """Make ``bill`` the :func:`call_funding` of calls in this context."""
    token = _FUNDING.set(bill)
    try:
        yield
    finally:
        _FUNDING.reset(token)


def resolved(value: Any) -> Future:
    """A future that already holds ``value`` (for worlds that compute a job's result up front)."""
    fut: Future = Future()
    fut.set_result(value)
    return fut
