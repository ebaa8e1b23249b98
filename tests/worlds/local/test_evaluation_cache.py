"""Evaluations of a content-identified system (the shipped base model, or a checkpoint identified by
its weights) are computed once per (model, harness, split, k, seeds) and reused: an official one
marked cached and costing nothing, a dev one restored with its trial logs and billed as when it ran."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from rsigym_env.scenario import load_scenario
from rsigym_env.services import EvalRequest
from rsigym_env.worlds.local.sandbox import isolation
from rsigym_env.worlds.common.harness import minimal_harness
from rsigym_env.worlds.local.lm.tinker_client import weights_identity
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


def dev_request(files: dict[str, str], n_tasks: int = 3) -> EvalRequest:
    return EvalRequest(checkpoint="base", harness_version="h", harness_files=files, split="dev", k=1, n_tasks=n_tasks)


@pytest.mark.slow
def test_a_repeated_dev_evaluation_of_the_base_system_is_restored_with_its_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    scenario = load_scenario("local-joint-aime")
    first_world = LocalWorld(scenario, seed=3)
    try:
        first = first_world.evaluation.start(dev_request(minimal_harness()), "job-1").future.result(timeout=300)
        first_dir = first_world.evaluation.run_dir / "job-1"
        assert not first.value.cached and first.cost_usd > 0
    finally:
        first_world.close()
    world = LocalWorld(scenario, seed=3)
    try:
        ev = world.evaluation
        again = ev.start(dev_request(minimal_harness()), "job-5").future.result(timeout=300)
        fresh = ev.start(dev_request(minimal_harness(), n_tasks=2), "job-6").future.result(timeout=300)
        job = ev.run_dir / "job-5"
        summary = json.loads((job / "summary.json").read_text())
        texts = [f.read_bytes() for f in job.rglob("*") if f.is_file()]
        trial_logs = [(job / trial["dir"] / "result.json").is_file() for trial in summary["trials"]]
    finally:
        world.close()
    assert again.value.cached and not fresh.value.cached  # other tasks: another evaluation
    assert again.value.model_dump(exclude={"cached"}) == first.value.model_dump(exclude={"cached"})
    assert again.cost_usd == first.cost_usd  # the same evaluation, the same bill: cold and warm episodes agree
    assert summary["id"] == "job-5" and summary["cached"] and summary["score"] == first.value.score
    assert len(trial_logs) == 3 and all(trial_logs)  # its trial logs, readable
    assert not any(str(first_dir.resolve()).encode() in t or b"@RSIGYM_EVAL_DIR@" in t for t in texts)
    assert any(str(job.resolve()).encode() in t for t in texts)  # Harbor's records point at the new place


def test_a_checkpoint_is_identified_by_its_weights_not_its_name_or_files(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"layers.0.attn.qkv.A": rng.standard_normal((8, 4), dtype=np.float32),
              "layers.0.attn.qkv.B": np.zeros((4, 8), np.float32)}

    def checkpoint(name: str, values: dict[str, np.ndarray], rank: int = 4) -> str | None:
        path = tmp_path / name
        path.mkdir()
        (path / "meta.json").write_text(json.dumps({"base_model": "rsigym-base", "name": name, "model_id": name,
                                                    "lora_config": {"rank": rank}}))
        np.savez(path / "adapter.npz", **values)
        return weights_identity(path, "rsigym-base:abc")

    one = checkpoint("ckpt-1", arrays)
    assert one is not None and one.startswith("rsigym-base:abc+")
    assert checkpoint("ckpt-7", dict(arrays)) == one  # another name, another file: the same weights
    changed = dict(arrays, **{"layers.0.attn.qkv.B": np.full((4, 8), 1e-7, np.float32)})
    assert checkpoint("ckpt-2", changed) != one
    assert checkpoint("ckpt-3", arrays, rank=8) != one
    assert weights_identity(tmp_path / "ckpt-1", "rsigym-base:other") != one
    shutil.rmtree(tmp_path / "ckpt-1")
    assert weights_identity(tmp_path / "ckpt-1", "rsigym-base:abc") is None  # unreadable: never cached
