"""``rsigym counterparts``: every provider's local counterpart on loopback, and the variables that point the
remote world (and the unchanged SDKs) at them.

=============================== ==========================================================================
variable                         what answers
=============================== ==========================================================================
``TINKER_BASE_URL``              :class:`~.tinker_api.TinkerCounterpart`: Tinker's ``/api/v1`` over the local
                                 model stack (the shipped base served as ``model_id``), and Tinker's
                                 OpenAI-compatible endpoint at ``…/oai/api/v1`` (inference, checkpoints by path)
``TINKER_API_KEY``               ``tml-`` + the token
``RSIGYM_TEACHER_BASE_URL``      an OpenAI-compatible server of the local world's teachers (``teacher-small``,
``RSIGYM_TEACHER_API_KEY``       ``teacher-large``), behind the token
``E2B_API_URL``                  :class:`~.e2b_api.E2BCounterpart`'s control plane
``E2B_SANDBOX_URL``              its sandbox proxy (bubblewrap sandboxes, the local envd)
``E2B_API_KEY``                  ``e2b_`` + the token
``RSIGYM_REMOTE_TASKS``          a directory of Harbor tasks (the local benchmark's, built here) for
                                 ``world_options.evaluation.dataset_path_env``
=============================== ==========================================================================

The token is fresh for every start unless given; everything listens on 127.0.0.1. With ``scenarios/remote/
remote-counterparts-aime.yaml`` the remote world runs offline (``docs/remote.md``)::

    rsigym counterparts --env-file /tmp/rsigym-cp.env &     # prints the exports too; Ctrl-C / SIGTERM stops it
    source /tmp/rsigym-cp.env
    rsigym run --scenario remote-counterparts-aime --dry-run
"""

from __future__ import annotations

import re
import secrets
import shutil
from pathlib import Path

from ..serving.asgi import ThreadedASGIServer
from ..serving.models import ModelRegistry
from ..serving.openai_server import UsageMeter, create_app
from . import DEFAULT_BASE, DEFAULT_BENCHMARK, DEFAULT_MODEL_ID
from .e2b_api import E2BCounterpart
from .tinker_api import TinkerCounterpart, bearer_guard



def build_tasks(benchmark: str, target: Path) -> Path:
    """The local benchmark's dev tasks as a Harbor dataset directory under ``target``.

    Their ``network_mode`` is made ``public``: a trial reaches the evaluation's model proxy over TCP (as trials in
    Harbor's docker, e2b or daytona environments do), which a task without network cannot."""
    from ..worlds.local import benchmarks

    built = benchmarks.resolve(benchmark).build(target / "build", splits=("dev",))["dev"]
    out = target / "dataset"
    if out.exists():
        shutil.rmtree(out)
    for task in sorted(p for p in built.iterdir() if (p / "task.toml").is_file()):
        shutil.copytree(task, out / task.name)
        toml = out / task.name / "task.toml"
        toml.write_text(re.sub(r'network_mode = "[a-z-]+"', 'network_mode = "public"', toml.read_text()))
    return out


class Counterparts:
    """The Tinker, OpenAI-compatible (teachers) and E2B counterparts under ``root``, sharing one token."""

    def __init__(self, root: str | Path, *, token: str | None = None, model_id: str = DEFAULT_MODEL_ID,
                 base: str = DEFAULT_BASE, benchmark: str = DEFAULT_BENCHMARK, host: str = "127.0.0.1",
                 require_isolation: bool = True, long_poll_s: float = 20.0):
        from ..worlds.local.teachers import TEACHERS

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.token = token or secrets.token_hex(16)
        self.model_id, self.benchmark = model_id, benchmark
        self.tinker = TinkerCounterpart(self.root / "tinker", {model_id: base}, api_key=f"tml-{self.token}",
                                        host=host, long_poll_s=long_poll_s)
        self.e2b = E2BCounterpart(self.root / "e2b", api_key=f"e2b_{self.token}", host=host,
                                  require_isolation=require_isolation)
        self.teacher_usage = UsageMeter()
        registry = ModelRegistry({name: make() for name, make in TEACHERS.items()})
        self._teachers = ThreadedASGIServer(bearer_guard(create_app(registry, 600.0, self.teacher_usage), self.token),
                                            host=host, port=0, name="teachers")
        self.tasks: Path | None = None

    def start(self) -> "Counterparts":
        self.tasks = build_tasks(self.benchmark, self.root / "tasks")
        self.tinker.start()
        self._teachers.start()
        self.e2b.start()
        return self

    def stop(self) -> None:
        """Stop every server and kill every sandbox (safe twice)."""
        self.e2b.stop()
        self._teachers.stop()
        self.tinker.close_sessions()
        self.tinker.stop()

    def __enter__(self) -> "Counterparts":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def environment(self) -> dict[str, str]:
        """The variables that point the remote world and the SDKs here."""
        return {"TINKER_BASE_URL": self.tinker.url, "TINKER_API_KEY": self.tinker.api_key,
                "RSIGYM_TEACHER_BASE_URL": f"{self._teachers.url}/v1", "RSIGYM_TEACHER_API_KEY": self.token,
                "E2B_API_URL": self.e2b.api_url, "E2B_SANDBOX_URL": self.e2b.sandbox_url,
                "E2B_API_KEY": self.e2b.api_key, "RSIGYM_REMOTE_TASKS": str(self.tasks or "")}


__all__ = ["Counterparts", "DEFAULT_BASE", "DEFAULT_BENCHMARK", "DEFAULT_MODEL_ID", "build_tasks"]
