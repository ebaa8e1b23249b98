"""``rsigym archive list | show | tree | diff | summary`` on a temporary archive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsigym_env.agents import AgentSpec
from rsigym_env.archive import Archive
from rsigym_env.cli import main


@pytest.fixture
def archive(tmp_path: Path) -> tuple[Path, list[AgentSpec]]:
    """root -> a (accepted) -> a1; root -> b (rejected); scores on train, validation and test."""
    archive = Archive(tmp_path / "archives", name="exp")
    root = AgentSpec(kind="scripted", params={"k": 3, "data_fraction": 0.4})
    a = root.derive(params={"data_fraction": 0.6})
    b = root.derive(params={"k": 5})
    a1 = a.derive(skills={"plan": "Buy data [first].\n"})
    made = {"improver": "ag-00000000000000aa", "round": 1, "operator": "raise data_fraction"}
    for s, parent, gen in ((root, None, 0), (a, root, 1), (b, root, 1), (a1, a, 2)):
        archive.add(s.to_files(), s.id, parent=parent.id if parent else None, generation=gen, chain=0, produced_by=made)
    for s, v in ((root, 0.34), (a, 0.36), (b, 0.30), (a1, 0.37)):
        archive.record(s.id, "train", [v, v + 0.02], cost_usd=10.0)
        archive.record(s.id, "validation", [v - 0.01, v + 0.01], cost_usd=5.0)
    archive.record(a.id, "test", [0.355])
    archive.set_status(a.id, "accepted", note="beats its parent on validation")
    archive.set_status(b.id, "rejected")
    return tmp_path / "archives", [root, a, b, a1]


def where(root: Path) -> list[str]:
    return ["--root", str(root), "--archive", "exp"]


def test_list_shows_every_node_with_its_scores(archive, capsys):
    root_dir, (root, a, b, a1) = archive
    assert main(["archive", "list", *where(root_dir)]) == 0
    out = capsys.readouterr().out
    for s in (root, a, b, a1):
        assert s.id in out
    assert "accepted" in out and "rejected" in out and "0.3600 ± 0.0100" in out and "0.3550" in out
    assert "raise data_fraction" in out
    assert main(["archive", "list", *where(root_dir), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [root.id, a.id, b.id, a1.id] and "patch" not in rows[0]
    assert rows[1]["scores"]["validation"]["mean"] == pytest.approx(0.36) and rows[1]["cost_usd"] == 15.0


def test_show_prints_scores_and_the_patch_as_a_diff(archive, capsys):
    root_dir, (root, a, b, a1) = archive
    assert main(["archive", "show", a1.id[:8], *where(root_dir)]) == 0
    out = capsys.readouterr().out
    assert f"parent: {a.id}" in out and "generation: 2" in out and "validation" in out
    assert f"+++ {a1.id}/skills/plan.md" in out and "+Buy data [first]." in out  # not eaten as markup
    assert main(["archive", "show", a.id, *where(root_dir)]) == 0
    out = capsys.readouterr().out
    assert "-data_fraction = 0.4" in out and "+data_fraction = 0.6" in out and "beats its parent" in out
    assert main(["archive", "show", root.id, "--files", *where(root_dir)]) == 0
    assert "==> params.toml <==" in capsys.readouterr().out
    assert main(["archive", "show", a.id, "--json", *where(root_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "accepted"


def test_tree_diff_and_summary(archive, capsys):
    root_dir, (root, a, b, a1) = archive
    assert main(["archive", "tree", *where(root_dir)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    row = {s.id: next(i for i, line in enumerate(lines) if s.id in line) for s in (root, a, b, a1)}
    assert row[root.id] < row[a.id] < row[a1.id] < row[b.id]  # a's subtree before its sibling b
    indent = {k: len(lines[i]) - len(lines[i].lstrip(" │├└─")) for k, i in row.items()}
    assert indent[root.id] < indent[a.id] == indent[b.id] < indent[a1.id]
    assert "valid 0.360" in lines[row[a.id]] and "accepted" in lines[row[a.id]]
    assert main(["archive", "diff", root.id, a1.id[:9], *where(root_dir)]) == 0
    out = capsys.readouterr().out
    assert "+data_fraction = 0.6" in out and "--- /dev/null" in out and "+++ " in out
    assert main(["archive", "diff", a.id, a.id, *where(root_dir)]) == 0
    assert "have the same files" in capsys.readouterr().out
    assert main(["archive", "summary", *where(root_dir), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["nodes"], s["accepted"], s["generations"]) == (4, 1, 3) and s["best"]["id"] == a1.id
    assert main(["archive", "summary", *where(root_dir)]) == 0
    assert "distinct code forms" in capsys.readouterr().out


def test_errors_are_clear_and_exit_2(archive, capsys, tmp_path: Path):
    root_dir, (root, a, b, a1) = archive
    assert main(["archive", "list", "--root", str(root_dir), "--archive", "nope"]) == 2
    assert "no archive 'nope'" in capsys.readouterr().out
    assert main(["archive", "show", "ag-ffffffff", *where(root_dir)]) == 2
    assert "no nodes" in capsys.readouterr().out
    assert main(["archive", "show", "ag", *where(root_dir)]) == 2
    assert "at least 5" in capsys.readouterr().out
    assert main(["archive", "tree", "--split", "dev", *where(root_dir)]) == 2
    assert "unknown split" in capsys.readouterr().out
    assert main(["archive", "list", "--root", str(root_dir), "--archive", "../x"]) == 2
    assert "archive name" in capsys.readouterr().out
    # a tampered node: the chain is refused, naming it
    path = root_dir / "exp" / f"{a.id}.json"
    data = json.loads(path.read_text())
    data["patch"]["params.toml"]["hunks"][0][3] = ["data_fraction = 0.9\n"]
    path.write_text(json.dumps(data))
    assert main(["archive", "show", a1.id, *where(root_dir)]) == 2
    out = capsys.readouterr().out
    assert "error:" in out and a.id in out


def test_the_default_archive_lives_under_rsigym_home(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    s = AgentSpec(kind="scripted", params={"k": 2})
    Archive().add(s.to_files(), s.id, parent=None, generation=0)
    assert (tmp_path / "home" / "archives" / "default" / f"{s.id}.json").is_file()
    assert main(["archive", "list"]) == 0 and s.id in capsys.readouterr().out
