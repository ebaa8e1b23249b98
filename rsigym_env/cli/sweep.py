"""``rsigym sweep``: agents x benchmarks x seeds as Ray tasks (or in-process), then the report."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from ..catalog import TRACKS
from ..scenario import load_scenario

if TYPE_CHECKING:
    from ..sweep import EpisodeSpec, SweepResult


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    """agents × benchmarks × seeds through Ray (or in-process with ``--local``), then the report."""
    from ..sweep import all_agents, all_benchmarks

    if args.report:
        return report_only(args, console)
    agents = all_agents() if args.agents == "all" else _split(args.agents)
    try:
        benchmarks = all_benchmarks(args.world) if args.benchmarks == "all" else _split(args.benchmarks)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    if not agents or not benchmarks or args.seeds < 1:
        console.print("[red]error:[/] need at least one agent, one benchmark and one seed")
        return 2
    specs = episode_specs(args, agents, benchmarks, console)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out or Path("runs") / f"sweep-{stamp}")
    command = command_line(args, agents, benchmarks, out)
    where = "in-process (--local)" if args.local else (f"on the Ray cluster at {args.address}" if args.address else "on a local Ray instance")
    console.print(f"[bold]sweep[/]: {len(agents)} agent(s) × {len(benchmarks)} benchmark(s) × {args.seeds} seed(s) = "
                  f"{len(specs)} episodes, {args.track} track, ${args.budget:g}, {where}; each episode has its own env, "
                  f"ledger and platform key; output {out}")
    try:
        result, failed = run_with_progress(args, specs, console)
    except Exception as exc:  # the cluster itself (not an episode) failed: nothing to report
        console.print(f"[red]error:[/] could not run the sweep: {type(exc).__name__}: {exc}")
        return 1
    write_and_print(result, failed, args, out, command, console)
    return 1 if (args.strict and failed) else 0


def report_only(args: argparse.Namespace, console: Console) -> int:
    """``--report``: re-make the table and plots of a saved results.json (next to it, or in ``--out``)."""
    from ..report import print_report, write_report
    from ..sweep import load_results

    data = load_results(args.report)
    out = Path(args.out) if args.out else Path(args.report).parent
    print_report(data, console)
    paths = write_report(data, out)
    console.print("report: " + ", ".join(str(p) for p in paths.values()))
    return 0


def episode_specs(args: argparse.Namespace, agents: list[str], benchmarks: list[str], console: Console) -> list[EpisodeSpec]:
    """The grid's episodes; a registered researcher (``ag-...``) travels with its spec (workers need no
    registry). An unknown agent is warned about; its episodes are reported as failed. Sets the world's
    default ``args.budget`` when none was given."""
    from ..sweep import all_agents, make_grid

    known = set(all_agents())
    registered: dict[str, Any] = {}
    for name in agents:
        if name == "program":  # the bundled seed program travels with its spec, as a registered one does
            from ..agents import seed_program

            registered[name] = seed_program()
            continue
        if name.startswith("ag-"):
            from ..agents import AgentRegistry

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
    return [dataclasses.replace(s, agent=registered[s.agent].id, agent_spec=registered[s.agent].content())
            if s.agent in registered else s for s in specs]


def command_line(args: argparse.Namespace, agents: list[str], benchmarks: list[str], out: Path) -> list[str]:
    """The ``rsigym sweep`` command that makes this sweep again (kept in results.json and table.md)."""
    command = ["rsigym", "sweep", "--agents", ",".join(agents), "--benchmarks", ",".join(benchmarks) if args.benchmarks != "all" else "all",
               "--seeds", str(args.seeds), "--track", args.track, "--budget", f"{args.budget:g}", "--out", str(out)]
    command += (["--first-seed", str(args.first_seed)] if args.first_seed else []) + (["--world", args.world] if args.world != "sim" else [])
    command += (["--max-steps", str(args.max_steps)] if args.max_steps else []) + (["--chunk", str(args.chunk)] if args.chunk else [])
    command += (["--address", args.address] if args.address else []) + (["--local"] if args.local else [])
    return command


def run_with_progress(args: argparse.Namespace, specs: list[EpisodeSpec], console: Console) -> tuple[SweepResult, int]:
    """Run the episodes with a progress bar (Ray start-up, then episodes and failures so far); the
    result and how many episodes failed. Raises if the cluster itself fails."""
    from ..sweep import sweep

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

        result = sweep(specs, local=args.local, address=args.address, num_cpus=args.num_cpus, chunk=args.chunk,
                       on_done=on_done, on_ready=on_ready)
    return result, failed


def write_and_print(result: SweepResult, failed: int, args: argparse.Namespace, out: Path, command: list[str],
                    console: Console) -> None:
    """results.json and the report files in ``out``; the table, the timing and where the files are."""
    from ..report import print_report, write_report

    result.config["command"] = shlex.join(command)
    data = result.to_dict()
    result.save(out / "results.json")
    print_report(data, console)
    paths = write_report(data, out, command=result.config["command"])
    timing = result.timing
    console.print(f"{result.config['episodes']} episodes in {timing['sweep_s']:.2f} s ({timing['episodes_per_s']:.0f}/s)"
                  + (f", Ray {'connect' if args.address else 'start-up'} {timing['ray_init_s']:.1f} s"
                     f" + worker warm-up {timing.get('ray_warmup_s', 0.0):.1f} s" if "ray_init_s" in timing else "")
                  + (f", {result.config['chunk']} episodes per task" if result.config.get("chunk") else "")
                  + f"; {failed} failed")
    console.print(f"results: {out / 'results.json'}; report: " + ", ".join(str(p) for p in paths.values()))


def register(sub: Any) -> None:
    """Add this module's command(s) to ``rsigym``'s subparsers."""
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
    sw.add_argument("--track", default="joint", choices=list(TRACKS))
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
