"""SandboxService contract: the same assertions for every world."""

from __future__ import annotations

import pytest

from rsigym_env.services import SandboxService
from rsigym_env.tools import SandboxExec


def _skip_without_isolation(world):
    if world.name == "local":
        from rsigym_env.worlds.local.sandbox.isolation import bwrap_available

        if not bwrap_available():
            pytest.skip("the local sandbox needs bubblewrap here")


def test_is_a_sandbox_service(world):
    assert isinstance(world.sandbox, SandboxService)


def test_command_output_state_and_bill(world):
    _skip_without_isolation(world)
    call = SandboxExec(command="echo contract > note.txt && cat note.txt && pwd", timeout_s=30)
    quote = world.sandbox.quote(call)
    billed = world.sandbox.exec(call)
    assert billed.value.exit_code == 0
    assert billed.value.stdout.splitlines() == ["contract", "/app"]
    assert 0 < billed.cost_usd <= quote.usd + 1e-12
    again = world.sandbox.exec(SandboxExec(command="cat note.txt", timeout_s=30))
    assert again.value.stdout == "contract\n"  # the run's sandbox keeps its files between calls


def test_failing_and_overlong_commands_report_their_exit(world):
    _skip_without_isolation(world)
    assert world.sandbox.exec(SandboxExec(command="exit 3", timeout_s=30)).value.exit_code == 3
    slow = world.sandbox.exec(SandboxExec(command="sleep 5", timeout_s=1))
    assert slow.value.exit_code != 0 and "wall-clock limit" in slow.value.stderr
