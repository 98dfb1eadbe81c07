"""Public tests for The three budgets in numbers: roofline, memory per rank, and the 4D mesh: small, fast, and each failure says what to look at.

Run: make check EX=budgets   (or: .venv/bin/pytest exercises/budgets)
TODO: a few hand-worked cases, each with a message that teaches (the scaffold's placeholder checks one).
"""

import pytest
import torch

from grader.testing import assert_close


@pytest.fixture(scope="module")
def sm(student):
    return student.load("budgets")


@pytest.mark.check("compute_public")
def test_compute_on_a_hand_worked_input(sm):
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert_close(sm.compute(x), torch.tensor([6.0, 15.0]), atol=0, rtol=0, what="compute(x) [row]",
                 hint="TODO: the mistake this case catches and what to look at (placeholder: each row's sum)")
