"""``LocalWorld``: the five services, real and small, on this machine (see ``docs/local-world.md``).

* train      → :func:`~.training.run_supervised` over :class:`~.tinker_client.LocalServiceClient`
* infer      → the ``openai`` client → :class:`~rsigym_env.serving.OpenAIServer` → the checkpoint
* generate_data → the ``openai`` client → the same server → a teacher model
* transform_data, sandbox_exec → the ``e2b`` SDK → the local envd server → bubblewrap
* evaluate, official → Harbor's ``Job`` over the benchmark's task directories (:mod:`.evaluation`)

Time is wall time: jobs run in worker threads and ``wait`` blocks until one finishes.

>>> from rsigym_env.scenario import load_scenario
>>> world = LocalWorld(load_scenario("local-joint-aime"), seed=0)   # doctest: +SKIP
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from openai import OpenAI

from rsigym_env.errors import ActionError, WorkFailed
from rsigym_env.prices import DEFAULT_PRICES, PriceList, TeacherPrice
from rsigym_env.scenario import Scenario
from rsigym_env.serving import ModelRegistry, OpenAIServer
from rsigym_env.home import cache_dir
from rsigym_env.splits import official_split
from rsigym_env.services import Billed, Completion, DatasetInfo, Job, Quote, TrainResult, progress_reporter
from rsigym_env.tools import GenerateData, Infer, Train, TransformData

from ..common.datasets import DatasetStore, count_tokens
from .lm.inference_pool import InferencePool

BASE_MODEL = "rsigym-base"
CONTEXT_TOKENS = 512
INFER_TOKENS_PER_SECOND = 1500.0   # for quotes only; actual time is measured
TRAIN_TOKENS_PER_SECOND = 4000.0
TRANSFORM_TIMEOUT_S = 60.0
CANCEL_WAIT_S = 30.0   # how long a cancelled job may take to stop (one training step, one trial)
DEMO_WORKERS = 3       # teacher demonstrations at once (they mostly wait on the teacher server and on processes)


class JobCancelled(Exception):
    """A job stopped because it was cancelled (the run ended, was reset or closed)."""
LOCAL_OPTIONS: dict[str, Any] = {
    "base_model": BASE_MODEL,   # a registered base model (tinker_client.register_base_model), e.g. a test's tiny one
    "eval_concurrency": 3,      # trials at once in an evaluation (3 measured fastest on 2 cores)
    "lr_scale": 10.0,           # learning rates are scaled by this (see LocalTrain)
    "official_split": "secret",  # "secret": drawn from the platform's secret (rsigym_env.splits); "public": reproducible
    "sampling_workers": 2,      # processes sampling the policy model (0: in this process)
}


class WallClock:
    """Seconds since the world started; ``wait`` blocks on the jobs' futures.

    >>> clock = WallClock(); clock.now() < 1.0
    True
    """

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def spend(self, seconds: float) -> None:
        """Wall time has already passed."""

    def wait(self, jobs: Sequence[Job], deadline: float) -> Job | None:
        by_future = {job.future: job for job in jobs}
        for job in jobs:
            if job.future.done():
                return job
        done, _ = cf.wait(list(by_future), timeout=max(0.0, deadline - self.now()), return_when=cf.FIRST_COMPLETED)
        return next((job for job in jobs if job.future in done), None)


def local_prices(teachers: dict[str, TeacherPrice]) -> PriceList:
    """The target model billed at Tinker's Qwen3.5-35B-A3B rates (it stands in for it), the local teachers' rates."""
    return PriceList(model=BASE_MODEL, model_price=DEFAULT_PRICES.model_price, teachers=teachers,
                     sandbox=DEFAULT_PRICES.sandbox,
                     source="local world: target at Tinker's Qwen3.5-35B-A3B-Base rates, local teachers, E2B rates")


class LocalWorld:
    """One benchmark's local world for one run. ``run_dir`` keeps every artifact; ``close()`` stops the servers."""

    name = "local"

    def __init__(self, scenario: Scenario, seed: int, run_dir: Path | None = None):
        from . import benchmarks, teachers
        from .harbor.evaluation import LocalEvalService
        from .sandbox.service import LocalSandboxService
        from .lm.tinker_client import LocalServiceClient

        self.scenario = scenario
        self.seed = seed
        unknown = set(scenario.world_options) - set(LOCAL_OPTIONS)
        if unknown:
            raise ValueError(f"unknown local-world options {sorted(unknown)}; options: {', '.join(LOCAL_OPTIONS)}")
        self.options = {**LOCAL_OPTIONS, **scenario.world_options}
        self.base_model = str(self.options["base_model"])
        self.benchmark = benchmarks.resolve(scenario.benchmark)
        self._own_dir = run_dir is None
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="rsigym-local-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.clock = WallClock()
        self.prices = local_prices(teachers.TEACHER_PRICES)
        sandbox = scenario.permissions.sandbox
        self.vcpus, self.memory_gib = sandbox.vcpus, sandbox.memory_gib
        self.split = official_split(self.options["official_split"])
        self.official_split = self.split.info  # recorded in every result: which held-out split it was scored on
        self.tasks = self.benchmark.build(tasks_cache(), self.split)
        self.tinker = LocalServiceClient(root_dir=self.run_dir / "tinker")
        # the policy model samples in worker processes: evaluations then use every core
        workers = int(self.options["sampling_workers"])
        self.sampling = InferencePool(self.run_dir / "tinker", workers=workers) if workers > 0 else None
        self.registry = ModelRegistry()
        self.checkpoints: dict[str, str] = {}        # checkpoint id -> tinker sampler path
        self.states: dict[str, str] = {}             # checkpoint id -> tinker state path
        self._identities: dict[str, str | None] = {}  # checkpoint id -> what its weights are (caching)
        self._register("base", None)
        for name in scenario.permissions.teachers:
            if name in teachers.TEACHERS:
                self.registry.add(name, teachers.TEACHERS[name]())
        self.server = OpenAIServer(self.registry).start()   # loopback TCP, for the platform side only
        self.client = OpenAI(base_url=self.server.base_url, api_key="local", max_retries=0, timeout=600)
        self.store = DatasetStore(self.run_dir / "datasets")
        self._pool = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="rsigym-local-job")

        self.rollout = LocalRollout(self)
        self.train = LocalTrain(self)
        self.inference = LocalInference(self)
        self.sandbox = LocalSandboxService(self.run_dir, network=sandbox.network, prices=self.prices,
                                           vcpus=self.vcpus, memory_gib=self.memory_gib, processes=sandbox.processes,
                                           disk_mb=max(16, int(sandbox.disk_gib * 1024)))
        self.evaluation = LocalEvalService(
            model_for=self.chat_model, tasks=self.tasks, run_dir=self.run_dir / "evals", prices=self.prices,
            seed=seed, server=self.server, vcpus=self.vcpus, memory_gib=self.memory_gib, clock=self.clock.now,
            concurrency=int(self.options["eval_concurrency"]), seed_key=self.split.key("trial-seeds"),
            cache_dir=cache_dir("evaluations"), model_identity=self._model_identity)

    # ---- models ---------------------------------------------------------------------------------

    def _register(self, checkpoint: str, sampler_path: str | None) -> None:
        from .lm.chat import register_base, register_checkpoint

        pool = self.sampling
        if sampler_path is None:
            register_base(self.registry, self.tinker, self.base_model, name=checkpoint, replace=True, pool=pool)
        else:
            register_checkpoint(self.registry, self.tinker, sampler_path, name=checkpoint, replace=True, pool=pool)

    def _model_identity(self, checkpoint: str) -> str | None:
        """What a checkpoint's weights are, for caching its evaluations by content: the shipped base
        model by its manifest's hash, a checkpoint trained from it by the hash of its sampler weights'
        arrays (test models and anything unreadable: None, evaluated every time)."""
        if self.base_model != BASE_MODEL:
            return None
        from .lm.base import manifest

        base = f"{BASE_MODEL}:{manifest()['sha256']['weights.npz']}"
        if checkpoint == "base":
            return base
        path = self.checkpoints.get(checkpoint)
        if path is None:
            return None
        if checkpoint not in self._identities:
            from .lm.tinker_client import weights_identity

            self._identities[checkpoint] = weights_identity(self.tinker.checkpoint_dir(path), base)
        return self._identities[checkpoint]

    def chat_model(self, checkpoint: str) -> Any:
        """The servable model behind a checkpoint id ('base' or 'ckpt-N')."""
        model = self.registry.get(checkpoint)
        if model is None:
            raise ActionError("unknown_ref", f"no checkpoint {checkpoint!r}; checkpoints: {', '.join(['base', *self.checkpoints])}")
        return model

    # ---- the initial system -----------------------------------------------------------------------

    def initial_harness(self) -> dict[str, str]:
        from ..common.harness import minimal_harness

        return minimal_harness()

    def describe(self) -> str:
        b = self.benchmark
        return (
            f"local world: {b.name} (mirrors {b.paper_id}; {b.domain}). {b.description}\n"
            "Everything is real and small: a NumPy transformer (base checkpoint rsigym-base) trained with LoRA "
            "through a Tinker-shaped client, served by an OpenAI-compatible server; the harness runs inside a "
            "bubblewrap sandbox and reaches only the model; Harbor runs the tasks and their hidden tests.\n"
            f"Teachers: {', '.join(t for t in self.scenario.permissions.teachers if t in self.prices.teachers)}. "
            "Read harness:latest/agent.py and harness.toml for what the harness does."
        )

    def close(self) -> None:
        """Stop the servers and workers; remove the run directory if the world made it. Safe to call twice."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for part in ("sandbox", "evaluation"):
            closer = getattr(getattr(self, part, None), "close", None)
            if closer is not None:
                closer()
        if getattr(self, "server", None) is not None:
            self.server.stop()
        if getattr(self, "sampling", None) is not None:
            self.sampling.close()
        self.tinker.close("success") if hasattr(self.tinker, "close") else None
        if self._own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # ---- artifacts the researcher can read ---------------------------------------------------------

    def read(self, ref: str) -> str | None:
        """World artifacts: ``job-N/<task>`` (every attempt's trajectory in a dev evaluation) or
        ``job-N/<task>/<attempt>``; ``ds-N`` rows are in ``read ds-N:rows``. ``None`` if ``ref`` is not one."""
        parts = ref.split("/")
        if len(parts) in (2, 3) and parts[0].startswith("job-"):
            return self._trajectories(*parts)
        if ref.endswith(":rows") and ref[:-5] in self.store:
            n = self.store.meta(ref[:-5]).info.n_examples
            return "\n".join(self.store.head(ref[:-5], 20)) + (f"\n... {n - 20} more" if n > 20 else "")
        return None

    def _trajectories(self, job: str, task: str, attempt: str | None = None) -> str:
        summary_path = self.run_dir / "evals" / job / "summary.json"
        if not summary_path.is_file():
            raise ActionError("unknown_ref", f"read: {job} is not a finished dev evaluation of this run")
        if (summary_path.parent / "PRUNED").exists():
            raise ActionError("unknown_ref", f"read: the trial logs of {job} were deleted to keep the run's "
                                             f"evaluation logs under their quota (read {job} has every score)")
        summary = json.loads(summary_path.read_text())
        trials = [t for t in summary.get("trials", []) if t["task"] == task
                  and (attempt is None or str(t["attempt"]) == attempt)]
        if not trials:
            tasks = sorted({t["task"] for t in summary.get("trials", [])})
            raise ActionError("unknown_ref", f"read: no {task!r}{'/' + attempt if attempt else ''} in {job}; "
                                             f"tasks: {', '.join(tasks[:30])}")
        out = []
        for t in trials:
            out.append(f"== {job}/{task} attempt {t['attempt']}: reward {t['reward']:g}"
                       f"{' (' + t['failure'] + ')' if t['failure'] else ''}")
            trajectory = self.run_dir / "evals" / job / t["dir"] / "agent" / "harness-trajectory.json"
            try:
                data = json.loads(trajectory.read_text())
            except (OSError, ValueError):
                out.append("(no trajectory: the harness wrote none)")
                continue
            for message in data.get("messages", []):
                out.append(f"{message.get('role', '?')}: {message.get('content', '')}")
            out.append(f"end: {data.get('end_reason')}")
        return "\n".join(out)

    # ---- datasets -------------------------------------------------------------------------------

    def dataset_path(self, ref: str) -> Path:
        return self.store.path(ref)

    def save_dataset(self, dataset_id: str, rows: list[dict[str, Any]], origin: str) -> DatasetInfo:
        return self.store.save_rows(dataset_id, rows, origin)


def tasks_cache() -> Path:
    """Where generated task directories are kept (``$RSIGYM_HOME/cache/tasks``, default
    ``~/.cache/rsigym/tasks``: :func:`rsigym_env.home.cache_dir`)."""
    return cache_dir("tasks")


class LocalRollout:
    """Teacher data through the OpenAI-compatible server; transforms in the sandbox."""

    def __init__(self, world: LocalWorld):
        self.world = world

    def _teacher(self, call: GenerateData) -> None:
        w = self.world
        if call.teacher not in w.prices.teachers or w.registry.get(call.teacher) is None:
            known = ", ".join(t for t in w.prices.teachers if w.registry.get(t) is not None)
            raise ActionError("unknown_ref", f"no teacher {call.teacher!r} in this world; teachers: {known}")
        if call.source != "synthetic":
            raise ActionError("not_supported", "the local world's teachers answer synthetic prompts only "
                                               "(source='dev' would leak the dev split into training data)")

    def quote_generate(self, call: GenerateData) -> Quote:
        self._teacher(call)
        turns = self.world.benchmark.max_turns
        cap = min(call.max_tokens_per_example, CONTEXT_TOKENS)
        usd = self.world.prices.teacher_usd(call.teacher, call.n_examples * turns * CONTEXT_TOKENS, call.n_examples * cap)
        return Quote(usd=usd, seconds=call.n_examples * 0.01)

    def generate(self, call: GenerateData, dataset_id: str) -> Billed[DatasetInfo]:
        from .teachers import demonstrate

        self._teacher(call)
        w = self.world
        start = time.monotonic()
        stream = int(hashlib.sha256(f"{w.seed}/{dataset_id}".encode()).hexdigest()[:8], 16)
        problems = w.benchmark.synthetic(call.n_examples, seed=stream)
        rows, usage = [], [0, 0]
        report = progress_reporter()

        def one(i: int) -> Any:
            return demonstrate(w.client, call.teacher, problems[i], seed=stream + i,
                               max_tokens=call.max_tokens_per_example, check=True)

        try:  # demonstrations side by side (their commands and checks wait on processes), kept in order
            with cf.ThreadPoolExecutor(max_workers=DEMO_WORKERS, thread_name_prefix="rsigym-demo") as pool:
                for i, demo in enumerate(pool.map(one, range(len(problems)))):
                    usage[0] += demo.prompt_tokens
                    usage[1] += demo.completion_tokens
                    report(w.prices.teacher_usd(call.teacher, *usage))
                    rows.append({"messages": demo.messages,
                                 "meta": {"problem": problems[i].id, "teacher": call.teacher, "passed": bool(demo.passed)}})
            info = w.save_dataset(dataset_id, rows, f"{call.teacher} x {call.n_examples} (synthetic)")
        except Exception as exc:  # the tokens served so far were used: bill them
            code = exc.code if isinstance(exc, ActionError) else "service_error"
            raise WorkFailed(code, f"generate_data stopped after {len(rows)} of {call.n_examples} examples: "
                                   f"{getattr(exc, 'message', None) or f'{type(exc).__name__}: {exc}'}",
                             cost_usd=w.prices.teacher_usd(call.teacher, *usage),
                             seconds=time.monotonic() - start) from exc
        cost = w.prices.teacher_usd(call.teacher, *usage)
        return Billed[DatasetInfo](value=info, cost_usd=cost, seconds=time.monotonic() - start)

    def quote_transform(self, call: TransformData) -> Quote:
        for ref in call.datasets:
            self.world.dataset_path(ref)
        return self.world.sandbox.quote_script(TRANSFORM_TIMEOUT_S)

    def transform(self, call: TransformData, dataset_id: str) -> Billed[DatasetInfo]:
        w = self.world
        if call.operation == "script" and not (call.script or "").strip():
            raise ActionError("invalid_args", "transform_data: operation 'script' needs a shell command in `script` "
                                              "that reads /data/in_*.jsonl and writes /data/out.jsonl")
        inputs: dict[str, bytes | str | Path] = {f"/data/in_{i}.jsonl": w.dataset_path(ref)
                                                 for i, ref in enumerate(call.datasets)}
        inputs["/app/transform.py"] = TRANSFORM_PY
        command = call.script if call.operation == "script" else f"python3 /app/transform.py {call.operation}"
        staging = w.store.staging(dataset_id)
        job = w.sandbox.run_script(command, inputs, timeout_s=TRANSFORM_TIMEOUT_S, save={OUT_JSONL: staging},
                                   max_save_bytes=w.store.room())

        def failed(code: str, why: str) -> WorkFailed:  # the script ran: its sandbox time is billed all the same
            staging.unlink(missing_ok=True)
            return WorkFailed(code, f"transform_data {call.operation}: {why}", cost_usd=job.cost_usd, seconds=job.seconds)

        if job.result.exit_code != 0:
            raise failed("script_failed", f"exit {job.result.exit_code}; "
                                          f"{(job.result.stderr or job.result.stdout or '')[-400:]}")
        if OUT_JSONL in job.refused:
            raise failed("dataset_too_large" if "bytes" in job.refused[OUT_JSONL] else "script_failed",
                         job.refused[OUT_JSONL])
        if OUT_JSONL not in job.saved:
            raise failed("script_failed", f"no {OUT_JSONL} written")
        try:
            info = w.store.ingest(dataset_id, staging, f"{call.operation}({', '.join(call.datasets)})")
        except ActionError as err:
            raise failed(err.code, err.message) from None
        return Billed[DatasetInfo](value=info, cost_usd=job.cost_usd, seconds=job.seconds)


OUT_JSONL = "/data/out.jsonl"
TRANSFORM_PY = '''\
"""filter | dedupe | mix over /data/in_*.jsonl -> /data/out.jsonl (runs inside the sandbox)."""
import glob, json, sys
op = sys.argv[1]
rows = [json.loads(l) for f in sorted(glob.glob("/data/in_*.jsonl")) for l in open(f) if l.strip()]
if op == "filter":
    rows = [r for r in rows if r.get("meta", {}).get("passed")]
elif op == "dedupe":
    seen, kept = set(), []
    for r in rows:
        key = json.dumps(r["messages"], sort_keys=True)
        if key not in seen:
            seen.add(key); kept.append(r)
    rows = kept
with open("/data/out.jsonl", "w") as out:
    for r in rows:
        out.write(json.dumps(r, sort_keys=True) + "\\n")
print(f"{op}: {len(rows)} rows")
'''


class LocalTrain:
    """LoRA fine-tuning through the supervised loop, in a worker thread.

    The researcher's learning rate is multiplied by the world option ``lr_scale`` (default 10): a
    2 M-parameter model needs about ten times the LoRA learning rate of a 35 B one to move as much,
    and scaling keeps the tool's meaning the same in every world (3e-4, Tinker's usual LoRA rate and
    the Data track's lock, is a sensible update here too; 1e-2 is as violent as it sounds).
    """

    def __init__(self, world: LocalWorld):
        self.world = world

    def _tokens(self, call: Train) -> int:
        """Billed tokens of the whole run, from the dataset's recorded statistics (nothing is read)."""
        w = self.world
        meta = w.store.meta(call.dataset)
        if meta.info.n_examples == 0:
            raise ActionError("invalid_args", f"dataset {call.dataset!r} is empty")
        if call.base != "base" and call.base not in w.states:
            raise ActionError("unknown_ref", f"no finished checkpoint {call.base!r} to continue from")
        return meta.train_tokens_per_epoch * call.num_epochs

    def quote(self, call: Train) -> Quote:
        tokens = self._tokens(call)
        return Quote(usd=self.world.prices.train_usd(tokens), seconds=tokens / TRAIN_TOKENS_PER_SECOND + 2.0)

    def start(self, call: Train, job_id: str, checkpoint_id: str) -> Job:
        from ..common.training import SupervisedConfig, run_supervised

        w = self.world
        self._tokens(call)
        config = SupervisedConfig(
            base_model=w.base_model, learning_rate=call.learning_rate * float(w.options["lr_scale"]),
            lr_schedule=call.lr_schedule, num_epochs=call.num_epochs, batch_size=call.batch_size, lora_rank=call.lora_rank,
            seed=w.seed, load_checkpoint_path=w.states.get(call.base) if call.base != "base" else None,
            checkpoint_name=checkpoint_id)
        path = w.dataset_path(call.dataset)
        stop, done_tokens = threading.Event(), [0]
        report = progress_reporter()

        def on_step(metrics: Any) -> None:  # progress, and where a cancelled job stops
            done_tokens[0] += metrics.num_tokens
            report(w.prices.train_usd(done_tokens[0]))
            if stop.is_set():
                raise JobCancelled(f"{job_id} was cancelled after {done_tokens[0]:,} trained tokens")

        def run() -> Billed[TrainResult]:
            result = run_supervised(w.tinker, config, path, on_step=on_step)
            w.checkpoints[checkpoint_id] = result.sampler_path
            if result.state_path:
                w.states[checkpoint_id] = result.state_path
            w._register(checkpoint_id, result.sampler_path)
            value = TrainResult(checkpoint=checkpoint_id, steps=len(result.steps), tokens=result.billable_tokens,
                                loss_curve=result.loss_curve, config=call.model_dump())
            return Billed[TrainResult](value=value, cost_usd=w.prices.train_usd(result.billable_tokens),
                                       seconds=result.wall_seconds)

        meta = {"checkpoint": checkpoint_id, "dataset": call.dataset, "base": call.base}
        future = w._pool.submit(run)

        def cancel() -> float:
            """Stop after the current step; the trained tokens so far are what it cost."""
            stop.set()
            cf.wait([future], timeout=CANCEL_WAIT_S)
            return w.prices.train_usd(done_tokens[0])

        return Job(id=job_id, kind="train", started_at=w.clock.now(), future=future, meta=meta, cancel=cancel)


class LocalInference:
    """One chat completion from a checkpoint, through the ``openai`` client."""

    def __init__(self, world: LocalWorld):
        self.world = world

    def quote(self, call: Infer) -> Quote:
        self.world.chat_model(call.model)
        prompt = count_tokens(call.prompt) + 8
        if prompt >= CONTEXT_TOKENS:
            raise ActionError("invalid_args", f"infer: the prompt is {prompt} tokens; the model's context is "
                                              f"{CONTEXT_TOKENS} tokens (bytes)")
        completion = min(call.max_tokens, CONTEXT_TOKENS - prompt)
        return Quote(usd=self.world.prices.sample_usd(prompt, completion), seconds=completion / INFER_TOKENS_PER_SECOND)

    def complete(self, call: Infer) -> Billed[Completion]:
        w = self.world
        quote = self.quote(call)
        start = time.monotonic()
        max_tokens = max(1, min(call.max_tokens, CONTEXT_TOKENS - count_tokens(call.prompt) - 8))
        reply = w.client.chat.completions.create(
            model=call.model, messages=[{"role": "user", "content": call.prompt}], max_tokens=max_tokens,
            seed=w.seed, temperature=0.7)
        choice, usage = reply.choices[0], reply.usage
        value = Completion(text=choice.message.content or "", prompt_tokens=usage.prompt_tokens,
                           completion_tokens=usage.completion_tokens,
                           finish_reason="length" if choice.finish_reason == "length" else "stop")
        cost = min(quote.usd, w.prices.sample_usd(usage.prompt_tokens, usage.completion_tokens))
        return Billed[Completion](value=value, cost_usd=cost, seconds=time.monotonic() - start)


def from_scenario(scenario: Scenario, seed: int, run_dir: Path | None = None) -> LocalWorld:
    """The registry's factory (``rsigym_env.worlds.WORLDS``)."""
    return LocalWorld(scenario, seed, run_dir)
