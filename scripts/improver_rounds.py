#!/usr/bin/env python3
"""How good is one round of an improver procedure, judged on validation only (never test).

From the seed program, one outer episode per outer seed (``improve_once``: the improver sees train
only); then EVERY candidate it fully evaluated is measured on the validation split and compared with
the seed program task by task (paired 95 % t interval). Per round it reports the best validation gain
among the candidates a validation would accept (lower bound > 0) and the same under the old rule
(the submitted candidate plus the two best on train that beat the parent on train), so a procedure
(``IMPROVER`` genes, given as ``improve_<gene>`` parameters) and a validation rule are chosen without
looking at test.

    python scripts/improver_rounds.py --seeds 7001,7002,7003,7004,7005,7006
    python scripts/improver_rounds.py --seeds 7001,7002,7003 --set cover_screen=true   # cover, 4-task screens first
    python scripts/improver_rounds.py --seeds 7001,7002 --set proposal=random --set select=root
    python scripts/improver_rounds.py --target ag-b251c661 --improver ag-b251c661 --seeds 20001   # a later round, its own improver
    python scripts/improver_rounds.py --target ag-b251c661 --improver program --seeds 20001       # ... this code's improver

Outer seeds 7001.. are used by no chain of ``rsigym recurse`` (chains use seed*1000 + round) and no
imp@k run (9000..). Prints one JSON line per round and a summary line.
"""

from __future__ import annotations

import argparse
import json
import time

import rsigym_env  # noqa: F401  (installs the recursive world's researchers)
from rsigym_env.agents import seed_program, spec_from_ref
from rsigym_env.metrics import ci95, paired_gain
from rsigym_env.scenario import load_scenario
from rsigym_env.worlds.recursive.measure import measure
from rsigym_env.worlds.recursive.ports import researchers
from rsigym_env.worlds.recursive.rounds import improve_once
from rsigym_env.worlds.recursive.world import RecursiveOptions


def _value(text: str) -> object:
    """A ``--set`` value: JSON when it parses (numbers, true/false), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="recursive-scripted")
    ap.add_argument("--seeds", default="7001,7002,7003,7004,7005,7006", help="outer seeds, comma-separated")
    ap.add_argument("--set", action="append", default=[], metavar="GENE=VALUE", help="an IMPROVER gene of the improver")
    ap.add_argument("--target", default=None, help="the program improved (id, prefix or bundled name); default: the seed")
    ap.add_argument("--improver", default=None, help="the improver spec; default: the target itself (--mode improver)")
    args = ap.parse_args()
    params = {f"improve_{k}": _value(v) for k, v in (s.split("=", 1) for s in args.set)}
    scen = load_scenario(args.scenario)
    opts = RecursiveOptions.model_validate(scen.world_options)
    using = researchers()
    target = spec_from_ref(args.target) if args.target else seed_program()
    improver = spec_from_ref(args.improver) if args.improver else target
    improver = improver.derive(params=params) if params else improver
    started = time.time()
    base = measure(target, opts, "official", scen.official_k, using=using)
    best_all, best_old = [], []
    for seed in [int(s) for s in args.seeds.split(",")]:
        out = improve_once(scen, opts, improver, target, seed, using)
        parent_train = out.parent_train.index if out.parent_train is not None else None
        rows = []
        for spec, m, note in out.candidates:
            gain = paired_gain(measure(spec, opts, "official", scen.official_k, using=using).task_values(),
                               base.task_values())
            rows.append({"train_gain": None if parent_train is None else m.index - parent_train, "val": gain["mean"],
                         "low": gain["low"], "submitted": spec.id == out.submitted.id, "note": note[:80]})
        old = sorted([r for r in rows if not r["submitted"] and (r["train_gain"] or 0) > 0],
                     key=lambda r: -r["train_gain"])[:2]
        best_all.append(max([r["val"] for r in rows if r["low"] > 0], default=0.0))
        best_old.append(max([r["val"] for r in rows if (r["submitted"] or r in old) and r["low"] > 0], default=0.0))
        print(json.dumps({"seed": seed, "dev_evaluations": out.dev_evaluations, "spend_usd": round(out.spend_usd),
                          "candidates": rows}), flush=True)
    a, o = ci95(best_all), ci95(best_old)
    print(json.dumps({"target": target.id, "improver": improver.id, "params": params, "rounds": len(best_all), "wall_s": round(time.time() - started),
                      "best_accepted_validate_all": [a["mean"], a["se"]], "best_accepted_old_rule": [o["mean"], o["se"]],
                      "per_round": [round(v, 4) for v in best_all]}), flush=True)


if __name__ == "__main__":
    main()
