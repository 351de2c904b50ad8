# packer — two commands for a newcomer: `make demo` and `make test`.
# Both create .venv on first use; setup is stamped so a second run installs nothing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Two install layers, each stamped: a second run installs nothing, and `make test` after
# `make demo` adds only the test layer.
DEMO_STAMP := $(VENV)/.packer-demo-stamp
TEST_STAMP := $(VENV)/.packer-test-stamp

.PHONY: setup setup-demo demo test test-fast lint demo-check bench sample-data clean

setup: $(TEST_STAMP)
setup-demo: $(DEMO_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Layer 1, what `packer build` needs (requirements-demo.lock: no torch).
$(DEMO_STAMP): requirements-demo.lock pyproject.toml | $(BIN)/python
	@echo "== installing the build's pinned dependencies (requirements-demo.lock, no torch) into $(VENV)"
	@start=$$(date +%s); \
	$(BIN)/python -m pip install --progress-bar on -r requirements-demo.lock && \
	$(BIN)/python -m pip install --quiet --no-deps -e . && \
	$(BIN)/python -m packer.pack.warm && \
	echo "== build layer installed in $$(( $$(date +%s) - start )) s; $(VENV) is now $$(du -sh $(VENV) | cut -f1)"
	@touch $@

# Layer 2, everything the tests use (requirements.lock: torch, open_clip, Ray, pytest, ...).
$(TEST_STAMP): requirements.lock $(DEMO_STAMP)
	@echo "== installing the test layer (requirements.lock: torch, open_clip, Ray, datasets, pytest, ...) into $(VENV)"
	@start=$$(date +%s); \
	$(BIN)/python -m pip install --progress-bar on -r requirements.lock && \
	echo "== test layer installed in $$(( $$(date +%s) - start )) s; $(VENV) is now $$(du -sh $(VENV) | cut -f1)"
	@touch $@

demo: $(DEMO_STAMP)
	$(BIN)/packer build --overwrite

# The suite on WORKERS processes (pytest-xdist, a test file per worker at a time), in the order
# tests/conftest.py gives the files (the Ray cluster's first: its tests mostly wait).
WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder

# The fast tier: everything but the tests marked slow.
test-fast: setup
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow"

# ruff, pinned in requirements.lock; its settings are in pyproject.toml.
lint: setup
	$(BIN)/ruff check .

# The build layer alone, as a user gets it: a fresh venv with requirements-demo.lock and the package
# (not editable, no torch), then a build of the sample job run from outside the repository, and verify.
DEMO_VENV := .venv-demo
demo-check:
	rm -rf $(DEMO_VENV)
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install --quiet -r requirements-demo.lock
	$(DEMO_VENV)/bin/python -m pip install --quiet --no-deps .
	@if $(DEMO_VENV)/bin/python -c "import torch" 2>/dev/null; then echo "the build layer installed torch"; exit 1; fi
	cd $(DEMO_VENV) && bin/packer build $(CURDIR)/pipelines/sample.toml -o $(CURDIR)/$(DEMO_VENV)/out --overwrite
	$(DEMO_VENV)/bin/packer verify $(DEMO_VENV)/out --media

# trl (the planner benchmark's baseline, the TRL recipe's test) is in the test layer, never a runtime dependency.
bench: setup
	@for f in bench/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# Regenerates sample_data/ (images, audio, JSONL, tokenizer) from its committed script.
sample-data: setup-demo
	$(BIN)/python sample_data/make_sample_data.py

clean:
	rm -rf out .pytest_cache $(DEMO_VENV)
