"""Issue 26 (A): the cover improver's code moves, AST edits of a phase function of researcher.py."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401  (registers the env ids)
from rsigym_env.agents import AgentSpec, seed_program
from rsigym_env.catalog import env_id
from rsigym_env.episode import run_episode
from rsigym_env.programs.runtime import load_program
from rsigym_env.programs.seed.improver import Program, check_program, code_moves, parse_literals

KINDS = ("drop", "dup", "guard", "swap", "money")


def seed_code() -> dict[str, str]:
    return dict(seed_program().code)


def moves(guard: float = 0.9) -> dict[str, list[tuple[str, str, str]]]:
    """The seed's code moves on its default plan, by kind (guard 0.9: a guarded call is skipped once a tenth
    of the money is gone)."""
    src = seed_code()["researcher.py"]
    out: dict[str, list[tuple[str, str, str]]] = {k: [] for k in KINDS}
    for key, text, what in code_moves(src, parse_literals(src, ("PHASES",))["PHASES"], guard=guard):
        out[key.split()[2]].append((key, text, what))
    return out


class JSONView:
    """Hands a researcher its observations and info as JSON, as the sandbox does."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def reset(self, observation, info, seed=None):
        self.inner.reset(to_json(observation), to_json(info), seed=seed)

    def act(self, observation, info):
        return self.inner.act(to_json(observation), to_json(info))


def to_json(value):
    return json.loads(json.dumps(value, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def actions(code: dict[str, str], benchmark: str, seed: int, budget: float) -> list:
    env = gym.make(env_id("joint"), benchmark=benchmark, budget_usd=budget)
    seen: list = []
    try:
        run_episode(env, JSONView(load_program(code).make_researcher({})), seed=seed,
                    on_step=lambda _s, action, _o, _i: seen.append(repr(action)))
    finally:
        env.close()
    return seen


EPISODES = [("swe-bench-verified", 0, 500.0), ("aime", 1, 500.0), ("terminal-bench-2", 2, 150.0)]


@pytest.mark.parametrize("kind", KINDS)
def test_each_code_operator_makes_a_valid_program_that_plays_differently(kind):
    found = moves()[kind]
    assert found, kind
    base = seed_code()
    played = {e: actions(base, *e) for e in EPISODES}
    differs = []
    for key, text, what in found:
        assert text != base["researcher.py"] and check_program(text) is None and key in what
        program = Program({"code/researcher.py": text})
        assert program.genome["STRATEGY"] == Program({"code/researcher.py": base["researcher.py"]}).genome["STRATEGY"]
        code = dict(base, **{"researcher.py": text})
        AgentSpec(kind="program", name="x", code=code)                    # a spec the registry takes
        for episode in EPISODES:
            seen = actions(code, *episode)
            assert "submit" in seen[-1] or any("'submit'" in a for a in seen[-3:])   # still ends with a submit
            if seen != played[episode]:
                differs.append(key)
    assert differs, f"no {kind} move changes any action on {EPISODES}"


def test_a_code_moved_program_runs_in_the_sandbox():
    sandbox = pytest.importorskip("rsigym_env.programs.sandbox")
    key, text, _ = moves()["money"][0]
    researcher = sandbox.ProgramResearcher(dict(seed_code(), **{"researcher.py": text}), {}, name="money")
    env = gym.make(env_id("joint"), benchmark="swe-bench-verified", budget_usd=500)
    seen: list = []
    try:
        run_episode(env, researcher, seed=0, on_step=lambda _s, action, _o, _i: seen.append(repr(action)))
    except sandbox.ProgramError as exc:
        if exc.code == "isolation_unavailable":
            pytest.skip(f"no program sandbox here: {exc}")
        raise
    finally:
        researcher.close()
        env.close()
    assert seen and "submit" in seen[-1] or any("'submit'" in a for a in seen[-3:])
    assert seen != actions(seed_code(), "swe-bench-verified", 0, 500.0)


def test_a_broken_edit_is_rejected_cleanly():
    """Dropping fix_harness's only tool call leaves phase_fix_harness no generator (the plan would crash): the
    contract check names it, and code_moves never offers it; nor anything that does not parse."""
    src = seed_code()["researcher.py"]
    broken = src.replace("    yield from _fix(ctx)\n\n\ndef phase_distil", "    pass\n\n\ndef phase_distil", 1)
    assert broken != src
    assert check_program(broken) == "phase fix_harness: no generator function phase_fix_harness(ctx)"
    assert check_program(src + "\ndef oops(:\n").startswith("does not parse")
    assert check_program(src.replace("def make_researcher", "def make_other")) == "no make_researcher"
    keys = [k for k, _, _ in code_moves(src, ["diagnose", "fix_harness", "distil", "compare", "submit"])]
    assert "code fix_harness drop 1" not in keys and not any(k.startswith("code submit") for k in keys)
    assert all(check_program(t) is None for _, t, _ in code_moves(src, ["distil"]))
    assert code_moves(src + "\ndef oops(:\n", ["distil"]) == []


def test_cover_measures_code_moves_and_the_archive_stores_their_patch(tmp_path, monkeypatch):
    """With ``code_moves`` on and every gene skipped, a round's first moves are code moves: each measured
    candidate is archived with its patch (a phase function rewritten), rebuilds with its id and keeps the
    contract."""
    from rsigym_env.archive import Archive
    from rsigym_env.programs.seed.improver import replace_literals
    from rsigym_env.scenario import load_scenario
    from rsigym_env.worlds.recursive import Settings, recurse

    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    files = seed_program().to_files()
    genes = list(parse_literals(files["code/researcher.py"], ("STRATEGY",))["STRATEGY"])
    own = parse_literals(files["code/improver.py"], ("IMPROVER",))["IMPROVER"]
    files["code/improver.py"] = replace_literals(files["code/improver.py"], {"IMPROVER": dict(
        own, code_moves=True, skip_genes=genes, candidates=3)})
    spec = AgentSpec.from_files(files)
    s = load_scenario("recursive-scripted-small")
    scen = s.model_copy(update={"budget_usd": 4000, "world_options": {
        **s.world_options, "dev_benchmarks": ["aime"], "official_benchmarks": ["aime"], "dev_seeds": 2,
        "official_seeds": 2, "test_seeds": 2, "budget_usd": 300, "target_spec": spec.model_dump(mode="json")}})
    result = recurse(scen, rounds=1, seeds=[0], mode="improver", archive=Archive(tmp_path / "a", "c"),
                     settings=Settings(imp_k=0, transfer_tracks=()))
    archive = Archive(tmp_path / "a", result["config"]["archives"][0])
    coded = [n for n in archive.nodes() if n.produced_by.get("operator", "").startswith("code ")]
    assert coded, [n.produced_by for n in archive.nodes()]
    for node in coded:
        rebuilt = archive.rebuild(node.id)
        assert AgentSpec.from_files(rebuilt).id == node.id and check_program(rebuilt["code/researcher.py"]) is None
        diff = archive.node_diff(node.id)
        assert "def phase_" in diff or "yield" in diff or "budget" in diff   # the patch edits a phase's code
        assert "train" in node.scores
