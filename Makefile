# make venv   create or reuse .venv and install the package with its dev tools (fast when nothing changed)
# make test      the suite on two workers, no GPU needed: simulator tests and the representative compile tier
#                (every kernel once for sm_75 and sm_90, float32 at d = 64); the compile tests start first
#                (tests/conftest.py).  Within 7 minutes on 2 cores: what .ci/run runs.
# make test-all  the same with the full compile tier: every specialisation (every dtype and the head dims
#                whose blocks differ); run it before a kernel change lands
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

.PHONY: venv test test-all tour lint

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

PYTEST = $(BIN)/python -m pytest -n 2 --dist load --maxschedchunk 1 --durations=15

test: venv
	$(PYTEST) --compile-tier=representative

test-all: venv
	$(PYTEST) --compile-tier=all

tour: venv
	$(BIN)/flash-numba tour

lint: venv
	$(BIN)/ruff check .
