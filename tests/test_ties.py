"""grader.testing's rule for rounded values: a difference is accepted only where the oracle itself sat
on a rounding tie (`assert_equal_up_to_ties`, `near_midpoint`)."""

from __future__ import annotations

import math

import pytest
import torch

from grader.testing import assert_equal_up_to_ties, near_midpoint

STEP = 0.25  # the grid step of the rounded values below


def rounded(rows: int = 4, cols: int = 6) -> torch.Tensor:
    """An oracle's rounded values: whole multiples of STEP."""
    return STEP * torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols).remainder(7)


def ties_at(*where: tuple[int, int], shape=(4, 6)) -> torch.Tensor:
    ties = torch.zeros(shape, dtype=torch.bool)
    for r, j in where:
        ties[r, j] = True
    return ties


def compare(got, want, ties, **kw):
    return assert_equal_up_to_ties(got, want, ties=ties, atol=1e-3 * STEP, what="Q", **kw)


# --------------------------------------------------------------------------------------------------
# near_midpoint: where the oracle's own computation sits on a tie


def test_near_midpoint_marks_midpoints_and_a_few_ulps_around_them():
    eps = torch.finfo(torch.float32).eps
    v = torch.tensor([2.5, 2.5 + 3 * eps, 2.5 - 3 * eps, -3.5, 2.5 + 1e-3, 3.0, 0.0, 2.49])
    assert near_midpoint(v, tol=8 * eps).tolist() == [True, True, True, True, False, False, False, False]


def test_near_midpoint_never_marks_nan_or_inf():
    v = torch.tensor([math.nan, math.inf, -math.inf, 0.5])
    assert near_midpoint(v, tol=0.5).tolist() == [False, False, False, True]


def test_near_midpoint_takes_a_tolerance_per_element():
    v = torch.tensor([1.5 + 1e-4, 1.5 + 1e-4])
    assert near_midpoint(v, tol=torch.tensor([1e-5, 1e-3])).tolist() == [False, True]


# --------------------------------------------------------------------------------------------------
# assert_equal_up_to_ties along rows (GPTQ: a rounding feeds the rest of its row)


def test_equal_values_pass_and_nothing_is_accepted():
    want = rounded()
    accepted = compare(want.clone(), want, ties=None)
    assert accepted.shape == want.shape and not accepted.any()


def test_a_difference_at_a_tie_of_the_oracle_is_accepted_with_the_rest_of_its_row():
    want = rounded()
    got = want.clone()
    got[1, 2] += STEP  # the other side of the tie the oracle sat on at [1, 2] ...
    got[1, 4] -= 3 * STEP  # ... after which row 1 legitimately follows another path
    accepted = compare(got, want, ties=ties_at((1, 2)))
    assert accepted.nonzero().tolist() == [[1, 2], [1, 4]]
    assert accepted.any(1).tolist() == [False, True, False, False]


def test_a_difference_after_a_tie_that_broke_the_same_way_is_accepted():
    # A tie in a grid fit (a zero point) can break the other way without changing the value at the
    # tie itself; its consequence shows at a later column of the same row.
    want = rounded()
    got = want.clone()
    got[2, 5] += STEP
    assert compare(got, want, ties=ties_at((2, 1))).any(1).tolist() == [False, False, True, False]


def test_a_difference_with_no_tie_in_the_oracle_is_refused():
    want = rounded()
    got = want.clone()
    got[3, 4] += STEP
    with pytest.raises(AssertionError) as info:
        compare(got, want, ties=ties_at((1, 2)))  # a tie elsewhere does not excuse row 3
    message = str(info.value)
    assert "1 of 4 rows differ" in message and "Row 3, column 4" in message, message
    assert "found 0.5, expected 0.25" in message, message
    assert "no rounding tie in this row" in message, message


def test_a_difference_before_the_tie_is_refused():
    want = rounded()
    got = want.clone()
    got[1, 1] += STEP  # the oracle's tie in row 1 is only at column 3
    got[1, 3] += STEP
    with pytest.raises(AssertionError) as info:
        compare(got, want, ties=ties_at((1, 3)))
    message = str(info.value)
    assert "Row 1, column 1" in message, message
    assert "first rounding tie in this row is later, at column 3" in message, message


def test_before_and_after_follow_the_processing_order():
    want = rounded()
    got = want.clone()
    got[0, 1] += STEP
    order = [4, 5, 3, 0, 2, 1]  # column 3 is processed before column 1
    assert compare(got, want, ties=ties_at((0, 3)), order=order).any(1).tolist() == [True, False, False, False]
    with pytest.raises(AssertionError) as info:
        compare(got, want, ties=ties_at((0, 3)), order=list(reversed(order)))  # now column 1 comes first
    assert "Row 0, column 1 (position 0 in the processing order)" in str(info.value), str(info.value)


def test_every_refused_row_is_counted_and_the_first_is_named():
    want = rounded()
    got = want.clone()
    got[2, 0] += STEP
    got[3, 5] += STEP
    got[1, 4] += STEP  # accepted: a tie at [1, 4]
    with pytest.raises(AssertionError) as info:
        compare(got, want, ties=ties_at((1, 4)))
    assert "2 of 4 rows differ" in str(info.value) and "Row 2, column 0" in str(info.value), str(info.value)


def test_nan_is_never_a_tie():
    want = rounded()
    got = want.clone()
    got[1, 2] = math.nan
    with pytest.raises(AssertionError) as info:
        compare(got, want, ties=ties_at((1, 0)))
    assert "Row 1, column 2: found nan" in str(info.value) and "NaN or inf is never a rounding tie" in str(info.value)


def test_tie_atol_bounds_the_jump_at_the_tie_itself():
    want = rounded()
    got = want.clone()
    got[1, 2] += STEP
    compare(got, want, ties=ties_at((1, 2)), tie_atol=1.25 * STEP)
    got[1, 2] += STEP  # two steps: not the other side of a tie
    with pytest.raises(AssertionError) as info:
        compare(got, want, ties=ties_at((1, 2)), tie_atol=1.25 * STEP)
    assert "the other side of a tie is at most 0.3125 away" in str(info.value), str(info.value)


def test_a_hint_gets_the_refused_index():
    want = rounded()
    got = want.clone()
    got[2, 3] += STEP
    with pytest.raises(AssertionError) as info:
        compare(got, want, ties=None, hint=lambda at: f"look at row {at[0]} column {at[1]}")
    assert str(info.value).endswith("look at row 2 column 3"), str(info.value)


# --------------------------------------------------------------------------------------------------
# element by element (path=False: round-to-nearest, where no rounding feeds another)


def test_elementwise_a_tie_excuses_only_its_own_element():
    want = rounded()
    got = want.clone()
    got[1, 2] += STEP
    assert compare(got, want, ties=ties_at((1, 2)), path=False).nonzero().tolist() == [[1, 2]]
    got[1, 4] += STEP  # after the tie, but elements do not feed one another
    with pytest.raises(AssertionError) as info:
        compare(got, want, ties=ties_at((1, 2)), path=False)
    assert "1 of 24 values differ" in str(info.value) and "[1, 4]" in str(info.value), str(info.value)


# --------------------------------------------------------------------------------------------------
# the test's own mistakes


def test_ties_of_the_wrong_shape_are_the_test_s_bug():
    with pytest.raises(ValueError, match="ties must have the shape"):
        compare(rounded(), rounded(), ties=torch.zeros(4, 5, dtype=torch.bool))


def test_an_order_that_is_not_a_permutation_is_the_test_s_bug():
    with pytest.raises(ValueError, match="permutation"):
        compare(rounded(), rounded(), ties=None, order=[0, 1, 2, 3, 4, 4])


def test_a_shape_mismatch_fails_like_assert_close():
    with pytest.raises(AssertionError, match=r"shape is \[4, 5\], expected \[4, 6\]"):
        compare(rounded(4, 5), rounded(), ties=None)
