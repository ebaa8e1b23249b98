"""The seed program's improver: it rewrites the strategy of a researcher program, offline.

The seed researcher delegates here (``make_improver(params)``) when its harness is a researcher
spec (the recursive world). The target's files are read with ``read harness:<version>/<path>@<offset>``;
its ``code/researcher.py`` holds the strategy as module-level literals (``STRATEGY``, ``ALLELES``,
``RANGES``, ``PHASES``, ``OPTIONAL_PHASES``) and, when the target carries this improver too,
``code/improver.py`` holds ``IMPROVER`` below. One outer episode:

1. read the target's code (or, for a target that is not a program, its ``params.toml``) and its
   memory ``memory/moves.md`` (which moves were tried on its lineage, and what they showed on train);
2. measure the target as it is: a screening evaluation (``screen_tasks`` dev tasks, avg@``screen_k``)
   and a full one (all dev tasks, avg@``full_k``);
3. ``proposal: "cover"`` (the seed's): enumerate the target's single moves in a fixed order
   (:func:`single_moves`: each gene the plan reads one step each way or to each other allele, each
   phase deleted, inserted or swapped), untried ones first, then re-tries of the best train gains
   (:func:`cover_order`); measure as many as money and steps allow on all dev tasks (or screen them
   first: ``cover_screen``); write every trial into the memory, the memory into every fully
   evaluated candidate and into the target (its successor: same behaviour, new memory); submit the
   best that beats the target on train, else the successor. No randomness in what is tried.
   Off in the seed: ``code_moves`` adds AST edits of the plan's phase functions (:func:`code_moves`) to
   the moves; ``self_moves`` writes that many edits of this procedure (:func:`self_moves`) as versions
   that differ only in ``code/improver.py``, which ``rsigym recurse --mode improver`` judges by what the
   edited improver produces (``rounds.metaproductivity``).
4. ``proposal: "random"`` (the procedure before 2026-12-05): while proposals, steps and budget
   remain, pick a base from the in-episode archive (``select``: greedy, tournament, latest or root),
   apply one operator drawn by ``operator_weights`` with a ``random.Random`` seeded from the episode's
   reset seed -- ``point`` (one gene), ``phase`` (delete / swap adjacent / insert a phase),
   ``crossover`` (genes from another evaluated candidate), ``self`` (one ``IMPROVER`` gene, carried by
   a point change of the researcher; only when the target has ``code/improver.py``) -- screen the
   candidate; if it is not worse than its base on the same tasks (a tie passes when ``screen_ties``),
   evaluate it fully and keep it if it beats the base by more than ``min_gain``; submit the best.
   (with ``skip_unread``, point and crossover leave alone the genes the plan's code never reads).

Either way every change is written back into the source, everything else byte-identical, with a
``# lineage:`` comment on the first line. ``rsigym recurse`` then validates the submission and
``validate_top`` of the others (``validate_from``: those that beat the parent on train, or every
screened one), and merges those with a positive validation gain into one more candidate
(``recombine``; with ``recombine_memory`` earlier rounds' near-passes too).

Standard library only; this file is a program the improver may rewrite (``IMPROVER`` is a literal).

>>> src = 'X = {"a": 1,  # note\\n     "b": [1, 2]}\\n'
>>> print(replace_literals(src, {"X": {"a": 2, "b": [1, 2]}}), end="")
X = {"a": 2,  # note
     "b": [1, 2]}
>>> step_value(3, 1, 8, "add", up=True, step=1.5), step_value(0.4, 0.05, 0.95, "mul", up=False, step=2.0)
(4, 0.2)
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Generator

try:  # the seed program's modules are flat: common.py sits next to this file
    from common import PlanResearcher
except ImportError:  # loaded as a package (tests, tools)
    from .common import PlanResearcher  # type: ignore[no-redef]

# The improver's own procedure. The "self" operator rewrites this literal in a target's improver.py.
IMPROVER = {
    "candidates": 20,          # proposals per episode at most (budget and steps may stop it earlier)
    "screen_tasks": 4,         # n_tasks of the screening evaluation (the first dev tasks: one per benchmark)
    "screen_k": 1,             # avg@k of the screening evaluation
    "screen_ties": False,      # a screen score equal to the base's passes to the full evaluation
    "full_k": 1,               # avg@k of the full dev evaluation (all dev tasks)
    "min_gain": 0.0,           # a candidate is kept if its full score beats its base's by more than this
    "operator_weights": {"point": 4, "phase": 2, "crossover": 1, "self": 1},  # how often each operator is drawn
    "step": 1.5,               # multiplicative step of "mul" genes
    "select": "greedy",        # the base of the next proposal: greedy (best), tournament, latest (kept) or root (the target)
    "tournament": 2,           # kept candidates drawn by the tournament rule
    "budget_reserve": 0.02,    # share of the starting budget no evaluation is expected to eat into
    "skip_unread": False,      # point and crossover change only genes the plan's code reads (see gene_reads)
    "parent_selection": "greedy",  # how `rsigym recurse` picks the next round's parent from the archive
    "validate_top": 8,         # how many fully evaluated candidates (best on train first) `rsigym recurse` validates
    "validate_from": "screened",  # ...among all it screened ("screened") or those that beat the parent on train
    "recombine": "positive",   # `rsigym recurse` merges the round's validated candidates with a positive gain ("positive";
                               # "accepted": only accepted ones; "none") into one more candidate, validated like any other
    "recombine_memory": False,  # ...together with earlier rounds' near-passes (a positive validation gain, not accepted)
    "proposal": "cover",       # "cover": measure the target's single moves in a fixed order, untried ones first (memory/moves.md);
                               # "random": draw operators by operator_weights and stack what beats its base (select)
    "cover_screen": False,     # cover: screen every move first (screen_tasks, screen_k), then fully evaluate the best
                               # full_top that pass; False: every move gets the full evaluation (a tie on a few tasks
                               # says nothing: most single moves change no action on most tasks)
    "full_top": 4,             # cover with cover_screen: how many of the best screens (that pass) get the full evaluation
    "retry": True,             # cover: after the untried moves, re-try the tried ones, the best train gains first
    "behaviour_novelty": False,  # `rsigym recurse` drops a candidate whose train results equal an archived one's (True),
                               # or validates it like any other (False: a single move that changes nothing on the few
                               # train tasks may still pay on validation)
    "code_moves": False,       # cover: after the literal moves, AST edits of the plan's phase functions (code_moves():
                               # drop, duplicate, swap or budget-guard a tool call, scale a money expression)
    "code_guard": 0.25,        # code moves: a guarded call runs only while budget left >= this x the starting budget
    "code_scale": [0.8, 1.25],  # code moves: the factors a money expression is scaled by
    "skip_genes": [],          # cover: STRATEGY genes it never moves (what it has learned not to spend evaluations on)
    "self_moves": 0,           # cover: this many edits of its own procedure per episode (single moves of the IMPROVER
                               # genes in self_genes, untried ones first), written as versions of the target that differ
                               # only in code/improver.py, never evaluated (no train task tells them apart: a program
                               # runs its improver only on a spec harness); `rsigym recurse --mode improver` judges each
                               # by metaproductivity (what it produces on fresh targets, paired on validation)
    "self_genes": ["full_k", "min_gain", "step", "budget_reserve", "cover_screen", "screen_tasks", "full_top"],
    "self_runs": 2,            # recurse: short improvements (one outer episode each, outer seeds no chain uses) per side
    "self_candidates": 8,      # recurse: moves each short improvement measures at most (0: its own "candidates")
}

# How the "self" operator may move IMPROVER's numeric genes: [low, high, how]; how = "mul" (x*step or
# x/step), "add" (x+-1; a float moves by a tenth of the range) or "dbl" (x*2 or x//2). Dotted names
# address nested entries.
IMPROVER_RANGES = {
    "candidates": [4, 30, "add"],
    "screen_tasks": [1, 16, "add"],
    "screen_k": [1, 3, "add"],
    "full_k": [1, 3, "add"],
    "min_gain": [0.0, 0.02, "add"],
    "operator_weights.point": [1, 8, "add"],
    "operator_weights.phase": [0, 8, "add"],
    "operator_weights.crossover": [0, 8, "add"],
    "operator_weights.self": [0, 8, "add"],
    "step": [1.1, 4.0, "mul"],
    "tournament": [2, 4, "add"],
    "full_top": [1, 12, "add"],
    "budget_reserve": [0.0, 0.2, "add"],
}

# Categorical IMPROVER genes and their allowed values (recombine: what `rsigym recurse` merges). Genes left out of IMPROVER_RANGES and IMPROVER_ALLELES
# (skip_unread, validate_top, validate_from, select "root") are not moved by "self"; an edit of this file can set them.
IMPROVER_ALLELES = {
    "select": ["greedy", "tournament", "latest"],
    "screen_ties": [True, False],
    "parent_selection": ["greedy", "dgm", "thompson", "sica"],
    "recombine": ["none", "accepted", "positive"],
    "recombine_memory": [True, False],
    "proposal": ["cover", "random"],
    "cover_screen": [True, False],
    "behaviour_novelty": [True, False],
    "retry": [True, False],
    # the STRATEGY genes of the seed program, any sub-list (a list gene: a move adds or removes one)
    "skip_genes": ["diagnose_k", "fix_harness", "fix_min_share", "teacher_rule", "probe_examples", "data_fraction",
                   "data_chunks", "eval_reserve", "max_examples", "max_tokens_per_example", "data_source", "transforms",
                   "learning_rate_scale", "num_epochs", "lora_rank", "lr_schedule", "early_base_eval", "k", "compare",
                   "submit_rule"],
}

# A target that is not a program: how its params.toml numbers may move (others: within 4x of the original).
PARAMS_RANGES = {
    "data_fraction": [0.05, 0.95, "mul"],
    "k": [1, 8, "add"],
    "probe_examples": [2, 200, "dbl"],
    "max_examples": [500, 200000, "dbl"],
    "submit_probability": [0.005, 0.5, "mul"],
}

LINEAGE = "# lineage: "
RESEARCHER = "code/researcher.py"
SELF = "code/improver.py"
MEMORY = "memory/moves.md"  # cover: which moves were tried on this lineage and what they showed on train
STRATEGY_LITERALS = ("STRATEGY", "ALLELES", "RANGES", "PHASES", "OPTIONAL_PHASES")
SELF_LITERALS = ("IMPROVER", "IMPROVER_RANGES", "IMPROVER_ALLELES")
OPERATORS = ("point", "phase", "crossover", "self")
_NOTE = re.compile(r"\n\.\.\. \(\d+ more characters; read with @offset to continue\)\Z")

Genome = dict[str, Any]
Action = dict[str, Any]
Step = tuple[dict[str, Any], dict[str, Any]]


# ---------------------------------------------------------------------------------- source literals


def inline(value: Any) -> str:
    """``value`` as a one-line Python literal (strings in double quotes, ASCII).

    >>> inline({"a": [1, 2.5, True, None, "x"], "b": (1,)})
    '{"a": [1, 2.5, True, None, "x"], "b": (1,)}'
    """
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{inline(k)}: {inline(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(inline(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(inline(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def render(value: Any, indent: int = 0, width: int = 100) -> str:
    """``value`` as a Python literal, one entry per line when it does not fit on one line at ``indent``.

    >>> print(render({"teacher": "best", "transforms": ["filter", "dedupe"]}, width=30))
    {
        "teacher": "best",
        "transforms": ["filter", "dedupe"],
    }
    """
    one = inline(value)
    if indent + len(one) <= width or not isinstance(value, (dict, list)) or not value:
        return one
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        rows = [f"{pad}{inline(k)}: {render(v, indent + 4, width)}," for k, v in value.items()]
        return "{\n" + "\n".join(rows) + "\n" + " " * indent + "}"
    rows = [f"{pad}{render(v, indent + 4, width)}," for v in value]
    return "[\n" + "\n".join(rows) + "\n" + " " * indent + "]"


def _assignments(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level ``NAME = <expr>`` (and annotated) assignments; the last one of a name wins."""
    found: dict[str, ast.expr] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found[node.target.id] = node.value
    return found


def parse_literals(source: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The values of the module-level literals ``names`` that ``source`` assigns (absent or
    non-literal ones are left out).

    >>> parse_literals("A = {'k': 3}\\nB = f()\\n", ("A", "B", "C"))
    {'A': {'k': 3}}
    """
    found = _assignments(ast.parse(source))
    out: dict[str, Any] = {}
    for name in names:
        if name in found:
            try:
                out[name] = ast.literal_eval(found[name])
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as literals, types included (``1 != 1.0 != True``)."""
    return inline(a) == inline(b)


class _Offsets:
    """Character offsets of ``ast`` positions (line numbers from 1, columns in UTF-8 bytes)."""

    def __init__(self, source: str):
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "replace"))

    def indent(self, lineno: int) -> int:
        line = self.lines[lineno - 1]
        return len(line) - len(line.lstrip(" "))


def _patch(node: ast.expr, old: Any, new: Any, where: _Offsets, edits: list[tuple[int, int, str]]) -> None:
    """Edits turning ``node`` (whose value is ``old``) into ``new``: a dict with the same keys in the
    same order is patched entry by entry (its comments and layout stay), anything else is re-rendered."""
    if _same(old, new):
        return
    if (isinstance(node, ast.Dict) and isinstance(old, dict) and isinstance(new, dict) and list(old) == list(new)
            and len(node.keys) == len(old) and all(k is not None for k in node.keys)):
        for key_node, value_node in zip(node.keys, node.values):
            key = ast.literal_eval(key_node)  # type: ignore[arg-type]
            _patch(value_node, old[key], new[key], where, edits)
        return
    start = where.at(node.lineno, node.col_offset)
    end = where.at(node.end_lineno or node.lineno, node.end_col_offset or 0)
    edits.append((start, end, render(new, where.indent(node.lineno))))


def replace_literals(source: str, values: dict[str, Any]) -> str:
    """``source`` with the module-level literals named in ``values`` rewritten to those values; only
    the changed parts of those literals' source segments change (``KeyError`` for a missing literal)."""
    found = _assignments(ast.parse(source))
    where, edits = _Offsets(source), []
    for name, value in values.items():
        if name not in found:
            raise KeyError(f"no module-level literal {name} to rewrite")
        _patch(found[name], ast.literal_eval(found[name]), value, where, edits)
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def set_lineage(source: str, text: str) -> str:
    """``source`` with its first line the comment ``# lineage: <text>`` (replacing an earlier one).

    >>> set_lineage(set_lineage("x = 1\\n", "point k 3 -> 4"), "phase delete fix")
    '# lineage: phase delete fix\\nx = 1\\n'
    """
    line = LINEAGE + " ".join(text.encode("ascii", "replace").decode("ascii").split())[:400] + "\n"
    if source.startswith(LINEAGE):
        source = source.split("\n", 1)[1] if "\n" in source else ""
    return line + source


# ---------------------------------------------------------------------------------- operators


def step_value(value: int | float, low: float, high: float, how: str, up: bool, step: float) -> int | float:
    """``value`` moved one step up or down (``how``: ``mul``, ``add`` or ``dbl``), kept in [low, high]."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if how == "mul":
        new: float = value * step if up else value / step
        if value == 0 and up:
            new = low if low > 0 else 0
    elif how == "add":
        delta = 1 if is_int else (high - low) / 10
        new = value + (delta if up else -delta)
    else:
        new = value * 2 if up else (value // 2 if is_int else value / 2)
    new = min(high, max(low, new))
    if is_int:
        rounded = int(round(new))
        if rounded == value and new != value:  # a small step of an int still moves it by one
            rounded = int(min(high, max(low, value + (1 if up else -1))))
        return rounded
    return float(f"{float(new):.4g}")  # four significant digits: 0.4 / 1.5 -> 0.2667


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def mutate_gene(name: str, value: Any, alleles: dict[str, Any], ranges: dict[str, Any], rng: random.Random,
                step: float) -> tuple[Any, str] | None:
    """One random change of gene ``name`` within its ALLELES/RANGES: ``(new value, what changed)``, or
    ``None`` if the gene cannot move. Numbers step (RANGES), categories switch (ALLELES), list genes
    gain, lose or reorder an element (ALLELES = the allowed elements), booleans flip."""
    if _numeric(value) and name in ranges:
        low, high, how = ranges[name][0], ranges[name][1], ranges[name][2] if len(ranges[name]) > 2 else "mul"
        ups = [True, False]
        rng.shuffle(ups)
        for up in ups:
            new = step_value(value, low, high, how, up, step)
            if not _same(new, value):
                return new, f"{name} {inline(value)} -> {inline(new)}"
        return None
    allowed = alleles.get(name)
    if isinstance(value, list) and isinstance(allowed, list) and not all(isinstance(a, list) for a in allowed):
        moves = []
        absent = [a for a in allowed if a not in value]
        if absent:
            moves.append("add")
        if value:
            moves.append("remove")
        if len(value) >= 2:
            moves.append("swap")
        if not moves:
            return None
        move, new = rng.choice(moves), list(value)
        if move == "add":
            element = rng.choice(absent)
            new.insert(rng.randint(0, len(new)), element)
            what = f"+{inline(element)}"
        elif move == "remove":
            element = rng.choice(value)
            new.remove(element)
            what = f"-{inline(element)}"
        else:
            i = rng.randrange(len(new) - 1)
            new[i], new[i + 1] = new[i + 1], new[i]
            what = f"swap {inline(new[i + 1])}<->{inline(new[i])}"
        return new, f"{name} {what}: {inline(value)} -> {inline(new)}"
    if isinstance(allowed, list):
        others = [a for a in allowed if not _same(a, value)]
        if not others:
            return None
        new = rng.choice(others)
        return new, f"{name} {inline(value)} -> {inline(new)}"
    if isinstance(value, bool):
        return (not value), f"{name} {value} -> {not value}"
    return None


def _movable(genes: dict[str, Any], alleles: dict[str, Any], ranges: dict[str, Any]) -> list[str]:
    """Genes that :func:`mutate_gene` may move."""
    return [g for g, v in genes.items()
            if (_numeric(v) and g in ranges) or isinstance(alleles.get(g), list) or isinstance(v, bool)]


def point(genome: Genome, space: dict[str, Any], rng: random.Random, step: float,
          reads: set[str] | None = None) -> tuple[Genome, str] | None:
    """The ``point`` operator: one STRATEGY gene changed (see :func:`mutate_gene`); only a gene in
    ``reads`` when it is given (:func:`gene_reads`: a change of any other gene changes no action)."""
    genes = genome["STRATEGY"]
    names = [n for n in _movable(genes, space.get("ALLELES", {}), space.get("RANGES", {}))
             if reads is None or n in reads]
    rng.shuffle(names)
    for name in names:
        moved = mutate_gene(name, genes[name], space.get("ALLELES", {}), space.get("RANGES", {}), rng, step)
        if moved is not None:
            return dict(genome, STRATEGY=dict(genes, **{name: moved[0]})), f"point {moved[1]}"
    return None


def phase(genome: Genome, space: dict[str, Any], rng: random.Random) -> tuple[Genome, str] | None:
    """The ``phase`` operator: delete a phase, swap two adjacent ones, or insert a known phase that is
    not in the plan (OPTIONAL_PHASES, or a default phase deleted earlier) at a random position. A phase
    named ``submit`` stays last; no phase ever appears twice."""
    phases = list(genome.get("PHASES") or [])
    if "PHASES" not in genome:
        return None
    tail = ["submit"] if phases and phases[-1] == "submit" else []
    body = phases[:-1] if tail else phases
    known = [p for p in list(space.get("DEFAULT_PHASES", [])) + list(space.get("OPTIONAL_PHASES", [])) if p != "submit"]
    absent = [p for i, p in enumerate(known) if p not in body and p not in known[:i]]
    moves = (["delete"] if len(body) > 1 else []) + (["swap"] if len(body) >= 2 else []) + (["insert"] if absent else [])
    if not moves:
        return None
    move = rng.choice(moves)
    if move == "delete":
        gone = body.pop(rng.randrange(len(body)))
        what = f"delete {gone}"
    elif move == "swap":
        i = rng.randrange(len(body) - 1)
        body[i], body[i + 1] = body[i + 1], body[i]
        what = f"swap {body[i + 1]}<->{body[i]}"
    else:
        new, at = rng.choice(absent), rng.randint(0, len(body))
        body.insert(at, new)
        what = f"insert {new}@{at}"
    return dict(genome, PHASES=body + tail), f"phase {what}: {inline(phases)} -> {inline(body + tail)}"


def crossover(genome: Genome, donor: Genome, donor_name: str, rng: random.Random,
              reads: set[str] | None = None) -> tuple[Genome, str] | None:
    """The ``crossover`` operator: a random non-empty subset of the genes (STRATEGY entries, the phase
    list as one gene, IMPROVER entries) in which ``donor`` differs, taken from it (STRATEGY entries only
    in ``reads`` when it is given)."""
    child = {key: (dict(value) if isinstance(value, dict) else value) for key, value in genome.items()}
    taken: list[str] = []
    options: list[tuple[str, str | None]] = []
    for part in ("STRATEGY", "IMPROVER", "params"):
        if isinstance(genome.get(part), dict) and isinstance(donor.get(part), dict):
            options += [(part, g) for g in genome[part] if g in donor[part] and not _same(genome[part][g], donor[part][g])
                        and (reads is None or part != "STRATEGY" or g in reads)]
    if "PHASES" in genome and "PHASES" in donor and not _same(genome["PHASES"], donor["PHASES"]):
        options.append(("PHASES", None))
    if not options:
        return None
    chosen = [o for o in options if rng.random() < 0.5] or [rng.choice(options)]
    for part, gene in chosen:
        if gene is None:
            child[part] = list(donor[part])
            taken.append("PHASES")
        else:
            child[part][gene] = donor[part][gene]
            taken.append(gene if part != "IMPROVER" else f"IMPROVER.{gene}")
    return child, f"crossover from {donor_name}: {', '.join(taken)}"


def _get(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def _set(tree: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    head, _, rest = dotted.partition(".")
    return dict(tree, **{head: _set(tree[head], rest, value) if rest else value})


def mutate_self(genome: Genome, space: dict[str, Any], rng: random.Random, step: float) -> tuple[Genome, str] | None:
    """One IMPROVER gene changed within IMPROVER_RANGES / IMPROVER_ALLELES (dotted names reach nested
    entries); ``None`` when the genome has no IMPROVER (the target carries no improver.py)."""
    own = genome.get("IMPROVER")
    if not isinstance(own, dict):
        return None
    ranges, alleles = space.get("IMPROVER_RANGES", {}), space.get("IMPROVER_ALLELES", {})
    names = []
    for name in list(ranges) + [a for a in alleles if a not in ranges]:
        try:
            value = _get(own, name)
        except (KeyError, TypeError):
            continue
        if not isinstance(value, list):  # list genes (skip_genes) move only by cover's self_moves
            names.append((name, value))
    rng.shuffle(names)
    for name, value in names:
        moved = mutate_gene(name, value, alleles, ranges, rng, step)
        if moved is not None:
            return dict(genome, IMPROVER=_set(own, name, moved[0])), f"self {moved[1]}"
    return None


def params_point(genome: Genome, space: dict[str, Any], rng: random.Random, step: float) -> tuple[Genome, str] | None:
    """``point`` for a target that is not a program: one numeric entry of params.toml stepped within
    ``space["RANGES"]`` (PARAMS_RANGES, else within 4x of the episode's original value)."""
    params = genome["params"]
    names = [n for n in params if n in space["RANGES"]]
    rng.shuffle(names)
    for name in names:
        moved = mutate_gene(name, params[name], {}, space["RANGES"], rng, step)
        if moved is not None:
            return dict(genome, params=dict(params, **{name: moved[0]})), f"point {moved[1]}"
    return None


def params_ranges(params: dict[str, Any]) -> dict[str, list[Any]]:
    """How each numeric parameter of a non-program target may move (``improve_*`` ones never do).

    >>> params_ranges({"k": 3, "temperature": 0.5, "improve_step": 1.5, "name": "x"})
    {'k': [1, 8, 'add'], 'temperature': [0.125, 0.95, 'mul']}
    """
    out: dict[str, list[Any]] = {}
    for name, value in params.items():
        if name.startswith("improve_") or not _numeric(value):
            continue
        if name in PARAMS_RANGES:
            out[name] = list(PARAMS_RANGES[name])
        elif isinstance(value, int) and value > 0:
            out[name] = [max(1, value // 4), value * 4, "dbl" if value >= 8 else "add"]
        elif isinstance(value, float) and value > 0:
            out[name] = [value / 4, min(0.95, value * 4) if value < 1 else value * 4, "mul"]
    return out


def toml_value(value: Any) -> str:
    """A TOML literal for a scalar or a list of scalars.

    >>> toml_value(0.6), toml_value(3), toml_value(True), toml_value(["a", 1])
    ('0.6', '3', 'true', '["a", 1]')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def rewrite_params(text: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    """params.toml ``text`` with the top-level entries that differ between ``old`` and ``new`` rewritten
    in place (a missing one is added before the first table); every other line stays."""
    for name, value in new.items():
        if name in old and _same(old[name], value):
            continue
        line = f"{name} = {toml_value(value)}"
        pattern = re.compile(rf"^{re.escape(name)}\s*=[^\n]*$", re.M)
        table = re.search(r"^\[", text, re.M)
        match = pattern.search(text, 0, table.start() if table else len(text))
        if match:
            text = text[:match.start()] + line + text[match.end():]
        else:
            at = table.start() if table else len(text)
            text = text[:at] + ("" if at == 0 or text[at - 1] == "\n" else "\n") + line + "\n" + text[at:]
    return text


def gene_reads(source: str, genes: list[str], plan: list[str]) -> set[str] | None:
    """The STRATEGY genes a researcher's code can read when it runs ``plan``: every gene named (as a
    string) in the plan's ``phase_*`` functions, in any function they reach, and in the code outside
    the phase functions (classes, other functions it reaches); None if the code has no phase functions.
    A candidate that changes only genes outside this set behaves exactly as its base, so the operators
    leave such genes alone (``skip_unread``): a cheap behaviour-novelty check before any screening.

    >>> src = ("def phase_a(ctx):\\n    return _h(ctx)\\n\\ndef _h(ctx):\\n    return ctx.s['x']\\n\\n"
    ...        "def phase_b(ctx):\\n    return ctx.s['y']\\n")
    >>> sorted(gene_reads(src, ["x", "y", "z"], ["a"])), sorted(gene_reads(src, ["x", "y", "z"], ["a", "b"]))
    (['x'], ['x', 'y'])
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if not any(name.startswith("phase_") for name in funcs):
        return None
    wanted = set(genes)

    def named(node: ast.AST) -> tuple[set[str], set[str]]:
        found, calls = set(), set()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value in wanted:
                found.add(sub.value)
            elif isinstance(sub, ast.Name) and sub.id in funcs:
                calls.add(sub.id)
        return found, calls

    roots: list[ast.AST] = [funcs["phase_" + p] for p in plan if "phase_" + p in funcs]
    for node in tree.body:  # code outside the phases (not the strategy literals themselves)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id in STRATEGY_LITERALS for t in targets):
            continue
        roots.append(node)
    seen: set[str] = set()
    reads: set[str] = set()
    while roots:
        found, calls = named(roots.pop())
        reads |= found
        for name in calls - seen:
            if not name.startswith("phase_"):
                seen.add(name)
                roots.append(funcs[name])
    return reads


# ---------------------------------------------------------------------------------- the target's program


class Program:
    """A target's editable files and the genome parsed from them.

    ``files``: path -> text of the files the improver may rewrite; ``genome``: STRATEGY/PHASES (and
    IMPROVER when ``code/improver.py`` defines it) or, for a non-program target, ``params``; ``space``:
    what the operators may do (ALLELES, RANGES, DEFAULT_PHASES, OPTIONAL_PHASES, IMPROVER_RANGES,
    IMPROVER_ALLELES)."""

    def __init__(self, files: dict[str, str]):
        self.files = dict(files)
        self.genome: Genome = {}
        self.space: dict[str, Any] = {}
        if RESEARCHER in files:
            found = parse_literals(files[RESEARCHER], STRATEGY_LITERALS)
            if isinstance(found.get("STRATEGY"), dict):
                self.genome["STRATEGY"] = found["STRATEGY"]
            if isinstance(found.get("PHASES"), list):
                self.genome["PHASES"] = found["PHASES"]
                self.space["DEFAULT_PHASES"] = list(found["PHASES"])
            for name in ("ALLELES", "RANGES"):
                self.space[name] = found.get(name) if isinstance(found.get(name), dict) else {}
            self.space["OPTIONAL_PHASES"] = list(found.get("OPTIONAL_PHASES") or [])
            if SELF in files:
                own = parse_literals(files[SELF], SELF_LITERALS)
                if isinstance(own.get("IMPROVER"), dict) and isinstance(own.get("IMPROVER_RANGES"), dict):
                    self.genome["IMPROVER"] = own["IMPROVER"]
                    self.space["IMPROVER_RANGES"] = own["IMPROVER_RANGES"]
                    self.space["IMPROVER_ALLELES"] = own.get("IMPROVER_ALLELES") or {}
        elif "params.toml" in files:
            self.genome["params"] = tomllib.loads(files["params.toml"])
            self.space["RANGES"] = params_ranges(self.genome["params"])

    @property
    def is_program(self) -> bool:
        return "STRATEGY" in self.genome

    def operators(self) -> list[str]:
        """The operators that apply to this target."""
        if not self.is_program:
            return ["point", "crossover"] if "params" in self.genome else []
        ops = ["point", "crossover"] + (["phase"] if "PHASES" in self.genome else [])
        return ops + (["self"] if "IMPROVER" in self.genome else [])

    def reads(self) -> set[str] | None:
        """The STRATEGY genes this program's plan reads (:func:`gene_reads`; None if unknown)."""
        plan = self.genome.get("PHASES")
        return gene_reads(self.files.get(RESEARCHER, ""), list(self.genome.get("STRATEGY") or {}),
                          list(plan if isinstance(plan, list) else self.space.get("DEFAULT_PHASES", [])))

    def write(self, genome: Genome, lineage: str) -> dict[str, str]:
        """The files that change when ``genome`` replaces this program's genome (researcher.py always,
        for its lineage line)."""
        if not self.is_program:
            return {"params.toml": rewrite_params(self.files["params.toml"], self.genome["params"], genome["params"])}
        ours = {n: genome[n] for n in ("STRATEGY", "PHASES") if n in genome}
        source = genome["CODE"] if isinstance(genome.get("CODE"), str) else self.files[RESEARCHER]  # a code move's
        out = {RESEARCHER: set_lineage(replace_literals(source, ours), lineage)}
        if "IMPROVER" in genome and not _same(genome["IMPROVER"], self.genome["IMPROVER"]):
            out[SELF] = replace_literals(self.files[SELF], {"IMPROVER": genome["IMPROVER"]})
        return out

    def derived(self, genome: Genome, lineage: str) -> "Program":
        """The program ``genome`` describes (its files as :meth:`write` gives them)."""
        child = Program.__new__(Program)
        child.files = dict(self.files, **self.write(genome, lineage))
        child.genome, child.space = genome, self.space
        return child


def genome_key(genome: Genome) -> str:
    """A normalized form of a genome: two programs with the same key behave the same."""
    return json.dumps(genome, sort_keys=True, default=repr)


def propose(program: Program, operator: str, rng: random.Random, step: float,
            donors: list[tuple[str, Genome]], skip_unread: bool = False) -> tuple[Genome, str] | None:
    """Apply ``operator`` to ``program``'s genome: ``(genome, description)`` or ``None`` if it cannot
    apply. ``self`` changes one IMPROVER gene and, so that the dev evaluation can tell the candidate
    apart, one researcher gene too (a change of improver.py alone scores exactly as its base).
    ``skip_unread``: point and crossover change only genes the plan reads (:meth:`Program.reads`)."""
    genome = program.genome
    reads = program.reads() if skip_unread and program.is_program else None
    if not program.is_program:
        if operator == "point":
            return params_point(genome, program.space, rng, step)
        if operator == "crossover" and donors:
            name, donor = donors[rng.randrange(len(donors))]
            return crossover(genome, donor, name, rng)
        return None
    if operator == "point":
        return point(genome, program.space, rng, step, reads)
    if operator == "phase":
        return phase(genome, program.space, rng)
    if operator == "crossover":
        if not donors:
            return None
        name, donor = donors[rng.randrange(len(donors))]
        return crossover(genome, donor, name, rng, reads)
    if operator == "self":
        changed = mutate_self(genome, program.space, rng, step)
        if changed is None:
            return None
        carried = point(changed[0], program.space, rng, step, reads)
        if carried is None:
            return None
        return carried[0], f"{changed[1]}; {carried[1]}"
    raise ValueError(f"unknown operator {operator!r}; known: {', '.join(OPERATORS)}")


# ---------------------------------------------------------------------------------- coverage and memory


def gene_moves(name: str, value: Any, alleles: dict[str, Any], ranges: dict[str, Any], step: float) -> list[tuple[Any, str]]:
    """Every single move of gene ``name``, in a fixed order: ``(new value, what changed)``. A number one
    step down and one step up in its RANGES; a category each other allele in ALLELES order; a boolean
    flipped; a list gene each element removed, each absent allowed element appended, the first two swapped.

    >>> [m[1] for m in gene_moves("k", 3, {}, {"k": [1, 8, "add"]}, 1.5)]
    ['k 3 -> 2', 'k 3 -> 4']
    >>> [m[0] for m in gene_moves("t", ["a", "b"], {"t": ["a", "b", "c"]}, {}, 1.5)]
    [['b'], ['a'], ['a', 'b', 'c'], ['b', 'a']]
    """
    out: list[tuple[Any, str]] = []
    allowed = alleles.get(name)
    if _numeric(value) and name in ranges:
        low, high, how = ranges[name][0], ranges[name][1], ranges[name][2] if len(ranges[name]) > 2 else "mul"
        for up in (False, True):
            new = step_value(value, low, high, how, up, step)
            if not _same(new, value) and not any(_same(new, o[0]) for o in out):
                out.append((new, f"{name} {inline(value)} -> {inline(new)}"))
    elif isinstance(value, list) and isinstance(allowed, list) and not all(isinstance(a, list) for a in allowed):
        news = [[v for v in value if v != e] for e in value] + [value + [a] for a in allowed if a not in value]
        news += [[value[1], value[0]] + value[2:]] if len(value) >= 2 else []
        out = [(new, f"{name} {inline(value)} -> {inline(new)}") for new in news]
    elif isinstance(allowed, list):
        out = [(a, f"{name} {inline(value)} -> {inline(a)}") for a in allowed if not _same(a, value)]
    elif isinstance(value, bool):
        out = [(not value, f"{name} {value} -> {not value}")]
    return out


def phase_moves(phases: list[str], space: dict[str, Any]) -> list[tuple[str, list[str], str]]:
    """Every single change of the plan, in a fixed order: ``(key, new plan, what changed)``. First each
    phase deleted, each absent known phase inserted just before ``submit``, each adjacent pair swapped;
    then the absent phases inserted at every other position. ``submit`` stays last.

    >>> [m[0] for m in phase_moves(["a", "b", "submit"], {"OPTIONAL_PHASES": ["x"]})]
    ['phase -a', 'phase -b', 'phase +x@2', 'phase a<->b', 'phase +x@0', 'phase +x@1']
    """
    tail = ["submit"] if phases and phases[-1] == "submit" else []
    body = phases[:-1] if tail else list(phases)
    known = [p for p in list(space.get("DEFAULT_PHASES", [])) + list(space.get("OPTIONAL_PHASES", [])) if p != "submit"]
    absent = [p for i, p in enumerate(known) if p not in body and p not in known[:i]]
    plans: list[tuple[str, list[str]]] = []
    if len(body) > 1:
        plans += [(f"phase -{p}", body[:i] + body[i + 1:]) for i, p in enumerate(body)]
    plans += [(f"phase +{p}@{len(body)}", body + [p]) for p in absent]
    plans += [(f"phase {body[i]}<->{body[i + 1]}", body[:i] + [body[i + 1], body[i]] + body[i + 2:])
              for i in range(len(body) - 1)]
    plans += [(f"phase +{p}@{at}", body[:at] + [p] + body[at:]) for p in absent for at in range(len(body))]
    return [(key, plan + tail, f"{key}: {inline(phases)} -> {inline(plan + tail)}") for key, plan in plans]


def single_moves(program: Program, step: float) -> list[tuple[str, Genome, str]]:
    """Every single move of ``program``'s genome, in a fixed order (STRATEGY genes in their order, only
    genes the plan reads when that is known; then the plan's changes, :func:`phase_moves`):
    ``(key, genome, lineage)``. The key names the move by its result (``data_fraction=0.49``, ``phase
    -compare``), so memory can tell whether a move was tried on an earlier parent. No randomness.

    >>> p = Program({"params.toml": "k = 3\\n"})
    >>> [m[0] for m in single_moves(p, 1.5)]
    ['k=2', 'k=4']
    """
    genome, space = program.genome, program.space
    if not program.is_program:
        genes, where = genome.get("params") or {}, "params"
        alleles, ranges, reads = {}, space.get("RANGES", {}), None
    else:
        genes, where = genome["STRATEGY"], "STRATEGY"
        alleles, ranges, reads = space.get("ALLELES", {}), space.get("RANGES", {}), program.reads()
    out: list[tuple[str, Genome, str]] = []
    for name, value in genes.items():
        if reads is not None and name not in reads:
            continue
        for new, what in gene_moves(name, value, alleles, ranges, step):
            out.append((f"{name}={inline(new)}", dict(genome, **{where: dict(genes, **{name: new})}), f"point {what}"))
    if program.is_program and "PHASES" in genome:
        out += [(key, dict(genome, PHASES=plan), what) for key, plan, what in phase_moves(list(genome["PHASES"]), space)]
    return out


def self_moves(program: Program, genes: list[str], step: float,
               memory: dict[str, list[dict[str, Any]]] | None = None) -> list[tuple[str, Genome, str]]:
    """Single moves of the improver's own procedure: each IMPROVER gene in ``genes`` (dotted names reach
    nested entries) one step each way in IMPROVER_RANGES or to each other value in IMPROVER_ALLELES, in
    that fixed order, leaving out moves ``memory`` has seen (a key ``IMPROVER.<gene>=<value>`` or a trial's
    ``undo``: the value an accepted move replaced). ``(key, genome, what)``; none when the program carries
    no improver.

    >>> files = {"code/researcher.py": 'STRATEGY = {"k": 3}\\nRANGES = {"k": [1, 8, "add"]}\\n',
    ...          "code/improver.py": 'IMPROVER = {"full_k": 1, "cover_screen": False}\\n'
    ...          'IMPROVER_RANGES = {"full_k": [1, 3, "add"]}\\nIMPROVER_ALLELES = {"cover_screen": [True, False]}\\n'}
    >>> [m[0] for m in self_moves(Program(files), ["full_k", "cover_screen", "nope"], 1.5)]
    ['IMPROVER.full_k=2', 'IMPROVER.cover_screen=True']
    >>> [m[0] for m in self_moves(Program(files), ["full_k"], 1.5, {"IMPROVER.full_k=2": [{"on": "x"}]})]
    []
    """
    own = program.genome.get("IMPROVER")
    if not isinstance(own, dict):
        return []
    ranges, alleles = program.space.get("IMPROVER_RANGES", {}), program.space.get("IMPROVER_ALLELES", {})
    seen = set(memory or {}) | {t["undo"] for trials in (memory or {}).values() for t in trials
                                if isinstance(t.get("undo"), str)}
    out: list[tuple[str, Genome, str]] = []
    for name in genes:
        try:
            value = _get(own, name)
        except (KeyError, TypeError):
            continue
        for new, what in gene_moves(name, value, alleles, ranges, step):
            key = f"IMPROVER.{name}={inline(new)}"
            if key not in seen:
                out.append((key, dict(program.genome, IMPROVER=_set(own, name, new)), f"self {what}"))
    return out


# ---------------------------------------------------------------------------------- code moves

NO_EDIT = ("phase_submit",)  # the contract's submit: never edited


def check_program(source: str) -> str | None:
    """Why ``source`` (a researcher.py) breaks the program contract, or None: it must parse and compile,
    keep its literals (STRATEGY a dict, PHASES a list), define ``make_researcher``, and every phase its
    PHASES and OPTIONAL_PHASES name must be a generator function ``phase_<x>(ctx)``.

    >>> check_program("def f(:\\n"), check_program("STRATEGY = {}\\nPHASES = ['a']\\ndef make_researcher(p): pass\\n")
    ('does not parse: invalid syntax (line 1)', 'phase a: no generator function phase_a(ctx)')
    """
    try:
        tree = ast.parse(source)
        compile(tree, RESEARCHER, "exec")
    except (SyntaxError, ValueError) as exc:
        return f"does not parse: {getattr(exc, 'msg', exc)} (line {getattr(exc, 'lineno', '?')})"
    found = parse_literals(source, STRATEGY_LITERALS)
    if not isinstance(found.get("STRATEGY"), dict) or not isinstance(found.get("PHASES"), list):
        return "STRATEGY or PHASES is not a literal"
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if "make_researcher" not in funcs:
        return "no make_researcher"
    for name in list(found["PHASES"]) + list(found.get("OPTIONAL_PHASES") or []):
        f = funcs.get(f"phase_{name}")
        if f is None or len(f.args.args) != 1 or not any(isinstance(x, (ast.Yield, ast.YieldFrom)) for x in ast.walk(f)):
            return f"phase {name}: no generator function phase_{name}(ctx)"
    return None


def _names(node: ast.AST, ctx_type: type) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx_type)}


def _calls_tool(node: ast.AST) -> bool:
    return any(isinstance(x, (ast.Yield, ast.YieldFrom)) for x in ast.walk(node))


def _mentions_budget(node: ast.AST) -> bool:
    return any(isinstance(x, ast.Attribute) and x.attr in ("budget_start", "budget_left") for x in ast.walk(node))


def _money_args(call: ast.Call) -> list[int]:
    """Positions of ``call``'s arguments that are money expressions (they mention the budget)."""
    return [j for j, a in enumerate(call.args) if isinstance(a, (ast.BinOp, ast.Attribute, ast.Call)) and _mentions_budget(a)]


def code_moves(source: str, phases: list[str], guard: float = 0.25, scales: tuple[float, ...] = (0.8, 1.25)
               ) -> list[tuple[str, str, str]]:
    """AST edits of the phase functions ``phases`` runs (``phase_submit`` never), in a fixed order:
    ``(key, new source, what)``. Per top-level statement ``i`` of a phase that calls a tool (a ``yield``):
    ``drop`` it (when nothing after it reads a name it sets), ``dup`` it (run it twice), ``guard`` it (run
    it only while ``ctx.budget_left() >= guard * ctx.budget_start``; same condition as drop), ``swap`` it
    with the next statement (when neither reads or sets a name the other sets); and each money expression
    (an argument mentioning ``budget_start``/``budget_left``) ``scale``d by each factor. Only the edited
    function is rewritten (``ast.unparse``: its comments go), every other byte stays; an edit that breaks
    the contract (:func:`check_program`) is left out.

    >>> src = ("STRATEGY = {}\\nPHASES = ['a']\\ndef make_researcher(p):\\n    pass\\n"
    ...        "def phase_a(ctx):\\n    x = yield 1\\n    yield from g(ctx, ctx.budget_start * 0.5)\\n    yield x\\n")
    >>> [m[0] for m in code_moves(src, ["a"])]
    ['code a dup 0', 'code a swap 0', 'code a drop 1', 'code a dup 1', 'code a guard 1', 'code a swap 1', 'code a money 1 x0.8', 'code a money 1 x1.25', 'code a drop 2', 'code a dup 2', 'code a guard 2']
    >>> print(dict((k, t) for k, t, _ in code_moves(src, ["a"]))["code a guard 1"].split("def phase_a")[1])
    (ctx):
        x = (yield 1)
        if ctx.budget_left() >= 0.25 * ctx.budget_start:
            yield from g(ctx, ctx.budget_start * 0.5)
        yield x
    <BLANKLINE>
    """
    import copy

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    where = _Offsets(source)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    out: list[tuple[str, str, str]] = []

    def emit(func: ast.FunctionDef, body: list[ast.stmt], key: str, what: str) -> None:
        new = copy.deepcopy(func)
        new.body = body or [ast.Pass()]
        new.decorator_list = []
        ast.fix_missing_locations(new)
        start = where.at(func.lineno, 0)
        end = where.at(func.end_lineno or func.lineno, func.end_col_offset or 0)
        text = source[:start] + ast.unparse(new) + source[end:]
        if text != source and check_program(text) is None:
            out.append((key, text, f"{key}: {what}"))

    for phase in dict.fromkeys(phases):
        func = funcs.get(f"phase_{phase}")
        if func is None or func.name in NO_EDIT:
            continue
        body = func.body
        for i, stmt in enumerate(body):
            if not _calls_tool(stmt) or isinstance(stmt, ast.Return):
                continue
            later = set().union(*[_names(s, ast.Load) for s in body[i + 1:]]) if body[i + 1:] else set()
            free = not (_names(stmt, ast.Store) & later)
            line = ast.unparse(stmt).split("\n")[0][:60]
            if free:
                emit(func, body[:i] + body[i + 1:], f"code {phase} drop {i}", f"drop `{line}`")
            emit(func, body[:i + 1] + [copy.deepcopy(stmt)] + body[i + 1:], f"code {phase} dup {i}", f"run `{line}` twice")
            if free:
                cond = ast.parse(f"ctx.budget_left() >= {guard!r} * ctx.budget_start", mode="eval").body
                emit(func, body[:i] + [ast.If(test=cond, body=[stmt], orelse=[])] + body[i + 1:],
                     f"code {phase} guard {i}", f"`{line}` only while budget left >= {guard!r} x start")
            if i + 1 < len(body):
                nxt = body[i + 1]
                a_set, b_set = _names(stmt, ast.Store), _names(nxt, ast.Store)
                if not isinstance(nxt, ast.Return) and not (a_set & (_names(nxt, ast.Load) | b_set)) \
                        and not (b_set & _names(stmt, ast.Load)):
                    emit(func, body[:i] + [nxt, stmt] + body[i + 2:], f"code {phase} swap {i}",
                         f"swap `{line}` and the next statement")
            if any(_money_args(call) for call in ast.walk(stmt) if isinstance(call, ast.Call)):
                for factor in scales:
                    edited = copy.deepcopy(stmt)
                    call = next(c for c in ast.walk(edited) if isinstance(c, ast.Call) and _money_args(c))
                    j = _money_args(call)[0]
                    call.args[j] = ast.BinOp(left=call.args[j], op=ast.Mult(), right=ast.Constant(factor))
                    emit(func, body[:i] + [edited] + body[i + 1:], f"code {phase} money {i} x{factor!r}",
                         f"money `{ast.unparse(call.args[j])[:60]}`")
    return out


def base_tag(genome: Genome) -> str:
    """A short name of a genome (the base a move was tried on), for the memory.

    >>> base_tag({"STRATEGY": {"k": 3}}) == base_tag({"STRATEGY": {"k": 3}}) != base_tag({"STRATEGY": {"k": 4}})
    True
    """
    return hashlib.sha256(genome_key(genome).encode()).hexdigest()[:10]


def read_memory(text: str | None) -> dict[str, list[dict[str, Any]]]:
    """The moves memory (``memory/moves.md``: JSON ``{"moves": {key: [trial, ...]}}``, a trial
    ``{"on": base_tag, "screen": gain, "full": gain or null, "undo": the move back or null}``, gains on
    train over the base); empty when absent or unreadable.

    >>> read_memory('{"moves": {"k=4": [{"on": "ab", "screen": 0.01, "full": null}]}}')["k=4"][0]["screen"]
    0.01
    >>> read_memory("not json"), read_memory(None)
    ({}, {})
    """
    try:
        moves = json.loads(text or "").get("moves")
    except (ValueError, AttributeError):
        return {}
    if not isinstance(moves, dict):
        return {}
    return {str(k): [t for t in v if isinstance(t, dict)] for k, v in moves.items() if isinstance(v, list)}


def write_memory(memory: dict[str, list[dict[str, Any]]]) -> str:
    """The moves memory as the text of ``memory/moves.md`` (sorted keys: the same memory, the same bytes).

    >>> read_memory(write_memory({"k=4": [{"on": "ab", "screen": 0.0, "full": None}]}))
    {'k=4': [{'full': None, 'on': 'ab', 'screen': 0.0}]}
    """
    return json.dumps({"moves": memory}, sort_keys=True, indent=1) + "\n"


def trial_gain(trial: dict[str, Any]) -> float:
    """What a trial showed on train: its full-evaluation gain, else its screen gain (0 if neither)."""
    for key in ("full", "screen"):
        if _numeric(trial.get(key)):
            return float(trial[key])
    return 0.0


def move_gene(key: str) -> str:
    """What a move changes: the gene of ``gene=value``, the phase and the kind of ``phase +x@i``.

    >>> move_gene("lora_rank=32"), move_gene("phase +verify_harness@2"), move_gene("phase -compare")
    ('lora_rank', 'phase +verify_harness', 'phase -compare')
    """
    return key.split("=", 1)[0] if not key.startswith("phase ") else key.split("@", 1)[0]


def _move_value(key: Any) -> Any:
    """The value a ``gene=value`` move key sets (None when it is no such key or the value is no literal).

    >>> _move_value("data_fraction=0.49"), _move_value('k="x"'), _move_value("phase -a"), _move_value(None)
    (0.49, 'x', None, None)
    """
    if not isinstance(key, str) or key.startswith("phase ") or "=" not in key:
        return None
    try:
        return json.loads(key.split("=", 1)[1])
    except ValueError:
        return None


def onward_moves(moves: list[tuple[str, Genome, str]], memory: dict[str, list[dict[str, Any]]],
                 genes: dict[str, Any], on: str | None = None) -> set[str]:
    """The keys of ``moves`` that take an accepted gene one step further the way it was moved: the base
    (its ``genes``) holds the value a move tried on an earlier base set (memory ``gene=new``, its ``undo``
    ``gene=old``), so that move was accepted, and the move goes on past ``new`` away from ``old``. Numbers
    only (a category has no direction).

    >>> mem = {"k=4": [{"on": "x", "full": 0.01, "undo": "k=3"}], "j=2": [{"on": "x", "full": 0.0, "undo": "j=1"}]}
    >>> ms = [("k=3", {}, ""), ("k=5", {}, ""), ("j=0", {}, ""), ("j=3", {}, "")]
    >>> sorted(onward_moves(ms, mem, {"k": 4, "j": 1}, on="y")), onward_moves(ms, mem, {"k": 4}, on="x")
    (['k=5'], set())
    """
    out: set[str] = set()
    for key, _, _ in moves:
        new, gene = _move_value(key), key.split("=", 1)[0]
        base = genes.get(gene)
        if not (_numeric(new) and _numeric(base)):
            continue
        for trial in memory.get(f"{gene}={inline(base)}", []):
            old = _move_value(trial.get("undo"))
            if trial.get("on") != on and _numeric(old) and (new - base) * (base - old) > 0:
                out.add(key)
    return out


def cover_order(moves: list[tuple[str, Genome, str]], memory: dict[str, list[dict[str, Any]]],
                retry: bool = True, on: str | None = None,
                genes: dict[str, Any] | None = None) -> list[tuple[str, Genome, str]]:
    """The order in which an outer episode measures ``moves`` of the base ``on`` (its :func:`base_tag`;
    ``genes``: its gene values): first every move memory has never seen, genes moved on an earlier base
    least often first (breadth before depth: a gene the lineage has never moved before a new value of one
    it has; trials on this same base do not count, so both directions of a gene are first-level moves),
    then in their own fixed order. Two exceptions to breadth: the next step of an accepted gene the way it
    was accepted (:func:`onward_moves`) is a first-level move, however often the gene was moved; and a
    phase's insertions at different positions are one gene, so its first untried position is at its
    gene's level and each further one a level deeper. Then -- with ``retry`` -- the tried ones, positive
    train gains first (a move that nearly passed on an earlier parent may pay on this one: a move's value
    depends on what it is stacked on), the fewest trials and the best gain first. A move that undoes a
    tried one (a trial's ``undo``: the value it replaced) counts as tried, with the opposite gain.
    Deterministic.

    >>> ms = [("a=1", {}, ""), ("b=1", {}, ""), ("c=1", {}, ""), ("d=1", {}, ""), ("a=2", {}, ""), ("e=2", {}, "")]
    >>> mem = {"a=0": [{"on": "x", "screen": -0.1}], "c=1": [{"on": "x", "screen": 0.2, "full": 0.05, "undo": "c=0"}],
    ...        "d=0": [{"on": "x", "screen": -0.03, "undo": "d=1"}], "e=1": [{"on": "y", "screen": 0.0}]}
    >>> [m[0] for m in cover_order(ms, mem, on="y")], [m[0] for m in cover_order(ms, mem, retry=False, on="y")]
    (['b=1', 'e=2', 'a=1', 'a=2', 'c=1', 'd=1'], ['b=1', 'e=2', 'a=1', 'a=2'])
    >>> mem["a=1"] = [{"on": "x", "full": 0.02, "undo": "a=0"}]   # a 0 -> 1 was accepted: a=2 goes on
    >>> [m[0] for m in cover_order(ms, mem, retry=False, on="y", genes={"a": 1})]
    ['b=1', 'a=2', 'e=2']
    >>> ps = [("phase +p@2", {}, ""), ("phase +q@2", {}, ""), ("phase +p@0", {}, ""), ("phase +p@1", {}, "")]
    >>> [m[0] for m in cover_order(ps + [("f=1", {}, "")], {"f=0": [{"on": "x", "screen": 0.0}]}, on="y")]
    ['phase +p@2', 'phase +q@2', 'phase +p@0', 'f=1', 'phase +p@1']
    """
    seen: dict[str, list[dict[str, Any]]] = {k: list(v) for k, v in memory.items()}
    for trials in memory.values():
        for t in trials:
            if isinstance(t.get("undo"), str):
                seen.setdefault(t["undo"], []).append({"on": t.get("on"), "screen": -trial_gain(t)})
    depth: dict[str, int] = {}
    for key, trials in seen.items():
        depth[move_gene(key)] = depth.get(move_gene(key), 0) + sum(1 for t in trials if on is None or t.get("on") != on)
    onward = onward_moves(moves, memory, genes or {}, on)
    positions: dict[str, int] = {}  # a phase's untried insertions so far: each further position a level deeper
    fresh = []
    for i, m in enumerate(moves):
        if seen.get(m[0]):
            continue
        gene = move_gene(m[0])
        level = 0 if m[0] in onward else depth.get(gene, 0)
        if m[0].startswith("phase +"):
            level, positions[gene] = level + positions.get(gene, 0), positions.get(gene, 0) + 1
        fresh.append((level, i, m))
    tried = [m for m in moves if seen.get(m[0])]
    best = {m[0]: max(trial_gain(t) for t in seen[m[0]]) for m in tried}
    tried.sort(key=lambda m: (best[m[0]] <= 0, len(seen[m[0]]), -best[m[0]]))
    return [m for _, _, m in sorted(fresh, key=lambda f: f[:2])] + (tried if retry else [])


# ---------------------------------------------------------------------------------- the researcher


def _body(log: str) -> str:
    """The text a read returned: the log without its status line and without a truncation note."""
    return _NOTE.sub("", log.split("\n", 1)[1] if "\n" in log else "")


@dataclass
class Candidate:
    """One version in the episode's archive: its harness ``version``, ``program``, the ``base`` version
    it was made from, the operator and ``lineage`` that made it, its dev scores and whether it was kept."""

    version: str
    program: Program
    base: str | None = None
    op: str = "target"
    lineage: str = ""
    screen: float | None = None
    full: float | None = None
    accepted: bool = False

    def row(self) -> dict[str, Any]:
        """What :attr:`ProgramImprover.log` keeps of it."""
        return {"version": self.version, "base": self.base, "op": self.op, "lineage": self.lineage,
                "screen": self.screen, "full": self.full, "accepted": self.accepted}


class ProgramImprover(PlanResearcher):
    """Improves a researcher program by rewriting its strategy literals (see the module docstring).

    ``log`` lists every measured candidate: op, lineage, version, screen, full, accepted."""

    name = "program-improver"

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = dict(IMPROVER, **(config or {}))
        self.log: list[dict[str, Any]] = []
        self.submitted: str | None = None

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        self.log, self.submitted, self.last_log = [], None, ""
        self.rng = random.Random(seed if seed is not None else int(info.get("seed", 0) or 0))
        self.max_steps = int(info.get("max_steps") or 10**9)
        self.steps = 0
        self.budget0 = float(info.get("budget_usd") or _first(observation.get("budget_left_usd")) or 0.0)
        self.budget = float(_first(observation.get("budget_left_usd")) or self.budget0)
        self.worst = 0.0      # reserved per attempt (the largest quote per attempt seen)
        self.cost: list[float] = [0.0, 0.0]  # dollars spent and attempts run by dev evaluations
        self.tasks: int | None = None        # dev tasks of a full evaluation
        self.stop = False
        self.memory: dict[str, list[dict[str, Any]]] = {}  # cover: the target's moves memory, grown by this episode
        self.start(self.plan(info))

    # ------------------------------------------------------------------ tool calls

    def call(self, action: Action) -> Generator[Action, Step, dict[str, Any]]:
        """One tool call; keeps the step count and the budget up to date; its info."""
        obs, info = yield action
        self.last_log = str(obs.get("log", ""))
        step = _first(obs.get("step"))
        self.steps = int(step) if step is not None else self.steps + 1
        left = info.get("budget_left_usd", _first(obs.get("budget_left_usd")))
        if left is not None:
            self.budget = float(left)
        return info

    def read(self, version: str, path: str) -> Generator[Action, Step, str | None]:
        """The whole text of one harness file, paged (None if it cannot be read completely)."""
        text, total = "", None
        while total is None or len(text) < total:
            ref = f"harness:{version}/{path}" + (f"@{len(text)}" if text else "")
            info = yield from self.call({"tool": "read", "args": {"ref": ref}})
            if not info.get("ok"):
                return None
            total = int((info.get("result") or {}).get("chars", 0))
            chunk = _body(self.last_log)[: total - len(text)]
            if not chunk and len(text) < total:
                return None
            text += chunk
        return text

    def affordable(self, k: int, n_tasks: int | None, keep: int = 0) -> bool:
        """Whether an evaluation of ``n_tasks`` dev tasks (None: all) avg@``k`` fits: its worst case is
        available and what it is expected to cost, plus ``keep`` more attempts, leaves ``budget_reserve``
        of the starting budget. Before the first evaluation nothing is known and it is tried."""
        if not self.worst:
            return True
        attempts = (min(n_tasks, self.tasks) if n_tasks and self.tasks else n_tasks or self.tasks or 1) * k
        expected = (attempts + keep) * (self.cost[0] / self.cost[1] if self.cost[1] else 0.0)
        reserve = float(self.config["budget_reserve"]) * self.budget0
        return attempts * self.worst <= self.budget and self.budget - expected >= reserve

    def evaluate(self, version: str, k: int, n_tasks: int | None) -> Generator[Action, Step, float | None]:
        """A dev evaluation of ``version``; its score, or None (``self.stop`` is set when the budget or a
        refusal ends the search; an invalid candidate only returns None)."""
        if not self.affordable(k, n_tasks):
            self.stop = True
            return None
        args: dict[str, Any] = {"checkpoint": "base", "harness": version, "k": k}
        if n_tasks:
            args["n_tasks"] = n_tasks
        info = yield from self.call({"tool": "evaluate", "args": args})
        if not info.get("ok"):
            if info.get("error") != "invalid_harness":
                self.stop = True
            return None
        job, quote = info["result"]["job"], float(info["result"].get("quote_usd", 0.0))
        while job not in self.events:
            info = yield from self.call({"tool": "wait", "args": {"job": job}})
            if not info.get("ok") and job not in self.events:
                self.stop = True
                return None
        event = self.events[job]
        if not event.get("ok"):
            return None
        ran = int(event.get("n_tasks", 1)) * int(event.get("k", k))
        if not n_tasks or int(event.get("n_tasks", n_tasks)) < n_tasks:  # now the split's size is known
            self.tasks = int(event.get("n_tasks", 1))
        self.worst = max(self.worst, quote / max(ran, 1))
        self.cost[0] += float(event.get("cost_usd", 0.0))
        self.cost[1] += ran
        return float(event["score"])

    def measure(self, candidate: Candidate, screen_of: float | None) -> Generator[Action, Step, None]:
        """Staged screening: the screen evaluation, and the full one only when the screen is not worse
        than ``screen_of`` (the base's screen score; a tie passes if ``screen_ties``; None measures both
        unconditionally)."""
        c = self.config
        candidate.screen = yield from self.evaluate(candidate.version, c["screen_k"], c["screen_tasks"])
        same = self.tasks is not None and c["screen_tasks"] >= self.tasks and c["screen_k"] == c["full_k"]
        if candidate.screen is None or (screen_of is not None and (
                candidate.screen < screen_of or (candidate.screen == screen_of and not c["screen_ties"]))):
            return
        if same:  # the screen already was the full evaluation
            candidate.full = candidate.screen
        else:
            candidate.full = yield from self.evaluate(candidate.version, c["full_k"], None)

    def edit(self, base: str, files: dict[str, str]) -> Generator[Action, Step, str | None]:
        """Write ``files`` (full contents) on top of version ``base``; the new version or None."""
        version = base
        for path in sorted(files, key=lambda p: p != RESEARCHER):
            info = yield from self.call({"tool": "edit_harness", "args": {
                "path": path, "content": files[path], "base_version": version}})
            if not info.get("ok"):
                return None
            version = info["result"]["version"]
        return version

    # ------------------------------------------------------------------ the plan

    def select(self, archive: list[Candidate]) -> Candidate:
        """The base of the next proposal, by ``select``: the best (greedy), the best of ``tournament``
        drawn at random, the latest accepted, or the target itself (root: every candidate is one change
        from the target, so its validation gain over the target is that change's; ``rsigym recurse``
        stacks changes across rounds on validation instead of on a few noisy train tasks)."""
        rule = self.config["select"]
        if rule == "latest":
            return archive[-1]
        if rule == "root":
            return archive[0]
        pool = archive
        if rule == "tournament":
            pool = [archive[self.rng.randrange(len(archive))] for _ in range(max(1, int(self.config["tournament"])))]
        return max(pool, key=lambda a: a.full)

    def draw_operator(self, available: list[str]) -> str | None:
        """An operator drawn by ``operator_weights`` among ``available`` (None if all weigh 0)."""
        weights = [max(0.0, float(self.config["operator_weights"].get(op, 0))) for op in available]
        if sum(weights) <= 0:
            return None
        return self.rng.choices(available, weights=weights)[0]

    def plan(self, info: dict[str, Any]) -> Generator[Action, Step, None]:
        parent_version = str(info.get("harness") or "latest")
        root = yield from self.load(parent_version)
        parent_version = self.parent_version
        parent = Candidate(parent_version, root, accepted=True)
        yield from self.measure(parent, None)
        self.log.append(parent.row())
        if parent.full is None or not root.operators():
            yield from self.submit(parent_version)
            return
        if self.config.get("proposal") == "cover":
            yield from self.cover(parent)
            return
        archive, evaluated = [parent], [parent]
        tried = {genome_key(root.genome)}
        needed = len(root.files) + 4 + 1  # edits, screen and full (evaluate + wait each), the submit
        proposals = 0
        while proposals < int(self.config["candidates"]) and not self.stop:
            if self.steps + needed > self.max_steps or not self.affordable(self.config["screen_k"], self.config["screen_tasks"]):
                break
            base = self.select(archive)
            proposal = self.propose(base, evaluated, tried)
            if proposal is None:
                break
            genome, lineage, operator = proposal
            proposals += 1
            tried.add(genome_key(genome))
            program = base.program.derived(genome, lineage)
            version = yield from self.edit(base.version, base.program.write(genome, lineage))
            if version is None or version in {e.version for e in evaluated}:
                continue
            candidate = Candidate(version, program, base.version, operator, lineage)
            yield from self.measure(candidate, base.screen)
            if candidate.screen is not None:
                evaluated.append(candidate)
            if candidate.full is not None and candidate.full > base.full + float(self.config["min_gain"]):
                candidate.accepted = True
                archive.append(candidate)
            self.log.append(candidate.row())
        best = max((a for a in archive if a.full is not None), key=lambda a: a.full)
        yield from self.submit(best.version)

    def cover(self, parent: Candidate) -> Generator[Action, Step, None]:
        """``proposal: "cover"``: the target's single moves (:func:`single_moves`) in the order of
        :func:`cover_order` (moves its memory has never seen first), each measured on all dev tasks while
        money and steps last; with ``cover_screen``, each is screened first (keeping enough money for
        ``full_top`` full evaluations) and the best ``full_top`` screens that pass (beat the target's
        screen; a tie passes with ``screen_ties``) are fully evaluated. Every trial goes
        into the memory (``memory/moves.md``), which is then written into every fully evaluated candidate
        and into the target itself (its successor: it behaves as the target, a program never sees its
        memory; ``rsigym recurse`` puts it in the target's place); the best candidate that beats the target
        on the full evaluation is submitted, else the successor. No randomness: the outer seed only changes
        the train tasks."""
        c = self.config
        tag, memory = base_tag(parent.program.genome), self.memory
        genes = parent.program.genome.get("STRATEGY") or parent.program.genome.get("params") or {}
        skip = set(c.get("skip_genes") or []) if isinstance(c.get("skip_genes"), list) else set()
        moves = [m for m in single_moves(parent.program, float(c["step"])) if move_gene(m[0]) not in skip]
        if c.get("code_moves") and RESEARCHER in parent.program.files:
            scales = tuple(float(x) for x in c.get("code_scale") or () if _numeric(x))
            code = [(key, dict(parent.program.genome, CODE=text), what) for key, text, what in
                    code_moves(parent.program.files[RESEARCHER], list(parent.program.genome.get("PHASES") or []),
                               float(c.get("code_guard", 0.25)), scales)]
            cut = next((i for i, m in enumerate(moves) if m[0].startswith("phase ")), len(moves))
            moves = moves[:cut] + code + moves[cut:]  # after the genes' moves, before the plan's
        order = cover_order(moves, memory, bool(c.get("retry", True)), tag, genes)
        full_top, sk, st = max(0, int(c.get("full_top", 4))), c["screen_k"], c["screen_tasks"]
        whole = not c.get("cover_screen") or (self.tasks is not None and st >= self.tasks and sk == c["full_k"])
        if whole:  # one stage: every move is measured on all dev tasks
            sk, st = c["full_k"], None
        keep = 0 if whole else full_top * int(c["full_k"]) * (self.tasks or 1)
        steps_after = 2 * full_top * 3 + full_top + 6  # full evaluations, memory edits, the submit
        screened: list[tuple[str, Candidate]] = []
        for key, genome, lineage in order[:max(0, int(c["candidates"]))]:
            if self.stop or self.steps + len(parent.program.files) + 3 + steps_after > self.max_steps \
                    or not self.affordable(sk, st, keep):
                break
            version = yield from self.edit(parent.version, parent.program.write(genome, lineage))
            if version is None:
                continue
            candidate = Candidate(version, parent.program.derived(genome, lineage), parent.version, "cover", lineage)
            candidate.screen = yield from self.evaluate(version, sk, st)
            if candidate.screen is None:
                continue
            gene = key.split("=", 1)[0]
            undo = f"{gene}={inline(genes[gene])}" if "=" in key and gene in genes else None
            memory.setdefault(key, []).append({"on": tag, "screen": round(candidate.screen - parent.screen, 6),
                                               "full": None, "undo": undo})
            screened.append((key, candidate))
        passing = [(k, x) for k, x in screened if x.screen > parent.screen
                   or (x.screen == parent.screen and c["screen_ties"])]
        passing.sort(key=lambda kx: -kx[1].screen)  # stable: equal screens stay in cover order
        for key, candidate in (screened if whole else passing[:full_top]):
            candidate.full = candidate.screen if whole else (yield from self.evaluate(candidate.version, c["full_k"], None))
            if candidate.full is None:
                continue
            memory[key][-1]["full"] = round(candidate.full - parent.full, 6)
            candidate.accepted = candidate.full > parent.full + float(c["min_gain"])
        self.log += [x.row() for _, x in screened]
        yield from self.propose_self(parent, memory, tag)
        text = {MEMORY: write_memory(memory)}
        best = max([x for _, x in screened if x.accepted], key=lambda x: x.full, default=None)
        submit = (yield from self.edit(parent.version, text)) or parent.version  # the target's successor
        for _, candidate in screened:
            if candidate.full is not None:  # what `rsigym recurse` may validate carries the whole memory
                version = yield from self.edit(candidate.version, text)
                if version is not None and candidate is best:
                    submit = version
        yield from self.submit(submit)

    def propose_self(self, parent: Candidate, memory: dict[str, list[dict[str, Any]]], tag: str
                     ) -> Generator[Action, Step, None]:
        """``self_moves`` edits of the target's own procedure (:func:`self_moves` of ``self_genes``): each a
        version of the target that differs only in ``code/improver.py``, not evaluated (its researcher plays
        exactly the target's episodes); ``rsigym recurse --mode improver`` finds them and judges each by
        what it produces. Each goes into the memory (tried, with its undo), so the next round proposes the
        next ones."""
        c = self.config
        n = max(0, int(c.get("self_moves", 0) or 0))
        genes = c.get("self_genes") if isinstance(c.get("self_genes"), list) else []
        if not n or SELF not in parent.program.files:
            return
        own = parent.program.genome.get("IMPROVER") or {}
        for key, genome, what in self_moves(parent.program, [str(g) for g in genes], float(c["step"]), memory)[:n]:
            if self.steps + 8 > self.max_steps:
                break
            files = parent.program.write(genome, what)
            version = yield from self.edit(parent.version, {SELF: files[SELF]})
            if version is None:
                continue
            gene = key[len("IMPROVER."):].split("=", 1)[0]
            memory.setdefault(key, []).append({"on": tag, "self": True, "screen": None, "full": None,
                                               "undo": f"IMPROVER.{gene}={inline(_get(own, gene))}"})
            self.log.append(Candidate(version, parent.program, parent.version, "self", what).row())

    def load(self, version: str) -> Generator[Action, Step, Program]:
        """Read the target: its file list (which also names the version), its code/researcher.py and
        code/improver.py, or its params.toml when it is not a program that follows the contract.
        Sets ``parent_version``."""
        self.parent_version = version
        listing = yield from self.call({"tool": "read", "args": {"ref": f"harness:{version}"}})
        head, _, names = _body(self.last_log).partition(": ")
        if not listing.get("ok"):
            return Program({})
        if head.startswith("harness "):
            self.parent_version = head.split()[1]
        paths = [p.strip() for p in names.split(",")]
        self.memory = read_memory((yield from self.read(self.parent_version, MEMORY)) if MEMORY in paths else None)
        for wanted in ([p for p in (RESEARCHER, SELF) if p in paths], ["params.toml"] if "params.toml" in paths else []):
            files: dict[str, str] = {}
            for path in wanted:
                text = yield from self.read(self.parent_version, path)
                if text is not None:
                    files[path] = text
            try:
                program = Program(files)
            except (SyntaxError, ValueError, tomllib.TOMLDecodeError):
                continue
            if program.operators():
                return program
        return Program({})

    def propose(self, base: Candidate, evaluated: list[Candidate], tried: set[str]) -> tuple[Genome, str, str] | None:
        """A new genome from ``base`` by one operator: ``(genome, lineage, operator)``; programs already
        tried are skipped (None after 50 draws found nothing new)."""
        program: Program = base.program
        donors = [(e.version, e.program.genome) for e in evaluated if e is not base]
        available = [op for op in program.operators() if op != "crossover" or donors]
        for _ in range(50):
            operator = self.draw_operator(available)
            if operator is None:
                return None
            made = propose(program, operator, self.rng, float(self.config["step"]), donors,
                           bool(self.config.get("skip_unread")))
            if made is not None and genome_key(made[0]) not in tried:
                return made[0], made[1], operator
        return None

    def submit(self, version: str) -> Generator[Action, Step, None]:
        """Submit ``version`` (waiting for the submission when it runs as a job)."""
        self.submitted = version
        info = yield from self.call({"tool": "submit", "args": {"checkpoint": "base", "harness": version}})
        job = (info.get("result") or {}).get("job") if info.get("ok") else None
        while job and job not in self.events:
            info = yield from self.call({"tool": "wait", "args": {"job": job}})
            if not info.get("ok"):
                break


def _first(value: Any) -> Any:
    """The first entry of an observation array (a list once it went through JSON), or the value."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    if hasattr(value, "tolist"):
        value = value.tolist()
        return value[0] if isinstance(value, list) and value else value
    return value


def make_improver(params: dict[str, Any] | None = None) -> ProgramImprover:
    """The improver. Entries of ``params`` named like an :data:`IMPROVER` gene (or ``improve_<gene>``)
    with a value of the same type override it; the rest is ignored."""
    overrides: dict[str, Any] = {}
    for key, value in (params or {}).items():
        gene = key[len("improve_"):] if key.startswith("improve_") else key
        if gene in IMPROVER and (type(value) is type(IMPROVER[gene]) or (_numeric(value) and _numeric(IMPROVER[gene]))):
            overrides[gene] = value
    return ProgramImprover(overrides)
