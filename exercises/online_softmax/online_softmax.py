"""Online softmax: the exercise. Read README.md in this folder first.

Fill in the four functions below; each raises NotImplementedError until you do. Run the public
tests with `make check EX=online_softmax` (or `.venv/bin/pytest exercises/online_softmax`).

Conventions shared by every function here:
- accumulate in fp32 whatever the input dtype;
- a row that holds only -inf has max m = -inf and sum l = 0, and its softmax is all zeros (not NaN);
- never compute exp(-inf - (-inf)): that is NaN. Subtract 0 instead when the max is -inf.
"""

from __future__ import annotations

from typing import Iterable

import torch
import triton
import triton.language as tl


def merge_states(
    m_a: torch.Tensor, l_a: torch.Tensor, m_b: torch.Tensor, l_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial normaliser states into the state of their union.

    Args:
        m_a, l_a: fp32 [rows]: row max and sum(exp(x - m_a)) over some columns A.
        m_b, l_b: fp32 [rows]: the same over other columns B.

    Returns:
        (m, l), fp32 [rows]: the row max over A and B, and sum(exp(x - m)) over A and B.

    Must be exactly commutative (merge(a, b) equals merge(b, a) bit for bit), associative up to
    rounding, and the empty state (m = -inf, l = 0) is an exact identity: no NaN, ever.
    """
    raise NotImplementedError("merge_states: rescale each partial sum to the common max, then add")


def online_normalizer(chunks: Iterable[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass over the column chunks of a matrix x[rows, n].

    Args:
        chunks: an iterable of 2-D tensors [rows, c_i] (any float dtype), the columns of x in order.
            Widths vary and may be 0. It can be consumed only ONCE: do not iterate it twice. It may be
            a stream far longer than memory: keep the running (m, l), never the chunks (no list of
            them, no copies, no torch.cat), and let each chunk go before you ask for the next.

    Returns:
        (m, l), fp32 [rows]: m = row max of x, l = sum over the row of exp(x - m), accumulated in fp32.
        A row of only -inf gives m = -inf, l = 0; so does a matrix of no columns (every chunk of width 0).

    Raises:
        ValueError: if `chunks` yields no chunk at all.
    """
    raise NotImplementedError("online_normalizer: keep a running (m, l); rescale l whenever m grows")


def online_softmax(x: torch.Tensor, block_size: int = 1024) -> torch.Tensor:
    """Softmax over the last dim of an N-D tensor, reading x in column blocks of `block_size`.

    Two passes over the blocks: the first computes (m, l) with `online_normalizer` (call it once, handing
    it the blocks), the second writes exp(x - m) / l block by block, with the (m, l) it returned. Besides
    x and the output, hold only a few blocks' worth of memory: convert to fp32 block by block, never the
    whole of x at once, and take no max, sum or exp over whole rows (not even in place on the output).
    Output has x's shape and dtype (fp16, bf16, fp32), computed in fp32. Rows of only -inf give zeros.
    An x with no elements (any dim of size 0) gives an empty tensor of x's shape and dtype.

    Raises:
        ValueError: if block_size is not a positive int (0, -1, 2.0, True, None all raise).
    """
    raise NotImplementedError("online_softmax: flatten to [rows, n], normalise, then write block by block")


# A Triton kernel is a function decorated with @triton.jit; write yours here. One program per row
# is a fine start: stream the row through in BLOCK-wide tiles, twice (README.md, "The Triton kernel").


def softmax_triton(x: torch.Tensor) -> torch.Tensor:
    """Row softmax of a 2-D tensor with a Triton kernel you write.

    x may have any strides (a transpose, a slice); the output is a new contiguous tensor of x's
    shape and dtype. Rows may be far longer than one block (up to 2**20 columns). Rows of only -inf
    give zeros. On a machine without CUDA the kernel runs under Triton's interpreter
    (TRITON_INTERPRET=1, which `make check` sets for you).

    Raises:
        ValueError: if x is not 2-D.
    """
    raise NotImplementedError("softmax_triton: launch your kernel with one program per row")
