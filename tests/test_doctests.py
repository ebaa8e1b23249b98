"""Every docstring example in the package runs (they are the documentation's promises)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import rsigym_env

import rsigym_env.baselines
import rsigym_env.wrappers

# wrappers/ and baselines/ live at the repo's top level and install as rsigym_env.wrappers / .baselines,
# so they are walked on their own paths too.
PACKAGES = [rsigym_env, rsigym_env.baselines, rsigym_env.wrappers]
MODULES = sorted({
    m.name
    for package in PACKAGES
    for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    if not m.name.endswith(".cli")
} | {p.__name__ for p in PACKAGES})


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
