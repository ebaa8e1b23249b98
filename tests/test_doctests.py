"""Every docstring example in the package runs (they are the documentation's promises)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import rsigym_env

# wrappers/ and baselines/ live at the repo's top level and install as rsigym_env.wrappers / .baselines
MAPPED = ["rsigym_env.baselines", "rsigym_env.baselines.random_researcher", "rsigym_env.baselines.scripted_researcher"]
MODULES = sorted(
    m.name for m in pkgutil.walk_packages(rsigym_env.__path__, "rsigym_env.") if not m.name.endswith(".cli")
) + ["rsigym_env", *MAPPED]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
