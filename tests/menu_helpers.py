"""Shared by the tests of the menu's array envs: masked uniform actions and the audit-tampering check."""

from __future__ import annotations

import sqlite3

import numpy as np

from rsigym_env.cli import main as rsigym


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
