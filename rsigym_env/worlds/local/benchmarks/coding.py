"""``local-code`` (mirrors SWE-bench Verified): a tiny Python file with one bug.

The instruction shows ``calc.py`` and one example the fixed function must satisfy (also checked
by the visible ``/app/check.sh``); hidden tests check more cases. A fix is one ``sed -i`` line.
Generator 3 (``TEMPLATES_V3``, ``NAMES_V3``): each function can carry its old bug or a new one
(``NEW_BUGS``: ``x * 3`` for ``x + 3``, swapped comparison operands, ``range(0, n)``, ``!= 0``, ...)
that pretraining never showed (pretraining draws generator 2, ``gen2_stream``), so only the teachers'
solver, whose edit families cover both, can teach its fix. Generator 5: ``LIBRARY_SHARE`` of the
tasks ship a library of three skills (``skills/``) the fix does not need (see ``terminal``).

>>> b = CodeBenchmark()
>>> p = b.split("dev")[0]
>>> b.check(p, p.messages + [{"role": "assistant", "content": a} for a in p.solution])
True
>>> b.check(p, p.messages + [{"role": "assistant", "content": "DONE"}])
False
>>> solve_next(p.messages) == p.solution[0]
True
"""

from __future__ import annotations

import random
import re

from .base import PROFILE_FILES, LocalBenchmark, Problem
from .skills import library

LIBRARY_SHARE, LIBRARY_SIZE, PROFILE_SHARE = 0.5, 3, 0.5

NAMES = ["calc", "step", "shift", "pick", "total", "scale", "judge", "clip"]

# (code with {f} {k} {j}, buggy (old, new) substring, call args, expected python expression)
TEMPLATES: list[tuple[str, tuple[str, str], str, str]] = [
    ("def {f}(x):\n    return x + {k}\n", ("x + {k}", "x - {k}"), "x", "x + {k}"),
    ("def {f}(x):\n    return x - {k}\n", ("x - {k}", "x + {k}"), "x", "x - {k}"),
    ("def {f}(a, b):\n    if a > b:\n        return a\n    return b\n", ("a > b", "a < b"), "a, b", "max(a, b)"),
    ("def {f}(a, b):\n    if a < b:\n        return a\n    return b\n", ("a < b", "a > b"), "a, b", "min(a, b)"),
    ("def {f}(n):\n    t = 0\n    for i in range(1, n + 1):\n        t += i\n    return t\n",
     ("range(1, n + 1)", "range(1, n)"), "n", "n * (n + 1) // 2"),
    ("def {f}(xs, k):\n    return sum(1 for x in xs if x <= k)\n", ("x <= k", "x < k"), "xs, k",
     "len([x for x in xs if x <= k])"),
    ("def {f}(x):\n    return x * {k} + {j}\n", ("+ {j}", "- {j}"), "x", "x * {k} + {j}"),
    ("def {f}(x):\n    return x % 2 == 0\n", ("== 0", "== 1"), "x", "x % 2 == 0"),
]

NAMES_V3 = ["fold", "bump", "gate", "trim", "tally", "span", "nudge", "cap"]
"""Generator 3's function names: none of generator 1-2's, so no generator-3 task (its key holds the
code) can be one the recorded pretraining stages drew."""

# Generator 3 adds, for the same functions, bugs pretraining never showed (and so fixes it never taught).
NEW_BUGS: list[tuple[str, tuple[str, str], str, str]] = [
    ("def {f}(x):\n    return x + {k}\n", ("x + {k}", "x * {k}"), "x", "x + {k}"),
    ("def {f}(x):\n    return x - {k}\n", ("x - {k}", "x * {k}"), "x", "x - {k}"),
    ("def {f}(a, b):\n    if a > b:\n        return a\n    return b\n", ("a > b", "b > a"), "a, b", "max(a, b)"),
    ("def {f}(a, b):\n    if a < b:\n        return a\n    return b\n", ("a < b", "b < a"), "a, b", "min(a, b)"),
    ("def {f}(n):\n    t = 0\n    for i in range(1, n + 1):\n        t += i\n    return t\n",
     ("range(1, n + 1)", "range(0, n)"), "n", "n * (n + 1) // 2"),
    ("def {f}(xs, k):\n    return sum(1 for x in xs if x <= k)\n", ("x <= k", "x > k"), "xs, k",
     "len([x for x in xs if x <= k])"),
    ("def {f}(x):\n    return x * {k} + {j}\n", ("+ {j}", "* {j}"), "x", "x * {k} + {j}"),
    ("def {f}(x):\n    return x % 2 == 0\n", ("== 0", "!= 0"), "x", "x % 2 == 0"),
]
TEMPLATES_V3 = TEMPLATES + NEW_BUGS

# The solver's edit families: (regex on the file, replacement), each covering the changed text with
# its neighbours so the edit is a readable ``sed``.
_MUTATIONS: list[tuple[str, str]] = [
    (r"x - (\d)", r"x + \1"), (r"x \+ (\d)", r"x - \1"), (r"x - (\d)", r"x * \1"), (r"x \+ (\d)", r"x * \1"),
    (r"a > b", "a < b"), (r"a < b", "a > b"), (r"a > b", "a >= b"), (r"a < b", "a <= b"),
    (r"range\(1, n\)", "range(1, n + 1)"), (r"range\(1, n \+ 1\)", "range(1, n)"), (r"range\(1, n\)", "range(0, n)"),
    (r"x < k", "x <= k"), (r"x <= k", "x < k"), (r"x < k", "x > k"),
    (r"- (\d)\n", r"+ \1"), (r"\+ (\d)\n", r"- \1"),
    (r"== 1", "== 0"), (r"== 0", "== 1"), (r"== 1", "== 2"),
    # generator 3's new bugs
    (r"x \* (\d)\n", r"x + \1"), (r"x \* (\d)\n", r"x - \1"), (r"b > a", "a > b"), (r"b < a", "a < b"),
    (r"range\(0, n\)", "range(1, n + 1)"), (r"x > k", "x <= k"), (r"\* (\d)\n", r"+ \1"), (r"!= 0", "== 0"),
    (r"b > a", "b >= a"), (r"b < a", "b <= a"), (r"range\(0, n\)", "range(0, n - 1)"), (r"x > k", "x >= k"),
    (r"\* (\d)\n", r"- \1"), (r"!= 0", "== 1"),
]


def _args(rng: random.Random, sig: str) -> tuple:
    if sig == "x":
        return (rng.randint(1, 20),)
    if sig == "a, b":
        a, b = rng.sample(range(1, 30), 2)
        return (a, b)
    if sig == "n":
        return (rng.randint(3, 9),)
    return ([rng.randint(0, 9) for _ in range(4)], rng.randint(2, 7))


def _value(expr: str, sig: str, args: tuple) -> object:
    env = dict(zip([s.strip() for s in sig.split(",")], args))
    return eval(expr, {"len": len, "max": max, "min": min}, env)  # noqa: S307 - our own template expressions


class CodeBenchmark(LocalBenchmark):
    name = "local-code"
    paper_id = "swe-bench-verified"
    domain = "code"
    description = ("Fix the one bug in a tiny Python file (calc.py, shown in the instruction with one required "
                   "example; half the bugs are of kinds a plain pretrained model never saw fixed); "
                   "/app/check.sh runs that example, hidden tests run more. Edits are one-line shell "
                   "commands such as sed -i.")
    max_turns = 6

    def generate(self, rng: random.Random, stream: str) -> Problem:
        p = make_problem(rng, TEMPLATES_V3, NAMES_V3)
        if rng.random() < LIBRARY_SHARE:  # drawn last: the task itself is generator 4's
            p.files.update(library(rng, LIBRARY_SIZE))
            p.meta["library"] = LIBRARY_SIZE
        if rng.random() < PROFILE_SHARE:  # generator 6, drawn last: a project shell profile (base.PROFILE_FILES)
            p.files.update(PROFILE_FILES)
            p.meta["profile"] = True
        return p


def make_problem(rng: random.Random, templates: list, names: list[str]) -> Problem:
    """One task: a template and its bug, a function name, constants, and an example the bug fails."""
    code, (good, bad), sig, truth = rng.choice(templates)
    fmt = {"f": rng.choice(names), "k": rng.randint(2, 9), "j": rng.randint(2, 9)}
    correct = code.format(**fmt)
    good, bad, truth = good.format(**fmt), bad.format(**fmt), truth.format(**fmt)
    buggy = correct.replace(good, bad, 1)
    while buggy.count(bad) != 1:  # the fix must be an unambiguous edit (x * 4 * 4: other constants)
        fmt["j"] = rng.randint(2, 9)
        correct = code.format(**fmt)
        good, bad, truth = [t.format(**fmt) for t in next((g, b, t) for c, (g, b), _, t in templates if c == code)]
        buggy = correct.replace(good, bad, 1)
    while True:  # an example on which the bug shows
        args = _args(rng, sig)
        want = _value(truth, sig, args)
        call = f"{fmt['f']}({', '.join(repr(a) for a in args)})"
        if _run(buggy, call) != want:
            break
    calls, wants = [[fmt["f"], list(args)]], [want]
    for _ in range(4):
        a = _args(rng, sig)
        calls.append([fmt["f"], list(a)])
        wants.append(_value(truth, sig, a))
    instruction = f"Fix the bug in calc.py: {call} must return {want!r}.\ncalc.py:\n{buggy}"
    check = ("#!/bin/bash\n# Visible check: the example from the instruction.\n"
             'cd "$(dirname "$0")"\n'
             f"python3 -c 'import calc; r = calc.{call}; assert r == {want!r}, \"{call} = %r, expected {want!r}\" % (r,)' "
             "2>&1 | tail -n 1\nexit ${PIPESTATUS[0]}\n")
    p = Problem(id="", domain="code", instruction=instruction, files={"calc.py": buggy, "check.sh": check},
                expected={"kind": "calls", "module": "calc", "calls": calls, "want": wants},
                solution=[_sed(bad, good), "DONE"],
                difficulty="easy" if sig == "x" else "medium", key=buggy + call,
                meta={"good": good, "bad": bad})
    return p


def _run(code: str, call: str) -> object:
    env: dict = {}
    try:
        exec(code, env)  # noqa: S102 - the task's own tiny file, run by the solver
        return eval(call, env)  # noqa: S307
    except Exception as exc:  # noqa: BLE001
        return exc


_FILE = re.compile(r"calc\.py:\n(.*)", re.S)
_EXAMPLE = re.compile(r"Fix the bug in calc\.py: (.+?) must return (.+?)\.\n")


def candidate_fixes(code: str) -> list[tuple[str, str]]:
    """Every (old, new) text edit of the solver's edit families that applies to ``code``.

    >>> candidate_fixes("def f(x):\\n    return x - 3\\n")[:2]
    [('x - 3', 'x + 3'), ('x - 3', 'x * 3')]
    """
    out: list[tuple[str, str]] = []
    for pattern, repl in _MUTATIONS:
        for m in re.finditer(pattern, code):
            old = m.group(0).rstrip("\n")
            new = m.expand(repl).rstrip("\n")
            if old != new and (old, new) not in out and code.count(old) == 1:
                out.append((old, new))
    return out


def _sed(old: str, new: str) -> str:
    """The one-line edit (``*`` escaped: sed patterns are regular expressions)."""
    return f"$ sed -i 's/{old.replace('*', chr(92) + '*')}/{new}/' calc.py"


def solve_next(messages: list[dict], rng: random.Random | None = None, wrong: bool = False) -> str:
    """Try every one-token mutation on the example from the prompt; answer with the ``sed`` of the
    first that passes (of one that does not when ``wrong``); ``DONE`` once an edit was made."""
    if any(m["role"] == "assistant" and m["content"].startswith("$ sed") for m in messages):
        last_obs = messages[-1]["content"] if messages[-1]["role"] == "user" else ""
        if "check failed" not in last_obs:
            return "DONE"
    text = next(m["content"] for m in messages if m["role"] == "user")
    fm, em = _FILE.search(text), _EXAMPLE.search(text)
    if not fm or not em:
        return "DONE"
    code, call, want = fm.group(1), em.group(1), em.group(2)
    try:
        target = eval(want, {})  # noqa: S307 - a literal from the prompt
    except Exception:  # noqa: BLE001
        return "DONE"
    good, bad = [], []
    for old, new in candidate_fixes(code):
        fixed = code.replace(old, new, 1)
        (good if _run(fixed, call) == target else bad).append((old, new))
    if wrong or not good:
        pool = bad or good
        if not pool:
            return "DONE"
        old, new = (rng or random.Random(0)).choice(pool)
        return _sed(old, new)
    return _sed(*good[0])


def check_failure(code: str, call: str, want: str) -> str:
    """What a verifying harness shows when ``check.sh`` fails (the same text the task's check prints)."""
    got = _run(code, call)
    if isinstance(got, Exception):
        return f"OUT: check failed: {type(got).__name__}: {got}"
    return f"OUT: check failed: AssertionError: {call} = {got!r}, expected {want}"


def generate_v2(rng: random.Random) -> Problem:
    """Generator 1-2's problems (kept as pretraining text for mixtures 1-3)."""
    return make_problem(rng, TEMPLATES, NAMES)


def gen2_stream(bench: "CodeBenchmark", seed: int = 0):
    """Generator 2's pretraining stream, as mixtures 1-3 drew it (skipping generator 2's dev and official tasks)."""
    held: set[str] = set()
    for split, total in (("dev", 20), ("official", 50)):
        i = 0
        while len(held) < total:
            held.add(generate_v2(random.Random(f"local-code:{split}:{i}")).key)
            i += 1
    name = f"pretrain{seed}" if seed else "pretrain"
    i = 0
    while True:
        p = generate_v2(random.Random(f"local-code:{name}:{i}"))
        i += 1
        if p.key not in held:
            p.id = f"local-code-pretrain-{seed}-{i - 1:05d}"
            yield p


def pretrain_chat(problem: Problem, rng: random.Random, version: int = 1) -> list[tuple[str, str | None]]:
    """Pretraining transcripts of varying quality (``version`` of the mixture, see ``benchmarks.MIXTURES``).

    Version 1: 60% fix + DONE; 15% a plausible wrong fix + DONE; 10% wrong fix, DONE, a check
    failure, the right fix, DONE (only where the bug was still in the file); 15% an edit that breaks
    the syntax + DONE. Version 2: 55% fix; 10% wrong fix + DONE; 20% wrong fix, DONE, the check's
    real failure message (as ``verify_before_submit`` shows it), a fix of the changed file, DONE;
    15% a syntax-breaking edit + DONE."""
    good, bad = problem.meta["good"], problem.meta["bad"]
    ok = [(_sed(bad, good), "OUT: (exit 0)"), ("DONE", None)]
    u = rng.random()
    p_ok, p_wrong_done = (0.60, 0.75) if version == 1 else (0.55, 0.65)
    if u < p_ok:
        return ok
    code = problem.files["calc.py"]
    ex = _EXAMPLE.search(problem.instruction)
    wrongs = [(o, n) for o, n in candidate_fixes(code) if (o, n) != (bad, good)
              and ex is not None and repr(_run(code.replace(o, n, 1), ex.group(1))) != ex.group(2)]
    if u < 0.85 and wrongs:
        o, n = rng.choice(wrongs)
        first = [(_sed(o, n), "OUT: (exit 0)")]
        if u < p_wrong_done:
            return first + [("DONE", None)]
        changed = code.replace(o, n, 1)
        if version == 1:
            if bad not in changed:
                return ok
            fail = f"OUT: check failed: {ex.group(1)} = ?, expected {ex.group(2)}"
            return first + [("DONE", fail), (_sed(bad, good), "OUT: (exit 0)"), ("DONE", None)]
        fixed = code.replace(bad, good, 1)
        repair = (n, good) if n in changed and changed.replace(n, good, 1) == fixed else (bad, good)
        if repair[0] not in changed:
            return ok
        return first + [("DONE", check_failure(changed, ex.group(1), ex.group(2))), (_sed(*repair), "OUT: (exit 0)"),
                        ("DONE", None)]
    broken = rng.choice([good[:-1], good + ")", good.replace(" ", "", 1) + " :", good.split(" ")[0] + " "])
    return [(_sed(bad, broken), "OUT: (exit 0)"), ("DONE", None)]
