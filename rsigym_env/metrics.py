"""Research-quality metrics: how well a researcher searched, chose and spent, and how recursion compounds.

Per episode (in the end ``info["metrics"]`` of every run, and in sweep records):

* ``discovery``  — the best dev score reached (``None``: no dev evaluation);
* ``selection``  — official score of the submitted candidate minus that of the best dev candidate
  (0 when it submitted the best one; ``None`` without a dev evaluation). Negative: it kept a worse one;
  positive: its dev favourite was not the best on held-out tasks and it picked better;
* ``retention``  — final official score minus the best dev score (how much of what it found on dev
  survives on the held-out split; negative = over-fitting dev or a regression after the best point);
* ``efficiency`` — normalized gain per dollar spent.

Across researchers (:mod:`rsigym_env.worlds.recursive`):

* ``improver_gain`` — the improved researcher's index minus the original's;
* ``compounding``   — the index gained across all rounds, with the gain of each round.

>>> m = episode_metrics({"best_dev_score": 0.5, "official_score": 0.45, "normalized_gain": 0.2,
...                      "spend_usd": 100.0}, best_candidate_official=0.47)
>>> m["discovery"], round(m["selection"], 2), round(m["retention"], 2), m["efficiency"]
(0.5, -0.02, -0.05, 0.002)
>>> c = compounding([0.30, 0.34, 0.35, 0.35])
>>> round(c["total"], 2), [round(g, 2) for g in c["per_round"]], c["rounds_improved"]
(0.05, [0.04, 0.01, 0.0], 2)
"""

from __future__ import annotations

import math
from typing import Any, Sequence

METRIC_KEYS = ("discovery", "selection", "retention", "efficiency")


def episode_metrics(end_info: dict[str, Any], best_candidate_official: float | None = None) -> dict[str, Any]:
    """The four per-episode metrics from an episode's end ``info``.

    ``best_candidate_official``: the official score of the best dev candidate (``None`` when there is
    none; pass the submitted one's official score when it was the best).
    """
    best_dev = end_info.get("best_dev_score")
    official = end_info.get("official_score")
    spend = float(end_info.get("spend_usd") or 0.0)
    gain = float(end_info.get("normalized_gain") or 0.0)
    return {
        "discovery": best_dev,
        "selection": None if best_candidate_official is None or official is None else official - best_candidate_official,
        "retention": None if best_dev is None or official is None else official - best_dev,
        "efficiency": gain / spend if spend > 0 else 0.0,
        "best_candidate_official_score": best_candidate_official,
    }


def improver_gain(index_before: float, index_after: float) -> float:
    """The improved researcher's index minus the original's.

    >>> round(improver_gain(0.31, 0.36), 2)
    0.05
    """
    return index_after - index_before


def compounding(indices: Sequence[float]) -> dict[str, Any]:
    """``indices[0]`` is the original researcher's index, ``indices[t]`` the one after round ``t``.

    Returns ``total`` (last − first), ``per_round`` gains, ``rounds_improved`` (gain > 0),
    ``later_rounds`` (gain of rounds 2..N together: does improvement keep coming after the first round?).
    """
    values = [float(v) for v in indices]
    per_round = [b - a for a, b in zip(values, values[1:])]
    return {
        "total": values[-1] - values[0] if values else 0.0,
        "per_round": per_round,
        "rounds_improved": sum(1 for g in per_round if g > 0),
        "later_rounds": sum(per_round[1:]),
    }


def mean_se(values: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """Mean, standard error and count of the values that are not ``None``.

    >>> mean_se([1.0, 3.0, None])
    (2.0, 1.0, 2)
    """
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None, 0
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0, 1
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)), len(xs)


# two-sided 95 % quantiles of Student's t by degrees of freedom (between entries the smaller df is used: conservative)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.980}


def t95(n: int) -> float:
    """The two-sided 95 % t quantile for a mean of ``n`` values (``inf`` below 2; 1.96 for large n).

    >>> t95(3), t95(1000)
    (4.303, 1.96)
    """
    if n < 2:
        return math.inf
    df = n - 1
    if df > 120:
        return 1.96
    return _T95[max(d for d in _T95 if d <= df)]


def ci95(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean, standard error, n and the 95 % t interval of the values that are not ``None``.

    >>> r = ci95([0.1, 0.2, 0.3]); round(r["mean"], 3), round(r["low"], 3), r["n"]
    (0.2, -0.048, 3)
    """
    m, se, n = mean_se(values)
    if m is None:
        return {"mean": None, "se": None, "n": 0, "low": None, "high": None}
    half = t95(n) * (se or 0.0) if n >= 2 else math.inf
    return {"mean": m, "se": se, "n": n, "low": m - half, "high": m + half}


def paired_gain(candidate: Sequence[float], baseline: Sequence[float]) -> dict[str, Any]:
    """The candidate's gain over the baseline on the same tasks, paired task by task: :func:`ci95` of the
    differences (``ValueError`` if the two were not measured on the same number of tasks).

    >>> g = paired_gain([0.5, 0.6, 0.7, 0.6], [0.4, 0.5, 0.5, 0.5]); round(g["mean"], 3), g["low"] > 0
    (0.125, True)
    """
    if len(candidate) != len(baseline):
        raise ValueError(f"paired comparison needs the same tasks: {len(candidate)} vs {len(baseline)} values")
    return ci95([float(a) - float(b) for a, b in zip(candidate, baseline)])


__all__ = ["METRIC_KEYS", "ci95", "compounding", "episode_metrics", "improver_gain", "mean_se", "paired_gain", "t95"]
