"""A run's datasets on disk: chat JSONL files with their statistics, bounded in size, streamed.

Nothing here loads a whole dataset to answer a question about it: :meth:`DatasetStore.ingest`
validates a file line by line while computing the statistics a quote needs (examples, tokens,
tokens one training epoch bills), so quotes and reads of large datasets cost nothing extra.
Every dataset is at most ``max_bytes`` and ``max_rows``; all of a run's datasets together at
most ``max_total_bytes`` (the run's dataset quota). A refusal names the limit.

>>> import tempfile
>>> store = DatasetStore(Path(tempfile.mkdtemp()))
>>> info = store.save_rows("ds-1", [{"messages": [{"role": "user", "content": "hi"},
...                                              {"role": "assistant", "content": "hello"}]}], "demo")
>>> info.n_examples, info.tokens, store.meta("ds-1").train_tokens_per_epoch
(1, 7, 12)
>>> store.head("ds-1", 5)[0][:15]
'{"messages": [{'
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from rsigym_env.errors import ActionError
from rsigym_env.services import DatasetInfo

MAX_DATASET_BYTES = 64 << 20
MAX_DATASET_ROWS = 100_000
MAX_RUN_DATASET_BYTES = 1 << 30
MAX_LINE_BYTES = 1 << 20
PREVIEW_ROWS = 2


def count_tokens(text: str) -> int:
    """Tokens of a text as the local model bills them (its tokenizer is byte level)."""
    return len(text.encode())


@dataclass(frozen=True)
class StoredDataset:
    """A dataset on disk: its file, what the researcher is told about it, and what quotes need."""

    path: Path
    info: DatasetInfo
    bytes: int
    train_tokens_per_epoch: int


class _Stats:
    """Statistics accumulated one row at a time."""

    def __init__(self) -> None:
        self.rows = self.tokens = self.train_tokens = self.passed = 0
        self.preview: list[dict[str, Any]] = []

    def add(self, row: Any, line_no: int) -> None:
        messages = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"line {line_no}: every line must be an object with a non-empty 'messages' list")
        for m in messages:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ValueError(f"line {line_no}: each message is an object with string 'role' and 'content'")
            n = count_tokens(m["content"])
            self.tokens += n
            self.train_tokens += n + 2  # rendered length: the text and a few special tokens per message
        self.train_tokens += 1
        self.rows += 1
        self.passed += bool((row.get("meta") or {}).get("passed")) if isinstance(row.get("meta"), dict) else 0
        if len(self.preview) < PREVIEW_ROWS:
            self.preview.append({"messages": messages})

    def info(self, dataset_id: str, origin: str) -> DatasetInfo:
        stats = {"pass_rate": self.passed / self.rows} if self.rows else {}
        return DatasetInfo(id=dataset_id, n_examples=self.rows, tokens=self.tokens, origin=origin, stats=stats,
                           preview=self.preview)


class DatasetStore:
    """The datasets of one run under ``root`` (``<root>/<id>.jsonl``), with limits; safe across threads."""

    def __init__(self, root: Path, *, max_bytes: int = MAX_DATASET_BYTES, max_rows: int = MAX_DATASET_ROWS,
                 max_total_bytes: int = MAX_RUN_DATASET_BYTES):
        self.root = Path(root)
        self.max_bytes, self.max_rows, self.max_total_bytes = max_bytes, max_rows, max_total_bytes
        self._sets: dict[str, StoredDataset] = {}
        self._lock = threading.Lock()

    # ---- reading ----------------------------------------------------------------------------------

    def __contains__(self, ref: str) -> bool:
        return ref in self._sets

    def ids(self) -> list[str]:
        return list(self._sets)

    def meta(self, ref: str) -> StoredDataset:
        try:
            return self._sets[ref]
        except KeyError:
            raise ActionError("unknown_ref", f"no dataset {ref!r}; datasets: {', '.join(self._sets) or 'none yet'}") from None

    def path(self, ref: str) -> Path:
        return self.meta(ref).path

    def head(self, ref: str, n: int) -> list[str]:
        """The first ``n`` lines of a dataset (read lazily)."""
        out: list[str] = []
        with open(self.path(ref), encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    out.append(line.rstrip("\n"))
                    if len(out) >= n:
                        break
        return out

    @property
    def used_bytes(self) -> int:
        return sum(d.bytes for d in self._sets.values())

    def room(self) -> int:
        """How many bytes the next dataset may have (its own limit and what is left of the run's quota)."""
        return max(0, min(self.max_bytes, self.max_total_bytes - self.used_bytes))

    # ---- writing ----------------------------------------------------------------------------------

    def save_rows(self, dataset_id: str, rows: Iterable[dict[str, Any]], origin: str) -> DatasetInfo:
        """Write ``rows`` (one JSON object per line) as dataset ``dataset_id``; limits apply as for :meth:`ingest`."""
        staging = self._staging(dataset_id)
        with open(staging, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
        return self.ingest(dataset_id, staging, origin)

    def ingest(self, dataset_id: str, source: Path, origin: str) -> DatasetInfo:
        """Validate a chat JSONL file line by line, take it over as dataset ``dataset_id`` (the file is
        moved) and return its info. ``ActionError`` (``dataset_too_large`` / ``invalid_dataset``), with
        the file removed, if it breaks a limit or a line is not a chat."""
        source = Path(source)
        try:
            size = source.stat().st_size
            room = self.room() + (self._sets[dataset_id].bytes if dataset_id in self._sets else 0)
            if size > room:
                raise ActionError("dataset_too_large", self._too_large(size, room))
            stats = _Stats()
            with open(source, "rb") as fh:
                for line_no, line in enumerate(fh, 1):
                    if len(line) > MAX_LINE_BYTES:
                        raise ActionError("invalid_dataset", f"line {line_no} is longer than {MAX_LINE_BYTES:,} bytes")
                    if not line.strip():
                        continue
                    try:
                        stats.add(json.loads(line), line_no)
                    except (ValueError, UnicodeDecodeError) as exc:
                        raise ActionError("invalid_dataset", f"not chat JSONL: {exc}"[:300]) from None
                    if stats.rows > self.max_rows:
                        raise ActionError("dataset_too_large", f"a dataset holds at most {self.max_rows:,} examples")
            target = self.root / f"{dataset_id}.jsonl"
            with self._lock:  # an id given again replaces that dataset
                os.replace(source, target)
                self._sets[dataset_id] = StoredDataset(target, stats.info(dataset_id, origin), size, stats.train_tokens)
            return self._sets[dataset_id].info
        finally:
            source.unlink(missing_ok=True)

    def _staging(self, dataset_id: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        return self.root / f".{dataset_id}.staging"

    def staging(self, dataset_id: str) -> Path:
        """A host path to stream a dataset into before :meth:`ingest`."""
        return self._staging(dataset_id)

    def _too_large(self, size: int, room: int) -> str:
        if room < self.max_bytes:
            return (f"the dataset is {size:,} bytes but only {room:,} are left of the run's "
                    f"{self.max_total_bytes:,}-byte dataset quota")
        return f"the dataset is {size:,} bytes; a dataset holds at most {self.max_bytes:,}"


__all__ = ["DatasetStore", "MAX_DATASET_BYTES", "MAX_DATASET_ROWS", "MAX_RUN_DATASET_BYTES", "StoredDataset",
           "count_tokens"]
