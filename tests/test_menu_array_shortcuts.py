"""``MenuArrayEnv``'s shortcuts leave what the direct way gives. The clean in two passes (``_clean_ahead``: every
row's filters and dedupes at once, as if each call ran, kept up to a row's first call where that is not so)
leaves every array of the env's state as the pass per dataset and operation alone (``_transform``) leaves it,
step after step: refusals for money, limits reached inside a clean, filters that keep nothing. Episode seeds
drawn 32 at a time per row are the ones a draw per reset gives (``ResearchEnv.reset``'s). Parity with the scalar
env is ``tests/test_menu_vector.py``'s."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils import seeding
from menu_helpers import masked_uniform

from rsigym_env.menu_vector import MENU_INDEX, MenuArrayEnv


def state(env: MenuArrayEnv) -> dict[str, np.ndarray]:
    """Every array of the env's state; the dataset arrays cut to the slots in use (their spare width may differ)."""
    used = max(1, int(env.n_ds.max()))
    return {name: value[:, :used] if name.startswith("ds_") else value
            for name, value in vars(env).items() if isinstance(value, np.ndarray)}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray], step: int) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].shape == b[name].shape and a[name].tobytes() == b[name].tobytes() if a[name].dtype != object \
            else a[name].tolist() == b[name].tolist(), f"{name} differs at step {step}"


@pytest.mark.parametrize(("track", "benchmark", "budget"), [("joint", "swe-bench-verified", 500), ("data", "aime", 20),
                                                            ("joint", "gpqa-diamond", 8)])
def test_the_clean_in_two_passes_leaves_the_state_of_a_pass_per_call(monkeypatch, track, benchmark, budget):
    ahead = MenuArrayEnv(64, track=track, benchmark=benchmark, budget_usd=budget)
    kept = []
    real = MenuArrayEnv._clean_ahead

    def counting(self, rows, todo, count, cleaned):
        done = real(self, rows, todo, count, cleaned)
        kept.append((int(done.sum()), int(count.sum()), int((done < count).sum())))
        return done

    monkeypatch.setattr(MenuArrayEnv, "_clean_ahead", counting)
    one_by_one = MenuArrayEnv(64, track=track, benchmark=benchmark, budget_usd=budget)
    one_by_one._clean_ahead = lambda rows, todo, count, cleaned: np.zeros(rows.size, np.int64)
    rng = np.random.default_rng(7)
    infos = [env.reset(seed=11)[1] for env in (ahead, one_by_one)]
    for step in range(120):
        mask = infos[0]["action_mask"]
        actions = masked_uniform(rng, mask)
        outs = [env.step(actions) for env in (ahead, one_by_one)]
        infos = [out[4] for out in outs]
        for x, y in zip(outs[0][:4], outs[1][:4]):
            assert x.tobytes() == y.tobytes()
        assert_same(state(ahead), state(one_by_one), step)
    ran, asked, cut = map(sum, zip(*kept))
    assert ran > asked / 2 and cut > 0  # most datasets cleaned ahead, and some rows stopped early and went on alone


def test_episode_seeds_drawn_ahead_are_the_draws_one_per_reset():
    """Rows that submit every step start ~50 episodes each (autoresets, a reset with new seeds in between, one
    row reseeded alone): each episode seed is the next ``integers(2**31 - 1)`` of the row's generator."""
    env = MenuArrayEnv(3, track="harness", benchmark="aime", budget_usd=100)
    env.reset(seed=40)
    generators = [seeding.np_random(40 + i)[0] for i in range(3)]
    expected = lambda: [int(g.integers(2**31 - 1)) for g in generators]  # noqa: E731
    seen, want = [env.episode_seeds.tolist()], [expected()]
    submit = np.full(3, MENU_INDEX["submit_latest"])
    for step in range(100):
        if step == 40:
            env.reset(seed=[7, None, 9])  # rows 0 and 2 get new generators, row 1 keeps its own
            generators[0], generators[2] = seeding.np_random(7)[0], seeding.np_random(9)[0]
            seen.append(env.episode_seeds.tolist())
            want.append(expected())
        *_, info = env.step(submit)
        if step % 2:  # every other step is the autoreset of the episodes the step before ended
            seen.append(env.episode_seeds.tolist())
            want.append(expected())
    assert seen == want and len(seen) > 40  # more than one batch of 32 per row


def test_worlds_drawn_ahead_are_the_worlds_their_seeds_give_in_few_passes(monkeypatch):
    """An autoresetting row's next worlds (and their initial official scores) are drawn ahead, many rows a pass: over
    80 harness steps of 24 rows (~5 episodes each) a few passes draw every world, and each episode's world and
    initial score are what its seed gives alone (``SimBatch.make`` of that seed, evaluated there). A row reset with
    a seed draws only the world it needs."""
    from rsigym_env.worlds.sim import batch as batch_module
    from rsigym_env.worlds.sim.batch import HarnessArrays, SimBatch

    passes, real = [], batch_module.draw_worlds
    monkeypatch.setattr(batch_module, "draw_worlds",
                        lambda benchmark, seeds, **kw: passes.append(len(seeds)) or real(benchmark, seeds, **kw))
    n, rng = 24, np.random.default_rng(3)
    env = MenuArrayEnv(n, track="harness", benchmark="gpqa-diamond", budget_usd=50)
    del passes[:]  # (the env's batch and the room for the worlds ahead)
    obs, info = env.reset(seed=5)
    assert passes == [n]  # seeded resets: the worlds they need
    seen = {(i, int(s)): float(v) for i, (s, v) in enumerate(zip(env.episode_seeds, env.initial_official))}
    episodes = 0
    for _ in range(80):
        mask = info["action_mask"]
        obs, _, terminated, truncated, info = env.step(masked_uniform(rng, mask))
        episodes += int((terminated | truncated).sum())
        seen.update({(i, int(s)): float(v) for i, (s, v) in enumerate(zip(env.episode_seeds, env.initial_official))})
    assert episodes > 3 * n and len(passes) <= 1 + 80 // 8  # a pass per step would be one per step with an episode's end
    seeds = sorted({s for _, s in seen})
    alone = SimBatch.make("gpqa-diamond", seeds)
    harness = HarnessArrays.of([alone.initial_harness()] * len(seeds))
    scores = alone.evaluate(alone.base_skill, np.zeros(len(seeds)), harness, k=env.scenario.official_k,
                            split="official").score
    by_seed = dict(zip(seeds, scores.tolist()))
    assert all(by_seed[s] == v for (_, s), v in seen.items())
    env.reset(seed=[None] * (n - 2) + [8, 9], options={"reset_mask": np.arange(n) >= n - 2})
    assert (env._world_end[-2:] == env._seed_at[-2:]).all()  # the reseeded rows: their world, none ahead
    del passes[:]
    for seed in (1, 2, 3):  # resets with seeds only: the worlds they need, as one draw per reset would
        env.reset(seed=seed)
    assert passes == [n, n, n]
