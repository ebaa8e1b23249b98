"""The remote world: Tinker, OpenAI-compatible endpoints, Harbor and E2B, through the shared services of ``worlds/common``.

See ``docs/remote.md``. Importing this package does not import the SDKs' network clients; building a
:class:`~.world.RemoteWorld` checks credentials first.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "RemoteWorld":
        from .world import RemoteWorld

        return RemoteWorld
    raise AttributeError(name)


__all__ = ["RemoteWorld"]
