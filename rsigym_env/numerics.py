"""The same arithmetic on every machine: which OpenBLAS kernels the local world's model uses.

OpenBLAS picks its matrix kernels by the CPU it runs on, and kernels sum in different orders: the
same seed gave different samples on an AVX-512 machine (OpenBLAS's ``SkylakeX`` kernels) than on the
AVX2 machines the recorded results were made on (``Haswell``; ``Zen`` uses the same kernels). Every
result of the local world (samples, checkpoints, dev and official scores, the evaluation cache) is
a function of that arithmetic, so the package asks OpenBLAS for the ``Haswell`` kernels on every
x86-64 CPU that has them (AVX2 and FMA), before NumPy loads it: :func:`pin_blas_core` runs first thing
when ``rsigym_env`` is imported and sets ``OPENBLAS_CORETYPE``, which every process the package
starts inherits (sampling and training workers). A value the user set is kept. On other CPUs nothing
is pinned and results are those of the machine's own kernels.

When NumPy was loaded before ``rsigym_env`` with other kernels, the setting reaches only the processes
started afterwards: :func:`blas_core_is_pinned` says whether this process computes with the pinned
kernels (the local world then trains in a process of its own).

This module imports nothing that loads NumPy.

>>> pinned_core({"avx2", "fma", "sse2"}, "x86_64"), pinned_core({"avx2"}, "x86_64"), pinned_core({"asimd"}, "aarch64")
('Haswell', None, None)
"""

from __future__ import annotations

import os
import platform
from typing import MutableMapping

CORE_ENV = "OPENBLAS_CORETYPE"
CANONICAL_CORE = "Haswell"  # the kernels of the recorded results; what OpenBLAS picks on AVX2 machines


def cpu_flags() -> set[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def pinned_core(flags: set[str], machine: str) -> str | None:
    """The OpenBLAS core type to pin on a CPU with ``flags`` (None: leave OpenBLAS its own choice)."""
    if machine.lower() in ("x86_64", "amd64") and {"avx2", "fma"} <= flags:
        return CANONICAL_CORE
    return None


def pin_blas_core(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Set ``OPENBLAS_CORETYPE`` for this process (if NumPy is not loaded yet) and every process it
    starts, unless it is set already; returns the core type in effect (None: OpenBLAS's own choice)."""
    if CORE_ENV not in environ:
        core = pinned_core(cpu_flags(), platform.machine())
        if core is not None:
            environ[CORE_ENV] = core
    return environ.get(CORE_ENV)


def blas_core() -> str | None:
    """The core type of the OpenBLAS this process loaded (None if it has none loaded)."""
    from threadpoolctl import threadpool_info

    cores = [str(info.get("architecture")) for info in threadpool_info() if info.get("internal_api") == "openblas"]
    return cores[0] if cores else None


def blas_core_is_pinned() -> bool:
    """Does this process compute with the pinned kernels? (True where nothing is pinned.)

    ``Zen`` is OpenBLAS's name for the ``Haswell`` kernels on AMD CPUs, so it counts as pinned too."""
    wanted = os.environ.get(CORE_ENV)
    if wanted is None:
        return True
    loaded = blas_core()
    same = {wanted.lower(), "zen"} if wanted.lower() == "haswell" else {wanted.lower()}
    return loaded is None or loaded.lower() in same


__all__ = ["CANONICAL_CORE", "CORE_ENV", "blas_core", "blas_core_is_pinned", "cpu_flags", "pin_blas_core",
           "pinned_core"]
