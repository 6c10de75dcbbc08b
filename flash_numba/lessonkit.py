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
