"""The array env of the menu interface (``rsigym_env.menu_vector``) against ``DiscreteMenu`` on the scalar env.

Every row must equal what ``DiscreteMenu(gym.make(env_id, ...))`` gives for the same seed and menu actions:
features, rewards, terminations, truncations, the action mask and the info keys the array env keeps, through
next-step autoresets, on every track and benchmark. The actions are seeded random draws over the macros the
array env steps (``ARRAY_MACROS``: the whole menu), mostly unmasked ones and some masked ones (which the env
refuses); small budgets, step and time limits make every way an episode ends happen. Then the shipped RL policy.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

from rsigym_env.baselines.rl_researcher import default_policy_path, policy_actions, shared_policy
from rsigym_env.catalog import BENCHMARKS, TRACK_ENV_IDS
from rsigym_env.menu_vector import ARRAY_MACROS, END_KEYS, MenuArrayEnv
from rsigym_env.wrappers.menu import MENU, MENU_INDEX, DiscreteMenu

SUPPORTED = np.array([m.kind in ARRAY_MACROS for m in MENU])
# (budget_usd, max_steps, time_limit_h): roomy, money runs out, steps run out, time runs out
LIMITS = [(500.0, None, None), (3.0, None, None), (500.0, 9, None), (500.0, None, 0.5)]


def scalar_value(info: dict, key: str):
    value = info.get(key, "" if key == "error" else None)
    return math.nan if value is None else value


def play(track: str, benchmark: str, limits: tuple, seed: int, n: int = 3, steps: int = 40,
         script: tuple[int, ...] = ()) -> list[str]:
    """Steps the array env and n scalar menus side by side (``script``: every env's first actions, then
    random ones); returns the end reasons of the episodes that ended and the error codes of refused calls."""
    budget, max_steps, time_h = limits
    kwargs = {"benchmark": benchmark, "budget_usd": budget, "max_steps": max_steps, "time_limit_h": time_h}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    vec = MenuArrayEnv(n, track=track, **kwargs)
    singles = [DiscreteMenu(gym.make(TRACK_ENV_IDS[track], **kwargs)) for _ in range(n)]
    obs, info = vec.reset(seed=seed)
    rows = [single.reset(seed=seed + i) for i, single in enumerate(singles)]
    rng = np.random.default_rng(seed)
    done = np.zeros(n, bool)
    ended: list[str] = []
    for t in range(steps):
        for i, (s_obs, s_info) in enumerate(rows):
            where = f"{track}/{benchmark}/{limits} t={t} env={i}"
            np.testing.assert_array_equal(obs[i], s_obs, err_msg=where)
            np.testing.assert_array_equal(info["action_mask"][i], s_info["action_mask"], err_msg=where)
        mask = info["action_mask"] & SUPPORTED
        actions = np.array([rng.choice(np.flatnonzero(mask[i] if rng.random() < 0.85 and mask[i].any() else SUPPORTED))
                            for i in range(n)])
        if t < len(script):
            actions[:] = script[t]
        obs, reward, terminated, truncated, info = vec.step(actions)
        for i, single in enumerate(singles):
            where = f"{track}/{benchmark}/{limits} t={t} env={i} action={MENU[actions[i]].name}"
            if done[i]:  # next-step autoreset: the action is ignored
                rows[i] = single.reset()
                assert (reward[i], terminated[i], truncated[i]) == (0.0, False, False), where
                assert not info["_ok"][i], where
                continue
            s_obs, s_reward, s_term, s_trunc, s_info = single.step(actions[i])
            rows[i] = (s_obs, s_info)
            assert (reward[i], terminated[i], truncated[i]) == (s_reward, s_term, s_trunc), where
            assert info["n_calls"][i] == len(s_info["calls"]), where
            for key in ("ok", "error", "cost_usd", "budget_left_usd", "spent_usd"):
                assert info[f"_{key}"][i] and info[key][i] == scalar_value(s_info, key), f"{where} {key}"
            ended += s_info["errors"]
            if s_term or s_trunc:
                ended.append(s_info["end_reason"])
                for key in END_KEYS:
                    want, got = scalar_value(s_info, key), info[key][i]
                    assert info[f"_{key}"][i] and (got == want or (got != got and want != want)), \
                        f"{where} {key}: {got!r} != {want!r}"
            else:
                assert "_end_reason" not in info or not info["_end_reason"][i], where
        done = terminated | truncated
        if (vec.n_ckpt > 0).any():
            ended.append("trained")
    for i, (s_obs, _) in enumerate(rows):
        np.testing.assert_array_equal(obs[i], s_obs)
    vec.close()
    return ended


@pytest.mark.parametrize("track", sorted(TRACK_ENV_IDS))
@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_every_row_equals_the_scalar_menu(track, benchmark):
    j = (sorted(TRACK_ENV_IDS).index(track) + BENCHMARKS.index(benchmark))
    seen = [reason for r in range(2) for reason in play(track, benchmark, LIMITS[(j + r) % len(LIMITS)], seed=10 * j + r)]
    assert len(set(seen) & {"submitted", "step limit", "time limit"}) >= 1, seen
    SEEN.update(seen)


SEEN: set[str] = set()


def test_money_runs_out_to_the_nano_dollar():
    """A budget of one evaluation's bill (and two nano-dollars: the hold rounds up): the wait that settles it
    leaves less than a cent (budget exhausted); a nano-dollar less and the same evaluation is refused."""
    probe = MenuArrayEnv(1, track="harness", benchmark="gpqa-diamond")
    probe.reset(seed=4)
    cost = float(probe.step(np.array([MENU_INDEX["eval_latest_k1"]]))[4]["cost_usd"][0])
    first = (MENU_INDEX["eval_latest_k1"],)
    reasons = play("harness", "gpqa-diamond", (cost + 2e-9, None, None), seed=4, n=1, steps=4, script=first)
    assert reasons[0] == "budget exhausted", reasons
    reasons = play("harness", "gpqa-diamond", (cost - 1e-9, None, None), seed=4, n=1, steps=4, script=first)
    assert reasons[0] == "insufficient_budget", reasons
    play("harness", "gpqa-diamond", (cost, None, None), seed=4, n=1, steps=4, script=first)  # the hold rounds up


def test_submit_best_breaks_a_tie_as_the_menu_does():
    """aime seed 129: base + the minimal harness and base + the verify fix both score 0.2833 on dev (k=1) but
    differ officially; ``submit_best`` takes the first scored, as ``MenuAdapter.best_candidate`` does."""
    script = (MENU_INDEX["eval_latest_k1"], MENU_INDEX["fix:unverified_completion"], MENU_INDEX["eval_latest_k1"],
              MENU_INDEX["submit_best"])
    assert play("harness", "aime", (500.0, None, None), seed=129, n=1, steps=4, script=script) == ["submitted"]


def test_the_parity_runs_cover_every_end_and_refusal():
    """Run after the parity tests (file order): their episodes ended in every way the macros can reach, and
    the env refused calls for each reason they can meet."""
    if len(SEEN) < 3:
        pytest.skip("run with the parity tests above")
    assert {"submitted", "step limit", "time limit", "budget exhausted", "insufficient_budget", "no_running_jobs",
            "harness_patch_failed", "forbidden_tool", "field_locked", "unknown_ref", "trained"} <= SEEN, SEEN


def test_out_of_range_actions_are_an_error():
    vec = MenuArrayEnv(2, benchmark="aime")
    vec.reset(seed=0)
    with pytest.raises(ValueError, match="menu index"):
        vec.step(np.array([0, len(MENU)]))


@pytest.mark.parametrize("track", sorted(TRACK_ENV_IDS))
def test_the_shipped_policy_plays_the_same(track):
    """The shipped RL policy (greedy, and sampled from a seeded generator) over the array env and over
    ``DiscreteMenu`` on the scalar env: the same rows on every benchmark, so the same returns."""
    params = shared_policy(default_policy_path())
    for benchmark in BENCHMARKS:
        n = 4
        vec = MenuArrayEnv(n, track=track, benchmark=benchmark, budget_usd=500)
        singles = [DiscreteMenu(gym.make(TRACK_ENV_IDS[track], benchmark=benchmark, budget_usd=500)) for _ in range(n)]
        obs, info = vec.reset(seed=1)
        s_rows = [single.reset(seed=1 + i) for i, single in enumerate(singles)]
        rng = np.random.default_rng(0)
        done = np.zeros(n, bool)
        for t in range(30):
            for i, (s_obs, s_info) in enumerate(s_rows):
                np.testing.assert_array_equal(obs[i], s_obs, err_msg=f"{benchmark} t={t} env={i}")
                np.testing.assert_array_equal(info["action_mask"][i], s_info["action_mask"])
            actions, _ = policy_actions(params, obs.astype(np.float64), info["action_mask"], rng if t % 2 else None)
            obs, reward, terminated, truncated, info = vec.step(actions)
            for i, single in enumerate(singles):
                if done[i]:
                    s_rows[i] = single.reset()
                    continue
                s_obs, s_reward, s_term, s_trunc, s_info = single.step(int(actions[i]))
                s_rows[i] = (s_obs, s_info)
                assert (reward[i], terminated[i], truncated[i]) == (s_reward, s_term, s_trunc), f"{benchmark} t={t}"
            done = terminated | truncated


def test_many_rows_cleaning_at_once():
    """Twelve rows generating twice, then cleaning with a step limit that falls inside the clean: each row's
    episode ends in the middle of its ``clean`` (and stops there), and every other row's cleaning in that
    step goes on as in its own scalar env."""
    gen = MENU_INDEX["gen:gpt-6-astra:50"]
    seen = play("data", "gpqa-diamond", (500.0, 6, None), seed=21, n=12, steps=6, script=(gen, gen, MENU_INDEX["clean"]))
    assert seen.count("step limit") >= 6, seen


def test_a_candidate_scored_eight_times_and_more():
    """Eleven evaluations of one candidate: from the eighth score on its mean is NumPy's pairwise one (the
    adapter's ``np.mean``), below it a running sum; both as the scalar menu's ``dev_latest_candidate``."""
    evaluate = MENU_INDEX["eval_latest_k1"]
    vec = MenuArrayEnv(1, track="harness", benchmark="aime", budget_usd=2000)
    vec.reset(seed=3)
    for _ in range(11):
        vec.step(np.array([evaluate]))
    assert vec.n_scores[0].max() == 11 and len(vec._score_lists) == 1
    assert play("harness", "aime", (2000.0, None, None), seed=3, n=2, steps=12, script=(evaluate,) * 11) == ["submitted"]


def test_generations_in_chunks_cleaned_into_pools_then_trained():
    """``gen:<teacher>:max`` (chunks cut to fit), ``clean`` (each chunk filtered and deduplicated, mixed with
    the teacher's pool), again, then training on the pool: every row as its scalar menu."""
    gen, clean, train = (MENU_INDEX[name] for name in ("gen:deepseek-v4.1-flash:max", "clean", "train:lr=0.0003"))
    script = (gen, gen, clean, gen, clean, train, MENU_INDEX["eval_latest_k1"])
    seen = play("joint", "gpqa-diamond", (500.0, None, None), seed=5, n=6, steps=10, script=script)
    assert seen.count("trained") >= 1, seen


def test_the_array_roundings_are_pythons():
    """``round_digits``, ``nano_up`` and ``nano_near`` (NumPy passes) against Python's ``round`` and the
    ledger's converters on random amounts of every magnitude the env meets, exact halves and values one
    float step either side of them."""
    from rsigym_env.menu_vector import nano_near, nano_up, round_digits
    from rsigym_env.platform.ledger import _nano_near, _nano_up

    rng = np.random.default_rng(7)
    values = np.concatenate([rng.random(20_000) * 10.0 ** rng.integers(-9, 4, 20_000),
                             rng.integers(0, 10**9, 5_000) / 1e9, rng.integers(0, 20_000, 5_000) / 20_000])
    halves = (rng.integers(0, 10**7, 3_000) + 0.5) / 1e4
    values = np.concatenate([values, halves, np.nextafter(halves, 0), np.nextafter(halves, 1)])
    for digits in (4, 9):
        assert round_digits(values, digits).tolist() == [round(v, digits) for v in values.tolist()]
    usd = values[values < 1e3]
    assert nano_up(usd).tolist() == [_nano_up(v) for v in usd.tolist()]
    assert nano_near(usd).tolist() == [_nano_near(v) for v in usd.tolist()]


def test_two_candidates_scored_in_turn_eight_times_and_more():
    """The base and the trained checkpoint evaluated in turn, nine times each: from its eighth score on, each
    candidate's mean is NumPy's over its own scores (the row's score log holds both, interleaved); every row as
    its scalar menu."""
    gen, train = MENU_INDEX["gen:gpt-6-astra:50"], MENU_INDEX["train:lr=0.0003"]
    base, latest = MENU_INDEX["eval_base_k3"], MENU_INDEX["eval_latest_k3"]
    script = (gen, train) + (base, latest) * 9
    vec = MenuArrayEnv(2, track="joint", benchmark="aime", budget_usd=2000, time_limit_h=1000)
    vec.reset(seed=8)
    for action in script:
        vec.step(np.full(2, action))
    assert (np.sort(vec.n_scores, axis=1)[:, -3:] == [0, 9, 9]).all() and len(vec._score_lists) == 4
    assert "trained" in play("joint", "aime", (2000.0, None, 1000.0), seed=8, n=2, steps=len(script) + 2, script=script)
