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
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from ..scenario import add_scenario_arguments
from ..env import ResearchEnv
from ..rundir import BRIEFING_FILE, LEDGER_FILE, RESULT_FILE, STEPS_FILE
from ..tools import SCHEMA_MAX_LENGTH, SCHEMA_MAX_LENGTH_ENV, schema_max_length
from .backend import LocalRun

RUN_FLAGS = ("scenario", "world", "benchmark", "track", "budget", "max_steps")
"""The argparse destinations :func:`add_run_arguments` adds that choose a run (besides ``seed``)."""
IN_PROCESS_FLAGS = (*RUN_FLAGS, "ledger", "run_dir", "seed")
"""Every flag of ``rsigym mcp`` that only an in-process run has: any of them given means one."""


@dataclass(frozen=True)
class LocalRunFactory:
    """Builds a :class:`LocalRun` of one scenario; ``None`` fields keep the scenario's own values.

    ``ledger_path`` keeps the ledger and audit log in that SQLite file (default: in memory);
    ``run_dir`` keeps the world's artifacts there. With ``run_dir`` and ``step_log`` (``rsigym mcp
    --run-dir``) each run also writes that directory as ``rsigym run`` does (:func:`recorded`): the
    dashboard's ``record.jsonl``, ``steps.jsonl``, ``briefing.txt``, ``result.json`` once the episode
    ends, and the ledger in ``ledger.sqlite`` unless ``ledger_path`` puts it elsewhere. ``researcher``
    and ``surface`` name who drives the run and through what, in the record.
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
    step_log: bool = False
    researcher: str | None = None
    surface: str | None = None

    @property
    def ledger(self) -> str | None:
        """Where the ledger is kept: ``ledger_path``, or ``run_dir/ledger.sqlite`` for a step-logged run."""
        if self.ledger_path or not (self.step_log and self.run_dir):
            return self.ledger_path
        return str(Path(self.run_dir) / LEDGER_FILE)

    def make_env(self) -> ResearchEnv:
        """A new :class:`ResearchEnv` of this scenario (not reset yet)."""
        if self.ledger and self.run_dir and self.step_log:
            Path(self.run_dir).mkdir(parents=True, exist_ok=True)
        return ResearchEnv(self.scenario, track=self.track, world=self.world, benchmark=self.benchmark,
                           budget_usd=self.budget_usd, max_steps=self.max_steps, ledger_path=self.ledger,
                           run_dir=self.run_dir, world_options=dict(self.world_options) or None)

    def __call__(self, seed: int | None = None) -> LocalRun:
        """A new run, reset with ``seed``."""
        env = self.make_env()
        if self.step_log and self.run_dir:
            env = recorded(env, self.run_dir, researcher=self.researcher, surface=self.surface, ledger=self.ledger)
        return LocalRun(env, seed=seed)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides: Any) -> "LocalRunFactory":
        """The factory the flags of :func:`add_run_arguments` describe (``overrides``: other fields)."""
        return cls(scenario=args.scenario, world=args.world, benchmark=args.benchmark, track=args.track,
                   budget_usd=args.budget, max_steps=args.max_steps,
                   ledger_path=str(Path(args.ledger)) if getattr(args, "ledger", None) else None,
                   run_dir=getattr(args, "run_dir", None), **overrides)


def recorded(env: gym.Env, run_dir: str | Path, *, researcher: str | None = None, surface: str | None = None,
             ledger: str | None = None) -> gym.Env:
    """``env`` writing ``run_dir`` as ``rsigym run`` does: the run record ``record.jsonl`` (what ``rsigym
    watch`` shows, :class:`~rsigym_env.watch.record.RunRecorder`), the step log ``steps.jsonl`` (a line
    ``{"step", "action", "info", "log"}`` per step, flushed: ``rsigym run``'s keys plus the text the
    researcher read, as the session service writes it), ``briefing.txt`` at reset and ``result.json``
    (``rsigym run``'s keys) when the episode ends. A run directory used before gets a new step log and
    loses its old result; the record appends the new episode, as with ``rsigym run``."""
    from ..watch.record import RunRecorder
    from .host import StepLog

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / STEPS_FILE).write_text("")
    (run_dir / RESULT_FILE).unlink(missing_ok=True)
    env = RunRecorder(env, run_dir, researcher=researcher, surface=surface)
    return EpisodeFiles(StepLog(env, run_dir / STEPS_FILE), run_dir, researcher=researcher, ledger=ledger)


class EpisodeFiles(gym.Wrapper):
    """Writes ``briefing.txt`` at reset and, once the episode ends, ``result.json`` as ``rsigym run`` does:
    :class:`~rsigym_env.episode.EpisodeResult`'s fields with ``wall_seconds``, ``run_dir`` and ``ledger``."""

    def __init__(self, env: gym.Env, run_dir: str | Path, *, researcher: str | None = None, ledger: str | None = None):
        super().__init__(env)
        self.run_dir, self.researcher, self.ledger = Path(run_dir), researcher, ledger
        self._seed: int | None = None
        self._started = time.perf_counter()
        self._reward, self._steps, self._written = 0.0, 0, False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._seed, self._started = seed, time.perf_counter()
        self._reward, self._steps, self._written = 0.0, 0, False
        if isinstance(obs, dict) and isinstance(obs.get("log"), str):
            (self.run_dir / BRIEFING_FILE).write_text(obs["log"])
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._reward += float(reward)
        self._steps += 1
        if (terminated or truncated) and not self._written:
            self._written = True
            self._write_result(bool(terminated), bool(truncated), info)
        return obs, reward, terminated, truncated, info

    def _write_result(self, terminated: bool, truncated: bool, info: dict[str, Any]) -> None:
        from ..episode import EpisodeResult

        scenario = getattr(self.env.unwrapped, "scenario", None)
        result = EpisodeResult(self.researcher or "?", getattr(scenario, "name", ""), self._seed, self._reward,
                               self._steps, terminated, truncated, dict(info))
        payload = dataclasses.asdict(result) | {"wall_seconds": time.perf_counter() - self._started,
                                                "run_dir": str(self.run_dir), "ledger": self.ledger}
        tmp = self.run_dir / (RESULT_FILE + ".tmp")
        tmp.write_text(json.dumps(payload, indent=2, default=str))
        tmp.replace(self.run_dir / RESULT_FILE)


def max_length_arg(text: str) -> int | None:
    """An argparse type for a schema ``maxLength`` cap: a number of characters; ``0`` or ``none``: no cap.

    >>> max_length_arg("800"), max_length_arg("none"), max_length_arg("0")
    (800, None, None)
    """
    try:
        return schema_max_length(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of characters (0 or 'none': the tools' own limits), "
                                         f"got {text!r}") from None


MAX_LENGTH_HELP = (f"cap every string maxLength of the schemas at N characters (default {SCHEMA_MAX_LENGTH}, or "
                   f"${SCHEMA_MAX_LENGTH_ENV}; 0 or 'none': the tools' own limits, up to 200,000). llama.cpp's "
                   "grammars refuse or crash on 2,000 or more; the tools accept their own limits either way")


def add_run_arguments(parser: argparse.ArgumentParser, *,
                      run_dir_help: str = "keep the world's artifacts in this directory") -> None:
    """Add the flags that choose an in-process run (as ``rsigym run`` has them)."""
    add_scenario_arguments(parser)
    parser.add_argument("--ledger", metavar="PATH", help="keep the ledger and audit log in this SQLite file")
    parser.add_argument("--run-dir", help=run_dir_help)


def add_mcp_arguments(parser: argparse.ArgumentParser) -> None:
    """``rsigym mcp``'s flags: the run's (:func:`~.local_runs.add_run_arguments`), its seed and label,
    progress, the schemas' string limit."""
    add_run_arguments(parser, run_dir_help="write the run directory as `rsigym run` does: steps.jsonl, record.jsonl "
                                           "(rsigym watch), result.json, briefing.txt, ledger.sqlite (unless "
                                           "--ledger), the world's artifacts")
    parser.add_argument("--seed", type=int, help="reset seed (default 0)")
    parser.add_argument("--label", default="mcp", help="who drives the run, as the run record and the dashboard "
                                                       "name it, e.g. claude-code (default: mcp)")
    parser.add_argument("--progress-interval", type=float, default=2.0,
                        help="seconds between progress notifications while a call runs (default 2)")
    parser.add_argument("--schema-max-length", metavar="N", type=max_length_arg, default=argparse.SUPPRESS,
                        help="the tool list's schemas: " + MAX_LENGTH_HELP)


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
