"""The harness's bytecode compiled once per harness version (``worlds/common/harness/bytecode.py``), through real
trials: Harbor's ``Job``, the bubblewrap environment, the harness as a Harbor agent.

Each test runs the same harness with the compiled copy (the launcher) and without it (``prepare`` giving None,
i.e. ``python3 /harness/agent.py`` from source, as before) and compares what the harness saw and did.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from rsigym_env.serving.models import ChatChoice, ChatRequest, ModelRegistry, apply_limits
from rsigym_env.serving.openai_server import OpenAIServer, UsageMeter
from rsigym_env.worlds.common.harness import bytecode, minimal_harness
from rsigym_env.worlds.local.sandbox import isolation

pytestmark = pytest.mark.skipif(not isolation.bwrap_available(), reason="bubblewrap does not work here")

os.environ.setdefault("HARBOR_TELEMETRY", "0")

PROBE = r'''
import json, os, sys, traceback
import helper

def nested():
    raise ValueError("inner")

try:
    nested()
except ValueError:
    caught = traceback.format_exc()
main = sys.modules["__main__"]
seen = {
    "name": __name__, "file": __file__, "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path,
    "globals": [k for k in globals() if k.startswith("__")], "loader": type(__loader__).__name__,
    "loader_path": getattr(__loader__, "path", None), "loader_name": getattr(__loader__, "name", None),
    "cached": __cached__, "spec": repr(__spec__), "main_is_module": main.__dict__ is globals(),
    "co_filename": sys._getframe().f_code.co_filename, "caught": caught, "helper": helper.VALUE,
    "helper_file": helper.__file__, "flags": str(sys.flags), "executable": sys.executable,
    "cwd": os.getcwd(), "version": VERSION,
}
try:
    with open("/harness/__pycache__/agent.cpython-311.pyc", "wb") as fh:  # a trial cannot change the copy
        fh.write(b"x")
    seen["wrote_pyc"] = True
except OSError as exc:
    seen["wrote_pyc"] = type(exc).__name__
with open("/proc/self/mountinfo") as fh:
    seen["cache_visible"] = "rsigym-harness-bytecode" in fh.read()
with open("/proc/self/cmdline", "rb") as fh:
    seen["launcher"] = fh.read().split(b"\0")[1] == b"/harness/__pycache__/launch.py"
seen["pycache"] = sorted(os.listdir("/harness/__pycache__")) if os.path.isdir("/harness/__pycache__") else None
with open("/app/answer.txt", "w") as fh:
    fh.write("42\n")
os.makedirs("/logs/agent", exist_ok=True)
with open("/logs/agent/trajectory.json", "w") as fh:
    json.dump({"end_reason": "answer", "steps": [], "seen": seen}, fh)
if os.environ.get("RSIGYM_SEED") and os.path.exists("/harness/raise.txt"):
    nested()
sys.exit(int(open("/harness/exit.txt").read()) if os.path.exists("/harness/exit.txt") else 0)
'''


def probe(version: str = "v1", **extra: str) -> dict[str, str]:
    return {"agent.py": f"VERSION = {version!r}\n" + PROBE, "helper.py": "VALUE = 7\n", **extra}


class NoModel:
    def complete(self, request: ChatRequest) -> list[ChatChoice]:
        return [apply_limits("ANSWER: 42", request) for _ in range(request.n)]


def make_task(root: Path) -> Path:
    task = root / "t-42"
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text('schema_version = "1.4"\n[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 30.0\n')
    (task / "instruction.md").write_text("Write 42 to /app/answer.txt\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    # the verifier sees neither the harness nor its bytecode
    (task / "tests" / "test.sh").write_text(
        '#!/bin/bash\nif [ ! -e /harness ] && [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; '
        'then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n')
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho 42 > /app/answer.txt\n")
    return root


def run_trial(tmp_path: Path, files: dict[str, str], harness_dir: Path | None = None) -> dict:
    """One trial of ``files`` as the harness → what the harness recorded, its stderr, exit code and reward."""
    from harbor.job import Job
    from harbor.models.job.config import JobConfig
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig

    from rsigym_env.worlds.common.evaluation import write_harness
    from rsigym_env.worlds.common.harbor_agent import ModelSession, register_session, unregister_session

    run = tmp_path / f"run-{time.monotonic_ns()}"
    harness_dir = harness_dir or run / "harness"
    if harness_dir.exists():
        for p in harness_dir.iterdir():
            p.unlink()
    write_harness(files, harness_dir)
    registry, meter = ModelRegistry(), UsageMeter()
    sock = run / "m.sock"
    key = f"bytecode-{time.monotonic_ns()}"
    with OpenAIServer(registry, port=None, uds=sock, usage=meter):
        register_session(key, ModelSession(socket=sock, registry=registry, meter=meter, model=NoModel(), seed=0,
                                           tokens_per_trial=1000))
        config = JobConfig(job_name="job", jobs_dir=run / "jobs", n_concurrent_trials=1, quiet=True,
                           tasks=[TaskConfig(path=make_task(run / "tasks") / "t-42")],
                           agents=[AgentConfig(import_path="rsigym_env.worlds.common.harbor_agent:HarnessAgent",
                                               kwargs={"harness_dir": str(harness_dir), "session": key})],
                           environment=EnvironmentConfig(
                               import_path="rsigym_env.worlds.local.harbor.environment:BubblewrapEnvironment"))

        async def go():
            return (await (await Job.create(config)).run()).trial_results

        try:
            (result,) = asyncio.run(go())
        finally:
            unregister_session(key)
    trial = Path(result.config.trials_dir) / result.trial_name
    raw = trial / "agent" / "harness-trajectory.json"
    meta = result.agent_result.metadata
    return {"seen": json.loads(raw.read_text()).get("seen") if raw.exists() else None,
            "stderr": (trial / "agent" / "harness-stderr.txt").read_text(), "exit_code": meta["exit_code"],
            "harness_error": meta["harness_error"],
            "reward": result.verifier_result.rewards["reward"] if result.verifier_result else None}


def both(tmp_path: Path, files: dict[str, str], monkeypatch) -> tuple[dict, dict]:
    """(with the compiled copy, from source as before)."""
    compiled = run_trial(tmp_path, files)
    with monkeypatch.context() as m:
        m.setattr(bytecode, "prepare", lambda *a, **k: None)
        plain = run_trial(tmp_path, files)
    return compiled, plain


def test_the_launcher_runs_agent_py_as_python3_runs_it(tmp_path, monkeypatch):
    """``__name__``, ``__file__``, ``__loader__``, ``__cached__``, the main module's globals, ``sys.argv``,
    ``sys.orig_argv``, ``sys.path`` (``[0]`` the script's directory), a caught traceback, an imported module of the
    harness, flags, the exit code, an uncaught exception's stderr: the same from the .pyc as from source."""
    on, off = both(tmp_path, probe(**{"exit.txt": "3", "raise.txt": "1"}), monkeypatch)
    assert on["seen"]["launcher"] and not off["seen"]["launcher"]  # the two ways did run
    assert on["seen"]["pycache"] == ["agent.cpython-311.pyc", "helper.cpython-311.pyc", "launch.py"]
    assert off["seen"]["pycache"] is None
    for key in ("launcher", "pycache", "wrote_pyc"):  # (no __pycache__ to write to without the copy)
        del on["seen"][key], off["seen"][key]
    assert on == off
    seen = on["seen"]
    assert seen["argv"] == ["/harness/agent.py"] and seen["orig_argv"] == ["python3", "/harness/agent.py"]
    assert seen["path"][0] == "/harness" and seen["file"] == seen["co_filename"] == "/harness/agent.py"
    assert seen["name"] == "__main__" and seen["loader"] == "SourceFileLoader" and seen["helper"] == 7
    assert 'File "/harness/agent.py", line' in seen["caught"] and "<string>" not in on["stderr"]
    assert on["stderr"].startswith("Traceback") and on["stderr"].endswith("ValueError: inner\n")
    assert on["exit_code"] == 1 and on["reward"] == 1.0  # the verifier ran without /harness


def test_a_trial_cannot_change_or_find_the_compiled_copy(tmp_path, monkeypatch):
    """The copy is read-only in the trial and no host path of the cache shows inside; the next trial of the same
    harness version runs the same code (the ``.pyc`` it gets is the one compiled for it)."""
    first = run_trial(tmp_path, probe())
    second = run_trial(tmp_path, probe())
    for seen in (first["seen"], second["seen"]):
        assert seen["launcher"] and seen["wrote_pyc"] in ("OSError", "PermissionError") and not seen["cache_visible"]
    assert first == second


def test_a_new_harness_version_never_runs_an_old_pyc(tmp_path, monkeypatch):
    """The same harness directory rewritten between evaluations (as the evaluation writes each version): each
    version runs its own code; a copy is keyed by the harness's content, never by its path."""
    harness_dir = tmp_path / "harness"
    seen = [run_trial(tmp_path, probe(v), harness_dir)["seen"] for v in ("v1", "v2", "v1")]
    assert [s["version"] for s in seen] == ["v1", "v2", "v1"] and all(s["launcher"] for s in seen)


def test_a_harness_that_does_not_compile_runs_as_before(tmp_path, monkeypatch):
    """``agent.py`` with a syntax error: no copy, ``python3 /harness/agent.py`` as before (the same stderr and
    harness error); a broken module beside a good ``agent.py`` fails at its import exactly as before."""
    on, off = both(tmp_path, {"agent.py": "import os\ndef broken(:\n    pass\n"}, monkeypatch)
    assert on == off and "SyntaxError" in on["stderr"] and on["exit_code"] == 1 and on["reward"] == 0.0
    on, off = both(tmp_path, probe(**{"helper.py": "VALUE = (\n"}), monkeypatch)
    assert on == off and on["seen"] is None and "SyntaxError" in on["stderr"]


def test_a_harness_with_its_own_pycache_or_symlinks_runs_as_before(tmp_path, monkeypatch):
    """A harness that brings a ``__pycache__`` (a forged ``.pyc``: it is the harness's own code, run as before, by
    the interpreter's own rules) gets no copy: ``python3 /harness/agent.py``, as before."""
    files = probe(**{"__pycache__/helper.cpython-311.pyc": "not bytecode"})
    on, off = both(tmp_path, files, monkeypatch)
    assert not on["seen"]["launcher"] and on == off


def test_prepare_keys_and_refuses(tmp_path):
    """Content-keyed copies; none for a symlink, a harness too large, or without agent.py."""
    a, b = tmp_path / "a", tmp_path / "b"
    for d, text in ((a, "X = 1\n"), (b, "X = 2\n")):
        d.mkdir()
        (d / "agent.py").write_text(text)
    pa, pb = bytecode.prepare(a), bytecode.prepare(b)
    assert pa is not None and pb is not None and pa != pb and bytecode.prepare(a) == pa
    assert (pa / "agent.py").read_text() == "X = 1\n" and (pa / "__pycache__").is_dir()
    (a / "link").symlink_to("/etc/passwd")
    assert bytecode.prepare(a) is None
    (a / "link").unlink()
    (a / "big.txt").write_bytes(b"x" * (bytecode.MAX_BYTES + 1))
    assert bytecode.prepare(a) is None
    (b / "agent.py").rename(b / "other.py")
    assert bytecode.prepare(b) is None


def test_the_launcher_execs_the_source_when_the_pyc_does_not_match(tmp_path):
    """A ``.pyc`` whose source changed after compiling (or any damaged one) is not run: the launcher execs
    ``python3 SCRIPT``, which compiles the source as before."""
    src = tmp_path / "h"
    src.mkdir()
    (src / "agent.py").write_text("import sys\nprint('old', sys.argv)\n")
    copy = bytecode.prepare(src, mount=str(tmp_path / "h"))
    assert copy is not None
    (src / "__pycache__").mkdir()
    for compiled in (copy / "__pycache__").iterdir():
        (src / "__pycache__" / compiled.name).write_bytes(compiled.read_bytes())
    pyc = next((copy / "__pycache__").glob("agent.*.pyc"))
    env = {"PATH": bytecode.SANDBOX_PATH}
    cmd = bytecode.launch_command(str(src / "agent.py"))
    assert subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True).stdout.startswith("old [")
    (src / "agent.py").write_text("import sys\nprint('new', sys.argv)\n")
    out = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True).stdout
    assert out == f"new [{str(src / 'agent.py')!r}]\n"
    (src / "__pycache__" / pyc.name).write_bytes(b"garbage")
    assert subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True).stdout == out


def test_the_minimal_harness_gets_its_bytecode(tmp_path):
    for name, text in minimal_harness().items():
        (tmp_path / name).write_text(text)
    copy = bytecode.prepare(tmp_path)
    assert copy is not None
    assert sorted(p.name.split(".")[0] for p in (copy / "__pycache__").iterdir()) == ["agent", "launch", "llm"]


def test_the_compile_runs_in_a_sandbox_never_on_the_host(tmp_path, monkeypatch):
    """The researcher's source is compiled by ``isolation.run_isolated`` (bubblewrap, no network, only the copy
    writable) with the sandbox's own interpreter; with no sandboxed compiler installed nothing is compiled and the
    harness runs as before."""
    from rsigym_env.worlds.local.sandbox import harness_bytecode

    assert bytecode._compiler is harness_bytecode.compile_harness and bytecode.SANDBOX_PATH == isolation.DEFAULT_PATH
    calls = []
    real = isolation.run_isolated

    def spy(command, **kwargs):
        calls.append((command, kwargs))
        return real(command, **kwargs)

    monkeypatch.setattr(isolation, "run_isolated", spy)
    src = tmp_path / "h"
    src.mkdir()
    (src / "agent.py").write_text("X = 'compiled in a sandbox'\n")
    copy = bytecode.prepare(src)
    assert copy is not None and len(calls) == 1
    command, kwargs = calls[0]
    assert command[:4] == ["python3", "-I", "-S", "-c"] and kwargs["workdir"] == copy
    assert not kwargs.get("network") and kwargs.get("require_isolation", True) and not kwargs.get("mounts")
    assert all(p.stat().st_uid == os.getuid() for p in [copy, *copy.rglob("*")])  # ours again after the sandbox
    monkeypatch.setattr(bytecode, "_compiler", None)
    (src / "agent.py").write_text("X = 'another version'\n")
    assert bytecode.prepare(src) is None and len(calls) == 1
    assert not run_trial(tmp_path, probe())["seen"]["launcher"]


def test_a_version_s_compile_does_not_stall_the_other_trials(tmp_path, monkeypatch):
    """``HarnessAgent.setup`` waits for the version's compile in a thread: the trials' event loop keeps running
    (a compile of ~0.2 s on the loop would stall every concurrent trial of the evaluation)."""
    from rsigym_env.worlds.common.harbor_agent import HarnessAgent, ModelSession, register_session, unregister_session

    def slow_prepare(src, mount="/harness"):
        time.sleep(0.5)
        return None

    class Mounts:  # an AgentMounts environment that records its mounts
        environment_name = "t-42"
        mounts: list = []

        def add_agent_mount(self, host, target, *, copy=False):
            self.mounts.append((str(host), target))

        def host_path(self, path):
            return tmp_path / path.lstrip("/")

    monkeypatch.setattr(bytecode, "prepare", slow_prepare)
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "agent.py").write_text("print('hi')\n")
    key = f"stall-{time.monotonic_ns()}"
    register_session(key, ModelSession(socket=tmp_path / "m.sock", registry=ModelRegistry(), meter=UsageMeter(),
                                       model=NoModel(), seed=0, tokens_per_trial=1000))
    try:
        agent = HarnessAgent(tmp_path / "logs", harness_dir=str(harness), session=key)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        async def go():
            task = asyncio.create_task(ticker())
            await agent.setup(Mounts())
            task.cancel()

        asyncio.run(go())
    finally:
        unregister_session(key)
    assert ticks >= 10  # the loop ran on while setup waited 0.5 s for the compile
    assert Mounts.mounts[0] == (str(harness), "/harness")  # no bytecode: the harness itself, as before
