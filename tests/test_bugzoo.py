"""Every exhibit of the bug zoo is caught by its exercise's checker, with a message that names the bug."""

import pytest

from flash_numba.course import bugzoo
from flash_numba.course import exercises as ex
from flash_numba.device import SIMULATOR

# What the verdict must say for each exhibit (the words that point at the bug).
NAMED_BY = {
    "missing_barrier": ["threads race on shared array K_j", "before any syncthreads"],
    "stale_max": ["stale maximum"],
    "top_left_mask": ["top-left bound"],
    "partial_tile": ["IndexError", "the last tile is partial"],
    "backward_ignores_causal": ["causal", "ignores the causal mask"],
    "scale_twice": ["the scale applied twice"],
    "uncounted_load": ["your counter"],
    "reread_k": ["HBM bytes", "read from HBM again"] if SIMULATOR else ["HBM bytes"],
    "o_every_tile": ["HBM bytes", "O: ", "at every tile"] if SIMULATOR else ["HBM bytes"],
}


def test_the_zoo_has_the_bugs_the_course_promises():
    assert set(bugzoo.names()) == set(NAMED_BY)
    assert len(bugzoo.names()) >= 6


#: Caught only in the simulator: its trace sees single loads, its race detector sees every shared-memory access.
SIMULATOR_ONLY = {"uncounted_load", "missing_barrier"}


@pytest.mark.parametrize("name", list(NAMED_BY))
def test_the_checker_catches_it(name, capsys):
    if name in SIMULATOR_ONLY and not SIMULATOR:
        pytest.skip("on a GPU nothing sees single loads, and a race may not show (lesson 11 says so)")
    exhibit = bugzoo.EXHIBITS[name]
    assert not ex.check(exhibit.exercise, bugzoo.build(name))
    out = capsys.readouterr().out
    assert "wrong on" in out
    for words in NAMED_BY[name]:
        assert words in out, f"{name}: the verdict does not say {words!r}:\n{out}"


@pytest.mark.parametrize("name", list(NAMED_BY))
def test_an_exhibit_is_a_small_edit_of_the_solution(name):
    changed = [line for line in bugzoo.diff(name).splitlines()[2:] if line[:1] in "+-"]
    assert 1 <= len(changed) <= 3, changed
    assert bugzoo.source(name) != bugzoo._solution_source(bugzoo.EXHIBITS[name])


def test_unknown_exhibit():
    with pytest.raises(ValueError, match="^name: unknown exhibit"):
        bugzoo.diff("nope")
