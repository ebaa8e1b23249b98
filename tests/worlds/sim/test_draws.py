"""The sim's counter-based draws (result version 5): the same numbers on every machine and at every N."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from rsigym_env.worlds.sim.draws import (
    Streams,
    benchmark_key,
    binomial,
    norm_ppf,
    seed_array,
    stream_keys,
    uniforms,
)


def test_uniforms_are_pinned_integers_turned_into_floats() -> None:
    """Integer hashing: these bits are the same on any machine (a change here is a new result version)."""
    keys = stream_keys(seed_array([0, 2**64 - 1]), benchmark_key("aime"), "eval")
    u = uniforms(keys, np.array([0, 5], dtype=np.uint64), 3)
    assert [float(x).hex() for x in u[0]] == PINNED_U0
    assert ((u > 0) & (u < 1)).all()


PINNED_U0 = ["0x1.c71b0b66e358dp-2", "0x1.9f9433e3726f1p-2", "0x1.542cef988845ep-1"]


def test_a_row_is_the_same_alone_and_among_others() -> None:
    seeds = seed_array(range(50))
    keys = stream_keys(seeds, benchmark_key("skillsbench"), "world")
    counters = np.arange(50, dtype=np.uint64) % 3
    many = uniforms(keys, counters, 200)
    for i in (0, 17, 49):
        assert np.array_equal(uniforms(keys[i : i + 1], counters[i : i + 1], 200)[0], many[i])
    assert np.array_equal(uniforms(keys, counters, 300)[:, :200], many)  # a longer draw extends a shorter one


def test_streams_and_calls_differ() -> None:
    s = Streams(1, benchmark_key("aime"))
    a, b, c = s.uniforms("eval", 100), s.uniforms("eval", 100), s.uniforms("data", 100)
    assert len({a.tobytes(), b.tobytes(), c.tobytes()}) == 3
    assert abs(float(np.concatenate([a, b, c]).mean()) - 0.5) < 0.05


def test_the_normal_quantile_is_normal_dists_bit_for_bit() -> None:
    p = np.concatenate([np.linspace(1e-12, 1 - 1e-12, 20_001), [1e-300, 0.075, 0.925, 0.5, 2**-53]])
    expected = [NormalDist().inv_cdf(float(x)) for x in p]
    assert norm_ppf(p).tolist() == expected
    assert norm_ppf(p[:20_000].reshape(4, -1)).tolist() == np.reshape(expected[:20_000], (4, -1)).tolist()


def test_aggregate_binomial_counts_have_the_binomials_mean_and_spread() -> None:
    u = (np.arange(20_000) + 0.5) / 20_000
    counts = binomial(np.full(u.shape, 400), np.full(u.shape, 0.3), u)
    assert counts.min() >= 0 and counts.max() <= 400
    assert abs(counts.mean() - 120) < 0.1 and abs(counts.std() - (400 * 0.3 * 0.7) ** 0.5) < 0.1
    assert binomial(10, 0.0, 0.99) == 0 and binomial(10, 1.0, 0.01) == 10


def test_seed_arrays_of_integers_are_the_seeds_given_one_by_one() -> None:
    """An integer array (the vector env's episode seeds) is cast as an array: the same seeds as a list gives, a copy,
    and a negative seed is refused as from a list."""
    for given in (np.array([0, 7, 2**31 - 2], np.int64), np.array([2**64 - 1, 3], np.uint64), np.array(5, np.int32)):
        out = seed_array(given)
        assert out.dtype == np.uint64 and out.tolist() == seed_array(np.atleast_1d(given).tolist()).tolist()
        assert not np.shares_memory(out, given)
    with pytest.raises(ValueError, match=r"got \[3, -1\]"):
        seed_array(np.array([3, -1]))
