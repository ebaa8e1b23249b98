"""The run record: one append-only JSON-lines file per run directory that ``rsigym watch`` reads.

:class:`RunRecorder` wraps any env built on :class:`~rsigym_env.env.ResearchEnv` and appends to
``<run_dir>/record.jsonl`` as the run goes. Every line is one JSON object with a ``type``:

* ``start`` — at reset: ``scenario`` (the full scenario), ``researcher``, ``surface``, ``run_id``,
  ``seed`` (the reset seed) and ``episode_seed``, ``owner`` (pid, start time, host: whether the
  process still runs), the initial ``harness`` (version and files) and the ``briefing``.
* ``step`` — after every step: ``step``, ``tool``, ``args``, ``ok``, ``error``/``message``,
  ``cost_usd``, ``spent_usd``, ``reserved_usd``, ``budget_left_usd``, ``world_s`` (the world's
  clock), ``dev`` (initial, best, last dev score; ``null`` = not measured), ``events`` (jobs that
  finished), ``running`` (jobs still running), ``result`` (without dataset samples) and ``log``
  (the full text the researcher read).
* ``dataset`` — a new dataset: id, size, origin, stats and its sample ``preview``.
* ``harness`` — a new harness version: ``version``, ``base_version`` and the ``files`` that differ
  from the base (``removed`` lists paths it no longer has).
* ``job`` — a job's result once it ended: training (``loss_curve``, steps, tokens, config), a dev
  evaluation (``tasks`` with each attempt's reward and failure mode, ``failure_modes``), or the
  ``error`` of a failed or cancelled job. Held-out (official) evaluations keep only their score.
* ``end`` — the episode's end ``info`` (official score, normalized gain, submission, spend, ...).
* ``resume`` — a process took the run over (the session service after a restart): its ``owner``;
  ``after_step`` is the last step that stays (later step lines before it were never confirmed).

Each step's lines go out in one ``write`` on an ``O_APPEND`` descriptor before ``step`` returns, so
a process that is killed loses nothing it had stepped; a line torn by a crash mid-write is skipped
by :func:`read_record`. ``fsync=True`` also survives a power cut (it costs a disk flush per step).
A second ``reset`` of the same env appends a new ``start``: readers show the last episode.

>>> import gymnasium as gym, tempfile, rsigym_env
>>> d = tempfile.mkdtemp()
>>> env = RunRecorder(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=50), d, researcher="me")
>>> _ = env.reset(seed=0)
>>> _ = env.step({"tool": "evaluate", "args": {"k": 1, "n_tasks": 5}})
>>> _ = env.step({"tool": "wait", "args": {}})
>>> _ = env.step({"tool": "submit", "args": {}})
>>> env.close()
>>> [r["type"] for r in read_record(f"{d}/record.jsonl")]
['start', 'step', 'step', 'job', 'step', 'end']
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import gymnasium as gym
import numpy as np
import orjson

from ..owners import current_owner
from ..rundir import RECORD_FILE

if TYPE_CHECKING:
    from ..run import RunView

VERSION = 1
RESULT_MAX_BYTES = 32_768
"""A step's ``result`` larger than this (as JSON) is recorded as ``{"truncated": true, "bytes": n}``."""


def _default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _clean(value: Any) -> Any:
    """``value`` with non-finite floats as ``None`` and everything else JSON-able (the slow path)."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return _clean(_default(value))


def dumps(record: dict[str, Any]) -> bytes:
    """One record as a JSON line (with its newline): orjson, or a safe fallback for what it refuses.

    >>> dumps({"a": np.float32(0.5), "b": float("nan")})
    b'{"a":0.5,"b":null}\\n'
    """
    try:
        return orjson.dumps(record, default=_default,
                            option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE)
    except (TypeError, orjson.JSONEncodeError):
        return (json.dumps(_clean(record), ensure_ascii=True, default=str) + "\n").encode()


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One record line as a dict; None for a blank, torn or foreign line."""
    if not line.strip():
        return None
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def iter_lines(data: bytes) -> Iterator[dict[str, Any]]:
    """The complete JSON-object lines of ``data`` (a torn or foreign line is skipped)."""
    for line in data.split(b"\n"):
        value = parse_line(line)
        if value is not None:
            yield value


def read_record(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete line of a record file (``[]`` if there is none); a torn last line is dropped."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return []
    return list(iter_lines(data[: data.rfind(b"\n") + 1]))


def normalize_action(action: Any) -> tuple[str | None, Any]:
    """``(tool, args)`` of an action in any form ``step`` takes, without validating it.

    >>> normalize_action('{"tool": "wait", "args": {}}'), normalize_action({"tool": "submit"})
    (('wait', {}), ('submit', {}))
    """
    if hasattr(action, "model_dump") and hasattr(action, "name"):
        return str(action.name), action.model_dump(mode="json")
    if isinstance(action, (str, bytes)):
        try:
            action = json.loads(action)
        except (ValueError, RecursionError):
            return None, {"action": action[:2000] if isinstance(action, str) else repr(action[:2000])}
    if isinstance(action, dict) and isinstance(action.get("args", {}), dict):
        return (str(action["tool"]) if "tool" in action else None), dict(action.get("args") or {})
    if isinstance(action, tuple) and len(action) == 2:
        return None, {"space_sample": _clean(action[1])}
    return None, {"action": _clean(action)}


def _score(value: Any) -> float | None:
    value = float(value)
    return None if value < 0 or not math.isfinite(value) else value


def job_payload(value: Any) -> dict[str, Any]:
    """What the record keeps of a finished job's result (see the module docstring)."""
    from ..services import DatasetInfo, EvalResult, TrainResult

    if isinstance(value, TrainResult):
        return {"kind": "train", "ok": True, "checkpoint": value.checkpoint, "steps": value.steps,
                "tokens": value.tokens, "loss_curve": list(value.loss_curve), "config": _clean(value.config)}
    if isinstance(value, EvalResult):
        out: dict[str, Any] = {"kind": "evaluate", "ok": True, "split": value.split, "checkpoint": value.checkpoint,
                               "harness": value.harness_version, "k": value.k, "score": value.score}
        if value.split == "dev":  # held-out tasks stay unnamed
            out.update(tasks=[{"task": t, "rewards": r, "failures": f}
                              for t, r, f in zip(value.task_ids, value.rewards, value.failures)],
                       failure_modes=dict(value.failure_modes), tokens=value.tokens,
                       sandbox_seconds=value.sandbox_seconds)
        return out
    if isinstance(value, DatasetInfo):
        return {"kind": "dataset", "ok": True, "dataset": value.id}
    if isinstance(value, dict):
        if "error" in value:
            return {"ok": False, "error": str(value["error"]), "cost_usd": value.get("cost_usd"),
                    **({"kind": value["kind"]} if "kind" in value else {})}
        if "submitted" in value:
            return {"kind": "submit", "ok": True, "submitted": _clean(value["submitted"])}
    return {"ok": True, "kind": type(value).__name__}


class RunRecorder(gym.Wrapper):
    """Append the run record of a ``ResearchEnv`` to ``<run_dir>/record.jsonl`` (see the module docstring).

    Args:
        run_dir: the run's directory (created if needed).
        researcher: who drives the run (``scripted``, an agent id, a label such as ``claude-code``).
        surface: what runs it, e.g. ``rsigym run`` or ``rsigym serve``.
        run_id: the run's id where the surface has one (the session service's).
        recording: ``False`` tracks the run without writing (a replay that rebuilds a run the record
            already holds); setting it to ``True`` later appends a ``resume`` line and goes on.
        fsync: flush every step to the disk, not only to the operating system.
    """

    def __init__(self, env: gym.Env, run_dir: str | os.PathLike[str], *, researcher: str | None = None,
                 surface: str | None = None, run_id: str | None = None, recording: bool = True,
                 fsync: bool = False):
        super().__init__(env)
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / RECORD_FILE
        self.researcher, self.surface, self.run_id = researcher, surface, run_id
        self.fsync = fsync
        self._recording = recording
        self._fd: int | None = None
        self._pending_start: dict[str, Any] | None = None
        self.steps = 0
        self._episode = -1  # resets so far - 1: a record's steps say which episode and resumption they belong to
        self._resumes = 0
        self._seen_datasets: set[str] = set()
        self._seen_versions: set[str] = set()
        self._seen_jobs: set[str] = set()
        self._ended = False

    # ------------------------------------------------------------------ writing

    def _write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        if self._fd is None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            _heal(self._fd, self.path)
        data = b"".join(_line(r) for r in records)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        if self.fsync:
            os.fsync(self._fd)

    @property
    def recording(self) -> bool:
        return self._recording

    @recording.setter
    def recording(self, value: bool) -> None:
        if value and not self._recording:
            if self._pending_start is not None and (not self.path.exists() or self.path.stat().st_size == 0):
                self._write([self._pending_start])  # nothing recorded yet: this is the run's start
            else:
                self._resumes += 1
                self._write([{"type": "resume", "t": time.time(), "after_step": self.steps,
                              "owner": dataclasses.asdict(current_owner()), "surface": self.surface}])
            self._pending_start = None
        self._recording = value

    def close_file(self) -> None:
        """Close the record file (the env stays open)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ the env

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.steps, self._ended, self._resumes = 0, False, 0
        self._episode += 1
        view = self.env.unwrapped.run_view()
        scenario = getattr(self.env.unwrapped, "scenario", None)
        start: dict[str, Any] = {
            "type": "start", "v": VERSION, "t": time.time(), "run_id": self.run_id, "researcher": self.researcher,
            "surface": self.surface, "seed": seed, "owner": dataclasses.asdict(current_owner()),
            "scenario": scenario.model_dump(mode="json") if scenario is not None else None,
            "briefing": obs.get("log") if isinstance(obs, dict) else None,
        }
        if view is not None:
            start.update(episode_seed=view.seed, key=view.key_id,
                         harness={"version": view.harness_initial, "files": view.harness_files(view.harness_initial)})
            self._seen_datasets = set(view.datasets)
            self._seen_versions = set(view.harness_versions)
            self._seen_jobs = set(view.job_results)
        if self._recording:
            self._write([start])
        else:
            self._pending_start = start
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        started = time.perf_counter()
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        records = self._records(action, obs, info, time.perf_counter() - started)
        if self._recording:
            self._write(records)
        return obs, reward, terminated, truncated, info

    def _records(self, action: Any, obs: Any, info: dict[str, Any], seconds: float) -> list[dict[str, Any]]:
        now = time.time()
        tool, args = normalize_action(action)
        result = info.get("result")
        if isinstance(result, dict) and "preview" in result:  # the samples go with the dataset line
            result = {k: v for k, v in result.items() if k != "preview"}
        step: dict[str, Any] = {
            "type": "step", "t": now, "step": self.steps, "tool": info.get("tool", tool), "args": args,
            "ok": bool(info.get("ok", False)), "cost_usd": info.get("cost_usd"),
            "budget_left_usd": info.get("budget_left_usd"), "wall_s": round(seconds, 6), "result": result,
        }
        if not step["ok"]:
            step.update(error=info.get("error"), message=info.get("message"))
        if self._episode > 0:
            step["ep"] = self._episode  # a later episode of the same env (readers show the last one)
        if self._resumes:
            step["rs"] = self._resumes  # written after a resume
        if info.get("events"):
            step["events"] = info["events"]
        if isinstance(obs, dict):
            step["log"] = obs.get("log")
            if "dev_scores" in obs:
                dev = obs["dev_scores"]
                step["dev"] = [_score(v) for v in (dev.tolist() if isinstance(dev, np.ndarray) else list(dev))[:3]]
        out = [step]
        view = self.env.unwrapped.run_view()
        if view is None:
            return out
        now_s = view.world_s
        step.update(spent_usd=view.balance.spent_usd, reserved_usd=view.balance.reserved_usd, world_s=now_s,
                    running=[{"job": j, "kind": r.kind, "since_s": r.started_at, "eta_s": r.eta_s}
                             for j, r in view.running.items()])
        if len(view.datasets) != len(self._seen_datasets):
            for ds_id, ds in view.datasets.items():
                if ds_id not in self._seen_datasets:
                    self._seen_datasets.add(ds_id)
                    out.append({"type": "dataset", "t": now, "step": self.steps, **ds.model_dump(mode="json")})
        if len(view.harness_versions) != len(self._seen_versions):
            for version in view.harness_versions:
                if version not in self._seen_versions:
                    self._seen_versions.add(version)
                    out.append(self._harness_line(view, version, result, now))
        if len(view.job_results) != len(self._seen_jobs):
            for job_id, value in view.job_results.items():
                if job_id not in self._seen_jobs:
                    self._seen_jobs.add(job_id)
                    out.append({"type": "job", "t": now, "step": self.steps, "world_s": now_s, "job": job_id,
                                **job_payload(value)})
        if view.end_info is not None and not self._ended:
            self._ended = True
            out.append({"type": "end", "t": now, "step": self.steps, "info": _clean(dict(view.end_info))})
        return out

    def _harness_line(self, view: RunView, version: str, result: Any, now: float) -> dict[str, Any]:
        base = view.harness_initial
        if isinstance(result, dict) and result.get("version") == version and result.get("base_version"):
            base = result["base_version"]
        files, before = view.harness_files(version), view.harness_files(base)
        return {"type": "harness", "t": now, "step": self.steps, "version": version, "base_version": base,
                "files": {p: text for p, text in files.items() if before.get(p) != text},
                "removed": sorted(set(before) - set(files))}

    def close(self) -> None:
        self.close_file()
        self.env.close()


def _line(record: dict[str, Any]) -> bytes:
    """A record as its line; a step whose ``result`` is over :data:`RESULT_MAX_BYTES` gets it replaced by
    ``{"truncated": true, "bytes": n}`` (measured only for lines long enough to hold such a result)."""
    line = dumps(record)
    if record.get("type") == "step" and len(line) > RESULT_MAX_BYTES and record.get("result") is not None:
        size = len(dumps({"r": record["result"]}))
        if size > RESULT_MAX_BYTES:
            line = dumps({**record, "result": {"truncated": True, "bytes": size}})
    return line


def _heal(fd: int, path: Path) -> None:
    """Cut a torn last line (a crash mid-write) so the next line starts clean."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    with path.open("rb") as f:
        f.seek(max(0, size - 65536))
        tail = f.read()
    if tail.endswith(b"\n"):
        return
    cut = tail.rfind(b"\n")
    if cut < 0 and size > len(tail):
        os.write(fd, b"\n")  # a line longer than the tail: end it; the reader skips it as torn
        return
    os.truncate(path, size - len(tail) + cut + 1)


__all__ = ["RECORD_FILE", "RunRecorder", "dumps", "iter_lines", "job_payload", "normalize_action", "parse_line", "read_record"]
