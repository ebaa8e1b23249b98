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

import re
import secrets

from ..watch.tokens import (MIN_TOKEN_CHARS, bearer_token, load_or_create_token, matches, new_token,  # noqa: F401
                           read_token_file, secret_hash, write_token_file)

_RUN_KEY = re.compile(r"rsr_([0-9a-f]{16})_[A-Za-z0-9_-]{43}")


def new_run_id() -> str:
    """A random run id: 16 hex digits."""
    return secrets.token_hex(8)


def new_run_key(run_id: str) -> str:
    """A fresh run key for ``run_id`` (256 random bits)."""
    return f"rsr_{run_id}_{secrets.token_urlsafe(32)}"


def new_admin_token() -> str:
    """A fresh admin token of the service (``rsa_`` and 256 random bits)."""
    return new_token("rsa_")


def parse_run_key(key: str | None) -> str | None:
    """The run id a well-formed run key names, else ``None``."""
    if not isinstance(key, str) or len(key) > 100:
        return None
    match = _RUN_KEY.fullmatch(key)
    return match.group(1) if match else None
