"""Any agent as the improver of ``rsigym recurse``: each round's outer episode is a session an agent drives.

:class:`AgentImprover` is an :class:`~rsigym_env.worlds.recursive.ports.EpisodePlayer`: handed to
:func:`~rsigym_env.worlds.recursive.recurse` as its ``improver``, it plays every round's outer episode
(the improver improving the selected parent) as a run of a :class:`~.service.SessionService` of its own,
served on loopback over MCP (``<url>/mcp``) and REST (``<url>/v1``) with a fresh run key per episode.
Per episode it calls ``agent(mcp_url, run_key)`` in a thread of its own (a plain function, or an ``async``
one: it runs on an event loop of its own; one that takes a ``context`` keyword is also told where the episode
stands, ``{"chain": <chain seed>, "round": r}``), or with no ``agent`` only announces the session
(``on_session``: ``rsigym recurse --serve`` prints it for a person or an external agent), then waits,
bounded by ``timeout_s``, until the episode ends (``submit``, or out of steps or money). A session that
does not end in time is closed (its running jobs settled) and :class:`ImproverTimeout` raised; an agent
that returns or fails without ending it raises :class:`AgentFailed`. Once it ends, the round reads what
the episode left in its world (its harness versions, the train evaluations, the submission) and judges it
exactly as it judges a program improver's: archive, validation, paired acceptance, test.

What the agent sees is what any researcher of a recursive run sees: the target's files as the harness,
train (dev) evaluations with per-task detail, the validation score of its submission as a single number,
its own run key; never the episode's seed, a held-out task or a test score.

``command_agent(command)`` makes an agent of a shell command (``rsigym recurse --improver-command``): it
runs once per episode with ``RSIGYM_MCP_URL``, ``RSIGYM_REST_URL``, ``RSIGYM_RUN_KEY`` and
``RSIGYM_MCP_CONFIG`` (a JSON MCP client config naming the server with its key, the ``mcpServers`` shape
Claude Code's ``--mcp-config`` reads) in its environment, and where the episode stands in the run:
``RSIGYM_IMPROVER_CHAIN`` (the chain's seed) and ``RSIGYM_IMPROVER_ROUND``.

>>> import httpx
>>> def submit_at_once(mcp_url: str, key: str) -> None:      # an agent over REST that changes nothing
...     rest = mcp_url.removesuffix("/mcp") + "/v1"
...     httpx.post(f"{rest}/tools/submit", json={"checkpoint": "base"},
...                headers={"Authorization": f"Bearer {key}"}, timeout=60)
>>> from rsigym_env.scenario import load_scenario
>>> from rsigym_env.worlds.recursive import RecursiveOptions, improve_once, researchers
>>> scenario = load_scenario("recursive-scripted-small", world_options={"official_seeds": 1})
>>> opts = RecursiveOptions.model_validate(scenario.world_options)
>>> with AgentImprover(submit_at_once, label="rest-example", timeout_s=120) as agent:
...     target = opts.spec()
...     out = improve_once(scenario, opts, agent, target, seed=7, using=researchers())
...     out.submitted.id == target.id, out.reward, agent.sessions[0]["state"], agent.id
(True, 0.0, 'done', 'agent:rest-example')
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import re
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..scenario import Scenario
from .auth import new_admin_token
from ..splits import NONCE_ENV, SECRET_ENV
from .service import SessionService

Agent = Callable[[str, str], Any]
"""``agent(mcp_url, run_key)``: drives one outer episode to ``submit``; may be ``async``."""

DEFAULT_TIMEOUT_S = 3600.0
HELD_OUT_ENV = (SECRET_ENV, NONCE_ENV)
"""Variables an improver command never inherits: the held-out split's secret and an episode draw's nonce."""
CONTEXT_ENV = {"chain": "RSIGYM_IMPROVER_CHAIN", "round": "RSIGYM_IMPROVER_ROUND"}
"""The variables that tell an improver command where its episode stands in the run: an improver that keeps
memory keeps it per chain, so that chains stay independent (``rsigym recurse``'s between-chain intervals assume
it). Never inherited: only the current episode's values are set."""
LABEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _accepts(function: Callable[..., Any], name: str) -> bool:
    """Whether ``function`` takes a keyword argument ``name`` (by name or through ``**kwargs``).

    >>> _accepts(lambda url, key, context=None: None, "context"), _accepts(lambda url, key: None, "context")
    (True, False)
    """
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name and p.kind != p.POSITIONAL_ONLY or p.kind == p.VAR_KEYWORD for p in parameters)


class ImproverTimeout(TimeoutError):
    """An outside improver's session did not end (no ``submit``) within its time limit."""


class AgentFailed(RuntimeError):
    """An outside improver returned or raised without ending its session's episode."""


@dataclass
class Session:
    """One outer episode as an agent is told of it: where to connect, with which key, until when."""

    n: int                   # the improver's n-th episode (1, 2, ...)
    run_id: str
    url: str                 # the service's base URL
    mcp_url: str             # MCP over streamable HTTP (bearer: the run key)
    rest_url: str            # REST (POST /tools/<tool>, GET /observation ...; bearer: the run key)
    key: str                 # this episode's run key (it opens this run only)
    timeout_s: float         # the session is closed if it has not ended by then
    mcp_config: str = ""     # a JSON MCP client config file for this session (mode 0600), see command_agent
    context: dict[str, Any] = field(default_factory=dict)  # where the episode stands: {"chain": 0, "round": 1}

    def announce(self) -> str:
        """What ``rsigym recurse --serve`` prints for a person or an agent to connect."""
        where = "".join(f"{k} {v}, " for k, v in self.context.items())
        return (f"improver session {self.n} ({where}run {self.run_id}): MCP {self.mcp_url}  REST {self.rest_url}  "
                f"run key {self.key}  (bearer; MCP client config {self.mcp_config}); ends at submit, "
                f"closed after {self.timeout_s:g} s")


@dataclass
class ServedEpisode:
    """An outer episode played in a session (an :class:`~rsigym_env.worlds.recursive.ports.OuterEpisode`)."""

    env: Any
    reward: float
    steps: int
    info: dict[str, Any]
    attempts: list[Any] = field(default_factory=list)
    closer: Callable[[], Any] | None = None

    def close(self) -> None:
        if self.closer is not None:
            self.closer()


def mcp_client_config(mcp_url: str, key: str, name: str = "rsigym") -> dict[str, Any]:
    """An MCP client config (the ``mcpServers`` shape Claude Code, Cursor and others read) for one session.

    >>> mcp_client_config("http://127.0.0.1:8765/mcp", "rsr_x")["mcpServers"]["rsigym"]["headers"]
    {'Authorization': 'Bearer rsr_x'}
    """
    return {"mcpServers": {name: {"type": "http", "url": mcp_url, "headers": {"Authorization": f"Bearer {key}"}}}}


def protected_paths() -> tuple[list[str], list[str]]:
    """What an improver command must not read (``hidden``: ``$RSIGYM_HOME``, with the split secret, the
    archives and the agent registry) and must not change (``read_only``: this package's code, including
    its mapped ``wrappers``/``baselines``/``scenarios``, and the interpreters that sandboxed programs and
    workers start from).

    >>> hidden, read_only = protected_paths()
    >>> any(p.endswith("rsigym_env") for p in read_only), len(hidden)
    (True, 1)
    """
    import importlib.util
    import sys

    from ..splits import rsigym_home

    read_only = []
    for name in ("rsigym_env", "rsigym_env.wrappers", "rsigym_env.baselines", "rsigym_env.scenarios"):
        spec = importlib.util.find_spec(name)
        read_only += [os.path.realpath(p) for p in (spec.submodule_search_locations or [])] if spec else []
    read_only += [os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)]
    return [str(rsigym_home())], list(dict.fromkeys(read_only))


def confined(argv: Sequence[str], hidden: Sequence[str] = (), read_only: Sequence[str] = (),
             shown: Sequence[str] = ()) -> list[str]:
    """``argv`` run under bubblewrap as the same user with the same network and files, except: a PID
    namespace of its own (no other process of the user's to read or trace), every ``hidden`` directory an
    empty tmpfs, every ``read_only`` one read-only, then each ``shown`` file put back read-only (e.g. the
    session's MCP config, kept in a hidden directory). Without a usable bubblewrap, ``argv`` as it is and
    a loud warning.

    >>> from rsigym_env.worlds.local.sandbox.isolation import bwrap_available
    >>> confined(["true"], hidden=["/nonexistent-x"])[-2:] if bwrap_available() else ["--", "true"]
    ['--', 'true']
    """
    from ..worlds.local.sandbox.isolation import bwrap_available, bwrap_path

    if not bwrap_available():
        warnings.warn("bubblewrap is not usable here: the improver command runs unconfined, as this user, and can "
                      "read $RSIGYM_HOME (the split secret) and change this package; install bubblewrap, or run "
                      "the agent as another user", RuntimeWarning, stacklevel=2)
        return list(argv)
    out = [bwrap_path() or "bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc", "--die-with-parent"]
    for path in read_only:
        if os.path.exists(path):
            out += ["--ro-bind", path, path]
    for path in hidden:
        if os.path.isdir(path):
            out += ["--tmpfs", path]
    for path in shown:
        if os.path.exists(path):
            out += ["--ro-bind", path, path]
    return [*out, "--", *argv]


def command_agent(command: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, confine: bool = True) -> Agent:
    """An agent that runs ``command`` (a shell command line) once per episode, with the session in its
    environment (``RSIGYM_MCP_URL``, ``RSIGYM_REST_URL``, ``RSIGYM_RUN_KEY``, ``RSIGYM_MCP_CONFIG``); it is
    killed after ``timeout_s``. Its output goes to this process's. A command that exits non-zero fails. It
    inherits this process's environment (its own API keys, ``PATH``) without :data:`HELD_OUT_ENV`, and,
    with ``confine``, runs :func:`confined`: it cannot read ``$RSIGYM_HOME`` or the sessions' books
    (``hidden`` from the improver), see this user's other processes, or change this package.

    >>> agent = command_agent('test "$RSIGYM_RUN_KEY" = k && test -n "$RSIGYM_MCP_CONFIG"')
    >>> agent("http://127.0.0.1:1/mcp", "k", mcp_config="/dev/null")
    >>> command_agent("exit 3")("http://127.0.0.1:1/mcp", "k")
    Traceback (most recent call last):
    ...
    rsigym_env.gateway.recursion.AgentFailed: the improver command exited with status 3: exit 3
    """
    if not command.strip():
        raise ValueError("the improver command is empty")

    def run(mcp_url: str, key: str, mcp_config: str = "", hidden: Sequence[str] = (),
            context: Mapping[str, Any] | None = None) -> None:
        env = {**{k: v for k, v in os.environ.items() if k not in HELD_OUT_ENV and k not in CONTEXT_ENV.values()},
               "RSIGYM_MCP_URL": mcp_url, "RSIGYM_REST_URL": mcp_url.removesuffix("/mcp") + "/v1",
               "RSIGYM_RUN_KEY": key, "RSIGYM_MCP_CONFIG": mcp_config,
               **{CONTEXT_ENV[k]: str(v) for k, v in (context or {}).items() if k in CONTEXT_ENV}}
        argv = ["/bin/sh", "-c", command]
        if confine:
            home, read_only = protected_paths()
            argv = confined(argv, hidden=[*home, *hidden], read_only=read_only, shown=[mcp_config] if mcp_config else ())
        try:
            done = subprocess.run(argv, env=env, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise AgentFailed(f"the improver command ran longer than {timeout_s:g} s and was killed: {command}") from None
        if done.returncode != 0:
            raise AgentFailed(f"the improver command exited with status {done.returncode}: {command}")

    run.wants_config = True  # type: ignore[attr-defined]
    return run


class AgentImprover:
    """An outside agent as ``rsigym recurse``'s improver (see the module docstring).

    Args:
        agent: ``agent(mcp_url, run_key)`` per outer episode (sync or async), or ``None``: nobody is
            called, ``on_session`` announces the session and someone connects to it.
        label: names the improver (its id is ``agent:<label>``) and the runs (their ``label``).
        timeout_s: how long one episode may take before its session is closed (:class:`ImproverTimeout`).
        host, port: where the service listens (loopback; ``port=0``: a free port).
        state_dir: where the sessions' runs are kept (ledger, audit log, steps); default a temporary
            directory removed by :meth:`close`.
        on_session: called with each :class:`Session` before the agent is.
    """

    def __init__(self, agent: Agent | None = None, *, label: str = "agent", timeout_s: float = DEFAULT_TIMEOUT_S,
                 host: str = "127.0.0.1", port: int = 0, state_dir: str | os.PathLike[str] | None = None,
                 on_session: Callable[[Session], None] | None = None, poll_s: float = 0.05):
        from ..serving.listen import is_loopback

        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if not isinstance(label, str) or not LABEL.fullmatch(label):
            raise ValueError(f"label must be 1-64 letters, digits, '.', '_' or '-', got {label!r}")
        if not is_loopback(host):
            raise ValueError(f"{host} is not a loopback address: an improver's sessions are served on this machine "
                             "only (put `rsigym serve` behind a TLS proxy to reach runs from elsewhere)")
        self.agent, self.label, self.timeout_s = agent, label, float(timeout_s)
        self.id = f"agent:{label}"
        self.host, self.port, self.on_session, self.poll_s = host, port, on_session, poll_s
        self._state_arg = state_dir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.service: SessionService | None = None
        self.server: Any = None
        self.sessions: list[dict[str, Any]] = []
        """One entry per episode played: ``run_id``, ``state``, ``reward``, ``seconds``, ``error``."""

    # ---------------------------------------------------------------- life cycle

    @property
    def url(self) -> str:
        """The service's base URL (once started)."""
        if self.server is None:
            raise RuntimeError("the improver's service is not started")
        return str(self.server.url)

    def start(self) -> "AgentImprover":
        """Start the session service and serve it (REST, MCP) on ``host:port``; idempotent."""
        from .cli import serve_app
        from ..serving.listen import BackgroundServer

        if self.service is not None:
            return self
        if self._state_arg is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="rsigym-improver-")
        state = Path(self._state_arg or self._tmp.name)  # type: ignore[union-attr]
        # the idle reaper must not close a session the agent is still thinking in: the episode's own limit rules
        self.service = SessionService(state, admin_token=new_admin_token(), idle_timeout_s=self.timeout_s + 60,
                                      max_active_runs=4)
        self.server = BackgroundServer(serve_app(self.service), host=self.host, port=self.port)
        try:
            self.server.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop serving and close every session; idempotent."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.service is not None:
            for run in self.service.list_runs():
                if run["state"] in ("active", "done"):
                    self.service.close_run(run["run_id"], "improver_closed")
            self.service.shutdown()
            self.service = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "AgentImprover":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- one episode

    def _call_agent(self, session: Session) -> None:
        assert self.agent is not None
        if getattr(self.agent, "wants_config", False):  # a command: told what to hide (the sessions' books)
            assert self.service is not None
            out = self.agent(session.mcp_url, session.key, mcp_config=session.mcp_config,
                             hidden=[str(self.service.state_dir)], context=session.context)
        elif _accepts(self.agent, "context"):  # a function that keeps memory can keep it per chain
            out = self.agent(session.mcp_url, session.key, context=session.context)
        else:
            out = self.agent(session.mcp_url, session.key)
        if inspect.isawaitable(out):
            async def wait_for() -> Any:
                return await out

            asyncio.run(wait_for())

    def play(self, scenario: Scenario, seed: int, context: Mapping[str, Any] | None = None) -> ServedEpisode:
        """Open the episode as a session, let the agent drive it and wait (bounded) until it ends.
        ``context`` (e.g. ``{"chain": 0, "round": 2}``) is told to the agent (:attr:`Session.context`)."""
        self.start()
        service = self.service
        assert service is not None
        created = service.open_run(scenario, seed=seed, label=self.label)
        run_id, key = created["run_id"], created["run_key"]
        mcp_url, rest_url = f"{self.url}/mcp", f"{self.url}/v1"
        config = service.runs_dir / run_id / "mcp-client.json"  # the run's directory is 0700 (with its key)
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(mcp_client_config(mcp_url, key), f, indent=1)
        session = Session(len(self.sessions) + 1, run_id, self.url, mcp_url, rest_url, key, self.timeout_s, str(config),
                          dict(context or {}))
        record: dict[str, Any] = {"run_id": run_id, "state": "active", "reward": None, "seconds": None, "error": None}
        self.sessions.append(record)
        if self.on_session is not None:
            self.on_session(session)
        failure: list[BaseException] = []
        thread = None
        if self.agent is not None:
            def drive() -> None:
                try:
                    self._call_agent(session)
                except BaseException as exc:  # reported below, with the session's state
                    failure.append(exc)

            thread = threading.Thread(target=drive, name=f"improver-{run_id}", daemon=True)
            thread.start()
        started = time.monotonic()
        deadline = started + self.timeout_s
        while True:
            state = service.run_summary(run_id)["state"]
            if state == "done":
                break
            why = None
            if state != "active":
                why = f"its session was closed ({service.run_summary(run_id)['code']}) before the episode ended"
            elif thread is not None and not thread.is_alive() and service.run_summary(run_id)["state"] != "done":
                why = ("the agent returned without ending the episode (call submit)" if not failure else
                       f"the agent failed: {type(failure[0]).__name__}: {failure[0]}")
            elif time.monotonic() > deadline:
                service.close_run(run_id, "improver_timeout")
                record.update(state="closed", error="improver_timeout", seconds=time.monotonic() - started)
                raise ImproverTimeout(f"improver {self.id} did not end its episode (run {run_id}) within "
                                      f"{self.timeout_s:g} s: no submit; the session was closed and its jobs settled "
                                      "(raise the limit with --improver-timeout / timeout_s)")
            if why is not None:
                service.close_run(run_id, "improver_failed")
                record.update(state="closed", error=why, seconds=time.monotonic() - started)
                raise AgentFailed(f"improver {self.id}, run {run_id}: {why}")
            time.sleep(self.poll_s)
        env = service.local_env(run_id)
        end = dict(env.unwrapped.run.end_info or {})
        record.update(state="done", reward=end.get("normalized_gain"), seconds=time.monotonic() - started)
        return ServedEpisode(env=env, reward=float(end["normalized_gain"]), steps=int(end.get("steps", 0)), info=end,
                             closer=lambda: service.close_run(run_id, "done"))

    def audits(self) -> list[dict[str, Any]]:
        """Each played session's audit log and whether its hash chain verifies (:meth:`SessionService.audit`)."""
        assert self.service is not None
        return [self.service.audit(s["run_id"]) for s in self.sessions]

