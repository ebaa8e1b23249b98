"""Shared by the tests of the menu's array envs: masked uniform actions and the audit-tampering check."""

from __future__ import annotations

import sqlite3

import numpy as np

from rsigym_env.cli import main as rsigym
from rsigym_env.wrappers.menu import MENU


def masked_uniform(rng: np.random.Generator, mask: np.ndarray) -> np.ndarray:
    """One allowed action per row, uniformly among the row's allowed ones.

    >>> masked_uniform(np.random.default_rng(0), np.array([[False, True, False], [True, False, False]])).tolist()
    [1, 0]
    """
    return np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)


def assert_a_changed_byte_breaks_the_audit(path, capsys) -> None:
    """Change one digit of an episode entry's ``refusals`` in the audit table: ``rsigym audit verify`` fails there."""
    conn = sqlite3.connect(path, isolation_level=None)
    seq, event = conn.execute("SELECT seq, event FROM audit WHERE event LIKE '%\"refusals\":%' LIMIT 1").fetchone()
    at = event.index('"refusals":') + len('"refusals":')
    conn.execute("UPDATE audit SET event = ? WHERE seq = ?", (event[:at] + ("9" if event[at] != "9" else "8")
                                                               + event[at + 1:], seq))
    conn.close()
    capsys.readouterr()
    assert rsigym(["audit", "verify", str(path)]) == 1
    assert f"BROKEN at record {seq}" in capsys.readouterr().out


def bad_actions(n: int) -> tuple:
    """Actions a batch of ``n`` menu envs must refuse with a ``ValueError`` naming the menu index: a wrong length, out
    of range, names, None, floats, a column, booleans."""
    return (np.zeros(n - 1, np.int64), np.full(n, len(MENU)), np.full(n, -1), ["submit"] * n, None, np.full(n, 1.5),
            [*range(n - 1), float(n - 1)], np.zeros((n, 1), np.int64), [True] * n)


def assert_seeded_runs_repeat(vec, n: int, steps: int = 12) -> None:
    """Two runs of ``steps`` sampled actions (masked entries too) from ``reset(seed=11)`` and the action space seeded
    alike give the same observations, rewards, ends and masks; the spaces hold what is returned."""
    runs = []
    for _ in range(2):
        obs, info = vec.reset(seed=11)
        assert vec.observation_space.contains(obs) and info["action_mask"].shape[0] == n
        vec.action_space.seed(3)
        trace = [obs]
        for _ in range(steps):
            obs, reward, terminated, truncated, info = vec.step(vec.action_space.sample())
            assert vec.observation_space.contains(obs) and reward.shape == terminated.shape == truncated.shape == (n,)
            assert terminated.dtype == truncated.dtype == bool and reward.dtype == np.float64
            trace += [obs, reward, terminated, truncated, info["action_mask"]]
        runs.append(trace)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
