"""The local world's training in a process of its own, so it shares no GIL with the evaluations beside it.

A training job and an evaluation often run at once (a researcher trains a checkpoint while it
evaluates the base model). In one process, the training's NumPy work and the evaluation's event
loop, Harbor and model server take turns on one GIL. :class:`TrainingProcess` runs each job in
``python -m rsigym_env.worlds.local.lm.train_worker`` instead: the worker runs exactly
:func:`~rsigym_env.worlds.common.training.run_supervised` over a
:class:`~.tinker_client.LocalServiceClient` on the same run directory, with the caller's BLAS thread
count, so its checkpoints are the same, byte for byte, as training in the caller's process; the
caller's ``LocalServiceClient`` (and the sampling workers) read them from that directory.

Each optimizer step's metrics come back as the worker makes them (progress, billing, cancellation:
``on_step`` raising stops the worker at once). A worker that dies is reported with what it had
trained (:class:`TrainingProcessDied`); the job's other work is untouched.

>>> TrainingProcess(Path("/nonexistent")).root_dir
PosixPath('/nonexistent')
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from ....errors import ActionError
from ...common.training import StepMetrics, SupervisedConfig, SupervisedResult
from . import model
from .inference_pool import read_frame, write_frame
from .tinker_client import register_bases, registered_bases


class TrainingProcessDied(RuntimeError):
    """The training worker ended without an answer (killed, out of memory); ``steps`` it had finished."""

    def __init__(self, message: str, steps: int):
        super().__init__(message)
        self.steps = steps


class TrainingProcess:
    """Run supervised training jobs over the checkpoints under ``root_dir``, each in a fresh worker process.

    ``process(config, dataset, on_step)`` has the signature of ``run_supervised`` given a service
    client: it returns the :class:`~rsigym_env.worlds.common.training.SupervisedResult` and raises
    what training raised (the training errors as themselves, others as ``RuntimeError`` naming
    their type)."""

    def __init__(self, root_dir: Path):
        self.root_dir = Path(root_dir)

    def __call__(self, config: SupervisedConfig, dataset: str | Path,
                 on_step: Callable[[StepMetrics], None] | None = None) -> SupervisedResult:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=env)
        steps = 0
        try:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                write_frame(proc.stdin, (str(self.root_dir), registered_bases(), model._THREADS, asdict(config),
                                         str(dataset)))
                proc.stdin.close()
            except BrokenPipeError:  # it died at once: reading says so
                pass
            while True:
                try:
                    kind, value = read_frame(proc.stdout)
                except EOFError:
                    code = proc.wait(10)
                    raise TrainingProcessDied(f"the training process died (exit status {code}) after {steps} "
                                              "optimizer steps", steps) from None
                if kind == "step":
                    steps += 1
                    if on_step is not None:
                        on_step(value)  # may raise (a cancelled job): the worker is stopped below
                elif kind == "done":
                    return value
                else:
                    raise _rebuild(value)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def _portable(exc: BaseException) -> tuple[Any, ...]:
    """``exc`` as the caller can raise it: pickled if it survives the trip unchanged, else its parts."""
    try:
        data = pickle.dumps(exc)
        back = pickle.loads(data)
        if type(back) is type(exc) and str(back) == str(exc) and getattr(back, "code", None) == getattr(exc, "code", None):
            return ("pickled", data)
    except Exception:  # noqa: BLE001 - not picklable: sent as its parts
        pass
    return ("parts", type(exc).__name__, getattr(exc, "code", None), str(exc))


def _rebuild(value: tuple[Any, ...]) -> BaseException:
    if value[0] == "pickled":
        return pickle.loads(value[1])
    _, kind, code, message = value
    return ActionError(code, message) if isinstance(code, str) else RuntimeError(f"{kind}: {message}")


def _main() -> None:
    """A worker: one job in on stdin, its steps and its result (or error) out on stdout."""
    from ...common.training import run_supervised
    from .tinker_client import LocalServiceClient

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames goes to the pipe
    root, bases, threads, config, dataset = read_frame(stdin)
    register_bases(bases)
    model.set_blas_threads(threads)
    service = LocalServiceClient(root_dir=root)
    try:
        result = run_supervised(service, SupervisedConfig(**config), dataset,
                                on_step=lambda metrics: write_frame(stdout, ("step", metrics)))
        answer: tuple[str, Any] = ("done", result)
    except Exception as exc:  # noqa: BLE001 - raised again in the caller
        answer = ("error", _portable(exc))
    finally:
        service.close("success")
    write_frame(stdout, answer)


if __name__ == "__main__":
    _main()


__all__ = ["TrainingProcess", "TrainingProcessDied"]
