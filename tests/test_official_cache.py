"""The initial system's official evaluation is computed once per (model, harness, split, k, seeds) and
reused: the same evaluation, marked cached, costing nothing."""

from __future__ import annotations

import pytest

from rsigym_env.scenario import load_scenario
from rsigym_env.services import EvalRequest
from rsigym_env.worlds.local import isolation
from rsigym_env.worlds.local.harness import minimal_harness
from rsigym_env.worlds.local.world import LocalWorld

pytestmark = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")


def request(files: dict[str, str], k: int = 1) -> EvalRequest:
    return EvalRequest(checkpoint="base", harness_version="h", harness_files=files, split="official", k=k)


@pytest.mark.slow
def test_a_repeated_official_evaluation_of_the_base_system_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    scenario = load_scenario("local-joint-gpqa-diamond")
    first_world = LocalWorld(scenario, seed=7)
    try:
        first = first_world.evaluation.official(request(minimal_harness()))
        assert not first.value.cached and first.cost_usd > 0
    finally:
        first_world.close()
    again_world = LocalWorld(scenario, seed=7)
    try:
        again = again_world.evaluation.official(request(minimal_harness()))
        ev = again_world.evaluation
        tasks = ev._plan(request(minimal_harness()), "official")
        changed = dict(minimal_harness(), **{"prompt.md": "Reply with one line."})
        keys = {ev._cache_key(request(minimal_harness()), tasks), ev._cache_key(request(changed), tasks),
                ev._cache_key(request(minimal_harness(), k=2), tasks),
                ev._cache_key(request(minimal_harness()).model_copy(update={"checkpoint": "ckpt-1"}), tasks)}
    finally:
        again_world.close()
    assert again.value.cached and again.cost_usd == 0.0
    assert again.value.model_dump(exclude={"cached"}) == first.value.model_dump(exclude={"cached"})
    assert None in keys and len(keys) == 4  # another harness, k or checkpoint is another evaluation (or none)
    other_seed = LocalWorld(scenario, seed=8)
    try:
        assert not other_seed.evaluation.official(request(minimal_harness())).value.cached
    finally:
        other_seed.close()
