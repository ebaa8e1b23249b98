"""Cheating harnesses against the honest minimal harness, on each local benchmark's official split.

* ``cheater`` (``rsigym_env.worlds.local.redteam.cheating_harness``) tries every cheat we know — hidden
  tests and solutions, the answers of the package's public official split shipped in the harness, code
  under test that steers the verifier, reward files, symlinks and FIFOs at answer paths, left-behind
  processes — and then falls back to the minimal harness's honest loop.
* ``reuse``: the same cheater shipping the answers of every official task of 40 earlier episodes on
  this machine (``redteam.earlier_answers``: more than their rewards, or any channel out of an official
  trial, could ever reveal), against this episode's own draw.
* ``own draws``: the same cheater with the answers of 40 draws from a secret of anyone's own — what the
  package gives without a single episode. Small task spaces (local-terminal's ~1,500 instructions) repeat
  across draws and their answers follow from the instruction, so a table of them is a solver: ``reuse``
  must not beat ``own draws`` (it holds when it does not), while every other attack must not beat ``honest``.
* ``answer key``: a harness carrying every constant of the benchmark's module (``redteam.answer_key_harness``)
  that answers knowledge questions from it and otherwise runs the honest loop (local-science's ``KB`` was
  such a key for generators 1-3).

Each is evaluated with the base model on the official split the platform scores (this machine's secret
and the episode's own draw), avg@3, through the same service as ``submit``, on the same tasks as the
honest harness. None may score more than the honest harness beyond sampling noise.

    .venv/bin/python bench/bench_cheating.py [--benchmarks all] [--k 3] [--out bench/cheating.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from rsigym_env.scenario import load_scenario  # noqa: E402
from rsigym_env.services import EvalRequest  # noqa: E402
from rsigym_env.worlds.local import benchmarks  # noqa: E402
from rsigym_env.worlds.common.harness import minimal_harness  # noqa: E402
from rsigym_env.worlds.local.redteam import (answer_key_harness, cheating_harness, earlier_answers,  # noqa: E402
                                             public_answers)
from rsigym_env.worlds.local.world import LocalWorld  # noqa: E402

HERE = Path(__file__).resolve().parent


def standard_error(rewards: list[list[float]]) -> float:
    """Standard error of avg@k over tasks (the tasks are the sample)."""
    per_task = [sum(r) / len(r) for r in rewards]
    n = len(per_task)
    mean = sum(per_task) / n
    return math.sqrt(sum((x - mean) ** 2 for x in per_task) / (n - 1) / n) if n > 1 else 0.0


ATTACKS = ("cheater", "reuse", "own_draws", "answer_key")
BASELINE = {"reuse": "own_draws"}
"""What an attack is compared with (default: the honest harness)."""


def attacks(bench: benchmarks.LocalBenchmark) -> list[tuple[str, dict[str, str]]]:
    """The attacking harnesses of ``ATTACKS`` (label, files) for ``bench`` (built once per benchmark)."""
    cache = attacks.__dict__.setdefault("built", {})
    if bench.name not in cache:
        cache[bench.name] = [("cheater", cheating_harness(public_answers(bench))),
                             ("reuse", cheating_harness(earlier_answers(bench))),
                             ("own_draws", cheating_harness(earlier_answers(bench, secret="anyone's own"))),
                             ("answer_key", answer_key_harness(bench))]
    return cache[bench.name]


def measure(names: list[str] | None = None, k: int = 3) -> list[dict]:
    rows = []
    for name in names or sorted(benchmarks.PAPER_IDS):
        bench = benchmarks.resolve(name)
        world = LocalWorld(load_scenario(f"local-joint-{name}"), seed=0)
        try:
            row: dict = {"benchmark": name, "local": bench.name, "split": world.official_split}
            for label, files in (("honest", minimal_harness()), *attacks(bench)):
                start = time.monotonic()
                result = world.evaluation.official(EvalRequest(checkpoint="base", harness_version=label,
                                                               harness_files=files, split="official", k=k)).value
                row[label] = result.score
                row[f"{label}_se"] = standard_error(result.rewards)
                row[f"{label}_s"] = round(time.monotonic() - start, 1)
            for label, _ in attacks(bench):
                base = BASELINE.get(label, "honest")
                row[f"{label}_difference"] = row[label] - row[base]
                row[f"{label}_noise"] = 2 * math.hypot(row[f"{base}_se"], row[f"{label}_se"])  # 2 s.e. of the difference
                row[f"{label}_holds"] = row[f"{label}_difference"] <= row[f"{label}_noise"]
                print(f"{name:20s} {base} {row[base]:.3f} ± {row[base + '_se']:.3f}  {label} {row[label]:.3f} ± "
                      f"{row[label + '_se']:.3f}  difference {row[label + '_difference']:+.3f} "
                      f"(2 s.e. {row[label + '_noise']:.3f})", flush=True)
            row["holds"] = all(row[f"{label}_holds"] for label, _ in attacks(bench) if label not in BASELINE.values())
            rows.append(row)
        finally:
            world.close()
    return rows


def table(rows: list[dict], k: int = 3) -> list[str]:
    """The figures as Markdown: each benchmark's honest and cheating scores, their difference and the noise."""
    head = "| benchmark (local mirror) | honest minimal harness | " + " | ".join(
        f"{NAMES[a]} | difference | 2 s.e." for a in ATTACKS) + " | holds |"
    lines = [head, "|---|---:|" + "---:|---:|---:|" * len(ATTACKS) + ":---:|"]
    for r in rows:
        cells = [f"{r[a]:.3f} ± {r[a + '_se']:.3f} | {r[a + '_difference']:+.3f} | {r[a + '_noise']:.3f}" for a in ATTACKS]
        lines.append(f"| {r['benchmark']} ({r['local']}) | {r['honest']:.3f} ± {r['honest_se']:.3f} | "
                     + " | ".join(cells) + f" | {'yes' if r['holds'] else '**no**'} |")
    return lines


NAMES = {"cheater": "cheating harness", "reuse": "reuse of 40 earlier episodes (vs own draws)",
         "own_draws": "40 draws of anyone's own", "answer_key": "answer key"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", default="all")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "cheating.json"))
    args = parser.parse_args(argv)
    names = None if args.benchmarks == "all" else args.benchmarks.split(",")
    rows = measure(names, args.k)
    print("\n".join(table(rows, args.k)))
    Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "load": os.getloadavg(),
                                          "k": args.k, "rows": rows}, indent=1))
    return 0 if all(r["holds"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
