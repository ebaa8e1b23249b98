"""Worlds for the service contract tests: the same assertions against ``local`` (here) and ``remote`` (with keys).

The local half builds a :class:`~rsigym_env.worlds.local.world.LocalWorld` on a tiny random base model
registered as ``rsigym-contract-tiny`` (the shipped base checkpoint is not needed for these contracts). The remote
half needs every credential the scenario names and skips otherwise, saying which are missing.
"""

from __future__ import annotations

import os

import pytest

from rsigym_env.scenario import load_scenario

WORLDS = ["local", "remote"]


def _local_world(tmp_path_factory: pytest.TempPathFactory):
    from rsigym_env.worlds.local.lm import tinker_client
    from rsigym_env.worlds.local.lm.model import ModelConfig
    from rsigym_env.worlds.local.world import LocalWorld

    root = tmp_path_factory.mktemp("contract-base")
    tinker_client.register_base_model("rsigym-contract-tiny", tinker_client.make_random_base(
        root / "base", ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=512)))
    scenario = load_scenario(world="local", benchmark="aime", budget_usd=5,
                             world_options={"base_model": "rsigym-contract-tiny"})
    return LocalWorld(scenario, seed=0, run_dir=tmp_path_factory.mktemp("contract-local"))


def _remote_world(tmp_path_factory: pytest.TempPathFactory):
    from rsigym_env.worlds.remote.config import RemoteOptions, required_credentials
    from rsigym_env.worlds.remote.world import RemoteWorld

    scenario = load_scenario("remote-joint-aime")
    options = RemoteOptions.model_validate(scenario.world_options)
    missing = [c.variable for c in required_credentials(options, scenario.permissions.teachers, scenario.tools())
               if not os.environ.get(c.variable)]
    if missing:
        pytest.skip(f"remote world: set {', '.join(missing)} to run this contract against the real services")
    return RemoteWorld(scenario, seed=0, run_dir=tmp_path_factory.mktemp("contract-remote"))


@pytest.fixture(scope="module", params=WORLDS)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A world of each kind, shared by a module's tests, closed afterwards."""
    w = _local_world(tmp_path_factory) if request.param == "local" else _remote_world(tmp_path_factory)
    yield w
    w.close()


def small_dataset(world, dataset_id: str = "ds-contract"):
    """A two-example chat dataset saved in the world (what generate_data would leave)."""
    rows = [{"messages": [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "5."}],
             "meta": {"passed": True}},
            {"messages": [{"role": "user", "content": "What is 4 plus 4?"}, {"role": "assistant", "content": "9."}],
             "meta": {"passed": False}}]
    return world.save_dataset(dataset_id, rows, "contract test")
