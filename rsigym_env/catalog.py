"""The one catalog of names the worlds, the researchers and the tools share.

Benchmark ids (per world), teacher names (per world), the harness failure modes and the remedy
that removes each one, and the Gymnasium env id of each track. Everything else imports these;
the per-benchmark and per-teacher *numbers* stay with the world that models them
(``worlds/sim/benchmarks.py``, ``worlds/remote/config.py``, ``worlds/local/teachers.py``,
``prices.py``), and ``tests/test_catalog.py`` checks that their keys are the catalog's.

This module imports nothing from the package (every other module may import it).

>>> BENCHMARKS[:2], LOCAL_BENCHMARKS["aime"]
(('swe-bench-verified', 'terminal-bench-2'), 'local-math')
>>> TEACHERS["local"]
('teacher-large', 'teacher-small')
>>> r = REMEDY_FOR["truncated_output"]
>>> f"[{r.section}] {r.key} = {r.minimal}  ->  {r.key} = {r.fixed}"
'[generation] on_truncation = "stop"  ->  on_truncation = "continue"'
>>> env_id("harness"), track_of("RSIGym/Data-v0")
('RSIGym/Harness-v0', 'data')
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

# --------------------------------------------------------------------------------------------
# Benchmarks

BENCHMARKS: tuple[str, ...] = ("swe-bench-verified", "terminal-bench-2", "aime", "gpqa-diamond", "skillsbench")
"""The paper's five benchmarks, in the paper's order: the ids of the sim and remote worlds (and the
paper id of each local benchmark)."""

LOCAL_BENCHMARKS: Mapping[str, str] = MappingProxyType({
    "swe-bench-verified": "local-code",
    "terminal-bench-2": "local-terminal",
    "aime": "local-math",
    "gpqa-diamond": "local-science",
    "skillsbench": "local-skills",
})
"""Paper id → the local world's stand-in benchmark (the local world accepts either name)."""

BENCHMARKS_BY_WORLD: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "sim": BENCHMARKS,
    "remote": BENCHMARKS,
    "local": tuple(LOCAL_BENCHMARKS[b] for b in BENCHMARKS),
})
"""Each world's own benchmark ids (the local world also takes the paper ids)."""

# --------------------------------------------------------------------------------------------
# Teachers

TEACHERS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "sim": ("claude-opus-5", "gpt-6-astra", "deepseek-v4.1-flash"),
    "remote": ("claude-opus-5", "gpt-6-astra", "deepseek-v4.1-flash"),
    "local": ("teacher-large", "teacher-small"),
})
"""The teachers of each world, in the order the scenarios list them (the remote world's are the
ones its default scenario prices; a scenario may name others)."""

SIM_TEACHERS: tuple[str, ...] = TEACHERS["sim"]
"""The sim world's teachers (also a scenario's default ``permissions.teachers``)."""

# --------------------------------------------------------------------------------------------
# Harness failure modes and their remedies


@dataclass(frozen=True)
class Remedy:
    """The ``harness.toml`` setting that removes one failure mode: ``[section] key = minimal`` in
    the minimal harness, ``key = fixed`` once fixed (values as TOML text)."""

    failure: str
    section: str
    key: str
    minimal: str
    fixed: str


REMEDIES: tuple[Remedy, ...] = (
    Remedy("truncated_output", "generation", "on_truncation", '"stop"', '"continue"'),
    Remedy("unverified_completion", "completion", "verify_before_submit", "false", "true"),
    Remedy("lost_shell_state", "shell", "persistent", "false", "true"),
    Remedy("action_loop", "loop", "detect", "false", "true"),
    Remedy("unchecked_edit", "edits", "check", "false", "true"),
    Remedy("missing_skill", "skills", "load_skills", "false", "true"),  # the local world's harness only
)
"""Every remedy, in the order of :data:`DEFECTS` (then the local world's ``missing_skill``)."""

REMEDY_FOR: Mapping[str, Remedy] = MappingProxyType({r.failure: r for r in REMEDIES})
"""Failure mode → its remedy."""

DEFECTS: tuple[str, ...] = tuple(r.failure for r in REMEDIES[:5])
"""The harness defects every world models, in the order used by every per-defect vector."""

WRONG_ANSWER = "wrong_answer"
HARNESS_ERROR = "harness_error"
FAILURE_MODES: tuple[str, ...] = (*DEFECTS, WRONG_ANSWER, HARNESS_ERROR)
"""The failure labels of an evaluation attempt (the sim world's; the local world adds ``missing_skill``)."""

# --------------------------------------------------------------------------------------------
# Tracks

TRACK_ENV_IDS: Mapping[str, str] = MappingProxyType({
    "joint": "RSIGym/Joint-v0",
    "data": "RSIGym/Data-v0",
    "harness": "RSIGym/Harness-v0",
})
"""Track → the Gymnasium id it is registered under."""

TRACKS: tuple[str, ...] = tuple(TRACK_ENV_IDS)
ENV_IDS: tuple[str, ...] = tuple(TRACK_ENV_IDS.values())


def env_id(track: str) -> str:
    """The Gymnasium id of a track (``ValueError`` for an unknown one)."""
    try:
        return TRACK_ENV_IDS[track]
    except KeyError:
        raise ValueError(f"unknown track {track!r}; tracks: {', '.join(TRACKS)}") from None


def track_of(env_id_: str) -> str:
    """The track of a Gymnasium id (``ValueError`` for an id that is not RSIGym's)."""
    for track, known in TRACK_ENV_IDS.items():
        if known == env_id_:
            return track
    raise ValueError(f"unknown env id {env_id_!r}; ids: {', '.join(ENV_IDS)}")


__all__ = [
    "BENCHMARKS", "BENCHMARKS_BY_WORLD", "DEFECTS", "ENV_IDS", "FAILURE_MODES", "HARNESS_ERROR", "LOCAL_BENCHMARKS",
    "REMEDIES", "REMEDY_FOR", "Remedy", "SIM_TEACHERS", "TEACHERS", "TRACKS", "TRACK_ENV_IDS", "WRONG_ANSWER",
    "env_id", "track_of",
]
