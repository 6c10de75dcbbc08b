"""What flash_numba adds to Numba's CUDA simulator (used only when the kernels run there).

==============  ===================================================================================
:mod:`.warps`   warp shuffles and votes, NaN-poisoned shared and local memory, and a block scheduler
                that runs the CUDA threads as greenlets (installed by :mod:`flash_numba.device`)
:mod:`.races`   a shared-memory race detector: which thread wrote and read each element since the
                block's last barrier
:mod:`.trace`   a trace of every global-memory access, per thread (counter honesty, access maps)
==============  ===================================================================================
"""
