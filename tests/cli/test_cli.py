"""The `rsigym` command: run, scenarios, audit verify, tools."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

from rsigym_env.cli import main


def test_run_writes_result_and_a_verifiable_audit_log(tmp_path, capsys):
    out = tmp_path / "result.json"
    code = main(["run", "--benchmark", "aime", "--agent", "scripted", "--seed", "0", "--quiet",
                 "--run-dir", str(tmp_path / "run"), "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["terminated"] and result["info"]["submitted"]["by"] == "agent"
    text = capsys.readouterr().out
    assert "normalized gain (reward)" in text and "final official score" in text
    assert (tmp_path / "run" / "steps.jsonl").read_text().count("\n") == result["steps"]

    assert main(["audit", "verify", str(tmp_path / "run")]) == 0
    assert "chain intact" in capsys.readouterr().out
    db = sqlite3.connect(tmp_path / "run" / "ledger.sqlite")
    db.execute("UPDATE audit SET event = replace(event, 'evaluate', 'evaluatE') WHERE seq = 3")
    db.commit()
    db.close()
    assert main(["audit", "verify", str(tmp_path / "run" / "ledger.sqlite")]) == 1
    assert "record 3" in capsys.readouterr().out


def test_scenarios_and_tools_and_errors(capsys):
    assert main(["scenarios", "--track", "data"]) == 0
    listing = capsys.readouterr().out
    assert "sim-data-aime-500" in listing and "sim-joint-aime-500" not in listing
    assert main(["tools", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 10
    assert main(["run", "--scenario", "nope", "--quiet"]) == 2
    assert "unknown scenario" in capsys.readouterr().out


def test_console_script_is_installed():
    proc = subprocess.run([sys.executable, "-m", "rsigym_env.cli", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "scenarios" in proc.stdout


def test_the_parser_leaves_the_agent_servers_unloaded():
    """``rsigym --help`` and ``rsigym run`` do not import the MCP SDK or the OpenEnv server (~1 s here);
    ``rsigym mcp`` / ``rsigym openenv`` load them when they run."""
    code = ("import sys; from rsigym_env.cli import build_parser; p = build_parser(); "
            "a = p.parse_args(['mcp', '--benchmark', 'aime']); "
            "print(sorted(m for m in ('mcp', 'rsigym_env.gateway.mcp_server', 'rsigym_env.gateway.openenv_server') "
            "if m in sys.modules), a.func.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "run_mcp"]


def test_run_with_the_llm_researcher_over_http(tmp_path, capsys):
    from rsigym_env.serving import ModelRegistry, OpenAIServer, ScriptedChatModel

    script = ScriptedChatModel([("evaluate", '{"k": 1, "n_tasks": 5}'), ("wait", "{}"), ("submit", "{}")])
    with OpenAIServer(ModelRegistry({"scripted": script})) as server:
        code = main(["run", "--agent", "llm", "--llm-base-url", server.base_url, "--llm-model", "scripted",
                     "--llm-api-key", "x", "--benchmark", "aime", "--track", "harness", "--quiet",
                     "--run-dir", str(tmp_path / "run")])
    assert code == 0
    assert "by the agent" in capsys.readouterr().out
    transcript = (tmp_path / "run" / "transcript.jsonl").read_text().splitlines()
    assert len(transcript) >= 3 and len(script.requests) == 3
