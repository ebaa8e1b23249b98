"""The E2B counterpart driven by the unchanged ``e2b`` SDK: create, commands and files, list, set_timeout, kill."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import CommandExitException, Sandbox, exceptions

from rsigym_env.counterparts.e2b_api import E2BCounterpart
from rsigym_env.worlds.local.sandbox.isolation import bwrap_available

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="the E2B counterpart's sandboxes need bubblewrap")


@pytest.fixture(scope="module")
def e2b_env(tmp_path_factory):
    with E2BCounterpart(tmp_path_factory.mktemp("e2b"), reap_interval_s=0.2) as counterpart:
        yield counterpart, {"api_key": counterpart.api_key, "api_url": counterpart.api_url,
                            "sandbox_url": counterpart.sandbox_url}


def test_a_sandbox_lives_runs_commands_and_dies(e2b_env):
    counterpart, opts = e2b_env
    sbx = Sandbox.create(timeout=120, metadata={"created_by": "test"}, allow_internet_access=False, **opts)
    assert sbx.commands.run("mkdir -p /app /data && chmod 777 /app /data", user="root", timeout=30).exit_code == 0
    sbx.files.write("/app/note.txt", "kept")
    run = sbx.commands.run("cat note.txt && echo && pwd && echo d > /data/d && cat /data/d", timeout=30)
    assert run.stdout.splitlines() == ["kept", "/app", "d"]
    with pytest.raises(CommandExitException):
        sbx.commands.run("exit 3", timeout=30)

    listed = Sandbox.list(**opts).next_items()
    assert [s.sandbox_id for s in listed] == [sbx.sandbox_id] and listed[0].metadata == {"created_by": "test"}
    sbx.set_timeout(60)
    info = sbx.get_info()
    assert 50 < (info.end_at - info.started_at).total_seconds() < 200 and info.template_id == "base"

    sbx.kill()
    assert Sandbox.list(**opts).next_items() == []
    with pytest.raises(exceptions.SandboxException, match="not running"):
        sbx.commands.run("echo late", timeout=10)


def test_a_sandbox_is_killed_at_its_timeout(e2b_env):
    counterpart, opts = e2b_env
    sbx = Sandbox.create(timeout=1, **opts)
    deadline = time.time() + 10
    while sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list(**opts).next_items()] and time.time() < deadline:
        time.sleep(0.2)
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list(**opts).next_items()]


def test_refusals_are_named(e2b_env):
    counterpart, opts = e2b_env
    with pytest.raises(exceptions.AuthenticationException):
        Sandbox.create(**(opts | {"api_key": "e2b_wrong"}))
    with pytest.raises(exceptions.SandboxException, match="template 'python-3.12' not found"):
        Sandbox.create(template="python-3.12", **opts)
    sbx = Sandbox.create(timeout=30, **opts)
    try:  # the router checks the sandbox's own envd token
        reply = httpx.post(f"{counterpart.sandbox_url}/filesystem.Filesystem/Stat", json={"path": "/app"},
                           headers={"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": "stolen",
                                    "Content-Type": "application/json"}, timeout=10)
        assert reply.status_code == 401
        paused = httpx.post(f"{counterpart.api_url}/sandboxes/{sbx.sandbox_id}/pause",
                            headers={"X-API-KEY": counterpart.api_key}, timeout=10)
        assert paused.status_code == 404 and "pause" in paused.json()["message"]
    finally:
        sbx.kill()
