"""An OpenAI-compatible HTTP server for any :class:`~rsigym_env.serving.models.ChatModel`.

Endpoints (under ``/v1``): ``GET /models``, ``GET /models/{id}``, ``POST /chat/completions``
(non-streaming and streaming server-sent events, ``tools``/``tool_calls``, ``n``, ``usage``,
``finish_reason`` ``stop``/``length``/``tool_calls``, ``stream_options.include_usage``); plus
``GET /health``. Errors have OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``:
400 for a malformed body, invalid messages or parameter values and ``context_length_exceeded``;
404 ``model_not_found``; a model's own ``ModelRequestError``/``InvalidParam`` as the 4xx it names;
500 ``model_error`` when a model raises anything else; 504 ``model_timeout``. Models run
in worker threads, so a slow or failing model never blocks or takes down the server.

The server runs uvicorn in a background thread on a port the OS picks (``port=0``); models can be
added to and removed from its registry while it runs:

>>> from openai import OpenAI
>>> from rsigym_env.serving import EchoModel, ModelRegistry
>>> with OpenAIServer(ModelRegistry({"echo": EchoModel(prefix="you said: ")})) as server:
...     client = OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
...     reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
>>> reply.choices[0].message.content, reply.usage.completion_tokens
('you said: hi', 4)

By hand::

    python -m rsigym_env.serving.openai_server --port 8000 [--scripted FILE]

serves ``echo`` (:class:`EchoModel`: replies with the last user message) and, with ``--scripted``,
``scripted`` (:class:`ScriptedChatModel` playing the turns in FILE: a JSON list or JSONL of
``{"say": text}`` / ``{"tool": name, "arguments": {...} or "raw text"}``), until Ctrl-C.

**Unix domain socket.** ``uds=PATH`` also listens on a unix socket (the same app; ``port=None``
listens on the socket only). Sandboxed code without network reaches the model through it:

>>> import tempfile, http.client
>>> sock = tempfile.mkdtemp() + "/model.sock"
>>> with OpenAIServer({"echo": EchoModel()}, port=None, uds=sock) as server:
...     conn = UnixHTTPConnection(server.uds)
...     conn.request("POST", "/v1/chat/completions", body=json.dumps(
...         {"model": "echo", "messages": [{"role": "user", "content": "hi there"}]}))
...     body = json.loads(conn.getresponse().read())
...     used = server.usage.get("echo")
>>> body["choices"][0]["message"]["content"], used.requests, used.completion_tokens
('hi there', 1, 2)

**Usage meter.** The server counts the tokens it serves per model id (``server.usage``, a
:class:`UsageMeter`): billing reads these counters, never what a client reports about itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import re
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import anyio
import anyio.to_thread
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .asgi import BodyLimitMiddleware, HTTPServing, ThreadedASGIServer, abort_cause
from .models import (
    ChatChoice, ChatModel, ChatRequest, EchoModel, InvalidParam, ModelRegistry, ModelRequestError, ScriptedChatModel,
    estimate_completion_tokens, estimate_prompt_tokens,
)

log = logging.getLogger("rsigym_env.serving")

STREAM_TEXT_PIECE = 2      # words per streamed content delta
STREAM_ARGS_PIECE = 16     # characters per streamed tool-argument delta
MAX_BODY_BYTES = 8 << 20   # default limit of a request body (decoded)
MAX_JSON_DEPTH = 64        # default limit of the nesting of a request's JSON
PARSE_IN_THREAD = 256 << 10  # bodies larger than this are parsed and validated in a worker thread


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None) -> JSONResponse:
    """A response in OpenAI's error shape."""
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status)


def _param(error: dict[str, Any]) -> str:
    """The OpenAI-style parameter path of a pydantic error: ``("messages", 0, "role")`` → ``messages[0].role``;
    a request-level :class:`InvalidParam` names its own."""
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidParam):
        return cause.param
    out = ""
    for part in error["loc"]:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "str" or str(part).startswith(("list[", "literal[", "function-", "union[", "dict[")):
            continue  # pydantic's labels of union branches
        else:
            out += ("." if out else "") + str(part)
    return out


_CODES = {"missing": "missing_required_parameter", "extra_forbidden": "unknown_parameter"}


def validation_error_response(exc: ValidationError) -> JSONResponse:
    """400 naming the offending parameters; of the branches of a union, only the deepest errors are kept."""
    errors = [(_param(e), e) for e in exc.errors(include_url=False)]
    errors = [(p, e) for p, e in errors
              if not any(q != p and q.startswith(p) and q[len(p):][:1] in ".[" for q, _ in errors)]
    param, first = errors[0]
    message = "; ".join(f"{p or 'body'}: {str(e['msg']).removeprefix('Value error, ')}" for p, e in errors[:5])
    if len(errors) > 5:
        message += f" (and {len(errors) - 5} more)"
    code = _CODES.get(first["type"], "invalid_type" if first["type"].endswith("_type") else "invalid_value")
    return error_response(400, f"Invalid request: {message}", param=param or None, code=code)


# --------------------------------------------------------------------------------------------
# Response assembly


def _finish(choice: ChatChoice) -> str:
    return choice.resolved_finish_reason


def _tool_calls(choice: ChatChoice) -> list[dict[str, Any]]:
    return [{"id": c.id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in choice.tool_calls]


def usage_of(model: ChatModel, request: ChatRequest, choices: list[ChatChoice]) -> dict[str, int]:
    """Prompt tokens once per request (as OpenAI counts with ``n > 1``), completion tokens summed."""
    prompt = next((c.prompt_tokens for c in choices if c.prompt_tokens is not None), None)
    if prompt is None:
        prompt = count_prompt_tokens(model, request)
    completion = sum(c.completion_tokens if c.completion_tokens is not None else estimate_completion_tokens(c)
                     for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def count_prompt_tokens(model: ChatModel, request: ChatRequest) -> int:
    counter = getattr(model, "count_prompt_tokens", None)
    return int(counter(request)) if callable(counter) else estimate_prompt_tokens(request)


def completion_body(cid: str, created: int, name: str, choices: list[ChatChoice], tool_calls: list[list[dict]],
                    usage: dict[str, int]) -> dict[str, Any]:
    out = []
    for i, choice in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": choice.content, "refusal": None}
        if tool_calls[i]:
            message["tool_calls"] = tool_calls[i]
        out.append({"index": i, "message": message, "logprobs": None, "finish_reason": _finish(choice)})
    return {"id": cid, "object": "chat.completion", "created": created, "model": name,
            "system_fingerprint": None, "choices": out, "usage": usage}


def _pieces(text: str, words: int) -> list[str]:
    """``text`` in pieces of ``words`` words each (whitespace kept), joining back to exactly ``text``."""
    parts = re.split(r"(?<=\s)(?=\S)", text)
    return ["".join(parts[i:i + words]) for i in range(0, len(parts), words)] or [""]


def stream_events(cid: str, created: int, name: str, choices: list[ChatChoice], tool_calls: list[list[dict]],
                  usage: dict[str, int], include_usage: bool) -> Iterator[str]:
    """Server-sent events of a completion in ``chat.completion.chunk`` form, then ``[DONE]``.

    Per choice: a role delta, content deltas, then per tool call a header delta (``index``, ``id``,
    ``type``, ``function.name``) and argument deltas (``index`` + ``function.arguments``), then an
    empty delta with the ``finish_reason`` — the format the openai SDK accumulates.
    """
    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> str:
        body: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                                "system_fingerprint": None,
                                "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            body["usage"] = None
        return f"data: {json.dumps(body)}\n\n"

    for i, choice in enumerate(choices):
        has_text = choice.content is not None
        yield chunk(i, {"role": "assistant", "content": "" if has_text else None})
        if choice.content:
            for piece in _pieces(choice.content, STREAM_TEXT_PIECE):
                yield chunk(i, {"content": piece})
        for j, call in enumerate(tool_calls[i]):
            yield chunk(i, {"tool_calls": [{"index": j, "id": call["id"], "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": ""}}]})
            args = call["function"]["arguments"]
            for k in range(0, len(args), STREAM_ARGS_PIECE):
                yield chunk(i, {"tool_calls": [{"index": j, "function": {"arguments": args[k:k + STREAM_ARGS_PIECE]}}]})
        yield chunk(i, {}, _finish(choice))
    if include_usage:
        body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                "system_fingerprint": None, "choices": [], "usage": usage}
        yield f"data: {json.dumps(body)}\n\n"
    yield "data: [DONE]\n\n"


# --------------------------------------------------------------------------------------------
# Usage counted server side


@dataclass(frozen=True)
class Usage:
    """Tokens served to one model id: successful completion requests, prompt and completion tokens."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.requests + other.requests, self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens)


class UsageMeter:
    """Thread-safe per-model-id token counters, written by the server for every completion it serves.

    >>> meter = UsageMeter()
    >>> meter.record("ckpt-3@ev-7", 10, 4); meter.record("ckpt-3@ev-7", 5, 1)
    >>> meter.get("ckpt-3@ev-7")
    Usage(requests=2, prompt_tokens=15, completion_tokens=5)
    >>> meter.reset("ckpt-3@ev-7").total_tokens, meter.get("ckpt-3@ev-7").total_tokens
    (20, 0)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, Usage] = {}

    def record(self, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Add one served request to ``model``'s counters."""
        with self._lock:
            self._counts[model] = self._counts.get(model, Usage()) + Usage(1, int(prompt_tokens),
                                                                           int(completion_tokens))

    def get(self, model: str) -> Usage:
        """``model``'s counters (zero if it served nothing since the last reset)."""
        with self._lock:
            return self._counts.get(model, Usage())

    def reset(self, model: str | None = None) -> Usage:
        """Zero ``model``'s counters (every model's if None) and return what they held (summed)."""
        with self._lock:
            if model is not None:
                return self._counts.pop(model, Usage())
            total = sum(self._counts.values(), Usage())
            self._counts.clear()
            return total

    def snapshot(self) -> dict[str, Usage]:
        """Every model id's counters."""
        with self._lock:
            return dict(self._counts)


# --------------------------------------------------------------------------------------------
# The app


def too_deep(value: Any, limit: int) -> bool:
    """True if the JSON ``value`` nests lists/objects more than ``limit`` levels (iteratively: any depth
    is safe to check).

    >>> too_deep({"a": [1, {"b": []}]}, 4), too_deep({"a": [1, {"b": []}]}, 3)  # four levels
    (False, True)
    """
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        todo.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


_LIMIT_CODES = {413: "request_too_large", 415: "unsupported_content_encoding", 400: "invalid_body"}


def _limit_error(status: int, message: str) -> Response:
    """A body refused by :class:`~.asgi.BodyLimitMiddleware`, in OpenAI's error shape."""
    return error_response(status, message, code=_LIMIT_CODES.get(status))


def create_app(registry: ModelRegistry, model_timeout_s: float | None = None,
               usage: UsageMeter | None = None, *, list_models: bool = True,
               max_body_bytes: int = MAX_BODY_BYTES, max_json_depth: int = MAX_JSON_DEPTH) -> Starlette:
    """The Starlette app serving ``registry`` (usable without :class:`OpenAIServer`, e.g. mounted);
    every served completion is counted in ``usage`` (if given) under the requested model id.

    ``list_models=False`` hides the registry: ``GET /v1/models`` lists nothing and ``/health`` does
    not count the models (a client sharing the server cannot learn the other clients' model ids;
    a model it names still answers). A body over ``max_body_bytes`` (after ``Content-Encoding``
    decoding) is a 413, JSON nested deeper than ``max_json_depth`` a 400.
    """
    show_models = list_models

    def _parse(raw: bytes) -> ChatRequest | Response:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"We could not parse the JSON body of your request ({exc}). The body "
                                       "must be a JSON object.", code="invalid_json")
        except RecursionError:
            data = None
        if data is None or too_deep(data, max_json_depth):
            return error_response(400, f"The JSON body of your request is nested more than {max_json_depth} levels "
                                       "deep.", code="invalid_json")
        if not isinstance(data, dict):
            return error_response(400, f"The request body must be a JSON object, got {type(data).__name__}.",
                                  code="invalid_json")
        try:
            return ChatRequest.model_validate(data)
        except ValidationError as exc:
            return validation_error_response(exc)

    async def list_models(request: Request) -> Response:
        entries = registry.entries() if show_models else []
        return JSONResponse({"object": "list", "data": [
            {"id": e.name, "object": "model", "created": e.created, "owned_by": e.owned_by} for e in entries]})

    async def get_model(request: Request) -> Response:
        name = request.path_params["model"]
        entry = registry.entry(name)
        if entry is None:
            return _model_not_found(name)
        return JSONResponse({"id": entry.name, "object": "model", "created": entry.created, "owned_by": entry.owned_by})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "models": len(registry)} if show_models else {"status": "ok"})

    async def chat_completions(request: Request) -> Response:
        raw = await request.body()
        parsed = _parse(raw) if len(raw) <= PARSE_IN_THREAD else await anyio.to_thread.run_sync(_parse, raw)
        if isinstance(parsed, Response):
            return parsed
        chat = parsed
        entry = registry.entry(chat.model)
        if entry is None:
            return _model_not_found(chat.model)
        model = entry.model

        context = getattr(model, "context_length", None)
        if context is not None:
            try:
                prompt = await anyio.to_thread.run_sync(count_prompt_tokens, model, chat)
            except Exception as exc:
                return _model_failed(chat.model, exc)
            wanted = prompt + (chat.completion_limit or 0)
            if prompt >= context or wanted > context:
                return error_response(
                    400, f"This model's maximum context length is {context} tokens. However, you requested "
                         f"{wanted} tokens ({prompt} in the messages, {chat.completion_limit or 0} in the "
                         "completion). Please reduce the length of the messages or completion.",
                    param="messages", code="context_length_exceeded")

        try:
            with anyio.fail_after(model_timeout_s):
                result = await anyio.to_thread.run_sync(model.complete, chat, abandon_on_cancel=True)
            choices = [c if isinstance(c, ChatChoice) else ChatChoice.model_validate(c) for c in result]
            if not choices:
                raise ValueError("the model returned no choices")
            usage_counts = usage_of(model, chat, choices)
        except TimeoutError:
            log.error("model %r timed out after %s s", chat.model, model_timeout_s)
            return error_response(504, f"The model {chat.model!r} did not answer within {model_timeout_s} s.",
                                  type_="timeout", code="model_timeout")
        except Exception as exc:  # a failing model must never take the server down
            return _model_failed(chat.model, exc)

        if usage is not None:
            usage.record(chat.model, usage_counts["prompt_tokens"], usage_counts["completion_tokens"])
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        calls = [_tool_calls(c) for c in choices]
        if chat.stream:
            include_usage = bool(chat.stream_options and chat.stream_options.include_usage)
            events = stream_events(cid, created, chat.model, choices, calls, usage_counts, include_usage)
            return StreamingResponse(events,
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return JSONResponse(completion_body(cid, created, chat.model, choices, calls, usage_counts))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=kind)

    async def server_error(request: Request, exc: Exception) -> Response:
        if abort_cause(exc) is None:  # an aborted request is logged once, in one line, by uvicorn's logger
            log.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return error_response(500, f"internal server error: {type(exc).__name__}: {exc}", type_="server_error",
                              code="internal_error")

    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error},
                     middleware=[Middleware(BodyLimitMiddleware, max_bytes=max_body_bytes, error=_limit_error)])


def _model_not_found(name: str) -> Response:
    return error_response(404, f"The model `{name}` does not exist or you do not have access to it.",
                          param="model", code="model_not_found")


def _model_failed(name: str, exc: Exception) -> Response:
    if isinstance(exc, ModelRequestError):  # the model refuses the request: the caller's error, not the server's
        return error_response(exc.status, str(exc), exc.type, exc.param, exc.code)
    if isinstance(exc, InvalidParam):
        return error_response(400, str(exc), param=exc.param, code="invalid_value")
    log.warning("model %r raised %s: %s", name, type(exc).__name__, exc)
    return error_response(500, f"The model {name!r} failed: {type(exc).__name__}: {exc}", type_="server_error",
                          code="model_error")


# --------------------------------------------------------------------------------------------
# The server in a background thread


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a unix domain socket (stdlib only), e.g. for :class:`OpenAIServer`'s ``uds``."""

    def __init__(self, path: str | Path, timeout: float = 60.0):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class OpenAIServer(HTTPServing):
    """Serve ``registry`` over HTTP on ``host:port`` (``port=0``: the OS picks a free one) and/or on the
    unix socket ``uds`` (``port=None``: the socket only).

    ``start()``/``stop()`` or use it as a context manager; ``base_url`` is what ``OpenAI(base_url=...)``
    takes. A model's ``complete`` that runs longer than ``model_timeout_s`` gets a 504 (its thread is
    abandoned, not killed). ``registry`` may also be a plain ``{name: model}`` mapping. ``usage``
    (a :class:`UsageMeter`) counts the tokens served per model id, over both listeners.
    ``list_models``, ``max_body_bytes`` and ``max_json_depth`` are :func:`create_app`'s (for a server
    that untrusted clients share: ``list_models=False``).
    """

    def __init__(self, registry: ModelRegistry | Mapping[str, ChatModel] | None = None, host: str = "127.0.0.1",
                 port: int | None = 0, *, uds: str | Path | None = None, model_timeout_s: float | None = 600.0,
                 log_level: str = "warning", usage: UsageMeter | None = None, list_models: bool = True,
                 max_body_bytes: int = MAX_BODY_BYTES, max_json_depth: int = MAX_JSON_DEPTH):
        self.registry = registry if isinstance(registry, ModelRegistry) else ModelRegistry(registry)
        self.host = host
        self.model_timeout_s = model_timeout_s
        self.log_level = log_level
        self.usage = usage if usage is not None else UsageMeter()
        self.list_models = list_models
        self.app = create_app(self.registry, model_timeout_s, self.usage, list_models=list_models,
                              max_body_bytes=max_body_bytes, max_json_depth=max_json_depth)
        self._http = ThreadedASGIServer(self.app, host=host, port=port, uds=uds, name="OpenAI-compatible",
                                        log_level=log_level, graceful_s=2, keep_alive_s=5)
        self.uds: Path | None = self._http.uds

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``."""
        return f"{self.url}/v1"

    def __repr__(self) -> str:
        where = [self.base_url] if self.port is not None else []
        if self.uds is not None and self.running:
            where.append(f"unix:{self.uds}")
        models = self.registry.names() if self.list_models else f"{len(self.registry)} hidden"
        return f"OpenAIServer({', '.join(where) or 'not started'}, models={models})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rsigym_env.serving.openai_server",
        description="Serve offline chat models over the OpenAI HTTP protocol: 'echo' (replies with the "
                    "last user message) and, with --scripted, 'scripted' (plays the turns in FILE).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 lets the OS pick a free port (printed)")
    parser.add_argument("--scripted", metavar="FILE",
                        help='JSON list or JSONL of turns: {"say": text} or {"tool": name, "arguments": {...}}')
    parser.add_argument("--repeat-last", action="store_true", help="the scripted model repeats its last turn")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")

    registry = ModelRegistry({"echo": EchoModel()})
    if args.scripted:
        registry.add("scripted", ScriptedChatModel.from_file(args.scripted, repeat_last=args.repeat_last))
    server = OpenAIServer(registry, host=args.host, port=args.port, log_level=args.log_level).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"serving {', '.join(registry.names())} at {server.base_url} (Ctrl-C to stop)", flush=True)
    try:
        while not stop.wait(0.5) and server.running:
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
