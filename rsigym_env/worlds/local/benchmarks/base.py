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
STREAMS = ("dev", "official", "synthetic", "pretrain")


# --- the action language -----------------------------------------------------------------------


# One definition of the action language: the minimal harness's own (its agent.py stays stdlib-only
# because it runs inside the sandbox; here it is imported as a module).
from ..harness.agent import observation, parse_action  # noqa: E402


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

VERIFIER_PY = r'''"""Hidden check: reads expected.json beside this file, inspects the app dir, exits 0 if solved."""
import json, os, subprocess, sys
HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.environ.get("RSIGYM_APP_DIR", "/app")
exp = json.load(open(os.path.join(HERE, "expected.json")))
def read(rel):
    try:
        with open(os.path.join(APP, rel)) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None
kind = exp["kind"]
if kind == "answer":
    got = (read("answer.txt") or "").strip()
    ok = got.upper() == str(exp["answer"]).upper()
elif kind == "files":
    ok = all((read(p) or "\0").strip() == c.strip() for p, c in exp["files"].items())
    ok = ok and all(os.path.isdir(os.path.join(APP, d)) for d in exp.get("dirs", []))
elif kind == "pytests":
    code = "import sys; sys.path.insert(0, %r)\nimport %s as m\n" % (APP, exp["module"])
    code += "\n".join("assert %s, %r" % (t, t) for t in exp["tests"])
    try:
        ok = subprocess.run([sys.executable, "-c", code], cwd=APP, capture_output=True, timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
else:
    ok = False
sys.exit(0 if ok else 1)
'''

TEST_SH = """#!/bin/bash
# Writes 1 (solved) or 0 to /logs/verifier/reward.txt; the check and its hidden data are beside this file.
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${RSIGYM_VERIFIER_DIR:-/logs/verifier}"
mkdir -p "$OUT"
if python3 "$DIR/check.py"; then echo 1 > "$OUT/reward.txt"; else echo 0 > "$OUT/reward.txt"; fi
"""

DOCKERFILE = """FROM python:3.12-slim
WORKDIR /app
COPY . /app
"""


def verify_dir(app: Path, expected: dict[str, Any]) -> bool:
    """Run the verifier script against an app directory (what ``tests/test.sh`` does)."""
    with tempfile.TemporaryDirectory(prefix="rsigym-verify-") as tmp:
        (Path(tmp) / "check.py").write_text(VERIFIER_PY)
        (Path(tmp) / "expected.json").write_text(json.dumps(expected))
        env = _clean_env(app) | {"RSIGYM_APP_DIR": str(app)}
        try:
            proc = subprocess.run(["python3", str(Path(tmp) / "check.py")], cwd=app, env=env, capture_output=True,
                                  timeout=20)
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
        if not hasattr(self, "_held"):
            self._held = frozenset(p.key for s in ("dev", "official") for p in self.split(s))
        return self._held

    def split(self, split: str) -> list[Problem]:
        """The ``dev`` (20) or ``official`` (30) problems; the two never share a key."""
        if split not in SPLIT_SIZES:
            raise ValueError(f"unknown split {split!r} (dev, official)")
        cache = self.__dict__.setdefault("_splits", {})
        if split not in cache:
            taken = set() if split == "dev" else {p.key for p in self.split("dev")}
            excluded = self.excluded_keys()
            out, i = [], 0
            while len(out) < SPLIT_SIZES[split]:
                p = self._raw(split, i)
                i += 1
                if p.key not in taken and p.key not in excluded:
                    taken.add(p.key)
                    out.append(p)
            cache[split] = out
        return cache[split]

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

    def build(self, root: Path) -> dict[str, Path]:
        """Write the dev and official task directories under ``root`` (idempotent: a content-hashed
        subdirectory, skipped when present) → ``{"dev": dir, "official": dir}``."""
        root = Path(root)
        trees = {s: {p.id: self.task_files(p) for p in self.split(s)} for s in SPLIT_SIZES}
        digest = hashlib.sha256(json.dumps(trees, sort_keys=True).encode()).hexdigest()[:12]
        base = root / f"{self.name}-v{GENERATOR_VERSION}-{digest}"
        out = {s: base / s for s in SPLIT_SIZES}
        if (base / ".complete").exists():
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.name}-", dir=root if root.exists() else None))
        if not root.exists():
            root.mkdir(parents=True, exist_ok=True)
        try:
            for split, tasks in trees.items():
                for tid, files in tasks.items():
                    write_files(tmp / split / tid, files)
            (tmp / ".complete").write_text(digest + "\n")
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
