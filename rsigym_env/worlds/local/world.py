"""``LocalWorld``: the five services, real and small, on this machine (see ``docs/local-world.md``).

The shared services of :mod:`rsigym_env.worlds.common`, wired to this machine's back ends:

* train      → :class:`~..common.train.TinkerTrainService` over :class:`~.lm.tinker_client.LocalServiceClient`
* infer      → :class:`~..common.inference.ChatInferenceService`: the ``openai`` client →
  :class:`~rsigym_env.serving.OpenAIServer` → the checkpoint
* generate_data → :class:`~..common.rollout.RolloutService` with :class:`~.teachers.LocalTeachers` (the same server)
* transform_data, sandbox_exec → :class:`~.sandbox.service.LocalSandboxService`: the ``e2b`` SDK → the local envd
  server → bubblewrap
* evaluate, official → :class:`~.harbor.evaluation.LocalEvalService`: Harbor's ``Job`` over the benchmark's task
  directories, trials in bubblewrap

Time is wall time: jobs run in worker threads and ``wait`` blocks until one finishes.

>>> LocalOptions().eval_concurrency, LocalOptions(lr_scale=3).lr_scale
(3, 3.0)
>>> from rsigym_env.scenario import load_scenario
>>> world = LocalWorld(load_scenario("local-joint-aime"), seed=0)   # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rsigym_env.errors import ActionError
from rsigym_env.home import cache_dir
from rsigym_env.numerics import CORE_ENV, blas_core, blas_core_is_pinned, canary_digest, check_arithmetic
from rsigym_env.prices import DEFAULT_PRICES, PriceList, TeacherPrice
from rsigym_env.scenario import Scenario
from rsigym_env.serving import ModelRegistry, OpenAIServer
from rsigym_env.splits import SplitMode, official_split

from ..common.datasets import DatasetStore
from ..common.inference import ChatInferenceService
from ..common.jobs import WallClock
from ..common.rollout import RolloutService
from ..common.train import TinkerTrainService
from ..common.world import ServiceWorld
from .lm.inference_pool import InferencePool
from .teachers import CONTEXT_TOKENS

log = logging.getLogger("rsigym_env.local")

BASE_MODEL = "rsigym-base"
INFER_TOKENS_PER_SECOND = 1500.0   # for quotes only; actual time is measured
PROMPT_OVERHEAD = 8                # the chat format's tokens around a one-message prompt (bytes are tokens)


class LocalOptions(BaseModel):
    """``world_options`` of a local-world scenario."""

    model_config = ConfigDict(extra="forbid")

    base_model: str = Field(BASE_MODEL, description="A registered base model (tinker_client.register_base_model), "
                                                    "e.g. a test's tiny one.")
    eval_concurrency: int = Field(3, ge=1, description="Trials at once in an evaluation (3 measured fastest on 2 cores).")
    spare_trials: int = Field(0, ge=0, description="Trials an evaluation may run beyond eval_concurrency while the "
                                                   "machine has idle cores (idle.SpareCores); none on a busy one. The "
                                                   "same results either way. Off by default: 2 gave no measurable "
                                                   "gain on a quiet 2-core machine (bench/README.md).")
    lr_scale: float = Field(10.0, gt=0, description="Learning rates are scaled by this (see docs/local-world.md).")
    official_split: SplitMode = Field(
        "secret", description="secret: drawn from the platform's secret (rsigym_env.splits); public: reproducible.")
    sampling_workers: int = Field(2, ge=0, description="Processes sampling the policy model (0: in this process).")
    training_process: bool | None = Field(
        None, description="Train in a process of its own (lm/train_worker), apart from the evaluations' GIL; the "
                          "checkpoints are the same either way. None (default): only when this process computes "
                          "with other OpenBLAS kernels than the pinned ones (rsigym_env.numerics: NumPy was loaded "
                          "before rsigym_env); otherwise in process, which on 2 cores measured no slower.")
    early_official: bool = Field(True, description="Start the initial system's official evaluation when an episode "
                                                   "starts, beside it (every episode's reward needs it and nothing "
                                                   "the researcher does changes it), so submit waits only for the "
                                                   "submission's own. The same evaluation either way.")


def local_prices(teachers: dict[str, TeacherPrice]) -> PriceList:
    """The target model billed at Tinker's Qwen3.5-35B-A3B rates (it stands in for it), the local teachers' rates."""
    return PriceList(model=BASE_MODEL, model_price=DEFAULT_PRICES.model_price, teachers=teachers,
                     sandbox=DEFAULT_PRICES.sandbox,
                     source="local world: target at Tinker's Qwen3.5-35B-A3B-Base rates, local teachers, E2B rates")


class LocalWorld(ServiceWorld):
    """One benchmark's local world for one run. ``run_dir`` keeps every artifact; ``close()`` stops the servers."""

    name = "local"

    def __init__(self, scenario: Scenario, seed: int, run_dir: Path | None = None):
        from . import benchmarks, teachers

        check_arithmetic()  # once a process: warns where the last bits would differ from other machines'
        self.scenario = scenario
        self.seed = seed
        self.options = LocalOptions.model_validate(scenario.world_options)
        self.base_model = self.options.base_model
        self.benchmark = benchmarks.resolve(scenario.benchmark)
        self.keep_files(run_dir, prefix="rsigym-local-", job_threads=2)
        self.clock = WallClock()
        self.prices = local_prices(teachers.TEACHER_PRICES)
        sandbox = scenario.permissions.sandbox
        self.vcpus, self.memory_gib = sandbox.vcpus, sandbox.memory_gib
        self.split = official_split(self.options.official_split)  # secret: this episode's own draw
        self.official_split = self.split.info  # recorded in every result: which held-out split it was scored on
        # the policy model samples in worker processes: evaluations then use every core. As many as this world's
        # start (one core busy) leaves cores idle start now, importing NumPy and the model meanwhile; the others at
        # the first request (started now too, on 2 cores, they slowed this start by ~0.4 s: bench/README.md round 9)
        workers = self.options.sampling_workers
        self.sampling = InferencePool(self.run_dir / "tinker", workers=workers) if workers > 0 else None
        if self.sampling is not None and self.sampling.poolable(self.base_model):
            self.sampling.start(max(1, (os.cpu_count() or 2) - 1))
        try:
            self._start_services(scenario, seed, sandbox)
        except BaseException:
            if self.sampling is not None:
                self.sampling.close()
            raise

    def _start_services(self, scenario: Scenario, seed: int, sandbox: Any) -> None:
        from openai import OpenAI  # (here: ~0.35 s of imports, after the sampling workers have started)

        from . import teachers
        from .harbor.evaluation import LocalEvalService
        from .lm.tinker_client import LocalServiceClient
        from .sandbox.service import LocalSandboxService

        self.tasks = self._build_tasks()
        self.tinker = LocalServiceClient(root_dir=self.run_dir / "tinker")
        self.registry = ModelRegistry()
        self._identities: dict[str, str | None] = {}  # checkpoint id -> what its weights are (caching)
        self.store = DatasetStore(self.run_dir / "datasets")
        self.train = TinkerTrainService(client=self.tinker, store=self.store, prices=self.prices, pool=self.pool,
                                        clock=self.clock.now, base_model=self.base_model, seed=seed,
                                        on_checkpoint=self._register, lr_scale=self.options.lr_scale,
                                        runner=self._training_process())
        self._register("base", None)
        for name in scenario.permissions.teachers:
            if name in teachers.TEACHERS:
                self.registry.add(name, teachers.TEACHERS[name]())
        self.server = OpenAIServer(self.registry).start()   # loopback TCP, for the platform side only
        self.client = OpenAI(base_url=self.server.base_url, api_key="local", max_retries=0, timeout=600)

        self.sandbox = LocalSandboxService(self.run_dir, network=sandbox.network, prices=self.prices,
                                           vcpus=self.vcpus, memory_gib=self.memory_gib, processes=sandbox.processes,
                                           disk_mb=max(16, int(sandbox.disk_gib * 1024)))
        self.rollout = RolloutService(teachers=teachers.LocalTeachers(client=self.client, registry=self.registry,
                                                                      benchmark=self.benchmark),
                                      sandbox=self.sandbox, store=self.store, prices=self.prices, seed=seed)
        self.inference = ChatInferenceService(client=self.client, model_for=self.chat_model, prices=self.prices,
                                              seed=seed, context_tokens=CONTEXT_TOKENS, prompt_overhead=PROMPT_OVERHEAD,
                                              tokens_per_second=INFER_TOKENS_PER_SECOND)
        self.evaluation = LocalEvalService(
            model_for=self.chat_model, tasks=self.tasks, run_dir=self.run_dir / "evals", prices=self.prices,
            seed=seed, server=self.server, vcpus=self.vcpus, memory_gib=self.memory_gib, clock=self.clock.now,
            concurrency=self.options.eval_concurrency, seed_key=self.split.key("trial-seeds"),
            cache_dir=cache_dir("evaluations"), model_identity=self._model_identity,
            prefetch=self.options.early_official, cache_official=self.split.fixed,
            spare_trials=self.options.spare_trials)

    def _build_tasks(self) -> dict[str, Path]:
        """The task directories: dev (public, the same in every episode) from the shared cache; the official
        split from the cache when its draw is fixed, else (an episode's own draw) in a private directory of
        this world's, outside every sandbox and gone when the world closes (its answers are worth nothing
        later, and a shared cache would only collect them)."""
        cache = tasks_cache()
        root = cache
        if not self.split.fixed:
            self._official_dir = Path(tempfile.mkdtemp(prefix="rsigym-ot-"))  # mode 0700
            root = self._official_dir
        return {"dev": self.benchmark.build(cache, splits=("dev",))["dev"],
                "official": self.benchmark.build(root, self.split, splits=("official",))["official"]}

    def _training_process(self) -> Any:
        """Where training jobs run: a process of their own when the base model loads there (see ``train_worker``)."""
        from .lm.tinker_client import loadable_elsewhere
        from .lm.train_worker import TrainingProcess

        wanted = self.options.training_process
        if wanted is None:
            wanted = not blas_core_is_pinned()
            if wanted:
                log.warning("NumPy was loaded with other OpenBLAS kernels (%s) than the pinned ones (%s) before "
                            "rsigym_env was imported: training runs in a process of its own, with the pinned ones, so "
                            "its checkpoints are those of every other machine", blas_core(), os.environ.get(CORE_ENV))
        if wanted and loadable_elsewhere(self.base_model):
            return TrainingProcess(self.run_dir / "tinker")
        return None

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

        # the weights, and the kernels the sampling workers compute with (rsigym_env.numerics)
        # (a BLAS that does not sum as the pinned kernels do elsewhere is named by its canary's digest too)
        blas = os.environ.get(CORE_ENV, "native")
        if check_arithmetic() is False:
            blas += f":{canary_digest()}"
        base = f"{BASE_MODEL}:{manifest()['sha256']['weights.npz']}:blas={blas}"
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

    def close_extras(self) -> None:
        """Stop the model server, the sampling workers and the Tinker-shaped client."""
        if getattr(self, "server", None) is not None:
            self.server.stop()
        if getattr(self, "sampling", None) is not None:
            self.sampling.close()
        self.tinker.close("success") if hasattr(self.tinker, "close") else None
        if getattr(self, "_official_dir", None) is not None:
            shutil.rmtree(self._official_dir, ignore_errors=True)

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


def tasks_cache() -> Path:
    """Where generated task directories are kept (``$RSIGYM_HOME/cache/tasks``, default
    ``~/.cache/rsigym/tasks``: :func:`rsigym_env.home.cache_dir`)."""
    return cache_dir("tasks")


def from_scenario(scenario: Scenario, seed: int, run_dir: Path | None = None) -> LocalWorld:
    """The registry's factory (``rsigym_env.worlds.WORLDS``)."""
    return LocalWorld(scenario, seed, run_dir)
