# Two commands on a fresh machine: `make run` and `make test`.
#
# Everything installed comes from the lock: uv.lock (payonce and its dev tools,
# every version and hash), requirements/uv.txt (the uv that reads it), and the
# pinned files of the test upstreams in tests/support/. A fresh clone gets
# exactly what main was tested with; `make upgrade` moves the lock forward and
# `make test-latest` shows what the newest releases would break.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(VENV)/uv/bin/uv
STAMP := $(VENV)/.installed
LATEST := $(VENV)/latest
# uv never downloads a Python of its own (the registries are all this machine
# reaches): it uses the virtualenv made from $(PYTHON).
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
# Most tests wait on real processes (gateways, simulators, Redis, Prometheus), not on
# the CPU: three workers on two cores, one test file each at a time (module fixtures
# stay shared). On a 2-core machine: 16 min 39 s with two, 11 min 30 s with three.
TEST_WORKERS ?= 3
PYTEST_ARGS ?=
# The suite starts hundreds of Python processes (gateways, simulators, CLIs), each
# importing payonce and its dependencies: compiled to bytecode once, kept in
# .venv/pycache (make clean removes it; the checkout stays clean) and read by every
# process after, even where the environment sets PYTHONDONTWRITEBYTECODE (as
# containers often do). Compiled from source each time, a gateway's start and stop
# cost 0.9 s of CPU instead of 0.45 s.
TEST_ENV := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache

.PHONY: run test setup prepare demo lint typecheck bench upgrade test-latest clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# uv itself, from its pinned hashes, beside (not inside) the project's packages
# (--isolated: whatever pip configuration the machine has is not ours);
# `uv sync` keeps the virtualenv to exactly the lock.
$(UV): requirements/uv.txt | $(BIN)/python
	@echo "setup: installing uv from requirements/uv.txt"
	$(BIN)/python -m pip --isolated install --quiet --disable-pip-version-check --no-warn-script-location \
		--require-hashes --target $(VENV)/uv --upgrade -r requirements/uv.txt
	touch $(UV)

$(STAMP): $(UV) pyproject.toml uv.lock
	@echo "setup: installing payonce and its dev tools from uv.lock"
	$(UV) sync --locked --extra dev --python $(BIN)/python
	touch $(STAMP)

## Install payonce and the dev tools from the lock (make run and make test do it).
setup: $(STAMP)

## Start the gateway on embedded defaults: SQLite store, built-in simulated upstream.
## The store lives in .venv/run/ (make clean removes it): the checkout stays clean.
run: $(STAMP)
	@mkdir -p $(VENV)/run
	$(BIN)/payonce serve --upstream sim --store sqlite:///$(VENV)/run/payonce.db

## The incident replayed: five stacks, the same requests, one bill each (about two
## minutes). Its files go to payonce-demo/ (ignored by git); the commands it prints
## run as printed from here.
demo: $(STAMP)
	$(BIN)/payonce demo --output payonce-demo

## What the suite needs besides .venv, one line per step on this terminal: the
## programs the tests drive (apt, as root), LiteLLM's and llama.cpp's virtualenvs
## (llama.cpp built once per machine); under a second when all is ready.
prepare: $(STAMP)
	$(BIN)/python -m tests.support.prepare

## Lint, type-check, prepare and run the whole suite (what CI runs).
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m tests.support.prepare
	$(TEST_ENV) $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not alone" $(PYTEST_ARGS)
	$(TEST_ENV) $(BIN)/pytest -q -m alone $(PYTEST_ARGS); status=$$?; [ $$status -eq 0 ] || [ $$status -eq 5 ]

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/gateway_overhead.py

## Move the lock to the newest releases the ranges in pyproject.toml allow (uv too);
## then run make test and commit uv.lock and requirements/uv.txt together.
upgrade: $(UV)
	$(UV) pip compile requirements/uv.in --universal --generate-hashes --upgrade \
		--quiet -o requirements/uv.txt
	$(UV) lock --upgrade

## The whole suite against the newest releases, not the lock, in $(LATEST):
## drift seen before it reaches main (nothing here changes the lock). The upper
## bounds of pyproject.toml are lifted (requirements/latest-overrides.txt), so the
## adapters' tests say whether a newer uvicorn or prometheus-client still fits.
test-latest: $(UV) prepare
	$(UV) venv --quiet --allow-existing --python $(BIN)/python $(LATEST)
	VIRTUAL_ENV=$(LATEST) $(UV) pip install --upgrade --refresh \
		--override requirements/latest-overrides.txt -e '.[dev]'
	$(LATEST)/bin/ruff check src tests benchmarks
	$(LATEST)/bin/mypy
	$(TEST_ENV) PAYONCE_TEST_LATEST=1 $(LATEST)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not alone" $(PYTEST_ARGS)
	$(TEST_ENV) PAYONCE_TEST_LATEST=1 $(LATEST)/bin/pytest -q -m alone $(PYTEST_ARGS); status=$$?; [ $$status -eq 0 ] || [ $$status -eq 5 ]

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
