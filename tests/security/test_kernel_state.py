"""Issue 25, class 4: kernel state shared between sandboxes.

Attacked as a researcher would, through ``sandbox_exec`` (the same isolation as every evaluation trial):
the host-wide counters a sandbox could watch for another sandbox's work — the load average and the global
last-PID (``/proc/loadavg``), CPU times, context switches and forks since boot (``/proc/stat``) — are a
still picture that the host's activity does not move. What remains shared (the page cache, other ``/proc``
counters, wall time) is listed in the README's known limits; with every episode drawing official tasks of
its own, nothing an official trial could leave in it is worth anything later
(``test_official_draw.test_a_perfect_channel_out_of_an_official_evaluation_is_worth_nothing_in_the_next_episode``).
"""

from __future__ import annotations

import subprocess

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.worlds.local.sandbox import isolation

pytestmark = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")

LOOK = "cat /proc/loadavg; echo ---; cat /proc/stat"


def test_the_hosts_load_and_cpu_counters_are_a_still_picture_inside_the_sandbox():
    from .test_official_split import quick

    env = gym.make("RSIGym/Joint-v0", scenario=quick("local-joint-aime"), world_options={"early_official": False})
    try:
        env.reset(seed=0)
        seen = []
        for _ in range(2):
            info = env.step({"tool": "sandbox_exec", "args": {"command": LOOK}})[4]
            assert info["ok"], info
            seen.append(info["result"]["stdout"])
            for _ in range(30):  # the host forks, switches and burns CPU in between
                subprocess.run(["true"], check=True)
    finally:
        env.close()
    assert seen[0] == seen[1]
    loadavg, stat = seen[0].split("---\n")
    assert loadavg.strip() == "0.00 0.00 0.00 1/1 1"
    counters = {line.split()[0]: line.split()[1:] for line in stat.splitlines()}
    assert counters["ctxt"] == ["0"] and counters["processes"] == ["0"] and set(counters["cpu"]) == {"0"}
    assert open("/proc/stat").read() != stat  # the host's own file moves; the sandbox's does not
