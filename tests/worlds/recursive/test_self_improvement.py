"""Issue 26 (B): in `--mode improver` an improver edits its own procedure, judged by what it produces."""

from __future__ import annotations

import pytest

from rsigym_env.agents import AgentSpec, seed_program
from rsigym_env.archive import Archive
from rsigym_env.programs.seed.improver import parse_literals, replace_literals
from rsigym_env.scenario import load_scenario
from rsigym_env.worlds.recursive import Settings, recurse
from rsigym_env.worlds.recursive.measure import measure
from rsigym_env.worlds.recursive.ports import researchers
from rsigym_env.worlds.recursive.report import markdown
from rsigym_env.worlds.recursive.world import RecursiveOptions

# swe-bench-verified and terminal-bench-2: where fixing the harness pays on every validation seed
BENCHES = ["swe-bench-verified", "terminal-bench-2"]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))


def crippled(improver: dict, strategy: dict | None = None) -> AgentSpec:
    """The seed program with its harness fixes off (so its first moves pay) and ``improver`` merged into its IMPROVER."""
    files = seed_program().to_files()
    st = parse_literals(files["code/researcher.py"], ("STRATEGY",))["STRATEGY"]
    files["code/researcher.py"] = replace_literals(files["code/researcher.py"],
                                                   {"STRATEGY": dict(st, fix_harness="none", **(strategy or {}))})
    own = parse_literals(files["code/improver.py"], ("IMPROVER",))["IMPROVER"]
    files["code/improver.py"] = replace_literals(files["code/improver.py"], {"IMPROVER": dict(own, **improver)})
    return AgentSpec.from_files(files)


def scenario(spec: AgentSpec):
    s = load_scenario("recursive-scripted-small")
    return s.model_copy(update={"budget_usd": 4000, "world_options": {
        **s.world_options, "dev_benchmarks": BENCHES, "official_benchmarks": BENCHES, "dev_seeds": 2,
        "official_seeds": 8, "test_seeds": 2, "budget_usd": 300, "target_spec": spec.model_dump(mode="json")}})


def own(spec_files: dict[str, str]) -> dict:
    return parse_literals(spec_files["code/improver.py"], ("IMPROVER",))["IMPROVER"]


def run(spec: AgentSpec, tmp_path, rounds: int = 2):
    result = recurse(scenario(spec), rounds=rounds, seeds=[0], mode="improver", archive=Archive(tmp_path / "a", "s"),
                     settings=Settings(imp_k=0, transfer_tracks=()))
    return result, Archive(tmp_path / "a", result["config"]["archives"][0])


SMALL = {"self_moves": 1, "self_runs": 1, "self_candidates": 4, "candidates": 4}


def test_an_improver_edit_that_produces_more_is_accepted_and_the_next_round_runs_the_edited_procedure(tmp_path):
    """min_gain 1.0: the improver never submits what it finds (it submits its target with new memory). Its edit to
    0.02 submits the train winner: on the same fresh short improvement that product beats the parent's on
    validation, so the edit is accepted, carried onto the chain's researcher, and round 2 runs it."""
    spec = crippled(dict(SMALL, min_gain=1.0, self_genes=["min_gain"]))
    result, archive = run(spec, tmp_path)
    first, second = result["rows"]
    (edit,) = first["self_edits"]
    assert edit["what"] == "IMPROVER.min_gain 1.0 -> 0.02" and edit["accepted"] and edit["low"] > 0
    ((parents_product, edits_product),) = edit["products"]
    assert parents_product != edits_product                           # the edited procedure submits another program
    opts = RecursiveOptions.model_validate(scenario(spec).world_options)
    using = researchers()
    registry = using.registry()
    assert measure(registry.get(edits_product), opts, "official", 1, using=using).index > \
        measure(registry.get(parents_product), opts, "official", 1, using=using).index
    carrier = first["improved"]                                        # the round's researcher with the edited improver
    assert archive.get(carrier).status == "accepted" and edit.get("carried_to", carrier) == carrier
    assert own(archive.rebuild(carrier))["min_gain"] == 0.02
    assert second["target"] == carrier and second["improver"] == carrier   # round 2 runs the edited procedure
    assert own(archive.rebuild(second["improver"]))["min_gain"] != own(spec.to_files())["min_gain"]
    assert [x["what"] for x in second["self_edits"]] == ["IMPROVER.min_gain 0.02 -> 0.018"]  # and goes on from it
    assert result["summary"]["self_edits"][1] >= 1
    assert "edits of the improver's own procedure (judged by metaproductivity): 2, accepted 1" in markdown(result)


def test_an_improver_edit_that_changes_nothing_it_produces_is_rejected(tmp_path):
    """``tournament`` and ``operator_weights`` are read only by the random procedure: each edited cover
    improver submits the very same program on the fresh short improvement, its metaproductive gain is
    0 [0, 0], and it is not accepted. An improver that proposes more edits than a round judges
    (``MAX_SELF_EDITS``) gets the first ones judged, no more."""
    from rsigym_env.worlds.recursive.rounds import MAX_SELF_EDITS

    genes = ["tournament", "operator_weights.point", "operator_weights.phase", "operator_weights.crossover"]
    spec = crippled(dict(SMALL, self_moves=MAX_SELF_EDITS + 2, self_genes=genes))
    result, archive = run(spec, tmp_path, rounds=1)
    (row,) = result["rows"]
    assert len(row["self_edits"]) == MAX_SELF_EDITS
    assert row["self_edits"][0]["what"] == "IMPROVER.tournament 2 -> 3"
    for edit in row["self_edits"]:
        ((a, b),) = edit["products"]
        assert a == b and edit["gain"] == 0.0 and not edit["accepted"]
        assert archive.get(edit["id"]).status == "rejected"
    assert own(archive.rebuild(row["improved"])) == own(spec.to_files())   # the procedure is unchanged


def test_without_self_moves_no_edit_of_the_improver_is_proposed(tmp_path):
    """The seed's default (``self_moves`` 0): rounds make no edit of the improver, as before."""
    result, archive = run(crippled(dict(SMALL, self_moves=0)), tmp_path, rounds=1)
    assert result["rows"][0]["self_edits"] == [] and result["summary"]["self_edits"] == [0, 0]
    assert all(not n.produced_by.get("operator", "").startswith("self") for n in archive.nodes())
