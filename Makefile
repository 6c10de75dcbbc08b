# make venv   create or reuse .venv and install the package with its dev tools (fast when nothing changed)
# make test      the suite on two workers, no GPU needed (--tier=representative): the simulator tests but those
#                marked `full`, and the representative compile tier (each kernel's launches for sm_75 and sm_90 at
#                float32, d = 64, with each of their variants' features once: causal, counting, dropout...); the
#                compile tests start first, then the slow ones (tests/conftest.py).  Within 7 minutes on 2 cores
#                from a clean clone: what .ci/run runs.
# make test-all  everything (--tier=all): the `full` cases too (every dtype of the test matrix, every case of the
#                costliest checks) and the full compile tier, every specialisation (every dtype and the head
#                dims whose blocks differ, every variant); run it before a kernel change lands
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
	$(PYTEST) --tier=representative

test-all: venv
	FLASH_NUMBA_FUZZ_EXAMPLES=4 $(PYTEST) --tier=all

tour: venv
	$(BIN)/flash-numba tour

lint: venv
	$(BIN)/ruff check .
