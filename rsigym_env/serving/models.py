"""Chat models behind the OpenAI-compatible server: request and choice types, the ``ChatModel``
protocol, the ``ModelRegistry``, a token estimate, and two offline models.

A chat model is any object with ``complete(request: ChatRequest) -> list[ChatChoice]``. The server
(:mod:`rsigym_env.serving.openai_server`) validates the HTTP body into a :class:`ChatRequest`, looks
the model up by name in a :class:`ModelRegistry`, calls ``complete`` in a worker thread and turns
the choices into OpenAI's response (or stream). Optional attributes a model may have:

* ``context_length: int | None`` — the server refuses requests whose prompt plus completion limit
  exceed it (HTTP 400, ``context_length_exceeded``);
* ``count_prompt_tokens(request) -> int`` — its own prompt token count (for ``usage`` and the
  context check); without it the server uses :func:`estimate_prompt_tokens`;
* a choice may carry ``prompt_tokens`` / ``completion_tokens``; the server estimates what is missing.

A model that raises :class:`ModelRequestError` (or :class:`InvalidParam`) gets that client error
(4xx) back to the caller; any other exception is a 500 ``model_error``.

``complete`` may be called from several threads at once; a model that is not thread-safe guards
itself (both models here do).

Token estimate (for models without a tokenizer): a run of ASCII letters, a group of up to three
digits, and every other non-space character each count one token; a message adds 4 tokens of
framing, a request 3 for the reply's start, and tool schemas count as their JSON text. It is
deterministic and within a small factor of BPE tokenizers on English and code; it is an estimate.

>>> estimate_tokens("Hello, world! 12345")
6
>>> model = ScriptedChatModel([Call("wait", {}), "done"])
>>> request = ChatRequest(model="scripted", messages=[{"role": "user", "content": "go"}])
>>> [c.tool_calls[0].name for c in model.complete(request)], model.complete(request)[0].content
(['wait'], 'done')
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Protocol, Union, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# --------------------------------------------------------------------------------------------
# Request: what arrives at POST /v1/chat/completions


class InvalidParam(ValueError):
    """A request-level validation problem that names the offending parameter (for the error's ``param``)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class ModelRequestError(Exception):
    """Raised by a model's ``complete`` or ``count_prompt_tokens`` when the request cannot be served
    for a reason that is the caller's (a checkpoint that no longer exists, a parameter value this model
    does not support): the server answers with ``status`` and OpenAI's error shape instead of a 500.
    A model may also raise :class:`InvalidParam` (answered 400 with its ``param``)."""

    def __init__(self, message: str, *, status: int = 400, code: str | None = None, param: str | None = None,
                 type: str = "invalid_request_error"):
        if not 400 <= status < 500:
            raise ValueError("ModelRequestError is for client errors (HTTP 4xx)")
        super().__init__(message)
        self.status, self.code, self.param, self.type = status, code, param, type


class FunctionCall(BaseModel):
    """The function part of an assistant tool call in the request history."""

    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str = ""


class MessageToolCall(BaseModel):
    """A tool call an assistant made earlier in the conversation."""

    model_config = ConfigDict(extra="ignore")
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    """One part of a list-valued ``content``; this server understands text parts only."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_only(self) -> "ContentPart":
        if self.type not in ("text", "refusal") or (self.text is None and self.type == "text"):
            raise ValueError(f"content part of type {self.type!r} is not supported (only 'text')")
        return self


class ChatMessage(BaseModel):
    """One message: ``system``/``developer``/``user``/``assistant`` (optionally with ``tool_calls``)
    or ``tool`` (with the ``tool_call_id`` it answers). Unknown keys are accepted and kept."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> "ChatMessage":
        if self.role == "assistant":
            if self.content is None and not self.tool_calls:
                raise ValueError("an assistant message needs 'content' or 'tool_calls'")
        elif self.tool_calls is not None:
            raise ValueError(f"'tool_calls' is only allowed on assistant messages, not on {self.role!r}")
        if self.role == "tool":
            if not self.tool_call_id:
                raise ValueError("a tool message needs 'tool_call_id'")
            if self.content is None:
                raise ValueError("a tool message needs 'content'")
        elif self.tool_call_id is not None:
            raise ValueError(f"'tool_call_id' is only allowed on tool messages, not on {self.role!r}")
        if self.role in ("system", "developer", "user") and self.content is None:
            raise ValueError(f"a {self.role} message needs 'content'")
        return self

    @property
    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    """A tool offered to the model: ``{"type": "function", "function": {name, description, parameters}}``."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """``tool_choice={"type": "function", "function": {"name": ...}}``: the model must call this tool."""

    type: Literal["function"]
    function: NamedFunction


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """A chat completion request, validated as OpenAI validates it (the subset this project uses).

    Parameters OpenAI accepts that are not modelled here (``logprobs``, ``response_format``, ...)
    are accepted and available in ``model_extra``.
    """

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=128)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("n", "stream", mode="before")
    @classmethod
    def _none_is_default(cls, value: Any, info: Any) -> Any:
        if value is None:
            return 1 if info.field_name == "n" else False
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        if value == "" or (isinstance(value, list) and "" in value):
            raise ValueError("stop sequences must not be empty")
        return value

    @model_validator(mode="after")
    def _consistency(self) -> "ChatRequest":
        names = self.tool_names
        if len(set(names)) != len(names):
            raise InvalidParam("tools", "tool names must be unique")
        if self.tool_choice is not None and not self.tools:
            raise InvalidParam("tool_choice", "'tool_choice' is only allowed when 'tools' are specified")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise InvalidParam("tool_choice", f"tool_choice names {self.tool_choice.function.name!r}, which is not in 'tools'")
        if self.stream_options is not None and not self.stream:
            raise InvalidParam("stream_options", "'stream_options' is only allowed when 'stream' is enabled")
        check_tool_message_order(self.messages)
        return self

    @property
    def tool_names(self) -> list[str]:
        return [t.function.name for t in self.tools or []]

    @property
    def completion_limit(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens``, else None (no limit given)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stop_sequences(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


def check_tool_message_order(messages: list[ChatMessage]) -> None:
    """OpenAI's rule: an assistant message with ``tool_calls`` is followed by one ``tool`` message per
    call id, and every ``tool`` message answers a call of the assistant message just before it."""
    pending: set[str] = set()
    answered: set[str] = set()
    for i, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id not in pending:
                where = "answered twice" if message.tool_call_id in answered else "not a call of the preceding assistant message"
                raise InvalidParam(
                    f"messages[{i}]", "a tool message must respond to a preceding assistant 'tool_calls' entry; "
                    f"tool_call_id {message.tool_call_id!r} is {where}")
            pending.discard(message.tool_call_id)
            answered.add(message.tool_call_id)
            continue
        if pending:
            raise InvalidParam(
                f"messages[{i}]", "an assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id', but this {message.role} message came first; "
                f"unanswered: {', '.join(sorted(pending))}")
        answered = set()
        if message.role == "assistant" and message.tool_calls:
            ids = [c.id for c in message.tool_calls]
            if len(set(ids)) != len(ids):
                raise InvalidParam(f"messages[{i}]", "duplicate tool call ids")
            pending = set(ids)
    if pending:
        raise InvalidParam(
            "messages", "the last assistant message has 'tool_calls' without tool messages responding to "
            f"{', '.join(sorted(pending))}")


# --------------------------------------------------------------------------------------------
# Response: what a model returns


FinishReason = Literal["stop", "length", "tool_calls", "content_filter"]


class ToolCall(BaseModel):
    """A tool call the model makes. ``arguments`` is sent as given: normally JSON text, but a model
    may produce anything (a dict is serialised to JSON). ``id`` is filled in by the server if None."""

    name: str
    arguments: str = "{}"
    id: str | None = None

    @field_validator("arguments", mode="before")
    @classmethod
    def _dump(cls, value: Any) -> Any:
        return value if isinstance(value, str) else json.dumps(value)


class ChatChoice(BaseModel):
    """One completion: text and/or tool calls, why it ended, and optionally the model's own token counts.

    ``finish_reason`` None means "tool_calls" when there are tool calls, else "stop".
    """

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = Field(None, ge=0)
    completion_tokens: int | None = Field(None, ge=0)

    @property
    def resolved_finish_reason(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


@runtime_checkable
class ChatModel(Protocol):
    """Anything that can complete a chat (see the module docstring for optional attributes)."""

    def complete(self, request: ChatRequest) -> list[ChatChoice]: ...


# --------------------------------------------------------------------------------------------
# Token estimate

_TOKEN = re.compile(r"[A-Za-z]+|\d{1,3}|[^\sA-Za-z\d]")
MESSAGE_OVERHEAD = 4
REPLY_OVERHEAD = 3


def estimate_tokens(text: str | None) -> int:
    """Deterministic token estimate of ``text`` (see the module docstring)."""
    return len(_TOKEN.findall(text)) if text else 0


def estimate_prompt_tokens(request: ChatRequest) -> int:
    """Estimated prompt tokens of a request: messages, their tool calls, and the tool schemas."""
    total = REPLY_OVERHEAD
    for message in request.messages:
        total += MESSAGE_OVERHEAD + estimate_tokens(message.text) + estimate_tokens(message.name)
        for call in message.tool_calls or []:
            total += estimate_tokens(call.function.name) + estimate_tokens(call.function.arguments)
    if request.tools:
        total += estimate_tokens(json.dumps([t.model_dump(exclude_none=True) for t in request.tools]))
    return total


def estimate_completion_tokens(choice: ChatChoice) -> int:
    return estimate_tokens(choice.content) + sum(
        estimate_tokens(c.name) + estimate_tokens(c.arguments) for c in choice.tool_calls)


def truncate_to_tokens(text: str, limit: int | None) -> tuple[str, bool]:
    """``text`` cut after its ``limit``-th estimated token; True if something was cut.

    >>> truncate_to_tokens("one two three", 2)
    ('one two', True)
    """
    if limit is None:
        return text, False
    for i, match in enumerate(_TOKEN.finditer(text)):
        if i == limit:
            return text[: match.start()].rstrip(), True
    return text, False


def apply_limits(text: str, request: ChatRequest) -> ChatChoice:
    """A text choice for ``request``: cut at the first stop sequence (not included), then at the
    completion limit (``finish_reason="length"``)."""
    for stop in request.stop_sequences:
        if stop in text:
            text = text[: text.index(stop)]
    text, cut = truncate_to_tokens(text, request.completion_limit)
    return ChatChoice(content=text, finish_reason="length" if cut else "stop")


# --------------------------------------------------------------------------------------------
# Registry


@dataclass
class RegisteredModel:
    name: str
    model: ChatModel
    owned_by: str = "rsigym"
    created: int = field(default_factory=lambda: int(time.time()))


class ModelRegistry:
    """Name → chat model, safe to change while a server is serving it.

    >>> registry = ModelRegistry({"echo": EchoModel()})
    >>> registry.add("ckpt-1", EchoModel(prefix="1: "))
    >>> registry.names()
    ['ckpt-1', 'echo']
    >>> registry.remove("ckpt-1") is not None, "ckpt-1" in registry
    (True, False)
    """

    def __init__(self, models: Mapping[str, ChatModel] | None = None):
        self._lock = threading.Lock()
        self._entries: dict[str, RegisteredModel] = {}
        for name, model in (models or {}).items():
            self.add(name, model)

    def add(self, name: str, model: ChatModel, *, owned_by: str = "rsigym", replace: bool = False) -> None:
        """Register ``model`` as ``name``; a taken name raises ``ValueError`` unless ``replace``."""
        if not name:
            raise ValueError("a model name must not be empty")
        if not callable(getattr(model, "complete", None)):
            raise TypeError(f"{type(model).__name__} has no complete(request) method")
        with self._lock:
            if name in self._entries and not replace:
                raise ValueError(f"model {name!r} is already registered (pass replace=True)")
            self._entries[name] = RegisteredModel(name, model, owned_by)

    def remove(self, name: str) -> ChatModel:
        """Unregister ``name`` and return its model (``KeyError`` if unknown)."""
        with self._lock:
            return self._entries.pop(name).model

    def get(self, name: str) -> ChatModel | None:
        entry = self.entry(name)
        return entry.model if entry else None

    def entry(self, name: str) -> RegisteredModel | None:
        with self._lock:
            return self._entries.get(name)

    def entries(self) -> list[RegisteredModel]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.name)

    def names(self) -> list[str]:
        return [e.name for e in self.entries()]

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


# --------------------------------------------------------------------------------------------
# Offline models


@dataclass(frozen=True)
class Say:
    """A scripted text reply (cut by ``max_tokens``/``stop`` like any text)."""

    text: str


@dataclass(frozen=True)
class Call:
    """A scripted tool call. ``arguments`` may be a dict (sent as JSON) or any text (sent verbatim,
    e.g. deliberately malformed JSON)."""

    name: str
    arguments: Any = field(default_factory=dict)
    id: str | None = None


Reply = Union[Say, Call, list[Call]]
TurnLike = Union[Reply, str, tuple, Callable[["ChatRequest"], Any]]


class ScriptExhausted(RuntimeError):
    """The scripted model was asked for more turns than it has."""


def _to_reply(turn: Any) -> Reply:
    if isinstance(turn, (Say, Call)):
        return turn
    if isinstance(turn, str):
        return Say(turn)
    if isinstance(turn, tuple) and len(turn) in (2, 3) and isinstance(turn[0], str):
        return Call(*turn)
    if isinstance(turn, list) and turn and all(isinstance(t, (Call, tuple)) for t in turn):
        return [t if isinstance(t, Call) else Call(*t) for t in turn]
    if isinstance(turn, dict):
        if "say" in turn:
            return Say(str(turn["say"]))
        if "tool" in turn:
            return Call(turn["tool"], turn.get("arguments", {}), turn.get("id"))
        if "tools" in turn:
            return [Call(t["tool"], t.get("arguments", {}), t.get("id")) for t in turn["tools"]]
    raise ValueError(f"not a scripted turn: {turn!r} (use Say, Call, a list of Call, text or (name, arguments))")


class ScriptedChatModel:
    """A deterministic mock model: plays one scripted turn per completion request, in order.

    A turn is text (a reply), ``(name, arguments)`` or :class:`Call` (one tool call; ``arguments``
    may be malformed JSON text on purpose), a list of calls (parallel tool calls), or a callable
    ``request -> turn`` (to react to what was sent). Every request is recorded in ``requests``;
    ``check(request)`` is called first and may raise to fail the request (the server answers 500 with
    the message). With ``n > 1`` every choice plays the same turn. After the last turn it raises
    :class:`ScriptExhausted`, or repeats the last turn if ``repeat_last``.
    """

    def __init__(self, turns: Iterable[TurnLike], *, check: Callable[[ChatRequest], None] | None = None,
                 repeat_last: bool = False, context_length: int | None = None):
        self.turns = list(turns)
        for turn in self.turns:
            if not callable(turn):
                _to_reply(turn)  # fail early on a malformed script
        self.check = check
        self.repeat_last = repeat_last
        self.context_length = context_length
        self.requests: list[ChatRequest] = []
        self._next = 0
        self._calls = 0
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> "ScriptedChatModel":
        """Turns from a JSON list or JSONL file: ``{"say": text}``, ``{"tool": name, "arguments": {...}
        or "raw text"}`` or ``{"tools": [{"tool": ..., "arguments": ...}, ...]}``."""
        text = Path(path).read_text()
        stripped = text.lstrip()
        turns = json.loads(text) if stripped.startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
        return cls([_to_reply(t) for t in turns], **kwargs)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self.turns) - self._next

    def complete(self, request: ChatRequest) -> list[ChatChoice]:
        with self._lock:
            self.requests.append(request)
            if self.check is not None:
                self.check(request)
            if self._next >= len(self.turns):
                if not (self.repeat_last and self.turns):
                    raise ScriptExhausted(f"the script has {len(self.turns)} turns and all were played")
                turn = self.turns[-1]
            else:
                turn = self.turns[self._next]
                self._next += 1
            self._calls += 1
            call_number = self._calls
        reply = _to_reply(turn(request) if callable(turn) else turn)
        choices = []
        for i in range(request.n):
            if isinstance(reply, Say):
                choices.append(apply_limits(reply.text, request))
            else:
                calls = reply if isinstance(reply, list) else [reply]
                choices.append(ChatChoice(tool_calls=[
                    ToolCall(name=c.name, arguments=c.arguments,
                             id=c.id or f"call_{call_number}_{i}_{j}") for j, c in enumerate(calls)]))
        return choices


class EchoModel:
    """Replies with ``prefix`` + the text of the last user message, honouring ``stop`` and the
    completion limit (``finish_reason="length"``); ``n`` identical choices. ``delay_s`` sleeps
    first (to test concurrency and timeouts); ``context_length`` makes the server check prompts."""

    def __init__(self, prefix: str = "", *, context_length: int | None = None, delay_s: float = 0.0):
        self.prefix = prefix
        self.context_length = context_length
        self.delay_s = delay_s

    def complete(self, request: ChatRequest) -> list[ChatChoice]:
        if self.delay_s:
            time.sleep(self.delay_s)
        last_user = next((m.text for m in reversed(request.messages) if m.role == "user"), "")
        return [apply_limits(self.prefix + last_user, request) for _ in range(request.n)]


__all__ = [
    "Call", "ChatChoice", "ChatMessage", "ChatModel", "ChatRequest", "EchoModel", "InvalidParam", "ModelRegistry",
    "ModelRequestError", "RegisteredModel", "Say", "ScriptExhausted", "ScriptedChatModel", "ToolCall", "ToolDef",
    "apply_limits", "estimate_completion_tokens", "estimate_prompt_tokens", "estimate_tokens",
    "truncate_to_tokens",
]
