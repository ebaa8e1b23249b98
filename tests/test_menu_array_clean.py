"""``MenuArrayEnv``'s clean in two passes (``_clean_ahead``: every row's filters and dedupes at once, as if each
call ran, kept up to a row's first call where that is not so) leaves every array of the env's state as the pass
per dataset and operation alone (``_transform``) leaves it, step after step: refusals for money, limits reached
inside a clean, filters that keep nothing. Parity with the scalar env is ``tests/test_menu_vector.py``'s."""

from __future__ import annotations

import numpy as np
import pytest

from rsigym_env.menu_vector import MenuArrayEnv


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
        actions = np.argmax(np.where(mask, rng.random(mask.shape), -1.0), axis=1)
        outs = [env.step(actions) for env in (ahead, one_by_one)]
        infos = [out[4] for out in outs]
        for x, y in zip(outs[0][:4], outs[1][:4]):
            assert x.tobytes() == y.tobytes()
        assert_same(state(ahead), state(one_by_one), step)
    ran, asked, cut = map(sum, zip(*kept))
    assert ran > asked / 2 and cut > 0  # most datasets cleaned ahead, and some rows stopped early and went on alone
