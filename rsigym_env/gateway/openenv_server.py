"""An OpenEnv-compatible server: each WebSocket session is its own research run.

It speaks OpenEnv 0.3's wire protocol, so OpenEnv's own clients (``EnvClient``, ``GenericEnvClient``,
TRL and torchforge integrations built on them) run episodes unchanged:

* ``WS /ws``: the client sends ``{"type": "reset", "data": {"seed": 0}}``, ``{"type": "step", "data":
  {"tool": "evaluate", "args": {"k": 1}}}``, ``{"type": "state"}`` or ``{"type": "close"}``; the server
  answers ``{"type": "observation", "data": {"observation", "reward", "done"}}``, ``{"type": "state",
  "data": {...}}`` or ``{"type": "error", "data": {"message", "code"}}`` (codes as OpenEnv's
  ``WSErrorCode``: ``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR``, ``EXECUTION_ERROR``,
  ``CAPACITY_REACHED``, ``FACTORY_ERROR``, ``SESSION_ERROR``).
* ``GET /health``, ``GET /schema`` (JSON schemas of :class:`ResearchAction`, :class:`ResearchObservation`,
  :class:`ResearchState`), ``GET /metadata``.

The stateless HTTP ``/reset`` and ``/step`` of OpenEnv's simulation mode build a fresh env per request,
which cannot hold a research run; they are not served (as in OpenEnv's production mode).

A step is one tool call: the tool's arguments are validated, billed and audited by the run (a refused
call is an observation with ``ok=False`` and its ``error`` code, costing nothing); the transport only
checks the message's shape. The reward is ``None`` until the episode ends, then the normalized gain.
Sessions are isolated (each its own run, its own key), at most ``max_sessions`` at once, and a session
that sends nothing for ``session_timeout_s`` is closed and its run ended. The seed is the only thing a
client chooses: the scenario, budget and world are the server's. With a ``seed_key`` (``rsigym openenv``'s
default, derived from the platform's secret) the episode is reset with a keyed hash of the client's seed:
the same seed gives the same episode on this machine, but a client cannot replay it offline (a sim
episode replayed from its seed would tell any candidate's held-out score before it is submitted);
``--public-seeds`` uses the client's seed as it is, for comparisons with runs elsewhere.

>>> from starlette.testclient import TestClient
>>> from rsigym_env.gateway.local_runs import LocalRunFactory
>>> app = openenv_app(LocalRunFactory(world="sim", benchmark="aime", budget_usd=50))
>>> with TestClient(app) as http, http.websocket_connect("/ws") as ws:
...     ws.send_json({"type": "reset", "data": {"seed": 0}})
...     first = ws.receive_json()["data"]
...     ws.send_json({"type": "step", "data": {"tool": "submit", "args": {}}})
...     last = ws.receive_json()["data"]
>>> first["done"], "AIME" in first["observation"]["text"], last["done"], last["reward"]
(False, True, True, 0.0)
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import json
import logging
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..splits import official_split
from ..tools import TOOL_NAMES
from ..watch.redact import Redactor, host_paths, split_secrets
from .backend import RunBackend, ToolReply, jsonable
from .local_runs import LocalRunFactory, add_openenv_arguments

log = logging.getLogger(__name__)

MakeRun = Callable[[int | None], RunBackend]
"""Builds a new run, reset with the given seed (a :class:`LocalRunFactory` is one)."""


class ResearchAction(BaseModel):
    """One tool call: the tool's name and its arguments (exactly a ``step`` action of the Gymnasium env)."""

    model_config = ConfigDict(extra="forbid")
    tool: str = Field(max_length=64, description=f"The tool: one of {', '.join(TOOL_NAMES)}.")
    args: dict[str, Any] = Field(default_factory=dict, description=(
        "The tool's arguments (schemas: rsigym_env.tool_schemas(), `rsigym tools --json`)."))
    metadata: dict[str, Any] = Field(default_factory=dict, description="Ignored by the run (OpenEnv's Action field).")


class ResearchObservation(BaseModel):
    """What the researcher sees after a reset or a tool call."""

    model_config = ConfigDict(extra="forbid")
    done: bool = Field(False, description="True once the episode has ended (submitted, or out of steps/time/money).")
    reward: float | None = Field(None, description=(
        "None until the episode ends; then the normalized gain on the held-out split."))
    metadata: dict[str, Any] = Field(default_factory=dict, description="OpenEnv's Observation field (unused).")
    text: str = Field(description=(
        "What the researcher reads: the status line and the result of the last call (or the briefing)."))
    tool: str | None = Field(None, description="The tool of the last call (None after reset).")
    ok: bool = Field(True, description="False if the last call was refused (then `error` and `message` say why).")
    error: str | None = Field(None, description="Error code of a refused call, e.g. invalid_args, insufficient_budget.")
    message: str | None = Field(None, description="What was wrong, for a refused call.")
    result: dict[str, Any] | None = Field(None, description="The structured result of an allowed call.")
    cost_usd: float = Field(0.0, description="What the last call cost.")
    budget_left_usd: float = Field(0.0, description="Dollars left on the run's key.")
    time_left_h: float = Field(0.0, description="Research hours left on the world's clock.")
    step: int = Field(0, description="Tool calls so far.")
    dev_scores: list[float | None] = Field(default_factory=list, description=(
        "Initial, best and last dev score (-1: not measured)."))
    running_jobs: int = Field(0, description="Jobs still running.")
    action_mask: list[int] = Field(default_factory=list, description=(
        f"Per tool ({', '.join(TOOL_NAMES)}): 1 if usable now."))
    events: list[dict[str, Any]] = Field(default_factory=list, description="Jobs that finished during the last call.")
    end: dict[str, Any] | None = Field(None, description=(
        "The end-of-episode summary (official score, spend, ...), once done."))


class ResearchState(BaseModel):
    """The session's state (OpenEnv's ``State``: ``episode_id``, ``step_count``)."""

    model_config = ConfigDict(extra="forbid")
    episode_id: str | None = Field(None, description="The episode's id (the client's, or a new one).")
    step_count: int = Field(0, ge=0, description="Steps taken in this episode.")
    seed: int | None = Field(None, description="The seed the client reset with (with keyed seeds, not the episode's).")
    done: bool = Field(False, description="True once the episode has ended.")
    budget_left_usd: float | None = Field(None, description="Dollars left (None before the first reset).")


class _ResetData(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenEnv passes only the kwargs reset() takes
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    episode_id: str | None = Field(None, max_length=255)


def observation_of(obs: dict[str, Any], reply: ToolReply | None = None) -> ResearchObservation:
    """A run's observation (and the reply of the call that led to it) as a :class:`ResearchObservation`."""
    common = dict(budget_left_usd=float(obs.get("budget_left_usd") or 0.0),
                  time_left_h=float(obs.get("time_left_h") or 0.0), step=int(obs.get("step") or 0),
                  dev_scores=list(obs.get("dev_scores") or []), running_jobs=int(obs.get("running_jobs") or 0),
                  action_mask=[int(v) for v in obs.get("action_mask") or []])
    if reply is None:
        return ResearchObservation(done=bool(obs.get("done")), text=str(obs.get("log", "")), end=obs.get("end"), **common)
    return ResearchObservation(done=reply.done, reward=reply.reward if reply.done else None, text=reply.text,
                               tool=reply.tool, ok=reply.ok, error=reply.error, message=reply.message, result=reply.result,
                               cost_usd=reply.cost_usd, events=reply.events, end=reply.end or obs.get("end"),
                               **{**common, "budget_left_usd": reply.budget_left_usd})


def wire_observation(observation: ResearchObservation) -> dict[str, Any]:
    """OpenEnv's ``serialize_observation``: ``{"observation": fields, "reward", "done"}``."""
    return {"observation": jsonable(observation.model_dump(exclude={"reward", "done", "metadata"})),
            "reward": observation.reward, "done": observation.done}


@dataclass
class _Session:
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    run: RunBackend | None = None
    episode_id: str | None = None
    seed: int | None = None
    steps: int = 0
    done: bool = False
    budget_left_usd: float | None = None


def keyed_seed(key: bytes, seed: int) -> int:
    """The episode seed behind a client's ``seed`` under ``key`` (31 bits, as a client's own).

    >>> keyed_seed(b"k", 0) == keyed_seed(b"k", 0) != keyed_seed(b"other", 0), 0 <= keyed_seed(b"k", 7) < 2**31
    (True, True)
    """
    return int.from_bytes(hmac.new(key, f"openenv-seed:{seed}".encode(), hashlib.sha256).digest()[:4], "big") >> 1


def _error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def _failure(exc: BaseException, *paths: Any) -> str:
    """An exception as a client may read it: its type and text, without host paths (``paths`` and any
    absolute one) or the split's secret (OpenEnv clients send no credentials: whoever connects reads this)."""
    known = host_paths([p for p in paths if p])
    return Redactor(known, split_secrets()).text(f"{type(exc).__name__}: {exc}")[:2000]


class OpenEnvServer:
    """The sessions and routes behind :func:`openenv_app`."""

    def __init__(self, make_run: MakeRun, *, max_sessions: int = 8, session_timeout_s: float | None = 900.0,
                 max_message_bytes: int = 1 << 20, max_runs: int | None = None, name: str = "rsigym",
                 description: str | None = None, seed_key: bytes | None = None):
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        if session_timeout_s is not None and not session_timeout_s > 0:
            raise ValueError(f"session_timeout_s must be > 0 or None, got {session_timeout_s}")
        self.make_run = make_run
        self.max_sessions = max_sessions
        self.session_timeout_s = session_timeout_s
        self.max_message_bytes = max_message_bytes
        self.max_runs = max_runs
        self.seed_key = seed_key  # None: a client's seed is the episode's (see the module doc)
        self.runs_started = 0
        self.name = name
        self.description = description or ("A research run of RSIGym-Env: improve a target system on a benchmark "
                                           "with billed tool calls; reward = normalized gain on a held-out split.")
        self.sessions: dict[str, _Session] = {}
        self._paths = [getattr(make_run, "run_dir", None), getattr(make_run, "ledger_path", None)]

    # -- HTTP ------------------------------------------------------------------------------

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy"})

    async def schema(self, request: Request) -> JSONResponse:
        return JSONResponse({"action": ResearchAction.model_json_schema(),
                             "observation": ResearchObservation.model_json_schema(),
                             "state": ResearchState.model_json_schema()})

    async def metadata(self, request: Request) -> JSONResponse:
        from .. import __version__

        return JSONResponse({"name": self.name, "description": self.description, "readme_content": None,
                             "version": __version__, "author": None, "documentation_url": None})

    # -- WebSocket sessions ----------------------------------------------------------------

    async def websocket(self, websocket: WebSocket) -> None:
        await websocket.accept()
        if len(self.sessions) >= self.max_sessions:
            # answer the client's first message (its reset), so its call fails with the reason, then close
            with anyio.move_on_after(10.0):
                await websocket.receive()
            try:
                await websocket.send_json(_error("CAPACITY_REACHED", f"all {self.max_sessions} sessions are in use",
                                                 active_sessions=len(self.sessions), max_sessions=self.max_sessions))
                await websocket.close(code=1013)
            except (RuntimeError, WebSocketDisconnect):
                pass
            return
        session = _Session()
        self.sessions[session.id] = session
        try:
            while True:
                raw = await self._receive(websocket)
                if raw is None:
                    break
                reply = await self._handle(session, raw)
                if reply is None:  # "close"
                    break
                await websocket.send_text(json.dumps(reply))
        except WebSocketDisconnect:
            pass
        finally:
            self.sessions.pop(session.id, None)
            with anyio.CancelScope(shield=True):
                await self._end_run(session)
            try:
                await websocket.close()
            except (RuntimeError, WebSocketDisconnect):  # already closed
                pass

    async def _receive(self, websocket: WebSocket) -> str | bytes | None:
        """The next message, or ``None`` when the client left or the session was idle too long."""
        message: dict[str, Any] | None = None
        with anyio.move_on_after(self.session_timeout_s):
            message = await websocket.receive()
        if message is None:
            log.info("OpenEnv session idle for %s s: closed", self.session_timeout_s)
            await websocket.send_json(_error("SESSION_ERROR", f"no message for {self.session_timeout_s} s: "
                                                              "the session is closed and its run ended"))
            return None
        if message["type"] == "websocket.disconnect":
            return None
        return message.get("text") if message.get("text") is not None else message.get("bytes", b"")

    async def _handle(self, session: _Session, raw: str | bytes) -> dict[str, Any] | None:
        if len(raw) > self.max_message_bytes:
            return _error("VALIDATION_ERROR",
                          f"a message of {len(raw):,} bytes is over the limit of {self.max_message_bytes:,}")
        try:
            message = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error("INVALID_JSON", f"Invalid JSON: {exc}")
        if not isinstance(message, dict):
            return _error("VALIDATION_ERROR", f"a message is a JSON object, got {type(message).__name__}")
        kind, data = message.get("type"), message.get("data", {})
        if kind == "close":
            return None
        if kind == "state":
            return {"type": "state", "data": self._state(session).model_dump()}
        if kind not in ("reset", "step"):
            return _error("UNKNOWN_TYPE", f"Unknown message type: {str(kind)[:64]}")
        if not isinstance(data, dict):
            return _error("VALIDATION_ERROR", f'"data" must be an object, got {type(data).__name__}')
        try:
            return await (self._reset(session, data) if kind == "reset" else self._step(session, data))
        except ValidationError as exc:
            errors = jsonable(exc.errors(include_url=False, include_context=False))
            return _error("VALIDATION_ERROR", "Invalid message", errors=errors)

    async def _reset(self, session: _Session, data: dict[str, Any]) -> dict[str, Any]:
        params = _ResetData.model_validate(data)
        await self._end_run(session)
        if self.max_runs is not None and self.runs_started >= self.max_runs:
            return _error("FACTORY_ERROR", f"this server has started its limit of {self.max_runs} runs",
                          factory_name=type(self.make_run).__name__)
        self.runs_started += 1  # counted before the build, so concurrent resets cannot pass the limit
        try:
            seed = params.seed if params.seed is None or self.seed_key is None else keyed_seed(self.seed_key, params.seed)
            run = await anyio.to_thread.run_sync(self.make_run, seed)
        except Exception as exc:
            log.exception("OpenEnv session: the run could not be built")
            return _error("FACTORY_ERROR", f"the run could not be built: {_failure(exc, *self._paths)}",
                          factory_name=type(self.make_run).__name__)
        session.run, session.seed, session.steps = run, params.seed, 0
        session.episode_id = params.episode_id or uuid.uuid4().hex
        try:
            obs = await anyio.to_thread.run_sync(run.observation)
        except Exception as exc:
            return _error("EXECUTION_ERROR", f"the run is unavailable: {_failure(exc, *self._paths)}")
        observation = observation_of(obs)
        session.done, session.budget_left_usd = observation.done, observation.budget_left_usd
        return {"type": "observation", "data": wire_observation(observation)}

    async def _step(self, session: _Session, data: dict[str, Any]) -> dict[str, Any]:
        action = ResearchAction.model_validate(data)
        run = session.run
        if run is None:
            return _error("SESSION_ERROR", "no episode yet: send a reset first")

        def call() -> ResearchObservation:
            reply = run.call(action.tool, action.args)
            return observation_of(run.observation(), reply)

        try:
            observation = await anyio.to_thread.run_sync(call)
        except Exception as exc:  # a bad call is an observation; only an unreachable run raises
            return _error("EXECUTION_ERROR", f"the run is unavailable: {_failure(exc, *self._paths)}")
        session.steps += 1
        session.done, session.budget_left_usd = observation.done, observation.budget_left_usd
        return {"type": "observation", "data": wire_observation(observation)}

    def _state(self, session: _Session) -> ResearchState:
        return ResearchState(episode_id=session.episode_id, step_count=session.steps, seed=session.seed,
                             done=session.done, budget_left_usd=session.budget_left_usd)

    async def _end_run(self, session: _Session) -> None:
        run, session.run = session.run, None
        if run is not None:
            try:
                await anyio.to_thread.run_sync(run.close)
            except Exception:
                log.exception("OpenEnv session: closing the run failed")

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/health", self.health), Route("/schema", self.schema), Route("/metadata", self.metadata),
            WebSocketRoute("/ws", self.websocket),
        ])


def openenv_app(make_run: MakeRun, *, max_sessions: int = 8, session_timeout_s: float | None = 900.0,
                max_message_bytes: int = 1 << 20, max_runs: int | None = None,
                seed_key: bytes | None = None) -> Starlette:
    """The OpenEnv-compatible ASGI app; ``make_run(seed)`` builds each session's run on ``reset``.

    Every ``reset`` starts a run with the scenario's full budget, so ``max_runs`` bounds how many the
    server ever starts (what a client can spend is at most ``max_runs`` budgets; default: no bound).
    ``seed_key``: reset with :func:`keyed_seed` of the client's seed (None: the client's seed as it is).
    ``app.state.openenv`` is the :class:`OpenEnvServer` (its ``sessions`` are the open ones).
    """
    server = OpenEnvServer(make_run, max_sessions=max_sessions, session_timeout_s=session_timeout_s,
                           max_message_bytes=max_message_bytes, max_runs=max_runs, seed_key=seed_key)
    app = server.app()
    app.state.openenv = server
    return app


# ------------------------------------------------------------------------------------------------
# `rsigym openenv`


def cmd_openenv(args: argparse.Namespace, console: Any = None) -> int:
    """``rsigym openenv``: serve the scenario to OpenEnv clients until Ctrl-C."""
    import uvicorn

    factory = LocalRunFactory.from_args(args)
    try:
        if not _is_loopback(args.host) and not args.allow_remote:
            raise ValueError(f"--host {args.host} is not a loopback address. OpenEnv clients send no credentials, "
                             "so anyone who reaches the port can start runs on this scenario's budget: pass "
                             "--allow-remote (and --max-runs) to accept that")
        factory.make_env().close()  # a bad scenario fails now, with its reason
    except ValueError as exc:
        print(f"rsigym openenv: {exc}", file=sys.stderr)
        return 2
    seed_key = None if args.public_seeds else official_split("secret", nonce="").key("openenv-seeds")
    app = openenv_app(factory, max_sessions=args.max_sessions, session_timeout_s=args.session_timeout,
                      max_runs=args.max_runs, seed_key=seed_key)
    print(f"OpenEnv server on ws://{args.host}:{args.port}/ws (max {args.max_sessions} sessions)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", ws="websockets-sansio")
    return 0


def _is_loopback(host: str) -> bool:
    """``True`` for 127.0.0.0/8, ::1 and ``localhost``.

    >>> _is_loopback("127.0.0.1"), _is_loopback("localhost"), _is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rsigym openenv", description="Serve research runs over OpenEnv's protocol.")
    add_openenv_arguments(parser)
    return cmd_openenv(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
