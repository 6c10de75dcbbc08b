"""Wrong answers the checkers once let through (issue 35), each fed to its checker, which must now reject it."""

import io
from contextlib import redirect_stdout

import numpy as np

from flash_numba.course import bugzoo
from flash_numba.course import exercises as ex


def _verdict(name, answer):
    buf = io.StringIO()
    with redirect_stdout(buf):
        ok = ex.check(name, answer)
    return ok, buf.getvalue()


def _loop_with(*edits):
    return bugzoo.edited("flash2_rows", edits, "a wrong flash2_loop")


def test_flash2_loop_rejects_a_mask_off_by_one():
    ok, text = _verdict("flash2_loop", _loop_with(("if c0 + c > row + diag:", "if c0 + c >= row + diag:")))
    assert not ok and "causal" in text.split("\n")[0], text
    assert "a mask off by one" in text, text


def test_flash2_loop_rejects_a_missing_minus_inf_guard():
    wrong = _loop_with(("            if m_new != NEG_INF:  # a row that has seen no visible key keeps (O_acc, l, m)"
                        " = (0, 0, -inf)\n", "            if True:\n"))
    ok, text = _verdict("flash2_loop", wrong)
    assert not ok and "Nq = 13 > Nk = 6" in text, text


def test_flash2_loop_rejects_a_missing_l_guard():
    wrong = _loop_with(("        if l_i > ZERO:\n            L_r = m_i + math.log(l_i)\n            inv = 1 / l_i\n",
                        "        L_r = m_i + math.log(max(l_i, np.float32(1e-30)))\n        inv = 1 / l_i\n"))
    ok, text = _verdict("flash2_loop", wrong)
    assert not ok and "Nq = 13 > Nk = 6" in text, text


def test_flash2_loop_passes_its_solution_on_every_case():
    ok, text = _verdict("flash2_loop", ex.solution_fn("flash2_loop"))
    assert ok and "9 cases" in text, text


def _rescale_without_o_rescale(O_i, l_i, m_i, S_ij, V_j):
    m_t = S_ij.max(axis=1)
    m_t_safe = np.where(m_t == -np.inf, 0.0, m_t)
    P_t = np.exp(S_ij - m_t_safe[:, None])
    m_new = np.maximum(m_i, m_t)
    m_new_safe = np.where(m_new == -np.inf, 0.0, m_new)
    a, b = np.exp(m_i - m_new_safe), np.exp(m_t - m_new_safe)
    l_new = a * l_i + b * P_t.sum(axis=1)
    l_div = np.where(l_new > 0, l_new, 1.0)
    return (l_i[:, None] * O_i + b[:, None] * (P_t @ V_j)) / l_div[:, None], l_new, m_new  # O_i not rescaled by a


def test_flash_rescale_catches_a_missing_o_rescale_where_the_maximum_moves():
    ok, text = _verdict("flash_rescale", _rescale_without_o_rescale)
    assert not ok and "case 2 of" in text and "maximum moves" in text, text


def test_mystery_verdicts_describe_symptoms_not_the_bug(capsys):
    from flash_numba.course import flash_checks as kx

    for letter, name in bugzoo.MYSTERIES.items():
        assert kx.examine(letter)
        text = capsys.readouterr().out
        assert "wrong on case" in text and "yours equals what" not in text and "top-left" not in text, text
        assert "the last tile is partial" not in text and name not in text, text
    # the full verdict of the same kernel still names the mistake, for the learner's own code
    ok, text = _verdict("flash1_block", bugzoo.build(bugzoo.MYSTERIES["B"]))
    assert not ok and "yours equals what the scale applied twice" in text


def test_repairs_reject_the_broken_kernel_and_accept_a_repaired_one():
    from flash_numba.course import flash_checks as kx

    for exercise, exhibit in kx.REPAIRS.items():
        ok, text = _verdict(exercise, bugzoo.build(exhibit))
        assert not ok, text
        assert ex.check_solution(exercise)


def test_lesson_11_starts_each_repair_from_the_broken_kernel():
    from pathlib import Path

    from flash_numba.course import flash_checks as kx

    text = (Path(__file__).resolve().parents[1] / "lessons" / "_src" / "11_bug_zoo.py").read_text()
    for exercise, name in (("fix_missing_barrier", "repaired_barrier"), ("fix_stale_max", "repaired_max")):
        assert kx.broken(exercise).replace("def flash2_rows(", f"def {name}(") in text, exercise


def test_no_lesson_prints_a_solution_or_a_diff_on_run_all():
    import re
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "lessons" / "_src").glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
            assert not re.search(r"\bex\.solution\(|bugzoo\.diff\(|bugzoo\.source\(|\.broken\(", code), \
                f"{path.name}:{n}: {line}"
