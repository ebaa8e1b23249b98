"""One state directory and one cache directory, both moved by $RSIGYM_HOME."""

from __future__ import annotations

from pathlib import Path

from rsigym_env import agents, home, splits
from rsigym_env.worlds.local.world import tasks_cache
from rsigym_env.worlds.remote.pricing import refreshed_path


def test_rsigym_home_moves_state_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path))
    assert home.state_dir() == splits.rsigym_home() == agents.rsigym_home() == tmp_path
    assert refreshed_path() == tmp_path / "prices" / "tinker_models.json"
    assert home.cache_dir() == tmp_path / "cache" and tasks_cache() == tmp_path / "cache" / "tasks"


def test_without_rsigym_home_state_stays_in_dot_rsigym_and_caches_follow_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("RSIGYM_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    assert home.state_dir("agents") == Path.home() / ".rsigym" / "agents"
    assert tasks_cache() == tmp_path / "xdg-cache" / "rsigym" / "tasks"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert home.cache_dir() == tmp_path / ".cache" / "rsigym"  # the platform default on Linux
