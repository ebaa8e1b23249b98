"""Research must pay (issue 30): blind, fixed recipes against adaptive researchers, on the sim.

A *blind recipe* reads no evaluation log and runs no evaluation: it does the same thing on every
benchmark and seed. The yardstick of issue 30 is how close the best such recipe comes to the
researchers that adapt (the scripted one, the shipped RL policy). Recipes measured here:

* ``flip-everything``: read ``harness:latest/harness.toml`` and flip every option the way its
  comments describe (``false`` -> ``true``; a quoted value -> the other value its comment names,
  ``"stop"`` -> ``"continue"``; every integer limit x4; floats untouched), in one edit; submit the base
  model with that harness. $0.
* ``flip:<subset>``: the same for a subset of the options.
* ``distil…``: buy as much teacher data as the budget allows (chunks of ``generate_data``, each cut to
  what fits, until ``reserve`` of the starting budget is left), mix, ``filter``, ``dedupe``, train once
  from base, submit that checkpoint (with or without the flips). ``distil+flip`` with claude-opus-5
  and a 15% reserve is what the RL researcher learned.
* ``scripted`` and ``rl`` (the shipped policy), the adaptive researchers, through the same runner.

Every episode is ``rsigym_env.episode.run_episode`` on ``gym.make("RSIGym/Joint-v0", world="sim",
benchmark=B, budget_usd=500)``, seeds 0..N-1 (never used to train or select the RL policy: it trained
on env seeds from 1,000,000 and was validated on seeds from 10,000; ``baselines/rl_researcher.py``).
Per recipe: the RSI-Index (per benchmark the mean normalized gain over seeds, then the mean over
benchmarks) ± its standard error over seeds of the per-seed RSI-Index (the mean over benchmarks of
one seed; the propagated per-benchmark s.e. is in the JSON as ``rsi_se_propagated``), mean spend, and
the share of episodes that finished at least one dev evaluation before submitting.

``--local`` also runs ``--local-recipes`` (default ``flip-everything``; blind recipes or baseline
researchers such as ``scripted``) on each local benchmark for ``--local-seeds`` (default 1: seed 0; the
local world's own harness.toml read from the env), one episode at a time (~0.5-1.5 min each on 2 cores).

    .venv/bin/python bench/bench_blind_recipes.py [--seeds 8] [--benchmarks all] [--json PATH] [--local]
    .venv/bin/python bench/bench_blind_recipes.py --local-only --local-seeds 2 \\
        --local-recipes flip-everything,flip:bools,scripted
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Generator

os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import rsigym_env  # noqa: E402,F401  (before NumPy: registers the ids, pins the BLAS kernels)
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

from rsigym_env.catalog import BENCHMARKS, LOCAL_BENCHMARKS  # noqa: E402
from rsigym_env.episode import PlanResearcher, run_episode  # noqa: E402

HERE = Path(__file__).resolve().parent
HARNESS_REF = "harness:latest/harness.toml"
ENV_ID = "RSIGym/Joint-v0"
BUDGET_USD = 500.0

Action = dict[str, Any]
Step = tuple[dict[str, Any], dict[str, Any]]


# --------------------------------------------------------------------------------------------
# Flipping harness.toml the way its comments describe (text in, text out; comments kept)

_LINE = re.compile(r"^(?P<head>\s*(?P<key>[A-Za-z_][\w-]*)\s*=\s*)(?P<value>\"[^\"]*\"|[^#\s][^#]*?)"
                   r"(?P<tail>\s*(?:#(?P<comment>.*))?)$")
_STRING_FALLBACK = {"stop": "continue"}


def flip_value(value: str, comment: str, limit_factor: float) -> str | None:
    """The flipped TOML value text, or None to leave it: ``false`` -> ``true``; a quoted string -> the
    first other quoted value its comment names (else ``"stop"`` -> ``"continue"``); an integer ->
    ``round(value * limit_factor)``; anything else (floats, true, arrays) stays.

    >>> flip_value("false", "", 4), flip_value('"stop"', ' "stop": give up | "continue": ask again', 4)
    ('true', '"continue"')
    >>> flip_value("4096", " replies longer than this are cut off", 4), flip_value("0.7", "", 4)
    ('16384', None)
    """
    if value == "false":
        return "true"
    if value.startswith('"') and value.endswith('"') and len(value) >= 2:
        current = value[1:-1]
        others = [o for o in re.findall(r'"([^"]*)"', comment or "") if o != current]
        target = others[0] if others else _STRING_FALLBACK.get(current)
        return f'"{target}"' if target is not None else None
    if re.fullmatch(r"[+-]?\d+", value) and limit_factor != 1:
        return str(int(round(int(value) * limit_factor)))
    return None


def flip_harness_toml(text: str, keys: frozenset[str] | None = None, limit_factor: float = 4.0,
                      ) -> tuple[str, list[str]]:
    """``text`` with every option (or only those in ``keys``) flipped; also the changes, as
    ``"key: old -> new"``. Layout and comments are kept.

    >>> new, changes = flip_harness_toml('[shell]\\npersistent = false   # keep state\\n')
    >>> new, changes
    ('[shell]\\npersistent = true   # keep state\\n', ['persistent: false -> true'])
    """
    out, changes = [], []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        m = _LINE.match(body)
        if m and (keys is None or m["key"] in keys):
            value = m["value"].strip()
            new = flip_value(value, m["comment"] or "", limit_factor)
            if new is not None and new != value:
                changes.append(f"{m['key']}: {value} -> {new}")
                body = m["head"] + new + m["tail"]
        out.append(body + line[len(line.rstrip("\n")):])
    return "".join(out), changes


# --------------------------------------------------------------------------------------------
# Blind recipes


@dataclass(frozen=True)
class Recipe:
    """A fixed plan that evaluates nothing. ``flips``: ``"all"``, ``"none"`` or comma-separated keys of
    harness.toml; ``teacher`` None: no data (submit the base model)."""

    name: str
    description: str
    flips: str = "all"
    limit_factor: float = 4.0
    teacher: str | None = None
    reserve: float = 0.15          # share of the starting budget left unspent on data (for training)
    clean: tuple[str, ...] = ("filter", "dedupe")
    learning_rate: float = 3e-4
    num_epochs: int = 1
    max_chunks: int = 6            # generate_data calls at most (each cut to what fits)
    max_examples: int = 20_000     # examples bought at most, over all chunks

    @property
    def keys(self) -> frozenset[str] | None:
        return None if self.flips == "all" else frozenset(k for k in self.flips.split(",") if k and k != "none")


OPUS, ASTRA, FLASH = "claude-opus-5", "gpt-6-astra", "deepseek-v4.1-flash"
RECIPES: tuple[Recipe, ...] = (
    Recipe("flip-everything", "flip every option of harness.toml (bools on, \"continue\", limits x4); submit base"),
    Recipe("flip:truncation", "flip on_truncation and max_output_tokens only; submit base",
           flips="on_truncation,max_output_tokens"),
    Recipe("flip:bools", "flip the true/false switches only (verify, shell, loop, edits); submit base",
           flips="verify_before_submit,persistent,detect,check,load_skills"),
    Recipe("distil", "opus data to 85% of the budget, filter, dedupe, train (defaults); no flips",
           flips="none", teacher=OPUS),
    Recipe("distil:40%", "opus data for 40% of the budget, filter, dedupe, train (defaults); no flips",
           flips="none", teacher=OPUS, reserve=0.60),
    Recipe("distil:astra", "gpt-6-astra data to 85% of the budget, filter, dedupe, train; no flips",
           flips="none", teacher=ASTRA),
    Recipe("distil:lr/2", "opus data to 85% of the budget, filter, dedupe, train at lr 1.5e-4; no flips",
           flips="none", teacher=OPUS, learning_rate=1.5e-4),
    Recipe("distil+flip", "the RL researcher's recipe: flip everything + opus data to 85% of the budget, "
           "filter, dedupe, train (defaults), submit the checkpoint", teacher=OPUS),
    Recipe("distil+flip:40%", "flip everything + opus data for 40% of the budget (the scripted researcher's "
           "data share), filter, dedupe, train", teacher=OPUS, reserve=0.60),
    Recipe("distil+flip:95%", "flip everything + opus data to 95% of the budget, filter, dedupe, train",
           teacher=OPUS, reserve=0.05),
    Recipe("distil+flip:astra", "flip everything + gpt-6-astra data to 85% of the budget, filter, dedupe, train",
           teacher=ASTRA),
    Recipe("distil+flip:flash", "flip everything + 6,000 deepseek-v4.1-flash examples (cheap: more would not "
           "fit the training bill or the 48 h), filter, dedupe, train", teacher=FLASH, max_examples=6000),
    Recipe("distil+flip:raw", "flip everything + opus data to 85% of the budget, no cleaning, train",
           teacher=OPUS, clean=()),
    Recipe("distil+flip:2ep", "flip everything + opus data to 85% of the budget, filter, dedupe, train 2 epochs",
           teacher=OPUS, num_epochs=2),
)
RECIPES_BY_NAME = {r.name: r for r in RECIPES}
ADAPTIVE = ("scripted", "rl")


class BlindResearcher(PlanResearcher):
    """Plays one :class:`Recipe`. It reads the harness file (to edit it) and the ids its own calls
    return (to chain them), never a score: no ``evaluate``, no ``infer``, no reading of results."""

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.name = recipe.name
        self.flipped: list[str] = []
        self.datasets: list[str] = []
        self.checkpoint: str | None = None
        self.budget_left = 0.0

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        self.flipped, self.datasets, self.checkpoint = [], [], None
        self.budget_left = self.budget_start = float(observation["budget_left_usd"][0])
        self.start(self.plan(info))

    def step(self, action: Action) -> Generator[Action, Step, dict[str, Any]]:
        obs, info = yield action
        self.budget_left = float(obs["budget_left_usd"][0])
        return info

    def plan(self, start_info: dict[str, Any]) -> Generator[Action, Step, None]:
        r, tools = self.recipe, set(start_info.get("tools", ()))
        harness = "latest"
        if r.flips != "none" and "edit_harness" in tools:
            obs, info = yield {"tool": "read", "args": {"ref": HARNESS_REF}}
            if info.get("ok"):
                text = obs["log"].split("\n", 1)[-1]  # the first line is the status line
                new, self.flipped = flip_harness_toml(text, r.keys, r.limit_factor)
                if self.flipped:
                    _, info = yield {"tool": "edit_harness", "args": {"path": "harness.toml", "content": new}}
                    if info.get("ok"):
                        harness = info["result"]["version"]
                    else:
                        self.flipped = []
        checkpoint = "base"
        if r.teacher and {"generate_data", "train"} <= tools:
            checkpoint = (yield from self.distil()) or "base"
        self.checkpoint = checkpoint
        _, info = yield {"tool": "submit", "args": {"checkpoint": checkpoint, "harness": harness}}
        if info.get("ok") and "job" in (info.get("result") or {}):
            yield from self.wait_for(info["result"]["job"])

    def call(self, action: Action) -> Generator[Action, Step, dict[str, Any]]:
        """A dataset-making call; a job (``async_jobs``) is waited for. The finished call's info."""
        info = yield from self.step(action)
        job = (info.get("result") or {}).get("job") if info.get("ok") else None
        if job is None:
            return info
        event = yield from self.wait_for(job)
        if not event or not event.get("ok"):
            return {"ok": False, "error": "job_failed"}
        return {"ok": True, "result": {"id": event["dataset"], "n_examples": event["n_examples"]}}

    def wait_for(self, job: str) -> Generator[Action, Step, dict[str, Any] | None]:
        while job not in self.events:
            info = yield from self.step({"tool": "wait", "args": {"job": job}})
            if not info.get("ok") and job not in self.events:
                return None
        return self.events[job]

    def distil(self) -> Generator[Action, Step, str | None]:
        r = self.recipe
        keep = r.reserve * self.budget_start
        per_example = None  # worst-case dollars per example, learned from the first refusal (free)
        bought = 0
        for _ in range(r.max_chunks):
            cap = min(20_000, r.max_examples - bought)
            n = cap if per_example is None else min(cap, int((self.budget_left - keep) / per_example))
            made = None
            for _try in range(3):
                if n < 50:
                    break
                info = yield from self.call({"tool": "generate_data", "args": {"teacher": r.teacher, "n_examples": n}})
                if info.get("ok"):
                    made = info["result"]["id"]
                    break
                if info.get("error") != "insufficient_budget" or not info.get("requested_usd"):
                    return None
                per_example = float(info["requested_usd"]) / n
                n = min(n - 1, int((float(info["available_usd"]) - keep) / per_example))
            if made is None:
                break
            self.datasets.append(made)
            bought += n
        if not self.datasets:
            return None
        dataset = self.datasets[0]
        if len(self.datasets) > 1:
            info = yield from self.call({"tool": "transform_data", "args": {"operation": "mix",
                                                                            "datasets": self.datasets[:8]}})
            if info.get("ok"):
                dataset = info["result"]["id"]
        for operation in r.clean:
            info = yield from self.call({"tool": "transform_data", "args": {"operation": operation,
                                                                            "datasets": [dataset]}})
            if info.get("ok") and info["result"]["n_examples"] > 0:
                dataset = info["result"]["id"]
        info = yield from self.step({"tool": "train", "args": {"dataset": dataset, "learning_rate": r.learning_rate,
                                                               "num_epochs": r.num_epochs}})
        if not info.get("ok"):
            return None
        event = yield from self.wait_for(info["result"]["job"])
        return event["checkpoint"] if event and event.get("ok") else None


def make_researcher(name: str) -> Any:
    if name in RECIPES_BY_NAME:
        return BlindResearcher(RECIPES_BY_NAME[name])
    from rsigym_env.baselines import make_researcher as make_baseline
    return make_baseline(name)


# --------------------------------------------------------------------------------------------
# Measurement


def _se(values: list[float]) -> float:
    n = len(values)
    return float(np.std(values, ddof=1) / math.sqrt(n)) if n > 1 else 0.0


def measure(seeds: int = 8, benchmarks: list[str] | None = None, recipes: list[str] | None = None,
            budget_usd: float = BUDGET_USD, progress: bool = False) -> list[dict[str, Any]]:
    """One row per recipe / researcher (blind recipes first, then ``scripted`` and ``rl``)."""
    benchmarks = list(benchmarks or BENCHMARKS)
    names = list(recipes or [*RECIPES_BY_NAME, *ADAPTIVE])
    rows = []
    for name in names:
        started = time.perf_counter()
        per: dict[str, list[dict[str, Any]]] = {}
        for bench in benchmarks:
            env = gym.make(ENV_ID, world="sim", benchmark=bench, budget_usd=budget_usd)
            try:
                for seed in range(seeds):
                    researcher = make_researcher(name)
                    result = run_episode(env, researcher, seed=seed)
                    info = result.info
                    per.setdefault(bench, []).append({
                        "seed": seed, "gain": float(result.reward), "spend": float(info.get("spend_usd") or 0.0),
                        "dev_evaluations": int(info.get("dev_evaluations") or 0),
                        "initial": info.get("initial_score"), "official": info.get("official_score"),
                        "end_reason": info.get("end_reason"), "steps": result.steps,
                        "submitted_by": (info.get("submitted") or {}).get("by"),
                        **({"flipped": researcher.flipped, "datasets": len(researcher.datasets),
                            "checkpoint": researcher.checkpoint} if isinstance(researcher, BlindResearcher) else {}),
                    })
            finally:
                env.close()
        rows.append(_row(name, benchmarks, seeds, per, time.perf_counter() - started))
        if progress:
            r = rows[-1]
            print(f"{name:20s} RSI {r['rsi_index']:+.3f} ± {r['rsi_se']:.3f}  spend ${r['spend_usd']:.0f}  "
                  f"evaluated {r['eval_share']:.0%}  [{r['wall_s']:.1f} s]", flush=True)
    return rows


def _row(name: str, benchmarks: list[str], seeds: int, per: dict[str, list[dict[str, Any]]], wall: float) -> dict:
    gains = np.array([[e["gain"] for e in per[b]] for b in benchmarks])  # (benchmarks, seeds)
    per_seed = gains.mean(axis=0)
    episodes = [e for b in benchmarks for e in per[b]]
    per_bench = {}
    for b in benchmarks:
        eps = per[b]
        g = [e["gain"] for e in eps]
        per_bench[b] = {"gain": float(np.mean(g)), "se": _se(g),
                        "spend": float(np.mean([e["spend"] for e in eps])),
                        "eval_share": float(np.mean([e["dev_evaluations"] > 0 for e in eps])),
                        "initial": float(np.mean([e["initial"] or 0.0 for e in eps])),
                        "official": float(np.mean([e["official"] or 0.0 for e in eps])),
                        "gain_min": float(min(g)), "gain_max": float(max(g))}
    recipe = RECIPES_BY_NAME.get(name)
    return {
        "name": name, "kind": "blind" if recipe else "adaptive",
        "description": recipe.description if recipe else f"the {name} researcher (rsigym_env.baselines)",
        "recipe": asdict(recipe) if recipe else None,
        "seeds": seeds, "benchmarks": benchmarks, "episodes": len(episodes),
        "rsi_index": float(per_seed.mean()), "rsi_se": _se(per_seed.tolist()),
        "rsi_se_propagated": float(math.sqrt(sum(per_bench[b]["se"] ** 2 for b in benchmarks)) / len(benchmarks)),
        "spend_usd": float(np.mean([e["spend"] for e in episodes])),
        "eval_share": float(np.mean([e["dev_evaluations"] > 0 for e in episodes])),
        "dev_evaluations_mean": float(np.mean([e["dev_evaluations"] for e in episodes])),
        "not_submitted": sum(e["submitted_by"] != "agent" for e in episodes),
        "trained_share": (float(np.mean([e.get("checkpoint") not in (None, "base") for e in episodes]))
                          if recipe and recipe.teacher else None),
        "per_benchmark": per_bench, "wall_s": round(wall, 2), "episodes_detail": per,
    }


def headline(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Best blind recipe (one recipe for every benchmark), best adaptive researcher, and the gap; also the
    per-benchmark best blind recipe picked after the fact (an optimistic bound on blind recipes)."""
    blind = [r for r in rows if r["kind"] == "blind"]
    adaptive = [r for r in rows if r["kind"] == "adaptive"]
    out: dict[str, Any] = {}
    flip = next((r for r in rows if r["name"] == "flip-everything"), None)
    if flip:
        out["flip_everything"] = flip["rsi_index"]
        out["flip_everything_goal_met"] = flip["rsi_index"] <= 0.02
        out["flip_everything_bar_met"] = flip["rsi_index"] <= 0.05
    if blind:
        best = max(blind, key=lambda r: r["rsi_index"])
        out.update(best_blind=best["name"], best_blind_rsi=best["rsi_index"], best_blind_se=best["rsi_se"])
        benches = best["benchmarks"]
        picks = {b: max(blind, key=lambda r: r["per_benchmark"][b]["gain"]) for b in benches}
        out["oracle_blind"] = {b: {"recipe": r["name"], "gain": r["per_benchmark"][b]["gain"]} for b, r in picks.items()}
        out["oracle_blind_rsi"] = float(np.mean([v["gain"] for v in out["oracle_blind"].values()]))
    if adaptive:
        top = max(adaptive, key=lambda r: r["rsi_index"])
        out.update(best_adaptive=top["name"], best_adaptive_rsi=top["rsi_index"], best_adaptive_se=top["rsi_se"])
    if blind and adaptive:
        best_eps = best["episodes_detail"]
        out["best_blind_wins"] = {  # share of paired episodes (benchmark, seed) where the best blind recipe scores >=
            a["name"]: float(np.mean([x["gain"] >= y["gain"] for b in benches
                                      for x, y in zip(best_eps[b], a["episodes_detail"][b])])) for a in adaptive}
        out["gap"] = out["best_adaptive_rsi"] - out["best_blind_rsi"]
        out["gap_se"] = math.hypot(out["best_adaptive_se"], out["best_blind_se"])
        out["gap_vs_oracle_blind"] = out["best_adaptive_rsi"] - out["oracle_blind_rsi"]
    return out


def table(rows: list[dict[str, Any]], all_recipes: bool = True) -> list[str]:
    """Markdown: the issue's four rows, the headline gap, then (``all_recipes``) every recipe by benchmark."""
    by_name = {r["name"]: r for r in rows}
    h = headline(rows)
    seeds = rows[0]["seeds"] if rows else 0
    benches = rows[0]["benchmarks"] if rows else []

    def line(label: str, r: dict[str, Any]) -> str:
        return (f"| {label} | {r['rsi_index']:+.3f} ± {r['rsi_se']:.3f} | ${r['spend_usd']:.0f} | "
                f"{r['eval_share']:.0%} | " + " | ".join(f"{r['per_benchmark'][b]['gain']:+.3f}" for b in benches) + " |")

    head = ("| recipe / researcher | RSI-Index ± s.e. | mean spend | episodes that evaluated | "
            + " | ".join(benches) + " |")
    sep = "|---|---:|---:|---:|" + "---:|" * len(benches)
    lines = [f"Sim, joint track, ${rows[0]['budget'] if rows and 'budget' in rows[0] else BUDGET_USD:g}, "
             f"{len(benches)} benchmarks × {seeds} seeds (0–{seeds - 1}); s.e. over seeds of the per-seed RSI-Index.",
             "", head, sep]
    if "flip-everything" in by_name:
        lines.append(line("blind: flip-everything (goal ≤ 0.02, bar ≤ 0.05)", by_name["flip-everything"]))
    if "best_blind" in h:
        lines.append(line(f"blind: best fixed recipe (`{h['best_blind']}`)", by_name[h["best_blind"]]))
    for name in ADAPTIVE:
        if name in by_name:
            lines.append(line(f"adaptive: {name} researcher", by_name[name]))
    if "gap" in h:
        lines += ["", f"**Headline gap** (best adaptive `{h['best_adaptive']}` − best blind `{h['best_blind']}`): "
                      f"**{h['gap']:+.3f}** ± {h['gap_se']:.3f}. Against the best blind recipe per benchmark picked "
                      f"after the fact (RSI {h['oracle_blind_rsi']:+.3f}: "
                      + ", ".join(f"{b} `{v['recipe']}`" for b, v in h["oracle_blind"].items())
                      + f"): {h['gap_vs_oracle_blind']:+.3f}. The best blind recipe scores at least as much as "
                      + ", ".join(f"`{a}` on {w:.0%}" for a, w in h["best_blind_wins"].items())
                      + " of the paired episodes (same benchmark and seed)."]
    if all_recipes:
        lines += ["", "Every recipe (gain per benchmark; blind ones evaluate nothing):", "", head, sep]
        for r in sorted(rows, key=lambda r: (r["kind"] != "blind", -r["rsi_index"])):
            lines.append(line(f"{r['kind']}: `{r['name']}`", r))
    return lines


# --------------------------------------------------------------------------------------------
# The local world: flip-everything once per benchmark


def measure_local(benchmarks: list[str] | None = None, seeds: int | list[int] = 1, recipes: list[str] | None = None,
                  progress: bool = False) -> list[dict[str, Any]]:
    """Each recipe (default ``flip-everything``; any blind recipe or baseline researcher, e.g. ``scripted``)
    on each local benchmark and seed, one episode at a time; initial -> final official score."""
    rows = []
    for name in recipes or ["flip-everything"]:
        for seed in (range(seeds) if isinstance(seeds, int) else seeds):
            for bench in benchmarks or list(BENCHMARKS):
                load_before = os.getloadavg()[0]
                started = time.perf_counter()
                env = gym.make(ENV_ID, world="local", benchmark=bench)
                try:
                    researcher = make_researcher(name)
                    result = run_episode(env, researcher, seed=seed)
                finally:
                    env.close()
                info = result.info
                row = {"recipe": name, "benchmark": bench, "local": LOCAL_BENCHMARKS.get(bench, bench), "seed": seed,
                       "initial": info.get("initial_score"), "official": info.get("official_score"),
                       "gain": float(result.reward), "spend": float(info.get("spend_usd") or 0.0),
                       "budget": info.get("budget_usd"), "dev_evaluations": int(info.get("dev_evaluations") or 0),
                       "flipped": getattr(researcher, "flipped", None), "end_reason": info.get("end_reason"),
                       "seconds": round(time.perf_counter() - started, 1),
                       "load": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
                rows.append(row)
                if progress:
                    print(f"local {name:16s} seed {seed} {bench:20s} {row['initial']:.3f} -> {row['official']:.3f} "
                          f"gain {row['gain']:+.3f} ${row['spend']:.2f} [{row['seconds']:.0f} s, load "
                          f"{row['load'][0]} -> {row['load'][1]}]", flush=True)
    return rows


def table_local(rows: list[dict[str, Any]]) -> list[str]:
    """One row per recipe: the mean normalized gain on each benchmark over its seeds (each seed's gain in
    brackets), the RSI-Index (mean over benchmarks) with its s.e. over seeds, and the mean spend."""
    benches = list(dict.fromkeys(r["benchmark"] for r in rows))
    lines = ["| recipe | " + " | ".join(f"{b} ({LOCAL_BENCHMARKS.get(b, b)})" for b in benches)
             + " | RSI-Index ± s.e. (seeds) | spend |", "|---|" + "---:|" * (len(benches) + 2)]
    for name in dict.fromkeys(r["recipe"] for r in rows):
        mine = [r for r in rows if r["recipe"] == name]
        cells = []
        for b in benches:
            gains = [r["gain"] for r in mine if r["benchmark"] == b]
            cells.append(f"{np.mean(gains):+.3f} (" + ", ".join(f"{g:+.3f}" for g in gains) + ")" if gains else "")
        seeds = sorted({r["seed"] for r in mine})
        per_seed = [float(np.mean([r["gain"] for r in mine if r["seed"] == s])) for s in seeds]
        spend = float(np.mean([r["spend"] for r in mine]))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | **{np.mean(per_seed):+.3f}** ± {_se(per_seed):.3f} "
                     f"({len(seeds)}) | ${spend:.2f} |")
    flips = next((r["flipped"] for r in rows if r.get("flipped")), None)
    if flips:
        lines += ["", "Flips applied by flip-everything (the local world's harness.toml): "
                  + "; ".join(f"`{f}`" for f in flips) + "."]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--benchmarks", default="all")
    parser.add_argument("--recipes", default="all", help="comma-separated (default: " + ", ".join([*RECIPES_BY_NAME, *ADAPTIVE]).replace("%", "%%") + ")")
    parser.add_argument("--budget", type=float, default=BUDGET_USD)
    parser.add_argument("--json", default="", help="write rows and headline here")
    parser.add_argument("--local", action="store_true", help="also flip-everything on the local world (slow)")
    parser.add_argument("--local-only", action="store_true", help="only the local-world check")
    parser.add_argument("--local-seeds", default="1", help="seeds of the local-world check: N (0..N-1) or a list: 2, or 2,3")
    parser.add_argument("--local-recipes", default="flip-everything",
                        help="comma-separated recipes or researchers of the local-world check (e.g. flip:bools,scripted)")
    args = parser.parse_args(argv)
    benches = None if args.benchmarks == "all" else args.benchmarks.split(",")
    recipes = None if args.recipes == "all" else args.recipes.split(",")
    command = "bench/bench_blind_recipes.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": command, "cpus": os.cpu_count()}
    if not args.local_only:
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        rows = measure(args.seeds, benches, recipes, args.budget, progress=True)
        for r in rows:
            r["budget"] = args.budget
        out.update(sim={"seeds": args.seeds, "budget_usd": args.budget, "wall_s": round(time.perf_counter() - t0, 1),
                        "load_before": load0, "load_after": os.getloadavg(), "headline": headline(rows),
                        "rows": rows})
        print(f"\n{out['date']}, load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}, {out['sim']['wall_s']} s\n")
        print("\n".join(table(rows)))
    if args.local or args.local_only:
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        seeds = [int(x) for x in args.local_seeds.split(",") if x] if "," in args.local_seeds else int(args.local_seeds)
        local = measure_local(benches, seeds, args.local_recipes.split(","), progress=True)
        out["local"] = {"rows": local, "wall_s": round(time.perf_counter() - t0, 1), "load_before": load0,
                        "load_after": os.getloadavg()}
        print("\n" + "\n".join(table_local(local)))
    if args.json:
        Path(args.json).write_text(json.dumps(for_json(out), indent=1, default=str) + "\n")
    return 0


EPISODE_FIELDS = ("seed", "gain", "spend", "dev_evaluations", "end_reason")


def for_json(out: dict[str, Any]) -> dict[str, Any]:
    """``out`` with each episode cut to ``EPISODE_FIELDS`` (gains and spends rounded) and written as one
    line per benchmark, so the file stays small enough to commit and diff.

    >>> row = {"episodes_detail": {"aime": [{"seed": 0, "gain": 0.123456, "spend": 1.0, "flipped": ["x"]}]}}
    >>> for_json({"sim": {"rows": [row]}})["sim"]["rows"][0]["episodes_detail"]["aime"]
    '[{"seed":0,"gain":0.1235,"spend":1.0}]'
    """
    def cut(episode: dict[str, Any]) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in episode.items() if k in EPISODE_FIELDS}

    sim = out.get("sim")
    if not sim:
        return out
    rows = [{**row, "episodes_detail": {b: json.dumps([cut(e) for e in eps], separators=(",", ":"))
                                        for b, eps in row.get("episodes_detail", {}).items()}}
            for row in sim.get("rows", [])]
    return {**out, "sim": {**sim, "rows": rows}}


if __name__ == "__main__":
    sys.exit(main())
