"""The three budgets in numbers: roofline, memory per rank, and the 4D mesh: the exercise. Read README.md in this folder first.

TODO: what the student writes here and the conventions every function shares (dtypes, devices, what no function
may do). Run the public tests with `make check EX=budgets` (or `.venv/bin/pytest exercises/budgets`).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def compute(x: Tensor) -> Tensor:
    """TODO: the contract, as README.md states it (the scaffold's placeholder: the sum of each row).

    Args:
        x: [rows, cols] floating-point tensor.

    Returns:
        [rows], x's dtype: the sum of each row, with no Python loop over rows.
    """
    raise NotImplementedError("compute: the sum of each row of x")
