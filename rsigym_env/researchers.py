"""The researcher layer as the recursive world sees it (:class:`rsigym_env.worlds.recursive.ports.Researchers`).

Specs come from :mod:`rsigym_env.agents`, inner episodes from :mod:`rsigym_env.sweep`; both are
imported when first used. ``import rsigym_env`` installs an instance, so the recursive world gets it
without importing anything above its layer.

>>> r = Researchers()
>>> r.target("scripted", None).kind
'scripted'
>>> ep = r.episode(r.target("scripted", None), "aime", 0, "joint", 100.0, "sim", None)
>>> r.scenario(ep).budget_usd, r.run_elsewhere([ep], ray=False)[0].ok
(100.0, True)
"""

from __future__ import annotations

from typing import Any, Sequence


class Researchers:
    """Researcher specs (the agent registry) and inner episodes (the sweep machinery)."""

    def target(self, name: str, inline: dict[str, Any] | None, registry: Any = None) -> Any:
        from .agents import AgentRegistry, AgentSpec

        if inline is not None:
            return AgentSpec.model_validate(inline)
        return (registry or AgentRegistry()).get(name)

    def from_files(self, files: dict[str, str]) -> Any:
        from .agents import AgentSpec, check_buildable

        spec = AgentSpec.from_files(files)
        check_buildable(spec)
        return spec

    def registry(self) -> Any:
        from .agents import AgentRegistry

        return AgentRegistry()

    def build(self, spec: Any) -> Any:
        from .agents import build_researcher

        return build_researcher(spec)

    def derived_from_files(self, files: dict[str, str], parent: str) -> Any:
        from .agents import AgentSpec

        improved = AgentSpec.from_files(files).model_copy(update={"parent": parent})
        return AgentSpec.model_validate(improved.model_dump())  # re-validate (the id comes from the content)

    def check(self, spec: Any) -> None:
        from .agents import check_buildable

        check_buildable(spec)

    def episode(self, spec: Any, benchmark: str, seed: int, track: str, budget_usd: float, world: str,
                max_steps: int | None) -> Any:
        from .sweep import EpisodeSpec

        return EpisodeSpec(spec.id, benchmark, seed, track, budget_usd, world, max_steps, agent_spec=spec.content())

    def scenario(self, episode: Any) -> Any:
        from .sweep import episode_scenario

        return episode_scenario(episode)

    def run_on(self, episode: Any, platform: Any, key: Any) -> Any:
        from .sweep import run_spec

        return run_spec(episode, platform=platform, key=key)

    def run_elsewhere(self, episodes: Sequence[Any], *, ray: bool) -> list[Any]:
        from . import sweep

        return sweep.sweep(list(episodes), local=False, num_cpus=2).records if ray else sweep.run_local(list(episodes))


def spec_id(files: dict[str, str]) -> str:
    """The :class:`~rsigym_env.agents.AgentSpec` id of a files view (``ValueError`` if it is no spec):
    the identity of :mod:`rsigym_env.archive`'s nodes, installed there by ``import rsigym_env``."""
    from .agents import AgentSpec

    return AgentSpec.from_files(files).id
