"""The five local benchmarks: deterministic Harbor task directories, disjoint seed streams, verifiers."""

from __future__ import annotations

import asyncio

import hashlib
import os
import random
import re
import shutil
import subprocess
import tomllib
from itertools import islice
from pathlib import Path

import pytest

from rsigym_env.worlds.local import benchmarks as B
from rsigym_env.worlds.local.benchmarks.base import parse_action

BWRAP = shutil.which("bwrap")


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() + oct(p.stat().st_mode & 0o777)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, dict[str, Path]]:
    root = tmp_path_factory.mktemp("tasks")
    return {name: b.build(root) for name, b in B.BENCHMARKS.items()}


def test_resolve_accepts_local_and_paper_ids():
    for name, b in B.BENCHMARKS.items():
        assert B.resolve(name) is b and B.resolve(b.paper_id) is b
        assert b.description.count(".") >= 2 and b.domain in B.DOMAINS
    with pytest.raises(ValueError, match="swe-bench-verified"):
        B.resolve("swe-bench")


def test_build_is_deterministic_and_idempotent(built, tmp_path):
    for name, b in B.BENCHMARKS.items():
        again = b.build(tmp_path)
        for split in ("dev", "official"):
            assert again[split].parent.name == built[name][split].parent.name  # same content hash
            assert tree_digest(again[split]) == tree_digest(built[name][split])
        stamp = (again["dev"].parent / ".complete").stat().st_mtime_ns
        assert b.build(tmp_path) == again and (again["dev"].parent / ".complete").stat().st_mtime_ns == stamp


def test_split_sizes_and_task_layout(built):
    from harbor.models.task.config import TaskConfig

    for name, dirs in built.items():
        for split, n in B.SPLIT_SIZES.items():
            tasks = sorted(p for p in dirs[split].iterdir() if p.is_dir())
            assert len(tasks) == n
            for t in tasks[:3]:
                for rel in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh",
                            "tests/check.py", "tests/expected.json", "solution/solve.sh"):
                    assert (t / rel).is_file(), (t, rel)
                cfg = TaskConfig.model_validate(tomllib.loads((t / "task.toml").read_text()))
                assert cfg.metadata["domain"] == B.BENCHMARKS[name].domain and cfg.agent.timeout_sec > 0
                assert not (t / "environment" / "expected.json").exists()  # the answer lives only in tests/


def test_splits_and_streams_are_disjoint():
    for b in B.BENCHMARKS.values():
        dev = {p.key for p in b.split("dev")}
        official = {p.key for p in b.split("official")}
        assert len(dev) == 20 and len(official) == 30 and not dev & official
        held = dev | official
        synthetic = {p.key for p in b.synthetic(150, seed=0)}
        pretrain = {p.key for p in islice(b.stream("pretrain"), 150)}
        assert not synthetic & held and not pretrain & held
        assert len(synthetic & pretrain) < 150  # different streams, not the same list
        assert b.synthetic(5, seed=1)[0].key != b.synthetic(5, seed=2)[0].key


def test_pretraining_mixture_is_deterministic_and_fits_the_context():
    from rsigym_env.worlds.common.tokenizer import ChatRenderer

    a, b = B.pretraining_conversations(300, seed=0), B.pretraining_conversations(300, seed=0)
    assert a == b and a != B.pretraining_conversations(300, seed=1)
    r = ChatRenderer()
    assert max(len(r.build_supervised_example(c)[0]) for c in a) < 512
    # every assistant turn is in the action language (or a science fact statement)
    for chat in a:
        for m in chat:
            if m["role"] == "assistant":
                assert parse_action(m["content"])[0] != "invalid" or m["content"].endswith(".")


def run_test_sh(task: Path, app: Path, verifier: Path) -> str:
    """Run tests/test.sh as Harbor does, through the local environment class: /app from ``app``, the tests
    uploaded (the verifier phase), ``bash /tests/test.sh``, the verifier directory downloaded. Code under
    test runs in the environment's probe sandbox, apart from the verifier."""
    from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from rsigym_env.worlds.local.harbor.environment import BubblewrapEnvironment

    paths = TrialPaths(trial_dir=verifier.parent / f"trial-{verifier.name}")
    paths.mkdir()
    env = BubblewrapEnvironment(app, task.name, f"{task.name}__t", paths, TaskEnvironmentConfig(),
                                require_isolation=bool(BWRAP))

    async def go() -> None:
        await env.start(force_build=False)
        await env.upload_dir(task / "tests", "/tests")
        await env.exec("bash /tests/test.sh")
        await env.download_dir("/logs/verifier", verifier)
        await env.stop(delete=True)

    asyncio.run(go())
    return (verifier / "reward.txt").read_text().strip()


def run_solve_sh(task: Path, app: Path) -> None:
    env = {"PATH": os.environ["PATH"], "RSIGYM_APP_DIR": str(app)}
    subprocess.run(["bash", str(task / "solution" / "solve.sh")], cwd=app, env=env, check=True, timeout=60,
                   capture_output=True)


@pytest.mark.parametrize("name", sorted(B.BENCHMARKS))
def test_solution_scores_one_and_an_empty_attempt_zero(built, tmp_path, name):
    tasks = sorted(p for p in built[name]["official"].iterdir() if p.is_dir())
    for task in tasks[:2]:
        for solve, want in ((True, "1"), (False, "0")):
            app = tmp_path / f"{task.name}-{solve}"
            shutil.copytree(task / "environment", app)
            if solve:
                run_solve_sh(task, app)
            assert run_test_sh(task, app, tmp_path / f"v-{task.name}-{solve}") == want, (task, solve)


def test_test_sh_finds_its_check_however_it_is_started(built, tmp_path):
    """tests/test.sh locates check.py beside itself without starting a process for it: by absolute path
    (Harbor), by a relative one, and from its own directory."""
    task = sorted(p for p in built["local-math"]["dev"].iterdir() if p.is_dir())[0]
    app = tmp_path / "app"
    shutil.copytree(task / "environment", app)
    run_solve_sh(task, app)
    for n, (argv, cwd) in enumerate([(["bash", str(task / "tests" / "test.sh")], tmp_path),
                                     (["bash", "tests/test.sh"], task), (["bash", "test.sh"], task / "tests")]):
        out = tmp_path / f"verifier-{n}"
        env = {"PATH": os.environ["PATH"], "RSIGYM_APP_DIR": str(app), "RSIGYM_VERIFIER_DIR": str(out)}
        subprocess.run(argv, cwd=cwd, env=env, check=True, timeout=60, capture_output=True)
        assert (out / "reward.txt").read_text() == "1\n", argv


def test_visible_check_passes_only_after_the_fix(built, tmp_path):
    task = sorted(p for p in built["local-code"]["dev"].iterdir() if p.is_dir())[0]
    app = tmp_path / "app"
    shutil.copytree(task / "environment", app)
    assert subprocess.run(["bash", "check.sh"], cwd=app, capture_output=True).returncode != 0
    run_solve_sh(task, app)
    assert subprocess.run(["bash", "check.sh"], cwd=app, capture_output=True).returncode == 0


@pytest.mark.parametrize("name", sorted(B.BENCHMARKS))
def test_checker_agrees_with_the_verifier(name):
    b = B.BENCHMARKS[name]
    for p in b.split("dev")[:2]:
        solved = p.messages + [{"role": "assistant", "content": a} for a in p.solution]
        assert b.check(p, solved)
        assert not b.check(p, p.messages + [{"role": "assistant", "content": "DONE"}])
        if not p.multi_turn:
            wrong = "ANSWER: B" if p.expected["answer"] != "B" else "ANSWER: C"
            assert not b.check(p, p.messages + [{"role": "assistant", "content": wrong}])


def test_skill_tools_need_their_documented_convention(tmp_path):
    from rsigym_env.worlds.local.benchmarks import skills

    p = B.BENCHMARKS["local-skills"].split("dev")[0]
    B.write_files(tmp_path, p.files)
    m = p.meta
    wrong = [s for s in range(4) if s != m["syntax"]][0]
    out, code = B.run_command(skills.command(wrong, m["skill"], m["k"], m["src"], m["dst"]), tmp_path)
    assert code == 2 and "bad arguments" in out
    out, code = B.run_command(skills.command(m["syntax"], m["skill"], m["k"], m["src"], m["dst"]), tmp_path)
    assert code == 0 and (tmp_path / m["dst"]).read_text() == p.expected["files"][m["dst"]]


def test_shipped_base_checkpoint_is_registered_and_intact():
    import numpy as np

    from rsigym_env.worlds.local.lm.base import BASE_DIR, load_base, manifest
    from rsigym_env.worlds.local.lm.tinker_client import LocalServiceClient

    meta = manifest()
    assert (BASE_DIR / "weights.npz").stat().st_size <= 8_000_000
    assert meta["build_seconds"] > 0 and meta["recipe"]["stages"]
    assert {int(k): v for k, v in meta["mixtures"].items()} == {s["mixture"]: B.MIXTURES[s["mixture"]] for s in meta["recipe"]["stages"]}
    base = load_base(verify=True)
    assert base.config.max_seq_len == 512 and base.config.vocab_size == 272
    assert all(v.dtype == np.float32 for v in base.params.values())
    service = LocalServiceClient()
    tc = service.create_lora_training_client(base_model="rsigym-base", rank=4).result()
    assert tc.get_info().model_data.model_name == "rsigym-base"


@pytest.mark.parametrize("version", sorted(B.MIXTURES))
def test_pretraining_prompts_never_contain_a_dev_or_official_task(version):
    # a skills instruction recurs with other tool conventions (its key includes the convention), so
    # skills are checked by key in test_splits_and_streams_are_disjoint
    held = {p.instruction for b in B.BENCHMARKS.values() if b.domain != "skills"
            for s in ("dev", "official") for p in b.split(s)}
    chats = B.pretraining_conversations(1500, seed=version - 1, version=version)
    prompts = {next(m["content"] for m in c if m["role"] == "user").split("\nSkill ")[0] for c in chats}
    assert not prompts & held


def test_recorded_stages_match_the_shipped_manifest():
    from rsigym_env.worlds.local.lm.base import manifest
    from rsigym_env.worlds.local.benchmarks import arith

    recipe = manifest()["recipe"]
    assert arith.RECORDED_STAGES == tuple((s["mixture"], s["data_seed"], s["steps"] * recipe["batch_size"])
                                          for s in recipe["stages"])


def test_generator_3_splits_never_held_a_recorded_pretraining_problem():
    """Generator 3 changed local-math and local-code; the recorded stages drew theirs from generators 1-2.
    Math: the splits skip a superset of the recorded stages' multi-operation problems (checked against
    the stages' real conversations here) and have >= 2 operations (drills have 1). Code: generator 3's
    function names are none of generator 1-2's, and a task's key holds its code."""
    from rsigym_env.worlds.local.benchmarks import arith, coding

    recorded = arith.recorded_pretrain_keys()
    math = B.BENCHMARKS["local-math"]
    held = {p.key for s in ("dev", "official") for p in math.split(s)}
    assert not held & recorded and all(len(k.split()) >= 5 for k in held)
    expr = re.compile(r"Compute left to right: ([0-9 +*-]+)")
    for mixture, seed, _n in arith.RECORDED_STAGES:
        chats = B.pretraining_conversations(1200, seed=seed, version=mixture)
        prompts = [next(m["content"] for m in c if m["role"] == "user") for c in chats]
        keys = {expr.search(t).group(1).strip() for t in prompts if "Compute left to right" in t}
        multi = {k for k in keys if len(k.split()) > 3}
        assert multi and multi <= recorded and not keys & held
    code = B.BENCHMARKS["local-code"]
    assert not set(coding.NAMES) & set(coding.NAMES_V3)
    for s in ("dev", "official"):
        for p in code.split(s):
            assert re.match(r"def (\w+)\(", p.files["calc.py"]).group(1) in coding.NAMES_V3
    for mixture, seed, _ in arith.RECORDED_STAGES:
        for c in B.pretraining_conversations(600, seed=seed, version=mixture):
            m = re.search(r"calc\.py:\ndef (\w+)\(", next(x["content"] for x in c if x["role"] == "user"))
            assert m is None or m.group(1) in coding.NAMES


def test_generator_3_new_bugs_are_fixed_by_the_teachers_solver():
    from rsigym_env.worlds.local.benchmarks import coding

    code = B.BENCHMARKS["local-code"]
    probs = code.synthetic(120, seed=3)
    new = [p for p in probs if (p.meta["good"], p.meta["bad"]) not in
           {(g.format(k=k, j=j), b.format(k=k, j=j)) for _, (g, b), _, _ in coding.TEMPLATES for k in range(2, 10) for j in range(2, 10)}]
    assert len(new) > 20
    for p in new:
        assert code.check(p, p.messages + [{"role": "assistant", "content": coding.solve_next(p.messages)},
                                           {"role": "assistant", "content": "DONE"}]), p.instruction


# --- local-science: generator 4 states the facts in the question ---------------------------------------


def test_science_problems_state_their_facts_and_invent_their_substances():
    """Every problem's truth is in its lab notes (the solver reads it from the chat alone), its substances
    are invented for it (never one of the old knowledge base's, which the base model was pretrained on),
    the other substance's value is always an option, and letters and difficulties are balanced."""
    from collections import Counter

    from rsigym_env.splits import official_split
    from rsigym_env.worlds.local.benchmarks import science

    b = B.BENCHMARKS["local-science"]
    problems = (b.split("dev") + b.split("official") + b.synthetic(400, seed=2)
                + b.split("official", official_split("secret", secret="s", nonce="n")))
    for p in problems:
        assert p.instruction.startswith("Lab notes: ") and p.instruction.endswith("Reply ANSWER: <letter>.")
        assert B.domain_of(p.messages) == "science" and p.expected["kind"] == "answer"
        assert science.solve_next(p.messages) == p.solution[0] and p.solution[0].endswith("ANSWER: " + p.expected["answer"])
        wrong = B.parse_action(science.solve_next(p.messages, random.Random(0), wrong=True))[1]
        assert wrong in "ABCD" and wrong != p.expected["answer"]
        assert p.meta["entity"] not in science.KB and p.meta["other"] not in science.KB
        facts, _ = science.read_notes(p.instruction)
        assert set(facts) == {p.meta["entity"], p.meta["other"]}
        options = dict(re.findall(r"^([ABCD])\) (\w+)$", p.instruction, re.M))
        assert len(set(options.values())) == 4 and set(options.values()) <= set(science.ATTRIBUTES[p.meta["attr"]])
    letters = Counter(p.expected["answer"] for p in problems)
    assert min(letters.values()) > 0.18 * len(problems)
    hard = sum(p.difficulty == "hard" for p in problems) / len(problems)
    assert 0.3 < hard < 0.5


def test_science_answers_are_not_in_the_package():
    """The same question with other notes has another answer: the notes decide, not a table."""
    from rsigym_env.worlds.local.benchmarks import science

    p = B.BENCHMARKS["local-science"].split("dev")[3]
    question = p.instruction.split("\n", 1)[1]
    options = dict(re.findall(r"^([ABCD])\) (\w+)$", question, re.M))
    entity, attr = p.meta["entity"], p.meta["attr"]
    a, b = [science.ATTRIBUTES[k][0] for k in sorted(science.ATTRIBUTES) if k != attr][:2]  # other properties
    for letter, value in options.items():
        notes = f"Lab notes: {entity} is {value} and {a}; {p.meta['other']} is {b}."
        chat = [{"role": "user", "content": notes + "\n" + question}]
        assert science.solve_next(chat) == f"{entity} {attr} is {value}. ANSWER: {letter}"


PRETRAINING_DIGESTS = {(1, 0): "12d4739bef2f3605", (2, 1): "d56f3556de0b40f3", (3, 2): "ef8d23389f67b37c",
                       (3, 3): "a3b9d81ff74e4662", (4, 4): "10c7d5da152e2357"}
"""sha256 (first 16 hex digits) of ``pretraining_conversations(2000, seed, mixture)`` for each recorded stage,
as the shipped base checkpoint was pretrained (generator 3; unchanged by generator 4)."""


def test_pretraining_still_draws_what_the_shipped_checkpoint_saw():
    """Generator 4 changed only the benchmark: pretraining keeps drawing science from generators 1-3
    (``science.kb_stream``), so the shipped checkpoint stays reproducible from the build script."""
    import json

    from rsigym_env.worlds.local.benchmarks import arith

    assert set(PRETRAINING_DIGESTS) == {(m, s) for m, s, _ in arith.RECORDED_STAGES}
    for (mixture, seed), digest in PRETRAINING_DIGESTS.items():
        chats = B.pretraining_conversations(2000, seed=seed, version=mixture)
        assert hashlib.sha256(json.dumps(chats, sort_keys=True).encode()).hexdigest()[:16] == digest, (mixture, seed)
        assert not any("Lab notes:" in m["content"] for c in chats for m in c)  # generator 4 never in pretraining


def test_generator_6_ships_a_shell_profile_only_where_steps_assume_a_fresh_shell():
    """Issue 30: a persistent session reads the project's ``.bashrc`` (the harness's agent.py), which puts it
    in build/. Generator 6 ships one to a share of the skills and code tasks (their steps assume a fresh
    shell at /app, so ``persistent`` costs there), never to terminal's (where it is the fix), and only in
    files the instruction does not mention."""
    from rsigym_env.worlds.local.benchmarks.base import PROFILE_FILES

    shares = {}
    for name, bench in B.BENCHMARKS.items():
        problems = bench.split("dev") + bench.split("official")
        shipped = [p for p in problems if ".bashrc" in p.files]
        shares[name] = len(shipped) / len(problems)
        for p in shipped:
            assert {k: p.files[k] for k in PROFILE_FILES} == PROFILE_FILES and p.meta["profile"]
            assert ".bashrc" not in p.instruction and "build" not in p.instruction
    assert shares["local-terminal"] == shares["local-math"] == shares["local-science"] == 0
    assert 0.6 <= shares["local-skills"] <= 0.9 and 0.3 <= shares["local-code"] <= 0.7, shares
