"""What a run directory holds, by name, and how its step log is read.

One layout for every writer and reader: ``rsigym run`` and ``rsigym serve`` write it, the dashboard
(``rsigym watch``) and the trajectory export read it.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / STEPS_FILE).write_text('{"step": 1}\\n{"step": 2}\\n{"ste')  # a crash mid-write
>>> [s["step"] for s in read_steps(d / STEPS_FILE)]
[1, 2]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"            # who runs what: scenario, world, researcher, key (gateway runs)
STEPS_FILE = "steps.jsonl"       # one line per step: tool, arguments, observation, info
RESULT_FILE = "result.json"      # the episode's result, once it ended
RECORD_FILE = "record.jsonl"     # the dashboard's live record (append-only)
LEDGER_FILE = "ledger.sqlite"    # the run's ledger and audit chain
BRIEFING_FILE = "briefing.txt"   # what the researcher was told at reset
RESUMES_FILE = "resumes.jsonl"   # each time a served run was picked up again


def read_steps(path: str | os.PathLike[str], *, repair: bool = False) -> list[dict[str, Any]]:
    """The complete lines of a ``steps.jsonl`` (a torn last line, from a crash mid-write, is dropped;
    with ``repair`` it is also cut from the file so appending continues on a clean line)."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end < len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    return [json.loads(line) for line in data[:end].decode("utf-8").splitlines() if line.strip()]


__all__ = ["BRIEFING_FILE", "LEDGER_FILE", "RECORD_FILE", "RESULT_FILE", "RESUMES_FILE", "RUN_FILE", "STEPS_FILE",
           "read_steps"]
