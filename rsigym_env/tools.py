"""The researcher's tools: one pydantic model per tool, the single source of truth.

From each model come argument validation (:func:`parse_action`), the LLM function-calling JSON
schema (:func:`tool_schemas`) and the Gymnasium subspace (:func:`action_space`).

An action can be given in any of these forms; all end up as a validated tool object:

>>> parse_action(Evaluate(checkpoint="base", k=1))
Evaluate(checkpoint='base', harness='latest', k=1, n_tasks=None)
>>> parse_action({"tool": "wait", "args": {}})
Wait(job=None, timeout_s=None)
>>> parse_action('{"tool": "submit", "args": {"checkpoint": "ckpt-1"}}')
Submit(checkpoint='ckpt-1', harness='latest')
>>> parse_action({"tool": "fly"})
Traceback (most recent call last):
...
rsigym_env.errors.ActionError: unknown tool 'fly'; tools are: generate_data, transform_data, train, infer, edit_harness, sandbox_exec, evaluate, read, wait, submit
"""

from __future__ import annotations

import functools
import json
import re
import string
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Union

import numpy as np
from gymnasium import spaces
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ActionError

TEXT_MAX = 512  # longest free-text argument a sampled action carries (LLM callers may send more)
CHARSET = string.printable


class Tool(BaseModel):
    """Base of every tool. ``name`` is the tool's wire name; ``paid`` says whether it bills.

    Arguments are strict: ``k: true`` or ``k: "2"`` is refused, not coerced (an int is a number, though).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    name: ClassVar[str]
    paid: ClassVar[bool] = False


class GenerateData(Tool):
    """Ask a teacher model (the rollout service) for training examples on this run's benchmark domain.

    Prompts come from synthetic tasks of the domain, or from the dev split (``source="dev"``: closer to
    the benchmark, but a model trained on them may look better on dev than it is). Returns a dataset id.
    Cost: prompt and completion tokens at the teacher's price; the worst case assumes every example
    uses ``max_tokens_per_example``.
    """

    name = "generate_data"
    paid = True
    teacher: str = Field(description="Teacher model id; the scenario lists the allowed ones.", max_length=64)
    n_examples: int = Field(ge=1, le=20_000, description="How many examples to generate.")
    source: Literal["synthetic", "dev"] = Field("synthetic", description="Where the prompts come from.")
    max_tokens_per_example: int = Field(8192, ge=256, le=32_768, description="Completion cap per example.")


class TransformData(Tool):
    """Filter, deduplicate or mix datasets by running code in the sandbox. Returns a new dataset id.

    ``filter`` keeps the examples whose answer passes the domain's checker; ``dedupe`` drops
    near-duplicates; ``mix`` concatenates; ``script`` runs ``script`` as a shell command over
    ``/data/in_*.jsonl`` writing ``/data/out.jsonl`` (worlds that cannot run code refuse it).
    Cost: sandbox seconds.
    """

    name = "transform_data"
    paid = True
    operation: Literal["filter", "dedupe", "mix", "script"] = Field(description="What to do.")
    datasets: list[str] = Field(min_length=1, max_length=8, description="Input dataset ids.")
    script: str | None = Field(None, max_length=20_000, description="Shell command for operation='script'.")


class Train(Tool):
    """Start a LoRA fine-tune on a dataset (the training service). Returns a job id at once.

    The finished job yields a checkpoint id and its loss curve. Starting from ``base`` or from an
    earlier checkpoint. Field names follow Tinker; a scenario may lock or restrict them.
    Cost: trained tokens (examples × tokens × epochs) at the model's training price.
    """

    name = "train"
    paid = True
    dataset: str = Field(description="Dataset id to train on.", max_length=64)
    base: str = Field("base", description="'base' or a checkpoint id to continue from.", max_length=64)
    learning_rate: float = Field(3e-4, gt=0.0, le=1e-2, description="Adam learning rate.")
    num_epochs: int = Field(1, ge=1, le=10, description="Passes over the dataset.")
    lora_rank: int = Field(16, ge=1, le=256, description="LoRA rank.")
    batch_size: int = Field(16, ge=1, le=512, description="Examples per optimizer step.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field("linear", description="Learning-rate schedule.")


class Infer(Tool):
    """Chat completion from the base model or a checkpoint (the inference service), to probe it.

    Cost: prompt and completion tokens at the model's sampling price.
    """

    name = "infer"
    paid = True
    model: str = Field("base", description="'base' or a checkpoint id.", max_length=64)
    prompt: str = Field(description="The user message.", max_length=50_000)
    max_tokens: int = Field(1024, ge=1, le=32_768, description="Completion cap.")


class EditHarness(Tool):
    """Write or patch one file of the harness; returns the new harness version id. Free.

    Give ``content`` to replace the whole file, or ``old`` and ``new`` to replace exactly one
    occurrence of ``old``. Edits apply to ``base_version`` (default: the latest version).
    """

    name = "edit_harness"
    path: str = Field(description="File path inside the harness, e.g. 'harness.toml'.", max_length=256)
    content: str | None = Field(None, max_length=200_000, description="New full content of the file.")
    old: str | None = Field(None, max_length=50_000, description="Exact text to replace (once).")
    new: str | None = Field(None, max_length=50_000, description="Replacement for `old`.")
    base_version: str = Field("latest", description="Harness version to edit.", max_length=64)


class SandboxExec(Tool):
    """Run a shell command in the run's isolated sandbox (the sandbox service).

    Cost: sandbox seconds at the vCPU and memory rates; the worst case is ``timeout_s``.
    """

    name = "sandbox_exec"
    paid = True
    command: str = Field(description="Shell command.", max_length=20_000)
    timeout_s: int = Field(60, ge=1, le=3600, description="Wall-clock limit in seconds.")


class Evaluate(Tool):
    """Score a (checkpoint, harness version) on the dev split, avg@k (the benchmark service).

    Returns a job id at once; the finished job has the mean score, per-task rewards and traces.
    ``n_tasks`` evaluates only the first n dev tasks (cheaper, noisier).
    Cost: the policy model's tokens plus sandbox seconds for every attempt.
    """

    name = "evaluate"
    paid = True
    checkpoint: str = Field("base", description="'base' or a checkpoint id.", max_length=64)
    harness: str = Field("latest", description="Harness version id, or 'latest'.", max_length=64)
    k: int = Field(3, ge=1, le=8, description="Attempts per task (avg@k).")
    n_tasks: int | None = Field(None, ge=1, le=1000, description="Evaluate only the first n dev tasks.")


class Read(Tool):
    """Read an artifact: a job's result or log, a dataset sample, a harness file, the budget. Free.

    Refs: ``job-3`` (a job), ``ds-2`` (a dataset), ``ckpt-1`` (a checkpoint),
    ``harness:latest/harness.toml`` or ``harness:<version>/<path>`` (a harness file),
    ``harness:latest`` (its file list), ``jobs``, ``artifacts``, ``budget``, ``scenario``.
    """

    name = "read"
    ref: str = Field(description="What to read.", max_length=512)


class Wait(Tool):
    """Let time pass until a job finishes (``job``) or until any running job finishes. Free.

    ``timeout_s`` bounds the wait in the world's clock (at most 30 s): when it passes first, the
    reply says which jobs are still running and how far along they are; call ``wait`` again.
    Without it the call returns when a job ends (or the time limit comes).
    """

    name = "wait"
    job: str | None = Field(None, description="Job id; omit to wait for the first job to end.", max_length=64)
    timeout_s: float | None = Field(None, gt=0.0, le=30.0,
                                    description="Return after at most this many seconds (world clock); omit to wait for the job.")


class Submit(Tool):
    """Submit a (checkpoint, harness version) for the official held-out evaluation; ends the episode.

    The official evaluation is billed outside the run's budget, as in RSIGym.
    """

    name = "submit"
    checkpoint: str = Field("base", description="'base' or a checkpoint id.", max_length=64)
    harness: str = Field("latest", description="Harness version id, or 'latest'.", max_length=64)


TOOLS: tuple[type[Tool], ...] = (
    GenerateData, TransformData, Train, Infer, EditHarness, SandboxExec, Evaluate, Read, Wait, Submit,
)
TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in TOOLS)
TOOLS_BY_NAME: dict[str, type[Tool]] = {t.name: t for t in TOOLS}


# --------------------------------------------------------------------------------------------
# Parsing: object, dict, JSON text or a sample of the Gymnasium action space -> Tool


ACTION_MAX_DEPTH = 8          # an action's arguments are flat; nothing legitimate nests deeper
ACTION_MAX_NODES = 4096       # containers + scalars in one action
ACTION_MAX_BYTES = 1 << 20    # JSON text, and the sum of string lengths, of one action


_SCALARS = frozenset({int, float, bool, type(None), np.int64, np.float64, np.int8})


_PLAIN = frozenset({int, float, bool, type(None)})
_FLAT_MAX_ARGS = 64
_FLAT_MAX_ITEMS = 16


def _flat_call(action: dict) -> bool:
    """True for a dict of at most two str-keyed entries whose values are plain scalars, strings or a dict
    of at most ``_FLAT_MAX_ARGS`` of those (or of lists of at most ``_FLAT_MAX_ITEMS`` strings), with no
    more text than ``ACTION_MAX_BYTES``: within every bound of :func:`check_shape` without walking it (no
    cycle, depth at most 3, fewer than 1 + 4 + 64 * 18 parts)."""
    return len(action) <= 2 and 0 <= _flat_text(action, 0) <= ACTION_MAX_BYTES


def _flat_text(entries: dict, depth: int) -> int:
    """The characters of keys and strings in ``entries`` if it has the shape :func:`_flat_call` allows at
    ``depth`` (0: the call, 1: its arguments), else -1."""
    if len(entries) > _FLAT_MAX_ARGS:
        return -1
    text = 0
    for key, value in entries.items():
        if type(key) is not str:
            return -1
        text += len(key)
        kind = type(value)
        if kind is str:
            text += len(value)
        elif kind is dict and depth == 0:
            inner = _flat_text(value, 1)
            if inner < 0:
                return -1
            text += inner
        elif kind is list and depth == 1 and len(value) <= _FLAT_MAX_ITEMS and all(type(v) is str for v in value):
            text += sum(map(len, value))
        elif kind not in _PLAIN:
            return -1
    return text


def check_shape(action: Any) -> None:
    """Refuse (``malformed_action``) an action nested deeper than ``ACTION_MAX_DEPTH``, with more than
    ``ACTION_MAX_NODES`` parts or ``ACTION_MAX_BYTES`` of text, or a self-referencing container —
    before anything parses, validates or audits it. Iterative: no recursion to exhaust.

    >>> deep = {"tool": "read", "args": {}}
    >>> for _ in range(50): deep = {"x": deep}
    >>> check_shape(deep)
    Traceback (most recent call last):
    ...
    rsigym_env.errors.ActionError: the action is nested deeper than 8 levels
    """
    if type(action) is dict and _flat_call(action):  # the common case of researchers: one flat call
        return
    if type(action) is tuple and len(action) == 2 and type(action[1]) is dict:  # the common case: a space sample
        text = 0
        for value in action[1].values():
            kind = type(value)
            if kind is str:
                text += len(value)
            elif kind is np.ndarray:
                if value.size > 1:
                    break
            elif kind not in _SCALARS and not (kind is tuple and all(type(v) is str for v in value)):
                break
        else:
            if len(action[1]) <= ACTION_MAX_NODES and text <= ACTION_MAX_BYTES:
                return
    stack: list[tuple[Any, int]] = [(action, 0)]
    seen: set[int] = set()
    nodes = text = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > ACTION_MAX_NODES:
            raise ActionError("malformed_action", f"the action has more than {ACTION_MAX_NODES} parts")
        if isinstance(value, (str, bytes)):
            text += len(value)
            if text > ACTION_MAX_BYTES:
                raise ActionError("malformed_action", f"the action holds more than {ACTION_MAX_BYTES} bytes of text")
            continue
        if not isinstance(value, (dict, list, tuple)):
            continue
        if depth >= ACTION_MAX_DEPTH:
            raise ActionError("malformed_action", f"the action is nested deeper than {ACTION_MAX_DEPTH} levels")
        if id(value) in seen:
            raise ActionError("malformed_action", "the action contains itself (a cycle)")
        seen.add(id(value))
        items = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
        if len(items) > ACTION_MAX_NODES:
            raise ActionError("malformed_action", f"the action has more than {ACTION_MAX_NODES} parts")
        for key, item in items:
            if key is not None:
                stack.append((key, depth + 1))
            stack.append((item, depth + 1))


_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*[ \t]*\n?(.*?)\n?```$", re.DOTALL)
_LENIENT = json.JSONDecoder(strict=False)
_EMBEDDED_TRIES = 16  # start positions tried when looking for the one JSON object in a text


def loads_lenient(text: str | bytes) -> Any:
    """JSON text as language models write it: strict JSON first; else, where the intent is unambiguous,
    the same with raw control characters (newlines, tabs) inside strings (``json.loads(strict=False)``),
    inside a markdown code fence, or the one JSON object a text holds (``Sure: {...}``; two objects
    are ambiguous). Anything else raises the strict parse's ``json.JSONDecodeError``.

    >>> loads_lenient('{"content": "line 1\\nline 2"}')  # a raw newline inside the string
    {'content': 'line 1\\nline 2'}
    >>> loads_lenient('I will evaluate: {"k": 1} and then wait.')
    {'k': 1}
    >>> loads_lenient('{"k": 1} or {"k": 2}')
    Traceback (most recent call last):
    ...
    json.decoder.JSONDecodeError: Extra data: line 1 column 10 (char 9)
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        first = exc
    if isinstance(text, bytes):
        text = text.decode("utf-8")  # a UnicodeDecodeError is the caller's, as json.loads' own
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    candidates = [stripped] + ([fenced.group(1).strip()] if fenced else [])
    for candidate in candidates:
        try:
            return _LENIENT.decode(candidate)
        except json.JSONDecodeError:
            pass
    found = _embedded_object(stripped)
    if found is not None:
        return found
    raise first


def _embedded_object(text: str) -> dict[str, Any] | None:
    """The one JSON object (control characters allowed in strings) in ``text`` beside other text;
    None if there is none, more than one, or it is not found within ``_EMBEDDED_TRIES`` tries."""
    found: list[Any] = []
    start, tries = text.find("{"), 0
    while start != -1:
        tries += 1
        if tries > _EMBEDDED_TRIES:
            return None
        try:
            value, end = _LENIENT.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            found.append(value)
            if len(found) > 1:
                return None
        start = text.find("{", end)
    return found[0] if found else None


def _decode_args(name: str, args: str | bytes) -> Any:
    """``"args"`` given as JSON text (as function-calling APIs carry arguments), decoded leniently."""
    if not args.strip():
        return {}
    try:
        return loads_lenient(args)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ActionError("malformed_action", f"arguments of {name!r} are not valid JSON: {exc}") from None
    except RecursionError:
        raise ActionError("malformed_action", f"arguments of {name!r} are nested too deeply") from None


def parse_action(action: Any) -> Tool:
    """Turn any accepted action form into a validated :class:`Tool`, or raise :class:`ActionError`.

    Accepted: a ``Tool`` instance; ``{"tool": name, "args": {...}}`` (``args`` may also be the JSON
    text of the object); the same as JSON text; and a sample of :func:`action_space` (``(index,
    {field: value})``). JSON text is read by :func:`loads_lenient`. Shapes no action has (deep
    nesting, huge or cyclic values) are refused first (:func:`check_shape`).
    """
    if isinstance(action, Tool):
        return action
    if isinstance(action, (str, bytes)):
        if len(action) > ACTION_MAX_BYTES:
            raise ActionError("malformed_action", f"action text is longer than {ACTION_MAX_BYTES} bytes")
        try:
            action = loads_lenient(action)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ActionError("malformed_action", f"action text is not valid JSON: {exc}") from None
        except RecursionError:
            raise ActionError("malformed_action", "action text is nested too deeply") from None
    check_shape(action)
    if isinstance(action, tuple) and len(action) == 2 and isinstance(action[0], (int, np.integer)):
        return from_space_sample(action)
    if not isinstance(action, dict):
        raise ActionError(
            "malformed_action",
            f'an action is a tool object, {{"tool": name, "args": {{...}}}} or its JSON; got {type(action).__name__}',
        )
    extra = set(action) - {"tool", "args"}
    if "tool" not in action or extra:
        raise ActionError(
            "malformed_action",
            'an action dict has exactly the keys "tool" and optionally "args"'
            + (f"; unexpected: {', '.join(sorted(map(str, extra)))}" if extra else "; \"tool\" is missing"),
        )
    name, args = action["tool"], action.get("args")
    args = {} if args is None else args
    if not isinstance(name, str) or name not in TOOLS_BY_NAME:
        raise ActionError("unknown_tool", f"unknown tool {name!r}; tools are: {', '.join(TOOL_NAMES)}")
    if isinstance(args, (str, bytes)):
        args = _decode_args(name, args)
        check_shape({"tool": name, "args": args})
    if not isinstance(args, dict):
        raise ActionError("malformed_action", f'"args" must be an object, got {type(args).__name__}')
    return build_tool(TOOLS_BY_NAME[name], args)


def build_tool(cls: type[Tool], args: dict[str, Any]) -> Tool:
    """Validate ``args`` against ``cls``; a failure names every bad field."""
    try:
        return cls.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(args)'}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise ActionError("invalid_args", f"{cls.name}: {problems}") from None


# --------------------------------------------------------------------------------------------
# LLM function-calling schemas


SCHEMA_MAX_LENGTH = 1000
"""The longest string ``maxLength`` the schemas of :func:`tool_schemas` show an LLM by default.

Grammar-constrained decoders compile every ``maxLength`` into a bounded repetition: llama.cpp's GBNF
parser refuses (older builds crash on) a repetition of 2,000 or more, and other engines get slower with
the bound. The tools themselves accept their models' limits (up to 200,000 characters): only what the
LLM is shown is capped. ``$RSIGYM_SCHEMA_MAX_LENGTH`` changes the default (``none``: the models' limits)."""
SCHEMA_MAX_LENGTH_ENV = "RSIGYM_SCHEMA_MAX_LENGTH"
_NO_CAP = ("", "0", "none", "off", "no")

_LONG_TEXT = {  # how to get longer text through a capped field, told in the field's description
    ("edit_harness", "content"): "A longer file goes in parts: the first as `content`, then each next part with "
                                 "`old` = the last line(s) already written (text that occurs once in the file) and "
                                 "`new` = the same line(s) followed by the part.",
    ("sandbox_exec", "command"): "A longer script goes in parts: append each to a file (`cat >> job.sh <<'EOF'` ... "
                                 "`EOF`; the run's sandbox keeps its files between calls), then run the file.",
}


def schema_max_length(value: int | str | None = "default") -> int | None:
    """The ``maxLength`` cap ``value`` stands for: ``"default"`` is ``$RSIGYM_SCHEMA_MAX_LENGTH`` if set, else
    :data:`SCHEMA_MAX_LENGTH`; ``None``, ``0`` or ``"none"`` mean no cap (the models' own limits).

    >>> schema_max_length(), schema_max_length(500), schema_max_length("none"), schema_max_length(0)
    (1000, 500, None, None)
    """
    if value == "default":
        import os

        value = os.environ.get(SCHEMA_MAX_LENGTH_ENV)
        if value is None:
            return SCHEMA_MAX_LENGTH
        where = f"${SCHEMA_MAX_LENGTH_ENV}"
    else:
        where = "max_string_length"
    if value is None or (isinstance(value, str) and value.strip().lower() in _NO_CAP):
        return None
    try:
        cap = int(value)
    except (TypeError, ValueError):
        cap = -1
    if isinstance(value, bool) or cap < 0:
        raise ValueError(f"{where} must be a whole number of characters (0 or 'none': the tools' own limits), "
                         f"got {value!r}")
    return cap or None


def _cap_strings(schema: Any, cap: int) -> int:
    """Lower every ``maxLength`` in ``schema`` above ``cap`` to ``cap``, in place; the largest one lowered (0: none)."""
    lowered = 0
    if isinstance(schema, dict):
        limit = schema.get("maxLength")
        if isinstance(limit, int) and limit > cap:
            schema["maxLength"], lowered = cap, limit
        for value in schema.values():
            lowered = max(lowered, _cap_strings(value, cap))
    elif isinstance(schema, list):
        for value in schema:
            lowered = max(lowered, _cap_strings(value, cap))
    return lowered


def tool_schema(cls: type[Tool], *, max_string_length: int | str | None = "default") -> dict[str, Any]:
    """OpenAI function-calling schema of one tool (``{"type": "function", "function": {...}}``); string
    limits capped as in :func:`tool_schemas`."""
    params = cls.model_json_schema()
    params.pop("title", None)
    params.pop("description", None)
    cap = schema_max_length(max_string_length)
    for name, prop in params.get("properties", {}).items():
        prop.pop("title", None)
        limit = _cap_strings(prop, cap) if cap is not None else 0
        if limit:
            note = (f"At most {cap:,} characters in this schema (the tool accepts up to {limit:,})."
                    + (" " + _LONG_TEXT[cls.name, name] if (cls.name, name) in _LONG_TEXT else ""))
            prop["description"] = f"{prop['description']} {note}" if prop.get("description") else note
    doc = " ".join((cls.__doc__ or "").split())
    return {"type": "function", "function": {"name": cls.name, "description": doc, "parameters": params}}


def tool_schemas(names: typing.Iterable[str] | None = None, *,
                 max_string_length: int | str | None = "default") -> list[dict[str, Any]]:
    """Schemas of all tools (or of ``names``), ready for ``tools=`` of a chat completion.

    Every string ``maxLength`` is capped at ``max_string_length`` (default :data:`SCHEMA_MAX_LENGTH`,
    1,000, or ``$RSIGYM_SCHEMA_MAX_LENGTH``) so that grammar-constrained decoders (llama.cpp, xgrammar,
    outlines, llguidance) compile them; a capped field's description says so and what the tool accepts
    (validation keeps the models' limits). ``max_string_length=None`` gives the models' own limits.

    >>> [s["function"]["name"] for s in tool_schemas(["wait", "submit"])]
    ['wait', 'submit']
    >>> [tool_schemas(["edit_harness"], max_string_length=n)[0]["function"]["parameters"]["properties"]["content"]
    ...  ["anyOf"][0]["maxLength"] for n in (None, 1000)]
    [200000, 1000]
    """
    wanted = TOOL_NAMES if names is None else tuple(names)
    cap = schema_max_length(max_string_length)
    return [tool_schema(TOOLS_BY_NAME[n], max_string_length=cap) for n in wanted]


# --------------------------------------------------------------------------------------------
# Gymnasium spaces derived from the same models


@functools.cache
def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _bounds(field: Any) -> tuple[float | None, float | None]:
    low = high = None
    for meta in field.metadata:
        low = getattr(meta, "ge", None) if getattr(meta, "ge", None) is not None else low
        low = getattr(meta, "gt", None) if getattr(meta, "gt", None) is not None else low
        high = getattr(meta, "le", None) if getattr(meta, "le", None) is not None else high
        high = getattr(meta, "lt", None) if getattr(meta, "lt", None) is not None else high
    return low, high


def _max_length(field: Any) -> int:
    for meta in field.metadata:
        if getattr(meta, "max_length", None) is not None:
            return min(int(meta.max_length), TEXT_MAX)
    return TEXT_MAX


def _is_optional(field: Any) -> bool:
    return _strip_optional(field.annotation) is not field.annotation


def field_space(field: Any) -> spaces.Space:
    """The Gymnasium space of one pydantic field (Literal → Discrete, int/float → Box, str → Text).

    An optional number gets one extra value below its range that stands for ``None``; an optional
    string uses ``""`` for ``None``.
    """
    ann = _strip_optional(field.annotation)
    origin = typing.get_origin(ann)
    if origin is Literal:
        return spaces.Discrete(len(typing.get_args(ann)))
    if ann is bool:
        return spaces.Discrete(2)
    if ann in (int, float):
        low, high = _bounds(field)
        dtype = np.int64 if ann is int else np.float64
        low = 0 if low is None else low
        low = low - 1 if _is_optional(field) else low
        high = (2**31 - 1 if ann is int else 1e9) if high is None else high
        return spaces.Box(low=low, high=high, shape=(), dtype=dtype)
    if ann is str:
        return spaces.Text(max_length=_max_length(field), min_length=0, charset=CHARSET)
    if origin is list and typing.get_args(ann) == (str,):  # fixed slots; "" marks an empty slot
        slots = next((m.max_length for m in field.metadata if getattr(m, "max_length", None)), 8)
        return spaces.Tuple([spaces.Text(max_length=64, min_length=0, charset=CHARSET)] * slots)
    raise TypeError(f"no Gymnasium space for field type {ann!r}")


def tool_space(cls: type[Tool]) -> spaces.Dict:
    """The ``Dict`` subspace of one tool, one entry per argument."""
    return spaces.Dict({name: field_space(f) for name, f in cls.model_fields.items()})


def action_space(seed: int | None = None) -> spaces.OneOf:
    """``OneOf`` over every tool's subspace; element ``i`` is ``TOOLS[i]``."""
    return spaces.OneOf([tool_space(t) for t in TOOLS], seed=seed)


@dataclass(frozen=True)
class _FieldConverter:
    """How one field's space value becomes a Python argument (analysed once per field)."""

    choices: tuple[Any, ...] | None  # Literal choices (the space holds an index)
    none_below: float | None         # optional number: values below this stand for None
    optional_text: bool              # optional string: "" stands for None
    is_bool: bool

    @classmethod
    def of(cls, field: Any) -> "_FieldConverter":
        ann = _strip_optional(field.annotation)
        optional = _is_optional(field)
        return cls(
            choices=typing.get_args(ann) if typing.get_origin(ann) is Literal else None,
            none_below=_bounds(field)[0] if optional and ann in (int, float) else None,
            optional_text=optional and ann is str,
            is_bool=ann is bool,
        )

    def __call__(self, value: Any) -> Any:
        if isinstance(value, (np.ndarray, np.generic)):
            value = value.item()
        if self.choices is not None:
            index = int(value)
            if not 0 <= index < len(self.choices):
                raise ActionError("invalid_args", f"choice index {index} out of range")
            return self.choices[index]
        if self.none_below is not None and isinstance(value, (int, float)) and value < self.none_below:
            return None
        if self.optional_text and value == "":
            return None
        if self.is_bool:
            return bool(value)
        if isinstance(value, tuple):
            return [v for v in value if v != ""]
        return value


_CONVERTERS: dict[type[Tool], dict[str, _FieldConverter]] = {
    t: {name: _FieldConverter.of(f) for name, f in t.model_fields.items()} for t in TOOLS
}


def from_space_sample(sample: tuple[int, Any]) -> Tool:
    """Turn an element of :func:`action_space` into a tool (validated like any other action)."""
    index, values = sample
    if not 0 <= int(index) < len(TOOLS):
        raise ActionError("unknown_tool", f"tool index {index} out of range 0..{len(TOOLS) - 1}")
    cls = TOOLS[int(index)]
    if not isinstance(values, dict):
        raise ActionError("malformed_action", "a space sample is (tool index, {field: value})")
    converters = _CONVERTERS[cls]
    unknown = values.keys() - converters.keys()
    if unknown:
        raise ActionError("invalid_args", f"{cls.name}: unknown fields {sorted(unknown)}")
    return build_tool(cls, {k: converters[k](v) for k, v in values.items()})


def to_space_sample(tool: Tool) -> tuple[int, dict[str, Any]]:
    """Inverse of :func:`from_space_sample`: a tool as an element of :func:`action_space`.

    >>> from_space_sample(to_space_sample(Evaluate(k=2)))
    Evaluate(checkpoint='base', harness='latest', k=2, n_tasks=None)
    """
    index = TOOL_NAMES.index(tool.name)
    space = tool_space(type(tool))
    out: dict[str, Any] = {}
    for name, field in type(tool).model_fields.items():
        value = getattr(tool, name)
        sub = space[name]
        ann = _strip_optional(field.annotation)
        if typing.get_origin(ann) is Literal:
            out[name] = np.int64(typing.get_args(ann).index(value))
        elif isinstance(sub, spaces.Box):
            out[name] = np.asarray(sub.low if value is None else value, dtype=sub.dtype)  # low = None
        elif isinstance(sub, spaces.Tuple):
            out[name] = tuple(list(value or ()) + [""] * (len(sub) - len(value or ())))
        else:
            out[name] = "" if value is None else value
    return index, out
