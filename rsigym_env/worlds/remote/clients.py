"""OpenAI-compatible clients of the remote world, shaped like the ``openai`` client the shared services use.

:class:`RoutedClient` has the one method the shared services call, ``chat.completions.create(model=...,
...)``, and routes by the *researcher's* model name: ``base`` and checkpoint ids (``ckpt-3``) go to the
inference endpoint under Tinker's names (the base model id, or the checkpoint's
``tinker://…/sampler_weights/…`` path); a teacher name goes to that teacher's endpoint under its provider
id. Provider errors become typed :class:`~rsigym_env.errors.ActionError` codes (:mod:`.errors`), retried
where safe. :class:`ForwardingChatModel` serves a checkpoint through the same route to Harbor trials
(behind the evaluation's own OpenAI-compatible proxy, which meters and budgets every trial).

>>> class Echo:
...     def create(self, **kw):
...         return kw["model"]
>>> routes = {"base": Route(Echo(), "Qwen/Qwen3.5-35B-A3B-Base", "Tinker")}
>>> RoutedClient(routes).chat.completions.create(model="base", messages=[])
'Qwen/Qwen3.5-35B-A3B-Base'
>>> RoutedClient(routes).chat.completions.create(model="ckpt-9", messages=[])
Traceback (most recent call last):
...
rsigym_env.errors.ActionError: no model 'ckpt-9' here; models: base
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

from ...errors import ActionError
from ...serving.models import ChatChoice, ChatRequest, ModelRequestError, ToolCall
from .errors import call_with_retries


@dataclass(frozen=True)
class Route:
    """Where a model name goes: a ``chat.completions``-like object, the provider-side model id, a label."""

    completions: Any
    provider_model: str
    provider: str


class _Completions:
    def __init__(self, client: "RoutedClient"):
        self._client = client

    def create(self, *, model: str, **params: Any) -> Any:
        route = self._client.route(model)
        return call_with_retries(lambda: route.completions.create(model=route.provider_model, **params),
                                 what=route.provider, attempts=self._client.attempts,
                                 backoff_s=self._client.backoff_s)


class _Chat:
    def __init__(self, client: "RoutedClient"):
        self.completions = _Completions(client)


class RoutedClient:
    """``client.chat.completions.create(model=NAME, ...)`` over per-name :class:`Route` s (thread-safe to extend)."""

    def __init__(self, routes: Mapping[str, Route] | None = None, attempts: int = 3, backoff_s: float = 1.0):
        self._routes: dict[str, Route] = dict(routes or {})
        self._lock = threading.Lock()
        self.attempts, self.backoff_s = attempts, backoff_s
        self.chat = _Chat(self)

    def add(self, name: str, route: Route) -> None:
        with self._lock:
            self._routes[name] = route

    def route(self, name: str) -> Route:
        with self._lock:
            route = self._routes.get(name)
            names = sorted(self._routes)
        if route is None:
            raise ActionError("unknown_ref", f"no model {name!r} here; models: {', '.join(names)}")
        return route

    def get(self, name: str) -> Route | None:
        with self._lock:
            return self._routes.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._routes)


def openai_completions(base_url: str, api_key: str, timeout_s: float) -> Any:
    """``OpenAI(...).chat.completions`` with the SDK's own retries off (:class:`RoutedClient` retries)."""
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s).chat.completions


class ForwardingChatModel:
    """A :class:`~rsigym_env.serving.models.ChatModel` that forwards each request to ``client`` as ``name``.

    Token counts come from the provider's ``usage``; a provider failure reaches the harness as HTTP 4xx
    (``ModelRequestError``) with the typed code, so a harness sees *why* and can retry.
    """

    context_length = None

    def __init__(self, client: RoutedClient, name: str):
        self.client, self.name = client, name

    def complete(self, request: ChatRequest) -> list[ChatChoice]:
        body = request.model_dump(exclude_none=True, exclude={"model", "stream", "stream_options"})
        try:
            reply = self.client.chat.completions.create(model=self.name, **body)
        except ActionError as err:
            status = {"rate_limited": 429, "unknown_ref": 404}.get(err.code, 424)
            raise ModelRequestError(err.message, status=status, code=err.code, type="provider_error") from None
        usage = getattr(reply, "usage", None)
        choices = []
        for i, choice in enumerate(reply.choices):
            calls = [ToolCall(name=c.function.name, arguments=c.function.arguments, id=c.id)
                     for c in (choice.message.tool_calls or [])]
            finish = choice.finish_reason if choice.finish_reason in ("stop", "length", "tool_calls",
                                                                       "content_filter") else None
            choices.append(ChatChoice(content=choice.message.content, tool_calls=calls, finish_reason=finish,
                                      prompt_tokens=getattr(usage, "prompt_tokens", None) if i == 0 else None,
                                      completion_tokens=(getattr(usage, "completion_tokens", None)
                                                         if len(reply.choices) == 1 else None)))
        return choices


__all__ = ["ForwardingChatModel", "Route", "RoutedClient", "openai_completions"]
