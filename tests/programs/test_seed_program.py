"""The seed researcher program (rsigym_env/programs/seed/researcher.py + common.py).

Its default strategy must play exactly the scripted researcher's actions and earn its rewards (the
observations pass through JSON as they do into the sandbox); every single-gene change within ALLELES /
RANGES and every one-edit PHASES variant must run an episode to a submit; params override STRATEGY.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401  (registers the env ids)
from rsigym_env.baselines import ScriptedResearcher
from rsigym_env.catalog import env_id
from rsigym_env.episode import run_episode

SEED_DIR = Path(__file__).resolve().parents[2] / "rsigym_env" / "programs" / "seed"
SEED_FILES = ("researcher.py", "common.py")
LITERALS = ("STRATEGY", "ALLELES", "RANGES", "PHASES", "OPTIONAL_PHASES")
BENCHMARKS = ("aime", "gpqa-diamond", "swe-bench-verified", "terminal-bench-2", "skillsbench")


# ------------------------------------------------------------------------------ loading the program


class _ProgramFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the program's top-level modules in its file dict (so ``import common`` works)."""

    def __init__(self, code: dict[str, str]):
        self.code = code

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if path is None and fullname + ".py" in self.code:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__ + ".py"
        exec(compile(self.code[name], name, "exec"), module.__dict__)


def _load_in_process(code: dict[str, str]) -> types.ModuleType:
    """Fresh module objects for the program's files; the entry module ``researcher``."""
    names = [n[:-3] for n in code if n.endswith(".py")]
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    finder = _ProgramFinder(code)
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module("researcher")
    finally:
        sys.meta_path.remove(finder)
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def load_program(code: dict[str, str]) -> types.ModuleType:
    """The runtime's ``load_program`` once it exists, else the in-process loader above."""
    try:
        from rsigym_env.programs.runtime import load_program as runtime_load  # type: ignore[import-not-found]
    except ImportError:
        return _load_in_process(code)
    return runtime_load(code)


def seed_code(**extra: str) -> dict[str, str]:
    code = {name: (SEED_DIR / name).read_text(encoding="ascii") for name in SEED_FILES}
    code.update(extra)
    return code


def with_literal(source: str, name: str, value: Any) -> str:
    """``source`` with the top-level assignment ``name = ...`` replaced by ``name = repr(value)``
    (what an improver does)."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            lines = source.splitlines(keepends=True)
            start, end = node.lineno - 1, node.end_lineno
            return "".join(lines[:start] + [f"{name} = {value!r}\n"] + lines[end:])
    raise AssertionError(f"no assignment {name}")


@pytest.fixture(scope="module")
def seed() -> types.ModuleType:
    return load_program(seed_code())


def to_json(value: Any) -> Any:
    """What the sandbox sees: the value through JSON (NumPy arrays and scalars become lists and numbers)."""
    return json.loads(json.dumps(value, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


class JSONView:
    """Hands a researcher its observations and info as JSON, as the sandbox does."""

    def __init__(self, inner: Any):
        self.inner, self.name = inner, inner.name

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        self.inner.reset(to_json(observation), to_json(info), seed=seed)

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any:
        return self.inner.act(to_json(observation), to_json(info))


def play(env: gym.Env, researcher: Any, seed: int) -> tuple[list[Any], Any]:
    """The actions of one episode (as JSON) and its result."""
    actions: list[Any] = []
    result = run_episode(env, researcher, seed=seed, on_step=lambda _s, action, _o, _i: actions.append(to_json(action)))
    return actions, result


# ------------------------------------------------------------------------------------ the contract


def test_files_are_ascii_and_literals_are_pure() -> None:
    for name in SEED_FILES:
        (SEED_DIR / name).read_bytes().decode("ascii")
    source = (SEED_DIR / "researcher.py").read_text()
    tree = ast.parse(source)
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) in LITERALS:
            found[node.targets[0].id] = ast.literal_eval(node.value)
    assert set(found) == set(LITERALS)
    strategy, alleles, ranges = found["STRATEGY"], found["ALLELES"], found["RANGES"]
    assert set(alleles) | set(ranges) == set(strategy) and not set(alleles) & set(ranges)
    for gene, allowed in alleles.items():
        values = strategy[gene] if isinstance(strategy[gene], list) else [strategy[gene]]
        assert all(v in allowed for v in values), gene
    for gene, (low, high, how) in ranges.items():
        assert how in ("mul", "add", "dbl") and low <= strategy[gene] <= high, gene
        if isinstance(strategy[gene], int):
            assert isinstance(low, int) and isinstance(high, int), gene
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for phase in found["PHASES"] + found["OPTIONAL_PHASES"]:
        assert f"phase_{phase}" in functions
    assert "make_researcher" in functions


# ------------------------------------------------------------------------------------------ equality


@pytest.mark.parametrize("track", ["joint", "data", "harness"])
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_default_program_plays_the_scripted_researcher(seed: types.ModuleType, track: str, benchmark: str) -> None:
    env = gym.make(env_id(track), benchmark=benchmark, budget_usd=500)
    try:
        for episode_seed in (0, 1, 2, 7):
            steps: dict[str, list[tuple[Any, float]]] = {}
            totals = {}
            for label, researcher in (("scripted", ScriptedResearcher()),
                                      ("program", JSONView(seed.make_researcher({})))):
                record: list[tuple[Any, float]] = []
                wrapped = _RewardRecorder(env)
                result = run_episode(wrapped, researcher, seed=episode_seed,
                                     on_step=lambda _s, a, _o, _i, r=record, w=wrapped: r.append((to_json(a), w.last)))
                steps[label], totals[label] = record, result.reward
            assert steps["program"] == steps["scripted"], (track, benchmark, episode_seed)
            assert totals["program"] == totals["scripted"]
            assert any(a["tool"] == "submit" for a, _ in steps["program"])
    finally:
        env.close()


class _RewardRecorder(gym.Wrapper):
    """Keeps the reward of the last step (for per-step comparison)."""

    last = 0.0

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.last = float(reward)
        return obs, reward, terminated, truncated, info


# ----------------------------------------------------------------------------------- mutations


def _gene_variants(module: types.ModuleType) -> list[tuple[str, Any]]:
    """Every single-gene change: each other allele, list genes' sub-lists and orders, numeric bounds."""
    out: list[tuple[str, Any]] = []
    for gene, default in module.STRATEGY.items():
        if gene in module.ALLELES:
            allowed = module.ALLELES[gene]
            if isinstance(default, list):
                out += [(gene, []), (gene, list(reversed(default)))]
                out += [(gene, [a]) for a in allowed]
                out += [(gene, default + [a]) for a in allowed if a not in default]
            else:
                out += [(gene, a) for a in allowed if a != default]
        else:
            low, high, _how = module.RANGES[gene]
            out += [(gene, low), (gene, high)]
    return out


def _phase_variants(module: types.ModuleType) -> list[list[str]]:
    """PHASES with one phase deleted, two adjacent ones swapped, or one optional phase inserted."""
    base = list(module.PHASES)
    out = [base[:i] + base[i + 1:] for i in range(len(base))]
    out += [base[:i] + [base[i + 1], base[i]] + base[i + 2:] for i in range(len(base) - 1)]
    out += [base[:i] + [opt] + base[i:] for opt in module.OPTIONAL_PHASES for i in range(len(base) + 1)]
    return out


def _assert_submits(env: gym.Env, researcher: Any) -> None:
    result = run_episode(env, JSONView(researcher), seed=0)
    submitted = (result.info.get("submitted") or {}).get("by")
    assert result.terminated and submitted == "agent", result.info.get("end_reason")


@pytest.mark.parametrize("track", ["joint", "data", "harness"])
def test_every_single_gene_change_submits(seed: types.ModuleType, track: str) -> None:
    env = gym.make(env_id(track), benchmark="aime", budget_usd=500)
    try:
        variants = _gene_variants(seed)
        assert len(variants) > 30
        for gene, value in variants:
            _assert_submits(env, seed.make_researcher({gene: value}))
    finally:
        env.close()


def test_every_one_edit_phase_plan_submits() -> None:
    base = load_program(seed_code())
    env = gym.make(env_id("joint"), benchmark="aime", budget_usd=500)
    try:
        for phases in _phase_variants(base):
            code = seed_code()
            code["researcher.py"] = with_literal(code["researcher.py"], "PHASES", phases)
            module = load_program(code)
            assert module.PHASES == phases
            _assert_submits(env, module.make_researcher({}))
    finally:
        env.close()


def test_all_optional_phases_together_and_rl_like_strategy_submit() -> None:
    base = load_program(seed_code())
    code = seed_code()
    phases = ["diagnose", "fix_harness", "verify_harness", "rediagnose", "distil", "second_distil", "mix_teachers",
              "retrain", "compare", "recompare", "submit"]
    code["researcher.py"] = with_literal(code["researcher.py"], "PHASES", phases)
    module = load_program(code)
    env = gym.make(env_id("joint"), benchmark="swe-bench-verified", budget_usd=500)
    try:
        _assert_submits(env, module.make_researcher({}))
        rl_like = {"data_fraction": 0.85, "data_chunks": 4, "eval_reserve": 3, "probe_examples": 50}
        _assert_submits(env, base.make_researcher(rl_like))
    finally:
        env.close()


def test_a_strategy_edit_in_the_source_takes_effect() -> None:
    code = seed_code()
    strategy = dict(load_program(code).STRATEGY, probe_examples=7)
    code["researcher.py"] = with_literal(code["researcher.py"], "STRATEGY", strategy)
    module = load_program(code)
    env = gym.make(env_id("joint"), benchmark="aime", budget_usd=500)
    try:
        actions, _ = play(env, JSONView(module.make_researcher({})), seed=0)
    finally:
        env.close()
    probes = [a["args"]["n_examples"] for a in actions if a["tool"] == "generate_data"][:3]
    assert probes == [7, 7, 7]


# ------------------------------------------------------------------------------------------ params


def test_params_override_strategy(seed: types.ModuleType) -> None:
    researcher = seed.make_researcher({"data_fraction": 0.6, "transforms": ["dedupe"]})
    assert researcher.strategy["data_fraction"] == 0.6 and researcher.strategy["transforms"] == ["dedupe"]
    assert seed.STRATEGY["data_fraction"] == 0.4  # the module's literal is untouched
    env = gym.make(env_id("joint"), benchmark="aime", budget_usd=500)
    try:
        default, _ = play(env, JSONView(seed.make_researcher({})), seed=0)
        more, _ = play(env, JSONView(researcher), seed=0)
    finally:
        env.close()
    bought = [[a["args"]["n_examples"] for a in acts if a["tool"] == "generate_data"][3] for acts in (default, more)]
    assert bought[1] > bought[0]
    assert [a["args"]["operation"] for a in more if a["tool"] == "transform_data"] == ["dedupe"]


@pytest.mark.parametrize("params, message", [
    ({"data_fractoin": 0.6}, "unknown parameter"),
    ({"teacher_rule": "loudest"}, "not one of"),
    ({"probe_examples": 2.5}, "integer"),
    ({"transforms": "filter"}, "list"),
    ({"k": True}, "number"),
])
def test_bad_params_are_value_errors(seed: types.ModuleType, params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        seed.make_researcher(params)


def test_unknown_phase_is_a_value_error() -> None:
    code = seed_code()
    code["researcher.py"] = with_literal(code["researcher.py"], "PHASES", ["diagnose", "dance", "submit"])
    with pytest.raises(ValueError, match="unknown phase 'dance'"):
        load_program(code).make_researcher({})


# --------------------------------------------------------------------------- spec harness: improve

SPEC_OBSERVATION = {"log": "Research run 'r' (harness track, recursive world).\n"
                           "Harness h-0123abcd: files code/researcher.py, params.toml, prompt.md, spec.json\n",
                    "budget_left_usd": [100.0]}
FAKE_IMPROVER = '''
class _Fake:
    def __init__(self, params):
        self.params = params
    def reset(self, observation, info, seed=None):
        self.seen = seed
    def act(self, observation, info):
        return {"tool": "read", "args": {"ref": "harness:latest/spec.json", "note": sorted(self.params)}}

def make_improver(params):
    return _Fake(params)
'''


def test_spec_harness_without_improver_submits_at_once(seed: types.ModuleType) -> None:
    researcher = seed.make_researcher({})
    researcher.reset(SPEC_OBSERVATION, {"tools": ["read", "submit"]}, seed=3)
    assert researcher.act(SPEC_OBSERVATION, {})["tool"] == "submit"


def test_spec_harness_delegates_to_the_improver() -> None:
    module = load_program(seed_code(**{"improver.py": FAKE_IMPROVER}))
    researcher = module.make_researcher({"improve_candidates": 3, "k": 2})
    researcher.reset(SPEC_OBSERVATION, {"tools": ["read", "submit"]}, seed=3)
    action = researcher.act(SPEC_OBSERVATION, {})
    assert action["tool"] == "read" and action["args"]["note"] == ["candidates"]
    # an ordinary harness: the same object researches
    env = gym.make(env_id("harness"), benchmark="aime", budget_usd=500)
    try:
        _assert_submits(env, module.make_researcher({}))
    finally:
        env.close()


def test_the_whole_seed_directory_loads_and_still_plays_the_scripted_researcher() -> None:
    code = {p.name: p.read_text(encoding="ascii") for p in sorted(SEED_DIR.glob("*.py"))}
    module = load_program(code)
    env = gym.make(env_id("joint"), benchmark="gpqa-diamond", budget_usd=500)
    try:
        scripted, expected = play(env, ScriptedResearcher(), seed=4)
        program, result = play(env, JSONView(module.make_researcher({})), seed=4)
    finally:
        env.close()
    assert program == scripted and result.reward == expected.reward


@pytest.mark.parametrize("benchmark", ["aime", "skillsbench"])
def test_equality_holds_with_async_jobs(seed: types.ModuleType, benchmark: str) -> None:
    env = gym.make(env_id("joint"), benchmark=benchmark, budget_usd=500, async_jobs=True)
    try:
        for episode_seed in (0, 3):
            scripted, expected = play(env, ScriptedResearcher(), seed=episode_seed)
            program, result = play(env, JSONView(seed.make_researcher({})), seed=episode_seed)
            assert program == scripted and result.reward == expected.reward
            assert sum(a["tool"] == "wait" for a in program) > 4  # the dataset calls were jobs
            rl_like = seed.make_researcher({"data_fraction": 0.85, "data_chunks": 4, "eval_reserve": 3})
            _assert_submits(env, rl_like)
    finally:
        env.close()


@pytest.mark.parametrize("budget", [0.5, 3.0, 60.0])
def test_equality_holds_when_money_is_short(seed: types.ModuleType, budget: float) -> None:
    for track, benchmark in (("joint", "swe-bench-verified"), ("data", "aime"), ("harness", "gpqa-diamond")):
        env = gym.make(env_id(track), benchmark=benchmark, budget_usd=budget)
        try:
            scripted, expected = play(env, ScriptedResearcher(), seed=1)
            program, result = play(env, JSONView(seed.make_researcher({})), seed=1)
            assert program == scripted and result.reward == expected.reward, (track, benchmark)
        finally:
            env.close()


def test_equality_holds_in_the_program_sandbox() -> None:
    sandbox = pytest.importorskip("rsigym_env.programs.sandbox")
    code = {p.name: p.read_text(encoding="ascii") for p in sorted(SEED_DIR.glob("*.py"))}
    researcher = sandbox.ProgramResearcher(code, {}, name="seed")
    try:
        for track, benchmark in (("joint", "swe-bench-verified"), ("data", "gpqa-diamond"), ("harness", "aime")):
            env = gym.make(env_id(track), benchmark=benchmark, budget_usd=500)
            try:
                for episode_seed in (0, 5):
                    scripted, expected = play(env, ScriptedResearcher(), seed=episode_seed)
                    try:
                        program, result = play(env, researcher, seed=episode_seed)
                    except sandbox.ProgramError as exc:
                        if exc.code == "isolation_unavailable":
                            pytest.skip(f"no program sandbox here: {exc}")
                        raise
                    assert program == scripted and result.reward == expected.reward, (track, benchmark, episode_seed)
            finally:
                env.close()
    finally:
        researcher.close()
