"""Canonical JSON: the one encoding of values that are hashed or compared as text.

``canonical_dumps`` is ``json.dumps`` with sorted keys and ASCII escapes (``ensure_ascii``, the
stdlib default), compact separators unless ``compact=False``, and an optional ``default`` for other
types. The two variants exist because persisted hashes were made with both: agent ids, harness
versions, replay keys and the audit log's fallback encoder use the compact form; the official
evaluation cache key and the local task-tree digests the stdlib's default separators. Each call site
keeps the variant it has always used, so every stored hash still matches.

>>> canonical_dumps({"b": [1, 2], "a": "é"})
'{"a":"\\\\u00e9","b":[1,2]}'
>>> canonical_dumps({"b": 1, "a": None}, compact=False)
'{"a": null, "b": 1}'
>>> canonical_dumps({"when": object}, default=lambda o: "<type>")
'{"when":"<type>"}'
>>> sha256_hex({"a": 1}) == sha256_hex({"a": 1}, default=str) != sha256_hex({"a": 1}, compact=False)
True
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any, Callable

import numpy as np

Default = Callable[[Any], Any] | None


@functools.lru_cache(maxsize=32)
def _encoder(default: Default, compact: bool) -> json.JSONEncoder:
    return json.JSONEncoder(sort_keys=True, separators=(",", ":") if compact else None, default=default)


def canonical_dumps(value: Any, *, default: Default = None, compact: bool = True) -> str:
    """``json.dumps(value, sort_keys=True, separators=(",", ":") if compact else None, default=default)``.

    Raises what ``json.dumps`` raises (``TypeError`` for a type without ``default``, ``ValueError``
    for a cycle)."""
    return _encoder(default, compact).encode(value)


def sha256_hex(value: Any, *, default: Default = None, compact: bool = True) -> str:
    """The sha256 hex digest of :func:`canonical_dumps` (UTF-8)."""
    return hashlib.sha256(canonical_dumps(value, default=default, compact=compact).encode()).hexdigest()


__all__ = ["canonical_dumps", "sha256_hex"]


def jsonable(value: Any, fallback: Callable[[Any], Any] | None = None) -> Any:
    """``value`` as JSON data: NumPy scalars/arrays as Python numbers/lists, tuples and sets as lists,
    dict keys as strings, non-finite floats as ``None``, pydantic models as their dump; anything else
    as it is, or as ``fallback(value)`` when given (e.g. ``str``: what a program's sandbox is sent).

    >>> jsonable({"a": np.float64(1.5), "b": np.array([1, 2]), "c": float("nan"), 4: {3}})
    {'a': 1.5, 'b': [1, 2], 'c': None, '4': [3]}
    >>> jsonable(object, fallback=lambda o: "<type>")
    '<type>'
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v, fallback) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, fallback) for v in value]
    if isinstance(value, (set, frozenset)):
        return [jsonable(v, fallback) for v in sorted(value, key=repr)]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), fallback)
    if isinstance(value, np.generic):
        return jsonable(value.item(), fallback)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(), fallback)
    return fallback(value) if fallback is not None else value
