"""The session service under load: N concurrent sim runs x M steps through REST and MCP, next to in-process stepping.

A real ``rsigym serve`` process (``python -m rsigym_env.gateway.cli serve --port 0``) on loopback;
this process creates the runs (admin token) and drives each from its own thread with its own
HTTP connection, every run playing the same 200-step script of calls that all succeed (dev
evaluations and waits, probes, sandbox commands, harness edits, reads, a submit at the end). The
reference, measured in the same run with the same script on this side: ``env.step`` of a
``ResearchEnv`` made as the service makes them but with an in-memory ledger (how a policy trains),
and ``RunHost.call`` (the service's backend without HTTP: a file ledger plus the appended, flushed
steps.jsonl).

Checked afterwards: zero errors (every call HTTP 200 with ``ok``), and every run's books: the audit
chain verifies, nothing is left reserved, the ledger's spend equals the sum of the replies'
``cost_usd``, and (where the ledger offers it) ``Ledger.books()`` balances.

    .venv/bin/python bench/bench_gateway.py [--runs 16] [--steps 200] [--ray local] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from rsigym_env.gateway.host import RunHost, RunMeta, research_env
from rsigym_env.platform.audit import verify_audit
from rsigym_env.platform.ledger import Ledger
from rsigym_env.scenario import load_scenario

ADMIN = "rsa_bench-admin-token-0123456789"
BENCHMARK, BUDGET = "aime", 1000.0


def script(steps: int) -> list[tuple[str, dict[str, Any]]]:
    """``steps`` calls that all succeed in a sim run, ending with a submit (in sim even a submit run as a
    job ends the episode at once: its simulated duration is zero)."""
    cycle = [("evaluate", {"k": 1, "n_tasks": 2}), ("wait", {}), ("read", {"ref": "budget"}),
             ("infer", {"prompt": "What is 2 + 2?", "max_tokens": 16}), ("sandbox_exec", {"command": "ls", "timeout_s": 5}),
             ("read", {"ref": "jobs"}), ("edit_harness", {"path": "notes.md", "content": "note {i}"})]
    end = [("submit", {})]
    calls = []
    for i in range(steps - len(end)):
        tool, args = cycle[i % len(cycle)]
        if i == steps - len(end) - 1 and tool == "evaluate":  # no dev evaluation still running at the submit
            tool, args = "read", {"ref": "budget"}
        calls.append((tool, {k: v.format(i=i) if isinstance(v, str) else v for k, v in args.items()}))
    return calls + end


def percentiles(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return {"p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "mean_ms": statistics.fmean(samples) * 1e3, "n": len(samples)}


def in_process(calls: list[tuple[str, dict[str, Any]]], runs: int) -> dict[str, Any]:
    """Latency of ``env.step`` (memory ledger) and of ``RunHost.call`` (file ledger + steps.jsonl)."""
    step_s, host_s = [], []
    scenario = load_scenario(benchmark=BENCHMARK, budget_usd=BUDGET)
    for seed in range(runs):
        env = research_env(scenario)  # as the service makes them (async_jobs where offered)
        env.reset(seed=seed)
        for tool, args in calls:
            t = time.perf_counter()
            _, _, _, _, info = env.step({"tool": tool, "args": args})
            step_s.append(time.perf_counter() - t)
            assert info["ok"], info
        env.close()
        with tempfile.TemporaryDirectory() as d:
            host = RunHost(d, RunMeta.new(f"b{seed}", "0" * 64, scenario, seed).model_dump())
            host.start(resume=False)
            for tool, args in calls:
                t = time.perf_counter()
                reply = host.call(tool, args)
                host_s.append(time.perf_counter() - t)
                assert reply.ok, reply.text
            host.close()
    return {"env.step": percentiles(step_s), "RunHost.call": percentiles(host_s)}


def start_server(state: Path, ray: str | None) -> tuple[subprocess.Popen, str]:
    token = state.parent / "admin-token"
    token.write_text(ADMIN)
    token.chmod(0o600)
    cmd = [sys.executable, "-m", "rsigym_env.gateway.cli", "serve", "--port", "0", "--state-dir", str(state),
           "--admin-token-file", str(token), "--max-runs", "1000"]
    if ray:
        cmd += ["--ray", ray]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on" in line:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its output
            return proc, line.rsplit(" ", 1)[1].strip()
    raise RuntimeError("rsigym serve did not start")


def through_rest(url: str, calls: list[tuple[str, dict[str, Any]]], runs: int, first_seed: int = 0) -> dict[str, Any]:
    """``runs`` runs driven at once, one thread and one connection each."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    created = [httpx.post(f"{url}/v1/runs", json={"benchmark": BENCHMARK, "budget_usd": BUDGET, "seed": s},
                          headers=admin, timeout=120).json() for s in range(first_seed, first_seed + runs)]
    latencies: list[list[float]] = [[] for _ in created]
    costs: list[float] = [0.0] * runs
    errors: list[str] = []
    barrier = threading.Barrier(runs)

    def drive(i: int) -> None:
        key = {"Authorization": f"Bearer {created[i]['run_key']}"}
        with httpx.Client(base_url=url, headers=key, timeout=120) as client:
            barrier.wait()
            for tool, args in calls:
                t = time.perf_counter()
                try:
                    r = client.post(f"/v1/tools/{tool}", json=args)
                    reply = r.json()
                except Exception as exc:  # counted, not fatal: the figure is the error count
                    errors.append(f"run {i} {tool}: {type(exc).__name__}: {exc}")
                    continue
                latencies[i].append(time.perf_counter() - t)
                if r.status_code != 200 or not reply.get("ok"):
                    errors.append(f"run {i} {tool}: HTTP {r.status_code} {reply.get('error')}")
                costs[i] += float(reply.get("cost_usd", 0.0))

    load_before = os.getloadavg()
    started = time.perf_counter()
    threads = [threading.Thread(target=drive, args=(i,)) for i in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    flat = [x for run in latencies for x in run]
    return {"created": created, "costs": costs, "errors": errors, "wall_s": wall, "calls": len(flat),
            "calls_per_s": len(flat) / wall, "latency": percentiles(flat),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def through_mcp(url: str, calls: list[tuple[str, dict[str, Any]]], runs: int, first_seed: int = 0) -> dict[str, Any]:
    """``runs`` runs driven at once through the service's ``/mcp`` (the ``mcp`` SDK's streamable-HTTP
    client, one per run, in one event loop): each call is one MCP ``tools/call``."""
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    admin = {"Authorization": f"Bearer {ADMIN}"}
    created = [httpx.post(f"{url}/v1/runs", json={"benchmark": BENCHMARK, "budget_usd": BUDGET, "seed": s},
                          headers=admin, timeout=120).json() for s in range(first_seed, first_seed + runs)]
    latencies: list[list[float]] = [[] for _ in created]
    costs: list[float] = [0.0] * runs
    errors: list[str] = []

    async def drive(i: int) -> None:
        headers = {"Authorization": f"Bearer {created[i]['run_key']}"}
        async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
            async with Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
                for tool, args in calls:
                    t = time.perf_counter()
                    try:
                        result = await client.call_tool(tool, args)
                    except Exception as exc:  # counted, not fatal
                        errors.append(f"run {i} {tool}: {type(exc).__name__}: {exc}")
                        continue
                    latencies[i].append(time.perf_counter() - t)
                    reply = result.structured_content or {}
                    if result.is_error or not reply.get("ok"):
                        errors.append(f"run {i} {tool}: {reply.get('error')}")
                    costs[i] += float(reply.get("cost_usd", 0.0))

    async def everyone() -> None:
        async with anyio.create_task_group() as tg:
            for i in range(runs):
                tg.start_soon(drive, i)

    load_before = os.getloadavg()
    started = time.perf_counter()
    anyio.run(everyone)
    wall = time.perf_counter() - started
    flat = [x for run in latencies for x in run]
    return {"created": created, "costs": costs, "errors": errors, "wall_s": wall, "calls": len(flat),
            "calls_per_s": len(flat) / wall, "latency": percentiles(flat),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}


def check_books(state: Path, created: list[dict[str, Any]], costs: list[float]) -> list[str]:
    problems = []
    for run, cost in zip(created, costs):
        run_dir = state / "runs" / run["run_id"]
        key = json.loads((run_dir / "run.json").read_text())["ledger_key"]
        report = verify_audit(run_dir / "ledger.sqlite")
        kwargs = {"readonly": True} if "readonly" in Ledger.__init__.__code__.co_varnames else {}
        with Ledger(run_dir / "ledger.sqlite", **kwargs) as ledger:
            b = ledger.balance(key)
            books_ok = ledger.books().ok if hasattr(ledger, "books") else True
        if not report.ok or not books_ok or b.reserved_usd != 0.0 or abs(b.spent_usd - cost) > 1e-6:
            problems.append(f"{run['run_id']}: audit {report.ok}, books {books_ok}, reserved {b.reserved_usd}, "
                            f"spent {b.spent_usd} vs replies {cost}")
    return problems


def measure(runs: int = 16, steps: int = 200, ray: str | None = None) -> dict[str, Any]:
    """Per-call latency in process, through REST and through MCP, one run alone and ``runs`` at once; errors; books."""
    calls = script(steps)
    reference = in_process(calls, runs)
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        state = Path(tmp) / "state"
        proc, url = start_server(state, ray)
        try:
            alone = through_rest(url, calls, 1, first_seed=10_000)  # one run by itself: no queueing
            rest = through_rest(url, calls, runs)
            mcp_alone = through_mcp(url, calls, 1, first_seed=20_000)
            mcp = through_mcp(url, calls, runs, first_seed=30_000)
        finally:
            proc.terminate()
            proc.wait(60)
        problems = []
        for part in (alone, rest, mcp_alone, mcp):
            problems += check_books(state, part.pop("created"), part.pop("costs"))
    errors = alone.pop("errors") + rest.pop("errors") + mcp_alone.pop("errors") + mcp.pop("errors")
    return {"runs": runs, "steps": steps, "ray": ray, "cpus": os.cpu_count(),
            "in_process": reference, "rest_one_run": alone, "rest": rest, "mcp_one_run": mcp_alone, "mcp": mcp,
            "books_problems": problems, "errors": len(errors), "error_samples": errors[:5]}


def table(out: dict[str, Any]) -> list[str]:
    """The figures as Markdown."""
    reference, alone, rest, mcp_alone, mcp = (out[k] for k in ("in_process", "rest_one_run", "rest", "mcp_one_run", "mcp"))
    rows = [("`env.step` (memory ledger, reference)", reference["env.step"]),
            ("`RunHost.call` (file ledger + steps.jsonl)", reference["RunHost.call"]),
            ("REST, one run alone", alone["latency"]), (f"REST, {out['runs']} runs at once", rest["latency"]),
            ("MCP (streamable HTTP), one run alone", mcp_alone["latency"]), (f"MCP, {out['runs']} runs at once", mcp["latency"])]
    return [
        f"Session service (`bench_gateway.py`): {out['runs']} sim runs × {out['steps']} calls"
        f"{', Ray ' + out['ray'] if out['ray'] else ''}; load {rest['loadavg_before'][0]:.2f} → {mcp['loadavg_after'][0]:.2f}.",
        "",
        "| per call | p50 ms | p99 ms | mean ms |",
        "|---|---:|---:|---:|",
        *[f"| {name} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['mean_ms']:.2f} |" for name, p in rows],
        "",
        f"REST: {rest['calls']} calls in {rest['wall_s']:.2f} s = {rest['calls_per_s']:.0f} calls/s; MCP: {mcp['calls']} calls "
        f"in {mcp['wall_s']:.2f} s = {mcp['calls_per_s']:.0f} calls/s; errors {out['errors']}; books of every run "
        f"balanced: {'yes' if not out['books_problems'] else 'NO'}.",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ray", help="serve with --ray ADDRESS (e.g. local)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    out = measure(args.runs, args.steps, args.ray)
    print("\n".join(table(out)))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if not out["books_problems"] and out["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
