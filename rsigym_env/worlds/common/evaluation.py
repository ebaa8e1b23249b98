"""``HarborEvalService``: benchmark evaluation through Harbor's ``Job`` (the ``EvalService`` protocol).

An evaluation of (checkpoint, harness) on a split runs one Harbor job: every task × ``k`` attempts,
:class:`~.harbor_agent.HarnessAgent` in the injected :class:`TrialEnvironment` per trial (the local
world's: a bubblewrap sandbox; the remote world's: a Harbor environment type such as docker),
``concurrency`` trials at a time, scored by each task's ``tests/test.sh``. The score is avg@k: the
mean over tasks of the mean reward over the ``k`` attempts.

The checkpoint is served on the evaluation's own unix socket by its own OpenAI-compatible server,
whose registry holds only that evaluation's per-trial aliases (``{checkpoint}@{eval}/{task}/{k}``,
each with a token budget): the untrusted harness can reach nothing else, neither teachers nor
other checkpoints. Tokens are billed from the server's counters (``server.usage`` of the world's
server if one is given, so the platform can read them too), sandbox time from each trial's
sandbox lifetime; the bill never exceeds the quote.

Where things are kept (``run_dir/<eval id>/``):

* dev: ``summary.json`` (the :class:`~rsigym_env.services.EvalResult` plus, per task and attempt,
  the trial directory), ``harness/`` (the files evaluated) and ``harbor/`` (Harbor's job directory:
  per trial ``agent/trajectory.json`` in ATIF, ``agent/harness-trajectory.json`` as the harness
  wrote it, harness stdout/stderr, ``verifier/``, ``result.json``);
* official: ``summary.json`` with the score and per-task rewards only. The Harbor job runs in a
  private directory outside ``run_dir`` and is deleted afterwards.

Official tests never reach code the researcher controls: the harness runs with ``/tests`` absent
(it is mounted only for the verifier's commands, after the harness's sandbox is gone, and those
commands get neither the harness nor the model socket), the task directories and the private job
directory are never mounted into any sandbox, and official trajectories and logs are not kept.

>>> failure_label(1.0, "answer", None)
''
>>> failure_label(0.0, "truncated", None), failure_label(0.0, None, "exit 1"), failure_label(0.0, "answer", None)
('truncated_output', 'harness_error', 'wrong_answer')
>>> failure_label(0.0, "max_turns", None, {"repeats": 2}), failure_label(0.0, "answer", None, {"lost_cd": 1})
('action_loop', 'lost_shell_state')
"""

from __future__ import annotations

import asyncio
import contextlib
import concurrent.futures as cf
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping, Protocol

os.environ.setdefault("HARBOR_TELEMETRY", "0")               # offline: no telemetry,
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download (Harbor imports litellm)

from ...canonical import sha256_hex  # noqa: E402
from ...errors import ActionError  # noqa: E402
from ...prices import PER_M, PriceList
from ...serving.models import ChatModel, ModelRegistry
from ...serving.openai_server import OpenAIServer, Usage, UsageMeter
from ...services import Billed, EvalRequest, EvalResult, Job, Quote
from .harbor_agent import IMPORT_PATH as AGENT_IMPORT_PATH
from .harbor_agent import ModelSession, register_session, unregister_session
from .idle import IdleGate, SpareCores, register_gate, unregister_gate

log = logging.getLogger("rsigym_env.evaluation")

END_REASON_LABELS: dict[str, str] = {
    "truncated": "truncated_output",
    "unverified": "unverified_completion",
    "loop": "action_loop",
    "unchecked_edit": "unchecked_edit",
    "lost_shell_state": "lost_shell_state",
    "missing_skill": "missing_skill",
}
SETUP_SLACK_S = 30.0          # sandbox seconds a trial may spend outside the agent and the verifier
EXPECTED_TRIAL_S = 1.0        # for the quote's duration estimate only
AGENT_SLACK_S = 5.0           # Harbor's agent limit beyond the harness's own (upload, trajectory conversion)
CANCEL_WAIT_S = 30.0          # how long a cancelled evaluation may take to stop its sandboxes
CACHE_VERSION = "6"           # of the evaluation cache: bump when trials would score differently (4: blocked prefills; 5: training in 2 micro-batches at once; 6: training on the rows' own tokens with causal attention in query blocks, inference on FusedWeights: layernorms folded into the matrices, a fused one-row decoding step)
_JOB_DIR_MARK = b"@RSIGYM_EVAL_DIR@"  # a cached dev evaluation's own directory, in its files


def _copy_tree(source: Path, target: Path, old: bytes, new: bytes) -> None:
    """Copy a directory tree (regular files and directories only), replacing ``old`` by ``new`` in files."""
    target.mkdir(parents=True)
    for path in sorted(source.rglob("*")):
        mode = path.lstat().st_mode
        dest = target / path.relative_to(source)
        if stat.S_ISDIR(mode):
            dest.mkdir(exist_ok=True)
        elif stat.S_ISREG(mode):
            data = path.read_bytes()
            dest.write_bytes(data.replace(old, new) if old in data else data)


def failure_label(reward: float, end_reason: str | None, harness_error: str | None,
                  signals: Mapping[str, Any] | None = None) -> str:
    """What went wrong in one attempt ('' if it succeeded).

    ``harness_error`` if the harness crashed (or ended with ``error``); an end reason naming a failure
    mode (``truncated``, ``unverified``, ``loop``, ``unchecked_edit``, ``lost_shell_state``,
    ``missing_skill``) maps to it; otherwise the minimal harness's ``signals`` decide, as its
    ``agent.py`` documents (repeats at ``max_turns``/``context_full`` → ``action_loop``, ``lost_cd`` →
    ``lost_shell_state``, ``broken_edit`` → ``unchecked_edit``, a skill the instruction names
    (``skills_named``; older trajectories: any skill present) but none seen → ``missing_skill``, an
    unverified answer while a check existed → ``unverified_completion``); else
    ``wrong_answer``. The end reason and signals are what the harness reports: diagnostics, not billing.
    """
    if reward >= 1.0:
        return ""
    if harness_error or end_reason == "error":
        return "harness_error"
    if end_reason in END_REASON_LABELS:
        return END_REASON_LABELS[end_reason]
    s = signals or {}
    if end_reason in ("max_turns", "context_full") and s.get("repeats", 0) >= 1:
        return "action_loop"
    if s.get("lost_cd"):
        return "lost_shell_state"
    if s.get("broken_edit"):
        return "unchecked_edit"
    if s.get("skills_named", s.get("skills_present")) and not s.get("skill_seen"):
        return "missing_skill"
    if end_reason in ("done", "answer") and s.get("check_available") and not s.get("verified"):
        return "unverified_completion"
    return "wrong_answer"


class TrialEnvironment(Protocol):
    """Where Harbor runs an evaluation's trials: the back end :class:`HarborEvalService` is given.

    The local world's is bubblewrap (:class:`rsigym_env.worlds.local.harbor.environment.BubblewrapTrials`);
    :class:`HarborEnvironmentType` is any environment Harbor knows by name (docker, e2b, daytona, ...)."""

    def check(self) -> None:
        """Raise if trials cannot run on this machine (before anything is spent)."""

    def config(self, sandboxes_dir: Path, memory_gib: float, idle_gate: str | None = None) -> Any:
        """Harbor's ``EnvironmentConfig`` for the job (``sandboxes_dir``: a private directory for the trials);
        ``idle_gate``: the key of the :class:`~.idle.IdleGate` each trial waits at before it starts, if the
        back end can (background evaluations)."""

    def trial_seconds(self, trial_dir: Path, result: Any) -> float:
        """The sandbox seconds one finished trial used (its bill; capped by the caller)."""

    def cache_settings(self) -> list[Any]:
        """What of this back end enters an evaluation's cache key."""

    def model_socket_dir(self) -> contextlib.AbstractContextManager[Path]:
        """A fresh directory for an evaluation's model socket, removed on exit; trials must not see its
        host path (it would tell them which trials share an evaluation)."""


@dataclass(frozen=True)
class HarborEnvironmentType:
    """A Harbor ``EnvironmentType`` value (``docker``, ``e2b``, ``daytona``, ...), or a Harbor environment class by
    import path (``module:Class``), and its kwargs; a trial's sandbox time is Harbor's own timing of it."""

    type: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Harbor's environment checks its own prerequisites when a trial starts."""

    def config(self, sandboxes_dir: Path, memory_gib: float, idle_gate: str | None = None) -> Any:
        from harbor.models.trial.config import EnvironmentConfig

        if ":" in self.type:  # a Harbor environment class by import path ('module:Class')
            return EnvironmentConfig(import_path=self.type, kwargs=dict(self.kwargs))
        return EnvironmentConfig(type=self.type, kwargs=dict(self.kwargs))  # trials elsewhere: no gate here

    def trial_seconds(self, trial_dir: Path, result: Any) -> float:
        return _trial_seconds(result)

    def cache_settings(self) -> list[Any]:
        return [self.type, sorted(self.kwargs.items())]

    def model_socket_dir(self) -> contextlib.AbstractContextManager[Path]:
        return tempfile.TemporaryDirectory(prefix="rsigym-ev-")  # unused: these trials reach the model over TCP


@dataclass(frozen=True)
class ModelEndpoint:
    """Serve an evaluation's model over TCP at ``host``:``port`` (0: any free port) instead of a unix socket, and
    tell the harness ``url`` (``{port}`` is filled in; default: the server's own URL).

    >>> ModelEndpoint("0.0.0.0", url="http://host.docker.internal:{port}/v1").harness_host()
    'host.docker.internal'
    """

    host: str
    port: int = 0
    url: str | None = None

    def harness_host(self) -> str:
        """The host name a trial connects to for the model (what its agent phase's network must allow)."""
        import urllib.parse

        return (urllib.parse.urlsplit(self.url).hostname or self.host) if self.url else self.host


def list_tasks(split_dir: Path) -> list[Path]:
    """The task directories (those with a ``task.toml``) in ``split_dir``: in the order of its
    ``index.json`` when there is one, else sorted by name."""
    split_dir = Path(split_dir)
    index = split_dir / "index.json"
    if index.is_file():
        return [split_dir / name for name in json.loads(index.read_text()) if (split_dir / name / "task.toml").is_file()]
    return sorted(p for p in split_dir.iterdir() if (p / "task.toml").is_file())


def write_harness(files: Mapping[str, str], target: Path) -> None:
    """Write the harness's files under ``target`` (readable by the sandbox user; paths must stay inside)."""
    target.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ActionError("invalid_args", f"harness file {name!r}: paths must be relative, without '..'")
        path = target.joinpath(*rel.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
    for d in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        d.chmod(0o755)


class HarborEvalService:
    """The ``EvalService`` of the local and the remote world: Harbor jobs over the benchmark's task directories.

    ``environment`` is where the trials run (:class:`TrialEnvironment`: bubblewrap in the local world, a Harbor
    environment type in the remote one); ``model_endpoint`` where the harness reaches the model (``None``: the
    evaluation's own unix socket, mounted into bubblewrap trials; a :class:`ModelEndpoint`: TCP, for trials
    elsewhere).

    ``model_for(checkpoint)`` gives the servable chat model of ``'base'`` or a checkpoint id (raising
    :class:`~rsigym_env.errors.ActionError` for an unknown one); ``tasks`` maps a split (``"dev"``,
    ``"official"``) to the directory holding its task directories; ``server`` (optional) lends its
    :class:`~rsigym_env.serving.openai_server.UsageMeter` so the platform sees each evaluation's
    aliases there. Per trial at most ``tokens_per_trial`` tokens are served, the harness may run
    ``agent_timeout_s`` and the tests ``verifier_timeout_s``; ``vcpus``/``memory_gib`` price the
    sandbox. ``private_dir`` holds official jobs while they run (default: a fresh temporary directory).
    ``cache_official``: official results may be cached (their tasks are a fixed draw); off when every
    episode draws official tasks of its own.
    """

    def __init__(self, *, environment: TrialEnvironment, model_for: Callable[[str], ChatModel],
                 tasks: Mapping[str, Path], run_dir: Path,
                 prices: PriceList, seed: int = 0, concurrency: int = 2, server: OpenAIServer | None = None,
                 tokens_per_trial: int = 8192, agent_timeout_s: float = 120.0, verifier_timeout_s: float = 60.0,
                 vcpus: float = 2.0, memory_gib: float = 2.0, private_dir: Path | None = None,
                 max_parallel_evals: int = 1, clock: Callable[[], float] = time.monotonic,
                 model_endpoint: ModelEndpoint | None = None,
                 seed_key: bytes = b"", logs_quota_bytes: int = 1 << 30, cache_dir: Path | None = None,
                 model_identity: Callable[[str], str | None] | None = None, cache_quota_bytes: int = 256 << 20,
                 prefetch: bool = False, cache_official: bool = True, spare_trials: int = 0):
        self.model_for = model_for
        # trials beyond ``concurrency`` while the machine has idle cores (SpareCores; only for an environment
        # whose trials wait at the gate they are given, as the local world's do): none by default
        self.spare_trials = max(0, int(spare_trials))
        self.prefetch = prefetch  # whether prefetch_official starts anything
        self.cache_official = cache_official  # False: official tasks are the episode's own draw (never again)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None  # official results of fixed systems
        self.model_identity = model_identity  # checkpoint -> content identity (None: not cacheable)
        self.cache_quota_bytes = cache_quota_bytes  # cached dev evaluations' trial logs, all together
        self.logs_quota_bytes = logs_quota_bytes  # the run's dev evaluation logs, all together (prune_logs)
        self.seed_key = seed_key  # keys the trials' seeds (the platform's secret; see harbor_agent.trial_seed)
        self.environment, self.model_endpoint = environment, model_endpoint
        self.clock = clock
        self.tasks = {split: Path(path) for split, path in tasks.items()}
        self.run_dir = Path(run_dir)
        self.prices = prices
        self.seed = int(seed)
        self.concurrency = max(1, int(concurrency))
        self.meter = server.usage if server is not None else UsageMeter()
        self.tokens_per_trial = int(tokens_per_trial)
        self.agent_timeout_s = float(agent_timeout_s)
        self.verifier_timeout_s = float(verifier_timeout_s)
        self.vcpus, self.memory_gib = vcpus, memory_gib
        self._own_private = private_dir is None
        self.private_dir = Path(private_dir) if private_dir else Path(tempfile.mkdtemp(prefix="rsigym-sb-"))
        self.private_dir.mkdir(parents=True, exist_ok=True)
        self.private_dir.chmod(0o700)
        # every trial's sandbox, dev or official, gets an opaque directory here (no split in any path)
        self.sandboxes_dir = self.private_dir / "sandboxes"
        self._pool = cf.ThreadPoolExecutor(max_workers=max_parallel_evals, thread_name_prefix="rsigym-eval")
        self._lock = threading.Lock()
        self._counter = 0
        self._running: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = {}
        # eval id -> (its model session, when it started, its SpareCores if any)
        self._live: dict[str, tuple[ModelSession, float, SpareCores | None]] = {}
        # official evaluations started ahead (prefetch_official): request key -> (future, the id it was given)
        self._prefetched: dict[str, tuple[cf.Future, str | None]] = {}
        self._gates: dict[str, IdleGate] = {}  # ... and the gates their trials wait at for idle cores
        self._closed = False

    # ---- EvalService -------------------------------------------------------------------------------

    def trial_cap_s(self) -> float:
        """The most sandbox seconds one trial is billed."""
        return self.agent_timeout_s + self.verifier_timeout_s + SETUP_SLACK_S

    def _plan(self, req: EvalRequest, split: str) -> list[Path]:
        if split not in self.tasks:
            raise ActionError("not_supported", f"no {split!r} split in this world (splits: {', '.join(self.tasks)})")
        if "agent.py" not in req.harness_files:
            raise ActionError("invalid_args", "the harness has no agent.py (it is run as `python3 /harness/agent.py`)")
        self.model_for(req.checkpoint)  # raises ActionError for an unknown checkpoint
        tasks = list_tasks(self.tasks[split])
        if req.n_tasks is not None:
            if req.n_tasks < 1:
                raise ActionError("invalid_args", "n_tasks must be at least 1")
            tasks = tasks[:req.n_tasks]
        if not tasks:
            raise ActionError("service_error", f"the {split} split has no tasks")
        return tasks

    def _quote(self, n_trials: int) -> Quote:
        rate = max(self.prices.model_price.prefill, self.prices.model_price.sample) * PER_M
        per_trial = self.tokens_per_trial * rate + self.prices.sandbox_usd(self.trial_cap_s(), self.vcpus,
                                                                            self.memory_gib)
        return Quote(usd=n_trials * per_trial, seconds=n_trials * EXPECTED_TRIAL_S / self.concurrency)

    def quote(self, req: EvalRequest) -> Quote:
        """Worst case: tasks × k × (a trial's token budget at the dearer token rate + its sandbox-second cap)."""
        return self._quote(len(self._plan(req, req.split)) * req.k)

    def start(self, req: EvalRequest, job_id: str) -> Job:
        """Run a dev evaluation in a background thread; the job's future is ``Billed[EvalResult]``."""
        if req.split != "dev":
            raise ActionError("not_supported", "only dev evaluations run as jobs; the official split is "
                                               "evaluated by the platform (official())")
        if self._closed:
            raise ActionError("service_error", "the evaluation service is closed")
        tasks = self._plan(req, req.split)
        quote = self._quote(len(tasks) * req.k)
        self.prune_logs()
        future = self._pool.submit(self._dev_evaluation, req, job_id, tasks, quote)
        return Job(id=job_id, kind="evaluate", started_at=self.clock(), future=future,
                   meta={"checkpoint": req.checkpoint, "harness_version": req.harness_version, "split": req.split,
                         "k": req.k, "n_tasks": len(tasks), "dir": str(self.run_dir / job_id)},
                   cancel=functools.partial(self._cancel, job_id, future, quote))

    def _cancel(self, eval_id: str, future: cf.Future, quote: Quote) -> float:
        """Stop a running evaluation; what the part that ran cost: the tokens served so far and the
        sandboxes' time (``concurrency`` sandboxes since it started, or the most that ran at once if spare
        trials made it more), never above its quote."""
        with self._lock:
            running = self._running.get(eval_id)
            live = self._live.get(eval_id)
        if running is not None:
            loop, task = running
            loop.call_soon_threadsafe(task.cancel)
        future.cancel()
        cf.wait([future], timeout=CANCEL_WAIT_S)
        if live is None:  # never started (or already finished: then the future holds its bill)
            return future.result().cost_usd if future.done() and not future.cancelled() and future.exception() is None else 0.0
        session, started, cores = live
        usage = session.usage()
        seconds = (time.monotonic() - started) * max(self.concurrency, cores.peak if cores is not None else 0)
        cost = self.prices.sample_usd(usage.prompt_tokens, usage.completion_tokens) + \
            self.prices.sandbox_usd(seconds, self.vcpus, self.memory_gib)
        return min(quote.usd, cost)

    def prefetch_official(self, req: EvalRequest) -> None:
        """Start the official evaluation ``req`` now, in the background, because the platform will ask for it
        later (the initial system's, which every episode's reward needs and no researcher action changes):
        :meth:`official` of the same request then waits for this one instead of starting its own. The
        evaluation is the same one either way (same trials, seeds and tasks; nothing of it reaches the
        researcher). Until it is asked for, each trial starts only when the machine has a core to spare
        (:class:`~.idle.IdleGate`), so it fills the episode's idle time instead of slowing it. Asking twice
        starts it once; one that fails is run again by :meth:`official`. Only with ``prefetch=True`` (the
        local world's ``early_official`` option); otherwise a no-op.

        It is numbered now, so official evaluations are named in the order they were asked for whichever
        thread gets to them first (a cached one takes no number: it makes no directory)."""
        if not self.prefetch or req.split != "official" or self._closed:
            return
        key = sha256_hex(req.model_dump())
        with self._lock:
            if key in self._prefetched:
                return
        try:
            hit = self._plan_official(req)[2]
        except Exception:  # noqa: BLE001 - the evaluation itself reports it (it runs again in official())
            hit = None
        with self._lock:
            if key in self._prefetched or self._closed:
                return
            future: cf.Future = cf.Future()
            if hit is not None:
                future.set_result(hit)
                self._prefetched[key] = (future, None)
                return
            eval_id = self._next_official_id()
            self._prefetched[key] = (future, eval_id)
            gate = self._gates[key] = IdleGate()

        def run() -> None:
            gate_key = register_gate(gate)
            try:
                future.set_result(self._official(req, idle_gate=gate_key, eval_id=eval_id))
            except BaseException as exc:  # noqa: BLE001 - official() runs it again and reports its own failure
                future.set_exception(exc)
            finally:
                unregister_gate(gate_key)
                log.info("official evaluation started ahead: its trials waited %.1f s in all for idle cores",
                         gate.waited_s)

        threading.Thread(target=run, name="rsigym-official-prefetch", daemon=True).start()

    def official(self, req: EvalRequest) -> Billed[EvalResult]:
        """The official split, synchronously; only the score and per-task rewards are kept.

        With ``cache_dir`` and a ``model_identity`` for the checkpoint (the shipped base model, or a
        trained checkpoint identified by its weights), the result is cached by content — split, tasks,
        model, harness files, k, seeds and the service's settings — and a repeat costs nothing: it is
        the same evaluation (``cached`` in its summary). One started ahead by :meth:`prefetch_official`
        is waited for; and since an official evaluation is asked for when the episode ends, every one
        started ahead stops waiting for idle cores from then on."""
        key = sha256_hex(req.model_dump())
        with self._lock:
            ahead = self._prefetched.pop(key, None)
            gates = list(self._gates.values())  # the episode is ending: what was started ahead is needed now
            self._gates.clear()
        for gate in gates:
            gate.open()
        if ahead is not None:
            future, eval_id = ahead
            try:
                return future.result()
            except Exception as exc:  # noqa: BLE001 - e.g. a sandbox failure while it ran: evaluate afresh
                log.warning("the official evaluation started ahead failed (%s: %s); running it again",
                            type(exc).__name__, exc)
            return self._official(req, eval_id=eval_id)  # under the name it was given (it left no directory)
        return self._official(req)

    def _next_official_id(self) -> str:
        """The next official evaluation's id (under ``self._lock``)."""
        self._counter += 1
        return f"official-{self._counter}"

    def _plan_official(self, req: EvalRequest) -> tuple[list[Path], str | None, Billed[EvalResult] | None]:
        """The official tasks of ``req``, its cache key and its cached result (None: not cached)."""
        tasks = self._plan(req, "official")
        key = self._cache_key(req, tasks, "official") if self.cache_official else None
        return tasks, key, self._cached(key) if key is not None else None

    def _official(self, req: EvalRequest, idle_gate: str | None = None, eval_id: str | None = None) -> Billed[EvalResult]:
        tasks, key, hit = self._plan_official(req)
        if hit is not None:
            return hit
        if eval_id is None:
            with self._lock:
                eval_id = self._next_official_id()
        # its own thread: Harbor's job needs an event loop of its own, whatever the caller's thread runs
        with cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsigym-official") as pool:
            billed = pool.submit(self._evaluate, req, "official", eval_id, tasks,
                                 self._quote(len(tasks) * req.k), idle_gate).result()
        if key is not None:
            self._store(key, billed)
        return billed

    def _dev_evaluation(self, req: EvalRequest, eval_id: str, tasks: list[Path], quote: Quote) -> Billed[EvalResult]:
        """A dev evaluation; one of a content-identified system seen before is restored from the cache:
        the same result, trial logs and bill (an evaluation's price does not depend on whether the
        platform had it at hand, so an episode is the same with a cold or a warm cache)."""
        key = self._cache_key(req, tasks, "dev")
        if key is not None and (hit := self._restore_dev(key, req, eval_id)) is not None:
            return hit
        billed = self._evaluate(req, "dev", eval_id, tasks, quote)
        if key is not None:
            self._store(key, billed, job_dir=self.run_dir / eval_id)
        return billed

    def _cache_key(self, req: EvalRequest, tasks: list[Path], split: str = "official") -> str | None:
        identity = self.model_identity(req.checkpoint) if self.model_identity is not None else None
        if self.cache_dir is None or identity is None:
            return None
        what: dict[str, Any] = {"model": identity, "harness": req.harness_files, "k": req.k, "seed": self.seed,
                                "seed_key": hashlib.sha256(self.seed_key).hexdigest(), "tasks": [str(t) for t in tasks],
                                "settings": [self.tokens_per_trial, self.agent_timeout_s, self.verifier_timeout_s,
                                             *self.environment.cache_settings()],
                                "code": CACHE_VERSION}
        if split != "official":  # (official keys stay those of earlier versions)
            what["split"] = split
        return sha256_hex(what, default=str, compact=False)

    def _cached(self, key: str) -> Billed[EvalResult] | None:
        try:
            data = json.loads((self.cache_dir / f"{key}.json").read_text())
            value = EvalResult.model_validate(data["result"]).model_copy(update={"cached": True})
        except (OSError, ValueError, KeyError):
            return None
        log.info("%s evaluation %s: cached result", value.split, key[:12])
        return Billed[EvalResult](value=value, cost_usd=0.0, seconds=0.0)

    def _restore_dev(self, key: str, req: EvalRequest, eval_id: str) -> Billed[EvalResult] | None:
        """Put a cached dev evaluation's directory (trial logs, summary) in place as ``eval_id``."""
        hit = self._cached(key)
        source = self.cache_dir / f"{key}.job"
        target = self.run_dir / eval_id
        if hit is None or not source.is_dir() or target.exists():
            return None
        try:
            data = json.loads((self.cache_dir / f"{key}.json").read_text())
            _copy_tree(source, target, _JOB_DIR_MARK, str(target.resolve()).encode())
            value = hit.value.model_copy(update={"checkpoint": req.checkpoint, "harness_version": req.harness_version})
            summary_path = target / "summary.json"
            summary = json.loads(summary_path.read_text())
            summary.update(id=eval_id, checkpoint=req.checkpoint, harness_version=req.harness_version, cached=True,
                           result=value.model_dump())
            summary_path.write_text(json.dumps(summary, indent=1))
            os.utime(self.cache_dir / f"{key}.json")  # recently used: pruned last
            return Billed[EvalResult](value=value, cost_usd=float(data["cost_usd"]), seconds=float(data["seconds"]))
        except (OSError, ValueError, KeyError) as exc:  # pruned or damaged meanwhile: evaluate afresh
            log.warning("cannot restore the cached evaluation %s: %s", key[:12], exc)
            shutil.rmtree(target, ignore_errors=True)
            return None

    def _store(self, key: str, billed: Billed[EvalResult], job_dir: Path | None = None) -> None:
        """Keep a result (and for a dev evaluation its directory, paths made relocatable) under its key."""
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.cache_dir, 0o700)
            if job_dir is not None:
                tmp_dir = self.cache_dir / f".{key}.{os.getpid()}.{threading.get_ident()}.job"
                shutil.rmtree(tmp_dir, ignore_errors=True)
                _copy_tree(job_dir, tmp_dir, str(job_dir.resolve()).encode(), _JOB_DIR_MARK)
                final = self.cache_dir / f"{key}.job"
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp_dir, final)
            tmp = self.cache_dir / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"result": billed.value.model_dump(), "cost_usd": billed.cost_usd,
                                       "seconds": billed.seconds}))
            os.replace(tmp, self.cache_dir / f"{key}.json")
            if job_dir is not None:
                self._prune_cache()
        except OSError as exc:  # a cache that cannot be written only costs time
            log.warning("cannot cache an evaluation in %s: %s", self.cache_dir, exc)

    def _prune_cache(self) -> None:
        """Keep the cached dev evaluations' directories under ``cache_quota_bytes`` (least recently used go)."""
        entries = []
        for job in self.cache_dir.glob("*.job"):
            size = sum(f.stat().st_size for f in job.rglob("*") if f.is_file())
            meta = self.cache_dir / f"{job.name[:-4]}.json"
            entries.append((meta.stat().st_mtime if meta.exists() else 0.0, size, job, meta))
        total = sum(size for _, size, _, _ in entries)
        for _, size, job, meta in sorted(entries, key=lambda e: e[0]):
            if total <= self.cache_quota_bytes:
                break
            meta.unlink(missing_ok=True)
            shutil.rmtree(job, ignore_errors=True)
            total -= size

    def prune_logs(self) -> int:
        """Keep the run's evaluation logs under ``logs_quota_bytes``: the trial directories of the oldest
        dev evaluations are deleted (their ``summary.json`` with every score stays). Returns bytes freed."""
        if not self.run_dir.is_dir():
            return 0
        evals = sorted((p for p in self.run_dir.iterdir() if (p / "harbor").is_dir()), key=lambda p: p.stat().st_mtime)
        sizes = {p: sum(f.stat().st_size for f in (p / "harbor").rglob("*") if f.is_file()) for p in evals}
        total, freed = sum(sizes.values()), 0
        for path in evals:
            if total - freed <= self.logs_quota_bytes:
                break
            shutil.rmtree(path / "harbor", ignore_errors=True)
            (path / "PRUNED").write_text("trial logs deleted to keep the run's evaluation logs under its quota\n")
            freed += sizes[path]
        return freed

    def _model_server(self, registry: ModelRegistry, **where: Any) -> OpenAIServer:
        """The evaluation's own model server; it does not list its models (no trial can count or name the others)."""
        return OpenAIServer(registry, usage=self.meter, list_models=False, **({"port": None} | where)).start()

    def close(self) -> None:
        """Cancel running evaluations (their futures fail), wait for their sandboxes to stop, and remove
        the private directory (if this service made it). Safe to call twice."""
        self._closed = True
        with self._lock:
            running = list(self._running.values())
            ahead = [future for future, _ in self._prefetched.values()]
            gates = list(self._gates.values())
            self._prefetched.clear()
            self._gates.clear()
        for gate in gates:  # first: a trial at its gate fails there, never let through to start a sandbox
            gate.close()  # (the cancel below reaches the job's loop only when that loop runs, later under load)
        for loop, task in running:
            loop.call_soon_threadsafe(task.cancel)
        self._pool.shutdown(wait=True, cancel_futures=True)
        cf.wait(ahead, timeout=CANCEL_WAIT_S)  # (cancelled above with the running evaluations)
        if self._own_private:
            shutil.rmtree(self.private_dir, ignore_errors=True)

    # ---- one evaluation ----------------------------------------------------------------------------

    def _evaluate(self, req: EvalRequest, split: str, eval_id: str, tasks: list[Path], quote: Quote,
                  idle_gate: str | None = None) -> Billed[EvalResult]:
        self.environment.check()
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,100}", eval_id) or ".." in eval_id:
            raise ActionError("invalid_args", f"evaluation id {eval_id!r}: letters, digits and _.@- only")
        started = time.monotonic()
        public_dir = self.run_dir / eval_id
        work_dir = public_dir if split == "dev" else self.private_dir / eval_id
        if work_dir.exists():
            raise ActionError("invalid_args", f"evaluation {eval_id!r} already exists at {work_dir}")
        work_dir.mkdir(parents=True)
        server: OpenAIServer | None = None
        session_key = f"{eval_id}-{uuid.uuid4().hex[:12]}"
        socket_dirs = contextlib.ExitStack()
        spare: str | None = None
        cores: SpareCores | None = None
        if idle_gate is None and self.spare_trials:  # (a background evaluation keeps its idle gate)
            cores = SpareCores(self.concurrency, self.concurrency + self.spare_trials)
            idle_gate = spare = register_gate(cores)
        try:
            socket_dir = Path(socket_dirs.enter_context(self.environment.model_socket_dir()))
            harness_dir = work_dir / "harness"
            write_harness(req.harness_files, harness_dir)
            registry = ModelRegistry()
            url: str | None = None
            # the same server, aliases, seeds and limits for every split: nothing a harness sees tells them apart
            endpoint = self.model_endpoint
            if endpoint is None:
                server = self._model_server(registry, uds=socket_dir / "model.sock")
            else:  # reachable over the network: the per-trial aliases are unguessable tokens
                server = self._model_server(registry, host=endpoint.host, port=endpoint.port)
                url = (endpoint.url or server.base_url).format(port=server.port)
            session = ModelSession(socket=socket_dir / "model.sock", registry=registry, meter=self.meter,
                                   model=self.model_for(req.checkpoint), seed=self.seed,
                                   tokens_per_trial=self.tokens_per_trial, url=url, seed_key=self.seed_key)
            register_session(session_key, session)
            with self._lock:
                self._live[eval_id] = (session, started, cores)
            try:
                results = self._run_job(req, tasks, work_dir, harness_dir, session_key, eval_id, idle_gate,
                                        self.concurrency + self.spare_trials if spare is not None else None)
                usage = session.usage()
            finally:
                with self._lock:
                    self._live.pop(eval_id, None)
                unregister_session(session_key)
                session.close()
            value, trials = self._collect(req, split, tasks, results, usage, work_dir)
        finally:
            if server is not None:
                server.stop()
            socket_dirs.close()
            if spare is not None:
                unregister_gate(spare)
            if split != "dev":
                discard_private(work_dir)
        token_usd = self.prices.sample_usd(usage.prompt_tokens, usage.completion_tokens)
        sandbox_usd = self.prices.sandbox_usd(value.sandbox_seconds, self.vcpus, self.memory_gib)
        cost = min(quote.usd, token_usd + sandbox_usd)
        seconds = time.monotonic() - started
        public_dir.mkdir(parents=True, exist_ok=True)
        summary: dict[str, Any] = {"id": eval_id, "split": split, "checkpoint": req.checkpoint,
                                   "harness_version": req.harness_version, "k": req.k, "score": value.score,
                                   "tasks": {t: r for t, r in zip(value.task_ids, value.rewards)}}
        if split == "dev":
            summary.update(result=value.model_dump(), cost_usd=cost, quote_usd=quote.usd, seconds=seconds,
                           prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                           trials=trials)
        (public_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        return Billed[EvalResult](value=value, cost_usd=cost, seconds=seconds)

    def _job_config(self, req: EvalRequest, tasks: list[Path], work_dir: Path, harness_dir: Path,
                    session_key: str, idle_gate: str | None = None, concurrency: int | None = None) -> Any:
        from harbor.models.job.config import JobConfig
        from harbor.models.trial.config import AgentConfig, TaskConfig, VerifierConfig

        # the sandbox kills the harness at agent_timeout_s; Harbor's own limit leaves time to collect its output
        # over TCP, the harness needs a route to the model even in a task without network: Harbor then gives the
        # agent phase (only) an allowlist holding just the model's host; a public task is left as it is (and when
        # every task is public the list is not passed at all: Harbor would log once a trial that it ignores it)
        reach = ({"extra_allowed_hosts": [self.model_endpoint.harness_host()]}
                 if self.model_endpoint and not all(map(_public_agent_network, tasks)) else {})
        agents = [AgentConfig(import_path=AGENT_IMPORT_PATH, max_timeout_sec=self.agent_timeout_s + AGENT_SLACK_S,
                              kwargs={"harness_dir": str(harness_dir.resolve()), "session": session_key,
                                      "attempt": attempt, "harness_version": req.harness_version,
                                      "timeout_s": self.agent_timeout_s}, **reach)
                  for attempt in range(req.k)]
        return JobConfig(job_name="harbor", jobs_dir=work_dir, n_attempts=1, n_concurrent_trials=concurrency or self.concurrency,
                         quiet=True, tasks=[TaskConfig(path=t.resolve()) for t in tasks], agents=agents,
                         environment=self.environment.config(self.sandboxes_dir, self.memory_gib, idle_gate),
                         verifier=VerifierConfig(max_timeout_sec=self.verifier_timeout_s))

    def _run_job(self, req: EvalRequest, tasks: list[Path], work_dir: Path, harness_dir: Path,
                 session_key: str, eval_id: str, idle_gate: str | None = None,
                 concurrency: int | None = None) -> list[Any]:
        """Harbor's ``Job`` over the tasks, in a fresh event loop in this thread (cancelled by :meth:`close`)."""
        from harbor.job import Job as HarborJob

        tune_harbor()
        config = self._job_config(req, tasks, work_dir, harness_dir, session_key, idle_gate, concurrency)

        async def run() -> list[Any]:
            task = asyncio.current_task()
            assert task is not None
            with self._lock:
                if self._closed:
                    raise ActionError("service_error", "the evaluation service is closed")
                self._running[eval_id] = (asyncio.get_running_loop(), task)
            try:
                job = await HarborJob.create(config)
                return list((await job.run()).trial_results)
            finally:
                with self._lock:
                    self._running.pop(eval_id, None)

        return asyncio.run(run())

    def _collect(self, req: EvalRequest, split: str, tasks: list[Path], results: list[Any], usage: Usage,
                 work_dir: Path) -> tuple[EvalResult, list[dict[str, Any]]]:
        task_ids = [t.name for t in tasks]
        index = {t.resolve(): i for i, t in enumerate(tasks)}
        rewards = [[0.0] * req.k for _ in tasks]
        failures = [["harness_error"] * req.k for _ in tasks]
        sandbox_seconds = 0.0
        trials: list[dict[str, Any]] = []
        for result in results:
            i = index.get(Path(result.task_id.get_local_path()).resolve())
            attempt = int(result.config.agent.kwargs.get("attempt", 0))
            if i is None or not 0 <= attempt < req.k:
                log.warning("a trial of an unplanned task or attempt: %s", result.trial_name)
                continue
            reward = 0.0
            if result.verifier_result is not None and result.verifier_result.rewards:
                reward = float(result.verifier_result.rewards.get("reward", 0.0))
            reward = min(max(reward, 0.0), 1.0)
            meta = (result.agent_result.metadata if result.agent_result is not None else None) or {}
            harness_error = meta.get("harness_error")
            if harness_error is None and result.agent_result is None and result.exception_info is not None:
                harness_error = result.exception_info.exception_type
            if (result.exception_info is not None
                    and result.exception_info.exception_type in ("AgentTimeoutError", "NonZeroAgentExitCodeError")):
                harness_error = harness_error or result.exception_info.exception_message[:300]
            rewards[i][attempt] = reward
            signals = meta.get("signals") if isinstance(meta.get("signals"), dict) else None
            failures[i][attempt] = failure_label(reward, meta.get("end_reason"), harness_error, signals)
            trial_dir = Path(result.config.trials_dir) / result.trial_name
            seconds = self.environment.trial_seconds(trial_dir, result)
            sandbox_seconds += min(seconds, self.trial_cap_s())
            trials.append({"task": task_ids[i], "attempt": attempt, "reward": reward,
                           "failure": failures[i][attempt],
                           "dir": str(trial_dir.relative_to(work_dir)) if trial_dir.is_relative_to(work_dir)
                           else str(trial_dir),
                           "harness_error": harness_error,
                           "exception": result.exception_info.exception_type if result.exception_info else None})
        modes: dict[str, int] = {}
        for row in failures:
            for label in row:
                if label:
                    modes[label] = modes.get(label, 0) + 1
        score = sum(sum(r) / req.k for r in rewards) / len(rewards)
        value = EvalResult(split=split, checkpoint=req.checkpoint, harness_version=req.harness_version, k=req.k,
                           score=score, task_ids=task_ids, rewards=rewards, failures=failures, failure_modes=modes,
                           tokens=usage.total_tokens, sandbox_seconds=round(sandbox_seconds, 4))
        trials.sort(key=lambda t: (t["task"], t["attempt"]))
        return value, trials


_TUNED = threading.Lock()
_TREE_CACHE_MAX = 4096


def tune_harbor() -> None:
    """Five adjustments to Harbor 0.25 (pinned), applied once per process.

    * its job draws a rich progress bar even when ``quiet``: disabled;
    * every trial hashes its task directory's whole content twice (the trial lock's digest and the
      deprecated ``Task.checksum``), about a third of Harbor's own per-trial work here;
    * every trial checks its task's input tree against the ``.harborignore`` rules (pathspec matching
      of every path and its ancestors) when it loads the task and again when the verifier selects the
      test files: ~15 ms of the main process per trial here, the same answers every time;
    * every trial's lock is built twice (the job's lock, then the trial's own), each time parsing and
      validating the task's ``task.toml`` twice (its package version, its verifier mode): ~0.8 ms of the
      main process per trial here;
    * its job rewrites the job's progress file at every trial's start and end: skipped
      (:func:`_skip_progress_writes`; the file is written when the job starts and ends).

    The hashes and the ``.harborignore`` checks are memoized by the directory's entries (path, type, size,
    mtime, inode of each), the ``task.toml`` readers by the file's content: a changed file gives a new key,
    so the value is always the one Harbor would compute; a check that fails is not memoized and fails
    again (``tests/worlds/local/test_harbor_local.py`` checks them against Harbor's own)."""
    with _TUNED:
        import harbor.job
        import harbor.models.job.lock as job_lock
        from harbor.models.task.file_filter import TaskFileFilter
        from harbor.models.task.task import Task
        from harbor.publisher.packager import Packager

        if getattr(harbor.job, "_rsigym_tuned", False):
            return
        harbor.job.Progress = functools.partial(harbor.job.Progress, disable=True)
        content_hash = Packager.compute_content_hash
        checksum = Task.checksum.fget
        hashes: dict[tuple, Any] = {}
        sums: dict[tuple, str] = {}

        def cached_content_hash(task_dir: Path) -> tuple[str, list[Path]]:
            key = _tree_key(Path(task_dir))
            if key not in hashes:
                if len(hashes) >= _TREE_CACHE_MAX:
                    hashes.clear()
                hashes[key] = content_hash(task_dir)
            digest, files = hashes[key]
            return digest, list(files)

        def cached_checksum(task: Any) -> str:
            key = _tree_key(Path(task.task_dir))
            if key not in sums:
                if len(sums) >= _TREE_CACHE_MAX:
                    sums.clear()
                sums[key] = checksum(task)
            return sums[key]

        Packager.compute_content_hash = staticmethod(cached_content_hash)
        Task.checksum = property(cached_checksum, doc=Task.checksum.__doc__)
        _memoize_task_filters(TaskFileFilter, Task)
        for name in ("_task_package_version", "_task_verifier_environment_mode"):
            setattr(job_lock, name, _memoized_by_task_toml(getattr(job_lock, name)))
        _skip_progress_writes(harbor.job.Job)
        harbor.job._rsigym_tuned = True


def _skip_progress_writes(job_class: Any) -> None:
    """Harbor's job rewrites its ``result.json`` (the job's progress counts, trials excluded) in a worker thread at
    every trial's start, cancellation and end, for a live viewer (~0.5 ms of the main process a write here, twice a
    trial); nothing reads it while the job runs. Those writes are skipped; the job still keeps its progress in
    memory and writes the file when it starts and when it ends (``Job.run``, with the same final content), and
    every trial writes its own ``result.json`` as before."""
    write = job_class._write_job_result_async

    @functools.wraps(write)
    async def tuned(self: Any, *, exclude_trial_results: bool = False) -> None:
        if not exclude_trial_results:  # (Harbor 0.25 passes True from the three trial hooks only)
            await write(self, exclude_trial_results=exclude_trial_results)

    job_class._write_job_result_async = tuned


def _public_agent_network(task: Path) -> bool:
    """Whether ``task``'s agent phase has public network access by its own ``task.toml`` (Harbor's reading of it;
    an unreadable file counts as not public, so the model's host is passed)."""
    try:
        return _public_agent_policy((task / "task.toml").read_text())
    except (OSError, ValueError):
        return False


@functools.lru_cache(maxsize=1024)
def _public_agent_policy(toml_text: str) -> bool:
    from harbor.models.task.config import NetworkMode, TaskConfig

    config = TaskConfig.model_validate_toml(toml_text)
    policy = config.agent.explicit_phase_policy() or config.environment.resolve_baseline()
    return policy.network_mode == NetworkMode.PUBLIC


_TOML_MEMO_MAX = 64 << 10  # a larger task.toml is read by Harbor each time


def _memoized_by_task_toml(read: Callable[[Path], Any]) -> Callable[[Path], Any]:
    """``read(task_dir)``, a function of the task's ``task.toml`` alone, memoized by that file's content
    (no readable file: not memoized)."""
    cached = functools.lru_cache(maxsize=_TREE_CACHE_MAX)(lambda content, task_dir: read(task_dir))

    @functools.wraps(read)
    def memoized(task_dir: Path) -> Any:
        try:
            with open(os.path.join(task_dir, "task.toml"), "rb") as f:
                content = f.read(_TOML_MEMO_MAX + 1)
        except OSError:
            return read(task_dir)
        return read(task_dir) if len(content) > _TOML_MEMO_MAX else cached(content, task_dir)
    return memoized


def _memoize_task_filters(filter_class: Any, task_class: Any) -> None:
    """Memoize ``TaskFileFilter.is_excluded`` / ``select`` and ``Task._validate_input_paths`` (see
    :func:`tune_harbor`): a filter made for a task directory shares the answers of every filter made for
    the same entries (:func:`_tree_key`), computed by Harbor's own code the first time."""
    init, is_excluded, select = filter_class.__init__, filter_class.is_excluded, filter_class.select
    validate_inputs = task_class.__dict__["_validate_input_paths"].__func__
    memos: dict[tuple, dict[tuple, Any]] = {}

    def tuned_init(self: Any, task_dir: Path | str) -> None:
        init(self, task_dir)
        key = _tree_key(self.task_dir)
        if key not in memos and len(memos) >= _TREE_CACHE_MAX:
            memos.clear()
        self._rsigym_memo = memos.setdefault(key, {})

    def memoized(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def tuned(self: Any, path: Path | str) -> Any:
            memo = getattr(self, "_rsigym_memo", None)
            if memo is None:
                return original(self, path)
            key = (kind, os.path.abspath(path))
            if key not in memo:
                memo[key] = original(self, path)  # an error is raised, not memoized
            return memo[key]
        return tuned

    def tuned_validate_inputs(config: Any, paths: Any, *, file_filter: Any = None) -> None:
        file_filter = file_filter or filter_class(paths.task_dir)
        memo = getattr(file_filter, "_rsigym_memo", None)
        key = ("inputs", config.model_dump_json())
        if memo is None or key not in memo:
            validate_inputs(config, paths, file_filter=file_filter)
            if memo is not None:
                memo[key] = True

    filter_class.__init__ = tuned_init
    filter_class.is_excluded = memoized("excluded", is_excluded)
    filter_class.select = memoized("select", select)  # a FileSelection is frozen: safe to share
    task_class._validate_input_paths = staticmethod(tuned_validate_inputs)


def _tree_key(root: Path) -> tuple:
    """What identifies a directory's content without reading it: every entry's path, type, size, mtime and
    inode (symbolic links to directories included: ``os.walk`` does not enter them)."""
    root = root.resolve()
    entries = []
    for current, dirs, files in os.walk(root):
        for name in (*files, *dirs):
            st = os.lstat(os.path.join(current, name))
            entries.append((current, name, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino))
        entries.append((current, "", len(dirs), len(files), 0, 0))
    return (str(root), tuple(sorted(entries)))


def discard_private(path: Path) -> None:
    """Delete an official evaluation's private job directory (its trials, logs and trajectories)."""
    shutil.rmtree(path, ignore_errors=True)


def _trial_seconds(result: Any) -> float:
    """A trial's wall time from Harbor's own timing (environments other than bubblewrap keep no record)."""
    if result.started_at is None:
        return 0.0
    if result.finished_at is None:  # unknown end: the caller caps it at the trial's worst case
        return float("inf")
    return max(0.0, (result.finished_at - result.started_at).total_seconds())


__all__ = ["END_REASON_LABELS", "HarborEnvironmentType", "HarborEvalService", "ModelEndpoint", "TrialEnvironment", "failure_label", "list_tasks", "write_harness"]
