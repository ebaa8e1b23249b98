"""Model serving: chat models behind an OpenAI-compatible HTTP server.

* :mod:`.models` — ``ChatRequest``/``ChatChoice``, the ``ChatModel`` protocol, ``ModelRegistry``,
  the token estimate, and the offline ``ScriptedChatModel`` and ``EchoModel``;
* :mod:`.openai_server` — ``OpenAIServer`` (uvicorn in a background thread on a free loopback port
  and/or a unix socket) and ``create_app``; ``python -m rsigym_env.serving.openai_server`` runs it by hand;
* :mod:`.asgi` — what every local HTTP server is built from: ``ThreadedASGIServer`` (uvicorn in a
  daemon thread), ``BodyLimitMiddleware`` (413 past a body size, gzip bombs included) and
  ``AbortedRequestFilter`` (an aborted request is one log line).

The servers are imported lazily (``from rsigym_env.serving import OpenAIServer`` works), so
importing the models does not load starlette or uvicorn.
"""

from __future__ import annotations

from typing import Any

from .models import (
    Call, ChatChoice, ChatMessage, ChatModel, ChatRequest, EchoModel, InvalidParam, ModelRegistry, ModelRequestError,
    Say, ScriptedChatModel, ScriptExhausted, ToolCall, estimate_prompt_tokens, estimate_tokens,
)

_LAZY = {"OpenAIServer": "openai_server", "create_app": "openai_server", "ThreadedASGIServer": "asgi",
         "BodyLimitMiddleware": "asgi", "AbortedRequestFilter": "asgi"}

__all__ = [
    "AbortedRequestFilter", "BodyLimitMiddleware", "Call", "ChatChoice", "ChatMessage", "ChatModel", "ChatRequest",
    "EchoModel", "InvalidParam", "ModelRegistry", "ModelRequestError", "OpenAIServer",
    "Say", "ScriptExhausted", "ScriptedChatModel", "ThreadedASGIServer", "ToolCall", "create_app",
    "estimate_prompt_tokens", "estimate_tokens",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
