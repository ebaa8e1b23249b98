"""Supervised fine-tuning over a chat JSONL dataset, written against the Tinker client interface only.

``run_supervised(service_client, config, dataset)`` uses nothing but Tinker's public methods
(``create_lora_training_client``, ``forward_backward``, ``optim_step``, ``save_state``,
``save_weights_for_sampler``, ``get_tokenizer``), so the same code drives the local client and the
real ``tinker.ServiceClient``. It follows tinker-cookbook's supervised loop: a renderer turns each
conversation into tokens and per-token weights (``train_on_what``), batches of ``batch_size``
conversations per optimizer step, ``num_epochs`` passes (reshuffled with ``seed``), ``max_steps``,
and a constant / linear / cosine learning-rate schedule.

>>> import tempfile
>>> from rsigym_env.worlds.local.lm.tinker_client import LocalServiceClient, make_random_base, register_base_model
>>> from rsigym_env.worlds.local.lm.model import ModelConfig
>>> root = tempfile.mkdtemp()
>>> register_base_model("doc-sft", make_random_base(root + "/base", ModelConfig(d_model=32, n_layers=1,
...     n_heads=2, d_ff=64, max_seq_len=64)))
>>> data = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 4
>>> cfg = SupervisedConfig(base_model="doc-sft", learning_rate=1e-2, batch_size=2, num_epochs=2, lora_rank=4)
>>> result = run_supervised(LocalServiceClient(root_dir=root), cfg, data)
>>> len(result.steps), result.billable_tokens, result.steps[-1].loss < result.steps[0].loss
(4, 88, True)
>>> result.sampler_path.endswith("/sampler_weights/final")
True
>>> SupervisedConfig(base_model="x", learning_rate=0).validate()
Traceback (most recent call last):
...
rsigym_env.worlds.common.training.TrainingConfigError: learning_rate must be a finite number > 0, got 0
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np
from tinker import types

from ...errors import ActionError
from .tokenizer import RENDERERS, MessageError, TrainOnWhat, get_renderer

LRSchedule = Literal["constant", "linear", "cosine"]
LR_SCHEDULES = ("constant", "linear", "cosine")


class TrainingConfigError(ActionError, ValueError):
    """A hyperparameter out of range or unknown (code ``invalid_args``)."""

    def __init__(self, message: str):
        super().__init__("invalid_args", message)


class DatasetError(ActionError, ValueError):
    """A dataset that cannot be trained on: unreadable line, bad messages, empty (code ``invalid_args``)."""

    def __init__(self, message: str):
        super().__init__("invalid_args", message)


class ExampleTooLongError(DatasetError):
    """An example with more tokens than ``max_length`` or the model's context."""


def lr_multiplier(schedule: str, step: int, total_steps: int) -> float:
    """Factor on the base learning rate at ``step`` (0-based) of ``total_steps`` (as tinker-cookbook).

    >>> [round(lr_multiplier(s, 2, 4), 3) for s in LR_SCHEDULES]
    [1.0, 0.5, 0.5]
    """
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - step / total_steps
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * step / total_steps))
    raise TrainingConfigError(f"unknown lr_schedule {schedule!r}; schedules: {', '.join(LR_SCHEDULES)}")


@dataclass
class SupervisedConfig:
    """Hyperparameters of a supervised run (field names as tinker-cookbook and RSIGym's train config).

    ``max_length`` caps an example's tokens (``None``: the model's context, where the client tells
    it); a longer example is an error, not silently truncated.
    """

    base_model: str
    learning_rate: float = 1e-4
    lr_schedule: str = "linear"
    num_epochs: int = 1
    batch_size: int = 16
    max_steps: int | None = None
    lora_rank: int = 32
    max_length: int | None = None
    train_on_what: str = TrainOnWhat.ALL_ASSISTANT_MESSAGES.value
    renderer: str = "rsigym_chat"
    seed: int = 0
    shuffle: bool = True
    load_checkpoint_path: str | None = None
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True
    checkpoint_name: str = "final"
    save_state: bool = True

    def validate(self) -> None:
        """Raise ``TrainingConfigError`` for the first bad field."""
        def bad(msg: str) -> None:
            raise TrainingConfigError(msg)

        if not isinstance(self.base_model, str) or not self.base_model:
            bad("base_model must be a non-empty string")
        if not (isinstance(self.learning_rate, (int, float)) and math.isfinite(self.learning_rate) and self.learning_rate > 0):
            bad(f"learning_rate must be a finite number > 0, got {self.learning_rate!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            bad(f"unknown lr_schedule {self.lr_schedule!r}; schedules: {', '.join(LR_SCHEDULES)}")
        for name in ("num_epochs", "batch_size", "lora_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                bad(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("max_steps", "max_length"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                bad(f"{name} must be None or an integer >= 1, got {value!r}")
        if self.max_length is not None and self.max_length < 2:
            bad("max_length must be >= 2 (an input token and a target)")
        if self.train_on_what not in {w.value for w in TrainOnWhat}:
            bad(f"unknown train_on_what {self.train_on_what!r}; choices: {', '.join(w.value for w in TrainOnWhat)}")
        if self.renderer not in RENDERERS:
            bad(f"unknown renderer {self.renderer!r}; renderers: {', '.join(sorted(RENDERERS))}")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                bad(f"{name} must be in [0, 1)")
        if not self.adam_eps > 0:
            bad("adam_eps must be > 0")
        for name in ("weight_decay", "grad_clip_norm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                bad(f"{name} must be a finite number >= 0")
        if not (self.train_mlp or self.train_attn or self.train_unembed):
            bad("at least one of train_mlp, train_attn, train_unembed must be True")
        if not isinstance(self.checkpoint_name, str) or not self.checkpoint_name or "/" in self.checkpoint_name:
            bad("checkpoint_name must be a non-empty name without '/'")

    def adam_params(self, learning_rate: float) -> types.AdamParams:
        return types.AdamParams(learning_rate=learning_rate, beta1=self.adam_beta1, beta2=self.adam_beta2,
                                eps=self.adam_eps, weight_decay=self.weight_decay, grad_clip_norm=self.grad_clip_norm)


@dataclass
class StepMetrics:
    """One optimizer step. ``num_tokens`` (Σ input lengths) is what RSIGym bills."""

    step: int
    epoch: int
    learning_rate: float
    loss: float
    """Mean negative log-likelihood per trained token (``loss_sum / num_loss_tokens``)."""
    loss_sum: float
    num_sequences: int
    num_tokens: int
    num_loss_tokens: float
    seconds: float


@dataclass
class SupervisedResult:
    """What a run produced: the sampler checkpoint path (its checkpoint id), the state checkpoint,
    the per-step metrics and the billable tokens."""

    sampler_path: str
    state_path: str | None
    model_id: str
    steps: list[StepMetrics] = field(default_factory=list)
    num_examples: int = 0
    billable_tokens: int = 0
    wall_seconds: float = 0.0

    @property
    def loss_curve(self) -> list[float]:
        return [s.loss for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- data ---------------------------------------------------------------------------------------


def load_chat_jsonl(source: str | Path | Iterable[Any]) -> list[list[dict[str, Any]]]:
    """Read conversations: a JSONL path (one ``{"messages": [...]}`` per line) or an iterable of
    such objects (or of message lists). Raises ``DatasetError`` naming the first bad line.

    >>> load_chat_jsonl([{"messages": [{"role": "user", "content": "hi"}]}])
    [[{'role': 'user', 'content': 'hi'}]]
    """
    from .tokenizer import validate_messages

    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise DatasetError(f"dataset file not found: {path}")
        items: list[tuple[int, Any]] = []
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    items.append((n, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{path.name} line {n}: not JSON ({e.msg})") from None
        where = lambda n: f"{path.name} line {n}"  # noqa: E731
    else:
        items = list(enumerate(source, 1))
        where = lambda n: f"example {n}"  # noqa: E731
    conversations = []
    for n, item in items:
        messages = item.get("messages") if isinstance(item, Mapping) else item
        try:
            conversations.append(validate_messages(messages))
        except MessageError as e:
            raise DatasetError(f"{where(n)}: {e}") from None
    if not conversations:
        raise DatasetError("the dataset is empty")
    return conversations


def conversation_to_datum(tokens: np.ndarray, weights: np.ndarray) -> types.Datum:
    """Rendered tokens and weights → a next-token ``Datum`` (inputs ``tokens[:-1]``, targets
    ``tokens[1:]``, weights aligned with the targets), as tinker-cookbook's ``datum_from_tokens_weights``."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1].tolist()),
        loss_fn_inputs={"target_tokens": types.TensorData.from_numpy(np.asarray(tokens[1:], np.int64)),
                        "weights": types.TensorData.from_numpy(np.asarray(weights[1:], np.float32))})


def build_data(conversations: Sequence[Sequence[Mapping[str, Any]]], renderer: Any, train_on_what: str,
               max_length: int | None, context: int | None = None) -> list[types.Datum]:
    """Render every conversation; reject examples that are too long (``max_length`` tokens, or
    more input tokens than the model's ``context``) or that train on nothing."""
    data = []
    for i, msgs in enumerate(conversations, 1):
        tokens, weights = renderer.build_supervised_example(msgs, train_on_what)
        if max_length is not None and len(tokens) > max_length:
            raise ExampleTooLongError(f"example {i} has {len(tokens)} tokens, more than max_length={max_length}")
        if context is not None and len(tokens) - 1 > context:
            raise ExampleTooLongError(
                f"example {i} has {len(tokens)} tokens ({len(tokens) - 1} inputs), more than the model's context of {context}")
        if len(tokens) < 2 or float(np.sum(weights[1:])) <= 0:
            raise DatasetError(f"example {i} has no tokens to train on (train_on_what={train_on_what!r})")
        data.append(conversation_to_datum(tokens, weights))
    return data


# --- the loop -----------------------------------------------------------------------------------


def run_supervised(service_client: Any, config: SupervisedConfig, dataset: str | Path | Iterable[Any], *,
                   renderer: Any = None, on_step: Callable[[StepMetrics], None] | None = None,
                   make_renderer: Callable[[Any], Any] | None = None) -> SupervisedResult:
    """Fine-tune ``config.base_model`` (or ``config.load_checkpoint_path``) on ``dataset``.

    Everything that can be checked before training (hyperparameters, every line of the
    dataset, example lengths) is checked first, so a bad call costs nothing. ``on_step`` is
    called after every optimizer step. The renderer is ``renderer``, else ``make_renderer`` of the
    training client's tokenizer, else ``config.renderer`` over it. Returns the
    ``tinker://…/sampler_weights/…`` path.
    """
    start = time.perf_counter()
    config.validate()
    conversations = load_chat_jsonl(dataset)

    if config.load_checkpoint_path:
        tc = service_client.create_training_client_from_state(config.load_checkpoint_path).result()
    else:
        tc = service_client.create_lora_training_client(
            base_model=config.base_model, rank=config.lora_rank, seed=config.seed, train_mlp=config.train_mlp,
            train_attn=config.train_attn, train_unembed=config.train_unembed).result()
    if renderer is None:
        tokenizer = tc.get_tokenizer()
        renderer = make_renderer(tokenizer) if make_renderer is not None else get_renderer(config.renderer, tokenizer)
    context = getattr(tc, "max_seq_len", None)  # the local client knows its context; Tinker checks server-side
    data = build_data(conversations, renderer, config.train_on_what, config.max_length, context)

    n = len(data)
    n_batches = math.ceil(n / config.batch_size)
    total = n_batches * config.num_epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    result = SupervisedResult(sampler_path="", state_path=None, model_id=str(getattr(tc, "model_id", "")),
                              num_examples=n)
    step = 0
    for epoch in range(config.num_epochs):
        order = np.random.default_rng([config.seed, epoch]).permutation(n) if config.shuffle else np.arange(n)
        for b in range(n_batches):
            if step >= total:
                break
            t0 = time.perf_counter()
            batch = [data[i] for i in order[b * config.batch_size:(b + 1) * config.batch_size]]
            lr = config.learning_rate * lr_multiplier(config.lr_schedule, step, total)
            fwd = tc.forward_backward(batch, "cross_entropy")
            opt = tc.optim_step(config.adam_params(lr))
            out = fwd.result()
            opt.result()
            loss_sum = float(out.metrics["loss:sum"])
            loss_tokens = float(sum(np.sum(d.loss_fn_inputs["weights"].to_numpy()) for d in batch))
            metrics = StepMetrics(step=step, epoch=epoch, learning_rate=lr, loss=loss_sum / max(loss_tokens, 1e-12),
                                  loss_sum=loss_sum, num_sequences=len(batch),
                                  num_tokens=sum(d.model_input.length for d in batch), num_loss_tokens=loss_tokens,
                                  seconds=time.perf_counter() - t0)
            result.steps.append(metrics)
            result.billable_tokens += metrics.num_tokens
            if on_step is not None:
                on_step(metrics)
            step += 1
    if config.save_state:
        result.state_path = tc.save_state(config.checkpoint_name).result().path
    result.sampler_path = tc.save_weights_for_sampler(config.checkpoint_name).result().path
    result.wall_seconds = time.perf_counter() - start
    return result
