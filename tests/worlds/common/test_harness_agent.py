"""The minimal harness's agent.py: each remedy changes behaviour (scripted models over the real server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rsigym_env.serving import ModelRegistry, OpenAIServer, ScriptedChatModel
from rsigym_env.worlds.common.harness import HARNESS_DIR, REMEDIES, minimal_harness, with_remedies

from rsigym_env.worlds.common.harness import agent as harness_agent


@pytest.fixture(scope="module")
def server():
    registry = ModelRegistry()
    with OpenAIServer(registry) as srv:
        yield srv


def run_agent(server, tmp_path: Path, turns: list, *, remedies=(), files: dict[str, str] | None = None,
              instruction: str = "Do the task.", toml_extra: dict[str, str] | None = None, seed: int = 3,
              context_length: int | None = None):
    """Run agent.py against a scripted model → (trajectory, app dir, the model's requests)."""
    name = f"scripted-{tmp_path.parent.name}-{tmp_path.name}"
    model = ScriptedChatModel(turns, context_length=context_length)
    server.registry.add(name, model, replace=True)
    harness = tmp_path / "harness"
    harness.mkdir(parents=True)
    hfiles = with_remedies(minimal_harness(), list(remedies))
    for key, value in (toml_extra or {}).items():
        hfiles["harness.toml"] = "\n".join(f"{key} = {value}" if line.startswith(f"{key} =") else line
                                           for line in hfiles["harness.toml"].splitlines())
    for fname, text in hfiles.items():
        (harness / fname).write_text(text)
    app, logs = tmp_path / "app", tmp_path / "logs"
    app.mkdir()
    for rel, text in (files or {}).items():
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        (app / rel).write_text(text)
    (tmp_path / "instruction.md").write_text(instruction)
    env = {"PATH": os.environ["PATH"], "RSIGYM_MODEL_URL": server.base_url, "RSIGYM_MODEL": name,
           "RSIGYM_SEED": str(seed), "RSIGYM_INSTRUCTION_FILE": str(tmp_path / "instruction.md"),
           "RSIGYM_APP_DIR": str(app), "RSIGYM_LOGS_DIR": str(logs), "RSIGYM_HARNESS_DIR": str(harness)}
    subprocess.run(["python3", str(harness / "agent.py")], env=env, cwd=app, timeout=60, check=False)
    return json.loads((logs / "trajectory.json").read_text()), app, model.requests


def commands(traj: dict) -> list[str]:
    return [c["command"] for s in traj["steps"] for c in s.get("commands", [])]


def test_minimal_toml_has_every_remedy_off():
    text = minimal_harness()["harness.toml"]
    for key, (_, minimal, fixed) in REMEDIES.items():
        assert f"{key} = {minimal}" in text
        assert f"{key} = {fixed}" in with_remedies(minimal_harness(), [key])["harness.toml"]
    cfg = harness_agent.load_config(str(HARNESS_DIR / "harness.toml"))
    assert cfg["generation"]["on_truncation"] == "stop" and not cfg["shell"]["persistent"]


def test_prompt_md_is_the_benchmarks_system_prompt():
    from rsigym_env.worlds.local.benchmarks import SYSTEM_PROMPT

    assert minimal_harness()["prompt.md"].strip() == SYSTEM_PROMPT


def test_answer_is_written_and_requests_carry_trial_seeds(server, tmp_path):
    traj, app, reqs = run_agent(server, tmp_path, ["2+3=5 ANSWER: 5"])
    assert traj["end_reason"] == "answer"
    assert (app / "answer.txt").read_text().strip() == "5"
    assert reqs[0].seed == harness_agent.request_seed(3, 0, 0)
    assert reqs[0].messages[0].role == "system" and traj["usage"]["requests"] == 1


def test_the_harness_starts_without_what_only_commands_need():
    """Every trial starts a fresh interpreter and imports are most of its start-up (~10 ms of ~55 here):
    what only running a command needs, and the URL parser a socket client never uses, load when used; the
    minimal harness.toml is read without ``tomllib`` (and its ``typing``), the socket without ``socket``, an
    edited file checked without ``py_compile`` and ``tempfile``."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import agent, llm; llm.Client(socket_path='/m.sock'); "
            "agent.load_config(sys.argv[1] + '/harness.toml'); assert agent.compiles(sys.argv[1] + '/agent.py'); "
            "print(sorted({'subprocess', 'tempfile', 'shlex', 'urllib.parse', 'tomllib', 'typing', 'socket', "
            "'py_compile'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(HARNESS_DIR)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"
    shell = harness_agent.Shell(str(HARNESS_DIR), persistent=True, timeout=10)
    try:
        assert shell.run("echo hi") == ("hi\n", 0)  # imported on first use
    finally:
        shell.close()


CONTEXT_SLACK = 60
"""Prompt tokens (as the scripted model estimates them) the instruction above takes, with room to spare; the
three usage lines take more than that."""

LONG = "12+30=42 42*3=126 126-7=119 119+20=139 139*2=278 ANSWER: 278"


def test_truncation_stop_vs_continue(server, tmp_path):
    extra = {"max_output_tokens": "6"}
    stop, app_s, reqs_s = run_agent(server, tmp_path / "a", [LONG, LONG], toml_extra=extra)
    assert stop["end_reason"] == "truncated" and not (app_s / "answer.txt").exists()
    assert harness_agent.failure_label(stop, 0) == "truncated_output"
    cont, app_c, reqs_c = run_agent(server, tmp_path / "b", [LONG, LONG], toml_extra=extra, remedies=["on_truncation"])
    assert cont["end_reason"] == "answer" and (app_c / "answer.txt").read_text().strip() == "278"
    assert [r.max_tokens for r in reqs_c] == [6, 224]


def test_lost_cd_vs_persistent_shell(server, tmp_path):
    script = ["$ mkdir -p d", "$ cd d", "$ export W=hi", "$ echo $W > f.txt", "DONE"]
    lost, app_l, _ = run_agent(server, tmp_path / "a", script)
    assert (app_l / "f.txt").read_text() == "\n" and not (app_l / "d" / "f.txt").exists()
    assert harness_agent.failure_label(lost, 0) == "lost_shell_state"
    kept, app_k, _ = run_agent(server, tmp_path / "b", script, remedies=["persistent"])
    assert (app_k / "d" / "f.txt").read_text() == "hi\n" and not (app_k / "f.txt").exists()
    assert kept["signals"]["lost_cd"] == 0


def test_a_persistent_session_reads_the_project_profile(server, tmp_path):
    """No free fix: the persistent session opens as an interactive shell and reads the project's
    ``.bashrc``; on a task whose steps assume a fresh shell at /app (the benchmarks' generator 6 ships the
    profile to a share of the skills and code tasks) its commands then run in build/."""
    from rsigym_env.worlds.local.benchmarks.base import PROFILE_FILES

    files = {**PROFILE_FILES, "in.txt": "x\n"}
    script = ["$ cp in.txt out.txt", "DONE"]
    fresh, app_f, _ = run_agent(server, tmp_path / "a", script, files=files)
    assert (app_f / "out.txt").read_text() == "x\n" and fresh["steps"][0]["commands"][0]["cwd"] == "."
    kept, app_k, _ = run_agent(server, tmp_path / "b", script, files=files, remedies=["persistent"])
    cmd = kept["steps"][0]["commands"][0]
    assert not (app_k / "out.txt").exists() and cmd["exit_code"] != 0 and cmd["cwd"] == "build"
    assert "No such file" in cmd["output"]
    # without a profile the session starts at /app, as before
    plain, app_p, _ = run_agent(server, tmp_path / "c", script, files={"in.txt": "x\n"}, remedies=["persistent"])
    assert (app_p / "out.txt").read_text() == "x\n"


def test_loop_detection_resamples_hotter(server, tmp_path):
    script = ["$ ls", "$ ls", "$ touch ok", "DONE"]
    off, app_off, reqs_off = run_agent(server, tmp_path / "a", script)
    assert commands(off) == ["ls", "ls", "touch ok"] and off["signals"]["repeats"] == 1
    on, app_on, reqs_on = run_agent(server, tmp_path / "b", script, remedies=["detect"])
    assert commands(on) == ["ls", "touch ok"] and on["signals"]["loop_resamples"] == 1
    assert reqs_on[2].temperature == pytest.approx(1.2) and reqs_off[2].temperature == pytest.approx(0.7)
    looping, _, _ = run_agent(server, tmp_path / "c", ["$ ls"] * 8)
    assert looping["end_reason"] == "max_turns" and harness_agent.failure_label(looping, 0) == "action_loop"


def test_unchecked_edit_vs_compile_check(server, tmp_path):
    files = {"calc.py": "def f():\n    return 1\n"}
    script = ["$ echo 'def f(:' > calc.py", "DONE"]
    off, app_off, _ = run_agent(server, tmp_path / "a", script, files=files)
    assert "def f(:" in (app_off / "calc.py").read_text() and off["signals"]["broken_edit"] == 1
    assert harness_agent.failure_label(off, 0) == "unchecked_edit"
    on, app_on, reqs = run_agent(server, tmp_path / "b", script, files=files, remedies=["check"])
    assert (app_on / "calc.py").read_text() == files["calc.py"]
    assert on["signals"]["reverted_edits"] == 1 and on["end_reason"] == "done" and len(reqs) == 2


def test_verify_before_submit_runs_check_sh(server, tmp_path):
    files = {"check.sh": "test -f ok.txt || { echo missing ok.txt; exit 1; }\n"}
    script = ["DONE", "$ touch ok.txt", "DONE"]
    off, app_off, _ = run_agent(server, tmp_path / "a", script, files=files)
    assert off["end_reason"] == "done" and not (app_off / "ok.txt").exists()
    assert harness_agent.failure_label(off, 0) == "unverified_completion"
    on, app_on, reqs = run_agent(server, tmp_path / "b", script, files=files, remedies=["verify_before_submit"])
    assert (app_on / "ok.txt").exists() and on["signals"]["verified"] and on["signals"]["verify_failures"] == 1
    assert reqs[1].messages[-1].content == "OUT: check failed: missing ok.txt"


def test_load_skills_shows_usage_lines(server, tmp_path):
    files = {"skills/rot/SKILL.md": "# rot\nShifts letters.\nUsage: python3 skills/rot/run.py -k K IN OUT\n",
             "skills/pad/SKILL.md": "# pad\nPads.\nUsage: python3 skills/pad/run.py IN OUT K\n"}
    inst = "Use the rot skill with value 2 on in.txt and write the result to out.txt."
    off, _, reqs_off = run_agent(server, tmp_path / "a", ["DONE"], files=files, instruction=inst)
    assert "Usage:" not in reqs_off[0].messages[-1].content
    assert harness_agent.failure_label(off, 0) == "missing_skill"
    on, _, reqs_on = run_agent(server, tmp_path / "b", ["DONE"], files=files, instruction=inst, remedies=["load_skills"])
    user = reqs_on[0].messages[-1].content
    assert "Skill rot: Usage: python3 skills/rot/run.py -k K IN OUT" in user and "skills/pad" not in user
    # an instruction that names no skill gets the whole library (the harness cannot tell which it needs)
    lib, _, reqs_lib = run_agent(server, tmp_path / "c", ["DONE"], files=files, instruction="Make a file.",
                                 remedies=["load_skills"])
    user = reqs_lib[0].messages[-1].content
    assert "Skill pad: Usage: python3 skills/pad/run.py IN OUT K" in user and "Skill rot: Usage:" in user
    assert harness_agent.failure_label(lib, 0) == "wrong_answer"  # no skill named: no missing_skill


def test_a_library_the_task_does_not_name_is_no_missing_skill(server, tmp_path):
    """Tools an environment ships but the instruction never names are not a defect of the harness; loading
    them costs context: with a larger ``max_output_tokens`` the first request no longer fits."""
    files = {f"skills/{n}/SKILL.md": f"# {n}\nA tool.\nUsage: python3 skills/{n}/run.py -k K IN OUT --verbose\n"
             for n in ("rot", "pad", "cut")}
    inst = "In the directory logs, create the file a.txt containing the word hello. One command per turn, then DONE."
    off, _, _ = run_agent(server, tmp_path / "a", ["DONE"], files=files, instruction=inst)
    assert off["signals"]["skills_present"] and not off["signals"]["skills_named"]
    assert harness_agent.failure_label(off, 0) == "wrong_answer"
    from rsigym_env.worlds.common.evaluation import failure_label
    assert failure_label(0.0, off["end_reason"], None, off["signals"]) == "wrong_answer"
    # the model's window holds the instruction and a 224-token reply, not the library as well
    cfg, window = {"max_output_tokens": "224"}, 224 + CONTEXT_SLACK
    plain, _, _ = run_agent(server, tmp_path / "b", ["DONE"], files=files, instruction=inst, toml_extra=cfg,
                            context_length=window)
    assert plain["end_reason"] == "done"
    loaded, _, _ = run_agent(server, tmp_path / "c", ["DONE"], files=files, instruction=inst, toml_extra=cfg,
                             context_length=window, remedies=["load_skills"])
    assert loaded["end_reason"] == "context_full" and loaded["signals"]["skill_seen"]
    small, _, _ = run_agent(server, tmp_path / "d", ["DONE"], files=files, instruction=inst, context_length=window,
                            remedies=["load_skills"])  # the minimal reply still fits beside the library
    assert small["end_reason"] == "done"


def test_unreachable_model_is_a_harness_error(tmp_path):
    app, logs = tmp_path / "app", tmp_path / "logs"
    app.mkdir()
    (tmp_path / "i.md").write_text("x")
    env = {"PATH": os.environ["PATH"], "RSIGYM_MODEL_URL": "http://127.0.0.1:9/v1", "RSIGYM_MODEL": "m",
           "RSIGYM_INSTRUCTION_FILE": str(tmp_path / "i.md"), "RSIGYM_APP_DIR": str(app), "RSIGYM_LOGS_DIR": str(logs)}
    subprocess.run(["python3", str(HARNESS_DIR / "agent.py")], env=env, timeout=30, check=False)
    traj = json.loads((logs / "trajectory.json").read_text())
    assert traj["end_reason"] == "error" and harness_agent.failure_label(traj, 0) == "harness_error"
    assert harness_agent.failure_label(traj, 1) is None


def test_agent_uses_only_the_stdlib():
    import ast

    stdlib = set(sys.stdlib_module_names) | {"llm"}
    for fname in ("agent.py", "llm.py"):
        tree = ast.parse((HARNESS_DIR / fname).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            assert all(n.split(".")[0] in stdlib | {"__future__"} for n in names), (fname, names)


TOML_PIECES = ["[generation]", "[agent]", "[a-b_1]", "[ agent ]", "[a.b]", "[[x]]", "[]", "x = 1", "x=1", "y = -0",
               "z = +7", "w = 0.5", "w = -0.0", "v = 1e3", "v = 1_0", "v = 007", "v = 0x1f", 's = "str"', "s = 'lit'",
               's = "a\\tb"', 's = "\u00e9"', 's = "a\tb"', "t = true", "t = false", "t = True", "k = [1, 2]",
               "k = {a = 1}", "k = inf", "k = nan", "# comment", "   # c", "x = 1 # c", "x = 1\t#\tc", "x = 1 #\x01",
               "x = 1 #\x7f", "  ", "", "\t", "key", "= 1", "a.b = 1", '"q" = 1', "x = 1 2", "x = .5", "x = 5.",
               "x = 1.5e2", 'x = "unterminated', "x = '''m'''", "\ufeffx = 1", "x = 1\r", 'x = "\u2028"', "dup = 1",
               "dup = 2", "x = 12345678901234567890123", "x = 1 # \u00e9\ud7ff", "x = 1 # \x0c"]

TOML_FUZZ = r"""
import random, sys, tomllib
sys.path.insert(0, sys.argv[1])
from agent import read_toml
pieces, real, bad, fast = eval(sys.argv[2]), tomllib.loads, [], 0
def outcome(f, raw):
    try:
        return ("ok", repr(f(raw)))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))
def fallback(text):
    global fast
    fast -= 1
    return real(text)
rng = random.Random(0)
for _ in range(int(sys.argv[3])):
    text = rng.choice(["\n", "\n", "\r\n", "\r"]).join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
    raw = (text + rng.choice(["", "\n", "\r\n", "\r"])).encode("utf-8", "surrogatepass")
    raw += b"\xff" if rng.random() < 0.02 else b""
    tomllib.loads, fast = fallback, fast + 1
    mine = outcome(read_toml, raw)
    tomllib.loads = real
    if mine != outcome(lambda r: tomllib.loads(r.decode()), raw):
        bad.append(raw)
print(len(bad), bad[:3], fast)
"""


@pytest.mark.parametrize("python", [sys.executable, "/usr/bin/python3"])
def test_read_toml_gives_tomllibs_value_or_its_error(python):
    """The harness reads a harness.toml of plain lines without tomllib (~8 ms of its start): 20,000 random
    documents of plain lines and near-misses (escapes, dotted keys, arrays, exponents, underscores, control
    characters, a lone CR, a BOM, a surrogate, bytes that are not UTF-8, a key or a table twice) give tomllib's
    value or its error, in the host's Python and the sandbox's; thousands of them without tomllib."""
    if not Path(python).exists():
        pytest.skip(f"no {python}")
    out = subprocess.run([python, "-I", "-c", TOML_FUZZ, str(HARNESS_DIR), repr(TOML_PIECES), "20000"],
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out[:2] == ["0", "[]"] and int(out[2]) > 2000, out


def test_every_remedys_toml_is_read_without_tomllib(monkeypatch):
    import tomllib

    expected = {}
    for key in [None, *REMEDIES]:
        text = with_remedies(minimal_harness(), [key] if key else [])["harness.toml"]
        for variant in (text, text.replace("\n", "\r\n"), text + "\n[extra]\nname = 'x'  # a researcher's table\n"):
            expected[variant] = tomllib.loads(variant)
    monkeypatch.setattr(tomllib, "loads", None)  # read without it
    for variant, value in expected.items():
        assert harness_agent.read_toml(variant.encode()) == value
    monkeypatch.undo()
    with pytest.raises(tomllib.TOMLDecodeError, match="Cannot overwrite a value"):  # a key twice: tomllib's error
        harness_agent.read_toml(b"[agent]\nmax_turns = 8\nmax_turns = 9\n")
    with pytest.raises(tomllib.TOMLDecodeError):
        harness_agent.read_toml(b"[agent]\n[agent]\n")


COMPILES = r"""
import os, py_compile, sys, tempfile
sys.path.insert(0, sys.argv[1])
from agent import compiles

def reference(path):  # the round-8 harness's check
    with tempfile.TemporaryDirectory() as tmp:
        try:
            py_compile.compile(path, cfile=os.path.join(tmp, "x.pyc"), doraise=True)
            return True
        except (py_compile.PyCompileError, OSError, ValueError, SyntaxError):
            return False

sources = [b"x = 1\n", b"def f(:\n", b"x = 1\x00\n", b"# -*- coding: latin-1 -*-\nx = '\xe9'\n", b"x = '\xff'\n",
           b"# coding: nope\nx = 1\n", b"\xef\xbb\xbfx = 1\n", b"(" * 300 + b")" * 300, b"[" * 100 + b"]" * 100,
           b"x = 1\n  y = 2\n", b"from __future__ import braces\n", b"from __future__ import annotations\nx: int = 1\n",
           b"return 1\n", b"def f():\n    yield\n    return 1\n", b"async def f():\n    await x\n", b"await x\n",
           b"-" * 100000 + b"1\n", b"f(**x, *y)\n", b"nonlocal x\n", b"x = 1e9999\n", b"'\\N{nope}'\n", b""]
tmp = tempfile.mkdtemp()
out = []
for i, src in enumerate(sources):
    path = os.path.join(tmp, f"m{i}.py")
    with open(path, "wb") as fh:
        fh.write(src)
    out.append((compiles(path), reference(path)))
out.append((compiles(os.path.join(tmp, "missing.py")), reference(os.path.join(tmp, "missing.py"))))
os.mkdir(os.path.join(tmp, "d.py"))
out.append((compiles(os.path.join(tmp, "d.py")), reference(os.path.join(tmp, "d.py"))))
print([i for i, (a, b) in enumerate(out) if a != b], sum(a for a, _ in out), len(out))
"""


@pytest.mark.parametrize("python", [sys.executable, "/usr/bin/python3"])
def test_compiles_is_py_compiles_check(python):
    """The edit check compiles with the built-in ``compile`` as ``py_compile`` does, without its imports: the
    same verdict on valid files, syntax errors, NUL bytes, encodings right and wrong, deep nesting, a future
    import, a missing file and a directory, in the host's Python and the sandbox's."""
    if not Path(python).exists():
        pytest.skip(f"no {python}")
    out = subprocess.run([python, "-I", "-c", COMPILES, str(HARNESS_DIR)], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split(maxsplit=1)
    assert out[0] == "[]" and 5 <= int(out[1].split()[0]) < int(out[1].split()[1]), out
