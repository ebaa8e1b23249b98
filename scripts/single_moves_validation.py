#!/usr/bin/env python3
"""Every single move of a researcher program, measured on validation against it (never test).

Enumerates the moves the cover improver would make from ``REF`` (``single_moves``, the seed improver's
``IMPROVER["step"]``), measures each resulting program on the scenario's validation split (avg@
``official_k``, cached) and compares it with ``REF`` task by task (paired 95 % t interval). Shows which
moves a validation would accept and where the cover order puts them given ``REF``'s memory: whether a
round that finds nothing had nothing to find or did not reach it.

    RSIGYM_HOME=... python scripts/single_moves_validation.py ag-b251c6617987f853 [--scenario recursive-scripted]
    RSIGYM_HOME=... python scripts/single_moves_validation.py program --code     # its code moves (code_moves)

Prints one JSON line per move (``move``, ``mean``, ``low``, ``high``, ``cover_position``) and a summary line.
"""

from __future__ import annotations

import argparse
import json
import time

import rsigym_env  # noqa: F401  (installs the recursive world's researchers)
from rsigym_env.agents import AgentSpec, spec_from_ref
from rsigym_env.metrics import paired_gain
from rsigym_env.programs.seed.improver import (IMPROVER, MEMORY, Program, base_tag, code_moves, cover_order, read_memory,
                                               single_moves)
from rsigym_env.scenario import load_scenario
from rsigym_env.worlds.recursive.measure import measure
from rsigym_env.worlds.recursive.ports import researchers
from rsigym_env.worlds.recursive.world import RecursiveOptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref", help="a registered program spec (id or prefix) or a bundled name (program)")
    ap.add_argument("--scenario", default="recursive-scripted")
    ap.add_argument("--code", action="store_true", help="the code moves of its plan's phases (code_moves) instead")
    args = ap.parse_args()
    scen = load_scenario(args.scenario)
    opts = RecursiveOptions.model_validate(scen.world_options)
    using = researchers()
    base = spec_from_ref(args.ref)
    if base.kind != "program":
        raise SystemExit(f"{args.ref}: a program spec is needed, this one is of kind {base.kind!r}")
    started = time.time()
    files = base.to_files()
    program = Program(files)
    moves = single_moves(program, IMPROVER["step"])
    if args.code:
        moves = [(key, dict(program.genome, CODE=text), what) for key, text, what in code_moves(
            files["code/researcher.py"], list(program.genome.get("PHASES") or []), IMPROVER["code_guard"],
            tuple(IMPROVER["code_scale"]))]
    order = [key for key, _, _ in cover_order(moves, read_memory(files.get(MEMORY)), on=base_tag(program.genome),
                                          genes=program.genome.get("STRATEGY"))]
    base_m = measure(base, opts, "official", scen.official_k, using=using)
    rows = []
    for key, genome, lineage in moves:
        spec = AgentSpec.from_files(program.derived(genome, lineage).files)
        gain = paired_gain(measure(spec, opts, "official", scen.official_k, using=using).task_values(),
                           base_m.task_values())
        rows.append({"move": key, "mean": gain["mean"], "low": gain["low"], "high": gain["high"],
                     "cover_position": order.index(key) if key in order else None})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"base": base.id, "validation_index": base_m.index, "moves": len(rows),
                      "accepted": [r for r in rows if r["low"] > 0], "exactly_zero": sum(r["mean"] == 0 for r in rows),
                      "seconds": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
