"""The sim's calibration checks (``rsigym_env/worlds/sim/CALIBRATION.md``, "Measured checks"), per benchmark
over seeds 0..N-1: the expected normalized official gain of flipping every harness option blind and of
fixing exactly the system's defects (base model), and the sampled initial official avg@3 (mean ± s.e.)
against the paper's.

    .venv/bin/python scripts/sim_calibration.py [--seeds 200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import rsigym_env  # noqa: F401  (first: it pins NumPy's code)

import numpy as np

from rsigym_env.catalog import DEFECTS, REMEDY_FOR
from rsigym_env.scoring import normalized_gain
from rsigym_env.services import EvalRequest
from rsigym_env.worlds.sim import BENCHMARKS, SimWorld

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bench_blind_recipes import flip_harness_toml  # noqa: E402  (the blind recipe's own flip)


def fixed(world: SimWorld) -> dict[str, str]:
    """The initial harness with exactly the system's defects fixed (what a perfect diagnosis gives)."""
    files = world.initial_harness()
    text = files["harness.toml"]
    for defect, has in zip(DEFECTS, world.profile.present):
        remedy = REMEDY_FOR[defect]
        if has:
            text = text.replace(f"{remedy.key} = {remedy.minimal}", f"{remedy.key} = {remedy.fixed}")
    return {**files, "harness.toml": text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args()
    print("| | flip every option | fix exactly the system's defects | initial official avg@3 sampled (paper) |")
    print("|---|---|---|---|")
    flips_all, fixes_all = [], []
    for benchmark, spec in BENCHMARKS.items():
        flips, fixes, scores = [], [], []
        for seed in range(args.seeds):
            world = SimWorld(benchmark, seed)
            initial = world.initial_harness()
            base = world.expected_score("base", initial, "official")
            flipped = {**initial, "harness.toml": flip_harness_toml(initial["harness.toml"])[0]}
            flips.append(normalized_gain(base, world.expected_score("base", flipped, "official")))
            fixes.append(normalized_gain(base, world.expected_score("base", fixed(world), "official")))
            request = EvalRequest(checkpoint="base", harness_version="v0", harness_files=initial, split="official")
            scores.append(world.evaluation.official(request).value.score)
        flips_all.append(np.mean(flips))
        fixes_all.append(np.mean(fixes))
        se = np.std(scores) / np.sqrt(len(scores))
        print(f"| {benchmark} | {np.mean(flips):+.3f} | {np.mean(fixes):+.3f} | {np.mean(scores):.4f} ± {se:.4f} "
              f"({spec.initial_score}) |")
    print(f"| RSI-Index | {np.mean(flips_all):+.3f} | {np.mean(fixes_all):+.3f} | |")


if __name__ == "__main__":
    main()
