"""The training service of the local and the remote world: LoRA fine-tuning through :func:`~.training.run_supervised`
over any Tinker-interface service client (the local ``LocalServiceClient`` or ``tinker.ServiceClient``), one job per
call in the world's worker threads.

The quote is the whole run's tokens (from the dataset's recorded statistics: nothing is read) at the training
rate; the bill the tokens trained, never above it. A cancelled job stops after its current step and costs the
tokens trained so far. A finished job records the checkpoint's sampler and state paths and hands the sampler path
to ``on_checkpoint`` (the world makes it servable).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from typing import Any, Callable

from ...errors import ActionError, WorkFailed
from ...prices import PriceList
from ...services import Billed, Job, Quote, TrainResult, progress_reporter
from ...tools import Train
from .datasets import DatasetStore
from .jobs import CANCEL_WAIT_S, JobCancelled

TRAIN_TOKENS_PER_SECOND = 4000.0   # for quotes only; actual time is measured


class TinkerTrainService:
    """The :class:`~rsigym_env.services.TrainService` over ``client`` (Tinker's interface).

    ``lr_scale`` multiplies the researcher's learning rate (the local world's tiny model needs a larger one to
    move as much); ``default_rank`` is the rank of calls that name none (else the tool's default); ``renderer``
    builds the chat renderer from the training client's tokenizer (default: ``SupervisedConfig.renderer``'s);
    ``errors`` turns a provider's exception into the error the job fails with; ``provider_paths`` records the
    base model and the sampler path in the result's config. ``runner(config, dataset_path, on_step)`` runs a
    job (default: :func:`~.training.run_supervised` over ``client`` in the job's thread; the local world's runs
    it in a process of its own, over the same checkpoints)."""

    def __init__(self, *, client: Any, store: DatasetStore, prices: PriceList, pool: cf.Executor,
                 clock: Callable[[], float], base_model: str, seed: int, on_checkpoint: Callable[[str, str], None],
                 lr_scale: float = 1.0, default_rank: int | None = None, renderer: Callable[[Any], Any] | None = None,
                 renderer_name: str | None = None, errors: Callable[[Exception], Exception] | None = None,
                 provider_paths: bool = False, runner: Callable[..., Any] | None = None):
        self.runner = runner
        self.client, self.store, self.prices, self.pool, self.clock = client, store, prices, pool, clock
        self.base_model, self.seed, self.on_checkpoint = base_model, seed, on_checkpoint
        self.lr_scale, self.default_rank, self.renderer, self.renderer_name = lr_scale, default_rank, renderer, renderer_name
        self.errors, self.provider_paths = errors, provider_paths
        self.checkpoints: dict[str, str] = {}   # checkpoint id -> sampler path (tinker://.../sampler_weights/...)
        self.states: dict[str, str] = {}        # checkpoint id -> state path (to continue training from)

    def rank(self, call: Train) -> int:
        """The call's rank if it names one, else ``default_rank``, else the tool's default."""
        if "lora_rank" in call.model_fields_set or self.default_rank is None:
            return call.lora_rank
        return self.default_rank

    def _tokens(self, call: Train) -> int:
        """Billed tokens of the whole run, from the dataset's recorded statistics (nothing is read)."""
        meta = self.store.meta(call.dataset)
        if meta.info.n_examples == 0:
            raise ActionError("invalid_args", f"dataset {call.dataset!r} is empty")
        if call.base != "base" and call.base not in self.states:
            raise ActionError("unknown_ref", f"no finished checkpoint {call.base!r} to continue from")
        return meta.train_tokens_per_epoch * call.num_epochs

    def quote(self, call: Train) -> Quote:
        tokens = self._tokens(call)
        return Quote(usd=self.prices.train_usd(tokens), seconds=tokens / TRAIN_TOKENS_PER_SECOND + 2.0)

    def start(self, call: Train, job_id: str, checkpoint_id: str) -> Job:
        from .training import SupervisedConfig, run_supervised

        quote = self.quote(call)
        config = SupervisedConfig(
            base_model=self.base_model, learning_rate=call.learning_rate * self.lr_scale, lr_schedule=call.lr_schedule,
            num_epochs=call.num_epochs, batch_size=call.batch_size, lora_rank=self.rank(call), seed=self.seed,
            load_checkpoint_path=self.states.get(call.base) if call.base != "base" else None,
            checkpoint_name=checkpoint_id, **({"renderer": self.renderer_name} if self.renderer_name else {}))
        path = self.store.path(call.dataset)
        stop, done_tokens = threading.Event(), [0]
        report = progress_reporter()

        def on_step(metrics: Any) -> None:  # progress, and where a cancelled job stops
            done_tokens[0] += metrics.num_tokens
            report(self.prices.train_usd(done_tokens[0]))
            if stop.is_set():
                raise JobCancelled(f"{job_id} was cancelled after {done_tokens[0]:,} trained tokens")

        def run() -> Billed[TrainResult]:
            try:
                if self.runner is not None:
                    result = self.runner(config, path, on_step)
                else:
                    result = run_supervised(self.client, config, path, on_step=on_step, make_renderer=self.renderer)
            except (ActionError, JobCancelled):
                raise
            except Exception as exc:  # noqa: BLE001 - a provider failure: typed, reservation released
                if self.errors is not None:
                    raise self.errors(exc) from exc
                if done_tokens[0]:  # it trained, then failed: billed for what it trained
                    raise WorkFailed("service_error", f"training failed after {done_tokens[0]:,} trained tokens: "
                                     f"{type(exc).__name__}: {exc}",
                                     cost_usd=min(quote.usd, self.prices.train_usd(done_tokens[0]))) from exc
                raise
            self.checkpoints[checkpoint_id] = result.sampler_path
            if result.state_path:
                self.states[checkpoint_id] = result.state_path
            self.on_checkpoint(checkpoint_id, result.sampler_path)
            described = call.model_dump()
            if self.provider_paths:
                described |= {"lora_rank": config.lora_rank, "base_model": self.base_model,
                              "sampler_path": result.sampler_path}
            value = TrainResult(checkpoint=checkpoint_id, steps=len(result.steps), tokens=result.billable_tokens,
                                loss_curve=result.loss_curve, config=described)
            return Billed[TrainResult](value=value, cost_usd=min(quote.usd, self.prices.train_usd(result.billable_tokens)),
                                       seconds=result.wall_seconds)

        meta = {"checkpoint": checkpoint_id, "dataset": call.dataset, "base": call.base}
        future = self.pool.submit(run)

        def cancel() -> float:
            """Stop after the current step; the trained tokens so far are what it cost."""
            stop.set()
            cf.wait([future], timeout=CANCEL_WAIT_S)
            return min(quote.usd, self.prices.train_usd(done_tokens[0]))

        return Job(id=job_id, kind="train", started_at=self.clock(), future=future, meta=meta, cancel=cancel)


__all__ = ["TRAIN_TOKENS_PER_SECOND", "TinkerTrainService"]
