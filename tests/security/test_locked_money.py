"""Issue 11, item 9: money is never locked forever.

Attacked as a careless (or hostile) user would: the process running a paid call is killed with
SIGKILL; the env is closed or reset while jobs run. Reservations are settled for the work done
(recorded as the call progressed) and the rest released; nothing stays reserved.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.platform.audit import verify_audit
from rsigym_env.platform.ledger import Ledger
from rsigym_env.worlds.local.sandbox import isolation

CHILD = textwrap.dedent('''
    import sys, gymnasium as gym, rsigym_env
    env = gym.make("RSIGym/Joint-v0", world="local", benchmark="aime", ledger_path=sys.argv[1], run_dir=sys.argv[2])
    env.reset(seed=0)
    print("ready", flush=True)
    env.step({"tool": "generate_data", "args": {"teacher": "teacher-small", "n_examples": 8000}})
    print("finished", flush=True)
''')


@pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")
@pytest.mark.slow
def test_a_killed_run_is_billed_for_its_work_and_releases_the_rest(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ledger_path), str(tmp_path / "run")],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the call has reserved its worst case and made progress
            time.sleep(1.0)
            with Ledger(ledger_path, recover=False) as ledger:
                key = next(r.key for r in ledger.audit_records() if r.key)
                bal, open_res = ledger.balance(key), ledger.open_reservations()
                if open_res and open_res[0].used_usd > 0:
                    break
        reserved = bal.reserved_usd
        assert reserved > 1.0, bal  # $5 budget: the worst case of 8000 demonstrations is most of it
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
        child.stdout.close()
    with Ledger(ledger_path) as ledger:  # opening it recovers what the dead owner held
        after = ledger.balance(key)
        records = ledger.audit_records()
    assert after.reserved_usd == 0.0
    assert 0.0 < after.spent_usd < reserved  # the work done, not the worst case
    assert after.spent_usd + after.available_usd == pytest.approx(after.budget_usd)
    recovered = [r.event for r in records if r.event.get("op") == "recover"]
    assert len(recovered) == 1 and recovered[0]["charged_usd"] == pytest.approx(after.spent_usd)
    assert verify_audit(ledger_path).ok
    shown = subprocess.run([sys.executable, "-m", "rsigym_env.cli", "ledger", "show", str(ledger_path)],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    # the dead run's sandbox (its tmpfs, cgroup and processes) is cleaned up by the next one to look
    from rsigym_env.worlds.local.sandbox.isolation import reap_stale_groups

    reap_stale_groups()
    assert not any(p.is_mount() for p in (tmp_path / "run").rglob("*") if p.is_dir())


@pytest.mark.parametrize("end", ["close", "reset"])
def test_closing_or_resetting_with_jobs_running_leaves_nothing_reserved(tmp_path, end):
    env = gym.make("RSIGym/Joint-v0", world="sim", benchmark="aime", budget_usd=500, ledger_path=tmp_path / "l.sqlite")
    env.reset(seed=0)
    env.step({"tool": "generate_data", "args": {"teacher": "claude-opus-5", "n_examples": 200}})
    env.step({"tool": "train", "args": {"dataset": "ds-1"}})
    env.step({"tool": "evaluate", "args": {"k": 1}})
    run = env.unwrapped.run
    key = run.key.id
    assert len(run.running) == 2 and run.balance.reserved_usd > 0
    if end == "reset":
        env.reset(seed=1)
        bal = env.unwrapped.platform.ledger.balance(key)
        env.close()
    else:
        env.close()
        with Ledger(tmp_path / "l.sqlite") as ledger:
            bal = ledger.balance(key)
    assert bal.reserved_usd == 0.0 and bal.spent_usd > 0
    assert verify_audit(tmp_path / "l.sqlite").ok
