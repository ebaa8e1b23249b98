"""Issue 25, classes 2 and 4: what any number of episodes learn about their official tasks is worth nothing later.

Each episode of the local world in secret mode scores on official tasks drawn from the platform's secret and
a nonce of the episode's own (``rsigym_env.splits``). Attacked as a researcher who learns across episodes:

* The strongest learner there is: it knows every earlier episode's official tasks *with their answers* (far
  more than official rewards reveal, and more than any covert channel — the page cache, timing, the
  host's counters — could carry out of an official trial). Everything it learned is also what the public
  package gives anyone: its table covers no more of the next episode's tasks than a table built from the
  package's public streams alone. With one fixed draw per machine (what main had) it covered all of them.
* End to end, through the public API: a harness carrying every answer of the previous episode's official
  tasks (the page-cache channel of class 4, modelled as perfect) scores nothing on the next episode.
"""

from __future__ import annotations

import json
import math
import os
import stat

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.splits import NONCE_ENV, SECRET_ENV, official_split
from rsigym_env.worlds.local import benchmarks
from rsigym_env.worlds.local.benchmarks.base import INDEX_FILE
from rsigym_env.worlds.local.sandbox import isolation

from .test_official_split import TABLE_ONLY, quick

EARLIER_EPISODES = 40
NEXT_EPISODES = 10


def visible(p: benchmarks.Problem) -> str:
    """What a task shows the harness: its instruction and its files (never the hidden expected state)."""
    return json.dumps([p.instruction, sorted(p.files.items())])


def draw(name: str, nonce: str) -> list[benchmarks.Problem]:
    return benchmarks.BENCHMARKS[name].split("official", official_split("secret", secret="s3cret", nonce=nonce))


@pytest.mark.parametrize("name", sorted(benchmarks.BENCHMARKS))
def test_earlier_episodes_official_tasks_teach_nothing_the_public_package_does_not(name):
    b = benchmarks.BENCHMARKS[name]
    learned = {visible(p) for i in range(EARLIER_EPISODES) for p in draw(name, f"episode-{i}")}
    # what anyone has without a single episode: the package draws the same distribution from a secret of their own
    public = {visible(p) for i in range(EARLIER_EPISODES)
              for p in b.split("official", official_split("secret", secret="anyone's own", nonce=str(i)))}
    later = [p for j in range(NEXT_EPISODES) for p in draw(name, f"later-{j}")]
    known = sum(visible(p) in learned for p in later) / len(later)
    known_publicly = sum(visible(p) in public for p in later) / len(later)
    spread = max(known_publicly * (1 - known_publicly), 1 / len(later))
    noise = 3 * math.sqrt(2 * spread / len(later))
    assert known <= known_publicly + noise, (known, known_publicly)
    # the canary: one fixed draw, the same in every episode, is fully known after the first
    fixed = {visible(p) for p in draw(name, "")}
    assert sum(visible(p) in fixed for p in draw(name, "")) / 30 == 1.0 > known_publicly + noise


def answer(p: benchmarks.Problem) -> str | None:
    """The answer a task's solution states (``ANSWER: x``), as TABLE_ONLY reads it."""
    return next((a.rsplit("ANSWER:", 1)[1].strip() for a in p.solution if "ANSWER:" in a), None)


def official_tasks(world) -> list[str]:
    return json.loads((world.tasks["official"] / INDEX_FILE).read_text())


@pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")
def test_every_episode_draws_official_tasks_of_its_own_and_keeps_them_private(monkeypatch):
    monkeypatch.delenv(NONCE_ENV, raising=False)
    from rsigym_env.worlds.local.world import tasks_cache

    env = gym.make("RSIGym/Joint-v0", scenario=quick("local-joint-aime"), world_options={"early_official": False})
    seen = []
    try:
        for _ in range(2):
            env.reset(seed=0)  # the same seed: a loop that resets with seed 0 every time
            world = env.unwrapped.run.world
            directory = world.tasks["official"]
            assert not str(directory).startswith(str(tasks_cache())), "an episode's own draw in the shared cache"
            assert stat.S_IMODE(directory.parent.parent.stat().st_mode) == 0o700
            seen.append((json.loads((world.tasks["dev"] / INDEX_FILE).read_text()), official_tasks(world),
                         dict(world.official_split), directory))
    finally:
        env.close()
    (dev1, official1, split1, dir1), (dev2, official2, split2, dir2) = seen
    assert dev1 == dev2                                   # dev stays public and seeded
    assert not set(official1) & set(official2)            # the held-out tasks do not
    assert split1["mode"] == split2["mode"] == "secret" and split1["draw"] == split2["draw"] == "per-episode"
    assert split1["id"] == split2["id"] and split1["draw_id"] != split2["draw_id"]
    assert not dir1.exists() and not dir2.exists()        # gone with their episode
    blob = json.dumps([split1, split2])
    assert os.environ[SECRET_ENV] not in blob


@pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")
@pytest.mark.slow
def test_a_perfect_channel_out_of_an_official_evaluation_is_worth_nothing_in_the_next_episode(tmp_path, monkeypatch):
    """The page cache, the host's counters or any other channel can carry at most what an official trial saw:
    here the next episode gets all of it, answers included, and scores nothing with it beyond the few tasks its
    own draw gives it by chance (a fixed 1/30 bound failed once in CI when two of 30 recurred)."""
    monkeypatch.delenv(NONCE_ENV, raising=False)
    env = gym.make("RSIGym/Joint-v0", scenario=quick("local-joint-aime"), run_dir=tmp_path / "run",
                   world_options={"early_official": False})
    try:
        env.reset(seed=0)
        world = env.unwrapped.run.world
        leaked = json.dumps({p.instruction.strip(): p.solution for p in world.benchmark.split("official", world.split)})
        env.reset(seed=0)
        world = env.unwrapped.run.world
        table = json.loads(leaked)
        tasks = world.benchmark.split("official", world.split)
        # what the table-only harness gets right by chance alone: a task the new draw repeats, or one whose
        # answer is its fallback "0"
        recurring = sum(p.instruction.strip() in table or answer(p) == "0" for p in tasks) / len(tasks)
        for path, content in (("answers.json", leaked), ("agent.py", TABLE_ONLY)):
            assert env.step({"tool": "edit_harness", "args": {"path": path, "content": content}})[4]["ok"]
        end = env.step({"tool": "submit", "args": {}})[4]
    finally:
        env.close()
    assert end["official_split"]["draw"] == "per-episode"
    # the table answers only the tasks the new draw happens to repeat (a fixed draw would repeat all of them;
    # by chance a few of 30 at most: test_earlier_episodes_official_tasks_teach_nothing_the_public_package_does_not
    # bounds that rate by what the public package gives anyone), and nothing else carried over
    assert recurring < 0.25, recurring
    assert end["official_score"] <= recurring, (end["official_score"], recurring)
