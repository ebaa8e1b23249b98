"""``local-skills`` (mirrors SkillsBench): tasks solvable only with a tool described in a skill document.

``/app/skills/<name>/SKILL.md`` documents ``/app/skills/<name>/run.py``; every task gives its tool
one of four argument conventions at random, so only the document's ``Usage:`` line says how to
call it. The minimal harness never shows skill documents (``load_skills = false``); the model
can still read one with ``cat``. Scored by the output file.

>>> b = SkillsBenchmark()
>>> p = b.split("dev")[0]
>>> b.check(p, p.messages + [{"role": "assistant", "content": a} for a in p.solution])
True
"""

from __future__ import annotations

import random
import re

from .base import PROFILE_FILES, LocalBenchmark, Problem

TOOLS: dict[str, tuple[str, str]] = {
    "rot": ("Shifts every letter K places in the alphabet.",
            "''.join(chr((ord(c) - 97 + k) % 26 + 97) if c.islower() else c for c in line)"),
    "rep": ("Repeats every line K times.", "'\\n'.join([line] * k)"),
    "cut": ("Keeps the first K characters of every line.", "line[:k]"),
    "pad": ("Pads every line on the left with K dots.", "'.' * k + line"),
    "tail": ("Keeps the last K characters of every line.", "line[-k:]"),
}
SYNTAX = [
    "python3 skills/{s}/run.py -k {k} {i} {o}",
    "python3 skills/{s}/run.py --key {k} {i} {o}",
    "python3 skills/{s}/run.py {i} {o} {k}",
    "python3 skills/{s}/run.py {i} -o {o} -n {k}",
]
PARSERS = [
    "a[0] == '-k' and len(a) == 4 and (a[1], a[2], a[3])",
    "a[0] == '--key' and len(a) == 4 and (a[1], a[2], a[3])",
    "len(a) == 3 and a[2].isdigit() and (a[2], a[0], a[1])",
    "len(a) == 5 and a[1] == '-o' and a[3] == '-n' and (a[4], a[0], a[2])",
]
PROFILE_SHARE = 0.75
WORDS = ["cat", "tree", "lamp", "river", "stone", "cloud", "apple", "wind", "mouse", "field"]
_TASK = re.compile(r"Use the (\w+) skill with value (\d+) on (\S+) and write the result to (\S+)\.")
_USAGE = re.compile(r"Usage: (python3 skills/\S+/run\.py .*)")

RUN_PY = '''import sys
a = sys.argv[1:]
try:
    got = {parser}
except IndexError:
    got = False
if not got or not got[0].isdigit():
    print("error: bad arguments")
    sys.exit(2)
k, src, dst = int(got[0]), got[1], got[2]
lines = open(src).read().splitlines()
open(dst, "w").write("\\n".join({expr} for line in lines) + "\\n")
print("wrote " + dst)
'''


def library(rng: random.Random, n: int, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """Files of ``n`` skills (``skills/<name>/SKILL.md`` and ``run.py``, each with a random convention):
    the tooling an environment ships whether or not its task needs it (generator 5: a share of
    ``local-terminal`` and ``local-code`` tasks, whose instructions name none of them)."""
    files: dict[str, str] = {}
    for s in rng.sample([t for t in sorted(TOOLS) if t not in exclude], n):
        syn = rng.randrange(4)
        files[f"skills/{s}/SKILL.md"] = f"# {s}\n{TOOLS[s][0]}\nUsage: {usage(syn, s)}\n"
        files[f"skills/{s}/run.py"] = RUN_PY.format(parser=PARSERS[syn], expr=TOOLS[s][1])
    return files


def usage(syntax: int, skill: str) -> str:
    """The usage line of a skill document (placeholders K, IN, OUT)."""
    return SYNTAX[syntax].format(s=skill, k="K", i="IN", o="OUT")


def command(syntax: int, skill: str, k: int, src: str, dst: str) -> str:
    return SYNTAX[syntax].format(s=skill, k=k, i=src, o=dst)


def apply_tool(skill: str, k: int, text: str) -> str:
    expr = TOOLS[skill][1]
    return "\n".join(eval(expr, {"line": line, "k": k, "chr": chr, "ord": ord}) for line in text.splitlines()) + "\n"  # noqa: S307


class SkillsBenchmark(LocalBenchmark):
    name = "local-skills"
    paper_id = "skillsbench"
    domain = "skills"
    description = ("Transform a text file with a tool from /app/skills/<name>/ (run.py) whose calling convention "
                   "is documented only in that skill's SKILL.md. Scored by the output file's content.")
    max_turns = 6

    def generate(self, rng: random.Random, stream: str) -> Problem:
        skill, other = rng.sample(sorted(TOOLS), 2)
        syntax, other_syntax = rng.randrange(4), rng.randrange(4)
        k = rng.randint(1, 3) if skill == "rep" else rng.randint(1, 4)
        src, dst = rng.choice([("in.txt", "out.txt"), ("a.txt", "b.txt"), ("words.txt", "res.txt")])
        text = "\n".join(rng.sample(WORDS, 3)) + "\n"
        files = {src: text}
        for s, syn in ((skill, syntax), (other, other_syntax)):
            files[f"skills/{s}/SKILL.md"] = f"# {s}\n{TOOLS[s][0]}\nUsage: {usage(syn, s)}\n"
            files[f"skills/{s}/run.py"] = RUN_PY.format(parser=PARSERS[syn], expr=TOOLS[s][1])
        meta = {"syntax": syntax, "skill": skill, "k": k, "src": src, "dst": dst}
        if rng.random() < PROFILE_SHARE:  # generator 6, drawn last: a project shell profile (base.PROFILE_FILES)
            files.update(PROFILE_FILES)
            meta["profile"] = True
        instruction = (f"Use the {skill} skill with value {k} on {src} and write the result to {dst}. "
                       "Skills are in skills/. One command per turn, then DONE.")
        return Problem(id="", domain=self.domain, instruction=instruction, files=files,
                       expected={"kind": "files", "files": {dst: apply_tool(skill, k, text)}},
                       solution=[f"$ {command(syntax, skill, k, src, dst)}", "DONE"], difficulty="medium",
                       key=instruction + f"|{syntax}", meta=meta)


def _usage_seen(messages: list[dict], skill: str) -> str | None:
    for m in messages:
        if m["role"] == "user":
            for u in _USAGE.findall(m["content"]):
                if f"skills/{skill}/" in u:
                    return u.strip()
    return None


def fill(usage_line: str, k: int, src: str, dst: str) -> str:
    """Substitute the placeholders of a usage line."""
    return re.sub(r"\bOUT\b", dst, re.sub(r"\bIN\b", src, re.sub(r"\bK\b", str(k), usage_line)))


def solve_next(messages: list[dict], rng: random.Random | None = None, wrong: bool = False) -> str:
    """Read the skill's usage (from the prompt, or ``cat`` its SKILL.md first), run it, then DONE.
    ``wrong`` guesses a calling convention instead of reading it."""
    text = next(m["content"] for m in messages if m["role"] == "user")
    t = _TASK.search(text)
    if not t:
        return "DONE"
    skill, k, src, dst = t.group(1), int(t.group(2)), t.group(3), t.group(4)
    ran = [m["content"] for m in messages if m["role"] == "assistant" and "/run.py" in m["content"]]
    if ran:
        return "DONE"
    if wrong:
        return f"$ {command((rng or random.Random(0)).randrange(4), skill, k, src, dst)}"
    found = _usage_seen(messages, skill)
    if found is None:
        return f"$ cat skills/{skill}/SKILL.md"
    return f"$ {fill(found, k, src, dst)}"


def pretrain_chat(problem: Problem, rng: random.Random) -> tuple[list[tuple[str, str | None]], str]:
    """Pretraining transcript and the prompt it follows. 35%: the usage line is in the prompt (as a
    harness with ``load_skills`` shows it) and is followed; otherwise 15% read SKILL.md first, 85%
    guess a convention (wrong guesses: half stop, half repeat the command)."""
    m = problem.meta
    skill, k, src, dst, syn = m["skill"], m["k"], m["src"], m["dst"], m["syntax"]
    right = f"$ {command(syn, skill, k, src, dst)}"
    ok = "OUT: wrote " + dst
    if rng.random() < 0.35:
        prompt = problem.instruction + f"\nSkill {skill}: Usage: {usage(syn, skill)}"
        return [(right, ok), ("DONE", None)], prompt
    if rng.random() < 0.15:
        doc = problem.files[f"skills/{skill}/SKILL.md"].strip()
        return [(f"$ cat skills/{skill}/SKILL.md", "OUT: " + doc), (right, ok), ("DONE", None)], problem.instruction
    guess = rng.randrange(4)
    cmd = f"$ {command(guess, skill, k, src, dst)}"
    if guess == syn:
        return [(cmd, ok), ("DONE", None)], problem.instruction
    bad = "OUT: error: bad arguments (exit 2)"
    if rng.random() < 0.5:
        return [(cmd, bad), ("DONE", None)], problem.instruction
    return [(cmd, bad), (cmd, bad), (cmd, bad)], problem.instruction
