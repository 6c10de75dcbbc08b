"""Compatibility shim: numba-cuda 0.30.4 on numpy >= 2.5.

numba-cuda 0.30.4 is the last release of the package that still ships the CUDA
simulator, which our users need on laptops without a GPU.  It refers to
``numpy.row_stack`` while it types a kernel, and numpy 2.5 removed that alias of
``numpy.vstack``: every kernel compile then fails with

    AttributeError: module 'numpy' has no attribute 'row_stack'

(NVIDIA/numba-cuda#907, not fixed upstream).  ``pip install flash-numba`` pins
``numpy<2.5``, but Colab and other prebuilt images already ship numpy 2.5, so the
package restores the alias before anything imports ``numba.cuda``.  The alias is
exactly what numpy < 2.5 had (``row_stack is vstack``), so nothing else changes.

Remove this module once numba-cuda is fixed or the pin is lifted.
"""

import numpy as np

#: True when this shim had to patch numpy (numpy >= 2.5).
PATCHED = False

if not hasattr(np, "row_stack"):  # numpy >= 2.5
    np.row_stack = np.vstack
    PATCHED = True
