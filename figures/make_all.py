"""Regenerate every figure of the article on this machine (see figures/README.md).

    python figures/make_all.py [--only N ...] [--quick] [--model-only] [--out DIR]

The figures live in :mod:`flash_numba.tools.figures` (one module per figure); this script only sets the
default output folder, figures/out next to it.
"""

import sys
from pathlib import Path

from flash_numba.tools import figures

OUT = Path(__file__).resolve().parent / "out"


def main(argv=None) -> int:
    """Make the figures (``argv`` as on the command line); 0 when none failed."""
    return figures.main(argv, default_out=OUT)


if __name__ == "__main__":
    sys.exit(main())
