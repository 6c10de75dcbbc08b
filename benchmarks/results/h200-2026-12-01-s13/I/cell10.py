"""Lesson 10's new GPU cell, on its own: the d = 128 atomic backward with P and dS in two tiles and in one."""
import numpy as np
import flash_numba as fn
from numba import cuda
from flash_numba import device
from flash_numba.kernels import flash2_fast
from flash_numba.tools.timing import median_ms

rng = np.random.default_rng(0)
gpu = device.info()
xs = [cuda.to_device(rng.standard_normal((32, 4096, 128)).astype(np.float32)) for _ in range(4)]
f128 = fn.attention_forward(*xs[:3], kernel="flash2_fast")
blk = fn.resolve_block("flash2_fast", 128, np.float32, pass_="backward", deterministic=False)
for rnd in (1, 2):
    for share in (False, True):
        with flash2_fast.layout.p_ds_tiles(share):
            n_blocks = flash2_fast.layout.kvq_blocks_per_sm(*blk, 128, np.float32, gpu.compute_capability,
                                                            gpu.shared_mem_per_sm)
            t = median_ms(lambda: fn.attention_backward(*xs[:3], f128.o, f128.lse, xs[3], kernel="flash2_fast",
                                                        deterministic=False))
        print(f"{gpu.name}, block {blk}, P and dS in {'one tile' if share else 'two tiles'}: {n_blocks} blocks an SM, "
              f"backward {t:.2f} ms", flush=True)
