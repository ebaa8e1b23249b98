"""An in-process client with tinker 0.38's public signatures, training and sampling the local model.

``LocalServiceClient`` mirrors ``tinker.ServiceClient``; the training and sampling clients it
creates mirror ``tinker.TrainingClient`` and ``tinker.SamplingClient``. Inputs and outputs are the
real ``tinker.types`` objects and every call returns a real ``tinker.APIFuture``: requests run in
submission order on one worker thread per client, as Tinker runs them in order on its servers.
Checkpoints are files under ``root_dir`` (``runs/RUN/weights/NAME`` and
``runs/RUN/sampler_weights/NAME``) addressed by Tinker's paths ``tinker://RUN/weights/NAME`` and
``tinker://RUN/sampler_weights/NAME``; a new client on the same directory resolves them.

>>> import tempfile, tinker
>>> from tinker import types
>>> root = tempfile.mkdtemp()
>>> register_base_model("doc-tiny", make_random_base(root + "/base", ModelConfig(d_model=32, n_layers=1,
...     n_heads=2, d_ff=64, max_seq_len=64)))
>>> service = LocalServiceClient(root_dir=root)
>>> tc = service.create_lora_training_client(base_model="doc-tiny", rank=4, seed=0).result()
>>> tc.get_info().model_data.model_name, tc.get_info().lora_rank
('doc-tiny', 4)
>>> datum = types.Datum(model_input=types.ModelInput.from_ints([256, 104, 105]),
...                     loss_fn_inputs={"target_tokens": [104, 105, 257], "weights": [0.0, 1.0, 1.0]})
>>> out = tc.forward_backward([datum], "cross_entropy").result()
>>> sorted(out.loss_fn_outputs[0]), out.metrics["loss:sum"] > 0
(['elementwise_loss', 'logprobs'], True)
>>> _ = tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
>>> path = tc.save_weights_for_sampler("step-1").result().path
>>> path.startswith("tinker://") and path.endswith("/sampler_weights/step-1")
True
>>> sc = LocalServiceClient(root_dir=root).create_sampling_client(model_path=path).result()
>>> resp = sc.sample(types.ModelInput.from_ints([256, 259]), 2, types.SamplingParams(max_tokens=3, seed=0)).result()
>>> isinstance(resp, types.SampleResponse), len(resp.sequences), len(resp.sequences[0].tokens)
(True, 2, 3)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence, TypeVar

import numpy as np
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture, AwaitableConcurrentFuture

from ....errors import ActionError
from .model import (
    Adam,
    BaseModel,
    ContextOverflowError,
    LoraConfig,
    ModelConfig,
    Params,
    PrefillCache,
    Transformer,
    init_lora,
    init_params,
    load_model,
    load_npz,
    save_model,
    save_npz,
)
from ...common.tokenizer import Tokenizer

T = TypeVar("T")

DEFAULT_BASE_MODEL = "rsigym-tiny"
"""A deterministic randomly initialised ``ModelConfig()`` (seed 0) until the pretrained base
checkpoint (issue 3, item 2) is registered under this name with ``register_base_model``."""

LORA_ALPHA = 32.0
"""LoRA scale numerator: adapters are scaled by ``LORA_ALPHA / rank``."""

MAX_LORA_RANK = 256
SUPPORTED_LOSSES = ("cross_entropy", "importance_sampling")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class UnknownModelError(ActionError, ValueError):
    """A base model name that is not registered (code ``unknown_ref``)."""

    def __init__(self, message: str):
        super().__init__("unknown_ref", message)


class CheckpointNotFoundError(ActionError, ValueError):
    """A ``tinker://`` path that is malformed or names no saved checkpoint (code ``unknown_ref``)."""

    def __init__(self, message: str):
        super().__init__("unknown_ref", message)


# --- base models ------------------------------------------------------------------------------


_REGISTRY: dict[str, Path | Callable[[], BaseModel]] = {}
_LOADED: dict[tuple[str, str], BaseModel] = {}
_REGISTRY_LOCK = threading.Lock()


def register_base_model(name: str, path: str | Path | Callable[[], BaseModel]) -> None:
    """Serve the checkpoint at ``path`` (a directory written by ``model.save_model``) as base model
    ``name`` in this process. Re-registering a name replaces it (the hook for the pretrained base
    checkpoint: ``register_base_model("rsigym-tiny", "path/to/checkpoint")``)."""
    with _REGISTRY_LOCK:
        _REGISTRY[name] = path if callable(path) else Path(path)
        for key in [k for k in _LOADED if k[0] == name]:
            del _LOADED[key]


def registered_base_models() -> list[str]:
    return sorted(_REGISTRY)


def _random_tiny() -> BaseModel:
    config = ModelConfig()
    return BaseModel(DEFAULT_BASE_MODEL, config, init_params(config, seed=0), Tokenizer())


_REGISTRY[DEFAULT_BASE_MODEL] = _random_tiny


def _shipped_base() -> BaseModel:
    """The pretrained checkpoint shipped in ``base/`` (``scripts/build_base_checkpoint.py``)."""
    from .base import load_base

    return load_base()


_REGISTRY["rsigym-base"] = _shipped_base


def loadable_elsewhere(base_model: str) -> bool:
    """Can another process load ``base_model``? (the shipped ones, and ones registered from a directory,
    given :func:`registered_bases`; not ones registered with a callable, such as tests' in-memory models)"""
    source = _REGISTRY.get(base_model)
    return isinstance(source, Path) or source in (_shipped_base, _random_tiny)


def registered_bases() -> dict[str, str]:
    """The base models registered from a directory, ``{name: directory}``: what another process must
    register to load the same models (:func:`register_bases`)."""
    return {name: str(path) for name, path in _REGISTRY.items() if isinstance(path, Path)}


def register_bases(bases: dict[str, str]) -> None:
    """Register another process's :func:`registered_bases` in this one."""
    for name, path in bases.items():
        if _REGISTRY.get(name) != Path(path):
            register_base_model(name, path)


def base_model_source(name: str) -> Path | Callable[[], BaseModel]:
    """Where the base model ``name`` is loaded from (a checkpoint directory or a loader), to register it under
    another name too (``register_base_model(other, base_model_source(name))``)."""
    with _REGISTRY_LOCK:
        if name not in _REGISTRY:
            raise UnknownModelError(f"unknown base model {name!r}; base models: {', '.join(sorted(_REGISTRY))}")
        return _REGISTRY[name]


def make_random_base(directory: str | Path, config: ModelConfig, seed: int = 0) -> Path:
    """Write a randomly initialised checkpoint (for tests and examples) and return its directory."""
    return save_model(directory, config, init_params(config, seed), Tokenizer(), extra={"origin": f"random init, seed {seed}"})


def load_base_model(name: str, overrides: Mapping[str, str | Path] | None = None) -> BaseModel:
    """The base model registered as ``name`` (loaded once per process, weights read-only)."""
    source: Path | Callable[[], BaseModel] | None = None
    if overrides and name in overrides:
        source = Path(overrides[name])
    else:
        source = _REGISTRY.get(name)
    if source is None:
        known = sorted(set(_REGISTRY) | set(overrides or {}))
        raise UnknownModelError(f"unknown base model {name!r}; base models: {', '.join(known)}")
    key = (name, str(source) if isinstance(source, Path) else "builtin")
    with _REGISTRY_LOCK:
        if key not in _LOADED:
            if isinstance(source, Path):
                if not (source / "config.json").is_file() or not (source / "weights.npz").is_file():
                    raise UnknownModelError(f"base model {name!r}: no checkpoint (config.json, weights.npz) in {source}")
                config, params, _ = load_model(source)
                tok_path = source / "tokenizer.json"
                tokenizer = Tokenizer.load(tok_path) if tok_path.exists() else Tokenizer()
                base = BaseModel(name, config, params, tokenizer)
            else:
                base = source()
                base = BaseModel(name, base.config, base.params, base.tokenizer)
            if base.tokenizer.vocab_size > base.config.vocab_size:
                raise ValueError(f"base model {name!r}: tokenizer has more ids than the model's vocabulary")
            for p in base.params.values():
                p.setflags(write=False)
            _LOADED[key] = base
        return _LOADED[key]


# --- futures -----------------------------------------------------------------------------------


def _done(value: T) -> AwaitableConcurrentFuture[T]:
    fut: Future[T] = Future()
    fut.set_result(value)
    return AwaitableConcurrentFuture(fut)


def _client_future(value: T) -> "_ClientFuture[T]":
    fut: Future[T] = Future()
    fut.set_result(value)
    return _ClientFuture(fut)


class _ClientFuture(AwaitableConcurrentFuture[T]):
    """A future of a client that, like tinker 0.38's backcompat futures, can still (deprecated)
    be used as the client itself."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        warnings.warn(
            f"Reading `.{name}` from the future returned by a client-creation method is deprecated; "
            "call .result() on the future, or await it, to get the client first.",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(self.result(), name)


class _Worker:
    """One thread running a client's requests in submission order."""

    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., T], *args: Any) -> AwaitableConcurrentFuture[T]:
        return AwaitableConcurrentFuture(self._pool.submit(fn, *args))

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# --- paths and files ---------------------------------------------------------------------------


Kind = Literal["weights", "sampler_weights"]


def parse_tinker_path(path: str) -> tuple[str, Kind, str]:
    """``tinker://RUN/weights/NAME`` → (RUN, "weights", NAME).

    >>> parse_tinker_path("tinker://s0001:train:0/sampler_weights/final")
    ('s0001:train:0', 'sampler_weights', 'final')
    """
    if not isinstance(path, str) or not path.startswith("tinker://"):
        raise CheckpointNotFoundError(f"not a tinker:// path: {path!r}")
    parts = path[len("tinker://"):].split("/")
    if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights") or not parts[0] or not parts[2]:
        raise CheckpointNotFoundError(
            f"malformed checkpoint path {path!r}; expected tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME")
    return parts[0], parts[1], parts[2]  # type: ignore[return-value]


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


# --- datum → arrays ----------------------------------------------------------------------------


@dataclass
class _Batch:
    tokens: list[np.ndarray]
    inputs: list[dict[str, np.ndarray]]


def _as_array(value: Any, dtype: Any) -> np.ndarray:
    if isinstance(value, types.TensorData):
        return np.asarray(value.to_numpy(), dtype=dtype).reshape(-1)
    return np.asarray(value, dtype=dtype).reshape(-1)


def _check_data(data: Sequence[types.Datum], loss_fn: str, config: ModelConfig) -> _Batch:
    if not data:
        raise ValueError("No data provided")
    if loss_fn not in SUPPORTED_LOSSES:
        raise ValueError(f"loss_fn {loss_fn!r} is not supported by the local client (supported: {', '.join(SUPPORTED_LOSSES)})")
    needs = {"cross_entropy": ("target_tokens",), "importance_sampling": ("target_tokens", "logprobs", "advantages")}[loss_fn]
    batch = _Batch([], [])
    for i, datum in enumerate(data):
        if not isinstance(datum, types.Datum):
            raise TypeError(f"datum {i}: expected tinker.types.Datum, got {type(datum).__name__}")
        tokens = np.asarray(datum.model_input.to_ints(), dtype=np.int64)
        n = tokens.size
        if n == 0:
            raise ValueError(f"datum {i}: empty model_input")
        if n > config.max_seq_len:
            raise ContextOverflowError(f"datum {i}: {n} input tokens exceed the model's context of {config.max_seq_len}")
        if tokens.min() < 0 or tokens.max() >= config.vocab_size:
            raise ValueError(f"datum {i}: token ids must be in [0, {config.vocab_size})")
        fields: dict[str, np.ndarray] = {}
        for key in needs:
            if key not in datum.loss_fn_inputs:
                raise ValueError(f"datum {i}: loss_fn_inputs[{key!r}] is required by {loss_fn}")
        for key, value in datum.loss_fn_inputs.items():
            arr = _as_array(value, np.int64 if key == "target_tokens" else np.float64)
            if arr.size != n:
                raise ValueError(f"datum {i}: loss_fn_inputs[{key!r}] has {arr.size} entries for {n} input tokens")
            fields[key] = arr
        t = fields["target_tokens"]
        if t.min() < 0 or t.max() >= config.vocab_size:
            raise ValueError(f"datum {i}: target token ids must be in [0, {config.vocab_size})")
        fields.setdefault("weights", np.ones(n))
        batch.tokens.append(tokens)
        batch.inputs.append(fields)
    return batch


TRAIN_SHARDS = 2  # micro-batches computed at once (one thread each); part of the result: see _chunks


def _chunks(lengths: Sequence[int], max_tokens: int, shards: int = TRAIN_SHARDS) -> list[list[int]]:
    """Indices in micro-batches: longest first, dealt round-robin into the fewest groups, a multiple of
    ``shards`` (at most one per row), whose padded tokens (rows × their longest) stay within ``max_tokens``.

    The groups are a function of the lengths alone, so a batch's gradient (the groups' sums, added in
    group order) is the same on any machine however many groups run at once; ``shards`` groups of
    similar size let that many threads share the work.

    >>> _chunks([5, 9, 7, 3], max_tokens=100)
    [[1, 0], [2, 3]]
    >>> _chunks([5, 9, 7, 3], max_tokens=9), _chunks([4], max_tokens=100)
    ([[1], [2], [0], [3]], [[0]])
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    longest, n = lengths[order[0]], len(order)
    groups = min(n, shards)
    while groups < n and -(-n // groups) * longest > max_tokens:
        groups = min(n, groups + shards)
    return [order[j::groups] for j in range(groups)]


_SHARD_POOL: ThreadPoolExecutor | None = None


def _shard_pool() -> ThreadPoolExecutor:
    """The threads that compute a batch's micro-batches (one each, BLAS on one thread: see ``_chunks``)."""
    global _SHARD_POOL
    if _SHARD_POOL is None:
        _SHARD_POOL = ThreadPoolExecutor(max_workers=TRAIN_SHARDS, thread_name_prefix="tinker-local-shard")
    return _SHARD_POOL


# --- training client ---------------------------------------------------------------------------


class LocalTrainingClient:
    """Mirrors ``tinker.TrainingClient`` over the local NumPy model (LoRA training).

    Gradients of successive ``forward_backward`` calls add up until ``optim_step`` applies
    them (AdamW with ``tinker.types.AdamParams``) and clears them.
    """

    def __init__(self, service: "LocalServiceClient", model_id: str, base: BaseModel, lora_config: LoraConfig,
                 lora: Params, optimizer: Adam | None = None):
        self.service = service
        self.model_id = model_id
        self._base = base
        self._lora_config = lora_config
        self._model = Transformer(base.config, base.params, lora, lora_config)
        self._adam = optimizer or Adam()
        self._grads: Params = {}
        self._steps = self._adam.t
        self._worker = _Worker(f"tinker-local-train-{model_id}")
        service._track(self._worker)
        self._info = types.GetInfoResponse(
            model_data=types.ModelData(arch="rsigym-numpy-transformer", model_name=base.name,
                                       tokenizer_id=base.tokenizer.name),
            model_id=model_id, is_lora=True, lora_rank=lora_config.rank, model_name=base.name)

    # --- forward / backward -----------------------------------------------------------------
    def _run(self, batch: _Batch, loss_fn: str, cfg: Mapping[str, Any], backward: bool) -> types.ForwardBackwardOutput:
        outputs: list[dict[str, types.TensorData]] = [{} for _ in batch.tokens]
        loss_sum = 0.0
        lengths = [t.size for t in batch.tokens]
        groups = _chunks(lengths, self.service.max_tokens_per_chunk)
        # the groups run at once on the shard threads; their results are added up in group order
        for group, (logp, grads) in zip(groups, _shard_pool().map(
                lambda group: self._group(batch, group, lengths, loss_fn, backward), groups)):
            for name, g in grads.items():
                if name in self._grads:
                    self._grads[name] += g
                else:
                    self._grads[name] = g
            for r, i in enumerate(group):
                f, lp = batch.inputs[i], logp[r, :lengths[i]]
                if loss_fn == "cross_entropy":
                    elem = -lp * f["weights"]
                else:
                    elem = -np.exp(lp - f["logprobs"]) * f["advantages"]
                loss_sum += float(elem.sum())
                outputs[i] = {"logprobs": types.TensorData.from_numpy(lp.astype(np.float32)),
                              "elementwise_loss": types.TensorData.from_numpy(elem.astype(np.float32))}
        return types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs,
                                           metrics={"loss:sum": loss_sum})

    def _group(self, batch: _Batch, group: list[int], lengths: list[int], loss_fn: str,
               backward: bool) -> tuple[np.ndarray, Params]:
        """One micro-batch (rows ``group``; padded here, computed on the rows' own tokens only: the model's
        packed path, ``lengths``): its target log-probabilities (float64, 0 past a row's length) and, with
        ``backward``, its gradients."""
        model = self._model
        dtype = model.dtype
        width = lengths[group[0]]
        tok = np.zeros((len(group), width), np.int64)
        tgt = np.zeros((len(group), width), np.int64)
        for r, i in enumerate(group):
            tok[r, :lengths[i]] = batch.tokens[i]
            tgt[r, :lengths[i]] = batch.inputs[i]["target_tokens"]
        own = [lengths[i] for i in group]
        if not backward:
            return model.token_logprobs(tok, tgt, own).astype(np.float64), {}
        coef = np.zeros((len(group), width), np.float64)
        for r, i in enumerate(group):
            coef[r, :lengths[i]] = -batch.inputs[i]["weights"]
        if loss_fn == "importance_sampling":
            adv = np.zeros_like(coef)
            old = np.zeros_like(coef)
            for r, i in enumerate(group):
                adv[r, :lengths[i]] = batch.inputs[i]["advantages"]
                old[r, :lengths[i]] = batch.inputs[i]["logprobs"]
            coef = lambda lp: (-adv * np.exp(lp - old)).astype(dtype)  # noqa: E731  dL/dlp of -Σ ratio·A
        logp, grads = model.loss_and_grad(tok, tgt, coef if callable(coef) else coef.astype(dtype),
                                          train_base=False, train_lora=True, lengths=own)
        return logp.astype(np.float64), grads

    def forward(self, data: list[types.Datum], loss_fn: types.LossFnType,
                loss_fn_config: Mapping[str, float | str] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss and per-token outputs without gradients (``loss_fn_outputs[i]["logprobs"]``)."""
        batch = _check_data(data, loss_fn, self._base.config)
        return self._worker.submit(self._run, batch, loss_fn, loss_fn_config or {}, False)

    def forward_backward(self, data: list[types.Datum], loss_fn: types.LossFnType,
                         loss_fn_config: Mapping[str, float | str] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """Loss, per-token outputs, and gradients (accumulated until ``optim_step``).

        ``cross_entropy``: ``loss = Σ −logprob(target) · weight`` (``metrics["loss:sum"]``);
        ``importance_sampling``: ``loss = −Σ exp(logprob − sampling logprob) · advantage``.
        """
        batch = _check_data(data, loss_fn, self._base.config)
        return self._worker.submit(self._run, batch, loss_fn, loss_fn_config or {}, True)

    def forward_backward_custom(self, data: list[types.Datum], loss_fn: Callable[..., Any], *,
                                loss_type_input: Literal["logprobs"] | None = None) -> APIFuture[types.ForwardBackwardOutput]:
        """A custom loss ``fn(data, logprobs_list) -> (loss, metrics)`` in torch, as in Tinker: a
        forward pass gives the log-probabilities, torch differentiates the loss, and a linear
        cross-entropy surrogate with ``weights = −dloss/dlogprobs`` carries the gradient."""
        try:
            import torch
        except ImportError:
            raise ImportError("PyTorch is not installed. Cannot run custom forward_backward.") from None
        if not callable(loss_fn) or hasattr(loss_fn, "session_id"):
            raise NotImplementedError("the local client runs custom losses given as callables, not LossHandles")
        batch = _check_data(data, "cross_entropy", self._base.config)

        def run() -> types.ForwardBackwardOutput:
            fwd = self._run(batch, "cross_entropy", {}, False)
            logprobs = [torch.tensor(o["logprobs"].to_numpy(), dtype=torch.float32).requires_grad_(True)
                        for o in fwd.loss_fn_outputs]
            loss, metrics = loss_fn(list(data), logprobs)
            loss.backward()
            for i, lp in enumerate(logprobs):
                if lp.grad is None:
                    raise ValueError("No gradient computed for logprob tensor")
                batch.inputs[i]["weights"] = -lp.grad.detach().numpy().astype(np.float64)
            out = self._run(batch, "cross_entropy", {}, True)
            surrogate = out.metrics.pop("loss:sum")
            out.metrics.update({k: float(v) for k, v in metrics.items()})
            out.metrics["loss:sum"] = float(loss.detach().sum().item())
            out.metrics["surrogate_loss:sum"] = surrogate
            return out

        return self._worker.submit(run)

    # --- optimizer ----------------------------------------------------------------------------
    def optim_step(self, optim_params: types.AdamParams | None = None, *,
                   adam_params: types.AdamParams | None = None) -> APIFuture[types.OptimStepResponse]:
        """Apply the accumulated gradients with AdamW (``torch.optim.AdamW`` semantics, Tinker's
        ``AdamParams`` fields and defaults) and clear them."""
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise TypeError("Expected AdamParams")
        if not (math.isfinite(params.learning_rate) and params.learning_rate >= 0):
            raise ValueError("learning_rate must be a finite number >= 0")

        def run() -> types.OptimStepResponse:
            lora = self._model.lora
            assert lora is not None
            grads = {k: self._grads.get(k, np.zeros_like(v)) for k, v in lora.items()}
            stats = self._adam.step(lora, grads, params)
            self._grads = {}
            self._model.weights_changed()
            self._steps += 1
            return types.OptimStepResponse(metrics={"grad_norm:mean": stats["grad_norm"],
                                                    "grad_clip_scale:mean": stats["grad_scale"]})

        return self._worker.submit(run)

    # --- checkpoints --------------------------------------------------------------------------
    def _snapshot(self) -> Params:
        assert self._model.lora is not None
        return {k: v.copy() for k, v in self._model.lora.items()}

    def _meta(self, kind: str, name: str, user_metadata: Mapping[str, str] | None) -> dict[str, Any]:
        return {"kind": kind, "name": name, "model_id": self.model_id, "base_model": self._base.name,
                "lora_config": self._lora_config.to_dict(), "optimizer_steps": self._steps,
                "user_metadata": dict(user_metadata or {})}

    def _save(self, kind: Kind, name: str, overwrite: bool, user_metadata: Mapping[str, str] | None,
              with_optimizer: bool) -> str:
        directory = self.service._checkpoint_dir(self.model_id, kind, name)
        if (directory / "meta.json").exists() and not overwrite:
            raise FileExistsError(f"checkpoint tinker://{self.model_id}/{kind}/{name} already exists (overwrite=True replaces it)")
        directory.mkdir(parents=True, exist_ok=True)
        save_npz(directory / "adapter.npz", self._snapshot())
        if with_optimizer:
            save_npz(directory / "optimizer.npz", self._adam.state())
        _write_json(directory / "meta.json", self._meta(kind, name, user_metadata))
        return f"tinker://{self.model_id}/{kind}/{name}"

    def save_state(self, name: str, ttl_seconds: int | None = None, overwrite: bool = False,
                   user_metadata: dict[str, str] | None = None) -> APIFuture[types.SaveWeightsResponse]:
        """Save adapter weights and optimizer state → ``tinker://RUN/weights/NAME``."""
        _check_name(name)
        return self._worker.submit(
            lambda: types.SaveWeightsResponse(path=self._save("weights", name, overwrite, user_metadata, True)))

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None,
                                 user_metadata: dict[str, str] | None = None) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        """Save adapter weights for sampling → ``tinker://RUN/sampler_weights/NAME``."""
        _check_name(name)
        return self._worker.submit(
            lambda: types.SaveWeightsForSamplerResponse(path=self._save("sampler_weights", name, False, user_metadata, False)))

    def save_weights_and_get_sampling_client(self, name: str | None = None, retry_config: Any = None,
                                             record_stability_info: bool = False,
                                             kind: types.SamplingClientKind = "snapshot") -> AwaitableConcurrentFuture["LocalSamplingClient"]:
        """An (unsaved) sampling client over a snapshot of the current weights."""
        def run() -> LocalSamplingClient:
            model = Transformer(self._base.config, self._base.params, self._snapshot(), self._lora_config).merged()
            return self.service._sampling_client(self._base, model, model_path=None)

        return _ClientFuture(self._worker.submit(run).future())

    def create_sampling_client(self, model_path: str, retry_config: Any = None,
                               record_stability_info: bool = False) -> AwaitableConcurrentFuture["LocalSamplingClient"]:
        return self.service.create_sampling_client(model_path=model_path)

    @property
    def max_seq_len(self) -> int:
        """The model's context in tokens (not part of Tinker's API)."""
        return self._base.config.max_seq_len

    def get_info(self) -> types.GetInfoResponse:
        return self._info

    def get_tokenizer(self) -> Tokenizer:
        return self._base.tokenizer

    def __repr__(self) -> str:
        return f"LocalTrainingClient(model_id={self.model_id!r}, base_model={self._base.name!r}, rank={self._lora_config.rank})"


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"checkpoint name {name!r}: use 1-128 characters from A-Z a-z 0-9 . _ - (not starting with . _ -)")


# --- sampling client ---------------------------------------------------------------------------


PREFILLS = PrefillCache()  # this process's prefill blocks, by (sampling client, scope, prompt up to the block's end)


class LocalSamplingClient:
    """Mirrors ``tinker.SamplingClient``: ``sample`` returns a real ``tinker.types.SampleResponse``.

    ``model`` (merged weights) and ``tokenizer`` are public for in-process users such as the
    model server.
    """

    supports_prefill_scope = True  # sample_scoped(): see there

    def __init__(self, service: "LocalServiceClient", base: BaseModel, model: Transformer, session_id: str,
                 model_path: str | None):
        self.service = service
        self.model = model
        self.tokenizer = base.tokenizer
        self.model_path = model_path
        self._base = base
        self._session_id = session_id
        self._counter = 0
        self._lock = threading.Lock()
        self._worker = _Worker(f"tinker-local-sample-{session_id}")
        self.prefill_identity = object()  # names these (immutable) weights in prefill caches
        service._track(self._worker)

    def _stops(self, stop: Any) -> tuple[list[int], list[str]]:
        if stop is None:
            return [self.tokenizer.eos_token_id], []
        if isinstance(stop, str):
            return [], [stop]
        stop = list(stop)
        if all(isinstance(s, str) for s in stop):
            return [], stop
        if all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in stop):
            return [int(s) for s in stop], []
        raise ValueError("stop must be a string, a list of strings or a list of token ids")

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
               include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0, topk_sample_logprobs: int = 0,
               target_prompt_logprobs: types.TensorData | None = None, prompt_alt_tokens_k: int = 0,
               prompt_logprobs_last_n: int | None = None) -> APIFuture[types.SampleResponse]:
        """``num_samples`` continuations of ``prompt`` (KV-cached, seeded by ``sampling_params.seed``).

        ``stop=None`` stops at the end-of-turn token ``<|end|>``; ``[]`` never stops early.
        Stop tokens or strings are included in the returned tokens.
        """
        return self.sample_scoped(prompt, num_samples, sampling_params, None, include_prompt_logprobs=include_prompt_logprobs,
                                  topk_prompt_logprobs=topk_prompt_logprobs, topk_sample_logprobs=topk_sample_logprobs,
                                  target_prompt_logprobs=target_prompt_logprobs, prompt_alt_tokens_k=prompt_alt_tokens_k,
                                  prompt_logprobs_last_n=prompt_logprobs_last_n)

    def sample_scoped(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
                      prefill_scope: str | None, *, prefill_cache: PrefillCache | None = None,
                      include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0, topk_sample_logprobs: int = 0,
                      target_prompt_logprobs: types.TensorData | None = None, prompt_alt_tokens_k: int = 0,
                      prompt_logprobs_last_n: int | None = None) -> APIFuture[types.SampleResponse]:
        """:meth:`sample`, and (a local extension; Tinker's client has none) requests with the same
        ``prefill_scope`` share the prefill blocks of their prompts' common beginnings
        (:class:`~.model.PrefillCache`; the samples do not change) — in ``prefill_cache``, by default
        this process's ``PREFILLS``. Requests in different scopes never do; ``None`` shares nothing."""
        if topk_prompt_logprobs or topk_sample_logprobs or target_prompt_logprobs is not None or prompt_alt_tokens_k:
            raise NotImplementedError("the local sampler supports include_prompt_logprobs, not top-k/target/alt-token logprobs")
        if num_samples < 1:
            raise ValueError("num_samples must be >= 1")
        tokens = prompt.to_ints()
        cfg = self.model.config
        if not tokens:
            raise ValueError("empty prompt")
        if len(tokens) >= cfg.max_seq_len:
            raise ContextOverflowError(f"prompt of {len(tokens)} tokens leaves no room in the context of {cfg.max_seq_len}")
        if min(tokens) < 0 or max(tokens) >= cfg.vocab_size:
            raise ValueError(f"token ids must be in [0, {cfg.vocab_size})")
        stop_tokens, stop_strings = self._stops(sampling_params.stop)
        sp = sampling_params
        last_n = prompt_logprobs_last_n
        if last_n is not None and not (include_prompt_logprobs and 1 <= last_n <= len(tokens) - 1):
            raise ValueError("prompt_logprobs_last_n needs include_prompt_logprobs and must be in [1, len(prompt) - 1]")
        with self._lock:
            first = self._counter
            self._counter += num_samples

        def run() -> types.SampleResponse:
            gens = self.model.generate([tokens], sp.max_tokens, temperature=sp.temperature, top_k=sp.top_k,
                                       top_p=sp.top_p, seed=sp.seed, stop_tokens=stop_tokens, stop_strings=stop_strings,
                                       token_bytes=self.tokenizer.token_bytes, num_samples=num_samples,
                                       prefill_cache=None if prefill_scope is None else prefill_cache or PREFILLS,
                                       prefill_key=(self.prefill_identity, prefill_scope))[0]
            seqs = [types.SampledSequence(stop_reason=g.stop_reason, sequence_id=f"{self._session_id}:{first + j}",
                                          tokens_np=np.asarray(g.tokens, np.int32),
                                          logprobs_np=np.asarray(g.logprobs, np.float32)) for j, g in enumerate(gens)]
            prompt_lp = None
            if include_prompt_logprobs:
                prompt_lp = self._prompt_logprobs(tokens, last_n)
            return types.SampleResponse(sequences=seqs, prompt_logprobs_np=prompt_lp)

        return self._worker.submit(run)

    def _prompt_logprobs(self, tokens: list[int], last_n: int | None) -> np.ndarray:
        arr = np.asarray(tokens, np.int64)[None]
        lp = self.model.token_logprobs(arr[:, :-1], arr[:, 1:])[0].astype(np.float32)
        out = np.concatenate([[np.nan], lp]).astype(np.float32)
        if last_n is not None:
            out[: len(tokens) - last_n] = np.nan
        return out

    def compute_logprobs(self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None) -> APIFuture[list[float | None]]:
        """log p(token_i | tokens before it) for every prompt token (``None`` for the first)."""
        tokens = prompt.to_ints()
        if len(tokens) > self.model.config.max_seq_len:
            raise ContextOverflowError(f"prompt of {len(tokens)} tokens exceeds the context of {self.model.config.max_seq_len}")

        def run() -> list[float | None]:
            lp = self._prompt_logprobs(tokens, prompt_logprobs_last_n)
            return [None if np.isnan(x) else float(x) for x in lp]

        return self._worker.submit(run)

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    def get_base_model(self) -> str:
        return self._base.name

    def __repr__(self) -> str:
        return f"LocalSamplingClient(base_model={self._base.name!r}, model_path={self.model_path!r})"


# --- service client ----------------------------------------------------------------------------


class LocalServiceClient:
    """Mirrors ``tinker.ServiceClient``, in process, over the local model.

    Args:
        user_metadata, project_id, display_name, base_url, api_key, default_headers_overrides:
            accepted for signature compatibility and ignored (nothing leaves the process).
        root_dir: where runs and checkpoints live (default: ``$RSIGYM_TINKER_ROOT``, else a new
            temporary directory).
        base_models: extra ``{name: checkpoint directory}`` for this client only.
        max_tokens_per_chunk: padded tokens per internal micro-batch (memory bound).
    """

    def __init__(self, user_metadata: dict[str, str] | None = None, project_id: str | None = None, *,
                 display_name: str | None = None, base_url: str | None = None, api_key: str | None = None,
                 default_headers_overrides: Mapping[str, str] | None = None, root_dir: str | Path | None = None, base_models: Mapping[str, str | Path] | None = None,
                 max_tokens_per_chunk: int = 8192, **kwargs: Any):
        if kwargs:
            warnings.warn(f"LocalServiceClient ignores unsupported arguments: {', '.join(sorted(kwargs))}",
                          FutureWarning, stacklevel=2)
        root = root_dir or os.environ.get("RSIGYM_TINKER_ROOT") or tempfile.mkdtemp(prefix="rsigym-tinker-")
        self.root_dir = Path(root)
        (self.root_dir / "runs").mkdir(parents=True, exist_ok=True)
        self.base_models_override = dict(base_models or {})
        self.max_tokens_per_chunk = int(max_tokens_per_chunk)
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._closed = False
        self._session_id = self._claim_session()
        self._train_seq = 0
        self._sample_seq = 0

    def _claim_session(self) -> str:
        sessions = self.root_dir / "sessions"
        sessions.mkdir(exist_ok=True)
        n = len(list(sessions.iterdir())) + 1
        while True:
            sid = f"s{n:04d}"
            try:
                (sessions / sid).mkdir()
                return sid
            except FileExistsError:
                n += 1

    @property
    def session_id(self) -> str:
        return self._session_id

    def _track(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                worker.close()
                raise RuntimeError("ServiceClient is closed")
            self._workers.append(worker)

    def _checkpoint_dir(self, run_id: str, kind: str, name: str) -> Path:
        return self.root_dir / "runs" / run_id / kind / name

    def checkpoint_dir(self, path: str) -> Path:
        """Where a ``tinker://RUN/KIND/NAME`` checkpoint's files are."""
        return self._checkpoint_dir(*parse_tinker_path(path))

    def _resolve(self, path: str) -> tuple[Path, dict[str, Any]]:
        run_id, kind, name = parse_tinker_path(path)
        directory = self._checkpoint_dir(run_id, kind, name)
        if not (directory / "meta.json").exists():
            raise CheckpointNotFoundError(f"no checkpoint at {path} (looked in {directory})")
        return directory, json.loads((directory / "meta.json").read_text())

    def _next_id(self, what: str) -> str:
        with self._lock:
            if self._closed:
                raise RuntimeError("ServiceClient is closed")
            if what == "train":
                n, self._train_seq = self._train_seq, self._train_seq + 1
            else:
                n, self._sample_seq = self._sample_seq, self._sample_seq + 1
        return f"{self._session_id}:{what}:{n}"

    def base_model(self, name: str) -> BaseModel:
        """The base model ``name`` (registered globally or given to this client)."""
        return load_base_model(name, self.base_models_override)

    def list_base_models(self) -> list[str]:
        """Names usable as ``base_model`` (not part of Tinker's API)."""
        return sorted(set(_REGISTRY) | set(self.base_models_override))

    def _new_training_client(self, base: BaseModel, lora_config: LoraConfig, lora: Params,
                             optimizer: Adam | None, provenance: Mapping[str, Any]) -> "LocalTrainingClient":
        model_id = self._next_id("train")
        run_dir = self.root_dir / "runs" / model_id
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_json(run_dir / "run.json", {"model_id": model_id, "base_model": base.name,
                                           "lora_config": lora_config.to_dict(), **provenance})
        return LocalTrainingClient(self, model_id, base, lora_config, lora, optimizer)

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    train_mlp: bool = True, train_attn: bool = True, train_unembed: bool = True,
                                    user_metadata: dict[str, str] | None = None,
                                    optimizer: types.OptimizerConfig | None = None) -> AwaitableConcurrentFuture[LocalTrainingClient]:
        """A training client with fresh LoRA adapters (B = 0: it starts as the base model)."""
        if not any([train_mlp, train_attn, train_unembed]):
            raise ValueError("At least one of train_mlp, train_attn, or train_unembed must be True")
        if not (isinstance(rank, int) and 1 <= rank <= MAX_LORA_RANK):
            raise ValueError(f"rank must be an integer in [1, {MAX_LORA_RANK}]")
        if optimizer is not None and getattr(optimizer, "type", "adamw") != "adamw":
            raise ValueError("the local client only has the AdamW optimizer")
        base = self.base_model(base_model)
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (2**31))
        lcfg = LoraConfig(rank=rank, alpha=LORA_ALPHA, train_attn=train_attn, train_mlp=train_mlp,
                          train_unembed=train_unembed)
        lora = init_lora(base.config, lcfg, seed)
        client = self._new_training_client(base, lcfg, lora, None, {"seed": seed, "user_metadata": user_metadata or {}})
        return _client_future(client)

    def _from_state(self, path: str, base_model: str | None, with_optimizer: bool,
                    user_metadata: dict[str, str] | None) -> AwaitableConcurrentFuture[LocalTrainingClient]:
        directory, meta = self._resolve(path)
        base = self.base_model(base_model or meta["base_model"])
        lcfg = LoraConfig.from_dict(meta["lora_config"])
        lora = {k: v.copy() for k, v in load_npz(directory / "adapter.npz").items()}
        optimizer = None
        if with_optimizer:
            if not (directory / "optimizer.npz").exists():
                raise CheckpointNotFoundError(f"{path} has no optimizer state (save it with save_state)")
            optimizer = Adam.from_state(load_npz(directory / "optimizer.npz"))
        client = self._new_training_client(base, lcfg, lora, optimizer,
                                           {"loaded_from": path, "user_metadata": user_metadata or {}})
        return _client_future(client)

    def create_training_client_from_state(self, path: str, base_model: str | None = None,
                                          user_metadata: dict[str, str] | None = None,
                                          weights_access_token: str | None = None,
                                          optimizer: types.OptimizerConfig | None = None) -> AwaitableConcurrentFuture[LocalTrainingClient]:
        """A training client from saved weights (optimizer state starts fresh)."""
        return self._from_state(path, base_model, False, user_metadata)

    def create_training_client_from_state_with_optimizer(self, path: str, base_model: str | None = None,
                                                         user_metadata: dict[str, str] | None = None,
                                                         weights_access_token: str | None = None) -> AwaitableConcurrentFuture[LocalTrainingClient]:
        """A training client from saved weights and Adam state (a ``save_state`` checkpoint)."""
        return self._from_state(path, base_model, True, user_metadata)

    def _sampling_client(self, base: BaseModel, model: Transformer, model_path: str | None) -> LocalSamplingClient:
        return LocalSamplingClient(self, base, model, self._next_id("sample"), model_path)

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None,
                               retry_config: Any = None, record_stability_info: bool = False) -> AwaitableConcurrentFuture[LocalSamplingClient]:
        """A sampling client for a saved checkpoint (either kind of path) or a base model."""
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")
        if model_path is None:
            base = self.base_model(base_model)  # type: ignore[arg-type]
            model = Transformer(base.config, base.params)
        else:
            directory, meta = self._resolve(model_path)
            base = self.base_model(base_model or meta["base_model"])
            lcfg = LoraConfig.from_dict(meta["lora_config"])
            model = Transformer(base.config, base.params, load_npz(directory / "adapter.npz"), lcfg).merged()
        return _client_future(self._sampling_client(base, model, model_path))

    def close(self, status: Literal["success", "errored", "interrupted"],
              detail: str | None = None) -> AwaitableConcurrentFuture[None]:
        """Finish pending requests and stop the clients' worker threads."""
        with self._lock:
            workers, self._workers, self._closed = self._workers, [], True
        for w in workers:
            w.close()
        return _done(None)

    def __enter__(self) -> "LocalServiceClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close("success" if exc[0] is None else "errored")

    def __repr__(self) -> str:
        return f"LocalServiceClient(root_dir={str(self.root_dir)!r}, session={self._session_id!r})"


def weights_identity(checkpoint_dir: Path, base: str) -> str | None:
    """A content hash of a checkpoint's weights: ``base`` (what it was trained from), its LoRA
    configuration and every array of its ``.npz`` files — not names, paths or file timestamps. None
    when the checkpoint cannot be read.

    Two checkpoints with the same identity sample the same tokens for the same seed."""
    try:
        meta = json.loads((checkpoint_dir / "meta.json").read_text())
        digest = hashlib.sha256(json.dumps({"from": base, "base_model": meta.get("base_model"),
                                            "lora": meta.get("lora_config")}, sort_keys=True).encode())
        files = sorted(checkpoint_dir.glob("*.npz"))
        if not files:
            return None
        for file in files:
            with np.load(file, allow_pickle=False) as arrays:
                for name in sorted(arrays.files):
                    array = arrays[name]
                    digest.update(f"{file.name}/{name}:{array.dtype.str}:{array.shape}".encode())
                    digest.update(np.ascontiguousarray(array).tobytes())
        return f"{base}+{digest.hexdigest()}"
    except (OSError, ValueError, KeyError, TypeError):
        return None
