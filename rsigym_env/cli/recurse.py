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
    from ..worlds.recursive import markdown, recurse, to_json

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
    rec.add_argument("--improver", default="scripted", help="registered id or bundled name (default scripted)")
    rec.add_argument("--target", help="registered id or bundled name (default: the scenario's)")
    rec.add_argument("--mode", choices=["target", "improver"], default="target")
    rec.add_argument("--ray", action="store_true", help="run the measuring episodes as Ray tasks")
    rec.add_argument("--out", help="directory for recursion.json and recursion.md (default runs/recursion-<timestamp>)")
    rec.add_argument("-q", "--quiet", action="store_true")
    rec.set_defaults(func=cmd_recurse)
