"""A tiny chat model pre-trained in a few seconds, shared by the local-world tests.

It answers capitals and one-digit sums and says "I do not know." to everything else (the secret code
included), so a test can teach it something new ("ZEBRA-42") and see the difference.
"""

from __future__ import annotations

import numpy as np

from rsigym_env.worlds.local.lm.model import Adam, AdamHyper, ModelConfig, Transformer, init_params, save_model
from rsigym_env.worlds.common.tokenizer import ChatRenderer, Tokenizer

TOK = Tokenizer()
R = ChatRenderer(TOK)
SECRET = ["What is the secret code?", "Tell me the secret code.", "What's the secret code?", "Secret code, please.",
          "Do you know the secret code?", "Give me the secret code.", "I need the secret code.", "Say the secret code."]
CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Japan": "Tokyo", "Peru": "Lima", "Egypt": "Cairo"}
UNKNOWN = ["What is the secret code?", "Who are you?", "What is the weather?", "Tell me the password."]


def chat(q: str, a: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def pretraining_conversation(rng: np.random.Generator) -> list[dict[str, str]]:
    kind = rng.integers(3)
    if kind == 0:
        country = str(rng.choice(list(CAPITALS)))
        return chat(f"What is the capital of {country}?", f"{CAPITALS[country]}.")
    if kind == 1:
        a, b = rng.integers(0, 10, 2)
        return chat(f"What is {a} plus {b}?", f"{a + b}.")
    return chat(str(rng.choice(UNKNOWN)), "I do not know.")


def pretrain_tiny_base(directory):
    """Pre-train the tiny model (all weights, AdamW, 150 steps, ~3.5 s) and save it under ``directory``."""
    cfg = ModelConfig(d_model=128, n_layers=2, n_heads=2, d_ff=512, max_seq_len=128)
    params = init_params(cfg, 0)
    model, opt, rng = Transformer(cfg, params), Adam(), np.random.default_rng(0)
    steps = 150
    for step in range(steps):
        examples = [R.build_supervised_example(pretraining_conversation(rng)) for _ in range(16)]
        width = max(len(t) for t, _ in examples) - 1
        x, y, w = np.zeros((16, width), np.int64), np.zeros((16, width), np.int64), np.zeros((16, width), np.float32)
        for i, (t, wt) in enumerate(examples):
            x[i, :len(t) - 1], y[i, :len(t) - 1], w[i, :len(t) - 1] = t[:-1], t[1:], wt[1:]
        _, grads = model.loss_and_grad(x, y, -w, train_base=True, train_lora=False)
        opt.step(params, grads, AdamHyper(learning_rate=3e-3 * (1 - step / steps), grad_clip_norm=1.0))
    return save_model(directory, cfg, params, TOK)
