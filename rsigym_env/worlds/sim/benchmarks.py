"""The five benchmarks of RSIGym and the per-domain numbers the sim world runs on.

Task counts and initial avg@3 scores are the paper's; every other number is a modelling choice
explained in ``CALIBRATION.md`` (token counts are set so that evaluations, teacher data and
training cost what the brief's targets say at the default price list).

>>> b = BENCHMARKS["aime"]
>>> b.n_tasks, b.initial_score, b.domain.agentic
(60, 0.3167, False)
>>> round(b.domain.reply_exceeds(4096), 2)
0.6
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from types import MappingProxyType
from typing import Mapping

from ...catalog import DEFECTS, SIM_TEACHERS  # noqa: F401  (DEFECTS: re-exported for the sim model)

# DEFECTS: the harness defects, in the order used by every per-defect vector; each one's setting in
# the minimal harness is ``catalog.REMEDY_FOR[defect]`` (truncation is exposed by a reply longer than
# ``max_output_tokens``).
TEACHERS: tuple[str, ...] = SIM_TEACHERS

TEACHER_DUPLICATES: Mapping[str, float] = MappingProxyType(
    {"claude-opus-5": 0.12, "gpt-6-astra": 0.10, "deepseek-v4.1-flash": 0.25}
)
"""Fraction of near-duplicate examples in a teacher's synthetic data."""

MINIMAL_MAX_OUTPUT_TOKENS = 4096


@dataclass(frozen=True)
class Domain:
    """What tasks of one kind look like to the sim: defects, token and time costs, teacher quality."""

    name: str
    agentic: bool
    difficulty_sd: float  # spread of task difficulty (logits)
    exposure: tuple[float, ...]  # per defect: fraction of tasks exposed where the system has it (truncation: at 4096 tokens)
    severity: tuple[float, ...]  # per defect: chance an exposed attempt fails because of it (median over seeds)
    prevalence: tuple[float, ...]  # per defect: chance a seed's target system has it (0 where exposure is 0)
    reply_sigma: float  # log-sd of a task's longest reply
    prefill_tokens: int  # prompt tokens of one attempt (all turns), minimal harness
    other_sampled_tokens: int  # sampled tokens of one attempt besides its longest reply
    context_tokens: int  # prompt tokens of one "continue" request after a cut-off reply
    sandbox_seconds: float  # sandbox time of one attempt
    attempt_seconds: float  # wall time of one attempt
    statement_tokens: int  # a task statement sent through `infer`
    example_prompt_tokens: int  # stored prompt part of one teacher example
    teacher_input_factor: float  # teacher input tokens billed per stored prompt token (multi-turn)
    example_completion_median: int  # teacher completion tokens (median, before the cap)
    example_completion_sigma: float  # log-sd of teacher completion tokens
    generate_seconds: float  # wall time of one teacher example
    check_seconds: float  # sandbox seconds to check one example (filter)
    examples_scale: float  # N0: examples that reach 63% of the learnable fraction at default settings
    incorrect_penalty: float  # logits the data's level drops per unit fraction of incorrect examples
    teacher_accuracy: Mapping[str, float]  # teacher's solve rate on the domain's tasks

    @property
    def reply_log_median(self) -> float:
        """Log-median of the longest reply, set so that the truncation exposure holds at 4096 tokens."""
        return self.reply_log_median_at(self.exposure[0])

    def reply_log_median_at(self, exposure: float) -> float:
        """Log-median of the longest reply at which ``exposure`` of the tasks exceed 4096 tokens."""
        z = NormalDist().inv_cdf(1.0 - exposure)
        return math.log(MINIMAL_MAX_OUTPUT_TOKENS) - self.reply_sigma * z

    @property
    def typical_reply_tokens(self) -> int:
        return round(math.exp(self.reply_log_median))

    def reply_exceeds(self, max_tokens: float) -> float:
        """Fraction of tasks whose longest reply is longer than ``max_tokens``."""
        return 1.0 - NormalDist(self.reply_log_median, self.reply_sigma).cdf(math.log(max_tokens))


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: the paper's task count and initial avg@3 score, on one domain."""

    id: str
    title: str
    domain: Domain
    n_tasks: int  # official split size (the dev split has the same size)
    initial_score: float  # avg@3 of Qwen3.5-35B-A3B-Base with the minimal harness


CODE_FIXING = Domain(
    name="code fixing (agentic)",
    agentic=True,
    difficulty_sd=2.0,
    exposure=(0.25, 0.35, 0.25, 0.20, 0.30),
    severity=(0.70, 0.50, 0.50, 0.60, 0.50),
    prevalence=(0.5, 0.5, 0.5, 0.5, 0.5),
    reply_sigma=0.8,
    prefill_tokens=110_000,
    other_sampled_tokens=16_000,
    context_tokens=8_000,
    sandbox_seconds=480.0,
    attempt_seconds=600.0,
    statement_tokens=3_000,
    example_prompt_tokens=7_000,
    teacher_input_factor=2.2,
    example_completion_median=2_700,
    example_completion_sigma=0.5,
    generate_seconds=240.0,
    check_seconds=3.0,
    examples_scale=600.0,
    incorrect_penalty=1.5,
    teacher_accuracy=MappingProxyType({"claude-opus-5": 0.72, "gpt-6-astra": 0.68, "deepseek-v4.1-flash": 0.52}),
)

TERMINAL = Domain(
    name="terminal tasks (agentic)",
    agentic=True,
    difficulty_sd=2.0,
    exposure=(0.25, 0.30, 0.35, 0.25, 0.15),
    severity=(0.60, 0.50, 0.60, 0.50, 0.40),
    prevalence=(0.5, 0.5, 0.5, 0.5, 0.5),
    reply_sigma=0.8,
    prefill_tokens=90_000,
    other_sampled_tokens=13_000,
    context_tokens=8_000,
    sandbox_seconds=600.0,
    attempt_seconds=600.0,
    statement_tokens=1_500,
    example_prompt_tokens=6_000,
    teacher_input_factor=2.0,
    example_completion_median=2_500,
    example_completion_sigma=0.5,
    generate_seconds=240.0,
    check_seconds=3.0,
    examples_scale=700.0,
    incorrect_penalty=1.5,
    teacher_accuracy=MappingProxyType({"claude-opus-5": 0.48, "gpt-6-astra": 0.52, "deepseek-v4.1-flash": 0.30}),
)

MATH = Domain(
    name="competition math (long single answer)",
    agentic=False,
    difficulty_sd=2.0,
    exposure=(0.60, 0.12, 0.0, 0.0, 0.0),
    severity=(0.90, 0.30, 0.0, 0.0, 0.0),
    prevalence=(0.4, 0.5, 0.0, 0.0, 0.0),
    reply_sigma=0.7,
    prefill_tokens=8_000,
    other_sampled_tokens=1_500,
    context_tokens=3_000,
    sandbox_seconds=60.0,
    attempt_seconds=240.0,
    statement_tokens=200,
    example_prompt_tokens=300,
    teacher_input_factor=1.0,
    example_completion_median=4_000,
    example_completion_sigma=0.5,
    generate_seconds=90.0,
    check_seconds=1.0,
    examples_scale=400.0,
    incorrect_penalty=4.0,
    teacher_accuracy=MappingProxyType({"claude-opus-5": 0.93, "gpt-6-astra": 0.96, "deepseek-v4.1-flash": 0.82}),
)

SCIENCE_QA = Domain(
    name="science multiple choice",
    agentic=False,
    difficulty_sd=1.5,
    exposure=(0.06, 0.05, 0.0, 0.0, 0.0),
    severity=(0.50, 0.20, 0.0, 0.0, 0.0),
    prevalence=(0.5, 0.5, 0.0, 0.0, 0.0),
    reply_sigma=0.6,
    prefill_tokens=1_500,
    other_sampled_tokens=300,
    context_tokens=1_500,
    sandbox_seconds=20.0,
    attempt_seconds=90.0,
    statement_tokens=400,
    example_prompt_tokens=400,
    teacher_input_factor=1.0,
    example_completion_median=1_500,
    example_completion_sigma=0.5,
    generate_seconds=40.0,
    check_seconds=1.0,
    examples_scale=500.0,
    incorrect_penalty=4.5,
    teacher_accuracy=MappingProxyType({"claude-opus-5": 0.87, "gpt-6-astra": 0.85, "deepseek-v4.1-flash": 0.70}),
)

SKILL_USE = Domain(
    name="tool and skill use (agentic)",
    agentic=True,
    difficulty_sd=2.0,
    exposure=(0.70, 0.80, 0.70, 0.60, 0.70),
    severity=(0.50, 0.50, 0.50, 0.50, 0.50),
    prevalence=(0.5, 0.5, 0.5, 0.5, 0.5),
    reply_sigma=0.8,
    prefill_tokens=100_000,
    other_sampled_tokens=14_000,
    context_tokens=8_000,
    sandbox_seconds=600.0,
    attempt_seconds=480.0,
    statement_tokens=1_500,
    example_prompt_tokens=6_000,
    teacher_input_factor=2.0,
    example_completion_median=2_500,
    example_completion_sigma=0.5,
    generate_seconds=180.0,
    check_seconds=2.0,
    examples_scale=400.0,
    incorrect_penalty=1.5,
    teacher_accuracy=MappingProxyType({"claude-opus-5": 0.42, "gpt-6-astra": 0.40, "deepseek-v4.1-flash": 0.22}),
)

BENCHMARKS: Mapping[str, Benchmark] = MappingProxyType(
    {
        b.id: b
        for b in (
            Benchmark("swe-bench-verified", "SWE-bench Verified", CODE_FIXING, 100, 0.1767),
            Benchmark("terminal-bench-2", "Terminal-Bench 2.0", TERMINAL, 89, 0.1049),
            Benchmark("aime", "AIME 2024/2025", MATH, 60, 0.3167),
            Benchmark("gpqa-diamond", "GPQA Diamond", SCIENCE_QA, 100, 0.5133),
            Benchmark("skillsbench", "SkillsBench", SKILL_USE, 37, 0.0165),
        )
    }
)
"""Benchmarks by id."""
