"""The report of a recursion run (:func:`~.rounds.recurse`): ``recursion.md`` and ``recursion.json``."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from .improver import SEARCH


def markdown(result: dict[str, Any], command: str | None = None) -> str:
    """The recursion result as Markdown: the command, a row per (seed, round), the summary."""
    cfg, s = result["config"], result["summary"]

    def ms(v: tuple) -> str:
        return "—" if v[0] is None else f"{v[0]:+.4f} ± {v[1]:.4f} (n={v[2]})"

    lines = ["# Recursion", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    o = cfg["options"]
    lines += [f"Scenario `{cfg['scenario']}`, mode `{cfg['mode']}`, {cfg['rounds']} rounds × seeds {cfg['seeds']}; "
              f"improver {cfg['improver']}, original target {cfg['target']}. Index = official RSI-Index over "
              f"{', '.join(o['official_benchmarks'])} × {o['official_seeds']} held-out seeds × avg@{cfg['official_k']} "
              f"({o['track']} track, ${o['budget_usd']:g} per episode); dev = {o['dev_seeds']} seed(s) per benchmark "
              "on " + ", ".join(o["dev_benchmarks"]) + ".", "",
              "| seed | round | target | improved | index before | index after | improver gain | best dev | dev evals | spend | params |",
              "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items() if k in SEARCH)
        best_dev = "—" if r["best_dev_score"] is None else f"{r['best_dev_score']:.4f}"
        lines.append(f"| {r['seed']} | {r['round']} | {r['target'][:11]} | {r['improved'][:11]} | {r['index_before']:+.4f} | "
                     f"{r['index_after']:+.4f} | {r['improver_gain']:+.4f} | {best_dev} | {r['dev_evaluations']} | "
                     f"${r['spend_usd']:,.0f} | {params} |")
    lines += ["", f"* original index: {s['original_index']:+.4f}",
              f"* improver gain, round 1 (mean ± s.e. over seeds): {ms(s['first_round_improver_gain'])}",
              *[f"* improver gain, round {r}: {ms(v)}" for r, v in s["improver_gain_by_round"].items() if int(r) > 1],
              f"* compounding (index after the last round − original): {ms(s['compounding_total'])}",
              f"* of which rounds 2..N: {ms(s['compounding_later_rounds'])}",
              f"* final index: {ms(s['final_index'])}", ""]
    return "\n".join(lines)


def to_json(result: dict[str, Any]) -> str:
    """The recursion result as JSON (dataclasses as dicts, anything else as text).

    >>> print(to_json({"summary": {"n": 1}}))
    {
     "summary": {
      "n": 1
     }
    }
    """
    return json.dumps(result, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
