"""The remote world's teachers: the :class:`~..common.rollout.Teachers` back end over the scenario's teacher catalog.

A catalog teacher is asked over its OpenAI-compatible endpoint (through the world's
:class:`~.clients.RoutedClient`), first for a new problem in the benchmark's domain, then for its solution.
Worst cases use bytes as the token count (every tokenizer here has at least one byte per token).
"""

from __future__ import annotations

from typing import Any, Iterator

from ...tools import GenerateData

PROMPT_OVERHEAD = 64          # tokens of chat framing per request, for quotes
PROBLEM_TOKENS = 1024         # the teacher's problem statement cap
SECONDS_PER_EXAMPLE = 20.0    # two teacher requests, for quotes


def _bytes(text: str) -> int:
    return len(text.encode())


class CatalogTeachers:
    """Teachers of the scenario's catalog, reached through ``client`` by name (``client.get(name)``: its route)."""

    def __init__(self, *, client: Any, benchmark: Any):
        self.client, self.benchmark = client, benchmark

    def answers(self, name: str) -> bool:
        return self.client.get(name) is not None

    def _prompt(self, index: int, stream: int) -> str:
        b = self.benchmark
        return (f"Write one new, self-contained practice problem for {b.name}: {b.domain}. Make it different from "
                f"common textbook examples (variation #{stream}-{index}). Reply with the problem statement only.")

    def worst_case(self, call: GenerateData) -> tuple[int, int, float]:
        per_example_in = 2 * PROMPT_OVERHEAD + _bytes(self._prompt(0, 0)) + PROBLEM_TOKENS
        per_example_out = PROBLEM_TOKENS + call.max_tokens_per_example
        return call.n_examples * per_example_in, call.n_examples * per_example_out, call.n_examples * SECONDS_PER_EXAMPLE

    def examples(self, call: GenerateData, stream: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        def ask(messages: list[dict[str, str]], max_tokens: int, seed: int, usage: list[int]) -> str:
            reply = self.client.chat.completions.create(model=call.teacher, messages=messages, max_tokens=max_tokens,
                                                        seed=seed, temperature=1.0)
            usage[0] += reply.usage.prompt_tokens
            usage[1] += reply.usage.completion_tokens
            return reply.choices[0].message.content or ""

        for i in range(call.n_examples):
            usage = [0, 0]
            problem = ask([{"role": "user", "content": self._prompt(i, stream)}], PROBLEM_TOKENS, stream + i, usage)
            answer = ask([{"role": "user", "content": problem}], call.max_tokens_per_example, stream + i, usage)
            row = {"messages": [{"role": "user", "content": problem}, {"role": "assistant", "content": answer}],
                   "meta": {"teacher": call.teacher, "index": i}}
            yield row, usage[0], usage[1]


__all__ = ["CatalogTeachers"]
