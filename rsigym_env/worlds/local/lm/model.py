"""A tiny decoder-only transformer in NumPy: forward, hand-written backward, LoRA, AdamW, sampling.

GPT-2 layout (pre-LayerNorm, learned positions, GELU MLP, no biases in the projections), with
tied or untied unembedding. Every layer has a forward and a backward function; the gradient
checks in ``tests/worlds/local/test_local_model.py`` compare each against finite differences in float64.
Normal use is float32; the same code runs in any float dtype the parameters have.

>>> cfg = ModelConfig(vocab_size=272, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=16)
>>> model = Transformer(cfg, init_params(cfg, seed=0))
>>> tokens = np.array([[1, 2, 3, 4]])
>>> logits = model.logits(tokens)
>>> logits.shape, logits.dtype
((1, 4, 272), dtype('float32'))
>>> out = model.generate([[1, 2, 3]], max_tokens=5, temperature=0.0)
>>> len(out[0][0].tokens), out[0][0].stop_reason
(5, 'length')

LoRA adapters start at zero (B = 0), so an adapted model first computes exactly the base model;
merging folds them into the weights:

>>> lcfg = LoraConfig(rank=4)
>>> lora = init_lora(cfg, lcfg, seed=1)
>>> sorted(lora)[:2]
['layers.0.attn.proj.lora_a', 'layers.0.attn.proj.lora_b']
>>> bool(np.allclose(Transformer(cfg, model.params, lora, lcfg).logits(tokens), logits))
True
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np
from threadpoolctl import ThreadpoolController

from ....errors import ActionError

Params = dict[str, np.ndarray]


class ContextOverflowError(ActionError, ValueError):
    """A sequence longer than the model's context (code ``invalid_args``)."""

    def __init__(self, message: str):
        super().__init__("invalid_args", message)


# --- BLAS threads -------------------------------------------------------------------------------

_THREADS = 1  # BLAS threads for model work (see set_blas_threads)
_LOCK = threading.Lock()


@functools.cache
def _blas_controller() -> ThreadpoolController:
    return ThreadpoolController()


def blas_threads() -> int | None:
    """The BLAS thread count of this process: the largest over every BLAS library loaded (a process can
    hold two OpenBLAS copies, e.g. NumPy's and SciPy's); None where threadpoolctl finds no BLAS."""
    pools = _blas_controller().select(user_api="blas").lib_controllers
    return max(int(pool.num_threads) for pool in pools) if pools else None


def _blas_on(n: int) -> bool:
    """Whether every loaded BLAS library runs on ``n`` threads (True where there is none)."""
    return all(int(pool.num_threads) == n for pool in _blas_controller().select(user_api="blas").lib_controllers)


def set_blas_threads(n: int) -> None:
    """Run the model's matrix products on ``n`` OpenBLAS threads (default 1), process-wide.

    One thread is the default: on the two cores the local world shares between model, server and
    sandbox, OpenBLAS's spinning worker threads make a second thread 10-20× slower as soon as
    another process is busy, and gain only ~1.5× on an idle machine (``bench/bench_model.py``).
    OpenBLAS's results depend on its thread count, so set it before computing, not during.
    """
    global _THREADS
    if n < 1:
        raise ValueError("n must be >= 1")
    _THREADS = int(n)
    _use_model_threads()


def _use_model_threads() -> None:
    """Before model work: put BLAS on the model's thread count. It is left there (not restored), so
    no thread ever changes it under another's running computation, and every result is a function
    of the inputs alone."""
    if not _blas_on(_THREADS):
        with _LOCK:
            _blas_controller().limit(limits=_THREADS, user_api="blas")


# --- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseModel:
    """A base model: name, shape, (read-only) weights and tokenizer (a :class:`~.tokenizer.Tokenizer`)."""

    name: str
    config: "ModelConfig"
    params: Params
    tokenizer: Any


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer.

    >>> ModelConfig().n_params()
    3351040
    """

    vocab_size: int = 272
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 1024
    max_seq_len: int = 512
    tie_embeddings: bool = True
    ln_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1")
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be a multiple of n_heads")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Name → shape of every parameter."""
        d, f = self.d_model, self.d_ff
        out: dict[str, tuple[int, ...]] = {"wte": (self.vocab_size, d), "wpe": (self.max_seq_len, d)}
        for i in range(self.n_layers):
            p = f"layers.{i}."
            out |= {p + "ln1.g": (d,), p + "ln1.b": (d,), p + "attn.qkv": (d, 3 * d), p + "attn.proj": (d, d),
                    p + "ln2.g": (d,), p + "ln2.b": (d,), p + "mlp.fc": (d, f), p + "mlp.proj": (f, d)}
        out |= {"lnf.g": (d,), "lnf.b": (d,)}
        if not self.tie_embeddings:
            out["unembed"] = (d, self.vocab_size)
        return out

    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.shapes().values())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def init_params(config: ModelConfig, seed: int, dtype: Any = np.float32) -> Params:
    """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2·layers)."""
    rng = np.random.default_rng(seed)
    params: Params = {}
    resid = 0.02 / math.sqrt(2 * config.n_layers)
    for name, shape in config.shapes().items():
        if name.endswith(".g"):
            params[name] = np.ones(shape, dtype)
        elif name.endswith(".b"):
            params[name] = np.zeros(shape, dtype)
        else:
            std = resid if name.endswith("attn.proj") or name.endswith("mlp.proj") else 0.02
            params[name] = (rng.standard_normal(shape) * std).astype(dtype)
    return params


# --- LoRA -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters: ``W x`` becomes ``W x + (alpha / rank) · B A x`` on the chosen matrices.

    Targets follow Tinker's flags: attention (``attn.qkv``, ``attn.proj``), MLP (``mlp.fc``,
    ``mlp.proj``) and the unembedding.
    """

    rank: int = 32
    alpha: float = 32.0
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError("LoRA rank must be >= 1")
        if not (self.train_attn or self.train_mlp or self.train_unembed):
            raise ValueError("At least one of train_mlp, train_attn, or train_unembed must be True")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LoraConfig":
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


def lora_targets(config: ModelConfig, lora_config: LoraConfig) -> list[str]:
    """Names of the weight matrices that get adapters (``unembed`` also when tied)."""
    out = []
    for i in range(config.n_layers):
        if lora_config.train_attn:
            out += [f"layers.{i}.attn.qkv", f"layers.{i}.attn.proj"]
        if lora_config.train_mlp:
            out += [f"layers.{i}.mlp.fc", f"layers.{i}.mlp.proj"]
    if lora_config.train_unembed:
        out.append("unembed")
    return out


def _matrix_shape(config: ModelConfig, name: str) -> tuple[int, int]:
    if name == "unembed":
        return config.d_model, config.vocab_size
    shape = config.shapes()[name]
    return shape[0], shape[1]


def init_lora(config: ModelConfig, lora_config: LoraConfig, seed: int, dtype: Any = np.float32) -> Params:
    """A ~ U(-1/sqrt(in), 1/sqrt(in)) (as PEFT's Kaiming init), B = 0."""
    rng = np.random.default_rng(seed)
    out: Params = {}
    for name in lora_targets(config, lora_config):
        n_in, n_out = _matrix_shape(config, name)
        bound = 1.0 / math.sqrt(n_in)
        out[name + ".lora_a"] = rng.uniform(-bound, bound, (n_in, lora_config.rank)).astype(dtype)
        out[name + ".lora_b"] = np.zeros((lora_config.rank, n_out), dtype)
    return out


def unembedding(config: ModelConfig, params: Params) -> np.ndarray:
    """The (d_model, vocab) output matrix (a transposed view of ``wte`` when tied)."""
    return params["wte"].T if config.tie_embeddings else params["unembed"]


def merge_lora(config: ModelConfig, params: Params, lora: Params, lora_config: LoraConfig) -> tuple[ModelConfig, Params]:
    """Fold the adapters into the weights: ``W + scale · A B``. An adapted tied unembedding
    becomes an untied one (the input embedding stays as it was)."""
    merged = dict(params)
    s = lora_config.scale
    for name in lora_targets(config, lora_config):
        delta = s * (lora[name + ".lora_a"] @ lora[name + ".lora_b"])
        if name == "unembed" and config.tie_embeddings:
            config = dataclasses.replace(config, tie_embeddings=False)
            merged["unembed"] = np.ascontiguousarray(params["wte"].T) + delta
        else:
            merged[name] = params[name] + delta
    return config, merged


# --- layers (each: forward → (out, cache); backward(dout, cache) → grads) -----------------------


def layernorm_forward(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> tuple[np.ndarray, tuple]:
    """LayerNorm over the last axis of a 2-D ``x``."""
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    var = np.einsum("ij,ij->i", xc, xc)[:, None] / x.shape[-1]
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    return xhat * g + b, (xhat, rstd)


def normalize_inference(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """A layernorm without its gain and bias (those are folded into the next matrix: :class:`FusedWeights`):
    ``layernorm_forward``'s normalized ``xhat``, bit for bit, with fewer temporaries and calls (no cache kept).

    ``x.mean`` is ``add.reduce`` then a division by the count (exact either way: one correctly
    rounded division), and ``np.einsum`` without ``optimize`` is its C core, called directly. One row
    (a decoding step) takes :func:`_normalize_row`, the same operations with fewer calls.
    """
    if x.shape[0] == 1 and x.dtype.type in _ROW_TYPES and ROW_PATHS:
        return _normalize_row(x, eps)
    n = x.shape[-1]
    mu = np.add.reduce(x, -1, keepdims=True)
    mu /= n
    xc = x - mu
    var = _c_einsum("ij,ij->i", xc, xc)[:, None]
    var /= n
    var += eps
    np.sqrt(var, out=var)
    np.true_divide(1.0, var, out=var)
    xc *= var
    return xc


_ROW_TYPES = (np.float32, np.float64)


def _normalize_row(x: np.ndarray, eps: float) -> np.ndarray:
    """:func:`normalize_inference` of a (1, n) float32 or float64 ``x``, bit for bit, in 4 array calls
    instead of 9: the row's mean, variance and reciprocal deviation are NumPy scalars of ``x``'s type
    (each the same correctly rounded IEEE operation as on a (1, 1) array), the square root is
    ``math.sqrt`` in float64 rounded to the type (exact for float64; for float32 a float64 square root
    rounded to float32 is the correctly rounded float32 one, as 53 >= 2·24 + 2).

    >>> x = np.array([[1.0, 2.0, 4.0]], np.float32)
    >>> g, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    >>> bool((_normalize_row(x, 1e-5) == layernorm_forward(x, g, b)[1][0]).all())
    True
    """
    ty = x.dtype.type
    n = ty(x.shape[-1])
    xc = x - np.add.reduce(x, -1, keepdims=True)[0, 0] / n
    var = _c_einsum("ij,ij->i", xc, xc)[0] / n + ty(eps)
    xc *= ty(1.0) / ty(math.sqrt(var))
    return xc


def layernorm_backward(dy: np.ndarray, cache: tuple, g: np.ndarray, need_params: bool = True) -> tuple:
    """→ (dx, dg, db); dg/db are None unless ``need_params``."""
    xhat, rstd = cache
    dg = np.einsum("ij,ij->j", dy, xhat) if need_params else None
    db = dy.sum(0) if need_params else None
    dxhat = dy * g
    n = xhat.shape[-1]
    proj = np.einsum("ij,ij->i", dxhat, xhat)[:, None] / n
    dx = dxhat - dxhat.mean(-1, keepdims=True) - xhat * proj
    dx *= rstd
    return dx, dg, db


_GELU_C = math.sqrt(2.0 / math.pi)
try:  # what np.einsum calls when not optimizing; skipping its Python wrapper saves ~3 µs a call
    from numpy._core.multiarray import c_einsum as _c_einsum
except ImportError:  # pragma: no cover - other NumPy layouts
    _c_einsum = np.einsum


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    """tanh(C · x · (1 + 0.044715 x²)), in a new array."""
    t = x * x
    t *= 0.044715
    t += 1.0
    t *= x
    t *= _GELU_C
    np.tanh(t, out=t)
    return t


def gelu_forward(x: np.ndarray) -> tuple[np.ndarray, tuple]:
    """GELU, tanh approximation (GPT-2)."""
    t = _gelu_tanh(x)
    y = t + 1.0
    y *= x
    y *= 0.5
    return y, (x, t)


def gelu_twice_(x: np.ndarray) -> np.ndarray:
    """2 · GELU(x) (tanh approximation) in one new array: inference folds the ½ into the next matrix
    (:class:`FusedWeights`; exact, a power of two), and ``C · x · (1 + 0.044715 x²)`` is computed as
    ``x · (C + 0.044715 C x²)``.

    >>> x = np.linspace(-4, 4, 9)
    >>> bool(np.allclose(gelu_twice_(x) / 2, gelu_forward(x)[0], rtol=1e-12, atol=1e-15))
    True
    """
    t = x * x
    t *= 0.044715 * _GELU_C
    t += _GELU_C
    t *= x
    np.tanh(t, out=t)
    t += 1.0
    t *= x
    return t


def gelu_backward(dy: np.ndarray, cache: tuple) -> np.ndarray:
    x, t = cache
    # d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t²) C (1 + 3·0.044715 x²)
    x2 = x * x
    x2 *= 3 * 0.044715 * _GELU_C
    x2 += _GELU_C
    x2 *= x
    sech2 = t * t
    np.subtract(1.0, sech2, out=sech2)
    sech2 *= x2
    sech2 += t
    sech2 += 1.0
    sech2 *= 0.5
    sech2 *= dy
    return sech2


def linear_forward(x: np.ndarray, w: np.ndarray, a: np.ndarray | None = None, b: np.ndarray | None = None,
                   scale: float = 0.0) -> tuple[np.ndarray, np.ndarray | None]:
    """``x @ w`` (+ ``scale · (x @ a) @ b`` with an adapter) → (y, x @ a)."""
    y = x @ w
    if a is None:
        return y, None
    xa = x @ a
    y += (scale * xa) @ b
    return y, xa


def linear_backward(dy: np.ndarray, x: np.ndarray, w: np.ndarray, a: np.ndarray | None = None,
                    b: np.ndarray | None = None, scale: float = 0.0, xa: np.ndarray | None = None, *,
                    need_dx: bool = True, need_dw: bool = True) -> tuple:
    """→ (dx, dw, da, db); entries not needed are None."""
    dx = dy @ w.T if need_dx else None
    dw = x.T @ dy if need_dw else None
    da = db = None
    if a is not None:
        assert b is not None and xa is not None
        dyb = dy @ b.T
        db = (scale * xa).T @ dy
        dyb *= scale
        da = x.T @ dyb
        if need_dx:
            dx += dyb @ a.T
    return dx, dw, da, db


_MASKS: dict[tuple[int, str], np.ndarray] = {}


def causal_mask(t: int, dtype: Any) -> np.ndarray:
    """Additive (t, t) mask: 0 on and below the diagonal, -inf above."""
    key = (t, np.dtype(dtype).str)
    if key not in _MASKS:
        if len(_MASKS) > 64:
            _MASKS.clear()
        _MASKS[key] = np.triu(np.full((t, t), -np.inf, dtype=dtype), 1)
    return _MASKS[key]


def softmax_(s: np.ndarray) -> np.ndarray:
    """In-place softmax over the last axis (``max`` and ``sum`` are these ufunc reductions, called directly)."""
    s -= np.maximum.reduce(s, -1, keepdims=True)
    np.exp(s, out=s)
    s *= 1.0 / np.add.reduce(s, -1, keepdims=True)
    return s


def attention_forward(qkv: np.ndarray, n_heads: int, bias: np.ndarray | None = None) -> tuple[np.ndarray, tuple]:
    """Causal multi-head attention on packed ``qkv`` (B, T, 3d) → (B, T, d).

    ``bias`` (broadcastable to (B, H, T, T)) replaces the plain causal mask when given.
    """
    bsz, t, three_d = qkv.shape
    d = three_d // 3
    hd = d // n_heads
    heads = np.ascontiguousarray(qkv.reshape(bsz, t, 3, n_heads, hd).transpose(2, 0, 3, 1, 4))
    q, k, v = heads[0], heads[1], heads[2]
    q *= 1.0 / math.sqrt(hd)
    p = q @ k.transpose(0, 1, 3, 2)
    p += causal_mask(t, qkv.dtype) if bias is None else bias
    softmax_(p)
    ctx = p @ v
    out = ctx.transpose(0, 2, 1, 3).reshape(bsz, t, d)
    return out, (q, k, v, p)


def attention_backward(dout: np.ndarray, cache: tuple) -> np.ndarray:
    """(B, T, d) → d qkv (B, T, 3d)."""
    q, k, v, p = cache
    bsz, h, t, hd = q.shape
    dctx = np.ascontiguousarray(dout.reshape(bsz, t, h, hd).transpose(0, 2, 1, 3))
    dheads = np.empty((3, bsz, h, t, hd), dtype=dout.dtype)
    np.matmul(p.transpose(0, 1, 3, 2), dctx, out=dheads[2])  # dv
    dp = dctx @ v.transpose(0, 1, 3, 2)
    # softmax backward: ds = p * (dp - sum(dp * p))
    row = np.einsum("bhij,bhij->bhi", dp, p)[..., None]
    dp -= row
    dp *= p
    np.matmul(dp, k, out=dheads[0])
    dheads[0] *= 1.0 / math.sqrt(hd)
    np.matmul(dp.transpose(0, 1, 3, 2), q, out=dheads[1])
    return dheads.transpose(1, 3, 0, 2, 4).reshape(bsz, t, 3 * h * hd)


ATTN_BLOCK = 64
"""Training's attention on rows of their own lengths (:func:`attention_rows_forward`) runs each row's queries in
blocks of this many: block ``[a, b)`` meets only the keys ``[0, b)``, so about half the causal T × T work is never
computed (the keys above the diagonal) and padding none at all."""


def _packed_index(lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(row, position) of each token of rows of ``lengths`` packed one after another.

    >>> [a.tolist() for a in _packed_index([2, 1])]
    [[0, 0, 1], [0, 1, 0]]
    """
    return np.repeat(np.arange(len(lengths)), lengths), np.concatenate([np.arange(n) for n in lengths])


def _segments(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of each row in a packed array of rows of ``lengths``.

    >>> _segments([3, 1, 2])
    [(0, 3), (3, 4), (4, 6)]
    """
    ends = np.cumsum(lengths).tolist()
    return [(e - n, e) for n, e in zip(lengths, ends)]


def attention_rows_forward(qkv: np.ndarray, n_heads: int, lengths: Sequence[int],
                           block: int = ATTN_BLOCK) -> tuple[np.ndarray, tuple]:
    """Causal multi-head attention on packed rows: ``qkv`` (N, 3d) holds rows of ``lengths`` one after
    another (N = their sum, no padding) → (N, d). Each row attends within itself, its queries in blocks
    (:data:`ATTN_BLOCK`) against the keys up to the block's end: the same function as
    :func:`attention_forward` on each row alone, without the work above the diagonal.

    >>> rng = np.random.default_rng(0)
    >>> qkv = rng.standard_normal((7, 12))
    >>> out, _ = attention_rows_forward(qkv, 2, [4, 3], block=2)
    >>> ref = np.concatenate([attention_forward(qkv[None, :4], 2)[0][0], attention_forward(qkv[None, 4:], 2)[0][0]])
    >>> bool(np.allclose(out, ref))
    True
    """
    n, three_d = qkv.shape
    d = three_d // 3
    hd = d // n_heads
    out = np.empty((n, d), qkv.dtype)
    rows = []
    for s, e in _segments(lengths):
        length = e - s
        heads = np.ascontiguousarray(qkv[s:e].reshape(length, 3, n_heads, hd).transpose(1, 2, 0, 3))
        q, k, v = heads[0], heads[1], heads[2]  # (H, L, hd)
        q *= 1.0 / math.sqrt(hd)
        ctx = np.empty((n_heads, length, hd), qkv.dtype)
        probs = []
        for a in range(0, length, block):
            b = min(a + block, length)
            p = q[:, a:b] @ k[:, :b].transpose(0, 2, 1)  # (H, b - a, b)
            p[:, :, a:] += causal_mask(b - a, qkv.dtype)
            softmax_(p)
            np.matmul(p, v[:, :b], out=ctx[:, a:b])
            probs.append(p)
        out[s:e] = ctx.transpose(1, 0, 2).reshape(length, d)
        rows.append((q, k, v, probs))
    return out, (tuple(lengths), block, rows)


def attention_rows_backward(dout: np.ndarray, cache: tuple) -> np.ndarray:
    """(N, d) → d qkv (N, 3d) of :func:`attention_rows_forward`."""
    lengths, block, rows = cache
    n, d = dout.shape
    dqkv = np.empty((n, 3 * d), dout.dtype)
    for (s, e), (q, k, v, probs) in zip(_segments(lengths), rows):
        h, length, hd = q.shape
        dctx = np.ascontiguousarray(dout[s:e].reshape(length, h, hd).transpose(1, 0, 2))
        dheads = np.zeros((3, h, length, hd), dout.dtype)
        dq, dk, dv = dheads[0], dheads[1], dheads[2]
        for a, p in zip(range(0, length, block), probs):
            b = a + p.shape[1]
            dc = dctx[:, a:b]
            dv[:, :b] += p.transpose(0, 2, 1) @ dc
            dp = dc @ v[:, :b].transpose(0, 2, 1)
            # softmax backward: ds = p * (dp - sum(dp * p))
            dp -= np.einsum("hij,hij->hi", dp, p)[..., None]
            dp *= p
            np.matmul(dp, k[:, :b], out=dq[:, a:b])
            dk[:, :b] += dp.transpose(0, 2, 1) @ q[:, a:b]
        dq *= 1.0 / math.sqrt(hd)
        dqkv[s:e] = dheads.transpose(2, 0, 1, 3).reshape(length, 3 * d)
    return dqkv


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - np.maximum.reduce(logits, -1, keepdims=True)
    z -= np.log(np.add.reduce(np.exp(z), -1, keepdims=True))
    return z


def target_logprobs_and_grad(logits: np.ndarray, targets: np.ndarray, coef: np.ndarray | None = None
                             ) -> tuple[np.ndarray, np.ndarray | None]:
    """Log-probabilities of ``targets`` under ``logits`` (N, V), and, given ``coef`` = dL/dlogprob
    per row, dL/dlogits = coef · (onehot − softmax)."""
    n = logits.shape[0]
    z = logits - logits.max(-1, keepdims=True)
    np.exp(z, out=z)
    total = z.sum(-1)
    rows = np.arange(n)
    logp = np.log(z[rows, targets] / total)
    if coef is None:
        return logp, None
    z *= (-coef / total)[:, None]
    z[rows, targets] += coef
    return logp, z


# --- the model ---------------------------------------------------------------------------------


@dataclass
class Generation:
    """One sampled continuation: tokens, their log-probabilities, and why it stopped."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: Literal["stop", "length"]


@dataclass
class _Cache:
    k: list[np.ndarray]
    v: list[np.ndarray]
    length: int = 0


ROW_PATHS = True
"""Take the one-row paths of a decoding step (:func:`_layernorm_row`, :meth:`Transformer._decode_row`,
:func:`_sample`'s): the same floats, tokens and draws as the general code, in fewer NumPy calls (a
decoding step of one sequence is ~50 small calls a layer, each ~1 µs of overhead). False runs the
general code on one row too (the tests compare the two)."""

PREFILL_BLOCK = 32
"""A single prompt is prefilled in blocks of this many tokens (:func:`prefill_ends`): block ``b`` runs
positions ``[32b, 32b + 32)`` against the keys before them, so its keys, values and last logits are a
function of the prompt's tokens up to the block's end only, whatever comes after them."""


def prefill_ends(n: int, block: int = PREFILL_BLOCK) -> list[int]:
    """Where the prefill blocks of an ``n``-token prompt end (the last one is shorter if ``n`` is not a
    multiple of ``block``).

    >>> prefill_ends(70), prefill_ends(64), prefill_ends(5)
    ([32, 64, 70], [32, 64], [5])
    """
    return [*range(block, n, block), n]


class PrefillCache:
    """Prefill blocks (:data:`PREFILL_BLOCK`) already run through a model: each block's keys, values
    and last logits, by the exact tokens of the prompt up to the block's end. A prompt that starts
    like one seen before (the first turn of every attempt at a task; a conversation's next turn, which
    repeats the turns before it) computes only the blocks not held here.

    A block is a function of those tokens alone and is computed the same way hit or miss, so a hit
    changes no float. Bounded: least recently used entries go once ``max_bytes`` is exceeded.
    Thread-safe. Whoever owns one decides what may share it (the local world: the trials of one
    evaluation, so timing tells a harness nothing about other evaluations).

    >>> cache = PrefillCache(max_bytes=1 << 20)
    >>> cache.get(("m", (1, 2, 3))) is None, cache.hits, cache.misses
    (True, 0, 1)
    """

    def __init__(self, max_bytes: int = 96 << 20):
        self.max_bytes = int(max_bytes)
        self.hits = self.misses = self.bytes = 0
        self._entries: OrderedDict[Any, tuple[list[np.ndarray], list[np.ndarray], np.ndarray, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0], entry[1], entry[2]

    def put(self, key: Any, k: list[np.ndarray], v: list[np.ndarray], logits: np.ndarray) -> None:
        size = sum(a.nbytes for a in k) + sum(a.nbytes for a in v) + logits.nbytes
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (k, v, logits, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, _, _, gone) = self._entries.popitem(last=False)
                self.bytes -= gone


@dataclass
class SamplingOptions:
    """Sampling controls (the fields of ``tinker.types.SamplingParams`` minus the stop list)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop_tokens: Sequence[int] = ()
    stop_strings: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError("temperature must be a finite number >= 0")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError("top_k must be -1 (no limit) or >= 1")


@dataclass(frozen=True)
class FusedWeights:
    """A model's weights as inference uses them (local result version 6): each layernorm's gain folded into the
    rows of the matrix after it and its bias into a bias of that product (``(x̂·g + b) W = x̂ (diag(g) W) + b W``),
    the attention's 1/sqrt(head_dim) into the query columns, GELU's ½ into the MLP's output matrix; folded
    in float64 and rounded once. ``layers``: per layer (qkv, qkv bias, attn.proj, fc, fc bias, ½·mlp.proj).

    >>> cfg = ModelConfig(vocab_size=11, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_seq_len=8)
    >>> fw = FusedWeights.of(cfg, init_params(cfg, seed=0))
    >>> [w.shape for w in fw.layers[0]], fw.unembed.shape
    ([(8, 24), (24,), (8, 8), (8, 16), (16,), (16, 8)], (8, 11))
    """

    layers: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    unembed: np.ndarray
    unembed_bias: np.ndarray

    @classmethod
    def of(cls, config: ModelConfig, params: Params) -> "FusedWeights":
        dtype = params["wte"].dtype

        def fold(g: np.ndarray, b: np.ndarray, w: np.ndarray, cols: np.ndarray | float = 1.0
                 ) -> tuple[np.ndarray, np.ndarray]:
            w64 = w.astype(np.float64)
            folded = g.astype(np.float64)[:, None] * w64 * cols
            return np.ascontiguousarray(folded, dtype=dtype), ((b.astype(np.float64) @ w64) * cols).astype(dtype)

        d = config.d_model
        q_cols = np.ones(3 * d)
        q_cols[:d] = 1.0 / math.sqrt(config.head_dim)
        layers = []
        for i in range(config.n_layers):
            pre = f"layers.{i}."
            w_qkv, b_qkv = fold(params[pre + "ln1.g"], params[pre + "ln1.b"], params[pre + "attn.qkv"], q_cols)
            w_fc, b_fc = fold(params[pre + "ln2.g"], params[pre + "ln2.b"], params[pre + "mlp.fc"])
            layers.append((w_qkv, b_qkv, np.ascontiguousarray(params[pre + "attn.proj"]), w_fc, b_fc,
                           np.ascontiguousarray(params[pre + "mlp.proj"] * dtype.type(0.5))))
        unembed, unembed_bias = fold(params["lnf.g"], params["lnf.b"], unembedding(config, params))
        return cls(layers, unembed, unembed_bias)


class Transformer:
    """The model: a config, its parameters, and optionally LoRA adapters.

    Args:
        config: shapes.
        params: base weights (see ``ModelConfig.shapes``).
        lora / lora_config: adapters (see ``init_lora``); ``None`` for the plain model.
    """

    def __init__(self, config: ModelConfig, params: Params, lora: Params | None = None,
                 lora_config: LoraConfig | None = None):
        missing = set(config.shapes()) - set(params)
        if missing:
            raise ValueError(f"missing parameters: {sorted(missing)[:5]}")
        if (lora is None) != (lora_config is None):
            raise ValueError("give both lora and lora_config, or neither")
        self.config = config
        self.params = params
        self.lora = lora
        self.lora_config = lora_config
        self._merged: tuple[ModelConfig, Params] | None = None
        self._fused: FusedWeights | None = None

    @property
    def dtype(self) -> np.dtype:
        return self.params["wte"].dtype

    def astype(self, dtype: Any) -> "Transformer":
        """A copy in another float dtype (float64 for gradient checks)."""
        cast = lambda p: {k: v.astype(dtype) for k, v in p.items()}  # noqa: E731
        return Transformer(self.config, cast(self.params), cast(self.lora) if self.lora else None, self.lora_config)

    def merged(self) -> "Transformer":
        """The same function with the adapters folded into the weights (no adapters left)."""
        if self.lora is None:
            return self
        if self._merged is None:
            self._merged = merge_lora(self.config, self.params, self.lora, self.lora_config)
        return Transformer(*self._merged)

    def weights_changed(self) -> None:
        """Forget what was made from the weights (:meth:`merged`'s, :meth:`fused`'s): call after changing
        ``params`` or ``lora`` in place."""
        self._merged = None
        self._fused = None

    def _ad(self, name: str) -> tuple[np.ndarray | None, np.ndarray | None]:
        if self.lora is None or name + ".lora_a" not in self.lora:
            return None, None
        return self.lora[name + ".lora_a"], self.lora[name + ".lora_b"]

    # --- training forward / backward --------------------------------------------------------
    def forward(self, tokens: np.ndarray, lengths: Sequence[int] | None = None) -> tuple[np.ndarray, list]:
        """(B, T) token ids → logits (B, T, V) and the activations the backward pass needs.

        With ``lengths`` (one per row, each in [1, T]), row ``b`` is ``tokens[b, :lengths[b]]`` (the rest is
        padding) and the model runs on those tokens alone, packed (no work on padding; attention by
        :func:`attention_rows_forward`): the logits come back packed, (sum of lengths, V), rows one after
        another. The same function of the real tokens as without ``lengths``, in other float rounding
        (training's arithmetic since local result version 6; without ``lengths``: the arithmetic the shipped
        checkpoint was built with, full T × T attention on the whole (B, T) array).
        """
        tokens = np.asarray(tokens)
        _use_model_threads()
        cfg, p = self.config, self.params
        bsz, t = tokens.shape
        if t > cfg.max_seq_len:
            raise ContextOverflowError(f"sequence of {t} tokens exceeds the context of {cfg.max_seq_len}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {cfg.vocab_size})")
        s = self.lora_config.scale if self.lora_config else 0.0
        d = cfg.d_model
        if lengths is None:
            n = bsz * t
            x = (p["wte"][tokens] + p["wpe"][:t]).reshape(n, d)
            attend = lambda qkv: attention_forward(qkv.reshape(bsz, t, 3 * d), cfg.n_heads)  # noqa: E731
            caches: list = [tokens]
        else:
            lengths = tuple(int(n) for n in lengths)
            if len(lengths) != bsz or any(not 1 <= n <= t for n in lengths):
                raise ValueError(f"lengths must be {bsz} numbers in [1, {t}]")
            rows, pos = _packed_index(lengths)
            n = pos.size
            x = p["wte"][tokens[rows, pos]] + p["wpe"][pos]
            attend = lambda qkv: attention_rows_forward(qkv, cfg.n_heads, lengths, ATTN_BLOCK)  # noqa: E731
            caches = [(tokens[rows, pos], pos, lengths)]
        for i in range(cfg.n_layers):
            pre = f"layers.{i}."
            h1, ln1 = layernorm_forward(x, p[pre + "ln1.g"], p[pre + "ln1.b"], cfg.ln_eps)
            qkv, xa1 = linear_forward(h1, p[pre + "attn.qkv"], *self._ad(pre + "attn.qkv"), s)
            ctx, att = attend(qkv)
            ctx = ctx.reshape(n, d)
            ao, xa2 = linear_forward(ctx, p[pre + "attn.proj"], *self._ad(pre + "attn.proj"), s)
            x = x + ao
            h2, ln2 = layernorm_forward(x, p[pre + "ln2.g"], p[pre + "ln2.b"], cfg.ln_eps)
            f, xa3 = linear_forward(h2, p[pre + "mlp.fc"], *self._ad(pre + "mlp.fc"), s)
            g, gel = gelu_forward(f)
            mo, xa4 = linear_forward(g, p[pre + "mlp.proj"], *self._ad(pre + "mlp.proj"), s)
            x = x + mo
            caches.append((h1, ln1, xa1, att, ctx, xa2, h2, ln2, xa3, gel, g, xa4))
        hf, lnf = layernorm_forward(x, p["lnf.g"], p["lnf.b"], cfg.ln_eps)
        logits, xau = linear_forward(hf, unembedding(cfg, p), *self._ad("unembed"), s)
        caches.append((hf, lnf, xau))
        return (logits.reshape(bsz, t, -1) if lengths is None else logits), caches

    def backward(self, dlogits: np.ndarray, caches: list, *, train_base: bool = False,
                 train_lora: bool = True) -> Params:
        """Gradients of a loss with d loss / d logits = ``dlogits`` (B, T, V; packed (N, V) after a packed
        :meth:`forward`), for the base weights (``train_base``) and/or the adapters (``train_lora``)."""
        _use_model_threads()
        cfg, p = self.config, self.params
        s = self.lora_config.scale if self.lora_config else 0.0
        lora_on = train_lora and self.lora is not None
        grads: Params = {}
        packed = isinstance(caches[0], tuple)  # (token ids, positions, lengths) of a packed forward
        d = cfg.d_model
        if packed:
            tokens, pos, lengths = caches[0]
            n = tokens.size
            attend_back = lambda dctx, att: attention_rows_backward(dctx, att)  # noqa: E731
        else:
            tokens = caches[0]
            bsz, t = tokens.shape
            n = bsz * t
            attend_back = lambda dctx, att: attention_backward(dctx.reshape(bsz, t, d), att)  # noqa: E731
        dl = dlogits.reshape(n, -1)

        def lin(dy, x, name, xa, w, need_dx=True):
            a, b = self._ad(name) if lora_on else (None, None)
            dx, dw, da, db = linear_backward(dy, x, w, a, b, s, xa, need_dx=need_dx, need_dw=train_base)
            if train_base:
                grads[name] = dw
            if a is not None:
                grads[name + ".lora_a"], grads[name + ".lora_b"] = da, db
            return dx

        hf, lnf, xau = caches[-1]
        dhf = lin(dl, hf, "unembed", xau, unembedding(cfg, p))
        dx, dg, db = layernorm_backward(dhf, lnf, p["lnf.g"], train_base)
        if train_base:
            grads["lnf.g"], grads["lnf.b"] = dg, db
            if cfg.tie_embeddings:
                grads["wte"] = grads.pop("unembed").T.copy()
        for i in reversed(range(cfg.n_layers)):
            pre = f"layers.{i}."
            h1, ln1, xa1, att, ctx, xa2, h2, ln2, xa3, gel, g, xa4 = caches[1 + i]
            dg_ = lin(dx, g, pre + "mlp.proj", xa4, p[pre + "mlp.proj"])
            df = gelu_backward(dg_, gel)
            dh2 = lin(df, h2, pre + "mlp.fc", xa3, p[pre + "mlp.fc"])
            dres, dgm, dbm = layernorm_backward(dh2, ln2, p[pre + "ln2.g"], train_base)
            dx = dx + dres
            dctx = lin(dx, ctx, pre + "attn.proj", xa2, p[pre + "attn.proj"])
            dqkv = attend_back(dctx, att).reshape(n, 3 * d)
            need = train_base or i > 0  # below layer 0 only the (frozen) embeddings remain
            dh1 = lin(dqkv, h1, pre + "attn.qkv", xa1, p[pre + "attn.qkv"], need_dx=need)
            if train_base:
                grads[pre + "ln2.g"], grads[pre + "ln2.b"] = dgm, dbm
            if need:
                dres, dg1, db1 = layernorm_backward(dh1, ln1, p[pre + "ln1.g"], train_base)
                dx = dx + dres
                if train_base:
                    grads[pre + "ln1.g"], grads[pre + "ln1.b"] = dg1, db1
        if train_base:
            dwte = grads.get("wte", np.zeros_like(p["wte"]))
            np.add.at(dwte, tokens.reshape(-1), dx)
            grads["wte"] = dwte
            dwpe = np.zeros_like(p["wpe"])
            if packed:
                np.add.at(dwpe, pos, dx)
            else:
                dwpe[:t] = dx.reshape(bsz, t, d).sum(0)
            grads["wpe"] = dwpe
        return grads

    def logits(self, tokens: np.ndarray) -> np.ndarray:
        """Forward pass only: (B, T) → (B, T, V)."""
        return self.forward(np.asarray(tokens))[0]

    def token_logprobs(self, tokens: np.ndarray, targets: np.ndarray, lengths: Sequence[int] | None = None
                       ) -> np.ndarray:
        """log p(targets[b, t] | tokens[b, :t+1]) for every position, (B, T); with ``lengths`` (see
        :meth:`forward`) only row ``b``'s first ``lengths[b]`` are computed, the rest are 0."""
        tokens = np.asarray(tokens)
        logits = self.forward(tokens, lengths)[0]
        if lengths is None:
            bsz, t, v = logits.shape
            return target_logprobs_and_grad(logits.reshape(-1, v), np.asarray(targets).reshape(-1))[0].reshape(bsz, t)
        rows, pos = _packed_index(lengths)
        out = np.zeros(tokens.shape, logits.dtype)
        out[rows, pos] = target_logprobs_and_grad(logits, np.asarray(targets)[rows, pos])[0]
        return out

    def loss_and_grad(self, tokens: np.ndarray, targets: np.ndarray,
                      coef: np.ndarray | Callable[[np.ndarray], np.ndarray], *,
                      train_base: bool = False, train_lora: bool = True,
                      lengths: Sequence[int] | None = None) -> tuple[np.ndarray, Params]:
        """For a loss L with dL/d logprob(target) = ``coef`` (B, T) — cross-entropy: ``-weights`` —
        return (target log-probabilities (B, T), gradients). ``coef`` may be a function of the
        log-probabilities (B, T) (e.g. importance sampling's ``-advantage · ratio``). With ``lengths``
        (see :meth:`forward`) the positions past a row's length are padding: not computed, log-probability
        0, ``coef`` there ignored (the gradient is that of the loss over the real positions)."""
        tokens = np.asarray(tokens)
        logits, caches = self.forward(tokens, lengths)
        bsz, t = tokens.shape
        v = logits.shape[-1]
        if lengths is None:
            flat, tgt = logits.reshape(-1, v), np.asarray(targets).reshape(-1)
            pick = lambda a: np.asarray(a).reshape(-1)  # noqa: E731
            unpack = lambda lp: lp.reshape(bsz, t)  # noqa: E731
        else:
            rows, pos = _packed_index(lengths)
            flat, tgt = logits, np.asarray(targets)[rows, pos]
            pick = lambda a: np.asarray(a)[rows, pos]  # noqa: E731

            def unpack(lp: np.ndarray) -> np.ndarray:
                out = np.zeros((bsz, t), lp.dtype)
                out[rows, pos] = lp
                return out
        if callable(coef):
            coef = coef(unpack(target_logprobs_and_grad(flat, tgt)[0]))
        logp, dlogits = target_logprobs_and_grad(flat, tgt, pick(np.asarray(coef, dtype=logits.dtype)))
        del logits, flat
        grads = self.backward(dlogits, caches, train_base=train_base, train_lora=train_lora)
        return unpack(logp), grads

    # --- inference with a KV cache ----------------------------------------------------------
    def _infer(self, tokens: np.ndarray, positions: np.ndarray, cache: _Cache, bias: np.ndarray,
               fused: "FusedWeights") -> np.ndarray:
        """Run ``tokens`` (B, T) at ``positions`` through the model, appending their keys and values
        to ``cache``; ``bias`` (B, 1, T, L) masks keys; ``fused`` is :meth:`fused` (the inference
        weights). Returns the last position's logits (B, V). The caller sets the BLAS thread count first
        (``_use_model_threads``)."""
        cfg, p, eps = self.config, self.params, self.config.ln_eps
        bsz, t = tokens.shape
        d, h, hd = cfg.d_model, cfg.n_heads, cfg.head_dim
        start, end = cache.length, cache.length + t
        x = p["wte"][tokens] + p["wpe"][positions]
        x = x.reshape(bsz * t, d)
        for i, (w_qkv, b_qkv, w_proj, w_fc, b_fc, w_out) in enumerate(fused.layers):
            qkv = normalize_inference(x, eps) @ w_qkv
            qkv += b_qkv
            qkv = qkv.reshape(bsz, t, 3, h, hd).transpose(2, 0, 3, 1, 4)
            keys, values = cache.k[i], cache.v[i]
            keys[:, :, start:end] = qkv[1]
            values[:, :, start:end] = qkv[2]
            sc = qkv[0] @ keys[:, :, :end].transpose(0, 1, 3, 2)  # the queries come scaled by 1/sqrt(hd)
            sc += bias
            softmax_(sc)
            ctx = (sc @ values[:, :, :end]).transpose(0, 2, 1, 3).reshape(bsz * t, d)
            x += ctx @ w_proj
            f = normalize_inference(x, eps) @ w_fc
            f += b_fc
            x += gelu_twice_(f) @ w_out
        cache.length = end
        logits = normalize_inference(x.reshape(bsz, t, d)[:, -1], eps) @ fused.unembed
        logits += fused.unembed_bias
        return logits

    def _step_row(self, token: int, position: int, cache: _Cache, fused: "FusedWeights") -> np.ndarray:
        """:meth:`_infer` of one token of one sequence with no padding (a decoding step of
        :meth:`_decode_row`), bit for bit, in fewer NumPy calls: the same matrix products on arrays of the
        same shapes, without the mask (a single sequence's decoding mask is all zeros: adding it changes no
        bit) and with views for the reshapes. Returns the logits (1, V)."""
        eps = self.config.ln_eps
        h, hd = self.config.n_heads, self.config.head_dim
        start, end = cache.length, cache.length + 1
        x = self.params["wte"][token] + self.params["wpe"][position]
        x = x[None]
        for i, (w_qkv, b_qkv, w_proj, w_fc, b_fc, w_out) in enumerate(fused.layers):
            qkv = _normalize_row(x, eps) @ w_qkv
            qkv += b_qkv
            qkv = qkv.reshape(3, 1, h, 1, hd)  # (3, B, H, T, hd): what _infer's transpose gives for one token
            keys, values = cache.k[i], cache.v[i]
            keys[:, :, start] = qkv[1, :, :, 0]
            values[:, :, start] = qkv[2, :, :, 0]
            sc = qkv[0] @ keys[:, :, :end].transpose(0, 1, 3, 2)
            softmax_(sc)
            x += (sc @ values[:, :, :end]).reshape(1, -1) @ w_proj
            f = _normalize_row(x, eps) @ w_fc
            f += b_fc
            x += gelu_twice_(f) @ w_out
        cache.length = end
        logits = _normalize_row(x, eps) @ fused.unembed
        logits += fused.unembed_bias
        return logits

    def _prefill_blocks(self, prompt: list[int], cache: _Cache, layers: "FusedWeights",
                        store: PrefillCache | None, key: Any) -> np.ndarray:
        """Run one prompt into the empty ``cache`` block by block (:func:`prefill_ends`), taking the
        blocks ``store`` holds under ``(key, prompt[:end])`` and putting there the ones it computes.
        Returns the last position's logits (1, V)."""
        tokens = np.asarray(prompt, np.int64)[None]
        neg = np.array(-np.inf, self.dtype)
        start, logits = 0, None
        for end in prefill_ends(len(prompt)):
            block_key = (key, tuple(prompt[:end])) if store is not None else None
            hit = store.get(block_key) if block_key is not None else None
            if hit is not None:
                for i in range(self.config.n_layers):
                    cache.k[i][:, :, start:end] = hit[0][i]
                    cache.v[i][:, :, start:end] = hit[1][i]
                cache.length, logits = end, hit[2]
            else:
                slots = np.arange(end)
                bias = np.where(slots[start:, None] >= slots[None, :], 0.0, neg).astype(self.dtype)[None, None]
                logits = self._infer(tokens[:, start:end], slots[None, start:end], cache, bias, layers)
                if block_key is not None:
                    store.put(block_key, [k[:, :, start:end].copy() for k in cache.k],
                              [v[:, :, start:end].copy() for v in cache.v], logits.copy())
            start = end
        return logits.copy()

    def fused(self) -> "FusedWeights":
        """The inference weights (:class:`FusedWeights`) of this model (adapters merged), made once."""
        if self._fused is None:
            merged = self.merged()
            self._fused = FusedWeights.of(merged.config, merged.params)
        return self._fused

    def _new_cache(self, bsz: int, capacity: int) -> _Cache:
        cfg = self.config
        shape = (bsz, cfg.n_heads, capacity, cfg.head_dim)
        return _Cache([np.zeros(shape, self.dtype) for _ in range(cfg.n_layers)],
                      [np.zeros(shape, self.dtype) for _ in range(cfg.n_layers)])

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int | None = None, *,
                 temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0, seed: int | None = None,
                 stop_tokens: Iterable[int] = (), stop_strings: Iterable[str] = (),
                 token_bytes: Callable[[int], bytes] | None = None, num_samples: int = 1,
                 use_cache: bool = True, prefill_cache: PrefillCache | None = None,
                 prefill_key: Any = None) -> list[list[Generation]]:
        """Sample continuations of a batch of prompts: ``num_samples`` per prompt.

        * ``temperature`` 0 is greedy; ``top_k`` -1 and ``top_p`` 1 mean no truncation.
        * A sequence stops after emitting a token in ``stop_tokens`` or once its bytes contain a
          string in ``stop_strings`` (needs ``token_bytes``); the stop token or string is kept in
          ``tokens``. It stops with ``"length"`` after ``max_tokens`` or when the context is full.
        * Returned log-probabilities are of the temperature-scaled distribution before top-k/top-p.
        * ``use_cache=False`` recomputes the whole sequence every step (same result, slower).
        * Deterministic for a given ``seed`` and batch.
        * A single prompt is prefilled in blocks (:func:`prefill_ends`). ``prefill_cache``: the blocks
          it holds under ``prefill_key`` (which must name these weights) for this prompt's beginning
          are not computed again; the samples are the same, hit or miss.
        """
        opts = SamplingOptions(max_tokens, temperature, top_k, top_p, seed, tuple(stop_tokens), tuple(stop_strings))
        if num_samples < 1:
            raise ValueError("num_samples must be >= 1")
        if not prompts:
            return []
        model = self.merged()
        cfg = model.config
        lens = np.array([len(pr) for pr in prompts])
        if lens.min() < 1:
            raise ValueError("every prompt needs at least one token")
        if lens.max() >= cfg.max_seq_len:
            raise ContextOverflowError(
                f"prompt of {lens.max()} tokens leaves no room in the context of {cfg.max_seq_len}")
        for pr in prompts:
            if min(pr) < 0 or max(pr) >= cfg.vocab_size:
                raise ValueError(f"token ids must be in [0, {cfg.vocab_size})")
        stops = [s.encode("utf-8") for s in opts.stop_strings if s]
        if stops and token_bytes is None:
            raise ValueError("stop strings need token_bytes (the tokenizer's token → bytes map)")
        rows = len(prompts) * num_samples
        lmax = int(lens.max())
        pad = np.repeat(lmax - lens, num_samples)
        budget = np.repeat(cfg.max_seq_len - lens, num_samples)
        if opts.max_tokens is not None:
            budget = np.minimum(budget, opts.max_tokens)
        capacity = lmax + int(budget.max())
        seq = np.zeros((rows, capacity), np.int64)
        for j, pr in enumerate(prompts):
            seq[j * num_samples:(j + 1) * num_samples, lmax - len(pr):lmax] = pr
        slots = np.arange(capacity)
        positions = np.maximum(slots[None, :] - pad[:, None], 0)
        key_ok = slots[None, :] >= pad[:, None]  # (rows, capacity): pad slots are never attended
        neg = np.array(-np.inf, model.dtype)

        def bias_for(q0: int, q1: int) -> np.ndarray:
            qs = slots[q0:q1]
            ok = key_ok[:, None, :q1] & (qs[None, :, None] >= slots[None, None, :q1])
            ok |= qs[None, :, None] == slots[None, None, :q1]  # pad rows attend to themselves
            return np.where(ok, 0.0, neg).astype(model.dtype)[:, None]

        # a decoding step's query (slot ≥ lmax) sees every non-pad key up to itself: a slice of one mask
        decode_bias = np.where(key_ok, 0.0, neg).astype(model.dtype)[:, None, None, :]
        layers = self.fused()
        _use_model_threads()

        # prefill (once per distinct prompt, then copied to its samples); one prompt: in blocks
        if use_cache:
            cache = model._new_cache(len(prompts), capacity)
            if len(prompts) == 1:
                logits = model._prefill_blocks(list(prompts[0]), cache, layers, prefill_cache, prefill_key)
            else:
                first = np.arange(0, rows, num_samples)
                logits = model._infer(seq[first, :lmax], positions[first, :lmax], cache, bias_for(0, lmax)[first],
                                      layers)
            if num_samples > 1:
                cache.k = [np.repeat(k, num_samples, axis=0) for k in cache.k]
                cache.v = [np.repeat(v, num_samples, axis=0) for v in cache.v]
                logits = np.repeat(logits, num_samples, axis=0)
        else:
            logits = model._infer(seq[:, :lmax], positions[:, :lmax], model._new_cache(rows, lmax), bias_for(0, lmax),
                                  layers)

        rng = np.random.default_rng(opts.seed)
        is_stop = np.zeros(cfg.vocab_size, bool)
        is_stop[[t for t in set(opts.stop_tokens) if 0 <= t < cfg.vocab_size]] = True
        out_logp = np.zeros((rows, capacity), np.float64)
        done = np.zeros(rows, bool)
        reason = np.array(["length"] * rows, dtype=object)
        count = np.zeros(rows, np.int64)
        tails = [b""] * rows
        longest = max((len(s) for s in stops), default=0)
        if rows == 1 and ROW_PATHS:  # one sequence (the local world's usual request): the loop below in scalars
            count[0], reason[0] = self._decode_row(model, logits, opts, rng, seq, out_logp, positions, cache if use_cache else None,
                                                   decode_bias, bias_for, layers, lmax, int(budget[0]), is_stop, stops,
                                                   token_bytes, longest)
        for step in range(0 if rows == 1 and ROW_PATHS else int(budget.max())):
            tok, lp = _sample(logits.astype(np.float64), opts, rng)
            slot = lmax + step
            tok = np.where(done, 0, tok)
            seq[:, slot] = tok
            out_logp[:, slot] = lp
            live = ~done
            count[live] += 1
            if opts.stop_tokens:
                hit = live & is_stop[tok]
                reason[hit] = "stop"
                done |= hit
            if stops:
                for r in np.flatnonzero(live & ~done):
                    tails[r] = (tails[r] + token_bytes(int(tok[r])))[-(longest + 64):]
                    if any(s in tails[r] for s in stops):
                        reason[r], done[r] = "stop", True
            done |= count >= budget
            if done.all():
                break
            if use_cache:
                logits = model._infer(seq[:, slot:slot + 1], positions[:, slot:slot + 1], cache,
                                      decode_bias[..., :slot + 1], layers)
            else:
                logits = model._infer(seq[:, :slot + 1], positions[:, :slot + 1], model._new_cache(rows, slot + 1),
                                      bias_for(0, slot + 1), layers)
        results = [Generation(seq[r, lmax:lmax + count[r]].tolist(), out_logp[r, lmax:lmax + count[r]].tolist(),
                              reason[r]) for r in range(rows)]
        return [results[j * num_samples:(j + 1) * num_samples] for j in range(len(prompts))]

    @staticmethod
    def _decode_row(model: "Transformer", logits: np.ndarray, opts: SamplingOptions, rng: np.random.Generator,
                    seq: np.ndarray, out_logp: np.ndarray, positions: np.ndarray, cache: _Cache | None,
                    decode_bias: np.ndarray, bias_for: Callable[[int, int], np.ndarray],
                    layers: "FusedWeights", lmax: int, budget: int, is_stop: np.ndarray,
                    stops: list[bytes], token_bytes: Callable[[int], bytes] | None, longest: int) -> tuple[int, str]:
        """:meth:`generate`'s decoding loop for one row, with Python scalars for its bookkeeping: the same
        tokens, log-probabilities, stop and draws from ``rng``. Fills ``seq`` and ``out_logp`` from slot
        ``lmax``; returns (tokens sampled, stop reason)."""
        tail = b""
        for step in range(budget):
            tok, lp = _sample(logits.astype(np.float64), opts, rng)
            t, slot = int(tok[0]), lmax + step
            seq[0, slot], out_logp[0, slot] = t, lp[0]
            if is_stop[t]:
                return step + 1, "stop"
            if stops:
                tail = (tail + token_bytes(t))[-(longest + 64):]  # type: ignore[misc]
                if any(s in tail for s in stops):
                    return step + 1, "stop"
            if step + 1 >= budget:
                break
            if cache is not None:
                logits = model._step_row(t, slot, cache, layers)
            else:
                logits = model._infer(seq[:, :slot + 1], positions[:, :slot + 1], model._new_cache(1, slot + 1),
                                      bias_for(0, slot + 1), layers)
        return budget, "length"


def _sample(logits: np.ndarray, opts: SamplingOptions, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One token per row from (rows, V) float64 logits → (tokens, their log-probabilities)."""
    rows, v = logits.shape
    if opts.temperature == 0.0:
        tok = logits.argmax(-1)
        return tok, log_softmax(logits)[np.arange(rows), tok]
    logp = log_softmax(logits if opts.temperature == 1.0 else logits / opts.temperature)  # x / 1 is x
    probs = np.exp(logp)
    truncate = 0 < opts.top_k < v or opts.top_p < 1.0
    if rows == 1 and not truncate and ROW_PATHS:  # a decoding step of one sequence: the same draw in fewer calls
        cum = np.add.accumulate(probs[0])  # what cumsum computes
        # the count of cum <= u (cum never decreases: a sum of numbers >= 0), as below
        k = min(int(np.count_nonzero(cum <= rng.random(1)[0] * cum[-1])), v - 1)
        return np.array([k]), logp[0, k:k + 1]
    if truncate:
        keep = np.ones_like(logp, dtype=bool)
        if 0 < opts.top_k < v:
            kth = np.partition(logp, v - opts.top_k, axis=-1)[:, v - opts.top_k][:, None]
            keep &= logp >= kth
        if opts.top_p < 1.0:
            order = np.argsort(-logp, axis=-1, kind="stable")
            sorted_p = np.exp(np.take_along_axis(np.where(keep, logp, -np.inf), order, -1))
            sorted_p /= sorted_p.sum(-1, keepdims=True)
            before = np.cumsum(sorted_p, -1) - sorted_p  # mass strictly before each token
            in_nucleus = np.zeros_like(keep)
            np.put_along_axis(in_nucleus, order, before < opts.top_p, -1)
            keep &= in_nucleus
        probs = np.where(keep, probs, 0.0)
    cum = np.cumsum(probs, -1)
    u = rng.random(rows) * cum[:, -1]
    tok = np.minimum((cum <= u[:, None]).sum(-1), v - 1)
    if truncate:  # guard against rounding at the edge of the kept set
        tok = np.where(keep[np.arange(rows), tok], tok, logp.argmax(-1))
    return tok, logp[np.arange(rows), tok]


# --- AdamW (Tinker's AdamParams semantics) ----------------------------------------------------


@dataclass
class AdamHyper:
    """The fields of ``tinker.types.AdamParams`` with its defaults (any object with these
    attributes, including ``AdamParams`` itself, works where this is expected)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass
class Adam:
    """AdamW as ``torch.optim.AdamW`` (what Tinker uses): decoupled weight decay
    ``p ← p·(1 − lr·wd)``, bias-corrected moments, ``p ← p − lr·m̂/(√v̂ + eps)``; before the
    step the global gradient norm is clipped to ``grad_clip_norm`` when that is > 0.

    >>> p = {"w": np.array([1.0, -1.0])}
    >>> opt = Adam()
    >>> stats = opt.step(p, {"w": np.array([0.5, -2.0])}, AdamHyper(learning_rate=0.1))
    >>> p["w"].round(6).tolist(), opt.t
    ([0.9, -0.9], 1)
    """

    m: Params = field(default_factory=dict)
    v: Params = field(default_factory=dict)
    t: int = 0

    def step(self, params: Params, grads: Mapping[str, np.ndarray], hp: Any) -> dict[str, float]:
        """Update ``params`` in place from ``grads``; returns the gradient norm (before clipping)."""
        lr, b1, b2, eps = float(hp.learning_rate), float(hp.beta1), float(hp.beta2), float(hp.eps)
        wd, clip = float(hp.weight_decay), float(hp.grad_clip_norm)
        if not (math.isfinite(lr) and lr >= 0):
            raise ValueError("learning_rate must be a finite number >= 0")
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError("beta1 and beta2 must be in [0, 1)")
        # float64 sums without BLAS, so the norm (and clipping) does not depend on BLAS threads
        norm = math.sqrt(sum(float(np.square(g, dtype=np.float64).sum()) for g in grads.values()))
        if not math.isfinite(norm):
            raise FloatingPointError("gradient is not finite")
        coef = 1.0
        if clip > 0 and norm > clip:
            coef = clip / (norm + 1e-6)
        self.t += 1
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for name in sorted(grads):
            p, g = params[name], grads[name]
            if coef != 1.0:
                g = g * coef
            m = self.m.setdefault(name, np.zeros_like(p))
            v = self.v.setdefault(name, np.zeros_like(p))
            if wd:
                p *= 1 - lr * wd
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * (g * g)
            denom = np.sqrt(v)
            denom *= 1 / math.sqrt(c2)
            denom += eps
            p -= (lr / c1) * (m / denom)
        return {"grad_norm": norm, "grad_scale": coef}

    def state(self) -> Params:
        """Flat arrays for saving (``m.NAME``, ``v.NAME``, ``t``)."""
        out = {f"m.{k}": v for k, v in self.m.items()} | {f"v.{k}": v for k, v in self.v.items()}
        out["t"] = np.array(self.t, np.int64)
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, np.ndarray]) -> "Adam":
        m = {k[2:]: np.array(v) for k, v in state.items() if k.startswith("m.")}
        v = {k[2:]: np.array(x) for k, x in state.items() if k.startswith("v.")}
        return cls(m, v, int(state["t"]) if "t" in state else 0)


# --- FLOP accounting ---------------------------------------------------------------------------


def flops_per_token(config: ModelConfig, seq_len: int, mode: Literal["forward", "lora", "full"] = "forward",
                    lora_config: LoraConfig | None = None) -> float:
    """Matrix-multiply FLOPs per token, counted as this code computes them.

    * forward: 2·(weights used in matmuls) + attention 4·T·d per layer (the full T×T score
      matrix is computed, as the padded path does; the packed path, training's since local result version 6,
      computes about half: :func:`attention_rows_forward`).
    * full (all weights trained): forward + backward, the backward being 2× the forward
      (input and weight gradients), i.e. the usual 6·N + 12·L·T·d.
    * lora: forward + input gradients only (2× forward dense, less the lowest layer's input
      gradient which only the frozen embeddings would need) + attention backward + the adapters'
      own matmuls (forward 1×, backward 2×).
    """
    d, f, v, L = config.d_model, config.d_ff, config.vocab_size, config.n_layers
    layer = 3 * d * d + d * d + 2 * d * f
    dense = 2 * (L * layer + d * v)
    attn = 4 * seq_len * d * L
    if mode == "forward":
        return float(dense + attn)
    if mode == "full":
        return float(3 * (dense + attn))
    lc = lora_config or LoraConfig()
    adapters = sum(2 * lc.rank * sum(_matrix_shape(config, t)) for t in lora_targets(config, lc))
    return float(dense + attn + (dense - 2 * 3 * d * d) + 2 * attn + 3 * adapters)


# --- deterministic .npz files ------------------------------------------------------------------


def save_npz(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Like ``np.savez`` but byte-for-byte reproducible (sorted names, fixed timestamps)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asarray(arrays[name], order="C"), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())
    tmp.replace(path)


def load_npz(path: str | Path) -> Params:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def save_model(directory: str | Path, config: ModelConfig, params: Params, tokenizer: Any = None,
               extra: Mapping[str, Any] | None = None) -> Path:
    """Write a base-model checkpoint: ``config.json`` (+ ``tokenizer.json``) and ``weights.npz``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"config": config.to_dict(), **(extra or {})}
    (directory / "config.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    if tokenizer is not None:
        tokenizer.save(directory / "tokenizer.json")
    save_npz(directory / "weights.npz", params)
    return directory


def load_model(directory: str | Path) -> tuple[ModelConfig, Params, dict[str, Any]]:
    """Read a checkpoint written by ``save_model`` → (config, params, metadata)."""
    directory = Path(directory)
    meta = json.loads((directory / "config.json").read_text())
    config = ModelConfig.from_dict(meta["config"])
    params = load_npz(directory / "weights.npz")
    return config, params, meta
