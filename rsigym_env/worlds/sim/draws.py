"""The sim's random numbers: counter-based, so N worlds draw in one NumPy pass (sim result version 5).

Every number the sim draws is a pure function of ``(seed, benchmark, stream, call, index)``: a stream's
key is a hash of the first three, and the ``call``-th draw of ``size`` numbers from it is SplitMix64
seeded by ``hash(key, call)``, outputs ``1..size``. A world's numbers therefore never depend on how many
other worlds are drawn with it, in what order, or on the machine (integer arithmetic; the float
transforms are the pinned NumPy ufuncs of :mod:`rsigym_env.numerics`). This replaces the per-stream
PCG64 generators of result versions up to 4, which had to be called once per world.

>>> keys = stream_keys(np.array([0, 1], dtype=np.uint64), benchmark_key("aime"), "eval")
>>> u = uniforms(keys, np.array([0, 0], dtype=np.uint64), 4)
>>> u.shape, bool(((u > 0) & (u < 1)).all())
((2, 4), True)
>>> bool((uniforms(keys[1:], np.array([0], dtype=np.uint64), 4) == u[1:]).all())  # a row alone is the same
True
>>> [round(float(x), 6) for x in norm_ppf(np.array([0.025, 0.5, 0.975]))]
[-1.959964, 0.0, 1.959964]
>>> norm_ppf(0.975).shape, norm_ppf(np.full((2, 3), 0.01)).shape
((), (2, 3))
"""

from __future__ import annotations

import math
import zlib

import numpy as np

STREAMS = ("world", "official", "data", "train", "eval", "infer", "table")
"""The streams of a world, in the order their index enters the key (``table``: a benchmark's fixed tasks,
drawn with seed 0)."""

_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment (golden ratio)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))
_UNIT = 2.0**-53
MAX_SEED = 2**64 - 1


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on a uint64 array (wrapping arithmetic; a new array)."""
    z = z ^ (z >> _S30)
    return _mix64_tail(z)


def _mix64_tail(z: np.ndarray) -> np.ndarray:
    """The rest of :func:`mix64` after its first xor-shift, in place on ``z``."""
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def benchmark_key(benchmark: str) -> int:
    """A benchmark's part of every key (its CRC-32, as the sim used before)."""
    return zlib.crc32(benchmark.encode())


def seed_array(seeds: object) -> np.ndarray:
    """World seeds as uint64; refuses negative seeds and seeds of more than 64 bits.

    >>> seed_array([0, 7]).tolist()
    [0, 7]
    >>> seed_array(np.array([3, 2**31 - 2])).tolist()  # an integer array: checked and cast as arrays
    [3, 2147483646]
    """
    if isinstance(seeds, np.ndarray) and seeds.dtype.kind in "iu":  # every value fits 64 bits; signed: >= 0
        if seeds.dtype.kind == "u" or not (seeds < 0).any():
            return np.atleast_1d(seeds).astype(np.uint64)
    values = [int(s) for s in np.atleast_1d(np.asarray(seeds, dtype=object)).tolist()]
    if any(not 0 <= s <= MAX_SEED for s in values):
        raise ValueError(f"world seeds must be integers from 0 to 2**64 - 1, got {values}")
    return np.array(values, dtype=np.uint64)


def stream_keys(seeds: np.ndarray, benchmark: int, stream: str) -> np.ndarray:
    """(N,) uint64: the key of ``stream`` in each world ``(seed, benchmark)``."""
    return streams_keys(seeds, benchmark, (stream,))[0]


def streams_keys(seeds: np.ndarray, benchmark: int, streams: tuple[str, ...]) -> np.ndarray:
    """(len(streams), N) uint64: :func:`stream_keys` of each stream, the world's part mixed once.

    >>> seeds = np.array([0, 5], dtype=np.uint64)
    >>> both = streams_keys(seeds, 7, ("data", "train"))
    >>> bool((both[1] == stream_keys(seeds, 7, "train")).all()), both.shape
    (True, (2, 2))
    """
    index = np.array([STREAMS.index(stream) + 1 for stream in streams], dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = mix64(seeds.astype(np.uint64) + _GAMMA)
        z = mix64(z ^ np.uint64(benchmark) * _M1 + _GAMMA)
        return mix64(z + index[:, None] * _GAMMA)


def uniforms(keys: np.ndarray, counters: np.ndarray, size: int) -> np.ndarray:
    """(N, size) uniforms in (0, 1): draw number ``counters[i]`` of stream ``keys[i]`` (53 bits each)."""
    state = mix64(keys ^ mix64(counters.astype(np.uint64) * _GAMMA + _M2))
    z = state[:, None] + _steps(size)
    z ^= z >> _S30
    bits = _mix64_tail(z)
    bits >>= _S11
    out = bits.astype(np.float64)
    out += 0.5
    out *= _UNIT
    return out


_STEPS: dict[int, np.ndarray] = {}


def _steps(size: int) -> np.ndarray:
    """``(1..size) * GAMMA`` (read-only, cached per size)."""
    steps = _STEPS.get(size)
    if steps is None:
        steps = _STEPS[size] = np.arange(1, size + 1, dtype=np.uint64) * _GAMMA
        steps.flags.writeable = False
    return steps


# Wichura's AS241 (PPND16) as Python's statistics.NormalDist.inv_cdf computes it, element-wise.
_A = (2.5090809287301226727e+3, 3.3430575583588128105e+4, 6.7265770927008700853e+4, 4.5921953931549871457e+4,
      1.3731693765509461125e+4, 1.9715909503065514427e+3, 1.3314166789178437745e+2, 3.3871328727963666080e+0)
_B = (5.2264952788528545610e+3, 2.8729085735721942674e+4, 3.9307895800092710610e+4, 2.1213794301586595867e+4,
      5.3941960214247511077e+3, 6.8718700749205790830e+2, 4.2313330701600911252e+1, 1.0)
_C = (7.74545014278341407640e-4, 2.27238449892691845833e-2, 2.41780725177450611770e-1, 1.27045825245236838258e+0,
      3.64784832476320460504e+0, 5.76949722146069140550e+0, 4.63033784615654529590e+0, 1.42343711074968357734e+0)
_D = (1.05075007164441684324e-9, 5.47593808499534494600e-4, 1.51986665636164571966e-2, 1.48103976427480074590e-1,
      6.89767334985100004550e-1, 1.67638483018380384940e+0, 2.05319162663775882187e+0, 1.0)
_E = (2.01033439929228813265e-7, 2.71155556874348757815e-5, 1.24266094738807843860e-3, 2.65321895265761230930e-2,
      2.96560571828504891230e-1, 1.78482653991729133580e+0, 5.46378491116411436990e+0, 6.65790464350110377720e+0)
_F = (2.04426310338993978564e-15, 1.42151175831644588870e-7, 1.84631831751005468180e-5, 7.86869131145613259100e-4,
      1.48753612908506148525e-2, 1.36929880922735805310e-1, 5.99832206555887937690e-1, 1.0)


def _poly_pair(x: np.ndarray, pair: np.ndarray) -> np.ndarray:
    """Two polynomials at ``x`` by Horner's rule in one pass (``pair``: (k, 2, 1), the coefficients of both,
    highest first): (2, len(x)), each element's products and sums the same floats as one at a time.

    >>> _poly_pair(np.array([2.0, 3.0]), np.array([[1.0, 2.0], [0.0, 1.0]])[:, :, None]).tolist()
    [[2.0, 3.0], [5.0, 7.0]]
    """
    out = x * pair[0]  # = full_like(x, c0) * x: the same products, one call fewer
    out += pair[1]
    for c in pair[2:]:
        out *= x
        out += c
    return out


_AB, _CD, _EF = (np.array(pair).T[:, :, None] for pair in ((_A, _B), (_C, _D), (_E, _F)))


def norm_ppf(p: np.ndarray) -> np.ndarray:
    """The standard normal quantile of each ``p`` in (0, 1) (AS241, as ``NormalDist().inv_cdf``)."""
    shape = np.shape(p)
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    q = p - 0.5
    r = 0.180625 - q * q
    top, bottom = _poly_pair(r, _AB)
    out = q * top / bottom  # the central branch, right for |q| <= 0.425
    tails = np.abs(q) > 0.425
    if tails.any():  # each element is computed as alone: the branches only pick which formula
        pt, qt = p[tails], q[tails]
        rt = np.sqrt(-np.log(np.where(qt > 0.0, 1.0 - pt, pt)))
        near = rt - 1.6
        top, bottom = _poly_pair(near, _CD)
        x = top / bottom
        if (rt > 5.0).any():  # p below ~1e-11: rare
            far = rt - 5.0
            top, bottom = _poly_pair(far, _EF)
            x = np.where(rt <= 5.0, x, top / bottom)
        out[tails] = np.where(qt < 0.0, -x, x)
    return out.reshape(shape)


def norm_cdf(x: np.ndarray | float) -> np.ndarray:
    """The standard normal CDF, element-wise (``math.erfc``; used on a handful of values per call)."""
    x = np.asarray(x, dtype=np.float64)
    return np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2.0)), otypes=[np.float64])(x)


def binomial(n: np.ndarray | int, p: np.ndarray | float, u: np.ndarray | float) -> np.ndarray:
    """An aggregate draw of a Binomial(n, p) count from one uniform ``u``: the normal approximation,
    rounded and clipped to 0..n (exact where p is 0 or 1).

    >>> binomial(np.array([100, 100, 0]), np.array([0.5, 0.0, 0.3]), np.array([0.5, 0.9, 0.9])).tolist()
    [50, 0, 0]
    """
    n = np.asarray(n, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    mean = n * p
    sd = np.sqrt(mean * (1.0 - p))
    count = np.floor(mean + sd * norm_ppf(u) + 0.5)
    return np.minimum(np.maximum(count, 0.0), n).astype(np.int64)  # np.clip's counts (clip's Python wrapper costs more)


class Streams:
    """One world's streams as counters (the scalar sim's view of the array draws: N = 1).

    >>> s = Streams(3, benchmark_key("aime"))
    >>> a = s.uniforms("eval", 5); b = s.uniforms("eval", 5)
    >>> a.shape, bool((a != b).any()), s.counters["eval"]
    ((5,), True, 2)
    """

    def __init__(self, seed: int, benchmark: int):
        self.seeds = seed_array([seed])
        self.benchmark = benchmark
        self.counters = dict.fromkeys(STREAMS, 0)
        self._keys = {name: stream_keys(self.seeds, benchmark, name) for name in STREAMS}

    def key(self, stream: str) -> np.ndarray:
        return self._keys[stream]

    def at(self, stream: str, counter: int, size: int) -> np.ndarray:
        """Draw number ``counter`` of the stream (1-D, ``size`` uniforms); moves no counter."""
        return uniforms(self._keys[stream], np.array([counter], dtype=np.uint64), size)[0]

    def uniforms(self, stream: str, size: int) -> np.ndarray:
        """The stream's next ``size`` uniforms (1-D); advances its counter by one."""
        counter = self.counters[stream]
        self.counters[stream] = counter + 1
        return uniforms(self._keys[stream], np.array([counter], dtype=np.uint64), size)[0]
