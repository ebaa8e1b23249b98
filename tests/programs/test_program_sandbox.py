"""Program researchers in their sandbox (rsigym_env/programs): real sim episodes through the reset/act
protocol, the same results as the same code loaded in-process, a fresh state per episode, the pool,
print() that does not break the protocol, and the program's own errors as ProgramError.

Attacks on the sandbox are in tests/security/test_hostile_programs.py.
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401  (registers the envs)
from rsigym_env.episode import run_episode
from rsigym_env.programs import ProgramError, ProgramLimits, ProgramResearcher, load_program
from rsigym_env.programs import sandbox as program_sandbox
from rsigym_env.programs.sandbox import ProgramPool, sandboxes_started, to_jsonable
from rsigym_env.worlds.local.sandbox import isolation

pytestmark = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap is not usable here")

LIMITS = ProgramLimits(act_wall_s=5, episode_wall_s=30, start_wall_s=20)

# Evaluates the initial system with k attempts, waits, submits; `common` is a sibling file. Works on the
# observation as the host passes it in-process (NumPy arrays) and as the sandbox gets it (lists).
TINY = {
    "researcher.py": '''
import common

EPISODES = 0


class Tiny:
    name = "tiny"

    def __init__(self, params):
        self.k = int(params.get("k", 1))

    def reset(self, observation, info, seed):
        global EPISODES
        EPISODES += 1
        self.episodes, self.seed = EPISODES, seed
        self.plan = common.plan(self.k, float(observation["budget_left_usd"][0]))

    def act(self, observation, info):
        return next(self.plan, {"tool": "submit", "args": {}})


def make_researcher(params):
    return Tiny(params)
''',
    "common.py": '''
def plan(k, budget):
    if budget > 1:
        yield {"tool": "evaluate", "args": {"k": k}}
        yield {"tool": "wait", "args": {}}
''',
}

# Says in each action what it saw: its module-level counter, its seed, leftovers of earlier episodes.
PROBE = {
    "researcher.py": '''
import os

COUNT = 0


class Probe:
    def reset(self, observation, info, seed):
        global COUNT
        COUNT += 1
        self.seed = seed
        self.leftover = sorted(os.listdir("/tmp")) + sorted(os.listdir("."))
        self.pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        open("/tmp/mark", "w").write("x")
        open("mark", "w").write("x")
        if os.fork() == 0:          # a process left running: the next episode must not see it
            import time
            time.sleep(60)
            os._exit(0)

    def act(self, observation, info):
        return {"tool": "submit", "args": {}, "count": COUNT, "seed": self.seed, "leftover": self.leftover,
                "others": [p for p in self.pids if p not in (1, os.getpid(), os.getppid())]}


def make_researcher(params):
    return Probe()
''',
}


def program(body_of_act: str = "", body_of_make: str = "", extra: str = "") -> dict[str, str]:
    """A one-file program whose act runs ``body_of_act`` then submits."""
    return {"researcher.py": f'''
import os, sys, subprocess
{extra}

class R:
    def reset(self, observation, info, seed):
        pass

    def act(self, observation, info):
        {body_of_act or "pass"}
        return {{"tool": "submit", "args": {{}}}}


def make_researcher(params):
    {body_of_make or "pass"}
    return R()
'''}


@pytest.fixture
def pool():
    p = ProgramPool()
    yield p
    p.close()


@pytest.fixture
def env():
    e = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500)
    yield e
    e.close()


def summary(result):
    info = result.info
    return (result.reward, result.steps, result.terminated, result.truncated, info.get("official_score"),
            info.get("spend_usd"), info.get("end_reason"), (info.get("submitted") or {}).get("by"))


def test_a_program_plays_a_sim_episode_with_the_same_result_as_in_process(env, pool):
    researcher = ProgramResearcher(TINY, {"k": 2}, name="tiny", limits=LIMITS, pool=pool)
    boxed = run_episode(env, researcher, seed=0)
    in_process = run_episode(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500),
                             load_program(TINY).make_researcher({"k": 2}), seed=0)
    assert boxed.steps == 3 and boxed.terminated and boxed.info["submitted"]["by"] == "agent"
    assert summary(boxed) == summary(in_process)
    assert researcher.attempts == [] and boxed.researcher == "tiny"
    researcher.close()


def test_every_episode_starts_from_a_fresh_state_in_one_sandbox(pool):
    researcher = ProgramResearcher(PROBE, name="probe", limits=LIMITS, pool=pool)
    seen = []
    for seed in (3, 4, 5):
        researcher.reset({}, {}, seed=seed)
        seen.append(researcher.act({}, {}))
    researcher.close()
    assert [a["count"] for a in seen] == [1, 1, 1] and [a["seed"] for a in seen] == [3, 4, 5]
    assert [a["leftover"] for a in seen] == [[], [], []]   # /tmp and the working directory were emptied
    assert [a["others"] for a in seen] == [[], [], []]     # the process each episode left was killed
    assert pool.started == 1
    assert researcher.attempts and {a["event"] for a in researcher.attempts} >= {"os.fork"}


def test_the_pool_reuses_a_sandbox_and_starts_no_process_for_the_next_episode(env, pool):
    before = sandboxes_started()
    first = ProgramResearcher(TINY, name="tiny", limits=LIMITS, pool=pool)
    run_episode(env, first, seed=0)
    run_episode(env, first, seed=1)                  # the same researcher: its next reset ends the episode
    assert pool.started == 1 and sandboxes_started() - before == 1
    del first                                        # dropped without close(), as run_spec drops researchers
    gc.collect()
    second = ProgramResearcher(TINY, {"k": 1}, name="tiny-again", limits=LIMITS, pool=pool)  # params are per episode
    run_episode(env, second, seed=2)
    second.close()
    assert pool.started == 1 and pool.idle == 1 and sandboxes_started() - before == 1
    other = ProgramResearcher(PROBE, limits=LIMITS, pool=pool)   # another program: a sandbox of its own
    other.reset({}, {})
    other.close()
    assert pool.started == 2


def test_concurrent_episodes_of_one_program_get_sandboxes_of_their_own(pool):
    results, errors = [], []

    def episode(seed):
        try:
            e = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500)
            r = ProgramResearcher(TINY, limits=LIMITS, pool=pool)
            results.append(summary(run_episode(e, r, seed=seed)))
            r.close()
            e.close()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=episode, args=(s,)) for s in (0, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 2 and results[0] == results[1]
    assert 1 <= pool.started <= 2 and pool.idle == pool.started


def test_a_programs_prints_do_not_break_the_protocol(env, pool):
    code = program(
        body_of_act='print("{\\"action\\": 1}"); os.write(1, b"garbage\\n"); sys.stdout.write("x" * 100000); '
                    'subprocess.run(["echo", "from a child"])',
        body_of_make='print("hello from make_researcher", flush=True)')
    researcher = ProgramResearcher(code, limits=LIMITS, pool=pool)
    result = run_episode(env, researcher, seed=0)
    assert result.terminated and result.steps == 1 and result.info["submitted"]["by"] == "agent"
    researcher.close()
    assert pool.idle == 1  # nothing went wrong: reusable


@pytest.mark.parametrize("where", ["make", "act"])
def test_a_program_that_raises_gives_a_program_error_with_its_text(env, pool, where):
    code = program(**{f"body_of_{where}": 'raise ValueError("no way, said the program")'})
    researcher = ProgramResearcher(code, limits=LIMITS, pool=pool)
    with pytest.raises(ProgramError) as caught:
        run_episode(env, researcher, seed=0)
    err = caught.value
    assert err.code == "program_raised" and "ValueError: no way, said the program" in str(err)
    assert ("in make_researcher/reset" if where == "make" else "in act") in str(err)
    assert 'File "/program/researcher.py"' in err.traceback
    assert pool.idle == 0  # a sandbox whose episode failed is not kept
    with pytest.raises(RuntimeError, match="reset"):
        researcher.act({}, {})
    # the same researcher plays again in a new sandbox (and fails the same way)
    with pytest.raises(ProgramError):
        run_episode(env, researcher, seed=1)
    assert pool.started == 2


def test_broken_programs_are_refused_with_the_reason(pool):
    with pytest.raises(ProgramError, match="program_invalid.*needs researcher.py"):
        ProgramResearcher({"common.py": ""}, pool=pool)
    with pytest.raises(ProgramError, match="program_invalid.*file name"):
        ProgramResearcher({"researcher.py": "", "../escape.py": ""}, pool=pool)
    with pytest.raises(ProgramError, match="program_invalid.*parameter"):
        ProgramResearcher(TINY, {"k": {"nested": 1}}, pool=pool)
    r = ProgramResearcher({"researcher.py": "def make_researcher(params)\n    return 1\n"}, limits=LIMITS, pool=pool)
    with pytest.raises(ProgramError) as caught:
        r.reset({}, {})
    assert caught.value.code == "program_invalid" and "SyntaxError" in str(caught.value)
    r = ProgramResearcher({"researcher.py": "x = 1\n"}, limits=LIMITS, pool=pool)
    with pytest.raises(ProgramError, match="must define make_researcher"):
        r.reset({}, {})
    r = ProgramResearcher(program(body_of_act="return {'tool': object()}"), limits=LIMITS, pool=pool)
    r.reset({}, {})
    with pytest.raises(ProgramError) as caught:
        r.act({}, {})
    assert caught.value.code == "program_protocol" and "not JSON" in str(caught.value)


def test_load_program_keeps_two_programs_apart_and_leaves_sys_modules_alone():
    import sys

    a = load_program({"researcher.py": "import common\nVALUE = common.VALUE", "common.py": "VALUE = 'a'"})
    b = load_program({"researcher.py": "import common\nVALUE = common.VALUE", "common.py": "VALUE = 'b'"})
    assert (a.VALUE, b.VALUE) == ("a", "b") and "common" not in sys.modules and "researcher" not in sys.modules
    assert not any(name.startswith("_rsigym_program_") for name in sys.modules)
    lazy = load_program({"researcher.py": "def get():\n    import common\n    return common.X\n", "common.py": "X = 7"})
    assert lazy.get() == 7   # an import inside a function, after loading, finds the sibling too
    from dataclasses import is_dataclass
    dc = load_program({"researcher.py": "from __future__ import annotations\nfrom dataclasses import dataclass\n"
                                        "from typing import ClassVar\n@dataclass\nclass A:\n    x: int = 1\n"
                                        "    y: ClassVar[int] = 2\n"})
    assert is_dataclass(dc.A) and dc.A().x == 1


def test_observations_reach_the_program_as_json(pool):
    import numpy as np

    code = program(body_of_act="return {'tool': 'submit', 'args': {}, 'saw': [observation, info]}")
    r = ProgramResearcher(code, limits=LIMITS, pool=pool)
    r.reset({}, {})
    obs = {"budget_left_usd": np.array([12.5]), "dev_scores": np.array([-1.0, np.nan, 0.5]), "step": np.int64(3)}
    info = {"pair": (1, 2), "tools": ["evaluate"], "nested": {"x": np.float32(0.25)}}
    saw = r.act(obs, info)["saw"]
    assert saw == [to_jsonable(obs), to_jsonable(info)]
    assert saw[0] == {"budget_left_usd": [12.5], "dev_scores": [-1.0, None, 0.5], "step": 3}
    r.close()


def test_without_bubblewrap_programs_are_refused_unless_allowed(monkeypatch, env, pool):
    monkeypatch.setattr(program_sandbox, "bwrap_available", lambda: False)
    monkeypatch.setattr(isolation, "_bwrap_works", lambda: (False, "pretend bwrap is missing"))
    monkeypatch.delenv(program_sandbox.UNSANDBOXED_ENV, raising=False)
    r = ProgramResearcher(TINY, limits=LIMITS, pool=pool)
    with pytest.raises(ProgramError) as caught:
        r.reset({}, {})
    assert caught.value.code == "isolation_unavailable" and "apt-get install -y bubblewrap" in str(caught.value)
    assert program_sandbox.UNSANDBOXED_ENV in str(caught.value) and pool.started == 0
    monkeypatch.setenv(program_sandbox.UNSANDBOXED_ENV, "1")
    boxed = run_episode(env, r, seed=0)
    r.close()
    in_process = run_episode(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500),
                             load_program(TINY).make_researcher({}), seed=0)
    assert summary(boxed) == summary(in_process) and pool.started == 1


SEED = Path(rsigym_env.__file__).parent / "programs" / "seed"


@pytest.mark.skipif(not (SEED / "researcher.py").exists(), reason="no seed program")
def test_the_seed_program_plays_the_same_episode_sandboxed_and_in_process(env, pool):
    code = {p.name: p.read_text(encoding="utf-8") for p in sorted(SEED.glob("*.py"))}
    boxed = run_episode(env, ProgramResearcher(code, name="seed", limits=LIMITS, pool=pool), seed=0)
    in_process = run_episode(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500),
                             load_program(code).make_researcher({}), seed=0)
    assert summary(boxed) == summary(in_process) and boxed.steps > 5


def test_program_limits_come_from_the_spec_within_what_the_scenario_grants():
    """A spec may tighten its program's limits, never loosen them past its scenario's (or the defaults);
    a scenario may grant more, up to LIMIT_BOUNDS. Bad values are clear errors, before anything runs."""
    from rsigym_env.agents import AgentSpec, build_researcher, seed_program
    from rsigym_env.programs.sandbox import LIMIT_BOUNDS
    from rsigym_env.scenario import load_scenario

    seed = seed_program()
    tight = AgentSpec.model_validate({**seed.model_dump(), "limits": {"act_wall_s": 3, "memory_mb": 256}})
    assert tight.id != seed.id and "limits" not in AgentSpec(kind="scripted").content()  # no limits: ids as before
    assert AgentSpec.from_files(tight.to_files()) == tight                                 # they travel in spec.json
    researcher = build_researcher(tight)
    assert (researcher.inner.limits.act_wall_s, researcher.inner.limits.memory_mb) == (3, 256)
    assert build_researcher(seed).inner.limits == ProgramLimits()
    loose = AgentSpec.model_validate({**seed.model_dump(), "limits": {"act_wall_s": 30}})
    with pytest.raises(ValueError, match="act_wall_s: 30 is above what is granted here"):
        build_researcher(loose)
    scenario = load_scenario().model_copy(update={"program_limits": {"act_wall_s": 60.0}})
    assert build_researcher(loose, scenario=scenario).inner.limits.act_wall_s == 30
    for bad, why in [({"act_wall_s": -1}, "positive"), ({"cpu_s": 1.5}, "integer"), ({"nope": 1}, "unknown"),
                     ({"memory_mb": LIMIT_BOUNDS["memory_mb"] * 2}, "above the bound"), ({"processes": True}, "int")]:
        with pytest.raises(ValueError, match=why):
            AgentSpec.model_validate({**seed.model_dump(), "limits": bad})
    with pytest.raises(ValueError, match="above the bound"):
        build_researcher(seed, scenario=load_scenario().model_copy(update={"program_limits": {"memory_mb": 10**6}}))
    with pytest.raises(ValueError, match="only the program kind"):
        AgentSpec(kind="scripted", limits={"act_wall_s": 1})
