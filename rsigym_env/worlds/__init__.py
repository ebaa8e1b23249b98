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

import importlib
from pathlib import Path
from typing import Callable

from ..scenario import Scenario, load_scenario  # noqa: F401  (load_scenario: doctest)
from ..services import World

WorldFactory = Callable[[Scenario, int, "Path | None"], World]

# name -> "module:function" of the world's factory, imported only when a scenario names the world (so
# nothing that imports the registry — the env, the run — imports a concrete world; see pyproject's
# import-linter contracts), or a factory registered at run time
WORLDS: dict[str, WorldFactory | str] = {
    "sim": "rsigym_env.worlds.sim.world:from_scenario",
    "local": "rsigym_env.worlds.local.world:from_scenario",
    "recursive": "rsigym_env.worlds.recursive.world:make_recursive_world",
    "remote": "rsigym_env.worlds.remote.world:from_scenario",
}


def register_world(name: str, factory: WorldFactory | str) -> None:
    """Make ``world=name`` available to scenarios and ``gymnasium.make``: a factory, or the
    ``"module:function"`` path of one (imported when a scenario first names the world)."""
    WORLDS[name] = factory


def world_factory(name: str) -> WorldFactory:
    """The factory registered as ``name`` (importing its module if it was registered by path)."""
    entry = WORLDS[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
    return entry


def make_world(scenario: Scenario, seed: int, run_dir: Path | None = None) -> World:
    """Build the scenario's world for one episode."""
    if scenario.world not in WORLDS:
        raise ValueError(f"unknown world {scenario.world!r}; worlds: {', '.join(sorted(WORLDS))}")
    return world_factory(scenario.world)(scenario, seed, run_dir)
