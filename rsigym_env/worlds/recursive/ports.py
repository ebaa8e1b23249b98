"""What the recursive world needs from the layers above it, as protocols it is handed.

The recursive world parses researcher specs and runs inner episodes with researchers, but worlds sit
below the researchers (the layering rule of :mod:`rsigym_env.worlds`): nothing here imports
:mod:`rsigym_env.agents` or :mod:`rsigym_env.sweep`, not even lazily. The package root
(:mod:`rsigym_env`) installs the implementation, :class:`rsigym_env.researchers.Researchers`, with
:func:`use_researchers` when it is imported; a caller may pass its own to the world or to
:func:`~.measure.measure`.

>>> researchers() is not None  # installed by ``import rsigym_env``
True
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence


class Researchers(Protocol):
    """Researcher specs and inner episodes, for the recursive world."""

    def target(self, name: str, inline: dict[str, Any] | None, registry: Any = None) -> Any:
        """The spec ``inline`` describes, else the one ``name`` names (a registered id or prefix, or a bundled name)."""

    def from_files(self, files: dict[str, str]) -> Any:
        """The spec a harness's files describe; ``ValueError`` (or a validation error) if it is not buildable."""

    def registry(self) -> Any:
        """The agent registry (``get``, ``register``)."""

    def build(self, spec: Any) -> Any:
        """A fresh researcher that behaves as ``spec`` says."""

    def derived_from_files(self, files: dict[str, str], parent: str) -> Any:
        """The spec a harness's files describe, with ``parent`` (its id computed from that content)."""

    def check(self, spec: Any) -> None:
        """Raise if ``spec`` cannot be built into a researcher."""

    def episode(self, spec: Any, benchmark: str, seed: int, track: str, budget_usd: float, world: str,
                max_steps: int | None) -> Any:
        """One inner episode: ``spec`` as the researcher of ``benchmark`` with ``seed`` (hashable fields
        ``benchmark``, ``seed``, ``track``, ``budget_usd``, ``world``, ``max_steps``)."""

    def scenario(self, episode: Any) -> Any:
        """The scenario ``episode`` runs in (what a sub-key for it is bound to)."""

    def run_on(self, episode: Any, platform: Any, key: Any) -> Any:
        """Run ``episode`` here, every call billed to ``key`` of ``platform``; its record (never raises)."""

    def run_elsewhere(self, episodes: Sequence[Any], *, ray: bool) -> list[Any]:
        """Run ``episodes`` on platforms of their own (Ray tasks with ``ray``); their records."""


class OuterEpisode(Protocol):
    """One outer episode of the recursive world played to its end, its env still open: what a round reads
    (the harness versions, the world's train measurements, the end ``info``), then closes it (:meth:`close`)."""

    env: Any                 # the episode's gym env (``env.unwrapped.run``, ``env.unwrapped.harness_files``)
    reward: float            # the outer reward (the normalized gain of the validation index)
    steps: int
    info: dict[str, Any]     # the end ``info``: submitted, spend_usd, dev_evaluations, best_dev_score, metrics
    attempts: list[Any]      # tampering attempts the improver's sandbox recorded (none for an outside agent)

    def close(self) -> None:
        """Release the env (and whatever played it)."""


class EpisodePlayer(Protocol):
    """An improver that plays each round's outer episode itself instead of being a researcher spec run in
    this process: e.g. an outside agent driving a session of the session service over MCP or REST
    (:class:`rsigym_env.gateway.recursion.AgentImprover`). ``id`` names it in the archive and the report.
    :func:`~.rounds.recurse` judges what it submits exactly as a program improver's submission."""

    id: str

    def play(self, scenario: Any, seed: int, context: dict[str, Any] | None = None) -> OuterEpisode:
        """Play one outer episode of ``scenario`` (whose target is the round's parent) with outer seed
        ``seed`` to its end (submit, or out of steps or money); raise if it does not end (e.g. a timeout).
        ``context`` says where the episode stands in the run (``{"chain": <chain seed>, "round": r}``), so that
        a player that keeps memory can keep it per chain (chains must stay independent)."""


def is_player(improver: Any) -> bool:
    """Does ``improver`` play its outer episodes itself (an :class:`EpisodePlayer`, not a spec)?

    >>> class Agent:
    ...     id = "agent:x"
    ...     def play(self, scenario, seed): ...
    >>> is_player(Agent()), is_player(object())
    (True, False)
    """
    return callable(getattr(improver, "play", None)) and isinstance(getattr(improver, "id", None), str)


_INSTALLED: list[Researchers] = []


def use_researchers(impl: Researchers) -> None:
    """Install the implementation the recursive world uses when it is given none."""
    _INSTALLED[:] = [impl]


def researchers() -> Researchers:
    """The installed implementation (``RuntimeError`` if nothing installed one)."""
    if not _INSTALLED:
        raise RuntimeError("no researchers installed for the recursive world; import rsigym_env first")
    return _INSTALLED[0]
