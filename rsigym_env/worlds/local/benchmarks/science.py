"""``local-science`` (mirrors GPQA Diamond): multiple choice over a synthetic knowledge base.

The knowledge base (``KB``) gives 40 invented substances four properties each. Pretraining text
states only about half of the facts (``PRETRAIN_FACTS``), so the base model knows some answers and
guesses the rest; teachers know the whole base (up to their error rate).

>>> b = ScienceBenchmark()
>>> p = b.split("dev")[0]
>>> "A) " in p.instruction and p.expected["answer"] in "ABCD"
True
>>> solve_next(p.messages).endswith("ANSWER: " + p.expected["answer"])
True
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
_SYL = ["zor", "qua", "fen", "lit", "mar", "dex", "vol", "pim", "rho", "sal", "tuv", "kel", "bri", "nox"]


def _make_kb() -> dict[str, dict[str, str]]:
    rng = random.Random("local-science:kb")
    names: list[str] = []
    while len(names) < 40:
        n = rng.choice(_SYL) + rng.choice(_SYL) + rng.choice(("ium", "ite", "on", "ine"))
        if n not in names:
            names.append(n)
    return {n: {a: rng.choice(v) for a, v in ATTRIBUTES.items()} for n in names}


KB = _make_kb()
_rng = random.Random("local-science:pretrain-facts")
PRETRAIN_FACTS = frozenset((e, a) for e in KB for a in ATTRIBUTES if _rng.random() < 0.5)
"""The (substance, property) facts that the pretraining text states."""

_Q = re.compile(r"What is the (\w+) of (\w+)\?")
_CHOICE = re.compile(r"^([ABCD])\) (\w+)$", re.M)


def fact(entity: str, attr: str) -> str:
    return f"{entity} {attr} is {KB[entity][attr]}."


class ScienceBenchmark(LocalBenchmark):
    name = "local-science"
    paper_id = "gpqa-diamond"
    domain = "science"
    description = ("Multiple-choice questions (A-D) about the properties of 40 invented substances; the facts come "
                   "from a fixed synthetic knowledge base that pretraining covers only in part. Scored by the "
                   "letter in /app/answer.txt.")
    max_turns = 2
    agent_timeout_sec = 30.0

    def generate(self, rng: random.Random, stream: str) -> Problem:
        entity = rng.choice(sorted(KB))
        attr = rng.choice(sorted(ATTRIBUTES))
        truth = KB[entity][attr]
        options = [truth] + rng.sample([v for v in ATTRIBUTES[attr] if v != truth], 3)
        rng.shuffle(options)
        letter = "ABCD"[options.index(truth)]
        lines = [f"What is the {attr} of {entity}?"] + [f"{l}) {o}" for l, o in zip("ABCD", options)]
        instruction = "\n".join(lines) + "\nReply ANSWER: <letter>."
        known = (entity, attr) in PRETRAIN_FACTS
        return Problem(id="", domain=self.domain, instruction=instruction, expected={"kind": "answer", "answer": letter},
                       solution=[f"{fact(entity, attr)} ANSWER: {letter}"], difficulty="easy" if known else "hard",
                       meta={"entity": entity, "attr": attr, "known": known})


def _parse(messages: list[dict]) -> tuple[str, str, dict[str, str]] | None:
    text = next(m["content"] for m in messages if m["role"] == "user")
    q = _Q.search(text)
    if not q:
        return None
    return q.group(2), q.group(1), {v: k for k, v in _CHOICE.findall(text)}


def solve_next(messages: list[dict], rng: random.Random | None = None, wrong: bool = False) -> str:
    """Look the fact up in the knowledge base (a wrong letter when ``wrong``)."""
    parsed = _parse(messages)
    if parsed is None or parsed[0] not in KB or parsed[1] not in ATTRIBUTES:
        return "ANSWER: A"
    entity, attr, choices = parsed
    truth = KB[entity][attr]
    letter = choices.get(truth, "A")
    if wrong:
        rng = rng or random.Random(0)
        others = [(v, l) for v, l in choices.items() if l != letter] or [("?", "A")]
        value, letter = rng.choice(sorted(others))
        return f"{entity} {attr} is {value}. ANSWER: {letter}"
    return f"{fact(entity, attr)} ANSWER: {letter}"


def pretrain_chat(problem: Problem, rng: random.Random) -> list[tuple[str, str | None]] | None:
    """Pretraining states only ``PRETRAIN_FACTS``: an answered question about a known fact, else None."""
    if not problem.meta["known"]:
        return None
    return [(solve_next(problem.messages, rng, wrong=rng.random() < 0.05), None)]


def fact_chats(rng: random.Random) -> list[dict[str, str]]:
    """A fact statement as a short chat (pretraining text about a known fact)."""
    entity, attr = rng.choice(sorted(PRETRAIN_FACTS))
    return [{"role": "user", "content": f"What is the {attr} of {entity}?"},
            {"role": "assistant", "content": fact(entity, attr)}]
