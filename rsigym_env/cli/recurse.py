"""``rsigym recurse``: rounds of researcher improvement on a recursive scenario."""

from __future__ import annotations

import argparse
import shlex
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from ..scenario import load_scenario


def cmd_recurse(args: argparse.Namespace, console: Console) -> int:
    from ..archive import Archive
    from ..worlds.recursive import Settings, markdown, plot, recurse, to_json

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
               *(["--improver", args.improver] if args.improver else []), "--mode", args.mode, "--out", str(out)]
    command += (["--first-seed", str(args.first_seed)] if args.first_seed else []) + (["--target", args.target] if args.target else [])
    command += ["--ray"] if args.ray else []
    command += (["--select", args.select] if args.select else []) + (["--imp-k", str(args.imp_k)] if args.imp_k != 1 else [])
    command += (["--imp-runs", str(args.imp_runs)] if args.imp_runs != 3 else [])
    command += (["--imp-generations", args.imp_generations] if args.imp_generations != "ends" else [])
    command += (["--accept-low", str(args.accept_low)] if args.accept_low else [])
    command += (["--transfer-local", str(args.transfer_local)] if args.transfer_local else [])
    command += (["--archive", args.archive] if args.archive else [])
    outside = bool(args.serve or args.improver_command)
    if outside:
        if args.improver or args.mode != "target":
            console.print("[red]error:[/] --serve / --improver-command make an outside agent the improver: "
                          "give neither --improver nor --mode improver with them")
            return 2
        if args.improver_timeout <= 0:
            console.print("[red]error:[/] --improver-timeout must be a positive number of seconds")
            return 2
        command += (["--improver-command", args.improver_command] if args.improver_command else ["--serve"])
        command += ["--improver-timeout", f"{args.improver_timeout:g}"] + (["--port", str(args.port)] if args.port else [])

    def on_round(row: dict[str, Any]) -> None:
        if not args.quiet:
            console.print(f"seed {row['seed']} round {row['round']} ({row['selection']}): parent {row['target']} -> "
                          f"{row['improved']}; {row['accepted']} accepted of {len(row['screened'])} screened, "
                          f"{row['candidates']} candidates; test index {row['index_before']:+.4f} -> "
                          f"{row['index_after']:+.4f} (gain {row['improver_gain']:+.4f}; {row['dev_evaluations']} "
                          f"dev evaluations, ${row['spend_usd']:,.0f})", highlight=False)
            for edit in row.get("self_edits") or []:  # edits of the improver's own procedure, by metaproductivity
                console.print(f"  improver edit {edit['what']}: metaproductive gain {edit['gain']:+.4f} "
                              f"[{edit['low']:+.4f}, {edit['high']:+.4f}] on validation, "
                              f"{'accepted' if edit['accepted'] else 'rejected'}", highlight=False)

    def on_progress(text: str) -> None:
        if not args.quiet:
            console.print(f"[dim]{text}[/]", highlight=False)

    def on_session(session: Any) -> None:  # even with --quiet: whoever drives the session needs this line
        console.print(session.announce(), highlight=False, markup=False, soft_wrap=True)

    started = time.perf_counter()
    improver: Any = args.improver
    if outside:
        from ..gateway.recursion import AgentImprover, command_agent

        agent = command_agent(args.improver_command, timeout_s=args.improver_timeout) if args.improver_command else None
        try:
            improver = AgentImprover(agent, label="command" if agent else "served", timeout_s=args.improver_timeout,
                                     port=args.port, on_session=on_session).start()
        except (OSError, RuntimeError, ValueError) as exc:
            console.print(f"[red]error:[/] the improver's session service could not start: {exc}")
            return 2
        console.print(f"improver sessions served at {improver.url} (MCP {improver.url}/mcp, REST {improver.url}/v1); "
                      "one session per round, each with its own run key", highlight=False)
    try:
        settings = Settings(selection=args.select, accept_low=args.accept_low, validate_top=args.validate_top,
                            imp_k=args.imp_k, imp_runs=args.imp_runs, imp_generations=args.imp_generations,
                            transfer_local=args.transfer_local, recombine=args.recombine)
        archive = Archive(name=args.archive or f"recursion-{stamp}")
        result = recurse(scenario, rounds=args.rounds, seeds=seeds, improver=improver, target=args.target,
                         mode=args.mode, ray=args.ray or None, on_round=on_round, archive=archive, settings=settings,
                         on_progress=on_progress)
    except (ValueError, KeyError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    except (TimeoutError, RuntimeError) as exc:
        from ..gateway.recursion import AgentFailed

        if not isinstance(exc, (TimeoutError, AgentFailed)):
            raise
        console.print(f"[red]error:[/] {exc}", highlight=False)
        return 3
    finally:
        if outside:
            improver.close()
    result["config"]["command"] = shlex.join(command)
    result["config"]["wall_s"] = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    (out / "recursion.json").write_text(to_json(result))
    text = markdown(result, shlex.join(command))
    (out / "recursion.md").write_text(text)
    png = plot(result, out / "recursion.png")
    console.print(text, markup=False, highlight=False)
    console.print(f"{out / 'recursion.json'}, {out / 'recursion.md'}{', ' + str(png) if png else ''} "
                  f"({result['config']['wall_s']:.1f} s); archives: {', '.join(result['config']['archives'])} "
                  f"(rsigym archive tree --archive NAME)")
    return 0


def register(sub: Any) -> None:
    """Add this module's command(s) to ``rsigym``'s subparsers."""
    rec = sub.add_parser("recurse", help="rounds of researcher improvement on a recursive scenario; improver gain, compounding",
                         description="Each round runs the improver on the recursive scenario whose target is the current "
                                     "researcher; the submitted spec is registered and becomes the next round's target "
                                     "(--mode target) or improver and target (--mode improver). Chains are independent per seed.")
    rec.add_argument("--scenario", default="recursive-scripted", help="a recursive scenario (default recursive-scripted)")
    rec.add_argument("--rounds", type=int, default=3)
    rec.add_argument("--seeds", type=int, default=3, help="independent chains: seeds first-seed .. first-seed+N-1")
    rec.add_argument("--first-seed", type=int, default=0)
    rec.add_argument("--improver", default=None, help="registered id or bundled name (default: the target, i.e. the "
                                                      "scenario's researcher improves it; e.g. program or scripted)")
    rec.add_argument("--target", help="registered id or bundled name (default: the scenario's)")
    rec.add_argument("--mode", choices=["target", "improver"], default="target")
    rec.add_argument("--ray", action="store_true", help="run the measuring episodes as Ray tasks")
    rec.add_argument("--select", choices=["greedy", "dgm", "thompson", "sica", "metaproductive"],
                     help="parent selection rule (default: the improver's own IMPROVER['parent_selection'], else greedy)")
    rec.add_argument("--accept-low", type=float, default=0.0,
                     help="accept a candidate when the 95%% lower bound of its paired validation gain is above this (default 0)")
    rec.add_argument("--validate-top", type=int, default=None,
                     help="candidates the improver fully evaluated (best on train first) validated besides the submitted "
                          "one (default: the improver's IMPROVER['validate_top'], else 2)")
    rec.add_argument("--recombine", choices=["none", "accepted", "positive"], default=None,
                     help="merge a round's validated candidates (accepted ones, or every one with a positive paired "
                          "validation gain) into one more candidate (default: the improver's IMPROVER['recombine'], else none)")
    rec.add_argument("--imp-k", type=int, default=1,
                     help="rounds of each fresh-target run for imp@k, the improver's own compounding (0: skip; default 1)")
    rec.add_argument("--imp-runs", type=int, default=3,
                     help="fresh-target runs (new outer seeds, the same for every improver) per improver for imp@k (default 3)")
    rec.add_argument("--imp-generations", choices=["ends", "all"], default="ends",
                     help="whose improvers imp@k measures: generation 0 and the last (default), or every generation")
    rec.add_argument("--transfer-local", type=int, default=0,
                     help="local-world episodes (benchmarks) per researcher in the final-vs-original comparison (default 0)")
    outside = rec.add_argument_group(
        "an outside agent as the improver", "Each round's outer episode (the improver improving the selected parent) "
        "is a session of a session service served on loopback over MCP (<url>/mcp) and REST (<url>/v1), with a run "
        "key of its own; the round waits for its submit, then judges it as any improver's (docs/recursion.md, "
        "'Your agent as the improver'). The agent sees train (dev) evaluations and its submission's validation "
        "score only; never a test task.")
    outside.add_argument("--serve", action="store_true",
                         help="print each round's MCP URL and run key and wait for whoever connects to submit")
    outside.add_argument("--improver-command", metavar="CMD",
                         help="run this shell command once per round, with RSIGYM_MCP_URL, RSIGYM_REST_URL, "
                              "RSIGYM_RUN_KEY and RSIGYM_MCP_CONFIG (an MCP client config file) in its environment, "
                              "under bubblewrap ($RSIGYM_HOME hidden, this package read-only, its own PID namespace), "
                              "e.g. 'claude -p \"Improve the researcher; submit\" --mcp-config \"$RSIGYM_MCP_CONFIG\"'")
    outside.add_argument("--improver-timeout", type=float, default=3600.0,
                         help="seconds one round's session may take before it is closed and recurse stops (default 3600)")
    outside.add_argument("--port", type=int, default=0, help="port of the sessions' service on 127.0.0.1 (default: a free one)")
    rec.add_argument("--archive", help="archive name under $RSIGYM_HOME/archives (default recursion-<timestamp>)")
    rec.add_argument("--out", help="directory for recursion.json and recursion.md (default runs/recursion-<timestamp>)")
    rec.add_argument("-q", "--quiet", action="store_true")
    rec.set_defaults(func=cmd_recurse)
