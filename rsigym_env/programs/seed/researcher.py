"""The seed researcher program: the scripted researcher as a standard-library program whose strategy is data.

With the defaults below it plays exactly the actions of ``baselines/scripted_researcher.py``
(``ScriptedResearcher()``): diagnose the initial system on dev (avg@1), fix the harness defects the
failures show, probe every teacher, buy data from the one whose examples pass most often with 40% of the
budget, filter and dedupe, train once (the base model's dev run starts while it trains), compare the
candidates on dev (avg@3) and submit the best.

Every choice lives in the literals ``STRATEGY`` (gene -> value), ``ALLELES`` (categorical gene -> the
values allowed; for a list gene, its allowed elements), ``RANGES`` (numeric gene -> ``[low, high,
step]``, step ``"mul"``, ``"add"`` or ``"dbl"``), ``PHASES`` (the plan: phase names run in order) and
``OPTIONAL_PHASES`` (phases implemented here but not in the default plan). Each phase ``x`` is the
generator function ``phase_x(ctx)``; they share one :class:`Context`. An improver edits those literals
(or adds phases); ``make_researcher(params)`` builds the researcher, ``params`` overriding ``STRATEGY``
entries of the same name (keys ``improve_<x>`` go, as ``x``, to the improver of a spec harness).

On a harness that is a researcher spec (the recursive world) it delegates to ``improver.make_improver``
when a module ``improver`` is part of the program, else it submits at once.
"""

from __future__ import annotations

import re
from typing import Any, Generator

try:  # the program's modules are flat: common.py sits next to this file
    from common import Action, Plan, Step, ToolPlanResearcher, is_spec_harness, scalar
except ImportError:  # imported as part of a package (tools)
    from .common import Action, Plan, Step, ToolPlanResearcher, is_spec_harness, scalar  # type: ignore[no-redef]

try:
    import improver
except ImportError:  # the program has no improver module: a spec harness is submitted unchanged
    improver = None

STRATEGY = {
    "diagnose_k": 1,                  # attempts per task of the diagnosis (and of rediagnose)
    "fix_harness": "observed",        # which harness options to switch (see ALLELES)
    "fix_min_share": 0.0,             # "observed"/"top1": fix a mode only if its share of attempts is at least this
    "teacher_rule": "pass_rate",      # how the probed teacher is chosen
    "probe_examples": 20,             # examples per teacher when probing
    "data_fraction": 0.4,             # share of the starting budget for teacher data (probes included)
    "data_chunks": 1,                 # generate_data calls at most for that money (then mixed)
    "eval_reserve": 0,                # avg@k dev evaluations (priced from the diagnosis) the data money leaves
    "max_examples": 20000,            # examples bought at most
    "max_tokens_per_example": 8192,   # completion cap of generated examples (8192: the tool's default)
    "data_source": "synthetic",       # prompts of the bought data
    "transforms": ["filter", "dedupe"],  # applied in this order to the bought data
    "learning_rate_scale": 1.0,       # learning rate = 3e-4 x this (1.0: not passed)
    "num_epochs": 1,                  # (1: not passed)
    "lora_rank": 16,                  # (16: not passed)
    "lr_schedule": "linear",          # ("linear": not passed)
    "early_base_eval": True,          # compare="finalists": evaluate the base finalist while training
    "k": 3,                           # attempts per task when comparing candidates
    "compare": "finalists",           # which candidates the compare phase evaluates
    "submit_rule": "best",            # which candidate is submitted
    "second_fraction": 0.3,           # share of the starting budget for second_distil / mix_teachers data
    "followup_lr_scale": 0.5,         # retrain / second_distil learning rate = the main one x this
}

ALLELES = {
    "fix_harness": ["observed", "top1", "all", "none"],
    "teacher_rule": ["pass_rate", "pass_per_dollar", "cheapest", "priciest", "first"],
    "data_source": ["synthetic", "dev"],
    "transforms": ["filter", "dedupe"],
    "lr_schedule": ["linear", "constant", "cosine"],
    "early_base_eval": [True, False],
    "compare": ["finalists", "checkpoints", "none"],
    "submit_rule": ["best", "latest"],
}

RANGES = {
    "diagnose_k": [1, 4, "add"],
    "fix_min_share": [0.0, 0.2, "add"],
    "probe_examples": [5, 200, "mul"],
    "data_fraction": [0.05, 0.95, "add"],
    "data_chunks": [1, 6, "add"],
    "eval_reserve": [0, 6, "add"],
    "max_examples": [500, 20000, "mul"],
    "max_tokens_per_example": [1024, 32768, "dbl"],
    "learning_rate_scale": [0.25, 4.0, "mul"],
    "num_epochs": [1, 4, "add"],
    "lora_rank": [4, 128, "dbl"],
    "k": [1, 8, "add"],
    "second_fraction": [0.05, 0.6, "add"],
    "followup_lr_scale": [0.25, 2.0, "mul"],
}

PHASES = ["diagnose", "fix_harness", "distil", "compare", "submit"]

OPTIONAL_PHASES = ["rediagnose", "verify_harness", "second_distil", "mix_teachers", "retrain", "recompare"]

# failure mode seen in evaluation traces -> [harness.toml key, the value that removes it] (catalog.REMEDIES)
FIXES = {
    "truncated_output": ["on_truncation", '"continue"'],
    "unverified_completion": ["verify_before_submit", "true"],
    "lost_shell_state": ["persistent", "true"],
    "action_loop": ["detect", "true"],
    "unchecked_edit": ["check", "true"],
    "missing_skill": ["load_skills", "true"],
}

HARNESS_FILE = "harness.toml"
REFERENCE_LR = 3e-4
TRAIN_DEFAULTS = {"num_epochs": 1, "lora_rank": 16, "lr_schedule": "linear"}
TRAIN_REFUSALS = ("field_locked", "field_not_allowed")
MAX_MIX = 8  # transform_data takes at most this many datasets

Candidate = tuple[str, str]  # (checkpoint, harness version)


class Context:
    """What the phases share: the strategy, the run's facts from ``reset`` and what was learned since."""

    def __init__(self, researcher: SeedResearcher, observation: dict[str, Any], info: dict[str, Any],
                 strategy: dict[str, Any]):
        self.r = researcher
        self.s = strategy
        self.tools: set[str] = set(info.get("tools") or [])
        self.teachers: list[str] = list(info.get("teachers") or [])
        self.locks: dict[str, Any] = dict(info.get("train_locks") or {})
        self.budget_start = scalar(observation.get("budget_left_usd"), scalar(info.get("budget_usd")))
        self.latest_version: str | None = info.get("harness")  # the newest harness version known
        self.harness = "latest"                   # the harness version candidates use
        self.harness_text: str | None = None      # harness.toml of ``harness``, once read
        self.initial_harness: str | None = None   # the version the first diagnosis measured
        self.failure_modes: dict[str, int] = {}   # of the last diagnosis
        self.attempts = 0                         # attempts of the last diagnosis (tasks x k)
        self.eval_usd_per_k = 0.0                 # dollars of a dev evaluation per attempt per task (diagnosis)
        self.candidates: dict[Candidate, float] = {}  # measured dev scores
        self.compared: set[Candidate] = set()     # candidates already measured at avg@k (not measured again)
        self.checkpoints: list[str] = []          # trained, in order
        self.early: dict[Candidate, str] = {}     # evaluations started but not yet collected -> job
        self.probes: dict[str, tuple[float, float]] = {}  # teacher -> (pass rate, dollars per example)
        self.teacher: str | None = None           # the teacher distil bought from
        self.dataset: str | None = None           # the training set of the first distil
        self.stopped = False                      # nothing could be measured: end with the default submit
        self.submitted = False

    def budget_left(self) -> float:
        """Dollars left, from the newest observation."""
        return scalar(self.r.observation.get("budget_left_usd"), self.budget_start)


# ---------------------------------------------------------------------------------------------- phases


def phase_diagnose(ctx: Context) -> Plan:
    """Evaluate the base model with the current harness (avg@diagnose_k): its failure modes, a candidate."""
    if "evaluate" not in ctx.tools:
        return
    result = yield from ctx.r.evaluate("base", ctx.harness, ctx.s["diagnose_k"])
    if result is None:
        if not ctx.candidates and not ctx.checkpoints:
            ctx.stopped = True  # as the scripted researcher: nothing measured, nothing to build on
        return
    _record_diagnosis(ctx, result)


def phase_fix_harness(ctx: Context) -> Plan:
    """Switch the harness.toml options that remove the failure modes the diagnosis showed (fix_harness)."""
    yield from _fix(ctx)


def phase_distil(ctx: Context) -> Plan:
    """Probe every teacher, buy data from the chosen one, transform it and train from base; while it
    trains the base finalist is evaluated (early_base_eval)."""
    if not ({"generate_data", "train"} <= ctx.tools and ctx.teachers):
        return
    s = ctx.s
    if not ctx.probes:
        yield from _probe(ctx)
    if not ctx.probes:
        return
    teacher = _choose_teacher(ctx.probes, s["teacher_rule"])
    spent = sum(cost * s["probe_examples"] for _, cost in ctx.probes.values())
    made = yield from _buy(ctx, teacher, _data_money(ctx, ctx.budget_start * s["data_fraction"] - spent),
                           ctx.probes[teacher][1])
    dataset = yield from _prepare(ctx, made)
    if dataset is None:
        return
    ctx.teacher = ctx.teacher or teacher
    ctx.dataset = ctx.dataset or dataset
    early = s["early_base_eval"] and s["compare"] == "finalists" and "evaluate" in ctx.tools
    checkpoint = yield from _train(ctx, dataset, "base", s["learning_rate_scale"], while_training=early)
    if checkpoint is not None:
        ctx.checkpoints.append(checkpoint)


def phase_compare(ctx: Context) -> Plan:
    """Evaluate the finalists on dev (avg@k): the base model with the current harness (compare="finalists")
    and every checkpoint; evaluations started earlier are collected."""
    rule = ctx.s["compare"]
    if rule == "none" or "evaluate" not in ctx.tools:
        return
    finalists = ([("base", ctx.harness)] if rule == "finalists" else []) + [(c, ctx.harness) for c in ctx.checkpoints]
    if ctx.harness == ctx.initial_harness and not ctx.checkpoints and not ctx.early:
        finalists = []  # nothing changed: the diagnosis is the only measurement needed
    for candidate in finalists + [c for c in ctx.early if c not in finalists]:
        if candidate in ctx.early:
            event = yield from ctx.r.wait_for(ctx.early.pop(candidate))
            result = event if event and event.get("ok") else None
        elif candidate in ctx.compared:
            continue
        else:
            result = yield from ctx.r.evaluate(candidate[0], candidate[1], ctx.s["k"])
        if result is not None:
            ctx.candidates[candidate] = result["score"]
            ctx.compared.add(candidate)


def phase_submit(ctx: Context) -> Plan:
    """Submit the best measured candidate (submit_rule="best") or the newest one ("latest")."""
    _collect_finished(ctx)
    latest = (ctx.checkpoints[-1] if ctx.checkpoints else "base", ctx.harness)
    best = max(ctx.candidates, key=lambda c: ctx.candidates[c]) if ctx.candidates else latest
    checkpoint, harness = latest if ctx.s["submit_rule"] == "latest" else best
    ctx.submitted = True
    _, info = yield {"tool": "submit", "args": {"checkpoint": checkpoint, "harness": harness}}
    if info.get("ok") and "job" in (info.get("result") or {}):  # submission as a job (async_jobs): wait for it
        yield from ctx.r.wait_for(info["result"]["job"])


def phase_rediagnose(ctx: Context) -> Plan:
    """Diagnose again with the current harness (defects too rare to show in the first diagnosis may show
    now) and fix what shows."""
    if "evaluate" not in ctx.tools:
        return
    result = yield from ctx.r.evaluate("base", ctx.harness, ctx.s["diagnose_k"])
    if result is None:
        return
    _record_diagnosis(ctx, result)
    yield from _fix(ctx)


def phase_verify_harness(ctx: Context) -> Plan:
    """Evaluate the base model with the edited harness (avg@k); keep the initial harness if it scores lower."""
    if "evaluate" not in ctx.tools or ctx.initial_harness is None or ctx.harness == ctx.initial_harness:
        return
    result = yield from ctx.r.evaluate("base", ctx.harness, ctx.s["k"])
    if result is None:
        return
    ctx.candidates[("base", ctx.harness)] = result["score"]
    ctx.compared.add(("base", ctx.harness))
    if result["score"] < ctx.candidates.get(("base", ctx.initial_harness), -1.0):
        ctx.harness, ctx.harness_text = ctx.initial_harness, None


def phase_second_distil(ctx: Context) -> Plan:
    """Continue training the newest checkpoint on fresh data of the same teacher (second_fraction of the
    budget, learning rate x followup_lr_scale): a new candidate."""
    if not ctx.checkpoints or ctx.teacher is None or not {"generate_data", "train"} <= ctx.tools:
        return
    money = _data_money(ctx, ctx.budget_start * ctx.s["second_fraction"])
    made = yield from _buy(ctx, ctx.teacher, money, ctx.probes[ctx.teacher][1])
    dataset = yield from _prepare(ctx, made)
    if dataset is None:
        return
    scale = ctx.s["learning_rate_scale"] * ctx.s["followup_lr_scale"]
    checkpoint = yield from _train(ctx, dataset, ctx.checkpoints[-1], scale)
    if checkpoint is not None:
        ctx.checkpoints.append(checkpoint)


def phase_mix_teachers(ctx: Context) -> Plan:
    """Buy data from the runner-up teacher too (second_fraction of the budget), mix it with the first
    training set and train from base: a new candidate."""
    if ctx.dataset is None or len(ctx.probes) < 2 or not {"generate_data", "transform_data", "train"} <= ctx.tools:
        return
    others = {t: p for t, p in ctx.probes.items() if t != ctx.teacher}
    runner_up = _choose_teacher(others, ctx.s["teacher_rule"])
    money = _data_money(ctx, ctx.budget_start * ctx.s["second_fraction"])
    made = yield from _buy(ctx, runner_up, money, ctx.probes[runner_up][1])
    extra = yield from _prepare(ctx, made)
    if extra is None:
        return
    info = yield from ctx.r.call(_transform("mix", [ctx.dataset, extra]))
    if not info.get("ok"):
        return
    checkpoint = yield from _train(ctx, info["result"]["id"], "base", ctx.s["learning_rate_scale"])
    if checkpoint is not None:
        ctx.checkpoints.append(checkpoint)


def phase_retrain(ctx: Context) -> Plan:
    """Train from base again on the first training set at the learning rate x followup_lr_scale: a new candidate."""
    if ctx.dataset is None or "train" not in ctx.tools:
        return
    scale = ctx.s["learning_rate_scale"] * ctx.s["followup_lr_scale"]
    checkpoint = yield from _train(ctx, ctx.dataset, "base", scale)
    if checkpoint is not None:
        ctx.checkpoints.append(checkpoint)


def phase_recompare(ctx: Context) -> Plan:
    """Evaluate the two best candidates again (avg@k) and keep the mean of both measurements."""
    if "evaluate" not in ctx.tools:
        return
    _collect_finished(ctx)
    top = sorted(ctx.candidates, key=lambda c: -ctx.candidates[c])[:2]
    if len(top) < 2:
        return
    for candidate in top:
        result = yield from ctx.r.evaluate(candidate[0], candidate[1], ctx.s["k"])
        if result is not None:
            ctx.candidates[candidate] = 0.5 * (ctx.candidates[candidate] + result["score"])
            ctx.compared.add(candidate)


# --------------------------------------------------------------------------------------------- helpers


def _record_diagnosis(ctx: Context, result: dict[str, Any]) -> None:
    """Keep a diagnosis: failure modes, the version it measured (now the current one), a candidate."""
    version = result.get("harness") or ctx.harness
    ctx.failure_modes = dict(result.get("failure_modes") or {})
    ctx.attempts = int(result.get("n_tasks") or 0) * int(result.get("k") or 1)
    ctx.eval_usd_per_k = float(result.get("cost_usd") or 0.0) / max(int(result.get("k") or 1), 1)
    if ctx.initial_harness is None:
        ctx.initial_harness = version
    if version != ctx.harness:
        ctx.harness_text = None
    ctx.harness = version
    ctx.candidates[("base", version)] = result["score"]


def _modes_to_fix(ctx: Context) -> list[str]:
    """The failure modes whose options to switch, in order: most frequent first (fix_harness, fix_min_share)."""
    rule = ctx.s["fix_harness"]
    if rule == "all":
        return list(FIXES)
    floor = ctx.s["fix_min_share"] * ctx.attempts
    seen = [m for m, c in sorted(ctx.failure_modes.items(), key=lambda kv: -kv[1]) if c > 0 and c >= floor]
    if rule == "top1":
        return [m for m in seen if m in FIXES][:1]
    return seen if rule == "observed" else []


def _fix(ctx: Context) -> Plan:
    """Read harness.toml of the current version and switch one option per failure mode to fix."""
    if ctx.s["fix_harness"] == "none" or not {"edit_harness", "read"} <= ctx.tools:
        return
    on_latest = ctx.harness in ("latest", ctx.latest_version)
    if ctx.harness_text is None:
        ref = "harness:latest/" + HARNESS_FILE if on_latest else f"harness:{ctx.harness}/{HARNESS_FILE}"
        obs, info = yield {"tool": "read", "args": {"ref": ref}}
        ctx.harness_text = obs["log"].split("\n", 1)[-1] if info.get("ok") else ""
    text = ctx.harness_text
    for mode in _modes_to_fix(ctx):
        key, value = FIXES.get(mode, (None, None))
        line = re.search(rf"^{key}\s*=\s*[^#\n]*?(?=\s*(#|$))", text, re.M) if key else None
        if line is None or line.group(0) == f"{key} = {value}":
            continue
        args = {"path": HARNESS_FILE, "old": line.group(0), "new": f"{key} = {value}"}
        if not on_latest:
            args["base_version"] = ctx.harness
        obs, info = yield {"tool": "edit_harness", "args": args}
        if info.get("ok"):
            ctx.harness = ctx.latest_version = info["result"]["version"]
            on_latest = True
            text = text.replace(line.group(0), f"{key} = {value}")
            ctx.harness_text = text


def _probe(ctx: Context) -> Plan:
    """Buy ``probe_examples`` from every teacher: pass rate and dollars per example of each."""
    n = ctx.s["probe_examples"]
    for teacher in ctx.teachers:
        info = yield from ctx.r.call(_generate(ctx, teacher, n, probe=True))
        if not info.get("ok"):
            continue
        ctx.probes[teacher] = ((info["result"].get("stats") or {}).get("pass_rate", 0.0), info.get("cost_usd", 0.0) / n)


def _choose_teacher(probes: dict[str, tuple[float, float]], rule: str) -> str:
    """The teacher to buy from (teacher_rule); ties go to the cheaper, then the earlier one."""
    if rule == "pass_per_dollar":
        return max(probes, key=lambda t: (probes[t][0] / max(probes[t][1], 1e-12), -probes[t][1]))
    if rule == "cheapest":
        return min(probes, key=lambda t: (probes[t][1], -probes[t][0]))
    if rule == "priciest":
        return max(probes, key=lambda t: (probes[t][1], probes[t][0]))
    if rule == "first":
        return next(iter(probes))
    return max(probes, key=lambda t: (probes[t][0], -probes[t][1]))


def _generate(ctx: Context, teacher: str, n: int, probe: bool = False) -> Action:
    """A generate_data call; source and completion cap only when they differ from the tool's defaults."""
    args: dict[str, Any] = {"teacher": teacher, "n_examples": n}
    if ctx.s["data_source"] != "synthetic" and not probe:
        args["source"] = ctx.s["data_source"]
    if ctx.s["max_tokens_per_example"] != 8192:
        args["max_tokens_per_example"] = int(ctx.s["max_tokens_per_example"])
    return {"tool": "generate_data", "args": args}


def _data_money(ctx: Context, money: float) -> float:
    """``money``, cut (eval_reserve > 0) to leave ``eval_reserve`` avg@k dev evaluations' worth of the budget."""
    if ctx.s["eval_reserve"] <= 0:
        return money
    return min(money, ctx.budget_left() - ctx.s["eval_reserve"] * ctx.s["k"] * ctx.eval_usd_per_k)


def _buy(ctx: Context, teacher: str, money: float, per_example: float) -> Generator[Action, Step, list[str]]:
    """Datasets of ``teacher`` for about ``money`` dollars, in up to ``data_chunks`` calls; a call whose worst
    case does not fit is scaled down to what does. Empty if nothing could be bought."""
    s = ctx.s
    made: list[str] = []
    bought = 0
    for _chunk in range(max(1, int(s["data_chunks"]))):
        n = min(s["max_examples"] - bought, int(money / max(per_example, 1e-9)))
        dataset = None
        while n >= s["probe_examples"] and dataset is None:
            info = yield from ctx.r.call(_generate(ctx, teacher, n))
            if info.get("ok"):
                dataset = info["result"]["id"]
            elif info.get("error") == "insufficient_budget":  # the worst case did not fit: scale to what does
                scale = info.get("available_usd", 0.0) / max(info.get("requested_usd", 0.0), 1e-12)
                n = min(n - 1, int(n * scale * 0.98)) if scale > 0 else n // 2
            else:
                return made
        if dataset is None:
            break
        made.append(dataset)
        cost = float(info.get("cost_usd") or 0.0)
        bought += n
        money -= cost
        if cost > 0:
            per_example = cost / n
    return made


def _transform(operation: str, datasets: list[str]) -> Action:
    """A transform_data call."""
    return {"tool": "transform_data", "args": {"operation": operation, "datasets": datasets}}


def _prepare(ctx: Context, made: list[str]) -> Generator[Action, Step, str | None]:
    """One training set from ``made``: mixed if there are several, then each of ``transforms`` (kept only
    if it leaves examples). None if there is no data."""
    if not made:
        return None
    dataset = made[0]
    if len(made) > 1 and "transform_data" in ctx.tools:
        info = yield from ctx.r.call(_transform("mix", made[:MAX_MIX]))
        if info.get("ok"):
            dataset = info["result"]["id"]
    if "transform_data" not in ctx.tools:
        return dataset
    for operation in ctx.s["transforms"]:
        info = yield from ctx.r.call(_transform(operation, [dataset]))
        if info.get("ok") and info["result"]["n_examples"] > 0:
            dataset = info["result"]["id"]
    return dataset


def _train_fields(ctx: Context, lr_scale: float) -> dict[str, Any]:
    """The training fields that differ from the defaults, minus the ones the scenario locks."""
    s = ctx.s
    fields: dict[str, Any] = {}
    if lr_scale != 1.0:
        fields["learning_rate"] = REFERENCE_LR * lr_scale
    for name, default in TRAIN_DEFAULTS.items():
        if s[name] != default:
            fields[name] = s[name]
    return {k: v for k, v in fields.items() if k not in ctx.locks}


def _train(ctx: Context, dataset: str, base: str, lr_scale: float,
           while_training: bool = False) -> Generator[Action, Step, str | None]:
    """Train on ``dataset`` from ``base``; the new checkpoint id or None. A refused non-default field is
    dropped (one retry at the defaults). With ``while_training`` the base finalist's evaluation starts
    once the job runs."""
    args: dict[str, Any] = {"dataset": dataset}
    if base != "base":
        args["base"] = base
    fields = _train_fields(ctx, lr_scale)
    _, info = yield {"tool": "train", "args": {**args, **fields}}
    if not info.get("ok") and fields and info.get("error") in TRAIN_REFUSALS:
        _, info = yield {"tool": "train", "args": args}
    if not info.get("ok"):
        return None
    if while_training and ("base", ctx.harness) not in ctx.compared | set(ctx.early):
        yield from ctx.r.start_evaluation("base", ctx.harness, ctx.s["k"], ctx.early)
    event = yield from ctx.r.wait_for(info["result"]["job"])
    return event["checkpoint"] if event and event.get("ok") else None


def _collect_finished(ctx: Context) -> None:
    """Fold evaluations started earlier whose events have arrived into the candidates (no waiting)."""
    for candidate, job in list(ctx.early.items()):
        event = ctx.r.events.get(job)
        if event is not None:
            del ctx.early[candidate]
            if event.get("ok"):
                ctx.candidates[candidate] = event["score"]
                ctx.compared.add(candidate)


def run_plan(ctx: Context, phases: list[str]) -> Plan:
    """Run ``phases`` in order; a plan that did not submit submits the best candidate at the end (unless
    nothing could be measured: then the default submit follows the plan)."""
    for name in phases:
        if ctx.stopped or ctx.submitted:
            break
        yield from globals()["phase_" + name](ctx)
    if not ctx.stopped and not ctx.submitted:
        yield from phase_submit(ctx)


# ------------------------------------------------------------------------------------------ researcher


def _submit_at_once() -> Plan:
    yield {"tool": "submit", "args": {}}


class SeedResearcher(ToolPlanResearcher):
    """Runs ``phases`` with ``strategy``; on a researcher-spec harness it acts as the program's improver."""

    name = "seed-program"

    def __init__(self, strategy: dict[str, Any], phases: list[str], improver_params: dict[str, Any]):
        self.strategy = strategy
        self.phases = phases
        self.improver_params = improver_params
        self.delegate: Any = None
        self.context: Context | None = None
        self.observation: dict[str, Any] = {}

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        self.delegate, self.context, self.observation = None, None, observation
        if is_spec_harness(observation):
            if improver is not None:
                self.delegate = improver.make_improver(dict(self.improver_params))
                self.delegate.reset(observation, info, seed=seed)
                return
            self.start(_submit_at_once())
            return
        self.context = Context(self, observation, info, self.strategy)
        self.start(run_plan(self.context, self.phases))

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Action:
        if self.delegate is not None:
            return self.delegate.act(observation, info)
        self.observation = observation
        return super().act(observation, info)


def _check(name: str, value: Any) -> None:
    """Raise ValueError if ``value`` is not a valid value of gene ``name``."""
    default = STRATEGY[name]
    if name in ALLELES:
        allowed = ALLELES[name]
        values = value if isinstance(default, list) else [value]
        if isinstance(default, list) and not isinstance(value, list):
            raise ValueError(f"strategy {name!r} must be a list of {allowed}, got {value!r}")
        bad = [v for v in values if v not in allowed or type(v) is not type(allowed[0])]
        if bad:
            raise ValueError(f"strategy {name!r}: {bad[0]!r} is not one of {allowed}")
    elif isinstance(default, (int, float)) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"strategy {name!r} must be a number, got {value!r}")
        if isinstance(default, int) and not isinstance(value, int):
            raise ValueError(f"strategy {name!r} must be an integer, got {value!r}")


def make_researcher(params: dict[str, Any] | None = None) -> SeedResearcher:
    """The researcher of this program: ``STRATEGY`` with ``params`` overriding entries of the same name.
    Keys ``improve_<x>`` are passed (as ``x``) to the improver of a spec harness; any other unknown key,
    an invalid value or an unknown phase is a ValueError."""
    params = dict(params or {})
    improve = {k[len("improve_"):]: v for k, v in params.items() if k.startswith("improve_")}
    research = {k: v for k, v in params.items() if not k.startswith("improve_")}
    unknown = sorted(set(research) - set(STRATEGY))
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)}; parameters are: {', '.join(STRATEGY)}")
    strategy = {k: (list(v) if isinstance(v, list) else v) for k, v in STRATEGY.items()}
    strategy.update(research)
    for name, value in strategy.items():
        _check(name, value)
    for phase in PHASES:
        if not callable(globals().get("phase_" + str(phase))):
            raise ValueError(f"unknown phase {phase!r}; phases are: {', '.join(PHASES + OPTIONAL_PHASES)}")
    return SeedResearcher(strategy, list(PHASES), improve)
