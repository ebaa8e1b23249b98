"""The inference service of the local and the remote world: one chat completion from the base model or a
checkpoint, through any OpenAI-compatible ``chat.completions`` client (the local world's own server, or the
remote world's inference endpoint).

Quotes count the prompt as its bytes plus ``prompt_overhead`` tokens of chat framing (every tokenizer here has at
least one byte per token); the bill is the provider's own token counts, cached prompt tokens at the cached rate,
never above the quote.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ...errors import ActionError
from ...prices import PriceList
from ...services import Billed, Completion, Quote
from ...tools import Infer


class ChatInferenceService:
    """The :class:`~rsigym_env.services.InferenceService` over ``client``; ``model_for(name)`` checks that the
    checkpoint exists (raising ``unknown_ref``); ``context_tokens`` is the model's window; a quote's duration is
    ``latency_s`` plus the completion at ``tokens_per_second``."""

    def __init__(self, *, client: Any, model_for: Callable[[str], Any], prices: PriceList, seed: int,
                 context_tokens: int, prompt_overhead: int, tokens_per_second: float, latency_s: float = 0.0):
        self.client, self.model_for, self.prices, self.seed = client, model_for, prices, seed
        self.context_tokens, self.prompt_overhead = context_tokens, prompt_overhead
        self.tokens_per_second, self.latency_s = tokens_per_second, latency_s

    def _limits(self, call: Infer) -> tuple[int, int]:
        self.model_for(call.model)  # unknown checkpoint -> unknown_ref
        prompt = len(call.prompt.encode()) + self.prompt_overhead
        if prompt >= self.context_tokens:
            raise ActionError("invalid_args", f"infer: the prompt may be up to {prompt} tokens; the model's context "
                                              f"is {self.context_tokens} tokens")
        return prompt, min(call.max_tokens, self.context_tokens - prompt)

    def quote(self, call: Infer) -> Quote:
        prompt, completion = self._limits(call)
        return Quote(usd=self.prices.sample_usd(prompt, completion),
                     seconds=self.latency_s + completion / self.tokens_per_second)

    def complete(self, call: Infer) -> Billed[Completion]:
        quote = self.quote(call)
        _, max_tokens = self._limits(call)
        start = time.monotonic()
        reply = self.client.chat.completions.create(model=call.model, messages=[{"role": "user", "content": call.prompt}],
                                                    max_tokens=max_tokens, seed=self.seed, temperature=0.7)
        choice, usage = reply.choices[0], reply.usage
        details = getattr(usage, "prompt_tokens_details", None)
        cached = int(getattr(details, "cached_tokens", 0) or 0)
        value = Completion(text=choice.message.content or "", prompt_tokens=usage.prompt_tokens,
                           completion_tokens=usage.completion_tokens,
                           finish_reason="length" if choice.finish_reason == "length" else "stop")
        cost = min(quote.usd, self.prices.sample_usd_cached(usage.prompt_tokens, cached, usage.completion_tokens))
        return Billed[Completion](value=value, cost_usd=cost, seconds=time.monotonic() - start)


__all__ = ["ChatInferenceService"]
