"""Teacher models of the local world: domain solvers with a per-teacher error rate and price.

A teacher is a :class:`~rsigym_env.serving.models.ChatModel`: it reads the conversation (only its
text), recognises the domain (``benchmarks.domain_of``), and answers the next turn in the action
language with the domain's solver (``benchmarks.SOLVERS``). With probability ``1 - accuracy`` an
episode is one the teacher gets wrong: the solver then makes a plausible mistake (a slipped
arithmetic step, a wrong letter, a wrong edit, a garbled file name, a guessed tool convention). The
draw depends on the request ``seed`` and the task prompt only, so every turn of one episode (asked
with the same seed) agrees, and the same request always gets the same answer.

Prices (dollars per million tokens, token counts by ``serving.models.estimate_tokens``):

=============== ======== ===== ======
teacher         accuracy input output
=============== ======== ===== ======
teacher-small   0.70     0.15   0.60
teacher-large   0.95     3.00  15.00
=============== ======== ===== ======

>>> from rsigym_env.serving.models import ChatRequest
>>> t = TeacherModel("teacher-large", accuracy=1.0)
>>> req = ChatRequest(model="teacher-large", seed=1, messages=[
...     {"role": "user", "content": "Compute left to right: 2 + 3 * 4\\nWrite the steps, then ANSWER: <integer>."}])
>>> t.complete(req)[0].content
'2+3=5 5*4=20 ANSWER: 20'
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rsigym_env.prices import TeacherPrice
from rsigym_env.serving.models import ChatChoice, ChatRequest, apply_limits, estimate_completion_tokens, estimate_prompt_tokens

from .benchmarks import (BENCHMARKS, SOLVERS, Problem, domain_of, observation, parse_action, run_command, verify_dir,
                         write_files)

TEACHER_ACCURACY: dict[str, float] = {"teacher-small": 0.70, "teacher-large": 0.95}
TEACHER_PRICES: dict[str, TeacherPrice] = {
    "teacher-small": TeacherPrice(input=0.15, output=0.60),
    "teacher-large": TeacherPrice(input=3.00, output=15.00),
}


class TeacherModel:
    """A solver-backed chat model that errs on a ``1 - accuracy`` share of episodes."""

    context_length = None

    def __init__(self, name: str, accuracy: float):
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError("accuracy must be in [0, 1]")
        self.name, self.accuracy = name, accuracy

    def wrong(self, messages: list[dict[str, str]], seed: int | None, index: int = 0) -> tuple[bool, random.Random]:
        """Is this episode one the teacher gets wrong? (a function of seed, task prompt and choice index)"""
        first = next((m["content"] for m in messages if m["role"] == "user"), "")
        h = hashlib.sha256(f"{self.name}|{seed}|{index}|{first}".encode()).hexdigest()
        rng = random.Random(h)
        return rng.random() >= self.accuracy, rng

    def answer(self, messages: list[dict[str, str]], seed: int | None = None, index: int = 0) -> str:
        """The next action line for a conversation."""
        wrong, rng = self.wrong(messages, seed, index)
        return SOLVERS[domain_of(messages)](messages, rng, wrong)

    def complete(self, request: ChatRequest) -> list[ChatChoice]:
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in request.messages]
        prompt_tokens = estimate_prompt_tokens(request)
        out = []
        for i in range(request.n):
            choice = apply_limits(self.answer(messages, request.seed, i), request)
            choice.prompt_tokens = prompt_tokens
            choice.completion_tokens = estimate_completion_tokens(choice)
            out.append(choice)
        return out

    def __repr__(self) -> str:
        return f"TeacherModel({self.name!r}, accuracy={self.accuracy})"


TEACHERS: dict[str, Callable[[], TeacherModel]] = {
    name: (lambda name=name: TeacherModel(name, TEACHER_ACCURACY[name])) for name in TEACHER_ACCURACY}
"""Teacher name → factory."""


@dataclass(frozen=True)
class Demonstration:
    """A played episode: the chat (with the observations the harness showed), its token usage, and
    whether it solved the task (the verifier's rules on the final files; None when not checked)."""

    messages: list[dict[str, str]]
    prompt_tokens: int
    completion_tokens: int
    passed: bool | None = None

    def __iter__(self):  # (messages, prompt tokens, completion tokens), as before
        return iter((self.messages, self.prompt_tokens, self.completion_tokens))

    def __getitem__(self, index: int) -> Any:
        return (self.messages, self.prompt_tokens, self.completion_tokens)[index]


def run_episode(ask: Callable[[list[dict[str, str]]], tuple[str, int, int]], problem: Problem,
                max_turns: int | None = None, *, check: bool = False) -> Demonstration:
    """Play one episode as the minimal harness does (fresh shell per command at a copy of the task's
    files, ``OUT:`` observations, ``ANSWER:`` written to ``answer.txt``) with ``ask(messages) -> (reply,
    prompt_tokens, completion_tokens)``. ``check``: judge the final files with the verifier's rules —
    what replaying the chat and verifying would give, without running anything twice."""
    bench = next(b for b in BENCHMARKS.values() if b.domain == problem.domain)
    turns = max_turns or bench.max_turns
    messages = list(problem.messages)
    used = [0, 0]
    tmp = tempfile.mkdtemp(prefix="rsigym-teach-")
    try:
        app = Path(tmp)
        write_files(app, problem.files)
        for _ in range(turns):
            reply, pt, ct = ask(messages)
            used[0] += pt
            used[1] += ct
            reply = reply.strip()
            messages.append({"role": "assistant", "content": reply})
            kind, arg = parse_action(reply)
            if kind == "answer":
                (app / "answer.txt").write_text(arg + "\n")
            if kind != "cmd":
                break
            out, code = run_command(arg, app)
            messages.append({"role": "user", "content": observation(out, code)})
        if messages[-1]["role"] != "assistant":
            messages.pop()
        passed = verify_dir(app, problem.expected) if check else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Demonstration(messages, used[0], used[1], passed)


def demonstrate(client: Any, teacher: str, problem: Problem, seed: int, max_tokens: int = 256, *,
                check: bool = False) -> Demonstration:
    """A teacher demonstration of ``problem`` through an ``openai`` client (the OpenAI-compatible
    server): the full chat with the observations the harness would show, the token usage and (with
    ``check``) whether it solved the task."""
    def ask(messages: list[dict[str, str]]) -> tuple[str, int, int]:
        r = client.chat.completions.create(model=teacher, messages=messages, max_tokens=max_tokens, seed=seed,
                                           temperature=0)
        usage = r.usage
        return (r.choices[0].message.content or "", getattr(usage, "prompt_tokens", 0) or 0,
                getattr(usage, "completion_tokens", 0) or 0)

    return run_episode(ask, problem, check=check)


def demonstrate_local(model: TeacherModel, problem: Problem, seed: int, *, check: bool = False) -> Demonstration:
    """As :func:`demonstrate` but calling the teacher in-process (no server)."""
    def ask(messages: list[dict[str, str]]) -> tuple[str, int, int]:
        req = ChatRequest(model=model.name, messages=messages, seed=seed)
        c = model.complete(req)[0]
        return c.content or "", c.prompt_tokens or 0, c.completion_tokens or 0

    return run_episode(ask, problem, check=check)




CONTEXT_TOKENS = 512      # the local model's window (bytes + specials): no demonstration turn is longer
DEMO_WORKERS = 3          # teacher demonstrations at once (they mostly wait on the teacher server and on processes)


class LocalTeachers:
    """The :class:`~rsigym_env.worlds.common.rollout.Teachers` back end of the local world: the teachers in
    ``registry`` (served by the world's OpenAI-compatible server, reached through ``client``) demonstrate the
    benchmark's synthetic problems, each checked with the domain's checker (``meta.passed``)."""

    def __init__(self, *, client: Any, registry: Any, benchmark: Any):
        self.client, self.registry, self.benchmark = client, registry, benchmark

    def answers(self, name: str) -> bool:
        return self.registry.get(name) is not None

    def worst_case(self, call: Any) -> tuple[int, int, float]:
        cap = min(call.max_tokens_per_example, CONTEXT_TOKENS)
        return call.n_examples * self.benchmark.max_turns * CONTEXT_TOKENS, call.n_examples * cap, call.n_examples * 0.01

    def examples(self, call: Any, stream: int) -> Any:
        import concurrent.futures as cf

        problems = self.benchmark.synthetic(call.n_examples, seed=stream)

        def one(i: int) -> Demonstration:
            return demonstrate(self.client, call.teacher, problems[i], seed=stream + i,
                               max_tokens=call.max_tokens_per_example, check=True)

        # side by side (their commands and checks wait on processes), kept in order
        with cf.ThreadPoolExecutor(max_workers=DEMO_WORKERS, thread_name_prefix="rsigym-demo") as pool:
            for i, demo in enumerate(pool.map(one, range(len(problems)))):
                row = {"messages": demo.messages,
                       "meta": {"problem": problems[i].id, "teacher": call.teacher, "passed": bool(demo.passed)}}
                yield row, demo.prompt_tokens, demo.completion_tokens


__all__ = ["Demonstration", "LocalTeachers", "TEACHERS", "TEACHER_ACCURACY", "TEACHER_PRICES", "TeacherModel",
           "demonstrate", "demonstrate_local", "run_episode"]
