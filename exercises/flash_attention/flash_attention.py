"""FlashAttention in Triton: the exercise. Read README.md in this folder first.

Write `flash_attention_forward`, `flash_attention_backward` and the two methods of `FlashAttention`;
each raises NotImplementedError until you do. `check_inputs` and `flash_attention` are given.
Run the public tests with `make check EX=flash_attention` (or `.venv/bin/pytest exercises/flash_attention`).
Without a GPU your kernels run under Triton's interpreter (TRITON_INTERPRET=1, which `make check`
sets for you): slow, so the tests use small shapes, and bf16 is checked on CUDA only.

Conventions shared by every function here:
- q is [B, Hq, Nq, D]; k and v are [B, Hkv, Nk, D]; Hq % Hkv == 0 and query head h reads KV head
  h // (Hq // Hkv) (grouped-query attention; Hkv == Hq is multi-head, Hkv == 1 multi-query);
- D is one of 16, 32, 64, 128; dtypes fp16, bf16, fp32; Nq and Nk are any positive lengths;
- sm_scale=None means 1 / sqrt(D); any other value, 0 included, is used as given;
- causal masks are aligned bottom-right: query i sees key j iff j <= i + Nk - Nq;
- a query row that sees no key gets o = 0 and lse = +inf;
- softmax statistics and accumulators are fp32 whatever the input dtype, and fp32 inputs are
  multiplied at full fp32 precision: tl.dot(a, b, input_precision="ieee"), never TF32;
- the Nq x Nk score matrix is never written to memory, in the forward or the backward pass, and the
  forward pass leaves the backward pass only q, k, v, o and lse (never P);
- each program holds tiles of a fixed size and loops over the rest of the range inside the kernel: the
  tiles you launch, under the interpreter too, are compiled for a real GPU (sm_90) and must fit there.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError unless q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D] fit the contract. (Given.)"""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D [B, H, N, D], found shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, found {tuple(k.shape)} and {tuple(v.shape)}")
    (b, hq, _, d), (bk, hkv, _, dk) = q.shape, k.shape
    if b != bk or d != dk:
        raise ValueError(f"q and k must agree on batch and head dim, found {tuple(q.shape)} and {tuple(k.shape)}")
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim must be one of {SUPPORTED_HEAD_DIMS}, found {d}")
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype of {SUPPORTED_DTYPES}, found {q.dtype}, {k.dtype}, {v.dtype}")


# Write your Triton kernels here (functions decorated with @triton.jit). A good start for the forward
# pass: a grid of (cdiv(Nq, BLOCK_M), B * Hq) programs; each loads one BLOCK_M x D tile of q, then
# loops over the keys in BLOCK_N-wide tiles, keeping a running max m, sum l and output accumulator in
# fp32 (README.md, "The forward kernel").


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with a Triton kernel you write: returns (o, lse).

    Args:
        q: [B, Hq, Nq, D]; k, v: [B, Hkv, Nk, D]; one dtype among fp16, bf16, fp32; any strides.
        causal: mask aligned bottom-right: query i sees key j iff j <= i + Nk - Nq.
        sm_scale: the score scale; None means 1 / sqrt(D).

    Returns:
        o: q's shape and dtype, softmax(q k^T * sm_scale, masked) v for each query head and the KV head
            it reads. A row that sees no key is 0.
        lse: fp32 [B, Hq, Nq], the natural-log logsumexp of each row's scaled, masked scores;
            +inf for a row that sees no key (so a backward pass that computes exp(s - lse) gets 0).

    The scores live one tile at a time inside the kernel; the Nq x Nk matrix is never in memory.

    Raises:
        ValueError: on shapes or dtypes outside the contract, an unsupported head dim included
            (call check_inputs).
    """
    raise NotImplementedError("flash_attention_forward: launch one program per (query tile, batch * head)")


def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    causal: bool = False, sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of o = attention(q, k, v) given dO: returns (dq, dk, dv), each with its input's shape
    and dtype.

    Args:
        q, k, v, causal, sm_scale: as for the forward pass.
        o, lse: what the forward pass returned for these inputs.
        do: the gradient of the loss with respect to o ([B, Hq, Nq, D], o's dtype, any strides).

    Recompute P = exp(q k^T * sm_scale - lse) tile by tile (FlashAttention-2, Algorithm 2): with
    delta = rowsum(dO * O), dS = P * (dP - delta) where dP = dO v^T, then dq = sm_scale * dS k,
    dk = sm_scale * dS^T q and dv = P^T dO. The dk and dv of a KV head shared by several query heads
    are the sums over those query heads. Rows with lse = +inf contribute nothing. Never build the
    Nq x Nk matrices P or dS in memory. All of it, delta included, is Triton kernels: host code only
    allocates, takes views and launches (README, "The rules").
    """
    raise NotImplementedError("flash_attention_backward: delta = rowsum(dO * O), then a dK/dV kernel and a dQ kernel")


class FlashAttention(torch.autograd.Function):
    """``FlashAttention.apply(q, k, v, causal, sm_scale)`` returns o and backpropagates into q, k, v."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, sm_scale=None):
        """Run flash_attention_forward, save what the backward pass needs (not P!), return o."""
        raise NotImplementedError("FlashAttention.forward: save q, k, v, o and lse with ctx.save_for_backward")

    @staticmethod
    def backward(ctx, do):
        """Return one gradient per forward input: (dq, dk, dv, None, None)."""
        raise NotImplementedError("FlashAttention.backward: call flash_attention_backward with the saved tensors")


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v with FlashAttention, differentiable: returns o. (Given.)"""
    return FlashAttention.apply(q, k, v, causal, sm_scale)
