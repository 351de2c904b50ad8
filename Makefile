# packer — two commands for a newcomer: `make demo` and `make test`.
# Both create .venv on first use; setup is stamped so a second run installs nothing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.packer-setup-stamp

.PHONY: setup demo test test-fast bench sample-data clean

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: setup
	$(BIN)/packer build --overwrite
	

test: setup
	$(BIN)/python -m pytest -q

# The fast tier: everything but the tests marked slow (under a minute on 2 cores).
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# trl is a side-by-side baseline for the planner benchmark only, never a runtime dependency.
bench: setup
	$(BIN)/python -c "import trl" 2>/dev/null || $(BIN)/python -m pip install --quiet trl==1.16.0
	@for f in bench/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# Regenerates sample_data/ (images, audio, JSONL, tokenizer) from its committed script.
sample-data: setup
	$(BIN)/python sample_data/make_sample_data.py

clean:
	rm -rf out .pytest_cache
