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
from typing import Any, Callable

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
