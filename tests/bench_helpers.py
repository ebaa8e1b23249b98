"""Loading a bench script (``bench/<name>.py``) as a module, for the tests of its code and doctests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as module ``name`` (registered in ``sys.modules`` once).

    >>> load_bench("bench_blind_recipes").__name__
    'bench_blind_recipes'
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
