"""A random researcher: a uniformly random allowed tool with plausible random arguments.

Arguments refer to things that exist (datasets, checkpoints, harness lines), so its calls mostly run
and spend money; it submits a random candidate with a small probability each step. It is the floor a
learned or scripted researcher must beat.

>>> import gymnasium as gym, rsigym_env
>>> from rsigym_env.episode import run_episode
>>> env = gym.make("RSIGym/Joint-v0", benchmark="aime", budget_usd=100, max_steps=30)
>>> run_episode(env, RandomResearcher(), seed=1).steps <= 30
True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from rsigym_env.catalog import SIM_TEACHERS
from rsigym_env.tools import TOOL_NAMES

TOML_LINE = re.compile(r"^(\w+)\s*=\s*(.+?)\s*(#.*)?$")
VALUES = ("true", "false", '"stop"', '"continue"', "1024", "4096", "16384")


@dataclass
class RandomArgs:
    submit_probability: float = 0.05
    max_examples: int = 2000


class RandomResearcher:
    """Uniform over usable tools (the observation's ``action_mask``), random but well-formed arguments."""

    name = "random"

    def __init__(self, args: RandomArgs | None = None):
        self.args = args or RandomArgs()
        self.rng = np.random.default_rng()
        self.datasets: list[str] = []
        self.checkpoints: list[str] = ["base"]
        self.harness: list[str] = ["latest"]
        self.teachers: list[str] = []
        self.harness_text = ""

    def reset(self, observation: dict[str, Any], info: dict[str, Any], seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.datasets, self.checkpoints, self.harness = [], ["base"], ["latest", info.get("harness", "latest")]
        self.teachers = list(info.get("teachers", []))
        self.harness_text = ""

    def act(self, observation: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
        self._remember(observation, info)
        usable = [TOOL_NAMES[i] for i in np.flatnonzero(observation["action_mask"])]
        if "submit" in usable and self.rng.random() < self.args.submit_probability:
            return {"tool": "submit", "args": self._submit()}
        needs_data = {"transform_data", "train"} if not self.datasets else set()
        choices = [t for t in usable if t != "submit" and t not in needs_data]
        tool = self._pick(choices) if choices else "submit"
        return {"tool": tool, "args": getattr(self, "_" + tool)()}

    # ------------------------------------------------------------------ arguments per tool

    def _generate_data(self) -> dict[str, Any]:
        n = int(np.exp(self.rng.uniform(np.log(10), np.log(self.args.max_examples))))
        return {"teacher": self._pick(self.teachers or [SIM_TEACHERS[0]]), "n_examples": n,
                "source": self._pick(["synthetic", "dev"])}

    def _transform_data(self) -> dict[str, Any]:
        op = self._pick(["filter", "dedupe", "mix"])
        k = 2 if op == "mix" and len(self.datasets) > 1 else 1
        return {"operation": op, "datasets": list(self.rng.choice(self.datasets, size=k, replace=False))}

    def _train(self) -> dict[str, Any]:
        return {"dataset": self._pick(self.datasets), "base": self._pick(self.checkpoints),
                "learning_rate": float(np.exp(self.rng.uniform(np.log(1e-5), np.log(3e-3))))}

    def _infer(self) -> dict[str, Any]:
        return {"model": self._pick(self.checkpoints), "prompt": f"task:dev/{self.rng.integers(0, 30)}",
                "max_tokens": 2048}

    def _edit_harness(self) -> dict[str, Any]:
        lines = [m for m in map(TOML_LINE.match, self.harness_text.splitlines()) if m]
        if not lines:
            return {"path": "notes.md", "content": f"note {self.rng.integers(1000)}\n"}
        line = lines[self.rng.integers(len(lines))]
        return {"path": "harness.toml", "old": line.group(0), "new": f"{line.group(1)} = {self._pick(VALUES)}"}

    def _sandbox_exec(self) -> dict[str, Any]:
        return {"command": self._pick(["ls /data", "echo hello", "python3 -c 'print(1)'"]), "timeout_s": 30}

    def _evaluate(self) -> dict[str, Any]:
        return {"checkpoint": self._pick(self.checkpoints), "harness": self._pick(self.harness),
                "k": int(self.rng.integers(1, 4)), "n_tasks": int(self.rng.integers(5, 60))}

    def _read(self) -> dict[str, Any]:
        return {"ref": self._pick(["harness:latest/harness.toml", "artifacts", "budget", "jobs", *self.datasets])}

    def _wait(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ bookkeeping

    def _pick(self, options: list[str]) -> str:
        return str(options[self.rng.integers(len(options))])

    def _submit(self) -> dict[str, Any]:
        return {"checkpoint": self._pick(self.checkpoints), "harness": self._pick(self.harness)}

    def _remember(self, observation: dict[str, Any], info: dict[str, Any]) -> None:
        result = info.get("result") or {}
        if info.get("tool") in ("generate_data", "transform_data") and info.get("ok"):
            self.datasets.append(result["id"])
        if info.get("tool") == "edit_harness" and info.get("ok"):
            self.harness.append(result["version"])
        if info.get("tool") == "read" and info.get("ok") and result.get("ref", "").endswith("harness.toml"):
            self.harness_text = observation["log"].split("\n", 1)[-1]
        for event in info.get("events", []):
            if event.get("kind") == "train" and event.get("ok"):
                self.checkpoints.append(event["checkpoint"])
