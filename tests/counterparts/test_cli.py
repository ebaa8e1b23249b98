"""``rsigym counterparts``: prints the exports (one token), serves on loopback, stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rsigym_env.worlds.local.sandbox.isolation import bwrap_available


@pytest.mark.skipif(not bwrap_available(), reason="the E2B counterpart needs bubblewrap")
def test_counterparts_print_their_variables_serve_and_stop_on_sigterm(tmp_path: Path):
    env_file = tmp_path / "env.sh"
    proc = subprocess.Popen([sys.executable, "-m", "rsigym_env.cli", "counterparts", "--dir", str(tmp_path / "cp"),
                             "--env-file", str(env_file), "--token", "0123abcd"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not env_file.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert env_file.exists(), proc.stdout.read() if proc.poll() is not None else "no env file"
        assert oct(env_file.stat().st_mode & 0o777) == "0o600"
        exports = dict(line.removeprefix("export ").split("=", 1) for line in env_file.read_text().splitlines())
        assert exports["TINKER_API_KEY"] == "tml-0123abcd" and exports["E2B_API_KEY"] == "e2b_0123abcd"
        assert all(exports[k].startswith("http://127.0.0.1:") for k in
                   ("TINKER_BASE_URL", "RSIGYM_TEACHER_BASE_URL", "E2B_API_URL", "E2B_SANDBOX_URL"))
        assert any(Path(exports["RSIGYM_REMOTE_TASKS"]).glob("*/task.toml"))
        assert httpx.get(f"{exports['TINKER_BASE_URL']}/api/v1/healthz", timeout=10).json() == {"status": "ok"}
        teachers = httpx.get(f"{exports['RSIGYM_TEACHER_BASE_URL']}/models", timeout=10,
                             headers={"Authorization": "Bearer 0123abcd"}).json()
        assert {"teacher-small", "teacher-large"} <= {m["id"] for m in teachers["data"]}
        assert httpx.get(f"{exports['RSIGYM_TEACHER_BASE_URL']}/models", timeout=10).status_code == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert "counterparts stopped" in proc.stdout.read()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{exports['TINKER_BASE_URL']}/api/v1/healthz", timeout=5)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
