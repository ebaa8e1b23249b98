"""The sandbox service of the local and the remote world: commands through the unchanged ``e2b`` SDK, against
whichever envd the back end gives (the local world's: its own envd servers over bubblewrap; the remote world's:
E2B's cloud).

:class:`E2BSandboxService` runs the researcher's ``sandbox_exec`` calls in the run's sandbox and
:meth:`~E2BSandboxService.run_script` (what ``transform_data`` needs) in a fresh private one with input files,
fetching output files back. Billing follows E2B's per-second rates (``PriceList.sandbox``): the quote is the
worst case, the bill the command's measured duration plus any idle time the back end's sandbox was billed
for before it (E2B bills a live sandbox every second; a local sandbox costs nothing idle).

>>> _wrapped("echo hi", 5)
"exec timeout -k 1 5 /bin/bash -c 'echo hi'"
"""

from __future__ import annotations

import shlex
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Protocol, Sequence

from e2b.exceptions import TimeoutException
from e2b.sandbox.commands.command_handle import CommandExitException

from ...prices import PriceList
from ...services import Billed, CommandResult, Quote
from ...tools import SandboxExec

KILL_GRACE_S = 1.0     # after the timeout, TERM; this much later, KILL
CLIENT_GRACE_S = 10.0  # the SDK's own deadline, beyond the command's
TIMEOUT_EXIT = 124     # coreutils timeout(1): the command ran out of time


class OutputTooLarge(Exception):
    """An output file of a script is larger than the caller allows (or not a regular file)."""


@dataclass(frozen=True)
class ScriptRun:
    """A finished :meth:`E2BSandboxService.run_script`: the command, the output files it left
    (path as requested → bytes; missing ones are absent), the ones streamed to host files
    (``saved``: path → bytes written; ``refused``: path → why not), its cost and duration.
    Unpacks as ``result, outputs``."""

    result: CommandResult
    outputs: dict[str, bytes]
    cost_usd: float
    seconds: float
    saved: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Any]:
        return iter((self.result, self.outputs))


@dataclass(frozen=True)
class Session:
    """The run's sandbox for one command: the ``e2b.Sandbox``-like object, the idle seconds billed before the
    command, and a note for the command's stderr (e.g. that the sandbox is a fresh one)."""

    sandbox: Any
    idle_s: float = 0.0
    note: str = ""


class SandboxBackend(Protocol):
    """Where the sandboxes are (the back end :class:`E2BSandboxService` is given)."""

    workdir: str | None   # the working directory of the run's commands (None: the sandbox's own)
    idle_s: float         # the most idle seconds a command can be billed for besides its own

    def session(self) -> AbstractContextManager[Session]:
        """The run's sandbox for one command (kept alive afterwards)."""

    def fresh(self, *, network: bool, limits: Any) -> AbstractContextManager[Any]:
        """A private sandbox for one script, gone afterwards; ``limits``: the back end's own (or ``None``)."""

    def close(self) -> None:
        """Stop the run's sandbox (safe to call twice)."""


def _wrapped(command: str, timeout_s: float) -> str:
    """``command`` under coreutils ``timeout`` (TERM at ``timeout_s``, KILL a second later), so a
    command that runs too long still returns its output and exit code 124."""
    return f"exec timeout -k {KILL_GRACE_S:g} {timeout_s:g} /bin/bash -c {shlex.quote(command)}"


def _in_sandbox(path: str) -> str:
    """A script's path as the sandbox sees it: relative paths are under ``/app``."""
    return path if path.startswith("/") else f"/app/{path}"


class E2BSandboxService:
    """The :class:`~rsigym_env.services.SandboxService` over the ``e2b`` SDK; ``backend`` says where the sandboxes
    are; ``prices``, ``vcpus`` and ``memory_gib`` the rates and the sandbox size seconds are billed at."""

    def __init__(self, backend: SandboxBackend, *, prices: PriceList, vcpus: float = 2.0, memory_gib: float = 2.0):
        self.backend = backend
        self.prices, self.vcpus, self.memory_gib = prices, vcpus, memory_gib

    def usd(self, seconds: float) -> float:
        """What ``seconds`` of this sandbox cost."""
        return self.prices.sandbox_usd(seconds, self.vcpus, self.memory_gib)

    # -- SandboxService ----------------------------------------------------------------------

    def quote(self, call: SandboxExec) -> Quote:
        """The worst case: the back end's idle period plus the whole ``timeout_s`` (the duration cannot be known
        before running)."""
        return Quote(usd=self.usd(self.backend.idle_s + call.timeout_s), seconds=float(call.timeout_s))

    def exec(self, call: SandboxExec) -> Billed[CommandResult]:
        """Run ``call.command`` with bash in ``/app``; bill its measured duration (at most ``timeout_s``) and the
        idle time before it."""
        with self.backend.session() as session:
            result = self._run(session.sandbox, call.command, call.timeout_s, cwd=self.backend.workdir)
        if session.note:
            result = result.model_copy(update={"stderr": session.note + result.stderr})
        seconds = min(result.duration_s, float(call.timeout_s)) + session.idle_s
        return Billed[CommandResult](value=result, cost_usd=min(self.usd(seconds), self.quote(call).usd),
                                     seconds=result.duration_s)

    def _run(self, sandbox: Any, command: str, timeout_s: float, cwd: str | None = None) -> CommandResult:
        start = time.monotonic()
        try:
            r: Any = sandbox.commands.run(_wrapped(command, timeout_s), cwd=cwd, timeout=timeout_s + CLIENT_GRACE_S)
        except CommandExitException as exc:
            r = exc
        except TimeoutException:
            duration = time.monotonic() - start
            return CommandResult(stdout="", stderr=f"[sandbox] wall-clock limit ({timeout_s:g} s) reached: "
                                 "the sandbox was killed\n", exit_code=TIMEOUT_EXIT, duration_s=duration)
        duration = time.monotonic() - start
        stdout, stderr, code = r.stdout or "", r.stderr or "", int(r.exit_code)
        if code in (TIMEOUT_EXIT, 128 + 9) and duration >= timeout_s:  # coreutils timeout: TERM (124), then KILL
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + \
                f"[sandbox] wall-clock limit ({timeout_s:g} s) reached: the command was killed\n"
        return CommandResult(stdout=stdout, stderr=stderr, exit_code=code, duration_s=duration)

    # -- scripts with files ------------------------------------------------------------------

    def quote_script(self, timeout_s: float) -> Quote:
        """Worst case of :meth:`run_script` with this timeout."""
        return Quote(usd=self.usd(timeout_s), seconds=float(timeout_s))

    def run_script(self, command: str, inputs: Mapping[str, bytes | str | Path] | None = None, *,
                   outputs: Sequence[str] = (), timeout_s: float = 600.0, limits: Any = None,
                   network: bool = False, save: Mapping[str, Path] | None = None,
                   max_save_bytes: int = 64 << 20) -> ScriptRun:
        """Run ``command`` in a fresh private sandbox holding ``inputs`` and fetch ``outputs`` back.

        Paths are the sandbox's: under ``/app`` (relative paths too) or under ``/data`` (a writable
        directory of the job); ``inputs`` values are contents or host files to copy in. The sandbox is
        gone afterwards. The cost is the command's measured duration (upload and download are free, as
        with E2B's file API). ``save`` maps sandbox paths to host files they are streamed into (never held
        in memory), each at most ``max_save_bytes`` (a larger one, or one that is not a regular file, is not
        saved: ``refused`` says why). ``limits``: the back end's per-command limits, if it has any.
        """
        with self.backend.fresh(network=network, limits=limits) as sandbox:
            for path, data in (inputs or {}).items():
                if isinstance(data, Path):
                    with open(data, "rb") as f:
                        sandbox.files.write(_in_sandbox(path), f)
                else:
                    sandbox.files.write(_in_sandbox(path), data)
            result = self._run(sandbox, command, timeout_s, cwd=self.backend.workdir)
            got: dict[str, bytes] = {}
            for path in outputs:
                if sandbox.files.exists(_in_sandbox(path)):
                    got[path] = bytes(sandbox.files.read(_in_sandbox(path), format="bytes"))
            saved, refused = self._save(sandbox, save or {}, max_save_bytes)
        seconds = min(result.duration_s, timeout_s)
        return ScriptRun(result=result, outputs=got, cost_usd=self.usd(seconds), seconds=result.duration_s,
                         saved=saved, refused=refused)

    @staticmethod
    def _save(sandbox: Any, save: Mapping[str, Path], limit: int) -> tuple[dict[str, int], dict[str, str]]:
        """Stream each sandbox file of ``save`` into its host file, refusing ones over ``limit`` bytes."""
        saved: dict[str, int] = {}
        refused: dict[str, str] = {}
        for path, target in save.items():
            try:
                if not sandbox.files.exists(path):
                    continue
                info = sandbox.files.get_info(path)
                if str(getattr(info.type, "value", info.type)) != "file":
                    raise OutputTooLarge(f"{path} is not a regular file")
                if info.size > limit:
                    raise OutputTooLarge(f"{path} is {info.size:,} bytes; at most {limit:,}")
                written = 0
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as fh:
                    for chunk in sandbox.files.read(path, format="stream"):
                        written += len(chunk)
                        if written > limit:  # it grew meanwhile
                            raise OutputTooLarge(f"{path} is over {limit:,} bytes")
                        fh.write(chunk)
                saved[path] = written
            except (OutputTooLarge, Exception) as exc:  # noqa: BLE001 - a bad output is reported, never fatal
                target.unlink(missing_ok=True)
                refused[path] = str(exc)[:300] if isinstance(exc, OutputTooLarge) else f"{type(exc).__name__}: {exc}"[:300]
        return saved, refused

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the back end's run sandbox (running commands are killed). Safe to call twice."""
        self.backend.close()

    def __enter__(self) -> "E2BSandboxService":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["E2BSandboxService", "OutputTooLarge", "SandboxBackend", "ScriptRun", "Session"]
