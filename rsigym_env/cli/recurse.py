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

    def on_round(row: dict[str, Any]) -> None:
        if not args.quiet:
            console.print(f"seed {row['seed']} round {row['round']} ({row['selection']}): parent {row['target']} -> "
                          f"{row['improved']}; {row['accepted']} accepted of {len(row['screened'])} screened, "
                          f"{row['candidates']} candidates; test index {row['index_before']:+.4f} -> "
                          f"{row['index_after']:+.4f} (gain {row['improver_gain']:+.4f}; {row['dev_evaluations']} "
                          f"dev evaluations, ${row['spend_usd']:,.0f})", highlight=False)

    def on_progress(text: str) -> None:
        if not args.quiet:
            console.print(f"[dim]{text}[/]", highlight=False)

    started = time.perf_counter()
    try:
        settings = Settings(selection=args.select, accept_low=args.accept_low, validate_top=args.validate_top,
                            imp_k=args.imp_k, imp_runs=args.imp_runs, imp_generations=args.imp_generations,
                            transfer_local=args.transfer_local, recombine=args.recombine)
        archive = Archive(name=args.archive or f"recursion-{stamp}")
        result = recurse(scenario, rounds=args.rounds, seeds=seeds, improver=args.improver, target=args.target,
                         mode=args.mode, ray=args.ray or None, on_round=on_round, archive=archive, settings=settings,
                         on_progress=on_progress)
    except (ValueError, KeyError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
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
    rec.add_argument("--archive", help="archive name under $RSIGYM_HOME/archives (default recursion-<timestamp>)")
    rec.add_argument("--out", help="directory for recursion.json and recursion.md (default runs/recursion-<timestamp>)")
    rec.add_argument("-q", "--quiet", action="store_true")
    rec.set_defaults(func=cmd_recurse)
