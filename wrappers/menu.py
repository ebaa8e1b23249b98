"""A discrete menu of research macro-actions with an action mask, for RL policies.

:class:`DiscreteMenu` wraps a research env so that the action is ``Discrete(len(MENU))`` and the
observation a ``Box`` of ``len(FEATURES)`` float32 features in [-1, 1]. Each menu entry (a
*macro*) becomes one or more real tool calls on the wrapped env; their rewards are summed and a
macro stops as soon as the episode ends. The mask says which entries can work now; it is in
``info["action_mask"]`` and in :meth:`DiscreteMenu.action_masks` (the sb3-contrib ``MaskablePPO``
convention). A masked entry is not refused by the wrapper: it is sent on and the env answers with
its own error (which is what "masked" promises: that call would fail).

The bookkeeping and the macro → tool-call mapping live in :class:`MenuAdapter`, which needs only the
observations and ``info`` dicts the env returns. A researcher on the raw env can therefore use the
same menu without the wrapper (see ``baselines/rl_researcher.py``): it asks the adapter for the
next tool call of the current macro, or for a new macro when that one is done.

>>> import gymnasium as gym, rsigym_env
>>> env = DiscreteMenu(gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=500))
>>> obs, info = env.reset(seed=3)  # a system whose replies get cut off
>>> obs.shape == (len(FEATURES),), bool(info["action_mask"][MENU_INDEX["wait"]])
(True, False)
>>> obs, reward, terminated, truncated, info = env.step(MENU_INDEX["fix:truncated_output"])
>>> info["calls"], info["ok"]
(['read', 'edit_harness'], True)
>>> obs, reward, terminated, truncated, info = env.step(MENU_INDEX["submit_latest"])
>>> terminated, reward > 0
(True, True)

Menu (``MENU``, in this order; ``MENU_INDEX`` maps names to indices)
    ====================================  ==============================================================
    ``eval_latest_k1``                    evaluate the latest candidate (newest checkpoint or base, latest
                                          harness) on dev, avg@1: a cheap diagnosis with failure modes
    ``eval_latest_k3``                    the same at avg@3, for selection
    ``eval_base_k3``                      base weights + latest harness, avg@3 (to compare a checkpoint with)
    ``fix:<defect>`` × 5                  set the ``harness.toml`` option that removes that defect (reads
                                          ``harness:latest/harness.toml`` first if it has not been read)
    ``gen:<teacher>:<n>`` × 3 × 4         ``generate_data`` of n ∈ {50, 500, 2000} synthetic examples; if the
                                          worst case does not fit the budget, n is cut once to fit
                                          ``FIT_SHARE`` of what is available. ``max``: up to ``MAX_CHUNKS``
                                          datasets, each cut to fit, until ``MAX_RESERVE`` of the budget is left
    ``clean``                             ``filter`` then ``dedupe`` every uncleaned generated dataset of the
                                          newest one's teacher, then ``mix`` them with that teacher's earlier
                                          cleaned data
    ``train:lr=<lr>`` × 3                 LoRA from base on the training set (the newest non-empty dataset
                                          the menu made), learning rate from ``LEARNING_RATES``; other
                                          fields at their (or the scenario's locked) defaults
    ``wait``                              ``wait`` for any running job
    ``submit_best``                       submit the candidate with the best mean dev score (the latest
                                          candidate if none has been evaluated)
    ``submit_latest``                     submit the latest candidate
    ====================================  ==============================================================

    With ``blocking=True`` (the default) the evaluate and train macros also wait for their job, so
    their result is in the observation that follows; ``wait`` is then only needed for jobs started
    outside the menu. With ``blocking=False`` they return once the job has started.

Mask
    An entry is masked when its tool is forbidden by the track, its teacher not allowed, its learning
    rate locked or not exposed by the scenario, a ``fix`` is already in the latest harness (or its
    option is not in the file), ``clean`` has no uncleaned generated dataset, ``train`` has no
    dataset, or ``wait`` has no running job.
    Budget is not masked (the ledger's refusal is the honest answer and costs nothing).

Observation (``FEATURES``, float32, all in [-1, 1]; -1 marks "not measured")
    ==========  ==================================================================================
    0-2         budget left, time left (fractions of the start), steps used (fraction of the limit)
    3-7         dev scores: initial, best, last, latest candidate (mean), base + latest harness (mean)
    8-12        has uncleaned generated data; has a training set; its size (log1p(n)/log1p(20000));
                its checker pass rate; it is cleaned
    13-15       has a checkpoint; the newest checkpoint was trained on the current training set;
                trainings started (/3)
    16-18       jobs running (/2), a train job running, an evaluate job running
    19-23       defect still unfixed in the latest harness (``DEFECTS`` order; 1 until the file is read)
    24-30       failure-mode shares of the last finished evaluation (``FAILURE_MODES``: share of attempts)
    31-33       best checker pass rate seen per teacher (``TEACHERS``), -1 if never used
    34-36       dollars per 100 examples per teacher as a share of the starting budget (capped at 1), -1
    37-39       last evaluation's cost (share of the budget), evaluations finished (/5), generations (/5)
    40-44       benchmark one-hot (``BENCHMARKS``)
    45-47       track one-hot (``TRACKS``)
    48          the last tool call failed
    49          the harness file has been read
    ==========  ==================================================================================
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Generator

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rsigym_env.catalog import BENCHMARKS, DEFECTS, FAILURE_MODES, REMEDY_FOR, SIM_TEACHERS, TRACKS

Action = dict[str, Any]
Step = tuple[dict[str, Any], dict[str, Any]]
MacroPlan = Generator[Action, Step, None]

# failure mode -> (harness.toml key, the value that removes it, the minimal harness's value)
FIXES: dict[str, tuple[str, str, str]] = {d: (REMEDY_FOR[d].key, REMEDY_FOR[d].fixed, REMEDY_FOR[d].minimal)
                                          for d in DEFECTS}
TEACHERS: tuple[str, ...] = SIM_TEACHERS
GEN_SIZES: tuple[int, ...] = (50, 500, 2000, 20_000)
LEARNING_RATES: tuple[float, ...] = (1.5e-4, 3e-4, 6e-4)
DEFAULT_LR = 3e-4
FIT_SHARE = 0.85  # a generation cut to fit asks for this share of the available money at its worst case
MAX_RESERVE = 0.15  # gen:<teacher>:max keeps this share of the starting budget (training, evaluations)
MAX_CHUNKS = 4  # and makes at most this many datasets
HARNESS_REF = "harness:latest/harness.toml"
MISSING = "none"  # a reference no run has: a masked macro that needs an artifact sends this and is refused


@dataclass(frozen=True)
class Macro:
    """One menu entry: ``kind`` says what it does, ``arg`` with what."""

    name: str
    kind: str
    arg: Any = None


def _build_menu() -> tuple[Macro, ...]:
    menu = [Macro("eval_latest_k1", "eval_latest", 1), Macro("eval_latest_k3", "eval_latest", 3),
            Macro("eval_base_k3", "eval_base", 3)]
    menu += [Macro(f"fix:{d}", "fix", d) for d in DEFECTS]
    menu += [Macro(f"gen:{t}:{'max' if n == GEN_SIZES[-1] else n}", "gen", (t, n)) for t in TEACHERS for n in GEN_SIZES]
    menu += [Macro("clean", "clean")]
    menu += [Macro(f"train:lr={lr:g}", "train", lr) for lr in LEARNING_RATES]
    menu += [Macro("wait", "wait"), Macro("submit_best", "submit_best"), Macro("submit_latest", "submit_latest")]
    return tuple(menu)


MENU: tuple[Macro, ...] = _build_menu()
MENU_INDEX: dict[str, int] = {m.name: i for i, m in enumerate(MENU)}
FEATURES: tuple[str, ...] = (
    "budget_left", "time_left", "steps_used",
    "dev_initial", "dev_best", "dev_last", "dev_latest_candidate", "dev_base_latest_harness",
    "has_raw_data", "has_train_set", "train_set_size", "train_set_pass_rate", "train_set_clean",
    "has_checkpoint", "checkpoint_current", "trainings",
    "jobs_running", "train_running", "eval_running",
    *(f"unfixed:{d}" for d in DEFECTS),
    *(f"fail_share:{m}" for m in FAILURE_MODES),
    *(f"pass_rate:{t}" for t in TEACHERS),
    *(f"usd_per_100:{t}" for t in TEACHERS),
    "eval_cost", "evaluations", "generations",
    *(f"benchmark:{b}" for b in BENCHMARKS),
    *(f"track:{t}" for t in TRACKS),
    "last_error", "harness_read",
)
_NEEDS = re.compile(r"needs \$([0-9.]+) but only \$([0-9.]+) is available")


@dataclass
class Dataset:
    id: str
    teacher: str
    n: int
    pass_rate: float
    clean: bool            # made by the menu's filter/dedupe/mix
    cleaned: bool = False  # (generated data) a clean descendant exists


@dataclass
class MenuState:
    """What the adapter knows about the run, all of it learned from observations and ``info``."""

    budget: float = 1.0
    time_h: float = 1.0
    max_steps: int = 200
    track: str = ""
    benchmark: str = ""
    tools: set[str] = field(default_factory=set)
    teachers: set[str] = field(default_factory=set)
    locks: dict[str, str] = field(default_factory=dict)
    harness: str = "latest"          # latest harness version id
    harness_text: str | None = None  # harness.toml of that version, once read
    datasets: dict[str, Dataset] = field(default_factory=dict)
    train_set: str | None = None
    pools: dict[str, str] = field(default_factory=dict)  # teacher -> its pooled clean dataset
    checkpoints: list[str] = field(default_factory=list)
    ckpt_data: dict[str, str] = field(default_factory=dict)  # checkpoint -> dataset it was trained on
    running: dict[str, str] = field(default_factory=dict)  # job -> kind
    pending: dict[str, str] = field(default_factory=dict)  # train job -> checkpoint
    finished: set[str] = field(default_factory=set)
    scores: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    dev_last: float = -1.0
    fail_shares: np.ndarray = field(default_factory=lambda: np.zeros(len(FAILURE_MODES)))
    pass_rates: dict[str, float] = field(default_factory=dict)
    usd_per_example: dict[str, float] = field(default_factory=dict)
    eval_cost: float = 0.0
    evaluations: int = 0
    generations: int = 0
    trainings: int = 0
    last_error: bool = False
    obs: dict[str, Any] = field(default_factory=dict)


class MenuAdapter:
    """The menu's bookkeeping and its macro → tool-call mapping, driven by the env's own outputs.

    Drive it like this (``DiscreteMenu`` and ``RLResearcher`` both do)::

        adapter.reset(obs, info)
        plan = adapter.plan(index)            # a generator of tool calls
        action = next(plan)
        obs, ..., info = env.step(action); adapter.observe(action, obs, info)
        action = plan.send((obs, info))       # ... until StopIteration

    Args:
        blocking: evaluate and train macros wait for their job (see the module docstring).
        scenario: the run's :class:`~rsigym_env.scenario.Scenario` if known; then the learning-rate mask
            also honours ``allow`` rules. Without it, locks are read from ``info["train_locks"]``.
    """

    def __init__(self, blocking: bool = True, scenario: Any = None):
        self.blocking = blocking
        self.scenario = scenario
        self.s = MenuState()

    # ------------------------------------------------------------------ tracking the run

    def reset(self, observation: dict[str, Any], info: dict[str, Any]) -> None:
        s = self.s = MenuState()
        s.budget = max(float(observation["budget_left_usd"][0]), 1e-9)
        s.time_h = max(float(observation["time_left_h"][0]), 1e-9)
        s.max_steps = int(info.get("max_steps", 200))
        s.track, s.benchmark = str(info.get("track", "")), str(info.get("benchmark", ""))
        s.tools = set(info.get("tools", []))
        s.teachers = set(info.get("teachers", []))
        s.locks = {str(k): str(v) for k, v in info.get("train_locks", {}).items()}
        s.harness = str(info.get("harness", "latest"))
        s.obs = observation

    def observe(self, action: Action, observation: dict[str, Any], info: dict[str, Any]) -> None:
        """Learn from the outcome of ``action`` (every tool call, whoever chose it)."""
        s = self.s
        s.obs = observation
        s.last_error = not info.get("ok", False)
        action = _as_dict(action)
        tool, args = action.get("tool"), action.get("args") or {}
        result = info.get("result") or {}
        if info.get("ok"):
            if tool == "generate_data":
                teacher, n = args["teacher"], int(result["n_examples"])
                rate = float(result.get("stats", {}).get("pass_rate", 0.0))
                s.datasets[result["id"]] = Dataset(result["id"], teacher, n, rate, clean=False)
                s.pass_rates[teacher] = max(rate, s.pass_rates.get(teacher, -1.0))
                s.usd_per_example[teacher] = float(info.get("cost_usd", 0.0)) / max(n, 1)
                s.generations += 1
                if n > 0:
                    s.train_set = result["id"]
            elif tool == "transform_data":
                sources = [s.datasets[d] for d in args.get("datasets", []) if d in s.datasets]
                teacher = sources[0].teacher if sources else ""
                n = int(result["n_examples"])
                s.datasets[result["id"]] = Dataset(result["id"], teacher, n,
                                                   float(result.get("stats", {}).get("pass_rate", 0.0)), clean=True)
                for src in sources:
                    src.cleaned = True
                if n > 0:
                    s.train_set = result["id"]
            elif tool == "train":
                s.running[result["job"]] = "train"
                s.pending[result["job"]] = result["checkpoint"]
                s.ckpt_data[result["checkpoint"]] = args.get("dataset", "")
                s.trainings += 1
            elif tool == "evaluate":
                s.running[result["job"]] = "evaluate"
            elif tool == "edit_harness":
                if args.get("base_version", "latest") not in ("latest", s.harness):
                    s.harness_text = None  # edited another version: read the file again when needed
                s.harness = result["version"]
                if args.get("path") == "harness.toml" and s.harness_text is not None:
                    if args.get("content") is not None:
                        s.harness_text = args["content"]
                    elif args.get("old") is not None:
                        s.harness_text = s.harness_text.replace(args["old"], args.get("new") or "", 1)
                elif args.get("path") == "harness.toml":
                    s.harness_text = None
            elif tool == "read" and str(args.get("ref", "")) in (HARNESS_REF, f"harness:{s.harness}/harness.toml"):
                text = observation.get("log", "").split("\n", 1)[-1]
                for event in info.get("events", []):
                    text = text.replace("\n" + event.get("text", ""), "")
                s.harness_text = text
        for event in info.get("events", []):
            job = event.get("job")
            s.finished.add(job)
            s.running.pop(job, None)
            if event.get("kind") == "train":
                s.pending.pop(job, None)
                if event.get("ok"):
                    s.checkpoints.append(event["checkpoint"])
            elif event.get("kind") == "evaluate" and event.get("ok"):
                key = (event["checkpoint"], event["harness"])
                s.scores.setdefault(key, []).append(float(event["score"]))
                s.dev_last = float(event["score"])
                attempts = max(1, int(event.get("n_tasks", 1)) * int(event.get("k", 1)))
                modes = event.get("failure_modes") or {}
                s.fail_shares = np.array([modes.get(m, 0) / attempts for m in FAILURE_MODES])
                s.eval_cost = float(event.get("cost_usd", 0.0))
                s.evaluations += 1
        if "running_jobs" in observation and int(observation["running_jobs"][0]) == 0:
            s.running.clear()

    # ------------------------------------------------------------------ what the policy sees

    def latest_candidate(self) -> tuple[str, str]:
        return (self.s.checkpoints[-1] if self.s.checkpoints else "base", self.s.harness)

    def best_candidate(self) -> tuple[str, str]:
        if not self.s.scores:
            return self.latest_candidate()
        return max(self.s.scores, key=lambda c: float(np.mean(self.s.scores[c])))

    def _fix_state(self, defect: str) -> str:
        """``unknown`` (harness not read yet), ``missing`` (no such option), ``fixed`` or ``unfixed``."""
        text = self.s.harness_text
        return "unknown" if text is None else _fix_state(text, defect)

    def _unfixed(self, defect: str) -> bool:
        return self._fix_state(defect) != "fixed"

    def _fixable(self, defect: str) -> bool:
        """A fix would change the file: unknown text, or the option present with another value."""
        return self._fix_state(defect) in ("unknown", "unfixed")

    def _raws(self) -> list[Dataset]:
        """Generated datasets not cleaned yet, oldest first."""
        return [d for d in self.s.datasets.values() if not d.clean and not d.cleaned and d.n > 0]

    def _lr_allowed(self, lr: float) -> bool:
        if self.scenario is not None:
            from rsigym_env.errors import ActionError
            from rsigym_env.platform.permissions import authorize
            from rsigym_env.tools import Train
            try:
                authorize(self.scenario, Train(dataset="x", **({} if lr == DEFAULT_LR else {"learning_rate": lr})))
            except ActionError:
                return False
            return True
        locked = self.s.locks.get("learning_rate")
        return lr == DEFAULT_LR or locked is None or math.isclose(float(locked), lr)

    def mask(self) -> np.ndarray:
        """Which menu entries can work now (bool, one per ``MENU`` entry)."""
        s = self.s
        tools = s.tools
        out = np.zeros(len(MENU), dtype=bool)
        for i, m in enumerate(MENU):
            if m.kind in ("eval_latest", "eval_base"):
                ok = "evaluate" in tools
            elif m.kind == "fix":
                ok = "edit_harness" in tools and self._fixable(m.arg)
            elif m.kind == "gen":
                ok = "generate_data" in tools and m.arg[0] in s.teachers
            elif m.kind == "clean":
                ok = "transform_data" in tools and bool(self._raws())
            elif m.kind == "train":
                ok = "train" in tools and s.train_set is not None and self._lr_allowed(m.arg)
            elif m.kind == "wait":
                ok = "wait" in tools and int(s.obs.get("running_jobs", [0])[0]) > 0
            else:
                ok = "submit" in tools
            out[i] = ok
        return out

    def features(self) -> np.ndarray:
        """The observation vector (see ``FEATURES`` and the module docstring)."""
        s, obs = self.s, self.s.obs
        f: list[float] = [
            float(obs["budget_left_usd"][0]) / s.budget,
            float(obs["time_left_h"][0]) / s.time_h,
            float(obs["step"][0]) / max(s.max_steps, 1),
        ]
        dev = obs["dev_scores"]
        latest, base = self.latest_candidate(), ("base", s.harness)
        f += [float(dev[0]), float(dev[1]), float(dev[2]),
              float(np.mean(s.scores[latest])) if latest in s.scores else -1.0,
              float(np.mean(s.scores[base])) if base in s.scores else -1.0]
        ts = s.datasets.get(s.train_set) if s.train_set else None
        f += [float(bool(self._raws())), float(ts is not None),
              math.log1p(ts.n) / math.log1p(20_000) if ts else 0.0,
              ts.pass_rate if ts else -1.0, float(ts.clean) if ts else 0.0]
        newest = s.checkpoints[-1] if s.checkpoints else None
        f += [float(newest is not None), float(newest is not None and s.ckpt_data.get(newest) == s.train_set),
              min(s.trainings, 3) / 3]
        kinds = list(s.running.values())
        f += [min(int(obs["running_jobs"][0]), 2) / 2, float("train" in kinds), float("evaluate" in kinds)]
        f += [float(self._unfixed(d)) for d in DEFECTS]
        f += list(s.fail_shares)
        f += [s.pass_rates.get(t, -1.0) for t in TEACHERS]
        f += [min(1.0, 100 * s.usd_per_example[t] / s.budget) if t in s.usd_per_example else -1.0 for t in TEACHERS]
        f += [min(1.0, s.eval_cost / s.budget), min(s.evaluations, 5) / 5, min(s.generations, 5) / 5]
        f += [float(s.benchmark == b) for b in BENCHMARKS]
        f += [float(s.track == t) for t in TRACKS]
        f += [float(s.last_error), float(s.harness_text is not None)]
        return np.clip(np.asarray(f, dtype=np.float32), -1.0, 1.0)

    # ------------------------------------------------------------------ macros -> tool calls

    def plan(self, index: int) -> MacroPlan:
        """The tool calls of menu entry ``index``: a generator that is sent ``(obs, info)`` after each.

        It always yields at least one call. Entries that are masked yield a call the env refuses.
        """
        if not 0 <= int(index) < len(MENU):
            return self._refused(f"menu index {index} out of range 0..{len(MENU) - 1}")
        m = MENU[int(index)]
        return getattr(self, "_" + m.kind)(m.arg)

    def _refused(self, why: str) -> MacroPlan:
        # an action the env rejects as malformed: its error observation is the answer
        yield {"tool": "menu", "args": {"error": why}}

    def _eval_latest(self, k: int) -> MacroPlan:
        ckpt, harness = self.latest_candidate()
        yield from self._evaluate(ckpt, harness, k)

    def _eval_base(self, k: int) -> MacroPlan:
        yield from self._evaluate("base", self.s.harness, k)

    def _evaluate(self, ckpt: str, harness: str, k: int) -> MacroPlan:
        obs, info = yield {"tool": "evaluate", "args": {"checkpoint": ckpt, "harness": harness, "k": k}}
        if info.get("ok") and self.blocking:
            yield from self._wait_for(info["result"]["job"])

    def _wait_for(self, job: str) -> MacroPlan:
        while job not in self.s.finished:
            obs, info = yield {"tool": "wait", "args": {"job": job}}
            if not info.get("ok") and job not in self.s.finished:
                return

    def _fix(self, defect: str) -> MacroPlan:
        key, fixed, unfixed = FIXES[defect]
        if self.s.harness_text is None:
            obs, info = yield {"tool": "read", "args": {"ref": HARNESS_REF}}
            if not info.get("ok") or self.s.harness_text is None:
                return
        line = _option_line(self.s.harness_text, key)
        if line is None or line.group(1).strip() == fixed:  # nothing to fix: a patch the env refuses
            yield {"tool": "edit_harness", "args": {"path": "harness.toml", "old": f"{key} = {unfixed}",
                                                    "new": f"{key} = {fixed}"}}
            return
        yield {"tool": "edit_harness", "args": {"path": "harness.toml", "old": line.group(0), "new": f"{key} = {fixed}"}}

    def _gen(self, arg: tuple[str, int]) -> MacroPlan:
        teacher, n = arg
        if n < GEN_SIZES[-1]:
            obs, info = yield {"tool": "generate_data", "args": {"teacher": teacher, "n_examples": n}}
            if info.get("error") == "insufficient_budget":
                fit = self._fit(n, info, 0.0)
                if fit >= 1:
                    yield {"tool": "generate_data", "args": {"teacher": teacher, "n_examples": fit}}
            return
        # max: chunks, each cut to fit, until only the reserve is left (or a chunk would be tiny)
        reserve = MAX_RESERVE * self.s.budget
        for chunk in range(MAX_CHUNKS):
            obs, info = yield {"tool": "generate_data", "args": {"teacher": teacher, "n_examples": n}}
            if info.get("error") != "insufficient_budget":
                return
            fit = self._fit(n, info, reserve)
            if fit < (1 if chunk == 0 else GEN_SIZES[0]):
                return
            obs, info = yield {"tool": "generate_data", "args": {"teacher": teacher, "n_examples": fit}}
            if not info.get("ok"):
                return

    @staticmethod
    def _fit(n: int, info: dict[str, Any], reserve: float) -> int:
        """Examples whose worst case fits ``FIT_SHARE`` of (available − reserve), from a refusal's message."""
        found = _NEEDS.search(info.get("message", ""))
        if not found or float(found.group(1)) <= 0:
            return 0
        return int(n * FIT_SHARE * max(0.0, float(found.group(2)) - reserve) / float(found.group(1)))

    def _clean(self, _: Any) -> MacroPlan:
        raws = self._raws()
        if not raws:
            yield {"tool": "transform_data", "args": {"operation": "filter", "datasets": [MISSING]}}
            return
        teacher = raws[-1].teacher
        cleaned = []
        for raw in [d for d in raws if d.teacher == teacher]:
            current = raw.id
            for operation in ("filter", "dedupe"):
                obs, info = yield {"tool": "transform_data", "args": {"operation": operation, "datasets": [current]}}
                if not info.get("ok") or int(info["result"]["n_examples"]) == 0:
                    current = ""
                    break
                current = info["result"]["id"]
            if current:
                cleaned.append(current)
        parts = ([self.s.pools[teacher]] if teacher in self.s.pools else []) + cleaned
        if len(parts) > 1:
            obs, info = yield {"tool": "transform_data", "args": {"operation": "mix", "datasets": parts[:8]}}
            if info.get("ok"):
                parts = [info["result"]["id"]]
        if parts:
            self.s.pools[teacher] = parts[-1]

    def _train(self, lr: float) -> MacroPlan:
        args: dict[str, Any] = {"dataset": self.s.train_set or MISSING}
        if lr != DEFAULT_LR:
            args["learning_rate"] = lr
        obs, info = yield {"tool": "train", "args": args}
        if info.get("ok") and self.blocking:
            yield from self._wait_for(info["result"]["job"])

    def _wait(self, _: Any) -> MacroPlan:
        yield {"tool": "wait", "args": {}}

    def _submit_best(self, _: Any) -> MacroPlan:
        ckpt, harness = self.best_candidate()
        yield {"tool": "submit", "args": {"checkpoint": ckpt, "harness": harness}}

    def _submit_latest(self, _: Any) -> MacroPlan:
        ckpt, harness = self.latest_candidate()
        yield {"tool": "submit", "args": {"checkpoint": ckpt, "harness": harness}}


def _as_dict(action: Any) -> dict[str, Any]:
    """Any action form ``step`` takes, as ``{"tool": ..., "args": {...}}`` ({} if it cannot be read)."""
    if isinstance(action, dict):
        return action
    if hasattr(action, "model_dump") and hasattr(action, "name"):
        return {"tool": action.name, "args": action.model_dump()}
    if isinstance(action, (str, bytes)):
        try:
            parsed = json.loads(action)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


@functools.cache
def _option_pattern(key: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(key)}\s*=\s*([^#\n]*?)(?=\s*(?:#|$))", re.M)


def _option_line(text: str, key: str) -> re.Match[str] | None:
    """``key = value`` in harness.toml (group 1: the value without its comment)."""
    return _option_pattern(key).search(text)


@functools.lru_cache(maxsize=256)
def _fix_state(text: str, defect: str) -> str:
    """``missing``, ``fixed`` or ``unfixed``: ``defect``'s option in the harness.toml ``text`` (the mask and the
    features ask for every defect at every step, of the same few texts)."""
    key, fixed, _ = FIXES[defect]
    line = _option_line(text, key)
    if line is None:
        return "missing"
    return "fixed" if line.group(1).strip() == fixed else "unfixed"


class DiscreteMenu(gym.Wrapper[np.ndarray, np.int64, dict[str, Any], Any], gym.utils.RecordConstructorArgs):
    """``Discrete(len(MENU))`` macro-actions with an action mask over a research env.

    Args:
        env: a research env (``RSIGym/Joint-v0``, ``Data-v0`` or ``Harness-v0``, or ``ResearchEnv``).
        blocking: evaluate and train macros wait for their job (default True).

    ``step`` returns the summed reward of the macro's calls; ``info`` is the last call's, with
    ``events`` of all of them, ``calls`` (tool names), ``errors`` (error codes), ``macro`` and
    ``action_mask``.
    """

    def __init__(self, env: gym.Env, blocking: bool = True):
        gym.utils.RecordConstructorArgs.__init__(self, blocking=blocking)
        gym.Wrapper.__init__(self, env)
        self.adapter = MenuAdapter(blocking=blocking, scenario=getattr(env.unwrapped, "scenario", None))
        self.action_space = spaces.Discrete(len(MENU))
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(len(FEATURES),), dtype=np.float32)
        self._done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.adapter.scenario = getattr(self.env.unwrapped, "scenario", None)
        self.adapter.reset(obs, info)
        self._done = False
        return self.adapter.features(), {**info, "action_mask": self.adapter.mask()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        plan = self.adapter.plan(int(action)) if np.ndim(action) == 0 else self.adapter._refused("not an index")
        call = next(plan)
        total, events, calls, errors = 0.0, [], [], []
        while True:
            obs, reward, terminated, truncated, info = self.env.step(call)
            self.adapter.observe(call, obs, info)
            total += float(reward)
            events += info.get("events", [])
            calls.append(str(info.get("tool", call.get("tool"))))
            if not info.get("ok", False):
                errors.append(info.get("error", "error"))
            if terminated or truncated:
                break
            try:
                call = plan.send((obs, info))
            except StopIteration:
                break
        info = {**info, "events": events, "calls": calls, "errors": errors,
                "macro": MENU[int(action)].name if np.ndim(action) == 0 and 0 <= int(action) < len(MENU) else str(action),
                "action_mask": self.adapter.mask()}
        return self.adapter.features(), total, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """The current mask (sb3-contrib ``MaskablePPO`` calls this)."""
        return self.adapter.mask()
