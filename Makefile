# Set-up and everyday commands. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp
DEMO_HOME ?= $(CURDIR)/.compactor-demo

.PHONY: venv demo test test-quick test-unit fuzz lint types check format clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "compactor needs Python 3.11+ (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,s3,bench,ray,postgres,hive]'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv and install compactor with every extra

demo: venv  ## build a fragmented sample table in .compactor-demo/, compact it, show before/after
	COMPACTOR_HOME=$(DEMO_HOME) $(BIN)/compactor demo

test: venv  ## run the whole test suite (starts the servers it needs by itself)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

test-quick: venv  ## everything but the tests marked slow: the inner loop while developing
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not slow"

test-unit: venv  ## tests/unit alone: no catalog, server or JVM, seconds (the innermost loop)
	$(BIN)/python -m pytest -q tests/unit

SEEDS ?= 20
fuzz: venv  ## random table histories judged by Iceberg Java: `make fuzz SEEDS=100`, or SEED=1234 for one
	$(BIN)/python tests/support/fuzz.py $(if $(SEED),--seed $(SEED),--seeds $(SEEDS))

lint: venv  ## ruff's lint rules and formatting, checked (`make format` applies them)
	$(BIN)/ruff check compactor tests deploy
	$(BIN)/ruff format --check compactor tests deploy

types: venv  ## mypy over compactor/ (configured in pyproject.toml)
	$(BIN)/mypy

check: lint types test  ## what CI runs

format: venv
	$(BIN)/ruff check --fix compactor tests deploy
	$(BIN)/ruff format compactor tests deploy

clean:
	rm -rf $(VENV) $(DEMO_HOME) .pytest_cache .ruff_cache *.egg-info
