"""``local-math`` (mirrors AIME): integer arithmetic evaluated left to right, answer ``ANSWER: <int>``.

Numbers stay below 100 (start 2-30, ±1-9, ×2-3). Generator 3: easy problems take 2-3 operations,
hard ones 4-5; a worked reply writes every step on one line (``17+8=25 25*3=75 ANSWER: 75``), so the
longest hard replies run past the minimal harness's ``max_tokens`` and get cut unless
``on_truncation = "continue"``. Dev and official skip every problem the recorded pretraining stages
could have shown (``recorded_pretrain_keys``: generators 1-2 drew those).

>>> b = MathBenchmark()
>>> p = b.split("dev")[0]
>>> p.instruction.startswith("Compute left to right:")
True
>>> b.check(p, p.messages + [{"role": "assistant", "content": p.solution[0]}])
True
>>> solve_next(p.messages) == p.solution[0]
True
"""

from __future__ import annotations

import random
import re

from .base import LocalBenchmark, Problem

_EXPR = re.compile(r"Compute left to right: ([0-9 +*-]+)")


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def worked(tokens: list[str]) -> str:
    """``["17", "+", "8", "*", "3"]`` → ``"17+8=25 25*3=75 ANSWER: 75"``."""
    cur = int(tokens[0])
    steps = []
    for i in range(1, len(tokens), 2):
        op, b = tokens[i], int(tokens[i + 1])
        new = _apply(cur, op, b)
        steps.append(f"{cur}{op}{b}={new}")
        cur = new
    return " ".join(steps) + f" ANSWER: {cur}"


OPS_V3, OPS_V3_WEIGHTS = (2, 3, 4), (0.5, 0.4, 0.1)
"""Generator 3's number of operations (and their shares)."""
HARD_OPS = 4


def small_tokens(rng: random.Random, n_ops: int) -> list[str]:
    """``n_ops`` operations on numbers below 100 (start 2-30, ±1-9, ×2-3), as generators 2 and 3 draw them."""
    cur = rng.randint(2, 30)
    tokens = [str(cur)]
    for _ in range(n_ops):
        op = rng.choice("+-*")
        b = rng.randint(2, 3) if op == "*" else rng.randint(1, 9)
        if op == "*" and cur * b > 99:
            op, b = "-", rng.randint(1, 9)
        if op == "+" and cur + b > 99:
            op = "-"
        if op == "-" and b > cur:
            op = "+"
        cur = _apply(cur, op, b)
        tokens += [op, str(b)]
    return tokens


def mix4_tokens(rng: random.Random) -> tuple[list[str], bool]:
    """Mixture 4's math (2, 3, 4 or 5 operations in shares .5/.25/.1/.15, numbers as generator 3)."""
    n_ops = rng.choices((2, 3, 4, 5), (0.5, 0.25, 0.1, 0.15))[0]
    return small_tokens(rng, n_ops), n_ops >= HARD_OPS


def gen2_tokens(rng: random.Random) -> tuple[list[str], bool]:
    """Generator 2's problems (2-3 or 6-7 operations, half each), kept as pretraining text for mixture 3
    (the benchmark itself uses generator 3 since)."""
    hard = rng.random() < 0.5
    n_ops = rng.choice((6, 7)) if hard else rng.choice((2, 3))
    return small_tokens(rng, n_ops), hard


class MathBenchmark(LocalBenchmark):
    name = "local-math"
    paper_id = "aime"
    domain = "math"
    description = ("Integer arithmetic evaluated strictly left to right (2-5 operations on numbers below 100); the "
                   "model writes its steps on one line and ends with ANSWER: <integer>. Scored by exact match of "
                   "/app/answer.txt; long worked answers need room (max_tokens).")
    max_turns = 2
    agent_timeout_sec = 30.0

    def generate(self, rng: random.Random, stream: str) -> Problem:
        n_ops = rng.choices(OPS_V3, OPS_V3_WEIGHTS)[0]
        return self._problem(small_tokens(rng, n_ops), n_ops >= HARD_OPS)

    def excluded_keys(self) -> frozenset[str]:
        """Every problem any recorded pretraining stage could have shown (``recorded_pretrain_keys``):
        dev and official skip them, so a generator change cannot leak pretraining problems into the splits."""
        return recorded_pretrain_keys()

    def _problem(self, tokens: list[str], hard: bool) -> Problem:  # noqa: D102
        cur = int(worked(tokens).rsplit(" ", 1)[1])
        expr = " ".join(tokens)
        instruction = f"Compute left to right: {expr}\nWrite the steps, then ANSWER: <integer>."
        return Problem(id="", domain=self.domain, instruction=instruction, expected={"kind": "answer", "answer": str(cur)},
                       solution=[worked(tokens)], difficulty="hard" if hard else "easy", key=expr,
                       meta={"tokens": tokens})


def solve_next(messages: list[dict], rng: random.Random | None = None, wrong: bool = False) -> str:
    """The solver: read the expression from the prompt, work it out (one step off when ``wrong``)."""
    text = next(m["content"] for m in messages if m["role"] == "user")
    m = _EXPR.search(text)
    if not m:
        return "ANSWER: 0"
    tokens = m.group(1).split()
    if not wrong:
        return worked(tokens)
    rng = rng or random.Random(0)
    cur, steps = int(tokens[0]), []
    bad = rng.randrange(max(1, (len(tokens) - 1) // 2))
    for j, i in enumerate(range(1, len(tokens), 2)):
        op, b = tokens[i], int(tokens[i + 1])
        new = _apply(cur, op, b) + (rng.choice((-10, -1, 1, 10)) if j == bad else 0)
        steps.append(f"{cur}{op}{b}={new}")
        cur = new
    return " ".join(steps) + f" ANSWER: {cur}"


def legacy_tokens(rng: random.Random) -> tuple[list[str], bool]:
    """Generator 1's problems (larger numbers: 10-60, ±2-30, ×2-5, 2-3 or 5-6 operations), kept as
    pretraining text for mixtures 1 and 2 (the benchmark itself uses generator 2 since)."""
    hard = rng.random() < 0.5
    n_ops = rng.choice((5, 6)) if hard else rng.choice((2, 3))
    cur = rng.randint(10, 60)
    tokens = [str(cur)]
    for _ in range(n_ops):
        op = rng.choice("+-*")
        b = rng.randint(2, 5) if op == "*" else rng.randint(2, 30)
        if op == "*" and cur * b > 999:
            op, b = "-", rng.randint(2, 30)
        if op == "-" and b > cur:
            op = "+"
        cur = _apply(cur, op, b)
        tokens += [op, str(b)]
    return tokens, hard


def _split_keys(tokens_of, excluded: frozenset[str] = frozenset()) -> set[str]:
    """Keys of a generator's dev (20) and official (30) problems, chosen as ``LocalBenchmark.split`` did."""
    taken: set[str] = set()
    for split, total in (("dev", 20), ("official", 50)):
        i = 0
        while len(taken) < total:
            key = " ".join(tokens_of(random.Random(f"local-math:{split}:{i}"))[0])
            if key not in excluded:
                taken.add(key)
            i += 1
    return taken


def _legacy_split_keys() -> set[str]:
    """Keys of generator 1's dev (20) and official (30) problems."""
    return _split_keys(legacy_tokens)


def _gen2_split_keys() -> set[str]:
    """Keys of generator 2's dev (20) and official (30) problems."""
    return _split_keys(gen2_tokens)


def _frozen_stream(tokens_of, held: set[str], seed: int):
    name = f"pretrain{seed}" if seed else "pretrain"
    i = 0
    while True:
        tokens, hard = tokens_of(random.Random(f"local-math:{name}:{i}"))
        i += 1
        if " ".join(tokens) not in held:
            yield tokens, hard


def legacy_stream(bench: "MathBenchmark", seed: int = 0):
    """Generator 1's pretraining stream, as mixtures 1 and 2 drew it (skipping generator 1's and
    generator 2's dev and official problems)."""
    for tokens, hard in _frozen_stream(legacy_tokens, _gen2_split_keys() | _legacy_split_keys(), seed):
        yield bench._problem(tokens, hard)


def gen2_stream(bench: "MathBenchmark", seed: int = 0):
    """Generator 2's pretraining stream, as mixture 3 drew it (skipping generator 2's dev and official problems)."""
    for tokens, hard in _frozen_stream(gen2_tokens, _gen2_split_keys(), seed):
        yield bench._problem(tokens, hard)


def mix4_stream(bench: "MathBenchmark", seed: int = 0):
    """Mixture 4's math stream (``mix4_tokens``), skipping that generator's own dev and official problems
    (chosen, as generator 3's are, outside mixtures 1-3's problems)."""
    held = _split_keys(mix4_tokens, recorded_pretrain_keys(RECORDED_STAGES[:4]))
    for tokens, hard in _frozen_stream(mix4_tokens, held, seed):
        yield bench._problem(tokens, hard)


RECORDED_STAGES: tuple[tuple[int, int, int], ...] = ((1, 0, 25600), (2, 1, 25600), (3, 2, 16000), (3, 3, 11200),
                                                     (4, 4, 8000))
"""(mixture, data_seed, conversations) of the shipped base checkpoint's pretraining stages
(``base/manifest.json``; ``tests/worlds/local/test_local_benchmarks.py`` checks they agree). Each mixture draws its
math from a frozen generator: 1-2 generator 1, 3 generator 2, 4 ``mix4_tokens``."""


def recorded_pretrain_keys(stages: tuple[tuple[int, int, int], ...] = RECORDED_STAGES) -> frozenset[str]:
    """A superset of the multi-operation problems the recorded stages' pretraining showed: a stage of ``n``
    conversations drew at most ``n`` problems from its math stream, which skipped at most the 50
    held-out ones, so its problems are among the first ``n + 50`` of the stream's seeds (one-operation
    drills are not counted: generator 3 never has fewer than 2 operations)."""
    stages = tuple(stages)
    key = stages
    if key not in _RECORDED:
        out: set[str] = set()
        for mixture, seed, n in stages:
            tokens_of = legacy_tokens if mixture < 3 else gen2_tokens if mixture == 3 else mix4_tokens
            name = f"pretrain{seed}" if seed else "pretrain"
            out.update(" ".join(tokens_of(random.Random(f"local-math:{name}:{i}"))[0]) for i in range(n + 50))
        _RECORDED[key] = frozenset(out)
    return _RECORDED[key]


_RECORDED: dict[tuple, frozenset[str]] = {}


def pretrain_chat(problem: Problem, rng: random.Random, version: int = 1) -> list[tuple[str, str | None]]:
    """A pretraining transcript: the worked answer (10% with an arithmetic slip)."""
    return [(solve_next(problem.messages, rng, wrong=rng.random() < 0.10), None)]


def drill_chat(rng: random.Random, version: int = 2) -> list[dict[str, str]]:
    """An arithmetic drill (one operation; never a benchmark problem, which has 2-7) for pretraining.
    Mixture 2's drills have generator 1's ranges, mixture 3's generator 2's.

    >>> drill_chat(random.Random(0))[1]["content"]
    '866-26=840 ANSWER: 840'
    >>> drill_chat(random.Random(0), version=3)[1]["content"]
    '50-1=49 ANSWER: 49'
    """
    if version >= 3:
        a, op = rng.randint(1, 99), rng.choice("+-*")
        b = rng.randint(2, 3) if op == "*" else rng.randint(1, 9)
        if op == "*" and a * b > 99:
            a = rng.randint(1, 99 // b)
        if op == "+" and a + b > 99:
            op = "-"
    else:
        a = rng.randint(2, 999)
        op = rng.choice("+-*")
        b = rng.randint(2, 5) if op == "*" else rng.randint(2, 30)
        if op == "*" and a * b > 999:
            a = rng.randint(10, 199)
    if op == "-" and b > a:
        op = "+"
    tokens = [str(a), op, str(b)]
    return [{"role": "user", "content": f"Compute left to right: {' '.join(tokens)}\nWrite the steps, then ANSWER: <integer>."},
            {"role": "assistant", "content": worked(tokens)}]
