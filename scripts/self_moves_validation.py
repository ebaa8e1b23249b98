#!/usr/bin/env python3
"""Every single edit of an improver's own procedure, judged by metaproductivity on validation (never test).

From ``REF`` (default: the seed program), each move of ``self_moves`` (the IMPROVER genes named by
``--genes``, default the improver's own ``self_genes``) is written into ``code/improver.py``; the edited
improver and ``REF``'s each run ``--runs`` short improvements of the original target (outer seeds
``META_SEED_BASE + n``: no chain, imp@k run or test uses them; at most ``--cap`` moves each) and what
each submits is compared on the validation split, paired task by task
(:func:`rsigym_env.worlds.recursive.rounds.metaproductivity`, what ``rsigym recurse --mode improver``
accepts an improver edit by). Shows which edits of the procedure produce more, so its default
``self_genes`` order is chosen without looking at test.

    RSIGYM_HOME=... python scripts/self_moves_validation.py [REF] [--runs 2] [--cap 8] [--genes step,full_k]

Prints one JSON line per edit (``move``, ``mean``, ``low``, ``high``, ``products``) and a summary line.
"""

from __future__ import annotations

import argparse
import json
import time

import rsigym_env  # noqa: F401  (installs the recursive world's researchers)
from rsigym_env.agents import AgentRegistry, seed_program, spec_from_ref
from rsigym_env.programs.seed.improver import IMPROVER, SELF, Program, self_moves
from rsigym_env.scenario import load_scenario
from rsigym_env.worlds.recursive.ports import researchers
from rsigym_env.worlds.recursive.rounds import Settings, _Context, metaproductivity
from rsigym_env.worlds.recursive.world import RecursiveOptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref", nargs="?", default=None, help="the improver program (id, prefix or bundled name); default: the seed")
    ap.add_argument("--scenario", default="recursive-scripted")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cap", type=int, default=8, help="moves per short improvement at most (0: the improver's own)")
    ap.add_argument("--genes", default=None, help="IMPROVER genes, comma-separated (default: the improver's self_genes)")
    args = ap.parse_args()
    scen = load_scenario(args.scenario)
    opts = RecursiveOptions.model_validate(scen.world_options)
    using = researchers()
    ref = spec_from_ref(args.ref) if args.ref else seed_program()
    files = ref.to_files()
    program = Program({p: t for p, t in files.items() if p in ("code/researcher.py", SELF)})
    own = program.genome.get("IMPROVER") or {}
    genes = args.genes.split(",") if args.genes else list(own.get("self_genes") or IMPROVER["self_genes"])
    ctx = _Context(scen, opts, scen.official_k, using, AgentRegistry(), Settings(), lambda _t: None)
    target = opts.spec(ctx.registry, using)
    started, results = time.time(), []
    for key, genome, what in self_moves(program, genes, float(own.get("step", IMPROVER["step"]))):
        edited = using.derived_from_files(dict(files, **{SELF: program.write(genome, what)[SELF]}), parent=ref.id)
        t = time.time()
        gain = metaproductivity(ctx, edited, ref, target, args.runs, args.cap)
        results.append((key, gain))
        print(json.dumps({"move": key, "mean": round(gain["mean"], 5), "low": round(gain["low"], 5),
                          "high": round(gain["high"], 5), "products": gain["products"], "s": round(time.time() - t, 1),
                          "load": open("/proc/loadavg").read().split()[0]}), flush=True)
    print(json.dumps({"ref": ref.id, "runs": args.runs, "cap": args.cap, "moves": len(results),
                      "accepted": [k for k, g in results if g["low"] > 0], "wall_s": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
