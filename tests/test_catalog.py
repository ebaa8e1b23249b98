"""The catalog is the one list of shared names: every world's own tables are keyed by it."""

from __future__ import annotations

import gymnasium as gym

import rsigym_env
from rsigym_env import catalog
from rsigym_env.prices import DEFAULT_PRICES
from rsigym_env.scenario import Permissions, load_scenario


def test_every_world_has_the_catalogs_benchmarks():
    from rsigym_env.worlds.local.benchmarks import BENCHMARKS as LOCAL, PAPER_IDS
    from rsigym_env.worlds.remote.config import BENCHMARKS as REMOTE
    from rsigym_env.worlds.sim.benchmarks import BENCHMARKS as SIM

    assert tuple(SIM) == tuple(REMOTE) == catalog.BENCHMARKS == catalog.BENCHMARKS_BY_WORLD["sim"]
    assert PAPER_IDS == {paper: local for paper, local in catalog.LOCAL_BENCHMARKS.items()}
    assert sorted(LOCAL) == sorted(catalog.BENCHMARKS_BY_WORLD["local"])


def test_the_tables_keyed_by_benchmark_cover_the_catalog():
    from rsigym_env.report import PAPER
    from rsigym_env.wrappers.menu import BENCHMARKS as MENU_BENCHMARKS

    assert tuple(PAPER) == tuple(MENU_BENCHMARKS) == catalog.BENCHMARKS


def test_every_world_has_the_catalogs_teachers():
    from rsigym_env.worlds.local.teachers import TEACHER_ACCURACY, TEACHER_PRICES, TEACHERS
    from rsigym_env.worlds.sim.benchmarks import BENCHMARKS, TEACHER_DUPLICATES

    sim = set(catalog.TEACHERS["sim"])
    assert set(DEFAULT_PRICES.teachers) == set(TEACHER_DUPLICATES) == sim
    assert all(set(b.domain.teacher_accuracy) == sim for b in BENCHMARKS.values())
    assert Permissions().teachers == list(catalog.SIM_TEACHERS)
    local = set(catalog.TEACHERS["local"])
    assert set(TEACHERS) == set(TEACHER_ACCURACY) == set(TEACHER_PRICES) == local
    for world in ("sim", "local", "remote"):
        assert tuple(load_scenario(world=world).permissions.teachers) == catalog.TEACHERS[world]


def test_the_remedies_are_the_minimal_harness_settings():
    from rsigym_env.worlds.common.harness import REMEDIES, minimal_harness
    from rsigym_env.worlds.sim.world import MINIMAL_HARNESS_TOML

    local = minimal_harness()["harness.toml"]
    for r in catalog.REMEDIES:
        assert REMEDIES[r.key] == (r.section, r.minimal, r.fixed)
        assert f"{r.key} = {r.minimal}" in local
        if r.failure in catalog.DEFECTS:
            assert f"{r.key} = {r.minimal}" in MINIMAL_HARNESS_TOML


def test_every_track_is_registered_under_its_id():
    from typing import get_args

    from rsigym_env.gateway.service import RunRequest
    from rsigym_env.scenario import TRACK_TOOLS, Track

    assert rsigym_env.ENV_IDS == catalog.ENV_IDS
    assert get_args(Track) == catalog.TRACKS == tuple(TRACK_TOOLS)
    assert get_args(RunRequest.model_fields["track"].annotation)[0] == Track
    for track, env_id in catalog.TRACK_ENV_IDS.items():
        assert gym.spec(env_id).kwargs["track"] == track
        assert catalog.env_id(track) == env_id and catalog.track_of(env_id) == track
