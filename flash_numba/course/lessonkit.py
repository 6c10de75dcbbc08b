"""Small helpers the lesson notebooks share, so their cells stay short.

* :func:`compare_prediction`: the "predict, then run" cells (the learner writes a
  number first; the next cell measures it and says how close the guess was).
* :func:`annotated_source`: a kernel's source with the paper's line numbers in a
  margin, read from the ``# line N`` comments the kernels already carry.
"""

from __future__ import annotations

import inspect
import re
import textwrap

_LINE_REF = re.compile(r"(?i)#\s*lines? (\d+)(?:\s*-\s*(\d+))?(?![\d'])")


def compare_prediction(what: str, predicted, measured, *, rel_tol: float = 0.1) -> bool | None:
    """Print a prediction next to the measured value; True when within ``rel_tol``, None if no guess yet."""
    if predicted is None:
        print(f"{what}: measured {measured:,}. (Write your prediction in the cell above first, then run both.)")
        return None
    off = abs(predicted - measured) / max(abs(measured), 1e-300)
    verdict = "right" if off <= rel_tol else f"off by {off:.0%}"
    print(f"{what}: you predicted {predicted:,}, measured {measured:,}: {verdict}")
    return off <= rel_tol


def annotated_source(obj, start: str | None = None, stop: str | None = None) -> str:
    """The source of ``obj`` (a function, or a kernel with ``py_func``) from the first line containing
    ``start`` up to (not including) the first later line containing ``stop``, with a margin showing the
    paper's line number wherever a comment cites ``line N`` or ``lines N-M``; the number holds for the
    lines below it until the next citation."""
    src = textwrap.dedent(inspect.getsource(getattr(obj, "py_func", obj))).splitlines()
    first = next((n for n, line in enumerate(src) if start and start in line), 0)
    last = next((n for n, line in enumerate(src) if stop and n > first and stop in line), len(src))
    out, current = [], ""
    for line in src[first:last]:
        m = _LINE_REF.search(line)
        if m:
            current = m.group(1) + (f"-{m.group(2)}" if m.group(2) else "")
        out.append(f"{current:>6} | {line}")
    return "\n".join(out)


def show(fig) -> None:
    """Display a matplotlib Figure in a notebook as a PNG (and nothing outside IPython)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:  # a plain Python run of the lesson source
        return
    if get_ipython() is not None:
        display(Image(buf.getvalue()))


def counted_beside_model(counted, kernel: str, BH: int, N: int, d: int, dtype, Ns=(1024, 4096, 16384),
                         block=None) -> str:
    """A table: the bytes each kernel of a call counted at the simulator's size, beside the IO model's
    bytes for the same kernels at real sizes (``B*H = 1``, the blocks the package would choose for
    ``d``), and the share of each at the largest N.

    ``counted``: the :class:`~flash_numba.hbm.HBMCount` of a call at ``(BH, N, d)`` with ``block``; the
    first column is checked against the model, so the table shows one model, measured small and
    extrapolated large.
    """
    from .. import iomodel

    here = iomodel.forward(kernel, BH, N, N, d, dtype, False, block)
    if counted != here:
        raise ValueError(f"counted: the counts differ from the IO model at N = {N}: {counted} vs {here}")
    big = {n: iomodel.forward(kernel, 1, n, n, d, dtype) for n in Ns}
    w = max(len(name) for name in here.per_kernel) + 2
    cols = "".join(f"{'N = ' + format(n, ','):>14}" for n in Ns)
    lines = [f"{kernel}, d = {d}: bytes counted now, and the IO model at real sizes (one head)",
             f"{'kernel':<{w}}{'counted, N = ' + str(N):>18}{cols}{'share':>8}"]
    last = big[Ns[-1]]
    for name, kb in here.per_kernel.items():
        row = "".join(f"{big[n].per_kernel[name].total / 1e6:>11.1f} MB" for n in Ns)
        share = last.per_kernel[name].total / last.total
        lines.append(f"{name:<{w}}{kb.total:>18,}{row}{share:>8.0%}")
    return "\n".join(lines)


def sdpa_backend_rows(q, k, v, o_ref, time_ms, dtypes=None) -> list[tuple[str, str, str, str]]:
    """PyTorch's SDPA under each backend it has, on torch tensors ``q, k, v`` (B, H, N, d).

    Returns rows ``(backend, dtype, time, error)``: the time from ``time_ms(call)`` (None prints as
    "-") and the largest error of head (0, 0) against ``o_ref`` (one head of the float64 reference),
    or ``"refused"`` and PyTorch's first reason when a backend cannot run these inputs.
    """
    import warnings

    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
    backends = [b for b in names if hasattr(SDPBackend, b)]  # CUDNN_ATTENTION: PyTorch 2.5 and later
    rows = []
    for dt in dtypes or (torch.float32, torch.float16):
        xq, xk, xv = (x.to(dt) for x in (q, k, v))
        for name in backends:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with sdpa_kernel(getattr(SDPBackend, name)):
                        o = F.scaled_dot_product_attention(xq, xk, xv)
                        t = time_ms(lambda: F.scaled_dot_product_attention(xq, xk, xv))
                    err = np.abs(o[0, 0].double().cpu().numpy() - o_ref).max()
                    rows.append((name, str(dt)[6:], "-" if t is None else f"{t:.2f} ms", f"{err:.1e}"))
                except RuntimeError as exc:
                    reasons = [str(w.message) for w in caught] or [str(exc)]
                    rows.append((name, str(dt)[6:], "refused", "; ".join(r.splitlines()[0][:90] for r in reasons)))
    return rows
