"""SKILL.md documents and the standalone client: generated from the tool models, so they cannot drift."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway_helpers import oldest_python
from rsigym_env.errors import ActionError
from rsigym_env.gateway import skills
from rsigym_env.gateway.cli import main as gateway_main
from rsigym_env.tools import TOOLS


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    head, _, _ = text[4:].partition("\n---\n")
    return yaml.safe_load(head)


def test_the_shipped_skill_documents_are_exactly_what_the_models_render():
    problems = skills.check_skills(skills.SHIPPED)
    assert problems == [], ("the shipped skills differ from the tool models; regenerate them with "
                            "`rsigym skills --out rsigym_env/gateway/skill_docs`: " + "; ".join(problems))


def test_every_skill_has_valid_front_matter_and_documents_every_argument_of_its_tool():
    docs = skills.render_skills()
    assert set(docs) == {"rsigym/SKILL.md", skills.CLIENT_PATH} | {f"{skills.skill_name(c.name)}/SKILL.md" for c in TOOLS}
    for rel, text in docs.items():
        if not rel.endswith("SKILL.md"):
            continue
        meta = front_matter(text)
        assert set(meta) == {"name", "description"} and meta["name"] == rel.split("/")[0]
        assert meta["name"].replace("-", "").isalnum() and meta["name"] == meta["name"].lower() and len(meta["name"]) <= 64
        assert 0 < len(meta["description"]) <= 1024 and "\n" not in meta["description"]
    for cls in TOOLS:
        text = docs[f"{skills.skill_name(cls.name)}/SKILL.md"]
        rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
        for name, field in cls.model_fields.items():
            row = rows[f"`{name}`"]
            assert ("required" in row) == field.is_required(), row
            if not field.is_required():
                assert f"default `{json.dumps(field.default)}`" in row
            for meta in field.metadata:
                for attr, sign in (("ge", "≥"), ("le", "≤"), ("gt", ">"), ("lt", "<")):
                    bound = getattr(meta, attr, None)
                    if bound is not None:
                        assert f"{sign} {bound:,}" in row if isinstance(bound, int) else f"{sign} {bound}" in row, row
                if getattr(meta, "max_length", None) and "array" not in row:
                    assert f"at most {meta.max_length:,} characters" in row
        assert f'"$RSIGYM_URL/v1/tools/{cls.name}"' in text and "$RSIGYM_RUN_KEY" in text
        assert f"rsigym-call {cls.name}" in text and "## Cost" in text
        assert ("Paid:" in text) == cls.paid
    overview = docs["rsigym/SKILL.md"]
    for code in ("insufficient_budget", "forbidden_tool", "unauthorized", "episode_over", "run_closed"):
        assert f"`{code}`" in overview


def test_the_drift_check_names_every_changed_missing_or_stale_file(tmp_path: Path):
    skills.write_skills(tmp_path)
    assert skills.check_skills(tmp_path) == []
    (tmp_path / "rsigym-train" / "SKILL.md").write_text("edited by hand\n")
    (tmp_path / "rsigym-wait" / "SKILL.md").unlink()
    (tmp_path / "rsigym-fly").mkdir()
    (tmp_path / "rsigym-fly" / "SKILL.md").write_text("a tool that no longer exists\n")
    assert skills.check_skills(tmp_path) == ["rsigym-train/SKILL.md: differs", "rsigym-wait/SKILL.md: missing",
                                             "rsigym-fly/SKILL.md: not generated (stale?)"]
    assert gateway_main(["skills", "--check", str(tmp_path)]) == 1
    assert gateway_main(["skills", "--out", str(tmp_path)]) == 0
    shutil.rmtree(tmp_path / "rsigym-fly")
    assert gateway_main(["skills", "--check", str(tmp_path)]) == 0


def test_an_example_that_no_longer_fits_its_tool_cannot_be_rendered(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(skills.EXAMPLES, "evaluate", {"k": 99})
    with pytest.raises(ActionError, match="evaluate: k"):
        skills.render_skills()
    monkeypatch.setitem(skills.EXAMPLES, "evaluate", {"checkpoint": "it's"})
    with pytest.raises(ValueError, match="single quote"):
        skills.render_skills()


def test_the_standalone_client_is_the_package_client_and_runs_on_python_3_8_without_packages(tmp_path: Path):
    skills.write_skills(tmp_path)
    client = tmp_path / skills.CLIENT_PATH
    source = client.read_text()
    assert source == (Path(skills.__file__).with_name("client.py")).read_text()
    assert os.access(client, os.X_OK) and source.startswith("#!/usr/bin/env python3\n")
    ast.parse(source, feature_version=(3, 8))
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import)}
    imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
    python = oldest_python()
    done = subprocess.run([python, "-I", "-S", str(client), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "rsigym-call TOOL" in done.stdout
    done = subprocess.run([python, "-I", "-S", str(client), "read", "ref=x"], capture_output=True, text=True,
                          timeout=60, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 2 and "RSIGYM_URL" in done.stderr
