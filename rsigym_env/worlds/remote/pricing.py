"""The remote world's prices: Tinker's ``models.json``, the teacher catalog, E2B's per-second rates.

Tinker publishes its price list as ``models.json`` (:data:`TINKER_MODELS_URL`): a JSON array of rows
``{"name", "tinker_id", "type", "arch", "size", "context", "prefill", "cached_prefill", "sample",
"train", "note"?}`` with prices as ``"$0.54"`` strings, dollars per million tokens. A copy is bundled
(``tinker_models.json``, provenance and date in ``tinker_models.meta.json``); ``rsigym prices refresh``
downloads the live file over it (or into ``$RSIGYM_HOME/prices``, which wins when present).

>>> rows = load_tinker_models()
>>> price = model_price("Qwen/Qwen3.5-35B-A3B-Base", rows)
>>> price.prefill, price.cached, price.sample, price.train
(0.54, 0.108, 1.335, 1.177)
>>> context_tokens("Qwen/Qwen3.5-35B-A3B-Base", rows)
65536
"""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from ...home import state_dir
from ...prices import ModelPrice, PriceList, SandboxPrice, TeacherPrice, model_price_from_tinker

TINKER_MODELS_URL = "https://tinker-docs.thinkingmachines.ai/tinker/models.json"
BUNDLED = Path(__file__).with_name("tinker_models.json")
BUNDLED_META = Path(__file__).with_name("tinker_models.meta.json")
E2B_RATES = SandboxPrice(vcpu_second=0.000014, gib_second=0.0000045)  # E2B's published per-second rates


def refreshed_path() -> Path:
    """Where ``rsigym prices refresh`` keeps the live copy (``$RSIGYM_HOME/prices/tinker_models.json``).

    State, not cache (:func:`rsigym_env.home.state_dir`): once present it decides what runs are billed."""
    return state_dir("prices", "tinker_models.json")


def price_source() -> tuple[Path, dict[str, Any]]:
    """The price file in use (a refreshed copy if there is one, else the bundled one) and its metadata."""
    live = refreshed_path()
    path = live if live.is_file() else BUNDLED
    meta_path = path.with_name("tinker_models.meta.json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return path, meta


def load_tinker_models(path: Path | None = None) -> list[dict[str, Any]]:
    """Rows of a ``models.json`` (default: :func:`price_source`); raises ``ValueError`` on a malformed file."""
    path = path or price_source()[0]
    rows = json.loads(Path(path).read_text())
    validate_rows(rows)
    return rows


def validate_rows(rows: Any) -> None:
    """Check ``rows`` has Tinker's ``models.json`` shape and parsable prices."""
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError("models.json must be a non-empty JSON array of objects")
    for r in rows:
        if not isinstance(r.get("tinker_id"), str) or not r["tinker_id"]:
            raise ValueError(f"a models.json row has no tinker_id: {r}")
        try:
            model_price_from_tinker(r)
        except (KeyError, ValueError) as exc:
            raise ValueError(f"models.json row {r.get('tinker_id')!r}: bad or missing price ({exc})") from None


def _row(model: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    for r in rows:
        if r["tinker_id"] == model:
            return r
    known = ", ".join(r["tinker_id"] for r in rows)
    raise KeyError(f"{model!r} is not in Tinker's price list ({known}); run `rsigym prices refresh` "
                   "or pick a listed model")


def model_price(model: str, rows: list[dict[str, Any]] | None = None) -> ModelPrice:
    """Tinker's rates for ``model`` (a ``tinker_id``); ``KeyError`` names the listed models."""
    return model_price_from_tinker(_row(model, rows if rows is not None else load_tinker_models()))


def context_tokens(model: str, rows: list[dict[str, Any]] | None = None) -> int:
    """The model's context length from its ``context`` column (``"64K"`` → 65536)."""
    text = str(_row(model, rows if rows is not None else load_tinker_models()).get("context", "32K")).strip().upper()
    scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
    return int(float(text[:-1] if text[-1:] in "KM" else text) * scale)


def remote_prices(model: str, teachers: Mapping[str, TeacherPrice], rows: list[dict[str, Any]] | None = None) -> PriceList:
    """The remote world's :class:`PriceList`: ``model`` at Tinker's rates, the teacher catalog, E2B."""
    path, meta = price_source()
    return PriceList(model=model, model_price=model_price(model, rows), teachers=dict(teachers), sandbox=E2B_RATES,
                     source=f"Tinker models.json ({path.name}, {meta.get('retrieved', 'undated')}), "
                            "teacher catalog (scenario), E2B per-second rates")


def refresh(url: str = TINKER_MODELS_URL, dest: Path | None = None, timeout_s: float = 30.0) -> Path:
    """Download Tinker's live ``models.json`` to ``dest`` (default :func:`refreshed_path`) with a dated metadata file.

    The file is validated before it replaces anything; returns its path.
    """
    dest = dest or refreshed_path()
    request = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "rsigym-env"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - a fixed https URL
        raw = response.read()
    rows = json.loads(raw)
    validate_rows(rows)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(raw)
    tmp.replace(dest)
    meta = {"source_url": url, "retrieved": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "method": "verbatim download (rsigym prices refresh)", "models": len(rows)}
    dest.with_name("tinker_models.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return dest


__all__ = ["BUNDLED", "E2B_RATES", "TINKER_MODELS_URL", "context_tokens", "load_tinker_models", "model_price",
           "price_source", "refresh", "refreshed_path", "remote_prices", "validate_rows"]
