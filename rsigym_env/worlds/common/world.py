"""What the local and the remote world have the same way beyond the life cycle: datasets in a
:class:`~.datasets.DatasetStore` and checkpoints trained by a :class:`~.train.TinkerTrainService`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...services import DatasetInfo
from ..lifecycle import WorldLifecycle
from .datasets import DatasetStore
from .train import TinkerTrainService


class ServiceWorld(WorldLifecycle):
    """A world built from the shared services (``store`` and ``train`` are set by its constructor)."""

    store: DatasetStore
    train: TinkerTrainService

    @property
    def checkpoints(self) -> dict[str, str]:
        """Finished checkpoints: id -> sampler path (``tinker://.../sampler_weights/...``)."""
        return self.train.checkpoints

    def dataset_path(self, ref: str) -> Path:
        return self.store.path(ref)

    def save_dataset(self, dataset_id: str, rows: list[dict[str, Any]], origin: str) -> DatasetInfo:
        return self.store.save_rows(dataset_id, rows, origin)


__all__ = ["ServiceWorld"]
