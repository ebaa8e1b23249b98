"""The remote world's rollout, training and inference services: the local world's classes, remote endpoints.

* :class:`RemoteTrain` is :class:`~..local.world.LocalTrain` (same token count and quote, same
  :func:`~..common.training.run_supervised` loop) with the scenario's base model and LoRA rank, the
  model's own chat template, and ``tinker://`` checkpoints registered for inference by their sampler path.
* :class:`RemoteRollout` keeps the local transforms (a script in the sandbox, now E2B's) and asks a
  catalog teacher over its OpenAI-compatible endpoint: first for a new problem in the benchmark's domain,
  then for its solution.
* :class:`RemoteInference` asks the inference endpoint (Tinker's OpenAI-compatible one by default) and
  bills the provider's own token counts, cached prompt tokens at the cached rate.

Worst cases use bytes as the token count (every tokenizer here has at least one byte per token).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from ...errors import ActionError
from ...services import Billed, Completion, DatasetInfo, Job, Quote, TrainResult
from ...tools import GenerateData, Infer, Train
from ..local.world import LocalInference, LocalRollout, LocalTrain

PROMPT_OVERHEAD = 64          # tokens of chat framing per request, for quotes
PROBLEM_TOKENS = 1024         # the teacher's problem statement cap


def _bytes(text: str) -> int:
    return len(text.encode())


class RemoteRollout(LocalRollout):
    """Teacher data from the scenario's teacher catalog; transforms as in the local world (in E2B)."""

    def _teacher(self, call: GenerateData) -> None:
        w = self.world
        if call.teacher not in w.prices.teachers or w.client.get(call.teacher) is None:
            known = ", ".join(t for t in w.prices.teachers if w.client.get(t) is not None)
            raise ActionError("unknown_ref", f"no teacher {call.teacher!r} in this world; teachers: {known}")
        if call.source != "synthetic":
            raise ActionError("not_supported", "teachers answer synthetic prompts only (source='dev' would leak "
                                               "the dev split into training data)")

    def _prompt(self, index: int, stream: int) -> str:
        b = self.world.benchmark
        return (f"Write one new, self-contained practice problem for {b.name}: {b.domain}. Make it different from "
                f"common textbook examples (variation #{stream}-{index}). Reply with the problem statement only.")

    def quote_generate(self, call: GenerateData) -> Quote:
        self._teacher(call)
        per_example_in = 2 * PROMPT_OVERHEAD + _bytes(self._prompt(0, 0)) + PROBLEM_TOKENS
        per_example_out = PROBLEM_TOKENS + call.max_tokens_per_example
        usd = self.world.prices.teacher_usd(call.teacher, call.n_examples * per_example_in,
                                            call.n_examples * per_example_out)
        return Quote(usd=usd, seconds=call.n_examples * 20.0)

    def generate(self, call: GenerateData, dataset_id: str) -> Billed[DatasetInfo]:
        self._teacher(call)
        w = self.world
        start = time.monotonic()
        stream = int(hashlib.sha256(f"{w.seed}/{dataset_id}".encode()).hexdigest()[:8], 16)
        rows, usage = [], [0, 0]

        def ask(messages: list[dict[str, str]], max_tokens: int, seed: int) -> str:
            reply = w.client.chat.completions.create(model=call.teacher, messages=messages, max_tokens=max_tokens,
                                                     seed=seed, temperature=1.0)
            usage[0] += reply.usage.prompt_tokens
            usage[1] += reply.usage.completion_tokens
            return reply.choices[0].message.content or ""

        try:
            for i in range(call.n_examples):
                problem = ask([{"role": "user", "content": self._prompt(i, stream)}], PROBLEM_TOKENS, stream + i)
                answer = ask([{"role": "user", "content": problem}], call.max_tokens_per_example, stream + i)
                rows.append({"messages": [{"role": "user", "content": problem},
                                          {"role": "assistant", "content": answer}],
                             "meta": {"teacher": call.teacher, "index": i}})
        except ActionError as err:  # the tokens already used were spent at the provider: say so
            spent = w.prices.teacher_usd(call.teacher, *usage)
            raise ActionError(err.code, f"{err.message} (after {len(rows)} of {call.n_examples} examples; "
                                        f"${spent:.4f} already used at the provider)") from None
        info = w.save_dataset(dataset_id, rows, f"{call.teacher} x {call.n_examples} (synthetic)")
        cost = min(self.quote_generate(call).usd, w.prices.teacher_usd(call.teacher, *usage))
        return Billed[DatasetInfo](value=info, cost_usd=cost, seconds=time.monotonic() - start)


class RemoteTrain(LocalTrain):
    """LoRA training on Tinker through the local world's supervised loop."""

    def rank(self, call: Train) -> int:
        """The call's rank if it names one, else the scenario's (``world_options.lora_rank``), else the tool default."""
        opts = self.world.options
        if "lora_rank" in call.model_fields_set or opts.lora_rank is None:
            return call.lora_rank
        return opts.lora_rank

    def start(self, call: Train, job_id: str, checkpoint_id: str) -> Job:
        from ..common.training import SupervisedConfig, run_supervised
        from .renderer import remote_renderer

        w = self.world
        self._tokens(call)
        config = SupervisedConfig(
            base_model=w.base_model, learning_rate=call.learning_rate, lr_schedule=call.lr_schedule,
            num_epochs=call.num_epochs, batch_size=call.batch_size, lora_rank=self.rank(call), seed=w.seed,
            load_checkpoint_path=w.states.get(call.base) if call.base != "base" else None,
            checkpoint_name=checkpoint_id, renderer="role_colon")  # the renderer object below is what is used
        path = w.dataset_path(call.dataset)

        def run() -> Billed[TrainResult]:
            recorder = _RecordingClient(w.tinker)
            renderer = _LazyRenderer(lambda: remote_renderer(w.options.renderer,
                                                             recorder.training_client.get_tokenizer()))
            try:
                result = run_supervised(recorder, config, path, renderer=renderer)
            except ActionError:
                raise
            except Exception as exc:  # noqa: BLE001 - a provider failure: typed, reservation released
                from .errors import translate

                raise translate(exc, "Tinker") from exc
            w.checkpoints[checkpoint_id] = result.sampler_path
            if result.state_path:
                w.states[checkpoint_id] = result.state_path
            w.register_checkpoint(checkpoint_id, result.sampler_path)
            value = TrainResult(checkpoint=checkpoint_id, steps=len(result.steps), tokens=result.billable_tokens,
                                loss_curve=result.loss_curve, config=call.model_dump() | {"lora_rank": config.lora_rank,
                                                                                         "base_model": w.base_model,
                                                                                         "sampler_path": result.sampler_path})
            cost = min(self.quote(call).usd, w.prices.train_usd(result.billable_tokens))
            return Billed[TrainResult](value=value, cost_usd=cost, seconds=result.wall_seconds)

        meta = {"checkpoint": checkpoint_id, "dataset": call.dataset, "base": call.base}
        return Job(id=job_id, kind="train", started_at=w.clock.now(), future=w._pool.submit(run), meta=meta)


class _RecordingClient:
    """A service client that remembers the training client it made (its tokenizer is the model's)."""

    def __init__(self, inner: Any):
        self.inner, self.training_client = inner, None

    def _record(self, future: Any) -> Any:
        owner = self

        class _Future:
            def result(self, timeout: float | None = None) -> Any:
                owner.training_client = future.result() if timeout is None else future.result(timeout)
                return owner.training_client

        return _Future()

    def create_lora_training_client(self, **kwargs: Any) -> Any:
        return self._record(self.inner.create_lora_training_client(**kwargs))

    def create_training_client_from_state(self, path: str) -> Any:
        return self._record(self.inner.create_training_client_from_state(path))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _LazyRenderer:
    """A renderer built on first use (after the training client exists)."""

    def __init__(self, build: Any):
        self._build, self._renderer = build, None

    def build_supervised_example(self, messages: Any, train_on_what: Any) -> Any:
        if self._renderer is None:
            self._renderer = self._build()
        return self._renderer.build_supervised_example(messages, train_on_what)


class RemoteInference(LocalInference):
    """One chat completion from the base model or a checkpoint, at the inference endpoint."""

    def _limits(self, call: Infer) -> tuple[int, int]:
        self.world.chat_model(call.model)  # unknown checkpoint -> unknown_ref
        prompt = _bytes(call.prompt) + PROMPT_OVERHEAD
        context = self.world.context_tokens
        if prompt >= context:
            raise ActionError("invalid_args", f"infer: the prompt may be up to {prompt} tokens; the model's context "
                                              f"is {context} tokens")
        return prompt, min(call.max_tokens, context - prompt)

    def quote(self, call: Infer) -> Quote:
        prompt, completion = self._limits(call)
        return Quote(usd=self.world.prices.sample_usd(prompt, completion), seconds=5.0 + completion / 50.0)

    def complete(self, call: Infer) -> Billed[Completion]:
        w = self.world
        quote = self.quote(call)
        _, max_tokens = self._limits(call)
        start = time.monotonic()
        reply = w.client.chat.completions.create(model=call.model, messages=[{"role": "user", "content": call.prompt}],
                                                 max_tokens=max_tokens, seed=w.seed, temperature=0.7)
        choice, usage = reply.choices[0], reply.usage
        details = getattr(usage, "prompt_tokens_details", None)
        cached = int(getattr(details, "cached_tokens", 0) or 0)
        value = Completion(text=choice.message.content or "", prompt_tokens=usage.prompt_tokens,
                           completion_tokens=usage.completion_tokens,
                           finish_reason="length" if choice.finish_reason == "length" else "stop")
        cost = min(quote.usd, w.prices.sample_usd_cached(usage.prompt_tokens, cached, usage.completion_tokens))
        return Billed[Completion](value=value, cost_usd=cost, seconds=time.monotonic() - start)


__all__ = ["RemoteInference", "RemoteRollout", "RemoteTrain"]
