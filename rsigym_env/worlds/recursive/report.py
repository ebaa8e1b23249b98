"""The report of a recursion run (:func:`~.rounds.recurse`): ``recursion.md``, ``recursion.json`` and plots."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any


def _ms(v: Any) -> str:
    if v is None or v[0] is None:
        return "—"
    return f"{v[0]:+.4f} ± {v[1]:.4f} (n={v[2]})"


def _ci(c: dict[str, Any] | None) -> str:
    if not c or c.get("mean") is None:
        return "—"
    low, high = c.get("low"), c.get("high")
    interval = "" if low is None or not math.isfinite(low) else f" [{low:+.4f}, {high:+.4f}]"
    return f"{c['mean']:+.4f}{interval} (n={c['n']})"



def _held_out_source(options: dict[str, Any]) -> str:
    """Where a report's validation and test seeds came from, in words."""
    if options.get("official_split", "secret") == "secret":
        return "validation and test seeds drawn from the platform's split secret (unknown to the improver)"
    return (f"public validation seeds from {options['official_first_seed']:,} and test seeds from "
            f"{options['test_first_seed']:,}")

def markdown(result: dict[str, Any], command: str | None = None) -> str:
    """The recursion result as Markdown: the command, a row per (seed, round), imp@k, transfer, the summary."""
    cfg, s = result["config"], result["summary"]
    lines = ["# Recursion", ""]
    if command:
        lines += ["```bash", command, "```", ""]
    o = cfg["options"]
    lines += [f"Scenario `{cfg['scenario']}`, mode `{cfg['mode']}`, {cfg['rounds']} rounds × seeds {cfg['seeds']}; "
              f"improver {cfg['improver']}, original target {cfg['target']}. Splits: **train** = {o['dev_seeds']} new "
              f"seed(s) per benchmark each round on {', '.join(o['dev_benchmarks'])} (what the improver sees, per "
              f"episode); **validation** = {o['official_seeds']} seeds per benchmark, the same for every candidate, × avg@{cfg['official_k']} "
              "(selection and acceptance; the improver sees only its episode's reward); **test** = "
              f"{o['test_seeds']} seeds per benchmark (reported only), {_held_out_source(o)}. "
              f"Index = test RSI-Index ({o['track']} track, ${o['budget_usd']:g} per episode). Archives: {', '.join('`' + a + '`' for a in cfg.get('archives', []))}.",
              "",
              "| seed | round | rule | parent | submitted | accepted / screened / novel / candidates | chain test index before → after | gain | dev evals | spend |",
              "|---:|---:|---|---|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['seed']} | {r['round']} | {r.get('selection', '')} | {r['target'][:11]} | {r.get('submitted', '')[:11]} | "
                     f"{r.get('accepted', 0)} / {len(r.get('screened', []))} / {r.get('novel', 0)} / {r.get('candidates', 0)} | "
                     f"{r['index_before']:+.4f} → {r['index_after']:+.4f} | {r['improver_gain']:+.4f} | "
                     f"{r['dev_evaluations']} | ${r['spend_usd']:,.0f} |")
    lines += ["", "## Improver gain per round (test, 95 % t intervals over chains)", "",
              "| round | gain |", "|---:|---:|"]
    for rnd, c in s.get("improver_gain_by_round_ci95", {}).items():
        lines.append(f"| {rnd} | {_ci(c)} |")
    if s.get("imp_at_k"):
        lines += ["", "## imp@k: what each generation's frozen improver achieves on a fresh target (test gain)", "",
                  "| generation | imp@k | imp@k(g) − imp@k(0) |", "|---:|---:|---:|"]
        for g, c in s["imp_at_k"].items():
            lines.append(f"| {g} | {_ci(c)} | {_ci(s.get('imp_compounding', {}).get(g)) if g != '0' else '—'} |")
    if result.get("transfer"):
        lines += ["", "## Final researcher against the original (paired per task, mean over chains)", "",
                  "The bar is the interval between chains (n = chains); the pooled one pairs every chain's tasks "
                  "as if they were independent (n = chains × tasks; the chains share their test tasks) and is shown "
                  "beside it, not instead of it.", "",
                  "| suite | original index | final − original, between chains | pooled over chains' tasks |",
                  "|---|---:|---:|---:|"]
        for name, t in result["transfer"].items():
            lines.append(f"| {name} | {t['seed_index']:+.4f} | {_ci(t['gain'])} | {_ci(t.get('pooled'))} |")
        if "transfer/local" not in result["transfer"]:
            lines.append("| transfer/local | not run (`--transfer-local N`: N local-world episodes per researcher) | — | — |")
        gain = result["transfer"].get("test", {}).get("gain") or {}
        if (gain.get("n") or 0) > 1 and gain.get("se") == 0:
            lines += ["", "Every chain's final researcher has the same test result: the interval between chains has "
                          "zero width and says nothing about the test tasks' noise; the per-chain paired intervals "
                          "below do."]
        beats = s.get("final_beats_seed_chains")
        if beats:
            lines += ["", f"Chains whose final researcher beats the original on test, paired over the test tasks "
                          f"(95 % lower bound > 0): {beats[0]} of {beats[1]} ("
                          + ", ".join(f"{c['mean']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]"
                                      for c in result["transfer"]["test"]["chains"]) + ")."]
    cost_acc = s.get("cost_per_accepted_usd")
    lines += ["", "## Summary", "",
              f"* original test index: {s['original_index']:+.4f}",
              f"* improver gain, round 1 (mean ± s.e. over chains): {_ms(s['first_round_improver_gain'])}",
              f"* compounding (test index after the last round − original): {_ms(s['compounding_total'])}; "
              f"95 %: {_ci(s.get('compounding_total_ci95'))}",
              f"* of which rounds 2..N: {_ms(s['compounding_later_rounds'])}; 95 %: {_ci(s.get('compounding_later_rounds_ci95'))}",
              f"* final test index: {_ms(s['final_index'])}",
              f"* candidates: {s.get('candidates', 0)}, accepted: {s.get('accepted', 0)}; cost per round "
              f"${s.get('cost_per_round_usd', 0):,.0f}, per accepted improvement "
              + ("—" if cost_acc is None or not math.isfinite(cost_acc) else f"${cost_acc:,.0f}")
              + (f"; recombined candidates (merges of a round's validated ones): {s['recombined'][0]}, accepted "
                 f"{s['recombined'][1]}" if s.get("recombined") else "")
              + (f"; edits of the improver's own procedure (judged by metaproductivity): {s['self_edits'][0]}, "
                 f"accepted {s['self_edits'][1]}" if s.get("self_edits") and s["self_edits"][0] else ""),
              f"* tampering-attempt rate (candidates whose episodes attempted something a researcher has no business "
              f"doing): {s.get('tampering_rate', 0):.3f}",
              f"* clade sizes (accepted nodes under each accepted first-generation node): {s.get('clade_sizes', {})}",
              *[f"* archive {a.get('name', i)}: " + ", ".join(f"{k2} {v}" for k2, v in a.items() if not isinstance(v, (dict, list)))
                + _diversity(a.get("diversity")) for i, a in enumerate(s.get("archives", []))], ""]
    return "\n".join(lines)


def _diversity(d: dict[str, Any] | None) -> str:
    """An archive's diversity as the report's archive line ends it.

    >>> _diversity({"distinct_forms": 59, "form_ratio": 1.0, "mean_gene_distance": 0.0375})
    '; diversity: 59 distinct code forms (ratio 1.00), mean pairwise gene distance 0.0375'
    >>> _diversity(None)
    ''
    """
    if not d:
        return ""
    out = f"; diversity: {d['distinct_forms']} distinct code forms"
    if d.get("form_ratio") is not None:
        out += f" (ratio {d['form_ratio']:.2f})"
    if d.get("mean_gene_distance") is not None:
        out += f", mean pairwise gene distance {d['mean_gene_distance']:.4f}"
    return out


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """``recursion.png``: the chain's test index by round (one line per chain) and imp@k by generation.
    ``None`` when matplotlib is missing (the ``plot`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for c in result["chains"]:
        axes[0].plot(range(len(c["indices"])), c["indices"], marker="o", label=f"chain {c['seed']}")
    axes[0].set_xlabel("round")
    axes[0].set_ylabel("test RSI-Index of the chain's researcher")
    axes[0].legend(fontsize=8)
    imp = result["summary"].get("imp_at_k") or {}
    if imp:
        gs = sorted(imp, key=int)
        means = [imp[g]["mean"] for g in gs]
        lows = [imp[g]["low"] if imp[g]["low"] is not None and math.isfinite(imp[g]["low"]) else imp[g]["mean"] for g in gs]
        highs = [imp[g]["high"] if imp[g]["high"] is not None and math.isfinite(imp[g]["high"]) else imp[g]["mean"] for g in gs]
        axes[1].errorbar([int(g) for g in gs], means, yerr=[[m - lo for m, lo in zip(means, lows)],
                                                             [hi - m for m, hi in zip(means, highs)]], marker="o", capsize=3)
        axes[1].axhline(0, color="grey", lw=0.5)
    axes[1].set_xlabel("generation of the improver")
    axes[1].set_ylabel("imp@k (test gain on a fresh target)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def to_json(result: dict[str, Any]) -> str:
    """The recursion result as JSON (dataclasses as dicts, anything else as text; infinities as null).

    >>> print(to_json({"summary": {"n": 1}}))
    {
     "summary": {
      "n": 1
     }
    }
    """
    def clean(o: Any) -> Any:
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    return json.dumps(clean(result), indent=1,
                      default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))
