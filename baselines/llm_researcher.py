"""An LLM researcher: any OpenAI-compatible chat model acting through the env's tools.

Endpoint and model come from :class:`LLMArgs` or the usual environment variables:
``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``RSIGYM_LLM_MODEL`` (the model name). It uses
``openai.OpenAI().chat.completions.create`` with ``tools=`` the function schemas of the tools the
scenario allows (``rsigym_env.tool_schemas(info["tools"])``, string limits capped for grammar-based
decoders: ``LLMArgs.schema_max_length``) and ``tool_choice="auto"``.

The conversation:

* system: the research goal and the rules (budget billed before each call, held-out scoring,
  exactly one tool call per turn); user: the briefing (the reset observation's ``log``);
* each turn the model's tool call becomes the action ``{"tool": name, "args": arguments}``. Arguments
  are read by :func:`rsigym_env.tools.loads_lenient`: JSON, or near-JSON whose intent is unambiguous
  (raw newlines inside strings, a code fence, one object inside other text). Arguments that are not
  even that go on as their raw text (``{"tool": name, "args": "<text>"}``), so the env answers with
  its ``malformed_action`` error (nothing is charged, the tool's name kept) instead of the researcher
  raising; empty arguments mean ``{}``. The next observation's ``log`` goes back as the ``tool``
  message (``tool_call_id`` and ``name``) for that call id. If the model makes several calls in one
  reply, only the first runs; the others are answered "not executed".
* **A reply without a tool call** (text only, or cut off by ``max_tokens``) is kept in the history and
  counts as ``read(ref="budget")`` — free, harmless, and it still advances the episode (one step of
  ``max_steps``), so a model that only talks cannot stall a run. The next request carries a short
  user nudge ("act through exactly one tool call") followed by that read's result.

**What is sent** is what every common server takes (the OpenAI API, vLLM, SGLang, llama.cpp and
llama-cpp-python, Ollama, LM Studio, LiteLLM): an assistant message's ``content`` is always a string
(``""`` beside tool calls, never ``null``: llama-cpp-python answers 500 to null, Ollama 400);
``tool_calls`` only when there are some (never ``[]``), each with an id, ``type: "function"``, a
valid function name and its arguments as strict JSON text (what was read, re-serialised; ``{}`` for
arguments that could not be read — llama.cpp re-parses them and fails the request otherwise); every
tool result is a string with its ``tool_call_id`` and ``name`` (``LLMArgs.tool_message_name``).

**Context policy** for long runs: the system prompt, the briefing and the last ``keep_turns``
exchanges (assistant reply + its results) are sent verbatim; older exchanges are replaced by one
user message summarising them, one line per step (tool, arguments, first line of the result and any
"job ... finished" line), the most recent ``summary_lines`` of them. Deterministic, no extra model
call. If the server still answers that the context is exceeded (OpenAI's ``context_length_exceeded``
or the wording of vLLM, SGLang, llama.cpp, LM Studio or LiteLLM), the request is sent again with the
verbatim window halved (down to zero exchanges), then with the summary halved (down to nothing); the
next turn starts again from ``keep_turns``. **A context too small for the fixed prompt** (system
prompt, briefing and tool schemas; estimated at 4 characters a token, or the server's own count) is
never retried: with ``LLMArgs.context_tokens`` (or ``$RSIGYM_LLM_CONTEXT``) it is found before the
first request, else at the server's first such error, and the episode ends at once with a reason
naming the tokens needed.

**Failures.** A request that fails with a 5xx, 408, 409, 425 or 429, a connection error, a timeout
or an unreadable or empty response is retried with exponential backoff (``retry_initial_s``,
doubling, at most ``retry_max_s`` each and ``retry_budget_s`` in all, at most ``max_retries``
times; a ``Retry-After`` header is honoured within those bounds). Every failure is written to the
transcript (an ``error`` record: status, code, message, attempt, the wait before the next one). When
the retries are used up, or the server refuses the request for good (any other 4xx), the researcher
**stops cleanly**: it records a ``stop`` record with a readable reason (``stop_reason``, e.g.
``llm_unavailable: HTTP 503 ... after 6 attempts``), logs it as a warning, and submits the initial
system (``submit(checkpoint="base", harness=<the initial version>)``, waiting for it where submission
is a job) — the outcome the rules give a run whose limits run out (reward 0), reached at once and
with every job settled, rather than an exception through the episode loop.

A **transcript** (JSONL: a ``reset`` record per episode, then every ``request`` with its messages,
every ``response`` as returned, every ``error``, every ``action``, and a ``stop`` if it stopped) is
appended to ``LLMArgs.transcript`` if set.

Offline, against the scripted model served over real HTTP:

>>> import gymnasium as gym, rsigym_env
>>> from rsigym_env.episode import run_episode
>>> from rsigym_env.serving import OpenAIServer, ScriptedChatModel, Call
>>> model = ScriptedChatModel([Call("evaluate", {"k": 1}), Call("wait", {}), Call("submit", {})])
>>> env = gym.make("RSIGym/Harness-v0", benchmark="aime", budget_usd=50)
>>> with OpenAIServer({"mock": model}) as server:
...     researcher = LLMResearcher(LLMArgs(base_url=server.base_url, api_key="x", model="mock"))
...     result = run_episode(env, researcher, seed=0)
>>> result.terminated, result.steps, result.info["submitted"]["by"]
(True, 3, 'agent')
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

SYSTEM_PROMPT = """\
You are an autonomous AI researcher. Your job is to improve a target system - a language model's \
weights plus the execution harness around it - on one benchmark, within a fixed budget, by calling \
the tools you are given. The briefing that follows describes the benchmark, the budget, the tools \
and the starting harness.

Rules:
- Act only through tool calls, exactly one tool call per turn. Each call's result (with a status \
line: step, money and time left, running jobs) comes back as the tool message.
- Every paid call is billed against the budget before it runs, at its worst-case cost; a call that \
does not fit is refused. A refused or malformed call costs nothing and uses no step (a run ends after as many refusals as it allows steps); read its error and fix the call.
- train and evaluate start jobs and return a job id at once; use wait to let time pass until a job \
finishes, then read its result (read job-N).
- evaluate scores on the dev split, for your decisions only. Your reward is the normalized gain of \
the system you submit, scored on a held-out official split you cannot see: prefer changes that \
generalise over ones that only raise dev scores.
- submit ends the run. If steps, time or money run out first, the initial system counts as \
submitted and the reward is 0.
"""

NUDGE = ("Your last reply contained no tool call. Act only through the tools, exactly one tool call "
         "per turn. To keep the run moving, that reply counted as read(ref=\"budget\"); its result follows.")
NOT_EXECUTED = "Not executed: only one tool call per turn is carried out (the first one). Call it again if still needed."
MALFORMED_NOTE = ("(The arguments of this {name} call were not valid JSON: {raw!r}; the call above shows them as {{}}.)")


@dataclass
class LLMArgs:
    model: str | None = None            # model name; default $RSIGYM_LLM_MODEL
    base_url: str | None = None         # default $OPENAI_BASE_URL, else OpenAI's own
    api_key: str | None = None          # default $OPENAI_API_KEY ("EMPTY" if a base URL is set and no key)
    temperature: float | None = None    # None: the server's default
    max_tokens: int | None = None       # completion cap per turn (sent as max_completion_tokens)
    keep_turns: int = 12                # exchanges kept verbatim; older ones are summarised
    summary_lines: int = 200            # most recent summary lines kept
    parallel_tool_calls: bool | None = False  # sent when not None (one tool call per turn)
    send_seed: bool = True              # send the episode seed as the request's `seed`
    transcript: str | None = None       # JSONL file the transcript is appended to
    timeout_s: float = 300.0            # per HTTP request
    max_retries: int = 5                # retries of a request that failed transiently (5xx, 429, connection, timeout)
    retry_initial_s: float = 1.0        # the first wait; it doubles each retry (with jitter)
    retry_max_s: float = 16.0           # the longest single wait (a Retry-After header is honoured up to this)
    retry_budget_s: float = 45.0        # the most time spent waiting between the attempts of one request
    context_tokens: int | None = None   # the server's context size if known; default $RSIGYM_LLM_CONTEXT
    tool_message_name: bool = True      # send the tool's `name` on tool results (Gemini's endpoint needs it)
    schema_max_length: int | str | None = "default"  # tool_schemas(max_string_length=): "default" caps at 1,000
    system_prompt: str = SYSTEM_PROMPT


Args = LLMArgs

CONTEXT_ENV = "RSIGYM_LLM_CONTEXT"
CHARS_PER_TOKEN = 4                     # the estimate of the fixed prompt's tokens
REPLY_TOKENS = 512                      # room for a reply when max_tokens is not set
TRANSIENT_STATUS = frozenset({408, 409, 425, 429})  # and every 5xx
_CONTEXT_WORDS = re.compile(
    r"context[ _](length|size|window)|maximum context|n_ctx|too many tokens|prompt is too long|"
    r"exceeds? the (available |model'?s? )?context|longer than the model'?s context", re.I)
_CONTEXT_SIZE = [re.compile(p, re.I) for p in (
    r"maximum context length is (\d[\d,]*)",                            # OpenAI, vLLM, llama-cpp-python, LiteLLM
    r"model'?s? context length \((\d[\d,]*) tokens?\)",                 # SGLang
    r"context length of (?:only )?(\d[\d,]*)",                          # LM Studio
    r"context (?:size|window|length)(?: is| of)?:? (\d[\d,]*)",
)]
_PROMPT_SIZE = [re.compile(p, re.I) for p in (
    r"\((\d[\d,]*) in the messages",                                    # OpenAI, vLLM, llama-cpp-python
    r"requested (\d[\d,]*) tokens",
    r"input \((\d[\d,]*) tokens?\)",                                    # SGLang
    r"prompt (?:has|is|of) (\d[\d,]*) tokens",
)]
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


class RequestFailed(Exception):
    """One failed chat completion request, as the transcript records it."""

    def __init__(self, kind: str, message: str, *, status: int | None = None, code: str | None = None,
                 transient: bool = False, retry_after_s: float | None = None, body: Any = None):
        super().__init__(message)
        self.kind, self.message, self.status, self.code = kind, message, status, code
        self.transient, self.retry_after_s, self.body = transient, retry_after_s, body
        self.context: tuple[int | None, int | None] | None = None  # (server context, prompt tokens) if too long
        self.after = ""  # " (after N attempts in S s)" once retries are used up

    def describe(self) -> str:
        where = f"HTTP {self.status}" if self.status is not None else self.kind
        return f"{where}{f' {self.code}' if self.code and self.code != str(self.status) else ''}: {_cut(self.message, 300)}"

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "status": self.status, "code": self.code, "message": _cut(self.message, 2000),
                "transient": self.transient}


@dataclass
class Exchange:
    """One turn: the assistant message and the messages answering it; ``summary`` once answered."""

    step: int
    messages: list[dict[str, Any]]
    summary: str | None = None
    call_id: str | None = None              # the executed call (None: no tool call, nudged)
    call_name: str = ""                     # its function name as sent back
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (id, name) of calls not executed
    label: str = ""                         # "tool(args)" for the summary
    malformed: str | None = None            # raw arguments text that was not JSON


class LLMResearcher:
    """A chat model with tool calling as a researcher. See the module docstring.

    ``stop_reason`` is None while it acts, else why it stopped (the endpoint failed for good, or its
    context cannot hold the fixed prompt); ``sleep`` is the function it waits with between retries.
    """

    name = "llm"

    def __init__(self, args: LLMArgs | None = None):
        self.args = args or LLMArgs()
        self.client: Any = None
        self.model: str = ""
        self.tools: list[dict[str, Any]] = []
        self.allowed: list[str] = []
        self.fixed: list[dict[str, Any]] = []
        self.fixed_tokens = 0
        self.exchanges: list[Exchange] = []
        self.seed: int | None = None
        self.fallback: dict[str, Any] = {"tool": "read", "args": {"ref": "budget"}}
        self.initial_harness: str | None = None
        self.requests = 0
        self.stop_reason: str | None = None
        self._stop_submits = 0
        self.sleep: Callable[[float], None] = time.sleep

    # ------------------------------------------------------------------ Researcher protocol

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        from rsigym_env import tool_schemas

        self._connect()
        self.allowed = list(info["tools"])
        self.tools = tool_schemas(self.allowed, max_string_length=self.args.schema_max_length)
        self.fallback = ({"tool": "read", "args": {"ref": "budget"}} if "read" in self.allowed
                         else {"tool": "wait", "args": {}})
        self.initial_harness = info.get("harness")
        self.seed = seed
        self.fixed = [{"role": "system", "content": self.args.system_prompt},
                      {"role": "user", "content": f"Briefing:\n{observation['log']}\n\nBegin: make your first tool call."}]
        self.fixed_tokens = estimate_tokens(self.fixed, self.tools)
        self.exchanges = []
        self.requests = 0
        self.stop_reason, self._stop_submits = None, 0
        context = self._context_tokens()
        self._record({"event": "reset", "time": time.time(), "model": self.model,
                      "base_url": str(self.client.base_url), "seed": seed, "scenario": info.get("scenario"),
                      "tools": self.allowed, "args": {k: v for k, v in asdict(self.args).items() if k != "api_key"},
                      "fixed_tokens_estimate": self.fixed_tokens, "context_tokens": context,
                      "messages": self.fixed})
        if context is not None and self.fixed_tokens > context:
            self._stop(0, self._too_small(None, f"the configured context (LLMArgs.context_tokens or "
                                                  f"${CONTEXT_ENV}) is {context:,} tokens"))

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any:
        if self.stop_reason is not None:
            return self._stop_action(observation, len(self.exchanges) + 1)
        if self.exchanges and self.exchanges[-1].summary is None:
            self._answer(self.exchanges[-1], observation["log"])
        step = len(self.exchanges) + 1
        response = self._complete(step)
        if response is None:  # the endpoint failed for good: stop cleanly
            return self._stop_action(observation, step)
        message = response.choices[0].message
        calls = list(getattr(message, "tool_calls", None) or [])
        content = getattr(message, "content", None)
        assistant: dict[str, Any] = {"role": "assistant", "content": content if isinstance(content, str) else ""}
        exchange = Exchange(step, [assistant])
        if calls:
            wire, parsed = [], []
            for i, call in enumerate(calls):
                entry, read = self._wire_call(call, step, i, {w["id"] for w in wire})
                wire.append(entry)
                parsed.append(read)
            assistant["tool_calls"] = wire
            exchange.call_id, exchange.call_name = wire[0]["id"], wire[0]["function"]["name"]
            exchange.skipped = [(w["id"], w["function"]["name"]) for w in wire[1:]]
            action, exchange.label, exchange.malformed = parsed[0]
        else:
            action = {"tool": self.fallback["tool"], "args": dict(self.fallback["args"])}
            exchange.label = f"(no tool call; counted as {self.fallback['tool']}{_compact(self.fallback['args'])})"
        self.exchanges.append(exchange)
        self._record({"event": "action", "step": step, "action": action})
        return action

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    # ------------------------------------------------------------------ turns

    def _connect(self) -> None:
        import openai

        self.model = self.args.model or os.environ.get("RSIGYM_LLM_MODEL", "")
        if not self.model:
            raise ValueError("no model name: set LLMArgs.model or RSIGYM_LLM_MODEL")
        if self.client is None:
            base_url = self.args.base_url or os.environ.get("OPENAI_BASE_URL") or None
            key = self.args.api_key or os.environ.get("OPENAI_API_KEY") or ("EMPTY" if base_url else None)
            # the client never retries by itself: every attempt is ours, so every failure is recorded
            self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=self.args.timeout_s, max_retries=0)

    def _context_tokens(self) -> int | None:
        if self.args.context_tokens is not None:
            return int(self.args.context_tokens) or None
        raw = os.environ.get(CONTEXT_ENV, "").strip().replace(",", "").replace("_", "")
        if not raw:
            return None
        if not raw.isdigit():
            raise ValueError(f"${CONTEXT_ENV} must be a number of tokens, got {raw!r}")
        return int(raw) or None

    @staticmethod
    def _wire_call(call: Any, step: int, index: int, taken: set[str]) -> tuple[dict[str, Any], tuple[Any, str, str | None]]:
        """A tool call of the response as it goes back into the history, and (action, summary label, raw
        arguments if they could not be read) for it. The history gets a valid function name and the
        arguments as strict JSON text (``{}`` when they could not be read)."""
        function = getattr(call, "function", None)
        if function is not None:
            name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
        else:  # a non-function ("custom") tool call: carried as an unknown tool
            custom = getattr(call, "custom", None)
            name, arguments = getattr(custom, "name", None), getattr(custom, "input", None)
        name = name if isinstance(name, str) else ""
        raw = arguments if isinstance(arguments, str) else ("" if arguments is None else json.dumps(arguments, default=str))
        action, label, malformed = LLMResearcher._action(name, raw)
        args = action.get("args") if isinstance(action, dict) else None
        call_id = getattr(call, "id", None) or f"call_{step}_{index}"
        while call_id in taken:
            call_id += "_"
        wire_name = _SAFE_NAME.sub("_", name.strip())[:64] or "unnamed"
        wire_args = json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else "{}"
        return ({"id": call_id, "type": "function", "function": {"name": wire_name, "arguments": wire_args}},
                (action, label, malformed))

    @staticmethod
    def _action(name: str, raw: str) -> tuple[Any, str, str | None]:
        """(action, summary label, raw arguments if they could not be read)."""
        from rsigym_env.tools import loads_lenient

        if not raw.strip():
            return {"tool": name, "args": {}}, f"{name}{{}}", None
        try:
            args = loads_lenient(raw)
        except (json.JSONDecodeError, RecursionError):
            # the env refuses it as malformed_action, nothing charged, the tool's name kept
            return {"tool": name, "args": raw}, f"{name}({_cut(raw, 120)}) (arguments not JSON)", raw
        return {"tool": name, "args": args}, f"{name}{_compact(args)}", None

    def _answer(self, exchange: Exchange, log_text: str) -> None:
        """Append the env's result to the exchange (tool message, or nudge) and summarise it."""
        if exchange.call_id is not None:
            content = log_text
            if exchange.malformed is not None:
                content += "\n" + MALFORMED_NOTE.format(name=exchange.call_name, raw=_cut(exchange.malformed, 200))
            exchange.messages.append(self._tool_message(exchange.call_id, exchange.call_name, content))
            exchange.messages += [self._tool_message(i, n, NOT_EXECUTED) for i, n in exchange.skipped]
        else:
            exchange.messages.append({"role": "user", "content": f"{NUDGE}\n\n{log_text}"})
        exchange.summary = f"step {exchange.step}: {exchange.label} -> {_result_digest(log_text)}"

    def _tool_message(self, call_id: str, name: str, content: str) -> dict[str, Any]:
        message = {"role": "tool", "tool_call_id": call_id, "content": content}
        if self.args.tool_message_name:
            message["name"] = name
        return message

    # ------------------------------------------------------------------ stopping

    def _stop(self, step: int, reason: str) -> None:
        self.stop_reason = reason
        self._record({"event": "stop", "step": step, "time": time.time(), "reason": reason})
        log.warning("the llm researcher stops (%s); it submits the initial system", reason)

    def _stop_action(self, observation: dict[str, Any], step: int) -> dict[str, Any]:
        """What a stopped researcher does: submit the initial system (twice at most), wait for a submission
        that runs as a job, else free calls until the episode ends."""
        running = observation.get("running_jobs") if isinstance(observation, dict) else None
        try:
            running = int(running[0]) if running is not None else 0
        except (TypeError, ValueError, IndexError):
            running = 0
        if self._stop_submits > 0 and running and "wait" in self.allowed:
            action: dict[str, Any] = {"tool": "wait", "args": {}}
        elif self._stop_submits < 2 and "submit" in self.allowed and self.initial_harness:
            self._stop_submits += 1
            action = {"tool": "submit", "args": {"checkpoint": "base", "harness": self.initial_harness}}
        else:
            action = {"tool": self.fallback["tool"], "args": dict(self.fallback["args"])}
        self._record({"event": "action", "step": step, "action": action, "stopped": self.stop_reason})
        return action

    def _too_small(self, prompt: int | None, detail: str) -> str:
        """The stop reason of a context that cannot hold the fixed prompt; ``prompt`` is the server's count
        of it (else the estimate is used)."""
        fixed = prompt if prompt is not None else self.fixed_tokens
        reply = self.args.max_tokens or REPLY_TOKENS
        needed = fixed + reply
        suggest = 1 << (needed - 1).bit_length()
        counted = f"{fixed:,} tokens (the server's count)" if prompt is not None else f"~{fixed:,} tokens"
        return (f"llm_context_too_small: the fixed prompt (system prompt, briefing and {len(self.tools)} tool "
                f"schemas) needs {counted} and a reply ~{reply:,} more, so the model's context must hold at least "
                f"{needed:,} tokens (e.g. {suggest:,}; a larger one keeps more turns verbatim); {detail}")

    # ------------------------------------------------------------------ context and requests

    def context(self, keep: int | None = None, summary_lines: int | None = None) -> list[dict[str, Any]]:
        """The messages sent next: system, briefing, a summary of old exchanges, the recent ones."""
        keep = self.args.keep_turns if keep is None else keep
        summary_lines = self.args.summary_lines if summary_lines is None else summary_lines
        split = max(0, len(self.exchanges) - max(0, keep))
        old, recent = self.exchanges[:split], self.exchanges[split:]
        messages = list(self.fixed)
        if old:
            lines = [e.summary or f"step {e.step}: {e.label}" for e in old]
            dropped = len(lines) - max(0, summary_lines)
            lines = lines[max(0, dropped):]
            head = f"Summary of steps 1-{old[-1].step} (their full results are no longer shown)"
            head += f"; the first {dropped} steps are omitted:" if dropped > 0 else ":"
            messages.append({"role": "user", "content": "\n".join([head, *lines])})
        for exchange in recent:
            messages.extend(exchange.messages)
        return messages

    def _shrink(self, keep: int, lines: int, current: list[dict[str, Any]]) -> tuple[int, int] | None:
        """The next smaller (keep, summary lines) whose context differs from ``current``; None if none does."""
        while keep > 0 or lines > 0:
            keep, lines = (keep // 2, lines) if keep > 0 else (0, lines // 2)
            if self.context(keep, lines) != current:
                return keep, lines
        return None

    def _complete(self, step: int) -> Any | None:
        """The model's response for this turn; None if the researcher had to stop (``stop_reason``)."""
        keep, lines = self.args.keep_turns, self.args.summary_lines
        while True:
            messages = self.context(keep, lines)
            params: dict[str, Any] = {"model": self.model, "messages": messages, "tools": self.tools,
                                      "tool_choice": "auto"}
            if self.args.parallel_tool_calls is not None:
                params["parallel_tool_calls"] = self.args.parallel_tool_calls
            if self.args.temperature is not None:
                params["temperature"] = self.args.temperature
            if self.args.max_tokens is not None:
                params["max_completion_tokens"] = self.args.max_tokens
            if self.args.send_seed and self.seed is not None:
                params["seed"] = self.seed
            self._record({"event": "request", "step": step, "keep_turns": keep, "summary_lines": lines,
                          **{k: v for k, v in params.items() if k != "tools"}})
            try:
                response = self._create(step, params)
            except RequestFailed as failure:
                if failure.context is None:
                    self._stop(step, f"llm_{'unavailable' if failure.transient else 'error'}: {failure.describe()}"
                                     f"{failure.after}")
                    return None
                context, prompt = failure.context
                smaller = self._shrink(keep, lines, messages)
                fixed_only = len(messages) == len(self.fixed)
                if smaller is None or (context is not None and self.fixed_tokens >= context):
                    where = f"the server's is {context:,} tokens" if context is not None else "the server refused it"
                    self._stop(step, self._too_small(prompt if fixed_only else None, f"{where} ({failure.describe()})"))
                    return None
                keep, lines = smaller
                continue
            self._record({"event": "response", "step": step, "response": response.model_dump(mode="json")})
            return response

    def _create(self, step: int, params: dict[str, Any]) -> Any:
        """One chat completion, transient failures retried with backoff (each recorded); the last failure
        raised as :class:`RequestFailed`."""
        import tenacity

        attempts = [0]
        started = time.monotonic()

        def attempt() -> Any:
            attempts[0] += 1
            self.requests += 1
            try:
                response = self.client.chat.completions.create(**params)
            except Exception as exc:
                failure = classify(exc)
                if failure is None:
                    raise
                raise failure from exc
            if not getattr(response, "choices", None) or getattr(response.choices[0], "message", None) is None:
                raise RequestFailed("empty_response", f"the model {self.model!r} returned no choices", status=200,
                                    transient=True)
            return response

        def wait(state: tenacity.RetryCallState) -> float:
            failure = state.outcome.exception() if state.outcome is not None else None
            backoff = self.args.retry_initial_s * 2 ** (state.attempt_number - 1) * random.uniform(0.8, 1.0)
            hinted = getattr(failure, "retry_after_s", None)
            return max(0.0, min(self.args.retry_max_s, max(backoff, hinted or 0.0)))

        def stop(state: tenacity.RetryCallState) -> bool:
            return (state.attempt_number > self.args.max_retries
                    or state.idle_for + state.upcoming_sleep > self.args.retry_budget_s)

        def before_sleep(state: tenacity.RetryCallState) -> None:
            failure = state.outcome.exception()
            self._record({"event": "error", "step": step, "attempt": state.attempt_number, "time": time.time(),
                          **failure.record(), "retry_in_s": round(state.next_action.sleep, 3)})

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(lambda exc: isinstance(exc, RequestFailed) and exc.transient),
            stop=stop, wait=wait, before_sleep=before_sleep, sleep=self.sleep, reraise=True)
        try:
            return retrying(attempt)
        except RequestFailed as failure:
            self._record({"event": "error", "step": step, "attempt": attempts[0], "time": time.time(),
                          **failure.record(), "retry_in_s": None})
            if failure.transient:
                failure.after = f" (after {attempts[0]} attempts in {time.monotonic() - started:.1f} s)"
            raise

    def _record(self, record: dict[str, Any]) -> None:
        if self.args.transcript:
            path = Path(self.args.transcript)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(json.dumps(record, default=str) + "\n")


def classify(exc: BaseException) -> RequestFailed | None:
    """An ``openai`` client error as a :class:`RequestFailed` (None for anything else: a bug, not the server).

    Transient: connection errors, timeouts, unreadable responses, 5xx, 408, 409, 425 and 429 — except
    a context-length error, which is never retried whatever its status (``context`` is set instead)."""
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return RequestFailed("timeout", str(exc) or "the request timed out", transient=True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f"{exc}" + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")
        return RequestFailed("connection", detail, transient=True)
    if isinstance(exc, openai.APIStatusError):
        body = exc.body
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message:
            message = body if isinstance(body, str) and body else str(exc)
        status = exc.status_code
        failure = RequestFailed("http", message, status=status, code=exc.code, body=body,
                                transient=status >= 500 or status in TRANSIENT_STATUS,
                                retry_after_s=_retry_after(exc.response))
        failure.context = _context_error(failure)
        if failure.context is not None:
            failure.transient = False
        return failure
    if isinstance(exc, openai.APIResponseValidationError):
        return RequestFailed("invalid_response", str(exc), status=getattr(exc, "status_code", None), transient=True)
    if isinstance(exc, openai.APIError):
        return RequestFailed("api_error", str(exc), transient=False)
    return None


def _context_error(failure: RequestFailed) -> tuple[int | None, int | None] | None:
    """(the server's context size, the prompt's tokens), each None if not said, for a context-length
    error; None for any other error."""
    body = failure.body if isinstance(failure.body, dict) else {}
    kind = str(body.get("type") or "")
    text = failure.message
    if not (failure.code == "context_length_exceeded" or "exceed_context" in kind
            or "ContextWindowExceeded" in text or _CONTEXT_WORDS.search(text)):
        return None
    if failure.status is not None and failure.status < 400:
        return None

    def number(value: Any, patterns: list[re.Pattern[str]]) -> int | None:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        for pattern in patterns:
            match = pattern.search(text)
            if match:
                return int(match.group(1).replace(",", ""))
        return None

    return number(body.get("n_ctx"), _CONTEXT_SIZE), number(body.get("n_prompt_tokens"), _PROMPT_SIZE)


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None) or {}
    for key, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            value = float(headers.get(key))
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            return value * scale
    return None


def estimate_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """The tokens of a prompt, estimated at ``CHARS_PER_TOKEN`` characters of its text and tool schemas a token.

    >>> estimate_tokens([{"role": "user", "content": "x" * 400}])
    104
    """
    chars = sum(len(m.get("content") or "") + (len(json.dumps(m["tool_calls"])) if m.get("tool_calls") else 0)
                for m in messages)
    if tools:
        chars += len(json.dumps(tools, ensure_ascii=False))
    return math.ceil(chars / CHARS_PER_TOKEN) + 4 * len(messages)


# ---------------------------------------------------------------------- helpers


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _compact(args: Any) -> str:
    text = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
    return f"({_cut(text, 160)})"


def _result_digest(log: str) -> str:
    """First line of the result (after the status line) and any "job-N ... finished" lines; a JSON
    result as compact JSON."""
    lines = [l.strip() for l in log.splitlines() if l.strip()]
    if lines and lines[0].startswith("[step "):
        lines = lines[1:]
    if not lines:
        return "(empty)"
    if lines[0] in ("{", "["):
        try:
            return _cut(json.dumps(json.loads("\n".join(lines)), separators=(",", ":")), 240)
        except json.JSONDecodeError:
            pass
    picked = [lines[0]] + [l for l in lines[1:] if l.startswith("job-") and " finished" in l]
    return " | ".join(_cut(l, 240) for l in picked)
