"""The harness as a Harbor agent: ``python3 /harness/agent.py`` inside the trial's sandbox (any Harbor environment).

Plug it into a Harbor job by import path, one agent config per attempt (so each trial knows its
attempt index and its seed does not depend on scheduling)::

    AgentConfig(import_path="rsigym_env.worlds.common.harbor_agent:HarnessAgent",
                kwargs={"harness_dir": "/path/to/harness", "session": "ev-7", "attempt": 0})

``session`` names a :class:`ModelSession` registered in this process (:func:`register_session`):
the unix socket the model is served on, and how to give each trial its own model id (an alias with
a token budget, whose server-side counters bill the trial). The harness directory is mounted
read-only at ``/harness`` and the socket at ``/run/rsigym/model.sock``, for the agent phase only; there the
harness comes with its bytecode, compiled in a sandbox once per harness version, and its ``agent.py`` is run
from it (:mod:`.harness.bytecode`: the same behaviour, ~5 ms less of the minimal harness's start).

The harness process gets ``RSIGYM_MODEL_SOCKET``, ``RSIGYM_MODEL`` (its alias),
``RSIGYM_INSTRUCTION_FILE`` (``/logs/agent/instruction.md``), ``RSIGYM_SEED``, ``RSIGYM_LOGS_DIR``
(``/logs/agent``) and ``RSIGYM_APP_DIR`` (``/app``), and writes ``/logs/agent/trajectory.json``
(``{"end_reason": ..., "steps": [...]}``). Afterwards that file is kept as
``harness-trajectory.json`` and replaced by Harbor's ATIF trajectory (:func:`to_atif`); the
AgentContext gets token counts from the server's counters (the harness is untrusted: what it
reports about itself is kept only as metadata).

>>> trial_seed(0, "t-42", 1) == trial_seed(0, "t-42", 1) != trial_seed(0, "t-42", 2)
True
>>> to_atif({"end_reason": "answer", "steps": [{"role": "user", "content": "2+2?"},
...          {"role": "assistant", "content": "ANSWER: 4"}]}, agent_name="h", version="1").steps[1].source
'agent'
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, runtime_checkable

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext, ModelUsage
from harbor.models.trajectories import (
    Agent as AtifAgent, FinalMetrics, Observation, ObservationResult, Step, ToolCall as AtifToolCall, Trajectory,
)

from .harness import bytecode
from ...serving.models import (
    ChatChoice, ChatModel, ChatRequest, ModelRegistry, ModelRequestError, estimate_completion_tokens,
    estimate_prompt_tokens,
)
from ...serving.openai_server import Usage, UsageMeter

IMPORT_PATH = "rsigym_env.worlds.common.harbor_agent:HarnessAgent"


@runtime_checkable
class AgentMounts(Protocol):
    """An environment that mounts host files into the agent phase only and whose files are host files (the local
    world's bubblewrap environment): the harness and the model socket are mounted, the trajectory read in place.
    Any other environment gets the harness uploaded and its trajectory downloaded."""

    def add_agent_mount(self, host: Path | str, target: str, *, copy: bool = False) -> None: ...

    def host_path(self, path: str) -> Path: ...
HARNESS_MOUNT = "/harness"
SOCKET_MOUNT = "/run/rsigym/model.sock"
LOGS_DIR = "/logs/agent"
APP_DIR = "/app"
INSTRUCTION_FILE = f"{LOGS_DIR}/instruction.md"
TRAJECTORY_FILE = "trajectory.json"
RAW_TRAJECTORY_FILE = "harness-trajectory.json"
MAX_TRAJECTORY_BYTES = 4 << 20
MAX_STEPS = 2000


def trial_seed(eval_seed: int, task: str, attempt: int, key: bytes = b"") -> int:
    """The harness's seed for one attempt at one task: a keyed hash of (evaluation seed, task id, attempt).

    With the platform's ``key`` (derived from the split secret) nobody outside the platform can tell
    from a seed which task, attempt or split it belongs to; the same key gives the same seeds."""
    message = f"{eval_seed}/{task}/{attempt}".encode()
    return int(hmac.new(key, message, hashlib.sha256).hexdigest()[:8], 16)


# --------------------------------------------------------------------------------------------
# Per-trial model ids with a token budget


class BudgetedModel:
    """A chat model that serves at most ``budget`` tokens (prompt + completion) in total.

    A request's completion limit is lowered to what is left (spread over its ``n`` choices); a
    request whose prompt alone does not fit is refused with HTTP 429 ``token_budget_exhausted``.
    Concurrent requests reserve their worst case first, so the budget holds under concurrency.
    ``prefill_scope``: requests of models that support it share prefills within this scope only.
    """

    def __init__(self, model: ChatModel, budget: int | None, prefill_scope: str | None = None):
        self.model = model
        self.budget = budget
        self.prefill_scope = prefill_scope if getattr(model, "supports_prefill_scope", False) else None
        self.used = 0
        self._reserved = 0
        self._lock = threading.Lock()

    @property
    def context_length(self) -> int | None:
        return getattr(self.model, "context_length", None)

    def count_prompt_tokens(self, request: ChatRequest) -> int:
        counter = getattr(self.model, "count_prompt_tokens", None)
        return int(counter(request)) if callable(counter) else estimate_prompt_tokens(request)

    def _complete(self, request: ChatRequest) -> list[ChatChoice]:
        if self.prefill_scope is None:
            return self.model.complete(request)
        return self.model.complete(request, prefill_scope=self.prefill_scope)  # type: ignore[call-arg]

    def complete(self, request: ChatRequest) -> list[ChatChoice]:
        if self.budget is None:
            return self._complete(request)
        prompt = self.count_prompt_tokens(request)
        with self._lock:
            left = self.budget - self.used - self._reserved
            per_choice = (left - prompt) // max(request.n, 1)
            if per_choice < 1:
                raise ModelRequestError(f"this trial's token budget ({self.budget} tokens) is used up",
                                        status=429, code="token_budget_exhausted", type="insufficient_quota")
            limit = min(request.completion_limit or per_choice, per_choice)
            reserved = prompt + limit * max(request.n, 1)
            self._reserved += reserved
        try:
            update = {"max_completion_tokens": limit} if request.max_completion_tokens is not None else {"max_tokens": limit}
            choices = self._complete(request.model_copy(update=update))
            parsed = [c if isinstance(c, ChatChoice) else ChatChoice.model_validate(c) for c in choices]
            spent = next((c.prompt_tokens for c in parsed if c.prompt_tokens is not None), prompt) + sum(
                c.completion_tokens if c.completion_tokens is not None else estimate_completion_tokens(c)
                for c in parsed)
        except BaseException:
            with self._lock:
                self._reserved -= reserved
            raise
        with self._lock:
            self._reserved -= reserved
            self.used += spent
        return parsed


@dataclass
class ModelSession:
    """What harness agents of one evaluation share: the model, where it is served, and its counters.

    ``open(task, attempt)`` registers the trial's own alias — an opaque random id (``m-`` and 32
    hex digits) that says nothing about the task, the attempt, the evaluation or the split — as a
    :class:`BudgetedModel` of ``tokens_per_trial`` in ``registry``, which the server behind
    ``socket`` serves and counts in ``meter``. ``seed_key`` keys the trials' seeds (:func:`trial_seed`).
    The trials of one session (one evaluation) share the prefills of identical prompts; no two
    sessions do, so how fast a reply comes says nothing about other evaluations.
    """

    socket: Path
    registry: ModelRegistry
    meter: UsageMeter
    model: ChatModel
    seed: int = 0
    tokens_per_trial: int | None = None
    url: str | None = None
    """Where harnesses reach the server over the network (``RSIGYM_MODEL_URL``) instead of ``socket``."""
    seed_key: bytes = b""
    aliases: list[str] = field(default_factory=list)
    prefill_scope: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    _by_trial: dict[tuple[str, int], str] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def alias(self, task: str, attempt: int) -> str | None:
        """The alias of a trial that was opened (None before)."""
        with self._lock:
            return self._by_trial.get((task, attempt))

    def open(self, task: str, attempt: int) -> str:
        """Register (once) and return the trial's model id; a retried trial keeps its alias and budget."""
        with self._lock:
            alias = self._by_trial.get((task, attempt))
            if alias is None:
                alias = self._by_trial[(task, attempt)] = f"m-{secrets.token_hex(16)}"
                self.registry.add(alias, BudgetedModel(self.model, self.tokens_per_trial, self.prefill_scope))
                self.aliases.append(alias)
        return alias

    def trial_seed(self, task: str, attempt: int) -> int:
        return trial_seed(self.seed, task, attempt, self.seed_key)

    def usage(self, alias: str | None = None) -> Usage:
        """Tokens the server served to ``alias`` (to every alias of the session if None)."""
        if alias is not None:
            return self.meter.get(alias)
        with self._lock:
            names = list(self.aliases)
        return sum((self.meter.get(a) for a in names), Usage())

    def close(self) -> None:
        """Unregister the session's aliases (their counters stay in the meter)."""
        with self._lock:
            for alias in self.aliases:
                if alias in self.registry:
                    self.registry.remove(alias)


_SESSIONS: dict[str, ModelSession] = {}
_SESSIONS_LOCK = threading.Lock()


def register_session(key: str, session: ModelSession) -> None:
    """Make ``session`` available to harness agents configured with ``session=key``."""
    with _SESSIONS_LOCK:
        if key in _SESSIONS:
            raise ValueError(f"a model session {key!r} is already registered")
        _SESSIONS[key] = session


def unregister_session(key: str) -> ModelSession | None:
    with _SESSIONS_LOCK:
        return _SESSIONS.pop(key, None)


def get_session(key: str) -> ModelSession:
    with _SESSIONS_LOCK:
        session = _SESSIONS.get(key)
    if session is None:
        raise KeyError(f"no model session {key!r} is registered in this process (see register_session)")
    return session


# --------------------------------------------------------------------------------------------
# The harness's trajectory → ATIF


_ROLE_SOURCE = {"user": "user", "system": "system", "developer": "system", "assistant": "agent", "agent": "agent",
                "model": "agent", "tool": "user", "environment": "user", "observation": "user"}


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _calls(item: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(command, output) pairs of a step: ``commands: [{command, output}, ...]`` or ``command``/``output``."""
    if isinstance(item.get("commands"), list):
        return [(_text(c.get("command")), c.get("output")) for c in item["commands"]
                if isinstance(c, Mapping) and c.get("command") is not None]
    command = item.get("command", item.get("cmd"))
    return [] if command is None else [(_text(command), item.get("output", item.get("observation")))]


def to_atif(raw: Mapping[str, Any], *, agent_name: str, version: str, model_name: str | None = None,
            session_id: str | None = None, extra: Mapping[str, Any] | None = None) -> Trajectory:
    """Harbor's ATIF trajectory of the harness's own ``{"end_reason", "steps": [...], "messages": [...]}``.

    Read leniently: the leading system/user ``messages`` (the prompt) become the first steps; each
    step's ``role``/``source`` (default: the agent), text in ``content``/``message``/``text``/``reply``,
    commands in ``commands: [{command, output}]`` or ``command``/``output`` become ``shell`` tool calls
    with their outputs as observations; every other key is kept in the step's ``extra``.
    """
    steps: list[Step] = []
    raw_steps = raw.get("steps") if isinstance(raw.get("steps"), list) else []
    messages = raw.get("messages") if isinstance(raw.get("messages"), list) else []
    first = raw_steps[0] if raw_steps and isinstance(raw_steps[0], Mapping) else {}
    if str(first.get("role") or first.get("source") or "agent").lower() in ("assistant", "agent", "model"):
        for message in messages:
            role = str(message.get("role", "")).lower() if isinstance(message, Mapping) else ""
            if role not in ("system", "developer", "user"):
                break
            steps.append(Step(step_id=len(steps) + 1, source=_ROLE_SOURCE[role], message=_text(message.get("content"))))
    known = {"source", "role", "content", "message", "text", "reply", "command", "cmd", "commands", "output",
             "observation"}
    for item in raw_steps[:MAX_STEPS]:
        item = item if isinstance(item, Mapping) else {"content": item}
        source = _ROLE_SOURCE.get(str(item.get("source") or item.get("role") or "agent").lower(), "agent")
        message = next((_text(item[k]) for k in ("content", "message", "text", "reply") if item.get(k) is not None), "")
        rest = {str(k): v for k, v in item.items() if k not in known}
        kwargs: dict[str, Any] = {}
        calls = _calls(item)
        if source == "agent":
            if calls:
                ids = [f"call_{len(steps) + 1}_{j}" for j in range(len(calls))]
                kwargs["tool_calls"] = [AtifToolCall(tool_call_id=i, function_name="shell", arguments={"command": c})
                                        for i, (c, _) in zip(ids, calls)]
                kwargs["observation"] = Observation(results=[
                    ObservationResult(source_call_id=i, content=_text(o)) for i, (_, o) in zip(ids, calls)])
            if model_name:
                kwargs["model_name"] = model_name
        elif calls:
            rest["commands"] = [{"command": c, "output": o} for c, o in calls]
        steps.append(Step(step_id=len(steps) + 1, source=source, message=message, extra=rest or None, **kwargs))
    if not steps:
        steps.append(Step(step_id=1, source="system", message="(the harness recorded no steps)"))
    end_reason = raw.get("end_reason")
    return Trajectory(session_id=session_id, agent=AtifAgent(name=agent_name, version=version, model_name=model_name),
                      steps=steps, final_metrics=FinalMetrics(total_steps=len(steps)),
                      extra={"end_reason": end_reason if isinstance(end_reason, str) else None, **(extra or {})})


# --------------------------------------------------------------------------------------------
# The agent


class HarnessAgent(BaseAgent):
    """Runs the harness (a directory with ``agent.py``) in the trial's sandbox; see the module docstring.

    Keywords (``AgentConfig.kwargs``): ``harness_dir`` (host path), ``session`` (a registered
    :class:`ModelSession`), ``attempt`` (index of this attempt, for the seed), ``harness_version``
    (recorded), ``timeout_s`` (wall-clock limit of the harness process, default 600).
    """

    def __init__(self, logs_dir: Path, model_name: str | None = None, *, harness_dir: str, session: str,
                 attempt: int = 0, harness_version: str = "unversioned", timeout_s: float = 600.0, **kwargs: Any):
        super().__init__(logs_dir=logs_dir, model_name=model_name, **kwargs)
        self.harness_dir = Path(harness_dir)
        if not (self.harness_dir / "agent.py").is_file():
            raise FileNotFoundError(f"the harness has no agent.py: {self.harness_dir}")
        self.session_key = session
        self.attempt = int(attempt)
        self.harness_version = harness_version
        self.timeout_s = float(timeout_s)
        self._alias: str | None = None
        self._task: str | None = None
        self._command = f"exec python3 {HARNESS_MOUNT}/agent.py"

    @staticmethod
    def name() -> str:
        return "rsigym-harness"

    def version(self) -> str:
        return self.harness_version

    async def set_web_tools_disabled(self, disabled: bool, environment: BaseEnvironment) -> None:
        """Nothing to do: the harness has no web tools, and the sandbox's network policy applies."""

    @property
    def session(self) -> ModelSession:
        return get_session(self.session_key)

    async def setup(self, environment: BaseEnvironment) -> None:
        """Give the trial its model id and mount the harness and the model socket (agent phase only).

        Any other Harbor environment (docker, e2b, daytona, ...) needs a session with a ``url``: the
        harness is uploaded to ``/harness`` and reaches the model at ``RSIGYM_MODEL_URL``.
        """
        session = self.session
        if not isinstance(environment, AgentMounts) and session.url is None:
            raise TypeError(f"HarnessAgent needs an environment with agent-only mounts (the local world's bubblewrap "
                            f"one) or a model session with "
                            f"a url, got {type(environment).__name__}")
        self._task = environment.environment_name
        self._alias = session.open(self._task, self.attempt)
        if isinstance(environment, AgentMounts):
            # the harness with its bytecode, compiled once per harness version in a sandbox (harness.bytecode):
            # the same files, and the script run from its checked .pyc by the launcher; in a thread, so that the
            # version's first trial waiting ~0.2 s on the compile does not stall the other trials' event loop
            compiled = await asyncio.to_thread(bytecode.prepare, self.harness_dir, HARNESS_MOUNT)
            if compiled is not None:
                self._command = bytecode.launch_command(f"{HARNESS_MOUNT}/agent.py")
            environment.add_agent_mount(compiled or self.harness_dir, HARNESS_MOUNT, copy=True)  # no host path inside
            if session.url is None:
                environment.add_agent_mount(session.socket, SOCKET_MOUNT)
        else:
            await environment.upload_dir(self.harness_dir, HARNESS_MOUNT)

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        """Run ``python3 /harness/agent.py`` to completion, then convert its trajectory and fill ``context``."""
        if self._alias is None or self._task is None:
            raise RuntimeError("setup() was not called")
        session = self.session
        seed = session.trial_seed(self._task, self.attempt)
        meta: dict[str, Any] = {"model": self._alias, "attempt": self.attempt, "seed": seed,
                                "harness_version": self.harness_version, "exit_code": None,
                                "end_reason": None, "harness_error": None}
        context.metadata = meta
        with tempfile.TemporaryDirectory(prefix="rsigym-instr-") as tmp:
            path = Path(tmp) / "instruction.md"
            path.write_text(instruction)
            await environment.upload_file(path, INSTRUCTION_FILE)
        where = {"RSIGYM_MODEL_SOCKET": SOCKET_MOUNT} if session.url is None else {"RSIGYM_MODEL_URL": session.url}
        env = {**where, "RSIGYM_MODEL": self._alias,
               "RSIGYM_INSTRUCTION_FILE": INSTRUCTION_FILE, "RSIGYM_SEED": str(seed), "RSIGYM_LOGS_DIR": LOGS_DIR,
               "RSIGYM_APP_DIR": APP_DIR, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        try:
            result = await environment.exec(self._command, cwd=APP_DIR, env=env,
                                            timeout_sec=self.timeout_s)
            meta["exit_code"] = result.return_code
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            (self.logs_dir / "harness-stdout.txt").write_text(result.stdout or "")
            (self.logs_dir / "harness-stderr.txt").write_text(result.stderr or "")
            if result.return_code == 124:
                meta["harness_error"] = f"the harness ran longer than {self.timeout_s:g} s and was killed"
            elif result.return_code != 0:
                tail = (result.stderr or "").strip().splitlines()[-1:] or [""]
                meta["harness_error"] = f"the harness exited with code {result.return_code}: {tail[0][:300]}"
        except asyncio.CancelledError:
            meta["harness_error"] = "the harness was stopped: the trial's time limit passed or the job was cancelled"
            raise
        finally:
            if not isinstance(environment, AgentMounts):
                await self._download_trajectory(environment)
            self._finish(environment, context, meta)

    async def _download_trajectory(self, environment: BaseEnvironment) -> None:
        """Fetch ``/logs/agent/trajectory.json`` from a remote environment into the agent's logs directory."""
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        try:
            await environment.download_file(f"{LOGS_DIR}/{TRAJECTORY_FILE}", self.logs_dir / TRAJECTORY_FILE)
        except Exception:  # noqa: BLE001 - a missing trajectory is reported by _read_raw_trajectory
            pass

    def _finish(self, environment: BaseEnvironment, context: AgentContext, meta: dict[str, Any]) -> None:
        """Token counts from the server; the harness's trajectory kept raw and converted to ATIF."""
        usage = self.session.usage(self._alias)
        context.n_input_tokens = usage.prompt_tokens
        context.n_cache_tokens = 0
        context.n_output_tokens = usage.completion_tokens
        context.model_usage = {self._alias or "model": ModelUsage(n_input_tokens=usage.prompt_tokens,
                                                                  n_output_tokens=usage.completion_tokens)}
        meta["requests"] = usage.requests
        raw = self._read_raw_trajectory(environment, meta)
        if raw is not None and isinstance(raw.get("end_reason"), str):
            meta["end_reason"] = raw["end_reason"][:100]
        if raw is not None and isinstance(raw.get("signals"), dict):  # the harness's own diagnosis (untrusted)
            meta["signals"] = {str(k)[:50]: v for k, v in list(raw["signals"].items())[:50] if isinstance(v, (bool, int))}
        try:
            trajectory = to_atif(raw or {}, agent_name=self.name(), version=self.version(), model_name=self._alias,
                                 session_id=self.session_id,
                                 extra={"attempt": self.attempt, "seed": meta["seed"],
                                        "harness_error": meta["harness_error"]})
        except ValueError as exc:  # a step the models refuse (e.g. a malformed field)
            meta["harness_error"] = meta["harness_error"] or f"unreadable trajectory: {exc}"[:300]
            trajectory = to_atif({}, agent_name=self.name(), version=self.version(), model_name=self._alias)
        trajectory.final_metrics = FinalMetrics(total_prompt_tokens=usage.prompt_tokens,
                                                total_completion_tokens=usage.completion_tokens,
                                                total_steps=len(trajectory.steps))
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / TRAJECTORY_FILE).write_text(json.dumps(trajectory.to_json_dict(), ensure_ascii=False, indent=1))

    def _read_raw_trajectory(self, environment: BaseEnvironment, meta: dict[str, Any]) -> dict[str, Any] | None:
        try:
            path = (environment.host_path(f"{LOGS_DIR}/{TRAJECTORY_FILE}")
                    if isinstance(environment, AgentMounts) else self.logs_dir / TRAJECTORY_FILE)
            if not path.is_file() or path.is_symlink():
                raise FileNotFoundError("the harness wrote no /logs/agent/trajectory.json")
            if path.stat().st_size > MAX_TRAJECTORY_BYTES:
                raise ValueError(f"trajectory.json is larger than {MAX_TRAJECTORY_BYTES} bytes")
            raw = json.loads(path.read_bytes())
            if not isinstance(raw, dict):
                raise ValueError("trajectory.json is not a JSON object")
            path.replace(path.with_name(RAW_TRAJECTORY_FILE))
            return raw
        except (OSError, ValueError, RecursionError) as exc:
            meta["harness_error"] = meta["harness_error"] or f"{exc}"[:300]
            return None


__all__ = ["BudgetedModel", "HarnessAgent", "IMPORT_PATH", "ModelSession", "get_session", "register_session",
           "to_atif", "trial_seed", "unregister_session"]
