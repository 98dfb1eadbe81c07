"""GPTQ: the reference solution.

GPTQ (Frantar et al., 2022) quantises a linear layer's weights W [rows, cols] one input column at a
time. After rounding column i it spreads the rounding error over the columns not yet rounded, so
that the layer's OUTPUT on calibration data moves as little as possible: it minimises
||W X - Q X||^2, whose Hessian with respect to each row of W is H = 2 X X^T / n.

The error feedback for column i is row i of U, the upper Cholesky factor of H^-1 (section 4, "Step 3:
Cholesky reformulation"): with d = U[i, i], the rounding error (w - q) / d times U[i, i:] is exactly the
Optimal Brain Surgeon update that re-inverting the Hessian of the remaining columns would give.
Rows are independent (they share H), so all rows are processed at once, one column at a time.

Updating every later column after every column is a rank-1 update of most of W: memory-bound.
The lazy batch (section 4, "Step 2") applies the updates inside a block of `block_size` columns
eagerly, and the block's accumulated error to all later columns once per block, as one matmul.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


class QuantResult(NamedTuple):
    Q: torch.Tensor  # dequantised weights: W's shape, dtype and device
    scale: torch.Tensor  # fp32 [rows, n_groups]
    zero: torch.Tensor  # fp32 [rows, n_groups], integers stored as floats
    g_idx: torch.Tensor  # int64 [cols]: the group of each original column
    loss: float | None  # sum of (w - q)^2 / d^2 / 2 over all weights; None for round-to-nearest


# --------------------------------------------------------------------------------------------------
# The quantiser: a uniform grid per row (or per row and group of columns)


def fit_quantizer(w: torch.Tensor, bits: int = 4, sym: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row grid for the values of w [rows, k]: returns fp32 (scale, zero), each [rows]."""
    _check_bits(bits)
    maxq = 2**bits - 1
    w = w.float()
    zeros = torch.zeros(w.shape[0], device=w.device)
    # The grid always contains 0, so an all-positive row still maps 0 exactly.
    xmin = torch.minimum(w.amin(dim=1), zeros)
    xmax = torch.maximum(w.amax(dim=1), zeros)
    if sym:
        xmax = torch.maximum(xmin.abs(), xmax)
        xmin = -xmax
    flat = (xmin == 0) & (xmax == 0)  # an all-zero row: any grid will do; avoid scale 0
    xmin = torch.where(flat, -1.0, xmin)
    xmax = torch.where(flat, 1.0, xmax)
    scale = (xmax - xmin) / maxq
    if sym:
        zero = torch.full_like(scale, (maxq + 1) / 2)
    else:
        zero = torch.round(-xmin / scale)
    return scale, zero


def quantize(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """Round x onto the grid scale * (k - zero), k in 0..maxq; returns the dequantised values."""
    q = torch.clamp(torch.round(x / scale) + zero, 0, maxq)
    return scale * (q - zero)


def quantize_rtn(W: torch.Tensor, bits: int = 4, group_size: int = -1, sym: bool = False) -> QuantResult:
    """Round-to-nearest, the baseline: every weight to its row's (or group's) grid, independently."""
    _check_weight(W)
    _check_bits(bits)
    cols = W.shape[1]
    Wf = W.detach().float()
    gs = group_size if group_size > 0 else cols
    fits = [fit_quantizer(Wf[:, s : s + gs], bits, sym) for s in range(0, cols, gs)]
    scale = torch.stack([s for s, _ in fits], dim=1)
    zero = torch.stack([z for _, z in fits], dim=1)
    g_idx = torch.arange(cols, device=W.device) // gs
    Q = quantize(Wf, scale[:, g_idx], zero[:, g_idx], 2**bits - 1)
    return QuantResult(Q.to(W.dtype), scale, zero, g_idx, None)


# --------------------------------------------------------------------------------------------------
# The Hessian of the layer-wise objective


def accumulate_hessian(H: torch.Tensor, n: int, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Fold calibration inputs x [..., cols] into the running H = (2 / n) * sum over rows of x x^T."""
    cols = H.shape[0]
    if x.shape[-1] != cols:
        raise ValueError(f"x has {x.shape[-1]} features but H is {tuple(H.shape)}")
    x = x.reshape(-1, cols).to(H.dtype)
    m = x.shape[0]
    if m == 0:
        return H, n
    # H holds the mean over n rows; rescale it to a mean over n + m, then add the new rows.
    H.mul_(n / (n + m))
    n += m
    x = math.sqrt(2 / n) * x
    H.add_(x.t() @ x)
    return H, n


# --------------------------------------------------------------------------------------------------
# GPTQ


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
    """Quantise W [rows, cols] column by column with error feedback through U = chol(H^-1)^T."""
    _check_gptq_args(W, H, bits, group_size, block_size, percdamp, act_order, static_groups)
    rows, cols = W.shape
    maxq = 2**bits - 1
    dtype = W.dtype
    W = W.detach().to(torch.float32, copy=True)
    H = H.detach().to(device=W.device, dtype=torch.float32, copy=True)
    grouped = group_size > 0
    gs = group_size if grouped else cols
    n_groups = math.ceil(cols / gs)
    scale = torch.zeros(rows, n_groups, device=W.device)
    zero = torch.zeros(rows, n_groups, device=W.device)

    # 1. Dead columns: an input feature that is always 0 has no say in the output; quantise it to 0.
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0

    if grouped and static_groups:  # every group's grid from the original weights, before any update
        for g in range(n_groups):
            scale[:, g], zero[:, g] = fit_quantizer(W[:, g * gs : (g + 1) * gs], bits, sym)

    # 2. Act-order: the columns with the largest Hessian diagonal (most input energy) go first.
    perm = torch.arange(cols, device=W.device)
    if act_order:
        perm = torch.sort(torch.diag(H), descending=True, stable=True).indices
        W, H = W[:, perm], H[perm][:, perm]
    group_of = (perm // gs).tolist()  # group of the column processed at each step

    # 3. Damping, relative to the average diagonal: scaling X leaves the result unchanged.
    H.diagonal().add_(percdamp * torch.diag(H).mean())

    # 4. The Cholesky reformulation: row i of U holds column i's error feedback to columns i..cols.
    try:
        U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    except torch.linalg.LinAlgError as exc:
        raise ValueError(f"H is not positive definite even after damping: raise percdamp ({exc})") from exc

    if not grouped:  # one grid per row, from the fixed (and permuted) weights
        scale[:, 0], zero[:, 0] = fit_quantizer(W, bits, sym)

    Q = torch.zeros_like(W)
    losses = torch.zeros(rows, device=W.device)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        W1 = W[:, i1:i2].clone()  # this block, kept up to date column by column
        U1 = U[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            col = i1 + i
            g = group_of[col]
            if grouped and not static_groups and col % gs == 0:
                # Fit the group from its weights as updated so far. Either it lies inside this block
                # (W1 is current), or it starts the block (W is current: no column of it is done yet).
                end = min(col + gs, cols)
                current = W1[:, i : end - i1] if end <= i2 else W[:, col:end]
                scale[:, g], zero[:, g] = fit_quantizer(current, bits, sym)
            w, d = W1[:, i], U1[i, i]
            q = quantize(w, scale[:, g], zero[:, g], maxq)
            Q[:, col] = q
            err = (w - q) / d
            losses += err**2 / 2
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]  # feedback inside the block, now
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ U[i1:i2, i2:]  # the lazy batch: the block's feedback to the rest, at once

    if act_order:
        Q = Q[:, torch.argsort(perm)]
    g_idx = torch.arange(cols, device=W.device) // gs
    return QuantResult(Q.to(dtype), scale, zero, g_idx, float(losses.sum()))


# --------------------------------------------------------------------------------------------------
# Input checks


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int from 2 to 8, found {bits!r}")


def _check_weight(W: torch.Tensor) -> None:
    if not isinstance(W, torch.Tensor) or W.dim() != 2 or not W.is_floating_point():
        raise ValueError(f"W must be a 2-D floating-point tensor [rows, cols], found {_describe(W)}")
    if W.shape[1] == 0:
        raise ValueError("W has no columns")
    if not torch.isfinite(W).all():
        raise ValueError("W holds NaN or inf")


def _check_gptq_args(W, H, bits, group_size, block_size, percdamp, act_order, static_groups) -> None:
    _check_weight(W)
    _check_bits(bits)
    cols = W.shape[1]
    if not isinstance(H, torch.Tensor) or tuple(H.shape) != (cols, cols):
        raise ValueError(f"H must be [cols, cols] = [{cols}, {cols}] for W of shape {tuple(W.shape)}, found {_describe(H)}")
    if not torch.isfinite(H).all():
        raise ValueError("H holds NaN or inf")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, found {block_size!r}")
    if not percdamp >= 0:
        raise ValueError(f"percdamp must be >= 0, found {percdamp!r}")
    if group_size > 0 and act_order and not static_groups:
        raise ValueError("act_order with groups needs static_groups=True (groups fit in the original column order)")
    if group_size > 0 and not static_groups and block_size % group_size and group_size % block_size:
        raise ValueError(
            f"block_size ({block_size}) and group_size ({group_size}) must divide one another, so that each "
            "group is fit from fully updated weights"
        )


def _describe(x) -> str:
    return f"shape {tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
