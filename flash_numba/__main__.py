"""``python -m flash_numba``: the same command as ``flash-numba`` (see :mod:`flash_numba.cli`)."""

from .cli import main

raise SystemExit(main())
