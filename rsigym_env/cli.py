"""``rsigym``: run research episodes, list scenarios, verify audit logs.

    rsigym run --benchmark aime --agent scripted --seed 0 --json result.json
    rsigym run --scenario sim-data-swe-bench-verified-1000 --agent random
    rsigym scenarios
    rsigym audit verify runs/<run>/ledger.sqlite
    rsigym tools
    rsigym sweep --agents random,scripted --benchmarks all --seeds 3 --out bench/sweep
    rsigym sweep --report bench/sweep/results.json
    rsigym agents register --from scripted --set data_fraction=0.6 --name scripted-df06
    rsigym agents list | show ID | diff ID1 ID2
    rsigym run --agent ag-3f2a... --record tape.jsonl       rsigym run --replay tape.jsonl
    rsigym recurse --scenario recursive-scripted --rounds 3 --seeds 3 --out runs/recursion
    rsigym ledger show runs/<run>/ledger.sqlite       rsigym ledger recover runs/<run>/ledger.sqlite
    rsigym serve --port 8765                          rsigym mcp --scenario sim-joint-aime-500
    rsigym skills --out skills/                       rsigym export atif runs/<run>
    rsigym openenv --port 8000                        rsigym watch runs/ --port 8766
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import ENV_IDS
from .baselines import RESEARCHERS, make_researcher
from .episode import EpisodeResult, Researcher, run_episode
from .platform.audit import verify_audit
from .scenario import list_scenarios, load_scenario
from .tools import tool_schemas


def _env_id(track: str) -> str:
    return next(i for i in ENV_IDS if i.split("/")[1].lower().startswith(track))


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    tape_meta: dict[str, Any] = {}
    try:
        if args.replay:  # the recorded scenario, researcher and seed unless given again
            from .replay import tape_header
            from .scenario import Scenario

            header = tape_header(args.replay)
            scenario = Scenario.model_validate(header["scenario"])
            tape_meta = header.get("meta", {})
            args.agent = args.agent or tape_meta.get("agent") or "scripted"
            args.seed = args.seed if args.seed is not None else tape_meta.get("reset_seed", 0)
        else:
            scenario = load_scenario(args.scenario, track=args.track, world=args.world, benchmark=args.benchmark,
                                     budget_usd=args.budget, max_steps=args.max_steps)
        if getattr(args, "dry_run", False):
            return cmd_dry_run(scenario, console)
        args.agent = args.agent or "scripted"
        args.seed = 0 if args.seed is None else args.seed
        if args.agent not in RESEARCHERS and not args.agent.startswith("ag-"):
            raise ValueError(f"unknown agent {args.agent!r}; bundled: {', '.join(sorted(RESEARCHERS))}, "
                             "or a registered id 'ag-...' (rsigym agents list)")
    except (ValueError, KeyError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.run_dir or Path("runs") / f"{stamp}-{scenario.name}-{args.agent}-s{args.seed}")
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger = run_dir / "ledger.sqlite"
    env = gym.make(_env_id(scenario.track), scenario=scenario, ledger_path=ledger, run_dir=run_dir)
    tape = None
    if args.record or args.replay:
        from .replay import TapeWrapper

        env = tape = TapeWrapper(env, record=args.record, replay=args.replay, meta={"agent": args.agent})
    from .watch.record import RunRecorder

    env = RunRecorder(env, run_dir, researcher=args.agent, surface="rsigym run")  # what `rsigym watch` shows, live
    try:
        researcher = _researcher(args, run_dir)
    except (ValueError, KeyError) as exc:
        env.close()
        console.print(f"[red]error:[/] {exc}")
        return 2
    steps_log = (run_dir / "steps.jsonl").open("w")
    console.print(f"[bold]{scenario.name}[/]: {args.agent} researcher, seed {args.seed}, "
                  f"budget ${scenario.budget_usd:g}, {scenario.time_limit_h:g} h, run dir {run_dir}")
    started = time.perf_counter()
    with Progress(TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[status]}", markup=False), TimeElapsedColumn(), console=console,
                  disable=args.quiet, transient=False) as progress:
        task = progress.add_task("steps", total=scenario.max_steps, status="")

        def on_step(step: int, action: Any, obs: dict[str, Any], info: dict[str, Any]) -> None:
            spent = scenario.budget_usd - float(obs["budget_left_usd"][0])
            best = float(obs["dev_scores"][1])
            what = info.get("tool", "?") + ("" if info.get("ok") else f" ✗ {info.get('error')}")
            for event in info.get("events", []):
                if event.get("kind") == "evaluate" and event.get("ok"):
                    what += f" | dev {event['score']:.3f}"
            status = f"${spent:,.2f} spent · best dev {'-' if best < 0 else f'{best:.3f}'} · {what}"
            progress.update(task, completed=step, status=status)
            if args.verbose:
                console.print(obs["log"], markup=False, highlight=False)
            elif not args.quiet:
                lines = obs["log"].split("\n")
                story = [lines[1] if len(lines) > 1 else ""] + [e["text"] for e in info.get("events", [])]
                for i, line in enumerate(story):
                    prefix = f"{step:>3} {info.get('tool', '?'):<15}" if i == 0 else " " * 20
                    progress.console.print(prefix + _cut(line, console.width - 21), markup=False, highlight=False)
            steps_log.write(json.dumps({"step": step, "action": action, "info": info}, default=str) + "\n")

        result = run_episode(env, researcher, seed=args.seed, on_step=on_step)
        progress.update(task, total=result.steps)
    steps_log.close()
    env.close()
    wall = time.perf_counter() - started
    payload = result.to_dict() | {"wall_seconds": wall, "run_dir": str(run_dir), "ledger": str(ledger)}
    (run_dir / "result.json").write_text(json.dumps(payload, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str))
    console.print(summary_table(result, wall))
    console.print(f"audit log: rsigym audit verify {ledger}")
    if args.record:
        console.print(f"tape: {args.record} (replay: rsigym run --replay {args.record})")
    if tape is not None and tape.diverged:
        console.print("[yellow]the run departed from the recording (some requests were not on the tape)[/]")
    return 0


def cmd_dry_run(scenario: Any, console: Console) -> int:
    """Check credentials, scenario, prices and dataset references without spending; 1 if anything is missing."""
    from .worlds.remote.dryrun import all_ok, render, run_checks

    checks = run_checks(scenario)
    console.print(render(checks))
    bad = [c.name for c in checks if c.status in ("missing", "fail")]
    console.print("[green]ready: nothing is missing[/]" if not bad else f"[red]not ready:[/] {', '.join(bad)}")
    return 0 if all_ok(checks) else 1


def cmd_prices(args: argparse.Namespace, console: Console) -> int:
    """``prices show`` (the price list in use) and ``prices refresh`` (download Tinker's models.json)."""
    from .worlds.remote import pricing

    if args.prices_command == "refresh":
        try:
            path = pricing.refresh(args.url, Path(args.out) if args.out else None)
        except (OSError, ValueError) as exc:
            console.print(f"[red]error:[/] could not refresh from {args.url}: {exc}")
            return 1
        console.print(f"Tinker price list: {path} ({len(pricing.load_tinker_models(path))} models)")
        return 0
    path, meta = pricing.price_source()
    table = Table(title=f"Tinker prices, $ per million tokens ({path}, {meta.get('retrieved', 'undated')})")
    for col in ("model", "context", "prefill", "cached", "sample", "train"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for row in pricing.load_tinker_models(path):
        price = pricing.model_price(row["tinker_id"], [row])
        table.add_row(row["tinker_id"], str(row.get("context", "")), f"{price.prefill:g}", f"{price.cached:g}",
                      f"{price.sample:g}", f"{price.train:g}")
    console.print(table)
    return 0


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 10)] + "…"


def _researcher(args: argparse.Namespace, run_dir: Path) -> Researcher:
    """The ``--agent``; an LLM researcher takes its endpoint options and writes its transcript to the run dir."""
    if args.agent.startswith("ag-"):  # a registered researcher spec
        from .agents import AgentRegistry, build_researcher

        spec = AgentRegistry().get(args.agent)
        extra: dict[str, Any] = {}
        if spec.kind == "llm":
            extra = {"transcript": str(run_dir / "transcript.jsonl")} | {
                f: getattr(args, f"llm_{f}") for f in ("model", "base_url", "api_key") if getattr(args, f"llm_{f}")}
        return build_researcher(spec, **extra)
    if args.agent != "llm":
        return make_researcher(args.agent)
    from .baselines import LLMArgs, LLMResearcher

    llm = LLMArgs(transcript=str(run_dir / "transcript.jsonl"))
    for field in ("model", "base_url", "api_key"):
        if getattr(args, f"llm_{field}"):
            setattr(llm, field, getattr(args, f"llm_{field}"))
    return LLMResearcher(llm)


def summary_table(result: EpisodeResult, wall_seconds: float) -> Table:
    """The end of an episode as a two-column table a person reads at a glance."""
    info = result.info
    table = Table(title=f"{result.scenario} — {result.researcher} researcher, seed {result.seed}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.2f}%"

    sub = info.get("submitted", {})
    best = info.get("best_candidate") or {}
    rows = [
        ("initial official score", pct(info.get("initial_score"))),
        ("final official score", pct(info.get("official_score"))),
        ("normalized gain (reward)", f"{info.get('normalized_gain', 0.0):+.4f}"),
        ("submitted", f"{sub.get('checkpoint')} + {sub.get('harness')} ({'by the agent' if sub.get('by') == 'agent' else 'by default: ' + str(info.get('end_reason'))})"),
        ("best dev score", f"{pct(info.get('best_dev_score'))} ({best['checkpoint']} + {best['harness']})" if best
         else "- (no dev evaluation)"),
        ("spend", f"${info.get('spend_usd', 0.0):,.2f} of ${info.get('budget_usd', 0.0):,.0f}"),
        ("official evaluation (outside budget)", f"${info.get('official_eval_usd', 0.0):,.2f}"),
        ("research time", f"{info.get('elapsed_h', 0.0):.1f} h (world clock)"),
        ("steps", str(result.steps)),
        ("wall time", f"{wall_seconds:.2f} s"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def cmd_scenarios(args: argparse.Namespace, console: Console) -> int:
    table = Table(title="bundled scenarios (rsigym run --scenario NAME)")
    for col in ("name", "track", "world", "benchmark", "budget", "time", "steps"):
        table.add_column(col, justify="right" if col in ("budget", "time", "steps") else "left")
    for name in list_scenarios():
        s = load_scenario(name)
        if args.track and s.track != args.track:
            continue
        table.add_row(name, s.track, s.world, s.benchmark, f"${s.budget_usd:g}", f"{s.time_limit_h:g} h", str(s.max_steps))
    console.print(table)
    return 0


def cmd_audit_verify(args: argparse.Namespace, console: Console) -> int:
    path = Path(args.path)
    if path.is_dir():
        path = path / "ledger.sqlite"
    report = verify_audit(path)
    console.print(("[green]" if report.ok else "[red]") + str(report))
    return 0 if report.ok else 1


def cmd_ledger(args: argparse.Namespace, console: Console) -> int:
    """``ledger show``: accounts, open reservations, the books and the audit chain (exit 1 unless all are
    right); ``ledger recover``: settle the reservations of processes that are gone and say what moved."""
    import sqlite3

    from .platform.ledger import Ledger

    path = Path(args.path)
    if path.is_dir():
        path = path / "ledger.sqlite"
    if not path.is_file():
        console.print(f"[red]error:[/] no ledger file at {path}")
        return 1
    try:
        ledger = Ledger(path, readonly=True)  # checks that it is a ledger before anything is written
        if args.ledger_command == "recover":
            ledger.close()
            ledger = Ledger(path, recover=False)
    except (ValueError, OSError, sqlite3.Error) as exc:
        console.print(f"[red]error:[/] cannot open {path} as a ledger: {exc}")
        return 1
    with ledger:
        if args.ledger_command == "recover":
            recovery = ledger.recover(unowned=args.unowned)
            table = Table(title=f"settled ({len(recovery.settled)})")
            for col in ("id", "key", "tool", "owner", "reserved", "charged", "released", "reason"):
                table.add_column(col, justify="right" if col in ("reserved", "charged", "released") else "left")
            for done in recovery.settled:
                r = done.reservation
                owner = f"{r.owner.pid}@{r.owner.host}" if r.owner else "?"
                table.add_row(str(r.id), r.key, r.label or "", owner, f"${r.usd:,.4f}", f"${done.charged_usd:,.4f}",
                              f"${done.released_usd:,.4f}", done.reason)
            console.print(table)
            for r in recovery.left:
                where = f"{r.owner.pid}@{r.owner.host}" if r.owner else "no owner recorded (--unowned settles it)"
                console.print(f"[yellow]left alone:[/] reservation {r.id} on {r.key} (${r.usd:,.4f}), owner {where}: "
                              f"{r.status}")
            return 0
        accounts, holds, books = ledger.accounts(), ledger.open_reservations(), ledger.books()
    money = lambda usd: f"${usd:,.4f}"  # noqa: E731
    table = Table(title=f"accounts ({path})")
    for col in ("key", "parent", "budget", "spent", "reserved", "granted", "available", "closed"):
        table.add_column(col, justify="left" if col in ("key", "parent", "closed") else "right")
    for a in accounts:
        b = a.balance
        table.add_row(a.key, a.parent or "", money(b.budget_usd), money(b.spent_usd), money(b.reserved_usd),
                      money(b.granted_usd), money(b.available_usd), "yes" if b.closed else "")
    console.print(table)
    table = Table(title=f"open reservations ({len(holds)})")
    for col in ("id", "key", "amount", "used so far", "tool", "owner pid", "host", "owner", "age"):
        table.add_column(col, justify="right" if col in ("id", "amount", "used so far", "age") else "left")
    now = time.time()
    for r in holds:
        age = "?" if r.created is None else f"{max(0.0, now - r.created):,.0f} s"
        style = {"alive": "green", "gone": "red"}.get(r.status, "yellow")
        table.add_row(str(r.id), r.key, money(r.usd), money(r.used_usd), r.label or "",
                      str(r.owner.pid) if r.owner else "?", r.owner.host if r.owner else "?",
                      f"[{style}]{r.status}[/]", age)
    console.print(table)
    gone = [r for r in holds if r.status == "gone"]
    if gone:
        console.print(f"[yellow]{len(gone)} reservation(s) of processes that are gone, ${sum(r.usd for r in gone):,.4f}: "
                      f"rsigym ledger recover {path}[/]")
    table = Table(title="the books")
    for col in ("key", "spent+reserved+granted+available = budget", "open reservations = reserved",
                "sub-key budgets = granted"):
        table.add_column(col)
    mark = lambda ok, text: f"[green]ok[/] {text}" if ok else f"[red]NO[/] {text}"  # noqa: E731
    for line in books.lines:
        total = line.spent_usd + line.reserved_usd + line.granted_usd + line.available_usd
        table.add_row(line.key, mark(line.balances, f"{money(total)} = {money(line.budget_usd)}" + (" (closed)" if line.closed else "")),
                      mark(line.reservations_match, f"{money(line.reservations_usd)} = {money(line.reserved_usd)}"),
                      mark(line.subkeys_match, f"{money(line.subkeys_usd)} = {money(line.granted_usd)}"))
    console.print(table)
    for problem in books.problems:
        console.print(f"[red]books:[/] {problem}", highlight=False)
    report = verify_audit(path)
    console.print(("[green]" if report.ok else "[red]") + str(report))
    ok = books.ok and report.ok
    console.print("[green]the books balance and the audit chain is intact[/]" if ok
                  else "[red]the books do not balance or the audit chain is broken[/]")
    return 0 if ok else 1


def cmd_tools(args: argparse.Namespace, console: Console) -> int:
    schemas = tool_schemas()
    if args.json:
        print(json.dumps(schemas, indent=2))
        return 0
    table = Table(title="tools (each one pydantic model: validation, JSON schema, Gymnasium subspace)")
    table.add_column("tool", style="bold")
    table.add_column("arguments")
    table.add_column("what it does")
    for s in schemas:
        fn = s["function"]
        table.add_row(fn["name"], ", ".join(fn["parameters"].get("properties", {})), fn["description"].split(". ")[0])
    console.print(table)
    return 0


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    """agents × benchmarks × seeds through Ray (or in-process with ``--local``), then the report."""
    from .report import print_report, write_report
    from .sweep import all_agents, all_benchmarks, load_results, make_grid, sweep

    if args.report:
        data = load_results(args.report)
        out = Path(args.out) if args.out else Path(args.report).parent
        print_report(data, console)
        paths = write_report(data, out)
        console.print("report: " + ", ".join(str(p) for p in paths.values()))
        return 0
    agents = all_agents() if args.agents == "all" else _split(args.agents)
    try:
        benchmarks = all_benchmarks(args.world) if args.benchmarks == "all" else _split(args.benchmarks)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    if not agents or not benchmarks or args.seeds < 1:
        console.print("[red]error:[/] need at least one agent, one benchmark and one seed")
        return 2
    known = set(all_agents())
    registered: dict[str, Any] = {}
    for name in agents:
        if name.startswith("ag-"):
            from .agents import AgentRegistry

            try:
                registered[name] = AgentRegistry().get(name)
            except KeyError as exc:
                console.print(f"[yellow]warning:[/] {exc}; its episodes will be reported as failed")
            continue
        if name not in known and ":" not in name:
            console.print(f"[yellow]warning:[/] unknown agent {name!r} (known: {', '.join(sorted(known))}); "
                          "its episodes will be reported as failed")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    if args.budget is None:  # the world's own default budget (sim $500, local $5, ...)
        args.budget = load_scenario(world=args.world, track=args.track).budget_usd
    specs = make_grid(agents, benchmarks, seeds, track=args.track, budget_usd=args.budget, world=args.world,
                      max_steps=args.max_steps)
    if registered:  # registered researchers travel with their spec: workers need no registry
        import dataclasses

        specs = [dataclasses.replace(s, agent=registered[s.agent].id, agent_spec=registered[s.agent].content())
                 if s.agent in registered else s for s in specs]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or Path("runs") / f"sweep-{stamp}")
    command = ["rsigym", "sweep", "--agents", ",".join(agents), "--benchmarks", ",".join(benchmarks) if args.benchmarks != "all" else "all",
               "--seeds", str(args.seeds), "--track", args.track, "--budget", f"{args.budget:g}", "--out", str(out)]
    command += (["--first-seed", str(args.first_seed)] if args.first_seed else []) + (["--world", args.world] if args.world != "sim" else [])
    command += (["--max-steps", str(args.max_steps)] if args.max_steps else []) + (["--chunk", str(args.chunk)] if args.chunk else [])
    command += (["--address", args.address] if args.address else []) + (["--local"] if args.local else [])
    where = "in-process (--local)" if args.local else (f"on the Ray cluster at {args.address}" if args.address else "on a local Ray instance")
    console.print(f"[bold]sweep[/]: {len(agents)} agent(s) × {len(benchmarks)} benchmark(s) × {args.seeds} seed(s) = "
                  f"{len(specs)} episodes, {args.track} track, ${args.budget:g}, {where}; each episode has its own env, "
                  f"ledger and platform key; output {out}")
    failed = 0
    with Progress(TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console,
                  disable=args.quiet) as progress:
        task = progress.add_task("starting Ray" if not args.local else "episodes", total=len(specs), status="")

        def on_ready(timing: dict[str, float]) -> None:
            if "ray_init_s" in timing:
                progress.console.print(f"Ray ready in {timing['ray_init_s']:.1f} s"
                                       f" (+ {timing.get('ray_warmup_s', 0.0):.1f} s warming up the workers)")
            progress.update(task, description="episodes")

        def on_done(records: list[Any]) -> None:
            nonlocal failed
            failed += sum(1 for r in records if not r.ok)
            progress.update(task, advance=len(records), status=f"[red]{failed} failed[/]" if failed else "")

        try:
            result = sweep(specs, local=args.local, address=args.address, num_cpus=args.num_cpus, chunk=args.chunk,
                           on_done=on_done, on_ready=on_ready)
        except Exception as exc:  # the cluster itself (not an episode) failed: nothing to report
            console.print(f"[red]error:[/] could not run the sweep: {type(exc).__name__}: {exc}")
            return 1
    result.config["command"] = shlex.join(command)
    data = result.to_dict()
    result.save(out / "results.json")
    print_report(data, console)
    paths = write_report(data, out, command=result.config["command"])
    timing = result.timing
    console.print(f"{len(specs)} episodes in {timing['sweep_s']:.2f} s ({timing['episodes_per_s']:.0f}/s)"
                  + (f", Ray {'connect' if args.address else 'start-up'} {timing['ray_init_s']:.1f} s"
                     f" + worker warm-up {timing.get('ray_warmup_s', 0.0):.1f} s" if "ray_init_s" in timing else "")
                  + (f", {result.config['chunk']} episodes per task" if result.config.get("chunk") else "")
                  + f"; {failed} failed")
    console.print(f"results: {out / 'results.json'}; report: " + ", ".join(str(p) for p in paths.values()))
    return 1 if (args.strict and failed) else 0


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    import tomllib

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value  # a bare string
    return out


def cmd_agents_register(args: argparse.Namespace, console: Console) -> int:
    from .agents import AgentRegistry, builtin_spec, spec_from_ref

    registry = AgentRegistry()
    try:
        if args.source and args.base:
            raise ValueError("give a source or --from, not both")
        ref = args.source or args.base or "scripted"
        base = builtin_spec(ref) if ref in ("scripted", "llm", "rl", "random") else spec_from_ref(ref, registry)
        changes: dict[str, Any] = {}
        if args.set:
            changes["params"] = _parse_set(args.set)
        for field, value in (("name", args.name), ("model", args.model)):
            if value is not None:
                changes[field] = value
        if args.prompt_file:
            changes["system_prompt"] = Path(args.prompt_file).read_text()
        spec = base.derive(**changes) if changes else base
        from .agents import check_buildable

        check_buildable(spec)
    except (ValueError, KeyError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    agent_id = registry.register(spec, note=args.note)
    print(agent_id)
    return 0


def cmd_agents_list(args: argparse.Namespace, console: Console) -> int:
    from .agents import AgentRegistry

    records = list(AgentRegistry())
    if args.json:
        print(json.dumps([{"id": r["id"], "registered_at": r["registered_at"], "note": r["note"],
                           "spec": r["spec"].model_dump(mode="json")} for r in records], indent=1))
        return 0
    table = Table(title=f"registered researchers ({AgentRegistry().root})")
    for col in ("id", "name", "kind", "parent", "params", "registered", "note"):
        table.add_column(col)
    for r in records:
        s = r["spec"]
        params = ", ".join(f"{k}={v}" for k, v in list(s.params.items())[:6])
        table.add_row(r["id"], s.name, s.kind, s.parent or "", params, r["registered_at"], r["note"])
    console.print(table)
    return 0


def cmd_agents_show(args: argparse.Namespace, console: Console) -> int:
    from .agents import AgentRegistry

    try:
        record = AgentRegistry().record(args.agent)
    except KeyError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    spec = record["spec"]
    if args.files:
        for path, text in spec.to_files().items():
            print(f"==> {path} <==\n{text}" + ("" if text.endswith("\n") else "\n"))
    else:
        print(json.dumps({"id": spec.id, "registered_at": record["registered_at"], "note": record["note"],
                          "spec": spec.model_dump(mode="json")}, indent=1))
    return 0


def cmd_agents_diff(args: argparse.Namespace, console: Console) -> int:
    from .agents import AgentRegistry, diff_specs

    registry = AgentRegistry()
    try:
        a, b = registry.get(args.a), registry.get(args.b)
    except KeyError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    text = diff_specs(a, b)
    print(text if text else f"{a.id} and {b.id} have the same content", end="" if text else "\n")
    return 0


def cmd_recurse(args: argparse.Namespace, console: Console) -> int:
    from .recursion import markdown, recurse, to_json

    try:
        scenario = load_scenario(args.scenario)
        if scenario.world != "recursive":
            raise ValueError(f"scenario {scenario.name!r} is not recursive (world {scenario.world!r})")
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or Path("runs") / f"recursion-{stamp}")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    command = ["rsigym", "recurse", "--scenario", args.scenario, "--rounds", str(args.rounds), "--seeds", str(args.seeds),
               "--improver", args.improver, "--mode", args.mode, "--out", str(out)]
    command += (["--first-seed", str(args.first_seed)] if args.first_seed else []) + (["--target", args.target] if args.target else [])
    command += ["--ray"] if args.ray else []

    def on_round(row: dict[str, Any]) -> None:
        if not args.quiet:
            console.print(f"seed {row['seed']} round {row['round']}: {row['target']} -> {row['improved']} "
                          f"index {row['index_before']:+.4f} -> {row['index_after']:+.4f} "
                          f"(gain {row['improver_gain']:+.4f}; best dev {row['best_dev_score'] or 0:.4f}, "
                          f"{row['dev_evaluations']} dev evaluations, ${row['spend_usd']:,.0f})", highlight=False)

    started = time.perf_counter()
    try:
        result = recurse(scenario, rounds=args.rounds, seeds=seeds, improver=args.improver, target=args.target,
                         mode=args.mode, ray=args.ray or None, on_round=on_round)
    except (ValueError, KeyError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    result["config"]["command"] = shlex.join(command)
    result["config"]["wall_s"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    (out / "recursion.json").write_text(to_json(result))
    text = markdown(result, shlex.join(command))
    (out / "recursion.md").write_text(text)
    console.print(text, markup=False, highlight=False)
    console.print(f"{out / 'recursion.json'}, {out / 'recursion.md'} ({result['config']['wall_s']:.1f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rsigym", description="RSIGym-Env: research runs as Gymnasium environments.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one research episode and print its result")
    run.add_argument("--scenario", help="bundled scenario name or YAML path (see `rsigym scenarios`)")
    run.add_argument("--world", help="world (default: the scenario's, sim)")
    run.add_argument("--benchmark", help="benchmark id, e.g. swe-bench-verified, aime")
    run.add_argument("--track", choices=["joint", "data", "harness"], help="track (default: the scenario's)")
    run.add_argument("--budget", type=float, help="budget in dollars")
    run.add_argument("--max-steps", type=int, help="tool calls per episode")
    run.add_argument("--agent", help=f"researcher: {', '.join(sorted(RESEARCHERS))} or a registered id 'ag-...' "
                                      "(default: scripted; with --replay: the recorded one)")
    run.add_argument("--seed", type=int, help="reset seed (default 0; with --replay: the recorded one)")
    run.add_argument("--record", metavar="PATH", help="record every service request/response and clock reading to this tape")
    run.add_argument("--replay", metavar="PATH", help="replay a tape: its scenario, researcher and seed, served from the "
                                                     "recording (a request it never recorded is refused)")
    run.add_argument("--llm-model", help="--agent llm: model name (default: $RSIGYM_LLM_MODEL)")
    run.add_argument("--llm-base-url", help="--agent llm: OpenAI-compatible base URL (default: $OPENAI_BASE_URL)")
    run.add_argument("--llm-api-key", help="--agent llm: API key (default: $OPENAI_API_KEY)")
    run.add_argument("--json", metavar="PATH", help="also write the result as JSON here")
    run.add_argument("--run-dir", help="where to keep the ledger, audit log and step log (default: runs/...)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no per-step lines")
    run.add_argument("-v", "--verbose", action="store_true", help="print every observation's full log")
    run.add_argument("--dry-run", action="store_true", help="check credentials, scenario, prices and dataset "
                                                            "references without spending; exit 1 if anything is missing")
    run.set_defaults(func=cmd_run)

    pr = sub.add_parser("prices", help="the remote world's price list (Tinker's models.json)")
    pr_sub = pr.add_subparsers(dest="prices_command", required=True)
    pr_sub.add_parser("show", help="the price list in use and its date").set_defaults(func=cmd_prices)
    refresh = pr_sub.add_parser("refresh", help="download Tinker's live models.json (needs the network)")
    refresh.add_argument("--url", default="https://tinker-docs.thinkingmachines.ai/tinker/models.json")
    refresh.add_argument("--out", help="where to write it (default: $RSIGYM_HOME/prices/tinker_models.json)")
    refresh.set_defaults(func=cmd_prices)

    scen = sub.add_parser("scenarios", help="list the bundled scenarios")
    scen.add_argument("--track", choices=["joint", "data", "harness"])
    scen.set_defaults(func=cmd_scenarios)

    audit = sub.add_parser("audit", help="audit-log commands")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_sub.add_parser("verify", help="check a run's hash-chained audit log; names the first broken record")
    verify.add_argument("path", help="a ledger.sqlite file or a run directory")
    verify.set_defaults(func=cmd_audit_verify)

    led = sub.add_parser("ledger", help="ledger commands: the books, open reservations, recovery after a crash")
    led_sub = led.add_subparsers(dest="ledger_command", required=True)
    led_show = led_sub.add_parser("show", help="accounts, open reservations (owner alive or gone), the books and the "
                                               "audit chain; exit 1 unless everything balances and the chain is intact")
    led_show.add_argument("path", help="a ledger.sqlite file or a run directory")
    led_show.set_defaults(func=cmd_ledger)
    led_rec = led_sub.add_parser("recover", help="settle reservations of processes that are gone (for the work they "
                                                 "recorded; the rest is released) and print what was settled")
    led_rec.add_argument("path", help="a ledger.sqlite file or a run directory")
    led_rec.add_argument("--unowned", action="store_true", help="also settle reservations that record no owner "
                                                                "(ledgers written before owners were recorded)")
    led_rec.set_defaults(func=cmd_ledger)

    tools = sub.add_parser("tools", help="list the researcher's tools")
    tools.add_argument("--json", action="store_true", help="print the function-calling schemas as JSON")
    tools.set_defaults(func=cmd_tools)

    sw = sub.add_parser("sweep", help="agents x benchmarks x seeds as Ray tasks; Figure-2 table, heatmap, anytime curves",
                        description="Run every (agent, benchmark, seed) episode, each in its own env with its own "
                                    "platform key and ledger, as Ray tasks of --chunk episodes (or in-process with "
                                    "--local), then print the Figure-2 table and write results.json, table.md, "
                                    "heatmap.png and anytime.png to --out. A failed episode is reported, not fatal.")
    sw.add_argument("--agents", default="random,scripted",
                    help="comma-separated researcher names, 'module:Factory' paths, or 'all' (every registered one)")
    sw.add_argument("--benchmarks", default="all", help="comma-separated benchmark ids or 'all' (default)")
    sw.add_argument("--seeds", type=int, default=3, help="seeds per (agent, benchmark): first-seed .. first-seed+N-1")
    sw.add_argument("--first-seed", type=int, default=0)
    sw.add_argument("--track", default="joint", choices=["joint", "data", "harness"])
    sw.add_argument("--budget", type=float, help="budget in dollars per episode (default: the world's, $500 on sim)")
    sw.add_argument("--world", default="sim")
    sw.add_argument("--max-steps", type=int, help="tool calls per episode (default: the scenario's)")
    sw.add_argument("--address", help="join this Ray cluster (e.g. ray://host:10001 or host:6379; its workers "
                                      "must have rsigym-env installed); default: start a local Ray")
    sw.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (default: all cores)")
    sw.add_argument("--chunk", type=int, help="episodes per Ray task (default: about 4 tasks per CPU, at most 25)")
    sw.add_argument("--local", action="store_true", help="run in this process without Ray (the reference)")
    sw.add_argument("--out", help="output directory (default runs/sweep-<timestamp>; with --report: next to the file)")
    sw.add_argument("--report", metavar="RESULTS_JSON", help="only re-make the table and plots from a saved results.json")
    sw.add_argument("--strict", action="store_true", help="exit 1 if any episode failed")
    sw.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    sw.set_defaults(func=cmd_sweep)

    ag = sub.add_parser("agents", help="the registry of researcher specs (content-addressed, in $RSIGYM_HOME/agents)")
    ag_sub = ag.add_subparsers(dest="agents_command", required=True)
    reg = ag_sub.add_parser("register", help="register a spec; prints its id")
    reg.add_argument("source", nargs="?", help="a spec JSON file, a directory of spec files (spec.json, params.toml, "
                                                "prompt.md, skills/, memory/) or a registered id to derive from")
    reg.add_argument("--from", dest="base", help="derive from a bundled researcher (scripted, llm, rl, random) or an id")
    reg.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a parameter (TOML value)")
    reg.add_argument("--name", help="the spec's name")
    reg.add_argument("--model", help="the model (LLM researchers)")
    reg.add_argument("--prompt-file", help="system prompt from this file")
    reg.add_argument("--note", default="", help="a note kept with the registration (not part of the content)")
    reg.set_defaults(func=cmd_agents_register)
    ls = ag_sub.add_parser("list", help="list registered specs")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_agents_list)
    show = ag_sub.add_parser("show", help="show a spec (JSON, or its files)")
    show.add_argument("agent")
    show.add_argument("--files", action="store_true", help="print the files view")
    show.set_defaults(func=cmd_agents_show)
    diff = ag_sub.add_parser("diff", help="unified diff of two specs' files")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.set_defaults(func=cmd_agents_diff)

    rec = sub.add_parser("recurse", help="rounds of researcher improvement on a recursive scenario; improver gain, compounding",
                         description="Each round runs the improver on the recursive scenario whose target is the current "
                                     "researcher; the submitted spec is registered and becomes the next round's target "
                                     "(--mode target) or improver and target (--mode improver). Chains are independent per seed.")
    rec.add_argument("--scenario", default="recursive-scripted", help="a recursive scenario (default recursive-scripted)")
    rec.add_argument("--rounds", type=int, default=3)
    rec.add_argument("--seeds", type=int, default=3, help="independent chains: seeds first-seed .. first-seed+N-1")
    rec.add_argument("--first-seed", type=int, default=0)
    rec.add_argument("--improver", default="scripted", help="registered id or bundled name (default scripted)")
    rec.add_argument("--target", help="registered id or bundled name (default: the scenario's)")
    rec.add_argument("--mode", choices=["target", "improver"], default="target")
    rec.add_argument("--ray", action="store_true", help="run the measuring episodes as Ray tasks")
    rec.add_argument("--out", help="directory for recursion.json and recursion.md (default runs/recursion-<timestamp>)")
    rec.add_argument("-q", "--quiet", action="store_true")
    rec.set_defaults(func=cmd_recurse)
    # any agent as the researcher: serve, skills, export (rsigym_env.gateway), mcp, openenv
    from .gateway import cli as gateway_cli, mcp_server, openenv_server

    gateway_cli.register(sub)
    from .watch import cli as watch_cli

    watch_cli.register(sub)
    mcp_server.register(sub)
    openenv_server.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    if not console.is_terminal:  # piped or captured: do not cut tables at 80 columns
        console = Console(width=160)
    return int(args.func(args, console))


if __name__ == "__main__":
    sys.exit(main())
