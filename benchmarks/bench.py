"""Benchmark every attention implementation: validate, time, report.

    python benchmarks/bench.py [options]      # the same as: flash-numba bench [options]

Options and output are those of :mod:`flash_numba.tools.bench` (``--help`` lists them).
"""

import sys

from flash_numba.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
