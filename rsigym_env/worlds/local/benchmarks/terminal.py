"""``local-terminal`` (mirrors Terminal-Bench 2.0): make files and directories as instructed.

Decided by the final file-system state. A reply may ``cd`` into a directory and act there, which
works only when the harness keeps the shell's state (``persistent = true``); the minimal harness
runs every command in a fresh shell at ``/app``, so a lost ``cd`` puts files in the wrong place.
Generator 5: ``LIBRARY_SHARE`` of the tasks ship a library of three skills (``skills/``) the task
does not need; a harness that loads skill documents (``load_skills``) fills the model's small
context with them.

>>> b = TerminalBenchmark()
>>> p = b.split("dev")[0]
>>> b.check(p, p.messages + [{"role": "assistant", "content": a} for a in p.solution])
True
"""

from __future__ import annotations

import random
import re

from .base import LocalBenchmark, Problem
from .skills import library

LIBRARY_SHARE, LIBRARY_SIZE = 0.5, 3

DIRS = ["logs", "data", "out", "build", "notes", "cache", "docs", "src"]
SUBDIRS = ["2024", "old", "v1", "x", "new", "tmp"]
FILES = ["notes.txt", "a.txt", "list.txt", "todo.txt", "log.txt", "b.txt", "info.txt"]
WORDS = ["hello", "alpha", "ready", "blue", "seven", "done", "ok", "green", "omega", "north", "quiet", "maple"]

_A = re.compile(r"Create the directory (\S+) and in it the file (\S+) containing the word (\w+)\.")
_B = re.compile(r"In the directory (\S+), create the file (\S+) containing the word (\w+)\.")
_C = re.compile(r"Copy (\S+) into the new directory (\S+)\.")
_D = re.compile(r"In the directory (\S+), rename (\S+) to (\S+)\.")


def plan(instruction: str, cd_style: bool = False) -> list[str]:
    """The actions that solve an instruction (path style, or ``cd`` style which needs a persistent shell)."""
    if m := _A.search(instruction):
        d, f, w = m.groups()
        return [f"$ mkdir -p {d}"] + ([f"$ cd {d}", f"$ echo {w} > {f}"] if cd_style else [f"$ echo {w} > {d}/{f}"]) + ["DONE"]
    if m := _B.search(instruction):
        d, f, w = m.groups()
        return ([f"$ cd {d}", f"$ echo {w} > {f}"] if cd_style else [f"$ echo {w} > {d}/{f}"]) + ["DONE"]
    if m := _C.search(instruction):
        s, d = m.groups()
        return [f"$ mkdir -p {d}"] + ([f"$ cd {d}", f"$ cp ../{s} ."] if cd_style else [f"$ cp {s} {d}/"]) + ["DONE"]
    if m := _D.search(instruction):
        d, a, b = m.groups()
        return ([f"$ cd {d}", f"$ mv {a} {b}"] if cd_style else [f"$ mv {d}/{a} {d}/{b}"]) + ["DONE"]
    return ["DONE"]


class TerminalBenchmark(LocalBenchmark):
    name = "local-terminal"
    paper_id = "terminal-bench-2"
    domain = "terminal"
    description = ("Shell tasks in /app: create directories and files, copy and rename, one command per turn. "
                   "Scored by the final file-system state; there is no visible check.")
    max_turns = 6

    def generate(self, rng: random.Random, stream: str) -> Problem:
        kind = rng.choice("ABCD")
        files: dict[str, str] = {}
        w = rng.choice(WORDS)
        if kind == "A":
            d, f = f"{rng.choice(DIRS)}/{rng.choice(SUBDIRS)}", rng.choice(FILES)
            instruction = f"Create the directory {d} and in it the file {f} containing the word {w}."
            expected = {f"{d}/{f}": w}
        elif kind == "B":
            d, f = rng.choice(DIRS), rng.choice(FILES)
            files[f"{d}/README"] = "keep\n"
            instruction = f"In the directory {d}, create the file {f} containing the word {w}."
            expected = {f"{d}/{f}": w}
        elif kind == "C":
            s, d = rng.choice(FILES), rng.choice(DIRS)
            files[s] = w + "\n"
            instruction = f"Copy {s} into the new directory {d}."
            expected = {f"{d}/{s}": w, s: w}
        else:
            d = rng.choice(DIRS)
            a, b = rng.sample(FILES, 2)
            files[f"{d}/{a}"] = w + "\n"
            instruction = f"In the directory {d}, rename {a} to {b}."
            expected = {f"{d}/{b}": w}
        instruction += " Use one shell command per turn, then DONE."
        p = Problem(id="", domain=self.domain, instruction=instruction, files=files,
                    expected={"kind": "files", "files": expected}, difficulty={"A": "hard", "C": "medium"}.get(kind, "easy"),
                    meta={"kind": kind})
        p.solution = plan(instruction)
        if rng.random() < LIBRARY_SHARE:  # drawn last: the task itself is generator 4's
            p.files.update(library(rng, LIBRARY_SIZE))
            p.meta["library"] = LIBRARY_SIZE
        return p


def _turn(messages: list[dict]) -> int:
    return sum(1 for m in messages if m["role"] == "assistant")


def solve_next(messages: list[dict], rng: random.Random | None = None, wrong: bool = False) -> str:
    """Next path-style action for the conversation so far; ``wrong`` garbles the file it writes."""
    text = next(m["content"] for m in messages if m["role"] == "user")
    steps = plan(text)
    i = min(_turn(messages), len(steps) - 1)
    action = steps[i]
    if wrong and action.startswith("$ ") and action != steps[0] or (wrong and len(steps) <= 2):
        rng = rng or random.Random(0)
        action = re.sub(r"\b(" + "|".join(WORDS + FILES) + r")\b",
                        lambda m: rng.choice([x for x in (WORDS if m.group(1) in WORDS else FILES) if x != m.group(1)]),
                        action, count=1)
    return action


def pretrain_chat(problem: Problem, rng: random.Random) -> list[tuple[str, str | None]]:
    """Pretraining transcript: cd style (55%, needs a persistent shell) or path style; 8% garbled."""
    actions = plan(problem.instruction, cd_style=rng.random() < 0.55)
    if rng.random() < 0.08:
        actions = [solve_next(problem.messages + [{"role": "assistant", "content": a} for a in actions[:i]], rng, True)
                   if i == len(actions) - 2 else a for i, a in enumerate(actions)]
    return [(a, "OUT: (exit 0)" if a.startswith("$") else None) for a in actions]
