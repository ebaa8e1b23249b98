"""The local world's arithmetic is the same on every x86-64 machine with AVX2: OpenBLAS's kernels are pinned
before NumPy loads them (rsigym_env.numerics), in this process and every process the package starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rsigym_env import numerics

AVX2 = numerics.pinned_core(numerics.cpu_flags(), __import__("platform").machine()) is not None


def run(code: str, **env: str) -> dict:
    import os

    environ = {k: v for k, v in os.environ.items() if k != numerics.CORE_ENV} | env
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE = ("import json, os; {first}; from rsigym_env.numerics import blas_core, blas_core_is_pinned; "
         "print(json.dumps({{'env': os.environ.get('OPENBLAS_CORETYPE'), 'loaded': blas_core(), "
         "'pinned': blas_core_is_pinned()}}))")


def test_a_value_the_user_set_is_kept():
    env = {numerics.CORE_ENV: "Sandybridge"}
    assert numerics.pin_blas_core(env) == "Sandybridge" and env[numerics.CORE_ENV] == "Sandybridge"
    env = {numerics.SIMD_ENV: "X86_V4"}
    numerics.pin_blas_core(env)
    assert env[numerics.SIMD_ENV] == "X86_V4"


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="the flags are x86-64's")
def test_numpys_level_is_asked_for_only_where_the_cpu_shows_all_of_it():
    """NumPy refuses to load when asked for a level the CPU lacks: a VM that masks one x86-64-v3 flag gets no pin."""
    full, masked = set(numerics.X86_V3_FLAGS), set(numerics.X86_V3_FLAGS) - {"bmi2"}
    env: dict[str, str] = {}
    numerics.pin_blas_core(env, full)
    assert env == {numerics.CORE_ENV: "Haswell", numerics.SIMD_ENV: "X86_V3"}
    env = {}
    numerics.pin_blas_core(env, masked)
    assert env == {numerics.CORE_ENV: "Haswell"}
    empty: dict[str, str] = {}
    assert numerics.pin_blas_core(empty) == empty.get(numerics.CORE_ENV)


@pytest.mark.skipif(not AVX2, reason="nothing is pinned on a CPU without AVX2 and FMA")
def test_importing_the_package_first_pins_the_kernels_for_this_process_and_its_children():
    got = run(PROBE.format(first="import rsigym_env, numpy"))
    assert got == {"env": "Haswell", "loaded": "Haswell", "pinned": True}


@pytest.mark.skipif(not AVX2, reason="nothing is pinned on a CPU without AVX2 and FMA")
def test_numpy_loaded_first_with_other_kernels_is_noticed():
    # NumPy loads the Sandybridge kernels; then the package pins Haswell for the processes it starts
    got = run(PROBE.format(first="import numpy; os.environ.pop('OPENBLAS_CORETYPE'); import rsigym_env"),
              OPENBLAS_CORETYPE="Sandybridge")
    assert got == {"env": "Haswell", "loaded": "Sandybridge", "pinned": False}


@pytest.mark.skipif(not AVX2, reason="nothing is pinned on a CPU without AVX2 and FMA")
def test_this_machine_computes_the_pinned_arithmetic():
    """The pinned kernels sum as on every other machine: OpenBLAS 0.3.34 on an AMD Zen 4/5 host does not (it
    rewrites the pinned kernels' blocking), which the canary sees; other kernels are seen too."""
    got = run("import json, rsigym_env; from rsigym_env.numerics import canary_digest, canonical_arithmetic; "
              "print(json.dumps([canary_digest(), canonical_arithmetic()]))")
    assert got == [numerics.CANONICAL_DIGEST, True], "install the package's NumPy (see rsigym_env/numerics.py)"
    other = run("import json, rsigym_env; from rsigym_env.numerics import canary_digest; print(json.dumps(canary_digest()))",
                OPENBLAS_CORETYPE="Sandybridge")
    assert other != numerics.CANONICAL_DIGEST


def test_the_canary_leaves_blas_on_one_thread_and_never_restores_a_count_under_running_model_work():
    """The local model computes on one BLAS thread and leaves it there; a canary that restored the count it
    found (two threads, before any model work) could do so while another thread's model computation runs,
    changing that computation's bits (a training determinism test failed once in CI that way)."""
    got = run("import json, rsigym_env; from threadpoolctl import ThreadpoolController; "
              "from rsigym_env.numerics import canary_digest; c = ThreadpoolController(); "
              "c.limit(limits=2, user_api='blas'); canary_digest(); "
              "print(json.dumps([p.num_threads for p in ThreadpoolController().select(user_api='blas').lib_controllers]))")
    assert got and set(got) == {1}


@pytest.mark.skipif(not AVX2, reason="nothing is pinned on a CPU without AVX2 and FMA")
def test_a_large_float64_product_under_the_pin_does_not_crash():
    """OpenBLAS 0.3.34's pinned Haswell DGEMM overran its panel buffer on Zen 4/5 hosts (a segfault from K ~300)."""
    got = run("import json, rsigym_env, numpy as np; a = np.ones((128, 2000)); b = np.ones((2000, 128)); "
              "print(json.dumps(float((a @ b)[0, 0])))")
    assert got == 2000.0


@pytest.mark.skipif(not AVX2, reason="nothing is pinned on a CPU without AVX2 and FMA")
def test_numpys_vector_code_is_pinned_to_avx2_for_this_process_and_its_children():
    """NumPy's float64 exp/log round differently in their AVX-512 versions: the package asks for NumPy's AVX2
    level before NumPy loads, so every AVX2 machine computes the same bits (NumPy loaded first is noticed)."""
    code = ("import json, os; {first}; from rsigym_env.numerics import simd_is_pinned; "
            "print(json.dumps([os.environ.get('NPY_ENABLE_CPU_FEATURES'), simd_is_pinned()]))")
    assert run(code.format(first="import rsigym_env, numpy")) == ["X86_V3", True]
    flags = numerics.cpu_flags()
    if "avx512f" in flags:  # only a machine with more than AVX2 can load NumPy's other code first
        got = run(code.format(first="os.environ.pop('NPY_ENABLE_CPU_FEATURES', None); import numpy; import rsigym_env"))
        assert got == ["X86_V3", False]
    kept = {"NPY_DISABLE_CPU_FEATURES": "AVX512_SPR"}
    numerics.pin_blas_core(kept)
    assert numerics.SIMD_ENV not in kept  # a user's own NumPy setting is kept (NumPy refuses both at once)


@pytest.mark.skipif(not AVX2, reason="nothing is pinned on a CPU without AVX2 and FMA")
def test_a_sim_episode_in_a_process_that_loaded_numpy_first_says_its_bits_differ():
    import os

    code = ("import os; os.environ.pop('NPY_ENABLE_CPU_FEATURES', None); import numpy; import rsigym_env, gymnasium as gym; "
            "env = gym.make('RSIGym/Joint-v0', world='sim', benchmark='aime'); env.reset(seed=0); "
            "env = gym.make('RSIGym/Joint-v0', world='sim', benchmark='aime')")
    environ = {k: v for k, v in os.environ.items() if k != numerics.CORE_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, check=True)
    assert out.stderr.count("does not compute the pinned arithmetic") == 1  # once a process
    pinned = subprocess.run([sys.executable, "-c", code.replace("import numpy; ", "")], capture_output=True, text=True,
                            env=environ, check=True)
    assert "pinned arithmetic" not in pinned.stderr


@pytest.mark.skipif(not AVX2, reason="nothing is pinned on a CPU without AVX2 and FMA")
def test_the_startup_hook_pins_the_arithmetic_whatever_is_imported_first(tmp_path):
    """`import gymnasium` loads NumPy before rsigym_env; the .pth hook (what make setup installs) pins it anyway."""
    numerics.install_startup_hook(tmp_path)
    code = ("import site; site.addsitedir({site!r}); "
            "import json, os, gymnasium, numpy; import rsigym_env; "
            "from rsigym_env.numerics import simd_is_pinned, blas_core_is_pinned, canonical_arithmetic; "
            "print(json.dumps([os.environ.get('OPENBLAS_CORETYPE'), blas_core_is_pinned(), simd_is_pinned(), "
            "canonical_arithmetic()]))")
    import os

    environ = {k: v for k, v in os.environ.items() if k not in (numerics.CORE_ENV, numerics.SIMD_ENV)}
    # -S: no site-packages hooks of the test's own environment; the tmp site dir's hook is the only one
    from pathlib import Path

    import rsigym_env

    paths = [__import__("sysconfig").get_paths()["purelib"], str(Path(rsigym_env.__file__).parents[1])]
    prelude = f"import sys; sys.path.extend({paths!r}); "
    out = subprocess.run([sys.executable, "-S", "-c", prelude + code.format(site=str(tmp_path))],
                         capture_output=True, text=True, env=environ, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["Haswell", True, True, True]
    # without the hook the same script computes other bits (on an AVX-512 machine) and says so
    if "avx512f" in numerics.cpu_flags():
        bare = subprocess.run([sys.executable, "-S", "-c", prelude + code.replace("site.addsitedir({site!r}); ", "")],
                              capture_output=True, text=True, env=environ, check=True)
        assert json.loads(bare.stdout.strip().splitlines()[-1])[2:] == [False, False]
