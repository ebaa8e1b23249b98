"""Worlds by name. A world is five services, a clock and an initial system (see ``services.World``).

Add a world by writing a factory ``(scenario, seed, run_dir) -> World`` and registering it. Each
factory imports its world's package only when a scenario asks for it.

**Layering rule.** Worlds sit below the researchers: no module under ``rsigym_env/worlds/`` imports
``rsigym_env.agents``, ``rsigym_env.baselines``, ``rsigym_env.sweep`` or ``rsigym_env.env``, not even
inside a function (``tests/test_layering.py``; ``lint-imports`` checks it over the import graph). A
world that runs researchers itself - the recursive world's inner episodes - is handed what it needs
(:mod:`.recursive.ports`; ``import rsigym_env`` installs it).

>>> sorted(WORLDS)
['local', 'recursive', 'remote', 'sim']
>>> world = make_world(load_scenario(benchmark="aime"), seed=0)
>>> world.name, "harness.toml" in world.initial_harness()
('sim', True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..scenario import Scenario, load_scenario  # noqa: F401  (load_scenario: doctest)
from ..services import World

WorldFactory = Callable[[Scenario, int, "Path | None"], World]


def _sim(scenario: Scenario, seed: int, run_dir: Path | None) -> World:
    from .sim import SimWorld

    sandbox = scenario.permissions.sandbox
    return SimWorld(
        scenario.benchmark, seed, vcpus=sandbox.vcpus, memory_gib=sandbox.memory_gib, options=scenario.world_options
    )


def _local(scenario: Scenario, seed: int, run_dir: Path | None) -> World:
    from .local.world import LocalWorld

    return LocalWorld(scenario, seed, run_dir)


def _remote(scenario: Scenario, seed: int, run_dir: Path | None) -> World:
    from .remote.world import RemoteWorld

    return RemoteWorld(scenario, seed, run_dir)


def _recursive(scenario: Scenario, seed: int, run_dir: Path | None) -> World:
    from .recursive.world import make_recursive_world

    return make_recursive_world(scenario, seed, run_dir)


WORLDS: dict[str, WorldFactory] = {"sim": _sim, "local": _local, "recursive": _recursive, "remote": _remote}


def register_world(name: str, factory: WorldFactory) -> None:
    """Make ``world=name`` available to scenarios and ``gymnasium.make``."""
    WORLDS[name] = factory


def make_world(scenario: Scenario, seed: int, run_dir: Path | None = None) -> World:
    """Build the scenario's world for one episode."""
    if scenario.world not in WORLDS:
        raise ValueError(f"unknown world {scenario.world!r}; worlds: {', '.join(sorted(WORLDS))}")
    return WORLDS[scenario.world](scenario, seed, run_dir)
