"""Naive oracles for online softmax's hidden checks: the textbook formulas in float64, never the solution.

- `naive_state(x)`: the softmax state of each row of a 2-D `x`, m = max_j x_j and
  l = sum_j exp(x_j - m), in float64 over the whole row at once (no chunks, no rescaling). A row of
  only -inf (or of no columns) has m = -inf and l = 0: its shift is taken as 0, so exp(-inf) = 0
  rather than exp(-inf - (-inf)) = NaN.
- `naive_softmax(x)`: softmax over the last dimension, exp(x_j - m) / l with (m, l) from
  `naive_state`, in float64; a row of only -inf gives zeros (divided by 1, not by l = 0).
"""

import torch

INF = float("inf")


def naive_state(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row max and sum(exp(x - max)) in float64; rows of only -inf give (-inf, 0)."""
    x = x.double()
    m = x.amax(dim=1) if x.shape[1] else torch.full(x.shape[:1], -INF, dtype=torch.float64)
    safe = torch.where(m == -INF, torch.zeros_like(m), m)
    return m, torch.exp(x - safe[:, None]).sum(dim=1)


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension in float64, exp(x - max) / sum; rows of only -inf give zeros."""
    rows = x.reshape(-1, x.shape[-1]).double()
    m, l = naive_state(rows)
    safe = torch.where(m == -INF, torch.zeros_like(m), m)
    out = torch.exp(rows - safe[:, None]) / torch.where(l > 0, l, torch.ones_like(l))[:, None]
    return out.reshape(x.shape)
