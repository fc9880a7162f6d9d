# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Most tests wait on real processes (gateways, simulators, Redis, Prometheus), not on
# the CPU: two workers, one test file each at a time (module fixtures stay shared).
TEST_WORKERS ?= 2

.PHONY: run test demo lint typecheck bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## Start the gateway on embedded defaults: SQLite store, built-in simulated upstream.
run: $(STAMP)
	$(BIN)/payonce serve --upstream sim

## The article's incident replayed: four stacks, the same requests, one bill each (about a minute).
demo: $(STAMP)
	$(BIN)/payonce demo

## Lint, type-check and run the whole suite (what CI runs).
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/gateway_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
