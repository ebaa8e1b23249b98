"""``rsigym serve`` as a user starts it: REST, MCP (streamable HTTP at /mcp) and the dashboard (/watch)
on one port, one run key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from gateway_helpers import listening_url
from test_gateway_mcp import assert_tool_listing, http_client

ADMIN = "test-admin-token-0123456789abcdef"


def test_rsigym_serve_speaks_rest_and_mcp_with_the_same_run_key(tmp_path: Path):
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN)
    token_file.chmod(0o600)
    proc = subprocess.Popen([sys.executable, "-m", "rsigym_env.cli", "serve", "--port", "0", "--state-dir",
                             str(tmp_path / "state"), "--admin-token-file", str(token_file), "--watch"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = listening_url(proc, 60)
        assert url, "rsigym serve did not start"
        created = httpx.post(f"{url}/v1/runs", json={"world": "sim", "benchmark": "aime", "budget_usd": 50, "seed": 0},
                             headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60).json()
        key = created["run_key"]

        async def over_mcp():
            async with http_client(f"{url}/mcp", key) as client:
                await assert_tool_listing(client)
                started = await client.call_tool("evaluate", {"k": 1})
                refused = await client.call_tool("evaluate", {"k": "one"})
                return started, refused

        started, refused = anyio.run(over_mcp)
        assert not started.is_error and started.structured_content["result"]["job"] == "job-1"
        assert refused.is_error and refused.structured_content["error"] == "invalid_args"
        jobs = httpx.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
        assert "job-1" in str(jobs)  # the job MCP started is the REST view's job: one run behind both
        page = httpx.get(f"{url}/watch/", timeout=30, headers={"Authorization": f"Bearer {ADMIN}"})
        assert page.status_code == 200 and created["run_id"][:8] in page.text  # the live dashboard (--watch)
        assert httpx.get(f"{url}/watch/", timeout=30).status_code == 401  # which needs a token
        own = httpx.get(f"{url}/watch/api/runs", timeout=30, headers={"Authorization": f"Bearer {key}"}).json()
        assert [r["key"] for r in own["runs"]] == [created["run_id"]] and "seed" not in own["runs"][0]
        with pytest.raises(Exception):  # noqa: B017 (the MCP client's own error for a refused key)
            anyio.run(lambda: _list_with(url, "wrong-key"))
    finally:
        proc.terminate()
        proc.wait(30)


async def _list_with(url: str, key: str):
    async with http_client(f"{url}/mcp", key) as client:
        await client.list_tools()
