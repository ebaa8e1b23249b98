"""The minimal harness's files: ``harness.toml`` (settings, every remedy off), ``prompt.md`` (system
prompt), ``agent.py`` (the control loop, stdlib only) and ``llm.py`` (stdlib OpenAI-compatible client).

>>> sorted(minimal_harness())
['agent.py', 'harness.toml', 'llm.py', 'prompt.md']
>>> 'persistent = false' in minimal_harness()["harness.toml"]
True
"""

from __future__ import annotations

from pathlib import Path

from ....catalog import REMEDIES as CATALOG_REMEDIES

HARNESS_DIR = Path(__file__).resolve().parent
FILES = ("agent.py", "harness.toml", "llm.py", "prompt.md")
REMEDIES: dict[str, tuple[str, str, str]] = {r.key: (r.section, r.minimal, r.fixed) for r in CATALOG_REMEDIES}
"""harness.toml key: (section, minimal value, fixed value) as TOML text (``catalog.REMEDIES``)."""


def minimal_harness() -> dict[str, str]:
    """File name → content of the minimal harness."""
    return {name: (HARNESS_DIR / name).read_text() for name in FILES}


def with_remedies(files: dict[str, str], remedies: list[str] | tuple[str, ...]) -> dict[str, str]:
    """A copy of ``files`` whose ``harness.toml`` switches the given remedies on.

    >>> "detect = true" in with_remedies(minimal_harness(), ["detect"])["harness.toml"]
    True
    """
    toml = files["harness.toml"]
    for key in remedies:
        _, old, new = REMEDIES[key]
        line = f"{key} = {old}"
        if line not in toml:
            raise ValueError(f"harness.toml has no line {line!r}")
        toml = toml.replace(line, f"{key} = {new}", 1)
    return {**files, "harness.toml": toml}


__all__ = ["FILES", "HARNESS_DIR", "REMEDIES", "minimal_harness", "with_remedies"]
