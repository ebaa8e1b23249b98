"""Layering: worlds sit below the researchers (see the docstring of ``rsigym_env.worlds``).

Importing a world must not import the researcher registry, the baselines, the sweep machinery or the
env, and no world module imports them at all, not even inside a function: the recursive world, which
runs inner episodes with researchers, is handed them (``rsigym_env.worlds.recursive.ports``).
(``lint-imports`` checks the same rules as contracts over the whole import graph.)
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rsigym_env.worlds

FORBIDDEN = ("rsigym_env.agents", "rsigym_env.baselines", "baselines", "rsigym_env.wrappers", "wrappers",
             "rsigym_env.sweep", "rsigym_env.env")
WORLDS_DIR = Path(rsigym_env.worlds.__file__).parent


def _imported_after(module: str) -> list[str]:
    """Forbidden modules in ``sys.modules`` after importing ``module`` in a fresh interpreter (beyond
    what importing the ``rsigym_env`` package itself brings)."""
    code = (
        "import json, sys, rsigym_env\n"
        "before = set(sys.modules)\n"
        f"import {module}\n"
        f"print(json.dumps(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('rsigym_env', 'baselines'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    new = json.loads(out.stdout.strip().splitlines()[-1])
    return [m for m in new if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


@pytest.mark.parametrize("module", ["rsigym_env.worlds", "rsigym_env.worlds.sim", "rsigym_env.worlds.local",
                                    "rsigym_env.worlds.recursive"])
def test_importing_a_world_does_not_import_the_researchers(module):
    assert _imported_after(module) == []


def test_the_recursive_world_is_handed_the_researchers():
    from rsigym_env.researchers import Researchers
    from rsigym_env.worlds.recursive import RecursiveOptions, RecursiveWorld, researchers

    assert isinstance(researchers(), Researchers)                 # installed by ``import rsigym_env``
    handed = Researchers()
    world = RecursiveWorld(RecursiveOptions(dev_benchmarks=["aime"]), seed=0, using=handed)
    assert world.researchers is handed and world.target.kind == "scripted"


def test_the_package_itself_does_not_import_the_researchers():
    code = "import json, sys, rsigym_env; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "rsigym_env.agents" not in loaded and "rsigym_env.baselines" not in loaded


def _imports(tree: ast.Module) -> list[ast.ImportFrom | ast.Import]:
    """Every import statement of a module: top level, inside functions, under ``if TYPE_CHECKING:``."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _absolute(path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = ["rsigym_env", *path.relative_to(WORLDS_DIR.parent).parent.parts]
    if node.level:
        base = package[: len(package) - node.level + 1]
        name = ".".join(base + ([node.module] if node.module else []))
        return [name] if node.module else [f"{name}.{alias.name}" for alias in node.names]
    return [node.module or ""]


def test_no_world_module_imports_the_researchers_even_lazily():
    offenders = []
    for path in sorted(WORLDS_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in _imports(tree):
            for name in _absolute(path, node):
                if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                    offenders.append(f"{path.relative_to(WORLDS_DIR.parent.parent)}:{node.lineno} imports {name}")
    assert offenders == []
