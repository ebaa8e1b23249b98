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
sets of prompts are disjoint (``tests/worlds/local/test_local_benchmarks.py`` checks it).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

GENERATOR_VERSION = "6"
"""1: first release; 2: local-math on numbers below 100 (6-7 operations when hard); 3: local-math
mostly 2-3 operations (4-5 when hard), local-code with new function names and bug families; 4: local-science
states the facts in the question (substances invented per problem, lab notes, a one-step rule when hard); 5: half
of local-terminal's and local-code's tasks ship a library of skills they do not need (the tasks themselves are
generator 4's); 6: a share of local-skills' and local-code's tasks ship a project shell profile, half of
local-skills' tools set themselves up on their first call (the tasks themselves are generator 4's)."""
SYSTEM_PROMPT = "Reply with one line: $ <command>, ANSWER: <answer>, or DONE."
"""The minimal harness's ``prompt.md`` (the system message every turn-0 prompt starts with)."""

PROFILE_FILES = {
    ".bashrc": "# This project's shell setup, read by interactive shells: work happens in build/.\n"
               "export BUILD_DIR=/app/build\ncd build\n",
    "build/README": "Build outputs go here.\n",
}
"""Generator 6: a project shell profile (``/app/.bashrc``), shipped by a share of the tasks whose steps
assume a fresh shell at ``/app``. ``bash -c`` never reads it; a persistent session (the harness's
``persistent = true``) opens as an interactive shell and does, so it starts in ``build/``."""

SPLIT_SIZES = {"dev": 20, "official": 30}
INDEX_FILE = "index.json"
"""The ordered list of a split directory's task directory names."""
STREAMS = ("dev", "official", "synthetic", "pretrain")


# --- the action language -----------------------------------------------------------------------


# One definition of the action language: the minimal harness's own (its agent.py stays stdlib-only
# because it runs inside the sandbox; here it is imported as a module).
from ...common.harness.agent import observation, parse_action  # noqa: E402
from ....canonical import sha256_hex  # noqa: E402
from ....splits import OfficialSplit, official_split  # noqa: E402
from ..sandbox.isolation import DEFAULT_PATH  # noqa: E402

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
    """The sandbox's PATH, not the caller's: the same programs as in a trial (and no version-manager
    shims on the way — a pyenv ``python3`` shim costs ~0.3 s a start)."""
    return {"PATH": DEFAULT_PATH, "HOME": str(cwd), "LC_ALL": "C.UTF-8"}


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

from . import verifier  # noqa: E402

PROBE_SOCKET = verifier.SOCKET
"""Where the verifier reaches the environment's probe runner (mounted for verifier commands only)."""
VERIFIER_PY = Path(verifier.__file__).read_text()
"""Each task's ``tests/check.py``: the source of :mod:`.verifier`, which the host imports too."""

TEST_SH = """#!/bin/bash
# Writes 1 (solved) or 0 to /logs/verifier/reward.txt; the check and its hidden data are beside this file.
# Builtins where they do (every trial runs this: each process it starts costs a few ms); the check is
# stdlib only, so its interpreter skips site-packages (-S) as well as the environment (-I).
case "${BASH_SOURCE[0]}" in */*) DIR="${BASH_SOURCE[0]%/*}" ;; *) DIR=. ;; esac
OUT="${RSIGYM_VERIFIER_DIR:-/logs/verifier}"
[ -d "$OUT" ] || mkdir -p "$OUT"
if python3 -I -S "$DIR/check.py"; then echo 1 > "$OUT/reward.txt"; else echo 0 > "$OUT/reward.txt"; fi
"""

DOCKERFILE = """FROM python:3.12-slim
WORKDIR /app
COPY . /app
"""


def verify_dir(app: Path, expected: dict[str, Any]) -> bool:
    """Does the app directory ``app`` solve the task? The verifier's own rules, in this process (code under
    test, for "calls" tasks, in a forked child of a warm worker process): for trusted demonstrations
    only, never for harness output.

    >>> verify_dir(Path("/nonexistent"), {"kind": "answer", "answer": "4"})
    False
    """
    if expected.get("kind") != "calls":
        return verifier.judge(expected, str(app), local=True)
    out = _WARM_PROBE.run({"module": expected["module"], "calls": expected["calls"], "app": str(app)})
    results = out.get("results") if isinstance(out, dict) else None
    return (isinstance(results, list) and len(results) == len(expected["want"])
            and all(isinstance(r, list) and len(r) == 2 and r[0] == "value" and verifier.same(r[1], w)
                    for r, w in zip(results, expected["want"])))


_FORK_SERVER = r"""
import json, os, select, signal, sys
PROBE = sys.argv[1]
for line in sys.stdin:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        request = json.loads(line)
        os.chdir(request["app"])
        sys.stdin = open(os.devnull)
        os.dup2(w, 1)
        import io
        sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
        sys.stdin = io.StringIO(line)
        try:
            exec(compile(PROBE, "<probe>", "exec"), {"__name__": "__main__"})
        finally:
            os._exit(0)
    os.close(w)
    chunks, ready = [], select.select([r], [], [], 10)[0]
    while ready:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        ready = select.select([r], [], [], 10)[0]
    os.close(r)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    lines = [l for l in b"".join(chunks).decode("utf-8", "replace").splitlines() if l.strip()]
    sys.stdout.write((lines[-1] if lines else "null") + chr(10))
    sys.stdout.flush()
"""


class _WarmProbe:
    """A Python worker started once per process that forks a child per check (~1 ms instead of a
    ~50 ms interpreter start); each child imports the code under test fresh and is killed after 10 s."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def run(self, request: dict[str, Any]) -> Any:
        with self._lock:
            for _ in range(2):  # a worker that died is replaced once
                if self._proc is None or self._proc.poll() is not None:
                    self._proc = subprocess.Popen([sys.executable, "-I", "-c", _FORK_SERVER, verifier.PROBE],
                                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                try:
                    self._proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
                    self._proc.stdin.flush()  # type: ignore[union-attr]
                    line = self._proc.stdout.readline()  # type: ignore[union-attr]
                except (BrokenPipeError, OSError):
                    line = ""
                if line:
                    try:
                        return json.loads(line)
                    except ValueError:
                        return None
                self._proc = None
        raise RuntimeError("the probe worker for host-side checks did not answer (twice)")


_WARM_PROBE = _WarmProbe()


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
        official = official or PUBLIC_SPLIT
        stream = "dev" if split == "dev" else official.stream(self.name)
        cache = self.__dict__.setdefault("_splits", {})  # dev and fixed draws only: an episode's own is drawn once
        if stream in cache:
            return cache[stream]
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
        if split == "dev" or official.fixed:
            cache[stream] = out
        return out

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

    def build(self, root: Path, official: OfficialSplit | None = None,
              splits: tuple[str, ...] = ("dev", "official")) -> dict[str, Path]:
        """Write the task directories of ``splits`` (dev; official: ``official``'s draw, default public) under
        ``root`` → ``{"dev": dir, "official": dir}``.

        Idempotent: a content-hashed subdirectory, skipped when present, readable by its owner only
        (it holds the hidden answers). Each split directory lists its tasks in order in ``index.json``
        (task directory names are hashes, the same form in every split). An episode's own official draw
        goes to a directory of the episode's (``splits=("official",)``), never to a shared cache.
        """
        root = Path(root)
        problems = {s: self.split(s, official) for s in splits}
        trees = {s: {p.id: self.task_files(p) for p in ps} for s, ps in problems.items()}
        digest = sha256_hex(trees, compact=False)[:12]
        base = root / f"{self.name}-v{GENERATOR_VERSION}-{digest}"
        out = {s: base / s for s in splits}
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
