"""What a remote-world scenario says (``world_options``), the five benchmarks' Harbor datasets, and the
credentials a scenario needs.

>>> opts = RemoteOptions.model_validate({"base_model": "Qwen/Qwen3.5-35B-A3B-Base", "lora_rank": 32})
>>> opts.evaluation.environment, opts.inference_base_url().endswith("/oai/api/v1")
('docker', True)
>>> [c.variable for c in required_credentials(opts, ["claude-opus-5"], tools=["train", "evaluate"])]
['TINKER_API_KEY']
>>> sandbox = required_credentials(opts, [], tools=["sandbox_exec"]); sandbox[0].variable
'E2B_API_KEY'
>>> BENCHMARKS["terminal-bench-2"].dataset
'terminal-bench@2.0'
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field

from ...splits import SplitMode

DEFAULT_BASE_MODEL = "Qwen/Qwen3.5-35B-A3B-Base"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Endpoint(_Strict):
    """An OpenAI-compatible endpoint: ``base_url`` (or the variable holding it) and the variable holding its key."""

    base_url: str | None = None
    base_url_env: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = Field(300.0, gt=0)

    def resolved_url(self, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
        """``base_url``, else the variable ``base_url_env`` names (in ``environ``, default the process's), else ``default``."""
        env = os.environ if environ is None else environ
        return self.base_url or (env.get(self.base_url_env) if self.base_url_env else None) or default


class TeacherEndpoint(Endpoint):
    """A teacher in the catalog: its provider-side model id, endpoint, and per-token prices ($ per million)."""

    model: str | None = Field(None, description="The provider's model id (default: the teacher's name).")
    base_url_env: str | None = "RSIGYM_TEACHER_BASE_URL"
    api_key_env: str = "RSIGYM_TEACHER_API_KEY"
    input: float = Field(ge=0)
    output: float = Field(ge=0)


class EvalOptions(_Strict):
    """Harbor evaluation: environment type, tasks (a Harbor dataset or task directories), limits."""

    environment: str = Field("docker", description="Harbor EnvironmentType value (docker, e2b, daytona, modal, ...) "
                                                   "or a Harbor environment class as 'module:Class'")
    environment_kwargs: dict[str, Any] = Field(default_factory=dict)
    dataset: str | None = Field(None, description="Harbor dataset 'name@version' (registry) or 'org/name@ref' (hub).")
    dataset_path: str | None = Field(None, description="A local directory of Harbor task directories.")
    dataset_path_env: str | None = Field(None, description="The variable holding dataset_path (when that is unset).")
    tasks: dict[Literal["dev", "official"], str] | None = Field(None, description="Split directories given explicitly.")
    dev_fraction: float = Field(0.5, gt=0, lt=1, description="Share of the dataset's tasks in the dev split.")
    official_split: SplitMode = Field(
        "secret", description="secret: each episode splits dev/official afresh from the platform's split secret "
                              "(rsigym_env.splits); public: by split_seed, the same split every time.")
    split_seed: int = Field(0, description="The public split's seed (official_split: public).")
    concurrency: int = Field(4, ge=1)
    tokens_per_trial: int = Field(200_000, ge=1)
    agent_timeout_s: float = Field(1800.0, gt=0)
    verifier_timeout_s: float = Field(600.0, gt=0)
    model_host: str = Field("0.0.0.0", description="Where the evaluation's model proxy listens.")
    model_port: int = Field(0, ge=0, le=65535)
    model_url: str | None = Field(None, description="URL harnesses use to reach the proxy; '{port}' is filled in. "
                                                    "Default for docker: http://host.docker.internal:{port}/v1")

    def local_dataset(self, environ: Mapping[str, str] | None = None) -> str | None:
        """``dataset_path``, else the directory ``dataset_path_env`` names (None when neither is set)."""
        env = os.environ if environ is None else environ
        return self.dataset_path or ((env.get(self.dataset_path_env) or None) if self.dataset_path_env else None)


class SandboxOptions(_Strict):
    """E2B sandboxes: template, lifetime, idle keep-alive; concurrency comes from ``permissions.sandbox.max_sandboxes``."""

    template: str | None = None
    lifetime_s: int = Field(3600, ge=60, le=86_400, description="E2B timeout of each sandbox (its longest life).")
    idle_s: int = Field(300, ge=30, description="How long the run's sandbox lives after its last command.")


class RemoteOptions(_Strict):
    """``world_options`` of a remote-world scenario."""

    base_model: str = DEFAULT_BASE_MODEL
    lora_rank: int | None = Field(None, ge=1, le=256, description="Rank for train calls that do not name one.")
    renderer: str = Field("hf_chat_template", description="hf_chat_template (the model's own) or role_colon.")
    tinker_base_url: str | None = Field(None, description="Default: $TINKER_BASE_URL, else Tinker's production URL.")
    inference: Endpoint = Field(default_factory=lambda: Endpoint(api_key_env="TINKER_API_KEY"),
                                description="Inference endpoint for base and checkpoints (default: Tinker's "
                                            "OpenAI-compatible one).")
    teachers: dict[str, TeacherEndpoint] = Field(default_factory=dict)
    evaluation: EvalOptions = Field(default_factory=EvalOptions)
    sandbox: SandboxOptions = Field(default_factory=SandboxOptions)

    def tinker_url(self, environ: Mapping[str, str] | None = None) -> str:
        """The scenario's ``tinker_base_url``, else ``TINKER_BASE_URL`` (in ``environ``, default the process's), else
        Tinker's production URL (``tinker.lib.base_url``)."""
        from tinker.lib.base_url import DEFAULT_BASE_URL, resolve_base_url

        env = os.environ if environ is None else environ
        return resolve_base_url(self.tinker_base_url or env.get("TINKER_BASE_URL") or DEFAULT_BASE_URL)

    def inference_base_url(self, environ: Mapping[str, str] | None = None) -> str:
        """The inference endpoint: the scenario's, else Tinker's OpenAI-compatible endpoint."""
        return self.inference.resolved_url(environ=environ) or f"{self.tinker_url(environ)}/oai/api/v1"


@dataclass(frozen=True)
class RemoteBenchmark:
    """A paper benchmark and its official Harbor dataset (verify with ``rsigym run --world remote --dry-run``)."""

    id: str
    name: str
    dataset: str
    domain: str
    paper_tasks: int


# Dataset references: terminal-bench@2.0 appears in harbor 0.25's own sources; the others are the names
# public Harbor job configs use (registry at harbor.constants.DEFAULT_REGISTRY_URL). They could not be
# resolved against the registry from this offline machine: the dry run resolves them when online.
BENCHMARKS: dict[str, RemoteBenchmark] = {b.id: b for b in [
    RemoteBenchmark("swe-bench-verified", "SWE-bench Verified", "swebench-verified@1.0",
                    "fixing a bug in a real Python repository so its hidden tests pass", 100),
    RemoteBenchmark("terminal-bench-2", "Terminal-Bench 2.0", "terminal-bench@2.0",
                    "completing a task in a Linux terminal (files, services, builds)", 89),
    RemoteBenchmark("aime", "AIME 2024/2025", "aime@1.0", "competition mathematics with an integer answer", 60),
    RemoteBenchmark("gpqa-diamond", "GPQA Diamond", "gpqa-diamond@1.0",
                    "graduate-level multiple-choice science (biology, physics, chemistry)", 100),
    RemoteBenchmark("skillsbench", "SkillsBench", "benchflow/skillsbench@latest",
                    "real-world tasks that need a documented skill or tool (science, office, finance)", 37),
]}


@dataclass(frozen=True)
class Credential:
    """An environment variable a scenario needs, and what for."""

    variable: str
    purpose: str

    @property
    def present(self) -> bool:
        return bool(os.environ.get(self.variable))


HARBOR_ENV_CREDENTIALS: dict[str, tuple[str, ...]] = {
    "e2b": ("E2B_API_KEY",), "daytona": ("DAYTONA_API_KEY",), "runloop": ("RUNLOOP_API_KEY",),
}


def required_credentials(options: RemoteOptions, teachers: Iterable[str], tools: Iterable[str]) -> list[Credential]:
    """Every variable the scenario's allowed tools need, once each, in a stable order."""
    tools = set(tools)
    needed: list[Credential] = []

    def add(var: str, why: str) -> None:
        if var and all(c.variable != var for c in needed):
            needed.append(Credential(var, why))

    if tools & {"train"}:
        add("TINKER_API_KEY", "training on Tinker")
    if tools & {"infer", "evaluate", "submit"}:
        add(options.inference.api_key_env, f"inference at {options.inference_base_url()}")
    if tools & {"generate_data"}:
        for name in teachers:
            spec = options.teachers.get(name)
            if spec is not None:
                add(spec.api_key_env, f"teacher {name}")
                if spec.base_url is None and spec.base_url_env:
                    add(spec.base_url_env, f"teacher {name}'s endpoint")
    if tools & {"sandbox_exec", "transform_data"}:
        add("E2B_API_KEY", "E2B sandboxes")
    if tools & {"evaluate", "submit"}:
        for var in HARBOR_ENV_CREDENTIALS.get(options.evaluation.environment, ()):
            add(var, f"Harbor's {options.evaluation.environment} environment")
    return needed


def docker_available() -> bool:
    """Harbor's docker environment needs the docker CLI."""
    return shutil.which("docker") is not None


__all__ = ["BENCHMARKS", "Credential", "DEFAULT_BASE_MODEL", "Endpoint", "EvalOptions", "RemoteBenchmark",
           "RemoteOptions", "SandboxOptions", "TeacherEndpoint", "docker_available", "required_credentials"]
