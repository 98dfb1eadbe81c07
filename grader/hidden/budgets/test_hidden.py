"""Hidden checks for The three budgets in numbers: roofline, memory per rank, and the 4D mesh.

The oracles (oracle.py) are TODO: the textbook each test compares against.

The signature: TODO: what the technique does that the textbook computation does not, how `signature` observes
it, and what it cannot see (the scaffold's placeholder counts the lines, operators and read-backs of one call
at 16 and at 512 rows).

Contract clauses (README "The contract") and the tests that draw them:

| clause | tests |
| --- | --- |
| TODO: every clause of the README's contract | TODO: the tests that draw it |
| compute(x): [rows, cols] -> [rows], each row's sum, x's dtype | test_compute_against_the_oracle |
| no Python loop over rows | test_compute_is_vectorised |
"""

import pytest
import torch

from grader.hidden.budgets.oracle import oracle_compute
from grader.structure import assert_no_hidden_loop
from grader.testing import assert_close


@pytest.fixture(scope="module")
def sm(student):
    return student.load("budgets")


@pytest.mark.check("compute")
@pytest.mark.parametrize("rows,cols", [(0, 3), (1, 1), (7, 129)])
def test_compute_against_the_oracle(sm, rng, rows, cols):
    x = torch.randn(rows, cols, generator=rng, dtype=torch.float64)
    got = sm.compute(x)
    assert isinstance(got, torch.Tensor) and got.dtype == x.dtype, (
        f"compute on {rows} x {cols} float64: expected a float64 tensor, found {type(got).__name__} "
        f"{getattr(got, 'dtype', '')}")
    assert_close(got, oracle_compute(x), atol=1e-9, rtol=1e-9, what=f"compute(x) on {rows} x {cols} [row]",
                 hint="TODO: what to look at (placeholder: each row's sum)")


@pytest.mark.check("signature")
def test_compute_is_vectorised(sm, student):
    work = {}
    for rows in (16, 512):
        def check(out, rows=rows):
            assert_close(out, torch.full((rows,), 4.0), atol=0, rtol=0, what=f"compute(ones({rows}, 4)) [row]")

        _, work[rows] = student.work_executed(sm.compute, torch.ones(rows, 4), check=check)
    advice = "TODO: the advice (placeholder: sum every row in one tensor operation)"
    assert work[512].lines <= work[16].lines + 8, (
        f"compute ran {work[16].lines} lines of your file for 16 rows and {work[512].lines} for 512: a Python "
        f"loop over rows. {advice}")
    assert_no_hidden_loop("compute", ("16 rows", "512 rows"), work[16], work[512], advice)
