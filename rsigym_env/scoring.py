"""RSI-Index arithmetic.

>>> round(normalized_gain(0.20, 0.60), 6)      # fills 40 of the 80 remaining points
0.5
>>> round(rsi_index([0.5, 0.25, 0.0]), 4)
0.25
"""

from __future__ import annotations

from typing import Iterable


def normalized_gain(initial: float, final: float) -> float:
    """``(final - initial) / (1 - initial)``; 0 when the initial system is already perfect."""
    if initial >= 1.0:
        return 0.0
    return (final - initial) / (1.0 - initial)


def rsi_index(gains: Iterable[float]) -> float:
    """Mean normalized gain over benchmarks."""
    values = list(gains)
    return sum(values) / len(values) if values else 0.0
