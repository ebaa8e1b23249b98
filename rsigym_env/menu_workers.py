"""``MenuWorkersEnv``: the vector sim's rows on worker processes (issue 27 item 1, ``num_workers``).

What ``gym.make_vec("RSIGym/Joint-v0", num_envs=N, vectorization_mode="vector_entry_point", menu=True,
num_workers=W)`` builds for W > 1 (and :func:`rsigym_env.vector.make_vector_env`; W = 1, the default, is
:class:`~rsigym_env.menu_vector.MenuArrayEnv` in this process). The N rows are cut into W contiguous shards
(:attr:`MenuWorkersEnv.shards`, as even as can be), each a ``MenuArrayEnv`` of its rows in a worker process;
the env the user holds is a Gymnasium ``VectorEnv`` with ``MenuArrayEnv``'s interface: the same spaces,
autoreset modes (``NEXT_STEP``; ``SAME_STEP`` with ``final_obs``/``final_info``; ``DISABLED`` with
``reset(options={"reset_mask": ...})``), info keys and ``_key`` masks, money arrays (:attr:`budget_left_usd`,
:attr:`spent_usd`, :attr:`refusals`, :attr:`episodes`), ``ledger_path`` and ``write_episodes``. So the
aggregate rate grows with the cores (EnvPool's and PufferLib's lever) where each worker has rows enough: every
shard pays a step's fixed cost (~60 % of a one-process step at N = 256), so on 2 shared cores W = 2 lost at
N = 256, was 0.86–1.46x of W = 1 at N = 1024 and 1.17–1.50x at N = 4096 (masked actions); ``bench/README.md`` ("The vector sim, round 7") has the figures.

**Parity by construction.** Rows are independent (row i depends on its seed and its actions only), so a
shard computes exactly what the same rows compute in one ``MenuArrayEnv``: a worker gets its rows' seeds
(``reset(seed=s)``: row i gets ``s + i``; a list: each its own) and actions, and every row's observation,
reward, termination, truncation and info equal the W = 1 env's, bit for bit, whole info arrays included
(``tests/test_menu_workers.py``).

**One ledger, in this process.** Workers do not write episodes: their ``MenuArrayEnv`` keeps each finished
episode's :class:`~rsigym_env.menu_vector.EpisodeRecords` (``defer_episodes``) and hands them back with the
step's reply; this process writes a call's records of every shard at once with the same function
(:func:`~rsigym_env.menu_vector.write_episode_records`), its own key secret and key numbering, so the ledger
and its audit chain hold the same episodes, in the same order, as with W = 1 (``rsigym audit verify``
accepts it). A call's episodes are written while the workers run the next call (the ledger's time off the
critical path): reading :attr:`MenuWorkersEnv.platform` writes them first and ``close()`` writes them all; a
reader of the ``ledger_path`` file in another process sees a step's episodes one call later.

**Transport.** One shared buffer (``multiprocessing.RawArray``: an unlinked file in ``/dev/shm`` mapped by
every process) holds the per-row arrays: actions, observations (N, F) float32, reward, terminated,
truncated, the action mask, the numeric info arrays and their masks, the end keys' numbers and the money
state; each worker reads and writes its rows only. A pipe per worker carries the commands and the rare object
data: error strings, end reasons, ``SAME_STEP``'s final observations and masks, finished episodes' records and a
worker's traceback; a command out and its reply back are also the synchronisation. At N = 256 the main
process spends ~1.3–1.5 ms of CPU a step on a slow VM (the ledger's ~0.75 of it while the workers run the next
call; ``bench_menu_array.py --overhead``). Workers start with the ``forkserver`` method
(``start_method="spawn"`` also works): the fork server imports ``rsigym_env.menu_vector`` once per process, then
each worker is a fork of it (~1 s for the first env of a process, ~0.2 s after); each worker checks that it runs
the main process's ``menu_vector.py`` (a fork server started in another checkout's directory would not) and
holds BLAS and OpenMP to one thread (``threadpoolctl``), so W workers do not oversubscribe the cores; they
inherit the NumPy and OpenBLAS pins of :mod:`rsigym_env.numerics` from the environment. As with any
``multiprocessing`` code, a script that builds this env must guard its top level with
``if __name__ == "__main__":`` (the workers import the main module).

**Failure.** Every wait is bounded (``timeout_s``); a worker that dies (its exit code), raises (its
traceback) or does not answer in time is a ``RuntimeError`` naming it and its rows, never a hang, and the
env is then broken (every later call says so) until :meth:`close`; so is an interrupted wait (Ctrl-C: the
workers ignore SIGINT, the main process handles it). ``close()`` is idempotent: the workers
write the episodes still running (as ``MenuArrayEnv.close``: ended by ``"closed"``), this process puts them
in the ledger, then the workers are joined (with a timeout, then terminated). A bad action or reset
argument is refused here with ``MenuArrayEnv``'s own message before anything is sent.

>>> import gymnasium as gym, rsigym_env
>>> from rsigym_env.wrappers.menu import MENU_INDEX
>>> vec = gym.make_vec("RSIGym/Harness-v0", num_envs=5, vectorization_mode="vector_entry_point", menu=True,
...                    num_workers=2, benchmark="aime", budget_usd=100)
>>> type(vec).__name__, vec.shards, vec.observation_space.shape
('MenuWorkersEnv', [(0, 2), (2, 5)], (5, 50))
>>> obs, info = vec.reset(seed=0)
>>> obs, reward, terminated, truncated, info = vec.step(np.full(5, MENU_INDEX["submit_latest"]))
>>> terminated.tolist(), vec.episodes.tolist(), len(vec.platform.ledger.accounts())
([True, True, True, True, True], [1, 1, 1, 1, 1], 5)
>>> vec.close(); vec.close()
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import secrets
import signal
import sys
import time
import traceback
import weakref
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from .menu_vector import (END_KEYS, EpisodeRecords, MenuArrayEnv, _reset_needed, array_scenario, check_write_episodes,
                          menu_actions, reset_args, write_episode_records)
from .platform.core import Platform
from .platform.ledger import NANO, Ledger, _nano_near
from .scenario import Scenario
from .wrappers.menu import FEATURES, MENU

__all__ = ["MenuWorkersEnv", "shard_bounds"]

_SOURCE = os.path.realpath(sys.modules[MenuArrayEnv.__module__].__file__ or "")  # the workers must run this code

_REGULAR: tuple[tuple[str, Any], ...] = (("n_calls", np.int64), ("ok", np.bool_), ("error", None),
                                         ("cost_usd", np.float64), ("budget_left_usd", np.float64),
                                         ("spent_usd", np.float64))  # info's keys every step (error: by pipe)
_END_NUMERIC: tuple[tuple[str, Any], ...] = tuple(
    (key, np.int64 if key in ("dev_evaluations", "steps", "refusals") else np.float64)
    for key in END_KEYS if key not in ("end_reason", "budget_usd"))  # those two: by pipe, and from the scenario
_STATE: tuple[tuple[str, Any], ...] = (("spent_n", np.int64), ("reserved_n", np.int64), ("steps", np.int64),
                                       ("refusals", np.int64), ("episodes", np.int64), ("episode_seeds", np.int64),
                                       ("done", np.bool_))


def shard_bounds(num_envs: int, num_workers: int) -> list[tuple[int, int]]:
    """The rows ``[lo, hi)`` of each worker: contiguous, sizes differing by one at most.

    >>> shard_bounds(5, 2), shard_bounds(6, 3)
    ([(0, 2), (2, 5)], [(0, 2), (2, 4), (4, 6)])
    """
    cuts = [k * num_envs // num_workers for k in range(num_workers + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _fields() -> list[tuple[str, Any, tuple[int, ...]]]:
    """The shared buffer's per-row arrays: (name, dtype, shape of a row)."""
    out: list[tuple[str, Any, tuple[int, ...]]] = [
        ("actions", np.int64, ()), ("obs", np.float32, (len(FEATURES),)), ("reward", np.float64, ()),
        ("terminated", np.bool_, ()), ("truncated", np.bool_, ()), ("action_mask", np.bool_, (len(MENU),)),
        ("ended", np.bool_, ())]
    for key, dtype in _REGULAR:
        out += ([] if dtype is None else [(key, dtype, ())]) + [(f"_{key}", np.bool_, ())]
    out += [(f"end:{key}", dtype, ()) for key, dtype in _END_NUMERIC]
    out += [(f"state:{key}", dtype, ()) for key, dtype in _STATE]
    return out


def _views(buffer: Any, n: int, lo: int = 0, hi: int | None = None) -> tuple[dict[str, np.ndarray], int]:
    """Each field's array over ``buffer`` (rows ``lo:hi`` of N = ``n``; no buffer: only the size), and the
    buffer's size in bytes (each field 64-byte aligned)."""
    views, offset = {}, 0
    for name, dtype, shape in _fields():
        count = n * math.prod(shape)
        if buffer is not None:
            views[name] = np.frombuffer(buffer, dtype, count=count, offset=offset).reshape((n, *shape))[lo:hi]
        offset += -(-count * np.dtype(dtype).itemsize // 64) * 64
    return views, offset


# ---------------------------------------------------------------------------------------------- the worker

def _worker(conn: Connection, buffer: Any, n: int, lo: int, hi: int, scenario: Scenario, autoreset_mode: str,
            write_episodes: bool | str, source: str) -> None:
    """A worker process: rows ``lo:hi`` as a ``MenuArrayEnv``, commands from ``conn`` until ``close`` (or until
    the main process is gone). ``source``: the main process's ``menu_vector.py``, which the worker's must be."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    try:
        from threadpoolctl import ThreadpoolController

        ThreadpoolController().limit(limits=1)  # BLAS and OpenMP on one thread: W workers, W cores
        from . import menu_vector

        if os.path.realpath(menu_vector.__file__) != source:  # e.g. the fork server imported another checkout's
            raise RuntimeError(f"this worker's rsigym_env is {menu_vector.__file__}, the main process's {source}: "
                               "the same code must run both (start from a directory without another checkout, "
                               "or install that one)")
        v, _ = _views(buffer, n, lo, hi)
        env = MenuArrayEnv(hi - lo, scenario=scenario, autoreset_mode=autoreset_mode, write_episodes=write_episodes)
        env.defer_episodes()
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", os.getpid()))
    busy = [0, 0.0, 0.0, time.perf_counter()]  # steps, their wall and CPU seconds, since
    while True:
        try:
            command, argument = conn.recv()
        except (EOFError, OSError):
            return  # the main process is gone (or closed the pipe)
        try:
            if command == "step":
                wall, cpu = time.perf_counter(), time.process_time()
                reply: Any = _worker_step(env, v)
                busy[:3] = busy[0] + 1, busy[1] + time.perf_counter() - wall, busy[2] + time.process_time() - cpu
            elif command == "stats":
                reply = ([], busy[0], busy[1], busy[2], time.perf_counter() - busy[3])
            elif command == "reset":
                obs, info = env.reset(seed=argument[0], options={"reset_mask": argument[1]})
                v["obs"][:], v["action_mask"][:] = obs, info["action_mask"]
                reply = (env.take_episodes(),)
            elif command == "close":
                env.close()
                reply = (env.take_episodes(),)
            else:
                raise ValueError(f"unknown command {command!r}")
            for key, _ in _STATE:
                v[f"state:{key}"][:] = getattr(env, key)
        except Exception:
            conn.send(("error", traceback.format_exc()))
            continue
        conn.send(("ok", reply))
        if command == "close":
            return


def _sparse(values: np.ndarray) -> tuple[list[int], list[str]] | None:
    """The non-empty strings of an object array, as (indices, strings); None if there are none."""
    at = np.flatnonzero(values != "")
    return (at.tolist(), values[at].tolist()) if at.size else None


def _worker_step(env: MenuArrayEnv, v: dict[str, np.ndarray]) -> tuple[Any, ...]:
    """One step of the worker's rows: arrays into the buffer; back by pipe: (finished episodes' records, error
    strings, end reasons, ``SAME_STEP``'s final observations and masks of the rows that ended)."""
    obs, reward, terminated, truncated, info = env.step(v["actions"])
    v["obs"][:], v["reward"][:], v["terminated"][:], v["truncated"][:] = obs, reward, terminated, truncated
    v["action_mask"][:] = info["action_mask"]
    for key, dtype in _REGULAR:
        if dtype is not None:
            v[key][:] = info[key]
        v[f"_{key}"][:] = info[f"_{key}"]
    final = None
    if "final_info" in info:  # SAME_STEP, some rows ended: their step's values are in final_info
        ended, values = info["_final_obs"], info["final_info"]
        gone = np.flatnonzero(ended)
        final = (gone.tolist(), np.stack(info["final_obs"][gone].tolist()), values["action_mask"][gone])
    elif "_steps" in info:  # some rows ended (NEXT_STEP, DISABLED)
        ended, values = info["_steps"], info
    else:  # none: the end keys' values all the same, for the rows of the shards where some did
        ended, values = np.zeros(env.num_envs, bool), env.end_values()
    v["ended"][:] = ended
    for key, _ in _END_NUMERIC:
        v[f"end:{key}"][:] = values[key]
    return env.take_episodes(), _sparse(info["error"]), _sparse(np.asarray(values["end_reason"])), final


def _stop(processes: list[Any], connections: list[Connection], timeout_s: float) -> None:
    """Close the pipes (a worker waiting for a command reads their end and exits), join each worker within
    ``timeout_s``, then terminate (and kill) what is left."""
    for conn in connections:
        conn.close()
    deadline = time.monotonic() + timeout_s
    for proc in processes:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
            proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)


# ---------------------------------------------------------------------------------------------- the env

class MenuWorkersEnv(VectorEnv):
    """``num_envs`` sim episodes through the menu interface, their rows on ``num_workers`` processes (module
    docstring); ``MenuArrayEnv``'s interface and results.

    Args:
        num_envs: episodes side by side.
        num_workers: worker processes (1..``num_envs``); rows ``shards[k]`` run in worker k.
        scenario, track, world, benchmark, budget_usd, max_steps, time_limit_h, world_options, ledger_path,
            autoreset_mode, write_episodes: as for :class:`~rsigym_env.menu_vector.MenuArrayEnv` (the ledger is
            this process's).
        timeout_s: the longest wait for a worker's start or reply (a worker that dies is seen at once).
        start_method: ``"forkserver"`` (default) or ``"spawn"``.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 1, *, num_workers: int = 2, scenario: str | Path | Scenario | None = None,
                 track: str | None = None, world: str | None = None, benchmark: str | None = None,
                 budget_usd: float | None = None, max_steps: int | None = None, time_limit_h: float | None = None,
                 world_options: dict[str, Any] | None = None, ledger_path: str | Path | None = None,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP, write_episodes: bool | str = True,
                 timeout_s: float = 60.0, start_method: str = "forkserver"):
        self._processes: list[Any] = []
        self._connections: list[Connection] = []
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        n = self.num_envs = int(num_envs)
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or not 1 <= num_workers <= n:
            raise ValueError(f"num_workers must be an integer from 1 to num_envs ({n}), got {num_workers!r}")
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method is 'forkserver' or 'spawn', got {start_method!r}")
        s = self.scenario = array_scenario(scenario, track=track, world=world, benchmark=benchmark,
                                           budget_usd=budget_usd, max_steps=max_steps, time_limit_h=time_limit_h,
                                           world_options=world_options)
        check_write_episodes(write_episodes)
        self.write_episodes = "episode" if write_episodes is True else write_episodes
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.metadata = {**self.metadata, "autoreset_mode": self.autoreset_mode}
        self.num_workers, self.timeout_s, self.start_method = int(num_workers), float(timeout_s), start_method
        self.shards = shard_bounds(n, self.num_workers)
        self.single_action_space = spaces.Discrete(len(MENU))
        self.action_space = spaces.MultiDiscrete(np.full(n, len(MENU)))
        self.single_observation_space = spaces.Box(-1.0, 1.0, shape=(len(FEATURES),), dtype=np.float32)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(n, len(FEATURES)), dtype=np.float32)
        self.budget_n = _nano_near(s.budget_usd)
        self._platform = Platform(Ledger(ledger_path))
        self._unwritten: list[tuple[int, list[EpisodeRecords]]] = []  # the last call's records (see _call)
        self._key_secret, self._keys = secrets.token_hex(16), 0  # as MenuArrayEnv's: episode i's key
        self._started, self._broken, self._closed_workers = False, "", False
        self._in_sync = [True] * self.num_workers  # a worker that answered every command so far
        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(["rsigym_env.menu_vector"])  # imported once by the server (if it starts now)
        _, size = _views(None, n)
        self._buffer = ctx.RawArray("B", size)
        self._v, _ = _views(self._buffer, n)
        self.worker_pids: list[int] = []
        started = time.perf_counter()
        try:
            for k, (lo, hi) in enumerate(self.shards):
                here, there = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(there, self._buffer, n, lo, hi, s, self.autoreset_mode.value,
                                                         self.write_episodes, _SOURCE), daemon=True,
                                   name=f"rsigym-menu-worker-{k}")
                self._processes.append(proc)
                self._connections.append(here)
                proc.start()
                there.close()
            self._finalizer = weakref.finalize(self, _stop, self._processes, self._connections, 5.0)
            self.worker_pids = self._call("start", None)
        except BaseException:
            _stop(self._processes, self._connections, 5.0)
            self._platform.ledger.close()
            self._closed_workers = True
            raise
        self.start_s = time.perf_counter() - started  # the workers' start, until every one is ready

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """As ``MenuArrayEnv.reset``: every env (or those in ``options["reset_mask"]``); ``seed`` an int (env i
        gets ``seed + i``) or one per env; an episode cut short is written to the ledger as ended by ``"reset"``."""
        self._usable()
        seeds, mask = reset_args(self.num_envs, seed, options, started=self._started)
        self._call("reset", [("reset", (seeds[lo:hi], mask[lo:hi])) for lo, hi in self.shards])
        self._started = True
        v = self._v
        return v["obs"].copy(), {"action_mask": v["action_mask"].copy(), "_action_mask": mask.copy(),
                                 "seed": v["state:episode_seeds"].copy(), "_seed": mask.copy()}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """As ``MenuArrayEnv.step``: one menu index per env; the same autoreset and info."""
        self._usable()
        if not self._started:
            raise gym.error.ResetNeeded("call reset() before step()")
        n, v = self.num_envs, self._v
        actions = menu_actions(actions, n)
        done_before = v["state:done"].copy()
        if done_before.any() and self.autoreset_mode == AutoresetMode.DISABLED:
            raise _reset_needed(np.flatnonzero(done_before))
        v["actions"][:] = actions
        replies = self._call("step", [("step", None)] * self.num_workers)
        info: dict[str, Any] = {"action_mask": v["action_mask"].copy(), "n_calls": v["n_calls"].copy(),
                                "_action_mask": np.ones(n, bool), "_n_calls": v["_n_calls"].copy()}
        error, reasons = np.full(n, "", dtype=object), np.full(n, "", dtype=object)
        finals = []
        for (lo, _), (_, errors, ends, final) in zip(self.shards, replies):
            for sparse, into in ((errors, error), (ends, reasons)):
                if sparse is not None:
                    into[np.asarray(sparse[0], np.int64) + lo] = sparse[1]
            if final is not None:
                finals.append((np.asarray(final[0], np.int64) + lo, final[1], final[2]))
        for key, dtype in _REGULAR[1:]:
            info[key], info[f"_{key}"] = error if dtype is None else v[key].copy(), v[f"_{key}"].copy()
        ended = v["ended"].copy()
        if ended.any():
            values = {key: v[f"end:{key}"].copy() for key, _ in _END_NUMERIC}
            values["end_reason"], values["budget_usd"] = reasons, np.full(n, self.scenario.budget_usd)
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                self._same_step_finals(info, values, ended, ~done_before, finals)
            else:
                for key in END_KEYS:
                    info[key], info[f"_{key}"] = values[key], ended.copy()
        return v["obs"].copy(), v["reward"].copy(), v["terminated"].copy(), v["truncated"].copy(), info

    def _same_step_finals(self, info: dict[str, Any], values: dict[str, np.ndarray], gone: np.ndarray,
                          acting: np.ndarray, finals: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """``MenuArrayEnv._reset_same_step``'s ``final_obs`` and ``final_info`` of the rows that ended (``gone``),
        from the shards' final observations and masks: each key's value as the step gave it, its mask what it
        was before the reset (``acting`` for the step's keys, all for the mask, the ended rows for the end keys)
        and ``gone``."""
        n = self.num_envs
        final_obs = np.full(n, None, dtype=object)
        final_mask = info["action_mask"].copy()
        for rows, obs, mask in finals:
            for i, row in zip(rows.tolist(), obs):
                final_obs[i] = row
            final_mask[rows] = mask
        final_info: dict[str, Any] = {"action_mask": final_mask, "_action_mask": gone.copy()}
        for key, _ in _REGULAR:
            final_info[key], final_info[f"_{key}"] = info[key].copy(), acting & gone
        for key in END_KEYS:
            final_info[key], final_info[f"_{key}"] = values[key].copy(), gone.copy()
        info["final_obs"], info["_final_obs"] = final_obs, gone.copy()
        info["final_info"], info["_final_info"] = final_info, gone.copy()

    def close_extras(self, **kwargs: Any) -> None:
        """The workers write their running episodes (ended by ``"closed"``) and this process puts them in the
        ledger; the workers are joined (``timeout_s``, then terminated); the ledger closes. Idempotent."""
        if self._closed_workers:
            return
        self._closed_workers = True
        try:
            live = [k for k in range(self.num_workers) if self._in_sync[k] and self._processes[k].is_alive()]
            if live:
                self._call("close", {k: ("close", None) for k in live}, closing=True)
        finally:
            for k, proc in enumerate(self._processes):
                if not self._in_sync[k] and proc.is_alive():  # it missed a command: it will not exit on its own
                    proc.kill()
            self._finalizer()  # _stop: join, then terminate what is left
            try:
                self._flush()
            finally:
                self._platform.ledger.close()

    @property
    def platform(self) -> Platform:
        """The platform of the ledger the episodes are written to (this process's), written up to date first."""
        self._flush()
        return self._platform

    # ------------------------------------------------------------------ money, as MenuArrayEnv's

    @property
    def budget_left_usd(self) -> np.ndarray:
        """What each env's episode may still spend (budget - spent - reserved), in dollars."""
        v = self._v
        return (self.budget_n - v["state:spent_n"] - v["state:reserved_n"]) / NANO

    @property
    def spent_usd(self) -> np.ndarray:
        """What each env's episode has spent, in dollars."""
        return self._v["state:spent_n"] / NANO

    @property
    def refusals(self) -> np.ndarray:
        """Refused calls of each env's current episode."""
        return self._v["state:refusals"].copy()

    @property
    def episodes(self) -> np.ndarray:
        """Finished episodes of each env."""
        return self._v["state:episodes"].copy()

    @property
    def steps(self) -> np.ndarray:
        """Calls that ran in each env's current episode."""
        return self._v["state:steps"].copy()

    @property
    def episode_seeds(self) -> np.ndarray:
        """Each env's current episode seed."""
        return self._v["state:episode_seeds"].copy()

    @property
    def done(self) -> np.ndarray:
        """Which envs' episodes have ended (and not been reset yet)."""
        return self._v["state:done"].copy()

    # ------------------------------------------------------------------ the workers

    def worker_stats(self) -> list[dict[str, float]]:
        """Each worker's steps so far, the wall and CPU seconds it spent in them, and its seconds since it started
        (so what it waited: for the main process and the pipes); for benchmarks."""
        return [{"steps": steps, "step_wall_s": wall, "step_cpu_s": cpu, "alive_s": alive}
                for _, steps, wall, cpu, alive in self._call("stats", [("stats", None)] * self.num_workers)]

    def _describe(self, k: int) -> str:
        lo, hi = self.shards[k]
        pid = self._processes[k].pid
        return f"worker {k} (envs {lo}..{hi - 1}, pid {pid})"

    def _usable(self) -> None:
        if self._closed_workers:
            raise RuntimeError("this MenuWorkersEnv is closed")
        if self._broken:
            raise RuntimeError(f"this MenuWorkersEnv is broken ({self._broken}); close() it and make a new one")

    def _call(self, what: str, messages: Sequence[Any] | dict[int, Any] | None, *, closing: bool = False) -> list[Any]:
        """Send ``messages[k]`` to worker k (``None``: nothing, wait for the start's reply), then gather every
        reply within ``timeout_s``, watching each worker's process: a worker that dies is seen at once. The
        replies' finished episodes (each reply's first item) are one write to the ledger, made while the workers
        run the next call (the ledger's time off the critical path), or before anyone reads the ledger
        (:attr:`platform`), or at a failure or ``close``; then any failure is a ``RuntimeError`` naming the workers
        (the env is broken from then on). Returns the replies in worker order (None for a worker that sent no
        message)."""
        if messages is None:
            targets: dict[int, Any] = dict.fromkeys(range(self.num_workers))
        else:
            targets = dict(messages) if isinstance(messages, dict) else dict(enumerate(messages))
        failures: list[str] = []
        pending = set()
        for k, message in targets.items():
            if message is None:
                pending.add(k)
                continue
            try:
                self._connections[k].send(message)
                pending.add(k)
            except (OSError, ValueError) as error:  # its end of the pipe is closed: it has died
                self._in_sync[k] = False
                self._processes[k].join(1.0)
                failures.append(f"{self._describe(k)} died before {what} (exit code {self._processes[k].exitcode}; "
                                f"sending: {error!r})")
        replies: list[Any] = [None] * self.num_workers
        if not failures:
            self._flush()  # the previous call's episodes, while the workers compute
        deadline = time.monotonic() + self.timeout_s
        try:
            while pending:
                left = deadline - time.monotonic()
                watched = [self._connections[k] for k in pending] + [self._processes[k].sentinel for k in pending]
                ready = set(wait(watched, max(0.0, left))) if left > 0 else set()
                if not ready:
                    break
                for k in sorted(pending):
                    conn, proc = self._connections[k], self._processes[k]
                    if conn in ready or (proc.sentinel in ready and conn.poll(0)):
                        try:
                            status, payload = conn.recv()
                        except (EOFError, OSError):
                            status, payload = "died", None
                    elif proc.sentinel in ready:
                        status, payload = "died", None
                    else:
                        continue
                    pending.discard(k)
                    if status == "ok":
                        replies[k] = payload
                    elif status == "died":
                        self._in_sync[k] = False
                        proc.join(1.0)
                        failures.append(f"{self._describe(k)} died during {what} (exit code {proc.exitcode})")
                    else:
                        story = str(payload).strip()  # its traceback: the exception's line first
                        failures.append(f"{self._describe(k)} failed in {what}: {story.splitlines()[-1]}\n{story}")
        except BaseException as error:  # Ctrl-C while waiting: replies still to come would answer the next call
            for k in pending:
                self._in_sync[k] = False
            self._broken = self._broken or f"interrupted during {what} ({type(error).__name__})"
            raise
        for k in sorted(pending):
            self._in_sync[k] = False
            failures.append(f"{self._describe(k)} did not answer {what} within {self.timeout_s:g} s")
        if what != "start":
            self._flush()
            self._unwritten = [(self.shards[k][0], reply[0]) for k, reply in enumerate(replies) if reply is not None]
        if failures:
            self._flush()
            message = "; ".join(failures)
            if not closing:
                self._broken = message
            raise RuntimeError(message)
        return replies

    def _flush(self) -> None:
        """Write the last call's records of every shard (rows offset by the shard's first), in one write: what
        ``MenuArrayEnv._write`` writes for the same rows (each of reset, step and close writes once)."""
        parts, self._unwritten = self._unwritten, []
        flat = [(records, lo) for lo, kept in parts for records in kept]
        if not flat or not self.write_episodes:
            return
        records = EpisodeRecords.concat([r for r, _ in flat], [lo for _, lo in flat])
        self._keys += write_episode_records(self._platform.ledger, records, per_step=self.write_episodes == "step",
                                            budget_usd=self.scenario.budget_usd, budget_n=self.budget_n,
                                            secret=self._key_secret, first=self._keys + 1)
