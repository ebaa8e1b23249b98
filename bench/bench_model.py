"""Local model speed: training tokens/s and FLOP utilization, generation tokens/s with and without
the KV cache.

The model is the default base shape (``ModelConfig()``: d_model 256, 4 layers, 4 heads, d_ff 1024,
context 512, byte vocabulary 272; 3.35 M parameters), in float32.

FLOP utilization (MFU) = the model's useful matrix-multiply FLOP/s ÷ the NumPy float32 matmul peak
measured in the same run with the same number of BLAS threads (the best of a few large products).
FLOPs are counted as ``model.flops_per_token`` documents: forward 2·(matmul weights) + 4·T·d per
layer (full T×T scores, as computed); full training = 3× forward (the backward is 2× the
forward); LoRA training = forward + input gradients (no weight gradients of the frozen base) +
the adapters' own products. Element-wise work (softmax, GELU, LayerNorm) and padding count for
nothing.

Each training workload runs with one BLAS thread (the model's automatic setting) and with two
pinned (``set_blas_threads(2)``), timed in rounds interleaved with its peak measurement; the best
round is kept, since other processes may share the cores.

* ``train_full``: all weights, batch 16 × 256 tokens (pre-training the base checkpoint).
* ``train_lora``: rank-32 adapters on attention, MLP and unembedding, 16 × 256 (what the
  Tinker-shaped client runs).
* ``forward``: logits only, 16 × 256.
* ``gen``: 8 prompts × 64 tokens, 64 new tokens each, temperature 1, with the KV cache and with
  full recomputation at every step; ``gen_single``: one prompt, with the cache (automatic threads).

    python bench/bench_model.py            # or: measure() from bench/run_all.py
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from rsigym_env.worlds.local.lm.model import (
    LoraConfig,
    ModelConfig,
    Transformer,
    _use_model_threads,
    flops_per_token,
    init_lora,
    init_params,
    set_blas_threads,
)

PEAK_SHAPES = [(4096, 512, 512), (4096, 256, 1024), (2048, 1024, 256)]
WORKLOADS = {"train_full": "full", "train_lora": "lora", "forward": "forward"}


def _best(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak(repeats: int = 3) -> float:
    """Best float32 matmul GFLOP/s over a few large shapes, with the model's BLAS thread setting."""
    rng = np.random.default_rng(0)
    best = 0.0
    _use_model_threads()
    for m, k, n in PEAK_SHAPES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        best = max(best, 2 * m * k * n / _best(lambda: a @ b, repeats) / 1e9)  # noqa: B023 (called at once)
    return best


def measure(seconds: float = 3.0) -> dict[str, float]:
    """Figures for one run; ``seconds`` is roughly the time spent per workload and thread setting."""
    cfg = ModelConfig()
    lcfg = LoraConfig(rank=32)
    params = init_params(cfg, 0)
    full = Transformer(cfg, params)
    lora = Transformer(cfg, params, init_lora(cfg, lcfg, 1), lcfg)
    rng = np.random.default_rng(0)
    bsz, seq = 16, 256
    tokens = rng.integers(0, cfg.vocab_size, (bsz, seq))
    targets = rng.integers(0, cfg.vocab_size, (bsz, seq))
    coef = -np.ones((bsz, seq), np.float32)
    work: dict[str, Callable[[], object]] = {
        "train_full": lambda: full.loss_and_grad(tokens, targets, coef, train_base=True, train_lora=False),
        "train_lora": lambda: lora.loss_and_grad(tokens, targets, coef, train_base=False, train_lora=True),
        "forward": lambda: full.logits(tokens),
    }
    out: dict[str, float] = {"params_millions": cfg.n_params() / 1e6}
    for threads in (1, 2):
        set_blas_threads(threads)
        try:
            for fn in work.values():
                fn()  # warm up
            step = {name: float("inf") for name in work}
            peak, rounds = 0.0, 0
            deadline = time.perf_counter() + seconds * len(work)
            while rounds < 2 or (time.perf_counter() < deadline and rounds < 30):
                peak = max(peak, matmul_peak())
                for name, fn in work.items():
                    step[name] = min(step[name], _best(fn, 1))
                rounds += 1
        finally:
            set_blas_threads(1)
        out[f"matmul_peak_gflops_t{threads}"] = peak
        for name, t in step.items():
            gflops = flops_per_token(cfg, seq, WORKLOADS[name], lcfg) * bsz * seq / t / 1e9
            out[f"{name}_tokens_per_s_t{threads}"] = bsz * seq / t
            out[f"{name}_gflops_t{threads}"] = gflops
            out[f"{name}_mfu_t{threads}"] = gflops / peak

    prompts = [rng.integers(0, 256, 64).tolist() for _ in range(8)]
    new = 64

    def gen(rows: list[list[int]], cache: bool) -> float:
        t = _best(lambda: full.generate(rows, new, temperature=1.0, seed=0, use_cache=cache), 2)
        return len(rows) * new / t

    out["gen_cache_tokens_per_s"] = gen(prompts, True)
    out["gen_nocache_tokens_per_s"] = gen(prompts, False)
    out["gen_cache_speedup"] = out["gen_cache_tokens_per_s"] / out["gen_nocache_tokens_per_s"]
    out["gen_single_cache_tokens_per_s"] = gen(prompts[:1], True)
    return out


def table(results: dict[str, float]) -> str:
    """The figures as a Markdown table."""
    r = results
    rows = [
        "| workload | BLAS threads | tokens/s | GFLOP/s | matmul peak GFLOP/s | MFU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    labels = {"train_full": "training, all weights (16 × 256)", "train_lora": "training, LoRA rank 32 (16 × 256)",
              "forward": "forward only (16 × 256)"}
    for name, label in labels.items():
        for t in (1, 2):
            rows.append(f"| {label} | {t} | {r[f'{name}_tokens_per_s_t{t}']:,.0f} | {r[f'{name}_gflops_t{t}']:.1f} "
                        f"| {r[f'matmul_peak_gflops_t{t}']:.0f} | {r[f'{name}_mfu_t{t}']:.0%} |")
    rows += [
        f"| generation, 8 prompts, KV cache | 1 | {r['gen_cache_tokens_per_s']:,.0f} | | | |",
        f"| generation, 8 prompts, no cache | 1 | {r['gen_nocache_tokens_per_s']:,.0f} | | | |",
        f"| generation, 1 prompt, KV cache | 1 | {r['gen_single_cache_tokens_per_s']:,.0f} | | | |",
        "",
        f"Model {r['params_millions']:.2f} M parameters, float32. KV cache speed-up ×{r['gen_cache_speedup']:.1f}.",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(measure()))
