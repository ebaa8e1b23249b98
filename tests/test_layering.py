"""Layering: worlds sit below the researchers (see the docstring of ``rsigym_env.worlds``).

Importing a world must not import the researcher registry, the baselines, the sweep machinery or the
env; the recursive world, which runs inner episodes with researchers, imports them only inside the
functions that run one.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rsigym_env.worlds

FORBIDDEN = ("rsigym_env.agents", "rsigym_env.baselines", "baselines", "rsigym_env.sweep", "rsigym_env.env")
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


def test_the_package_itself_does_not_import_the_researchers():
    code = "import json, sys, rsigym_env; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "rsigym_env.agents" not in loaded and "rsigym_env.baselines" not in loaded


def _module_level_imports(tree: ast.Module) -> list[ast.ImportFrom | ast.Import]:
    """Imports that run when the module is imported: top level and inside top-level ``if``/``try``
    (except ``if TYPE_CHECKING:``), not inside functions or classes' methods."""
    found: list[ast.ImportFrom | ast.Import] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                walk(node.orelse)
                walk(node.finalbody)
                for handler in node.handlers:
                    walk(handler.body)
            elif isinstance(node, ast.ClassDef):
                walk(node.body)

    walk(tree.body)
    return found


def _absolute(path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = ["rsigym_env", *path.relative_to(WORLDS_DIR.parent).parent.parts]
    if node.level:
        base = package[: len(package) - node.level + 1]
        name = ".".join(base + ([node.module] if node.module else []))
        return [name] if node.module else [f"{name}.{alias.name}" for alias in node.names]
    return [node.module or ""]


def test_no_world_module_imports_the_researchers_at_import_time():
    offenders = []
    for path in sorted(WORLDS_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in _module_level_imports(tree):
            for name in _absolute(path, node):
                if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                    offenders.append(f"{path.relative_to(WORLDS_DIR.parent.parent)}:{node.lineno} imports {name}")
    assert offenders == []
