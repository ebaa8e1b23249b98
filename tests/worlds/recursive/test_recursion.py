"""Recursion: a world whose target system is a researcher, the scripted improver, rounds, and `rsigym recurse`."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import pytest

from rsigym_env.agents import AgentRegistry, AgentSpec, build_researcher, builtin_spec, dump_toml
from rsigym_env.cli import main
from rsigym_env.episode import run_episode
from rsigym_env.home import state_dir
from rsigym_env.errors import InsufficientBudget
from rsigym_env.platform import Balance, Ledger, Platform, verify_audit
from rsigym_env.run import ResearchRun
from rsigym_env.worlds.recursive import RecursiveOptions, Settings, measure, recurse, split_tasks
from rsigym_env.worlds.recursive.report import markdown
from rsigym_env.scenario import list_scenarios, load_scenario
from rsigym_env.scoring import normalized_gain
from rsigym_env.worlds import WORLDS

TINY = {"dev_benchmarks": ["aime"], "official_benchmarks": ["aime", "gpqa-diamond"], "dev_seeds": 2, "official_seeds": 2,
        "budget_usd": 300}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("RSIGYM_HOME", str(tmp_path / "home"))
    saved = dict(WORLDS)
    yield
    WORLDS.clear()
    WORLDS.update(saved)


def tiny_options(**options):
    return RecursiveOptions.model_validate({**tiny_scenario().world_options, **options})


def tiny_scenario(**options):
    s = load_scenario("recursive-scripted-small")
    return s.model_copy(update={"world_options": {**s.world_options, **TINY, **options}, "budget_usd": 4000})


def test_dev_and_official_splits_never_overlap_and_dev_follows_the_seed():
    opts = RecursiveOptions(**TINY)
    official = {s for _, s in split_tasks(opts, "official")}
    dev = [{s for _, s in split_tasks(opts, "dev", world_seed=w)} for w in (0, 1)]
    assert not (official & dev[0]) and dev[0] != dev[1]
    assert split_tasks(opts, "dev", 0, n_tasks=1) == [("aime", 1_000_000)]


def test_the_recursive_world_measures_a_researcher_spec_through_its_harness():
    env = gym.make("RSIGym/Harness-v0", scenario=tiny_scenario())
    obs, info = env.reset(seed=0)
    assert "spec.json" in obs["log"] and "params.toml" in obs["log"] and info["tools"] == [
        "edit_harness", "evaluate", "read", "wait", "submit"]
    obs, _, _, _, info = env.step({"tool": "read", "args": {"ref": "harness:latest/params.toml"}})
    assert "data_fraction = 0.4" in obs["log"]
    obs, _, _, _, info = env.step({"tool": "evaluate", "args": {"k": 1}})
    assert info["ok"] and info["result"]["quote_usd"] == 2 * 300           # worst case: episodes x their budget
    obs, _, _, _, info = env.step({"tool": "wait", "args": {}})
    (event,) = info["events"]
    m = measure(builtin_spec("scripted"), RecursiveOptions(**TINY), "dev", 1, env.unwrapped.run.seed)
    assert event["score"] == pytest.approx(max(0.0, m.index)) and 0 < info["cost_usd"] <= 600
    assert info["cost_usd"] == pytest.approx(m.spend_usd)                # billed what its episodes spent
    # a broken spec is refused before anything is reserved, with the reason
    _, _, _, _, info = env.step({"tool": "edit_harness", "args": {"path": "params.toml", "content": "k = 'three'\n"}})
    _, _, _, _, info = env.step({"tool": "evaluate", "args": {"k": 1}})
    assert info["error"] == "invalid_harness" and "parameter k must be int" in info["message"] and info["cost_usd"] == 0
    _, _, _, _, info = env.step({"tool": "edit_harness", "args": {"path": "params.toml", "content": dump_toml(
        {"data_fraction": 0.6, "k": 3, "max_examples": 20000, "probe_examples": 20})}})
    version = info["result"]["version"]
    obs, reward, term, _, info = env.step({"tool": "submit", "args": {"harness": version}})
    improved = builtin_spec("scripted").model_copy(update={"params": {**builtin_spec("scripted").params, "data_fraction": 0.6}})
    k = env.unwrapped.scenario.official_k
    before = measure(builtin_spec("scripted"), RecursiveOptions(**TINY), "official", k).index
    after = measure(improved, RecursiveOptions(**TINY), "official", k).index
    assert term and info["initial_score"] == pytest.approx(max(0, before)) and info["official_score"] == pytest.approx(max(0, after))
    assert reward == pytest.approx(normalized_gain(max(0, before), max(0, after)))
    env.close()


def test_unsupported_services_are_refused():
    scenario = tiny_scenario().model_copy(update={"permissions": tiny_scenario().permissions.model_copy(update={"tools": None})})
    env = gym.make("RSIGym/Harness-v0", scenario=scenario)
    env.reset(seed=0)
    _, _, _, _, info = env.step({"tool": "infer", "args": {"prompt": "hi"}})
    assert info["error"] == "not_supported" and "researcher spec" in info["message"]
    _, _, _, _, info = env.step({"tool": "evaluate", "args": {"checkpoint": "ckpt-1"}})
    assert info["error"] == "unknown_ref"


def test_a_scripted_spec_improves_itself_when_its_harness_is_a_spec():
    env = gym.make("RSIGym/Harness-v0", scenario=tiny_scenario())
    result = run_episode(env, build_researcher(builtin_spec("scripted").derive(params={"improve_max_evaluations": 4})), seed=2)
    run = env.unwrapped.run
    assert result.terminated and sum(len(c.scores) for c in run.candidates.values()) == 4
    submitted = AgentSpec.from_files(run.harness.files(result.info["submitted"]["harness"]))
    assert result.info["best_dev_score"] == max(s for c in run.candidates.values() for s in c.scores)
    assert result.info["metrics"]["selection"] == 0.0                       # it submits its best dev candidate
    assert set(submitted.params) == set(builtin_spec("scripted").params)


def test_rounds_register_each_improved_researcher_and_report_honest_gains():
    registry = AgentRegistry()
    result = recurse(tiny_scenario(), rounds=2, seeds=[0, 1], registry=registry)
    rows, chains = result["rows"], result["chains"]
    assert [(r["seed"], r["round"]) for r in rows] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    opts = tiny_options()
    for r in rows:
        improved = registry.get(r["improved"])
        assert r["index_after"] == measure(improved, opts, "test", 1).index     # recomputable, not stored guesses
        assert r["improver_gain"] == pytest.approx(r["index_after"] - r["index_before"])
        assert improved.parent == r["target"] or improved.id == r["target"]
        for s in r["screened"]:                                               # accepted = paired validation gain > 0
            assert s["accepted"] == (s["low"] > 0)
    for chain in chains:
        seed_rows = [r for r in rows if r["seed"] == chain["seed"]]
        assert seed_rows[1]["target"] == seed_rows[0]["improved"]            # round t's output is round t+1's target
        assert chain["compounding"]["total"] == pytest.approx(chain["indices"][-1] - chain["indices"][0])
    assert result["summary"]["compounding_total"][2] == 2


def test_improver_mode_makes_the_improved_researcher_the_next_improver():
    result = recurse(tiny_scenario(), rounds=2, seeds=[0], mode="improver")
    first, second = result["rows"]
    assert second["improver"] == first["improved"] == second["target"]


def assert_no_file_names_a_held_out_seed(roots) -> None:
    """An improver that runs as the user reads whatever a run wrote (report, archive): none of it may name a
    validation or test seed, or an inner episode's seed made from one."""
    from rsigym_env.worlds.recursive.measure import MAX_K, held_out_seeds

    seeds = set(held_out_seeds("official", 64)) | set(held_out_seeds("test", 64))
    seeds |= {s * MAX_K + j for s in set(seeds) for j in range(MAX_K)}
    files = [p for root in roots for p in root.rglob("*") if p.is_file()]
    assert files
    for path in files:
        named = {int(n) for n in re.findall(rb"\d{9,}", path.read_bytes())} & seeds
        assert not named, f"{path} names held-out seeds {sorted(named)[:3]}"


def test_cli_recurse(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("extends: " + str(list_scenarios()["recursive-scripted-small"]) +
                    "\nbudget_usd: 4000\nworld_options:\n  dev_benchmarks: [aime]\n  official_benchmarks: [aime]\n"
                    "  official_seeds: 2\n  budget_usd: 300\n")
    assert main(["recurse", "--scenario", str(path), "--rounds", "2", "--seeds", "1", "--out", str(tmp_path / "o")]) == 0
    data = json.loads((tmp_path / "o" / "recursion.json").read_text())
    assert len(data["rows"]) == 2 and "rsigym recurse" in data["config"]["command"]
    report = (tmp_path / "o" / "recursion.md").read_text()
    assert "compounding" in report and "| transfer/local | not run" in report and "zero width" not in report
    assert "diversity: " in report and "distinct code forms" in report                # the archive's diversity
    data["transfer"]["test"]["gain"] = {"mean": 0.03, "se": 0.0, "n": 3, "low": 0.03, "high": 0.03}  # chains alike
    assert "zero width" in markdown(data)
    assert_no_file_names_a_held_out_seed([tmp_path / "o"] + [state_dir("archives") / a for a in data["config"]["archives"]])
    assert main(["recurse", "--scenario", "sim-joint-aime-500"]) == 2
    capsys.readouterr()
    assert main(["agents", "list", "--json"]) == 0
    registered = {r["id"]: r["spec"] for r in json.loads(capsys.readouterr().out)}
    assert {row["improved"] for row in data["rows"]} <= registered.keys()


# --- billing: inner episodes run on sub-keys of the outer run's key ------------------------------
# (each test uses its own per-episode budget, so its episodes are not in the measurement cache and run here)


def test_inner_episodes_bill_sub_keys_carved_out_of_the_outer_key(tmp_path):
    env = gym.make("RSIGym/Harness-v0", scenario=tiny_scenario(budget_usd=310), ledger_path=tmp_path / "ledger.db")
    env.reset(seed=0)
    run, platform = env.unwrapped.run, env.unwrapped.platform
    _, _, _, _, info = env.step({"tool": "evaluate", "args": {"k": 1}})
    assert info["result"]["quote_usd"] == 2 * 310 and info["cost_usd"] == 0    # reserved; charged when it is collected
    subs = {a.key: a.balance for a in platform.ledger.accounts() if a.parent == run.key.id}
    assert len(subs) == 2 and all(b.closed and b.budget_usd == 310 and 0 <= b.spent_usd <= 310 for b in subs.values())
    spent = sum(b.spent_usd for b in subs.values())
    assert spent > 0
    inner = [r.event for r in platform.ledger.audit_records() if r.key in subs]  # the inner episodes' own calls
    assert {"evaluate", "submit"} <= {e["tool"] for e in inner} and {"reserve", "settle"} <= {e["op"] for e in inner}
    outer_ops = [(r.event["tool"], r.event["op"]) for r in platform.ledger.audit_records() if r.key == run.key.id]
    assert outer_ops.count(("mint_subkey", "mint")) == 2 and outer_ops.count(("close_subkey", "close")) == 2
    _, _, _, _, info = env.step({"tool": "wait", "args": {}})
    assert info["cost_usd"] == pytest.approx(spent) and info["events"][0]["cost_usd"] == pytest.approx(spent)
    balance = platform.balance(run.key)
    assert balance.spent_usd == pytest.approx(spent) and balance.available_usd == pytest.approx(4000 - spent)
    assert balance.reserved_usd == 0 and balance.granted_usd == 0
    assert platform.ledger.books().ok, platform.ledger.books().problems
    # measured again (the cache): the same bill, replayed on fresh sub-keys, not computed again
    _, _, _, _, info = env.step({"tool": "evaluate", "args": {"k": 1}})
    _, _, _, _, info = env.step({"tool": "wait", "args": {}})
    assert info["cost_usd"] == pytest.approx(spent)
    replayed = [r.event for r in platform.ledger.audit_records() if r.event.get("tool") == "inner_episode"]
    assert len(replayed) == 4 and {e["args"]["args"]["replayed"] for e in replayed} == {"cache"}   # reserve + settle each
    env.close()


def test_a_sub_key_caps_its_inner_run_and_its_spend_is_charged_with_the_call():
    platform = Platform()
    outer = platform.issue_key(load_scenario(budget_usd=100))
    bill = platform.open(outer, {"tool": "evaluate"}, 60.0)
    inner = bill.mint_subkey(25.0, load_scenario(benchmark="aime", budget_usd=25))
    assert platform.balance(outer).available_usd == 40.0 and platform.balance(inner).available_usd == 25.0
    with pytest.raises(InsufficientBudget):
        platform.open(inner, {"tool": "train"}, 25.5)          # never more than the sub-key holds
    with pytest.raises(InsufficientBudget):
        bill.mint_subkey(40.0)                                  # never more than the call reserved
    run = ResearchRun(inner.scenario, 0, platform, key=inner)  # an inner episode sees the sub-key's budget
    assert run.budget_left == 25.0 and run.key is inner
    with platform.charge(inner, {"tool": "infer"}, quote_usd=10.0) as inner_bill:
        inner_bill.settle(10.0)
    assert bill.close_subkey(inner) == 10.0
    assert bill.settle(3.0) == 10.0                             # at least what its sub-keys spent
    assert platform.balance(outer) == Balance(100.0, 10.0, 0.0, 0.0, 90.0)
    failed = platform.open(outer, {"tool": "evaluate"}, 50.0)   # a failed call cannot give inner spend back
    spender = failed.mint_subkey(20.0)
    with platform.charge(spender, {"tool": "infer"}, quote_usd=5.0) as inner_bill:
        inner_bill.settle(4.0)
    platform.release(failed, "job_failed")                      # closes the open sub-key first
    assert failed.charged_usd == 4.0 and platform.balance(outer) == Balance(100.0, 14.0, 0.0, 0.0, 86.0)
    assert platform.ledger.books().ok, platform.ledger.books().problems


def test_a_recursive_run_never_overdraws_the_outer_key_and_its_books_balance(tmp_path):
    path = tmp_path / "ledger.db"
    scenario = tiny_scenario(budget_usd=320).model_copy(update={"budget_usd": 1400})  # room for about two evaluations
    env = gym.make("RSIGym/Harness-v0", scenario=scenario, ledger_path=path)
    researcher = build_researcher(builtin_spec("scripted").derive(params={"improve_max_evaluations": 6}))
    platform = env.unwrapped.platform
    seen = []

    def check(step, action, obs, info):
        balance = platform.balance(env.unwrapped.run.key)
        assert balance.available_usd >= 0 and balance.spent_usd + balance.reserved_usd + balance.granted_usd <= 1400
        seen.append(info.get("error"))

    result = run_episode(env, researcher, seed=1, on_step=check)
    balance = platform.balance(env.unwrapped.run.key)
    assert result.info["spend_usd"] == pytest.approx(balance.spent_usd) and 0 < balance.spent_usd <= 1400
    assert "insufficient_budget" in seen                        # the third evaluation did not fit, and was refused
    subs = [a for a in platform.ledger.accounts() if a.parent == env.unwrapped.run.key.id]
    assert subs and all(a.balance.closed and a.balance.spent_usd <= a.balance.budget_usd for a in subs)
    assert sum(a.balance.spent_usd for a in subs) == pytest.approx(balance.spent_usd)  # all of it is inner spend
    books = platform.ledger.books()
    assert books.ok, books.problems
    env.close()
    assert verify_audit(path).ok
    with Ledger(path, readonly=True) as reopened:
        assert reopened.books().ok


def test_episodes_run_elsewhere_are_charged_on_their_sub_keys(monkeypatch):
    """With ``ray: true`` the episodes run in workers with ledgers of their own; each is then charged on a
    sub-key of the outer key at what it spent (here the "workers" are this process)."""
    import rsigym_env.sweep as sweep_module

    ran = []

    def fake_sweep(specs, **kwargs):
        ran.extend(specs)
        return sweep_module.SweepResult(sweep_module.run_local(specs), {}, {})

    monkeypatch.setattr(sweep_module, "sweep", fake_sweep)
    env = gym.make("RSIGym/Harness-v0", scenario=tiny_scenario(budget_usd=330, ray=True))
    env.reset(seed=0)
    run, platform = env.unwrapped.run, env.unwrapped.platform
    env.step({"tool": "evaluate", "args": {"k": 1}})
    _, _, _, _, info = env.step({"tool": "wait", "args": {}})
    assert len(ran) == 2
    subs = {a.key: a.balance for a in platform.ledger.accounts() if a.parent == run.key.id}
    charges = [r.event for r in platform.ledger.audit_records() if r.key in subs]
    assert [(e["tool"], e["op"]) for e in charges] == [("inner_episode", "reserve"), ("inner_episode", "settle")] * 2
    assert {e["args"]["args"]["replayed"] for e in charges} == {"ray"}
    spent = sum(b.spent_usd for b in subs.values())
    assert spent > 0 and info["cost_usd"] == pytest.approx(spent) == pytest.approx(platform.balance(run.key).spent_usd)
    assert platform.ledger.books().ok
    env.close()


# --- issue 26: the archive, the three splits, paired acceptance, programs ---------------------------


def test_train_validation_and_test_seeds_never_overlap():
    opts = tiny_options()
    test = {s for _, s in split_tasks(opts, "test")}
    official = {s for _, s in split_tasks(opts, "official")}
    for w in (0, 1, 9_999, 123_456_789):
        assert not ({s for _, s in split_tasks(opts, "dev", world_seed=w)} & (test | official))
    assert not (test & official)
    with pytest.raises(ValueError, match="overlap"):
        RecursiveOptions(official_split="public", test_first_seed=1_500_000)
    with pytest.raises(ValueError, match="apply to official_split='public' only"):
        RecursiveOptions(test_first_seed=3_000_000)  # would be silently unused with the secret split


def test_validation_and_test_seeds_are_keyed_by_the_split_secret_not_public_numbers(monkeypatch):
    """An improver with this package cannot compute a candidate's validation or test score: the seeds
    are keyed hashes of the platform's split secret, change with it, and never are the public ones."""
    from rsigym_env.splits import SECRET_ENV
    from rsigym_env.worlds.recursive.measure import HELD_OUT_SEED_BASE, held_out_seeds

    opts = tiny_options()
    public = RecursiveOptions.model_validate({**opts.model_dump(exclude={"official_first_seed", "test_first_seed"}),
                                              "official_split": "public"})
    mine = {split: split_tasks(opts, split) for split in ("official", "test")}
    for split, tasks in mine.items():
        assert {s for _, s in tasks}.isdisjoint(s for _, s in split_tasks(public, split))
        assert min(s for _, s in tasks) >= HELD_OUT_SEED_BASE
        assert [s for _, s in tasks][::len(opts.official_benchmarks)] == held_out_seeds(split, len(tasks) // len(opts.official_benchmarks))
    assert split_tasks(opts, "official") == mine["official"]  # the same secret: the same tasks for every candidate
    monkeypatch.setenv(SECRET_ENV, "another-platform-secret")
    for split, tasks in mine.items():
        assert {s for _, s in split_tasks(opts, split)}.isdisjoint(s for _, s in tasks)
    measured = measure(builtin_spec("scripted"), opts, "official", k=1)
    assert all(re.fullmatch(r"[\w.-]+/task-\d+", t) for t in measured.task_ids())


def test_rounds_archive_every_candidate_and_accept_only_paired_validation_gains(tmp_path):
    from rsigym_env.archive import Archive

    base = Archive(tmp_path / "archives", "t")
    result = recurse(tiny_scenario(), rounds=2, seeds=[0], archive=base, settings=Settings(imp_runs=2))
    (name,) = result["config"]["archives"]
    archive = Archive(tmp_path / "archives", name)
    nodes = {n.id: n for n in archive.nodes()}
    root = result["chains"][0]["ids"][0]
    assert nodes[root].generation == 0 and nodes[root].status == "accepted"
    assert {"validation", "test"} <= set(nodes[root].scores)
    for node in nodes.values():
        assert AgentSpec.from_files(archive.rebuild(node.id)).id == node.id      # any node rebuilds from its chain
        if node.parent is not None:
            assert "train" in node.scores and node.cost_usd > 0 and node.produced_by["round"] in (1, 2)
        if node.status == "accepted" and node.parent is not None:
            assert "test" in node.scores
        if node.status in ("evaluated", "duplicate"):
            assert "test" not in node.scores                                 # test is measured only for accepted nodes
    for row in result["rows"]:
        for s in row["screened"]:
            assert nodes[s["id"]].status == ("accepted" if s["low"] > 0 else "rejected")
    summary = result["summary"]
    assert summary["candidates"] == sum(r["candidates"] for r in result["rows"])
    test = result["transfer"]["test"]                   # between chains (the bar) and pooled over chains' tasks
    assert summary["final_vs_seed_test"] == test["gain"] and test["gain"]["n"] == 1
    assert summary["final_vs_seed_test_pooled"] == test["pooled"] and test["pooled"]["n"] == sum(c["n"] for c in test["chains"])
    assert set(summary["imp_at_k"]) == {"0", "2"} and "test" in result["transfer"]   # the first and the last generation
    for g in ("0", "2"):
        (runs,) = result["imp"][g]["runs"]                                      # one chain: its improver's 2 fresh runs
        assert len(runs) == 2 and result["imp"][g]["values"] == [pytest.approx(sum(runs) / 2)]


def test_the_seed_program_is_improved_in_its_sandbox_and_archived(tmp_path):
    from rsigym_env.agents import seed_program
    from rsigym_env.archive import Archive

    scenario = tiny_scenario(target="program")
    result = recurse(scenario, rounds=1, seeds=[0], mode="improver", archive=Archive(tmp_path / "a", "p"),
                     settings=Settings(imp_k=0, transfer_tracks=()))
    (row,) = result["rows"]
    assert row["target"] == seed_program().id and row["improver"] == seed_program().id
    assert row["candidates"] >= 1 and row["dev_evaluations"] >= 2 and row["attempts"] == []
    assert result["summary"]["tampering_rate"] == 0.0


def test_a_candidate_that_reaches_for_host_files_is_counted_as_a_tampering_attempt():
    from rsigym_env.programs.sandbox import ProgramError  # noqa: F401  (the sandbox must be importable)

    snoop = AgentSpec(kind="program", name="snoop", code={"researcher.py": '''
class Snoop:
    def reset(self, observation, info, seed):
        try:
            open("/work/main/README.md").read()
        except OSError:
            pass
    def act(self, observation, info):
        return {"tool": "submit", "args": {}}
def make_researcher(params):
    return Snoop()
'''})
    m = measure(snoop, tiny_options(), "dev", 1)
    assert all(r.ok for r in m.records) and "open" in m.attempts        # it ran, was contained, and was counted
    assert measure(builtin_spec("program"), tiny_options(), "dev", 1).attempts == []  # the seed program attempts nothing


@pytest.mark.parametrize("rule", ["greedy", "dgm", "thompson", "sica", "metaproductive"])
def test_every_parent_selection_rule_runs_rounds_and_picks_an_accepted_parent(rule, tmp_path):
    from rsigym_env.archive import Archive

    result = recurse(tiny_scenario(), rounds=2, seeds=[0], archive=Archive(tmp_path / "a", rule),
                     settings=Settings(selection=rule, imp_k=0, transfer_tracks=()))
    archive = Archive(tmp_path / "a", result["config"]["archives"][0])
    accepted = {n.id for n in archive.nodes() if n.status == "accepted"}
    assert all(row["selection"] == rule and row["target"] in accepted for row in result["rows"])
    with pytest.raises(ValueError, match="selection must be one of"):
        recurse(tiny_scenario(), rounds=1, seeds=[0], settings=Settings(selection="best-guess"))


def test_an_improver_program_says_how_many_of_its_candidates_recurse_validates():
    from rsigym_env.agents import seed_program
    from rsigym_env.worlds.recursive.rounds import (MAX_VALIDATE_TOP, _improver_rule, _improver_setting,
                                                    _improver_validate_top)

    seed = seed_program()
    text = seed.code["improver.py"]
    assert _improver_validate_top(seed) == 8 and _improver_rule(seed) == "greedy"
    for value, read in (("3", 3), ("0", 0), (str(MAX_VALIDATE_TOP + 1), None), ("-1", None), ("True", None),
                        ('"all"', None), ("2.5", None)):
        edited = seed.model_copy(update={"code": dict(seed.code, **{
            "improver.py": text.replace('"validate_top": 8,', f'"validate_top": {value},')})})
        assert _improver_validate_top(edited) == read, value
    assert _improver_validate_top(seed.model_copy(update={"code": {}})) is None
    assert _improver_setting(seed, "validate_from") == "screened"      # any screened candidate, not only train winners
    assert _improver_setting(seed, "behaviour_novelty") is False       # equal train results do not hide a move
    assert _improver_setting(seed.model_copy(update={"code": dict(seed.code, **{"improver.py": "IMPROVER = f()\n"})}),
                             "validate_from") is None                    # nothing of the program runs


def test_recombination_merges_the_moves_of_candidates_into_one_program():
    from rsigym_env.agents import seed_program
    from rsigym_env.programs.seed.improver import parse_literals, replace_literals, set_lineage
    from rsigym_env.worlds.recursive.rounds import _improver_recombine, recombination

    seed = seed_program()
    parent = seed.to_files()
    text = parent["code/researcher.py"]
    found = parse_literals(text, ("STRATEGY", "PHASES"))

    def moved(lineage: str, **literals) -> dict[str, str]:
        return dict(parent, **{"code/researcher.py": set_lineage(replace_literals(text, literals), lineage)})

    share = moved("point fix_min_share", STRATEGY=dict(found["STRATEGY"], fix_min_share=0.02))
    verify = moved("phase insert verify_harness", PHASES=["diagnose", "fix_harness", "verify_harness", "distil",
                                                          "compare", "submit"])
    clash = moved("point fix_min_share", STRATEGY=dict(found["STRATEGY"], fix_min_share=0.04))
    files, names = recombination(parent, [("a", share, None), ("b", clash, None), ("c", verify, None)])
    assert names == ["a", "c"]                                   # b changes the line a changed: left out
    merged = parse_literals(files["code/researcher.py"], ("STRATEGY", "PHASES"))
    assert merged["STRATEGY"] == dict(found["STRATEGY"], fix_min_share=0.02)
    assert merged["PHASES"][2] == "verify_harness" and files["code/researcher.py"].startswith("# lineage: recombine a + c")
    assert AgentSpec.from_files(files).kind == "program"
    assert recombination(parent, [("a", share, None), ("b", clash, None)]) is None
    assert recombination(parent, [("a", share, None), ("a2", share, parent)]) is None          # a change merged already
    # an earlier round's near-pass (made from an earlier parent) merges into the current parent's candidates
    now = parse_literals(share["code/researcher.py"], ("STRATEGY",))["STRATEGY"]
    later = dict(share, **{"code/researcher.py": set_lineage(replace_literals(share["code/researcher.py"], {
        "STRATEGY": dict(now, lora_rank=32)}), "point lora_rank")})
    files, names = recombination(share, [("later", later, None), ("verify", verify, parent)])
    merged = parse_literals(files["code/researcher.py"], ("STRATEGY", "PHASES"))
    assert names == ["later", "verify"] and merged["STRATEGY"] == dict(now, lora_rank=32)
    assert merged["PHASES"][2] == "verify_harness"
    assert _improver_recombine(seed) in ("none", "accepted", "positive")
    with pytest.raises(ValueError, match="recombine must be one of"):
        recurse(tiny_scenario(), rounds=1, seeds=[0], settings=Settings(recombine="all"))


def test_the_cover_improvers_memory_travels_through_the_archive_and_steers_the_next_round(tmp_path):
    """Two rounds of the seed program improving itself (proposal "cover"): every node rebuilds from its chain
    with the same id and the same memory/moves.md; the second round measures moves the first never tried
    before any re-try; a parent whose round found nothing better is replaced by its successor (the same
    behaviour, the new memory), never selected again."""
    from rsigym_env.archive import Archive
    from rsigym_env.programs.seed.improver import MEMORY, Program, base_tag, cover_order, read_memory, single_moves

    result = recurse(tiny_scenario(target="program"), rounds=2, seeds=[0], mode="improver",
                     archive=Archive(tmp_path / "a", "m"), settings=Settings(imp_k=0, transfer_tracks=()))
    archive = Archive(tmp_path / "a", result["config"]["archives"][0])
    nodes = {n.id: n for n in archive.nodes()}
    memories = {}
    for node in nodes.values():
        files = archive.rebuild(node.id)
        assert AgentSpec.from_files(files).id == node.id                      # the memory is part of the content id
        memories[node.id] = read_memory(files.get(MEMORY))
    first, second = result["rows"]
    assert memories[first["target"]] == {} and memories[second["target"]]    # round 2's parent remembers round 1
    tried_first = set(memories[second["target"]])
    final = max((n for n in nodes.values() if n.produced_by.get("round") == 2), key=lambda n: len(memories[n.id]))
    parent_files = archive.rebuild(second["target"])
    program = Program({p: t for p, t in parent_files.items() if p in ("code/researcher.py", "code/improver.py")})
    untried = [key for key, _, _ in cover_order(single_moves(program, 1.5), memories[second["target"]], retry=False,
                                                on=base_tag(program.genome), genes=program.genome["STRATEGY"])]
    assert untried and not set(untried) & tried_first
    tried_second = [key for key, trials in memories[final.id].items() if len(trials) > len(memories[second["target"]].get(key, []))]
    assert tried_second and set(tried_second) == set(untried[:len(tried_second)])   # the untried ones, in cover order
    for node in nodes.values():
        if node.produced_by.get("operator") == "memory":                        # a successor: same episodes as its parent
            assert node.scores["validation"].values == nodes[node.parent].scores["validation"].values
            assert all(row["target"] != node.parent for row in result["rows"] if row["round"] > node.produced_by["round"])
    assert all(row["target"] in nodes and nodes[row["target"]].status == "accepted" for row in result["rows"])


def test_the_improver_sees_train_only_never_a_test_task():
    """Everything an improver receives in an outer episode (observations, infos, file reads) names no test
    task and no test seed: test is measured by `rsigym recurse` outside any episode."""
    from rsigym_env.agents import seed_program
    from rsigym_env.programs.runtime import load_program

    spec = seed_program()
    scenario = tiny_scenario(target_spec=spec.model_dump(mode="json"))
    opts = RecursiveOptions.model_validate(scenario.world_options)
    improver = load_program(spec.code, "improver").make_improver({"candidates": 3})
    seen: list[str] = []

    class Recorder:
        name = "recorder"

        def reset(self, observation, info, seed=None):
            seen.append(json.dumps([observation, info], default=str))
            improver.reset(observation, info, seed)

        def act(self, observation, info):
            seen.append(json.dumps([observation, info], default=str))
            return improver.act(observation, info)

    env = gym.make("RSIGym/Harness-v0", scenario=scenario)
    result = run_episode(env, Recorder(), seed=11)
    env.close()
    assert result.terminated and len(seen) > 5
    text = "\n".join(seen)
    dev = {seed for _, seed in split_tasks(opts, "dev", 11)}
    assert any(str(seed) in text for seed in dev) or "evaluate" in text
    for _bench, seed in split_tasks(opts, "test"):
        assert str(seed) not in text
