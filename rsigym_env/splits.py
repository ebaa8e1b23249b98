"""The held-out split's secret: official tasks are drawn from it, afresh for every episode, and nothing a
researcher reaches holds either the secret or the episode's draw.

A local benchmark's dev and synthetic prompts are public and deterministic (anyone with the
package can generate them). Its **official** split is drawn from a secret that lives only in the
platform's state, outside every sandbox: ``$RSIGYM_HOME/secrets/official-split.key`` (mode 0600,
created at first use), or ``RSIGYM_SPLIT_SECRET`` when set (tests pin it that way), **and a nonce of
the episode's own** (128 random bits, held by the world and never shown): every episode scores on
official tasks of its own, so what any number of episodes learn about their official tasks — through
their rewards or any other channel — is worth nothing in a later one. ``RSIGYM_SPLIT_NONCE`` pins the
draw (benchmarks and tests that compare two runs on the same tasks); results then say ``fixed``.
Every result records the split it was scored on as :attr:`OfficialSplit.info` — the mode, a hash of
the secret, whether the draw was the episode's own, and a hash of the draw; never the secret or the nonce.

The ``public`` mode draws the official split from the package's fixed seed instead, for
reproducible comparisons across machines (and the figures in the README); results say so.

>>> public = official_split("public")
>>> public.info
{'mode': 'public', 'id': 'public', 'draw': 'fixed'}
>>> one = OfficialSplit("secret", "test-secret", nonce=secrets.token_hex(16), fixed=False)  # as a world draws it
>>> two = OfficialSplit("secret", "test-secret", nonce=secrets.token_hex(16), fixed=False)
>>> one.info["mode"], one.info["draw"], len(one.info["id"]), one.info["id"] == two.info["id"]
('secret', 'per-episode', 16, True)
>>> one.stream("local-math") != two.stream("local-math") != public.stream("local-math")
True
>>> pinned = official_split("secret", secret="test-secret", nonce="n1")
>>> pinned.info["draw"], pinned.stream("local-math") == official_split("secret", secret="test-secret", nonce="n1").stream("local-math")
('fixed', True)
>>> "test-secret" in repr(one) or one.nonce in repr(one)
False
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .home import state_dir

SplitMode = Literal["secret", "public"]
SECRET_ENV = "RSIGYM_SPLIT_SECRET"
NONCE_ENV = "RSIGYM_SPLIT_NONCE"
SECRET_FILE = "official-split.key"


def rsigym_home() -> Path:
    """``$RSIGYM_HOME`` or ``~/.rsigym``: the platform's own state (agents, secrets; :func:`~.home.state_dir`)."""
    return state_dir()


@dataclass(frozen=True)
class OfficialSplit:
    """Which official split a world evaluates on: ``mode`` and, for ``secret``, the secret itself and the
    draw's nonce (neither ever shown). ``fixed``: the draw is pinned (public mode, or a nonce given by the
    operator), so two runs score on the same tasks; otherwise it is the episode's own."""

    mode: SplitMode
    _secret: str = field(repr=False, default="")
    nonce: str = field(repr=False, default="")
    fixed: bool = True

    @property
    def id(self) -> str:
        """``public``, or the first 16 hex digits of the secret's SHA-256 (which split, not the secret)."""
        if self.mode == "public":
            return "public"
        return hashlib.sha256(self._secret.encode()).hexdigest()[:16]

    @property
    def info(self) -> dict[str, Any]:
        """What results record about the split: mode, the secret's id, ``draw`` (``per-episode`` or
        ``fixed``) and, for a secret split, ``draw_id`` (a keyed hash of the nonce: which draw, not the nonce)."""
        out: dict[str, Any] = {"mode": self.mode, "id": self.id, "draw": "fixed" if self.fixed else "per-episode"}
        if self.mode == "secret":
            out["draw_id"] = hmac.new(self._secret.encode(), f"draw:{self.nonce}".encode(), hashlib.sha256).hexdigest()[:16]
        return out

    def stream(self, benchmark: str) -> str:
        """The name of ``benchmark``'s official problem stream: ``official`` in public mode, else a keyed
        digest of the secret and the nonce (so one benchmark's or one episode's stream tells nothing about
        another's)."""
        if self.mode == "public":
            return "official"
        digest = hmac.new(self._secret.encode(), f"official-split:{benchmark}:{self.nonce}".encode(),
                          hashlib.sha256).hexdigest()
        return f"official-{digest[:32]}"

    def key(self, purpose: str) -> bytes:
        """A key derived from the secret (not the draw) for ``purpose`` (e.g. per-trial seeds, which dev
        evaluations share across episodes); public mode: a fixed one."""
        base = self._secret if self.mode == "secret" else "public-split"
        return hmac.new(base.encode(), purpose.encode(), hashlib.sha256).digest()


def load_secret(home: Path | None = None) -> str:
    """The split secret: ``$RSIGYM_SPLIT_SECRET``, else the key file under ``home/secrets``, created
    (256 random bits, mode 0600, directory 0700) the first time it is needed."""
    pinned = os.environ.get(SECRET_ENV)
    if pinned:
        return pinned
    directory = (home or rsigym_home()) / "secrets"
    path = directory / SECRET_FILE
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    secret = secrets.token_hex(32)
    tmp = directory / f".{SECRET_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    try:
        os.link(tmp, path)  # atomic and never overwrites: a concurrent first use keeps one secret
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_text().strip()


def official_split(mode: SplitMode = "secret", *, secret: str | None = None, home: Path | None = None,
                   nonce: str | None = None) -> OfficialSplit:
    """The official split of ``mode``. ``secret``: from ``secret`` if given, else :func:`load_secret`; each
    call is a draw of its own (a fresh 128-bit nonce: call it once per episode), unless ``nonce`` or
    ``$RSIGYM_SPLIT_NONCE`` pins the draw."""
    if mode == "public":
        return OfficialSplit("public")
    if mode != "secret":
        raise ValueError(f"official split mode must be 'secret' or 'public', got {mode!r}")
    if nonce is None:
        nonce = os.environ.get(NONCE_ENV) or None
    fixed = nonce is not None
    return OfficialSplit("secret", secret if secret is not None else load_secret(home),
                         nonce=nonce if fixed else secrets.token_hex(16), fixed=fixed)


__all__ = ["NONCE_ENV", "OfficialSplit", "SECRET_ENV", "SplitMode", "load_secret", "official_split", "rsigym_home"]
