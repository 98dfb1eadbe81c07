"""Naive oracles for The three budgets in numbers: roofline, memory per rank, and the 4D mesh's hidden checks: the textbook, in float64, with plain loops.

None of this is the solution.

- `oracle_compute`: TODO: what it computes and how (the scaffold's placeholder: each row's sum, a Python loop
  over lists in float64).
"""

from __future__ import annotations

import torch


def oracle_compute(x: torch.Tensor) -> torch.Tensor:
    """Each row's sum, row by row over Python lists, in float64."""
    return torch.tensor([sum(row) for row in x.double().tolist()], dtype=torch.float64)
