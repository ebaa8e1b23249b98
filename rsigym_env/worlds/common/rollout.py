"""The rollout service of the local and the remote world: teacher data (the teachers are a back end) and dataset
transforms in the sandbox.

* ``generate_data``: the :class:`Teachers` back end writes the examples (the local world's: domain solvers behind
  its OpenAI-compatible server; the remote world's: catalog teachers over their endpoints); the service checks the
  call, draws the example stream from the world's seed and the dataset id, bills the tokens the teacher used (also
  when it stops half way: :class:`~rsigym_env.errors.WorkFailed`) and saves a chat JSONL dataset.
* ``transform_data``: ``filter`` / ``dedupe`` / ``mix`` / ``script`` run as a script in a fresh sandbox over the
  input datasets; its ``/data/out.jsonl`` streams into the dataset store.

>>> "filter" in TRANSFORM_PY and OUT_JSONL
'/data/out.jsonl'
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any, Iterator, Protocol

from ...errors import ActionError, WorkFailed
from ...prices import PriceList
from ...services import Billed, DatasetInfo, Quote, progress_reporter
from ...tools import GenerateData, TransformData
from .datasets import DatasetStore

TRANSFORM_TIMEOUT_S = 60.0


class Teachers(Protocol):
    """The teachers a world has (the back end :class:`RolloutService` is given)."""

    def answers(self, name: str) -> bool:
        """Whether teacher ``name`` answers in this world."""

    def worst_case(self, call: GenerateData) -> tuple[int, int, float]:
        """The most input and output tokens ``call`` can use, and its expected seconds."""

    def examples(self, call: GenerateData, stream: int) -> Iterator[tuple[dict[str, Any], int, int]]:
        """The call's examples in order, each as (dataset row, input tokens, output tokens it used); ``stream``
        seeds them (a function of the world's seed and the dataset id)."""


class Sandbox(Protocol):
    """What a transform needs of the sandbox service (:class:`~.sandbox.E2BSandboxService`)."""

    def quote_script(self, timeout_s: float) -> Quote: ...

    def run_script(self, command: str, inputs: Any = None, **kwargs: Any) -> Any: ...


class RolloutService:
    """The :class:`~rsigym_env.services.RolloutService`: ``teachers`` write data, ``sandbox`` runs transforms,
    ``store`` keeps the datasets; ``prices`` bills the teachers' tokens; ``seed``: the world's."""

    def __init__(self, *, teachers: Teachers, sandbox: Sandbox, store: DatasetStore, prices: PriceList, seed: int):
        self.teachers, self.sandbox, self.store, self.prices, self.seed = teachers, sandbox, store, prices, seed

    def _check(self, call: GenerateData) -> None:
        if call.teacher not in self.prices.teachers or not self.teachers.answers(call.teacher):
            known = ", ".join(t for t in self.prices.teachers if self.teachers.answers(t))
            raise ActionError("unknown_ref", f"no teacher {call.teacher!r} in this world; teachers: {known}")
        if call.source != "synthetic":
            raise ActionError("not_supported", "teachers answer synthetic prompts only (source='dev' would leak "
                                               "the dev split into training data)")

    def quote_generate(self, call: GenerateData) -> Quote:
        self._check(call)
        tokens_in, tokens_out, seconds = self.teachers.worst_case(call)
        return Quote(usd=self.prices.teacher_usd(call.teacher, tokens_in, tokens_out), seconds=seconds)

    def generate(self, call: GenerateData, dataset_id: str) -> Billed[DatasetInfo]:
        quote = self.quote_generate(call)
        start = time.monotonic()
        stream = int(hashlib.sha256(f"{self.seed}/{dataset_id}".encode()).hexdigest()[:8], 16)
        rows: list[dict[str, Any]] = []
        usage = [0, 0]
        report = progress_reporter()
        try:
            for row, tokens_in, tokens_out in self.teachers.examples(call, stream):
                usage[0] += tokens_in
                usage[1] += tokens_out
                report(self.prices.teacher_usd(call.teacher, *usage))
                rows.append(row)
            info = self.store.save_rows(dataset_id, rows, f"{call.teacher} x {call.n_examples} (synthetic)")
        except Exception as exc:  # the tokens served so far were used: bill them
            code = exc.code if isinstance(exc, ActionError) else "service_error"
            raise WorkFailed(code, f"generate_data stopped after {len(rows)} of {call.n_examples} examples: "
                                   f"{getattr(exc, 'message', None) or f'{type(exc).__name__}: {exc}'}",
                             cost_usd=min(quote.usd, self.prices.teacher_usd(call.teacher, *usage)),
                             seconds=time.monotonic() - start) from exc
        cost = min(quote.usd, self.prices.teacher_usd(call.teacher, *usage))
        return Billed[DatasetInfo](value=info, cost_usd=cost, seconds=time.monotonic() - start)

    def quote_transform(self, call: TransformData) -> Quote:
        for ref in call.datasets:
            self.store.path(ref)
        return self.sandbox.quote_script(TRANSFORM_TIMEOUT_S)

    def transform(self, call: TransformData, dataset_id: str) -> Billed[DatasetInfo]:
        if call.operation == "script" and not (call.script or "").strip():
            raise ActionError("invalid_args", "transform_data: operation 'script' needs a shell command in `script` "
                                              "that reads /data/in_*.jsonl and writes /data/out.jsonl")
        inputs: dict[str, bytes | str | Path] = {f"/data/in_{i}.jsonl": self.store.path(ref)
                                                 for i, ref in enumerate(call.datasets)}
        inputs["/app/transform.py"] = TRANSFORM_PY
        command = call.script if call.operation == "script" else f"python3 /app/transform.py {call.operation}"
        staging = self.store.staging(dataset_id)
        job = self.sandbox.run_script(command, inputs, timeout_s=TRANSFORM_TIMEOUT_S, save={OUT_JSONL: staging},
                                      max_save_bytes=self.store.room())

        def failed(code: str, why: str) -> WorkFailed:  # the script ran: its sandbox time is billed all the same
            staging.unlink(missing_ok=True)
            return WorkFailed(code, f"transform_data {call.operation}: {why}", cost_usd=job.cost_usd, seconds=job.seconds)

        if job.result.exit_code != 0:
            raise failed("script_failed", f"exit {job.result.exit_code}; "
                                          f"{(job.result.stderr or job.result.stdout or '')[-400:]}")
        if OUT_JSONL in job.refused:
            raise failed("dataset_too_large" if "bytes" in job.refused[OUT_JSONL] else "script_failed",
                         job.refused[OUT_JSONL])
        if OUT_JSONL not in job.saved:
            raise failed("script_failed", f"no {OUT_JSONL} written")
        try:
            info = self.store.ingest(dataset_id, staging, f"{call.operation}({', '.join(call.datasets)})")
        except ActionError as err:
            raise failed(err.code, err.message) from None
        return Billed[DatasetInfo](value=info, cost_usd=job.cost_usd, seconds=job.seconds)


OUT_JSONL = "/data/out.jsonl"
TRANSFORM_PY = '''\
"""filter | dedupe | mix over /data/in_*.jsonl -> /data/out.jsonl (runs inside the sandbox)."""
import glob, json, sys
op = sys.argv[1]
rows = [json.loads(l) for f in sorted(glob.glob("/data/in_*.jsonl")) for l in open(f) if l.strip()]
if op == "filter":
    rows = [r for r in rows if r.get("meta", {}).get("passed")]
elif op == "dedupe":
    seen, kept = set(), []
    for r in rows:
        key = json.dumps(r["messages"], sort_keys=True)
        if key not in seen:
            seen.add(key); kept.append(r)
    rows = kept
with open("/data/out.jsonl", "w") as out:
    for r in rows:
        out.write(json.dumps(r, sort_keys=True) + "\\n")
print(f"{op}: {len(rows)} rows")
'''


__all__ = ["OUT_JSONL", "RolloutService", "TRANSFORM_PY", "TRANSFORM_TIMEOUT_S", "Teachers"]
