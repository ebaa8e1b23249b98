"""Rounds of recursion (:func:`recurse`, ``rsigym recurse``): each round's improved researcher is the next one's target.

Round ``t`` runs one outer episode of the recursive world in which the improver improves the current
target; the submitted spec is registered (``parent`` = the target) and becomes round ``t+1``'s target
(``mode="target"``) or its improver *and* target (``mode="improver"``: the researcher improves itself).
Every index is an official measurement (:func:`~.measure.measure`), recomputable from the registry.
"""

from __future__ import annotations

from typing import Any, Sequence

from ...catalog import env_id as env_id_of
from ...episode import run_episode
from ...metrics import compounding, improver_gain, mean_se
from ...scenario import Scenario
from .measure import Measurement, measure
from .ports import Researchers, researchers
from .world import RecursiveOptions


def _official_index(spec: Any, opts: RecursiveOptions, k: int, using: Researchers) -> Measurement:
    return measure(spec, opts, "official", k, using=using)


def recurse(
    scenario: Scenario, *, rounds: int = 3, seeds: Sequence[int] = (0, 1, 2), improver: Any = "scripted",
    target: Any = None, mode: str = "target", registry: Any = None,
    ray: bool | None = None, on_round: Any = None, using: Researchers | None = None,
) -> dict[str, Any]:
    """Run ``rounds`` rounds of improvement for each chain seed; register every improved spec.

    Returns ``{"config", "rows", "chains", "summary"}``: one row per (seed, round) with the target and
    improver ids, the official index before and after (raw, unfloored), the improver gain, the outer
    episode's reward and research-quality metrics; per chain the indices and :func:`compounding`; the
    summary has mean ± s.e. over chains of the first-round improver gain and of the compounded gain.
    """
    import gymnasium as gym

    using = using or researchers()
    if mode not in ("target", "improver"):
        raise ValueError(f"mode must be 'target' or 'improver', got {mode!r}")
    registry = registry or using.registry()
    opts = RecursiveOptions.model_validate(scenario.world_options)
    if ray is not None:
        opts = opts.model_copy(update={"ray": ray})
    first_target = (registry.get(target) if isinstance(target, str)
                    else target if target is not None else opts.spec(registry, using))
    first_improver = registry.get(improver) if isinstance(improver, str) else improver
    registry.register(first_target)
    registry.register(first_improver)
    env_id = env_id_of(scenario.track)
    k = scenario.official_k
    rows: list[dict[str, Any]] = []
    chains: list[dict[str, Any]] = []
    for seed in seeds:
        tgt, imp = first_target, first_improver
        indices = [_official_index(tgt, opts, k, using).index]
        ids = [tgt.id]
        for r in range(rounds):
            scen = scenario.model_copy(update={"world_options": opts.model_copy(update={
                "target_spec": tgt.model_dump(mode="json")}).model_dump(mode="json")})
            env = gym.make(env_id, scenario=scen)
            result = run_episode(env, using.build(imp), seed=seed * 1000 + r)
            sub = result.info["submitted"]
            files = env.unwrapped.harness_files(sub["harness"])
            env.close()
            if files == tgt.to_files():
                improved = tgt
            else:
                improved = using.derived_from_files(files, parent=tgt.id)
            registry.register(improved, note=f"recurse: seed {seed} round {r + 1} from {tgt.id}")
            before, after = indices[-1], _official_index(improved, opts, k, using).index
            indices.append(after)
            ids.append(improved.id)
            row = {
                "seed": seed, "round": r + 1, "mode": mode, "improver": imp.id, "target": tgt.id, "improved": improved.id,
                "changed": improved.id != tgt.id, "index_before": before, "index_after": after,
                "improver_gain": improver_gain(before, after), "reward": result.reward,
                "dev_evaluations": result.info["dev_evaluations"],
                "spend_usd": result.info["spend_usd"], "steps": result.steps,
                "best_dev_score": result.info.get("best_dev_score"), "metrics": result.info.get("metrics", {}),
                "params": {k2: v for k2, v in improved.params.items()},
            }
            rows.append(row)
            if on_round is not None:
                on_round(row)
            if mode == "target":
                tgt = improved
            else:
                imp = tgt = improved
        chains.append({"seed": seed, "ids": ids, "indices": indices, "compounding": compounding(indices)})
    first = [row["improver_gain"] for row in rows if row["round"] == 1]
    total = [c["compounding"]["total"] for c in chains]
    later = [c["compounding"]["later_rounds"] for c in chains]
    per_round = {r: mean_se([row["improver_gain"] for row in rows if row["round"] == r]) for r in range(1, rounds + 1)}
    summary = {
        "original_index": chains[0]["indices"][0] if chains else None,
        "first_round_improver_gain": mean_se(first), "compounding_total": mean_se(total),
        "compounding_later_rounds": mean_se(later), "improver_gain_by_round": per_round,
        "final_index": mean_se([c["indices"][-1] for c in chains]),
    }
    config = {"scenario": scenario.name, "rounds": rounds, "seeds": list(seeds), "mode": mode,
              "improver": first_improver.id, "target": first_target.id, "official_k": k,
              "options": opts.model_dump(mode="json", exclude={"target_spec"})}
    return {"config": config, "rows": rows, "chains": chains, "summary": summary}
