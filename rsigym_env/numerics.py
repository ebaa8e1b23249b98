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

Pinning the kernels is not enough on every OpenBLAS: 0.3.34 (the one NumPy 2.5.2-2.5.5 bundle) rewrites the
blocking of whatever kernels are pinned on AMD Zen 4/5 hosts with AVX-512 (OpenBLAS issues 6013 and 6021), so
SGEMM sums in another order there (other samples, checkpoints and scores for the same seed) and the pinned
``Haswell`` DGEMM crashes once K passes ~300 (a segfault in any float64 matrix product of that size, e.g. the
RL researcher's training). The package therefore requires a NumPy whose OpenBLAS does not
(``numpy<2.5.2``), and :func:`canonical_arithmetic` checks the arithmetic itself: a few fixed SGEMMs
whose products must hash to what the pinned kernels give everywhere else.

NumPy's own vector code is dispatched by CPU too: its float64 ``exp``, ``log``, ``log1p``, ``expm1`` and
``power`` (and some float32 ones) round differently in their AVX-512 versions than in their AVX2 ones, so
the sim's quotes and draws differed in their last bits between an AVX-512 and an AVX2 machine for the same
seed. On the same CPUs the package therefore also sets ``NPY_ENABLE_CPU_FEATURES=X86_V3`` (NumPy's AVX2
level; the names NumPy >= 2.4 use) before NumPy loads: every machine with AVX2 runs the AVX2 versions.
A value the user set for it (or for ``NPY_DISABLE_CPU_FEATURES``) is kept.

Both settings only work before NumPy loads, and a script that starts with ``import gymnasium`` (which
imports NumPy) loads it before ``rsigym_env``. :func:`install_startup_hook` therefore puts a start-up hook
into the environment's ``site-packages`` (a ``.pth`` file, which Python runs at every interpreter start
before any user code): it pins both in every process of that environment, whatever is imported first.
``make setup`` and ``make run`` install it into ``.venv``; elsewhere run
``python -c "import rsigym_env.numerics as n; n.install_startup_hook()"`` once.

This module imports nothing that loads NumPy (only :func:`canonical_arithmetic` does, when called), and
nothing outside the standard library at import time, so the start-up hook can run it on its own.

>>> pinned_core({"avx2", "fma", "sse2"}, "x86_64"), pinned_core({"avx2"}, "x86_64"), pinned_core({"asimd"}, "aarch64")
('Haswell', None, None)
"""

from __future__ import annotations

import functools
import os
import platform
from typing import Any, MutableMapping

CORE_ENV = "OPENBLAS_CORETYPE"
SIMD_ENV = "NPY_ENABLE_CPU_FEATURES"
CANONICAL_SIMD = "X86_V3"  # NumPy's dispatch level of AVX2 + FMA machines (x86-64-v3)
X86_V3_FLAGS = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})  # /proc/cpuinfo names
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


def pin_blas_core(environ: MutableMapping[str, str] = os.environ, flags: set[str] | None = None) -> str | None:
    """Set ``OPENBLAS_CORETYPE`` (and NumPy's ``NPY_ENABLE_CPU_FEATURES``) for this process (if NumPy is not
    loaded yet) and every process it starts, unless set already; ``flags``: the CPU's (default: this one's).
    Returns the core type in effect (None: OpenBLAS's own choice)."""
    flags = cpu_flags() if flags is None else flags
    core = pinned_core(flags, platform.machine())
    if core is not None:
        environ.setdefault(CORE_ENV, core)
        if SIMD_ENV not in environ and "NPY_DISABLE_CPU_FEATURES" not in environ and X86_V3_FLAGS <= flags:
            # NumPy's AVX2 code everywhere (module docstring); only where the CPU shows every x86-64-v3 flag,
            # since NumPy refuses to load when asked for a level the CPU lacks (a VM may mask one of them)
            environ[SIMD_ENV] = CANONICAL_SIMD
    return environ.get(CORE_ENV)


HOOK_NAME = "rsigym_env_arithmetic"  # the .pth file and the module it imports, in site-packages
_HOOK_MODULE = '''"""Written by rsigym_env.numerics.install_startup_hook: pins the arithmetic before anything loads NumPy."""
import os as _os
import sys as _sys


def _pin() -> None:
    if "OPENBLAS_CORETYPE" in _os.environ or "numpy" in _sys.modules:
        return  # a process started by a pinned one inherits the pin (the hook then costs ~0.1 ms)
    import importlib.util

    spec = importlib.util.find_spec("rsigym_env")
    if spec is None or not spec.submodule_search_locations:
        return
    path = _os.path.join(list(spec.submodule_search_locations)[0], "numerics.py")
    numerics_spec = importlib.util.spec_from_file_location("_rsigym_env_numerics_at_startup", path)
    numerics = importlib.util.module_from_spec(numerics_spec)
    numerics_spec.loader.exec_module(numerics)
    numerics.pin_blas_core()


try:
    _pin()
except Exception:  # a start-up hook must never stop an interpreter from starting
    pass
'''


def install_startup_hook(site_dir: str | os.PathLike[str] | None = None) -> str:
    """Install the start-up hook (module docstring) into ``site_dir`` (default: this environment's
    ``site-packages``); returns the ``.pth`` file's path. Idempotent.

    >>> import tempfile, pathlib
    >>> pth = install_startup_hook(tempfile.mkdtemp())
    >>> pathlib.Path(pth).read_text()
    'import rsigym_env_arithmetic\\n'
    """
    import sysconfig
    from pathlib import Path

    site = Path(site_dir if site_dir is not None else sysconfig.get_paths()["purelib"])
    (site / f"{HOOK_NAME}.py").write_text(_HOOK_MODULE, encoding="utf-8")
    pth = site / f"{HOOK_NAME}.pth"
    pth.write_text(f"import {HOOK_NAME}\n", encoding="utf-8")
    return str(pth)


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


CANONICAL_DIGEST = "19484dcb95103bfd"  # the pinned Haswell kernels with their own blocking, NumPy at X86_V3
_CANARY_SHAPES = ((64, 1024, 64), (48, 2000, 40), (96, 600, 128))  # K past every blocking split in use


def canary_digest() -> str:
    """The first 16 hex digits of the SHA-256 of a few float32 matrix products (K up to 2,000) and of NumPy's
    float64 ``exp``, ``log``, ``log1p`` and ``expm1`` over fixed inputs.

    The inputs are exact rationals rounded once (no random generator), so only the BLAS's summation order
    and NumPy's vector code can change the bytes. The products run on one BLAS thread, as the local model's
    do (OpenBLAS's sums depend on its thread count too), and BLAS is left on one thread, as the model leaves
    it: restoring an earlier count (a ``threadpool_limits`` block) could change the thread count under
    another thread's running model computation, and with it that computation's bits."""
    import hashlib

    import numpy as np
    from threadpoolctl import ThreadpoolController

    digest = hashlib.sha256()
    ThreadpoolController().limit(limits=1, user_api="blas")  # process-wide, never restored (see above)
    products = [_canary_product(np, m, k, n) for m, k, n in _CANARY_SHAPES]
    for product in products:
        digest.update(product.tobytes())
    x = (np.arange(20_000, dtype=np.int64) * 7919 + 13) % 65521 / 65521.0 * 40.0 - 20.0
    for values in (np.exp(x), np.log(np.abs(x) + 1e-3), np.log1p(np.abs(x)), np.expm1(x)):
        digest.update(values.tobytes())
    return digest.hexdigest()[:16]


def _canary_product(np: Any, m: int, k: int, n: int) -> Any:
    i = np.arange(m * k, dtype=np.int64).reshape(m, k)
    j = np.arange(k * n, dtype=np.int64).reshape(k, n)
    a = ((i * 7919 + 13) % 65521 / 65521.0 - 0.5).astype(np.float32)
    b = ((j * 104729 + 7) % 65519 / 65519.0 - 0.5).astype(np.float32)
    return a @ b


@functools.cache
def check_arithmetic() -> bool | None:
    """:func:`canonical_arithmetic`, computed once a process, with a warning where it is False."""
    canonical = canonical_arithmetic()
    if canonical is False:
        import logging

        import numpy as np

        logging.getLogger("rsigym_env.numerics").warning(
            "this process does not compute the pinned arithmetic (NumPy %s, OpenBLAS core %s, NumPy code "
            "pinned: %s): sim and local results will differ in their last bits from other machines' for the "
            "same seed. Import rsigym_env before NumPy (or install the start-up hook: "
            "rsigym_env.numerics.install_startup_hook()), and install the package's NumPy (numpy<2.5.2: "
            "OpenBLAS 0.3.34 sums otherwise on AMD Zen 4/5 hosts); see rsigym_env/numerics.py",
            np.__version__, blas_core(), simd_is_pinned())
    return canonical


def simd_is_pinned() -> bool:
    """Does this process's NumPy run the pinned vector code? (True where nothing is pinned.) False when NumPy
    was loaded before ``rsigym_env`` on an AVX-512 machine."""
    if os.environ.get(SIMD_ENV) != CANONICAL_SIMD:
        return True
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return not any(__cpu_features__.get(t) for t in __cpu_dispatch__ if t != CANONICAL_SIMD)


def canonical_arithmetic() -> bool | None:
    """Does this process compute the recorded results' arithmetic? None where nothing is pinned (a CPU without
    AVX2 and FMA: results are that machine's own), else whether :func:`canary_digest` matches the pinned
    kernels' (False e.g. with OpenBLAS 0.3.34 on an AMD Zen 4/5 host, or NumPy loaded before the pin)."""
    if os.environ.get(CORE_ENV, "").lower() not in ("haswell", "zen"):
        return None
    return canary_digest() == CANONICAL_DIGEST


__all__ = ["CANONICAL_CORE", "CANONICAL_DIGEST", "CANONICAL_SIMD", "CORE_ENV", "SIMD_ENV", "X86_V3_FLAGS",
           "blas_core", "blas_core_is_pinned", "canary_digest", "canonical_arithmetic", "check_arithmetic",
           "cpu_flags", "install_startup_hook", "pin_blas_core", "pinned_core", "simd_is_pinned"]
