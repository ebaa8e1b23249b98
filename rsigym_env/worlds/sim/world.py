"""``SimWorld``: the five services over the latent model of :mod:`.model`, on a simulated clock.

Every call is pure NumPy and microseconds long. Results of jobs are computed when they start and
become visible when the clock reaches ``ready_at``. All randomness comes from the world's counter-based
streams (:mod:`.draws`, keyed by ``(seed, benchmark, stream)``): the same calls on the same seed give the
same results, on any machine. The world itself is :func:`~.model.draw_worlds` with N = 1 and its
evaluations are :func:`~.model.evaluation_stats` and :func:`~.model.draw_outcomes` with N = 1 (sim result
version 6), so an array of N worlds (:class:`~.batch.SimBatch`) gives each one what it gives alone.

>>> from rsigym_env.services import EvalRequest
>>> world = SimWorld("aime", seed=0)
>>> round(world.expected_score("base", world.initial_harness(), "official"), 4)
0.3167
>>> result = world.evaluation.official(EvalRequest(checkpoint="base", harness_version="v0",
...                                                harness_files=world.initial_harness(), split="official"))
>>> result.value.k, len(result.value.tasks)
(3, 60)
"""

from __future__ import annotations

import functools
import json
import math
import re
import shlex
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rsigym_env.errors import ActionError
from rsigym_env.numerics import check_arithmetic
from rsigym_env.prices import DEFAULT_PRICES, PriceList
from rsigym_env.services import (
    Billed,
    CommandResult,
    Completion,
    DatasetInfo,
    EvalRequest,
    EvalResult,
    Job,
    Quote,
    TrainResult,
    resolved,
)
from rsigym_env.tools import GenerateData, Infer, SandboxExec, Train, TransformData

from ..lifecycle import WorldLifecycle
from .benchmarks import BENCHMARKS
from .clock import SimClock
from .draws import Streams, benchmark_key
from .model import (
    EVAL_DRAWS,
    FAILURE_MODES,
    HARNESS_ERROR,
    Dataset,
    EvalStats,
    Harness,
    HarnessError,
    ModelState,
    Robustness,
    TaskSet,
    TrainSettings,
    attempt_tokens,
    calibrate_skill,
    dedupe_dataset,
    draw_outcomes,
    draw_worlds,
    evaluation_stats,
    filter_dataset,
    generate_dataset,
    GENERATE_DRAWS,
    loss_curve,
    mix_datasets,
    norm_ppf,
    parse_harness,
    render_attempts,
    sigmoid,
    train_model,
)

MINIMAL_HARNESS_TOML = """\
# Minimal harness. The paper's researchers changed each option below where their logs showed the
# failure it addresses; an option the system does not need costs tokens and breaks some tasks.
[generation]
max_output_tokens = 4096    # replies longer than this are cut off
on_truncation = "stop"      # "stop": give up on a cut-off reply | "continue": ask the model to continue
[completion]
verify_before_submit = false  # run the task's own checks before declaring the task done
[shell]
persistent = false          # keep working directory and environment between commands
[loop]
detect = false              # notice repeated identical actions and change course
[edits]
check = false               # re-read and syntax-check a file after editing it
"""

PROMPT_MD = """\
You are an agent solving a {title} task. Read the task, work step by step, and finish with your answer.
"""

HARNESS_ERROR_SANDBOX_S = 10.0  # an attempt that dies while loading the harness
TRANSFORM_STARTUP_S = 10.0
TRANSFORM_SECONDS_PER_EXAMPLE = {"dedupe": 0.01, "mix": 0.002}  # filter: the domain's check_seconds
INFER_TOKENS_PER_SECOND = 80.0
INFER_LATENCY_S = 0.5
TASK_PROMPT = re.compile(r"task:dev/(\d+)")
LOSS_POINTS = 200  # points of a training job's loss curve (at most)
SANDBOX_NOT_MODELLED = "sim sandbox: command not modelled; the sim world runs no code (use world='local')\n"


class SimOptions(BaseModel):
    """``world_options`` of a sim-world scenario: concurrency and training throughput (``CALIBRATION.md``).

    >>> SimOptions().eval_concurrency, SimOptions.model_validate({"train_overhead_s": 60}).train_overhead_s
    (16, 60.0)
    >>> try:
    ...     SimOptions.model_validate({"warp": 2})
    ... except ValueError as exc:
    ...     print("unknown sim options ['warp']" in str(exc))
    True
    """

    model_config = ConfigDict(extra="forbid")

    eval_concurrency: int = Field(16, ge=1, description="Attempts running at once in an evaluation.")
    generate_concurrency: int = Field(64, ge=1, description="Teacher requests at once.")
    transform_concurrency: int = Field(16, ge=1, description="Sandboxes checking examples at once (filter).")
    train_tokens_per_second: float = Field(8000.0, gt=0, description="Training throughput.")
    train_overhead_s: float = Field(120.0, ge=0, description="Added to every training job's duration.")

    @model_validator(mode="before")
    @classmethod
    def _known_options(cls, data: Any) -> Any:
        if isinstance(data, dict) and (unknown := set(data) - set(cls.model_fields)):
            raise ValueError(f"unknown sim options {sorted(unknown)}; options are {', '.join(cls.model_fields)}")
        return data


class SimWorld(WorldLifecycle):
    """A seeded surrogate of one RSIGym research run: benchmark, target system and five services.

    Args:
        benchmark: a key of ``BENCHMARKS``.
        seed: non-negative world seed (tasks, official draws, training tolerance, all sampling).
        prices: the price list calls are billed at.
        vcpus, memory_gib: sandbox size (sandbox seconds are billed at these).
        options: :class:`SimOptions` or a dict of its fields (concurrency and training throughput).
    """

    name = "sim"

    def __init__(
        self,
        benchmark: str,
        seed: int,
        *,
        prices: PriceList = DEFAULT_PRICES,
        vcpus: float = 2,
        memory_gib: float = 2.0,
        options: SimOptions | dict[str, Any] | None = None,
    ):
        if benchmark not in BENCHMARKS:
            raise ValueError(f"unknown benchmark {benchmark!r}; benchmarks are {', '.join(BENCHMARKS)}")
        check_arithmetic()  # once a process: warns where the last bits would differ from other machines'
        self.options = SimOptions.model_validate(options or {})
        self.benchmark = BENCHMARKS[benchmark]
        self.domain = self.benchmark.domain
        self.seed = seed
        self.prices = prices
        self.vcpus = vcpus
        self.memory_gib = memory_gib
        self.clock = SimClock()
        self.streams = Streams(seed, benchmark_key(benchmark))
        drawn = draw_worlds(self.benchmark, [seed])  # the array core with N = 1: parity by construction
        self.worlds = drawn
        self.profile = drawn.profile(0, self.domain)
        self.severity, self.harm = self.profile.severity, self.profile.harm
        self.official_tasks, self.dev_tasks = drawn.tasks(0, official=True), drawn.tasks(0, official=False)
        self.base_skill = float(drawn.base_skill[0])
        self.robustness = Robustness(float(drawn.threshold[0]), float(drawn.damage_scale[0]))
        self._teacher_skill: dict[str, float] = {}
        self.datasets: dict[str, Dataset] = {}
        self._checkpoints: dict[str, tuple[ModelState, float]] = {"base": (ModelState(self.base_skill), 0.0)}

        self.rollout = SimRollout(self)
        self.train = SimTrain(self)
        self.inference = SimInference(self)
        self.sandbox = SimSandbox(self)
        self.evaluation = SimEvaluation(self)

    # ---- the initial system and a description -------------------------------------------------

    def initial_harness(self) -> dict[str, str]:
        return {"harness.toml": MINIMAL_HARNESS_TOML, "prompt.md": PROMPT_MD.format(title=self.benchmark.title)}

    def describe(self) -> str:
        b, d = self.benchmark, self.domain
        teachers = ", ".join(t for t in self.prices.teachers if t in d.teacher_accuracy)
        return (
            f"sim world: {b.title} ({d.name}); {b.n_tasks} official tasks held out, {b.n_tasks} dev tasks; "
            f"initial avg@3 {b.initial_score:.2%} (Qwen3.5-35B-A3B-Base, minimal harness).\n"
            "This is a calibrated statistical model, not real software: task outcomes are sampled from "
            "per-task success probabilities driven by the model's skill, the harness's defects and training.\n"
            "The harness is read from harness.toml only (sections generation, completion, shell, loop, edits); "
            "prompt.md is carried along but not modelled. A harness.toml that does not parse fails every attempt "
            "with 'harness_error'. Which failures the target system has, and how often, differ from run to run and "
            "show in evaluation logs; an option it does not need costs tokens and breaks some tasks (those "
            "failures show as wrong_answer).\n"
            f"Teachers: {teachers}. Data, training, evaluation, inference and sandbox are billed at "
            f"{self.prices.source or 'the configured prices'}.\n"
            "infer with prompt 'task:dev/<i>' samples one attempt of dev task i by the model alone; other prompts "
            "get no real text. The sandbox models only: ls /data, wc -l /data/<ds>.jsonl, head /data/<ds>.jsonl, "
            "echo, sleep N, true; transform_data 'script' is not available (use world='local')."
        )

    # ---- for tests and calibration (not a service) -------------------------------------------

    def expected_score(self, checkpoint: str, harness_files: dict[str, str], split: str) -> float:
        """Mean success probability over a split's tasks (0 if harness.toml does not parse)."""
        state = self.model_state(checkpoint, require_ready=False)
        try:
            harness = parse_harness(harness_files)
        except HarnessError:
            return 0.0
        official = split == "official"
        stats = self.eval_stats(state.skill, 0.0 if official else state.dev_memory, harness, official)
        return float(stats.mean[0]) / stats.success.shape[1]

    def eval_stats(self, skill: float, memory: float, harness: Harness, official: bool,
                   n_tasks: int | None = None) -> EvalStats:
        """The evaluation kernel of :mod:`.model` with N = 1 (what :class:`~.batch.SimBatch` runs on N)."""
        w = self.worlds
        half = w.half if official else 1 - w.half
        return evaluation_stats(w.table, half, w.variant, w.present, w.severity, w.harm, np.array([skill]),
                                np.array([memory]), np.array([harness.max_output_tokens]), harness.active[None],
                                harness.applied[None], n_tasks)

    # ---- shared look-ups ------------------------------------------------------------------------

    def uniforms(self, stream: str, size: int) -> np.ndarray:
        """The next ``size`` uniforms of one of the world's streams (:mod:`.draws`)."""
        return self.streams.uniforms(stream, size)

    def model_state(self, ref: str, require_ready: bool = True) -> ModelState:
        """A checkpoint's latent state; ``unknown_ref`` if it does not exist (or is still training)."""
        if ref not in self._checkpoints:
            known = ", ".join(self._checkpoints)
            raise ActionError("unknown_ref", f"no checkpoint {ref!r}; checkpoints are: {known}")
        state, ready_at = self._checkpoints[ref]
        if require_ready and self.clock.now() < ready_at:
            raise ActionError("unknown_ref", f"checkpoint {ref!r} is still training (ready at t={ready_at:.0f}s)")
        return state

    def add_checkpoint(self, ref: str, state: ModelState, ready_at: float) -> None:
        self._checkpoints[ref] = (state, ready_at)

    def dataset(self, ref: str) -> Dataset:
        if ref not in self.datasets:
            known = ", ".join(self.datasets) or "none yet"
            raise ActionError("unknown_ref", f"no dataset {ref!r}; datasets are: {known}")
        return self.datasets[ref]

    def teacher_skill(self, teacher: str) -> float:
        """The skill (logit) at which a teacher solves the domain's tasks as often as its accuracy says."""
        if teacher not in self._teacher_skill:
            tasks = (self.official_tasks, self.dev_tasks)
            difficulty = np.concatenate([t.difficulty for t in tasks])
            accuracy = self.teacher_accuracy(teacher)
            self._teacher_skill[teacher] = float(calibrate_skill(difficulty, 1.0, accuracy))
        return self._teacher_skill[teacher]

    def teacher_accuracy(self, teacher: str) -> float:
        """A teacher's solve rate on this system's tasks: the domain's, shifted per seed in logits."""
        mean = self.domain.teacher_accuracy[teacher]
        return float(sigmoid(math.log(mean / (1.0 - mean)) + self.profile.teacher_shift[teacher]))

    def distillation_target(self, data: Dataset) -> float:
        """The skill training on ``data`` moves toward: the base plus the system's transfer share of the
        data's lead over the base (the transfer can be small or negative: then distilling does not pay);
        data below the base pull toward their own level whatever the transfer."""
        gap = data.target(self.domain.incorrect_penalty) - self.base_skill
        return self.base_skill + (self.profile.transfer * gap if gap > 0 else gap)

    def sandbox_usd(self, seconds: float) -> float:
        return self.prices.sandbox_usd(seconds, self.vcpus, self.memory_gib)

    def dataset_info(self, ref: str) -> DatasetInfo:
        data = self.datasets[ref]
        return DatasetInfo(
            id=ref,
            n_examples=data.n,
            tokens=data.tokens,
            origin=data.origin,
            stats=data.stats(),
            preview=[example_record(self, data, i) for i in range(min(2, data.n))],
        )


def example_record(world: SimWorld, data: Dataset, index: int) -> dict[str, Any]:
    """A stand-in chat example (the sim stores statistics, not text); correct ones in the data's proportion."""
    correct = (index + 1) * 0.6180339887 % 1.0 < data.pass_rate
    source = "dev" if index < data.n_dev else "synthetic"
    tokens = data.tokens // max(data.n, 1)
    return {
        "messages": [
            {"role": "user", "content": f"[sim] {source} {world.domain.name} task #{index}"},
            {
                "role": "assistant",
                "content": f"[sim] {data.teacher} reply, ~{tokens} tokens ({'correct' if correct else 'incorrect'})",
            },
        ]
    }


class SimRollout:
    """Teacher data and dataset transforms."""

    def __init__(self, world: SimWorld):
        self.world = world

    def _teacher_tokens(self, call: GenerateData) -> tuple[int, int]:
        """Worst-case (input, output) teacher tokens: every completion at the cap."""
        d = self.world.domain
        input_tokens = round(call.n_examples * d.example_prompt_tokens * d.teacher_input_factor)
        return input_tokens, call.n_examples * call.max_tokens_per_example

    def _generate_seconds(self, n: int) -> float:
        return math.ceil(n / self.world.options.generate_concurrency) * self.world.domain.generate_seconds

    def quote_generate(self, call: GenerateData) -> Quote:
        w = self.world
        if call.teacher not in w.prices.teachers:
            known = ", ".join(w.prices.teachers)
            raise ActionError("unknown_ref", f"no teacher {call.teacher!r}; teachers are: {known}")
        if call.teacher not in w.domain.teacher_accuracy:
            raise ActionError("not_supported", f"the sim world has no profile of teacher {call.teacher!r}")
        input_tokens, output_tokens = self._teacher_tokens(call)
        usd = w.prices.teacher_usd(call.teacher, input_tokens, output_tokens)
        return Quote(usd=usd, seconds=self._generate_seconds(call.n_examples))

    def generate(self, call: GenerateData, dataset_id: str) -> Billed[DatasetInfo]:
        self.quote_generate(call)
        w = self.world
        made = generate_dataset(
            w.uniforms("data", GENERATE_DRAWS), w.domain, call.teacher, w.teacher_skill(call.teacher), call.n_examples, call.source,
            call.max_tokens_per_example, dataset_id, w.benchmark.n_tasks, w.teacher_accuracy(call.teacher),
        )
        w.datasets[dataset_id] = made.dataset
        cost = w.prices.teacher_usd(call.teacher, made.input_tokens, made.output_tokens)
        seconds = self._generate_seconds(call.n_examples)
        return Billed[DatasetInfo](value=w.dataset_info(dataset_id), cost_usd=cost, seconds=seconds)

    def _transform_compute(self, call: TransformData) -> tuple[float, float]:
        """(sandbox seconds billed, wall seconds) of a transform."""
        if call.operation == "script":
            raise ActionError(
                "not_supported",
                "transform_data 'script' needs real code execution; the sim world runs no code; use world='local'",
            )
        n = sum(self.world.dataset(ref).n for ref in call.datasets)
        if call.operation == "filter":
            per_example, parallel = self.world.domain.check_seconds, self.world.options.transform_concurrency
        else:
            per_example, parallel = TRANSFORM_SECONDS_PER_EXAMPLE[call.operation], 1
        return TRANSFORM_STARTUP_S + n * per_example, TRANSFORM_STARTUP_S + math.ceil(n / parallel) * per_example

    def quote_transform(self, call: TransformData) -> Quote:
        compute, wall = self._transform_compute(call)
        return Quote(usd=self.world.sandbox_usd(compute), seconds=wall)

    def transform(self, call: TransformData, dataset_id: str) -> Billed[DatasetInfo]:
        compute, wall = self._transform_compute(call)
        w = self.world
        origin = f"{call.operation}({', '.join(call.datasets)})"
        merged = mix_datasets((w.dataset(ref) for ref in call.datasets), origin)
        if call.operation == "filter":
            merged = filter_dataset(w.uniforms("data", 2), merged, origin)
        elif call.operation == "dedupe":
            merged = dedupe_dataset(w.uniforms("data", 1), merged, origin)
        w.datasets[dataset_id] = merged
        return Billed[DatasetInfo](value=w.dataset_info(dataset_id), cost_usd=w.sandbox_usd(compute), seconds=wall)


class SimTrain:
    """LoRA fine-tuning as a distillation step toward the data's level."""

    def __init__(self, world: SimWorld):
        self.world = world

    def _tokens(self, call: Train) -> int:
        """Billed training tokens; refuses an unknown or empty dataset and an unknown or unfinished base."""
        data = self.world.dataset(call.dataset)
        if data.n == 0:
            raise ActionError("invalid_args", f"dataset {call.dataset!r} is empty")
        self.world.model_state(call.base)
        return data.tokens * call.num_epochs

    def _seconds(self, tokens: int) -> float:
        return tokens / self.world.options.train_tokens_per_second + self.world.options.train_overhead_s

    def quote(self, call: Train) -> Quote:
        tokens = self._tokens(call)
        return Quote(usd=self.world.prices.train_usd(tokens), seconds=self._seconds(tokens))

    def start(self, call: Train, job_id: str, checkpoint_id: str) -> Job:
        tokens = self._tokens(call)
        w = self.world
        data, parent = w.dataset(call.dataset), w.model_state(call.base)
        settings = TrainSettings.of(call)
        target = w.distillation_target(data)
        u = w.uniforms("train", 1 + LOSS_POINTS)
        state = train_model(float(norm_ppf(u[0])), parent, data, settings, w.domain, w.robustness, w.benchmark.n_tasks,
                            target=target)
        steps = math.ceil(data.n * call.num_epochs / call.batch_size)
        gap = target - parent.skill
        result = TrainResult(
            checkpoint=checkpoint_id,
            steps=steps,
            tokens=tokens,
            loss_curve=loss_curve(u[1:], steps, settings, gap, data.pass_rate, LOSS_POINTS),
            config=call.model_dump(),
        )
        seconds = self._seconds(tokens)
        now = w.clock.now()
        w.add_checkpoint(checkpoint_id, state, now + seconds)
        billed = Billed[TrainResult](value=result, cost_usd=w.prices.train_usd(tokens), seconds=seconds)
        meta = {"checkpoint": checkpoint_id, "dataset": call.dataset, "base": call.base}
        return Job(id=job_id, kind="train", started_at=now, future=resolved(billed), ready_at=now + seconds, meta=meta)


class SimInference:
    """One attempt of a dev task by the model alone; no free text."""

    def __init__(self, world: SimWorld):
        self.world = world

    def _prompt(self, call: Infer) -> tuple[int | None, int]:
        """(dev task index or None, prompt tokens); checks the model and the task index."""
        self.world.model_state(call.model)
        tokens = max(1, math.ceil(len(call.prompt) / 4))
        match = TASK_PROMPT.fullmatch(call.prompt.strip())
        if match is None:
            return None, tokens
        index, n = int(match.group(1)), len(self.world.dev_tasks)
        if index >= n:
            raise ActionError("unknown_ref", f"no dev task {index}; dev tasks are 0..{n - 1}")
        return index, tokens + self.world.domain.statement_tokens

    def _wanted_tokens(self, index: int | None) -> int:
        """Tokens the reply needs: the task's longest reply, or the domain's typical one."""
        w = self.world
        return w.domain.typical_reply_tokens if index is None else round(w.dev_tasks.reply_tokens[index])

    def quote(self, call: Infer) -> Quote:
        index, prompt_tokens = self._prompt(call)
        completion = min(self._wanted_tokens(index), call.max_tokens)
        return Quote(
            usd=self.world.prices.sample_usd(prompt_tokens, call.max_tokens),
            seconds=INFER_LATENCY_S + completion / INFER_TOKENS_PER_SECOND,
        )

    def complete(self, call: Infer) -> Billed[Completion]:
        index, prompt_tokens = self._prompt(call)
        w = self.world
        wanted = self._wanted_tokens(index)
        completion = min(wanted, call.max_tokens)
        finish = "length" if wanted > call.max_tokens else "stop"
        if index is None:
            text = (
                f"[sim] The sim world models task outcomes, not text, so there is no real reply to this prompt. "
                f"Send 'task:dev/<i>' (0 <= i < {len(w.dev_tasks)}) to sample one attempt of dev task i by "
                f"{call.model!r} alone, or use world='local' for real completions."
            )
        elif finish == "length":
            text = f"[sim] dev/{index}: not solved (truncated_output): cut off at max_tokens={call.max_tokens}."
        else:
            state = w.model_state(call.model)
            p = sigmoid(state.skill - w.dev_tasks.difficulty[index])
            p = p + state.dev_memory * (1.0 - p)
            solved = bool(w.uniforms("infer", 1)[0] < p)
            outcome = "solved" if solved else "not solved (wrong_answer)"
            text = f"[sim] dev/{index}: {outcome} by {call.model!r} alone, no harness."
        value = Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=completion, finish_reason=finish)
        seconds = INFER_LATENCY_S + completion / INFER_TOKENS_PER_SECOND
        return Billed[Completion](value=value, cost_usd=w.prices.sample_usd(prompt_tokens, completion), seconds=seconds)


@functools.lru_cache(maxsize=64)
def _split(command: str) -> tuple[tuple[str, ...], str]:
    """``(shlex.split(command), "")``, or ``((), message)`` if it does not parse. Cached: a call is
    parsed by its quote and again by its run, and ``shlex`` is slow on long commands."""
    try:
        return tuple(shlex.split(command)), ""
    except ValueError as exc:
        return (), str(exc)


class SimSandbox:
    """A tiny modelled shell over the world's datasets (``/data/<id>.jsonl``)."""

    def __init__(self, world: SimWorld):
        self.world = world

    def quote(self, call: SandboxExec) -> Quote:
        return Quote(usd=self.world.sandbox_usd(call.timeout_s), seconds=self._run(call).duration_s)

    def exec(self, call: SandboxExec) -> Billed[CommandResult]:
        result = self._run(call)
        cost = self.world.sandbox_usd(result.duration_s)
        return Billed[CommandResult](value=result, cost_usd=cost, seconds=result.duration_s)

    def _run(self, call: SandboxExec) -> CommandResult:
        """The modelled outcome of a command (no side effects); at least one sandbox second."""

        def done(stdout: str = "", stderr: str = "", code: int = 0, seconds: float = 1.0) -> CommandResult:
            return CommandResult(stdout=stdout, stderr=stderr, exit_code=code, duration_s=max(1.0, seconds))

        argv, error = _split(call.command)
        if error:
            return done(stderr=f"sim sandbox: cannot parse command: {error}\n", code=2)
        match argv:
            case [] | ["true"]:
                return done()
            case ["echo", *words]:
                return done(" ".join(words) + "\n")
            case ["sleep", seconds] if re.fullmatch(r"\d+(\.\d*)?", seconds):
                if float(seconds) > call.timeout_s:
                    message = f"sim sandbox: timed out after {call.timeout_s}s\n"
                    return done(stderr=message, code=124, seconds=call.timeout_s)
                return done(seconds=float(seconds))
            case ["ls", "/data" | "/data/"]:
                return done("".join(f"{ref}.jsonl\n" for ref in sorted(self.world.datasets)))
            case ["wc", "-l", path]:
                data = self._file(path)
                if data is None:
                    return done(stderr=f"wc: {path}: No such file or directory\n", code=1)
                return done(f"{data.n} {path}\n")
            case ["head", path] | ["head", "-n", _, path]:
                lines = int(argv[2]) if len(argv) == 4 and argv[2].isdigit() else 10
                data = self._file(path)
                if data is None:
                    return done(stderr=f"head: cannot open '{path}' for reading: No such file or directory\n", code=1)
                records = (example_record(self.world, data, i) for i in range(min(lines, data.n)))
                return done("".join(json.dumps(record) + "\n" for record in records))
        return done(stderr=SANDBOX_NOT_MODELLED, code=127)

    def _file(self, path: str) -> Dataset | None:
        match = re.fullmatch(r"/data/(.+)\.jsonl", path)
        return self.world.datasets.get(match.group(1)) if match else None


class SimEvaluation:
    """avg@k on the dev split (fresh draws) or the official split (fixed draws per world seed)."""

    def __init__(self, world: SimWorld):
        self.world = world
        self._bills: dict[tuple[bool, int, Harness | None, int], tuple[float, float, int, float]] = {}

    def _plan(self, req: EvalRequest, official: bool) -> tuple[ModelState, TaskSet, Harness | HarnessError]:
        w = self.world
        state = w.model_state(req.checkpoint)
        if req.n_tasks is not None and req.n_tasks < 1:
            raise ActionError("invalid_args", f"n_tasks must be at least 1, got {req.n_tasks}")
        tasks = w.official_tasks if official else w.dev_tasks.head(req.n_tasks or len(w.dev_tasks))
        try:
            harness: Harness | HarnessError = parse_harness(req.harness_files)
        except HarnessError as exc:
            harness = exc
        return state, tasks, harness

    def _bill(self, tasks: TaskSet, harness: Harness | HarnessError, k: int, official: bool) -> tuple[float, float, int, float]:
        """(usd, seconds, tokens, sandbox seconds) of evaluating ``tasks`` k times. A world's splits never
        change, so the bill of (split, first n tasks, harness, k) is computed once (a call is quoted, then run)."""
        key = (official, len(tasks),
               harness if isinstance(harness, Harness) else None, k)
        bill = self._bills.get(key)
        if bill is None:
            bill = self._bills[key] = self._compute_bill(tasks, harness, k)
        return bill

    def _compute_bill(self, tasks: TaskSet, harness: Harness | HarnessError, k: int) -> tuple[float, float, int, float]:
        ok = harness if isinstance(harness, Harness) else Harness()
        usd, seconds, tokens, sandbox_s = evaluation_bill(
            self.world, tasks.reply_tokens, k, ok.max_output_tokens, ok.on_truncation == "continue",
            ok.verify_before_submit, ok.check, isinstance(harness, Harness))
        return float(usd), float(seconds), int(tokens), float(sandbox_s)

    def quote(self, req: EvalRequest) -> Quote:
        _, tasks, harness = self._plan(req, req.split == "official")
        usd, seconds, *_ = self._bill(tasks, harness, req.k, req.split == "official")
        return Quote(usd=usd, seconds=seconds)

    def start(self, req: EvalRequest, job_id: str) -> Job:
        if req.split != "dev":
            raise ActionError("not_supported", "only the platform evaluates the official split (at submit)")
        billed = self._run(req, official=False)
        now = self.world.clock.now()
        meta = {"checkpoint": req.checkpoint, "harness_version": req.harness_version, "split": "dev"}
        ready_at = now + billed.seconds
        return Job(id=job_id, kind="evaluate", started_at=now, future=resolved(billed), ready_at=ready_at, meta=meta)

    def official(self, req: EvalRequest) -> Billed[EvalResult]:
        """The held-out split (``n_tasks`` is ignored): the same draws every time for a world seed."""
        return self._run(req, official=True)

    def prefetch_official(self, req: EvalRequest) -> None:
        """Nothing to start ahead: an official evaluation here is a few draws."""

    def _run(self, req: EvalRequest, official: bool) -> Billed[EvalResult]:
        w = self.world
        state, tasks, harness = self._plan(req, official)
        usd, seconds, tokens, sandbox_s = self._bill(tasks, harness, req.k, official)
        n, k = len(tasks), req.k
        split = "official" if official else "dev"
        names = list(_task_names(split, n))
        if isinstance(harness, HarnessError):
            failure = f"{HARNESS_ERROR}: {harness}"
            rewards, labels = [[0.0] * k for _ in names], [[failure] * k for _ in names]
            modes, score = {HARNESS_ERROR: n * k}, 0.0
        else:
            # the aggregate draw (EVAL_DRAWS uniforms: what SimBatch draws) heads a longer block whose rest
            # places the outcomes on tasks for the text (counter-based: the head is the same either way)
            size = EVAL_DRAWS * (1 + n * k)
            u = w.streams.at("official", 0, size) if official else w.uniforms("eval", size)
            stats = w.eval_stats(state.skill, 0.0 if official else state.dev_memory, harness, official, n)
            counts = draw_outcomes(stats, k, u[None, :EVAL_DRAWS])[0]
            label = render_attempts(stats, counts, k, u[EVAL_DRAWS:])
            labels = _LABELS[label].tolist()  # a failure mode per attempt, "" (index -1) where it succeeded
            rewards = (label < 0).astype(float).tolist()
            modes = {FAILURE_MODES[j]: int(c) for j, c in enumerate(counts[1:]) if c}
            score = int(counts[0]) / (n * k)
        # built from trusted arrays: skip re-validating hundreds of nested lists
        value = EvalResult.model_construct(
            split=split, checkpoint=req.checkpoint, harness_version=req.harness_version, k=k, score=score,
            task_ids=names, rewards=rewards, failures=labels, failure_modes=modes, tokens=tokens,
            sandbox_seconds=sandbox_s,
        )
        return Billed[EvalResult](value=value, cost_usd=usd, seconds=seconds)


def evaluation_bill(
    world: SimWorld, reply_tokens: np.ndarray, k: int, max_output_tokens: Any, cont: Any, verify: Any, check: Any,
    valid: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(usd, seconds, tokens, sandbox seconds) of evaluating tasks whose replies need ``reply_tokens`` (n,)
    k times under the harness options (``cont``: on_truncation = "continue"; ``valid`` False: harness.toml
    does not parse, and every attempt dies while loading it). With N worlds' options as (N,) arrays and
    ``reply_tokens`` (N, n), each world's bill as alone (:class:`~.batch.SimBatch`).

    >>> w = SimWorld("aime", 0)
    >>> usd, seconds, tokens, sandbox_s = evaluation_bill(w, w.dev_tasks.reply_tokens, 3, 4096, False, False, False, True)
    >>> float(usd) == w.evaluation.quote(EvalRequest(checkpoint="base", harness_version="v0",
    ...                                              harness_files=w.initial_harness(), k=3)).usd
    True
    """
    d = world.domain
    attempts = reply_tokens.shape[-1] * k
    rounds = math.ceil(attempts / world.options.eval_concurrency)
    options = (np.asarray(option)[..., None] for option in (max_output_tokens, cont, verify, check))
    prefill, sampled, time_factor = attempt_tokens(d, reply_tokens, *options)
    prefill, sampled = k * prefill.sum(axis=-1), k * sampled.sum(axis=-1)
    time_factor = np.asarray(time_factor)[..., 0]
    sandbox_s = attempts * (d.sandbox_seconds * time_factor)
    usd = world.prices.sample_usd(prefill, sampled) + world.sandbox_usd(sandbox_s)
    seconds = rounds * (d.attempt_seconds * time_factor)
    tokens = np.round(prefill + sampled).astype(np.int64)
    error_s = attempts * HARNESS_ERROR_SANDBOX_S
    valid = np.asarray(valid)
    return (np.where(valid, usd, world.sandbox_usd(error_s)), np.where(valid, seconds, rounds * HARNESS_ERROR_SANDBOX_S),
            np.where(valid, tokens, 0), np.where(valid, sandbox_s, error_s))


_LABELS = np.array([*FAILURE_MODES, ""], dtype=object)


@functools.lru_cache(maxsize=64)
def _task_names(split: str, n: int) -> tuple[str, ...]:
    return tuple(f"{split}/{i}" for i in range(n))


def from_scenario(scenario: Any, seed: int, run_dir: Any = None) -> SimWorld:
    """The registry's factory: the scenario's benchmark, sandbox size and world options."""
    sandbox = scenario.permissions.sandbox
    return SimWorld(scenario.benchmark, seed, vcpus=sandbox.vcpus, memory_gib=sandbox.memory_gib,
                    options=scenario.world_options)
