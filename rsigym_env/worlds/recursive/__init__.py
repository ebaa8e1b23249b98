"""Recursion: the target system is a researcher, and the researcher that improves it is one too.

The package, by job:

* :mod:`.world` - the recursive world (``world: recursive``) and its :class:`RecursiveOptions`; the
  world registry (:mod:`rsigym_env.worlds`) builds it like the sim, local and remote worlds.
* :mod:`.measure` - tasks, splits and the inner episodes that measure a researcher spec, each billed
  to a sub-key of the outer run's key carved out of the evaluation's reservation.
* :mod:`.improver` - the scripted improver, the step that produces an improved researcher.
* :mod:`.rounds` - :func:`recurse`, rounds of improvement (``rsigym recurse``).
* :mod:`.report` - the rounds' Markdown and JSON report.

**Layering.** Worlds sit below researchers: nothing under :mod:`rsigym_env.worlds` imports
:mod:`rsigym_env.agents`, :mod:`rsigym_env.baselines`, :mod:`rsigym_env.sweep` or
:mod:`rsigym_env.env` when it is imported, so importing any world never pulls in the researchers
(``tests/test_layering.py`` checks it). The recursive world does need them - it parses researcher
specs and runs inner episodes with a researcher - so it imports them inside the functions that do
that, when a recursive episode actually runs; the scripted improver is a researcher and is built by
:func:`rsigym_env.agents.build_researcher`, which imports it.

>>> opts = RecursiveOptions(dev_benchmarks=["aime"], official_benchmarks=["aime"], official_seeds=2)
>>> from rsigym_env.agents import builtin_spec
>>> m = measure(builtin_spec("scripted"), opts, "official", k=1)
>>> len(m.records), m.index == sum(r.reward for r in m.records) / 2
(2, True)
"""

from .improver import SEARCH, ImproverArgs, ScriptedAgent, ScriptedImprover
from .measure import ALL_BENCHMARKS, DEV_SEED_BASE, MAX_K, Measurement, measure, split_tasks
from .report import markdown, to_json
from .rounds import recurse
from .world import RecursiveEvaluation, RecursiveOptions, RecursiveWorld, make_recursive_world

__all__ = [
    "ALL_BENCHMARKS", "DEV_SEED_BASE", "MAX_K", "SEARCH", "ImproverArgs", "Measurement", "RecursiveEvaluation",
    "RecursiveOptions", "RecursiveWorld", "ScriptedAgent", "ScriptedImprover", "make_recursive_world", "markdown",
    "measure", "recurse", "split_tasks", "to_json",
]
