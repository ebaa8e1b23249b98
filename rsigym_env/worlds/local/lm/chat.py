"""The local model (base or trained checkpoint) as a chat model behind the OpenAI-compatible server.

:class:`LocalChatModel` is a :class:`~rsigym_env.serving.models.ChatModel` over a Tinker-shaped
sampling client and a chat renderer: it renders the request's messages (and offered tools) into a
prompt, samples ``n`` completions with the request's ``max_tokens``/``max_completion_tokens``,
``temperature``, ``top_p``, ``stop`` and ``seed``, and parses each into text or tool calls with
``finish_reason`` ``stop``/``length``/``tool_calls`` and the model's own token counts. It only calls
``sample(prompt, num_samples, sampling_params)``, so it works over the local client and, with a
renderer for its tokenizer, over a real ``tinker.SamplingClient``.

The registry helpers serve a base model under its name and every trained checkpoint under its
``tinker://`` path (the model id clients pass, as with Tinker's OpenAI-compatible endpoint); they
can be called while the server runs:

>>> import tempfile
>>> from openai import OpenAI
>>> from rsigym_env.serving import ModelRegistry, OpenAIServer
>>> from rsigym_env.worlds.local.lm.model import ModelConfig
>>> from rsigym_env.worlds.local.lm.tinker_client import LocalServiceClient, make_random_base, register_base_model
>>> from rsigym_env.worlds.common.training import SupervisedConfig, run_supervised
>>> root = tempfile.mkdtemp()
>>> register_base_model("doc-chat", make_random_base(root + "/base", ModelConfig(d_model=32, n_layers=1,
...     n_heads=2, d_ff=64, max_seq_len=64)))
>>> service = LocalServiceClient(root_dir=root)
>>> registry = ModelRegistry()
>>> with OpenAIServer(registry) as server:
...     _ = serve_checkpoints(service, registry, "doc-chat")            # the base model, under its name
...     data = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
...     path = run_supervised(service, SupervisedConfig(base_model="doc-chat", lora_rank=2), data).sampler_path
...     _ = register_checkpoint(registry, service, path)                # added while the server runs
...     client = OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
...     reply = client.chat.completions.create(model=path, messages=[{"role": "user", "content": "hi"}],
...                                            max_tokens=5, seed=0)
>>> registry.names() == sorted(["doc-chat", path]), reply.usage.prompt_tokens, reply.usage.completion_tokens
(True, 6, 5)
>>> reply.choices[0].finish_reason
'length'
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from tinker import types

from ....serving.models import ChatChoice, ChatRequest, InvalidParam, ModelRegistry, ModelRequestError, ToolCall
from .model import ContextOverflowError
from .tinker_client import CheckpointNotFoundError, UnknownModelError, parse_tinker_path
from ...common.tokenizer import ChatRenderer, MessageError, RoleColonRenderer, Tokenizer

_UNSUPPORTED_EXTRAS = ("logprobs", "top_logprobs", "logit_bias")


def request_messages(request: ChatRequest) -> list[dict[str, Any]]:
    """The request's messages as plain dicts for a renderer: text content, ``developer`` as
    ``system``, assistant tool calls in OpenAI's shape."""
    out = []
    for m in request.messages:
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                 for c in m.tool_calls]
        out.append(msg)
    return out


def request_tools(request: ChatRequest) -> list[dict[str, Any]] | None:
    return [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None


def _default_renderer(tokenizer: Any) -> Any:
    return ChatRenderer(tokenizer) if isinstance(tokenizer, Tokenizer) else RoleColonRenderer(tokenizer)


class LocalChatModel:
    """A chat model over a sampling client (``sample`` returning a ``tinker.types.SampleResponse``).

    Args:
        sampling_client: the client, or a zero-argument callable returning it (loaded on first use).
        renderer: messages → prompt tokens and sampled tokens → message (default: ``ChatRenderer``
            over the client's tokenizer; needed up front when ``sampling_client`` is a callable).
        context_length: prompt + completion limit in tokens (default: the local model's
            ``max_seq_len``); the server refuses longer requests with ``context_length_exceeded``.
        check: called before every request; raises (e.g. ``CheckpointNotFoundError``) when the model
            can no longer be served (its checkpoint files vanished) → 404 ``model_not_found``.
        name: for messages.

    Sampling parameters: ``temperature`` (default 1) and ``top_p`` (default 1, must be in (0, 1]),
    ``seed`` (any integer; negative ones are taken modulo 2**64), ``max_tokens`` /
    ``max_completion_tokens`` (default: the rest of the context), up to four ``stop`` strings (cut
    before the stop string, which is not returned, as OpenAI does). Tools are rendered in the
    renderer's tool format; ``tool_choice="required"`` or a named tool starts the reply with the
    tool-call token (and the function name), ``"none"`` returns any call the model writes as text.
    Penalties and logprobs are not supported (400 naming the parameter).

    Token counts are the model's: ``prompt_tokens`` is the rendered prompt, ``completion_tokens``
    the sampled tokens kept (with the end-of-turn token, without what follows a stop string).
    """

    def __init__(self, sampling_client: Any, renderer: Any = None, *, context_length: int | None = None,
                 check: Callable[[], Any] | None = None, name: str | None = None):
        self._lock = threading.Lock()
        if callable(sampling_client) and not hasattr(sampling_client, "sample"):
            if renderer is None:
                raise ValueError("a lazily loaded sampling client needs an explicit renderer")
            self._client, self._factory = None, sampling_client
        else:
            self._client, self._factory = sampling_client, None
        self.renderer = renderer if renderer is not None else _default_renderer(sampling_client.get_tokenizer())
        if context_length is None and self._client is not None:
            config = getattr(getattr(self._client, "model", None), "config", None)
            context_length = getattr(config, "max_seq_len", None)
        self.context_length = context_length
        self.check = check
        self.name = name or getattr(sampling_client, "model_path", None) or "local"

    # --- loading and errors ----------------------------------------------------------------
    @property
    def sampling_client(self) -> Any:
        """The sampling client (created now if it was given as a callable)."""
        with self._lock:
            if self._client is None:
                self._client = self._factory()  # type: ignore[misc]
            return self._client

    def _ensure_servable(self) -> None:
        try:
            if self.check is not None:
                self.check()
        except (CheckpointNotFoundError, UnknownModelError) as exc:
            raise ModelRequestError(f"The model `{self.name}` can no longer be served: {exc}", status=404,
                                    code="model_not_found", param="model") from None

    # --- rendering ---------------------------------------------------------------------------
    def _forced_prefix(self, request: ChatRequest) -> list[int]:
        """Tokens the reply must start with: a tool call when ``tool_choice`` demands one."""
        choice = request.tool_choice
        if not request.tools or choice in (None, "auto", "none") or not isinstance(self.renderer, ChatRenderer):
            return []
        tok = self.renderer.tokenizer
        prefix = [tok.special("<|tool_call|>")]
        if not isinstance(choice, str):  # a named tool: as the renderer writes a call
            prefix += tok.encode('{"name": ' + json.dumps(choice.function.name) + ', "arguments": ')
        return prefix

    def render(self, request: ChatRequest) -> list[int]:
        """The prompt tokens of ``request`` (without any forced reply prefix)."""
        try:
            return [int(t) for t in self.renderer.build_generation_prompt(request_messages(request),
                                                                          request_tools(request))]
        except MessageError as exc:
            raise InvalidParam("messages", f"the messages cannot be rendered: {exc}") from None

    def count_prompt_tokens(self, request: ChatRequest) -> int:
        """The rendered prompt's length in tokens (the server's context check and ``usage``)."""
        self._ensure_servable()
        return len(self.render(request))

    # --- sampling ----------------------------------------------------------------------------
    def sampling_params(self, request: ChatRequest, reserved: int = 0) -> types.SamplingParams:
        """The request's sampling parameters as ``tinker.types.SamplingParams`` (400 for values the
        model cannot honour); ``reserved`` tokens of the completion limit are already spent."""
        temperature = 1.0 if request.temperature is None else float(request.temperature)
        if not (math.isfinite(temperature) and temperature >= 0):
            raise InvalidParam("temperature", f"temperature must be a finite number >= 0, got {temperature}")
        top_p = 1.0 if request.top_p is None else float(request.top_p)
        if not 0.0 < top_p <= 1.0:
            raise InvalidParam("top_p", f"top_p must be in (0, 1], got {top_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(request, name):
                raise InvalidParam(name, f"{name} is not supported by the local model (use 0 or leave it out)")
        extra = request.model_extra or {}
        for name in _UNSUPPORTED_EXTRAS:
            if extra.get(name) not in (None, False, 0, {}):
                raise InvalidParam(name, f"{name} is not supported by the local model")
        limit = request.completion_limit
        stop = list(self.renderer.get_stop_sequences())
        if stop and all(isinstance(s, str) for s in stop):
            stop += request.stop_sequences  # string stops combine; token stops are cut afterwards
        return types.SamplingParams(
            max_tokens=None if limit is None else max(limit - reserved, 1), temperature=temperature, top_p=top_p,
            seed=None if request.seed is None else int(request.seed) % 2**64, stop=stop or None)

    supports_prefill_scope = True  # complete(..., prefill_scope=) shares prefills within a scope (see model.PrefillCache)

    def complete(self, request: ChatRequest, prefill_scope: str | None = None) -> list[ChatChoice]:
        self._ensure_servable()
        prompt = self.render(request)
        prefix = self._forced_prefix(request)
        limit = request.completion_limit
        if limit is not None and len(prefix) >= limit:  # the forced start alone uses up the limit
            return [self._choice(request, len(prompt), prefix, [], "length") for _ in range(request.n)]
        params = self.sampling_params(request, reserved=len(prefix))
        try:
            client = self.sampling_client
            tokens = types.ModelInput.from_ints(prompt + prefix)
            if prefill_scope is not None and getattr(client, "supports_prefill_scope", False):
                response = client.sample_scoped(tokens, request.n, params, prefill_scope).result()
            else:
                response = client.sample(tokens, request.n, params).result()
        except (CheckpointNotFoundError, UnknownModelError) as exc:
            raise ModelRequestError(f"The model `{self.name}` cannot be loaded: {exc}", status=404,
                                    code="model_not_found", param="model") from None
        except ContextOverflowError as exc:
            raise ModelRequestError(f"This model's maximum context length is {self.context_length} tokens: {exc}",
                                    code="context_length_exceeded", param="messages") from None
        return [self._choice(request, len(prompt), prefix, list(seq.tokens), seq.stop_reason)
                for seq in response.sequences]

    def _cut_at_stop(self, tokens: list[int], stops: Sequence[str]) -> tuple[list[int], str | None]:
        """The shortest prefix of ``tokens`` whose text contains a stop string (and that string),
        or ``(tokens, None)``: what a sampler stopping at those strings would have returned."""
        decode = self.renderer.tokenizer.decode
        if not stops or not any(s in decode(tokens) for s in stops):
            return tokens, None
        lo, hi = 1, len(tokens)  # the smallest k with a stop string in decode(tokens[:k])
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in decode(tokens[:mid]) for s in stops):
                hi = mid
            else:
                lo = mid + 1
        text = decode(tokens[:lo])
        return tokens[:lo], min((s for s in stops if s in text), key=text.index)

    def _choice(self, request: ChatRequest, n_prompt: int, prefix: list[int], sampled: list[int],
                stop_reason: str) -> ChatChoice:
        sampled, stop_hit = self._cut_at_stop(sampled, request.stop_sequences)
        message, ended = self.renderer.parse_response(prefix + sampled)
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        if calls and (not request.tools or request.tool_choice == "none"):  # no tools on offer: it is text
            content += "".join(json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                               for c in calls)
            calls = []
        if calls and request.parallel_tool_calls is False:
            calls = calls[:1]
        if stop_hit is not None:
            content = content[: content.index(stop_hit)] if stop_hit in content else content
            finish = "tool_calls" if calls else "stop"
        elif stop_reason == "stop" or ended:
            finish = "tool_calls" if calls else "stop"
        else:
            finish = "length"
        return ChatChoice(content=content if content or not calls else None,
                          tool_calls=[ToolCall(name=c["function"]["name"], arguments=c["function"]["arguments"])
                                      for c in calls],
                          finish_reason=finish, prompt_tokens=n_prompt, completion_tokens=len(prefix) + len(sampled))

    def __repr__(self) -> str:
        return f"LocalChatModel({self.name!r}, context_length={self.context_length})"


# --- the registry --------------------------------------------------------------------------------


def chat_model(service_client: Any, model_path: str | None = None, base_model: str | None = None, *,
               renderer: Any = None, pool: Any = None) -> LocalChatModel:
    """A :class:`LocalChatModel` for a checkpoint (``tinker://...`` path) or a base model of a
    ``LocalServiceClient``. The path is checked now (``CheckpointNotFoundError``, an ``ActionError``);
    the weights load on the first request; a checkpoint whose files vanish later answers 404."""
    if model_path is None and base_model is None:
        raise ValueError("give model_path or base_model")
    check: Callable[[], Any] | None = None
    if model_path is not None:
        _, meta = service_client._resolve(model_path)  # raises CheckpointNotFoundError
        base = service_client.base_model(base_model or meta["base_model"])
        check = lambda: service_client._resolve(model_path)  # noqa: E731
    else:
        base = service_client.base_model(base_model)
    def factory() -> Any:
        if pool is not None and pool.poolable(base.name):  # sampled in worker processes (the same tokens)
            return pool.client(model_path=model_path, base_model=base_model, tokenizer=base.tokenizer)
        return service_client.create_sampling_client(model_path=model_path, base_model=base_model).result()

    return LocalChatModel(factory, renderer if renderer is not None else _default_renderer(base.tokenizer),
                          context_length=base.config.max_seq_len, check=check, name=model_path or base.name)


def register_checkpoint(registry: ModelRegistry, service_client: Any, sampler_path: str, name: str | None = None, *,
                        renderer: Any = None, replace: bool = False, pool: Any = None) -> str:
    """Serve the checkpoint at ``sampler_path`` as ``name`` (default: the path itself) and return the name.

    Raises ``CheckpointNotFoundError`` (an ``ActionError``) for a malformed or unknown path and
    ``ValueError`` if the name is taken (unless ``replace``). Safe while the server runs."""
    parse_tinker_path(sampler_path)
    name = name or sampler_path
    registry.add(name, chat_model(service_client, model_path=sampler_path, renderer=renderer, pool=pool), replace=replace)
    return name


def register_base(registry: ModelRegistry, service_client: Any, base_model: str, name: str | None = None, *,
                  renderer: Any = None, replace: bool = False, pool: Any = None) -> str:
    """Serve base model ``base_model`` as ``name`` (default: its name) and return the name."""
    name = name or base_model
    registry.add(name, chat_model(service_client, base_model=base_model, renderer=renderer, pool=pool), replace=replace)
    return name


def sampler_checkpoints(service_client: Any) -> list[str]:
    """The ``tinker://RUN/sampler_weights/NAME`` paths saved under a local client's ``root_dir``."""
    runs = Path(service_client.root_dir) / "runs"
    return sorted(f"tinker://{meta.parent.parent.parent.name}/sampler_weights/{meta.parent.name}"
                  for meta in runs.glob("*/sampler_weights/*/meta.json"))


def serve_checkpoints(service_client: Any, registry: ModelRegistry, base_model: str | None = None,
                      sampler_paths: Sequence[str] | None = None, *, renderer: Any = None) -> list[str]:
    """Register ``base_model`` under its name and every sampler checkpoint under its ``tinker://``
    path (``sampler_paths``, default: all saved under the client's ``root_dir``). Names already in
    the registry are left alone, so calling it again adds just the new checkpoints. Returns the
    names added."""
    added = []
    if base_model is not None and base_model not in registry:
        added.append(register_base(registry, service_client, base_model, renderer=renderer))
    for path in sampler_checkpoints(service_client) if sampler_paths is None else sampler_paths:
        if path not in registry:
            added.append(register_checkpoint(registry, service_client, path, renderer=renderer))
    return added


__all__ = [
    "LocalChatModel", "chat_model", "register_base", "register_checkpoint", "request_messages", "request_tools",
    "sampler_checkpoints", "serve_checkpoints",
]
