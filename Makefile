# make venv   create or reuse .venv and install the package with its dev tools (fast when nothing changed)
# make test   the whole suite: simulator tests and the compile tier (no GPU needed); the compile tier
#             starts first and the other worker steals the tests queued behind it (tests/conftest.py)
# make tour   run standard attention and every FlashAttention kernel once (flash-numba tour)
# make lint   ruff

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.flash-numba-installed

.PHONY: venv test tour lint

venv: $(STAMP)

# Reinstall only when the package's metadata changes; the install is editable.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

test: venv
	$(BIN)/python -m pytest -n 2 --dist worksteal

tour: venv
	$(BIN)/flash-numba tour

lint: venv
	$(BIN)/ruff check .
