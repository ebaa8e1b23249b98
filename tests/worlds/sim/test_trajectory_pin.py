"""Pinned sim trajectories: the full ``(observation, reward, terminated, truncated, info)`` of every
step of a few episodes, and each episode's audit log and books, hashed and compared with a digest
recorded before the sim was made faster (issue 15, goal 4). A speed-up must not move a single value.

Wall times and key ids (a random secret's hash) are the only things left out of the audit log: the
ids are replaced by their order of appearance.

If a change is *meant* to alter episodes, recompute the digests with
``python tests/worlds/sim/test_trajectory_pin.py`` and say why in the commit.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any, Callable

import rsigym_env  # noqa: F401, I001  (first: it pins NumPy's and OpenBLAS's code, rsigym_env.numerics; registers the ids)

import gymnasium as gym
import numpy as np
import pytest
from rsigym_env.baselines import make_researcher


def _plain(value: Any) -> Any:
    """``value`` as exact, hashable JSON: arrays keep their dtype, floats their repr."""
    if isinstance(value, np.ndarray):
        return {"ndarray": str(value.dtype), "shape": list(value.shape), "values": _plain(value.tolist())}
    if isinstance(value, np.generic):
        return {"np": str(value.dtype), "value": _plain(value.item())}
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, dict):
        return {"dict": [[_plain(k), _plain(v)] for k, v in value.items()]}  # insertion order counts too
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_plain(v) for v in value]}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "model_dump"):
        return {type(value).__name__: _plain(value.model_dump())}
    return {type(value).__name__: repr(value)}


class _Digest:
    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self.steps = 0

    def add(self, item: Any) -> None:
        self._h.update(json.dumps(_plain(item), sort_keys=True).encode())
        self._h.update(b"\n")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def _audit(env: gym.Env, digest: _Digest) -> None:
    """The episode's audit log (wall times dropped, key ids by order of appearance) and books."""
    ledger = env.unwrapped.platform.ledger
    ids: dict[str, str] = {}

    def key(k: Any) -> Any:
        return ids.setdefault(k, f"key-{len(ids)}") if isinstance(k, str) else k

    for record in ledger.audit_records():
        event = {k: v for k, v in record.event.items() if k != "wall_time"}
        event["key"] = key(event.get("key"))
        digest.add(["audit", record.seq, key(record.key), event])
    books = ledger.books()
    lines = sorted((key(line.key), line.spent_usd, line.reserved_usd, line.available_usd) for line in books.lines)
    digest.add(["books", books.ok, lines])  # accounts come sorted by their random ids: sort by appearance


def _researcher_episodes(env_id: str, agent: str, seeds: tuple[int, ...], **kwargs: Any) -> Callable[[], _Digest]:
    def run() -> _Digest:
        digest = _Digest()
        env = gym.make(env_id, **kwargs)
        try:
            for seed in seeds:
                researcher = make_researcher(agent)
                obs, info = env.reset(seed=seed)
                digest.add(["reset", obs, info])
                researcher.reset(obs, info, seed=seed)
                done = False
                while not done:
                    action = researcher.act(obs, info)
                    obs, reward, terminated, truncated, info = env.step(action)
                    digest.add(["step", _plain(action), obs, reward, terminated, truncated, info])
                    digest.steps += 1
                    done = terminated or truncated
                env.unwrapped.render_mode = "ansi"
                digest.add(["render", env.unwrapped.render()])
            _audit(env, digest)
        finally:
            env.close()
        return digest

    return run


def _on_disk(env_id: str, agent: str, seeds: tuple[int, ...], **kwargs: Any) -> Callable[[], _Digest]:
    """The same as :func:`_researcher_episodes` with the ledger and audit log in an SQLite file."""
    def run() -> _Digest:
        with tempfile.TemporaryDirectory() as tmp:
            return _researcher_episodes(env_id, agent, seeds, ledger_path=Path(tmp) / "ledger.db", **kwargs)()

    return run


def _sampled(n: int, seed: int, **kwargs: Any) -> Callable[[], _Digest]:
    def run() -> _Digest:
        digest = _Digest()
        env = gym.make("RSIGym/Joint-v0", max_steps=120, **kwargs)
        try:
            obs, info = env.reset(seed=seed)
            env.action_space.seed(seed)
            digest.add(["reset", obs, info])
            for _ in range(n):
                action = env.action_space.sample()
                obs, reward, terminated, truncated, info = env.step(action)
                digest.add(["step", obs, reward, terminated, truncated, info])
                digest.steps += 1
                if terminated or truncated:
                    obs, info = env.reset()
                    digest.add(["reset", obs, info])
            _audit(env, digest)
        finally:
            env.close()
        return digest

    return run


def _scripted_actions() -> _Digest:
    """Hand-written actions over every tool and the usual refusals (forms: dict, JSON text, tool object)."""
    from rsigym_env.tools import Evaluate

    actions: list[Any] = [
        {"tool": "read", "args": {"ref": "harness:latest/harness.toml"}},
        {"tool": "read", "args": {"ref": "budget"}},
        {"tool": "read", "args": {"ref": "scenario"}},
        {"tool": "read", "args": {"ref": "nothing"}},
        {"tool": "fly"},
        "not json",
        '{"tool": "wait", "args": {}}',
        {"tool": "evaluate", "args": {"k": 1, "n_tasks": 10}},
        {"tool": "read", "args": {"ref": "job-1"}},
        {"tool": "wait", "args": {"timeout_s": 5.0}},
        {"tool": "wait", "args": {}},
        {"tool": "read", "args": {"ref": "job-1"}},
        {"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 50}},
        {"tool": "generate_data", "args": {"teacher": "nobody", "n_examples": 50}},
        {"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 20_000,
                                           "max_tokens_per_example": 32_768}},
        {"tool": "wait", "args": {}},  # async_jobs: the dataset is a job
        {"tool": "transform_data", "args": {"operation": "filter", "datasets": ["ds-1"]}},
        {"tool": "transform_data", "args": {"operation": "dedupe", "datasets": ["ds-2"]}},
        {"tool": "transform_data", "args": {"operation": "script", "datasets": ["ds-2"], "script": "true"}},
        {"tool": "read", "args": {"ref": "ds-3"}},
        {"tool": "sandbox_exec", "args": {"command": "ls /data"}},
        {"tool": "sandbox_exec", "args": {"command": "head -n 2 /data/ds-1.jsonl"}},
        {"tool": "sandbox_exec", "args": {"command": "wc -l /data/ds-3.jsonl"}},
        {"tool": "sandbox_exec", "args": {"command": "rm -rf /"}},
        {"tool": "infer", "args": {"prompt": "task:dev/3"}},
        {"tool": "infer", "args": {"prompt": "hello", "max_tokens": 5}},
        {"tool": "edit_harness", "args": {"path": "harness.toml", "old": "persistent = false", "new": "persistent = true"}},
        {"tool": "edit_harness", "args": {"path": "harness.toml", "old": "detect = false", "new": "detect = true"}},
        {"tool": "edit_harness", "args": {"path": "prompt.md", "content": "Solve it."}},
        {"tool": "train", "args": {"dataset": "ds-3"}},
        {"tool": "train", "args": {"dataset": "ds-3", "num_epochs": 2, "learning_rate": 1e-4}},
        {"tool": "evaluate", "args": {"checkpoint": "ckpt-1"}},
        {"tool": "wait", "args": {"job": "job-2"}},
        {"tool": "read", "args": {"ref": "jobs"}},
        {"tool": "read", "args": {"ref": "artifacts"}},
        Evaluate(checkpoint="ckpt-1", k=2),
        {"tool": "wait", "args": {}},
        {"tool": "wait", "args": {}},
        {"tool": "read", "args": {"ref": "ckpt-1"}},
        {"tool": "evaluate", "args": {"checkpoint": "ckpt-2", "harness": "latest", "k": 1}},
        {"tool": "wait", "args": {}},
        {"tool": "wait", "args": {}},
        {"tool": "read", "args": {"ref": "harness:latest"}},
        {"tool": "submit", "args": {"checkpoint": "ckpt-1"}},
        {"tool": "read", "args": {"ref": "budget"}},
    ]
    digest = _Digest()
    for env_id, kwargs in (("RSIGym/Joint-v0", {"benchmark": "aime"}),
                           ("RSIGym/Joint-v0", {"benchmark": "terminal-bench-2", "async_jobs": True}),
                           ("RSIGym/Data-v0", {"benchmark": "skillsbench", "budget_usd": 40})):
        env = gym.make(env_id, **kwargs)
        try:
            obs, info = env.reset(seed=11)
            digest.add(["reset", obs, info])
            for action in actions:
                obs, reward, terminated, truncated, info = env.step(action)
                digest.add(["step", obs, reward, terminated, truncated, info])
                digest.steps += 1
            _audit(env, digest)
        finally:
            env.close()
    return digest


EPISODES: dict[str, Callable[[], _Digest]] = {
    "scripted-joint": _researcher_episodes("RSIGym/Joint-v0", "scripted", (0, 1, 2), benchmark="swe-bench-verified"),
    "scripted-data": _researcher_episodes("RSIGym/Data-v0", "scripted", (3,), benchmark="aime"),
    "scripted-harness": _researcher_episodes("RSIGym/Harness-v0", "scripted", (4,), benchmark="gpqa-diamond",
                                             budget_usd=50),
    "scripted-async": _researcher_episodes("RSIGym/Joint-v0", "scripted", (5,), benchmark="skillsbench",
                                           async_jobs=True),
    "rl-joint": _researcher_episodes("RSIGym/Joint-v0", "rl", (0, 1), benchmark="terminal-bench-2"),
    "random-joint": _researcher_episodes("RSIGym/Joint-v0", "random", (0, 1, 2), benchmark="aime"),
    "scripted-disk": _on_disk("RSIGym/Joint-v0", "scripted", (6, 7), benchmark="aime"),
    "sampled": _sampled(400, seed=7, benchmark="swe-bench-verified"),
    "actions": _scripted_actions,
}

PINNED: dict[str, tuple[int, str]] = {  # name -> (steps, sha256), recomputed for sim result version 6 (issue 27: fixed task tables per benchmark, evaluations drawn per world)
    'actions': (135, 'ae79197ff99f2e45261f70fc0ce7e782b114ad0a24a14309c03b73d7c32c4e2b'),
    'random-joint': (51, '8223d5efc5fa1c24af3a3e703b2919e3a90f9e486c0a09af0046a629452c8136'),
    'rl-joint': (70, '5a4a0a9594bfa6ab83f1247a882baa7f136cbab820a3f19c24ea37acc9b1889e'),
    'sampled': (400, 'bbfbd3f2e7542a16bfbbd71bffe87166668a090b932407619ccc09106e7efe5e'),
    'scripted-async': (26, 'ffde3179419a628520e0d0db97b77da373600b33ea678bad41b95d03c98ccb85'),
    'scripted-data': (15, 'e693e9447dab0d2080da2cac8c2e122b1d9f2a5468db304ef8c897fb9000053e'),
    'scripted-disk': (34, 'be5a922fa62f54180132a8b66f2d4a4e6e1bddd1d6e5138386cd4935084b62c1'),
    'scripted-harness': (7, '646546499ea613271462202800d5a388b53d0005b2dcc03d9890315f9e77b89e'),
    'scripted-joint': (53, 'b47dd916829d0835c7d1a089aa73d56c5737e7e2dc9da25e257e3f7646ac85a3'),
}


@pytest.mark.parametrize("name", sorted(EPISODES))
def test_trajectories_match_the_pin(name):
    digest = EPISODES[name]()
    assert (digest.steps, digest.hexdigest()) == PINNED[name]


if __name__ == "__main__":
    for name in sorted(EPISODES):
        d = EPISODES[name]()
        print(f"    {name!r}: ({d.steps}, {d.hexdigest()!r}),")
