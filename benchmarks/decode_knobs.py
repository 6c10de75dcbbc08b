"""flash_decode's tensor-core kernel with a build-time constant set, timed by the decode benchmark.

    python benchmarks/decode_knobs.py [--set NAME=VALUE ...] -- [bench_decode arguments]

Sets the named constants of :mod:`flash_numba.kernels.flash_decode.tc` (``L2_PREFETCH``: cp.async's L2 prefetch
size, 0, 64, 128 or 256; a value is a Python literal) before any kernel is built, then runs
``python -m flash_numba.tools.bench_decode`` with the rest of the arguments.  One setting a process: the kernels are
built once a process, so two settings are two runs, each printing its setting first.  Needs a GPU.  (Pipeline
stages need no process of their own: bench_decode's ``flash_decode-st<n>`` names run them.)
"""

from __future__ import annotations

import ast
import sys

KNOBS = ("L2_PREFETCH",)


def main(argv: list[str]) -> int:
    if "--" in argv:
        cut = argv.index("--")
        own, rest = argv[:cut], argv[cut + 1:]
    else:
        own, rest = argv, []
    settings = {}
    it = iter(own)
    for a in it:
        if a != "--set":
            print(f"decode_knobs: unknown argument {a!r} (--set NAME=VALUE ... -- bench_decode arguments)",
                  file=sys.stderr)
            return 2
        name, _, value = next(it, "").partition("=")
        if name not in KNOBS or not value:
            print(f"decode_knobs: --set takes NAME=VALUE with NAME one of {', '.join(KNOBS)}", file=sys.stderr)
            return 2
        settings[name] = ast.literal_eval(value)

    from flash_numba.kernels.flash_decode import tc
    from flash_numba.tools import bench_decode

    for name, value in settings.items():
        setattr(tc, name, value)
    print("flash_decode tc knobs: " + ", ".join(f"{n}={getattr(tc, n)!r}" for n in KNOBS), flush=True)
    return bench_decode.main(rest, "python benchmarks/decode_knobs.py " + " ".join(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
