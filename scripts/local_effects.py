#!/usr/bin/env python3
"""What harness fixes, teacher data, both, and over-training do to each local benchmark — measured
through the local world's own services (the same code an episode runs: teachers behind the
OpenAI-compatible server, transforms in the E2B-protocol sandbox, LoRA training through the
Tinker-shaped client, Harbor's ``Job`` with the harness in bubblewrap and the hidden tests).

For every benchmark, on its held-out official split (avg@k):

* ``initial``     base model + minimal harness;
* ``harness``     base model + every remedy of ``harness.toml`` switched on;
* ``data``        LoRA on filtered teacher data (``--examples`` from ``--teacher``, ``--epochs`` at
                  ``--lr``; the world scales learning rates by its ``lr_scale``), minimal harness;
* ``both``        that checkpoint + the fixed harness;
* ``overtrained`` the same data at ``--over-lr`` for ``--over-epochs`` epochs, fixed harness
                  (compare with ``both``: only the training differs).

    python scripts/local_effects.py                       # all five, ~20 min on 2 cores
    python scripts/local_effects.py --benchmarks aime --k 1

Prints a Markdown table (paste it into the README) and writes ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rsigym_env.catalog import BENCHMARKS as CATALOG_BENCHMARKS
from rsigym_env.harness import version_id
from rsigym_env.scenario import load_scenario
from rsigym_env.services import EvalRequest
from rsigym_env.tools import GenerateData, Train, TransformData
from rsigym_env.worlds.common.harness import REMEDIES, with_remedies
from rsigym_env.worlds.local.world import LocalWorld

BENCHMARKS = list(CATALOG_BENCHMARKS)
CONDITIONS = ["initial", "harness", "data", "both", "overtrained"]


def official(world: LocalWorld, checkpoint: str, files: dict[str, str], k: int) -> dict[str, Any]:
    result = world.evaluation.official(EvalRequest(checkpoint=checkpoint, harness_version=version_id(files),
                                                   harness_files=files, split="official", k=k)).value
    return {"score": result.score, "failure_modes": result.failure_modes}


def train(world: LocalWorld, dataset: str, checkpoint: str, **hyper: Any) -> dict[str, Any]:
    job = world.train.start(Train(dataset=dataset, **hyper), f"job-{checkpoint}", checkpoint)
    result = job.future.result().value
    return {"steps": result.steps, "final_loss": result.loss_curve[-1], **hyper}


def measure(benchmark: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rsigym-effects-") as tmp:
        # the public official split: the figures are reproducible on any machine (the platform's own
        # official split is drawn from this machine's secret, rsigym_env.splits)
        scenario = load_scenario(world="local", benchmark=benchmark, budget_usd=1000,
                                 world_options={"official_split": "public"})
        world = LocalWorld(scenario, seed=args.seed, run_dir=Path(tmp))
        try:
            minimal = world.initial_harness()
            fixed = with_remedies(minimal, list(REMEDIES))
            rows: dict[str, Any] = {"benchmark": benchmark, "local": world.benchmark.name}
            rows["initial"] = official(world, "base", minimal, args.k)
            print(f"{benchmark}: initial {rows['initial']['score']:.3f}", flush=True)
            rows["harness"] = official(world, "base", fixed, args.k)
            raw = world.rollout.generate(GenerateData(teacher=args.teacher, n_examples=args.examples), "ds-1").value
            kept = world.rollout.transform(TransformData(operation="filter", datasets=["ds-1"]), "ds-2").value
            rows["dataset"] = {"generated": raw.n_examples, "kept": kept.n_examples, "pass_rate": raw.stats.get("pass_rate")}
            rows["train"] = train(world, "ds-2", "ckpt-1", learning_rate=args.lr, num_epochs=args.epochs, lora_rank=16)
            rows["data"] = official(world, "ckpt-1", minimal, args.k)
            rows["both"] = official(world, "ckpt-1", fixed, args.k)
            rows["over_train"] = train(world, "ds-2", "ckpt-2", learning_rate=args.over_lr,
                                       num_epochs=args.over_epochs, lora_rank=16)
            rows["overtrained"] = official(world, "ckpt-2", fixed, args.k)
        finally:
            world.close()
    rows["seconds"] = time.monotonic() - t0
    print(f"{benchmark}: " + ", ".join(f"{c} {rows[c]['score']:.3f}" for c in CONDITIONS)
          + f" ({rows['seconds']:.0f} s)", flush=True)
    return rows


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"| benchmark (local mirror) | initial | + harness fixes | + teacher data ({args.epochs} epochs, lr "
             f"{args.lr:g}) | both | over-trained ({args.over_epochs} epochs, lr {args.over_lr:g}) + fixes |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        cells = [f"{r[c]['score']:.3f}" for c in CONDITIONS]
        lines.append(f"| {r['benchmark']} ({r['local']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmarks", nargs="*", default=BENCHMARKS)
    parser.add_argument("--k", type=int, default=3, help="attempts per task (avg@k)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--teacher", default="teacher-large")
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--over-lr", type=float, default=1e-3)
    parser.add_argument("--over-epochs", type=int, default=8)
    parser.add_argument("--out", default="runs/local_effects.json")
    args = parser.parse_args()
    results = [measure(b, args) for b in args.benchmarks]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print()
    print(table(results, args))


if __name__ == "__main__":
    main()
