"""The dashboard's lineage pages over HTTP: the archives list, an archive's score by generation and
tree, a node's evaluations and diff; admin only (a run key is refused, no token is 401)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from rsigym_env.agents import AgentSpec
from rsigym_env.archive import Archive
from rsigym_env.serving.asgi import ThreadedASGIServer
from rsigym_env.watch.app import create_app

TOKEN = "rsw_watch-archive-test-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
get = functools.partial(httpx.get, headers=AUTH)


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[AgentSpec]]:
    """Archive ``exp``: root -> a (accepted) -> a1; root -> b (rejected); ``other``: a lone root."""
    root_dir = tmp_path_factory.mktemp("archives")
    archive = Archive(root_dir, name="exp")
    root = AgentSpec(kind="scripted", params={"k": 3, "data_fraction": 0.4})
    a = root.derive(params={"data_fraction": 0.6})
    b = root.derive(params={"k": 5})
    a1 = a.derive(skills={"plan": "Buy <data> first & then train.\n"})
    for s, parent, gen, v in ((root, None, 0, 0.34), (a, root, 1, 0.36), (b, root, 1, 0.30), (a1, a, 2, 0.38)):
        archive.add(s.to_files(), s.id, parent=parent.id if parent else None, generation=gen, chain=0,
                    produced_by={"improver": "ag-00000000000000aa", "round": gen, "operator": f"edit {gen}"})
        archive.record(s.id, "train", [v, v + 0.02], cost_usd=10.0, tasks=["t1", "t2"])
        archive.record(s.id, "validation", [v - 0.01, v + 0.01], cost_usd=5.0)
    archive.record(a.id, "test", [0.355])
    archive.record(a.id, "transfer/aime", [0.2, 0.25])
    archive.set_status(a.id, "accepted")
    archive.set_status(b.id, "rejected", note="worse on validation")
    lone = AgentSpec(kind="scripted", params={"k": 9})
    Archive(root_dir, name="other").add(lone.to_files(), lone.id, parent=None, generation=0)
    return root_dir, [root, a, b, a1]


@pytest.fixture(scope="module")
def server(archives, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    runs = tmp_path_factory.mktemp("runs")
    app = create_app([runs], admin_token=TOKEN, poll_s=0.1, archives=archives[0])
    with ThreadedASGIServer(app, name="watch-archive", graceful_s=0.5) as srv:
        yield srv.url


def test_the_archives_page_lists_archives_and_is_linked_from_the_navigation(server: str, archives):
    _, (root, a, b, a1) = archives
    home = get(server + "/").text
    assert 'href="/archives">Lineage</a>' in home
    reply = get(server + "/archives")
    assert reply.status_code == 200 and "Content-Security-Policy" in reply.headers
    html = reply.text
    assert 'data-archive="exp"' in html and 'data-archive="other"' in html and 'href="/archives/exp"' in html
    assert f'href="/archives/exp/nodes/{a1.id}"' in html  # the best validation node
    data = get(server + "/api/archives").json()
    rows = {r["name"]: r for r in data["archives"]}
    assert rows["exp"]["nodes"] == 4 and rows["exp"]["accepted"] == 1 and rows["other"]["nodes"] == 1
    assert rows["exp"]["best"]["id"] == a1.id and rows["exp"]["cost_usd"] == 60.0


def test_an_archive_page_has_the_score_by_generation_the_tree_and_the_nodes(server: str, archives):
    _, (root, a, b, a1) = archives
    html = get(server + "/archives/exp").text
    svg = html[html.index("<svg"): html.index("</svg>")]
    assert len(re.findall(r'<circle class="node"', svg)) == 4 and "<polyline" in svg
    for s in (root, a, b, a1):
        assert f'href="/archives/exp/nodes/{s.id}"' in svg
    # the tree: root > (a > a1, b)
    tree = html[html.index('id="tree"'):]
    tree = tree[: tree.index("</section>")]
    positions = {s.id: tree.index(f'data-node="{s.id}"') for s in (root, a, b, a1)}
    assert positions[root.id] < positions[a.id] < positions[a1.id] < positions[b.id]
    assert tree.count("<ul>") == 3  # the roots, root's children, a's children
    table = html[html.index('id="nodes"'):]
    for s in (root, a, b, a1):
        assert f'data-node="{s.id}"' in table
    assert "transfer/aime" in table and ">accepted<" in table and ">rejected<" in table
    assert re.search(r"<td class=\"num\">2</td>\s*<td class=\"num\">1</td>\s*<td class=\"num\">0.380</td>", html)
    # another split: the chart and means on train
    train = get(server + "/archives/exp", params={"split": "train"}).text
    assert "train score by generation" in train and "0.390" in train
    view = get(server + "/api/archives/exp").json()
    assert [g["best"] for g in view["summary"]["by_generation"]] == pytest.approx([0.34, 0.36, 0.38])
    assert view["splits"] == ["train", "validation", "test", "transfer/aime"] and len(view["rows"]) == 4
    assert get(server + "/archives/exp", params={"split": "dev"}).status_code == 404
    assert get(server + "/api/archives/exp", params={"split": "dev"}).json()["error"] == "unknown_split"


def test_a_node_page_has_its_evaluations_and_its_diff_from_its_parent(server: str, archives):
    _, (root, a, b, a1) = archives
    reply = get(f"{server}/archives/exp/nodes/{a1.id[:8]}")  # a unique prefix
    assert reply.status_code == 200
    html = reply.text
    assert f'<h1>{a1.id} ' in html and f'href="/archives/exp/nodes/{a.id}"' in html
    lineage = html[html.index('id="lineage"'):]
    lineage = lineage[: lineage.index("</p>")]
    assert lineage.index(root.id) < lineage.index(a.id) < lineage.index(a1.id)
    assert 'class="dadd"' in html and "+Buy &lt;data&gt; first &amp; then train." in html  # escaped
    assert "skills/plan.md (new)" in html
    scores = html[html.index('id="scores"'):]
    assert 'data-split="train"' in scores and 'data-split="validation"' in scores and "t1: " in scores
    page_a = get(f"{server}/archives/exp/nodes/{a.id}").text
    assert "-data_fraction = 0.4" in page_a and "+data_fraction = 0.6" in page_a and 'data-split="transfer/aime"' in page_a
    assert f'href="/archives/exp/nodes/{a1.id}"' in page_a  # its child
    page_b = get(f"{server}/archives/exp/nodes/{b.id}").text
    assert "worse on validation" in page_b and ">rejected<" in page_b
    page_root = get(f"{server}/archives/exp/nodes/{root.id}").text
    assert "a root is stored whole" in page_root and "+k = 3" in page_root


def test_missing_tampered_and_unsafe_archives(server: str, archives, tmp_path: Path):
    root_dir, (root, a, b, a1) = archives
    for path in ("/archives/nope", "/archives/exp/nodes/ag-ffffffffffffffff", "/archives/exp/nodes/ag",
                 "/archives/..%2F..%2Fetc", "/archives/exp/nodes/..%2Fother"):
        assert get(server + path).status_code == 404, path
    assert get(server + "/api/archives/nope").status_code == 404
    # a tampered node: its page says the chain does not rebuild (and the archive page still renders)
    copy = Archive(root_dir, name="tampered")
    for node in Archive(root_dir, name="exp").nodes():
        (copy.dir).mkdir(parents=True, exist_ok=True)
        data = node.model_dump(mode="json")
        if node.id == a.id:
            data["patch"]["params.toml"]["hunks"][0][3] = ["data_fraction = 0.9\n"]
        (copy.dir / f"{node.id}.json").write_text(json.dumps(data))
    page = get(f"{server}/archives/tampered/nodes/{a1.id}").text
    assert 'id="rebuild-error"' in page and a.id in page
    assert get(f"{server}/archives/tampered").status_code == 200


def test_the_lineage_pages_need_the_admin_token(archives, tmp_path: Path):
    from rsigym_env.watch.auth import WatchAuth

    root_dir, _ = archives
    run_dir = tmp_path / "runs" / "mine"
    run_dir.mkdir(parents=True)
    auth = WatchAuth(TOKEN, run_for_key=lambda key: "mine" if key == "rsk_a-run-key-0123456789abcdef" else None,
                     runs_dir=tmp_path / "runs")
    app = create_app([tmp_path / "runs"], auth=auth, archives=root_dir)
    with ThreadedASGIServer(app, name="watch-archive-auth", graceful_s=0.5) as srv:
        for path in ("/archives", "/archives/exp", "/api/archives", "/api/archives/exp"):
            assert httpx.get(srv.url + path).status_code == 401, path
            reply = httpx.get(srv.url + path, headers={"Authorization": "Bearer rsk_a-run-key-0123456789abcdef"})
            assert reply.status_code == 403, (path, reply.status_code)
            assert "exp" not in reply.text.replace("/archives/exp", "") and "archive" in reply.text
            assert get(srv.url + path).status_code == 200, path
