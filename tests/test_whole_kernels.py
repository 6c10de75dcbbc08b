"""The whole-kernel exercises (lessons 7 and 9): the packaged kernels pass, and each classic wrong kernel fails
with the verdict that names it (values, bytes, shared-memory races, global write races)."""

import io
from contextlib import redirect_stdout

import pytest

from flash_numba.course import exercises as ex
from flash_numba.course import bugzoo
from flash_numba.course import flash_checks as kx


def _edited(factory_name, *edits):
    """The packaged factory ``factory_name`` with ``edits`` ((old, new), each old text found once) applied."""
    return bugzoo.edited_factory(factory_name, edits)


def _verdict(name, answer):
    buf = io.StringIO()
    with redirect_stdout(buf):
        ok = ex.check(name, answer)
    return ok, buf.getvalue()


@pytest.mark.parametrize("name", sorted(kx.WHOLE_KERNELS))
def test_the_packaged_kernel_passes(name):
    assert ex.check_solution(name)


def test_a_kernel_still_raising_is_not_done():
    def make(Br, Bc, d, causal):
        from numba import cuda

        @cuda.jit
        def kernel(q, k, v, o, L, scale, counter):
            raise NotImplementedError("write the kernel")

        return kernel

    ok, text = _verdict("flash2_kernel", make)
    assert not ok and "not done yet" in text


FORWARD_WRONG = {  # what the learner gets wrong -> (edits, a phrase of the verdict)
    "no barrier after the loads": (
        [("            cuda.syncthreads()  # K_j, V_j are complete\n", "")], "shared memory"),
    "no barrier before the loads": (
        [("            cuda.syncthreads()  # every thread is done with the previous K_j, V_j\n", "")],
        "shared memory"),
    "a mask off by one": ([("if c0 + c > row + diag:", "if c0 + c >= row + diag:")], "a mask off by one"),
    "a top-left mask": ([("            diag = Nk - Nq\n", "            diag = 0\n")], "top-left"),
    "every key tile loaded under the mask": (
        [("                n_tiles = min(n_tiles, last_key // Bc + 1)", "                n_tiles = n_tiles")],
        "none of its rows sees"),
    "the scale applied twice": ([("                    s *= scale\n", "                    s *= scale * scale\n")],
                                "the scale applied twice"),
    "every tile taken as full": ([("            cols = min(Bc, Nk - c0)", "            cols = Bc")], "index"),
    "no -inf guard": ([("                if m_new != NEG_INF:", "                if True:")], "Nq = 13 > Nk = 6"),
}


@pytest.mark.parametrize("mistake", sorted(FORWARD_WRONG))
def test_a_wrong_forward_kernel_is_named(mistake):
    edits, phrase = FORWARD_WRONG[mistake]
    ok, text = _verdict("flash2_kernel", _edited("flash2_forward_kernel", *edits))
    assert not ok and phrase in text, text


DQ_WRONG = {
    "dq_kernel": {
        "dQ without its scale": ([("                        dq_r[x] += scale * dS * K_j[c, x]",
                                   "                        dq_r[x] += dS * K_j[c, x]")], "without its factor scale"),
        "the mask ignored": ([("                    if c0 + c > row + diag:\n                        continue",
                               "                    if False:\n                        continue")],
                             "ignores the causal mask"),
        "no barrier after the loads": ([("                nr += 2 * E\n            cuda.syncthreads()\n",
                                         "                nr += 2 * E\n")], "shared memory"),
    },
    "dq_atomic": {
        "a plain add into dQ": ([("                        cuda.atomic.add(dq, (r0 + r, x), scale * dS * k_c[x])",
                                  "                        dq[r0 + r, x] += scale * dS * k_c[x]")],
                                "a write race in global memory"),
        "the mask ignored": ([("                    if col > r0 + r + diag:\n                        continue",
                               "                    if False:\n                        continue")],
                             "ignores the causal mask"),
        "a zero added for every masked pair": (
            [("                    if col > r0 + r + diag:\n"
              "                        continue  # masked: P = 0, nothing to add\n", ""),
             ("                    P = math.exp(scale * s - L_i[r])\n",
              "                    P = math.exp(scale * s - L_i[r])\n                    if col > r0 + r + diag:\n"
              "                        P = ZERO\n")],
            "dQ: "),
    },
}


@pytest.mark.parametrize("name,mistake", [(n, m) for n, ms in DQ_WRONG.items() for m in ms])
def test_a_wrong_dq_kernel_is_named(name, mistake):
    edits, phrase = DQ_WRONG[name][mistake]
    factory = {"dq_kernel": "dq_kernel", "dq_atomic": "dq_atomic_kernel"}[name]
    ok, text = _verdict(name, _edited(factory, *edits))
    assert not ok and phrase in text, text


def test_the_race_picture_of_a_plain_add():
    """What lesson 7 shows: the atomic kernel's adds are recorded; a plain add is a write race, an atomic one not."""
    plain = _edited("dq_atomic_kernel", *bugzoo.PLAIN_ADD)
    bad = kx.measure_kernel("dq_atomic", plain, 4, 8)
    good = kx.measure_kernel("dq_atomic", kx.dq_atomic_kernel, 4, 8)
    assert kx.write_races(bad) is not None and kx.write_races(good) is None
    assert len(good["atomics"]) == 4 * 8 * 4  # one add per (query, key) pair per element of d
    # the simulator runs one thread at a time: the values agree, only the write record sees the race
    assert abs(good["dQ"] - bad["dQ"]).max() < 1e-5
