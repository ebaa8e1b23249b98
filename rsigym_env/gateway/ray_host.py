"""Runs in Ray actors: one :class:`~rsigym_env.gateway.host.RunHost` per actor, anywhere in a cluster.

``rsigym serve --ray ADDRESS`` makes the session service start each run as a :data:`RunActor` (the
same ``RunHost`` class, so a run behaves exactly as in-process) and talk to it through a
:class:`RayRunHandle`, which offers the host's methods synchronously. Actors hold no CPU
(``num_cpus=0``; sim calls are microseconds) and are spread over the cluster's nodes; each takes
up to ``max_concurrency`` calls at once (the run's own lock orders its steps). The run's files go
to its run directory on the actor's node: with more than one node, give the service a state
directory on a shared filesystem. An actor that dies (its node lost, killed) makes its run
``interrupted`` (``actor_lost``) with its held money released, as after a restart.
"""

from __future__ import annotations

import functools
from typing import Any

from .backend import ToolReply
from .host import RunHost, RunUnavailable

ACTOR_CONCURRENCY = 8


@functools.cache
def run_actor_class() -> Any:
    """``ray.remote(RunHost)`` with the service's options (built on first use; importing needs no Ray)."""
    import ray

    return ray.remote(num_cpus=0, max_concurrency=ACTOR_CONCURRENCY, max_restarts=0)(RunHost)


class RayRunHandle:
    """A :class:`RunHost` living in a Ray actor, called synchronously. A dead actor reads as a closed run."""

    def __init__(self, run_dir: str, meta: dict[str, Any], wait_cap_s: float):
        import ray

        self._ray = ray
        self.actor = run_actor_class().options(scheduling_strategy="SPREAD").remote(run_dir, meta, wait_cap_s)

    def _get(self, method: str, *args: Any) -> Any:
        try:
            return self._ray.get(getattr(self.actor, method).remote(*args))
        except (self._ray.exceptions.RayActorError, self._ray.exceptions.ActorDiedError) as exc:
            raise RunUnavailable("actor_lost", f"the run's Ray actor is gone ({type(exc).__name__})") from None
        except self._ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, RunUnavailable):
                raise RunUnavailable(cause.code, cause.message) from None
            raise

    def start(self, resume: bool) -> dict[str, Any]:
        return self._get("start", resume)

    def call(self, tool: str, args: dict[str, Any] | None = None) -> ToolReply:
        return self._get("call", tool, args)  # RunUnavailable("actor_lost") if the actor died

    def observation(self) -> dict[str, Any]:
        return self._get("observation")

    def balance(self) -> dict[str, float]:
        return self._get("balance")

    def jobs(self) -> list[dict[str, Any]]:
        return self._get("jobs")

    def job(self, job_id: str) -> dict[str, Any] | None:
        return self._get("job", job_id)

    def status(self) -> dict[str, Any]:
        return self._get("status")

    def close(self, code: str = "closed") -> dict[str, Any]:
        try:
            return self._get("close", code)
        finally:
            self.kill()

    def shutdown(self) -> None:
        try:
            self._get("shutdown")
        except Exception:  # stopping anyway
            pass
        finally:
            self.kill()

    def kill(self) -> None:
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone
            pass
