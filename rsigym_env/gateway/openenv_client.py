"""A typed OpenEnv client for :mod:`rsigym_env.gateway.openenv_server` (needs ``openenv-core``).

OpenEnv's own :class:`~openenv.core.env_client.EnvClient`, with this package's action, observation
and state models::

    from rsigym_env.gateway.openenv_client import RSIGymEnv
    from rsigym_env.gateway.openenv_server import ResearchAction

    with RSIGymEnv(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=0)
        print(result.observation.text)                       # the briefing
        result = env.step(ResearchAction(tool="evaluate", args={"k": 1}))
        result = env.step(ResearchAction(tool="submit"))
        print(result.done, result.reward)                    # True, the normalized gain

``GenericEnvClient`` (plain dicts, no install of this package) works as well.
"""

from __future__ import annotations

from typing import Any

from .openenv_server import ResearchAction, ResearchObservation, ResearchState

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
except ImportError as missing:  # the module imports without openenv-core; the client itself needs it
    _reason = str(missing)

    def RSIGymEnv(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - stands in for the class
        """Needs ``openenv-core``; raises ``ImportError`` saying so."""
        raise ImportError(f"RSIGymEnv needs OpenEnv's client: pip install openenv-core==0.3.* ({_reason})")

else:

    class RSIGymEnv(EnvClient[ResearchAction, ResearchObservation, ResearchState]):  # type: ignore[no-redef]
        """OpenEnv client of a research-run server; one WebSocket session is one run."""

        def _step_payload(self, action: ResearchAction | dict[str, Any]) -> dict[str, Any]:
            if isinstance(action, ResearchAction):
                return action.model_dump(exclude={"metadata"})
            return dict(action)

        def _parse_result(self, payload: dict[str, Any]) -> StepResult[ResearchObservation]:
            observation = ResearchObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                                              done=bool(payload.get("done", False)))
            return StepResult(observation=observation, reward=payload.get("reward"), done=observation.done)

        def _parse_state(self, payload: dict[str, Any]) -> ResearchState:
            return ResearchState(**payload)
