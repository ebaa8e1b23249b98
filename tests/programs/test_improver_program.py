"""The seed program's improver (rsigym_env/programs/seed/improver.py): its operators on the real seed
researcher.py, and improvement episodes in the recursive world with the improver run in-process."""

from __future__ import annotations

import ast
import random
import types
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401  (registers the envs, installs the recursive world's researchers)
from rsigym_env.episode import run_episode
from rsigym_env.programs.runtime import load_program
from rsigym_env.scenario import load_scenario

SEED = Path(rsigym_env.__file__).parent / "programs" / "seed"
FILES = {p.name: p.read_text(encoding="utf-8") for p in sorted(SEED.glob("*.py"))}


def load(files: dict[str, str], module: str) -> types.ModuleType:
    """The program's module ``module``, loaded in-process into fresh module objects (trusted code)."""
    return load_program(files, module)


IMP = load(FILES, "improver")


def harness_files(files: dict[str, str]) -> dict[str, str]:
    return {f"code/{name}": text for name, text in files.items()}


def program(with_improver: bool = True) -> Any:
    files = harness_files(FILES)
    if not with_improver:
        files.pop("code/improver.py")
    return IMP.Program({p: t for p, t in files.items() if p in (IMP.RESEARCHER, IMP.SELF)})


def literal_segments(source: str) -> dict[str, tuple[int, int]]:
    """Character spans of the module-level literal assignments' values."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    spans = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            v = node.value
            spans[node.targets[0].id] = (starts[v.lineno - 1] + v.col_offset, starts[v.end_lineno - 1] + v.end_col_offset)
    return spans


def outside(source: str, name: str) -> tuple[str, str]:
    """``source`` without its lineage line, split around the literal ``name``'s value."""
    if source.startswith(IMP.LINEAGE):
        source = source.split("\n", 1)[1]
    start, end = literal_segments(source)[name]
    return source[:start], source[end:]


def within_space(strategy: dict[str, Any], space: dict[str, Any]) -> None:
    for gene, value in strategy.items():
        allowed, rng = space["ALLELES"].get(gene), space["RANGES"].get(gene)
        if isinstance(value, list) and allowed is not None:
            assert set(value) <= set(allowed) and len(set(value)) == len(value), (gene, value)
        elif allowed is not None:
            assert value in allowed and type(value) is type(allowed[0]), (gene, value)
        if rng is not None:
            assert rng[0] <= value <= rng[1], (gene, value)


def test_the_seed_program_parses_into_a_genome_and_its_operators():
    p = program()
    assert p.is_program and p.genome["PHASES"][-1] == "submit"
    assert set(p.genome["STRATEGY"]) == set(ast.literal_eval(outside_value(FILES["researcher.py"], "STRATEGY")))
    assert p.operators() == ["point", "crossover", "phase", "self"]
    assert "self" not in program(with_improver=False).operators()


def outside_value(source: str, name: str) -> str:
    start, end = literal_segments(source)[name]
    return source[start:end]


@pytest.mark.parametrize("seed", range(40))
def test_point_changes_one_gene_within_its_alleles_or_range_and_nothing_else(seed):
    p = program()
    genome, lineage = IMP.point(p.genome, p.space, random.Random(seed), 1.5)
    changed = [g for g in genome["STRATEGY"] if IMP.inline(genome["STRATEGY"][g]) != IMP.inline(p.genome["STRATEGY"][g])]
    assert len(changed) == 1 and lineage.startswith(f"point {changed[0]} ")
    within_space(genome["STRATEGY"], p.space)
    files = p.write(genome, lineage)
    assert set(files) == {IMP.RESEARCHER}
    new = files[IMP.RESEARCHER]
    assert new.startswith(f"# lineage: {lineage}\n") and new.isascii()
    assert outside(new, "STRATEGY") == outside(FILES["researcher.py"], "STRATEGY")   # byte-identical elsewhere
    assert IMP.parse_literals(new, ("STRATEGY",))["STRATEGY"] == genome["STRATEGY"]
    load(dict(FILES, **{"researcher.py": new}), "researcher").make_researcher({})   # the seed's own checks pass


def test_point_moves_every_kind_of_gene():
    p, lineages = program(), set()
    for seed in range(300):
        genome, lineage = IMP.point(p.genome, p.space, random.Random(seed), 1.5)
        lineages.add(lineage.split()[1])
    assert {"k", "data_fraction", "teacher_rule", "transforms", "early_base_eval", "probe_examples"} <= lineages
    rng = random.Random(0)
    moves = {IMP.mutate_gene("transforms", ["filter", "dedupe"], p.space["ALLELES"], {}, rng, 1.5)[0][0] is not None
             for _ in range(5)}
    assert moves == {True}
    assert IMP.mutate_gene("transforms", [], {"transforms": ["filter"]}, {}, rng, 1.5)[0] == ["filter"]
    assert IMP.mutate_gene("k", 8, {}, {"k": [1, 8, "add"]}, rng, 1.5)[0] == 7          # at the edge: the other way
    assert IMP.mutate_gene("name", "x", {}, {}, rng, 1.5) is None                       # not mutable


@pytest.mark.parametrize("seed", range(40))
def test_phase_deletes_swaps_or_inserts_without_duplicates(seed):
    p = program()
    genome, lineage = IMP.phase(p.genome, p.space, random.Random(seed))
    phases = genome["PHASES"]
    assert phases != p.genome["PHASES"] and len(set(phases)) == len(phases) and phases[-1] == "submit"
    assert set(phases) <= set(p.genome["PHASES"]) | set(p.space["OPTIONAL_PHASES"])
    assert lineage.split()[1] in ("delete", "swap", "insert")
    new = p.write(genome, lineage)[IMP.RESEARCHER]
    assert outside(new, "PHASES") == outside(FILES["researcher.py"], "PHASES")
    assert IMP.parse_literals(new, ("PHASES",))["PHASES"] == phases
    load(dict(FILES, **{"researcher.py": new}), "researcher").make_researcher({})


def test_phase_may_bring_back_a_deleted_default_phase():
    p = program()
    space = dict(p.space, OPTIONAL_PHASES=[])
    genome = dict(p.genome, PHASES=["diagnose", "submit"])
    inserted = {IMP.phase(genome, space, random.Random(s))[0]["PHASES"][0] for s in range(30)}
    assert {"fix_harness", "distil", "compare"} & inserted


def test_crossover_takes_only_genes_the_donor_has():
    p = program()
    rng = random.Random(1)
    donor = dict(p.genome, STRATEGY=dict(p.genome["STRATEGY"], k=5, teacher_rule="cheapest"),
                 PHASES=["diagnose", "distil", "compare", "submit"])
    for _ in range(20):
        child, lineage = IMP.crossover(p.genome, donor, "h-donor", rng)
        assert lineage.startswith("crossover from h-donor: ")
        assert child != p.genome
        for gene, value in child["STRATEGY"].items():
            assert value in (p.genome["STRATEGY"][gene], donor["STRATEGY"][gene])
        assert child["PHASES"] in (p.genome["PHASES"], donor["PHASES"])
    assert IMP.crossover(p.genome, p.genome, "h-same", rng) is None


@pytest.mark.parametrize("seed", range(20))
def test_self_changes_one_improver_gene_within_its_ranges_and_carries_one_researcher_change(seed):
    p = program()
    genome, lineage = IMP.propose(p, "self", random.Random(seed), 1.5, [])
    assert lineage.startswith("self ") and "; point " in lineage
    own, before = genome["IMPROVER"], p.genome["IMPROVER"]
    flat = lambda d: {f"{k}.{j}" if isinstance(v, dict) else k: (w if isinstance(v, dict) else v)  # noqa: E731
                      for k, v in d.items() for j, w in (v.items() if isinstance(v, dict) else [(None, v)])}
    diff = [g for g in flat(own) if flat(own)[g] != flat(before)[g]]
    assert len(diff) == 1
    gene = diff[0]
    if gene in p.space["IMPROVER_RANGES"]:
        low, high, _ = p.space["IMPROVER_RANGES"][gene]
        assert low <= flat(own)[gene] <= high
    else:
        assert flat(own)[gene] in p.space["IMPROVER_ALLELES"][gene]
    files = p.write(genome, lineage)
    assert set(files) == {IMP.RESEARCHER, IMP.SELF}
    assert outside(files[IMP.SELF], "IMPROVER") == outside(FILES["improver.py"], "IMPROVER")
    assert IMP.parse_literals(files[IMP.SELF], ("IMPROVER",))["IMPROVER"] == own
    mutated = load(dict(FILES, **{"improver.py": files[IMP.SELF]}), "improver")
    assert mutated.make_improver({}).config == own                  # the next round's improver behaves so


def test_self_needs_the_improver_in_the_target():
    p = program(with_improver=False)
    assert IMP.propose(p, "self", random.Random(0), 1.5, []) is None and "IMPROVER" not in p.genome


def test_skip_unread_never_proposes_a_gene_the_plan_does_not_read():
    p = program()
    unread = set(p.genome["STRATEGY"]) - p.reads()
    # the default plan has no second_distil / mix_teachers / retrain: their genes change no action
    assert unread == {"second_fraction", "followup_lr_scale"}
    with_retrain = p.derived(dict(p.genome, PHASES=["diagnose", "retrain", "submit"]), "x")
    assert "followup_lr_scale" in with_retrain.reads() and "second_fraction" not in with_retrain.reads()
    moved = {IMP.propose(p, "point", random.Random(seed), 1.5, [], skip_unread=True)[1].split()[1]
             for seed in range(200)}
    assert moved and not moved & unread
    assert {IMP.propose(p, "point", random.Random(seed), 1.5, [])[1].split()[1] for seed in range(200)} & unread
    donor = dict(p.genome, STRATEGY=dict(p.genome["STRATEGY"], second_fraction=0.5))
    assert IMP.crossover(p.genome, donor, "h-d", random.Random(0), p.reads()) is None   # nothing read differs
    assert IMP.make_improver({}).config["skip_unread"] is False and IMP.make_improver({"improve_skip_unread": True}).config["skip_unread"]


def test_proposals_are_deterministic_under_a_seed():
    def draws(seed: int) -> list[str]:
        improver = IMP.make_improver({})
        improver.rng = random.Random(seed)
        base = IMP.Candidate("h-1", program(), full=0.3)
        tried: set[str] = set()
        out = []
        for _ in range(12):
            genome, lineage, _op = improver.propose(base, [base], tried)
            tried.add(IMP.genome_key(genome))
            out.append(lineage)
        return out

    assert draws(7) == draws(7) and draws(7) != draws(8)
    assert len(set(draws(7))) == 12                                 # never the same program twice


def test_literals_are_rewritten_in_place_and_rendered_readably():
    src = 'A = {\n    "k": 3,  # attempts\n    "t": ["x"],\n}\nB = [1, 2]\n'
    out = IMP.replace_literals(src, {"A": {"k": 4, "t": ["x"]}, "B": [2, 1]})
    assert out == 'A = {\n    "k": 4,  # attempts\n    "t": ["x"],\n}\nB = [2, 1]\n'
    out = IMP.replace_literals(src, {"A": {"k": 3}})                 # keys changed: the whole literal
    assert out.startswith('A = {"k": 3}\nB') and ast.literal_eval(IMP.render({"a": list(range(50))})) == {"a": list(range(50))}
    with pytest.raises(KeyError):
        IMP.replace_literals(src, {"C": 1})


def test_params_toml_targets_get_numeric_changes_in_place():
    text = "data_fraction = 0.4\nk = 3\nname = \"x\"\nimprove_step = 1.5\n"
    p = IMP.Program({"params.toml": text})
    assert p.operators() == ["point", "crossover"] and "improve_step" not in p.space["RANGES"]
    genome, lineage = IMP.propose(p, "point", random.Random(0), 1.5, [])
    new = p.write(genome, lineage)["params.toml"]
    assert IMP.tomllib.loads(new) == genome["params"] and new.count("\n") == text.count("\n")
    assert IMP.propose(p, "phase", random.Random(0), 1.5, []) is None


# ---------------------------------------------------------------------------------- episodes


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))


def small(**world: Any) -> Any:
    s = load_scenario("recursive-scripted-small")
    return s.model_copy(update={"world_options": {**s.world_options, **world}})


def test_a_params_target_is_improved_and_its_best_version_submitted():
    env = gym.make("RSIGym/Harness-v0", scenario=small())
    improver = IMP.make_improver({"candidates": 4, "proposal": "random"})
    result = run_episode(env, improver, seed=3)
    run = env.unwrapped.run
    assert result.terminated and improver.log[0]["op"] == "target" and len(improver.log) <= 5
    best = max((r for r in improver.log if r["accepted"]), key=lambda r: r["full"])
    assert result.info["submitted"]["harness"] == best["version"] == improver.submitted
    assert all(r["op"] == "point" or r["op"] == "crossover" for r in improver.log[1:])
    assert IMP.tomllib.loads(run.harness.files(best["version"])["params.toml"])
    env.close()


def program_kind_wired() -> bool:
    try:
        from rsigym_env.programs import ProgramResearcher  # noqa: F401
    except ImportError:
        return False
    from rsigym_env.agents import KINDS

    return "program" in KINDS


@pytest.mark.skipif(not program_kind_wired(), reason="the program kind is not wired yet")
def test_the_seed_program_improves_itself_in_the_recursive_world():
    """The seed program is the target (its evaluations run it in its sandbox) and, loaded in-process,
    the improver: it plays to a submit of its best candidate, a rewritten researcher.py."""
    from rsigym_env.agents import AgentSpec, seed_program

    spec = seed_program()
    env = gym.make("RSIGym/Harness-v0", scenario=small(target_spec=spec.model_dump(mode="json")))
    improver = load(spec.code, "improver").make_improver({"candidates": 3, "full_k": 1, "proposal": "random"})
    result = run_episode(env, improver, seed=4)  # sim result version 6: a world where a candidate wins (5: none did)
    run = env.unwrapped.run
    assert result.terminated and improver.log[0]["op"] == "target" and improver.log[0]["full"] > 0
    assert [r["op"] for r in improver.log[1:]] and all(r["screen"] is not None for r in improver.log[1:])
    best = max((r for r in improver.log if r["accepted"]), key=lambda r: r["full"])
    assert best["op"] != "target" and result.info["submitted"]["harness"] == best["version"]
    submitted = AgentSpec.from_files(run.harness.files(best["version"]))
    assert submitted.kind == "program"
    source = submitted.code["researcher.py"]
    ast.parse(source)
    assert source != spec.code["researcher.py"] and source.startswith(f"# lineage: {best['lineage']}\n")
    load(submitted.code, "researcher").make_researcher({})
    env.close()


# ---------------------------------------------------------------------------------- coverage and memory


def test_cover_enumerates_every_single_move_of_the_parent_in_a_fixed_order():
    """No randomness: the same list every time; each move changes one read gene (to a neighbouring value or
    another allele) or the plan, and every gene the plan reads is moved."""
    p = program()
    moves = IMP.single_moves(p, 1.5)
    assert moves == IMP.single_moves(program(), 1.5) and len({key for key, _, _ in moves}) == len(moves)
    base = p.genome["STRATEGY"]
    moved_genes = set()
    for key, genome, lineage in moves:
        changed = [g for g in base if not IMP._same(base[g], genome["STRATEGY"][g])]
        plan_changed = genome["PHASES"] != p.genome["PHASES"]
        assert len(changed) + plan_changed == 1, key
        if changed:
            (gene,) = changed
            moved_genes.add(gene)
            assert key == f"{gene}={IMP.inline(genome['STRATEGY'][gene])}" and lineage.startswith("point ")
        else:
            assert key.startswith("phase ") and genome["PHASES"][-1] == "submit" and len(set(genome["PHASES"])) == len(genome["PHASES"])
        within_space(genome["STRATEGY"], p.space)
    assert moved_genes == p.reads()                                                     # every gene the plan reads
    assert {"second_fraction", "followup_lr_scale"}.isdisjoint(moved_genes)            # never read by the default plan
    assert [m[1] for m in IMP.gene_moves("lora_rank", 16, {}, p.space["RANGES"], 1.5)] == ["lora_rank 16 -> 8", "lora_rank 16 -> 32"]
    keys = [key for key, _, _ in moves]
    assert keys.index("phase -compare") < keys.index("phase +verify_harness@4") < keys.index("phase +verify_harness@0")


def test_cover_order_measures_untried_moves_first_then_the_near_passes():
    moves = IMP.single_moves(program(), 1.5)
    keys = [key for key, _, _ in moves]
    assert keys[:4] == ["diagnose_k=2", 'fix_harness="top1"', 'fix_harness="all"', 'fix_harness="none"']
    memory = {keys[0]: [{"on": "a", "screen": -0.01, "full": None}],
              keys[1]: [{"on": "a", "screen": 0.02, "full": 0.004}],
              keys[2]: [{"on": "a", "screen": 0.0, "full": None}, {"on": "b", "screen": 0.03, "full": 0.01}],
              "lora_rank=32": [{"on": "a", "screen": 0.05, "full": 0.02, "undo": "lora_rank=16"}]}
    order = [key for key, _, _ in IMP.cover_order(moves, memory)]
    further = [k for k in keys if k.startswith("phase +") and not k.endswith("@4")]   # a phase's other positions
    untouched = [k for k in keys[3:] if IMP.move_gene(k) not in ("fix_harness", "lora_rank") and k not in further]
    assert order[:len(untouched)] == untouched                        # genes never tried, in their fixed order
    rest = [k for k in order if k not in further]
    assert rest[len(untouched):len(untouched) + 2] == ["lora_rank=8", keys[3]]   # then tried genes, least tried first
    assert order.index("phase +verify_harness@0") < order.index("lora_rank=8") < order.index("phase +verify_harness@2")
    assert order[-4:] == ["lora_rank=32", keys[1], keys[2], keys[0]]  # then positive train gains (fewest trials first)
    assert "lora_rank=16" not in keys                                 # (the seed has 16: undoing is no move here)
    on_32 = IMP.single_moves(IMP.Program({IMP.RESEARCHER: IMP.replace_literals(FILES["researcher.py"], {
        "STRATEGY": dict(program().genome["STRATEGY"], lora_rank=32)})}), 1.5)
    back = [key for key, _, _ in IMP.cover_order(on_32, memory)]
    assert back.index("lora_rank=16") > back.index("lora_rank=64")   # undoing a move that gained counts as tried
    assert [k for k, _, _ in IMP.cover_order(moves, memory, retry=False)] == order[:-4]
    same_base = [k for k, _, _ in IMP.cover_order(moves, memory, on="a")]   # trials on this very base are no depth
    assert same_base.index("lora_rank=8") < same_base.index("phase -diagnose") < order.index("lora_rank=8")
    assert IMP.read_memory(IMP.write_memory(memory)) == memory
    assert IMP.write_memory(memory) == IMP.write_memory(dict(reversed(list(memory.items()))))  # same memory, same bytes


def test_cover_takes_an_accepted_gene_a_step_further_early_and_counts_a_phases_positions_as_one_gene():
    """The next step of a gene the way an earlier base accepted it (data_fraction 0.4 -> 0.49 accepted: 0.58)
    is a first-level move however often the gene was moved, the way back is not; a phase inserted at another
    position than its first is a level deeper for each position before it."""
    strategy = dict(program().genome["STRATEGY"], data_fraction=0.49)
    base = IMP.Program({IMP.RESEARCHER: IMP.replace_literals(FILES["researcher.py"], {"STRATEGY": strategy})})
    moves = IMP.single_moves(base, 1.5)
    keys = [key for key, _, _ in moves]
    assert {"data_fraction=0.58", "data_fraction=0.4", "phase +verify_harness@4", "phase +verify_harness@0"} <= set(keys)
    memory = {"data_fraction=0.49": [{"on": "a", "screen": 0.01, "full": 0.002, "undo": "data_fraction=0.4"}],
              "data_fraction=0.31": [{"on": "a", "screen": -0.01, "full": -0.003, "undo": "data_fraction=0.4"}],
              "lora_rank=8": [{"on": "a", "screen": 0.0, "full": 0.0, "undo": "lora_rank=16"}]}
    order = [key for key, _, _ in IMP.cover_order(moves, memory, on=IMP.base_tag(base.genome), genes=strategy)]
    first_level = [k for k in keys if k == "data_fraction=0.58" or (
        IMP.move_gene(k) not in ("data_fraction", "lora_rank") and not (k.startswith("phase +") and not k.endswith("@4")))]
    assert order[:len(first_level)] == first_level                     # in the fixed order, 0.58 among them
    assert order.index("data_fraction=0.58") < order.index("phase -diagnose") < order.index("lora_rank=32")
    assert order.index("data_fraction=0.4") > order.index("phase +recompare@3")   # the way back was tried: a re-try
    at = [order.index(k) for k in ("phase +verify_harness@4", "phase +verify_harness@0", "lora_rank=32",
                                   "phase +verify_harness@1", "phase +verify_harness@2")]
    assert at == sorted(at)      # one gene: its positions go a level deeper one by one (lora_rank: moved 16 -> 8, depth 2)
    went_down = {"data_fraction=0.49": [dict(memory["data_fraction=0.49"][0], undo="data_fraction=0.58")]}
    down = [key for key, _, _ in IMP.cover_order(moves, went_down, on=IMP.base_tag(base.genome), genes=strategy)]
    assert down.index("data_fraction=0.4") < down.index("phase -diagnose") < down.index("data_fraction=0.58")
    unaccepted = dict(strategy, data_fraction=0.4)                     # the base does not hold the move: no direction
    assert "data_fraction=0.58" not in IMP.onward_moves(moves, memory, unaccepted, on="b")
    assert "data_fraction=0.58" not in IMP.onward_moves(moves, memory, strategy, on="a")   # tried on this very base


def test_a_cover_episode_first_takes_the_accepted_gene_a_step_further():
    """In an episode: the target holds data_fraction 0.49, which its memory says an earlier base accepted
    from 0.4, and every gene before it in the fixed order was moved once: the first move measured is 0.58
    (the improver hands the target's genes to the order; without it data_fraction would wait, moved twice)."""
    from rsigym_env.agents import AgentSpec, seed_program

    files = dict(seed_program().to_files())
    strategy = dict(IMP.Program(files).genome["STRATEGY"], data_fraction=0.49)
    files[IMP.RESEARCHER] = IMP.replace_literals(files[IMP.RESEARCHER], {"STRATEGY": strategy})
    keys = [key for key, _, _ in IMP.single_moves(IMP.Program(files), 1.5)]
    before = keys[:keys.index("data_fraction=0.4")]
    memory = {key: [{"on": "earlier", "screen": 0.0, "full": 0.0}] for key in before}
    memory["data_fraction=0.49"] = [{"on": "earlier", "screen": 0.01, "full": 0.002, "undo": "data_fraction=0.4"}]
    files[IMP.MEMORY] = IMP.write_memory(memory)
    spec = AgentSpec.from_files(files)
    env = gym.make("RSIGym/Harness-v0", scenario=small(target_spec=spec.model_dump(mode="json")))
    improver = load(spec.code, "improver").make_improver({"candidates": 1})
    result = run_episode(env, improver, seed=5)
    assert result.terminated and [r["lineage"] for r in improver.log[1:]] == ["point data_fraction 0.49 -> 0.58"]
    env.close()


def test_the_cover_improver_screens_moves_in_order_and_writes_its_memory_into_what_it_submits():
    """One episode in the recursive world: the moves are measured in cover order, every trial lands in
    memory/moves.md, and the submitted version (and every fully evaluated one) carries that memory."""
    from rsigym_env.agents import AgentSpec, seed_program

    spec = seed_program()
    env = gym.make("RSIGym/Harness-v0", scenario=small(target_spec=spec.model_dump(mode="json")))
    improver = load(spec.code, "improver").make_improver({"candidates": 5})
    result = run_episode(env, improver, seed=5)
    run = env.unwrapped.run
    assert result.terminated and improver.log[0]["op"] == "target"
    expected = [lineage for _, _, lineage in IMP.single_moves(IMP.Program({p: t for p, t in harness_files(spec.code).items()
                                                                              if p in (IMP.RESEARCHER, IMP.SELF)}), 1.5)]
    tried = [r["lineage"] for r in improver.log[1:]]
    assert tried and tried == expected[:len(tried)] and all(r["op"] == "cover" for r in improver.log[1:])
    submitted = run.harness.files(result.info["submitted"]["harness"])
    memory = IMP.read_memory(submitted[IMP.MEMORY])
    assert memory == improver.memory and len(memory) == len(tried)
    tag = IMP.base_tag(IMP.Program({p: t for p, t in harness_files(spec.code).items() if p in (IMP.RESEARCHER, IMP.SELF)}).genome)
    assert all(len(v) == 1 and v[0]["on"] == tag and set(v[0]) == {"on", "screen", "full", "undo"} for v in memory.values())
    assert memory["diagnose_k=2"][0]["undo"] == "diagnose_k=1"
    assert AgentSpec.from_files(submitted).memory["moves"] == submitted[IMP.MEMORY]
    env.close()
