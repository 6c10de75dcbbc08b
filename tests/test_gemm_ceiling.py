"""benchmarks/gemm_ceiling.py: its products are attention's (shapes, values against float64, FLOPs), and without
a GPU it stops with a message instead of timing nothing."""

import runpy
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gemm_ceiling.py"


def _script() -> dict:
    """The tool's globals (``products``, ``main``), run as a module is, without ``__main__``."""
    return runpy.run_path(str(SCRIPT))


@pytest.mark.parametrize("bh, n, d", [(1, 17, 16), (3, 97, 40)])
def test_products_are_attentions_with_their_flops(bh, n, d):
    prods = _script()["products"](bh, n, d, device="cpu", seed=1)
    g = torch.Generator().manual_seed(1)
    q, k, do = (torch.randn(bh, n, d, generator=g).double().numpy() for _ in range(3))
    p = torch.randn(bh, n, n, generator=g).double().numpy()
    expected = {"S": (q @ k.transpose(0, 2, 1), (n, n, d)), "dV": (p.transpose(0, 2, 1) @ do, (n, d, n)),
                "dQ": (p @ k, (n, d, n))}
    assert len(prods) == 3
    for name, (call, flops) in prods.items():
        ref, (m, cols, inner) = expected[name.split(" ")[0]]
        out = call().double().numpy()
        assert out.shape == ref.shape == (bh, m, cols)
        # float32 sums of `inner` products of unit normals: the error grows like sqrt(inner) ulps of the terms
        assert np.max(np.abs(out - ref)) <= 8 * np.sqrt(inner) * np.finfo(np.float32).eps * np.max(np.abs(ref))
        assert flops == 2 * bh * m * cols * inner


def test_without_a_gpu_it_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs PyTorch with CUDA"):
        _script()["main"](["--n", "16", "--d", "16"])
