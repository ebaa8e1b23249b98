"""Runs in this process for the agent surfaces: one scenario, a fresh :class:`LocalRun` per episode.

A :class:`LocalRunFactory` holds what the server operator chose (scenario, world, benchmark,
budget, ...); the agent only picks the seed. The MCP server (stdio), the OpenEnv server (one run
per WebSocket session) and the TRL environment class all build their runs with it.

>>> factory = LocalRunFactory(world="sim", benchmark="aime", budget_usd=50)
>>> run = factory(seed=0)
>>> run.call("read", {"ref": "budget"}).ok
True
>>> run.close()
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..scenario import add_scenario_arguments
from ..env import ResearchEnv
from .backend import LocalRun

RUN_FLAGS = ("scenario", "world", "benchmark", "track", "budget", "max_steps")
"""The argparse destinations :func:`add_run_arguments` adds that choose a run (besides ``seed``)."""


@dataclass(frozen=True)
class LocalRunFactory:
    """Builds a :class:`LocalRun` of one scenario; ``None`` fields keep the scenario's own values.

    ``ledger_path`` keeps the ledger and audit log in that SQLite file (default: in memory);
    ``run_dir`` keeps the world's artifacts there.
    """

    scenario: str | None = None
    world: str | None = None
    benchmark: str | None = None
    track: str | None = None
    budget_usd: float | None = None
    max_steps: int | None = None
    ledger_path: str | None = None
    run_dir: str | None = None
    world_options: dict[str, Any] = field(default_factory=dict)

    def make_env(self) -> ResearchEnv:
        """A new :class:`ResearchEnv` of this scenario (not reset yet)."""
        return ResearchEnv(self.scenario, track=self.track, world=self.world, benchmark=self.benchmark,
                           budget_usd=self.budget_usd, max_steps=self.max_steps, ledger_path=self.ledger_path,
                           run_dir=self.run_dir, world_options=dict(self.world_options) or None)

    def __call__(self, seed: int | None = None) -> LocalRun:
        """A new run, reset with ``seed``."""
        return LocalRun(self.make_env(), seed=seed)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "LocalRunFactory":
        """The factory the flags of :func:`add_run_arguments` describe."""
        return cls(scenario=args.scenario, world=args.world, benchmark=args.benchmark, track=args.track,
                   budget_usd=args.budget, max_steps=args.max_steps,
                   ledger_path=str(Path(args.ledger)) if getattr(args, "ledger", None) else None,
                   run_dir=getattr(args, "run_dir", None))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags that choose an in-process run (as ``rsigym run`` has them)."""
    add_scenario_arguments(parser)
    parser.add_argument("--ledger", metavar="PATH", help="keep the ledger and audit log in this SQLite file")
    parser.add_argument("--run-dir", help="keep the world's artifacts in this directory")


def add_mcp_arguments(parser: argparse.ArgumentParser) -> None:
    """``rsigym mcp``'s flags: the run's (:func:`~.local_runs.add_run_arguments`), its seed, progress."""
    add_run_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="reset seed (default 0)")
    parser.add_argument("--progress-interval", type=float, default=2.0,
                        help="seconds between progress notifications while a call runs (default 2)")


def add_openenv_arguments(parser: argparse.ArgumentParser) -> None:
    """``rsigym openenv``'s flags: the run's, the address, the session limits."""
    add_run_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--max-sessions", type=int, default=8, help="concurrent sessions (default 8)")
    parser.add_argument("--session-timeout", type=float, default=900.0,
                        help="close a session that sends nothing for this many seconds (default 900)")
    parser.add_argument("--max-runs", type=int, help="start at most this many runs (every reset starts one)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a non-loopback --host (OpenEnv clients send no credentials)")
    parser.add_argument("--public-seeds", action="store_true",
                        help="reset with the client's seed as it is (default: a keyed hash of it, so a client "
                             "cannot replay its episode offline)")
