"""Issue 11, item 3: the held-out split cannot be computed from the package.

Attacked as a researcher would: compute the official answers offline from the package and ship
them in the harness. With the split drawn from the platform's secret they are worth nothing; in
the documented public mode (reproducible comparisons) the same harness would be perfect, which is
what shows the secret is the defence. The secret lives outside every sandbox, results say which
split they were scored on, and nothing the researcher can read names an official task.
"""

from __future__ import annotations

import json
import math
import os
import stat
import textwrap

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.splits import SECRET_ENV, official_split
from rsigym_env.worlds.local import benchmarks
from rsigym_env.worlds.local.sandbox import isolation

TABLE_ONLY = textwrap.dedent('''
    import json, os
    here = os.path.dirname(os.path.abspath(__file__))
    table = json.load(open(os.path.join(here, "answers.json")))
    instruction = open(os.environ["RSIGYM_INSTRUCTION_FILE"]).read().strip()
    answer = next((a.rsplit("ANSWER:", 1)[1].strip() for a in table.get(instruction, []) if "ANSWER:" in a), "0")
    open(os.path.join(os.environ.get("RSIGYM_APP_DIR", "/app"), "answer.txt"), "w").write(answer + "\\n")
    json.dump({"end_reason": "answer", "steps": []}, open("/logs/agent/trajectory.json", "w"))
''')


def quick(name: str):
    """A bundled scenario with avg@1 official evaluations (a third of the trials)."""
    from rsigym_env.scenario import load_scenario

    return load_scenario(name).model_copy(update={"official_k": 1})


def public_table(name: str) -> str:
    b = benchmarks.resolve(name)
    return json.dumps({p.instruction.strip(): p.solution for p in b.split("official")})


@pytest.mark.parametrize("name", sorted(benchmarks.BENCHMARKS))
def test_secret_split_shares_nothing_with_what_the_package_computes(name):
    """The public split shares with a secret draw no more than any independent draw does (small task spaces —
    local-skills has ~240 instructions — share a few tasks by chance), and never a dev task."""
    b = benchmarks.BENCHMARKS[name]
    computable = {p.key for s in ("dev", "official") for p in b.split(s)}  # public: anyone can generate these
    shared = chance = 0
    for i in range(20):
        secret = b.split("official", official_split("secret", secret="a secret nobody ships", nonce=str(i)))
        other = {p.key for p in b.split("official", official_split("secret", secret="another secret", nonce=str(i)))}
        assert len(secret) == 30 and [p.key for p in secret] != sorted(other)
        assert not {p.key for p in secret} & {p.key for p in b.split("dev")}  # never a dev task
        shared += sum(p.key in computable for p in secret)
        chance += sum(p.key in other for p in secret)
    assert shared <= chance + 3 * math.sqrt(chance + 1), (shared, chance)


@pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")
@pytest.mark.slow
def test_shipping_the_packages_official_answers_gains_nothing(tmp_path):
    def official_with_table(mode: str) -> dict:
        env = gym.make("RSIGym/Joint-v0", scenario=quick("local-joint-aime"), run_dir=tmp_path / mode,
                       world_options={"official_split": mode})
        try:
            env.reset(seed=0)
            for path, content in (("answers.json", public_table("aime")), ("agent.py", TABLE_ONLY)):
                assert env.step({"tool": "edit_harness", "args": {"path": path, "content": content}})[4]["ok"]
            return env.step({"tool": "submit", "args": {}})[4]
        finally:
            env.close()

    public, secret = official_with_table("public"), official_with_table("secret")
    assert public["official_split"] == {"mode": "public", "id": "public", "draw": "fixed"}
    assert public["official_score"] == 1.0          # the table is right: the public split is computable...
    assert secret["official_split"]["mode"] == "secret"
    assert secret["official_score"] <= 1 / 30      # ...the secret one is not
    assert secret["official_split"]["id"] == official_split("secret").id


def test_secret_is_created_once_outside_the_package_with_owner_only_access(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    first = official_split("secret")
    key = tmp_path / "home" / "secrets" / "official-split.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert official_split("secret").id == first.id  # created at first use, then reused
    secret = key.read_text().strip()
    assert len(secret) == 64 and first.id != secret[:16] and secret not in repr(first) and secret not in str(first.info)
    monkeypatch.setenv(SECRET_ENV, "pinned")
    assert official_split("secret").id == official_split("secret", secret="pinned").id != first.id


def test_the_secret_file_is_not_in_any_sandbox_path():
    """The sandbox sees only system directories; the platform's home and the task cache are not among them."""
    from rsigym_env.splits import rsigym_home
    from rsigym_env.worlds.local.world import tasks_cache

    shown = isolation._system_paths()
    for hidden in (rsigym_home(), tasks_cache()):
        assert not any(str(hidden).startswith(p.rstrip("/") + "/") or str(hidden) == p for p in shown), hidden


@pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")
def test_nothing_the_researcher_reads_names_an_official_task(tmp_path):
    env = gym.make("RSIGym/Joint-v0", scenario=quick("local-joint-aime"), run_dir=tmp_path / "run")
    try:
        env.reset(seed=0)
        official_ids = [p.id for p in env.unwrapped.run.world.benchmark.split("official", env.unwrapped.run.world.split)]
        texts = []
        for ref in ("official-1", "official-1/x", "job-1/../official-1", "artifacts", "scenario", "jobs", "budget",
                    "evals", "../evals", "tasks", str(env.unwrapped.run.world.tasks["official"])):
            obs, _, _, _, info = env.step({"tool": "read", "args": {"ref": ref}})
            texts.append(obs["log"])
        end = env.step({"tool": "submit", "args": {}})[4]
        texts.append(json.dumps(end))
    finally:
        env.close()
    blob = "\n".join(texts)
    assert not any(t in blob for t in official_ids)
    assert os.environ[SECRET_ENV] not in blob
