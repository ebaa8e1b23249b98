"""The array env (``MenuArrayEnv``) as users reach it: what ``gym.make_vec(..., menu=True)`` builds for every
id, the vector-env checks, the money arrays, the autoreset modes and the ledger and audit chain of finished
episodes (verified with ``rsigym audit verify``'s code path, then tampered with). Parity with the scalar env
is ``tests/test_menu_vector.py``'s."""

from __future__ import annotations

import math
from pathlib import Path
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from ledger_helpers import ledger_state, open_settled_one_by_one
from menu_helpers import assert_a_changed_byte_breaks_the_audit, assert_seeded_runs_repeat, bad_actions, masked_uniform

import rsigym_env
from rsigym_env.cli import main as rsigym
from rsigym_env.menu_vector import END_KEYS, MenuArrayEnv
from rsigym_env.platform import ledger as ledger_module
from rsigym_env.platform.ledger import Ledger
from rsigym_env.vector import ResearchVectorEnv
from rsigym_env.wrappers.menu import FEATURES, MENU, MENU_INDEX, DiscreteMenu

KWARGS = {"benchmark": "aime", "budget_usd": 100}


@pytest.mark.parametrize("env_id", rsigym_env.ENV_IDS)
def test_make_vec_builds_the_array_env_for_the_menu_on_the_sim_world(env_id):
    track = gym.spec(env_id).kwargs["track"]
    for mode in ("vector_entry_point", None):  # None: make_vec's default, the vector entry point
        vec = gym.make_vec(env_id, num_envs=3, vectorization_mode=mode, menu=True, **KWARGS)
        assert isinstance(vec, MenuArrayEnv) and vec.scenario.track == track and vec.scenario.world == "sim"
        assert vec.spec is not None and vec.spec.id == env_id and vec.spec.kwargs["menu"] is True
        assert vec.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        assert vec.observation_space.shape == (3, len(FEATURES)) and vec.action_space.shape == (3,)
        assert vec.single_action_space == gym.spaces.Discrete(len(MENU))
        vec.close()
    # today's route, by an explicit argument, or for what the array env cannot do
    for extra in ({"array": False}, {"include_log": True}, {"world": "local"}, {"run_dir": None, "async_jobs": True}):
        vec = gym.make_vec(env_id, num_envs=2, menu=True, **KWARGS, **extra)
        assert isinstance(vec, ResearchVectorEnv) and vec.menu and isinstance(vec.envs[0], DiscreteMenu), extra
        vec.close()
    assert isinstance(gym.make_vec(env_id, num_envs=2, **KWARGS), ResearchVectorEnv)  # tool calls: as before
    with pytest.raises(ValueError, match="'local' world.*array=False"):
        gym.make_vec(env_id, num_envs=2, menu=True, array=True, world="local", **KWARGS)
    with pytest.raises(ValueError, match="include_log=True"):
        gym.make_vec(env_id, num_envs=2, menu=True, array=True, include_log=True, **KWARGS)
    with pytest.raises(ValueError, match="menu=True"):
        gym.make_vec(env_id, num_envs=2, array=True, **KWARGS)
    with pytest.raises(TypeError, match="array is None, True or False"):
        gym.make_vec(env_id, num_envs=2, menu=True, array="fast", **KWARGS)
    with pytest.raises(ValueError, match="track"):  # a scenario of another track, as the scalar env says
        gym.make_vec(env_id, num_envs=2, menu=True, scenario="sim-data-aime-500" if track != "data"
                     else "sim-joint-aime-500")


def test_the_vector_env_checks():
    """What Gymnasium's ``check_env`` asks of a single env, for the batch: spaces hold what is returned,
    seeding reproduces, bad input is a clear error that changes nothing."""
    vec = gym.make_vec("RSIGym/Data-v0", num_envs=5, menu=True, benchmark="gpqa-diamond", budget_usd=300)
    with pytest.raises(gym.error.ResetNeeded):
        vec.step(np.zeros(5, np.int64))
    assert_seeded_runs_repeat(vec, 5)
    before = (vec.spent_usd.copy(), vec.refusals.copy(), vec.steps.copy())
    for bad in bad_actions(5):
        with pytest.raises(ValueError, match="menu index"):
            vec.step(bad)
    for now, then in zip((vec.spent_usd, vec.refusals, vec.steps), before):
        np.testing.assert_array_equal(now, then)
    with pytest.raises(ValueError, match="reset_mask"):
        vec.reset(options={"reset_mask": [1, 0, 0, 0, 0]})
    with pytest.raises(ValueError, match="unknown reset options"):
        vec.reset(options={"colour": "red"})
    with pytest.raises(ValueError, match="num_envs"):
        MenuArrayEnv(0)
    vec.close()


def test_money_arrays_are_the_infos_and_never_go_negative():
    """A $3 budget under masked-uniform play: every step's ``budget_left_usd``/``spent_usd`` equal the info's,
    refused calls cost nothing and are counted, nothing goes negative, ``episodes`` counts the ends."""
    vec = MenuArrayEnv(8, track="joint", benchmark="swe-bench-verified", budget_usd=3.0)
    obs, info = vec.reset(seed=5)
    rng = np.random.default_rng(0)
    ends = np.zeros(8, np.int64)
    refused = 0
    for _ in range(60):
        refusals_before = vec.refusals.copy()
        obs, reward, terminated, truncated, info = vec.step(masked_uniform(rng, info["action_mask"]))
        acting = info["_ok"]
        np.testing.assert_array_equal(vec.budget_left_usd[acting], info["budget_left_usd"][acting])
        np.testing.assert_array_equal(vec.spent_usd[acting], info["spent_usd"][acting])
        assert (vec.budget_left_usd >= 0).all() and (vec.spent_usd <= 3.0).all() and (obs[:, 0] >= 0).all()
        if "_spend_usd" in info:  # an episode ended: its spend is the array's
            np.testing.assert_array_equal(info["spend_usd"][info["_spend_usd"]], vec.spent_usd[info["_spend_usd"]])
        fresh = vec.refusals >= refusals_before  # an env reset this step starts from 0
        refused += int((vec.refusals - refusals_before)[acting & fresh].sum())
        assert (info["cost_usd"][acting & ~info["ok"]] >= 0).all()
        ends += terminated | truncated
    np.testing.assert_array_equal(vec.episodes, ends)
    assert ends.sum() >= 8 and refused > 0, (ends, refused)
    vec.close()


def test_autoreset_modes_give_the_same_episodes():
    """``SAME_STEP`` and ``DISABLED`` (with ``reset_mask``) play the episodes ``NEXT_STEP`` plays: the final
    observation and info of an ended env are its ``NEXT_STEP`` step's, the next one starts at once."""
    kw = dict(track="harness", benchmark="gpqa-diamond", budget_usd=100)
    nxt, same = MenuArrayEnv(3, **kw), MenuArrayEnv(3, autoreset_mode="SameStep", **kw)
    assert same.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    o1, i1 = nxt.reset(seed=0)
    o2, i2 = same.reset(seed=0)
    submit, probe = MENU_INDEX["submit_latest"], MENU_INDEX["eval_latest_k1"]
    o1, r1, t1, _, i1 = nxt.step([submit, probe, probe])
    o2, r2, t2, _, i2 = same.step([submit, probe, probe])
    np.testing.assert_array_equal(r1, r2)
    assert t2.tolist() == [True, False, False] and i2["_final_obs"].tolist() == [True, False, False]
    np.testing.assert_array_equal(i2["final_obs"][0], o1[0])
    np.testing.assert_array_equal(o2[1:], o1[1:])
    for key in END_KEYS:
        assert i2["final_info"][f"_{key}"].tolist() == [True, False, False] and f"_{key}" not in i2
        assert i2["final_info"][key][0] == i1[key][0] or key.endswith("dev_score")  # NaN there
    assert i2["final_info"]["ok"][0] and not i2["_ok"][0] and i2["_ok"][1]
    o1, r1, t1, _, i1 = nxt.step([probe, probe, probe])  # the next-step reset: row 0's action is ignored
    np.testing.assert_array_equal(o2[0], o1[0])
    assert o2[0, 2] == 0.0 and (same.steps[0], same.episodes[0]) == (0, 1)
    for vec in (nxt, same):
        vec.close()

    off = MenuArrayEnv(2, autoreset_mode=AutoresetMode.DISABLED, **kw)
    off.reset(seed=0)
    off.step([submit, probe])
    with pytest.raises(gym.error.ResetNeeded, match=r"envs \[0\]"):
        off.step([probe, probe])
    steps = off.steps.copy()
    obs, info = off.reset(seed=[7, None], options={"reset_mask": np.array([True, False])})
    assert info["_action_mask"].tolist() == [True, False] and off.steps.tolist() == [0, steps[1]]
    off.step([probe, probe])
    off.close()


def test_finished_episodes_are_in_a_ledger_the_audit_cli_verifies(tmp_path: Path, capsys):
    """Episodes played through ``make_vec`` with ``ledger_path``: one account per episode (the ended ones,
    and the ones a reset or ``close`` cut short), its spend the episode's, the books balance, and
    ``rsigym audit verify`` / ``rsigym ledger show`` accept the file; one changed byte and verify fails."""
    path = tmp_path / "ledger.sqlite"
    vec = gym.make_vec("RSIGym/Joint-v0", num_envs=4, menu=True, ledger_path=path, benchmark="aime", budget_usd=20)
    obs, info = vec.reset(seed=0)
    rng = np.random.default_rng(1)
    spends, gains = [], []
    for _ in range(40):
        obs, reward, terminated, truncated, info = vec.step(masked_uniform(rng, info["action_mask"]))
        ended = terminated | truncated
        spends += info["spend_usd"][ended].tolist() if ended.any() else []
        gains += info["normalized_gain"][ended].tolist() if ended.any() else []
    cut = int((~vec.unwrapped.done).sum())  # still running: written as ended by "closed"
    vec.close()
    assert len(spends) >= 4
    with Ledger(path, readonly=True) as ledger:
        accounts, records, books = ledger.accounts(), ledger.audit_records(), ledger.books()
    assert books.ok and len(accounts) == len(spends) + cut
    episodes = [r.event for r in records if r.event.get("tool") == "episode" and r.event["op"] in ("settle", "record")]
    assert len(episodes) == len(accounts) and [e["end_reason"] for e in episodes].count("closed") == cut
    spent = {a.key: a.balance.spent_usd for a in accounts}
    assert [spent[e["key"]] for e in episodes[:len(spends)]] == spends  # in the order they ended
    assert [e["normalized_gain"] for e in episodes[:len(spends)]] == gains
    assert all(a.balance.spent_usd <= a.balance.budget_usd == 20 for a in accounts)
    assert any(e["op"] == "record" for e in episodes) and any(e["op"] == "settle" for e in episodes)
    capsys.readouterr()
    assert rsigym(["audit", "verify", str(path)]) == 0, capsys.readouterr().out
    assert rsigym(["ledger", "show", str(path)]) == 0, capsys.readouterr().out

    assert_a_changed_byte_breaks_the_audit(path, capsys)


def test_the_ledger_is_in_memory_by_default_and_written_per_episode():
    vec = MenuArrayEnv(2, **KWARGS)
    vec.reset(seed=0)
    vec.step([MENU_INDEX["submit_latest"], MENU_INDEX["eval_latest_k1"]])
    ledger = vec.platform.ledger
    assert ledger.path is None and len(ledger.accounts()) == 1
    vec.reset(seed=1)  # env 1's episode, cut short, is written too
    assert len(ledger.accounts()) == 2 and ledger.books().ok
    assert sorted(a.balance.spent_usd > 0 for a in ledger.accounts()) == [False, True]
    vec.close()
    quiet = MenuArrayEnv(2, write_episodes=False, **KWARGS)
    quiet.reset(seed=0)
    quiet.step([MENU_INDEX["submit_latest"], MENU_INDEX["eval_latest_k1"]])
    assert quiet.platform.ledger.accounts() == [] and quiet.episodes.tolist() == [1, 0] and quiet.spent_usd[1] > 0
    quiet.close()


@pytest.mark.parametrize("write", ["episode", "step"])
def test_a_step_s_episodes_written_at_once_equal_them_written_one_by_one(tmp_path: Path, write: str):
    """The episodes that end in a step go to the ledger in one ``open_settled``: the file (audit rows with their
    hashes, at one wall time; accounts) is, entry for entry, what opening, reserving and settling (or recording)
    each episode in turn gives, through autoresets, a reset that cuts episodes short and ``close``."""
    states = []
    for bulk in (True, False):
        path = tmp_path / f"{write}-{bulk}.sqlite"
        with mock.patch.object(ledger_module, "time", mock.Mock(time=lambda: 1_800_000_000.5)), \
                mock.patch.object(Ledger, "open_settled", Ledger.open_settled if bulk else open_settled_one_by_one):
            vec = MenuArrayEnv(8, ledger_path=path, write_episodes=write, track="joint", **KWARGS)
            vec._key_secret = "same-keys"
            rng = np.random.default_rng(5)
            obs, info = vec.reset(seed=3)
            for i in range(30):
                if i == 20:
                    obs, info = vec.reset(seed=4)  # the running episodes are cut short: "reset"
                obs, reward, terminated, truncated, info = vec.step(masked_uniform(rng, info["action_mask"]))
            vec.close()
        with Ledger(path, readonly=True) as ledger:
            states.append(ledger_state(ledger))
        assert rsigym(["audit", "verify", str(path)]) == 0
    assert states[0] == states[1]
    text = str([row[2] for row in states[0][0]])
    assert all(f"'end_reason': '{why}'" in text for why in ("reset", "closed")) and "'op': 'settle'" in text


def test_episodes_written_per_step_are_verified_and_tamper_evident(tmp_path: Path, capsys):
    """``write_episodes="step"``: one account and one audited entry per step for the episodes that ended in
    it, each episode listed with its spend (within its budget), the account's spend their sum; ``rsigym audit
    verify`` accepts the file and fails it when one episode's refusals are changed."""
    path = tmp_path / "ledger.sqlite"
    vec = MenuArrayEnv(4, ledger_path=path, write_episodes="step", track="joint", benchmark="aime", budget_usd=20)
    obs, info = vec.reset(seed=0)
    rng = np.random.default_rng(1)
    spends = []
    for _ in range(40):
        obs, reward, terminated, truncated, info = vec.step(masked_uniform(rng, info["action_mask"]))
        ended = terminated | truncated
        if ended.any():
            spends.append(info["spend_usd"][ended].tolist())
    vec.close()
    with Ledger(path, readonly=True) as ledger:
        accounts, records, books = ledger.accounts(), ledger.audit_records(), ledger.books()
    entries = [r.event for r in records if r.event.get("tool") == "episodes" and r.event["op"] in ("settle", "record")]
    assert books.ok and len(entries) == len(accounts) == len(spends) + 1  # and the episodes close() cut short
    spent = {a.key: a.balance.spent_usd for a in accounts}
    for entry, want in zip(entries, spends):
        assert [e["spend_usd"] for e in entry["episodes"]] == want
        assert math.isclose(spent[entry["key"]], sum(want), abs_tol=1e-9)
        assert all(e["spend_usd"] <= 20 and "refusals" in e for e in entry["episodes"])
    assert [e["end_reason"] for e in entries[-1]["episodes"]] == ["closed"] * len(entries[-1]["episodes"])
    capsys.readouterr()
    assert rsigym(["audit", "verify", str(path)]) == 0, capsys.readouterr().out
    assert_a_changed_byte_breaks_the_audit(path, capsys)
    with pytest.raises(ValueError, match="write_episodes"):
        MenuArrayEnv(1, write_episodes="sometimes")
