"""``MenuArrayEnv``: N sim episodes behind the menu interface, stepped as arrays (issue 27 item 1).

WORK IN PROGRESS: not registered for users yet (``gym.make_vec`` still builds
:class:`~rsigym_env.vector.ResearchVectorEnv`). Which macros it steps is in ``ARRAY_MACROS``; any other
menu entry raises ``NotImplementedError``. Parity with the scalar env is tested for those macros only
(``tests/test_menu_vector.py``).

What it is: every sub-env is ``DiscreteMenu(gym.make(env_id, benchmark=b, ...))`` on the sim world (one
benchmark and one scenario for the N envs), without the text log: the action is a menu index per env,
the observation an ``(N, len(FEATURES))`` float32 matrix, ``info["action_mask"]`` an ``(N, len(MENU))``
bool matrix. For the same seeds and menu actions, row i's features, reward, termination, truncation and
the info keys in ``INFO_KEYS`` equal the scalar env's.

Design
------
State arrays (row i = env i; see ``MenuArrayEnv.__init__``):

* worlds: a :class:`~rsigym_env.worlds.sim.batch.SimBatch` (each row the world its episode seed gives
  alone, streams and all; a reset redraws its rows), the initial system's official score per row;
* money, in integer nano-dollars as the ledger keeps it: ``spent_n``, ``reserved_n`` (one running job's
  hold) against the scenario's ``budget_n``; a call is reserved at ``_nano_up(quote)`` before it runs and
  refused (free, counted in ``refusals``, no step) when that exceeds what is available, and settled at
  ``_nano_near(cost)`` (at most the hold); a job cancelled at the end is billed for the share of its
  duration that ran, as ``ResearchRun._settle_running`` does;
* clock (seconds), ``steps`` (calls that ran), ``refusals`` and the end (``done``, ``end_reason``);
* harness: ``fixed`` (N, 5) — which defects the latest harness fixes. The menu's fixes only switch an
  option on, so a harness version is one of 32 bit patterns; their version ids and parsed options are
  computed once per benchmark with the scalar code (``HarnessStore.edit`` of the menu's own edit,
  ``version_id``, ``HarnessArrays.of``), so version ids and evaluated options match by construction;
* dev candidates: (checkpoint, harness version) pairs, for now only ``base`` × 32 versions: their number
  of scores and mean (N, 32) and the order a candidate was first scored in (the adapter's and the run's
  dict order, for ties); the scores themselves in a list per row and candidate, averaged by ``np.mean``
  as the adapter does when one is added (a padded (N, 32, S) array summed along S rounds differently
  from ``np.mean`` of the list from 4 values on: measured); ``initial_dev``,
  ``best_dev`` (the run's best candidate: the first to reach the highest single score), ``last_dev``;
* one running evaluation per row (the menu's evaluations block: start, then ``wait`` for it): its
  ready time, cost and result, drawn when it starts as the scalar world does;
* the adapter's own memory for the features: ``harness_read``, failure shares and cost of the last
  finished evaluation, evaluations finished, ``last_error``.

Shared with the scalar env (parity by construction): the menu, mask and feature definitions
(``wrappers/menu.py``), scenario loading, the episode seed (Gymnasium's ``np_random``, as
``ResearchEnv.reset``), world draws and evaluation kernels and bills (``SimBatch``), harness version ids,
the ledger's nano-dollar rounding, ``normalized_gain``, the run's ``MIN_USD``.

Re-implemented in arrays (parity by test): the run's call sequence per macro (``ResearchRun.execute``:
step count, refusals, limits in the run's order — steps, refusals, time, money), the ledger's
reserve/settle arithmetic, the clock's ``wait``, the run's dev bookkeeping, the adapter's features and
mask. ``tests/test_menu_vector.py`` plays seeded random action sequences (mostly masked ones, some
refused on purpose) through this env and through ``DiscreteMenu`` on the scalar env, on every track and
benchmark, and compares every row.

Not here yet: data (``gen``, ``clean``), training (``train:lr``), autoreset modes other than
``NEXT_STEP``, the ledger/audit record of finished episodes, the text of ``info`` (``result``,
``message``, ``events``, ``metrics``).

>>> env = MenuArrayEnv(2, track="harness", benchmark="aime", budget_usd=500)
>>> obs, info = env.reset(seed=0)
>>> obs.shape, info["action_mask"].shape
((2, 50), (2, 27))
>>> obs, reward, terminated, truncated, info = env.step(np.array([MENU_INDEX["eval_latest_k1"],
...                                                               MENU_INDEX["submit_latest"]]))
>>> terminated.tolist(), info["n_calls"].tolist(), bool(info["cost_usd"][0] > 0)
([False, True], [2, 1], True)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from .catalog import DEFECTS, FAILURE_MODES
from .harness import HarnessStore
from .platform.ledger import NANO, _nano_near, _nano_up
from .run import MIN_USD
from .scenario import load_scenario
from .scoring import normalized_gain
from .worlds.sim.batch import HarnessArrays, SimBatch
from .wrappers.menu import FEATURES, FIXES, MENU, MENU_INDEX, TEACHERS, _option_line

__all__ = ["ARRAY_MACROS", "INFO_KEYS", "MenuArrayEnv"]

ARRAY_MACROS: tuple[str, ...] = ("eval_latest", "eval_base", "fix", "wait", "submit_best", "submit_latest")
INFO_KEYS: tuple[str, ...] = ("ok", "error", "cost_usd", "budget_left_usd", "spent_usd")
END_KEYS: tuple[str, ...] = ("initial_score", "official_score", "normalized_gain", "best_dev_score",
                             "initial_dev_score", "dev_evaluations", "end_reason", "steps", "refusals",
                             "spend_usd", "budget_usd", "elapsed_h")
N_VERSIONS = 1 << len(DEFECTS)  # harness versions the menu's fixes can make
_KIND = np.array([m.kind for m in MENU])
_ARG = [m.arg for m in MENU]
_F = {name: i for i, name in enumerate(FEATURES)}


def harness_versions(batch: SimBatch) -> tuple[list[str], list[dict[str, str]]]:
    """The version ids and files of the 32 harnesses the menu's fixes make from the initial one (bit j of
    the index: ``DEFECTS[j]`` fixed), made with the scalar run's own ``HarnessStore.edit`` of the edit
    ``DiscreteMenu`` sends, so ids and texts are the scalar env's.

    >>> ids, files = harness_versions(SimBatch.make("aime", [0]))
    >>> len(set(ids)), 'on_truncation = "continue"' in files[1]["harness.toml"]
    (32, True)
    """
    ids, files = [], []
    for bits in range(N_VERSIONS):
        store = HarnessStore(batch.initial_harness())
        for j, defect in enumerate(DEFECTS):
            if bits >> j & 1:
                key, fixed, _ = FIXES[defect]
                line = _option_line(store.files()["harness.toml"], key)
                assert line is not None, f"the minimal harness has no {key}"
                store.edit("harness.toml", old=line.group(0), new=f"{key} = {fixed}")
        ids.append(store.latest)
        files.append(store.files())
    return ids, files


def _nano(values: np.ndarray, convert: Any) -> np.ndarray:
    """The ledger's scalar rounding (``_nano_up`` or ``_nano_near``) of each dollar amount."""
    return np.array([convert(v) for v in values.tolist()], dtype=np.int64)


class MenuArrayEnv(VectorEnv):
    """``num_envs`` sim episodes of one scenario through the menu interface, as arrays (module docstring).

    Args:
        num_envs: episodes side by side.
        scenario, track, benchmark, budget_usd, max_steps, time_limit_h: as for ``ResearchEnv`` (sim world).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 1, *, scenario: str | None = None, track: str | None = None,
                 benchmark: str | None = None, budget_usd: float | None = None, max_steps: int | None = None,
                 time_limit_h: float | None = None):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        overrides = dict(track=track, benchmark=benchmark, budget_usd=budget_usd, max_steps=max_steps,
                         time_limit_h=time_limit_h)
        base = load_scenario(scenario, **{**overrides, "track": None if scenario is not None else track})
        s = self.scenario = base.model_copy(update={k: v for k, v in overrides.items() if v is not None})
        if s.world != "sim":
            raise ValueError(f"the array env runs the sim world only, not {s.world!r}")
        n = self.num_envs = int(num_envs)
        self.single_action_space = spaces.Discrete(len(MENU))
        self.action_space = spaces.MultiDiscrete(np.full(n, len(MENU)))
        self.single_observation_space = spaces.Box(-1.0, 1.0, shape=(len(FEATURES),), dtype=np.float32)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(n, len(FEATURES)), dtype=np.float32)
        self.budget_n = _nano_near(s.budget_usd)
        self.time_limit_s = s.time_limit_h * 3600.0
        self.tools = set(s.tools())
        self.batch = SimBatch.make(s.benchmark, [0] * n)
        self.version_ids, files = harness_versions(self.batch)
        self.harness_table = HarnessArrays.of(files)
        self.n_dev = self.batch.n_tasks
        self._static_mask = self._mask_constants()
        self._rngs: list[np.random.Generator | None] = [None] * n
        self.episode_seeds = np.zeros(n, np.int64)
        z = lambda dtype=float: np.zeros(n, dtype)  # noqa: E731
        self.initial_official, self._final, self.clock, self.done = z(), z(), z(), z(bool)
        self.spent_n, self.reserved_n, self.steps, self.refusals = z(np.int64), z(np.int64), z(np.int64), z(np.int64)
        self.end_reason = np.full(n, "", dtype=object)
        self.fixed = np.zeros((n, len(DEFECTS)), bool)
        self.harness_read, self.last_error = z(bool), z(bool)
        self.score_lists: list[dict[int, list[float]]] = [{} for _ in range(n)]  # row -> candidate -> scores
        self.n_scores = np.zeros((n, N_VERSIONS), np.int64)
        self.means = np.zeros((n, N_VERSIONS))
        self.first_scored = np.zeros((n, N_VERSIONS), np.int64)  # 0: never; else the order (1, 2, ...)
        self.n_candidates = z(np.int64)
        self.initial_dev, self.best_dev, self.last_dev, self.best_cand = z(), z(), z(), z(np.int64)
        self.running, self.job_start, self.job_ready, self.job_usd = z(bool), z(), z(), z()
        self.job_score, self.job_cand, self.job_k = z(), z(np.int64), z(np.int64)
        self.job_counts = np.zeros((n, 1 + len(FAILURE_MODES)), np.int64)
        self.fail_shares = np.zeros((n, len(FAILURE_MODES)))
        self.eval_cost, self.evaluations = z(), z(np.int64)
        self._started = False

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | Sequence[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env; ``seed``: an int (env i gets ``seed + i``) or one seed per env."""
        n = self.num_envs
        if seed is None or isinstance(seed, (int, np.integer)):
            seeds: list[int | None] = [None if seed is None else int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"give one seed per env ({n}), got {len(seeds)}")
        self._reset_rows(np.arange(n), seeds)
        self._started = True
        return self._features(), {"action_mask": self._mask()}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One menu index per env; an env that ended is reset instead (its action ignored)."""
        if not self._started:
            raise ValueError("call reset() before step()")
        actions = np.asarray(actions, dtype=np.int64)
        n = self.num_envs
        if actions.shape != (n,) or ((actions < 0) | (actions >= len(MENU))).any():
            raise ValueError(f"give one menu index (0..{len(MENU) - 1}) per env ({n}), got {actions!r}")
        resetting = np.flatnonzero(self.done)
        if resetting.size:
            self._reset_rows(resetting, [None] * resetting.size)
        self._reward = np.zeros(n)
        self._terminated, self._truncated = np.zeros(n, bool), np.zeros(n, bool)
        self._ok, self._spent_before = np.ones(n, bool), self.spent_n.copy()
        self._error = np.full(n, "", dtype=object)
        self._calls = np.zeros(n, np.int64)
        acting = np.ones(n, bool)
        acting[resetting] = False
        kinds = _KIND[actions]
        for kind in np.unique(kinds[acting]).tolist():
            if kind not in ARRAY_MACROS:
                raise NotImplementedError(f"menu entry kind {kind!r} is not in the array env yet")
            rows = np.flatnonzero(acting & (kinds == kind))
            getattr(self, "_macro_" + kind)(rows, actions[rows])
        info: dict[str, Any] = {"action_mask": self._mask(), "n_calls": self._calls.copy(),
                                "_action_mask": np.ones(n, bool), "_n_calls": acting.copy()}
        self.last_error[acting] = ~self._ok[acting]
        balance = self._available_usd()
        spent = self.spent_n / NANO
        cost = np.array([round(a / NANO - b / NANO, 9) for a, b in zip(self.spent_n.tolist(), self._spent_before.tolist())])
        for key, value in (("ok", self._ok), ("error", self._error), ("cost_usd", cost),
                           ("budget_left_usd", balance), ("spent_usd", spent)):
            info[key], info[f"_{key}"] = value, acting.copy()
        ended = np.flatnonzero(acting & self.done)
        if ended.size:
            self._end_info(info, ended)
        return self._features(), self._reward, self._terminated, self._truncated, info

    # ------------------------------------------------------------------ macros (rows do one each)

    def _macro_eval_latest(self, rows: np.ndarray, actions: np.ndarray) -> None:
        self._evaluate(rows, np.array([_ARG[a] for a in actions.tolist()], np.int64))

    _macro_eval_base = _macro_eval_latest  # no checkpoints yet: the latest candidate is base + latest harness

    def _macro_fix(self, rows: np.ndarray, actions: np.ndarray) -> None:
        defect = np.array([DEFECTS.index(_ARG[a]) for a in actions.tolist()], np.intp)
        unread = ~self.harness_read[rows]
        if unread.any():
            first = rows[unread]
            self._call(first)  # read harness:latest/harness.toml: free, a step
            self._ran(first)
            self.harness_read[first] = True
            self._after_call(first)
            go = ~self.done[rows]
            rows, defect = rows[go], defect[go]
        if not rows.size:
            return
        self._call(rows)
        if "edit_harness" not in self.tools:
            self._refuse(rows, "forbidden_tool")
        else:
            done = self.fixed[rows, defect]
            self._refuse(rows[done], "harness_patch_failed")
            edit = rows[~done]
            self.fixed[edit, defect[~done]] = True
            self._ran(edit)
        self._after_call(rows)

    def _macro_wait(self, rows: np.ndarray, actions: np.ndarray) -> None:
        self._call(rows)
        self._wait(rows)

    def _macro_submit_latest(self, rows: np.ndarray, actions: np.ndarray) -> None:
        self._submit(rows, self._version(rows))

    def _macro_submit_best(self, rows: np.ndarray, actions: np.ndarray) -> None:
        """The adapter's best candidate: the highest mean dev score, the first scored on a tie (else latest)."""
        scored = self.n_scores[rows] > 0
        mean = np.where(scored, self.means[rows], -np.inf)
        top = scored & (mean == mean.max(axis=1, keepdims=True))
        order = np.where(top, self.first_scored[rows], np.iinfo(np.int64).max)
        best = order.argmin(axis=1)
        self._submit(rows, np.where(scored.any(axis=1), best, self._version(rows)))

    # ------------------------------------------------------------------ calls (the run's execute)

    def _call(self, rows: np.ndarray) -> None:
        """A call of a macro begins: counted in ``n_calls``, its cost is its own."""
        self._calls[rows] += 1
        self._ok[rows], self._error[rows] = True, ""
        self._spent_before[rows] = self.spent_n[rows]

    def _ran(self, rows: np.ndarray) -> None:
        self.steps[rows] += 1

    def _refuse(self, rows: np.ndarray, code: str) -> None:
        self.refusals[rows] += 1
        self._ok[rows], self._error[rows] = False, code

    def _evaluate(self, rows: np.ndarray, k: np.ndarray) -> None:
        """``evaluate`` (reserve the quote or refuse it; draw the result; a job), then ``wait`` for it."""
        if "evaluate" not in self.tools:  # every track has it; kept for other scenarios
            self._call(rows)
            self._refuse(rows, "forbidden_tool")
            self._after_call(rows)
            return
        self._call(rows)
        version = self._version(rows)
        harness = self._harness(version)
        usd = self.batch.dev_bill(rows, harness, k)[0]
        hold = _nano(usd, _nano_up)
        fits = hold <= self.budget_n - self.spent_n[rows] - self.reserved_n[rows]
        self._refuse(rows[~fits], "insufficient_budget")
        go = rows[fits]
        if go.size:
            self._ran(go)
            out = self.batch.evaluate(self.batch.base_skill[go], np.zeros(go.size), self._harness(version[fits]),
                                      k=k[fits], split="dev", rows=go)
            self.reserved_n[go] += hold[fits]
            self.running[go] = True
            self.job_start[go], self.job_ready[go] = self.clock[go], self.clock[go] + out.seconds
            self.job_usd[go], self.job_score[go], self.job_counts[go] = out.usd, out.score, out.counts
            self.job_cand[go], self.job_k[go] = version[fits], k[fits]
        self._after_call(rows)
        waiting = go[~self.done[go]]
        while waiting.size:  # DiscreteMenu's blocking evaluate: wait until the job is in
            self._call(waiting)
            self._wait(waiting)
            waiting = waiting[~self.done[waiting] & self.running[waiting]]

    def _wait(self, rows: np.ndarray) -> None:
        """``wait`` for the running job (the clock jumps to it, or to the time limit)."""
        idle = ~self.running[rows]
        self._refuse(rows[idle], "no_running_jobs")
        go = rows[~idle]
        self._ran(go)
        ready = np.maximum(self.job_ready[go], self.clock[go])
        ends = ready <= self.time_limit_s
        self.clock[go] = np.where(ends, ready, np.maximum(self.clock[go], self.time_limit_s))
        self._collect(go[ends])
        self._after_call(rows)

    def _collect(self, rows: np.ndarray) -> None:
        """Finished evaluations: settle their bills, record their dev scores (run and adapter)."""
        if not rows.size:
            return
        charge = np.minimum(_nano(self.job_usd[rows], _nano_near), self.reserved_n[rows])
        self._settle(rows, charge)
        self.running[rows] = False
        score, cand = self.job_score[rows], self.job_cand[rows]
        for i, c, value in zip(rows.tolist(), cand.tolist(), score.tolist()):  # one finished evaluation each
            scores = self.score_lists[i].setdefault(c, [])
            if not scores:
                self.n_candidates[i] += 1
                self.first_scored[i, c] = self.n_candidates[i]
            scores.append(value)
            self.n_scores[i, c] = len(scores)
            self.means[i, c] = float(np.mean(scores))  # the adapter's mean, summed as NumPy sums
            if c == 0 and self.initial_dev[i] < 0:
                self.initial_dev[i] = value
            if value > self.best_dev[i]:
                self.best_dev[i], self.best_cand[i] = value, c
        self.last_dev[rows] = score
        attempts = np.maximum(1, self.n_dev * self.job_k[rows])
        self.fail_shares[rows] = self.job_counts[rows, 1:] / attempts[:, None]
        self.eval_cost[rows] = self.job_usd[rows]
        self.evaluations[rows] += 1

    def _settle(self, rows: np.ndarray, charge: np.ndarray) -> None:
        self.spent_n[rows] += charge
        self.reserved_n[rows] = 0

    def _submit(self, rows: np.ndarray, version: np.ndarray) -> None:
        self._call(rows)
        if "submit" not in self.tools:
            self._refuse(rows, "forbidden_tool")
            self._after_call(rows)
            return
        self._ran(rows)
        final = self._official(rows, version)
        self._end(rows, final, terminated=True, reason="submitted")

    def _after_call(self, rows: np.ndarray) -> None:
        """The run's limits after a call, in its order: steps, refusals, time, money."""
        rows = rows[~self.done[rows]]
        if not rows.size:
            return
        s = self.scenario
        reason = np.select(
            [self.steps[rows] >= s.max_steps, self.refusals[rows] >= s.refusal_limit,
             self.clock[rows] >= self.time_limit_s, ~self.running[rows] & (self._available_usd(rows) < MIN_USD)],
            ["step limit", "refusal limit", "time limit", "budget exhausted"], "")
        ending = reason != ""
        if ending.any():
            ends = rows[ending]
            self._end(ends, self.initial_official[ends], terminated=False, reason=reason[ending])

    def _end(self, rows: np.ndarray, final: np.ndarray, *, terminated: bool, reason: Any) -> None:
        """The episode's result: running jobs billed for the share that ran, the normalized gain."""
        busy = rows[self.running[rows]]
        if busy.size:
            span = self.job_ready[busy] - self.job_start[busy]
            fraction = np.where(span > 0, np.minimum(1.0, np.maximum(0.0, (self.clock[busy] - self.job_start[busy])
                                                                    / np.where(span > 0, span, 1.0))), 1.0)
            charge = np.minimum(_nano(self.job_usd[busy] * fraction, _nano_near), self.reserved_n[busy])
            self._settle(busy, charge)
            self.running[busy] = False
        self.done[rows] = True
        self.end_reason[rows] = reason
        self._final[rows] = final
        self._reward[rows] = [normalized_gain(i, f) for i, f in zip(self.initial_official[rows].tolist(),
                                                                   np.asarray(final, float).tolist())]
        (self._terminated if terminated else self._truncated)[rows] = True

    # ------------------------------------------------------------------ state

    def _reset_rows(self, rows: np.ndarray, seeds: Sequence[int | None]) -> None:
        """New episodes at ``rows``: the episode seed as ``ResearchEnv.reset`` draws it, the world it gives."""
        episode = []
        for i, seed in zip(rows.tolist(), seeds):
            if seed is not None or self._rngs[i] is None:
                self._rngs[i], _ = seeding.np_random(seed)
            episode.append(int(self._rngs[i].integers(2**31 - 1)))
        self.episode_seeds[rows] = episode
        self.batch.reset(rows, episode)
        for name in ("clock", "spent_n", "reserved_n", "steps", "refusals", "fixed", "harness_read", "last_error",
                     "n_scores", "means", "first_scored", "n_candidates", "running", "fail_shares",
                     "eval_cost", "evaluations", "done"):
            getattr(self, name)[rows] = 0
        self.end_reason[rows] = ""
        for i in rows.tolist():
            self.score_lists[i] = {}
        self.initial_dev[rows] = self.best_dev[rows] = self.last_dev[rows] = -1.0
        self.best_cand[rows] = -1
        self.initial_official[rows] = self._official(rows, np.zeros(rows.size, np.int64))

    def _official(self, rows: np.ndarray, version: np.ndarray) -> np.ndarray:
        """The official avg@k of base + ``version`` (the world's fixed draw)."""
        return self.batch.evaluate(self.batch.base_skill[rows], np.zeros(rows.size), self._harness(version),
                                   k=self.scenario.official_k, split="official", rows=rows).score

    def _version(self, rows: np.ndarray) -> np.ndarray:
        """The latest harness version (its bit pattern) of each row."""
        return self.fixed[rows] @ (1 << np.arange(len(DEFECTS)))

    def _harness(self, version: np.ndarray) -> HarnessArrays:
        t = self.harness_table
        return HarnessArrays(*(getattr(t, f)[version] for f in HarnessArrays.__dataclass_fields__))

    def _available_usd(self, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        return (self.budget_n - self.spent_n[rows] - self.reserved_n[rows]) / NANO

    def _mask_constants(self) -> np.ndarray:
        """The mask entries that depend only on the scenario (tools, teachers, locks)."""
        s, tools = self.scenario, self.tools
        out = np.zeros(len(MENU), bool)
        for i, m in enumerate(MENU):
            if m.kind in ("eval_latest", "eval_base"):
                out[i] = "evaluate" in tools
            elif m.kind == "fix":
                out[i] = "edit_harness" in tools
            elif m.kind == "gen":
                out[i] = "generate_data" in tools and m.arg[0] in s.permissions.teachers
            elif m.kind in ("submit_best", "submit_latest"):
                out[i] = "submit" in tools
        return out

    def _mask(self) -> np.ndarray:
        """``MenuAdapter.mask`` per row (no data or checkpoints yet: clean and train are masked)."""
        mask = np.tile(self._static_mask, (self.num_envs, 1))
        fix = slice(MENU_INDEX[f"fix:{DEFECTS[0]}"], MENU_INDEX[f"fix:{DEFECTS[-1]}"] + 1)
        mask[:, fix] &= ~(self.fixed & self.harness_read[:, None])
        mask[:, MENU_INDEX["wait"]] = ("wait" in self.tools) & self.running & ~self.done
        return mask

    def _features(self) -> np.ndarray:
        """``MenuAdapter.features`` per row (float64, then float32 and clipped as there)."""
        n, s = self.num_envs, self.scenario
        f = np.zeros((n, len(FEATURES)))
        f[:, 0] = np.minimum(self._available_usd(), s.budget_usd) / max(s.budget_usd, 1e-9)
        time_h = self.time_limit_s / 3600.0
        f[:, 1] = (np.maximum(0.0, self.time_limit_s - self.clock) / 3600.0) / max(time_h, 1e-9)
        f[:, 2] = np.minimum(self.steps, s.max_steps) / max(s.max_steps, 1)
        f[:, 3], f[:, 4], f[:, 5] = self.initial_dev, self.best_dev, self.last_dev
        latest = self._version(np.arange(n))
        scored = self.n_scores[np.arange(n), latest] > 0
        f[:, 6] = f[:, 7] = np.where(scored, self.means[np.arange(n), latest], -1.0)
        f[:, _F["train_set_pass_rate"]] = -1.0
        running = self.running & ~self.done
        f[:, _F["jobs_running"]] = running / 2
        f[:, _F["eval_running"]] = running
        f[:, _F[f"unfixed:{DEFECTS[0]}"]:_F[f"unfixed:{DEFECTS[-1]}"] + 1] = ~(self.fixed & self.harness_read[:, None])
        f[:, _F[f"fail_share:{FAILURE_MODES[0]}"]:_F[f"fail_share:{FAILURE_MODES[-1]}"] + 1] = self.fail_shares
        f[:, _F[f"pass_rate:{TEACHERS[0]}"]:_F[f"usd_per_100:{TEACHERS[-1]}"] + 1] = -1.0
        f[:, _F["eval_cost"]] = np.minimum(1.0, self.eval_cost / max(s.budget_usd, 1e-9))
        f[:, _F["evaluations"]] = np.minimum(self.evaluations, 5) / 5
        f[:, _F[f"benchmark:{s.benchmark}"]] = 1.0
        f[:, _F[f"track:{s.track}"]] = 1.0
        f[:, _F["last_error"]] = self.last_error
        f[:, _F["harness_read"]] = self.harness_read
        return np.clip(f.astype(np.float32), -1.0, 1.0)

    def _end_info(self, info: dict[str, Any], rows: np.ndarray) -> None:
        """The end keys of the rows whose episode ended this step (``_key`` masks mark them)."""
        n = self.num_envs
        s = self.scenario
        values = {
            "initial_score": self.initial_official, "official_score": self._final,
            "normalized_gain": self._reward, "best_dev_score": np.where(self.best_dev < 0, np.nan, self.best_dev),
            "initial_dev_score": np.where(self.initial_dev < 0, np.nan, self.initial_dev),
            "dev_evaluations": self.n_scores.sum(axis=1), "end_reason": self.end_reason, "steps": self.steps,
            "refusals": self.refusals, "spend_usd": self.spent_n / NANO, "budget_usd": np.full(n, s.budget_usd),
            "elapsed_h": self.clock / 3600.0,
        }
        present = np.zeros(n, bool)
        present[rows] = True
        for key in END_KEYS:
            info[key], info[f"_{key}"] = np.array(values[key], copy=True), present.copy()
