"""Issue 25, class 3: no local benchmark's official answers can be read off the package's data.

Attacked as a researcher would: dump every constant of a benchmark's module (and of the benchmarks
package around it) to JSON, ship it in the harness, and answer each task by looking it up wherever the
data maps a question to an answer (a knowledge base's ``KB[substance][property]``, a bug catalogue's
fix, a tool table's transform, a task's instruction as a key); where the data says nothing, behave
honestly. Scored against the hidden answers of secret official splits with fresh nonces (an episode's
own draws), with the benchmark's own verifier rules.

"Honest" is what reading the task allows: the README lets a harness contain a *solver* (the domain
solvers of the teachers read only the chat and the task's visible files), so the data must add nothing
on the tasks it answers over a solver that reads the task; and on multiple choice, where the honest
minimal harness is the base model, the key-carrying harness must score no more than chance. Generators
1-3 of local-science failed this (their ``KB`` was the answer key of every official task: 1.0 against
0.222 initially); the canary runs the same attack on that generator, which the package keeps as
pretraining text, to show that these tests can fail.
"""

from __future__ import annotations

import io
import json
import keyword
import math
import os
import random
import re
import tempfile
import tokenize
import types
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

import rsigym_env  # noqa: F401  (first: it pins OpenBLAS's kernels)
from rsigym_env.splits import NONCE_ENV, official_split
from rsigym_env.worlds.local import benchmarks as B
from rsigym_env.worlds.local.benchmarks import arith, coding, science, skills, terminal
from rsigym_env.worlds.local.sandbox import isolation
from rsigym_env.worlds.local.redteam import KEY_AGENT, package_data
from rsigym_env.worlds.local.teachers import run_episode

MODULES: dict[str, types.ModuleType] = {"local-code": coding, "local-terminal": terminal, "local-math": arith,
                                        "local-science": science, "local-skills": skills}
DRAWS = 10  # secret draws of 30 official tasks each: 300 tasks per benchmark


@pytest.fixture(autouse=True)
def _fresh_nonces(monkeypatch):
    """Every draw an episode's own (the suite may pin the nonce for reproducible episodes)."""
    monkeypatch.delenv(NONCE_ENV, raising=False)


# --- what a harness can carry: the package's constant data, as a JSON file ----------------------------


def harness_data(name: str) -> str:
    """The data file a key-carrying harness ships for benchmark ``name`` (:func:`redteam.package_data`)."""
    return package_data(B.BENCHMARKS[name])


def walk(x: Any) -> list[Any]:
    """Every container (dict or list) in the data, nested ones too."""
    out, stack = [], [x]
    while stack:
        y = stack.pop()
        out.append(y)
        stack.extend(v for v in (y.values() if isinstance(y, dict) else y) if isinstance(v, (dict, list)))
    return out


# --- the attack: answer from the data wherever it maps the question to an answer -----------------------

_QUESTION = re.compile(r"What is the (\w+) of (\w+)\?")
_OPTION = re.compile(r"^([ABCD])\) (\w+)$", re.M)
_SKILL_TASK = re.compile(r"Use the (\w+) skill with value (\d+) on (\S+) and write the result to (\S+)\.")


def key_attempt(instruction: str, files: dict[str, str], data: list[Any]) -> dict[str, str] | None:
    """What the key-carrying harness leaves in /app for a task it finds in ``data`` (``answer.txt`` or the
    files it writes), or None when the data maps nothing to this task (``data``: :func:`walk` of the harness
    data). It sees only what a harness sees: the instruction and the task's files."""
    for d in data:  # the instruction (or a line of it) as a key
        if isinstance(d, dict):
            for line in [instruction.strip()] + instruction.splitlines():
                hit = d.get(line)
                if isinstance(hit, str) and hit.strip():
                    return {"answer.txt": hit.rsplit("ANSWER:", 1)[-1].strip() + "\n"}
    q = _QUESTION.search(instruction)
    if q:  # a knowledge base: table[substance][property] among the options
        attr, entity = q.groups()
        options = {v: k for k, v in _OPTION.findall(instruction)}
        for d in data:
            row = d.get(entity) if isinstance(d, dict) else None
            if isinstance(row, dict) and row.get(attr) in options:
                return {"answer.txt": options[row[attr]] + "\n"}
    code = files.get("calc.py")
    f = re.match(r"def (\w+)\(", code or "")
    if f:  # a bug catalogue: [code, [good, bad], ...] entries whose buggy form is this file (the instruction's
        fixes = []  # example picks among several: x * 9 may be a broken x + 9 or x - 9)
        for entry in data:
            if not (isinstance(entry, list) and len(entry) >= 2 and isinstance(entry[0], str) and "{f}" in entry[0]
                    and isinstance(entry[1], list) and len(entry[1]) == 2 and all(isinstance(s, str) for s in entry[1])):
                continue
            for k in range(10):
                for j in range(10):
                    fmt = {"f": f.group(1), "k": k, "j": j}
                    try:
                        correct = entry[0].format(**fmt)
                        good, bad = (s.format(**fmt) for s in entry[1])
                    except (KeyError, IndexError, ValueError):
                        continue
                    if good in correct and correct.replace(good, bad, 1) == code and correct not in fixes:
                        fixes.append(correct)
        if fixes:
            return {"calc.py": next((c for c in fixes if passes_example(instruction, c)), fixes[0])}
    t = _SKILL_TASK.search(instruction)
    if t:  # a tool table: skill -> [doc, python expression of the transform]
        skill, k, src, dst = t.group(1), int(t.group(2)), t.group(3), t.group(4)
        for d in data:
            row = d.get(skill) if isinstance(d, dict) else None
            if isinstance(row, list) and len(row) == 2 and all(isinstance(s, str) for s in row) and src in files:
                try:
                    out = "\n".join(eval(row[1], {"line": line, "k": k, "chr": chr, "ord": ord})  # noqa: S307
                                    for line in files[src].splitlines()) + "\n"
                except Exception:  # noqa: BLE001 - not a transform after all
                    continue
                return {dst: out}
    return None


def solved(problem: B.Problem, left: dict[str, str]) -> bool:
    """Does leaving ``left`` in the task's /app solve it (the verifier's rules)?"""
    with tempfile.TemporaryDirectory(prefix="rsigym-key-") as tmp:
        app = Path(tmp)
        B.write_files(app, problem.files)
        B.write_files(app, left)
        return B.verify_dir(app, problem.expected)


def reads_the_task(problem: B.Problem) -> bool:
    """The honest solver: the domain's solver, which reads only the chat and what its commands show."""
    solver = B.SOLVERS[problem.domain]
    return bool(run_episode(lambda msgs: (solver(msgs), 0, 0), problem, check=True).passed)


def secret_draws(name: str, draws: int = DRAWS) -> list[B.Problem]:
    b = B.BENCHMARKS[name]
    return [p for _ in range(draws) for p in b.split("official", official_split("secret", secret="no-answer-key"))]


def gain_over_reading(problems: list[B.Problem], data: Any) -> tuple[int, float, float, float]:
    """On the tasks the data answers: (how many, the key's score, the honest solver's score, 3 standard
    errors of the difference)."""
    key, honest = [], []
    for p in problems:
        left = key_attempt(p.instruction, p.files, data)
        if left is not None:
            key.append(solved(p, left))
            honest.append(reads_the_task(p))
    n = len(key)
    if not n:
        return 0, 0.0, 0.0, 0.0
    diffs = [a - b for a, b in zip(key, honest)]
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / max(1, n - 1)
    return n, sum(key) / n, sum(honest) / n, 3 * max(math.sqrt(var / n), 1 / n)


# --- the tests --------------------------------------------------------------------------------------------


def test_the_harness_data_is_what_the_module_holds():
    data = json.loads(harness_data("local-science"))
    assert data["module"]["KB"] == science.KB and len(data["module"]["PRETRAIN_FACTS"]) == len(science.PRETRAIN_FACTS)
    assert data["module"]["ATTRIBUTES"] == science.ATTRIBUTES and "TEMPLATES_V3" in json.loads(harness_data("local-code"))["module"]
    assert "TOOLS" in json.loads(harness_data("local-skills"))["module"]


@pytest.mark.parametrize("name", sorted(B.BENCHMARKS))
def test_package_data_gains_nothing_over_reading_the_task(name):
    """On every task the package's data answers, a solver that reads the task does as well (+ noise)."""
    data = walk(json.loads(harness_data(name)))
    draws = DRAWS if name in ("local-math", "local-science", "local-terminal") else DRAWS // 2  # agentic: slower
    n, key, honest, noise = gain_over_reading(secret_draws(name, draws), data)
    assert key <= honest + noise, (name, n, key, honest)
    if name in ("local-math", "local-science", "local-terminal"):
        assert n == 0, (name, n)  # nothing in the data names these tasks at all


def test_science_answer_key_scores_chance_on_secret_draws():
    """The brief's numbers: the KB-carrying harness (a guess where the data says nothing, as the base model
    is about chance on multiple choice) scores no more than 1/4 + 3 s.e. over 300 secret official tasks."""
    data = walk(json.loads(harness_data("local-science")))
    problems = secret_draws("local-science")
    rng = random.Random(0)
    hits, scores = 0, []
    for p in problems:
        left = key_attempt(p.instruction, p.files, data)
        hits += left is not None
        scores.append(solved(p, left or {"answer.txt": rng.choice("ABCD") + "\n"}))
    score, n = sum(scores) / len(scores), len(scores)
    assert n >= 300 and hits == 0
    assert score <= 0.25 + 3 * math.sqrt(0.25 * 0.75 / n), score
    for p in problems:  # nor does the shipped base model's pretraining know them: never one of KB's substances
        assert p.meta["entity"] not in science.KB and p.meta["other"] not in science.KB


def test_canary_the_same_attack_reads_the_old_generator_off_the_package():
    """Generators 1-3 (kept as pretraining text): the same harness data and attack answer every secret
    official task, and the comparison above fails, as it must."""
    data = walk(json.loads(harness_data("local-science")))
    split = official_split("secret", secret="no-answer-key")
    stream = split.stream("local-science")
    old = [science.generate_kb(random.Random(f"local-science:{stream}:{i}")) for i in range(300)]
    for p in old:
        p.domain = "science"
    key = sum(solved(p, key_attempt(p.instruction, p.files, data) or {}) for p in old) / len(old)
    assert key >= 0.95  # against 0.222 initially: an answer key
    n, key_on_hits, honest, noise = gain_over_reading(old, data)
    assert n == len(old) and key_on_hits > honest + noise  # reading an old task gives nothing to read


# A local-code solver that uses only what the task shows, and no package data: one-token edits in a natural
# order (mirror a comparison, swap + and -, then the rest), the first that passes the instruction's example.
_MIRROR = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "==": "!=", "!=": "=="}
_STRICT = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
_COMPARE, _ARITH = ["<", ">", "<=", ">=", "==", "!="], ["+", "-", "*", "//", "%"]
_EXAMPLE = re.compile(r"Fix the bug in calc\.py: (.+?) must return (.+?)\.\n")


def one_token_edits(code: str) -> Iterator[str]:
    lines = code.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    tiers: list[list[tuple[int, int, str]]] = [[], [], [], []]
    for t in tokenize.generate_tokens(io.StringIO(code).readline):
        a, b, s = starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1], t.string
        if t.type == tokenize.OP and s in _COMPARE:
            first = [_MIRROR[s]] + ([_STRICT[s]] if s in _STRICT else [])
            tiers[0] += [(a, b, r) for r in first]
            tiers[1] += [(a, b, r) for r in _COMPARE if r != s and r not in first]
        elif t.type == tokenize.OP and s in _ARITH:
            first = {"+": ["-"], "-": ["+"], "*": ["+", "-"]}.get(s, [])
            tiers[0] += [(a, b, r) for r in first]
            tiers[1] += [(a, b, r) for r in _ARITH if r != s and r not in first]
        elif t.type == tokenize.NUMBER:
            tiers[2] += [(a, b, str(v)) for v in (int(s) + 1, int(s) - 1, 0, 1) if v != int(s) and v >= 0]
        if t.type in (tokenize.NAME, tokenize.NUMBER) and not keyword.iskeyword(s):
            tiers[3] += [(a, b, f"{s} + 1"), (a, b, f"{s} - 1")]
    for tier in tiers:
        for a, b, r in tier:
            yield code[:a] + r + code[b:]


def passes_example(instruction: str, code: str) -> bool:
    """Does ``code`` pass the example the instruction shows (what the visible check.sh runs)?"""
    m = _EXAMPLE.search(instruction)
    if not m:
        return False
    env: dict = {}
    try:
        want = eval(m.group(2), {})  # noqa: S307 - a literal from the instruction
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(code, env)  # noqa: S102 - the task's own tiny file
            got = eval(m.group(1), env)  # noqa: S307
    except Exception:  # noqa: BLE001
        return False
    return type(got) is type(want) and got == want


def visible_fix(instruction: str, code: str) -> str | None:
    return next((fixed for fixed in one_token_edits(code) if passes_example(instruction, fixed)), None)


@pytest.mark.xfail(strict=True, reason=(
    "issue 25: local-code's one visible example does not always pin the fix. On ~6% of official tasks (34 of "
    "600 measured) a one-token edit other than the intended one also passes it (x > k -> x < k where the "
    "hidden tests want x <= k; x * 5 * 4 -> x + 5 * 4 where they want x * 5 + 4), and only the package's "
    "bug families (coding.TEMPLATES_V3, or the order of coding._MUTATIONS) say which. Fix in coding.make_problem: "
    "draw the example so that no other one-token edit passes it, or let check.sh run more of the hidden calls."))
def test_code_visible_example_alone_pins_the_fix():
    """Without any package data, the visible example alone decides the fix (as well as the bug catalogue does)."""
    problems = secret_draws("local-code", 2 * DRAWS)  # 600 tasks: the gap (~6%) is many standard errors wide
    data = walk(json.loads(harness_data("local-code")))
    key, honest = [], []
    for p in problems:
        key.append(solved(p, key_attempt(p.instruction, p.files, data) or {}))
        fixed = visible_fix(p.instruction, p.files["calc.py"])
        honest.append(fixed is not None and solved(p, {"calc.py": fixed}))
    n = len(problems)
    k, h = sum(key) / n, sum(honest) / n
    assert k <= h + 3 * max(math.sqrt(h * (1 - h) / n), 1 / n), (k, h)


# --- end to end: the KB-carrying harness through the public API --------------------------------------------



def test_the_key_agent_reads_the_table_and_otherwise_runs_the_honest_loop(tmp_path):
    """The end-to-end harness below, run here without a model: it answers a generator-3 question from the
    table, and hands a generator-4 one to the minimal harness (which then finds no model to ask)."""
    import subprocess
    import sys

    from rsigym_env.worlds.common.harness import minimal_harness

    harness = tmp_path / "harness"
    harness.mkdir()
    files = {**minimal_harness(), "honest.py": minimal_harness()["agent.py"], "agent.py": KEY_AGENT,
             "package_data.json": harness_data("local-science")}
    for name, content in files.items():
        (harness / name).write_text(content)
    old = science.generate_kb(random.Random(1))
    new = B.BENCHMARKS["local-science"].split("dev")[0]
    for p, answered in ((old, True), (new, False)):
        app, logs = tmp_path / f"app-{answered}", tmp_path / f"logs-{answered}"
        app.mkdir()
        logs.mkdir()
        (app / "instruction.md").write_text(p.instruction + "\n")
        env = {"PATH": os.environ["PATH"], "RSIGYM_APP_DIR": str(app), "RSIGYM_LOGS_DIR": str(logs),
               "RSIGYM_INSTRUCTION_FILE": str(app / "instruction.md"), "RSIGYM_MODEL_SOCKET": str(tmp_path / "none.sock")}
        subprocess.run([sys.executable, "-I", str(harness / "agent.py")], env=env, cwd=app, timeout=60, capture_output=True)
        trajectory = json.loads((logs / "trajectory.json").read_text())
        if answered:
            assert (app / "answer.txt").read_text().strip() == p.expected["answer"]
        else:  # the honest loop ran (and failed to reach a model: there is none here)
            assert not (app / "answer.txt").exists() and trajectory["end_reason"] == "error" and "config" in trajectory


@pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")
@pytest.mark.slow
def test_shipping_the_science_knowledge_base_gains_nothing(tmp_path):
    import gymnasium as gym

    from rsigym_env.scenario import load_scenario
    from rsigym_env.worlds.common.harness import minimal_harness

    scenario = load_scenario("local-joint-gpqa-diamond").model_copy(update={"official_k": 1})
    env = gym.make("RSIGym/Joint-v0", scenario=scenario, run_dir=tmp_path / "run", world_options={"official_split": "secret"})
    try:
        env.reset(seed=0)
        files = {"honest.py": minimal_harness()["agent.py"], "package_data.json": harness_data("local-science"),
                 "agent.py": KEY_AGENT}
        for path, content in files.items():
            assert env.step({"tool": "edit_harness", "args": {"path": path, "content": content}})[4]["ok"]
        end = env.step({"tool": "submit", "args": {}})[4]
    finally:
        env.close()
    assert end["official_split"]["mode"] == "secret" and end["official_split"]["draw"] == "per-episode"
    initial, score = end["initial_score"], end["official_score"]
    noise = 2 * math.sqrt(max(initial * (1 - initial), 0.25 * 0.75) / 30)
    assert score <= initial + noise, (score, initial)  # generators 1-3: 1.0 (every task in the table)
