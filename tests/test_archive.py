"""The archive of candidate researchers (``rsigym_env.archive``): patches that rebuild exactly and
refuse tampering, parent-selection rules, the novelty filter, concurrent writers, the summary."""

from __future__ import annotations

import json
import multiprocessing
import random
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from rsigym_env.agents import AgentSpec
from rsigym_env.archive import (Archive, ArchiveError, PatchError, Score, apply_patch, merge_files, dgm_weights, files_hash,
                                form_hash, list_archives, make_patch, novelty, population, select_parent, spec_id)

# ------------------------------------------------------------------------------------ helpers

names = st.from_regex(r"[a-z][a-z0-9_-]{0,6}", fullmatch=True)
line_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                    max_size=12)
endings = st.sampled_from(["\n", "\n", "\n", "\r\n", "\r", ""])
lines = st.lists(st.tuples(line_text, endings).map(lambda t: t[0] + t[1]), max_size=8)


def spec(k: int = 3, **kw) -> AgentSpec:
    return AgentSpec(kind="scripted", params={"k": k, **kw.pop("params", {})}, **kw)


def put(archive: Archive, s: AgentSpec, parent: AgentSpec | None = None, generation: int | None = None, **kw):
    gen = generation if generation is not None else (0 if parent is None else archive.get(parent.id).generation + 1)
    return archive.add(s.to_files(), s.id, parent=parent.id if parent else None, generation=gen, **kw)


@st.composite
def edit(draw, text: str) -> str:
    """A random line-level edit of ``text``: insert, delete or replace lines (line endings kept)."""
    out = text.splitlines(keepends=True)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["insert", "delete", "replace", "append"]))
        i = draw(st.integers(0, len(out)))
        if op == "insert":
            out[i:i] = draw(lines)
        elif op == "delete" and out:
            del out[min(i, len(out) - 1)]
        elif op == "replace" and out:
            out[min(i, len(out) - 1)] = draw(line_text) + draw(endings)
        else:
            out.append(draw(line_text))
    return "".join(out)


@st.composite
def mutate(draw, s: AgentSpec) -> AgentSpec:
    """A random child of ``s``: parameters, prompt, skills and memory edited, added or deleted."""
    data = s.model_dump()
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["param", "prompt", "skill", "add_skill", "del_skill", "memory"]))
        if what == "param":
            data["params"][draw(st.sampled_from(["k", "data_fraction", "probe_examples"]))] = draw(
                st.one_of(st.integers(1, 9), st.floats(0.05, 0.95, allow_nan=False)))
            data["params"]["k"] = int(data["params"].get("k", 3)) if isinstance(data["params"].get("k", 3), int) else 3
        elif what == "prompt":
            data["system_prompt"] = draw(edit(data["system_prompt"] or ""))
        elif what in ("skill", "add_skill") and (what == "add_skill" or not data["skills"]):
            data["skills"][draw(names)] = "".join(draw(lines))
        elif what == "skill":
            name = draw(st.sampled_from(sorted(data["skills"])))
            data["skills"][name] = draw(edit(data["skills"][name]))
        elif what == "del_skill" and data["skills"]:
            del data["skills"][draw(st.sampled_from(sorted(data["skills"])))]
        else:
            data["memory"][draw(names)] = "".join(draw(lines))
    data["parent"] = s.id
    return AgentSpec.model_validate(data)


@st.composite
def chains(draw) -> list[tuple[int | None, AgentSpec]]:
    """A tree of specs: (index of the parent or None, spec), each a random mutation of its parent."""
    root = spec(draw(st.integers(1, 5)), system_prompt="".join(draw(lines)) or None,
                skills={n: "".join(draw(lines)) for n in draw(st.lists(names, max_size=2, unique=True))})
    out: list[tuple[int | None, AgentSpec]] = [(None, root)]
    for _ in range(draw(st.integers(1, 7))):
        i = draw(st.integers(0, len(out) - 1))
        out.append((i, draw(mutate(out[i][1]))))
    return out


# ------------------------------------------------------------------------------------ patches


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, st.lists(st.tuples(line_text, endings).map("".join), max_size=6).map("".join), max_size=4),
       st.dictionaries(names, st.lists(st.tuples(line_text, endings).map("".join), max_size=6).map("".join), max_size=4))
def test_a_patch_takes_any_files_to_any_files_exactly(before: dict[str, str], after: dict[str, str]):
    assert apply_patch(before, make_patch(before, after)) == after
    assert make_patch(after, after) == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text("abc", min_size=1, max_size=3).map(lambda t: t + "\n"), min_size=2, max_size=12),
       st.data())
def test_a_merge_applies_both_sides_changes_to_separate_lines_and_refuses_clashes(lines: list[str], data):
    lines = [f"{i} {line}" for i, line in enumerate(lines)]  # distinct lines, as in code (a diff of repeats is ambiguous)
    n = len(lines)
    ours_at = set(data.draw(st.lists(st.integers(0, n - 1), max_size=3)))
    theirs_at = set(data.draw(st.lists(st.integers(0, n - 1), max_size=3))) - ours_at
    ours = [line if i not in ours_at else "ours " + line for i, line in enumerate(lines)]
    theirs = [line if i not in theirs_at else "theirs " + line for i, line in enumerate(lines)]
    both = [ours[i] if i in ours_at else theirs[i] for i in range(n)]
    base = {"f": "".join(lines), "same": "x\n"}
    merged = merge_files(base, {**base, "f": "".join(ours)}, {**base, "f": "".join(theirs), "new": "n"})
    assert merged == {"f": "".join(both), "same": "x\n", "new": "n"}      # every change of both, once
    assert merge_files(base, {**base, "f": "".join(ours)}, {**base, "f": "".join(ours)}) == {**base, "f": "".join(ours)}
    if ours_at:                                                            # the same line changed differently
        i = min(ours_at)
        clash = [line if j != i else "clash " + line for j, line in enumerate(lines)]
        assert merge_files(base, {**base, "f": "".join(ours)}, {**base, "f": "".join(clash)}) is None


@settings(max_examples=40, deadline=None)
@given(chains())
def test_any_chain_of_random_edits_rebuilds_exactly_with_its_ids_checked(tree):
    archive = Archive(tempfile.mkdtemp(prefix="archive-"), name="prop")
    added: dict[str, AgentSpec] = {}
    for parent, s in tree:
        if s.id in added:
            continue  # a mutation that came back to an archived spec: adding it again is a no-op
        parent_spec = tree[parent][1] if parent is not None else None
        node = put(archive, s, parent_spec)
        assert node.id == s.id and (node.parent == (parent_spec.id if parent_spec else None))
        added[s.id] = s
    assert len(archive) == len(added)
    for node_id, s in added.items():
        assert archive.rebuild(node_id) == s.to_files()
    assert {k: v for k, v in archive.rebuild_all().items()} == {k: s.to_files() for k, s in added.items()}
    # a node's patch holds only what changed from its parent
    for node in archive.nodes():
        if node.parent is not None:
            before, after = added[node.parent].to_files(), added[node.id].to_files()
            assert set(node.patch) == {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def test_the_identity_is_pluggable(tmp_path: Path):
    """The archive imports no researcher code: ids come from the installed identity (the spec's, by
    ``import rsigym_env``) or from the one it is given."""
    files = {"spec.json": "{}", "notes.md": "anything\n"}
    archive = Archive(tmp_path, name="plain", identify=lambda f: "ag-" + files_hash(f))
    node = archive.add(files, "ag-" + files_hash(files), parent=None, generation=0)
    assert archive.rebuild(node.id) == files
    assert Archive(tmp_path).identify is spec_id and spec_id(spec(2).to_files()) == spec(2).id


def test_adding_is_idempotent_and_checks_what_it_is_given(tmp_path: Path):
    archive = Archive(tmp_path, name="a")
    root, child = spec(3), spec(4)
    first = put(archive, root)
    assert put(archive, root).created == first.created and len(archive) == 1
    assert first.patch["params.toml"].op == "add" and first.generation == 0
    with pytest.raises(ValueError, match="hash to"):
        archive.add(root.to_files(), child.id, parent=None, generation=0)
    with pytest.raises(KeyError, match="not in archive"):
        archive.add(child.to_files(), child.id, parent=spec(9).id, generation=1)
    with pytest.raises(ValueError, match="must be greater"):
        archive.add(child.to_files(), child.id, parent=root.id, generation=0)
    with pytest.raises(ValueError, match="not a researcher spec"):
        archive.add({"spec.json": "{}"}, child.id, parent=None, generation=0)
    with pytest.raises(ArchiveError, match="unsafe file path"):
        archive.add({**child.to_files(), "../x": ""}, child.id, parent=None, generation=0)
    with pytest.raises(ValueError, match="archive name"):
        Archive(tmp_path, name="../escape")
    assert list_archives(tmp_path) == ["a"] and not Archive(tmp_path, name="empty").exists()


def _chain(archive: Archive, n: int = 4) -> list[AgentSpec]:
    specs = [spec(1, skills={"plan": "step one\nstep two\n"})]
    put(archive, specs[0])
    for i in range(1, n):
        s = specs[-1].derive(params={"k": i + 1}, skills={"plan": f"step one\nstep {i}\nstep two\n"})
        put(archive, s, specs[-1])
        specs.append(s)
    return specs


@pytest.mark.parametrize("tamper", ["hunk_text", "hunk_text_and_hash", "root_text", "delete_parent", "loop"])
def test_a_tampered_chain_is_refused(tmp_path: Path, tamper: str):
    archive = Archive(tmp_path, name="t")
    specs = _chain(archive)
    last = specs[-1].id
    assert archive.rebuild(last) == specs[-1].to_files()
    target = specs[2].id if tamper != "root_text" else specs[0].id
    path = archive.dir / f"{target}.json"
    data = json.loads(path.read_text())
    if tamper.startswith("hunk_text"):
        hunk = data["patch"]["skills/plan.md"]["hunks"][0]
        hunk[3] = ["step 42\n"]
        if tamper == "hunk_text_and_hash":  # consistent with itself: only the id check can tell
            from rsigym_env.archive import text_hash

            text = "step one\nstep 42\nstep two\n"
            data["patch"]["skills/plan.md"]["sha256"] = text_hash(text)
    elif tamper == "root_text":
        data["patch"]["params.toml"]["text"] = "k = 7\n"
    elif tamper == "delete_parent":
        (archive.dir / f"{specs[1].id}.json").unlink()
    else:
        data["parent"] = last
    path.write_text(json.dumps(data))
    with pytest.raises(ArchiveError) as info:
        archive.rebuild(last)
    message = str(info.value)
    assert (target in message or specs[1].id in message or "loop" in message), message
    with pytest.raises(ArchiveError):
        archive.rebuild_all()


def test_a_patch_refuses_files_it_was_not_made_for():
    patch = make_patch({"a": "1\n2\n3\n"}, {"a": "1\nX\n3\n"})
    with pytest.raises(PatchError, match="does not match"):
        apply_patch({"a": "1\nY\n3\n"}, patch)
    with pytest.raises(PatchError, match="does not exist"):
        apply_patch({}, patch)
    with pytest.raises(PatchError, match="exists"):
        apply_patch({"b": "x"}, make_patch({}, {"b": "y"}))
    with pytest.raises(PatchError, match="not the one"):
        apply_patch({"b": "other"}, make_patch({"b": "x"}, {}))
    with pytest.raises(ArchiveError, match="unsafe file path"):
        make_patch({}, {"/etc/passwd": "x"})


# ------------------------------------------------------------------------------------ records


def test_record_sets_mean_se_n_and_sums_cost(tmp_path: Path):
    archive = Archive(tmp_path)
    root = spec()
    put(archive, root)
    node = archive.record(root.id[:7], "train", [1.0, 0.0, 1.0, 1.0], cost_usd=2.5, tasks=["a", "b", "c", "d"])
    s = node.scores["train"]
    assert (s.mean, s.n, s.tasks) == (0.75, 4, ["a", "b", "c", "d"]) and s.se == pytest.approx(0.25)
    node = archive.record(root.id, "validation", [0.4], cost_usd=1.0)
    assert node.scores["validation"].se == 0.0 and node.cost_usd == 3.5 and set(node.scores) == {"train", "validation"}
    node = archive.record(root.id, "validation", [0.6], extend=True)
    assert node.scores["validation"].values == [0.4, 0.6] and node.scores["validation"].mean == pytest.approx(0.5)
    node = archive.record(root.id, "transfer/aime", [0.1, 0.3])
    assert archive.get(root.id).scores["transfer/aime"].mean == pytest.approx(0.2)
    for bad in ("dev", "transfer/", "transfer/a/b"):
        with pytest.raises(ValueError, match="unknown split"):
            archive.record(root.id, bad, [1.0])
    with pytest.raises(ValueError, match="finite"):
        archive.record(root.id, "test", [float("nan")])
    with pytest.raises(ValueError, match="cost_usd"):
        archive.record(root.id, "test", [1.0], cost_usd=-1)
    node = archive.set_status(root.id, "accepted", note="beats the baseline")
    assert node.status == "accepted" and node.notes == "beats the baseline"
    with pytest.raises(ValueError, match="status must be"):
        archive.set_status(root.id, "great")  # type: ignore[arg-type]
    assert Score.of([2.0]).se == 0.0


def test_ids_resolve_by_unique_prefix(tmp_path: Path):
    archive = Archive(tmp_path)
    a, b = spec(1), spec(2)
    put(archive, a)
    put(archive, b, a)
    assert archive.get(a.id[:6]).id == a.id
    with pytest.raises(KeyError, match="at least 5"):
        archive.get("ag-")
    with pytest.raises(KeyError, match="no nodes"):
        archive.get("ag-zzzz")
    common = next(i for i in range(3, 19) if a.id[:i] != b.id[:i])
    if common >= 5:
        with pytest.raises(KeyError, match="2 nodes"):
            archive.get(a.id[: common - 1])


def _record_many(root: str, node_id: str, split: str, n: int) -> None:
    archive = Archive(root, name="conc")
    for i in range(n):
        archive.record(node_id, split, [i / n], cost_usd=1.0)


def test_concurrent_writers_in_threads_and_processes_lose_nothing(tmp_path: Path):
    archive = Archive(tmp_path, name="conc")
    root = spec()
    put(archive, root)
    threads = [threading.Thread(target=_record_many, args=(str(tmp_path), root.id, split, 10))
               for split in ("train", "validation")]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), root.id, split, 10))
             for split in ("test", "transfer/aime")]
    for w in [*threads, *procs]:
        w.start()
    for t in threads:
        t.join(60)
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    node = archive.get(root.id)
    assert set(node.scores) == {"train", "validation", "test", "transfer/aime"} and node.cost_usd == 40.0
    assert not list(archive.dir.glob(".tmp-*"))
    # children added concurrently all land
    kids = [root.derive(params={"k": 10 + i}) for i in range(8)]
    workers = [threading.Thread(target=put, args=(archive, k, root)) for k in kids]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert {c.id for c in archive.children(root.id)} == {k.id for k in kids}


# ------------------------------------------------------------------------------------ the tree


def test_children_descendants_lineage_tree_and_summary(tmp_path: Path):
    archive = Archive(tmp_path)
    r = spec(1)
    a, b = r.derive(params={"k": 2}), r.derive(params={"k": 3})
    a1 = a.derive(params={"k": 4}, skills={"x": "new idea\n"})
    for s, p in ((r, None), (a, r), (b, r), (a1, a)):
        put(archive, s, p, chain=0, produced_by={"improver": "ag-0000000000000000", "round": 1, "operator": "k"})
    for s, v in ((r, 0.3), (a, 0.5), (b, 0.2), (a1, 0.6)):
        archive.record(s.id, "validation", [v, v], cost_usd=1.0)
    archive.set_status(a.id, "accepted")
    assert [n.id for n in archive.children(r.id)] == [a.id, b.id]
    assert [n.id for n in archive.descendants(r.id)] == [a.id, b.id, a1.id]
    assert [n.id for n in archive.lineage(a1.id)] == [r.id, a.id, a1.id]
    (top,) = archive.tree()
    assert top["id"] == r.id and [c["id"] for c in top["children"]] == [a.id, b.id]
    assert top["children"][0]["children"][0]["mean"] == 0.6
    s = archive.summary()
    assert (s["nodes"], s["accepted"], s["generations"], s["cost_usd"]) == (4, 1, 3, 4.0)
    assert [g["best"] for g in s["by_generation"]] == [0.3, 0.5, 0.6] and s["best"]["id"] == a1.id
    assert s["diversity"]["distinct_forms"] == 4 and 0 < s["diversity"]["mean_gene_distance"] < 1
    diff = archive.node_diff(a1.id)
    assert "+++ " + f"{a1.id}/skills/x.md" in diff and "-k = 2" in diff and "+k = 4" in diff
    assert archive.diff(a.id, a.id) == "" and "/dev/null" in archive.node_diff(r.id)


# ------------------------------------------------------------------------------------ selection


def _scored(archive: Archive, s: AgentSpec, parent: AgentSpec | None, values: list[float], status: str = "evaluated"):
    put(archive, s, parent)
    archive.record(s.id, "validation", values)
    if status != "evaluated":
        archive.set_status(s.id, status)  # type: ignore[arg-type]


def test_greedy_picks_the_best_and_only_eligible_nodes(tmp_path: Path):
    archive = Archive(tmp_path)
    r, a, b, c = spec(1), spec(2), spec(3), spec(4)
    _scored(archive, r, None, [0.2, 0.4])
    _scored(archive, a, r, [0.5, 0.7])
    _scored(archive, b, r, [0.9, 0.9], status="rejected")
    _scored(archive, c, r, [0.95, 0.95], status="duplicate")
    rng = random.Random(0)
    assert select_parent(archive, "greedy", rng).id == a.id
    assert select_parent(archive, "greedy", rng, statuses={"evaluated", "accepted", "rejected"}).id == b.id
    # a list of nodes (one chain's, say) instead of the archive
    assert select_parent([archive.get(r.id)], "greedy", rng).id == r.id
    assert select_parent(archive.nodes(), "sica", rng).id == a.id
    with pytest.raises(LookupError, match="no node"):
        select_parent(archive, "greedy", rng, split="test")
    with pytest.raises(ValueError, match="unknown selection rule"):
        select_parent(archive, "best-of", rng)


def test_dgm_weights_favour_high_scores_and_penalize_many_children(tmp_path: Path):
    archive = Archive(tmp_path)
    r = spec(1)
    _scored(archive, r, None, [0.3])
    high, low, busy = spec(2), spec(3), spec(4)
    _scored(archive, high, r, [0.7])
    _scored(archive, low, r, [0.4])
    _scored(archive, busy, r, [0.7])
    for i in range(3):  # busy has three children (rejected: they count as children, not as candidates)
        _scored(archive, spec(10 + i), busy, [0.1], status="rejected")
    pop = population(archive)
    w = dgm_weights(pop)
    assert w[high.id] > w[low.id] and w[high.id] == pytest.approx(4 * w[busy.id])
    assert sum(w.values()) == pytest.approx(1.0)
    rng = random.Random(1234)
    counts = Counter(select_parent(archive, "dgm", rng).id for _ in range(4000))
    for node_id, p in w.items():
        assert counts[node_id] / 4000 == pytest.approx(p, abs=0.03)
    assert counts[high.id] > counts[busy.id] and counts[high.id] > counts[low.id]
    median = dgm_weights(pop, midpoint="median")
    assert median[high.id] / median[low.id] > 1


def test_thompson_prefers_the_clade_with_good_descendants(tmp_path: Path):
    """A scores 0.7 but its children 0.1; B scores 0.5 and its children 0.8: the clade of B is more
    productive, so Thompson sampling picks B although greedy (and DGM, mostly) pick A."""
    archive = Archive(tmp_path)
    r, a, b = spec(1), spec(2), spec(3)
    _scored(archive, r, None, [0.4] * 10)
    _scored(archive, a, r, [0.7] * 10)
    _scored(archive, b, r, [0.5] * 10)
    for i in range(3):
        _scored(archive, spec(20 + i), a, [0.1] * 10, status="rejected")
        _scored(archive, spec(30 + i), b, [0.8] * 10, status="rejected")
    rng = random.Random(7)
    counts = Counter(select_parent(archive, "thompson", rng).id for _ in range(300))
    assert counts[b.id] > 0.9 * 300 and counts[a.id] < 0.05 * 300
    assert select_parent(archive, "greedy", rng).id == a.id
    # unbounded results (e.g. gains): a normal posterior, the same preference
    archive2 = Archive(tmp_path, name="gains")
    for s, p, v in ((r, None, 0.0), (a, r, 3.0), (b, r, 1.0)):
        _scored(archive2, s, p, [v - 0.5, v + 0.5] * 5)
    for i in range(3):
        _scored(archive2, spec(20 + i), a, [-5.0, -4.0] * 5, status="rejected")
        _scored(archive2, spec(30 + i), b, [4.0, 5.0] * 5, status="rejected")
    counts = Counter(select_parent(archive2, "thompson", rng).id for _ in range(200))
    assert counts.most_common(1)[0][0] == b.id


def test_sica_takes_the_newest_node_within_the_best_ones_bound(tmp_path: Path):
    archive = Archive(tmp_path)
    r, best, close, newest_poor = spec(1), spec(2), spec(3), spec(4)
    _scored(archive, r, None, [0.2, 0.3, 0.2, 0.3])
    _scored(archive, best, r, [0.5, 0.7, 0.5, 0.7])     # mean 0.6, se 0.0577: lower bound 0.487
    _scored(archive, close, best, [0.5, 0.5, 0.5, 0.5])  # 0.5 >= 0.487: within the bound, newer
    _scored(archive, newest_poor, close, [0.4, 0.4])    # newest, but below the bound
    rng = random.Random(0)
    assert select_parent(archive, "sica", rng).id == close.id
    assert select_parent(archive, "sica", rng, z=0.0).id == best.id
    archive.set_status(close.id, "rejected")
    assert select_parent(archive, "sica", rng).id == best.id


def test_metaproductive_prefers_the_parent_whose_improver_produced_gains(tmp_path: Path):
    """a and b score the same; what a's improver produced lost to its parents, b's gained: the
    metaproductive rule picks b; with nothing produced yet it is a draw around the own scores."""
    from rsigym_env.archive import improver_gains

    archive = Archive(tmp_path)
    r, a, b = spec(1), spec(2), spec(3)
    for s, parent, values in ((r, None, [0.4] * 4), (a, r, [0.5] * 4), (b, r, [0.5] * 4)):
        _scored(archive, s, parent, values, status="accepted")
    rng = random.Random(3)
    counts = Counter(select_parent(archive, "metaproductive", rng, statuses=("accepted",)).id for _ in range(300))
    assert counts[a.id] > 60 and counts[b.id] > 60                           # no record yet: a draw
    for i, (improver, values) in enumerate([(a, [0.44, 0.46]), (a, [0.43, 0.45]), (b, [0.56, 0.6]), (b, [0.55, 0.57])]):
        child = spec(40 + i)
        put(archive, child, improver, produced_by={"by": improver.id})
        archive.record(child.id, "validation", values * 2)
        archive.set_status(child.id, "rejected")
    assert improver_gains(population(archive), b.id) == [pytest.approx(0.08), pytest.approx(0.06)]
    counts = Counter(select_parent(archive, "metaproductive", rng, statuses=("accepted",)).id for _ in range(300))
    assert counts[b.id] > 0.8 * 300, counts


# ------------------------------------------------------------------------------------ novelty


def test_novelty_catches_ids_comment_only_changes_and_behaviour_duplicates(tmp_path: Path):
    archive = Archive(tmp_path)
    r = spec(3, skills={"plan": "Check the data first.\nThen train.\n"})
    put(archive, r)
    archive.record(r.id, "train", [0.25, 0.5, 1.0], tasks=["t1", "t2", "t3"])
    # same content
    assert "same content" in novelty(archive, r.to_files(), None)
    # only comments and whitespace changed: params.toml comment, skill re-wrapped, spec renamed
    files = r.to_files()
    files["params.toml"] = "# tuned\n" + files["params.toml"].replace("k = 3", "k   =   3  # three")
    files["skills/plan.md"] = "Check  the data first.\n\nThen   train.\n"
    assert "modulo comments" in novelty(archive, files, None)
    renamed = r.derive(name="another-label")
    assert "modulo comments" in novelty(archive, renamed.to_files(), None)
    # Python code (the program kind): comments and docstrings do not count, a real change does
    code = '"""Policy."""\ndef make_researcher(params):\n    return params.get("k", 1) + 1\n'
    same = "def make_researcher(params):  # the policy\n    '''Doc.'''\n    return params.get('k', 1)+1\n"
    changed = 'def make_researcher(params):\n    return params.get("k", 1) + 2\n'
    files_of = {text: {"spec.json": json.dumps({"kind": "program"}), "code/researcher.py": text}
                for text in (code, same, changed)}
    assert form_hash(files_of[same]) == form_hash(files_of[code]) != form_hash(files_of[changed])
    if _program_kind():
        archive_py = Archive(tmp_path, name="py")
        program = AgentSpec(kind="program", code={"researcher.py": code})
        put(archive_py, program)
        edited = program.model_copy(update={"code": {"researcher.py": same}})
        assert edited.id != program.id and "modulo comments" in novelty(archive_py, edited.to_files(), None)
        real = program.derive(code={"researcher.py": changed})
        assert novelty(archive_py, real.to_files(), None) is None
        put(archive_py, real, program)
        assert archive_py.rebuild(real.id)["code/researcher.py"] == changed
        assert '+    return params.get("k", 1) + 2' in archive_py.node_diff(real.id)
    # behaviour: the same train results on the same tasks
    child = r.derive(params={"k": 4})
    assert "same train results" in novelty(archive, child.to_files(), [0.25, 0.5, 1.0000000001], tasks=["t1", "t2", "t3"])
    assert novelty(archive, child.to_files(), [0.25, 0.5, 1.0], tasks=["t1", "t2", "t9"]) is None  # other tasks
    assert novelty(archive, child.to_files(), [0.25, 0.5, 1.0]) is None  # tasks unknown here, known there
    assert novelty(archive, child.to_files(), [0.25, 0.5, 0.75], tasks=["t1", "t2", "t3"]) is None
    # a real change goes through
    assert novelty(archive, child.to_files(), None) is None
    assert novelty(archive, r.derive(skills={"plan": "Train first.\n"}).to_files(), None) is None


def _program_kind() -> bool:
    """Whether the spec model has the ``program`` kind (its code/<name>.py files)."""
    return "code" in AgentSpec.model_fields
