"""Worlds for the service contract tests: the same assertions against ``local`` and ``remote``.

The local half builds a :class:`~rsigym_env.worlds.local.world.LocalWorld` on a tiny random base model
registered as ``rsigym-contract-tiny`` (the shipped base checkpoint is not needed for these contracts). The remote
half runs the remote world's own code and the unchanged SDKs: against the real services when every credential
``remote-joint-aime`` names is set, else against the providers' local counterparts (``rsigym counterparts``,
:mod:`rsigym_env.counterparts`), started for the test session with ``remote-counterparts-aime`` (never skipped).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

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


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _missing_real_credentials(scenario) -> list[str]:
    from rsigym_env.worlds.remote.config import RemoteOptions, required_credentials

    options = RemoteOptions.model_validate(scenario.world_options)
    return [c.variable for c in required_credentials(options, scenario.permissions.teachers, scenario.tools())
            if not os.environ.get(c.variable)]


@pytest.fixture(scope="session")
def remote_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The scenario the remote half runs: the real services' when their keys are set, else the counterparts' (started
    here, their variables set for the session)."""
    real = load_scenario("remote-joint-aime")
    if not _missing_real_credentials(real):
        yield "remote-joint-aime"
        return
    from rsigym_env.counterparts.stack import Counterparts
    from rsigym_env.worlds.local.sandbox.isolation import bwrap_available

    with Counterparts(tmp_path_factory.mktemp("counterparts"), require_isolation=bwrap_available(),
                      long_poll_s=5.0) as stack, _environment(stack.environment()):
        yield "remote-counterparts-aime"


def _remote_world(tmp_path_factory: pytest.TempPathFactory, scenario_name: str):
    from rsigym_env.worlds.remote.world import RemoteWorld

    return RemoteWorld(load_scenario(scenario_name), seed=0, run_dir=tmp_path_factory.mktemp("contract-remote"))


@pytest.fixture(scope="module", params=WORLDS)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A world of each kind, shared by a module's tests, closed afterwards."""
    if request.param == "local":
        w = _local_world(tmp_path_factory)
    else:
        w = _remote_world(tmp_path_factory, request.getfixturevalue("remote_services"))
    yield w
    w.close()


def small_dataset(world, dataset_id: str = "ds-contract"):
    """A two-example chat dataset saved in the world (what generate_data would leave)."""
    rows = [{"messages": [{"role": "user", "content": "What is 2 plus 3?"}, {"role": "assistant", "content": "5."}],
             "meta": {"passed": True}},
            {"messages": [{"role": "user", "content": "What is 4 plus 4?"}, {"role": "assistant", "content": "9."}],
             "meta": {"passed": False}}]
    return world.save_dataset(dataset_id, rows, "contract test")
