"""``local-science`` (mirrors GPQA Diamond): multiple choice whose truth is stated in the task.

Generator 4: every problem invents its own substances (names from the syllables below, never one of
the 40 names of the old knowledge base ``KB``, so what the base model learnt about those is no help)
with properties drawn at random for that problem, and states them in a line of lab notes before the
familiar question. The answer follows from reading the notes, and from nothing else: no table in the
package gives it. An easy problem states the property outright; a hard one states a one-step rule
(``every helical substance is positive``) and the substance's premise property. The options always
hold the other substance's value (or the other rule's conclusion), so reading the wrong line of the
notes gives a wrong letter.

>>> b = ScienceBenchmark()
>>> p = b.split("dev")[0]
>>> print(p.instruction)  # doctest: +NORMALIZE_WHITESPACE
Lab notes: every black substance is ring; every blue substance is sphere; litbrion is black and foam;
  rhomaron is gel and blue.
What is the shape of litbrion?
A) needle
B) ring
C) sphere
D) cubic
Reply ANSWER: <letter>.
>>> p.expected["answer"], p.difficulty, p.solution
('B', 'hard', ['litbrion is black. litbrion shape is ring. ANSWER: B'])
>>> solve_next(p.messages) == p.solution[0]
True
>>> all(solve_next(q.messages).endswith("ANSWER: " + q.expected["answer"]) for q in b.split("dev"))
True

Generators 1-3 asked about ``KB`` (40 substances x 4 properties) instead, so the package held the answer
key of every official task. That generator is kept, unchanged, as pretraining text only
(``generate_kb``, ``kb_stream``, ``pretrain_chat``, ``fact_chats``): the shipped base checkpoint was
pretrained on it, and ``benchmarks.pretraining_conversations`` still draws exactly the same
conversations.
"""

from __future__ import annotations

import random
import re

from .base import LocalBenchmark, Problem

ATTRIBUTES: dict[str, list[str]] = {
    "color": ["red", "blue", "green", "gold", "white", "black", "violet", "gray"],
    "phase": ["solid", "liquid", "gas", "plasma", "gel", "foam"],
    "charge": ["positive", "negative", "neutral", "mixed"],
    "shape": ["cubic", "helical", "layered", "needle", "ring", "sphere"],
}
"""The four properties and their values (no value belongs to two properties)."""
_SYL = ["zor", "qua", "fen", "lit", "mar", "dex", "vol", "pim", "rho", "sal", "tuv", "kel", "bri", "nox"]
_SUFFIXES = ("ium", "ite", "on", "ine")
HARD_SHARE = 0.4
"""Share of problems that state a rule rather than the property itself."""


# --- generator 4: the facts are in the question ------------------------------------------------------


class ScienceBenchmark(LocalBenchmark):
    name = "local-science"
    paper_id = "gpqa-diamond"
    domain = "science"
    description = ("Multiple-choice questions (A-D) about the properties of substances invented for each question; "
                   "a line of lab notes in the question states the facts (or a one-step rule and a premise), "
                   "next to another substance's. Scored by the letter in /app/answer.txt.")
    max_turns = 2
    agent_timeout_sec = 30.0

    def generate(self, rng: random.Random, stream: str) -> Problem:
        return generate_notes(rng)


def _name(rng: random.Random, taken: set[str]) -> str:
    """An invented substance: never one of ``KB``'s (the base model was pretrained on those) nor ``taken``."""
    while True:
        n = rng.choice(_SYL) + rng.choice(_SYL) + rng.choice(_SUFFIXES)
        if n not in KB and n not in taken:
            taken.add(n)
            return n


def _describe(rng: random.Random, name: str, values: list[str]) -> str:
    values = list(values)
    rng.shuffle(values)
    return f"{name} is {' and '.join(values)}"


def generate_notes(rng: random.Random) -> Problem:
    """One generator-4 problem: two invented substances, their facts in the lab notes, a question on one.

    >>> p = generate_notes(random.Random(1))
    >>> p.instruction.startswith("Lab notes: ") and p.instruction.endswith("Reply ANSWER: <letter>.")
    True
    """
    taken: set[str] = set()
    target, other = _name(rng, taken), _name(rng, taken)
    attr = rng.choice(sorted(ATTRIBUTES))
    truth, decoy = rng.sample(ATTRIBUTES[attr], 2)
    hard = rng.random() < HARD_SHARE
    rules: list[str] = []
    if hard:  # a one-step rule: the premise (another property) is stated, the asked property follows
        premise = rng.choice(sorted(a for a in ATTRIBUTES if a != attr))
        p_target, p_other = rng.sample(ATTRIBUTES[premise], 2)
        rules = [f"every {p_target} substance is {truth}", f"every {p_other} substance is {decoy}"]
        rng.shuffle(rules)
        filler = [a for a in sorted(ATTRIBUTES) if a not in (attr, premise)]
        facts = {target: [p_target, rng.choice(ATTRIBUTES[rng.choice(filler)])],
                 other: [p_other, rng.choice(ATTRIBUTES[rng.choice(filler)])]}
        reasoning = f"{target} is {p_target}. "
    else:
        filler = [a for a in sorted(ATTRIBUTES) if a != attr]
        facts = {target: [truth, rng.choice(ATTRIBUTES[rng.choice(filler)])],
                 other: [decoy, rng.choice(ATTRIBUTES[rng.choice(filler)])]}
        reasoning = ""
    order = [target, other]
    rng.shuffle(order)
    notes = rules + [_describe(rng, n, facts[n]) for n in order]
    options = [truth, decoy] + rng.sample([v for v in ATTRIBUTES[attr] if v not in (truth, decoy)], 2)
    rng.shuffle(options)
    letter = "ABCD"[options.index(truth)]
    lines = ([f"Lab notes: {'; '.join(notes)}.", f"What is the {attr} of {target}?"]
             + [f"{l}) {o}" for l, o in zip("ABCD", options)])
    instruction = "\n".join(lines) + "\nReply ANSWER: <letter>."
    return Problem(id="", domain="science", instruction=instruction, expected={"kind": "answer", "answer": letter},
                   solution=[f"{reasoning}{target} {attr} is {truth}. ANSWER: {letter}"],
                   difficulty="hard" if hard else "easy",
                   meta={"entity": target, "attr": attr, "other": other, "rule": hard})


_Q = re.compile(r"What is the (\w+) of (\w+)\?")
_CHOICE = re.compile(r"^([ABCD])\) (\w+)$", re.M)
_NOTES = re.compile(r"^Lab notes: (.*)\.$", re.M)
_RULE = re.compile(r"^every (\w+) substance is (\w+)$")
_FACT = re.compile(r"^(\w+) is (\w+(?: and \w+)*)$")


def read_notes(text: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The lab notes of a question → (substance → stated values, premise value → implied values).

    >>> facts, rules = read_notes("Lab notes: every red substance is gas; pimon is red and cubic.")
    >>> sorted(facts["pimon"]), rules
    (['cubic', 'red'], {'red': {'gas'}})
    """
    facts: dict[str, set[str]] = {}
    rules: dict[str, set[str]] = {}
    m = _NOTES.search(text)
    for clause in (m.group(1).split("; ") if m else []):
        if r := _RULE.match(clause):
            rules.setdefault(r.group(1), set()).add(r.group(2))
        elif f := _FACT.match(clause):
            facts.setdefault(f.group(1), set()).update(f.group(2).split(" and "))
    return facts, rules


def solve_next(messages: list[dict], rng: random.Random | None = None, wrong: bool = False) -> str:
    """Read the answer off the lab notes (applying their rules; a wrong letter when ``wrong``).

    Only the question's text is used: the values stated for the asked substance (and what the rules
    derive from them) that are among the options. No notes, nothing to read: ``ANSWER: A``.

    >>> msgs = [{"role": "user", "content": "Lab notes: pimon is red and gas; tuvon is blue and gel.\\n"
    ...          "What is the color of tuvon?\\nA) red\\nB) gold\\nC) blue\\nD) white\\nReply ANSWER: <letter>."}]
    >>> solve_next(msgs), solve_next(msgs, random.Random(0), wrong=True)
    ('tuvon color is blue. ANSWER: C', 'tuvon color is red. ANSWER: A')
    """
    text = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
    q = _Q.search(text)
    if not q:
        return "ANSWER: A"
    attr, entity = q.group(1), q.group(2)
    choices = {v: k for k, v in _CHOICE.findall(text)}
    facts, rules = read_notes(text)
    stated = facts.get(entity, set())
    known, steps = set(stated), []
    for _ in range(3):  # rules chain at most a few steps
        new = {c for v in sorted(known) for c in rules.get(v, ()) if c not in known}
        if not new:
            break
        steps += sorted(v for v in known if rules.get(v, set()) & new)
        known |= new
    found = sorted(v for v in known if v in choices)
    if len(found) != 1:
        return "ANSWER: A"
    value, letter = found[0], choices[found[0]]
    reasoning = "".join(f"{entity} is {v}. " for v in steps if v in stated)
    if wrong:
        rng = rng or random.Random(0)
        others = [(v, l) for v, l in choices.items() if l != letter] or [("?", "A")]
        value, letter = rng.choice(sorted(others))
        reasoning = ""
    return f"{reasoning}{entity} {attr} is {value}. ANSWER: {letter}"


# --- generators 1-3 (pretraining text only): a fixed knowledge base ---------------------------------


def _make_kb() -> dict[str, dict[str, str]]:
    rng = random.Random("local-science:kb")
    names: list[str] = []
    while len(names) < 40:
        n = rng.choice(_SYL) + rng.choice(_SYL) + rng.choice(("ium", "ite", "on", "ine"))
        if n not in names:
            names.append(n)
    return {n: {a: rng.choice(v) for a, v in ATTRIBUTES.items()} for n in names}


KB = _make_kb()
"""Generators 1-3's knowledge base (40 invented substances, four properties each): the pretraining text's
facts. No benchmark problem asks about it any more (generator 4 never uses its names)."""
_rng = random.Random("local-science:pretrain-facts")
PRETRAIN_FACTS = frozenset((e, a) for e in KB for a in ATTRIBUTES if _rng.random() < 0.5)
"""The (substance, property) facts of ``KB`` that the pretraining text states."""


def fact(entity: str, attr: str) -> str:
    return f"{entity} {attr} is {KB[entity][attr]}."


def generate_kb(rng: random.Random) -> Problem:
    """Generators 1-3's problem (a question about ``KB``), kept as pretraining text: draws exactly as they did."""
    entity = rng.choice(sorted(KB))
    attr = rng.choice(sorted(ATTRIBUTES))
    truth = KB[entity][attr]
    options = [truth] + rng.sample([v for v in ATTRIBUTES[attr] if v != truth], 3)
    rng.shuffle(options)
    letter = "ABCD"[options.index(truth)]
    lines = [f"What is the {attr} of {entity}?"] + [f"{l}) {o}" for l, o in zip("ABCD", options)]
    instruction = "\n".join(lines) + "\nReply ANSWER: <letter>."
    known = (entity, attr) in PRETRAIN_FACTS
    return Problem(id="", domain="science", instruction=instruction, expected={"kind": "answer", "answer": letter},
                   solution=[f"{fact(entity, attr)} ANSWER: {letter}"], difficulty="easy" if known else "hard",
                   key=instruction, meta={"entity": entity, "attr": attr, "known": known})


def kb_stream(bench: "ScienceBenchmark", seed: int = 0):
    """Generators 1-3's pretraining stream, as every recorded mixture drew it (skipping their dev and official
    problems, which generator 4's splits no longer hold)."""
    held: set[str] = set()
    for split, total in (("dev", 20), ("official", 50)):
        i = 0
        while len(held) < total:
            held.add(generate_kb(random.Random(f"local-science:{split}:{i}")).key)
            i += 1
    name = f"pretrain{seed}" if seed else "pretrain"
    i = 0
    while True:
        p = generate_kb(random.Random(f"local-science:{name}:{i}"))
        i += 1
        if p.key not in held:
            p.id = f"local-science-pretrain-{seed}-{i - 1:05d}"
            yield p


def kb_solve_next(messages: list[dict], rng: random.Random | None = None, wrong: bool = False) -> str:
    """Generators 1-3's solver: look the fact up in ``KB`` (a wrong letter when ``wrong``); pretraining text only."""
    text = next(m["content"] for m in messages if m["role"] == "user")
    q = _Q.search(text)
    if not q or q.group(2) not in KB or q.group(1) not in ATTRIBUTES:
        return "ANSWER: A"
    entity, attr, choices = q.group(2), q.group(1), {v: k for k, v in _CHOICE.findall(text)}
    truth = KB[entity][attr]
    letter = choices.get(truth, "A")
    if wrong:
        rng = rng or random.Random(0)
        others = [(v, l) for v, l in choices.items() if l != letter] or [("?", "A")]
        value, letter = rng.choice(sorted(others))
        return f"{entity} {attr} is {value}. ANSWER: {letter}"
    return f"{fact(entity, attr)} ANSWER: {letter}"


def pretrain_chat(problem: Problem, rng: random.Random) -> list[tuple[str, str | None]] | None:
    """Pretraining (``kb_stream``'s problems) states only ``PRETRAIN_FACTS``: an answered question about a
    known fact, else None."""
    if not problem.meta["known"]:
        return None
    return [(kb_solve_next(problem.messages, rng, wrong=rng.random() < 0.05), None)]


def fact_chats(rng: random.Random) -> list[dict[str, str]]:
    """A fact statement as a short chat (pretraining text about a known fact)."""
    entity, attr = rng.choice(sorted(PRETRAIN_FACTS))
    return [{"role": "user", "content": f"What is the {attr} of {entity}?"},
            {"role": "assistant", "content": fact(entity, attr)}]
