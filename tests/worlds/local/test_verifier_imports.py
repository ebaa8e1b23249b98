"""Issue 27 item 2, round 8: the hidden check (each task's ``tests/check.py``) without ``json``, ``socket`` or ``os``.

The check reads ``expected.json`` and the probe runner's reply with json's own C scanner and writes its
request with json's C encoder (``_json``, with ``json.loads``'s and ``json.dumps``'s settings), and reaches
the runner through ``_socket``: ~9 ms less CPU at every code trial's verifier start, ~7 ms at every other
trial's. Its verdicts must be those of the json-based check it replaces (``verifier_json_reference.py``, the
round-7 source): on every task's reference solution and on wrong ones, on every benchmark, and on hostile
probe outputs through a trial's own path (the code under test prints them; ``bash /tests/test.sh`` judges).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rsigym_env.worlds.local import benchmarks
from rsigym_env.worlds.local.benchmarks import base, coding, verifier
from rsigym_env.worlds.local.sandbox import isolation

REFERENCE = Path(__file__).with_name("verifier_json_reference.py")
SANDBOX_PYTHON = shutil.which("python3", path=isolation.DEFAULT_PATH)


def _reference():
    spec = importlib.util.spec_from_file_location("verifier_json_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OLD = _reference()

# JSON documents and near-misses: what a probe's last line or a runner's reply might be
ATOMS = ['1', '-0', '1.0', '1e5', '1E+2', 'true', 'false', 'null', '"a"', '"\\u00e9"', '"\\ud800"', 'NaN', 'Infinity',
         '-Infinity', '"x\ty"', '"\\n"', '01', '1.', '.5', '[', ']', '{', '}', ',', ':', ' ', '\n', '\r', '\t', '\x0b',
         '\ufeff', '\u00a0', '"', '\\', 'tru', '"\x00"', '\x00', '[1,]', '{"a":1,}', '9' * 30, '"\udcff"', '\u2028',
         '{"results": [["value", 5], ["error", "E"]]}', '{"results": [], "results": [1]}', '1' * 5000]

PARITY = r'''
import json, random, sys
sys.path.insert(0, sys.argv[1])
import verifier as v
assert v._scan is not None, "no _json here"
atoms = json.loads(sys.argv[2])
def outcome(f, s):
    try:
        return ("ok", repr(f(s)))
    except ValueError:
        return ("ValueError",)
    except RecursionError:
        return ("RecursionError",)
rng, bad = random.Random(27), []
docs = ["".join(rng.choice(atoms) for _ in range(rng.randint(0, 8))) for _ in range(20000)]
docs += atoms + ["[" * 100000 + "]" * 100000, " " * 70000 + "1", "\x00" + atoms[-3]]
for s in docs:
    if outcome(json.loads, s) != outcome(v.loads, s):
        bad.append(s)
values = [{"argv": ["python3", "-I", "-c", v.PROBE], "stdin": '{"a": 1}', "timeout_s": 10},
          {"module": "calc", "calls": [["f", [1, 2]], ["g", [[1, 2, 3], 4]]], "app": "/app"}, "\u00e9\ud800\x00",
          [True, False, None, 1, -5, 10 ** 30, 'x"\\'], {"k": {"\u00e9": [1.5, float("inf"), float("nan")]}},
          {1: 2, True: 3, None: 4, 2.5: 5}, [], {}]
bad += [repr(x) for x in values if v.dumps(x) != json.dumps(x)]
for x in ({"a": object()}, {(1,): 2}):
    for f in (json.dumps, v.dumps):
        try:
            f(x)
            bad.append(("no TypeError", repr(x)))
        except TypeError:
            pass
print(json.dumps(bad))
'''


@pytest.mark.parametrize("python", ["host", "sandbox"])
def test_loads_and_dumps_are_json_s(python):
    """20,000 random documents and near-misses (NUL bytes, BOM, lone surrogates, NaN, huge and deep ones):
    the same value or the same error class as ``json.loads``; ``dumps`` gives ``json.dumps``'s text exactly,
    and its TypeError for what JSON cannot hold — in this interpreter and in the sandboxes'."""
    exe = sys.executable if python == "host" else SANDBOX_PYTHON
    if exe is None:
        pytest.skip("no python3 on the sandbox's PATH")
    out = subprocess.run([exe, "-I", "-c", PARITY, str(Path(verifier.__file__).parent), json.dumps(ATOMS)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def _imports(argv: list[str], **kwargs) -> set[str]:
    """The modules a ``python3 -X importtime`` run imported (beyond its start-up's)."""
    out = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, timeout=60, **kwargs)
    return {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}


def test_the_check_imports_neither_json_re_enum_nor_socket(tmp_path):
    """As test.sh starts it, on an answer task and on a code task whose probe runner answers (a stand-in
    runner on a socket of the test's; the check's own code path, its socket constant aside)."""
    if SANDBOX_PYTHON is None:
        pytest.skip("no python3 on the sandbox's PATH")
    tests, app = tmp_path / "tests", tmp_path / "app"
    tests.mkdir()
    app.mkdir()
    (tests / "check.py").write_text(base.VERIFIER_PY)
    (tests / "expected.json").write_text(json.dumps({"kind": "answer", "answer": "4"}))
    (app / "answer.txt").write_text("4\n")
    env = {"RSIGYM_APP_DIR": str(app)}
    answer = _imports([SANDBOX_PYTHON, "-I", "-S", str(tests / "check.py")], env=env)

    sock = Path(tempfile.mkdtemp(prefix="rsigym-t-", dir="/tmp")) / "p.sock"
    reply = json.dumps({"exit_code": 0, "stdout": '\n{"results": [["value", 3]]}\n', "stderr": "", "limit": None})
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(sock), reply])
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        code = r"""
import sys
sys.path.insert(0, sys.argv[1])
import verifier
verifier.SOCKET = sys.argv[2]
sys.exit(0 if verifier.judge({"kind": "calls", "module": "m", "calls": [["f", [1]]], "want": [3]}, "/app") else 1)
"""
        argv = [SANDBOX_PYTHON, "-I", "-S", "-c", code, str(Path(verifier.__file__).parent), str(sock)]
        calls = _imports(argv)
        assert subprocess.run(argv, timeout=60).returncode == 0  # the runner's reply was read and judged solved
    finally:
        runner.kill()
        runner.wait()
        shutil.rmtree(sock.parent, ignore_errors=True)
    for imported in (answer, calls):
        assert "_json" in imported and not imported & {"json", "json.decoder", "re", "enum", "socket", "selectors", "os"}
    assert "_socket" in calls


RUNNER = r"""
import os, socket, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(sys.argv[1])
srv.listen(4)
while True:
    conn, _ = srv.accept()
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    conn.sendall(sys.argv[2].encode() + b"\n")
    conn.close()
"""


def _apps(problem: base.Problem, root: Path) -> dict[str, Path]:
    """The task as given, solved by its reference actions, and (code tasks) fixed wrongly by the solver's
    other edits: app directories to judge."""
    variants: dict[str, list[str]] = {"given": [], "solved": problem.solution}
    if problem.expected.get("kind") == "calls":
        for n, (old, new) in enumerate(coding.candidate_fixes(problem.files["calc.py"])[:3]):
            variants[f"edit{n}"] = [coding._sed(old, new)]
    apps = {}
    for name, actions in variants.items():
        app = root / name
        app.mkdir(parents=True)
        base.write_files(app, problem.files)
        base.replay(problem, actions, app)
        apps[name] = app
    return apps


@pytest.mark.slow
def test_verdicts_equal_the_json_checks_on_every_task(tmp_path):
    """Every dev and public official task of the five benchmarks: as given, with its reference solution and
    (code tasks) with three of the solver's edits, right or wrong: the same verdict from both checks, and
    the reference solutions solve (so the comparison is not between two checks that fail everything)."""
    verdicts = {}
    for name, bench in sorted(benchmarks.BENCHMARKS.items()):
        for split in ("dev", "official"):
            for i, problem in enumerate(bench.split(split)):
                for variant, app in _apps(problem, tmp_path / name / split / str(i)).items():
                    new = verifier.judge(problem.expected, str(app), local=True)
                    old = OLD.judge(problem.expected, str(app), local=True)
                    assert new == old, (problem.id, variant)
                    verdicts[(name, problem.id, variant)] = new
    assert all(v for (_, _, variant), v in verdicts.items() if variant == "solved")
    assert not any(v for (_, _, variant), v in verdicts.items() if variant == "given")
    edits = [v for (name, _, variant), v in verdicts.items() if variant.startswith("edit")]
    assert 0 < sum(edits) < len(edits)


# --- hostile probe outputs, through a trial's own path --------------------------------------------------

def _hostile_outputs(want: list) -> dict[str, tuple[bytes, str]]:
    """What code under test prints in place of the probe's results (then it exits): name → (bytes, the
    reward both checks must give). Only output that parses, as JSON, to exactly the wanted values passes."""
    first = want[0]
    exact = json.dumps({"results": [["value", w] for w in want]})

    def with_first(value) -> str:
        return json.dumps({"results": [["value", value]] + [["value", w] for w in want[1:]]})

    other_type = int(first) if isinstance(first, bool) else bool(first)
    return {
        "exact": (f"\n{exact}\n".encode(), "1"),
        "compact_spaced_and_cr": (("  " + json.dumps(json.loads(exact), separators=(",", ":")) + " \r\n").encode(), "1"),
        "duplicate_key_last_wins": (('{"results": [], "results": ' + exact[len('{"results": '):]).encode(), "1"),
        "extra_key": ((exact[:-1] + ', "import_error": null}').encode(), "1"),
        "bool_for_int_or_int_for_bool": (with_first(other_type).encode(), "0"),
        "float_form": (with_first(float(first)).encode(), "0"),
        "exponent_form": (with_first(first).replace(f'["value", {json.dumps(first)}]', '["value", 1e0]', 1).encode(), "0"),
        "string_form": (with_first(str(first)).encode(), "0"),
        "second_line_after": (f"{exact}\n[]\n".encode(), "0"),
        "garbage_before_on_the_line": (f"ok {exact}\n".encode(), "0"),
        "a_second_document_on_the_line": (f"{exact} []\n".encode(), "0"),
        "unicode_line_break_after": (f"{exact}\u2028x\n".encode(), "0"),
        "nul_before": (b"\x00" + exact.encode() + b"\n", "0"),
        "nul_inside": (exact.replace("[", "[\x00", 1).encode(), "0"),
        "not_utf8": (b"\xff\xfe" + exact.encode() + b"\n", "0"),
        "huge_line": ((" " * 70000 + exact + "\n").encode(), "0"),  # past the probe's 64 KiB of output
        "deep_nesting": (b"[" * 100000 + b"\n", "0"),
        "huge_int": (with_first(0).replace('["value", 0]', '["value", ' + "9" * 5000 + "]", 1).encode(), "0"),
        "nan": (with_first(0).replace('["value", 0]', '["value", NaN]', 1).encode(), "0"),
        "nothing": (b"", "0"),
    }


def _verify(task: Path, tests: Path, trial: Path, calc: str) -> tuple[str, int]:
    """One trial of ``task`` whose agent left ``calc`` as ``calc.py``, verified with the tests directory
    ``tests`` (Harbor's own steps: upload /tests, ``bash /tests/test.sh``) → (reward, exit code)."""
    from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from rsigym_env.worlds.local.harbor.environment import BubblewrapEnvironment

    paths = TrialPaths(trial_dir=trial)
    paths.mkdir()
    env = BubblewrapEnvironment(task / "environment", task.name, f"{task.name}__{trial.name}", paths,
                                TaskEnvironmentConfig())

    async def go() -> tuple[str, int]:
        await env.start(force_build=False)
        try:
            (env.app_dir / "calc.py").write_text(calc)
            await env.upload_dir(tests, "/tests")
            result = await env.exec("bash /tests/test.sh")
            return (env.host_path("/logs/verifier") / "reward.txt").read_text().strip(), result.return_code
        finally:
            await env.stop(delete=True)

    return asyncio.run(go())


@pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")
def test_hostile_probe_outputs_score_as_with_the_json_check_through_a_trial(tmp_path):
    """Code under test that prints a forged result line and exits: a bool where an int is wanted, ``1.0``,
    ``1e0``, ``"1"``, a second line, garbage before it, a Unicode line break, NUL bytes, bytes that are not
    UTF-8, a line past the probe's output limit, 100,000 open brackets, a 5,000-digit number, NaN, nothing.
    Each gets the reward the json-based check gives it, through Harbor's verifier steps in a trial; only the
    forms that parse to exactly the wanted values pass (the values are hidden from the code under test)."""
    task = sorted(p for p in benchmarks.resolve("local-code").build(tmp_path / "tasks")["dev"].iterdir()
                  if p.is_dir())[0]
    reference_tests = tmp_path / "reference-tests"
    shutil.copytree(task / "tests", reference_tests)
    (reference_tests / "check.py").write_text(REFERENCE.read_text())
    assert (task / "tests" / "check.py").read_text() == base.VERIFIER_PY
    want = json.loads((task / "tests" / "expected.json").read_text())["want"]
    rewards = {}
    for name, (output, expected) in _hostile_outputs(want).items():
        calc = f"import os\nos.write(1, {output!r})\nos._exit(0)\n"
        new = _verify(task, task / "tests", tmp_path / f"{name}-new", calc)
        old = _verify(task, reference_tests, tmp_path / f"{name}-old", calc)
        assert new == old, name
        rewards[name] = new[0]
        assert new[0] == expected, name
    assert set(rewards.values()) == {"0", "1"}


@pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")
def test_code_under_test_that_is_right_or_wrong_scores_as_with_the_json_check_through_a_trial(tmp_path):
    """The reference fix, the bug, and a random wrong edit on three code tasks, through a trial."""
    dirs = benchmarks.resolve("local-code").build(tmp_path / "tasks")
    rng = random.Random(8)
    tasks = sorted(p for p in dirs["dev"].iterdir() if p.is_dir())[:3]
    seen = []
    for n, task in enumerate(tasks):
        reference_tests = tmp_path / f"reference-tests-{n}"
        shutil.copytree(task / "tests", reference_tests)
        (reference_tests / "check.py").write_text(REFERENCE.read_text())
        buggy = (task / "environment" / "calc.py").read_text()
        exp = json.loads((task / "tests" / "expected.json").read_text())
        app = tmp_path / f"solved-{n}"
        shutil.copytree(task / "environment", app)
        subprocess.run(["bash", str(task / "solution" / "solve.sh")], cwd=app, check=True, timeout=60,
                       env={"PATH": isolation.DEFAULT_PATH, "RSIGYM_APP_DIR": str(app)})
        fixed = (app / "calc.py").read_text()
        assert fixed != buggy
        wrong = buggy.replace(*rng.choice(coding.candidate_fixes(buggy)), 1)
        for name, calc in (("fixed", fixed), ("buggy", buggy), ("wrong", wrong)):
            new = _verify(task, task / "tests", tmp_path / f"{n}-{name}-new", calc)
            old = _verify(task, reference_tests, tmp_path / f"{n}-{name}-old", calc)
            assert new == old, (task.name, name)
            seen.append((name, new[0]))
        assert exp["kind"] == "calls"
    assert [r for name, r in seen if name == "fixed"] == ["1"] * 3
    assert [r for name, r in seen if name == "buggy"] == ["0"] * 3


def test_the_reference_is_the_round_7_check():
    """The reference's code is the json-based check's (only its docstring's head was added), and the probe
    the new check asks for is the same command, so the probe's output is the same bytes as before."""
    ref = REFERENCE.read_text()
    body = ref[ref.index("This module is each task's"):]
    assert "import json" in body and "import socket" in body and "json.loads(lines[-1])" in body
    assert OLD.PROBE == verifier.PROBE and OLD.SOCKET == verifier.SOCKET and OLD.MAX_BYTES == verifier.MAX_BYTES
