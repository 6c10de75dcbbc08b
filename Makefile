# make venv   create or reuse .venv and install the package with its dev tools (fast when nothing changed)
# make test   the whole suite: simulator tests and the compile tier (no GPU needed) on two workers; the
#             compile tier's four tests start first, two on each worker (tests/conftest.py)
# make tour   run standard attention and every FlashAttention kernel once (flash-numba tour)
# make lint   ruff

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.flash-numba-installed
# uv, pip-installed into the venv, installs the dev extra in parallel: about 30 s where pip alone
# takes 2-3 minutes.  uv does not read pip's configuration, so the find-links pip is configured with
# (our machines keep the CPU build of torch there) are handed on.  `make venv UV=` uses pip alone.
UV ?= $(BIN)/uv
FIND_LINKS = $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/^.*find-links='\(.*\)'$$/\1/p" | sort -u)

.PHONY: venv test tour lint

venv: $(STAMP)

# Reinstall only when the package's metadata changes; the install is editable.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
ifdef UV
	$(BIN)/python -m pip install -q uv
	$(UV) pip install -q --compile-bytecode --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS)) -e ".[dev]"
else
	$(BIN)/python -m pip install -q -e ".[dev]"
endif
	touch $@

test: venv
	$(BIN)/python -m pytest -n 2 --dist load --maxschedchunk 1 --durations=15

tour: venv
	$(BIN)/flash-numba tour

lint: venv
	$(BIN)/ruff check .
