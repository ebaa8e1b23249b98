"""The harness's bytecode compiled in a sandbox of the local world (``common.harness.bytecode``'s compiler).

The researcher's source is hostile: it is compiled by the sandbox's own ``python3`` in a bubblewrap sandbox
(no network, its own PID namespace, nothing of the host writable but the copy being compiled, shown as
``/app``; CPU, memory, process and time limits), once per harness version, never by a host process.
Importing :mod:`rsigym_env.worlds.local.sandbox` installs it (:func:`~..common.harness.bytecode.set_compiler`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ...common.harness import bytecode
from . import isolation

LIMITS = isolation.Limits(wall_s=60.0, cpu_s=30, memory_mb=1024, processes=16, output_bytes=1 << 16, file_mb=64)


def compile_harness(copy: Path, mount: str) -> None:
    """Compile every ``.py`` file of the harness copy ``copy`` (checked-hash ``.pyc``, recorded as under ``mount``).

    Raises :class:`~.isolation.IsolationUnavailable` where bubblewrap does not work (no bytecode then)."""
    result = isolation.run_isolated(["python3", "-I", "-S", "-c", bytecode.COMPILE_SCRIPT, isolation.APP, mount],
                                    workdir=copy, limits=LIMITS)
    if os.geteuid() == 0:  # the sandbox's uid was given the copy (isolation.claim): ours again, read-only to it
        for path in [copy, *copy.rglob("*")]:
            os.lchown(path, os.getuid(), os.getgid())
    if result.exit_code != 0:
        raise RuntimeError(f"the harness's compile failed: {result.stderr[-300:]}")


bytecode.set_compiler(compile_harness)

__all__ = ["LIMITS", "compile_harness"]
