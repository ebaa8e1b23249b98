"""One run of the session service: its env, its record on disk, and how it comes back after a restart.

A run directory holds ``run.json`` (:class:`RunMeta`: scenario, seed, key hash, state),
``ledger.sqlite`` (ledger and hash-chained audit log), ``steps.jsonl`` (one line per step, appended
and flushed: ``{"step", "action", "info", "log"}``, the format ``rsigym run`` writes plus the text
the researcher read), ``briefing.txt`` and whatever the world keeps there.

:class:`RunHost` runs in the service's process or, unchanged, inside a Ray actor. Its
:meth:`RunHost.start` either builds a fresh env or **resumes** a recorded one:

* ``sim`` runs (deterministic given scenario, seed and actions) re-execute their recorded actions
  on a fresh env whose ledger is a throwaway in memory. Every replayed ``info`` must equal the
  recorded one, and the throwaway audit log must equal the persistent one record by record (wall
  times and key ids aside) — so a step whose ledger change was committed but whose line was never
  written (a crash in between) is detected. Then the run continues on the persistent ledger: its
  key is re-bound to the persistent account and each running job's open reservation is handed to
  this process (released and reserved again, audited with ``reason: "resumed"``, so the ledger's
  crash recovery never settles a live job). Hand-overs are recorded in ``resumes.jsonl`` and redone
  at the same points by later replays, which keeps the books reproducible across any number of restarts.
* Anything else — other worlds (their servers and jobs died with the process) or a replay that
  does not match — is **interrupted** (``service_restarted`` / ``replay_diverged``): its open
  reservations are released (audited), so nothing stays held, and it can no longer be called.

>>> import tempfile
>>> from rsigym_env.scenario import load_scenario
>>> d = tempfile.mkdtemp()
>>> meta = RunMeta.new("r1", "0" * 64, load_scenario(benchmark="aime", budget_usd=50), seed=0)
>>> host = RunHost(d, meta.model_dump())
>>> host.start(resume=False)["state"]
'active'
>>> host.call("evaluate", {"k": 1, "n_tasks": 5}).result["job"]
'job-1'
>>> host.shutdown()                 # the service stops: nothing is settled, the job's money stays held
>>> again = RunHost(d, {**meta.model_dump(), "ledger_key": host.ledger_key})
>>> status = again.start(resume=True)
>>> status["state"], status["steps"], status["balance"]["reserved_usd"] > 0
('active', 1, True)
>>> again.close("deleted")["balance"]["reserved_usd"]      # closing settles the running job
0.0
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field

from ..env import ResearchEnv
from ..platform.core import Bill, Platform
from ..platform.ledger import NANO, Ledger, Reservation
from ..run import JobView, ResearchRun, RunView
from ..scenario import Scenario
from ..services import EvalResult, TrainResult
from ..worlds.sim.clock import SimClock
from ..rundir import BRIEFING_FILE, LEDGER_FILE, RESUMES_FILE, RUN_FILE, STEPS_FILE, read_steps
from ..watch.record import RunRecorder
from .backend import LocalRun, ToolReply, jsonable

WAIT_CAP_S = 30.0
"""Longest ``wait`` the service lets a run block for on a wall-clock world (the ``Wait.timeout_s`` bound)."""

RunState = Literal["active", "done", "closed", "interrupted"]
ASYNC_JOBS = "async_jobs" in inspect.signature(ResearchEnv).parameters


def research_env(scenario: Scenario, **kwargs: Any) -> ResearchEnv:
    """A ``ResearchEnv`` as the service makes them: with ``async_jobs`` where the env offers it (data
    making and submit's official evaluation become jobs, so no call blocks long)."""
    if ASYNC_JOBS:
        kwargs.setdefault("async_jobs", True)
    return ResearchEnv(scenario, **kwargs)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RunMeta(BaseModel):
    """``run.json``: what the service knows about a run, enough to list it and to rebuild it."""

    model_config = ConfigDict(extra="ignore")
    run_id: str
    key_sha256: str = Field(description="sha256 of the run key; the key itself is never stored.")
    scenario: dict[str, Any] = Field(description="The full scenario (Scenario.model_dump()).")
    seed: int
    label: str | None = Field(None, description="Who drives the run (e.g. 'claude-code'); shown in trajectories.")
    created_at: str
    updated_at: str
    state: RunState = "active"
    code: str | None = Field(None, description="Why the run is closed or interrupted (idle_timeout, deleted, ...).")
    message: str | None = None
    ledger_key: str | None = Field(None, description="The platform key id of the run on its ledger.")
    steps: int = 0
    balance: dict[str, float] | None = None
    end: dict[str, Any] | None = None

    @classmethod
    def new(cls, run_id: str, key_sha256: str, scenario: Scenario, seed: int, label: str | None = None) -> "RunMeta":
        stamp = now_iso()
        return cls(run_id=run_id, key_sha256=key_sha256, scenario=scenario.model_dump(), seed=seed, label=label,
                   created_at=stamp, updated_at=stamp)

    def save(self, run_dir: str | os.PathLike[str]) -> None:
        """Write ``run.json`` atomically (a crash leaves the old or the new file, never half of one)."""
        self.updated_at = now_iso()
        path = Path(run_dir) / RUN_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> "RunMeta":
        return cls.model_validate_json((Path(run_dir) / RUN_FILE).read_text())


class RunUnavailable(Exception):
    """A run that is closed or interrupted (``code``) was asked for something."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def refusal(tool: str, code: str, message: str, budget_left_usd: float = 0.0) -> ToolReply:
    """A :class:`ToolReply` for a call refused before it reached the run (it costs nothing)."""
    return ToolReply(ok=False, tool=tool[:64], text=f"ERROR {code}: {message}", error=code, message=message,
                     budget_left_usd=budget_left_usd)


# --------------------------------------------------------------------------------------------
# The step record


class StepLog(gym.Wrapper):
    """Appends every step to ``path`` as one JSON line ``{"step", "action", "info", "log"}``, flushed.

    With ``recording=False`` nothing is written (a replay); ``last`` always holds the last line's text.
    Any surface driving a ``ResearchEnv`` can wrap it to make its episode exportable
    (``rsigym export atif``).
    """

    def __init__(self, env: gym.Env, path: str | os.PathLike[str], *, recording: bool = True):
        super().__init__(env)
        self.path = Path(path)
        self.recording = recording
        self.steps = 0
        self.last: str | None = None
        self._file: Any = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        self.steps = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        self.last = record_line({"step": self.steps, "action": action, "info": info, "log": obs["log"]})
        if self.recording:
            if self._file is None:
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(self.last + "\n")
            self._file.flush()
        return obs, reward, terminated, truncated, info

    def close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        self.close_file()
        self.env.close()


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def record_line(record: dict[str, Any]) -> str:
    """One JSON line for ``steps.jsonl``: NumPy values as numbers, non-finite floats as ``null``.

    orjson in the common case (~5 µs); the stdlib, ASCII-escaped, for what orjson refuses (a lone
    surrogate in a string), so recording never fails.

    >>> record_line({"a": np.float64(0.5), "b": float("nan"), "c": chr(0xD800)})
    '{"a": 0.5, "b": null, "c": "\\\\ud800"}'
    """
    try:
        return orjson.dumps(record, default=_plain, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(jsonable(record), default=str)


# --------------------------------------------------------------------------------------------
# The run as the service drives it


class ServedRun(LocalRun):
    """A :class:`LocalRun` with the views the service offers besides tool calls (balance, jobs) and
    a close that settles running jobs first. Its lock is re-entrant; after :meth:`close` every call
    is refused with ``run_closed``."""

    def __init__(self, env: Any, seed: int | None = None):
        super().__init__(env, seed)
        self._lock = threading.RLock()  # type: ignore[assignment]  # call() below re-enters LocalRun.call
        self.closed = False
        self.end: dict[str, Any] | None = None

    @property
    def research(self) -> ResearchRun:
        run = self.env.unwrapped.run
        if self.closed or run is None:
            raise RunUnavailable("run_closed", "this run is closed")
        return run

    def view(self) -> RunView:
        """The run's read-only snapshot (:meth:`ResearchEnv.run_view`); ``run_closed`` once it is closed."""
        view = self.env.unwrapped.run_view()
        if self.closed or view is None:
            raise RunUnavailable("run_closed", "this run is closed")
        return view

    def call(self, tool: str, args: dict[str, Any] | None = None) -> ToolReply:
        with self._lock:
            if self.closed:
                return refusal(tool, "run_closed", "this run is closed")
            reply = super().call(tool, args)
            if reply.end is not None:
                self.end = reply.end
            return reply

    def observation(self) -> dict[str, Any]:
        with self._lock:
            self.view()  # raises RunUnavailable once closed
            return super().observation()

    def balance(self) -> dict[str, float]:
        """``{budget_usd, spent_usd, reserved_usd, remaining_usd}`` of the run's key, read from the ledger now."""
        with self._lock:
            key_id = self.view().key_id
            b = self.env.unwrapped.platform.ledger.balance(key_id)
        return {"budget_usd": b.budget_usd, "spent_usd": b.spent_usd, "reserved_usd": b.reserved_usd,
                "remaining_usd": b.available_usd}

    def jobs(self) -> list[dict[str, Any]]:
        """Every job of the run: running ones with their progress, then finished, failed or cancelled ones."""
        with self._lock:
            view = self.view()
        out = [_running_job(job_id, job, view.world_s) for job_id, job in view.running.items()]
        return out + [{"id": job_id, **_finished_job(value)} for job_id, value in view.job_results.items()]

    def job(self, job_id: str) -> dict[str, Any] | None:
        """One job with its result (``None`` if this run has no such job)."""
        with self._lock:
            view = self.view()
        if job_id in view.running:
            return _running_job(job_id, view.running[job_id], view.world_s)
        if job_id in view.job_results:
            value = view.job_results[job_id]
            if isinstance(value, EvalResult) and value.split != "dev":  # held-out tasks stay unnamed
                return {"id": job_id, **_finished_job(value), "result": {"split": value.split, "score": value.score}}
            return {"id": job_id, **_finished_job(value), "result": jsonable(value)}
        return None

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"steps": self.view().steps, "done": self.done, "balance": self.balance(), "end": self.end}

    def close(self, code: str = "closed") -> dict[str, Any]:  # type: ignore[override]
        """Settle running jobs (as at the end of an episode), audit the close, close the env; the final status."""
        with self._lock:
            if self.closed:
                return {}
            run = self.env.unwrapped.run
            status: dict[str, Any] = {}
            if run is not None:
                run.abandon(f"closed ({code})")  # running jobs billed for the part that ran, as at truncation
                run.platform.ledger.record({"key": run.key.id, "tool": "run_closed", "decision": "closed", "code": code})
                status = self.status()
            self.closed = True
            self.env.close()
            return status

    def shutdown(self) -> None:
        """Stop without settling anything, exactly as a crash would leave the books (``env.close()`` would
        settle running jobs): the world and the files are closed, open reservations stay for the resume."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            env = self.env.unwrapped
            if isinstance(self.env, StepLog):
                self.env.close_file()
                if isinstance(self.env.env, RunRecorder):
                    self.env.env.close_file()
            if env.run is not None:
                env.run.world.close()
                env.run = None
            env.platform.ledger.close()


def _running_job(job_id: str, job: JobView, now: float) -> dict[str, Any]:
    out: dict[str, Any] = {"id": job_id, "kind": job.kind, "status": "running",
                           "elapsed_s": round(max(0.0, now - job.started_at), 3)}
    eta = job.eta_s if job.ready_at is None else job.ready_at - job.started_at
    if eta:
        out["eta_s"] = round(float(eta), 3)
    return out


def _finished_job(value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and "error" in value:
        status = "cancelled" if str(value["error"]).startswith("cancelled") else "failed"
        return {"kind": value.get("kind", "?"), "status": status, "error": value["error"]}
    kind = {TrainResult: "train", EvalResult: "evaluate"}.get(type(value), type(value).__name__)
    return {"kind": kind, "status": "finished"}


# --------------------------------------------------------------------------------------------
# Resumption


class ReplayDiverged(Exception):
    """The recorded steps do not reproduce the books on disk."""


def _open_reservations(ledger_path: Path, key_id: str) -> list[tuple[int, int]]:
    """``(id, nano)`` of every open reservation of ``key_id`` in a ledger file, oldest first."""
    conn = sqlite3.connect(ledger_path, timeout=30.0)
    try:
        return [(int(i), int(n)) for i, n in
                conn.execute("SELECT id, nano FROM reservations WHERE key = ? ORDER BY id", (key_id,))]
    finally:
        conn.close()


def _audit_events(ledger: Ledger, key_id: str) -> list[str]:
    """The audit events of a ledger with wall times dropped and ``key_id`` written as ``KEY``."""
    out = []
    for record in ledger.audit_records():
        event = {k: ("KEY" if v == key_id else v) for k, v in record.event.items() if k != "wall_time"}
        out.append(json.dumps(event, sort_keys=True, default=str))
    return out


def release_run(ledger_path: str | os.PathLike[str], key_id: str | None, code: str, message: str) -> dict[str, float] | None:
    """Release every open reservation of ``key_id`` (audited) and record why; the balance afterwards."""
    path = Path(ledger_path)
    if key_id is None or not path.exists():
        return None
    with open_ledger(path, recover=True) as ledger:  # owners that are gone: charged their recorded work
        for rid, nano in _open_reservations(path, key_id):  # the rest (a live or unknown owner): released
            ledger.release(Reservation(rid, key_id, nano / NANO),
                           audit={"tool": "run_interrupted", "decision": "released", "code": code})
        ledger.record({"key": key_id, "tool": "run_interrupted", "decision": "closed", "code": code,
                       "message": message[:256]})
        b = ledger.balance(key_id)
    return {"budget_usd": b.budget_usd, "spent_usd": b.spent_usd, "reserved_usd": b.reserved_usd,
            "remaining_usd": b.available_usd}


def open_ledger(path: str | os.PathLike[str], *, recover: bool) -> Ledger:
    """A file ledger; ``recover=False`` keeps it from settling reservations of processes that are gone
    (the run being resumed owns them)."""
    if "recover" in inspect.signature(Ledger).parameters:
        return Ledger(path, recover=recover)
    return Ledger(path)


def _rebind(env: ResearchEnv, ledger: Ledger, key_id: str) -> None:
    """Move a replayed run from its throwaway ledger onto the persistent one: the run's key becomes the
    persistent account, each running job's bill its open reservation there (matched by id and amount)."""
    run = env.run
    assert run is not None
    rows = _open_reservations(Path(ledger.path or ""), key_id)
    bills = sorted(run.running.values(), key=lambda r: r.bill.reservation.id)
    replayed = [(r.bill.reservation.id, round(r.bill.reservation.usd * NANO)) for r in bills]
    if replayed != rows:
        raise ReplayDiverged(f"open reservations differ: replay {replayed}, ledger {rows}")
    platform = Platform(ledger)
    key = dataclasses.replace(run.key, id=key_id, secret="")  # the persistent account; a run never uses the secret
    for running, (rid, nano) in zip(bills, rows):
        running.bill = Bill(platform, key, Reservation(rid, key_id, nano / NANO), _event(running))
    throwaway = env.platform
    env.platform = run.platform = platform
    run.key = key
    run.balance = platform.balance(key)
    throwaway.ledger.close()


def _event(running: Any) -> dict[str, Any]:
    """The audit event a running job's bill settles with."""
    return dict(getattr(running.bill, "_event", None) or {"tool": running.job.kind, "decision": "allowed"})


def hand_over(run: ResearchRun) -> None:
    """Make this process the owner of the run's open reservations: release each and reserve the same
    amount again (both audited with ``reason: "resumed"``), keeping the work recorded on it."""
    ledger = run.platform.ledger
    used = {r.id: r.used_usd for r in ledger.open_reservations()} if hasattr(ledger, "open_reservations") else {}
    for running in sorted(run.running.values(), key=lambda r: r.bill.reservation.id):
        old, event = running.bill.reservation, _event(running)
        ledger.release(old, audit={**event, "reason": "resumed"})
        new = ledger.reserve(run.key.id, old.usd, audit={**event, "reason": "resumed"})
        if used.get(old.id):
            ledger.progress(new, used[old.id])
        running.bill = Bill(run.platform, run.key, new, event)


class RunHost:
    """A run of the session service (see the module docstring). Nothing heavy happens before :meth:`start`.

    Args:
        run_dir: the run's directory (``run.json`` is written by the service, not here).
        meta: the :class:`RunMeta` as a dict.
        wait_cap_s: on worlds whose clock is wall time, ``wait`` is bounded by this (see :meth:`call`).
    """

    def __init__(self, run_dir: str, meta: dict[str, Any], wait_cap_s: float = WAIT_CAP_S):
        self.run_dir = Path(run_dir)
        self.meta = RunMeta.model_validate(meta)
        self.wait_cap_s = wait_cap_s
        self.served: ServedRun | None = None
        self.ledger_key: str | None = self.meta.ledger_key
        self.wall_clock = False

    # ---- start

    def _env(self, ledger_path: Path | None) -> ResearchEnv:
        return research_env(Scenario.model_validate(self.meta.scenario), ledger_path=ledger_path, run_dir=self.run_dir)

    def start(self, resume: bool) -> dict[str, Any]:
        """Build the run (``resume=False``) or bring a recorded one back; its status, with ``state``
        ``active``/``done``, or ``interrupted`` with ``code`` and ``message`` (then it is released)."""
        if not resume:
            env = self._env(self.run_dir / LEDGER_FILE)
            recorder = RunRecorder(env, self.run_dir, researcher=self.meta.label, surface="rsigym serve",
                                   run_id=self.meta.run_id)
            self.served = ServedRun(StepLog(recorder, self.run_dir / STEPS_FILE), self.meta.seed)
            self.ledger_key = env.run.key.id  # type: ignore[union-attr]
            (self.run_dir / BRIEFING_FILE).write_text(self.served.observation()["log"])
        else:
            world = self.meta.scenario.get("world")
            if self.ledger_key is None:
                return self._interrupt("service_restarted", "the service stopped while the run was being created")
            if world != "sim":
                return self._interrupt("service_restarted", f"a {world}-world run does not survive a restart of the "
                                       "service (its servers and jobs stopped with it); its reservations were released")
            try:
                self.served = self._replay()
            except ReplayDiverged as exc:
                return self._interrupt("replay_diverged", f"the recorded steps do not reproduce this run's books "
                                       f"({exc}); its reservations were released")
        clock = self.served.research.world.clock
        self.wall_clock = not getattr(clock, "simulated", isinstance(clock, SimClock))
        return {"state": "done" if self.served.done else "active", "ledger_key": self.ledger_key,
                **self.served.status()}

    def _replay(self) -> ServedRun:
        lines = read_steps(self.run_dir / STEPS_FILE, repair=True)
        resumes = [int(r["after_step"]) for r in read_steps(self.run_dir / RESUMES_FILE)]
        if any(n > len(lines) for n in resumes):
            raise ReplayDiverged(f"a hand-over after step {max(resumes)} but only {len(lines)} steps are recorded")
        env = self._env(None)
        recorder = RunRecorder(env, self.run_dir, researcher=self.meta.label, surface="rsigym serve",
                               run_id=self.meta.run_id, recording=False)
        log = StepLog(recorder, self.run_dir / STEPS_FILE, recording=False)
        served = ServedRun(log, self.meta.seed)
        try:
            assert env.run is not None
            for _ in range(resumes.count(0)):
                hand_over(env.run)
            for n, line in enumerate(lines, 1):
                action = line.get("action") or {}
                served.call(str(action.get("tool")), action.get("args"))
                if json.loads(log.last or "null")["info"] != line.get("info"):
                    raise ReplayDiverged(f"step {n} ({action.get('tool')}) came out differently")
                for _ in range(resumes.count(n)):
                    hand_over(env.run)
            persistent = open_ledger(self.run_dir / LEDGER_FILE, recover=False)
            try:
                assert self.ledger_key is not None and env.run is not None
                mine, theirs = _audit_events(env.platform.ledger, env.run.key.id), _audit_events(persistent, self.ledger_key)
                if mine != theirs:
                    first = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
                    raise ReplayDiverged(f"audit logs differ from record {first + 1} ({len(mine)} replayed, "
                                         f"{len(theirs)} on disk)")
                _rebind(env, persistent, self.ledger_key)
            except BaseException:
                persistent.close()
                raise
            if env.run.running:
                hand_over(env.run)
                with (self.run_dir / RESUMES_FILE).open("a") as f:
                    f.write(json.dumps({"after_step": len(lines), "at": now_iso()}) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            env.close()
            raise
        log.recording = True
        recorder.recording = True  # appends a "resume" line: this process writes the run from here on
        return served

    def _interrupt(self, code: str, message: str) -> dict[str, Any]:
        balance = release_run(self.run_dir / LEDGER_FILE, self.ledger_key, code, message)
        return {"state": "interrupted", "code": code, "message": message, "ledger_key": self.ledger_key,
                "balance": balance, "steps": len(read_steps(self.run_dir / STEPS_FILE)), "done": False, "end": None}

    # ---- RunBackend and the service's views

    def _run(self) -> ServedRun:
        if self.served is None:
            raise RunUnavailable("run_closed", "this run is not open")
        return self.served

    def call(self, tool: str, args: dict[str, Any] | None = None) -> ToolReply:
        """One tool call. On a wall-clock world, ``wait`` without ``timeout_s`` (or with more than the cap)
        gets ``timeout_s = wait_cap_s``, so no call blocks longer than that; in ``sim`` waiting is instant."""
        if self.served is None:
            return refusal(tool, "run_closed", "this run is not open")
        if tool == "wait" and self.wall_clock and isinstance(args, dict):
            given = args.get("timeout_s")
            if given is None or (isinstance(given, (int, float)) and not isinstance(given, bool) and given > self.wait_cap_s):
                args = {**args, "timeout_s": self.wait_cap_s}
        return self.served.call(tool, args)

    def observation(self) -> dict[str, Any]:
        return self._run().observation()

    def balance(self) -> dict[str, float]:
        return self._run().balance()

    def jobs(self) -> list[dict[str, Any]]:
        return self._run().jobs()

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self._run().job(job_id)

    def status(self) -> dict[str, Any]:
        return self._run().status()

    def close(self, code: str = "closed") -> dict[str, Any]:
        """Settle running jobs and close; the final status (``{}`` if it was not open)."""
        return self.served.close(code) if self.served is not None else {}

    def shutdown(self) -> None:
        """Stop without settling (the service is stopping; the run resumes on restart)."""
        if self.served is not None:
            self.served.shutdown()

    def ping(self) -> bool:
        return True
