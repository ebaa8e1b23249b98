"""Recursion: the target system is a researcher, and the researcher that improves it is one too.

The package, by job:

* :mod:`.world` - the recursive world (``world: recursive``) and its :class:`RecursiveOptions`; the
  world registry (:mod:`rsigym_env.worlds`) builds it like the sim, local and remote worlds.
* :mod:`.measure` - tasks, splits and the inner episodes that measure a researcher spec, each billed
  to a sub-key of the outer run's key carved out of the evaluation's reservation.
* :mod:`.improver` - the scripted improver, the step that produces an improved researcher.
* :mod:`.rounds` - :func:`recurse`, rounds of archive-based improvement with train / validation / test
  splits, paired acceptance, imp@k and transfer (``rsigym recurse``).
* :mod:`.report` - the rounds' Markdown and JSON report and their plot.
* :mod:`.ports` - what the world is handed from the researcher layer (:class:`Researchers`), and how an
  outside agent plays a round's outer episode (:class:`EpisodePlayer`).

**Layering.** Worlds sit below the researchers: nothing under :mod:`rsigym_env.worlds` imports
:mod:`rsigym_env.agents`, :mod:`rsigym_env.sweep` or :mod:`rsigym_env.env`, not even inside a
function (``lint-imports``, and ``tests/test_layering.py`` checks that importing a world loads none
of them). What the recursive world needs from above - parsing researcher specs, building
researchers, running inner episodes, the agent registry - it is handed as a
:class:`~.ports.Researchers` (:mod:`.ports`), which ``import rsigym_env`` installs
(:class:`rsigym_env.researchers.Researchers`). The scripted improver speaks only the tool protocol;
:class:`rsigym_env.agents.ScriptedAgent` builds it.

>>> opts = RecursiveOptions(dev_benchmarks=["aime"], official_benchmarks=["aime"], official_seeds=2)
>>> from rsigym_env.agents import builtin_spec
>>> m = measure(builtin_spec("scripted"), opts, "official", k=1)
>>> len(m.records), m.index == sum(r.reward for r in m.records) / 2
(2, True)
"""

from .improver import SEARCH, ImproverArgs, ScriptedImprover
from .ports import EpisodePlayer, OuterEpisode, Researchers, is_player, researchers, use_researchers
from .measure import ALL_BENCHMARKS, DEV_SEED_BASE, MAX_K, Measurement, measure, split_tasks
from .report import markdown, plot, to_json
from .rounds import Settings, improve_once, recurse
from .world import RecursiveEvaluation, RecursiveOptions, RecursiveWorld, make_recursive_world

__all__ = [
    "ALL_BENCHMARKS", "DEV_SEED_BASE", "EpisodePlayer", "MAX_K", "SEARCH", "ImproverArgs", "Measurement",
    "OuterEpisode", "RecursiveEvaluation", "RecursiveOptions", "RecursiveWorld", "Researchers", "ScriptedImprover", "Settings", "improve_once",
    "is_player", "make_recursive_world", "markdown", "measure", "plot", "recurse", "researchers", "split_tasks", "to_json",
    "use_researchers",
]
