"""GPTQ: the exercise. Read README.md in this folder first.

Fill in the four functions that raise NotImplementedError. `QuantResult` and `quantize` are given.
Run the public tests with `make check EX=gptq` (or `.venv/bin/pytest exercises/gptq`).

Conventions shared by every function here:
- W is a weight matrix [rows, cols] = [out_features, in_features], as in torch.nn.Linear: the layer
  computes W @ x for an input column x of `cols` features. Quantisation grids are per output ROW
  (and per group of `group_size` consecutive input columns when group_size > 0).
- All the arithmetic happens in fp32, whatever W's dtype; Q comes back in W's dtype.
- bits is an int from 2 to 8; maxq = 2**bits - 1 is the largest integer code.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class QuantResult(NamedTuple):
    """What quantize_rtn and gptq_quantize return.

    Q:     the dequantised weights (every value on its row's or group's grid): W's shape, dtype, device.
    scale: fp32 [rows, n_groups], the grid step of each row (and group).
    zero:  fp32 [rows, n_groups], the integer code that stands for 0.0 (a whole number stored as a float).
    g_idx: int64 [cols], the group of each column of W, in W's original column order: column j uses
           scale[:, g_idx[j]] and zero[:, g_idx[j]]. Without groups: all zeros (n_groups = 1).
    loss:  a Python float, the sum over all weights of (w - q)^2 / d^2 / 2 (GPTQ), or None (RTN).
    """

    Q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    g_idx: torch.Tensor
    loss: float | None


def quantize(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """Round x onto the grid {scale * (k - zero) : k = 0..maxq} and return the dequantised values.

    Given complete: this exact formula fixes the rounding convention. torch.round rounds half to even
    (2.5 -> 2), and a symmetric grid puts a row's largest magnitude exactly on such a tie, so every
    implementation must round the same way. `scale` and `zero` broadcast against x: for one column
    x [rows] pass scale[:, g] and zero[:, g]; for a block x [rows, k] pass [rows, 1] views.
    """
    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return scale * (q - zero)


def fit_quantizer(w: torch.Tensor, bits: int = 4, sym: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Fit one grid per row of w [rows, k]; returns fp32 (scale, zero), each of shape [rows].

    Asymmetric (default): xmin = min(row.min(), 0), xmax = max(row.max(), 0) (the grid always holds 0),
        scale = (xmax - xmin) / maxq, zero = round(-xmin / scale).
    Symmetric: xmax = max(|xmin|, xmax) and xmin = -xmax for EVERY row (also rows with no negative
        value), scale = (xmax - xmin) / maxq, zero = (maxq + 1) / 2.
    A row with xmin == xmax == 0 (all zeros) uses xmin = -1, xmax = 1 instead: never divide by 0.

    Raises:
        ValueError: if bits is not an int from 2 to 8.
    """
    raise NotImplementedError("fit_quantizer: row min and max (both clamped to include 0), then scale and zero")


def quantize_rtn(W: torch.Tensor, bits: int = 4, group_size: int = -1, sym: bool = False) -> QuantResult:
    """Round-to-nearest, the baseline: each weight to its row's (or row-and-group's) grid, independently.

    group_size <= 0: one grid per row (n_groups = 1). group_size > 0: columns [g*gs, (g+1)*gs) form
    group g, with its own grid per row; the last group may be partial (n_groups = ceil(cols / gs)).
    Returns QuantResult(Q, scale, zero, g_idx, loss=None).

    Raises:
        ValueError: if W is not a 2-D floating-point tensor, holds NaN, or bits is outside 2..8.
    """
    raise NotImplementedError("quantize_rtn: fit_quantizer per group of columns, then quantize every column")


def accumulate_hessian(H: torch.Tensor, n: int, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Fold a batch of calibration inputs into the running Hessian of ||W X - Q X||^2.

    Args:
        H: fp32 [cols, cols], the Hessian of the n rows seen so far (zeros when n == 0).
        n: the number of input ROWS seen so far (not the number of calls).
        x: [..., cols], any float dtype: leading dims are flattened, so x holds m = x.numel() // cols rows.

    Returns:
        (H, n + m) with H = (2 / (n + m)) * (sum over all n + m rows of x x^T), accumulated in fp32.
        Updating H in place is allowed. Batches of 2 then 5 rows give the same H as one batch of 7.
        A batch of 0 rows returns (H, n) unchanged.

    Raises:
        ValueError: if x's last dim is not cols.
    """
    raise NotImplementedError("accumulate_hessian: rescale H by n / (n + m), then add (2 / (n + m)) x^T x")


def gptq_quantize(
    W: torch.Tensor,
    H: torch.Tensor,
    bits: int = 4,
    group_size: int = -1,
    block_size: int = 128,
    percdamp: float = 0.01,
    sym: bool = False,
    act_order: bool = False,
    static_groups: bool = False,
) -> QuantResult:
    """Quantise W [rows, cols] column by column, feeding each column's rounding error forward.

    H is the Hessian [cols, cols] (fp32, on W's device) from accumulate_hessian. W and H are not modified.
    The steps, in this order:
      1. dead columns: where H[i, i] == 0, set H[i, i] = 1 and W[:, i] = 0;
      2. act_order: process the columns in a stable descending sort of diag(H) (permute W and H);
      3. damping: add percdamp * mean(diag(H)) to H's diagonal;
      4. U = cholesky(cholesky_inverse(cholesky(H)), upper=True), the upper Cholesky factor of H^-1;
      5. without groups, fit each row's grid once (fit_quantizer) on the fixed, permuted W;
      6. for each column i in order: q = quantize(w_i); err = (w_i - q) / U[i, i]; the loss gains
         err^2 / 2; the remaining columns j > i of the current block get w_j -= err * U[i, j]; after a block
         of `block_size` columns, every later column gets the block's errors at once:
         W[:, later] -= Err_block @ U[block, later] (the lazy batch).
    Groups (group_size > 0): group g holds the ORIGINAL columns [g*gs, (g+1)*gs) (the last may be
    partial). Its grid is fit when its first column is reached, from the weights as updated so far
    (all feedback from earlier columns applied). With static_groups=True, every group's grid is fit
    from W (after step 1) before any update instead. act_order with groups requires static_groups.
    Returns QuantResult(Q in W's original column order, scale, zero, g_idx, loss).

    Raises:
        ValueError: W not a 2-D floating tensor; H not [cols, cols]; NaN or inf in W or H; bits not
            an int in 2..8; block_size not a positive int; percdamp < 0; act_order with groups but not static_groups;
            dynamic groups (group_size > 0, static_groups=False) where neither block_size nor
            group_size divides the other.
    """
    raise NotImplementedError("gptq_quantize: damp, Cholesky of H^-1, then quantise block by block")
