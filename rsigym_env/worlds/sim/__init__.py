"""The sim world: a seeded, calibrated surrogate of an RSIGym research run (see CALIBRATION.md)."""

from .benchmarks import BENCHMARKS
from .clock import SimClock
from .world import SimOptions, SimWorld

__all__ = ["BENCHMARKS", "SimClock", "SimOptions", "SimWorld"]
