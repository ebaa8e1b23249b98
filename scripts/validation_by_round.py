#!/usr/bin/env python3
"""Validation only: per archive (a chain of ``rsigym recurse``) and round, what was validated and accepted.

For every node a round produced (successors, operator ``memory``, left out) its paired validation gain over
its parent (95 % t interval) and its status; prints the best four and every accepted one per round. Reads no
test score, so an improver procedure can be chosen on it.

    RSIGYM_HOME=... python scripts/validation_by_round.py val-new-chain20 val-old-chain20
"""

from __future__ import annotations

import argparse

from rsigym_env.archive import Archive
from rsigym_env.metrics import paired_gain


def rows(archive: Archive) -> dict[int, list[tuple[float, float, str, str]]]:
    """``{round: [(mean, low, status, operator), ...]}``, best validation gain first."""
    nodes = {n.id: n for n in archive.nodes()}
    out: dict[int, list[tuple[float, float, str, str]]] = {}
    for n in nodes.values():
        parent = nodes.get(n.parent) if n.parent else None
        rnd, op = n.produced_by.get("round"), str(n.produced_by.get("operator", ""))
        if rnd is None or op == "memory" or parent is None or "validation" not in n.scores \
                or "validation" not in parent.scores:
            continue
        g = paired_gain(n.scores["validation"].values, parent.scores["validation"].values)
        out.setdefault(int(rnd), []).append((g["mean"], g["low"], n.status, op))
    return {r: sorted(v, reverse=True) for r, v in sorted(out.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("archives", nargs="+", help="archive names under $RSIGYM_HOME/archives")
    args = ap.parse_args()
    for name in args.archives:
        print("==", name)
        for rnd, got in rows(Archive(None, name)).items():
            accepted = [x for x in got if x[2] == "accepted"]
            print(f" round {rnd}: {len(got)} validated, {len(accepted)} accepted")
            for mean, low, status, op in got[:4] + [x for x in accepted if x not in got[:4]]:
                print(f"   {mean:+.4f} (95% low {low:+.4f}) {status:9s} {op[:90]}")


if __name__ == "__main__":
    main()
