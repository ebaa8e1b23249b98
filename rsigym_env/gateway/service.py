"""The session service: one process, many isolated research runs, each reached with its own run key.

:class:`SessionService` creates runs (from a bundled scenario name or YAML plus overrides), keeps
each one's ledger, audit log and steps on disk under ``<state_dir>/runs/<run id>/``, answers tool
calls by run id, closes runs left idle (settling their jobs) and, when it starts again on the same
state directory, lists every earlier run and resumes or interrupts it (see :mod:`.host`). Every
surface (REST in :mod:`.rest`, MCP, OpenEnv) talks to it; :meth:`SessionService.backend_for_key`
gives them a run as a :class:`~rsigym_env.gateway.backend.RunBackend`.
Once a run's episode is over, :meth:`SessionService.audit`, :meth:`~SessionService.ledger`,
:meth:`~SessionService.ledger_snapshot` and :meth:`~SessionService.trajectory` give its records,
read-only (what the verifier of a Harbor task keeps: :mod:`.harbor_task`).

>>> import tempfile
>>> service = SessionService(tempfile.mkdtemp(), admin_token="rsa_example-admin-token", start_reaper=False)
>>> created = service.create_run(RunRequest(benchmark="aime", budget_usd=50, seed=1))
>>> run = service.backend_for_key(created["run_key"])
>>> run.call("evaluate", {"k": 1, "n_tasks": 5}).result["job"], service.backend_for_key("rsr_nope") is None
('job-1', True)
>>> service.close_run(created["run_id"], "deleted")["state"]
'closed'
>>> run.call("read", {"ref": "jobs"}).error
'run_closed'
>>> service.shutdown()
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import sqlite3
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..platform.audit import read_records, verify_audit
from ..platform.ledger import NANO
from ..scenario import Scenario, list_scenarios, load_scenario, scenario_dir
from ..watch.redact import Redactor, host_paths, split_secrets
from ..worlds import WORLDS
from .auth import matches, new_run_id, new_run_key, parse_run_key, secret_hash
from .backend import ToolReply
from .host import (BRIEFING_FILE, LEDGER_FILE, RUN_FILE, STEPS_FILE, WAIT_CAP_S, RunHost, RunMeta, RunUnavailable,
                   refusal, release_run)

log = logging.getLogger("rsigym_env.gateway")
T = TypeVar("T")


class GatewayError(Exception):
    """A request the service refuses: ``code`` (machine-readable), ``message`` and the HTTP ``status``."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class RunRequest(BaseModel):
    """``POST /v1/runs``: a scenario (a bundled name, YAML text, or neither for a track's base) and overrides."""

    model_config = ConfigDict(extra="forbid")
    scenario: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$",
                                 description="A bundled scenario name (`rsigym scenarios` lists them).")
    scenario_yaml: str | None = Field(None, max_length=100_000,
                                      description="A scenario as YAML; `extends:` may name a bundled scenario.")
    track: Literal["joint", "data", "harness"] | None = None
    world: str | None = Field(None, max_length=32, description="sim, local, remote, recursive or a registered world.")
    benchmark: str | None = Field(None, max_length=64)
    budget_usd: float | None = Field(None, gt=0, le=1e6)
    max_steps: int | None = Field(None, ge=1, le=100_000)
    time_limit_h: float | None = Field(None, gt=0, le=100_000)
    seed: int | None = Field(None, ge=0, lt=2**31, description="Episode seed; default: a random one (recorded).")
    world_options: dict[str, Any] | None = None
    label: str | None = Field(None, max_length=64, description="Who drives the run, e.g. 'claude-code' (for trajectories).")

    @model_validator(mode="after")
    def _one_scenario(self) -> "RunRequest":
        if self.scenario is not None and self.scenario_yaml is not None:
            raise ValueError("give either scenario (a bundled name) or scenario_yaml, not both")
        return self


def resolve_scenario(request: RunRequest) -> Scenario:
    """The scenario a request names, with its overrides; :class:`GatewayError` (422) naming what is wrong.

    >>> resolve_scenario(RunRequest(scenario="sim-data-aime-500", budget_usd=20)).budget_usd
    20.0
    >>> resolve_scenario(RunRequest(scenario_yaml="extends: sim-harness-aime-500\\nmax_steps: 7")).max_steps
    7
    >>> resolve_scenario(RunRequest(scenario="passwd.yaml"))   # a name, never a path to read
    Traceback (most recent call last):
    ...
    rsigym_env.gateway.service.GatewayError: unknown scenario 'passwd.yaml'; `rsigym scenarios` lists the bundled ones
    """
    overrides = dict(track=request.track, world=request.world, benchmark=request.benchmark,
                     budget_usd=request.budget_usd, max_steps=request.max_steps, time_limit_h=request.time_limit_h,
                     world_options=request.world_options)
    if request.world is not None and request.world not in WORLDS:
        raise GatewayError("invalid_scenario", f"unknown world {request.world!r}; worlds: {', '.join(sorted(WORLDS))}", 422)
    try:
        if request.scenario_yaml is not None:
            scenario = _scenario_from_yaml(request.scenario_yaml, overrides)
        elif request.scenario is not None:
            if request.scenario not in list_scenarios():
                raise GatewayError("invalid_scenario", f"unknown scenario {request.scenario!r}; `rsigym scenarios` "
                                   "lists the bundled ones", 422)
            scenario = load_scenario(request.scenario, **overrides)
        else:
            scenario = load_scenario(None, **overrides)
    except (ValueError, KeyError, TypeError, yaml.YAMLError, ValidationError) as exc:
        raise GatewayError("invalid_scenario", " ".join(f"{type(exc).__name__}: {exc}".split())[:2000], 422) from None
    if scenario.world not in WORLDS:
        raise GatewayError("invalid_scenario", f"unknown world {scenario.world!r}; worlds: {', '.join(sorted(WORLDS))}", 422)
    return scenario


def _scenario_from_yaml(text: str, overrides: dict[str, Any]) -> Scenario:
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"scenario_yaml must be a mapping, got {type(data).__name__}")
    parent = data.get("extends")
    if parent is not None:  # only bundled scenarios: a name, or a path inside the scenarios directory
        root = scenario_dir().resolve()
        bundled = list_scenarios()
        target = bundled.get(str(parent)) or (root / str(parent)).resolve()
        if not Path(target).resolve().is_relative_to(root) or not Path(target).is_file():
            raise ValueError(f"extends: {parent!r} is not a bundled scenario")
        data["extends"] = str(Path(target).resolve())
    with tempfile.TemporaryDirectory(prefix="rsigym-scenario-") as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(yaml.safe_dump(data))
        return load_scenario(path, **overrides)


@dataclass
class _Entry:
    meta: RunMeta
    run_dir: Path
    host: Any = None  # RunHost | RayRunHandle while the run is open
    last_used: float = field(default_factory=time.monotonic)
    inflight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class ServiceBackend:
    """One run of a :class:`SessionService` as a ``RunBackend`` (what :meth:`SessionService.backend_for_key`
    returns): calls go through the service, so idle tracking, the ``wait`` cap and closed-run refusals
    apply to every surface alike. ``close()`` does nothing: a run's life belongs to the service
    (``DELETE /v1/runs/{id}`` or the idle timeout)."""

    def __init__(self, service: "SessionService", run_id: str):
        self.service, self.run_id = service, run_id

    def call(self, tool: str, args: dict[str, Any] | None = None) -> ToolReply:
        return self.service.call(self.run_id, tool, args)

    def observation(self) -> dict[str, Any]:
        return self.service.observation(self.run_id)

    def balance(self) -> dict[str, float]:
        return self.service.balance(self.run_id)

    def jobs(self) -> list[dict[str, Any]]:
        return self.service.jobs(self.run_id)

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self.service.job(self.run_id, job_id)

    def close(self) -> None:
        return None


class SessionService:
    """Many runs in one process (or spread over a Ray cluster), persisted under ``state_dir``.

    Args:
        state_dir: where runs live (``runs/<id>/``); created ``0700``. Earlier runs found there are
            listed, and open ``sim`` runs resumed (see :mod:`.host`), when the service starts.
        admin_token: the secret for ``/v1/runs`` (only its hash is kept).
        idle_timeout_s: a run with no call for this long is closed (its jobs settled).
        max_active_runs: open runs at most (``too_many_runs`` beyond).
        max_inflight_per_run: concurrent calls on one run at most (``too_many_requests`` beyond), so
            one key cannot tie up the worker threads every run shares.
        ray_address: ``None``: runs in this process; else each run in a Ray actor (``"auto"`` or an
            address to join a cluster, ``"local"`` to start one here; a Ray already up is used as is).
        wait_cap_s: longest ``wait`` on a wall-clock world.
        start_reaper: run the idle-timeout thread (tests may call :meth:`reap_idle` instead).
    """

    def __init__(self, state_dir: str | os.PathLike[str], *, admin_token: str, idle_timeout_s: float = 1800.0,
                 max_active_runs: int = 32, max_inflight_per_run: int = 8, ray_address: str | None = None,
                 wait_cap_s: float = WAIT_CAP_S, reap_interval_s: float | None = None, start_reaper: bool = True):
        if not isinstance(admin_token, str) or len(admin_token) < 16:
            raise ValueError("the admin token must be a string of at least 16 characters")
        self.state_dir = Path(state_dir)
        self.runs_dir = self.state_dir / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)
        self._admin_hash = secret_hash(admin_token)
        self.redactor = Redactor(host_paths([self.state_dir]), split_secrets())
        """What a researcher is never told about its run: seeds, the split's secret, host paths."""
        self.idle_timeout_s = float(idle_timeout_s)
        self.max_active_runs = max_active_runs
        self.max_inflight_per_run = max_inflight_per_run
        self.wait_cap_s = wait_cap_s
        self.ray_address = ray_address
        if ray_address is not None:
            from ..sweep import init_ray

            init_ray(None if ray_address == "local" else ray_address)
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._starting = 0
        self._stop = threading.Event()
        self._recover()
        self._reaper: threading.Thread | None = None
        if start_reaper:
            interval = reap_interval_s if reap_interval_s is not None else max(0.05, min(5.0, self.idle_timeout_s / 4))
            self._reaper = threading.Thread(target=self._reap_loop, args=(interval,), name="rsigym-reaper", daemon=True)
            self._reaper.start()

    # ------------------------------------------------------------------ hosts

    def _new_host(self, entry: _Entry) -> Any:
        if self.ray_address is not None:
            from .ray_host import RayRunHandle

            return RayRunHandle(str(entry.run_dir), entry.meta.model_dump(), self.wait_cap_s)
        return RunHost(str(entry.run_dir), entry.meta.model_dump(), self.wait_cap_s)

    def _apply(self, entry: _Entry, status: dict[str, Any]) -> None:
        meta = entry.meta
        for name in ("ledger_key", "balance", "end", "code", "message"):
            if status.get(name) is not None:
                setattr(meta, name, status[name])
        meta.steps = int(status.get("steps", meta.steps) or 0)
        if status.get("state"):
            meta.state = status["state"]

    def _recover(self) -> None:
        """List every run under ``runs/``; resume the open ones (sim) or mark them interrupted."""
        for run_dir in sorted(p for p in self.runs_dir.iterdir() if p.is_dir()):
            try:
                meta = RunMeta.load(run_dir)
            except (OSError, ValueError) as exc:
                log.warning("skipping %s: no readable run.json (%s)", run_dir, exc)
                continue
            entry = _Entry(meta, run_dir)
            self._entries[meta.run_id] = entry
            if meta.state not in ("active", "done"):
                continue
            host = self._new_host(entry)
            try:
                status = host.start(resume=True)
            except Exception as exc:  # a broken run must not keep the service from starting
                log.exception("could not resume run %s", meta.run_id)
                status = {"state": "interrupted", "code": "resume_failed", "message": f"{type(exc).__name__}: {exc}"}
            self._apply(entry, status)
            if meta.state in ("active", "done"):
                entry.host = host
            elif hasattr(host, "kill"):
                host.kill()
            meta.save(run_dir)

    # ------------------------------------------------------------------ admin

    def check_admin(self, token: str | None) -> bool:
        """Is ``token`` the admin token (constant time)?"""
        return matches(token, self._admin_hash)

    def create_run(self, request: RunRequest) -> dict[str, Any]:
        """Start a run; ``{run_id, run_key, ...}`` — the key is shown only here."""
        return self.open_run(resolve_scenario(request), request.seed, request.label)

    def open_run(self, scenario: Scenario, seed: int | None = None, label: str | None = None) -> dict[str, Any]:
        """Start a run of ``scenario`` as it is (what :meth:`create_run` does once the request is resolved; a
        caller in this process, such as ``rsigym recurse`` opening a round's outer episode, hands the scenario
        itself); ``{run_id, run_key, ...}``."""
        with self._lock:
            open_runs = sum(1 for e in self._entries.values() if e.host is not None) + self._starting
            if open_runs >= self.max_active_runs:
                raise GatewayError("too_many_runs", f"{open_runs} runs are open (at most {self.max_active_runs}); "
                                   "close one (DELETE /v1/runs/{id}) or wait for the idle timeout", 429)
            self._starting += 1
        try:
            run_id = new_run_id()
            key = new_run_key(run_id)
            run_dir = self.runs_dir / run_id
            run_dir.mkdir(mode=0o700)
            seed = seed if seed is not None else secrets.randbelow(2**31)
            entry = _Entry(RunMeta.new(run_id, secret_hash(key), scenario, seed, label), run_dir)
            entry.meta.save(run_dir)
            host = self._new_host(entry)
            try:
                status = host.start(resume=False)
                briefing = host.observation()["log"]
            except Exception as exc:
                if hasattr(host, "kill"):
                    host.kill()
                entry.meta.state, entry.meta.code = "closed", "start_failed"
                entry.meta.message = f"{type(exc).__name__}: {exc}"[:2000]
                entry.meta.save(run_dir)
                with self._lock:
                    self._entries[run_id] = entry
                status_code = 422 if isinstance(exc, (ValueError, ValidationError)) else 503
                raise GatewayError("start_failed", f"the run could not start: {entry.meta.message}", status_code) from None
            self._apply(entry, status)
            entry.meta.save(run_dir)
            entry.host = host
            entry.last_used = time.monotonic()  # idle from now, not from before its world started
            with self._lock:
                self._entries[run_id] = entry
        finally:
            with self._lock:
                self._starting -= 1
        return {"run_id": run_id, "run_key": key, **self._summary(entry, live=False),
                "tools": scenario.tools(), "briefing": briefing}

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run the service knows, oldest first, with its state (live figures for open runs)."""
        with self._lock:
            entries = list(self._entries.values())
        return [self._summary(e) for e in sorted(entries, key=lambda e: e.meta.created_at)]

    def run_summary(self, run_id: str) -> dict[str, Any]:
        """A run's summary as the admin sees it (with its seed)."""
        return self._summary(self._entry(run_id))

    def researcher_summary(self, run_id: str) -> dict[str, Any]:
        """A run's summary as its run key sees it: no seed (with it a sim run could be replayed offline to
        know any candidate's held-out score), no host path or secret in its messages."""
        entry = self._entry(run_id)
        return self.redactor.with_numbers([entry.meta.seed]).data(self._summary(entry))

    def close_run(self, run_id: str, code: str = "deleted") -> dict[str, Any]:
        """Close a run: settle its running jobs, audit it, close its env. Idempotent."""
        entry = self._entry(run_id)
        with entry.lock:
            host, entry.host = entry.host, None
        if host is not None:
            try:
                status = host.close(code)
            except Exception as exc:
                log.exception("closing run %s", run_id)
                status = {"message": f"{type(exc).__name__}: {exc}"}
            with entry.lock:
                self._apply(entry, status)
                entry.meta.state, entry.meta.code = "closed", code
                entry.meta.save(entry.run_dir)
        return self._summary(entry, live=False)

    def _entry(self, run_id: str) -> _Entry:
        entry = self._entries.get(run_id)
        if entry is None:
            raise GatewayError("unknown_run", f"no run {run_id!r}", 404)
        return entry

    def _summary(self, entry: _Entry, live: bool = True) -> dict[str, Any]:
        meta = entry.meta
        s = meta.scenario
        out = {"run_id": meta.run_id, "state": meta.state, "code": meta.code, "message": meta.message,
               "label": meta.label, "scenario": s.get("name"), "track": s.get("track"), "world": s.get("world"),
               "benchmark": s.get("benchmark"), "budget_usd": s.get("budget_usd"), "seed": meta.seed,
               "created_at": meta.created_at, "updated_at": meta.updated_at, "steps": meta.steps,
               "balance": meta.balance, "reward": (meta.end or {}).get("normalized_gain"),
               "idle_s": round(time.monotonic() - entry.last_used, 3) if entry.host is not None else None}
        host = entry.host
        if live and host is not None:
            try:
                status = host.status()
                out.update(steps=status["steps"], balance=status["balance"])
            except RunUnavailable:
                pass
        return out

    # ------------------------------------------------------------------ researcher calls

    def run_for_key(self, key: str | None) -> str | None:
        """The run id a run key opens, or ``None`` (one constant-time comparison either way)."""
        run_id = parse_run_key(key)
        entry = self._entries.get(run_id) if run_id is not None else None
        ok = matches(key, entry.meta.key_sha256 if entry is not None else None)
        return run_id if ok and entry is not None else None

    def backend_for_key(self, key: str | None) -> ServiceBackend | None:
        """The run a bearer run key opens, as a ``RunBackend`` (``None`` for a wrong key)."""
        run_id = self.run_for_key(key)
        return ServiceBackend(self, run_id) if run_id is not None else None

    def _unavailable(self, entry: _Entry) -> tuple[str, str]:
        meta = entry.meta
        if meta.state == "interrupted":  # the message may hold an exception's text: no host path in it
            return "run_interrupted", self.redactor.text(f"this run was interrupted ({meta.code}): {meta.message or ''}".strip())
        return "run_closed", f"this run is closed ({meta.code or 'closed'})"

    def _use(self, run_id: str, what: Callable[[Any], T], tool: str | None = None) -> T | ToolReply:
        """Run ``what(host)`` with the run's in-flight accounting; a refusal when the run is not open."""
        entry = self._entry(run_id)
        with entry.lock:
            host = entry.host
            if host is None or entry.inflight >= self.max_inflight_per_run:
                if host is None:
                    code, message = self._unavailable(entry)
                    status = 410
                else:
                    code, message = "too_many_requests", (f"{entry.inflight} calls on this run are still running "
                                                          f"(at most {self.max_inflight_per_run} at once)")
                    status = 429
                if tool is not None:
                    left = (entry.meta.balance or {}).get("remaining_usd", 0.0)
                    return refusal(tool, code, message, left)
                raise GatewayError(code, message, status)
            entry.inflight += 1
            entry.last_used = time.monotonic()
        try:
            return what(host)
        except RunUnavailable as exc:
            code, message = exc.code, exc.message
            if code == "actor_lost":
                self._lost(entry, host, message)
                code, message = self._unavailable(entry)
            if tool is not None:
                return refusal(tool, code, message)
            raise GatewayError(code, message, 410) from None
        finally:
            with entry.lock:
                entry.inflight -= 1
                entry.last_used = time.monotonic()

    def _lost(self, entry: _Entry, host: Any, message: str) -> None:
        """A run whose host died under it (a Ray actor): interrupted, its held money released."""
        with entry.lock:
            if entry.host is not host:
                return
            entry.host = None
        balance = release_run(entry.run_dir / LEDGER_FILE, entry.meta.ledger_key, "actor_lost", message)
        with entry.lock:
            entry.meta.state, entry.meta.code, entry.meta.message = "interrupted", "actor_lost", message
            entry.meta.balance = balance or entry.meta.balance
            entry.meta.save(entry.run_dir)

    def call(self, run_id: str, tool: str, args: Any = None) -> ToolReply:
        """One tool call on a run; refusals (including a closed run) are replies, never exceptions."""
        reply = self._use(run_id, lambda host: host.call(tool, args), tool=tool)
        assert isinstance(reply, ToolReply)
        if reply.done:
            entry = self._entry(run_id)
            with entry.lock:
                if entry.meta.state == "active" and reply.end is not None:
                    entry.meta.state, entry.meta.end = "done", reply.end
                    entry.meta.save(entry.run_dir)
        return reply

    def refusal(self, run_id: str, tool: str, code: str, message: str) -> ToolReply:
        """A refusal of a call the gateway itself rejects (e.g. a body that is not JSON), with the run's
        money left; not a step, not audited."""
        try:
            left = float(self.balance(run_id)["remaining_usd"])
        except GatewayError:
            left = 0.0
        return refusal(tool, code, message, left)

    def observation(self, run_id: str) -> dict[str, Any]:
        return self._use(run_id, lambda host: host.observation())  # type: ignore[return-value]

    def balance(self, run_id: str) -> dict[str, float]:
        return self._use(run_id, lambda host: host.balance())  # type: ignore[return-value]

    def jobs(self, run_id: str) -> list[dict[str, Any]]:
        return self._use(run_id, lambda host: host.jobs())  # type: ignore[return-value]

    def job(self, run_id: str, job_id: str) -> dict[str, Any] | None:
        return self._use(run_id, lambda host: host.job(job_id))  # type: ignore[return-value]

    def local_env(self, run_id: str) -> Any:
        """The gym env of an open run hosted in this process (not in a Ray actor): for a caller in this
        process that reads what the episode left in its world once it is over (``rsigym recurse`` reads a
        round's candidates); :class:`GatewayError` ``not_local`` otherwise. Never exposed to run keys."""
        entry = self._entry(run_id)
        served = getattr(entry.host, "served", None)
        if served is None:
            raise GatewayError("not_local", f"run {run_id} is not open in this process", 409)
        return served.env

    def tools(self, run_id: str) -> list[str]:
        """The tools this run's key allows."""
        return Scenario.model_validate(self._entry(run_id).meta.scenario).tools()

    # ------------------------------------------------------------------ records of an ended run (read-only)

    def _ended(self, run_id: str) -> _Entry:
        """The run's entry once its episode is over (done, closed or interrupted); 409 before: its records
        are the verifier's evidence, not a view the researcher needs while it works."""
        entry = self._entry(run_id)
        if entry.meta.state == "active":
            raise GatewayError("episode_not_over", "the run's ledger, audit log and trajectory are available once "
                               "its episode is over (submit ends it)", 409)
        return entry

    def _read_ledger(self, entry: _Entry) -> sqlite3.Connection:
        path = entry.run_dir / LEDGER_FILE
        if not path.is_file():
            raise GatewayError("no_ledger", f"run {entry.meta.run_id} has no ledger file", 404)
        return sqlite3.connect(f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro", uri=True, timeout=30.0)

    def audit(self, run_id: str) -> dict[str, Any]:
        """The run's audit log, record by record (``seq``, ``key``, ``event``, ``prev_hash``, ``hash``), and
        whether its hash chain is intact (:func:`~rsigym_env.platform.audit.verify_audit`)."""
        entry = self._ended(run_id)
        conn = self._read_ledger(entry)
        try:
            records = [dataclasses.asdict(r) for r in read_records(conn.cursor())]
        finally:
            conn.close()
        report = verify_audit(entry.run_dir / LEDGER_FILE)
        return {"run_id": run_id, "records": records,
                "verified": {"ok": report.ok, "records": report.records, "first_broken": report.first_broken,
                             "reason": report.reason}}

    def ledger(self, run_id: str) -> dict[str, Any]:
        """The run's ledger: every account (budget, spent, reserved, granted, in nano-dollars and dollars)
        and every reservation still open."""
        entry = self._ended(run_id)
        conn = self._read_ledger(entry)
        try:
            accounts = conn.execute("SELECT key, parent, budget, spent, reserved, granted, closed FROM accounts "
                                    "ORDER BY key").fetchall()
            open_rows = conn.execute("SELECT id, key, nano FROM reservations ORDER BY id").fetchall()
        finally:
            conn.close()
        names = ("budget", "spent", "reserved", "granted")
        return {"run_id": run_id, "unit": "nano-dollars (1e-9 USD)",
                "accounts": [{"key": k, "parent": parent, **dict(zip(names, nums)),
                              **{f"{n}_usd": v / NANO for n, v in zip(names, nums)}, "closed": bool(closed)}
                             for k, parent, *nums, closed in accounts],
                "open_reservations": [{"id": i, "key": k, "nano": n} for i, k, n in open_rows]}

    def ledger_snapshot(self, run_id: str) -> bytes:
        """A consistent copy of the run's ledger database (``ledger.sqlite``: books and audit log, for
        ``rsigym ledger show`` / ``rsigym audit verify``)."""
        entry = self._ended(run_id)
        conn = self._read_ledger(entry)
        with tempfile.TemporaryDirectory(prefix="rsigym-ledger-") as tmp:
            target = Path(tmp) / LEDGER_FILE
            try:
                conn.execute("VACUUM INTO ?", (str(target),))
            finally:
                conn.close()
            return target.read_bytes()

    def trajectory(self, run_id: str) -> dict[str, Any]:
        """The run's episode as an ATIF trajectory (what ``rsigym export atif`` writes)."""
        from ..atif import export_atif

        entry = self._ended(run_id)
        if (entry.run_dir / STEPS_FILE).is_file():
            return export_atif(entry.run_dir).to_json_dict()
        with tempfile.TemporaryDirectory(prefix="rsigym-atif-") as tmp:  # no step was taken: the briefing alone
            for name in (RUN_FILE, BRIEFING_FILE):
                if (entry.run_dir / name).is_file():
                    shutil.copyfile(entry.run_dir / name, Path(tmp) / name)
            (Path(tmp) / STEPS_FILE).touch()
            return export_atif(tmp).to_json_dict()

    # ------------------------------------------------------------------ idle runs, shutdown

    def reap_idle(self) -> list[str]:
        """Close every open run with no call for ``idle_timeout_s``; the ids closed."""
        now = time.monotonic()
        with self._lock:
            idle = [rid for rid, e in self._entries.items()
                    if e.host is not None and e.inflight == 0 and now - e.last_used > self.idle_timeout_s]
        closed = []
        for run_id in idle:
            entry = self._entries[run_id]
            with entry.lock:  # a call may have arrived since
                still_idle = entry.inflight == 0 and time.monotonic() - entry.last_used > self.idle_timeout_s
            if still_idle:
                self.close_run(run_id, "idle_timeout")
                closed.append(run_id)
        return closed

    def _reap_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.reap_idle()
            except Exception:  # the reaper must outlive any one run's failure
                log.exception("idle-run reaper")

    def shutdown(self) -> None:
        """Stop the reaper and every run without settling anything: open runs resume (sim) or are
        interrupted when a service starts again on this state directory."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(5)
        with self._lock:
            entries = list(self._entries.values())
        for entry in entries:
            with entry.lock:
                host, entry.host = entry.host, None
            if host is not None:
                try:
                    host.shutdown()
                except Exception:
                    log.exception("stopping run %s", entry.meta.run_id)

    def __enter__(self) -> "SessionService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
