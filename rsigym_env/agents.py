"""The agent registry: researcher specs, versioned by content and stored durably.

A :class:`AgentSpec` says everything that makes a researcher what it is: its ``kind`` (``scripted``,
``llm``, ``rl``, ``random``, or an import path ``"package.module:Factory"``), ``model``, ``system_prompt``,
``tools``, ``skills``, ``memory``, ``params`` (the fields of the kind's ``...Args`` dataclass) and
``parent``, the id of the spec it was derived from. Its id is a hash of that content (``ag-`` + 16 hex
digits), so the id changes exactly when the content does.

A spec also has a **files view** (:meth:`AgentSpec.to_files` / :meth:`AgentSpec.from_files`):
``spec.json`` (kind, name, model, tools, parent), ``prompt.md``, ``params.toml``, ``skills/<name>.md``,
``memory/<name>.md``. In the recursive world (:mod:`rsigym_env.worlds.recursive`) those files are the target
system's harness, edited with ``edit_harness`` like any other harness.

:class:`AgentRegistry` keeps one JSON file per id under ``$RSIGYM_HOME/agents`` (default
``~/.rsigym/agents``); writes are atomic, so a registry survives restarts and concurrent writers.

>>> import tempfile
>>> reg = AgentRegistry(tempfile.mkdtemp())
>>> spec = builtin_spec("scripted").derive(params={"data_fraction": 0.6})
>>> agent_id = reg.register(spec)
>>> agent_id == spec.id and agent_id.startswith("ag-")
True
>>> reg.get(agent_id[:8]).params["data_fraction"], reg.get(agent_id).parent == builtin_spec("scripted").id
(0.6, True)
>>> build_researcher(reg.get(agent_id)).args.data_fraction
0.6
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import json
import math
import os
import re
import tempfile
import tomllib
import typing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator, model_validator

from .canonical import canonical_dumps
from .episode import Researcher
from .home import state_dir

KINDS = ("scripted", "llm", "rl", "random", "program")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PARAM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
ID = re.compile(r"^ag-[0-9a-f]{16}$")
CODE_FILE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\.py$")
CODE_MAX_BYTES = 512 * 1024  # all of a program's source together
Scalar = str | int | float | bool


class AgentSpec(BaseModel):
    """A researcher, completely described. ``id`` is the hash of all of it.

    >>> a = AgentSpec(kind="scripted", params={"k": 2})
    >>> a.id == AgentSpec(kind="scripted", params={"k": 2}).id, a.id == a.derive(params={"k": 3}).id
    (True, False)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(description="scripted | llm | rl | random | 'package.module:Factory'")
    name: str = Field("", description="A label for people (part of the content).")
    model: str | None = Field(None, description="Model name (LLM researchers).")
    system_prompt: str | None = Field(None, description="System prompt; None = the kind's default.")
    tools: list[str] | None = Field(None, description="Tools it may use (intersected with the scenario's); None = all.")
    skills: dict[str, str] = Field(default_factory=dict, description="Skill name -> text (Markdown).")
    memory: dict[str, str] = Field(default_factory=dict, description="Memory note name -> text, carried across episodes.")
    params: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict, description="Fields of the kind's Args dataclass.")
    code: dict[str, str] = Field(default_factory=dict, description="Program kind: Python source files (name.py -> text); "
                                                                   "researcher.py defines make_researcher(params).")
    limits: dict[str, StrictInt | StrictFloat] = Field(default_factory=dict, description="Program kind: ProgramLimits fields it "
                                     "asks for (at most what the scenario grants; rsigym_env.programs.ProgramLimits.parse).")
    parent: str | None = Field(None, description="Id of the spec this one was derived from.")

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in KINDS and not re.fullmatch(r"[\w.]+:[\w.]+", value):
            raise ValueError(f"kind must be one of {', '.join(KINDS)} or 'package.module:Factory', got {value!r}")
        return value

    @field_validator("skills", "memory")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not NAME.fullmatch(name):
                raise ValueError(f"skill/memory name {name!r} must match {NAME.pattern}")
        return value

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, v in value.items():
            if not PARAM.fullmatch(key):
                raise ValueError(f"parameter name {key!r} must be an identifier")
            for item in v if isinstance(v, list) else [v]:
                if isinstance(item, float) and not math.isfinite(item):
                    raise ValueError(f"parameter {key} must be finite, got {item}")
        return value

    @field_validator("code")
    @classmethod
    def _code(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not CODE_FILE.fullmatch(name):
                raise ValueError(f"code file name {name!r} must match {CODE_FILE.pattern} (flat, a Python module)")
        size = sum(len(text.encode()) for text in value.values())
        if size > CODE_MAX_BYTES:
            raise ValueError(f"a program's code may hold {CODE_MAX_BYTES} bytes, got {size}")
        return value

    @model_validator(mode="after")
    def _program(self) -> "AgentSpec":
        if self.kind == "program" and "researcher.py" not in self.code:
            raise ValueError("a program spec needs code/researcher.py (defining make_researcher(params))")
        if self.kind != "program" and (self.code or self.limits):
            raise ValueError(f"only the program kind carries code and limits; kind is {self.kind!r}")
        if self.limits:
            from .programs import ProgramLimits

            ProgramLimits.parse(self.limits, ceiling=ProgramLimits.bounds())  # in bounds; the scenario's grant: at build
        return self

    @field_validator("parent")
    @classmethod
    def _parent(cls, value: str | None) -> str | None:
        if value is not None and not ID.fullmatch(value):
            raise ValueError(f"parent must be an agent id like 'ag-0123456789abcdef', got {value!r}")
        return value

    # ------------------------------------------------------------------ identity

    def content(self) -> str:
        """Canonical JSON of the whole spec: what the id hashes."""
        data = self.model_dump(mode="json")
        for name in ("code", "limits"):
            if not data[name]:
                del data[name]  # specs without code (or limits) hash as they did before programs (or limits) existed
        return canonical_dumps(data)

    @property
    def id(self) -> str:
        return "ag-" + hashlib.sha256(self.content().encode()).hexdigest()[:16]

    def derive(self, **changes: Any) -> "AgentSpec":
        """A child spec: ``changes`` applied (``params`` merged), ``parent`` set to this spec's id."""
        data = self.model_dump()
        if "params" in changes:
            data["params"] = {**data["params"], **changes.pop("params")}
        data["parent"] = self.id
        data.update(changes)
        return AgentSpec.model_validate(data)

    # ------------------------------------------------------------------ files view

    def to_files(self) -> dict[str, str]:
        """The spec as harness files (see the module docstring).

        >>> sorted(AgentSpec(kind="llm", system_prompt="Be careful.", skills={"triage": "..."}).to_files())
        ['params.toml', 'prompt.md', 'skills/triage.md', 'spec.json']
        """
        head = {"kind": self.kind, "name": self.name, "model": self.model, "tools": self.tools, "parent": self.parent}
        if self.limits:
            head["limits"] = self.limits
        files = {"spec.json": json.dumps(head, indent=1, ensure_ascii=False) + "\n", "params.toml": dump_toml(self.params)}
        if self.system_prompt is not None:
            files["prompt.md"] = self.system_prompt
        files |= {f"skills/{k}.md": v for k, v in self.skills.items()}
        files |= {f"memory/{k}.md": v for k, v in self.memory.items()}
        files |= {f"code/{k}": v for k, v in self.code.items()}
        return files

    @classmethod
    def from_files(cls, files: dict[str, str]) -> "AgentSpec":
        """Parse the files view; ``ValueError`` naming the file and what is wrong."""
        if "spec.json" not in files:
            raise ValueError("spec.json is missing")
        try:
            head = json.loads(files["spec.json"])
        except json.JSONDecodeError as exc:
            raise ValueError(f"spec.json is not valid JSON: {exc}") from None
        if not isinstance(head, dict):
            raise ValueError("spec.json must be a JSON object")
        unknown = set(head) - {"kind", "name", "model", "tools", "parent", "limits"}
        if unknown:
            raise ValueError(f"spec.json: unknown keys {sorted(unknown)} (known: kind, name, model, tools, parent, limits)")
        try:
            params = tomllib.loads(files.get("params.toml", ""))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"params.toml does not parse: {exc}") from None
        skills, memory, code = {}, {}, {}
        for path, text in files.items():
            folder, _, rest = path.partition("/")
            if folder in ("skills", "memory") and rest.endswith(".md") and "/" not in rest:
                (skills if folder == "skills" else memory)[rest[:-3]] = text
            elif folder == "code" and "/" not in rest:
                code[rest] = text
            elif path not in ("spec.json", "params.toml", "prompt.md"):
                raise ValueError(f"unexpected file {path!r}; a spec has spec.json, params.toml, prompt.md, "
                                 "skills/<name>.md, memory/<name>.md and code/<name>.py")
        try:
            return cls(**head, params=params, system_prompt=files.get("prompt.md"), skills=skills, memory=memory, code=code)
        except Exception as exc:
            raise ValueError(f"invalid spec: {exc}") from None


def dump_toml(params: dict[str, Any]) -> str:
    """TOML for scalar (and list-of-scalar) parameters, written by ``tomli_w``; ``tomllib.loads``
    gives them back (``TypeError`` for a value TOML has no form for, e.g. ``None``).

    >>> text = dump_toml({"k": 3, "data_fraction": 0.4, "name": 'a "b"', "on": True, "xs": [1, 2]})
    >>> tomllib.loads(text) == {"k": 3, "data_fraction": 0.4, "name": 'a "b"', "on": True, "xs": [1, 2]}
    True
    >>> print(dump_toml({"k": 3, "name": "df55"}), end="")
    k = 3
    name = "df55"
    """
    return tomli_w.dumps(params)


# ---------------------------------------------------------------------------------- built-in specs


def _args_class(kind: str) -> type | None:
    from . import baselines

    return {"scripted": baselines.ScriptedArgs, "llm": baselines.LLMArgs, "rl": baselines.RLResearcherArgs,
            "random": baselines.RandomArgs}.get(kind)


def builtin_spec(name: str) -> AgentSpec:
    """The spec of a bundled researcher with its default parameters.

    >>> builtin_spec("scripted").params["data_fraction"]
    0.4
    """
    if name == "program":
        return seed_program()
    cls = _args_class(name)
    if cls is None:
        raise ValueError(f"no bundled researcher {name!r}; bundled: {', '.join(KINDS)}")
    params = {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}
    prompt = None
    if name == "llm":
        prompt = params.pop("system_prompt")
        params = {k: v for k, v in params.items() if k not in ("model", "base_url", "api_key", "transcript")}
    params = {k: v for k, v in params.items() if v is not None and v != ""}
    return AgentSpec(kind=name, name=name, params=params, system_prompt=prompt)


def seed_program() -> AgentSpec:
    """The bundled seed program (``rsigym_env/programs/seed/*.py``): the scripted researcher written as
    a stdlib program whose strategy is editable code, and the improver it becomes on a spec harness.

    >>> spec = seed_program()
    >>> spec.kind, "researcher.py" in spec.code, spec.id == builtin_spec("program").id
    ('program', True, True)
    """
    from importlib import resources

    folder = resources.files("rsigym_env.programs") / "seed"
    code = {f.name: f.read_text(encoding="utf-8") for f in sorted(folder.iterdir(), key=lambda f: f.name)
            if CODE_FILE.fullmatch(f.name)}
    return AgentSpec(kind="program", name="scripted-program", code=code)


def make_args(cls: type, params: dict[str, Any]) -> Any:
    """``cls(**params)`` with the field types checked (ints stay ints; a float field takes an int).

    >>> from rsigym_env.baselines import ScriptedArgs
    >>> make_args(ScriptedArgs, {"k": 2}).k
    2
    >>> make_args(ScriptedArgs, {"k": "two"})
    Traceback (most recent call last):
    ValueError: parameter k must be int, got 'two'
    """
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(params) - known
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)} for {cls.__name__}; known: {', '.join(sorted(known))}")
    for key, value in params.items():
        allowed = typing.get_args(hints[key]) or (hints[key],)
        allowed = tuple(t for t in allowed if isinstance(t, type))
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            continue
        if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed)):
            raise ValueError(f"parameter {key} must be {' or '.join(t.__name__ for t in allowed)}, got {value!r}")
    return cls(**params)


class SpecResearcher:
    """A researcher built from a spec: limits the tools it is offered to ``spec.tools``; ``name`` is the id."""

    def __init__(self, spec: AgentSpec, inner: Researcher):
        self.spec, self.inner, self.name = spec, inner, spec.id

    @property
    def args(self) -> Any:
        return getattr(self.inner, "args", None)

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        if self.spec.tools is not None and "tools" in info:
            info = {**info, "tools": [t for t in info["tools"] if t in self.spec.tools]}
        self.inner.reset(observation, info, seed=seed)

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any:
        return self.inner.act(observation, info)

    def close(self) -> None:
        """Release what the researcher holds (a program's sandbox goes back to its pool)."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class ScriptedAgent:
    """The ``scripted`` kind built from a spec: the scripted researcher on an ordinary harness, the
    scripted improver when the harness is a researcher spec. Parameters ``improve_<x>`` go to
    :class:`~rsigym_env.worlds.recursive.improver.ImproverArgs` (as ``x``), the others to :class:`~rsigym_env.baselines.ScriptedArgs`."""

    name = "scripted"

    def __init__(self, params: dict[str, Any]):
        from .baselines import ScriptedArgs, ScriptedResearcher
        from .worlds.recursive.improver import ImproverArgs, ScriptedImprover

        improve = {k[len("improve_"):]: v for k, v in params.items() if k.startswith("improve_")}
        research = {k: v for k, v in params.items() if not k.startswith("improve_")}
        self.args = make_args(ScriptedArgs, research)
        self.improve_args = make_args(ImproverArgs, improve)
        self.researcher = ScriptedResearcher(self.args)
        self.improver = ScriptedImprover(self.improve_args)
        self.active: Any = self.researcher

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        is_spec = re.search(r"^Harness h-\w+: files .*\bspec\.json\b", observation["log"], re.M) is not None
        self.active = self.improver if is_spec else self.researcher
        self.active.reset(observation, info, seed=seed)

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> Any:
        return self.active.act(observation, info)


def build_researcher(spec: AgentSpec, *, scenario: Any = None, **overrides: Any) -> SpecResearcher:
    """A fresh researcher that behaves as ``spec`` says. ``overrides`` are extra Args fields not part of
    the content (e.g. ``transcript=`` or an LLM endpoint). A program runs with the limits its spec asks
    for, within what ``scenario``'s ``program_limits`` grant (default: the :class:`ProgramLimits` defaults).

    For ``llm``, ``system_prompt`` gets the skills and memory appended as Markdown sections. A
    ``scripted`` spec whose harness is a researcher spec (the recursive world) acts as the scripted
    improver (:class:`rsigym_env.worlds.recursive.improver.ScriptedImprover`, parameters prefixed ``improve_``).
    """
    cls = _args_class(spec.kind)
    if spec.kind == "program":
        from .programs import ProgramLimits, ProgramResearcher

        granted = ProgramLimits.parse(getattr(scenario, "program_limits", None), ceiling=ProgramLimits.bounds())
        limits = ProgramLimits.parse(spec.limits, granted)
        return SpecResearcher(spec, ProgramResearcher(spec.code, dict(spec.params) | overrides, name=spec.id,
                                                      limits=limits))
    if spec.kind == "scripted":
        return SpecResearcher(spec, ScriptedAgent(dict(spec.params)))
    if cls is None:
        module, _, attr = spec.kind.partition(":")
        factory = getattr(importlib.import_module(module), attr)
        return SpecResearcher(spec, factory(**spec.params, **overrides) if spec.params or overrides else factory())
    params: dict[str, Any] = dict(spec.params) | overrides
    if spec.kind == "llm":
        from .baselines.llm_researcher import SYSTEM_PROMPT

        prompt = spec.system_prompt if spec.system_prompt is not None else SYSTEM_PROMPT
        sections = [f"\n## Skill: {k}\n{v}" for k, v in spec.skills.items()]
        sections += [f"\n## Memory: {k}\n{v}" for k, v in spec.memory.items()]
        params["system_prompt"] = prompt + "".join(sections)
        if spec.model is not None:
            params.setdefault("model", spec.model)
    args = make_args(cls, params)
    from . import baselines

    inner = {"llm": baselines.LLMResearcher, "rl": baselines.RLResearcher, "random": baselines.RandomResearcher}[spec.kind]
    return SpecResearcher(spec, inner(args))


def check_buildable(spec: AgentSpec) -> None:
    """Raise ``ValueError`` if ``spec`` cannot be turned into a researcher (bad parameters, unknown kind;
    a program's files must compile — they are not run here: programs run only in their sandbox)."""
    if spec.kind == "program":
        for name, text in spec.code.items():
            try:
                compile(text, f"code/{name}", "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                raise ValueError(f"code/{name} does not compile: {exc}") from None
        return
    build_researcher(spec)


# ---------------------------------------------------------------------------------- the registry


def rsigym_home() -> Path:
    """``$RSIGYM_HOME`` or ``~/.rsigym`` (:func:`rsigym_env.home.state_dir`)."""
    return state_dir()


class AgentRegistry:
    """Content-addressed specs on disk: ``<root>/<id>.json`` = ``{"id", "spec", "registered_at", "note"}``.

    Registering the same content twice is a no-op that returns the same id (the first registration's
    time and note stay). Ids can be given by any unique prefix of at least 5 characters, or as the
    name of a bundled researcher (``scripted`` etc., registered on first use).
    """

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else rsigym_home() / "agents"
        self.root.mkdir(parents=True, exist_ok=True)

    def register(self, spec: AgentSpec, note: str = "") -> str:
        path = self.root / f"{spec.id}.json"
        if not path.exists():
            record = {"id": spec.id, "spec": spec.model_dump(mode="json"), "note": note,
                      "registered_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w") as fh:
                json.dump(record, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        return spec.id

    def _load(self, path: Path) -> dict[str, Any]:
        record = json.loads(path.read_text())
        spec = AgentSpec.model_validate(record["spec"])
        if spec.id != record["id"] or path.stem != spec.id:
            raise ValueError(f"{path}: stored content does not hash to its id (edited by hand?)")
        return record | {"spec": spec}

    def resolve(self, ref: str) -> str:
        """A full id from an id, a unique prefix, or a bundled researcher's name."""
        if ref in KINDS:
            return self.register(builtin_spec(ref), note="bundled")
        if (self.root / f"{ref}.json").exists():
            return ref
        if len(ref) < 5 or not ref.startswith("ag-"):
            raise KeyError(f"unknown agent {ref!r}: give an id 'ag-...' (or a unique prefix) or one of {', '.join(KINDS)}")
        matches = [p.stem for p in self.root.glob(f"{ref}*.json")]
        if len(matches) != 1:
            raise KeyError(f"agent {ref!r}: {'no' if not matches else len(matches)} registered ids match"
                           + (f" ({', '.join(sorted(matches)[:5])})" if matches else "; `rsigym agents list` shows them"))
        return matches[0]

    def get(self, ref: str) -> AgentSpec:
        return self._load(self.root / f"{self.resolve(ref)}.json")["spec"]

    def record(self, ref: str) -> dict[str, Any]:
        return self._load(self.root / f"{self.resolve(ref)}.json")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Every record, oldest first."""
        records = [self._load(p) for p in self.root.glob("ag-*.json")]
        return iter(sorted(records, key=lambda r: (r["registered_at"], r["id"])))

    def __contains__(self, agent_id: object) -> bool:
        return isinstance(agent_id, str) and (self.root / f"{agent_id}.json").exists()

    def lineage(self, ref: str) -> list[str]:
        """The id and its ancestors that are registered, newest first."""
        out, spec = [], self.get(ref)
        while True:
            out.append(spec.id)
            if spec.parent is None or spec.parent not in self or spec.parent in out:
                return out
            spec = self.get(spec.parent)


def diff_specs(a: AgentSpec, b: AgentSpec) -> str:
    """A unified diff of the two specs' files views ('' when they are the same).

    >>> print(diff_specs(AgentSpec(kind="scripted", params={"k": 3}), AgentSpec(kind="scripted", params={"k": 2})))
    --- a/params.toml
    +++ b/params.toml
    @@ -1 +1 @@
    -k = 3
    +k = 2
    <BLANKLINE>
    """
    fa, fb = a.to_files(), b.to_files()
    out = []
    for path in sorted(fa.keys() | fb.keys()):
        left = fa.get(path, "").splitlines(keepends=True)
        right = fb.get(path, "").splitlines(keepends=True)
        if left != right:
            out += difflib.unified_diff(left, right, f"a/{path}" if path in fa else "/dev/null",
                                        f"b/{path}" if path in fb else "/dev/null", lineterm="\n")
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def spec_from_ref(ref: str, registry: AgentRegistry | None = None) -> AgentSpec:
    """A spec from a registered id/prefix, a bundled name, a spec JSON file, or a directory of spec files."""
    path = Path(ref)
    if path.is_dir():
        files = {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}
        return AgentSpec.from_files(files)
    if path.suffix == ".json" and path.is_file():
        data = json.loads(path.read_text())
        return AgentSpec.model_validate(data.get("spec", data))
    return (registry or AgentRegistry()).get(ref)


__all__ = ["AgentRegistry", "AgentSpec", "SpecResearcher", "build_researcher", "builtin_spec", "check_buildable",
           "diff_specs", "dump_toml", "make_args", "rsigym_home", "seed_program", "spec_from_ref"]
