"""SKILL.md documents for agents that drive a run over HTTP, generated from the tool models.

``rsigym skills --out DIR`` writes one skill directory per tool (``rsigym-<tool>/SKILL.md``: what it
does, its arguments with type, default and bounds, its cost, a ``curl`` example against
``$RSIGYM_URL`` with ``$RSIGYM_RUN_KEY`` and the ``rsigym-call`` form) and an overview skill
(``rsigym/SKILL.md``: connecting, replies, status codes, jobs, the end of the episode) with the
standalone client ``rsigym/scripts/rsigym-call`` beside it. Everything comes from the pydantic
models, :class:`~rsigym_env.gateway.backend.ToolReply` and the REST status table, so the documents
cannot drift from the service; the copy shipped in ``skill_docs/`` is checked against a fresh
rendering by the tests (``rsigym skills --check DIR`` does the same for any directory).

>>> docs = render_skills()
>>> sorted(docs)[:3]
['rsigym-edit-harness/SKILL.md', 'rsigym-evaluate/SKILL.md', 'rsigym-generate-data/SKILL.md']
>>> docs["rsigym-evaluate/SKILL.md"].splitlines()[1]
'name: rsigym-evaluate'
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from ..tools import TOOLS, Tool, build_tool
from .backend import ToolReply
from .host import ASYNC_JOBS

SHIPPED = Path(__file__).with_name("skill_docs")
CLIENT_PATH = "rsigym/scripts/rsigym-call"

EXAMPLES: dict[str, dict[str, Any]] = {
    "generate_data": {"teacher": "claude-opus-5", "n_examples": 200},
    "transform_data": {"operation": "filter", "datasets": ["ds-1"]},
    "train": {"dataset": "ds-2", "num_epochs": 2},
    "infer": {"model": "ckpt-1", "prompt": "What is 17 * 23?", "max_tokens": 256},
    "edit_harness": {"path": "harness.toml", "old": "persistent = false", "new": "persistent = true"},
    "sandbox_exec": {"command": "ls -la /data", "timeout_s": 30},
    "evaluate": {"checkpoint": "ckpt-1", "k": 1, "n_tasks": 20},
    "read": {"ref": "job-1"},
    "wait": {},
    "submit": {"checkpoint": "ckpt-1", "harness": "latest"},
}
"""One example call per tool (validated against the tool's model whenever the documents are rendered)."""

_AS_JOB = ("On this service the call runs as a job: the reply names the job (`result.job`) and the dataset id it "
           "will make (`result.dataset`); `wait` for the job, then use the dataset. ") if ASYNC_JOBS else ""

NOTES: dict[str, str] = {
    "generate_data": _AS_JOB + "The allowed teachers are in the briefing (`rsigym-call observation`) and in "
                     "`read ref=scenario`.",
    "transform_data": _AS_JOB.strip(),
    "train": "The run's scenario may lock some fields (e.g. the data track locks learning_rate, num_epochs, "
             "lora_rank, batch_size): asking for another value is refused with `field_locked` (403).",
    "wait": "`rsigym-call wait` waits for whichever job ends first; `job=job-3` for one job. In the `sim` "
            "world time is simulated and `wait` returns at once. On worlds with a wall clock the "
            "service bounds every `wait` to 30 s (it passes `timeout_s=30` when you give none or more): when the "
            "reply says the job is still running, call `wait` again.",
    "read": "Long texts come in pages: `read ref=job-3@8000` continues at character 8000.",
    "submit": ("On this service the official evaluation runs as a job: the episode ends when it finishes (at once "
               "in `sim`; elsewhere `wait` until a reply has `done: true`). " if ASYNC_JOBS else "")
              + "The reply that ends the episode carries `reward` and `end` (official score, spend, ...); after it "
              "every tool call is refused with `episode_over` (409).",
}


def skill_name(tool: str) -> str:
    """``generate_data`` -> ``rsigym-generate-data``."""
    return "rsigym-" + tool.replace("_", "-")


def _doc(cls: type[Tool]) -> str:
    return " ".join((cls.__doc__ or "").split())


def _first_sentence(text: str) -> str:
    head, dot, _ = text.partition(". ")
    return head + ("." if dot or not head.endswith(".") else "")


def _type(prop: dict[str, Any]) -> str:
    if "anyOf" in prop:
        return " or ".join(_type(p) for p in prop["anyOf"])
    if "enum" in prop:
        return "one of " + ", ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"array of {_type(prop.get('items', {}))}"
    return str(kind)


def _bounds(prop: dict[str, Any]) -> str:
    parts: list[str] = []
    for p in [prop, *prop.get("anyOf", [])]:
        for key, fmt in (("minimum", "≥ {}"), ("exclusiveMinimum", "> {}"), ("maximum", "≤ {}"),
                         ("exclusiveMaximum", "< {}"), ("minLength", "at least {} characters"),
                         ("maxLength", "at most {} characters"), ("minItems", "at least {} items"),
                         ("maxItems", "at most {} items")):
            if key in p:
                parts.append(fmt.format(f"{p[key]:,}" if isinstance(p[key], int) else p[key]))
    return ", ".join(parts) or "-"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def arguments_table(cls: type[Tool]) -> str:
    """A Markdown table of a tool's arguments: name, type, required or default, bounds, description."""
    schema = cls.model_json_schema()
    required = set(schema.get("required", []))
    rows = ["| argument | type | required / default | bounds | description |", "|---|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        default = "required" if name in required else f"default `{json.dumps(prop.get('default'))}`"
        rows.append(f"| `{name}` | {_cell(_type(prop))} | {default} | {_cell(_bounds(prop))} | "
                    f"{_cell(prop.get('description', ''))} |")
    if len(rows) == 2:
        rows.append("| (none) | | | | |")
    return "\n".join(rows)


def _cost(cls: type[Tool]) -> str:
    doc = _doc(cls)
    said = doc[doc.index("Cost:"):] if "Cost:" in doc else ""
    if cls.paid:
        return (f"{said} ".lstrip() + "Paid: the worst case is reserved on the run's budget before the call runs "
                "(refused with `insufficient_budget`, HTTP 402, if it does not fit, and then it costs nothing); "
                "the actual cost is settled afterwards and the rest released. The reply's `cost_usd` says what "
                "it cost, `budget_left_usd` what is left.")
    if cls.name == "submit":
        return "The official evaluation is billed outside the run's budget, as in RSIGym; the call itself is free."
    return "Free (time may pass in the world's clock)." if cls.name == "wait" else "Free."


def _cli_value(value: Any) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, separators=(",", ":"))


def examples(cls: type[Tool]) -> tuple[str, str]:
    """The ``curl`` and ``rsigym-call`` forms of the tool's example call."""
    args = EXAMPLES[cls.name]
    build_tool(cls, args)  # an example that no longer fits the model fails here, loudly
    body = json.dumps(args)
    if "'" in body:
        raise ValueError(f"the {cls.name} example must not contain a single quote (it is shell-quoted)")
    curl = (f'curl -sS -X POST "$RSIGYM_URL/v1/tools/{cls.name}" \\\n'
            f'  -H "Authorization: Bearer $RSIGYM_RUN_KEY" -H "Content-Type: application/json" \\\n'
            f"  -d '{body}'")
    call = " ".join(["rsigym-call", cls.name, *(shlex.quote(f"{k}={_cli_value(v)}") for k, v in args.items())])
    return curl, call


def _front_matter(name: str, description: str) -> str:
    return f"---\nname: {name}\ndescription: {json.dumps(description, ensure_ascii=False)}\n---\n"


def tool_skill(cls: type[Tool]) -> str:
    """The SKILL.md of one tool."""
    doc = _doc(cls)
    curl, call = examples(cls)
    kind = "paid" if cls.paid else "free"
    description = (f"RSIGym tool `{cls.name}` ({kind}): {_first_sentence(doc)} Use it through $RSIGYM_URL "
                   f"with $RSIGYM_RUN_KEY; see the `rsigym` skill for replies and errors.")
    parts = [
        _front_matter(skill_name(cls.name), description),
        f"# `{cls.name}`\n",
        doc + "\n",
        "## Arguments\n",
        "The request body is a JSON object of these arguments (unknown ones are refused with `invalid_args`).\n",
        arguments_table(cls) + "\n",
        "## Cost\n",
        _cost(cls) + "\n",
        "## Call it\n",
        "```bash\n" + curl + "\n```\n",
        "or, with the client from the `rsigym` skill (values are JSON when they parse, else strings):\n",
        "```bash\n" + call + "\n```\n",
        "The reply is a JSON `ToolReply`; `text` is what to read. A refusal has `ok: false`, an `error` code and "
        "a `message`, costs nothing, and comes with an HTTP status (see the `rsigym` skill).\n",
    ]
    if NOTES.get(cls.name):
        parts += ["## Notes\n", NOTES[cls.name] + "\n"]
    return "\n".join(parts)


def overview_skill() -> str:
    """The SKILL.md of the ``rsigym`` skill: connecting, the tools, replies, status codes, jobs, the end."""
    from .rest import STATUS

    tools = ["| tool | what it does | cost | skill |", "|---|---|---|---|"]
    for cls in TOOLS:
        cost = "paid" if cls.paid else ("outside the budget" if cls.name == "submit" else "free")
        tools.append(f"| `{cls.name}` | {_cell(_first_sentence(_doc(cls)))} | {cost} | `{skill_name(cls.name)}` |")
    fields = ["| field | meaning |", "|---|---|"]
    for name, field in ToolReply.model_fields.items():
        fields.append(f"| `{name}` | {_cell(field.description or '')} |")
    by_status: dict[int, list[str]] = {}
    for code, status in STATUS.items():
        by_status.setdefault(status, []).append(f"`{code}`")
    codes = ["| HTTP | error codes |", "|---|---|", "| 200 | (none: the call ran) |"]
    codes += [f"| {status} | {', '.join(sorted(names))} |" for status, names in sorted(by_status.items())]
    codes.append("| 400 | any other refusal: `unknown_ref`, `no_running_jobs`, `harness_patch_failed`, "
                 "`not_supported`, `service_error`, ... |")
    description = ("Be the researcher of an RSIGym research run: improve a model and its harness on a benchmark "
                   "within a budget by calling the run's tools over HTTP ($RSIGYM_URL, $RSIGYM_RUN_KEY). Start "
                   "here: connecting, replies, errors, jobs, how the episode ends; one skill per tool (rsigym-<tool>).")
    return "\n".join([
        _front_matter("rsigym", description),
        "# An RSIGym research run\n",
        "You improve a *target system* (model weights + execution harness) on a benchmark. Every tool call is "
        "authorized against your run key and billed to the run's budget before it runs. The reward is the "
        "normalized gain `(final - initial) / (1 - initial)` of what you `submit`, measured on a held-out split "
        "you never see.\n",
        "## Connect\n",
        "* `$RSIGYM_URL`: the service (e.g. `http://127.0.0.1:8765`); `$RSIGYM_RUN_KEY`: your run key. Every "
        "request carries `Authorization: Bearer $RSIGYM_RUN_KEY`.",
        "* A tool call is `POST $RSIGYM_URL/v1/tools/<tool>` with the tool's arguments as a JSON object.",
        "* `scripts/rsigym-call` in this skill's directory is a client needing only Python >= 3.8 (where the "
        "package is installed it is also the `rsigym-call` command): "
        "`python3 scripts/rsigym-call TOOL NAME=VALUE ...` prints what you read and exits 1 on a refusal "
        "(the error code on stderr), 3 if the service cannot be reached; `--json` prints the whole reply; "
        "`TOOL -` reads the arguments as JSON from stdin; `NAME@=FILE` reads a value from a file.\n",
        "## Start\n",
        "```bash\n"
        'curl -sS "$RSIGYM_URL/v1/observation" -H "Authorization: Bearer $RSIGYM_RUN_KEY"   # the briefing is in "log"\n'
        "rsigym-call read ref=scenario                                                      # limits, teachers, locks\n"
        "rsigym-call read ref=harness:latest/harness.toml                                   # the harness files\n"
        "```\n",
        "Read-only views (not steps, free): `GET /v1/observation`, `GET /v1/balance` "
        "(`{budget_usd, spent_usd, reserved_usd, remaining_usd}`), `GET /v1/jobs`, `GET /v1/jobs/<id>`, "
        "`GET /v1/run`, `GET /v1/tools` (function-calling schemas of your tools); with the client: "
        "`rsigym-call balance | jobs | job ID | observation | run | tools`.\n",
        "## Tools\n",
        "\n".join(tools) + "\n",
        "## Replies\n",
        "Every tool call answers a JSON `ToolReply`, refused or not:\n",
        "\n".join(fields) + "\n",
        "## Status codes\n",
        "\n".join(codes) + "\n",
        "A refused tool call costs nothing and is audited. 401: no or wrong run key. 402: the call's worst case does not "
        "fit what is left (`GET /v1/balance`). 403: your key (the scenario's track) does not allow the tool, "
        "teacher or field. 410: the run was closed (idle for too long, or deleted) or interrupted.\n",
        "## Jobs and time\n",
        f"`train` and `evaluate`{' (here also `generate_data`, `transform_data` and `submit`)' if ASYNC_JOBS else ''} "
        "return a job id at once; the job runs while you do other things. `wait` lets "
        "the world's clock run until a job ends (`job=ID`, or any job); finished jobs appear in the reply's "
        "`events` and in `read ref=<job id>`. Every call also takes time in the world's clock, and the run has "
        "a time limit as well as a step limit and a budget.\n",
        "## The end\n",
        "`submit` (a checkpoint and a harness version) runs the official evaluation and ends the episode; the "
        "reply that ends it has `done: true`, `reward` and `end`. Running out of steps, time or money ends it too (the "
        "initial system then counts as submitted, reward 0). Afterwards every call is refused with "
        "`episode_over` (409).\n",
    ])


def render_skills() -> dict[str, str]:
    """Every document (relative path -> text), including the standalone client."""
    docs = {"rsigym/SKILL.md": overview_skill()}
    for cls in TOOLS:
        docs[f"{skill_name(cls.name)}/SKILL.md"] = tool_skill(cls)
    docs[CLIENT_PATH] = Path(__file__).with_name("client.py").read_text()
    return dict(sorted(docs.items()))


def write_skills(out: str | os.PathLike[str]) -> list[Path]:
    """Write the documents under ``out`` (the client executable); the paths written."""
    root = Path(out)
    written = []
    for rel, text in render_skills().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel == CLIENT_PATH:
            path.chmod(0o755)
        written.append(path)
    return written


def check_skills(directory: str | os.PathLike[str] = SHIPPED) -> list[str]:
    """Documents under ``directory`` that differ from a fresh rendering, are missing, or are extra."""
    root = Path(directory)
    fresh = render_skills()
    problems = [f"{rel}: {'missing' if not (root / rel).is_file() else 'differs'}"
                for rel, text in fresh.items() if not (root / rel).is_file() or (root / rel).read_text() != text]
    present = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()
    problems += [f"{rel}: not generated (stale?)" for rel in sorted(present - set(fresh))]
    return problems
