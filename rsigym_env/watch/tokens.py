"""Secrets shared by the dashboard and the session service: hashes compared in constant time, bearer
tokens, token files (0600).

The gateway builds on these (``rsigym_env.gateway.auth`` re-exports them): the watch package sits below
it, so both ``rsigym watch`` and ``rsigym serve`` check tokens the same way.

>>> stored = secret_hash("rsw_0123456789abcdef")
>>> matches("rsw_0123456789abcdef", stored), matches("rsw_0123456789abcdeF", stored), matches(None, stored)
(True, False, False)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path
from typing import Callable

_DUMMY = hashlib.sha256(b"rsigym: no such run").hexdigest()


def new_token(prefix: str) -> str:
    """``prefix`` and 256 random bits (url-safe)."""
    return prefix + secrets.token_urlsafe(32)


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


# ------------------------------------------------------------------------------------ token files

MIN_TOKEN_CHARS = 16


def read_token_file(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """The token in ``path`` and a warning (``None`` if there is nothing to say); ``ValueError`` saying
    what is wrong with a file that cannot be read or holds less than 16 characters.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with open(os.path.join(d, "t"), "w") as f:
    ...     _ = f.write("rsa_0123456789abcdef\\n")
    >>> os.chmod(os.path.join(d, "t"), 0o600)
    >>> read_token_file(os.path.join(d, "t"))
    ('rsa_0123456789abcdef', None)
    """
    p = Path(path)
    try:
        token = p.read_text().strip()
        mode = p.stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the token file {p}: {exc}") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"the token in {p} is shorter than {MIN_TOKEN_CHARS} characters")
    warning = f"{p} is readable by other users (chmod 600 it)" if mode & (stat.S_IRWXG | stat.S_IRWXO) else None
    return token, warning


def write_token_file(path: str | os.PathLike[str], token: str) -> None:
    """Write ``token`` to ``path`` (mode 0600 from its creation; the folder made 0700 if it is new)."""
    p = Path(path)
    if not p.parent.exists():
        p.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(p, 0o600)  # an older file keeps its mode through O_TRUNC


def load_or_create_token(path: str | os.PathLike[str], make: Callable[[], str] = lambda: new_token("rsw_")
                         ) -> tuple[str, bool, str | None]:
    """``(token, created, warning)``: the token kept in ``path``, or a new one (``make()``) written there 0600.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "watch-token")
    >>> token, created, _ = load_or_create_token(path)
    >>> created, load_or_create_token(path) == (token, False, None), oct(os.stat(path).st_mode & 0o777)
    (True, True, '0o600')
    """
    p = Path(path)
    if p.exists():
        token, warning = read_token_file(p)
        return token, False, warning
    token = make()
    write_token_file(p, token)
    return token, True, None
