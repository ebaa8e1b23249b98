"""Record and replay: a run's every service request and response, and every clock reading, on a tape.

Recording wraps the world a run builds; the tape (JSON Lines) holds, per episode, a header (world,
world seed, scenario, initial harness, description, ``meta``) and then:

* every service call — ``quote``/``start``/``official``/``generate``/... with its request and its
  response (a quote, a billed result, a job, or the error it raised); hints that answer nothing
  (``prefetch_official``) reach the recorded world but not the tape;
* every reading of the world's clock (``now``), every ``spend`` and every ``wait`` (which job ended),
  so worlds on a wall clock replay to the same observations;
* for each job, every answer its future gave to ``done()`` and its final result.

A **replay world** serves those responses: a service request is looked up by its content (the n-th
identical request gets the n-th recorded response) and one that was never recorded is refused with
``ActionError("not_recorded", ...)`` naming it, so the run reports it as an ordinary refused call.
Clock readings and job states are served in recorded order; once a run departs from the recording,
the clock carries on from its last reading (spend adds, wait jumps to the job's ready time) and
:attr:`ReplayWorld.diverged` says so.

A replay world is handed to the env the way any world is, through its world factory
(``ResearchEnv(world_factory=...)``, :data:`rsigym_env.worlds.WorldFactory`): :class:`ReplayWorlds`
is a factory that builds the recorded episode's :class:`ReplayWorld`, :class:`RecordingWorlds` wraps
another factory to record. Nothing global changes, so a replaying env and a live one can run side by
side. :class:`TapeWrapper` does that wiring around any ``ResearchEnv`` (it wraps that env's own
factory; the scenario is untouched, so the recorded run's observations are those of an unrecorded one):

>>> import gymnasium as gym, tempfile, rsigym_env
>>> from rsigym_env.episode import run_episode
>>> from rsigym_env.baselines import make_researcher
>>> tape = tempfile.mktemp(suffix=".jsonl")
>>> env = TapeWrapper(gym.make("RSIGym/Harness-v0", benchmark="aime", budget_usd=50), record=tape)
>>> live = run_episode(env, make_researcher("scripted"), seed=3)
>>> env = TapeWrapper(gym.make("RSIGym/Harness-v0", benchmark="aime", budget_usd=50), replay=tape)
>>> again = run_episode(env, make_researcher("scripted"), seed=3)
>>> again.reward == live.reward, again.info["official_score"] == live.info["official_score"]
(True, True)
>>> env.world.name, env.diverged
('sim', False)

The same replay without the wrapper:

>>> env = gym.make("RSIGym/Harness-v0", benchmark="aime", budget_usd=50, world_factory=ReplayWorlds(tape))
>>> run_episode(env, make_researcher("scripted"), seed=3).reward == live.reward
True
"""

from __future__ import annotations

import json
import math
import threading
from collections import defaultdict, deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Sequence

import gymnasium as gym
from pydantic import BaseModel

from .canonical import canonical_dumps
from .errors import ActionError
from .scenario import Scenario
from .services import Billed, CommandResult, Completion, DatasetInfo, EvalRequest, EvalResult, Job, Quote, TrainResult

FORMAT = "rsigym-tape/1"
SERVICES = ("rollout", "train", "inference", "sandbox", "evaluation")
HINTS = frozenset({"prefetch_official"})  # calls that answer nothing: passed on when recording, not on the tape
VALUE_TYPES: dict[str, type[BaseModel]] = {t.__name__: t for t in (DatasetInfo, TrainResult, Completion, CommandResult, EvalResult)}


class ReplayMiss(ActionError):
    """A request the tape never recorded (refused like any bad call: nothing is charged)."""

    def __init__(self, message: str):
        super().__init__("not_recorded", message)


# ------------------------------------------------------------------------------------ encoding


def _enc_arg(arg: Any) -> Any:
    if isinstance(arg, BaseModel):
        return {"type": type(arg).__name__, "data": arg.model_dump(mode="json")}
    return arg


def _enc_error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, ActionError):
        return {"type": "ActionError", "code": exc.code, "message": exc.message}
    return {"type": type(exc).__name__, "message": str(exc)}


def _raise(err: dict[str, Any]) -> None:
    if err["type"] == "ActionError":
        raise ActionError(err["code"], err["message"])
    raise RuntimeError(f"{err['type']}: {err['message']} (recorded)")


def _enc_billed(billed: Billed) -> dict[str, Any]:
    value = billed.value
    name = type(value).__name__
    if name not in VALUE_TYPES:
        raise TypeError(f"cannot record a result of type {name}")
    return {"value_type": name, "value": value.model_dump(mode="json"), "cost_usd": billed.cost_usd, "seconds": billed.seconds}


def _dec_billed(data: dict[str, Any]) -> Billed:
    cls = VALUE_TYPES[data["value_type"]]
    return Billed[cls](value=cls.model_validate(data["value"]), cost_usd=data["cost_usd"], seconds=data["seconds"])


def _key(service: str, method: str, args: Sequence[Any]) -> str:
    return canonical_dumps([service, method, [_enc_arg(a) for a in args]])


def _describe_call(service: str, method: str, args: Sequence[Any]) -> str:
    parts = []
    for a in args:
        if isinstance(a, EvalRequest):
            parts.append(f"{a.checkpoint} + {a.harness_version} on {a.split}, k={a.k}, n_tasks={a.n_tasks}")
        elif isinstance(a, BaseModel):
            parts.append(json.dumps(a.model_dump(mode="json", exclude_defaults=True), sort_keys=True))
        else:
            parts.append(repr(a))
    text = ", ".join(parts)
    return f"{service}.{method}({text if len(text) < 300 else text[:297] + '...'})"


# ------------------------------------------------------------------------------------ recording


class _Writer:
    """Appends JSON lines to the tape, one write per line, flushed (a crash keeps what ran)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.fh = path.open("a", encoding="utf-8")

    def write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self.lock:
            if not self.fh.closed:
                self.fh.write(line)
                self.fh.flush()

    def close(self) -> None:
        with self.lock:
            self.fh.close()


class _RecordingFuture(Future):
    """A job's future as the run sees it: every ``done()`` answer is recorded; the result once it exists."""

    def __init__(self, inner: Future, job_id: str, writer: _Writer):
        super().__init__()
        self._inner, self._job, self._writer = inner, job_id, writer
        inner.add_done_callback(self._copy)

    def _copy(self, inner: Future) -> None:
        try:
            result = inner.result()
        except BaseException as exc:  # noqa: BLE001 - recorded, then handed on as it was
            self._writer.write({"k": "result", "job": self._job, "err": _enc_error(exc)})
            self.set_exception(exc)
            return
        self._writer.write({"k": "result", "job": self._job, "value": _enc_billed(result)})
        self.set_result(result)

    def done(self) -> bool:
        answer = self._inner.done()
        self._writer.write({"k": "done", "job": self._job, "v": answer})
        return answer

    def result(self, timeout: float | None = None) -> Any:
        return self._inner.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._inner.exception(timeout)


class _RecordingService:
    def __init__(self, name: str, inner: Any, world: "RecordingWorld"):
        self._name, self._inner, self._world = name, inner, world

    def __getattr__(self, method: str) -> Callable[..., Any]:
        target = getattr(self._inner, method)
        if not callable(target) or method in HINTS:
            return target
        world, service = self._world, self._name

        def call(*args: Any) -> Any:
            entry: dict[str, Any] = {"k": "call", "key": _key(service, method, args)}
            try:
                out = target(*args)
            except BaseException as exc:
                world.writer.write(entry | {"err": _enc_error(exc)})
                raise
            if isinstance(out, Job):
                entry["job"] = {"id": out.id, "kind": out.kind, "started_at": out.started_at, "ready_at": out.ready_at,
                                "meta": json.loads(json.dumps(out.meta, default=str))}
                world.inner_jobs[out.id] = out
                out = Job(id=out.id, kind=out.kind, started_at=out.started_at, ready_at=out.ready_at, meta=out.meta,
                          future=_RecordingFuture(out.future, out.id, world.writer))
            elif isinstance(out, Quote):
                entry["quote"] = out.model_dump()
            elif isinstance(out, Billed):
                entry["billed"] = _enc_billed(out)
            else:
                raise TypeError(f"cannot record {service}.{method} returning {type(out).__name__}")
            world.writer.write(entry)
            return out

        return call


class _RecordingClock:
    def __init__(self, inner: Any, world: "RecordingWorld"):
        self._inner, self._world = inner, world

    def now(self) -> float:
        t = self._inner.now()
        self._world.writer.write({"k": "clock", "op": "now", "t": t})
        return t

    def spend(self, seconds: float) -> None:
        self._inner.spend(seconds)
        self._world.writer.write({"k": "clock", "op": "spend", "s": seconds})

    def wait(self, jobs: Sequence[Job], deadline: float) -> Job | None:
        inner = [self._world.inner_jobs.get(j.id, j) for j in jobs]
        got = self._inner.wait(inner, deadline)
        job = None if got is None else next(j for j in jobs if j.id == got.id)
        self._world.writer.write({"k": "clock", "op": "wait", "jobs": [j.id for j in jobs],
                                  "deadline": deadline if math.isfinite(deadline) else None,
                                  "job": None if job is None else job.id})
        return job


class RecordingWorld:
    """Any world, with every request, response and clock reading appended to a tape."""

    def __init__(self, inner: Any, path: str | Path, scenario: Scenario, seed: int, meta: dict[str, Any] | None = None):
        self.inner, self.name = inner, inner.name
        self.writer = _Writer(Path(path))
        self.inner_jobs: dict[str, Job] = {}
        self._harness, self._describe = inner.initial_harness(), inner.describe()
        self.writer.write({"k": "header", "format": FORMAT, "world": inner.name, "seed": seed,
                           "scenario": scenario.model_dump(mode="json"), "meta": meta or {},
                           "initial_harness": self._harness, "describe": self._describe})
        self.clock = _RecordingClock(inner.clock, self)
        for service in SERVICES:
            setattr(self, service, _RecordingService(service, getattr(inner, service), self))

    def initial_harness(self) -> dict[str, str]:
        return dict(self._harness)

    def describe(self) -> str:
        return self._describe

    def read(self, ref: str) -> str | None:
        """World artifacts are not on the tape (a replay could not answer them): none while recording."""
        return None

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.writer.close()


# ------------------------------------------------------------------------------------ replay


def read_tape(path: str | Path) -> list[dict[str, Any]]:
    """The episodes of a tape: ``[{"header": {...}, "entries": [...]}, ...]``."""
    episodes: list[dict[str, Any]] = []
    with Path(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            entry = json.loads(line)
            if entry.get("k") == "header":
                if entry.get("format") != FORMAT:
                    raise ValueError(f"{path}:{n}: not an {FORMAT} tape (format {entry.get('format')!r})")
                episodes.append({"header": entry, "entries": []})
            elif not episodes:
                raise ValueError(f"{path}:{n}: entry before the first header")
            else:
                episodes[-1]["entries"].append(entry)
    if not episodes:
        raise ValueError(f"{path}: empty tape")
    return episodes


class _ReplayFuture(Future):
    """Answers ``done()`` as recorded (then as the last answer) and holds the recorded result."""

    def __init__(self, job_id: str, answers: deque, result: dict[str, Any] | None):
        super().__init__()
        self._job, self._answers, self._last = job_id, answers, False
        if result is not None:
            if "err" in result:
                try:
                    _raise(result["err"])
                except BaseException as exc:  # noqa: BLE001
                    self.set_exception(exc)
            else:
                self.set_result(_dec_billed(result["value"]))

    def done(self) -> bool:
        if self._answers:
            self._last = self._answers.popleft()
        elif not self._last:
            self._last = super().done()
        return self._last

    def result(self, timeout: float | None = None) -> Any:
        if not super().done():
            raise ReplayMiss(f"replay: the result of {self._job} was never recorded (the recorded run ended first)")
        return super().result(0)


class _ReplayService:
    def __init__(self, name: str, world: "ReplayWorld"):
        self._name, self._world = name, world

    def __getattr__(self, method: str) -> Callable[..., Any]:
        world, service = self._world, self._name
        if method in HINTS:  # a replay has every answer already
            return lambda *args: None

        def call(*args: Any) -> Any:
            queue = world.calls.get(_key(service, method, args))
            if not queue:
                world.diverged = True
                similar = sum(len(q) for k, q in world.calls.items() if k.startswith(json.dumps([service, method])[:-1]))
                raise ReplayMiss(f"replay: {_describe_call(service, method, args)} was never recorded in {world.path} "
                                 f"(it holds {similar} other unused {service}.{method} response(s)); only recorded "
                                 "requests can be replayed")
            entry = queue.popleft()
            if "err" in entry:
                _raise(entry["err"])
            if "quote" in entry:
                return Quote(**entry["quote"])
            if "billed" in entry:
                return _dec_billed(entry["billed"])
            j = entry["job"]
            future = _ReplayFuture(j["id"], world.done_answers[j["id"]], world.results.get(j["id"]))
            return Job(id=j["id"], kind=j["kind"], started_at=j["started_at"], ready_at=j["ready_at"], meta=j["meta"],
                       future=future)

        return call


class _ReplayClock:
    def __init__(self, world: "ReplayWorld", entries: list[dict[str, Any]]):
        self._world, self._tape, self._last = world, deque(entries), 0.0

    def _next(self, op: str) -> dict[str, Any] | None:
        if self._tape and self._tape[0]["op"] == op:
            return self._tape.popleft()
        self._world.diverged = True
        return None

    def now(self) -> float:
        entry = self._next("now")
        if entry is not None:
            self._last = entry["t"]
        return self._last

    def spend(self, seconds: float) -> None:
        if self._next("spend") is None:
            self._last += seconds

    def wait(self, jobs: Sequence[Job], deadline: float) -> Job | None:
        entry = self._next("wait")
        if entry is not None:
            return next((j for j in jobs if j.id == entry["job"]), None)
        ready = [j for j in jobs if j.ready_at is not None or j.future.done()]
        if not ready:
            return None
        job = min(ready, key=lambda j: j.ready_at if j.ready_at is not None else self._last)
        self._last = max(self._last, job.ready_at or self._last)
        return job


class ReplayWorld:
    """Serves one recorded episode (see the module docstring). ``diverged`` turns true when the run
    asks for something the recording does not hold."""

    def __init__(self, episode: dict[str, Any], path: str | Path = "<tape>"):
        header = episode["header"]
        self.path, self.header, self.name = str(path), header, header["world"]
        self.diverged = False
        self.calls: dict[str, deque] = defaultdict(deque)
        self.done_answers: dict[str, deque] = defaultdict(deque)
        self.results: dict[str, dict[str, Any]] = {}
        clock: list[dict[str, Any]] = []
        for entry in episode["entries"]:
            kind = entry["k"]
            if kind == "call":
                self.calls[entry["key"]].append(entry)
            elif kind == "clock":
                clock.append(entry)
            elif kind == "done":
                self.done_answers[entry["job"]].append(entry["v"])
            elif kind == "result":
                self.results[entry["job"]] = entry
        self.clock = _ReplayClock(self, clock)
        for service in SERVICES:
            setattr(self, service, _ReplayService(service, self))

    @classmethod
    def load(cls, path: str | Path, seed: int | None = None) -> "ReplayWorld":
        """The episode of ``path`` recorded with world seed ``seed`` (or its only episode)."""
        episodes = read_tape(path)
        if seed is not None:
            for episode in episodes:
                if episode["header"]["seed"] == seed:
                    return cls(episode, path)
        if len(episodes) == 1:
            return cls(episodes[0], path)
        raise ValueError(f"{path} holds no episode with world seed {seed}; seeds: "
                         f"{', '.join(str(e['header']['seed']) for e in episodes)}")

    def initial_harness(self) -> dict[str, str]:
        return dict(self.header["initial_harness"])

    def describe(self) -> str:
        return self.header["describe"]

    def read(self, ref: str) -> str | None:
        """No world artifacts on a tape."""
        return None

    def close(self) -> None:
        """Nothing to release."""


# ------------------------------------------------------------------------------------ wiring


class ReplayWorlds:
    """A world factory, ``(scenario, seed, run_dir) -> ReplayWorld``, that serves the episode of the tape
    at ``path`` recorded with that world seed (or its only episode); pass it as ``world_factory``.

    ``built`` is the last world it built (``None`` before the first ``reset``).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        read_tape(self.path)  # fail now, clearly, on a missing or foreign file
        self.built: ReplayWorld | None = None

    def __call__(self, scenario: Scenario, seed: int, run_dir: Path | None = None) -> ReplayWorld:
        self.built = ReplayWorld.load(self.path, seed)
        return self.built


class RecordingWorlds:
    """A world factory that builds each world with ``inner`` and records it to the tape at ``path``
    (appending one episode per world). ``meta`` (a dict, or a function returning one at build time)
    goes into each episode's header. ``built`` is the last world it built."""

    def __init__(self, inner: Callable[..., Any], path: str | Path,
                 meta: dict[str, Any] | Callable[[], dict[str, Any]] | None = None):
        self.inner, self.path, self.meta = inner, Path(path), meta
        self.built: RecordingWorld | None = None

    def __call__(self, scenario: Scenario, seed: int, run_dir: Path | None = None) -> RecordingWorld:
        meta = self.meta() if callable(self.meta) else self.meta
        self.built = RecordingWorld(self.inner(scenario, seed, run_dir), self.path, scenario, seed, meta)
        return self.built


class TapeWrapper(gym.Wrapper):
    """Records every episode of ``env`` to ``record`` (the file is started afresh) or replays ``replay``.

    ``env`` is a ``ResearchEnv`` (under any wrappers); its world factory is wrapped — that env only,
    nothing global. ``meta`` goes into each episode's header, with the reset seed (``reset_seed``).
    :attr:`world` is the world of the current episode, :attr:`diverged` whether a replay has departed
    from the recording.
    """

    def __init__(self, env: gym.Env, *, record: str | Path | None = None, replay: str | Path | None = None,
                 meta: dict[str, Any] | None = None):
        super().__init__(env)
        if (record is None) == (replay is None):
            raise ValueError("give exactly one of record= and replay=")
        self.mode, self.path = ("record", Path(record)) if record is not None else ("replay", Path(replay))  # type: ignore[arg-type]
        self.meta = dict(meta or {})
        self._reset_seed: int | None = None
        target = env.unwrapped
        if not hasattr(target, "world_factory"):
            raise TypeError(f"{type(target).__name__} builds no world through a world_factory; TapeWrapper needs a ResearchEnv")
        self.factory: ReplayWorlds | RecordingWorlds
        if self.mode == "record":
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")
            self.factory = RecordingWorlds(target.world_factory, self.path, lambda: self.meta | {"reset_seed": self._reset_seed})
        else:
            self.factory = ReplayWorlds(self.path)
        target.world_factory = self.factory

    @property
    def world(self) -> RecordingWorld | ReplayWorld | None:
        """The world of the current episode (``None`` before the first ``reset``)."""
        return self.factory.built

    @property
    def diverged(self) -> bool:
        """True once a replayed run asked for something the tape does not hold (never when recording)."""
        return isinstance(self.world, ReplayWorld) and self.world.diverged

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self._reset_seed, self.factory.built = seed, None
        obs, info = self.env.reset(seed=seed, options=options)
        if self.factory.built is None:
            raise RuntimeError("the episode's world was built without the tape (the env's world_factory was "
                               "replaced after the TapeWrapper was made)")
        return obs, info


def tape_header(path: str | Path, episode: int = 0) -> dict[str, Any]:
    """The header of a tape's ``episode``-th episode (scenario, world seed, meta)."""
    return read_tape(path)[episode]["header"]


__all__ = ["FORMAT", "RecordingWorld", "RecordingWorlds", "ReplayMiss", "ReplayWorld", "ReplayWorlds", "TapeWrapper",
           "read_tape", "tape_header"]
