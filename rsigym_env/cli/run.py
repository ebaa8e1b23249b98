"""``rsigym run``: one research episode, with a progress bar, a step log, a result table and files.

``cmd_run`` is its steps in order, each a function here: :func:`scenario_of` (the scenario: bundled,
from a YAML file, or a tape's), :func:`settle_agent_and_seed`, :func:`make_run_dir`,
:func:`build_env` (the env, its world recorded or replayed, watched by ``rsigym watch``),
:func:`choose_researcher`, :func:`run_with_progress`, :func:`write_outputs` and :func:`print_result`.

>>> from rsigym_env.cli import build_parser
>>> args = build_parser().parse_args(["run", "--benchmark", "aime", "--budget", "50"])
>>> args.func is cmd_run, scenario_of(args).name, env_id("harness")
(True, 'sim-joint-aime-50', 'RSIGym/Harness-v0')
>>> settle_agent_and_seed(args); args.agent, args.seed
('scripted', 0)
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..baselines import RESEARCHERS, make_researcher
from ..catalog import env_id
from ..episode import EpisodeResult, Researcher, run_episode
from ..scenario import Scenario, add_scenario_arguments, load_scenario


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """Run one episode and print its result; 2 on a bad scenario, agent or tape (nothing is run)."""
    try:
        scenario = scenario_of(args)
        if getattr(args, "dry_run", False):
            return cmd_dry_run(scenario, console)
        settle_agent_and_seed(args)
    except (ValueError, KeyError, OSError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    run_dir = make_run_dir(args, scenario)
    env, tape = build_env(args, scenario, run_dir)
    try:
        researcher = choose_researcher(args, run_dir, scenario)
    except (ValueError, KeyError) as exc:
        env.close()
        console.print(f"[red]error:[/] {exc}")
        return 2
    result, wall = run_with_progress(env, researcher, args, scenario, run_dir, console)
    write_outputs(result, wall, args, run_dir)
    print_result(result, wall, args, run_dir, console, diverged=tape is not None and tape.diverged)
    return 0


def scenario_of(args: argparse.Namespace) -> Scenario:
    """The run's scenario: with ``--replay`` the tape's (and its researcher and seed unless given
    again), else the bundled or YAML scenario with the command line's overrides."""
    if not args.replay:
        return load_scenario(args.scenario, track=args.track, world=args.world, benchmark=args.benchmark,
                             budget_usd=args.budget, max_steps=args.max_steps)
    from ..replay import tape_header

    header = tape_header(args.replay)
    scenario = Scenario.model_validate(header["scenario"])
    tape_meta = header.get("meta", {})
    args.agent = args.agent or tape_meta.get("agent") or "scripted"
    args.seed = args.seed if args.seed is not None else tape_meta.get("reset_seed", 0)
    return scenario


def settle_agent_and_seed(args: argparse.Namespace) -> None:
    """Default ``--agent`` (scripted) and ``--seed`` (0); ``program`` (the seed program) becomes its
    registered id; an agent that is neither bundled nor a registered id (``ag-...``) is a ``ValueError``."""
    args.agent = args.agent or "scripted"
    args.seed = 0 if args.seed is None else args.seed
    if args.agent == "program":  # the bundled seed program: registered, then run as any registered spec
        from ..agents import AgentRegistry, seed_program

        args.agent = AgentRegistry().register(seed_program(), note="bundled")
    if args.agent not in RESEARCHERS and not args.agent.startswith("ag-"):
        raise ValueError(f"unknown agent {args.agent!r}; bundled: {', '.join(sorted(RESEARCHERS))}, "
                         "or a registered id 'ag-...' (rsigym agents list)")


def make_run_dir(args: argparse.Namespace, scenario: Scenario) -> Path:
    """``--run-dir``, or ``runs/<time>-<scenario>-<agent>-s<seed>``; created."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.run_dir or Path("runs") / f"{stamp}-{scenario.name}-{args.agent}-s{args.seed}")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def build_env(args: argparse.Namespace, scenario: Scenario, run_dir: Path) -> tuple[gym.Env, Any]:
    """The episode's env with its ledger in ``run_dir``; its world recorded to ``--record`` or replayed
    from ``--replay`` (the :class:`~rsigym_env.replay.TapeWrapper`, returned too; else ``None``), and
    the whole run written for ``rsigym watch`` as it goes."""
    from ..watch.record import RunRecorder

    env = gym.make(env_id(scenario.track), scenario=scenario, ledger_path=run_dir / "ledger.sqlite", run_dir=run_dir)
    tape = None
    if args.record or args.replay:
        from ..replay import TapeWrapper

        env = tape = TapeWrapper(env, record=args.record, replay=args.replay, meta={"agent": args.agent})
    env = RunRecorder(env, run_dir, researcher=args.agent, surface="rsigym run")  # what `rsigym watch` shows, live
    return env, tape


def run_with_progress(env: gym.Env, researcher: Researcher, args: argparse.Namespace, scenario: Scenario,
                      run_dir: Path, console: Console) -> tuple[EpisodeResult, float]:
    """Run the episode with a progress bar and a line per step (``-q``: none; ``-v``: every full
    observation), each step also appended to ``run_dir/steps.jsonl``; closes ``env``. Returns the
    result and the wall time in seconds."""
    with (run_dir / "steps.jsonl").open("w") as steps_log:
        console.print(f"[bold]{scenario.name}[/]: {args.agent} researcher, seed {args.seed}, "
                      f"budget ${scenario.budget_usd:g}, {scenario.time_limit_h:g} h, run dir {run_dir}")
        started = time.perf_counter()
        with Progress(TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[status]}", markup=False), TimeElapsedColumn(), console=console,
                      disable=args.quiet, transient=False) as progress:
            task = progress.add_task("steps", total=scenario.max_steps, status="")

            def on_step(step: int, action: Any, obs: dict[str, Any], info: dict[str, Any]) -> None:
                progress.update(task, completed=step, status=_status(scenario, obs, info))
                if args.verbose:
                    console.print(obs["log"], markup=False, highlight=False)
                elif not args.quiet:
                    for line in _story(step, obs, info, console.width):
                        progress.console.print(line, markup=False, highlight=False)
                steps_log.write(json.dumps({"step": step, "action": action, "info": info}, default=str) + "\n")

            result = run_episode(env, researcher, seed=args.seed, on_step=on_step)
            progress.update(task, total=result.steps)
    env.close()
    return result, time.perf_counter() - started


def _status(scenario: Scenario, obs: dict[str, Any], info: dict[str, Any]) -> str:
    """The progress bar's status: spend, best dev score, the last call (and the dev scores it got)."""
    spent = scenario.budget_usd - float(obs["budget_left_usd"][0])
    best = float(obs["dev_scores"][1])
    what = info.get("tool", "?") + ("" if info.get("ok") else f" ✗ {info.get('error')}")
    for event in info.get("events", []):
        if event.get("kind") == "evaluate" and event.get("ok"):
            what += f" | dev {event['score']:.3f}"
    return f"${spent:,.2f} spent · best dev {'-' if best < 0 else f'{best:.3f}'} · {what}"


def _story(step: int, obs: dict[str, Any], info: dict[str, Any], width: int) -> list[str]:
    """A step's lines: the call's result line, then one per job that finished, cut to ``width``."""
    lines = obs["log"].split("\n")
    story = [lines[1] if len(lines) > 1 else ""] + [e["text"] for e in info.get("events", [])]
    return [(f"{step:>3} {info.get('tool', '?'):<15}" if i == 0 else " " * 20) + _cut(line, width - 21)
            for i, line in enumerate(story)]


def write_outputs(result: EpisodeResult, wall: float, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """``run_dir/result.json`` (and ``--json``): the result with the wall time, run dir and ledger path."""
    payload = result.to_dict() | {"wall_seconds": wall, "run_dir": str(run_dir), "ledger": str(run_dir / "ledger.sqlite")}
    (run_dir / "result.json").write_text(json.dumps(payload, indent=2, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str))
    return payload


def print_result(result: EpisodeResult, wall: float, args: argparse.Namespace, run_dir: Path, console: Console,
                 *, diverged: bool = False) -> None:
    """The result table, how to verify the audit log, the tape, and whether a replay departed from it."""
    ledger = run_dir / "ledger.sqlite"
    console.print(summary_table(result, wall))
    console.print(f"audit log: rsigym audit verify {ledger}")
    if args.record:
        console.print(f"tape: {args.record} (replay: rsigym run --replay {args.record})")
    if diverged:
        console.print("[yellow]the run departed from the recording (some requests were not on the tape)[/]")


def cmd_dry_run(scenario: Any, console: Console) -> int:
    """Check credentials, scenario, prices and dataset references without spending; 1 if anything is missing."""
    from ..worlds.remote.dryrun import all_ok, render, run_checks

    checks = run_checks(scenario)
    console.print(render(checks))
    bad = [c.name for c in checks if c.status in ("missing", "fail")]
    console.print("[green]ready: nothing is missing[/]" if not bad else f"[red]not ready:[/] {', '.join(bad)}")
    return 0 if all_ok(checks) else 1


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 10)] + "…"


def choose_researcher(args: argparse.Namespace, run_dir: Path, scenario: Scenario | None = None) -> Researcher:
    """The ``--agent``; an LLM researcher takes its endpoint options and writes its transcript to the run dir;
    a program runs within the ``program_limits`` of ``scenario``."""
    if args.agent.startswith("ag-"):  # a registered researcher spec
        from ..agents import AgentRegistry, build_researcher

        spec = AgentRegistry().get(args.agent)
        extra: dict[str, Any] = {}
        if spec.kind == "llm":
            extra = {"transcript": str(run_dir / "transcript.jsonl")} | {
                f: getattr(args, f"llm_{f}") for f in ("model", "base_url", "api_key") if getattr(args, f"llm_{f}")}
        return build_researcher(spec, scenario=scenario, **extra)
    if args.agent != "llm":
        return make_researcher(args.agent)
    from ..baselines import LLMArgs, LLMResearcher

    llm = LLMArgs(transcript=str(run_dir / "transcript.jsonl"))
    for field in ("model", "base_url", "api_key"):
        if getattr(args, f"llm_{field}"):
            setattr(llm, field, getattr(args, f"llm_{field}"))
    if args.llm_context:
        llm.context_tokens = args.llm_context
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


def register(sub: Any) -> None:
    """Add ``run`` to ``rsigym``'s subparsers."""
    run = sub.add_parser("run", help="run one research episode and print its result")
    add_scenario_arguments(run)
    run.add_argument("--agent", help=f"researcher: {', '.join(sorted(RESEARCHERS))}, program (the seed program, sandboxed) or a registered id 'ag-...' "
                                      "(default: scripted; with --replay: the recorded one)")
    run.add_argument("--seed", type=int, help="reset seed (default 0; with --replay: the recorded one)")
    run.add_argument("--record", metavar="PATH", help="record every service request/response and clock reading to this tape")
    run.add_argument("--replay", metavar="PATH", help="replay a tape: its scenario, researcher and seed, served from the "
                                                     "recording (a request it never recorded is refused)")
    run.add_argument("--llm-model", help="--agent llm: model name (default: $RSIGYM_LLM_MODEL)")
    run.add_argument("--llm-base-url", help="--agent llm: OpenAI-compatible base URL (default: $OPENAI_BASE_URL)")
    run.add_argument("--llm-api-key", help="--agent llm: API key (default: $OPENAI_API_KEY)")
    run.add_argument("--llm-context", type=int, metavar="TOKENS",
                     help="--agent llm: the server's context size, checked against the fixed prompt before the "
                          "first call (default: $RSIGYM_LLM_CONTEXT)")
    run.add_argument("--json", metavar="PATH", help="also write the result as JSON here")
    run.add_argument("--run-dir", help="where to keep the ledger, audit log and step log (default: runs/...)")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no per-step lines")
    run.add_argument("-v", "--verbose", action="store_true", help="print every observation's full log")
    run.add_argument("--dry-run", action="store_true", help="check credentials, scenario, prices and dataset "
                                                            "references without spending; exit 1 if anything is missing")
    run.set_defaults(func=cmd_run)
