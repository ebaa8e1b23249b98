"""Shared fixtures.

``ray_session``: one local Ray (2 CPUs, no dashboard) per test process, started only when a test asks
for it and shut down at the end of the session. Ray tests share it; ``rsigym_env.sweep`` reuses a
running Ray instead of starting its own, and leaves it running.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Iterator

import pytest

import rsigym_env  # noqa: F401  (first: it pins OpenBLAS's kernels before NumPy loads them, rsigym_env.numerics)

# The official split of the local world is drawn from a secret (rsigym_env.splits); the suite pins it so
# its runs are reproducible and never touch the machine's own secret.
os.environ.setdefault("RSIGYM_SPLIT_SECRET", "rsigym-test-suite-split-secret")
# Every episode draws official tasks of its own; the suite pins that draw too, so two runs of a test score on
# the same tasks. Tests of the per-episode draw unset it (tests/security/test_official_draw.py).
os.environ.setdefault("RSIGYM_SPLIT_NONCE", "rsigym-test-suite-draw")
# The platform's state (agents, secrets, caches, tasks) in a home of the test run's own, not the user's.
os.environ.setdefault("RSIGYM_HOME", tempfile.mkdtemp(prefix="rsigym-test-home-"))


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    from rsigym_env.sweep import init_ray

    started, _ = init_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()
