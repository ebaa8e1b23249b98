"""Reading run directories for ``rsigym watch``: a run's whole story (:class:`RunState`) and its list row.

A run directory is read from its ``record.jsonl`` (:mod:`.record`) when it has one; older run
directories (``steps.jsonl`` of ``rsigym run`` or of the session service, ``result.json``,
``run.json``) show what those files hold: steps, spend, dev scores from evaluation events, the end.

:class:`RunState` is fed one record line at a time (:meth:`RunState.feed`), so a growing file is
read only from where the last read stopped (:class:`RunReader`). The list row of a run
(:func:`summary_of`) needs only the first line and the last lines of a record: :func:`quick_summary`
reads just those, which keeps a list of thousands of runs fast.

>>> import gymnasium as gym, tempfile, rsigym_env
>>> from rsigym_env.watch.record import RunRecorder
>>> d = tempfile.mkdtemp()
>>> env = RunRecorder(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=50), d, researcher="me")
>>> _ = env.reset(seed=0)
>>> _ = env.step({"tool": "evaluate", "args": {"k": 1, "n_tasks": 5}}); _ = env.step({"tool": "wait", "args": {}})
>>> env.close()
>>> state = RunReader(d).state()
>>> len(state.steps), state.jobs["job-1"]["status"], list(state.candidates) == [f"base + {state.meta['harness_version']}"]
(2, 'finished', True)
>>> row = summary_of(d, stall_after_s=60)
>>> row["status"], row["researcher"], row["steps"], row["best_dev"] == state.best_dev
('running', 'me', 2, True)
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from ..owners import Owner, owner_status
from ..rundir import RECORD_FILE, RESULT_FILE, RUN_FILE, STEPS_FILE
from .record import iter_lines, normalize_action, parse_line

STALL_AFTER_S = 300.0
"""Default: a running run with no step for this long is shown as stalled."""

MARKERS = (RECORD_FILE, STEPS_FILE, RUN_FILE, RESULT_FILE)
JOB_TOOLS = {"evaluate": "evaluate", "train": "train", "generate_data": "dataset", "transform_data": "dataset",
             "submit": "submit"}


def stat_sig(path: str | os.PathLike[str]) -> tuple[int, int, int] | None:
    """``(inode, size, mtime_ns)`` of a file, or ``None`` if it does not exist."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def signature(run_dir: str | os.PathLike[str], dir_mtime_ns: int | None = None) -> tuple[Any, ...]:
    """What changes whenever anything the watcher shows of a run changes: the stats of its record (or
    steps log), which grows with every step, and the directory's mtime, which moves when ``run.json``
    is replaced or ``result.json`` appears. Two ``stat`` calls."""
    base = os.fspath(run_dir)
    main = stat_sig(os.path.join(base, RECORD_FILE))
    if main is None:
        main = stat_sig(os.path.join(base, STEPS_FILE))
    if dir_mtime_ns is None:
        try:
            dir_mtime_ns = os.stat(base).st_mtime_ns
        except OSError:
            dir_mtime_ns = None
    return (main, dir_mtime_ns)


def _load_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            value = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _owner(value: Any) -> Owner | None:
    if not isinstance(value, dict):
        return None
    try:
        return Owner(int(value["pid"]), value.get("start"), value.get("boot_id"), str(value.get("host", "")),
                     value.get("pid_ns"))
    except (KeyError, TypeError, ValueError):
        return None


def legacy_line(line: dict[str, Any]) -> dict[str, Any]:
    """A ``steps.jsonl`` line (``{"step", "action", "info", "log"?}``) as a record ``step`` line."""
    info = line.get("info") or {}
    tool, args = normalize_action(line.get("action"))
    out = {"type": "step", "step": line.get("step"), "tool": info.get("tool", tool), "args": args,
           "ok": bool(info.get("ok", False)), "cost_usd": info.get("cost_usd"),
           "budget_left_usd": info.get("budget_left_usd"), "result": info.get("result"),
           "events": info.get("events") or [], "log": line.get("log"), "legacy": True}
    if not out["ok"]:
        out.update(error=info.get("error"), message=info.get("message"))
    if "normalized_gain" in info:
        out["end"] = {k: v for k, v in info.items() if k not in ("tool", "ok", "result", "events")}
    return out


def args_text(tool: str | None, args: Any, limit: int = 160) -> str:
    """A one-line rendering of a call's arguments.

    >>> args_text("evaluate", {"checkpoint": "base", "k": 1, "n_tasks": None})
    'checkpoint=base k=1'
    """
    if not isinstance(args, dict):
        text = str(args)
    else:
        parts = []
        for k, v in args.items():
            if v is None:
                continue
            if isinstance(v, str):
                v = v if len(v) <= 60 else v[:57] + "..."
                parts.append(f"{k}={v}" if v and " " not in v else f"{k}={json.dumps(v)}")
            else:
                parts.append(f"{k}={json.dumps(v, default=str)}")
        text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class RunState:
    """Everything a run's page shows, built by feeding record lines in order (see the module docstring)."""

    meta: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[int, str] = field(default_factory=dict)
    datasets: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    candidates: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    end: dict[str, Any] | None = None
    owner: dict[str, Any] | None = None
    last_t: float | None = None
    legacy: bool = False
    _spent: float = 0.0
    _best: float | None = None

    # ---------------------------------------------------------------- feeding

    def feed(self, rec: dict[str, Any]) -> None:
        kind = rec.get("type")
        if isinstance(rec.get("t"), (int, float)):
            self.last_t = float(rec["t"])
        if kind == "start":
            t = self.last_t
            self.__init__()  # type: ignore[misc]  # a new episode: start over
            self.last_t = t
            self.meta = {k: v for k, v in rec.items() if k not in ("type", "harness")}
            self.owner = rec.get("owner")
            harness = rec.get("harness") or {}
            self.meta["harness_version"] = harness.get("version")
            if harness.get("version"):
                self.versions[harness["version"]] = {"version": harness["version"], "base_version": None, "step": 0,
                                                     "changed": sorted(harness.get("files") or {}), "removed": [],
                                                     "files": dict(harness.get("files") or {}), "initial": True}
        elif kind == "resume":
            self.owner = rec.get("owner") or self.owner
            after = int(rec.get("after_step") or 0)
            self._truncate(after)
        elif kind == "step":
            self._step(rec)
        elif kind == "dataset":
            self.datasets[str(rec.get("id"))] = {k: v for k, v in rec.items() if k != "type"}
        elif kind == "harness":
            self._harness(rec)
        elif kind == "job":
            self._job_end(rec)
        elif kind == "end":
            self.end = rec.get("info") or {}

    def _truncate(self, after: int) -> None:
        """Drop what was recorded after step ``after`` (never confirmed; see ``resume`` lines)."""
        if not self.steps or self.steps[-1]["step"] <= after:
            return
        self.steps = [s for s in self.steps if s["step"] <= after]
        self.logs = {n: text for n, text in self.logs.items() if n <= after}
        self.datasets = {k: v for k, v in self.datasets.items() if (v.get("step") or 0) <= after}
        self.versions = {k: v for k, v in self.versions.items() if (v.get("step") or 0) <= after}
        self.jobs = {k: v for k, v in self.jobs.items() if (v.get("started_step") or 0) <= after}
        self.candidates = {k: kept for k, v in self.candidates.items() if (kept := [c for c in v if c["step"] <= after])}
        self.end = None
        self._spent = float(self.steps[-1].get("spent_usd") or 0.0) if self.steps else 0.0
        scores = [c["score"] for v in self.candidates.values() for c in v]
        self._best = max(scores) if scores else None

    def _step(self, rec: dict[str, Any]) -> None:
        n = int(rec.get("step") or len(self.steps) + 1)
        if self.steps and n <= self.steps[-1]["step"]:
            self._truncate(n - 1)  # the same step again (a resume without a resume line): keep the later one
        log = rec.get("log")
        if isinstance(log, str):
            self.logs[n] = log
        cost = _float(rec.get("cost_usd")) or 0.0
        if rec.get("spent_usd") is None:
            self._spent += cost
            spent = self._spent
        else:
            spent = self._spent = float(rec["spent_usd"])
        world_s = _float(rec.get("world_s"))
        step = {k: v for k, v in rec.items() if k not in ("type", "log", "end")}
        step.update(step=n, spent_usd=spent, cost_usd=cost, has_log=isinstance(log, str), world_s=world_s,
                    args_text=args_text(rec.get("tool"), rec.get("args")))
        result = rec.get("result") if isinstance(rec.get("result"), dict) else {}
        tool = rec.get("tool")
        if rec.get("ok") and "job" in result:
            kind = JOB_TOOLS.get(str(tool), str(tool))
            self.jobs[str(result["job"])] = {
                "id": str(result["job"]), "kind": kind, "tool": tool, "status": "running", "started_step": n,
                "started_world_s": world_s, "args": rec.get("args"), "args_text": step["args_text"],
                "quote_usd": result.get("quote_usd"), "eta_s": result.get("eta_s"),
                "target": result.get("checkpoint") or result.get("dataset")}
        if rec.get("ok") and tool in ("generate_data", "transform_data") and "n_examples" in result:
            self.datasets.setdefault(str(result.get("id")), {**result, "step": n})  # older runs: from the result
        if rec.get("ok") and tool == "edit_harness" and result.get("version") and result["version"] not in self.versions:
            self.versions[result["version"]] = {"version": result["version"], "base_version": result.get("base_version"),
                                                "step": n, "changed": [result.get("path")], "removed": [],
                                                "files": None}  # older runs: no contents
        for event in rec.get("events") or []:
            if not isinstance(event, dict) or "job" not in event:
                continue
            job = self.jobs.setdefault(str(event["job"]), {"id": str(event["job"]), "kind": event.get("kind"),
                                                           "started_step": None})
            job.update(status="finished" if event.get("ok") else "failed", ended_step=n, ended_world_s=world_s,
                       event={k: v for k, v in event.items() if k != "text"}, text=event.get("text"))
            if event.get("cost_usd") is not None:
                job["cost_usd"] = event["cost_usd"]
            if event.get("kind") == "evaluate" and event.get("ok") and event.get("score") is not None:
                name = f"{event.get('checkpoint')} + {event.get('harness')}"
                score = float(event["score"])
                self.candidates.setdefault(name, []).append({"step": n, "world_s": world_s, "score": score,
                                                             "job": event["job"]})
                self._best = score if self._best is None else max(self._best, score)
        running = {r.get("job") for r in rec.get("running") or [] if isinstance(r, dict)}
        for job_id in running:
            if job_id in self.jobs:
                self.jobs[job_id]["status"] = "running"
        dev = rec.get("dev")
        if not (isinstance(dev, list) and len(dev) == 3):
            dev = [None, self._best, None]
        step["dev"] = dev
        self.steps.append(step)
        if rec.get("end"):
            self.end = rec["end"]

    def _harness(self, rec: dict[str, Any]) -> None:
        base = rec.get("base_version")
        files = dict((self.versions.get(base) or {}).get("files") or {})
        for path in rec.get("removed") or []:
            files.pop(path, None)
        files.update(rec.get("files") or {})
        self.versions[str(rec.get("version"))] = {"version": rec.get("version"), "base_version": base,
                                                  "step": rec.get("step"), "changed": sorted(rec.get("files") or {}),
                                                  "removed": list(rec.get("removed") or []), "files": files}

    def _job_end(self, rec: dict[str, Any]) -> None:
        job_id = str(rec.get("job"))
        job = self.jobs.setdefault(job_id, {"id": job_id, "kind": rec.get("kind"), "started_step": None})
        payload = {k: v for k, v in rec.items() if k not in ("type", "t", "job")}
        job["result"] = payload
        if payload.get("kind") and (job.get("kind") is None or payload["kind"] != "dataset"):
            job["kind"] = payload["kind"]
        if payload.get("ok"):
            job["status"] = "finished"
        else:
            job["status"] = "cancelled" if str(payload.get("error", "")).startswith("cancelled") else "failed"
            job["error"] = payload.get("error")
        job.setdefault("ended_step", rec.get("step"))
        job.setdefault("ended_world_s", rec.get("world_s"))
        if payload.get("cost_usd") is not None:
            job["cost_usd"] = payload["cost_usd"]

    # ---------------------------------------------------------------- views

    @property
    def scenario(self) -> dict[str, Any]:
        return self.meta.get("scenario") or {}

    @property
    def best_dev(self) -> float | None:
        if self.end and self.end.get("best_dev_score") is not None:
            return float(self.end["best_dev_score"])
        if self.steps and self.steps[-1]["dev"][1] is not None:
            return float(self.steps[-1]["dev"][1])
        return self._best

    def harness_diff(self, a: str, b: str) -> list[dict[str, Any]] | None:
        """Per file, the unified diff from version ``a`` to ``b`` (``None`` if either has no contents)."""
        va, vb = self.versions.get(a), self.versions.get(b)
        if not va or not vb or va.get("files") is None or vb.get("files") is None:
            return None
        return diff_files(va["files"], vb["files"], a, b)


def diff_files(before: dict[str, str], after: dict[str, str], a: str = "a", b: str = "b") -> list[dict[str, Any]]:
    """``[{"path", "lines": [(kind, text)]}]`` for every file that differs; kind is ``+ - @ =`` or ``h``.

    >>> diff_files({"x": "1\\n2\\n"}, {"x": "1\\n3\\n"})[0]["lines"][-2:]
    [('-', '-2'), ('+', '+3')]
    """
    out = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        lines = []
        for line in difflib.unified_diff((old or "").splitlines(), (new or "").splitlines(),
                                         f"{a}/{path}" if old is not None else "/dev/null",
                                         f"{b}/{path}" if new is not None else "/dev/null", lineterm=""):
            kind = "h" if line.startswith(("---", "+++")) else line[:1] if line[:1] in "+-@" else "="
            lines.append((kind, line))
        out.append({"path": path, "lines": lines, "added": old is None, "removed": new is None})
    return out


class RunReader:
    """A run directory read incrementally: :meth:`state` parses only what was appended since last time.

    A file that shrank or was replaced (another inode) is read again from the start.
    """

    def __init__(self, run_dir: str | os.PathLike[str]):
        self.run_dir = Path(run_dir)
        self._state = RunState()
        self._source: str | None = None
        self._offset = 0
        self._ino: int | None = None
        self._lock = threading.Lock()
        self._extra_sig: tuple[Any, ...] | None = None
        self.result: dict[str, Any] | None = None
        self.run_json: dict[str, Any] | None = None

    def state(self) -> RunState:
        with self._lock:
            record = self.run_dir / RECORD_FILE
            source = RECORD_FILE if record.exists() else STEPS_FILE
            path = self.run_dir / source
            sig = stat_sig(path)
            if source != self._source or sig is None or sig[0] != self._ino or sig[1] < self._offset:
                self._state, self._offset, self._source, self._ino = RunState(), 0, source, sig[0] if sig else None
                self._state.legacy = source == STEPS_FILE
            if sig is not None and sig[1] > self._offset:
                with path.open("rb") as f:
                    f.seek(self._offset)
                    data = f.read(sig[1] - self._offset)
                end = data.rfind(b"\n") + 1
                convert: Callable[[dict[str, Any]], dict[str, Any]] = legacy_line if source == STEPS_FILE else _same
                for rec in iter_lines(data[:end]):
                    self._state.feed(convert(rec))
                self._offset += end
            if self._state.legacy and sig is not None:
                self._state.last_t = sig[2] / 1e9
            extra = (stat_sig(self.run_dir / RESULT_FILE), stat_sig(self.run_dir / RUN_FILE))
            if extra != self._extra_sig:
                self._extra_sig = extra
                self.result = _load_json(self.run_dir / RESULT_FILE)
                self.run_json = _load_json(self.run_dir / RUN_FILE)
            return self._state


def _same(rec: dict[str, Any]) -> dict[str, Any]:
    return rec


# ------------------------------------------------------------------------------------------ the list row


def _head_line(f: Any, limit: int = 16 << 20) -> dict[str, Any] | None:
    """The first line of an open file as JSON (``None`` if it is not complete within ``limit`` bytes)."""
    f.seek(0)
    chunk = b""
    while b"\n" not in chunk and len(chunk) < limit:
        more = f.read(65536 if not chunk else len(chunk))
        if not more:
            return None
        chunk += more
    line = chunk.split(b"\n", 1)[0]
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def backwards(f: Any, size: int, chunk: int = 16384) -> Iterator[dict[str, Any]]:
    """The complete JSON lines of an open file, last first, read in growing chunks from its end (a
    torn last line, with no newline after it, is skipped)."""
    pos, carry, first = size, b"", True
    while pos > 0:
        start = max(0, pos - chunk)
        f.seek(start)
        data = f.read(pos - start) + carry
        pos = start
        parts = data.split(b"\n")
        if first:
            parts.pop()  # what follows the last newline: empty, or a torn line
            first = False
        carry = parts.pop(0) if pos > 0 else b""
        for line in reversed(parts):
            value = parse_line(line)
            if value is not None:
                yield value
        chunk = min(chunk * 4, 16 << 20)


def quick_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The facts of a record file the list needs, read from its end back to its last step, and its first
    line; ``None`` where that is not enough (a second episode, a resumed run): then read it all."""
    try:
        f = open(os.path.join(os.fspath(run_dir), RECORD_FILE), "rb")
    except OSError:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return None
        last_step, end, last_t, start = None, None, None, None
        for rec in backwards(f, size):
            kind = rec.get("type")
            if last_t is None and isinstance(rec.get("t"), (int, float)):
                last_t = rec["t"]
            if kind == "step":
                if rec.get("ep") or rec.get("rs"):
                    return None
                last_step = rec
                break
            if kind == "end":
                end = rec.get("info")
            elif kind == "resume":
                return None
            elif kind == "start":
                start = rec
                break
        if start is None:
            start = _head_line(f)
            if start is None or start.get("type") != "start":
                return None
    return {"meta": start, "last_step": last_step, "end": end, "last_t": last_t if last_t is not None else start.get("t")}


def result_summary(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the list needs of a finished older run, from its ``result.json`` alone."""
    info = (result or {}).get("info") or {}
    if "normalized_gain" not in info:
        return None
    meta = {"researcher": result.get("researcher"), "seed": result.get("seed"),
            "scenario": {"name": result.get("scenario")}, "surface": "rsigym run"}
    last = {"step": result.get("steps"), "spent_usd": info.get("spend_usd"), "dev": [None, info.get("best_dev_score"), None]}
    return {"meta": meta, "last_step": last, "end": info}


@functools.lru_cache(maxsize=256)
def bundled_scenario(name: str) -> dict[str, Any]:
    """A bundled scenario's fields by name (``{}`` if there is none): what an older record left out.

    >>> bundled_scenario("sim-joint-aime-500")["benchmark"], bundled_scenario("nope")
    ('aime', {})
    """
    from ..scenario import list_scenarios, load_scenario

    try:
        if name not in list_scenarios():
            return {}
        s = load_scenario(name)
    except (ValueError, KeyError, OSError):
        return {}
    return {"name": s.name, "track": s.track, "world": s.world, "benchmark": s.benchmark, "budget_usd": s.budget_usd,
            "max_steps": s.max_steps, "time_limit_h": s.time_limit_h}


def _status(ended: bool, state: str | None, code: str | None, owner: dict[str, Any] | None, last_t: float | None,
            stall_after_s: float, now: float, error: str | None = None) -> tuple[str, str]:
    """``(status, note)``: running / finished / failed / stalled and why."""
    if ended:
        return "finished", ""
    if error:
        return "failed", error
    if state in ("closed", "interrupted"):
        return "failed", f"{state}" + (f" ({code})" if code else "")
    if owner is not None and state != "active":
        alive = owner_status(_owner(owner))
        if alive == "gone":
            return "failed", "its process is gone"
    idle = None if last_t is None else max(0.0, now - last_t)
    if idle is not None and idle > stall_after_s:
        return "stalled", f"no step for {duration(idle)}"
    return "running", ""


def duration(seconds: float) -> str:
    """``42 s``, ``3 min``, ``2.5 h``, ``4.0 d``.

    >>> duration(42), duration(200), duration(9000), duration(400000)
    ('42 s', '3 min', '2.5 h', '4.6 d')
    """
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _row(run_dir: Path, meta: dict[str, Any], last_step: dict[str, Any] | None, end: dict[str, Any] | None,
         last_t: float | None, owner: dict[str, Any] | None, result: dict[str, Any] | None,
         run_json: dict[str, Any] | None, best_dev: float | None, spent: float | None,
         stall_after_s: float, now: float) -> dict[str, Any]:
    scenario = dict(meta.get("scenario") or {})
    if not scenario and run_json:
        scenario = run_json.get("scenario") or {}
    if result and not scenario.get("name"):
        scenario["name"] = result.get("scenario")
    if scenario.get("name") and not scenario.get("world"):
        scenario = {**bundled_scenario(str(scenario["name"])), **scenario}
    if end is None and result and "normalized_gain" in (result.get("info") or {}):
        end = result["info"]
    if end is None and run_json and run_json.get("end"):
        end = run_json["end"]
    budget = _float(scenario.get("budget_usd")) or _float((end or {}).get("budget_usd"))
    if spent is None and last_step is not None:
        spent = _float(last_step.get("spent_usd"))
    if end and end.get("spend_usd") is not None:
        spent = float(end["spend_usd"])
    reserved = _float((last_step or {}).get("reserved_usd")) if not end else 0.0
    researcher = meta.get("researcher") or (run_json or {}).get("label") or (result or {}).get("researcher")
    state = (run_json or {}).get("state")
    status, note = _status(bool(end), state, (run_json or {}).get("code"), owner, last_t, stall_after_s, now)
    steps = int((last_step or {}).get("step") or 0)
    if run_json and not last_step:
        steps = int(run_json.get("steps") or 0)
    return {
        "key": run_dir.name, "kind": "run", "path": str(run_dir), "scenario": scenario.get("name") or run_dir.name,
        "track": scenario.get("track"), "world": scenario.get("world"), "benchmark": scenario.get("benchmark"),
        "researcher": researcher or "?", "seed": meta.get("seed", (result or {}).get("seed", (run_json or {}).get("seed"))),
        "surface": meta.get("surface") or ("rsigym serve" if run_json else "rsigym run" if result else None),
        "status": status, "status_note": note, "state": state, "steps": steps,
        "max_steps": scenario.get("max_steps"), "spent_usd": spent, "reserved_usd": reserved, "budget_usd": budget,
        "spend_frac": (spent / budget) if spent is not None and budget else None,
        "best_dev": best_dev, "official": _float((end or {}).get("official_score")),
        "initial": _float((end or {}).get("initial_score")), "gain": _float((end or {}).get("normalized_gain")),
        "end_reason": (end or {}).get("end_reason"), "started_t": meta.get("t"), "last_t": last_t,
        "source": "record" if meta.get("type") == "start" else "steps", "owner": owner,
    }


def summary_of(run_dir: str | os.PathLike[str], stall_after_s: float = STALL_AFTER_S, *,
               reader: RunReader | None = None, now: float | None = None,
               make_reader: Callable[[Path], RunReader] | None = None,
               names: frozenset[str] | None = None) -> dict[str, Any]:
    """The list row of a run directory: from the record's ends (or an older run's ``result.json``) when
    they say enough, else from its whole state (``reader``, incremental, when given). The row's
    ``owner`` is the process that writes the run (for :func:`refresh_status`); ``make_reader`` gives the
    (kept, incremental) reader of a run that needs the whole read; ``names``, the directory's file names
    if the caller has listed it (files not in it are not opened)."""
    base = os.fspath(run_dir)
    now = time.time() if now is None else now

    def load(name: str) -> dict[str, Any] | None:
        return None if names is not None and name not in names else _load_json(os.path.join(base, name))

    result, run_json = load(RESULT_FILE), load(RUN_FILE)
    has_record = RECORD_FILE in names if names is not None else os.path.exists(os.path.join(base, RECORD_FILE))
    run_dir = Path(base)
    quick = quick_summary(run_dir) if has_record else result_summary(result)
    if quick is not None:
        last = quick["last_step"]
        dev = (last or {}).get("dev") or [None, None, None]
        best = (quick["end"] or {}).get("best_dev_score", dev[1] if len(dev) > 1 else None)
        last_t = quick.get("last_t")
        if last_t is None:
            sig = stat_sig(os.path.join(base, STEPS_FILE))
            last_t = sig[2] / 1e9 if sig else None
        return _row(run_dir, {**quick["meta"], "type": "start" if has_record else None}, last, quick["end"], last_t,
                    quick["meta"].get("owner"), result, run_json, _float(best), None, stall_after_s, now)
    reader = reader or (make_reader(run_dir) if make_reader is not None else RunReader(run_dir))
    state = reader.state()
    last = state.steps[-1] if state.steps else None
    meta = {**state.meta, "type": "start" if not state.legacy else None}
    return _row(run_dir, meta, last, state.end, state.last_t, state.owner, result, run_json, state.best_dev,
                last["spent_usd"] if last else None, stall_after_s, now)


def refresh_status(row: dict[str, Any], stall_after_s: float, now: float) -> dict[str, Any]:
    """``row`` with its status recomputed for ``now`` (time passes: a running run may become stalled)."""
    if row["status"] in ("finished", "failed"):
        return row
    status, note = _status(False, row.get("state"), None, row.get("owner"), row.get("last_t"),
                           stall_after_s, now)
    if (status, note) == (row["status"], row["status_note"]):
        return row
    return {**row, "status": status, "status_note": note}


def is_run_dir(path: Path) -> bool:
    return any((path / name).is_file() for name in (RECORD_FILE, STEPS_FILE, RUN_FILE))


__all__ = ["RunReader", "RunState", "STALL_AFTER_S", "diff_files", "duration", "quick_summary",
           "signature", "summary_of"]
