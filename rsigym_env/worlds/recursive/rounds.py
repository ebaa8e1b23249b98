"""Rounds of recursion (:func:`recurse`, ``rsigym recurse``): an archive of researchers, grown by an improver.

Each chain (one per seed) starts an :class:`~rsigym_env.archive.Archive` clade at the original target.
A round:

1. **selects a parent** from the chain's archive nodes by a pluggable rule (greedy, DGM, Thompson over
   clades, SICA; :func:`rsigym_env.archive.select_parent`), read from the improver's own files when it
   is a program (its ``IMPROVER["parent_selection"]``), else ``selection``;
2. runs one outer episode of the recursive world in which the improver improves that parent. The
   improver sees only **train** feedback: dev evaluations with per-episode detail on seeds drawn from the
   episode's seed (new every round). Its episode's reward is the **validation** score (fixed held-out
   seeds), a single number;
3. archives every candidate the improver fully evaluated (content-addressed, with its patch from the
   parent, its train scores and cost, the operator that produced it), rejecting duplicates (same code
   modulo comments, or the same train behaviour) with the novelty filter;
4. **screens** them: the submitted candidate and the ``validate_top`` best on train that beat the
   parent there are measured on validation, **paired** with the parent task by task; a candidate is
   accepted only if the 95 % lower bound of its paired gain is above ``accept_low``;
   the improver's ``recombine`` then merges the validated candidates with a positive gain (and, with
   ``recombine_memory``, earlier rounds' near-passes) three-way into one more candidate, validated alike;
5. measures accepted candidates on **test** (seeds no episode of the world ever runs), for the report
   only: nothing the improver or the selection sees depends on test;
6. if the improver wrote new memory into the parent itself (a version that differs from it only in
   ``memory/``: the same episodes, :func:`~.measure.behaviour_key`), that **successor** takes the
   parent's place: it is archived as the parent's child, measured, and the parent is no longer
   selected, so what a round learned is kept even when it found nothing better.

``mode="target"``: the improver is fixed; ``mode="improver"``: the selected parent improves itself (its
improver is part of its own files, so a round can change the next round's improver). The chain's
researcher after round ``t`` is its best accepted node on validation; ``index`` = its test RSI-Index.

Compounding of the improver (``imp_k > 0``): the chain's improver of a generation (``imp_generations``:
the first and the last, or all), frozen, runs ``imp_k`` rounds of this same protocol on a fresh target
(the original target) ``imp_runs`` times, each with outer seeds no chain uses (the same ones for every
improver, so improvers are compared on the same train tasks); imp@k(g) is the mean test gain of the best
researcher it gets accepted, and compounding is imp@k(g) - imp@k(0), with 95 % intervals over chains
(:mod:`rsigym_env.metrics`).
"""

from __future__ import annotations

import ast
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...catalog import env_id as env_id_of
from ...episode import run_episode
from ...metrics import ci95, compounding, improver_gain, mean_se, paired_gain
from ...scenario import Scenario, load_scenario
from .measure import Measurement, behaviour_key, measure, split_tasks
from .ports import Researchers, is_player, researchers
from .world import RecursiveOptions

FRESH_SEED_BASE = 9_000  # outer seeds of imp@k's fresh-target runs: chains use seed*1000 + round
META_SEED_BASE = 8_500   # outer seeds of the short improvements that judge an improver's edit of itself
MAX_SELF_RUNS = 4        # an improver may ask for at most this many short improvements per side
MAX_SELF_EDITS = 4       # ...and have at most this many edits of its own procedure judged per round (the first ones)
RULES = ("greedy", "dgm", "thompson", "sica", "metaproductive")
MAX_VALIDATE_TOP = 12  # an improver may ask for at most this many validations per round besides its submission


@dataclass(frozen=True)
class Settings:
    """How rounds select, screen and accept (the defaults of ``rsigym recurse``).

    >>> Settings().accept_low, Settings(selection="dgm").selection
    (0.0, 'dgm')
    """

    selection: str | None = None   # parent selection rule; None = the improver's own (IMPROVER["parent_selection"]), else greedy
    accept_low: float = 0.0        # accept a candidate when the 95 % lower bound of its paired validation gain is above this
    validate_top: int | None = None  # besides the submitted candidate, this many of the candidates the improver fully
                                     # evaluated (best on train first) are validated; None = the improver's own
                                     # IMPROVER["validate_top"], else 2
    imp_k: int = 1                 # rounds of each fresh-target improvement run for imp@k (0: do not measure imp@k)
    imp_runs: int = 3              # fresh-target runs (outer seeds no chain uses) per improver, averaged
    imp_generations: str = "ends"  # whose improvers imp@k measures: "ends" (generation 0 and the last) or "all"
    transfer_tracks: tuple[str, ...] = ("data", "harness")  # other tracks for the final-vs-seed comparison
    transfer_local: int = 0        # local-world episodes per researcher in the final-vs-seed comparison
    recombine: str | None = None   # which validated candidates of a round are merged into one more candidate
                                   # (RECOMBINE); None = the improver's own IMPROVER["recombine"], else "none"


@dataclass
class Outcome:
    """One improvement episode: what was submitted, every candidate fully evaluated on train, and its cost."""

    submitted: Any
    candidates: list[tuple[Any, Measurement, str]]   # (spec as the files say, full train measurement, what produced it)
    parent_train: Measurement | None
    reward: float
    spend_usd: float
    steps: int
    dev_evaluations: int
    best_dev_score: float | None
    metrics: dict[str, Any]
    attempts: list[str]
    successor: Any = None   # the target with new memory the improver wrote into it (it behaves as the target)
    self_edits: list[str] = field(default_factory=list)  # improver.py texts of versions that differ from the target
                                                         # only there: edits of the improver's own procedure


def _improver_literal(text: str | None) -> dict[str, Any] | None:
    """The ``IMPROVER`` literal of an improver program's ``improver.py`` text (read with
    ``ast.literal_eval``: nothing of the program runs here), or None."""
    try:
        for node in ast.parse(text or "").body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "IMPROVER" for t in node.targets):
                value = ast.literal_eval(node.value)
                return value if isinstance(value, dict) else None
    except (SyntaxError, ValueError, AttributeError, TypeError, MemoryError, RecursionError):
        return None
    return None


def _improver_setting(improver: Any, key: str) -> Any:
    """The value an improver program gives ``key`` in its own ``IMPROVER`` literal, or None."""
    return (_improver_literal((getattr(improver, "code", None) or {}).get("improver.py")) or {}).get(key)


def _improver_rule(improver: Any) -> str | None:
    """The parent-selection rule an improver program names in its ``IMPROVER`` (None if none or unknown)."""
    rule = _improver_setting(improver, "parent_selection")
    return rule if isinstance(rule, str) and rule in RULES else None


def _improver_int(improver: Any, key: str, low: int, high: float = float("inf")) -> int | None:
    """``IMPROVER[key]`` of an improver program if it is an int in ``low..high``, else None.

    >>> class Imp: code = {"improver.py": "IMPROVER = {'self_runs': 3, 'validate_top': True}"}
    >>> _improver_int(Imp, "self_runs", 1, 4), _improver_int(Imp, "self_runs", 1, 2), _improver_int(Imp, "validate_top", 0)
    (3, None, None)
    """
    n = _improver_setting(improver, key)
    return n if isinstance(n, int) and not isinstance(n, bool) and low <= n <= high else None


def _improver_validate_top(improver: Any) -> int | None:
    """How many of its fully evaluated candidates an improver program asks ``recurse`` to validate
    (``IMPROVER["validate_top"]``, an int in 0..MAX_VALIDATE_TOP; None otherwise)."""
    return _improver_int(improver, "validate_top", 0, MAX_VALIDATE_TOP)


def _lineage_note(files: dict[str, str]) -> str:
    """What produced a candidate: the improver program's ``# lineage: ...`` line, if it wrote one."""
    for line in files.get("code/researcher.py", "").splitlines()[:5]:
        if line.startswith("# lineage:"):
            return line[len("# lineage:"):].strip()[:200]
    return ""


RECOMBINE = ("none", "accepted", "positive")
LINEAGE = "# lineage:"
SELF_PATH = "code/improver.py"


def _improver_recombine(improver: Any) -> str | None:
    """Which of a round's validated candidates ``recurse`` merges into one more candidate, as an improver
    program's ``IMPROVER["recombine"]`` says: ``"accepted"`` (those accepted), ``"positive"`` (those
    whose paired validation gain is above 0, accepted or not: near-passes too) or ``"none"``."""
    mode = _improver_setting(improver, "recombine")
    return mode if isinstance(mode, str) and mode in RECOMBINE else None


def _without_lineage(files: dict[str, str]) -> dict[str, str]:
    """``files`` without the improver's ``# lineage:`` first line of ``code/researcher.py`` and without
    ``memory/`` (every candidate rewrites both, so merges would always conflict there)."""
    files = {p: t for p, t in files.items() if not p.startswith("memory/")}
    text = files.get("code/researcher.py")
    if text is None or not text.startswith(LINEAGE):
        return files
    return dict(files, **{"code/researcher.py": text.split("\n", 1)[1] if "\n" in text else ""})


def recombination(parent: dict[str, str], ranked: Sequence[tuple[str, dict[str, str], dict[str, str] | None]]
                  ) -> tuple[dict[str, str], list[str]] | None:
    """The merge of candidates' changes into ``parent``: ``ranked`` = ``(name, files, base)``, best first,
    ``base`` the files the candidate was made from (None: ``parent``; an earlier round's candidate has an
    earlier parent). Each one's changes from its base are merged in (:func:`rsigym_env.archive.merge_files`)
    unless they conflict with what is merged already or are in it already. ``(files, names merged)``, or
    None when fewer than two merged.

    >>> p = {"code/researcher.py": "A = 1\\nB = 2\\n"}
    >>> a = {"code/researcher.py": "# lineage: point A\\nA = 3\\nB = 2\\n"}
    >>> b = {"code/researcher.py": "# lineage: point B\\nA = 1\\nB = 5\\n"}
    >>> recombination(p, [("a", a, None), ("b", b, None)])
    ({'code/researcher.py': '# lineage: recombine a + b\\nA = 3\\nB = 5\\n'}, ['a', 'b'])
    """
    from ...archive import merge_files

    merged, names = _without_lineage(parent), []
    for name, files, base in ranked:
        out = merge_files(_without_lineage(base if base is not None else parent), merged, _without_lineage(files))
        if out is not None and out != merged:
            merged, names = out, names + [name]
    if len(names) < 2:
        return None
    for files in (parent, ranked[0][1]):  # the memory of the best one (the newest), else the parent's
        merged |= {p: t for p, t in files.items() if p.startswith("memory/")}
    if "code/researcher.py" in merged:
        merged["code/researcher.py"] = f"{LINEAGE} recombine {' + '.join(names)}\n" + merged["code/researcher.py"]
    return merged, names


def _recombine(ctx: "_Context", chain: "_Chain", archive: Any, imp: Any, parent: Any, screened: list[dict[str, Any]],
               validation: dict[str, Measurement], test: dict[str, Measurement], generation: int, seed: int,
               r: int) -> dict[str, Any] | None:
    """One more candidate of round ``r``: the merge of the round's validated candidates the improver's
    ``recombine`` names (best on validation first) and, with ``recombine_memory``, the near-passes of
    earlier rounds (a positive paired validation gain over their parent, not accepted; newest first),
    measured on validation, paired with the parent and accepted by the same rule as any candidate (and
    then measured on test). Its screened row, or None. This round's near-passes are remembered."""
    from ...archive import novelty

    mode = ctx.settings.recombine or _improver_recombine(imp) or "none"
    remember = _improver_setting(imp, "recombine_memory") is True
    pool = sorted([s for s in screened if s["gain"] is not None and s["gain"] > 0
                   and (s["accepted"] or mode == "positive")], key=lambda s: -s["validation"])
    ranked = [(s["id"], chain.specs[s["id"]].to_files(), None) for s in pool]
    if remember:
        ranked += [(sid, chain.specs[sid].to_files(), chain.specs[pid].to_files()) for sid, pid in reversed(chain.near)
                   if sid not in {s["id"] for s in pool}]
    chain.near += [(s["id"], parent.id) for s in screened if not s["accepted"] and s["gain"] is not None and s["gain"] > 0]
    made = recombination(parent.to_files(), ranked) if mode != "none" else None
    if made is None:
        return None
    files, names = made
    try:
        spec = ctx.using.derived_from_files(files, parent=parent.id)
    except Exception:  # a merge the spec format refuses is no candidate
        return None
    if spec.id in archive or novelty(archive, spec.to_files(), None) is not None:
        return None
    archive.add(spec.to_files(), spec.id, parent=parent.id, generation=generation, chain=seed,
                produced_by={"by": "recombine", "round": r, "operator": "recombine " + " + ".join(names)})
    ctx.registry.register(spec, note=f"recurse: seed {seed} round {r} recombines {', '.join(names)}")
    chain.specs[spec.id] = spec
    validation[spec.id] = chain.measured(spec, "official")
    gain = paired_gain(validation[spec.id].task_values(), validation[parent.id].task_values())
    accepted = gain["low"] is not None and gain["low"] > ctx.settings.accept_low
    archive.set_status(spec.id, "accepted" if accepted else "rejected",
                       note=f"recombined; paired validation gain {gain['mean']:+.4f} (95% low {gain['low']:+.4f})")
    if accepted:
        test[spec.id] = chain.measured(spec, "test")
    return {"id": spec.id, "accepted": accepted, "gain": gain["mean"], "low": gain["low"], "high": gain["high"],
            "validation": validation[spec.id].index, "recombines": names}


@dataclass
class Played:
    """An outer episode played here by a researcher spec (:class:`~.ports.OuterEpisode`)."""

    env: Any
    reward: float
    steps: int
    info: dict[str, Any]
    attempts: list[Any]
    researcher: Any = None

    def close(self) -> None:
        close = getattr(self.researcher, "close", None)
        try:
            if close is not None:
                close()
        finally:
            self.env.close()


def play_here(scenario: Scenario, improver: Any, seed: int, using: Researchers) -> Played:
    """The outer episode with ``improver`` (a researcher spec) as its researcher, in this process."""
    import gymnasium as gym

    env = gym.make(env_id_of(scenario.track), scenario=scenario)
    researcher = None
    try:
        researcher = using.build(improver)
        result = run_episode(env, researcher, seed=seed)
    except BaseException:
        Played(env, 0.0, 0, {}, [], researcher).close()
        raise
    attempts = list(getattr(getattr(researcher, "inner", researcher), "attempts", None) or [])
    return Played(env, float(result.reward), result.steps, result.info, attempts, researcher)


def improve_once(scenario: Scenario, opts: RecursiveOptions, improver: Any, target: Any, seed: int,
                 using: Researchers, context: dict[str, Any] | None = None) -> Outcome:
    """One outer episode of the recursive world: ``improver`` improves ``target`` (outer seed ``seed``).
    A researcher spec plays it here (:func:`play_here`); an :class:`~.ports.EpisodePlayer` (an outside
    agent) plays it itself, told ``context`` (where the episode stands: chain and round). Either way what it
    left in the episode's world becomes the :class:`Outcome`."""
    scen = scenario.model_copy(update={"world_options": opts.model_copy(update={
        "target_spec": target.model_dump(mode="json")}).model_dump(mode="json")})
    if is_player(improver):
        played = improver.play(scen, seed, context=context) if context is not None else improver.play(scen, seed)
    else:
        played = play_here(scen, improver, seed, using)
    try:
        env, info = played.env, played.info
        run = env.unwrapped.run
        world = run.world
        sub = info["submitted"]
        files = env.unwrapped.harness_files(sub["harness"])
        submitted = target if files == target.to_files() else using.derived_from_files(files, parent=target.id)
        # a version that differs from a measured one only in what its episodes never see (a program's
        # memory) shares its measurement; the newest such version (the improver's memory written last) is kept
        key_of: dict[str, str] = {}
        newest: dict[str, dict[str, str]] = {}
        for version in run.harness.versions:
            vfiles = run.harness.files(version)
            try:
                key_of.setdefault(using.from_files(vfiles).id, behaviour_key(vfiles))
            except Exception:
                continue
            newest[behaviour_key(vfiles)] = vfiles
        target_key = behaviour_key(target.to_files())
        self_edits = _self_edits(target.to_files(), [run.harness.files(v) for v in run.harness.versions])
        successor = None
        if newest.get(target_key, target.to_files()) != target.to_files():
            successor = using.derived_from_files(newest[target_key], parent=target.id)
        if successor is not None and files == successor.to_files():
            submitted = successor
        candidates, parent_train, seen = [], None, set()
        all_dev = len(split_tasks(world.opts, "dev", world.seed))
        for (spec_id, split, _n), m in sorted(world.measurements.items(), key=lambda kv: kv[0][2] is not None):
            # fully evaluated: on every dev task (a screen that already covers them all counts)
            if split != "dev" or len(m.tasks) < all_dev or spec_id not in key_of or key_of[spec_id] in seen:
                continue
            seen.add(key_of[spec_id])
            if key_of[spec_id] == target_key:
                parent_train = m
                continue
            vfiles = newest[key_of[spec_id]]
            spec = using.derived_from_files(vfiles, parent=target.id)
            candidates.append((spec, m, _lineage_note(vfiles)))
    finally:
        played.close()
    return Outcome(submitted, candidates, parent_train, float(played.reward), float(info["spend_usd"]),
                   played.steps, int(info["dev_evaluations"]), info.get("best_dev_score"),
                   info.get("metrics", {}), [str(a.get("event", a)) if isinstance(a, dict) else str(a)
                                             for a in played.attempts], successor, self_edits)


def _self_edits(target: dict[str, str], versions: Sequence[dict[str, str]]) -> list[str]:
    """The ``code/improver.py`` texts of the versions that differ from ``target`` in that file only
    (``memory/`` aside): edits of the improver's own procedure, in the order written, each once.

    >>> t = {"code/researcher.py": "A = 1\\n", "code/improver.py": "I = 1\\n"}
    >>> _self_edits(t, [t, dict(t, **{"code/improver.py": "I = 2\\n", "memory/m.md": "x"}),
    ...                 dict(t, **{"code/researcher.py": "A = 2\\n", "code/improver.py": "I = 3\\n"})])
    ['I = 2\\n']
    """
    def bare(files: dict[str, str]) -> dict[str, str]:
        return {p: t for p, t in files.items() if not p.startswith("memory/") and p != SELF_PATH}

    out: list[str] = []
    for files in versions:
        text = files.get(SELF_PATH)
        if text is not None and text != target.get(SELF_PATH) and bare(files) == bare(target) and text not in out:
            out.append(text)
    return out


def _improver_changes(before: str, after: str) -> str:
    """What an edit of ``improver.py`` changed in its ``IMPROVER`` literal, as ``gene old -> new`` (or
    ``"improver.py edited"`` when the literal is unreadable or unchanged).

    >>> _improver_changes('IMPROVER = {"a": 1, "b": 2}\\n', 'IMPROVER = {"a": 1, "b": 3}\\n')
    'IMPROVER.b 2 -> 3'
    """
    a, b = _improver_literal(before), _improver_literal(after)
    if not isinstance(a, dict) or not isinstance(b, dict):
        return "improver.py edited"
    changed = [f"IMPROVER.{g} {a.get(g)!r} -> {b.get(g)!r}" for g in sorted(set(a) | set(b)) if a.get(g) != b.get(g)]
    return "; ".join(changed)[:200] or "improver.py edited"


def _product(ctx: "_Context", improver: Any, target: Any, seed: int, cap: int) -> Any:
    """What ``improver`` submits in one outer episode on ``target`` (outer seed ``seed``; at most ``cap``
    moves when ``cap`` > 0 and the improver's own ``candidates`` is larger), memoized by what its episodes
    depend on."""
    own = _improver_setting(improver, "candidates")
    cap = min(cap, own) if isinstance(own, int) and not isinstance(own, bool) and cap > 0 else cap
    key = (behaviour_key(improver.to_files()), target.id, seed, cap)
    if key not in ctx.products:
        runner = improver.derive(params={"improve_candidates": cap}) if cap > 0 else improver
        ctx.products[key] = improve_once(ctx.scenario, ctx.opts, runner, target, seed, ctx.using).submitted
        ctx.registry.register(ctx.products[key], note=f"recurse: what {improver.id} submits improving {target.id} "
                              f"(outer seed {seed}; judging an improver edit)")
    return ctx.products[key]


def metaproductivity(ctx: "_Context", edited: Any, base: Any, target: Any, runs: int, cap: int = 0) -> dict[str, Any]:
    """How much more ``edited`` (an improver) produces than ``base``: each runs ``runs`` short improvements
    of ``target`` (one outer episode each, train only, outer seeds ``META_SEED_BASE + n``, no chain, imp@k
    run or test uses them; the same for both), and what each submits is measured on **validation**;
    the gain is paired task by task (the mean over the runs per task): :func:`~rsigym_env.metrics.ci95`
    plus ``products`` (``[base's, edited's]`` ids per run). Test is never measured here."""
    per_run, products = [], []
    for n in range(max(1, runs)):
        a = _product(ctx, base, target, META_SEED_BASE + n, cap)
        b = _product(ctx, edited, target, META_SEED_BASE + n, cap)
        va = measure(a, ctx.opts, "official", ctx.k, using=ctx.using).task_values()
        vb = measure(b, ctx.opts, "official", ctx.k, using=ctx.using).task_values()
        per_run.append([x - y for x, y in zip(vb, va)])
        products.append([a.id, b.id])
    per_task = [sum(d) / len(d) for d in zip(*per_run)]
    return {**ci95(per_task), "products": products}


def _judge_self_edits(ctx: "_Context", chain: "_Chain", archive: Any, imp: Any, parent: Any, root: Any,
                      edits: list[str], validation: dict[str, Measurement], test: dict[str, Measurement],
                      generation: int, seed: int, r: int) -> list[dict[str, Any]]:
    """The improver's edits of its own procedure (``--mode improver``): each is the parent with the
    edited ``code/improver.py`` (archived as its child; the first ``MAX_SELF_EDITS``), judged by
    :func:`metaproductivity` against the parent on fresh short improvements of the chain's original
    target, and accepted by the same rule as any candidate (the 95 % lower bound above ``accept_low``); settings ``self_runs`` / ``self_candidates``
    from the improver's own ``IMPROVER``. The best accepted edit is carried onto the chain's researcher
    (its files with that ``improver.py``), which takes the researcher's place, so the next round runs the
    edited procedure. One row per edit."""
    from ...archive import novelty

    runs = _improver_int(imp, "self_runs", 1, MAX_SELF_RUNS) or 2
    cap = _improver_int(imp, "self_candidates", 0) or 0
    rows: list[dict[str, Any]] = []
    before = parent.to_files()
    for text in edits[:MAX_SELF_EDITS]:
        files = dict(before, **{SELF_PATH: text})
        what = _improver_changes(before.get(SELF_PATH, ""), text)
        try:
            spec = ctx.using.derived_from_files(files, parent=parent.id)
            ctx.using.check(spec)
        except Exception:  # an edit the spec format refuses is no candidate
            continue
        if spec.id in archive or novelty(archive, spec.to_files(), None) is not None:
            continue
        archive.add(spec.to_files(), spec.id, parent=parent.id, generation=generation, chain=seed,
                    produced_by={"by": imp.id, "round": r, "operator": f"self {what}"})
        ctx.registry.register(spec, note=f"recurse: seed {seed} round {r}: {parent.id}'s improver edited ({what})")
        chain.specs[spec.id] = spec
        ctx.say(f"seed {seed} round {r}: judging an edit of the improver ({what}) by metaproductivity")
        gain = metaproductivity(ctx, spec, parent, root, runs, cap)
        accepted = gain["low"] is not None and gain["low"] > ctx.settings.accept_low
        rows.append({"id": spec.id, "what": what, "accepted": accepted, "gain": gain["mean"], "low": gain["low"],
                     "high": gain["high"], "products": gain["products"]})
        note = (f"metaproductive gain {gain['mean']:+.4f} (95% low {gain['low']:+.4f}) on validation over "
                f"{runs} short improvement(s) of the original")
        if not accepted:
            archive.set_status(spec.id, "rejected", note=note)
            continue
        validation[spec.id] = chain.measured(spec, "official")
        test[spec.id] = chain.measured(spec, "test")
        archive.set_status(spec.id, "accepted", note=note)
    best = max((x for x in rows if x["accepted"]), key=lambda x: x["gain"], default=None)
    if best is None:
        return rows
    chosen = chain.specs[best["id"]]
    holder = chain.specs[chain.best]
    if holder.id != parent.id and holder.to_files().get(SELF_PATH) == before.get(SELF_PATH):
        # the round's researcher was made from the parent with the old procedure: carry the edit onto it
        files = dict(holder.to_files(), **{SELF_PATH: chosen.to_files()[SELF_PATH]})
        carrier = ctx.using.derived_from_files(files, parent=holder.id)
        if carrier.id not in archive:
            archive.add(carrier.to_files(), carrier.id, parent=holder.id, generation=archive.get(holder.id).generation + 1,
                        chain=seed,
                        produced_by={"by": imp.id, "round": r, "operator": f"self {best['what']} (onto {holder.id})"})
            ctx.registry.register(carrier, note=f"recurse: seed {seed} round {r}: {holder.id} with the edited improver")
            chain.specs[carrier.id] = carrier
            validation[carrier.id] = chain.measured(carrier, "official")
            test[carrier.id] = chain.measured(carrier, "test")
            archive.set_status(carrier.id, "accepted", note=f"{holder.id} with the improver edit {best['id']} "
                               "(accepted by metaproductivity); it takes its place")
        chain.superseded |= {holder.id, chosen.id}
        chain.best = carrier.id
        best["carried_to"] = carrier.id
    elif holder.id == parent.id:
        chain.superseded.add(parent.id)
        chain.best = chosen.id
    return rows


class _Chain:
    """One chain's clade in the archive, and the measurements it needs (validation and test, cached)."""

    def __init__(self, archive: Any, seed: int, opts: RecursiveOptions, k: int, using: Researchers):
        self.archive, self.seed, self.opts, self.k, self.using = archive, seed, opts, k, using
        self.specs: dict[str, Any] = {}
        self.best: str | None = None
        self.near: list[tuple[str, str]] = []  # (candidate, its parent): validated, a positive gain, not accepted
        self.superseded: set[str] = set()  # nodes whose successor (the same behaviour, newer memory) takes their place

    def measured(self, spec: Any, split: str) -> Measurement:
        m = measure(spec, self.opts, split, self.k, using=self.using)
        self.archive.record(spec.id, "validation" if split == "official" else split, m.task_values(), cost_usd=0.0,
                            tasks=m.task_ids())
        return m


@dataclass
class _Context:
    """What every chain of one recursion run shares."""

    scenario: Scenario
    opts: RecursiveOptions
    k: int
    using: Researchers
    registry: Any
    settings: Settings
    say: Callable[[str], None]
    products: dict[tuple[str, str, int, int], Any] = field(default_factory=dict)  # metaproductivity's memo


@dataclass
class _ChainRun:
    rows: list[dict[str, Any]]
    chain: dict[str, Any]
    improvers: list[Any]     # the chain's improver after each round (index 0: before the first)
    candidates: int
    tampering: int


def _run_chain(ctx: _Context, archive: Any, seed: int, root: Any, fixed_improver: Any, rounds: int,
               outer_seed: Callable[[int], int], on_round: Callable[[dict[str, Any]], None] | None) -> _ChainRun:
    """One chain: ``rounds`` rounds grown from ``root`` in ``archive``; ``fixed_improver`` improves every
    round (``None``: the selected parent improves itself)."""
    from ...archive import novelty, select_parent

    opts, k, using, registry, settings, say = ctx.opts, ctx.k, ctx.using, ctx.registry, ctx.settings, ctx.say
    chain = _Chain(archive, seed, opts, k, using)
    archive.add(root.to_files(), root.id, parent=None, generation=0, chain=seed, produced_by={"by": "original target"})
    chain.specs[root.id] = root
    validation = {root.id: chain.measured(root, "official")}
    test = {root.id: chain.measured(root, "test")}
    archive.set_status(root.id, "accepted")
    chain.best = root.id
    indices, ids = [test[root.id].index], [root.id]
    improvers = [fixed_improver or root]
    rows: list[dict[str, Any]] = []
    candidates_total = tampering = 0
    mode = "target" if fixed_improver is not None else "improver"
    rng = random.Random(seed)
    for r in range(1, rounds + 1):
        current_improver = fixed_improver or chain.specs[chain.best]
        rule = settings.selection or _improver_rule(current_improver) or "greedy"
        parent_node = select_parent([n for n in archive.nodes() if n.id not in chain.superseded], rule, rng,
                                    split="validation")
        parent = chain.specs[parent_node.id]
        imp = fixed_improver or parent
        say(f"seed {seed} round {r}: {rule} selected {parent.id}; improving")
        out = improve_once(ctx.scenario, opts, imp, parent, outer_seed(r), using, context={"chain": seed, "round": r})
        # archive every fully evaluated candidate (and the submitted one), then screen on validation
        generation = (parent_node.generation or 0) + 1
        fresh: list[tuple[Any, Measurement | None]] = []
        seen_ids = set()
        entries = list(out.candidates)
        successor = out.successor if out.successor is not None and out.successor.id not in archive else None
        if out.submitted.id not in {parent.id, getattr(successor, "id", None)} | {c[0].id for c in entries}:
            entries.append((out.submitted, None, _lineage_note(out.submitted.to_files())))
        for spec, m, note in entries:
            if spec.id in seen_ids:
                continue
            seen_ids.add(spec.id)
            candidates_total += 1
            if m is not None and m.attempts:
                tampering += 1
            if spec.id in archive:  # proposed again (in an earlier round): its node keeps what it has
                continue
            # the improver may ask that equal train results do not make a duplicate (IMPROVER["behaviour_novelty"])
            behaviour = m.task_values() if m is not None and _improver_setting(imp, "behaviour_novelty") is not False else None
            reason = novelty(archive, spec.to_files(), behaviour, tasks=m.task_ids() if m is not None else None)
            archive.add(spec.to_files(), spec.id, parent=parent.id, generation=generation, chain=seed,
                        produced_by={"by": imp.id, "round": r, "operator": note})
            if m is not None:
                archive.record(spec.id, "train", m.task_values(), tasks=m.task_ids(),
                               cost_usd=float(m.billed_usd if m.billed_usd is not None else m.spend_usd))
            if reason is not None:
                archive.set_status(spec.id, "duplicate", note=reason)
                continue
            registry.register(spec, note=f"recurse: seed {seed} round {r} from {parent.id}")
            chain.specs[spec.id] = spec
            fresh.append((spec, m))
        # every candidate here passed the improver's screen (not worse than its base on the screen tasks); by
        # default only those that also beat the parent on train are validated, "screened" validates any of them
        top = settings.validate_top
        if top is None:
            top = _improver_validate_top(imp)
            top = 2 if top is None else top
        parent_train = out.parent_train.index if out.parent_train is not None else None
        every = _improver_setting(imp, "validate_from") == "screened"
        on_train = sorted([(m.index, s.id) for s, m in fresh if m is not None and s.id != out.submitted.id
                           and (every or parent_train is None or m.index > parent_train)], reverse=True)
        chosen = {s.id for s, _ in fresh if s.id == out.submitted.id}
        chosen |= {sid for _, sid in on_train[:top]}
        screened: list[dict[str, Any]] = []
        for spec, _m in fresh:
            if spec.id not in chosen:
                archive.set_status(spec.id, "evaluated")
                continue
            validation[spec.id] = chain.measured(spec, "official")
            gain = paired_gain(validation[spec.id].task_values(), validation[parent.id].task_values())
            accepted = gain["low"] is not None and gain["low"] > settings.accept_low
            archive.set_status(spec.id, "accepted" if accepted else "rejected",
                               note=f"paired validation gain {gain['mean']:+.4f} (95% low {gain['low']:+.4f})")
            if accepted:
                test[spec.id] = chain.measured(spec, "test")
            screened.append({"id": spec.id, "accepted": accepted, "gain": gain["mean"], "low": gain["low"],
                             "high": gain["high"], "validation": validation[spec.id].index})
        recombined = _recombine(ctx, chain, archive, imp, parent, screened, validation, test, generation, seed, r)
        if recombined is not None:
            screened.append(recombined)
        before_id = current = chain.best
        if successor is not None:  # the parent with this round's memory: it behaves as the parent and takes its place
            archive.add(successor.to_files(), successor.id, parent=parent.id, generation=generation, chain=seed,
                        produced_by={"by": imp.id, "round": r, "operator": "memory"})
            registry.register(successor, note=f"recurse: seed {seed} round {r}: {parent.id} with new memory")
            chain.specs[successor.id] = successor
            validation[successor.id] = chain.measured(successor, "official")
            test[successor.id] = chain.measured(successor, "test")
            archive.set_status(successor.id, "accepted", note="its parent with new memory (a program never sees its "
                               "memory: the same episodes); it takes the parent's place")
            chain.superseded.add(parent.id)
            current = successor.id if before_id == parent.id else before_id
        accepted_ids = [n.id for n in archive.nodes() if n.status == "accepted" and n.id not in chain.superseded]
        chain.best = max(accepted_ids, key=lambda i: (validation[i].index, i == current))
        meta = []
        if fixed_improver is None and out.self_edits:  # --mode improver: edits of its own procedure, by what they produce
            meta = _judge_self_edits(ctx, chain, archive, imp, parent, root, out.self_edits, validation, test,
                                     generation, seed, r)
        before, after = test[before_id].index, test[chain.best].index
        indices.append(after)
        ids.append(chain.best)
        improvers.append(fixed_improver or chain.specs[chain.best])
        row = {
            "seed": seed, "round": r, "mode": mode, "selection": rule, "improver": imp.id, "target": parent.id,
            "parent_generation": parent_node.generation, "submitted": out.submitted.id, "improved": chain.best,
            "changed": chain.best not in (before_id, current), "index_before": before, "index_after": after,
            "improver_gain": improver_gain(before, after), "reward": out.reward,
            "candidates": len(entries), "novel": len(fresh), "screened": screened, "self_edits": meta,
            "accepted": sum(1 for s in screened if s["accepted"]),
            "dev_evaluations": out.dev_evaluations, "spend_usd": out.spend_usd, "steps": out.steps,
            "best_dev_score": out.best_dev_score, "metrics": out.metrics, "attempts": out.attempts,
            "params": dict(chain.specs[chain.best].params),
        }
        rows.append(row)
        if on_round is not None:
            on_round(row)
    return _ChainRun(rows, {"seed": seed, "ids": ids, "indices": indices, "compounding": compounding(indices)},
                     improvers, candidates_total, tampering)


def recurse(
    scenario: Scenario, *, rounds: int = 3, seeds: Sequence[int] = (0, 1, 2), improver: Any = None,
    target: Any = None, mode: str = "target", registry: Any = None,
    ray: bool | None = None, on_round: Callable[[dict[str, Any]], None] | None = None,
    using: Researchers | None = None, archive: Any = None, settings: Settings | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run ``rounds`` rounds of archive-based improvement for each chain seed (see the module docstring).

    Returns ``{"config", "rows", "chains", "imp", "transfer", "summary"}``: one row per (seed, round)
    with the parent, the submitted and accepted candidates, their paired validation gains, the chain's
    test index before and after, costs and tampering attempts; per chain the test indices and
    :func:`compounding`; ``imp`` the imp@k of each generation's frozen improver; ``transfer`` the final
    researcher against the original on test, other tracks and (optionally) the local world.

    ``improver``: a registered id or bundled name, a spec (run here as the outer episodes' researcher), or an
    :class:`~.ports.EpisodePlayer` that plays each outer episode itself, such as an outside agent over MCP
    (:class:`rsigym_env.gateway.recursion.AgentImprover`; ``mode="target"`` only). Either way the round
    judges what was submitted and fully evaluated in the episode alike: archive, validation, test.
    """
    from ...archive import Archive

    using = using or researchers()
    settings = settings or Settings()
    if mode not in ("target", "improver"):
        raise ValueError(f"mode must be 'target' or 'improver', got {mode!r}")
    if settings.imp_generations not in ("ends", "all"):
        raise ValueError(f"imp_generations must be 'ends' or 'all', got {settings.imp_generations!r}")
    if settings.recombine is not None and settings.recombine not in RECOMBINE:
        raise ValueError(f"recombine must be one of {', '.join(RECOMBINE)}, got {settings.recombine!r}")
    if settings.selection is not None and settings.selection not in RULES:
        raise ValueError(f"selection must be one of {', '.join(RULES)}, got {settings.selection!r}")
    registry = registry or using.registry()
    base = archive if archive is not None else Archive(name=f"recursion-{time.strftime('%Y%m%d-%H%M%S')}")
    opts = RecursiveOptions.model_validate(scenario.world_options)
    if ray is not None:
        opts = opts.model_copy(update={"ray": ray})
    first_target = (registry.get(target) if isinstance(target, str)
                    else target if target is not None else opts.spec(registry, using))
    first_improver = (first_target if improver is None else registry.get(improver) if isinstance(improver, str)
                      else improver)
    registry.register(first_target)
    if is_player(first_improver):  # an outside agent: it has no files, so it cannot be improved by a round
        if mode != "target":
            raise ValueError(f"improver {first_improver.id} plays its episodes itself (an outside agent): it can only "
                             "improve the target (mode 'target'), not be improved by a round (mode 'improver')")
    else:
        registry.register(first_improver)
    k = scenario.official_k
    say = on_progress or (lambda _text: None)
    ctx = _Context(scenario, opts, k, using, registry, settings, say)
    rows: list[dict[str, Any]] = []
    chains: list[dict[str, Any]] = []
    improvers_by_generation: dict[int, list[Any]] = {}
    candidates_total = tampering = 0
    archives: list[Any] = []
    for seed in seeds:
        archive = Archive(base.root, f"{base.name}-chain{seed}")  # chains are independent: an archive each
        archives.append(archive)
        run = _run_chain(ctx, archive, seed, first_target, first_improver if mode == "target" else None, rounds,
                         lambda r, seed=seed: seed * 1000 + r, on_round)
        rows += run.rows
        chains.append(run.chain)
        for g, spec in enumerate(run.improvers):
            improvers_by_generation.setdefault(g, []).append(spec)
        candidates_total += run.candidates
        tampering += run.tampering
    imp = _imp_at_k(ctx, first_target, first_target, improvers_by_generation)
    transfer = _transfer(scenario, opts, first_target, [c["ids"][-1] for c in chains],
                         {c["ids"][-1]: registry.get(c["ids"][-1]) for c in chains}, k, settings, using, say)
    summary = _summary(rows, chains, imp, transfer, rounds, archives, candidates_total, tampering)
    config = {"scenario": scenario.name, "rounds": rounds, "seeds": list(seeds), "mode": mode,
              "improver": first_improver.id, "target": first_target.id, "official_k": k,
              "archives": [a.name for a in archives], "archive_root": str(base.root),
              "settings": {**settings.__dict__, "transfer_tracks": list(settings.transfer_tracks)},
              "options": opts.model_dump(mode="json", exclude={"target_spec"})}
    return {"config": config, "rows": rows, "chains": chains, "imp": imp, "transfer": transfer, "summary": summary}


def _imp_at_k(ctx: _Context, root: Any, fresh_target: Any, improvers: dict[int, list[Any]]) -> dict[str, Any]:
    """imp@k of every generation's frozen improver: the test gain of the best accepted researcher after
    ``imp_k`` rounds of this same protocol (selection, paired acceptance on validation) in which it
    improves a fresh target, with outer seeds no chain uses; per generation a value per chain, their mean
    and 95 % interval. Its archives are scratch (a temporary directory)."""
    import tempfile

    from ...archive import Archive

    imp_k, runs = ctx.settings.imp_k, max(1, ctx.settings.imp_runs)
    if imp_k <= 0:
        return {}
    last = max(improvers)
    generations = sorted(improvers) if ctx.settings.imp_generations == "all" else sorted({0, last})
    memo: dict[str, list[float]] = {}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rsigym-imp-") as scratch:
        for g in generations:
            values, per_run = [], []
            for improver in improvers[g]:
                if improver.id not in memo:
                    ctx.say(f"imp@{imp_k}: generation {g} improver {improver.id} on a fresh target, {runs} run(s)")
                    quiet = _Context(**{**ctx.__dict__, "say": lambda _t: None})
                    gains = []
                    for n in range(runs):
                        run = _run_chain(quiet, Archive(scratch, f"imp-{improver.id}-{n}"), 0, fresh_target, improver,
                                         imp_k, lambda r, n=n: FRESH_SEED_BASE + 100 * n + r, None)
                        gains.append(run.chain["indices"][-1] - run.chain["indices"][0])
                    memo[improver.id] = gains
                per_run.append(memo[improver.id])
                values.append(sum(memo[improver.id]) / len(memo[improver.id]))
            out[str(g)] = {"values": values, "runs": per_run, **ci95(values)}
    return out


def _transfer(scenario: Scenario, opts: RecursiveOptions, seed_spec: Any, final_ids: list[str], specs: dict[str, Any],
              k: int, settings: Settings, using: Researchers, say: Callable[[str], None]) -> dict[str, Any]:
    """The final researcher of each chain against the original, paired task by task: on test, on held-out
    (transfer) benchmarks, on the other tracks, and on a few local-world episodes."""
    suites: dict[str, RecursiveOptions] = {"test": opts}
    if opts.transfer_benchmarks:
        suites["transfer/benchmarks"] = opts.model_copy(update={"official_benchmarks": list(opts.transfer_benchmarks)})
    for track in settings.transfer_tracks:
        if track != opts.track:
            suites[f"transfer/{track}-track"] = opts.model_copy(update={"track": track})
    if settings.transfer_local > 0:
        benches = list(opts.official_benchmarks)[:max(1, settings.transfer_local)]
        local_budget = load_scenario(world="local", track=opts.track).budget_usd  # the local world's own ($5)
        suites["transfer/local"] = opts.model_copy(update={
            "inner_world": "local", "official_benchmarks": benches, "test_seeds": 1,
            "budget_usd": local_budget, "ray": False})
    out: dict[str, Any] = {}
    for name, suite in suites.items():
        say(f"transfer: {name}")
        kk = 1 if name == "transfer/local" else k
        base = measure(seed_spec, suite, "test", kk, using=using)
        per_chain, pooled = [], []
        for sid in final_ids:
            final = measure(specs[sid], suite, "test", kk, using=using)
            per_chain.append({"final": sid, "index": final.index, **paired_gain(final.task_values(), base.task_values())})
            pooled += [a - b for a, b in zip(final.task_values(), base.task_values())]
        # "gain" (between chains, n = chains) is the headline; "pooled" pairs every chain's test tasks as if
        # independent (n = chains x tasks): narrower, but it ignores that chains differ, so it is not the bar
        out[name] = {"seed_index": base.index, "chains": per_chain,
                     "gain": ci95([c["mean"] for c in per_chain]), "pooled": ci95(pooled)}
    return out


def _summary(rows: list[dict[str, Any]], chains: list[dict[str, Any]], imp: dict[str, Any], transfer: dict[str, Any],
             rounds: int, archives: list[Any], candidates_total: int, tampering: int) -> dict[str, Any]:
    first = [row["improver_gain"] for row in rows if row["round"] == 1]
    total = [c["compounding"]["total"] for c in chains]
    later = [c["compounding"]["later_rounds"] for c in chains]
    per_round = {r: mean_se([row["improver_gain"] for row in rows if row["round"] == r]) for r in range(1, rounds + 1)}
    per_round_ci = {r: ci95([row["improver_gain"] for row in rows if row["round"] == r]) for r in range(1, rounds + 1)}
    accepted = sum(row["accepted"] for row in rows)
    spend = sum(row["spend_usd"] for row in rows)
    imp_comp: dict[str, Any] = {}
    if "0" in imp:
        for g, v in imp.items():
            if g != "0":
                imp_comp[g] = ci95([a - b for a, b in zip(v["values"], imp["0"]["values"])])
    clades: dict[str, int] = {}
    for archive in archives:
        for n in archive.nodes():
            if n.generation == 1 and n.status == "accepted":
                clades[n.id] = 1 + sum(1 for d in archive.descendants(n.id) if d.status == "accepted")
    return {
        "original_index": chains[0]["indices"][0] if chains else None,
        "first_round_improver_gain": mean_se(first), "compounding_total": mean_se(total),
        "compounding_later_rounds": mean_se(later), "improver_gain_by_round": per_round,
        "improver_gain_by_round_ci95": per_round_ci,
        "compounding_total_ci95": ci95(total), "compounding_later_rounds_ci95": ci95(later),
        "final_index": mean_se([c["indices"][-1] for c in chains]),
        "final_vs_seed_test": transfer.get("test", {}).get("gain"),
        "final_vs_seed_test_pooled": transfer.get("test", {}).get("pooled"),
        "final_beats_seed_chains": [sum(1 for c in transfer.get("test", {}).get("chains", [])
                                        if c.get("low") is not None and c["low"] > 0),
                                    len(transfer.get("test", {}).get("chains", []))],
        "imp_at_k": {g: {kk: v[kk] for kk in ("mean", "se", "n", "low", "high")} for g, v in imp.items()},
        "imp_compounding": imp_comp,
        "candidates": candidates_total, "accepted": accepted,
        "self_edits": [sum(len(row.get("self_edits", [])) for row in rows),
                       sum(1 for row in rows for x in row.get("self_edits", []) if x["accepted"])],
        "recombined": [sum(1 for row in rows for x in row["screened"] if x.get("recombines")),
                       sum(1 for row in rows for x in row["screened"] if x.get("recombines") and x["accepted"])],
        "cost_per_round_usd": spend / max(len(rows), 1),
        "cost_per_accepted_usd": spend / accepted if accepted else math.inf,
        "tampering_rate": tampering / candidates_total if candidates_total else 0.0,
        "clade_sizes": clades,
        "archives": [a.summary(split="validation") for a in archives],
    }
