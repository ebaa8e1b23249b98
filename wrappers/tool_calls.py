"""``ToolCallWrapper``: the env for LLM policies. The action is a function call, the observation text.

A call may come in any of the usual shapes; all of these do the same thing:

>>> import json, gymnasium as gym, rsigym_env
>>> from rsigym_env.wrappers import ToolCallWrapper
>>> parse_tool_call({"name": "evaluate", "arguments": '{"k": 1}'})
{'tool': 'evaluate', 'args': {'k': 1}}
>>> parse_tool_call({"type": "function", "function": {"name": "evaluate", "arguments": {"k": 1}}})
{'tool': 'evaluate', 'args': {'k': 1}}
>>> parse_tool_call('{"tool": "evaluate", "args": {"k": 1}}')
{'tool': 'evaluate', 'args': {'k': 1}}

Arguments a model writes as near-JSON are read where the intent is unambiguous
(:func:`~rsigym_env.tools.loads_lenient`): raw newlines or tabs inside strings, a markdown code
fence, one JSON object inside other text:

>>> parse_tool_call({"name": "edit_harness", "arguments": '{"path": "prompt.md", "content": "a\\nb"}'})
{'tool': 'edit_harness', 'args': {'path': 'prompt.md', 'content': 'a\\nb'}}

A call that cannot be understood is not an exception but an error observation (audited, free); it
keeps the tool's name (``info["tool"]``) when the call has one:

>>> env = ToolCallWrapper(gym.make("RSIGym/Harness-v0", benchmark="aime", budget_usd=50))
>>> log, info = env.reset(seed=0)
>>> [s["function"]["name"] for s in env.tool_schemas][:3]
['infer', 'edit_harness', 'sandbox_exec']
>>> log, reward, terminated, truncated, info = env.step({"name": "evaluate", "arguments": '{"k": 1'})
>>> info["error"], info["tool"], info["cost_usd"], log.splitlines()[1][:66]
('malformed_action', 'evaluate', 0.0, "ERROR malformed_action: arguments of 'evaluate' are not valid JSON")
>>> log, reward, terminated, truncated, info = env.step(json.dumps({"name": "submit", "arguments": "{}"}))
>>> terminated, info["observation"]["step"]
(True, array([1]))
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

import gymnasium as gym
from gymnasium import spaces

import rsigym_env
from rsigym_env.env import LOG_MAX, printable
from rsigym_env.tools import Tool, loads_lenient

ACTION_MAX = 100_000
HINT = 'send one function call, e.g. {"name": "evaluate", "arguments": {"k": 1}}'
_SHAPE_ERRORS = {"malformed_action", "unknown_tool", "invalid_args"}  # the env's codes for a call it cannot read
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # a name worth keeping in the refusal (tool_label keeps 64)


class ToolCallError(ValueError):
    """A tool call that could not be turned into an env action; the message says why. ``tool`` and
    ``raw_args`` are the call's function name and arguments when it had a name."""

    def __init__(self, message: str, tool: str | None = None, raw_args: Any = None):
        super().__init__(message)
        self.tool, self.raw_args = tool, raw_args


def _decode_json(text: str | bytes, what: str) -> Any:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ToolCallError(f"{what} is not UTF-8 text: {exc}") from None
    try:  # near-JSON too: a code fence, raw newlines in strings, one object inside prose
        return loads_lenient(text)
    except json.JSONDecodeError as exc:
        raise ToolCallError(f"{what} are not valid JSON: {exc}" if what.startswith("arguments")
                            else f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ToolCallError(f"{what} {'are' if what.startswith('arguments') else 'is'} nested too deeply") from None


def _arguments(name: str, raw: Any) -> Any:
    """The arguments of a call as a dict (JSON text decoded; ``None``/``""`` mean no arguments)."""
    if raw is None or (isinstance(raw, (str, bytes)) and not raw.strip()):
        return {}
    if isinstance(raw, (str, bytes)):
        raw = _decode_json(raw, f"arguments of {name!r}")
    if not isinstance(raw, dict):
        raise ToolCallError(f"arguments of {name!r} must be a JSON object, got {type(raw).__name__}")
    return raw


def _named(name: Any, raw_args: Any) -> dict[str, Any]:
    if not isinstance(name, str) or not name.strip():
        raise ToolCallError(f"the call has no function name (got {name!r})")
    name = name.strip()
    try:
        return {"tool": name, "args": _arguments(name, raw_args)}
    except ToolCallError as exc:
        if _NAME.match(name) and not isinstance(raw_args, bytes):  # bytes: the env might read them otherwise
            exc.tool, exc.raw_args = name, raw_args
        raise


def parse_tool_call(call: Any, _depth: int = 0) -> dict[str, Any] | Tool | tuple[Any, Any]:
    """Turn a function call in any usual shape into an action ``step`` takes, or raise :class:`ToolCallError`.

    Shapes: ``{"name", "arguments"}`` (arguments as JSON text or an object), a ``tool_calls[i]`` entry
    ``{"type": "function", "function": {...}}``, an assistant message with exactly one ``tool_calls``
    entry, a one-element list of calls, ``openai`` SDK objects (``.function.name`` / ``.function.arguments``,
    or ``.name`` / ``.arguments``), Anthropic ``{"name", "input"}`` blocks, the env's own
    ``{"tool", "args"}``, JSON text of any of these (a markdown code fence around it is fine), and the
    env's own action forms (tool objects, space samples), which pass through unchanged.

    >>> parse_tool_call('```json\\n{"name": "wait", "arguments": ""}\\n```')
    {'tool': 'wait', 'args': {}}
    >>> parse_tool_call({"arguments": "{}"})
    Traceback (most recent call last):
    ...
    rsigym_env.wrappers.tool_calls.ToolCallError: the call has no function name (keys: arguments)
    """
    if _depth > 4:
        raise ToolCallError("the call is nested too deeply")
    if isinstance(call, Tool):
        return call
    if isinstance(call, tuple) and len(call) == 2 and isinstance(call[1], dict):
        return call  # a sample of the env's action space
    if isinstance(call, (str, bytes)):
        return parse_tool_call(_decode_json(call, "the tool call"), _depth + 1)
    if isinstance(call, list):
        if len(call) != 1:
            raise ToolCallError(f"one function call per step, got {len(call)}")
        return parse_tool_call(call[0], _depth + 1)
    if not isinstance(call, dict):
        function = getattr(call, "function", None)
        if function is not None and hasattr(function, "name"):  # openai ChatCompletionMessageToolCall
            return _named(function.name, getattr(function, "arguments", None))
        if hasattr(call, "name") and hasattr(call, "arguments"):  # Function, ResponseFunctionToolCall
            return _named(call.name, call.arguments)
        if hasattr(call, "model_dump"):  # some other pydantic model (an SDK message, ...)
            return parse_tool_call(call.model_dump(), _depth + 1)
        raise ToolCallError(f"a tool call is a function call object or its JSON, got {type(call).__name__}")
    if "tool_calls" in call and "name" not in call:
        calls = call["tool_calls"] or []
        if not isinstance(calls, list) or len(calls) != 1:
            count = len(calls) if isinstance(calls, list) else type(calls).__name__
            raise ToolCallError(f"one function call per step, got {count}")
        return parse_tool_call(calls[0], _depth + 1)
    if "function" in call and "name" not in call:
        return parse_tool_call(call["function"], _depth + 1)
    if "tool" in call and "name" not in call:
        return _named(call["tool"], call.get("args", call.get("arguments")))
    if "name" in call:
        return _named(call["name"], call.get("arguments", call.get("input", call.get("args"))))
    raise ToolCallError(f"the call has no function name (keys: {', '.join(map(str, call)) or 'none'})")


class ToolCallWrapper(gym.Wrapper[str, str, dict[str, Any], Any], gym.utils.RecordConstructorArgs):
    """The env with function calls as actions and the env's ``log`` text as observation.

    ``step`` accepts anything :func:`parse_tool_call` does. A call it cannot parse is still sent to the
    env as it came, so the env refuses it (``info["error"]``, nothing charged, audited); the observation
    and ``info["message"]`` then say what was wrong with the call (the env's own wording stays in
    ``info["env_message"]``). The numeric part of the env's observation is kept in
    ``info["observation"]``; the parsed call in ``info["tool_call"]``.

    Args:
        env: an RSIGym env (or a wrapper of one whose observation is the env's ``Dict``).
    """

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self.action_space = spaces.Text(max_length=ACTION_MAX, min_length=0, charset=string.printable)
        log_space = env.observation_space["log"] if isinstance(env.observation_space, spaces.Dict) else None
        self.observation_space = log_space if isinstance(log_space, spaces.Text) else spaces.Text(
            max_length=LOG_MAX, min_length=0, charset=string.printable)

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function-calling schemas of the tools this scenario allows (for ``tools=``)."""
        return rsigym_env.tool_schemas(self.env.unwrapped.scenario.tools())

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return self._split(obs, info)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        problem: str | None = None
        try:
            call: Any = parse_tool_call(action)
        except ToolCallError as exc:
            # the env refuses it (and audits it): as {"tool": name, "args": what came} when the call named
            # a tool, so that the refusal keeps the name (info["tool"], the step log), else as it came
            problem = str(exc)
            call = action if exc.tool is None else {"tool": exc.tool, "args": exc.raw_args}
        obs, reward, terminated, truncated, info = self.env.step(call)
        log, info = self._split(obs, info)
        if problem is not None:
            info["tool_call_error"] = problem
            if info.get("error") in _SHAPE_ERRORS and "message" in info:  # not e.g. episode_over
                code, env_message = info["error"], info["message"]
                message = f"{problem}; {HINT}"
                log = log.replace(f"ERROR {code}: {env_message}", f"ERROR {code}: {message}", 1)
                info["env_message"], info["message"] = env_message, message
                log = printable(log, self.observation_space.max_length)
        elif isinstance(call, dict):
            info["tool_call"] = {"name": call["tool"], "arguments": call["args"]}
        return log, reward, terminated, truncated, info

    @staticmethod
    def _split(obs: Any, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if isinstance(obs, dict) and "log" in obs:
            info = {**info, "observation": {k: v for k, v in obs.items() if k != "log"}}
            return obs["log"], info
        return str(obs), info
