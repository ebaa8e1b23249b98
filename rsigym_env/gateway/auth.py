"""Run keys and the admin token: random secrets, only their sha256 kept, compared in constant time.

A run key names its run (``rsr_<16 hex run id>_<43 url-safe characters>``), so checking one is a
single constant-time comparison against that run's stored hash, with no search over secrets.

>>> run_id = new_run_id()
>>> key = new_run_key(run_id)
>>> parse_run_key(key) == run_id, parse_run_key("rsr_" + run_id + "_short"), parse_run_key(None)
(True, None, None)
>>> stored = secret_hash(key)
>>> matches(key, stored), matches(key[:-1] + ("A" if key[-1] != "A" else "B"), stored)
(True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

_RUN_KEY = re.compile(r"rsr_([0-9a-f]{16})_[A-Za-z0-9_-]{43}")
_DUMMY = hashlib.sha256(b"rsigym: no such run").hexdigest()


def new_run_id() -> str:
    """A random run id: 16 hex digits."""
    return secrets.token_hex(8)


def new_run_key(run_id: str) -> str:
    """A fresh run key for ``run_id`` (256 random bits)."""
    return f"rsr_{run_id}_{secrets.token_urlsafe(32)}"


def new_admin_token() -> str:
    return "rsa_" + secrets.token_urlsafe(32)


def parse_run_key(key: str | None) -> str | None:
    """The run id a well-formed run key names, else ``None``."""
    if not isinstance(key, str) or len(key) > 100:
        return None
    match = _RUN_KEY.fullmatch(key)
    return match.group(1) if match else None


def secret_hash(secret: str) -> str:
    """sha256 hex digest of a secret (what is stored instead of it)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def matches(secret: str | None, stored_hash: str | None) -> bool:
    """Constant-time check of ``secret`` against a stored hash (``None`` never matches)."""
    presented = secret_hash(secret) if isinstance(secret, str) else _DUMMY
    return hmac.compare_digest(presented, stored_hash or _DUMMY) and stored_hash is not None and secret is not None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (scheme case-insensitive).

    >>> bearer_token("Bearer abc"), bearer_token("bearer  abc "), bearer_token("Basic abc"), bearer_token(None)
    ('abc', 'abc', None, None)
    """
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
