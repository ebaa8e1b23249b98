"""A whole remote-world episode offline: ``rsigym run --scenario remote-counterparts-aime`` against the counterparts,
every service through the remote world's own code and the unchanged SDKs (docs/remote.md)."""

from __future__ import annotations

import json
import os

import pytest

from rsigym_env.cli import main
from rsigym_env.worlds.local.sandbox.isolation import bwrap_available


@pytest.mark.slow
@pytest.mark.skipif(not bwrap_available(), reason="trials and sandboxes run under bubblewrap")
def test_a_scripted_remote_episode_completes_with_a_reward_balanced_books_and_a_verified_audit(tmp_path, monkeypatch):
    from rsigym_env.counterparts.stack import Counterparts

    with Counterparts(tmp_path / "counterparts", long_poll_s=5.0) as stack:
        for key, value in stack.environment().items():
            monkeypatch.setenv(key, value)
        assert main(["run", "--scenario", "remote-counterparts-aime", "--dry-run"]) == 0
        run_dir = tmp_path / "run"
        assert main(["run", "--scenario", "remote-counterparts-aime", "--agent", "scripted", "--run-dir", str(run_dir),
                     "-q"]) == 0
        sessions = len(stack.tinker._sessions)
        assert not any(stack.tinker._sessions.values())  # closing the world finished its Tinker session
        sandboxes_made = next(stack.e2b._ids) - 1
        teacher_tokens = sum(u.total_tokens for u in stack.teacher_usage.snapshot().values())
        served = stack.tinker.usage.snapshot()

    result = json.loads((run_dir / "result.json").read_text())
    assert result["terminated"] and isinstance(result["reward"], float)
    assert main(["ledger", "show", str(run_dir / "ledger.sqlite")]) == 0  # books balance, audit chain intact
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    used = {s.get("action", {}).get("tool") for s in steps}
    assert {"train", "evaluate", "generate_data", "transform_data", "submit"} <= used
    # each provider answered through its own protocol
    assert sessions >= 1 and sandboxes_made >= 1 and teacher_tokens > 0
    assert any(name.startswith("tinker://") for name in served)  # a trained checkpoint served by its sampler path
    assert os.environ.get("TINKER_BASE_URL") is not None
