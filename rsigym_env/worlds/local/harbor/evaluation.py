"""The local world's evaluations: the shared :class:`~rsigym_env.worlds.common.evaluation.HarborEvalService`
with every trial in a bubblewrap sandbox (:class:`~.environment.BubblewrapEnvironment`) and the model on the
evaluation's own unix socket, mounted into the agent phase only.

>>> BubblewrapTrials().cache_settings()
[None, []]
"""

from __future__ import annotations

import json
import stat
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ...common.evaluation import HarborEvalService
from ..sandbox import isolation
from .environment import IMPORT_PATH, SANDBOX_RECORD


@dataclass(frozen=True)
class BubblewrapTrials:
    """The :class:`~rsigym_env.worlds.common.evaluation.TrialEnvironment` of the local world: Harbor's job
    builds a :class:`~.environment.BubblewrapEnvironment` per trial (``kwargs``: its constructor keywords),
    billed from the sandbox record each one leaves in its trial directory."""

    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        if not isolation.bwrap_available():
            raise isolation.IsolationUnavailable(isolation.INSTALL_HINT)

    def config(self, sandboxes_dir: Path, memory_gib: float, idle_gate: str | None = None) -> Any:
        from harbor.models.trial.config import EnvironmentConfig

        return EnvironmentConfig(import_path=IMPORT_PATH, kwargs={"sandbox_dir": str(sandboxes_dir),
                                                                  "group_memory_mb": max(64, int(memory_gib * 1024)),
                                                                  **({"idle_gate": idle_gate} if idle_gate else {}),
                                                                  **self.kwargs})

    def trial_seconds(self, trial_dir: Path, result: Any) -> float:
        path = trial_dir / SANDBOX_RECORD
        try:
            if not stat.S_ISREG(path.lstat().st_mode):
                return 0.0
            return max(0.0, float(json.loads(path.read_text())["seconds"]))
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0

    def cache_settings(self) -> list[Any]:
        return [None, sorted(self.kwargs.items())]  # (the keys of evaluations cached before the back ends were split)

    def model_socket_dir(self) -> AbstractContextManager[Path]:
        return isolation.opaque_directory(prefix="rsigym-ev-")  # short: unix socket paths are limited to 108 bytes


class LocalEvalService(HarborEvalService):
    """:class:`~rsigym_env.worlds.common.evaluation.HarborEvalService` on bubblewrap trials, the model on a unix
    socket; ``environment_kwargs``: keywords of every trial's :class:`~.environment.BubblewrapEnvironment`."""

    def __init__(self, *, environment_kwargs: Mapping[str, Any] | None = None, **kwargs: Any):
        super().__init__(environment=BubblewrapTrials(dict(environment_kwargs or {})), **kwargs)


__all__ = ["BubblewrapTrials", "LocalEvalService"]
