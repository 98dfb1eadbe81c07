"""Online softmax: the reference solution.

Softmax needs two numbers per row before it can write anything: the row max m (for stability) and
the normaliser l = sum(exp(x - m)). The online trick (Milakov & Gimelshein, 2018) finds both in ONE
pass: keep a running (m, l) and, whenever the max grows from m to m', rescale the sum by
exp(m - m'). Two such states merge the same way, which is what lets FlashAttention tile a row.
"""

from __future__ import annotations

from typing import Iterable

import torch
import triton
import triton.language as tl

NEG_INF = float("-inf")


def _safe_max(m: torch.Tensor) -> torch.Tensor:
    """The max to subtract: m itself, or 0 for rows that have seen only -inf (avoids -inf - -inf = NaN)."""
    return torch.where(m == NEG_INF, torch.zeros_like(m), m)


def merge_states(
    m_a: torch.Tensor, l_a: torch.Tensor, m_b: torch.Tensor, l_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial normaliser states (m, l) into the state of their union."""
    m = torch.maximum(m_a, m_b)
    shift = _safe_max(m)
    # Each partial sum was taken relative to its own max; move both to the common max.
    l = l_a * torch.exp(m_a - shift) + l_b * torch.exp(m_b - shift)
    return m, l


def online_normalizer(chunks: Iterable[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over column chunks of x[rows, n]: returns fp32 (row max m, sum of exp(x - m))."""
    m = l = None
    for chunk in chunks:
        chunk = chunk.float()
        if m is None:
            m = torch.full(chunk.shape[:1], NEG_INF, dtype=torch.float32, device=chunk.device)
            l = torch.zeros_like(m)
        if chunk.shape[1] == 0:
            continue
        m_chunk = chunk.amax(dim=1)
        l_chunk = torch.exp(chunk - _safe_max(m_chunk)[:, None]).sum(dim=1)
        m, l = merge_states(m, l, m_chunk, l_chunk)
    if m is None:
        raise ValueError("online_normalizer needs at least one chunk, found none")
    return m, l


def online_softmax(x: torch.Tensor, block_size: int = 1024) -> torch.Tensor:
    """Softmax over the last dim, reading x in column blocks: one pass for (m, l), one to write."""
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int (not a bool), found {block_size!r}")
    n = x.shape[-1]
    if n == 0 or x.numel() == 0:
        return torch.empty_like(x)
    rows = x.reshape(-1, n)
    starts = range(0, n, block_size)

    m, l = online_normalizer(rows[:, s : s + block_size] for s in starts)
    shift = _safe_max(m)[:, None]
    inv_l = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))[:, None]  # fully masked rows -> zeros

    out = torch.empty_like(rows)
    for s in starts:
        block = rows[:, s : s + block_size].float()
        out[:, s : s + block_size] = (torch.exp(block - shift) * inv_l).to(x.dtype)
    return out.reshape(x.shape)


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, stride_xr, stride_xc, stride_or, BLOCK: tl.constexpr):
    # One program per row; the row streams through in BLOCK-wide tiles.
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * stride_xr
    out_row = out_ptr + row.to(tl.int64) * stride_or
    cols = tl.arange(0, BLOCK)

    # Pass 1: an online normaliser per lane. Lane j keeps (m_j, l_j) over columns j, j + BLOCK, ...
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        x = tl.load(x_row + offs * stride_xc, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - shift) + tl.exp(x - shift)
        m = m_new

    # Merge the lanes: the same rescaling, done once across the tile.
    row_max = tl.max(m, axis=0)
    row_shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    row_sum = tl.sum(l * tl.exp(m - row_shift), axis=0)
    inv_sum = tl.where(row_sum > 0, 1.0 / tl.where(row_sum > 0, row_sum, 1.0), 0.0)  # masked rows -> 0

    # Pass 2: normalise and write.
    for start in range(0, n_cols, BLOCK):
        offs = start + cols
        mask = offs < n_cols
        x = tl.load(x_row + offs * stride_xc, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.exp(x - row_shift) * inv_sum
        tl.store(out_row + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax_triton(x: torch.Tensor) -> torch.Tensor:
    """Row softmax of a 2-D tensor (any strides) with the Triton kernel above; output contiguous."""
    if x.dim() != 2:
        raise ValueError(f"softmax_triton expects a 2-D tensor, found {x.dim()} dims (shape {tuple(x.shape)})")
    rows, n_cols = x.shape
    out = torch.empty((rows, n_cols), dtype=x.dtype, device=x.device)
    if rows == 0 or n_cols == 0:
        return out
    block = min(4096, triton.next_power_of_2(n_cols))
    num_warps = 4 if block <= 1024 else 8
    _softmax_kernel[(rows,)](x, out, n_cols, x.stride(0), x.stride(1), out.stride(0), BLOCK=block, num_warps=num_warps)
    return out
