"""What ``rsigym watch`` watches: run and sweep directories under its roots, and live service runs.

:class:`Catalog` scans its roots (at most once per ``scan_interval_s``), keeps each run's list row
cached by the stats of its files (a run whose files did not change costs four ``stat`` calls per
scan), recomputes statuses as time passes (running → stalled) and numbers every change with a
generation, so a live page asks only for the rows that changed since the generation it has.

Live runs of a session service come from a :class:`ServiceSource` (the service in this process)
or a :class:`URLSource` (``GET /v1/runs`` of ``rsigym serve`` with the admin token); a live run
whose directory is also watched is shown once, with the service's state over it.

>>> import gymnasium as gym, tempfile, rsigym_env
>>> from rsigym_env.baselines import make_researcher
>>> from rsigym_env.episode import run_episode
>>> from rsigym_env.watch.record import RunRecorder
>>> root = tempfile.mkdtemp()
>>> env = RunRecorder(gym.make("RSIGym/Joint-v0", benchmark="aime"), f"{root}/r1", researcher="scripted")
>>> _ = run_episode(env, make_researcher("scripted"), seed=0); env.close()
>>> catalog = Catalog([root])
>>> [(r["key"], r["status"]) for r in catalog.rows()]
[('r1', 'finished')]
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol

from .model import MARKERS, STALL_AFTER_S, RunReader, refresh_status, signature, stat_sig, summary_of
from .sweeps import RESULTS_FILE, load_sweep, sweep_row

RUN_MARKERS = frozenset(MARKERS[:3])  # record.jsonl, steps.jsonl, run.json


class LiveSource(Protocol):
    """Runs a session service knows: ``GET /v1/runs`` rows (``run_id``, ``state``, ``steps``, ``balance``...)."""

    error: str | None

    def runs(self) -> list[dict[str, Any]]: ...


class ServiceSource:
    """The runs of a :class:`~rsigym_env.gateway.service.SessionService` in this process."""

    def __init__(self, service: Any):
        self.service = service
        self.error: str | None = None

    def runs(self) -> list[dict[str, Any]]:
        return list(self.service.list_runs())


class URLSource:
    """The runs of ``rsigym serve`` at ``url`` (admin token), fetched at most once per ``ttl_s``."""

    def __init__(self, url: str, admin_token: str, *, timeout_s: float = 2.0, ttl_s: float = 1.0):
        self.url, self.timeout_s, self.ttl_s = url.rstrip("/"), timeout_s, ttl_s
        self._headers = {"Authorization": f"Bearer {admin_token}"}
        self._cache: tuple[float, list[dict[str, Any]]] = (0.0, [])
        self.error: str | None = None

    def runs(self) -> list[dict[str, Any]]:
        import httpx

        at, rows = self._cache
        if time.monotonic() - at < self.ttl_s:
            return rows
        try:
            reply = httpx.get(f"{self.url}/v1/runs", headers=self._headers, timeout=self.timeout_s)
            reply.raise_for_status()
            rows = list(reply.json()["runs"])
            self.error = None
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self.error = f"{self.url}: {type(exc).__name__}: {exc}"[:300]
            rows = []
        self._cache = (time.monotonic(), rows)
        return rows


@dataclass
class Entry:
    key: str
    kind: str  # "run" | "sweep" | "live"
    path: Path | None


def live_row(run: dict[str, Any], stall_after_s: float, now: float) -> dict[str, Any]:
    """A service's run summary as a list row."""
    balance = run.get("balance") or {}
    state = run.get("state")
    idle = run.get("idle_s")
    last_t = now - float(idle) if idle is not None else None
    if state == "done":
        status, note = "finished", ""
    elif state in ("closed", "interrupted"):
        status, note = "failed", f"{state}" + (f" ({run['code']})" if run.get("code") else "")
    elif idle is not None and idle > stall_after_s:
        from .model import duration

        status, note = "stalled", f"no step for {duration(float(idle))}"
    else:
        status, note = "running", ""
    budget = run.get("budget_usd")
    spent = balance.get("spent_usd")
    return {"key": str(run.get("run_id")), "kind": "live", "path": None, "scenario": run.get("scenario") or "?",
            "track": run.get("track"), "world": run.get("world"), "benchmark": run.get("benchmark"),
            "researcher": run.get("label") or "?", "seed": run.get("seed"), "surface": "rsigym serve",
            "status": status, "status_note": note, "state": state, "steps": int(run.get("steps") or 0),
            "max_steps": None, "spent_usd": spent, "reserved_usd": balance.get("reserved_usd"), "budget_usd": budget,
            "spend_frac": spent / budget if spent is not None and budget else None, "best_dev": None,
            "official": None, "initial": None, "gain": run.get("reward"), "end_reason": None, "started_t": None,
            "last_t": last_t, "source": "service"}


class Catalog:
    """Run and sweep directories at or under ``roots`` (two levels deep), plus live service runs.

    Args:
        roots: run directories, sweep directories, or folders holding them (``runs/``, a service's
            state directory, ``bench/``).
        stall_after_s: a running run with no step for this long is shown as stalled.
        scan_interval_s: the folders are listed and the files checked at most this often.
        live: a :class:`LiveSource` (a service in this process or at a URL).
    """

    def __init__(self, roots: Iterable[str | Path], *, stall_after_s: float = STALL_AFTER_S,
                 scan_interval_s: float = 1.0, live: LiveSource | None = None):
        self.roots = [Path(r) for r in roots]
        self.stall_after_s = float(stall_after_s)
        self.scan_interval_s = scan_interval_s
        self.live = live
        self.generation = 0
        self._lock = threading.RLock()
        self._scanned_at = -1e18
        self._entries: dict[str, Entry] = {}
        self._rows: dict[str, tuple[Any, dict[str, Any], int]] = {}  # key -> (signature, row, generation)
        self._sweeps: dict[str, tuple[Any, dict[str, Any] | None, str | None]] = {}
        self._readers: dict[Path, RunReader] = {}
        self._kinds: dict[str, tuple[int | None, str | None, frozenset[str] | None]] = {}  # dir -> (mtime, kind, names)
        self._paths: dict[str, Path] = {}

    # ------------------------------------------------------------------ scanning

    def _scan_dirs(self) -> dict[str, tuple[Entry, int | None, frozenset[str] | None]]:
        """Every run and sweep directory with its mtime; a directory whose mtime did not move keeps the
        kind found before (one ``stat`` per directory; only folders that are neither are listed)."""
        entries: dict[str, tuple[Entry, int | None, frozenset[str] | None]] = {}
        seen: set[str] = set()

        def add(kind: str, path: str, mtime: int | None, names: frozenset[str] | None) -> None:
            name = os.path.basename(path.rstrip("/")) or "run"
            key, n = name, 2
            while key in entries:
                key, n = f"{name}~{n}", n + 1
            p = self._paths.get(path)
            if p is None:
                p = self._paths[path] = Path(path)
            entries[key] = (Entry(key, kind, p), mtime, names)

        def walk(path: str, left: int, mtime: int | None) -> None:
            if path in seen:
                return
            seen.add(path)
            cached = self._kinds.get(path)
            if cached is not None and cached[0] == mtime and mtime is not None:
                kind, names = cached[1], cached[2]
            else:
                try:
                    listed = frozenset(os.listdir(path))
                except OSError:
                    return
                kind = "sweep" if RESULTS_FILE in listed else "run" if listed & RUN_MARKERS else None
                names = listed if kind == "run" else None
                self._kinds[path] = (mtime, kind, names)
            if kind is not None:
                add(kind, path, mtime, names)
                return
            if left <= 0:
                return
            try:
                children = sorted((e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)), key=lambda e: e.name)
            except OSError:
                return
            for child in children:
                try:
                    child_mtime: int | None = child.stat(follow_symlinks=False).st_mtime_ns
                except OSError:
                    continue
                walk(child.path, left - 1, child_mtime)

        for root in self.roots:
            try:
                mtime: int | None = os.stat(root).st_mtime_ns
            except OSError:
                continue
            walk(os.fspath(root), 2, mtime)
        return entries

    def refresh(self, force: bool = False) -> int:
        """Rescan if the last scan is older than ``scan_interval_s``; the generation afterwards."""
        with self._lock:
            if not force and time.monotonic() - self._scanned_at < self.scan_interval_s:
                return self.generation
            self._scanned_at = time.monotonic()
            now = time.time()
            found = self._scan_dirs()
            entries = {k: e for k, (e, _, _) in found.items()}
            changed = False
            live = {}
            if self.live is not None:
                live = {str(r.get("run_id")): r for r in self.live.runs()}
            for key in [k for k in self._rows if k not in entries and k not in live]:
                del self._rows[key]
                changed = True
            for key, (entry, mtime, names) in found.items():
                assert entry.path is not None
                if entry.kind == "sweep":
                    self._sweep_entry(key, entry.path)
                    continue
                sig = signature(entry.path, mtime)
                old = self._rows.get(key)
                if old is not None and old[0] == sig:
                    row = refresh_status(old[1], self.stall_after_s, now)
                else:
                    row = summary_of(entry.path, self.stall_after_s, reader=self._readers.get(entry.path), now=now,
                                     make_reader=self._keep_reader, names=names)
                if key in live:
                    row = self._overlay(row, live.pop(key), now)
                changed |= self._put(key, sig, row, old)
            for key, run in live.items():
                entries[key] = Entry(key, "live", None)
                old = self._rows.get(key)
                changed |= self._put(key, None, live_row(run, self.stall_after_s, now), old)
            for key in [k for k in self._sweeps if k not in entries]:
                del self._sweeps[key]
                changed = True
            if set(entries) != set(self._entries):
                changed = True
            self._entries = entries
            if changed:
                self.generation += 1
                for key, (sig, row, gen) in self._rows.items():
                    if gen < 0:
                        self._rows[key] = (sig, row, self.generation)
            return self.generation

    def _put(self, key: str, sig: Any, row: dict[str, Any], old: tuple[Any, dict[str, Any], int] | None) -> bool:
        if old is not None and old[1] == row:
            self._rows[key] = (sig, old[1], old[2])  # the same object: pages keep what they rendered of it
            return False
        self._rows[key] = (sig, row, -1)  # stamped with the new generation at the end of the scan
        return True

    def _overlay(self, row: dict[str, Any], run: dict[str, Any], now: float) -> dict[str, Any]:
        """A watched run directory that a live service also reports: the service's state wins."""
        live = live_row(run, self.stall_after_s, now)
        out = {**row, "state": live["state"]}
        if row["status"] != "finished":
            out.update(status=live["status"], status_note=live["status_note"])
        if (live["steps"] or 0) > (row["steps"] or 0):
            out.update(steps=live["steps"], spent_usd=live["spent_usd"], reserved_usd=live["reserved_usd"],
                       spend_frac=live["spend_frac"])
        return out

    def _sweep_entry(self, key: str, path: Path) -> None:
        sig = stat_sig(path / RESULTS_FILE)
        old = self._sweeps.get(key)
        if old is not None and old[0] == sig:
            return
        try:
            row, error = sweep_row(key, path, load_sweep(path)), None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            row, error = None, f"{type(exc).__name__}: {exc}"
        self._sweeps[key] = (sig, row, error)
        self.generation += 1

    # ------------------------------------------------------------------ views

    def rows(self, since: int | None = None) -> list[dict[str, Any]]:
        """Every run's list row, newest first (only rows changed after generation ``since``, if given)."""
        self.refresh()
        with self._lock:
            items = list(self._rows.values())
        rows = [row for _, row, gen in items if since is None or gen > since]
        return sorted(rows, key=lambda r: (r.get("started_t") or r.get("last_t") or 0.0, r["key"]), reverse=True)

    def keys(self) -> set[str]:
        with self._lock:
            return set(self._rows)

    def sweeps(self) -> list[dict[str, Any]]:
        self.refresh()
        with self._lock:
            return [row for _, row, _ in self._sweeps.values() if row is not None]

    def entry(self, key: str) -> Entry | None:
        """The watched directory called ``key`` (a key not seen yet makes the folders be listed again)."""
        self.refresh()
        with self._lock:
            found = self._entries.get(key)
        if found is None and time.monotonic() - self._scanned_at > 0.2:
            self.refresh(force=True)
            with self._lock:
                found = self._entries.get(key)
        return found

    def _keep_reader(self, path: Path) -> RunReader:
        with self._lock:
            reader = self._readers.get(path)
            if reader is None:
                reader = self._readers[path] = RunReader(path)
                while len(self._readers) > 256:  # pages seldom open at once; keep memory bounded
                    self._readers.pop(next(iter(self._readers)))
            return reader

    def reader(self, key: str) -> RunReader | None:
        """The incremental reader of a watched run directory (kept for later calls)."""
        entry = self.entry(key)
        if entry is None or entry.kind != "run" or entry.path is None:
            return None
        return self._keep_reader(entry.path)

    def row(self, key: str) -> dict[str, Any] | None:
        self.refresh()
        with self._lock:
            found = self._rows.get(key)
        return found[1] if found else None

    def live_run(self, key: str) -> dict[str, Any] | None:
        """The live service's summary of a run (``None`` without a live source or if it has no such run)."""
        if self.live is None:
            return None
        return next((r for r in self.live.runs() if str(r.get("run_id")) == key), None)


__all__ = ["Catalog", "Entry", "LiveSource", "ServiceSource", "URLSource", "live_row"]
