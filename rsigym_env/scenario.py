"""Scenarios: what a run is allowed to do and with how much money and time.

A scenario is YAML validated by :class:`Scenario`. A file may ``extends:`` another (a path
relative to itself); keys of the child override the parent's, recursively for mappings. The
bundled scenarios live in ``scenarios/`` and are found by name. Under every scenario lie its
world's defaults (``scenarios/worlds/<world>.yaml``: budget, time, teachers), so a track taken to
another world gets that world's teachers:

>>> s = load_scenario("sim-data-aime-500")
>>> s.track, s.benchmark, s.budget_usd, s.permissions.train.lock["learning_rate"]
('data', 'aime', 500.0, 0.0003)
>>> load_scenario(track="harness", benchmark="gpqa-diamond", budget_usd=50).tools()
['infer', 'edit_harness', 'sandbox_exec', 'evaluate', 'read', 'wait', 'submit']
>>> load_scenario(world="local", benchmark="aime").permissions.teachers
['teacher-large', 'teacher-small']
"""

from __future__ import annotations

import argparse
import functools
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError, field_validator

from .catalog import SIM_TEACHERS, TRACKS
from .tools import TOOL_NAMES

Track = Literal["joint", "data", "harness"]

TRACK_TOOLS: dict[str, tuple[str, ...]] = {
    # Joint: weights and harness together. Data: weights only, the harness is fixed and the training
    # hyperparameters locked. Harness: the harness only (model, benchmark and sandbox services), as RSIGym.
    "joint": TOOL_NAMES,
    "data": ("generate_data", "transform_data", "train", "infer", "sandbox_exec", "evaluate", "read", "wait", "submit"),
    "harness": ("infer", "edit_harness", "sandbox_exec", "evaluate", "read", "wait", "submit"),
}
TRAIN_FIELDS = ("learning_rate", "num_epochs", "lora_rank", "batch_size", "lr_schedule", "base")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TrainPolicy(_Strict):
    """RSIGym's ``allow`` / ``lock`` for training fields.

    ``allow``: ``"*"`` (every field) or ``{field: true | [allowed values]}``; a field not allowed must
    stay at its default. ``lock``: ``{field: value}``; the value is forced, and asking for another is
    refused.
    """

    allow: Literal["*"] | dict[str, bool | list[Any]] = "*"
    lock: dict[str, Any] = Field(default_factory=dict)

    @field_validator("allow", "lock")
    @classmethod
    def _known_fields(cls, value: Any) -> Any:
        if isinstance(value, dict):
            unknown = set(value) - set(TRAIN_FIELDS)
            if unknown:
                raise ValueError(f"unknown training fields {sorted(unknown)}; known: {list(TRAIN_FIELDS)}")
        return value


class SandboxPolicy(_Strict):
    """Limits of the run's sandbox."""

    network: bool = False
    vcpus: float = Field(2.0, gt=0)
    memory_gib: float = Field(2.0, gt=0, description="Memory of one sandbox, all its processes together.")
    disk_gib: float = Field(1.0, gt=0, description="Disk quota of one sandbox (its files, all commands together).")
    processes: int = Field(256, ge=16, description="Processes and threads of one sandbox, all commands together.")
    max_sandboxes: int = Field(2, ge=1)
    timeout_s: int = Field(600, ge=1)


class Permissions(_Strict):
    """What the run's platform key may do."""

    tools: list[str] | None = Field(None, description="Allowed tools; default: the track's.")
    teachers: list[str] = Field(default_factory=lambda: list(SIM_TEACHERS))
    train: TrainPolicy = Field(default_factory=TrainPolicy)
    sandbox: SandboxPolicy = Field(default_factory=SandboxPolicy)

    @field_validator("tools")
    @classmethod
    def _known_tools(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (unknown := set(value) - set(TOOL_NAMES)):
            raise ValueError(f"unknown tools {sorted(unknown)}; known: {list(TOOL_NAMES)}")
        return value


class Scenario(_Strict):
    """One research setting: track, world, benchmark, money, time and permissions."""

    name: str = "custom"
    description: str = ""
    track: Track = "joint"
    world: str = "sim"
    benchmark: str = "swe-bench-verified"
    budget_usd: float = Field(500.0, gt=0)
    time_limit_h: float = Field(48.0, gt=0, description="Research time, in the world's clock.")
    max_steps: int = Field(200, ge=1, description="Tool calls per episode that run (refused calls use no step).")
    max_refusals: int | None = Field(None, ge=1, description="Refused calls per episode before it ends (they cost "
                                                             "nothing and use no step); default: max_steps.")
    official_k: int = Field(3, ge=1, le=8, description="Attempts per task in the official evaluation.")
    permissions: Permissions = Field(default_factory=Permissions)
    world_options: dict[str, Any] = Field(default_factory=dict)
    program_limits: dict[str, StrictInt | StrictFloat] = Field(default_factory=dict, description=(
        "What program researchers may use here (rsigym_env.programs.ProgramLimits fields; at most its LIMIT_BOUNDS; "
        "default: its defaults); a program spec's own limits may only be lower."))

    @property
    def refusal_limit(self) -> int:
        """Refused calls after which the episode ends (``max_refusals``, else ``max_steps``)."""
        return self.max_refusals if self.max_refusals is not None else self.max_steps

    def tools(self) -> list[str]:
        """Tools this scenario's key allows, in the canonical order."""
        tools = self.permissions.tools
        return list(_allowed_tools(self.track, None if tools is None else tuple(tools)))


@functools.cache
def _allowed_tools(track: str, tools: tuple[str, ...] | None) -> tuple[str, ...]:
    allowed = tools if tools is not None else TRACK_TOOLS[track]
    return tuple(t for t in TOOL_NAMES if t in allowed)


def scenario_dir() -> Path:
    """The directory of bundled scenarios."""
    return Path(str(resources.files("rsigym_env.scenarios")))


def list_scenarios() -> dict[str, Path]:
    """Bundled scenario names (file stem) → path, sorted; base files under ``tracks/`` excluded."""
    root = scenario_dir()
    return {p.stem: p for p in sorted(root.rglob("*.yaml")) if p.parent.name not in ("tracks", "worlds")}


def world_defaults(world: str) -> dict[str, Any]:
    """A world's defaults (``scenarios/worlds/<world>.yaml``: budget, time, teachers...), ``{}`` if it has none.

    >>> world_defaults("local")["permissions"]["teachers"]
    ['teacher-large', 'teacher-small']
    """
    path = scenario_dir() / "worlds" / f"{world}.yaml"
    return _read(path) if path.exists() else {}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if path in seen:
        raise ValueError(f"scenario {path} extends itself (cycle: {' -> '.join(map(str, seen))})")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"scenario {path} must be a mapping, got {type(data).__name__}")
    parent = data.pop("extends", None)
    if parent is not None:
        data = _merge(_read((path.parent / parent).resolve(), (*seen, path)), data)
    return data


def load_scenario(scenario: str | Path | None = None, **overrides: Any) -> Scenario:
    """Load a scenario by bundled name or path, then apply ``overrides`` (``None`` values are ignored).

    With no scenario, the track named in ``overrides`` (default joint) starts from its bundled base.
    Raises ``ValueError`` naming the file and the bad fields.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if scenario is None:
        track = overrides.get("track", "joint")
        path = scenario_dir() / "tracks" / f"{track}.yaml"
        if not path.exists():
            raise ValueError(f"unknown track {track!r}; tracks: {sorted(TRACK_TOOLS)}")
    else:
        path = Path(scenario)
        if not path.suffix:
            known = list_scenarios()
            if str(scenario) not in known:
                raise ValueError(f"unknown scenario {scenario!r}; `rsigym scenarios` lists the {len(known)} bundled ones")
            path = known[str(scenario)]
        if not path.exists():
            raise ValueError(f"scenario file {path} does not exist")
    data = _read(path.resolve())
    world = overrides.get("world", data.get("world", "sim"))
    data = _merge(world_defaults(world), {**data, "world": world})  # track < world < scenario < overrides
    if overrides:
        data = _merge(data, overrides)
        if scenario is None:
            budget = data.get("budget_usd")
            data["name"] = "-".join(str(p) for p in (data.get("world"), data.get("track"), data.get("benchmark"),
                                                      f"{budget:g}" if isinstance(budget, (int, float)) else None) if p)
        elif {"track", "benchmark", "budget_usd", "world"} & overrides.keys():
            data["name"] = f"{data.get('name', path.stem)}+overrides"
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"invalid scenario {path}: {exc}") from None


def add_scenario_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags that choose a scenario and override its world, benchmark, track, budget and steps
    (``rsigym run`` and every in-process surface share them)."""
    parser.add_argument("--scenario", help="bundled scenario name or YAML path (see `rsigym scenarios`)")
    parser.add_argument("--world", help="world (default: the scenario's, sim)")
    parser.add_argument("--benchmark", help="benchmark id, e.g. swe-bench-verified, aime")
    parser.add_argument("--track", choices=list(TRACKS), help="track (default: the scenario's)")
    parser.add_argument("--budget", type=float, help="budget in dollars")
    parser.add_argument("--max-steps", type=int, help="tool calls per episode")
