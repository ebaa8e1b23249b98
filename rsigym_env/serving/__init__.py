"""Model serving: chat models behind an OpenAI-compatible HTTP server.

* :mod:`.models` — ``ChatRequest``/``ChatChoice``, the ``ChatModel`` protocol, ``ModelRegistry``,
  the token estimate, and the offline ``ScriptedChatModel`` and ``EchoModel``;
* :mod:`.openai_server` — ``OpenAIServer`` (uvicorn in a background thread on a free loopback port)
  and ``create_app``; ``python -m rsigym_env.serving.openai_server`` runs it by hand.

The server is imported lazily (``from rsigym_env.serving import OpenAIServer`` works), so
importing the models does not load starlette or uvicorn.
"""

from __future__ import annotations

from typing import Any

from .models import (
    Call, ChatChoice, ChatMessage, ChatModel, ChatRequest, EchoModel, InvalidParam, ModelRegistry, ModelRequestError,
    Say, ScriptedChatModel, ScriptExhausted, ToolCall, estimate_prompt_tokens, estimate_tokens,
)

_LAZY = {"OpenAIServer", "create_app"}

__all__ = [
    "Call", "ChatChoice", "ChatMessage", "ChatModel", "ChatRequest", "EchoModel", "InvalidParam", "ModelRegistry",
    "ModelRequestError", "OpenAIServer",
    "Say", "ScriptExhausted", "ScriptedChatModel", "ToolCall", "create_app", "estimate_prompt_tokens",
    "estimate_tokens",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import openai_server
        return getattr(openai_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
