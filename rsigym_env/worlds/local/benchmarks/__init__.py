"""The five local benchmarks (``docs/local-world.md``): deterministic generators → Harbor task
directories, synthetic prompts for teachers, demonstration checking, and the pretraining mixture.

>>> sorted(BENCHMARKS)
['local-code', 'local-math', 'local-science', 'local-skills', 'local-terminal']
>>> resolve("aime").name, resolve("local-code").paper_id
('local-math', 'swe-bench-verified')
>>> resolve("nope")
Traceback (most recent call last):
...
ValueError: unknown benchmark 'nope'; benchmarks: local-code (swe-bench-verified), local-math (aime), local-science (gpqa-diamond), local-skills (skillsbench), local-terminal (terminal-bench-2)
"""

from __future__ import annotations

import random
from typing import Callable

from . import arith, coding, science, skills, terminal
from .arith import MathBenchmark
from .base import (GENERATOR_VERSION, SPLIT_SIZES, SYSTEM_PROMPT, LocalBenchmark, Problem, observation, parse_action,
                   run_command, verify_dir, write_files)
from .coding import CodeBenchmark
from .science import ScienceBenchmark
from .skills import SkillsBenchmark
from .terminal import TerminalBenchmark

BENCHMARKS: dict[str, LocalBenchmark] = {b.name: b for b in (
    CodeBenchmark(), TerminalBenchmark(), MathBenchmark(), ScienceBenchmark(), SkillsBenchmark())}
PAPER_IDS: dict[str, str] = {b.paper_id: name for name, b in BENCHMARKS.items()}
DOMAINS: dict[str, str] = {b.domain: name for name, b in BENCHMARKS.items()}

SOLVERS: dict[str, Callable[..., str]] = {
    "code": coding.solve_next, "terminal": terminal.solve_next, "math": arith.solve_next,
    "science": science.solve_next, "skills": skills.solve_next}
"""Domain solvers: ``solve(messages, rng=None, wrong=False) -> next action line`` from the chat alone."""


def resolve(name: str) -> LocalBenchmark:
    """A benchmark by local id (``local-math``) or paper id (``aime``)."""
    key = PAPER_IDS.get(name, name)
    if key not in BENCHMARKS:
        valid = ", ".join(f"{n} ({b.paper_id})" for n, b in sorted(BENCHMARKS.items()))
        raise ValueError(f"unknown benchmark {name!r}; benchmarks: {valid}")
    return BENCHMARKS[key]


def domain_of(messages: list[dict]) -> str:
    """Which domain a prompt belongs to, from its text (what a teacher reads).

    >>> domain_of([{"role": "user", "content": "Compute left to right: 1 + 2"}])
    'math'
    """
    text = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
    if "Compute left to right:" in text:
        return "math"
    if "Fix the bug in calc.py" in text:
        return "code"
    if " skill with value " in text:
        return "skills"
    if "Reply ANSWER: <letter>" in text:
        return "science"
    return "terminal"


# --- the pretraining mixture ----------------------------------------------------------------------

MIXTURES: dict[int, dict[str, float]] = {
    1: {"math": 0.26, "science": 0.22, "code": 0.20, "terminal": 0.16, "skills": 0.16},
    2: {"math": 0.28, "science": 0.16, "code": 0.20, "terminal": 0.18, "skills": 0.18},
    3: {"math": 0.36, "science": 0.14, "code": 0.18, "terminal": 0.16, "skills": 0.16},
    4: {"math": 0.55, "science": 0.12, "code": 0.12, "terminal": 0.11, "skills": 0.10},
}
"""Share of pretraining conversations per domain, by mixture version. Science: half questions, half
fact statements. Version 2 adds arithmetic drills (40% of math: one-operation problems, never in a
benchmark) and code transcripts that recover from the real ``check.sh`` failure message. Mixtures 1
and 2 draw their math from generator 1 (larger numbers, ``arith.legacy_stream``); version 3 from the
benchmark's generator 2, with drills in its ranges; version 4 (more arithmetic, half of it drills) from
``arith.mix4_tokens`` (generator 3's ranges, more operations). The benchmark's splits skip every
problem any recorded stage could have drawn (``arith.recorded_pretrain_keys``). Code always comes from generator 2 (``coding.gen2_stream``): its
function names and bug families, so generator 3's new bugs are never shown in pretraining. Science always
comes from generators 1-3 (``science.kb_stream``: questions about the fixed knowledge base ``science.KB``);
generator 4's questions, whose facts are stated in the question, are never shown in pretraining."""
MIXTURE = MIXTURES[3]
DRILL_SHARE = {1: 0.0, 2: 0.4, 3: 0.3, 4: 0.5}


def pretraining_conversations(n: int, seed: int = 0, version: int = 3) -> list[list[dict[str, str]]]:
    """``n`` pretraining chats drawn from the five domains' ``pretrain`` streams (disjoint from dev,
    official and synthetic) in ``MIXTURE`` proportions. Transcripts have the quality of a noisy web
    corpus of agent traces (see each domain's ``pretrain_chat``); half start with the system prompt.

    >>> chats = pretraining_conversations(5, seed=1)
    >>> len(chats), all(c[-1]["role"] == "assistant" for c in chats)
    (5, True)
    """
    rng = random.Random(f"pretrain-mixture:{seed}" if version == 1 else f"pretrain-mixture:v{version}:{seed}")
    streams = {d: BENCHMARKS[name].stream("pretrain", seed) for d, name in DOMAINS.items()}
    if version < 3:
        streams["math"] = arith.legacy_stream(BENCHMARKS["local-math"], seed)
    elif version == 3:
        streams["math"] = arith.gen2_stream(BENCHMARKS["local-math"], seed)
    elif version == 4:
        streams["math"] = arith.mix4_stream(BENCHMARKS["local-math"], seed)
    streams["code"] = coding.gen2_stream(BENCHMARKS["local-code"], seed)
    streams["science"] = science.kb_stream(BENCHMARKS["local-science"], seed)
    domains, weights = zip(*sorted(MIXTURES[version].items()))
    out: list[list[dict[str, str]]] = []
    while len(out) < n:
        d = rng.choices(domains, weights)[0]
        if d == "science" and rng.random() < 0.5:
            out.append(science.fact_chats(rng))
            continue
        if d == "math" and DRILL_SHARE[version] and rng.random() < DRILL_SHARE[version]:
            out.append(([{"role": "system", "content": SYSTEM_PROMPT}] if rng.random() < 0.5 else []) + arith.drill_chat(rng, version))
            continue
        p = next(streams[d])
        prompt = p.instruction
        if d == "skills":
            turns, prompt = skills.pretrain_chat(p, rng)
        else:
            turns = (coding.pretrain_chat(p, rng, version) if d == "code" else
                     {"math": arith.pretrain_chat, "science": science.pretrain_chat,
                      "terminal": terminal.pretrain_chat}[d](p, rng))
        if turns is None:
            continue
        msgs = ([{"role": "system", "content": SYSTEM_PROMPT}] if rng.random() < 0.5 else [])
        msgs.append({"role": "user", "content": prompt})
        for action, obs in turns:
            msgs.append({"role": "assistant", "content": action})
            if obs is not None:
                msgs.append({"role": "user", "content": obs})
        if msgs[-1]["role"] != "assistant":
            msgs.pop()
        out.append(msgs)
    return out


__all__ = [
    "BENCHMARKS", "DOMAINS", "GENERATOR_VERSION", "MIXTURE", "MIXTURES", "PAPER_IDS", "SOLVERS", "SPLIT_SIZES", "SYSTEM_PROMPT",
    "CodeBenchmark", "LocalBenchmark", "MathBenchmark", "Problem", "ScienceBenchmark", "SkillsBenchmark",
    "TerminalBenchmark", "domain_of", "observation", "parse_action", "pretraining_conversations", "resolve",
    "run_command", "verify_dir", "write_files",
]
