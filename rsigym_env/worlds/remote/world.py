"""``RemoteWorld``: the five services on real providers: the shared services of :mod:`rsigym_env.worlds.common`
wired to remote back ends.

========== ======================================================================================
service    how
========== ======================================================================================
train      :class:`~..common.train.TinkerTrainService` (``run_supervised``) over ``tinker.ServiceClient``
           (``TINKER_API_KEY``, ``TINKER_BASE_URL``); ``tinker://`` checkpoints, the model's own chat template
infer      :class:`~..common.inference.ChatInferenceService` over Tinker's OpenAI-compatible endpoint (or the
           scenario's), the base model by its Tinker id, a checkpoint by its sampler path
rollout    :class:`~..common.rollout.RolloutService` with :class:`~.teachers.CatalogTeachers` (catalog
           teachers over OpenAI-compatible endpoints); transforms in E2B
sandbox    :class:`~.sandbox.RemoteSandboxService` (the shared e2b-SDK service, E2B's cloud as back end)
evaluate   :class:`~.evaluation.RemoteEvalService` (the shared Harbor service, a Harbor environment type, the
           model behind a metering proxy at ``RSIGYM_MODEL_URL``)
========== ======================================================================================

Credentials are checked first: a missing variable raises
:class:`~.errors.MissingCredentials` naming it, before any client is made or anything spent.
``rsigym run --world remote --dry-run`` reports every check without spending (:mod:`.dryrun`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from ...errors import ActionError
from ...prices import TeacherPrice
from ...scenario import Scenario
from ...splits import official_split
from ..common.datasets import DatasetStore
from ..common.inference import ChatInferenceService
from ..common.jobs import WallClock
from ..common.rollout import RolloutService
from ..common.train import TinkerTrainService
from ..common.world import ServiceWorld
from .clients import ForwardingChatModel, Route, RoutedClient, openai_completions
from .config import BENCHMARKS, RemoteBenchmark, RemoteOptions, required_credentials
from .errors import MissingCredentials
from .pricing import context_tokens, load_tinker_models, remote_prices


def teacher_prices(options: RemoteOptions, allowed: list[str]) -> dict[str, TeacherPrice]:
    """The catalog's prices of the teachers the scenario allows."""
    return {n: TeacherPrice(input=options.teachers[n].input, output=options.teachers[n].output)
            for n in allowed if n in options.teachers}


PROMPT_OVERHEAD = 64   # tokens of chat framing per request, for quotes
TINKER_CLOSE_S = 30.0  # how long closing the world waits for Tinker to finish its session
log = logging.getLogger("rsigym_env.worlds.remote")


class RemoteWorld(ServiceWorld):
    """One benchmark's remote world for one run (see the module docstring).

    Keyword arguments replace the real clients (tests, replays): ``service_client`` (Tinker-shaped),
    ``inference`` (a ``chat.completions``-like object), ``teachers`` (name → one), ``sandbox_create``
    (``e2b.Sandbox.create``-like), ``tasks`` (split → task directory).
    """

    name = "remote"

    def __init__(self, scenario: Scenario, seed: int, run_dir: Path | None = None, *, service_client: Any = None,
                 inference: Any = None, teachers: Mapping[str, Any] | None = None,
                 sandbox_create: Callable[..., Any] | None = None, tasks: Mapping[str, Path] | None = None,
                 environ: Mapping[str, str] | None = None):
        from .evaluation import RemoteEvalService, prepare_splits
        from .sandbox import RemoteSandboxService
        from .teachers import CatalogTeachers

        env = os.environ if environ is None else environ
        self.scenario, self.seed = scenario, seed
        self.options = RemoteOptions.model_validate(scenario.world_options)
        self.benchmark: RemoteBenchmark = BENCHMARKS.get(scenario.benchmark) or RemoteBenchmark(
            scenario.benchmark, scenario.benchmark, self.options.evaluation.dataset or "", "the benchmark's tasks", 0)
        replaced = {"TINKER_API_KEY": service_client is not None, "E2B_API_KEY": sandbox_create is not None}
        missing = [c.variable for c in required_credentials(self.options, scenario.permissions.teachers, scenario.tools())
                   if not env.get(c.variable) and not replaced.get(c.variable, False)
                   and not (inference is not None and c.variable == self.options.inference.api_key_env)
                   and not (teachers is not None and "teacher" in c.purpose)]
        if missing:
            raise MissingCredentials(missing, "the remote world reaches real services")
        rows = load_tinker_models()
        self.base_model = self.options.base_model
        allowed = [t for t in scenario.permissions.teachers if t in self.options.teachers]
        self.prices = remote_prices(self.base_model, teacher_prices(self.options, allowed), rows)
        self.context_tokens = context_tokens(self.base_model, rows)

        self.keep_files(run_dir, prefix="rsigym-remote-", job_threads=2)
        self.clock = WallClock()
        self.store = DatasetStore(self.run_dir / "datasets")

        self._owns_tinker = service_client is None  # a client made here is closed here (its session finished)
        if service_client is None:
            import tinker

            service_client = tinker.ServiceClient(base_url=self.options.tinker_url(env),
                                                  api_key=env.get("TINKER_API_KEY"),
                                                  user_metadata={"rsigym_scenario": scenario.name, "seed": str(seed)})
        self.tinker = service_client
        if inference is None:
            inference = openai_completions(self.options.inference_base_url(env),
                                           env.get(self.options.inference.api_key_env, ""),
                                           self.options.inference.timeout_s)
        self._inference = inference
        self.inference_url = self.options.inference_base_url(env)
        self.client = RoutedClient({"base": Route(inference, self.base_model, "the inference endpoint")})
        for name in allowed:
            spec = self.options.teachers[name]
            completions = (teachers or {}).get(name)
            if completions is None:
                url = spec.resolved_url(environ=env)
                if url is None:
                    continue  # required_credentials reported it; a scenario without generate_data needs none
                completions = openai_completions(url, env.get(spec.api_key_env, ""), spec.timeout_s)
            self.client.add(name, Route(completions, spec.model or name, f"teacher {name}"))

        sandbox = scenario.permissions.sandbox
        self.vcpus, self.memory_gib = sandbox.vcpus, sandbox.memory_gib
        self.train = TinkerTrainService(client=self.tinker, store=self.store, prices=self.prices, pool=self.pool,
                                        clock=self.clock.now, base_model=self.base_model, seed=seed,
                                        on_checkpoint=self.register_checkpoint, default_rank=self.options.lora_rank,
                                        renderer=self._renderer, renderer_name="role_colon", errors=_tinker_error,
                                        provider_paths=True)
        self.inference = ChatInferenceService(client=self.client, model_for=self.chat_model, prices=self.prices,
                                              seed=seed, context_tokens=self.context_tokens,
                                              prompt_overhead=PROMPT_OVERHEAD, tokens_per_second=50.0, latency_s=5.0)
        self.sandbox = RemoteSandboxService(options=self.options.sandbox, prices=self.prices,
                                            vcpus=sandbox.vcpus, memory_gib=sandbox.memory_gib, network=sandbox.network,
                                            max_sandboxes=sandbox.max_sandboxes, api_key=env.get("E2B_API_KEY"),
                                            domain=env.get("E2B_DOMAIN"), create=sandbox_create,
                                            api_url=env.get("E2B_API_URL"), sandbox_url=env.get("E2B_SANDBOX_URL"))
        self.rollout = RolloutService(teachers=CatalogTeachers(client=self.client, benchmark=self.benchmark),
                                      sandbox=self.sandbox, store=self.store, prices=self.prices, seed=seed)
        evaluation = self.options.evaluation
        # recorded in every result: which held-out split it was scored on (never the secret or the nonce)
        self.split = None if tasks is not None or evaluation.tasks else official_split(evaluation.official_split)
        if self.split is None:
            self.official_split = {"mode": "given", "draw": "fixed"}  # the scenario (or caller) names the split
        elif self.split.mode == "secret":  # this episode's own draw
            self.official_split = self.split.info
        else:
            self.official_split = {"mode": "public", "id": f"split_seed={evaluation.split_seed}", "draw": "fixed"}
        self.tasks = dict(tasks) if tasks is not None else prepare_splits(
            evaluation, evaluation.dataset or self.benchmark.dataset, self.run_dir / "tasks", environ=env,
            split=self.split)
        self.evaluation = RemoteEvalService(options=self.options.evaluation, model_for=self.chat_model,
                                            tasks=self.tasks, run_dir=self.run_dir / "evals", prices=self.prices,
                                            seed=seed, vcpus=sandbox.vcpus, memory_gib=sandbox.memory_gib,
                                            clock=self.clock.now)

    def close_extras(self) -> None:
        """Finish the Tinker session this world opened (Tinker then stops expecting its heartbeats; without this
        every episode's session heartbeats for as long as the process lives). Bounded; a failure is logged."""
        if self._owns_tinker:
            try:
                self.tinker.close("success", detail="rsigym episode closed").result(timeout=TINKER_CLOSE_S)
            except Exception as exc:  # noqa: BLE001 - the session expires on its own when heartbeats stop
                log.warning("could not finish the Tinker session: %s: %s", type(exc).__name__, exc)
        super().close_extras()

    # ---- models ---------------------------------------------------------------------------------

    def _renderer(self, tokenizer: Any) -> Any:
        """The scenario's chat format over the model's tokenizer (default: the model's own chat template)."""
        from .renderer import remote_renderer

        return remote_renderer(self.options.renderer, tokenizer)

    def register_checkpoint(self, checkpoint: str, sampler_path: str) -> None:
        """Make a trained checkpoint answer as ``checkpoint`` (Tinker serves it by its sampler path)."""
        self.client.add(checkpoint, Route(self._inference, sampler_path, "the inference endpoint"))

    def chat_model(self, checkpoint: str) -> ForwardingChatModel:
        """A servable model for 'base' or a finished checkpoint (``unknown_ref`` otherwise)."""
        if checkpoint != "base" and checkpoint not in self.checkpoints:
            raise ActionError("unknown_ref", f"no checkpoint {checkpoint!r}; checkpoints: "
                                             f"{', '.join(['base', *self.checkpoints])}")
        return ForwardingChatModel(self.client, checkpoint)

    # ---- the initial system ---------------------------------------------------------------------

    def initial_harness(self) -> dict[str, str]:
        from ..common.harness import minimal_harness

        return minimal_harness()

    def describe(self) -> str:
        b, e = self.benchmark, self.options.evaluation
        teachers = ", ".join(t for t in self.scenario.permissions.teachers if t in self.prices.teachers) or "none"
        return (f"remote world: {b.name} ({b.domain}); Harbor dataset {e.dataset or b.dataset}, tasks split into dev "
                f"({len(list(Path(self.tasks['dev']).iterdir()))}) and held-out official "
                f"({_split_words(self.official_split)}). Base model {self.base_model} "
                f"on Tinker (LoRA; checkpoints are tinker:// paths), inference at {self.inference_url}, "
                f"trials in Harbor's {e.environment} environment, sandboxes on E2B. Teachers: {teachers}. "
                f"Prices: {self.prices.source}.")


def _split_words(info: Mapping[str, Any]) -> str:
    """How the official split was drawn, in the words the researcher reads."""
    if info.get("mode") == "secret":
        return "drawn for this episode from a secret" if info.get("draw") == "per-episode" else "a pinned secret draw"
    return "named by the scenario" if info.get("mode") == "given" else "a public split, the same every episode"


def _tinker_error(exc: Exception) -> Exception:
    """A Tinker failure as a typed error (the reservation is released)."""
    from .errors import translate

    return translate(exc, "Tinker")


def from_scenario(scenario: Scenario, seed: int, run_dir: Path | None = None) -> RemoteWorld:
    """The registry's factory (``rsigym_env.worlds.WORLDS``)."""
    return RemoteWorld(scenario, seed, run_dir)


__all__ = ["RemoteWorld", "from_scenario", "teacher_prices"]

