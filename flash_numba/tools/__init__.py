"""The measuring tools: what runs the kernels to time, count and draw them (not needed to use them).

* :mod:`~flash_numba.tools.bench`: ``flash-numba bench``, validate every kernel
  against the float64 reference, then time it (and PyTorch SDPA); table, CSV,
  plot.  :mod:`~flash_numba.tools.bench_cases` says what runs,
  :mod:`~flash_numba.tools.bench_report` how it is reported.
* :mod:`~flash_numba.tools.figures`: ``flash-numba figures``, the article's and
  the paper's figures (one module per figure), PNG + CSV.
* :mod:`~flash_numba.tools.profile`: ``flash-numba profile``, our HBM byte
  counters beside Nsight Compute's DRAM bytes, per kernel launch.
* :mod:`~flash_numba.tools.microbench`: this GPU's ceilings (HBM and shared-memory
  bandwidth, float32 peak), each measured by one small kernel.
* :mod:`~flash_numba.tools.passes`: one pass of a kernel on random device
  arrays, its counted and modelled HBM bytes, and the FLOPs of each launch.
* :mod:`~flash_numba.tools.timing`: GPU clocks and device memory: median times,
  per-launch times, peak memory, out-of-memory errors.
* :mod:`~flash_numba.tools.csvfile`: CSV files with ``#`` comment lines on top.
"""
