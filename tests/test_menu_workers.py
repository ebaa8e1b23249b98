"""The vector sim's rows on worker processes (``MenuWorkersEnv``, ``make_vec(..., menu=True, num_workers=W)``):
every row's observation, reward, ends and whole info equal the one-process ``MenuArrayEnv``'s, bit for bit, on
every track and autoreset mode, with uneven shards; the ledger (written in the main process) equals the
one-process env's entry for entry and ``rsigym audit verify`` accepts it; failures are errors naming the worker,
never hangs; bad input is refused before anything is sent."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from ledger_helpers import ledger_state
from menu_helpers import assert_seeded_runs_repeat, bad_actions, masked_uniform

import rsigym_env  # noqa: F401  (registers the ids)
from rsigym_env.cli import main as rsigym
from rsigym_env.menu_vector import MenuArrayEnv
from rsigym_env.menu_workers import MenuWorkersEnv
from rsigym_env.platform import ledger as ledger_module
from rsigym_env.platform.ledger import Ledger
from rsigym_env.wrappers.menu import FEATURES, MENU, MENU_INDEX


def same(a: Any, b: Any, where: str) -> None:
    """Equal, bit for bit: arrays with their dtypes (NaN where NaN), dicts key for key in order, object arrays
    element by element."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (where, list(a), list(b))
        for key in a:
            same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, (where, a, b)
        if a.dtype == object:
            for i, (x, y) in enumerate(zip(a.tolist(), b.tolist())):
                same(x, y, f"{where}[{i}]")
        else:
            assert a.tobytes() == b.tobytes(), (where, a, b)
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def play(env: Any, mode: AutoresetMode, steps: int, seed: int) -> tuple[list[Any], int]:
    """Seeded masked-uniform play (some masked entries too, which the env refuses), a reset that cuts the running
    episodes short halfway; under ``DISABLED`` the ended envs are reset with ``reset_mask`` (one of them with a
    seed of its own). Returns everything the env returned and its money arrays after each step, and how many
    episodes ended."""
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    trace: list[Any] = [obs, info]
    ends = 0
    for i in range(steps):
        if i == steps // 2:
            obs, info = env.reset(seed=seed + 100)
            trace += [obs, info]
        actions = masked_uniform(rng, info["action_mask"])
        if i % 7 == 3:  # a masked entry now and then: refused, counted
            actions[rng.integers(env.num_envs)] = rng.integers(len(MENU))
        obs, reward, terminated, truncated, info = env.step(actions)
        trace += [obs, reward, terminated, truncated, info]
        ends += int((terminated | truncated).sum())
        if mode == AutoresetMode.DISABLED and (terminated | truncated).any():
            ended = terminated | truncated
            seeds = [int(rng.integers(1000)) if j == int(np.flatnonzero(ended)[0]) else None
                     for j in range(env.num_envs)]
            obs, info = env.reset(seed=seeds, options={"reset_mask": ended})
            trace += [obs, info]
        trace += [env.budget_left_usd, env.spent_usd, env.refusals.copy(), env.episodes.copy(), env.steps.copy()]
    return trace, ends


PARITY = [  # track, benchmark, N, W, autoreset mode, ledger writing
    ("joint", "aime", 5, 2, AutoresetMode.NEXT_STEP, "episode"),
    ("joint", "swe-bench-verified", 7, 3, AutoresetMode.DISABLED, "step"),
    ("data", "swe-bench-verified", 7, 3, AutoresetMode.SAME_STEP, "episode"),
    ("data", "aime", 5, 2, AutoresetMode.NEXT_STEP, "step"),
    ("harness", "gpqa-diamond", 6, 2, AutoresetMode.DISABLED, "episode"),
    ("harness", "aime", 5, 3, AutoresetMode.SAME_STEP, "episode"),
]


@pytest.mark.parametrize("track, benchmark, n, workers, mode, write", PARITY)
def test_rows_on_workers_equal_one_process_bit_for_bit(tmp_path: Path, track, benchmark, n, workers, mode, write):
    """The same seeds and actions through ``MenuArrayEnv`` and ``MenuWorkersEnv``: every observation, reward, end,
    info (its keys, masks, values, ``final_obs``/``final_info``) and money array equal; so do the ledgers (at a
    fixed wall time, with the same key secret: audit rows with their hashes, accounts), through autoresets, a
    reset and ``close`` that cut episodes short; ``rsigym audit verify`` accepts the workers' file."""
    budget = {"joint": 20, "data": 15, "harness": 60}[track]
    kw = dict(track=track, benchmark=benchmark, budget_usd=budget, autoreset_mode=mode, write_episodes=write)
    traces, ends, states = [], [], []
    with mock.patch.object(ledger_module, "time", mock.Mock(time=lambda: 1_800_000_000.5)):
        for w in (1, workers):
            path = tmp_path / f"w{w}.sqlite"
            env = (MenuArrayEnv(n, ledger_path=path, **kw) if w == 1
                   else MenuWorkersEnv(n, num_workers=w, ledger_path=path, **kw))
            env._key_secret = "same-keys"
            trace, ended = play(env, mode, 36, seed=n * 10)
            traces.append(trace)
            ends.append(ended)
            env.close()
            with Ledger(path, readonly=True) as ledger:
                states.append(ledger_state(ledger))
    one, many = traces
    assert len(one) == len(many)
    for i, (a, b) in enumerate(zip(one, many)):
        same(a, b, f"item {i}")
    assert ends[0] == ends[1] >= n, "episodes must end (and reset) for the test to mean anything"
    assert states[0] == states[1] and len(states[0][1]) >= 2
    text = str([row[2] for row in states[1][0]])
    assert all(f"'end_reason': '{why}'" in text for why in ("reset", "closed"))
    assert rsigym(["audit", "verify", str(tmp_path / f"w{workers}.sqlite")]) == 0


def test_a_broken_parity_or_ledger_is_seen():
    """The comparison itself: a changed bit in an observation, a mask or an info value fails it."""
    info = {"ok": np.array([True, False]), "_ok": np.array([True, True]), "error": np.array(["", "x"], dtype=object)}
    same(info, {key: value.copy() for key, value in info.items()}, "info")
    for change in ({"ok": np.array([True, True])}, {"error": np.array(["", "y"], dtype=object)},
                   {"ok": np.array([1, 0])}):
        with pytest.raises(AssertionError):
            same(info, {**info, **change}, "info")
    with pytest.raises(AssertionError):
        same(np.float32([0.5, 0.25]), np.float32([0.5, np.nextafter(np.float32(0.25), np.float32(1))]), "obs")


@pytest.fixture(scope="module")
def vec():
    env = gym.make_vec("RSIGym/Data-v0", num_envs=5, vectorization_mode="vector_entry_point", menu=True,
                       num_workers=2, benchmark="gpqa-diamond", budget_usd=300)
    yield env
    env.close()


def test_make_vec_builds_it_for_num_workers(vec):
    assert isinstance(vec, MenuWorkersEnv) and vec.spec is not None and vec.spec.id == "RSIGym/Data-v0"
    assert vec.spec.kwargs["num_workers"] == 2 and vec.shards == [(0, 2), (2, 5)] and len(vec.worker_pids) == 2
    assert vec.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP and vec.unwrapped is vec
    assert vec.observation_space == gym.spaces.Box(-1.0, 1.0, (5, len(FEATURES)), np.float32)
    assert vec.single_action_space == gym.spaces.Discrete(len(MENU)) and vec.action_space.shape == (5,)
    one = gym.make_vec("RSIGym/Data-v0", num_envs=5, menu=True, num_workers=1, benchmark="gpqa-diamond")
    assert type(one) is MenuArrayEnv  # the default: this process
    one.close()
    for bad in (0, 6, 1.5, True, "2"):
        with pytest.raises(ValueError, match="num_workers must be an integer from 1 to num_envs"):
            gym.make_vec("RSIGym/Data-v0", num_envs=5, menu=True, num_workers=bad, benchmark="gpqa-diamond")
    with pytest.raises(ValueError, match="num_workers runs the array env"):
        gym.make_vec("RSIGym/Data-v0", num_envs=2, menu=True, array=False, num_workers=2, benchmark="aime")
    with pytest.raises(ValueError, match="num_workers runs the array env"):
        gym.make_vec("RSIGym/Data-v0", num_envs=2, menu=True, world="local", num_workers=2, benchmark="aime")
    with pytest.raises(ValueError, match="start_method"):
        MenuWorkersEnv(2, start_method="fork")


def test_the_vector_env_checks(vec):
    """``check_env``'s questions for a batch: the spaces hold what is returned, seeding reproduces, bad input is
    ``MenuArrayEnv``'s own error, raised before anything reaches a worker, and changes nothing."""
    with pytest.raises(gym.error.ResetNeeded):
        vec.step(np.zeros(5, np.int64))
    assert_seeded_runs_repeat(vec, 5)
    before = (vec.spent_usd.copy(), vec.refusals, vec.steps)
    sent = []
    with mock.patch.object(vec, "_call", side_effect=lambda *a, **k: sent.append(a)):
        for bad in bad_actions(5):
            with pytest.raises(ValueError, match="menu index"):
                vec.step(bad)
        for options in ({"reset_mask": [1, 0, 0, 0, 0]}, {"colour": "red"}):
            with pytest.raises(ValueError, match="reset_mask|unknown reset options"):
                vec.reset(options=options)
        with pytest.raises(ValueError, match="one seed per env"):
            vec.reset(seed=[1, 2])
    assert sent == []
    for now, then in zip((vec.spent_usd, vec.refusals, vec.steps), before):
        np.testing.assert_array_equal(now, then)
    obs, *_ = vec.step(np.full(5, MENU_INDEX["wait"]))  # still usable
    assert obs.shape == (5, len(FEATURES))


def test_disabled_autoreset_needs_a_reset_named_by_global_rows():
    off = MenuWorkersEnv(4, num_workers=2, autoreset_mode="Disabled", track="harness", benchmark="aime",
                         budget_usd=100)
    off.reset(seed=0)
    probe, submit = MENU_INDEX["eval_latest_k1"], MENU_INDEX["submit_latest"]
    off.step([probe, probe, submit, probe])
    with pytest.raises(gym.error.ResetNeeded, match=r"envs \[2\] have ended"):
        off.step([probe] * 4)
    obs, info = off.reset(seed=[None, None, 7, None], options={"reset_mask": np.array([False, False, True, False])})
    assert info["_seed"].tolist() == [False, False, True, False] and off.steps.tolist()[2] == 0
    off.step([probe] * 4)
    off.close()
    with pytest.raises(RuntimeError, match="closed"):
        off.step([probe] * 4)


def test_a_killed_worker_is_an_error_naming_it_not_a_hang(tmp_path: Path):
    """SIGKILL one worker: the next step raises at once (its rows and exit code), every later call says the env is
    broken, and ``close()`` (twice) still writes the live worker's running episodes and stops everything."""
    path = tmp_path / "ledger.sqlite"
    env = MenuWorkersEnv(4, num_workers=2, ledger_path=path, track="joint", benchmark="aime", budget_usd=20,
                         timeout_s=30)
    env.reset(seed=0)
    env.step(np.full(4, MENU_INDEX["eval_latest_k1"]))
    os.kill(env.worker_pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker 1 \(envs 2\.\.3, pid \d+\) died (before|during) step \(exit code -9"):
        env.step(np.full(4, MENU_INDEX["wait"]))
    assert time.monotonic() - start < 10
    with pytest.raises(RuntimeError, match="broken.*worker 1"):
        env.step(np.full(4, MENU_INDEX["wait"]))
    env.close()
    env.close()
    assert not any(p.is_alive() for p in env._processes)
    with Ledger(path, readonly=True) as ledger:
        episodes = [r.event for r in ledger.audit_records() if r.event.get("tool") == "episode"
                    and r.event["op"] in ("settle", "record")]
    assert [e["end_reason"] for e in episodes] == ["closed", "closed"]  # worker 0's two rows
    assert rsigym(["audit", "verify", str(path)]) == 0


def test_a_worker_that_raises_or_hangs_is_an_error_with_its_story():
    """A worker's exception comes back with its traceback, naming the worker; a worker that stops answering is a
    timeout error (``timeout_s``), and ``close()`` still stops it."""
    env = MenuWorkersEnv(3, num_workers=3, track="harness", benchmark="aime", budget_usd=100, timeout_s=1.0)
    env.reset(seed=0)
    env._v["actions"][1] = 999  # past the main process's check: worker 1's own MenuArrayEnv refuses it
    with pytest.raises(RuntimeError, match=r"worker 1 \(envs 1\.\.1, pid \d+\) failed in step:.*ValueError: give "
                                           r"one menu index"):
        env._call("step", [("step", None)] * 3)
    env.close()

    env = MenuWorkersEnv(2, num_workers=2, track="harness", benchmark="aime", budget_usd=100, timeout_s=1.0)
    env.reset(seed=0)
    os.kill(env.worker_pids[0], signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"worker 0 \(envs 0\.\.0, pid \d+\) did not answer step within 1 s"):
            env.step(np.full(2, MENU_INDEX["wait"]))
        assert time.monotonic() - start < 5
    finally:
        start = time.monotonic()
        env.close()
    assert time.monotonic() - start < 5 and not any(p.is_alive() for p in env._processes)


def test_an_interrupted_call_breaks_the_env_instead_of_mixing_up_replies():
    """Ctrl-C while the main process waits: the replies still to come would answer the next call, so the env says
    it is broken; ``close()`` still stops the workers."""
    from rsigym_env import menu_workers

    env = MenuWorkersEnv(2, num_workers=2, track="harness", benchmark="aime", budget_usd=100)
    env.reset(seed=0)
    with mock.patch.object(menu_workers, "wait", side_effect=KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            env.step(np.full(2, MENU_INDEX["eval_latest_k1"]))
    with pytest.raises(RuntimeError, match=r"broken \(interrupted during step \(KeyboardInterrupt\)\)"):
        env.step(np.full(2, MENU_INDEX["wait"]))
    start = time.monotonic()
    env.close()
    assert time.monotonic() - start < 5 and not any(p.is_alive() for p in env._processes)
