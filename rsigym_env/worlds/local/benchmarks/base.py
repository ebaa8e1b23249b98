"""Shared machinery of the five local benchmarks: ``Problem``, ``LocalBenchmark``, the action
language, Harbor task directories, the verifier script and the demonstration checker.

The action language (``docs/local-world.md``): the model answers with one line, ``$ <command>``,
``ANSWER: <text>`` (reasoning may precede it on the same line) or ``DONE``; the harness replies to
a command with ``OUT: <first 200 bytes of stdout+stderr>`` (``OUT: (exit N)`` when there is none).

>>> parse_action("37+45=82 ANSWER: 82")
('answer', '82')
>>> parse_action("$ mkdir -p logs")
('cmd', 'mkdir -p logs')
>>> parse_action("DONE"), parse_action("hello")
(('done', ''), ('invalid', 'hello'))
>>> observation("", 0), observation("hi\\n", 1)
('OUT: (exit 0)', 'OUT: hi (exit 1)')

Seed streams: every problem of benchmark B is generated from ``random.Random(f"{B}:{stream}:{i}")``
with ``stream`` one of ``dev``, ``official``, ``synthetic``, ``pretrain``; the synthetic and
pretraining streams skip every problem whose ``key`` is in the dev or official split, so the four
sets of prompts are disjoint (``tests/test_local_benchmarks.py`` checks it).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

GENERATOR_VERSION = "3"
"""1: first release; 2: local-math on numbers below 100 (6-7 operations when hard); 3: local-math
mostly 2-3 operations (4-5 when hard), local-code with new function names and bug families."""
SYSTEM_PROMPT = "Reply with one line: $ <command>, ANSWER: <answer>, or DONE."
"""The minimal harness's ``prompt.md`` (the system message every turn-0 prompt starts with)."""

SPLIT_SIZES = {"dev": 20, "official": 30}
INDEX_FILE = "index.json"
"""The ordered list of a split directory's task directory names."""
STREAMS = ("dev", "official", "synthetic", "pretrain")


# --- the action language -----------------------------------------------------------------------


# One definition of the action language: the minimal harness's own (its agent.py stays stdlib-only
# because it runs inside the sandbox; here it is imported as a module).
from ..harness.agent import observation, parse_action  # noqa: E402
from ....splits import OfficialSplit, official_split  # noqa: E402

PUBLIC_SPLIT = official_split("public")


def run_command(command: str, cwd: Path, timeout: float = 10.0) -> tuple[str, int]:
    """Run ``command`` in a fresh bash at ``cwd`` (the minimal harness's semantics) → (output, exit)."""
    try:
        proc = subprocess.run(["bash", "-c", command], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=timeout, env=_clean_env(cwd))
        return proc.stdout.decode("utf-8", "replace"), proc.returncode
    except subprocess.TimeoutExpired:
        return "timeout", 124


def _clean_env(cwd: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(cwd), "LC_ALL": "C.UTF-8"}


# --- problems ---------------------------------------------------------------------------------


@dataclass
class Problem:
    """One task instance.

    ``messages`` is what the minimal harness shows the model at turn 0 (system prompt + the
    instruction); ``files`` become ``/app``; ``expected`` is the hidden verifier data (only in
    ``tests/``); ``solution`` the reference actions (one line each); ``meta`` what solvers need.
    """

    id: str
    domain: str
    instruction: str
    files: dict[str, str] = field(default_factory=dict)
    expected: dict[str, Any] = field(default_factory=dict)
    solution: list[str] = field(default_factory=list)
    difficulty: str = "medium"
    key: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.instruction}]

    @property
    def multi_turn(self) -> bool:
        return self.expected.get("kind") != "answer"


def executable(path: str) -> bool:
    return path.endswith(".sh") or path.endswith("run.py")


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, content in sorted(files.items()):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        os.chmod(p, 0o755 if executable(rel) else 0o644)


# --- the verifier (stdlib python run by tests/test.sh) -----------------------------------------

PROBE_SOCKET = "/run/rsigym/probe.sock"
"""Where the verifier reaches the environment's probe runner (mounted for verifier commands only)."""

PROBE_PY = """import json, sys
sys.dont_write_bytecode = True
req = json.loads(sys.stdin.read())
sys.path.insert(0, req["app"])
try:
    m = __import__(req["module"])
except BaseException as e:
    out = {"import_error": type(e).__name__}
else:
    res = []
    for name, args in req["calls"]:
        try:
            v = getattr(m, name)(*args)
            res.append(["value", v if type(v) in (int, bool, str) else repr(v)[:200]])
        except BaseException as e:
            res.append(["error", type(e).__name__])
    out = {"results": res}
sys.stdout.write("\\n" + json.dumps(out) + "\\n")
sys.stdout.flush()
"""
"""Runs the code under test in the probe's own sandbox: imports the module from the app directory,
makes the calls, prints one JSON line. Whatever the code under test does there (exit early, print,
patch this program) it can only change what comes back, and only knowing the expected values would
make that pass."""

_VERIFIER_TEMPLATE = '''"""Hidden check (stdlib only): reads expected.json beside this file, inspects /app, exits 0 iff solved.

It never runs, imports or follows anything left in /app: files are read with O_NOFOLLOW and
O_NONBLOCK one directory at a time and must be regular files. Code under test ("calls" tasks) runs
only in a sandbox of its own (no /tests, no /logs/verifier, no network), started by the
environment's probe runner behind the socket mounted for the verifier; only its printed results
come back and are compared with strict types. No probe runner: the task fails closed.
``--local`` (host-side checks of trusted demonstrations only) runs the probe as a subprocess.
"""
import json, os, socket, stat, subprocess, sys
HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.environ.get("RSIGYM_APP_DIR", "/app")
SOCKET = @SOCKET@
MAX_BYTES = 1 << 20
PROBE = @PROBE@
exp = json.load(open(os.path.join(HERE, "expected.json")))


def _walk(rel, leaf_flags):
    """An fd of APP/rel opened without following any symlink on the way (or None)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    try:
        fd = os.open(APP, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], leaf_flags | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def read(rel):
    fd = _walk(rel, os.O_RDONLY | os.O_NONBLOCK)
    if fd is None:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_BYTES + 1)
        return None if len(data) > MAX_BYTES else data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def is_dir(rel):
    fd = _walk(rel, os.O_RDONLY | os.O_DIRECTORY)
    if fd is None:
        return False
    os.close(fd)
    return True


def probe(module, calls):
    """Run the calls in the code under test's own sandbox; the parsed results, or None."""
    request = {"module": module, "calls": calls, "app": "/app"}
    if "--local" in sys.argv[1:]:
        request["app"] = APP
        try:
            out = subprocess.run([sys.executable, "-I", "-c", PROBE], input=json.dumps(request).encode(), cwd=APP,
                                 capture_output=True, timeout=10).stdout.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            return None
    else:
        if not os.path.exists(SOCKET):
            print("no probe runner: code under test cannot run apart from the verifier here", file=sys.stderr)
            return None
        message = json.dumps({"argv": ["python3", "-I", "-c", PROBE], "stdin": json.dumps(request),
                              "timeout_s": 10}).encode() + b"\\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(30)
                conn.connect(SOCKET)
                conn.sendall(message)
                conn.shutdown(socket.SHUT_WR)
                data = b""
                while len(data) <= 4 * MAX_BYTES:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            out = json.loads(data.decode("utf-8"))["stdout"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
    lines = [line for line in str(out).splitlines() if line.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def same(got, want):
    return type(got) is type(want) and got == want


kind = exp["kind"]
if kind == "answer":
    ok = (read("answer.txt") or "").strip().upper() == str(exp["answer"]).upper()
elif kind == "files":
    ok = all((read(p) or "\\0").strip() == c.strip() for p, c in exp["files"].items())
    ok = ok and all(is_dir(d) for d in exp.get("dirs", []))
elif kind == "calls":
    out = probe(exp["module"], exp["calls"])
    results = out.get("results") if isinstance(out, dict) else None
    ok = (isinstance(results, list) and len(results) == len(exp["want"])
          and all(isinstance(r, list) and len(r) == 2 and r[0] == "value" and same(r[1], w)
                  for r, w in zip(results, exp["want"])))
else:
    ok = False
sys.exit(0 if ok else 1)
'''
VERIFIER_PY = _VERIFIER_TEMPLATE.replace("@SOCKET@", repr(PROBE_SOCKET)).replace("@PROBE@", repr(PROBE_PY))

TEST_SH = """#!/bin/bash
# Writes 1 (solved) or 0 to /logs/verifier/reward.txt; the check and its hidden data are beside this file.
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${RSIGYM_VERIFIER_DIR:-/logs/verifier}"
mkdir -p "$OUT"
if python3 -I "$DIR/check.py"; then echo 1 > "$OUT/reward.txt"; else echo 0 > "$OUT/reward.txt"; fi
"""

DOCKERFILE = """FROM python:3.12-slim
WORKDIR /app
COPY . /app
"""


def verify_dir(app: Path, expected: dict[str, Any]) -> bool:
    """Run the verifier script against an app directory on the host (``--local``: trusted demonstrations only)."""
    with tempfile.TemporaryDirectory(prefix="rsigym-verify-") as tmp:
        (Path(tmp) / "check.py").write_text(VERIFIER_PY)
        (Path(tmp) / "expected.json").write_text(json.dumps(expected))
        env = _clean_env(app) | {"RSIGYM_APP_DIR": str(app)}
        try:
            proc = subprocess.run(["python3", "-I", str(Path(tmp) / "check.py"), "--local"], cwd=app, env=env,
                                  capture_output=True, timeout=20)
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0


def replay(problem: Problem, actions: list[str], app: Path) -> None:
    """Apply action lines in ``app`` as the minimal harness would (fresh shell per command)."""
    for line in actions:
        kind, arg = parse_action(line)
        if kind == "cmd":
            run_command(arg, app)
        elif kind == "answer":
            (app / "answer.txt").write_text(arg + "\n")
            return
        elif kind == "done":
            return


# --- the benchmark --------------------------------------------------------------------------------


class LocalBenchmark:
    """A local benchmark: a deterministic problem generator plus Harbor task directories.

    Subclasses set the class attributes and implement ``generate(rng, stream)``.
    """

    name: str = ""
    paper_id: str = ""
    domain: str = ""
    description: str = ""
    max_turns: int = 8
    agent_timeout_sec: float = 60.0

    # --- to implement -------------------------------------------------------------------------
    def generate(self, rng: random.Random, stream: str) -> Problem:  # pragma: no cover - abstract
        raise NotImplementedError

    def excluded_keys(self) -> frozenset[str]:
        """Keys the dev and official splits skip (problems the recorded pretraining stages may have shown
        when an older generator drew them); none by default."""
        return frozenset()

    # --- streams --------------------------------------------------------------------------------
    def _raw(self, stream: str, i: int) -> Problem:
        p = self.generate(random.Random(f"{self.name}:{stream}:{i}"), stream)
        p.id = f"{self.name}-{stream}-{i:04d}"
        p.domain = self.domain
        p.key = p.key or p.instruction
        return p

    def _heldout_keys(self) -> frozenset[str]:
        """Keys the synthetic and pretraining streams skip: dev and the *public* official split (never the
        secret one: a stream that skipped secret tasks would reveal them by its gaps)."""
        if not hasattr(self, "_held"):
            self._held = frozenset(p.key for s in ("dev", "official") for p in self.split(s))
        return self._held

    def task_id(self, problem: Problem) -> str:
        """A task's id: the benchmark and a hash of the problem, the same form for every split.

        >>> from rsigym_env.worlds.local.benchmarks import BENCHMARKS
        >>> BENCHMARKS["local-math"].split("dev")[0].id.startswith("local-math-")
        True
        """
        return f"{self.name}-{hashlib.sha256(f'{self.name}\0{problem.key}'.encode()).hexdigest()[:12]}"

    def split(self, split: str, official: OfficialSplit | None = None) -> list[Problem]:
        """The ``dev`` (20) or ``official`` (30) problems; the two never share a key.

        Dev is public and deterministic; the official split is drawn from ``official`` (default: the
        public split, :func:`rsigym_env.splits.official_split`), skipping dev's keys and every key the
        benchmark excludes.
        """
        if split not in SPLIT_SIZES:
            raise ValueError(f"unknown split {split!r} (dev, official)")
        stream = "dev" if split == "dev" else (official or PUBLIC_SPLIT).stream(self.name)
        cache = self.__dict__.setdefault("_splits", {})
        if stream not in cache:
            taken = set() if split == "dev" else {p.key for p in self.split("dev")}
            excluded = self.excluded_keys()
            out, i = [], 0
            while len(out) < SPLIT_SIZES[split]:
                p = self._raw(stream, i)
                i += 1
                if p.key not in taken and p.key not in excluded:
                    taken.add(p.key)
                    p.id = self.task_id(p)
                    out.append(p)
            cache[stream] = out
        return cache[stream]

    def stream(self, stream: str, seed: int = 0) -> Iterator[Problem]:
        """Endless problems of the ``synthetic`` or ``pretrain`` stream (``seed`` picks a sub-stream),
        never one whose key is in dev or official."""
        if stream not in ("synthetic", "pretrain"):
            raise ValueError("stream must be 'synthetic' or 'pretrain'")
        held = self._heldout_keys()
        i = 0
        while True:
            p = self._raw(f"{stream}{seed}" if seed else stream, i)
            i += 1
            if p.key not in held:
                p.id = f"{self.name}-{stream}-{seed}-{i - 1:05d}"
                yield p

    def synthetic(self, n: int, seed: int) -> list[Problem]:
        """``n`` teacher prompts from the synthetic stream (disjoint from dev/official)."""
        it = self.stream("synthetic", seed)
        return [next(it) for _ in range(n)]

    # --- checking demonstrations --------------------------------------------------------------
    def check(self, problem: Problem, messages: list[dict]) -> bool:
        """Does this chat (a demonstration) solve ``problem``? Replays its assistant actions on a copy
        of the task files (fresh shell per command, as the minimal harness) and runs the verifier."""
        actions = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
        with tempfile.TemporaryDirectory(prefix="rsigym-check-") as tmp:
            app = Path(tmp)
            write_files(app, problem.files)
            replay(problem, actions, app)
            return verify_dir(app, problem.expected)

    # --- Harbor task directories ----------------------------------------------------------------
    def task_files(self, p: Problem) -> dict[str, str]:
        """Relative path → content of the task directory of ``p``."""
        toml = "\n".join([
            'schema_version = "1.4"',
            "",
            "[metadata]",
            f'domain = "{self.domain}"',
            f'benchmark = "{self.name}"',
            f'mirrors = "{self.paper_id}"',
            f'difficulty = "{p.difficulty}"',
            f'generator_version = "{GENERATOR_VERSION}"',
            "",
            "[agent]",
            f"timeout_sec = {self.agent_timeout_sec}",
            "",
            "[verifier]",
            "timeout_sec = 30.0",
            "",
            "[environment]",
            "cpus = 1",
            "memory_mb = 512",
            "storage_mb = 64",
            'network_mode = "no-network"',
            'workdir = "/app"',
            "",
        ])
        out = {"task.toml": toml, "instruction.md": p.instruction + "\n", "environment/Dockerfile": DOCKERFILE,
               "tests/test.sh": TEST_SH, "tests/check.py": VERIFIER_PY,
               "tests/expected.json": json.dumps(p.expected, indent=1, sort_keys=True) + "\n",
               "solution/solve.sh": self.solve_sh(p)}
        for rel, content in p.files.items():
            out[f"environment/{rel}"] = content
        return out

    @staticmethod
    def solve_sh(p: Problem) -> str:
        lines = ["#!/bin/bash", "# Reference solution (runs in /app).", 'cd "${RSIGYM_APP_DIR:-/app}"']
        for action in p.solution:
            kind, arg = parse_action(action)
            if kind == "cmd":
                lines.append(arg)
            elif kind == "answer":
                lines.append(f"echo {json.dumps(arg)} > answer.txt")
        return "\n".join(lines) + "\n"

    def build(self, root: Path, official: OfficialSplit | None = None) -> dict[str, Path]:
        """Write the dev and official (``official``'s draw, default public) task directories under ``root``
        → ``{"dev": dir, "official": dir}``.

        Idempotent: a content-hashed subdirectory, skipped when present, readable by its owner only
        (it holds the hidden answers). Each split directory lists its tasks in order in ``index.json``
        (task directory names are hashes, the same form in every split).
        """
        root = Path(root)
        problems = {"dev": self.split("dev"), "official": self.split("official", official)}
        trees = {s: {p.id: self.task_files(p) for p in ps} for s, ps in problems.items()}
        digest = hashlib.sha256(json.dumps(trees, sort_keys=True).encode()).hexdigest()[:12]
        base = root / f"{self.name}-v{GENERATOR_VERSION}-{digest}"
        out = {s: base / s for s in SPLIT_SIZES}
        if (base / ".complete").exists():
            return out
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.name}-", dir=root))
        try:
            for split, tasks in trees.items():
                for tid, files in tasks.items():
                    write_files(tmp / split / tid, files)
                (tmp / split / INDEX_FILE).write_text(json.dumps([p.id for p in problems[split]], indent=0) + "\n")
            (tmp / ".complete").write_text(digest + "\n")
            tmp.chmod(0o700)
            try:
                tmp.rename(base)
            except OSError:  # built concurrently by someone else
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, mirrors {self.paper_id!r})"


def demo_messages(problem: Problem, turns: list[tuple[str, str | None]], system: bool = True) -> list[dict[str, str]]:
    """A chat: the turn-0 prompt, then (assistant line, observation or None) pairs."""
    msgs = list(problem.messages if system else problem.messages[1:])
    for action, obs in turns:
        msgs.append({"role": "assistant", "content": action})
        if obs is not None:
            msgs.append({"role": "user", "content": obs})
    return msgs


def execute(problem: Problem, actions: list[str], app: Path | None = None,
            transform: Callable[[str], str] | None = None) -> list[tuple[str, str | None]]:
    """Run action lines for real (fresh shell at the app dir) and pair each with its observation."""
    own = app is None
    tmp = tempfile.mkdtemp(prefix="rsigym-demo-") if own else None
    app = Path(tmp) if own else app
    try:
        if own:
            write_files(app, problem.files)
        turns: list[tuple[str, str | None]] = []
        for a in actions:
            kind, arg = parse_action(a)
            if kind == "cmd":
                out, code = run_command(arg, app)
                turns.append((a, observation(out, code)))
            else:
                turns.append((a, None))
                break
        return turns
    finally:
        if own:
            shutil.rmtree(tmp, ignore_errors=True)
