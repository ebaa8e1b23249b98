"""The offline **local** world: a real tiny language model behind a Tinker-shaped client.

By subsystem: ``world`` (``LocalWorld``: the shared services of :mod:`rsigym_env.worlds.common` wired to this
machine), ``lm/`` (the model stack), ``sandbox/`` (bubblewrap + envd), ``harbor/`` (trials in bubblewrap),
``benchmarks/``, ``teachers``. The model stack's names are re-exported here:

* ``lm.model``: the NumPy transformer — forward, hand-written backward, LoRA, AdamW, KV-cached
  batched sampling.
* ``lm.tinker_client``: ``LocalServiceClient`` with tinker 0.38's signatures, returning real
  ``tinker.types`` objects and ``tinker.APIFuture`` futures; checkpoints on disk.
* ``lm.chat``: checkpoints as servable chat models.
* shared with the remote world: ``common.tokenizer`` (byte-level tokenizer, optional BPE merges, and chat
  renderers: messages → tokens and per-token training weights, ``TrainOnWhat``) and ``common.training`` (the
  supervised loop over chat JSONL, written against the Tinker client interface only: it runs unchanged against
  ``tinker.ServiceClient``).

``lm.tinker_client`` and ``common.training`` need the ``tinker`` package (the ``services`` extra); they are
imported on first use. Model work runs its matrix products on one OpenBLAS thread, set
process-wide (``set_blas_threads(n)`` to change it before computing; see ``lm.model.set_blas_threads``).

>>> from rsigym_env.worlds.local import Tokenizer, ChatRenderer, ModelConfig
>>> ChatRenderer(Tokenizer()).get_stop_sequences()
[257]
"""

from __future__ import annotations

from typing import Any

from .lm.model import (
    Adam,
    AdamHyper,
    ContextOverflowError,
    Generation,
    LoraConfig,
    ModelConfig,
    Transformer,
    flops_per_token,
    init_lora,
    init_params,
    load_model,
    merge_lora,
    save_model,
    set_blas_threads,
)
from ..common.tokenizer import ChatRenderer, MessageError, RoleColonRenderer, Tokenizer, TrainOnWhat, get_renderer

_LAZY = {
    "LocalServiceClient": ".lm.tinker_client",
    "LocalTrainingClient": ".lm.tinker_client",
    "LocalSamplingClient": ".lm.tinker_client",
    "register_base_model": ".lm.tinker_client",
    "make_random_base": ".lm.tinker_client",
    "parse_tinker_path": ".lm.tinker_client",
    "UnknownModelError": ".lm.tinker_client",
    "CheckpointNotFoundError": ".lm.tinker_client",
    "DEFAULT_BASE_MODEL": ".lm.tinker_client",
    "SupervisedConfig": "..common.training",
    "SupervisedResult": "..common.training",
    "StepMetrics": "..common.training",
    "run_supervised": "..common.training",
    "load_chat_jsonl": "..common.training",
    "TrainingConfigError": "..common.training",
    "DatasetError": "..common.training",
    "LocalChatModel": ".lm.chat",
    "chat_model": ".lm.chat",
    "register_base": ".lm.chat",
    "register_checkpoint": ".lm.chat",
    "serve_checkpoints": ".lm.chat",
    "sampler_checkpoints": ".lm.chat",
}

__all__ = [
    "Adam", "AdamHyper", "ChatRenderer", "ContextOverflowError", "Generation", "LoraConfig", "MessageError",
    "ModelConfig", "RoleColonRenderer", "Tokenizer", "TrainOnWhat", "Transformer", "flops_per_token",
    "get_renderer", "init_lora", "init_params", "load_model", "merge_lora", "save_model", "set_blas_threads",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name], __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
