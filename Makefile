# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench docs clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps "litdata>=0.2.76,<0.3"  # its deps: in dev
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/zephon-dask demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The inner loop: no cluster, no framework, no subprocess-heavy test (the whole suite: make test).
FAST_TESTS := tests/unit tests/formats tests/pipeline tests/docs/test_architecture.py tests/docs/test_docstrings.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(FAST_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check zephon_dask zephon_dask_demo tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

# the docs' generated tables (options, recipe keys, formats), written from their definitions
docs: $(STAMP)
	$(BIN)/python docs/tables.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache
