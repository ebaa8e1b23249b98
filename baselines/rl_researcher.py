"""An RL researcher: PPO in NumPy over the discrete research menu, trained on the sim world.

CleanRL-style, one file: a typed :class:`Args`, a small actor-critic MLP (two tanh layers each) with
hand-written backprop and Adam, a masked softmax over :data:`~rsigym_env.wrappers.menu.MENU`, PPO
with GAE, and :class:`RLResearcher`, which plays a saved policy on the raw env like any other
baseline (it keeps its own :class:`~rsigym_env.wrappers.menu.MenuAdapter`, so it needs no wrapper).

Reproduce the shipped policy (``baselines/policies/rl_sim.npz`` and its ``.json``) and the learning
curve (``docs/rl_learning_curve.csv`` and ``.png``), from the repository root::

    python -m rsigym_env.baselines.rl_researcher --train
    python -m rsigym_env.baselines.rl_researcher --compare --seeds 20 --save [--track Data|Harness]

``--train`` first plays ``bc_episodes`` (1,500) episodes of the menu expert (:func:`expert_index`, the
scripted researcher's recipe in menu terms) and clones it (cross-entropy on its entries, MSE on their
returns; 97.6% greedy agreement), then runs 150 PPO iterations (18,000 episodes). Since issue 30 the
sim's best choices depend on what evaluations reveal, and PPO from scratch collapsed to submitting at
once; from the cloned start it improves on the expert. It took 1,248 s of wall time on this 2-core
machine under a load of 10-16 from other jobs; since the training runs on one BLAS thread (OpenBLAS's second
thread spun between the small products), 255-269 s at a load of 6-9 (``bench/README.md``, "The vector sim,
round 2"). It runs two rollout workers (``--workers``), each
stepping ``num_envs`` sim envs in lockstep (``--vector``: through the vector sim, ``MenuArrayEnv``,
:func:`collect_vector`, the same episodes for the same actions; no faster here, as a worker's episodes fall
into 15 scenarios of ~4 envs each: ``bench/README.md``, "The vector sim"); episodes cycle over the five benchmarks
x three tracks, $500, env seeds from 1,000,000 up. With the same ``--seed`` and worker count the weights are
bit-identical. Greedy validation return at training time (20 seeds per benchmark, env seeds 10,000 and up): +0.217
(swe +0.259, terminal +0.134, aime +0.426, gpqa +0.197, skills +0.067). Training subtracts
``step_cost`` per menu step (shaping, so that it stops making useless calls); every number here is the
env's own reward.

``--compare`` runs :func:`rsigym_env.episode.run_episode` for random, scripted and rl on seeds
0..19 of each benchmark ($500; seeds never used in training or selection). Mean normalized gain ±
standard error (mean spend), joint track, at sim result version 6 (2026-12-05; the shipped policy was
trained on an earlier version and kept: it still leads):

=====================  ====================  =====================  =====================
benchmark              random                scripted               rl
=====================  ====================  =====================  =====================
swe-bench-verified     -0.018 ± 0.014 ($66)  +0.251 ± 0.032 ($298)  +0.304 ± 0.048 ($477)
terminal-bench-2       -0.015 ± 0.009 ($57)  +0.073 ± 0.012 ($265)  +0.104 ± 0.015 ($444)
aime                   -0.039 ± 0.030 ($43)  +0.303 ± 0.057 ($209)  +0.412 ± 0.050 ($402)
gpqa-diamond           -0.132 ± 0.075 ($24)  +0.188 ± 0.048 ($106)  +0.229 ± 0.055 ($250)
skillsbench            -0.002 ± 0.001 ($58)  +0.079 ± 0.020 ($229)  +0.092 ± 0.021 ($414)
RSI-Index              -0.041 ± 0.025        +0.179 ± 0.016         +0.228 ± 0.016
=====================  ====================  =====================  =====================

RSI-Index on the other tracks (``--track Data`` / ``Harness``): data: random +0.000, scripted
+0.107 ± 0.013, rl +0.138 ± 0.014; harness: random -0.119 ± 0.039, scripted +0.058 ± 0.010,
rl +0.057 ± 0.009. The tables are also in ``rl_sim.json``.

What it learned (greedy; e.g. swe seed 0: ``eval_latest_k1 fix:lost_shell_state fix:action_loop
gen:<each teacher>:50 gen:claude-opus-5:max clean eval_latest_k3 train:lr=0.0003 eval_latest_k3
submit_best``): evaluate the initial system (avg@1), fix only the defects its failures show, probe every
teacher, buy data from the one whose examples pass most often (astra on some aime and gpqa seeds),
clean, measure the base model with the fixed harness, train at the default rate, measure the
checkpoint, submit the better; it evaluated before submitting on every episode of
the comparison. No recipe that never evaluates comes close (``bench/README.md``, "Research must pay").

>>> import gymnasium as gym, rsigym_env
>>> from rsigym_env.episode import run_episode
>>> env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500)
>>> result = run_episode(env, RLResearcher(), seed=0)
>>> result.terminated and result.reward > 0
True
"""

from __future__ import annotations

import argparse
import csv
import importlib.resources
import json
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from rsigym_env.catalog import TRACKS
from rsigym_env.catalog import DEFECTS, FAILURE_MODES
from rsigym_env.wrappers.menu import BENCHMARKS, FEATURES, MENU, MENU_INDEX, TEACHERS, DiscreteMenu, MenuAdapter

OBS_DIM, N_ACTIONS = len(FEATURES), len(MENU)
TRAIN_SEED_OFFSET = 1_000_000  # training episodes use env seeds from here (and up)
VALIDATION_SEED_OFFSET = 10_000  # greedy evaluations during training; comparisons use seeds 0, 1, ...


@dataclass
class Args:
    seed: int = 1
    """seed of the weights, the sampling and the order of training scenarios"""
    iterations: int = 150
    """PPO iterations (each collects ``episodes_per_iteration`` whole episodes)"""
    episodes_per_iteration: int = 120
    num_envs: int = 12
    """envs stepped in lockstep per worker (one batched forward pass per step)"""
    workers: int = 2
    """rollout processes (1 = in this process)"""
    vector: bool = False
    """roll out the policy through the vector sim (``make_vec(..., menu=True)``: the array env ``MenuArrayEnv``,
    one per scenario) instead of ``DiscreteMenu`` envs (behaviour cloning's expert, which reads each env's
    adapter, plays ``DiscreteMenu`` envs either way); the same episodes for the same actions
    (``tests/baselines/test_rl_vector.py``)"""
    learning_rate: float = 1e-3
    anneal_lr: bool = True
    gamma: float = 1.0
    """the reward comes once, at the end; no discount"""
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    update_epochs: int = 4
    num_minibatches: int = 4
    ent_coef: float = 0.02
    vf_coef: float = 0.5
    bc_episodes: int = 1500
    """episodes of the menu expert (:func:`expert_index`) the policy is cloned from before PPO (0: none)"""
    bc_epochs: int = 30
    """passes over those episodes' steps (cross-entropy on the expert's entries, MSE on their returns)"""
    step_cost: float = 0.002
    """training-only shaping: this much is subtracted per menu step (curves report the env's return)"""
    max_grad_norm: float = 0.5
    hidden: int = 128
    benchmarks: tuple[str, ...] = BENCHMARKS
    tracks: tuple[str, ...] = TRACKS
    budgets: tuple[float, ...] = (500.0,)
    eval_every: int = 10
    """greedy evaluation of the current policy every this many iterations"""
    eval_seeds: int = 6
    """seeds per benchmark in those evaluations (joint track, first budget, seeds 10,000 and up)"""
    final_eval_seeds: int = 20
    """seeds per benchmark of the greedy validation stored with the policy"""
    out: str = ""
    """where to save the policy; default: the package's policies/rl_sim.npz"""
    curve: str = "docs/rl_learning_curve"
    """learning curve path without extension (.csv and .png are written)"""


def default_policy_path() -> Path:
    return Path(str(importlib.resources.files("rsigym_env.baselines") / "policies" / "rl_sim.npz"))


# ------------------------------------------------------------------------------------------------
# The network: two tanh MLPs (actor: logits over the menu; critic: the value), backprop by hand


def orthogonal(rng: np.random.Generator, n_in: int, n_out: int, gain: float) -> np.ndarray:
    a = rng.standard_normal((max(n_in, n_out), min(n_in, n_out)))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    return gain * (q if n_in >= n_out else q.T)[:n_in, :n_out]


def init_params(rng: np.random.Generator, obs_dim: int, hidden: int, n_actions: int) -> dict[str, np.ndarray]:
    """CleanRL's initialisation: orthogonal weights (gain √2; 0.01 for the logits, 1 for the value)."""
    p: dict[str, np.ndarray] = {}
    for net, out_dim, out_gain in (("pi", n_actions, 0.01), ("v", 1, 1.0)):
        dims = [obs_dim, hidden, hidden, out_dim]
        for layer in range(3):
            gain = np.sqrt(2.0) if layer < 2 else out_gain
            p[f"{net}.W{layer}"] = orthogonal(rng, dims[layer], dims[layer + 1], gain)
            p[f"{net}.b{layer}"] = np.zeros(dims[layer + 1])
    return p


def mlp_forward(p: dict[str, np.ndarray], net: str, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Output and the activations backprop needs (input, hidden 1, hidden 2)."""
    h1 = np.tanh(x @ p[f"{net}.W0"] + p[f"{net}.b0"])
    h2 = np.tanh(h1 @ p[f"{net}.W1"] + p[f"{net}.b1"])
    return h2 @ p[f"{net}.W2"] + p[f"{net}.b2"], [x, h1, h2]


def mlp_backward(p: dict[str, np.ndarray], net: str, cache: list[np.ndarray], dout: np.ndarray,
                 grads: dict[str, np.ndarray]) -> None:
    x, h1, h2 = cache
    grads[f"{net}.W2"] = h2.T @ dout
    grads[f"{net}.b2"] = dout.sum(0)
    dz2 = (dout @ p[f"{net}.W2"].T) * (1.0 - h2**2)
    grads[f"{net}.W1"] = h1.T @ dz2
    grads[f"{net}.b1"] = dz2.sum(0)
    dz1 = (dz2 @ p[f"{net}.W1"].T) * (1.0 - h1**2)
    grads[f"{net}.W0"] = x.T @ dz1
    grads[f"{net}.b0"] = dz1.sum(0)


def masked_log_softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """log π(a) over the allowed entries; -inf where masked."""
    z = np.where(mask, logits, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def policy_step(p: dict[str, np.ndarray], obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator | None,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Actions (sampled with ``rng``, greedy without), their log-probabilities and the values."""
    actions, logp = policy_actions(p, obs, mask, rng)
    values, _ = mlp_forward(p, "v", obs)
    return actions, logp[np.arange(len(actions)), actions], values[:, 0]


def policy_actions(p: dict[str, np.ndarray], obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator | None,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The actor alone (what playing a policy needs): actions, as :func:`policy_step` draws them, and the
    log-probabilities of every entry."""
    logits, _ = mlp_forward(p, "pi", obs)
    logp = masked_log_softmax(logits, mask)
    if rng is None:
        actions = np.argmax(logp, axis=-1)
    else:  # Gumbel-max sampling: -inf stays -inf, so masked entries are never drawn
        actions = np.argmax(logp - np.log(-np.log(rng.random(logp.shape))), axis=-1)
    return actions, logp


def ppo_loss(p: dict[str, np.ndarray], b: dict[str, np.ndarray], args: Args) -> tuple[float, dict[str, np.ndarray], dict]:
    """The clipped PPO objective on minibatch ``b`` and its exact gradient.

    ``b`` has ``obs``, ``mask``, ``actions``, ``logp`` (at collection), ``adv`` (normalised here),
    ``returns``. Loss = policy loss − ent_coef · entropy + vf_coef · ½ mean (v − return)².
    """
    n = len(b["actions"])
    adv = b["adv"]
    if n > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    logits, cache_pi = mlp_forward(p, "pi", b["obs"])
    logp_all = masked_log_softmax(logits, b["mask"])
    probs = np.where(b["mask"], np.exp(logp_all), 0.0)
    safe_logp = np.where(b["mask"], logp_all, 0.0)
    rows = np.arange(n)
    ratio = np.exp(logp_all[rows, b["actions"]] - b["logp"])
    clipped = np.clip(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg1, pg2 = -adv * ratio, -adv * clipped
    pg_loss = float(np.maximum(pg1, pg2).mean())
    entropy = -(probs * safe_logp).sum(-1)
    values, cache_v = mlp_forward(p, "v", b["obs"])
    v_loss = 0.5 * float(((values[:, 0] - b["returns"]) ** 2).mean())
    loss = pg_loss - args.ent_coef * float(entropy.mean()) + args.vf_coef * v_loss

    # d loss / d log π(a): the unclipped term carries the gradient where it is the max (else 0)
    dlogp = np.where(pg1 >= pg2, -adv * ratio, 0.0) / n
    onehot = np.zeros_like(probs)
    onehot[rows, b["actions"]] = 1.0
    dlogits = dlogp[:, None] * (onehot - probs)
    # d entropy / d logits = -π (log π + H)
    dlogits += (args.ent_coef / n) * probs * (safe_logp + entropy[:, None])
    grads: dict[str, np.ndarray] = {}
    mlp_backward(p, "pi", cache_pi, dlogits, grads)
    dv = (args.vf_coef / n) * (values[:, 0] - b["returns"])[:, None]
    mlp_backward(p, "v", cache_v, dv, grads)
    approx_kl = float(((ratio - 1) - np.log(ratio)).mean())
    stats = {"pg_loss": pg_loss, "v_loss": v_loss, "entropy": float(entropy.mean()), "approx_kl": approx_kl,
             "clipfrac": float((np.abs(ratio - 1) > args.clip_coef).mean())}
    return loss, grads, stats


def bc_loss(p: dict[str, np.ndarray], b: dict[str, np.ndarray], vf_coef: float) -> tuple[float, dict[str, np.ndarray]]:
    """Behaviour cloning on minibatch ``b`` (``obs``, ``mask``, ``actions``, ``returns``) and its exact
    gradient: cross-entropy of the actor on the expert's entries + vf_coef · ½ mean (v − return)²."""
    n = len(b["actions"])
    rows = np.arange(n)
    logits, cache_pi = mlp_forward(p, "pi", b["obs"])
    logp = masked_log_softmax(logits, b["mask"])
    probs = np.where(b["mask"], np.exp(logp), 0.0)
    onehot = np.zeros_like(probs)
    onehot[rows, b["actions"]] = 1.0
    values, cache_v = mlp_forward(p, "v", b["obs"])
    loss = float(-logp[rows, b["actions"]].mean()) + vf_coef * 0.5 * float(((values[:, 0] - b["returns"]) ** 2).mean())
    grads: dict[str, np.ndarray] = {}
    mlp_backward(p, "pi", cache_pi, (probs - onehot) / n, grads)
    mlp_backward(p, "v", cache_v, (vf_coef / n) * (values[:, 0] - b["returns"])[:, None], grads)
    return loss, grads


def expert_index(adapter: MenuAdapter) -> int:
    """The menu entry a careful researcher picks now, from what the adapter has seen (the warm start PPO
    begins from; the same recipe as the scripted researcher): evaluate the initial system once, fix the
    defects its failures show, probe every teacher with 50 examples, buy data from the one whose examples
    pass most often, clean, train at the default rate, evaluate the checkpoint and the base model with
    the latest harness (avg@3), submit the best on dev."""
    s, ok = adapter.s, adapter.mask()

    def pick(name: str) -> int | None:
        return MENU_INDEX[name] if ok[MENU_INDEX[name]] else None

    if s.running and (i := pick("wait")) is not None:
        return i
    if s.evaluations == 0 and (i := pick("eval_latest_k1")) is not None:
        return i
    if s.evaluations == 1 and not s.checkpoints:
        for defect in DEFECTS:
            if s.fail_shares[FAILURE_MODES.index(defect)] > 0 and (i := pick(f"fix:{defect}")) is not None:
                return i
    teachers = [t for t in TEACHERS if t in s.teachers]
    if "generate_data" in s.tools and "train" in s.tools and teachers and s.trainings == 0:
        for t in teachers:
            if t not in s.pass_rates and s.generations < len(teachers) and (i := pick(f"gen:{t}:50")) is not None:
                return i
        best = max(teachers, key=lambda t: s.pass_rates.get(t, -1.0))
        if s.generations <= len(teachers) and (i := pick(f"gen:{best}:max")) is not None:
            return i
        data = s.datasets.get(s.train_set) if s.train_set else None
        if data is not None and not data.clean and (i := pick("clean")) is not None:
            return i
        if (i := pick("train:lr=0.0003")) is not None:
            return i
    latest, base = adapter.latest_candidate(), ("base", s.harness)
    if latest not in s.scores and (i := pick("eval_latest_k3")) is not None:
        return i
    if base not in s.scores and (i := pick("eval_base_k3")) is not None:
        return i
    return MENU_INDEX["submit_best"]


class Adam:
    def __init__(self, params: dict[str, np.ndarray], lr: float, betas=(0.9, 0.999), eps: float = 1e-5):
        self.lr, self.betas, self.eps, self.t = lr, betas, eps, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        b1, b2 = self.betas
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            m_hat = self.m[k] / (1 - b1**self.t)
            v_hat = self.v[k] / (1 - b2**self.t)
            params[k] -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


def clip_grad_norm(grads: dict[str, np.ndarray], max_norm: float) -> float:
    norm = float(np.sqrt(sum(float((g**2).sum()) for g in grads.values())))
    if norm > max_norm:
        for g in grads.values():
            g *= max_norm / (norm + 1e-6)
    return norm


# ------------------------------------------------------------------------------------------------
# Rollouts: whole episodes from envs stepped in lockstep


def make_menu_env(track: str, benchmark: str, budget: float) -> DiscreteMenu:
    from rsigym_env.env import ResearchEnv  # the bare env: no checker wrappers in the hot loop
    return DiscreteMenu(ResearchEnv(track=track, benchmark=benchmark, budget_usd=budget))


def collect(params: dict[str, np.ndarray] | None, jobs: list[tuple[str, str, float, int]], num_envs: int,
            rng: np.random.Generator | None) -> list[dict[str, Any]]:
    """Play one episode per job ``(track, benchmark, budget, env seed)``; greedy when ``rng`` is None, the
    expert (:func:`expert_index`) when ``params`` is None."""
    envs: dict[tuple[str, str, float], list[DiscreteMenu]] = {}
    slots: list[dict[str, Any] | None] = [None] * num_envs
    queue = list(jobs)
    done_eps: list[dict[str, Any]] = []

    def start(i: int) -> None:
        if not queue:
            slots[i] = None
            return
        track, bench, budget, seed = queue.pop(0)
        key = (track, bench, budget)
        free = envs.setdefault(key, [])
        env = free.pop() if free else make_menu_env(track, bench, budget)
        obs, info = env.reset(seed=seed)
        slots[i] = {"env": env, "key": key, "seed": seed, "obs": obs, "mask": info["action_mask"],
                    "O": [], "M": [], "A": [], "L": [], "V": [], "W": [], "R": 0.0, "calls": 0, "info": info}

    for i in range(num_envs):
        start(i)
    while any(s is not None for s in slots):
        live = [i for i, s in enumerate(slots) if s is not None]
        obs = np.stack([slots[i]["obs"] for i in live]).astype(np.float64)
        mask = np.stack([slots[i]["mask"] for i in live])
        if params is None:  # the expert plays (behaviour cloning data)
            actions = np.array([expert_index(slots[i]["env"].adapter) for i in live])
            logps = values = np.zeros(len(live))
        else:
            actions, logps, values = policy_step(params, obs, mask, rng)
        for j, i in enumerate(live):
            s = slots[i]
            assert s is not None
            for name, value in (("O", obs[j]), ("M", mask[j]), ("A", int(actions[j])), ("L", float(logps[j])),
                                ("V", float(values[j]))):
                s[name].append(value)
            o, r, term, trunc, info = s["env"].step(int(actions[j]))
            s["R"] += r
            s["W"].append(float(r))
            s["calls"] += len(info["calls"])
            s["obs"], s["mask"], s["info"] = o, info["action_mask"], info
            if term or trunc:
                done_eps.append({"benchmark": s["key"][1], "track": s["key"][0], "budget": s["key"][2], "seed": s["seed"],
                                 "return": float(s["R"]), "calls": s["calls"], "spend": float(info.get("spend_usd", 0.0)),
                                 "obs": np.array(s["O"]), "mask": np.array(s["M"]), "actions": np.array(s["A"]),
                                 "logp": np.array(s["L"]), "values": np.array(s["V"]),
                                 "rewards": np.array(s["W"])})
                envs[s["key"]].append(s["env"])
                start(i)
    for pool in envs.values():
        for env in pool:
            env.close()
    return done_eps


def collect_vector(params: dict[str, np.ndarray] | None, jobs: list[tuple[str, str, float, int]], num_envs: int,
                   rng: np.random.Generator | None) -> list[dict[str, Any]]:
    """:func:`collect` through the vector sim: ``make_vec(..., menu=True)``'s env per (track, benchmark,
    budget) of ``jobs`` (the array env, :class:`~rsigym_env.menu_vector.MenuArrayEnv`; for the expert, which
    reads each env's :class:`~rsigym_env.wrappers.menu.MenuAdapter`, the per-env route), up to ``num_envs``
    episodes each at once, all of them in one batched forward pass per step. A finished env is reset
    (``reset_mask``) with the next seed of its scenario; one with none left plays idle (``wait``, refused)
    until its group ends."""
    from gymnasium.vector import AutoresetMode

    from rsigym_env.vector import make_vector_env

    queues: dict[tuple[str, str, float], list[int]] = {}
    for track, bench, budget, seed in jobs:
        queues.setdefault((track, bench, budget), []).append(seed)

    def slot(seed: int) -> dict[str, Any]:
        return {"seed": seed, "O": [], "M": [], "A": [], "L": [], "V": [], "W": [], "R": 0.0, "calls": 0}

    groups = []
    for key, seeds in queues.items():
        n = min(num_envs, len(seeds))
        vec = make_vector_env(n, menu=True, array=params is not None, track=key[0], benchmark=key[1],
                              budget_usd=key[2], autoreset_mode=AutoresetMode.DISABLED)
        obs, info = vec.reset(seed=seeds[:n])
        groups.append({"key": key, "vec": vec, "queue": seeds[n:], "obs": obs, "mask": info["action_mask"],
                       "slots": [slot(seed) for seed in seeds[:n]]})
    done_eps: list[dict[str, Any]] = []
    idle = MENU_INDEX["wait"]
    while groups:
        live = [(g, i) for g in groups for i, s in enumerate(g["slots"]) if s is not None]
        obs = np.stack([g["obs"][i] for g, i in live]).astype(np.float64)
        mask = np.stack([g["mask"][i] for g, i in live])
        if params is None:  # the expert plays (behaviour cloning data)
            actions = np.array([expert_index(g["vec"].envs[i].adapter) for g, i in live])
            logps = values = np.zeros(len(live))
        else:
            actions, logps, values = policy_step(params, obs, mask, rng)
        batches = {id(g): np.full(g["vec"].num_envs, idle) for g in groups}
        for j, (g, i) in enumerate(live):
            s = g["slots"][i]
            for name, value in (("O", obs[j]), ("M", mask[j]), ("A", int(actions[j])), ("L", float(logps[j])),
                                ("V", float(values[j]))):
                s[name].append(value)
            batches[id(g)][i] = actions[j]
        for g in list(groups):
            vec = g["vec"]
            o, r, term, trunc, info = vec.step(batches[id(g)])
            g["obs"], g["mask"] = o, info["action_mask"]
            ended = term | trunc
            seeds: list[int | None] = [None] * vec.num_envs
            for i in range(vec.num_envs):
                s = g["slots"][i]
                if s is None:
                    continue
                s["R"] += float(r[i])
                s["W"].append(float(r[i]))
                s["calls"] += int(info["n_calls"][i]) if "n_calls" in info else len(info["calls"][i])
                if ended[i]:
                    spend = float(info["spend_usd"][i]) if info.get("_spend_usd", ended)[i] else 0.0
                    done_eps.append({"benchmark": g["key"][1], "track": g["key"][0], "budget": g["key"][2],
                                     "seed": s["seed"], "return": float(s["R"]), "calls": s["calls"], "spend": spend,
                                     "obs": np.array(s["O"]), "mask": np.array(s["M"]), "actions": np.array(s["A"]),
                                     "logp": np.array(s["L"]), "values": np.array(s["V"]),
                                     "rewards": np.array(s["W"])})
                    g["slots"][i] = slot(g["queue"].pop(0)) if g["queue"] else None
                    seeds[i] = g["slots"][i]["seed"] if g["slots"][i] is not None else 0
            if all(s is None for s in g["slots"]):
                vec.close()
                groups.remove(g)
            elif ended.any():
                o, info = vec.reset(seed=seeds, options={"reset_mask": ended})
                g["obs"], g["mask"] = o, np.where(ended[:, None], info["action_mask"], g["mask"])
    return done_eps


def _collect_worker(payload: tuple) -> list[dict[str, Any]]:
    params, jobs, num_envs, seed, vector = payload
    play = collect_vector if vector and params is not None else collect  # the expert reads DiscreteMenu's adapters
    return play(params, jobs, num_envs, None if seed is None else np.random.default_rng(seed))


def gae(ep: dict[str, Any], gamma: float, lam: float, step_cost: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns of one whole episode (it ends in a terminal state: no bootstrap)."""
    values = ep["values"]
    n = len(values)
    rewards = ep["rewards"] - step_cost
    adv = np.zeros(n)
    last = 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv, adv + values


# ------------------------------------------------------------------------------------------------
# Training


class Trainer:
    """PPO over whole sim episodes; ``run()`` trains, ``save()`` writes the policy and its figures."""

    def __init__(self, args: Args):
        self.args = args
        self.rng = np.random.default_rng(args.seed)
        self.params = init_params(self.rng, OBS_DIM, args.hidden, N_ACTIONS)
        self.adam = Adam(self.params, args.learning_rate)
        self.episodes = 0
        self.macro_steps = 0
        self.tool_calls = 0
        self.curve: list[dict[str, float]] = []
        self.bc_stats: dict[str, float] = {}
        self.pool: Any = None

    def _jobs(self, n: int) -> list[tuple[str, str, float, int]]:
        a = self.args
        configs = [(t, b, float(u)) for t in a.tracks for b in a.benchmarks for u in a.budgets]
        jobs = []
        for k in range(n):
            c = configs[(self.episodes + k) % len(configs)] if len(configs) > 1 else configs[0]
            jobs.append((*c, TRAIN_SEED_OFFSET + self.args.seed * 100_000_000 + self.episodes + k))
        return jobs

    def _collect(self, jobs: list, greedy: bool, expert: bool = False) -> list[dict[str, Any]]:
        a = self.args
        workers = max(1, min(a.workers, len(jobs)))
        chunks = [jobs[w::workers] for w in range(workers)]
        seeds = [None if greedy else int(self.rng.integers(2**31)) for _ in chunks]
        params = None if expert else self.params
        payloads = [(params, chunk, a.num_envs, s, a.vector) for chunk, s in zip(chunks, seeds)]
        if workers == 1:
            return [ep for pl in payloads for ep in _collect_worker(pl)]
        if self.pool is None:
            self.pool = mp.get_context("fork" if hasattr(os, "fork") else "spawn").Pool(a.workers)
        return [ep for part in self.pool.map(_collect_worker, payloads) for ep in part]

    def evaluate(self, seeds: int | None = None) -> dict[str, float]:
        """Greedy mean return per benchmark (joint track, first budget, validation env seeds)."""
        a = self.args
        n = a.eval_seeds if seeds is None else seeds
        jobs = [("joint" if "joint" in a.tracks else a.tracks[0], b, float(a.budgets[0]), VALIDATION_SEED_OFFSET + s)
                for b in a.benchmarks for s in range(n)]
        eps = self._collect(jobs, greedy=True)
        out = {b: float(np.mean([e["return"] for e in eps if e["benchmark"] == b])) for b in a.benchmarks}
        out["mean"] = float(np.mean([out[b] for b in a.benchmarks]))
        return out

    def update(self, eps: list[dict[str, Any]], frac: float) -> dict[str, float]:
        a = self.args
        advs, rets = zip(*(gae(e, a.gamma, a.gae_lambda, a.step_cost) for e in eps))
        batch = {"obs": np.concatenate([e["obs"] for e in eps]), "mask": np.concatenate([e["mask"] for e in eps]),
                 "actions": np.concatenate([e["actions"] for e in eps]), "logp": np.concatenate([e["logp"] for e in eps]),
                 "adv": np.concatenate(advs), "returns": np.concatenate(rets)}
        n = len(batch["actions"])
        self.adam.lr = a.learning_rate * (frac if a.anneal_lr else 1.0)
        size = max(1, n // a.num_minibatches)
        stats: dict[str, float] = {}
        for _ in range(a.update_epochs):
            order = self.rng.permutation(n)
            for start in range(0, n, size):
                idx = order[start:start + size]
                if len(idx) < 2:
                    continue
                _, grads, stats = ppo_loss(self.params, {k: v[idx] for k, v in batch.items()}, a)
                stats["grad_norm"] = clip_grad_norm(grads, a.max_grad_norm)
                self.adam.step(self.params, grads)
        return stats

    def behaviour_clone(self, log: bool = True) -> dict[str, float]:
        """Warm start: play ``bc_episodes`` expert episodes (training seeds, as PPO's), then fit the actor to
        the expert's entries and the critic to their returns for ``bc_epochs`` passes."""
        a = self.args
        eps = self._collect(self._jobs(a.bc_episodes), greedy=True, expert=True)
        self.episodes += len(eps)
        batch = {"obs": np.concatenate([e["obs"] for e in eps]), "mask": np.concatenate([e["mask"] for e in eps]),
                 "actions": np.concatenate([e["actions"] for e in eps]),
                 "returns": np.concatenate([np.full(len(e["actions"]), e["return"]) for e in eps])}
        n = len(batch["actions"])
        adam, size, loss = Adam(self.params, a.learning_rate), 256, float("nan")
        for _ in range(a.bc_epochs):
            order = self.rng.permutation(n)
            for start in range(0, n, size):
                idx = order[start:start + size]
                loss, grads = bc_loss(self.params, {k: v[idx] for k, v in batch.items()}, a.vf_coef)
                clip_grad_norm(grads, a.max_grad_norm)
                adam.step(self.params, grads)
        x, m = batch["obs"], batch["mask"]
        agree = float(np.mean(policy_actions(self.params, x, m, None)[0] == batch["actions"]))
        stats = {"bc_episodes": len(eps), "bc_steps": n, "bc_loss": loss, "bc_agreement": agree,
                 "expert_return": float(np.mean([e["return"] for e in eps]))}
        if log:
            print(f"behaviour cloning: {len(eps)} expert episodes ({n} steps, expert return "
                  f"{stats['expert_return']:+.3f}), loss {loss:.3f}, greedy agreement {agree:.1%}", flush=True)
        return stats

    def run(self, log: bool = True) -> list[dict[str, float]]:
        a = self.args
        t0 = time.time()
        if a.bc_episodes > 0 and not self.curve:
            self.bc_stats = self.behaviour_clone(log)
        for it in range(1, a.iterations + 1):
            eps = self._collect(self._jobs(a.episodes_per_iteration), greedy=False)
            self.episodes += len(eps)
            self.macro_steps += sum(len(e["actions"]) for e in eps)
            self.tool_calls += sum(e["calls"] for e in eps)
            stats = self.update(eps, 1.0 - (it - 1) / a.iterations)
            row = {"iteration": it, "episodes": self.episodes, "macro_steps": self.macro_steps,
                   "tool_calls": self.tool_calls, "mean_return": float(np.mean([e["return"] for e in eps])),
                   "mean_spend": float(np.mean([e["spend"] for e in eps])),
                   "mean_macro_steps": float(np.mean([len(e["actions"]) for e in eps])),
                   "entropy": stats.get("entropy", float("nan")), "approx_kl": stats.get("approx_kl", float("nan")),
                   "greedy_return": float("nan"), "wall_s": time.time() - t0}
            if a.eval_every and (it % a.eval_every == 0 or it == 1 or it == a.iterations):
                row["greedy_return"] = self.evaluate()["mean"]
                row["wall_s"] = time.time() - t0
            self.curve.append(row)
            if log:
                g = f" greedy {row['greedy_return']:+.3f}" if not np.isnan(row["greedy_return"]) else ""
                print(f"it {it:3d} eps {self.episodes:6d} return {row['mean_return']:+.3f}{g} "
                      f"steps/ep {row['mean_macro_steps']:.1f} spend ${row['mean_spend']:.0f} "
                      f"H {row['entropy']:.2f} kl {row['approx_kl']:.4f} [{row['wall_s']:.0f}s]", flush=True)
        return self.curve

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None

    def save(self, path: str | Path, extra: dict[str, Any] | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **{k: v.astype(np.float32) for k, v in self.params.items()},
                            features=np.array(FEATURES), menu=np.array([m.name for m in MENU]))
        meta = {"args": asdict(self.args), "episodes": self.episodes, "macro_steps": self.macro_steps,
                "tool_calls": self.tool_calls, "behaviour_cloning": self.bc_stats, **(extra or {})}
        path.with_suffix(".json").write_text(json.dumps(meta, indent=1, default=str) + "\n")

    def write_curve(self, stem: str | Path, references: dict[str, float] | None = None) -> None:
        """CSV of ``self.curve`` and its plot; ``references``: name -> mean return, drawn as dashed lines.

        Columns: iteration, episodes, macro_steps, tool_calls (cumulative), mean_return and mean_spend
        of the iteration's sampled training episodes (all training tracks), mean_macro_steps, entropy,
        approx_kl, greedy_return (joint track, validation seeds; empty between evaluations), wall_s.
        """
        stem = Path(stem)
        stem.parent.mkdir(parents=True, exist_ok=True)
        keys = list(self.curve[0])
        with open(stem.with_suffix(".csv"), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            for row in self.curve:
                w.writerow({k: ("" if isinstance(v, float) and np.isnan(v) else f"{v:.6g}" if isinstance(v, float) else v)
                            for k, v in row.items()})
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        ep = [r["episodes"] for r in self.curve]
        fig, ax = plt.subplots(figsize=(7, 4))
        tracks = "+".join(self.args.tracks)
        ax.plot(ep, [r["mean_return"] for r in self.curve], label=f"training episodes, sampled policy ({tracks})", lw=1)
        greedy = [(r["episodes"], r["greedy_return"]) for r in self.curve if not np.isnan(r["greedy_return"])]
        if greedy:
            ax.plot(*zip(*greedy), "o-", label=f"greedy policy, joint, {self.args.eval_seeds} held-out seeds x 5 benchmarks")
        for (name, value), color in zip((references or {}).items(), ("tab:green", "tab:red", "tab:purple")):
            ax.axhline(value, ls="--", color=color, lw=1, label=f"{name} researcher, joint, same held-out seeds")
        ax.set_xlabel("episodes")
        ax.set_ylabel("mean return (normalized gain)")
        ax.set_title("PPO (NumPy) on the discrete research menu, sim world, $500")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(stem.with_suffix(".png"), dpi=120)
        plt.close(fig)


# ------------------------------------------------------------------------------------------------
# The researcher


@dataclass
class RLResearcherArgs:
    policy: str = ""
    """path of the .npz policy; default: the shipped baselines/policies/rl_sim.npz"""
    sample: bool = False
    """sample from the policy instead of taking the most likely menu entry"""
    blocking: bool = True


class RLResearcher:
    """Plays a trained menu policy on the raw env (dict observations, tool-call actions)."""

    name = "rl"

    def __init__(self, args: RLResearcherArgs | None = None, params: dict[str, np.ndarray] | None = None):
        self.args = args or RLResearcherArgs()
        self.params = params if params is not None else shared_policy(self.args.policy or default_policy_path())
        self.adapter = MenuAdapter(blocking=self.args.blocking)
        self.rng = np.random.default_rng()
        self._plan: Any = None
        self._last: dict[str, Any] | None = None
        self.macros: list[str] = []

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        self.adapter.reset(observation, info)
        self.rng = np.random.default_rng(seed)
        self._plan, self._last, self.macros = None, None, []

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        if self._last is not None:
            self.adapter.observe(self._last, observation, info)
        action = None
        if self._plan is not None:
            try:
                action = self._plan.send((observation, info))
            except StopIteration:
                self._plan = None
        if action is None:
            x = self.adapter.features()[None].astype(np.float64)
            m = self.adapter.mask()[None]
            index = int(policy_actions(self.params, x, m, self.rng if self.args.sample else None)[0][0])
            self.macros.append(MENU[index].name)
            self._plan = self.adapter.plan(index)
            action = next(self._plan)
        self._last = action
        return action


def load_policy(path: str | Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        if list(data["menu"]) != [m.name for m in MENU] or list(data["features"]) != list(FEATURES):
            raise ValueError(f"{path}: saved for another menu or feature layout; retrain it")
        return {k: data[k].astype(np.float64) for k in data.files if k not in ("menu", "features")}


_SHARED: dict[tuple[str, int, int], dict[str, np.ndarray]] = {}


def shared_policy(path: str | Path) -> dict[str, np.ndarray]:
    """:func:`load_policy`, read once per file version (path, mtime, size) and shared read-only by every
    researcher that plays it: unpacking the ``.npz`` took longer than a whole sim episode."""
    stat = os.stat(path)
    version = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
    params = _SHARED.get(version)
    if params is None:
        params = load_policy(path)
        for array in params.values():
            array.flags.writeable = False
        if len(_SHARED) >= 8:
            _SHARED.clear()
        _SHARED[version] = params
    return params


# ------------------------------------------------------------------------------------------------
# Comparison: RSI-Index of random, scripted and rl with run_episode


def compare(seeds: int, budget: float = 500.0, track: str = "Joint", policy: str = "") -> dict[str, Any]:
    import gymnasium as gym

    import rsigym_env  # noqa: F401  (registers the ids)
    from rsigym_env.baselines import make_researcher
    from rsigym_env.baselines.scripted_researcher import ScriptedResearcher
    from rsigym_env.catalog import env_id
    from rsigym_env.episode import run_episode
    from rsigym_env.metrics import mean_se

    def cell(values: list[float]) -> dict[str, float]:
        mean, se, _ = mean_se(values)
        return {"mean": mean, "se": se}

    makers = {"random": lambda: make_researcher("random"), "scripted": ScriptedResearcher,
              "rl": lambda: RLResearcher(RLResearcherArgs(policy=policy))}
    table: dict[str, Any] = {}
    for name, make in makers.items():
        researcher = make()
        per: dict[str, list[float]] = {}
        spend: dict[str, list[float]] = {}
        for bench in BENCHMARKS:
            env = gym.make(env_id(track.lower()), benchmark=bench, budget_usd=budget)
            for seed in range(seeds):
                r = run_episode(env, researcher, seed=seed)
                per.setdefault(bench, []).append(r.reward)
                spend.setdefault(bench, []).append(float(r.info.get("spend_usd", 0.0)))
            env.close()
        table[name] = {b: {**cell(v), "spend": float(np.mean(spend[b]))} for b, v in per.items()}
        means = np.array([per[b] for b in BENCHMARKS]).mean(axis=0)  # RSI-Index per seed
        table[name]["rsi_index"] = cell(means.tolist())
    table["seeds"] = seeds
    return table


def baseline_returns(names: tuple[str, ...], benchmarks: tuple[str, ...], seeds: int, offset: int = 0,
                     budget: float = 500.0) -> dict[str, float]:
    """Mean return of registered researchers over benchmarks x seeds (joint track), for reference lines."""
    import gymnasium as gym

    import rsigym_env  # noqa: F401
    from rsigym_env.baselines import make_researcher
    from rsigym_env.episode import run_episode

    out = {}
    for name in names:
        returns = []
        for bench in benchmarks:
            env = gym.make("RSIGym/Joint-v0", benchmark=bench, budget_usd=budget)
            returns += [run_episode(env, make_researcher(name), seed=offset + s).reward for s in range(seeds)]
            env.close()
        out[name] = float(np.mean(returns))
    return out


def format_table(table: dict[str, Any]) -> str:
    names = [n for n in ("random", "scripted", "rl") if n in table]
    lines = ["| benchmark | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for b in BENCHMARKS:
        lines.append(f"| {b} | " + " | ".join(f"{table[n][b]['mean']:+.3f} ± {table[n][b]['se']:.3f} "
                                              f"(${table[n][b]['spend']:.0f})" for n in names) + " |")
    lines.append("| **RSI-Index** | " + " | ".join(f"**{table[n]['rsi_index']['mean']:+.3f}** ± "
                                                  f"{table[n]['rsi_index']['se']:.3f}" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", action="store_true", help="train and save the policy and its learning curve")
    parser.add_argument("--compare", action="store_true", help="RSI-Index of random, scripted and rl on sim")
    parser.add_argument("--seeds", type=int, default=20, help="seeds per benchmark for --compare")
    parser.add_argument("--policy", default="", help="policy file for --compare (default: the shipped one)")
    parser.add_argument("--save", action="store_true", help="with --compare: store the table in the policy's .json")
    parser.add_argument("--track", default="Joint", choices=["Joint", "Data", "Harness"], help="track for --compare")
    for f in Args.__dataclass_fields__.values():  # every Args field is a flag: --ent-coef 0.02, --tracks joint,data
        flag = f"--{f.name.replace('_', '-')}"
        if f.type in ("int", "float", "str"):
            parser.add_argument(flag, type={"int": int, "float": float, "str": str}[f.type], default=f.default)
        elif f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        elif f.type.startswith("tuple["):
            kind = float if "float" in f.type else str
            parser.add_argument(flag, type=lambda text, kind=kind: tuple(kind(x) for x in text.split(",")),
                                default=f.default, help="comma-separated")
    ns = parser.parse_args(argv)
    if not (ns.train or ns.compare):
        parser.error("give --train and/or --compare")
    if ns.train:
        args = Args(**{k: getattr(ns, k) for k in Args.__dataclass_fields__ if hasattr(ns, k)})
        trainer = Trainer(args)
        t0 = time.time()
        # one BLAS thread, here and in the rollout workers forked from here: the products are small, and
        # OpenBLAS's second thread spins between them (on 2 shared cores: 674 s -> 269 s of wall time, 413 ->
        # 176 s of CPU; bench/README.md, "The vector sim, round 2"). Set, never restored: restoring a count
        # can change it under a computation still running on another thread (rsigym_env.numerics.canary_digest).
        ThreadpoolController().limit(limits=1, user_api="blas")
        try:
            trainer.run()
            final = trainer.evaluate(seeds=args.final_eval_seeds)
        finally:
            trainer.close()
        wall = time.time() - t0
        out = args.out or str(default_policy_path())
        trainer.save(out, {"wall_s": round(wall, 1), "cpu_count": os.cpu_count(),
                           "final_greedy_return": final,
                           "curve": [{k: None if np.isnan(r[k]) else round(r[k], 4)
                                      for k in ("episodes", "mean_return", "greedy_return")} for r in trainer.curve]})
        references = baseline_returns(("scripted", "random"), args.benchmarks, args.eval_seeds, VALIDATION_SEED_OFFSET)
        trainer.write_curve(args.curve, references)
        print(f"saved {out} and {args.curve}.csv/.png after {wall:.0f} s; greedy return ({args.final_eval_seeds} seeds): "
              + ", ".join(f"{k} {v:+.3f}" for k, v in final.items()))
    if ns.compare:
        t0 = time.time()
        table = compare(ns.seeds, track=ns.track, policy=ns.policy)
        table["wall_s"] = round(time.time() - t0, 1)
        print(format_table(table))
        if ns.save:
            meta_path = Path(ns.policy or default_policy_path()).with_suffix(".json")
            meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
            meta["comparison" if ns.track == "Joint" else f"comparison_{ns.track.lower()}"] = {
                "track": ns.track.lower(), "budget_usd": 500, **table}
            meta_path.write_text(json.dumps(meta, indent=1, default=str) + "\n")
            print(f"stored in {meta_path}")


if __name__ == "__main__":
    main()
