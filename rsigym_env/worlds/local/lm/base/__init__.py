"""The shipped base checkpoint ``rsigym-base`` (built by ``scripts/build_base_checkpoint.py``).

``weights.npz`` holds float16 weights (half the size); :func:`load_base` returns them as float32,
which the model computes in. ``manifest.json`` records the config, the pretraining recipe and
mixture, the weights' sha256 and the build time. ``tinker_client`` registers it as
``rsigym-base``, so ``LocalServiceClient().create_lora_training_client(base_model="rsigym-base")``
works in any process.

>>> manifest()["name"]
'rsigym-base'
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

BASE_DIR = Path(__file__).resolve().parent
NAME = "rsigym-base"


def manifest(directory: str | Path = BASE_DIR) -> dict[str, Any]:
    return json.loads((Path(directory) / "manifest.json").read_text())


def load_base(directory: str | Path = BASE_DIR, name: str = NAME, verify: bool = False) -> Any:
    """The checkpoint as a :class:`~..model.BaseModel` (float32 weights); ``verify`` checks the sha256."""
    from ..model import BaseModel, ModelConfig, load_npz
    from ....common.tokenizer import Tokenizer

    directory = Path(directory)
    meta = manifest(directory)
    path = directory / "weights.npz"
    if verify:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != meta["sha256"]["weights.npz"]:
            raise ValueError(f"{path}: sha256 {digest} does not match the manifest")
    params = {k: v.astype(np.float32) for k, v in load_npz(path).items()}
    return BaseModel(name, ModelConfig.from_dict(meta["config"]), params, Tokenizer.from_dict(meta["tokenizer"]))


__all__ = ["BASE_DIR", "NAME", "load_base", "manifest"]
