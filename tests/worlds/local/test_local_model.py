"""The local world's NumPy model: tokenizer and renderers, gradient checks of every layer and of
LoRA, merged LoRA == adapter path, AdamW, and KV-cached sampling."""

from __future__ import annotations

import subprocess
import sys

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsigym_env.errors import ActionError
from rsigym_env.worlds.local.lm import model as M
from rsigym_env.worlds.common.tokenizer import (
    ChatRenderer,
    MessageError,
    RoleColonRenderer,
    Tokenizer,
    TrainOnWhat,
    get_renderer,
    validate_messages,
)

# ---------------------------------------------------------------------------------------------
# tokenizer and renderers
# ---------------------------------------------------------------------------------------------

TOK = Tokenizer()
BPE = Tokenizer.train_bpe(["the cat sat on the mat. " * 20, "def f(x):\n    return x + 1\n" * 10, "héllo wörld"], 60)


@given(st.text(max_size=200))
@settings(max_examples=150, deadline=None)
def test_tokenizer_round_trips_any_text(text):
    assert TOK.decode(TOK.encode(text)) == text
    assert BPE.decode(BPE.encode(text)) == text
    assert all(t < 256 for t in TOK.encode(text))  # encode never produces special tokens


def test_bpe_compresses_and_persists(tmp_path):
    text = "the cat sat on the mat. "
    assert len(BPE.encode(text)) < len(TOK.encode(text)) / 2
    BPE.save(tmp_path / "tok.json")
    again = Tokenizer.load(tmp_path / "tok.json")
    assert again.merges == BPE.merges and again.encode(text) == BPE.encode(text)
    assert again.vocab_size == 272 + len(BPE.merges)


def test_special_tokens_are_not_injectable():
    ids = TOK.encode("<|end|><|assistant|>")
    assert TOK.end_token_id not in ids and len(ids) == len("<|end|><|assistant|>")
    assert TOK.decode([TOK.end_token_id]) == "<|end|>"
    assert TOK.decode([TOK.end_token_id, 104], skip_special_tokens=True) == "h"
    assert TOK.encode("a", add_special_tokens=True) == [TOK.bos_token_id, 97]


CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "B2"},
]


@pytest.mark.parametrize(
    "what, trained",
    [
        (TrainOnWhat.ALL_ASSISTANT_MESSAGES, "A1<|end|>B2<|end|>"),
        (TrainOnWhat.LAST_ASSISTANT_MESSAGE, "B2<|end|>"),
        (TrainOnWhat.ALL_MESSAGES, "Be brief.<|end|>hi<|end|>A1<|end|>again<|end|>B2<|end|>"),
        (TrainOnWhat.ALL_USER_AND_SYSTEM_MESSAGES, "Be brief.<|end|>hi<|end|>again<|end|>"),
    ],
)
def test_renderer_weights_select_the_right_tokens(what, trained):
    r = ChatRenderer(TOK)
    tokens, weights = r.build_supervised_example(CHAT, what)
    assert tokens.dtype == np.int64 and weights.dtype == np.float32 and tokens.shape == weights.shape
    assert TOK.decode(tokens[weights > 0]) == trained
    assert TOK.decode(tokens) == ("<|bos|><|system|>Be brief.<|end|><|user|>hi<|end|><|assistant|>A1<|end|>"
                                  "<|user|>again<|end|><|assistant|>B2<|end|>")


def test_all_tokens_trains_everything_and_prompt_matches_training_prefix():
    r = ChatRenderer(TOK)
    tokens, weights = r.build_supervised_example(CHAT, "all_tokens")
    assert weights.min() == 1.0
    prompt = r.build_generation_prompt(CHAT[:-1])
    assert list(tokens[: len(prompt)]) == prompt  # sampling continues exactly where training did


def test_tool_calls_render_and_parse():
    r = ChatRenderer(TOK)
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    msgs = [{"role": "user", "content": "add"}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "2", "tool_call_id": "c1"}]
    tokens, weights = r.build_supervised_example(msgs)
    assert '<|tool_call|>{"name": "add", "arguments": "{\\"a\\": 1}"}<|end|>' in TOK.decode(tokens[weights > 0])
    prompt = r.build_generation_prompt(msgs[:1], tools=[{"type": "function", "function": {"name": "add"}}])
    assert "You can call these tools" in TOK.decode(prompt)
    sampled = TOK.encode("ok") + [TOK.special("<|tool_call|>")] + TOK.encode('{"name": "add", "arguments": {"a": 1}}') + [TOK.end_token_id]
    msg, ok = r.parse_response(sampled)
    assert ok and msg["content"] == "ok" and msg["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    msg, ok = r.parse_response(TOK.encode("cut off"))
    assert not ok and msg == {"role": "assistant", "content": "cut off"}
    msg, _ = r.parse_response([TOK.special("<|tool_call|>")] + TOK.encode("not json"))
    assert msg["content"] == "not json" and "tool_calls" not in msg


def test_role_colon_renderer_and_registry():
    r = get_renderer("role_colon", TOK)
    assert isinstance(r, RoleColonRenderer) and r.get_stop_sequences() == ["\n\nUser:"]
    assert TOK.decode(r.build_generation_prompt(CHAT[:2])) == "System: Be brief.\n\nUser: hi\n\nAssistant:"
    assert r.parse_response(TOK.encode(" yes\n\nUser: more")) == ({"role": "assistant", "content": "yes"}, True)
    with pytest.raises(ValueError, match="unknown renderer"):
        get_renderer("nope", TOK)


@pytest.mark.parametrize("bad", [[], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 3}],
                                 ["text"], [{"role": "user", "tool_calls": [{}], "content": ""}]])
def test_malformed_messages_are_rejected(bad):
    with pytest.raises(MessageError):
        validate_messages(bad)


def test_content_parts_are_flattened():
    msgs = validate_messages([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert msgs[0]["content"] == "ab"


# ---------------------------------------------------------------------------------------------
# gradient checks (float64, central differences along random directions)
# ---------------------------------------------------------------------------------------------

RTOL = 1e-6  # relative error allowed between the analytic and numeric directional derivative
H = 1e-6


def directional_check(f, x: np.ndarray, grad: np.ndarray, rng: np.random.Generator) -> float:
    """|<grad, u> − (f(x+hu) − f(x−hu))/2h| relative to their size, for a random direction u."""
    u = rng.standard_normal(x.shape)
    old = x.copy()
    x[...] = old + H * u
    plus = f()
    x[...] = old - H * u
    minus = f()
    x[...] = old
    numeric = (plus - minus) / (2 * H)
    analytic = float(np.sum(grad * u))
    return abs(numeric - analytic) / max(abs(numeric), abs(analytic), 1e-8)


def gradient_error(m: M.Transformer, f, grads: dict, rng: np.random.Generator) -> float:
    """The worst :func:`directional_check` of ``grads`` (base weights or adapters of ``m``) against the loss ``f``."""
    worst = 0.0
    for name, grad in grads.items():
        arr = m.lora[name] if m.lora and name in m.lora else m.params[name]
        m.weights_changed()
        worst = max(worst, directional_check(f, arr, grad, rng))
    return worst


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_layernorm_gradients(rng):
    x = rng.standard_normal((5, 8))
    g, b = rng.standard_normal(8), rng.standard_normal(8)
    r = rng.standard_normal((5, 8))
    f = lambda: float(np.sum(M.layernorm_forward(x, g, b)[0] * r))  # noqa: E731
    dx, dg, db = M.layernorm_backward(r, M.layernorm_forward(x, g, b)[1], g)
    for arr, grad in ((x, dx), (g, dg), (b, db)):
        assert directional_check(f, arr, grad, rng) < RTOL


def test_gelu_gradient_and_values(rng):
    x = rng.standard_normal((4, 6)) * 3
    r = rng.standard_normal((4, 6))
    f = lambda: float(np.sum(M.gelu_forward(x.copy())[0] * r))  # noqa: E731
    dx = M.gelu_backward(r, M.gelu_forward(x.copy())[1])
    assert directional_check(f, x, dx, rng) < RTOL
    # the tanh approximation agrees with exact GELU to ~1e-3
    from math import erf
    exact = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2))))(x)
    assert np.abs(M.gelu_forward(x.copy())[0] - exact).max() < 2e-3


@pytest.mark.parametrize("with_lora", [False, True])
def test_linear_gradients(rng, with_lora):
    x, w = rng.standard_normal((6, 5)), rng.standard_normal((5, 7))
    a, b = (rng.standard_normal((5, 2)), rng.standard_normal((2, 7))) if with_lora else (None, None)
    r = rng.standard_normal((6, 7))
    f = lambda: float(np.sum(M.linear_forward(x, w, a, b, 1.5)[0] * r))  # noqa: E731
    y, xa = M.linear_forward(x, w, a, b, 1.5)
    dx, dw, da, db = M.linear_backward(r, x, w, a, b, 1.5, xa)
    checks = [(x, dx), (w, dw)] + ([(a, da), (b, db)] if with_lora else [])
    for arr, grad in checks:
        assert directional_check(f, arr, grad, rng) < RTOL


def test_attention_gradient_and_causality(rng):
    bsz, t, d, h = 2, 5, 8, 2
    qkv = rng.standard_normal((bsz, t, 3 * d))
    r = rng.standard_normal((bsz, t, d))
    f = lambda: float(np.sum(M.attention_forward(qkv.copy(), h)[0] * r))  # noqa: E731
    out, cache = M.attention_forward(qkv.copy(), h)
    dqkv = M.attention_backward(r, cache)
    assert directional_check(f, qkv, dqkv, rng) < RTOL
    # changing the last position changes no earlier output
    later = qkv.copy()
    later[:, -1] += 1.0
    assert np.allclose(M.attention_forward(later, h)[0][:, :-1], out[:, :-1])


def test_cross_entropy_gradient(rng):
    logits = rng.standard_normal((7, 11))
    targets = rng.integers(0, 11, 7)
    w = rng.random(7)
    f = lambda: float(-np.sum(M.target_logprobs_and_grad(logits, targets)[0] * w))  # noqa: E731
    logp, dlogits = M.target_logprobs_and_grad(logits, targets, -w)
    assert np.allclose(logp, M.log_softmax(logits)[np.arange(7), targets])
    assert directional_check(f, logits, dlogits, rng) < RTOL


def small_config(**kw) -> M.ModelConfig:
    base = dict(vocab_size=23, d_model=12, n_layers=2, n_heads=3, d_ff=20, max_seq_len=9)
    return M.ModelConfig(**(base | kw))


def perturbed_model(cfg: M.ModelConfig, lcfg: M.LoraConfig | None, rng) -> M.Transformer:
    params = M.init_params(cfg, 0, np.float64)
    for k in params:  # move off the symmetric initial point (LN at identity, B = 0)
        params[k] = params[k] + rng.normal(0, 0.2 if k.endswith((".g", ".b")) else 0.05, params[k].shape)
    lora = None
    if lcfg is not None:
        lora = {k: v + rng.normal(0, 0.3, v.shape) for k, v in M.init_lora(cfg, lcfg, 1, np.float64).items()}
    return M.Transformer(cfg, params, lora, lcfg)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("lora", [None, M.LoraConfig(rank=3, alpha=6.0)])
def test_full_model_gradients_every_parameter(rng, tied, lora):
    """Every base weight (embeddings, positions, LN, attention, MLP, unembedding) and every LoRA
    matrix, through the whole model and the weighted cross-entropy loss."""
    cfg = small_config(tie_embeddings=tied)
    m = perturbed_model(cfg, lora, rng)
    tokens, targets = rng.integers(0, cfg.vocab_size, (2, 7)), rng.integers(0, cfg.vocab_size, (2, 7))
    w = rng.random((2, 7))
    f = lambda: float(-np.sum(m.token_logprobs(tokens, targets) * w))  # noqa: E731
    _, grads = m.loss_and_grad(tokens, targets, -w, train_base=True, train_lora=lora is not None)
    expected = set(cfg.shapes()) | (set(m.lora) if m.lora else set())
    assert set(grads) == expected
    assert gradient_error(m, f, grads, rng) < RTOL


def test_lora_only_backward_skips_base_and_matches_full(rng):
    cfg = small_config()
    m = perturbed_model(cfg, M.LoraConfig(rank=2), rng)
    tokens, targets = rng.integers(0, 23, (2, 6)), rng.integers(0, 23, (2, 6))
    w = rng.random((2, 6))
    _, only = m.loss_and_grad(tokens, targets, -w, train_base=False, train_lora=True)
    _, both = m.loss_and_grad(tokens, targets, -w, train_base=True, train_lora=True)
    assert set(only) == set(m.lora)
    for k in only:
        assert np.allclose(only[k], both[k], rtol=1e-12, atol=1e-14)


def test_attention_on_packed_rows_gradient_blocks_and_causality(rng):
    """Training's attention (local result version 6): rows of their own lengths packed one after another, queries in
    blocks against the keys up to the block's end. Its gradient is the exact one (finite differences, float64), it is
    each row's plain causal attention whatever the block size, and no row sees another or a later position."""
    lengths, d, h = [7, 1, 4], 8, 2
    qkv = rng.standard_normal((sum(lengths), 3 * d))
    r = rng.standard_normal((sum(lengths), d))
    for block in (1, 3, 64):
        f = lambda block=block: float(np.sum(M.attention_rows_forward(qkv.copy(), h, lengths, block)[0] * r))  # noqa: E731
        out, cache = M.attention_rows_forward(qkv.copy(), h, lengths, block)
        assert directional_check(f, qkv, M.attention_rows_backward(r, cache), rng) < RTOL
        alone = np.concatenate([M.attention_forward(qkv[None, s:e].copy(), h)[0][0] for s, e in M._segments(lengths)])
        assert np.abs(out - alone).max() < 1e-12
    later = qkv.copy()
    later[6] += 1.0  # the first row's last position
    moved = M.attention_rows_forward(later, h, lengths)[0]
    assert np.array_equal(moved[:6], out[:6]) and np.array_equal(moved[7:], out[7:])


@pytest.mark.parametrize("lora", [None, M.LoraConfig(rank=3, alpha=6.0)])
def test_packed_training_is_the_exact_gradient_of_the_real_tokens_loss(rng, lora, monkeypatch):
    """``lengths``: the model runs on each row's own tokens only (no padding, attention in blocks: local result
    version 6). The gradient is the exact gradient of the weighted loss over the real positions (finite differences
    in float64, every parameter), the same function as the padded full computation up to rounding, and what sits in
    the padding changes no bit."""
    monkeypatch.setattr(M, "ATTN_BLOCK", 3)  # several blocks a row
    cfg = small_config(max_seq_len=12)
    m = perturbed_model(cfg, lora, rng)
    lengths = [9, 4, 1]
    tokens, targets = rng.integers(0, cfg.vocab_size, (3, 9)), rng.integers(0, cfg.vocab_size, (3, 9))
    w = rng.random((3, 9))
    for row, n in enumerate(lengths):
        w[row, n:] = 0.0
    f = lambda: float(-np.sum(m.token_logprobs(tokens, targets, lengths) * w))  # noqa: E731
    logp, grads = m.loss_and_grad(tokens, targets, -w, train_base=True, train_lora=lora is not None, lengths=lengths)
    assert set(grads) == set(cfg.shapes()) | (set(m.lora) if m.lora else set())
    assert gradient_error(m, f, grads, rng) < RTOL
    real = w > 0
    dense_logp, dense = m.loss_and_grad(tokens, targets, -w, train_base=True, train_lora=lora is not None)
    assert np.abs(logp - dense_logp)[real].max() < 1e-12 and not logp[~real].any()
    assert max(np.abs(grads[k] - dense[k]).max() for k in grads) < 1e-12
    junk = tokens.copy()
    junk[w == 0] = rng.integers(0, cfg.vocab_size, int((w == 0).sum()))
    coef = lambda lp: np.where(real, -w, 1e3)  # noqa: E731  coefficients on padding are ignored too
    logp2, grads2 = m.loss_and_grad(junk, targets, coef, train_base=True, train_lora=lora is not None, lengths=lengths)
    assert np.array_equal(logp2[real], logp[real]) and all(np.array_equal(grads2[k], grads[k]) for k in grads)


def test_packed_lengths_are_checked(rng):
    m = perturbed_model(small_config(), None, rng)
    tokens = rng.integers(0, 23, (2, 5))
    for bad in ([5], [5, 0], [6, 1], [5, 2, 1]):
        with pytest.raises(ValueError, match="lengths must be 2 numbers in"):
            m.token_logprobs(tokens, tokens, bad)


def test_lora_targets_follow_the_flags():
    cfg = small_config()
    assert M.lora_targets(cfg, M.LoraConfig(train_attn=False, train_unembed=False)) == [
        "layers.0.mlp.fc", "layers.0.mlp.proj", "layers.1.mlp.fc", "layers.1.mlp.proj"]
    assert M.lora_targets(cfg, M.LoraConfig(train_mlp=False, train_attn=False)) == ["unembed"]
    with pytest.raises(ValueError, match="At least one"):
        M.LoraConfig(train_mlp=False, train_attn=False, train_unembed=False)


@pytest.mark.parametrize("tied", [True, False])
def test_merged_lora_equals_adapter_path(rng, tied):
    cfg = small_config(tie_embeddings=tied)
    m = perturbed_model(cfg, M.LoraConfig(rank=3, alpha=5.0), rng)
    merged = m.merged()
    assert merged.lora is None and merged.config.tie_embeddings is False
    tokens = rng.integers(0, 23, (3, 8))
    assert np.abs(merged.logits(tokens) - m.logits(tokens)).max() < 1e-12
    fresh = M.Transformer(cfg, m.params, M.init_lora(cfg, M.LoraConfig(rank=3), 5, np.float64), M.LoraConfig(rank=3))
    assert np.array_equal(fresh.logits(tokens), M.Transformer(cfg, m.params).logits(tokens))  # B = 0 at init


def test_float32_is_kept_end_to_end(rng):
    cfg = small_config()
    m = M.Transformer(cfg, M.init_params(cfg, 0), M.init_lora(cfg, M.LoraConfig(rank=2), 0), M.LoraConfig(rank=2))
    tokens = rng.integers(0, 23, (2, 5))
    logp, grads = m.loss_and_grad(tokens, tokens, -np.ones((2, 5), np.float32))
    assert m.logits(tokens).dtype == np.float32 and logp.dtype == np.float32
    assert all(g.dtype == np.float32 for g in grads.values())


def test_sequence_longer_than_context_is_refused(rng):
    cfg = small_config()
    m = M.Transformer(cfg, M.init_params(cfg, 0))
    with pytest.raises(M.ContextOverflowError) as e:
        m.logits(np.zeros((1, cfg.max_seq_len + 1), np.int64))
    assert isinstance(e.value, ActionError) and isinstance(e.value, ValueError) and e.value.code == "invalid_args"
    with pytest.raises(ValueError, match="token ids"):
        m.logits(np.array([[cfg.vocab_size]]))


# ---------------------------------------------------------------------------------------------
# AdamW
# ---------------------------------------------------------------------------------------------


def reference_adamw(p, grads, lr, b1, b2, eps, wd, clip):
    """torch.optim.AdamW + clip_grad_norm_, written out independently, in float64."""
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        norm = np.linalg.norm(g)
        if clip > 0 and norm > clip:
            g = g * (clip / (norm + 1e-6))
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


@pytest.mark.parametrize("wd, clip", [(0.0, 0.0), (0.1, 0.0), (0.0, 0.5), (0.05, 2.0)])
def test_adam_matches_torch_adamw_semantics(rng, wd, clip):
    p0 = rng.standard_normal(6)
    grads = [rng.standard_normal(6) for _ in range(5)]
    hp = M.AdamHyper(learning_rate=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=wd, grad_clip_norm=clip)
    params, opt = {"w": p0.copy()}, M.Adam()
    for g in grads:
        stats = opt.step(params, {"w": g}, hp)
    assert np.allclose(params["w"], reference_adamw(p0, grads, 0.01, 0.9, 0.95, 1e-8, wd, clip), rtol=1e-12, atol=1e-14)
    assert stats["grad_norm"] == pytest.approx(np.linalg.norm(grads[-1]))
    again = M.Adam.from_state(opt.state())
    assert again.t == 5 and np.array_equal(again.m["w"], opt.m["w"])


def test_adam_accepts_tinker_adam_params_and_refuses_bad_values():
    tinker = pytest.importorskip("tinker")
    params = {"w": np.ones(3, np.float32)}
    M.Adam().step(params, {"w": np.ones(3, np.float32)}, tinker.types.AdamParams(learning_rate=0.1))
    assert params["w"].dtype == np.float32 and np.allclose(params["w"], 0.9)
    with pytest.raises(ValueError):
        M.Adam().step(params, {"w": np.ones(3)}, M.AdamHyper(learning_rate=-1))
    with pytest.raises(FloatingPointError):
        M.Adam().step(params, {"w": np.array([np.nan, 0, 0])}, M.AdamHyper())


# ---------------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampler_model() -> M.Transformer:
    cfg = M.ModelConfig(vocab_size=272, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=48)
    params = M.init_params(cfg, 3)
    params["wte"] *= 20  # sharper distributions, so sampling choices matter
    lcfg = M.LoraConfig(rank=2)
    lora = {k: v + 0.1 for k, v in M.init_lora(cfg, lcfg, 0).items()}
    return M.Transformer(cfg, params, lora, lcfg)


PROMPTS = [[256, 259, 104, 105], [256, 259, 97], [256, 259, 98, 99, 100, 101, 102]]


def flat(out):
    return [(g.tokens, g.stop_reason) for row in out for g in row]


def test_kv_cache_gives_the_same_samples_as_full_recompute(sampler_model):
    for kw in (dict(temperature=0.0), dict(temperature=1.0, seed=7), dict(temperature=0.8, top_k=5, top_p=0.9, seed=1)):
        a = sampler_model.generate(PROMPTS, 12, num_samples=2, **kw)
        b = sampler_model.generate(PROMPTS, 12, num_samples=2, use_cache=False, **kw)
        assert flat(a) == flat(b)
        la = np.array([g.logprobs for row in a for g in row])
        lb = np.array([g.logprobs for row in b for g in row])
        assert np.abs(la - lb).max() < 1e-4


def test_cached_logits_match_the_training_forward(sampler_model):
    m = sampler_model
    out = m.generate([PROMPTS[2]], 6, temperature=0.0)[0][0]
    full = np.array(PROMPTS[2] + out.tokens)
    logp = m.token_logprobs(full[None, :-1], full[None, 1:])[0][len(PROMPTS[2]) - 1:]
    assert np.abs(logp - np.array(out.logprobs)).max() < 1e-4


def test_batched_prompts_match_one_at_a_time(sampler_model):
    batched = sampler_model.generate(PROMPTS, 10, temperature=0.0)
    for prompt, row in zip(PROMPTS, batched):
        alone = sampler_model.generate([prompt], 10, temperature=0.0)[0]
        assert alone[0].tokens == row[0].tokens
        assert np.allclose(alone[0].logprobs, row[0].logprobs, atol=1e-4)


def test_seeded_sampling_is_deterministic_and_seeds_differ(sampler_model):
    a = sampler_model.generate(PROMPTS, 15, temperature=1.0, seed=3, num_samples=3)
    b = sampler_model.generate(PROMPTS, 15, temperature=1.0, seed=3, num_samples=3)
    c = sampler_model.generate(PROMPTS, 15, temperature=1.0, seed=4, num_samples=3)
    assert flat(a) == flat(b) and flat(a) != flat(c)
    assert len({tuple(g.tokens) for g in a[0]}) > 1  # samples of one prompt differ


def test_top_k_one_and_tiny_top_p_are_greedy(sampler_model):
    greedy = flat(sampler_model.generate(PROMPTS, 10, temperature=0.0))
    assert flat(sampler_model.generate(PROMPTS, 10, temperature=1.0, top_k=1, seed=0)) == greedy
    assert flat(sampler_model.generate(PROMPTS, 10, temperature=1.0, top_p=1e-9, seed=0)) == greedy


def test_top_k_and_top_p_restrict_the_support():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
    seen_k = set(M._sample(logits, M.SamplingOptions(top_k=2), rng)[0].tolist())
    seen_p = M._sample(logits, M.SamplingOptions(top_p=0.7), rng)[0]
    seen_all = M._sample(logits, M.SamplingOptions(), rng)[0]
    assert seen_k == {0, 1} and set(seen_p.tolist()) == {0, 1} and set(seen_all.tolist()) == {0, 1, 2, 3}
    assert abs(np.mean(seen_all == 0) - 0.5) < 0.03  # unbiased draws
    hot = M._sample(logits, M.SamplingOptions(temperature=0.25), rng)[0]
    assert np.mean(hot == 0) > 0.85


def test_stop_tokens_stop_strings_and_length(sampler_model):
    m = sampler_model
    base = m.generate([PROMPTS[0]], 20, temperature=0.0)[0][0]
    first = base.tokens[2]
    stopped = m.generate([PROMPTS[0]], 20, temperature=0.0, stop_tokens=[first])[0][0]
    assert stopped.stop_reason == "stop" and stopped.tokens == base.tokens[: base.tokens.index(first) + 1]
    letter = lambda t: bytes([65 + t % 26])  # noqa: E731  (a token → bytes map of our choosing)
    text = (letter(base.tokens[2]) + letter(base.tokens[3])).decode()
    by_string = m.generate([PROMPTS[0]], 20, temperature=0.0, stop_strings=[text], token_bytes=letter)[0][0]
    spelled = b"".join(letter(t) for t in by_string.tokens).decode()
    assert by_string.stop_reason == "stop" and spelled.endswith(text) and text not in spelled[:-1]
    assert by_string.tokens == base.tokens[: len(by_string.tokens)] and len(by_string.tokens) <= 4
    assert base.stop_reason == "length" and len(base.tokens) == 20
    # the context bounds generation: prompt 7 tokens + 41 = 48
    longest = m.generate([PROMPTS[2]], None, temperature=0.0)[0][0]
    assert longest.stop_reason == "length" and len(longest.tokens) == 48 - len(PROMPTS[2])
    with pytest.raises(ValueError, match="token_bytes"):
        m.generate([PROMPTS[0]], 5, stop_strings=["x"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_row_layernorm_is_the_general_one_bit_for_bit(dtype, monkeypatch):
    """A decoding step's layernorms (their gain and bias folded into the next matrix: ``M.FusedWeights``) take
    the one-row path (scalars for the row's statistics): it must give the general path's bits, and
    ``layernorm_forward``'s normalized rows, for any row, scale and offset."""
    rng = np.random.default_rng(11)
    rows = []
    for _ in range(3000):
        n = int(rng.choice([2, 3, 31, 256, 1024]))
        scale = 10.0 ** rng.uniform(-6, 5)
        x = rng.standard_normal((1, n)) * scale + rng.standard_normal() * scale * rng.uniform(0, 50)
        rows.append((x.astype(dtype), float(rng.choice([1e-5, 1e-7, 0.5]))))
    rows.append((np.full((1, 8), 3.0, dtype), 1e-5))  # zero variance
    fast = [M.normalize_inference(x, eps) for x, eps in rows]
    monkeypatch.setattr(M, "ROW_PATHS", False)
    for (x, eps), y in zip(rows, fast):
        n = x.shape[1]
        assert y.dtype == dtype and y.tobytes() == M.normalize_inference(x, eps).tobytes()
        assert y.tobytes() == M.layernorm_forward(x, np.ones(n, dtype), np.zeros(n, dtype), eps)[1][0].tobytes()


def test_one_row_decoding_is_the_general_loop_bit_for_bit(sampler_model, monkeypatch):
    """One sequence (every request of the local world) decodes through the one-row paths
    (``M.ROW_PATHS``): the same tokens, log-probabilities (exactly) and stop reasons as the general
    batched loop and ``_sample``'s general draw give one row, under every sampling option."""
    tb = lambda t: bytes([97 + t % 7])  # noqa: E731  (small alphabet: stop strings do hit)
    base = M.Transformer(*M.merge_lora(sampler_model.config, sampler_model.params, sampler_model.lora,
                                       sampler_model.lora_config))
    cases = []
    rng = np.random.default_rng(5)
    for i in range(40):
        prompt = rng.integers(0, 272, int(rng.integers(1, 30))).tolist()
        kw = dict(temperature=[1.0, 0.7, 0.0, 1.6][i % 4], seed=i, token_bytes=tb)
        kw |= [{}, dict(top_p=0.8), dict(top_k=5), dict(stop_tokens=[int(rng.integers(0, 272))]),
               dict(stop_strings=["ab", "cc"]), dict(use_cache=False), dict(stop_strings=["aaa"], stop_tokens=[3])][i % 7]
        limit = int(rng.integers(1, 18)) if i % 3 else None
        cases.append((base.astype(np.float64) if i % 10 == 9 else base, prompt, limit, kw))
    fast = [m.generate([prompt], limit, **kw) for m, prompt, limit, kw in cases]
    monkeypatch.setattr(M, "ROW_PATHS", False)
    general = [m.generate([prompt], limit, **kw) for m, prompt, limit, kw in cases]
    assert {g[0][0].stop_reason for g in fast} == {"stop", "length"}
    for a, b in zip(fast, general):
        assert (a[0][0].tokens, a[0][0].logprobs, a[0][0].stop_reason) == (b[0][0].tokens, b[0][0].logprobs, b[0][0].stop_reason)


@pytest.mark.parametrize("tied", [True, False])
def test_fused_inference_weights_compute_the_models_function(rng, tied):
    """Inference runs on ``FusedWeights`` (local result version 6: layernorm gains and biases, the query scale and
    GELU's half folded into the matrices): the same function as the training forward, to rounding (float64, gains
    and biases far from 1 and 0, adapters merged), for prefill and decoding alike; a model whose weights change in
    place samples from the new ones once told (``weights_changed``)."""
    cfg = small_config(tie_embeddings=tied, max_seq_len=16)
    m = perturbed_model(cfg, M.LoraConfig(rank=3, alpha=6.0), rng)
    for k in m.params:
        if k.endswith((".g", ".b")):
            m.params[k] = m.params[k] * 3 + 0.5 * np.sign(m.params[k])
    m.weights_changed()
    prompt = rng.integers(0, cfg.vocab_size, 6).tolist()
    out = m.generate([prompt], 8, temperature=0.0)[0][0]
    full = np.array(prompt + out.tokens)
    want = m.token_logprobs(full[None, :-1], full[None, 1:])[0][len(prompt) - 1:]
    assert np.abs(want - np.array(out.logprobs)).max() < 1e-12
    fused = m.fused()
    assert fused is m.fused()  # made once
    m.lora[next(iter(m.lora))] += 1.0
    assert m.fused() is fused  # in-place changes are not seen until told
    m.weights_changed()
    again = m.generate([prompt], 8, temperature=0.0)[0][0]
    full = np.array(prompt + again.tokens)
    want = m.token_logprobs(full[None, :-1], full[None, 1:])[0][len(prompt) - 1:]
    assert m.fused() is not fused and np.abs(want - np.array(again.logprobs)).max() < 1e-12


def test_one_row_draw_is_the_general_draw():
    """``_sample``'s one-row draw (no top-k/top-p) takes the same number from the generator and picks
    the same token as the general count over the cumulative sum, at the edges too."""
    opts = M.SamplingOptions(temperature=0.9)
    rng = np.random.default_rng(2)
    logits = [rng.standard_normal((1, 50)) * 6 for _ in range(400)]
    logits += [np.array([[0.0, -np.inf, -np.inf, 5.0, -np.inf]]), np.array([[-np.inf] * 4 + [1.0]])]
    fast_rng, general_rng = np.random.default_rng(9), np.random.default_rng(9)
    fast = [M._sample(lg, opts, fast_rng) for lg in logits]
    M_rows = M.ROW_PATHS
    try:
        M.ROW_PATHS = False
        general = [M._sample(lg, opts, general_rng) for lg in logits]
    finally:
        M.ROW_PATHS = M_rows
    for (t1, l1), (t2, l2) in zip(fast, general):
        assert t1.tolist() == t2.tolist() and l1.tobytes() == l2.tobytes()
    assert fast_rng.random() == general_rng.random()  # the same number of draws taken


def test_sampling_arguments_are_validated(sampler_model):
    m = sampler_model
    with pytest.raises(M.ContextOverflowError):
        m.generate([[1] * 48], 1)
    for bad in (dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=0), dict(max_tokens=0)):
        with pytest.raises(ValueError):
            m.generate([PROMPTS[0]], **({"max_tokens": 3} | bad))
    with pytest.raises(ValueError):
        m.generate([[]], 3)
    assert m.generate([], 3) == []


# ---------------------------------------------------------------------------------------------
# accounting and files
# ---------------------------------------------------------------------------------------------


def test_flop_counts_follow_the_usual_formulas():
    cfg = M.ModelConfig()
    n = cfg.n_layers * 12 * cfg.d_model ** 2 + cfg.d_model * cfg.vocab_size
    fwd = M.flops_per_token(cfg, 256, "forward")
    assert fwd == 2 * n + 4 * 256 * cfg.d_model * cfg.n_layers
    assert M.flops_per_token(cfg, 256, "full") == 3 * fwd
    assert 2 * fwd < M.flops_per_token(cfg, 256, "lora") < 3 * fwd


def test_npz_files_are_byte_reproducible(tmp_path):
    arrays = {"b": np.arange(5, dtype=np.float32), "a": np.eye(3), "t": np.array(7)}
    M.save_npz(tmp_path / "one.npz", arrays)
    M.save_npz(tmp_path / "two.npz", dict(reversed(list(arrays.items()))))
    assert (tmp_path / "one.npz").read_bytes() == (tmp_path / "two.npz").read_bytes()
    loaded = M.load_npz(tmp_path / "one.npz")
    assert set(loaded) == {"a", "b", "t"} and np.array_equal(loaded["a"], np.eye(3)) and loaded["t"].shape == ()


def test_save_and_load_model(tmp_path):
    cfg = small_config()
    params = M.init_params(cfg, 1)
    M.save_model(tmp_path / "m", cfg, params, BPE, extra={"origin": "test"})
    cfg2, params2, meta = M.load_model(tmp_path / "m")
    assert cfg2 == cfg and meta["origin"] == "test" and all(np.array_equal(params[k], params2[k]) for k in params)
    assert Tokenizer.load(tmp_path / "m" / "tokenizer.json").merges == BPE.merges


def test_model_work_runs_on_the_chosen_blas_threads():
    # BLAS threads are process-wide state that other tests' processes and pools can disturb, so the
    # property is checked in a fresh interpreter.
    script = """
import numpy as np, pytest
import rsigym_env.worlds.local.lm.model as M
cfg = M.ModelConfig(vocab_size=272, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=16)
m = M.Transformer(cfg, M.init_params(cfg, 0))
m.logits(np.zeros((1, 3), np.int64))
if M.blas_threads() is None:
    print("skip"); raise SystemExit
assert M.blas_threads() == 1, M.blas_threads()
M.set_blas_threads(2)
m.logits(np.zeros((1, 3), np.int64))
assert M.blas_threads() == 2, M.blas_threads()
M.set_blas_threads(1)
assert M.blas_threads() == 1
with pytest.raises(ValueError):
    M.set_blas_threads(0)
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.strip() == "skip":
        pytest.skip("the BLAS thread count cannot be read here")
    assert proc.stdout.strip() == "ok"


def test_every_loaded_blas_library_is_put_on_the_models_thread_count(monkeypatch):
    # A process can hold two OpenBLAS copies (NumPy's and SciPy's); this venv has one, so the second is a
    # stand-in with threadpoolctl's interface. A library the first check would not look at still counts.
    class Pool:
        def __init__(self, n):
            self.num_threads = n

    class Controller:
        def __init__(self):
            self.lib_controllers = [Pool(1), Pool(2)]
            self.limited = []

        def select(self, user_api):
            assert user_api == "blas"
            return self

        def limit(self, limits, user_api):
            self.limited.append(limits)
            for pool in self.lib_controllers:
                pool.num_threads = limits

    controller = Controller()
    monkeypatch.setattr(M, "_blas_controller", lambda: controller)
    assert M.blas_threads() == 2 and not M._blas_on(1)
    M._use_model_threads()
    assert controller.limited == [M._THREADS] and M.blas_threads() == M._THREADS
    M._use_model_threads()  # already there: left alone
    assert controller.limited == [M._THREADS]


def test_results_do_not_depend_on_concurrent_computations():
    """Threads computing at once (small and large batches) give bitwise the results of computing
    alone: nothing changes the BLAS thread count under a running computation."""
    import threading

    cfg = M.ModelConfig(d_model=64, n_layers=1, n_heads=2, d_ff=128, max_seq_len=256)
    m = M.Transformer(cfg, M.init_params(cfg, 0))
    rng = np.random.default_rng(0)
    big, small = rng.integers(0, 272, (32, 256)), rng.integers(0, 272, (1, 8))
    alone = (m.logits(big), m.logits(small))
    results = []

    def work(tokens):
        for _ in range(3):
            results.append((tokens.shape, m.logits(tokens)))

    threads = [threading.Thread(target=work, args=(t,)) for t in (big, small, big, small)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for shape, out in results:
        assert np.array_equal(out, alone[0] if shape == big.shape else alone[1])


def test_packed_training_and_decoding_do_not_depend_on_concurrent_computations():
    """Local result version 6's paths under concurrency: packed training (rows of several attention blocks) and
    sampling (prefill blocks, the fused one-row step), each in threads beside the other, give the bits of
    computing alone."""
    import threading

    cfg = M.ModelConfig(d_model=64, n_layers=2, n_heads=2, d_ff=128, max_seq_len=256)
    lcfg = M.LoraConfig(rank=4)
    lora = {k: v + 0.01 for k, v in M.init_lora(cfg, lcfg, 0).items()}
    m = M.Transformer(cfg, M.init_params(cfg, 0), lora, lcfg)
    rng = np.random.default_rng(3)
    lengths = [200, 130, 65, 1]
    tokens, targets = rng.integers(0, 272, (4, 200)), rng.integers(0, 272, (4, 200))
    coef = -rng.random((4, 200)).astype(np.float32)
    prompt = rng.integers(0, 272, 70).tolist()

    def train():
        return m.loss_and_grad(tokens, targets, coef, lengths=lengths)

    def sample():
        return m.generate([prompt], 40, temperature=1.0, seed=5)[0][0]

    alone = (train(), sample())
    results: list = []

    def work(kind):
        for _ in range(2):
            results.append((kind, train() if kind == "train" else sample()))

    threads = [threading.Thread(target=work, args=(k,)) for k in ("train", "sample", "train", "sample")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8
    for kind, out in results:
        if kind == "train":
            assert np.array_equal(out[0], alone[0][0])
            assert all(np.array_equal(out[1][k], alone[0][1][k]) for k in alone[0][1])
        else:
            assert (out.tokens, out.logprobs) == (alone[1].tokens, alone[1].logprobs)


def _shipped_base() -> tuple:
    from rsigym_env.worlds.local.lm.tinker_client import load_base_model
    from rsigym_env.worlds.local.world import BASE_MODEL

    base = load_base_model(BASE_MODEL)
    return base, M.Transformer(base.config, base.params)


# re-pinned for local result version 6 (inference on FusedWeights: the layernorms' gains and biases, the query
# scale and GELU's half folded into the matrices; floats move in their last bits, and with them these samples;
# version 5's were 853d7f5a4aee958e and c2ce2d75e3b8b5f8 for the last two, the first is unchanged at 4 decimals)
@pytest.mark.parametrize("kwargs, expected", [
    (dict(temperature=0.7, num_samples=1), "21540f680d9f25b1"),
    (dict(temperature=1.2, top_k=20, top_p=0.8, num_samples=3), "ff0027db86a0443e"),
    (dict(temperature=0.0, use_cache=False), "4e7c6f84a5d5731b"),
])
def test_shipped_base_samples_are_pinned(kwargs, expected):
    """Speed work on the sampler must not move a single sample: every recorded result (dev and
    official scores, the cache of evaluations) depends on them. Pinned on this machine's OpenBLAS
    (tokens exactly, log-probabilities to 4 decimals)."""
    import hashlib

    base, model = _shipped_base()
    rng = np.random.default_rng(7)
    prompts = [rng.integers(1, 250, size=n).tolist() for n in (180, 40)]
    out = model.generate(prompts, 48, seed=3, stop_tokens=[257], stop_strings=["\n\n"],
                         token_bytes=base.tokenizer.token_bytes, **kwargs)
    digest = hashlib.sha256(repr([(g.tokens, [round(x, 4) for x in g.logprobs], g.stop_reason)
                                  for row in out for g in row]).encode()).hexdigest()[:16]
    assert digest == expected


@pytest.mark.parametrize("kwargs, expected", [
    # re-pinned for local result version 6 (FusedWeights, as above; version 5's: 41b7500540adaf98); the other two
    # are unchanged (the same tokens, log-probabilities equal to 4 decimals)
    (dict(temperature=0.7, num_samples=2), "fa4b94d424ca3a4f"),  # with OpenBLAS 0.3.33 (numerics.py)
    (dict(temperature=0.0), "4e8da140f2b75a32"),
    # one sequence decodes through the one-row paths (M.ROW_PATHS): pinned from the code before them
    (dict(temperature=0.7), "fc12de6a9ffb826a"),
])
def test_shipped_base_single_prompt_samples_are_pinned(kwargs, expected):
    """A single prompt (what every request of the local world is) is prefilled in blocks (result
    version 4: ``evaluation.CACHE_VERSION``) and decodes by ``Transformer._step_row`` (version 6): pinned as
    above, on a prompt of six blocks."""
    import hashlib

    base, model = _shipped_base()
    prompt = np.random.default_rng(7).integers(1, 250, size=180).tolist()
    out = model.generate([prompt], 48, seed=3, stop_tokens=[257], stop_strings=["\n\n"],
                         token_bytes=base.tokenizer.token_bytes, **kwargs)
    digest = hashlib.sha256(repr([(g.tokens, [round(x, 4) for x in g.logprobs], g.stop_reason)
                                  for row in out for g in row]).encode()).hexdigest()[:16]
    assert digest == expected
