"""FlashAttention in Triton: the reference solution.

Attention is softmax(Q K^T * scale) V. Written naively it builds the Nq x Nk score matrix S in memory,
reads it back for the softmax, writes P, and reads P again for P V: quadratic memory traffic for work
whose inputs and output are linear in the sequence length. FlashAttention (Dao et al., 2022; FA-2,
Dao 2023) never lets S leave the chip:

* forward: one program owns a tile of query rows and streams the K/V tiles past it, keeping an
  online softmax (running max m, running sum l, an unnormalised output accumulator, all fp32). When
  a new tile raises the max, the old sum and accumulator are rescaled by exp(m_old - m_new). It
  writes O and one number per row, lse = m + log(l), which is all the backward pass needs.
* backward: recompute P = exp(S - lse) tile by tile. With delta = rowsum(dO * O),
  dS = P * (dP - delta), dQ = scale * dS K, dK = scale * dS^T Q, dV = P^T dO. One kernel owns a K/V
  tile and sweeps the query tiles (and every query head of its group) for dK, dV; another owns a
  query tile and sweeps the K/V tiles for dQ. No atomics, so the result is deterministic.

Conventions: GQA query head h reads KV head h // (Hq // Hkv). Causal masks are aligned bottom-right
(query i sees key j iff j <= i + Nk - Nq). A row that sees no key gets o = 0 and lse = +inf.

The kernels work in base 2 (exp2 is what the hardware has): scores are multiplied by
scale * log2(e), and lse is converted back to the natural log before it is stored.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The kernels work in base 2 (exp2 and log2 are the fast instructions): exp(x) = exp2(x * LOG2E) and
# ln(y) = log2(y) * LN2. Named tl.constexpr so the kernels can read them as compile-time constants.
LOG2E = tl.constexpr(1.4426950408889634)  # log2(e)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2)
# Under the CPU interpreter (TRITON_INTERPRET=1) large tiles mean fewer Python steps.
INTERPRETER_BLOCKS = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1)
DELTA_ROWS = 64  # rows of rowsum(O * dO) per program of the backward's first kernel


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ValueError unless q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D] fit the contract."""
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


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs get true fp32 products ("ieee"), never TF32; the setting is ignored for fp16/bf16.
    return "ieee" if dtype == torch.float32 else "tf32"


def _scale(sm_scale: float | None, head_dim: int) -> float:
    """The score scale: 1 / sqrt(D) by default; any given value, 0 included, as given."""
    return 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


def _blocks(head_dim: int, dtype: torch.dtype) -> dict:
    """Tile sizes and launch options (INTERPRETER_BLOCKS under the CPU interpreter). Each was compiled for sm_90
    and spills nothing (README.md, "Performance notes")."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return dict(INTERPRETER_BLOCKS)
    if dtype == torch.float32:  # "ieee" fp32 products run on the FMA units, operands in registers: small tiles
        return dict(BLOCK_M=32, BLOCK_N=32 if head_dim <= 64 else 16, num_warps=4, num_stages=2)
    if head_dim <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)


@triton.jit
def _diagonal(N_Q, N_K):
    """Causal masks are aligned bottom-right: query i sees key j iff j <= i + _diagonal(N_Q, N_K)."""
    return N_K - N_Q


@triton.jit
def _kv_head(bh, H_Q, H_KV):
    """Grouped-query attention: program (b, h) over b * H_Q + h reads KV head h // (H_Q // H_KV)."""
    return (bh // H_Q) * H_KV + (bh % H_Q) // (H_Q // H_KV)


@triton.jit
def _visible_key_range(start_m, N_Q, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """For the query rows [start_m, start_m + BLOCK_M): keys [0, lo) are seen by every row and lie in
    whole tiles (no mask needed); keys [lo, hi) need the bounds and causal mask; keys >= hi are seen
    by no row."""
    if CAUSAL:
        shift = _diagonal(N_Q, N_K)
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + shift, 0), N_K)
        lo = tl.minimum(tl.maximum(start_m + 1 + shift, 0), N_K) // BLOCK_N * BLOCK_N
    else:
        hi = N_K
        lo = N_K // BLOCK_N * BLOCK_N
    return lo, hi


# --------------------------------------------------------------------------------------------------
# Forward


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, K, V, offs_m, start, stop, N_Q, N_K, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(start, stop, BLOCK_N):
        cols = start_n + offs_n
        # K^T tile [HEAD_DIM, BLOCK_N] and V tile [BLOCK_N, HEAD_DIM].
        kt_ptrs = K + cols[None, :] * HEAD_DIM + offs_d[:, None]
        v_ptrs = V + cols[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            kt = tl.load(kt_ptrs, mask=cols[None, :] < N_K, other=0.0)
            v = tl.load(v_ptrs, mask=cols[:, None] < N_K, other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            v = tl.load(v_ptrs)

        # Scores in log2 units. Keys past the end, or in a row's causal future, score -inf: exp2 -> 0.
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        if MASKED:
            s = tl.where(cols[None, :] < N_K, s, float("-inf"))
            if CAUSAL:
                s = tl.where(cols[None, :] <= offs_m[:, None] + _diagonal(N_Q, N_K), s, float("-inf"))

        # Online softmax: raise the running max, rescale what was summed against the old max.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, qk_scale, N_Q, N_K, H_Q, H_KV,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    # One program: BLOCK_M query rows of one (batch, query head). Q, K, V, O are contiguous.
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    kv_bh = _kv_head(bh, H_Q, H_KV)
    Q += bh.to(tl.int64) * N_Q * HEAD_DIM
    O += bh.to(tl.int64) * N_Q * HEAD_DIM
    K += kv_bh.to(tl.int64) * N_K * HEAD_DIM
    V += kv_bh.to(tl.int64) * N_K * HEAD_DIM
    LSE += bh.to(tl.int64) * N_Q

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(Q + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)

    # The running state: max and sum in log2 units, and the unnormalised output, all fp32.
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    lo, hi = _visible_key_range(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, offs_m, 0, lo, N_Q, N_K, qk_scale,
                               HEAD_DIM, BLOCK_N, False, CAUSAL, PRECISION)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, offs_m, lo, hi, N_Q, N_K, qk_scale,
                               HEAD_DIM, BLOCK_N, True, CAUSAL, PRECISION)

    # Normalise once at the end. A row that saw no key has l = 0: o = 0 and lse = +inf.
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2, float("inf"))  # natural log
    tl.store(O + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + offs_m, lse, mask=row_ok)


def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output o (q's dtype and shape) and fp32 lse [B, Hq, Nq]; see the module docstring."""
    check_inputs(q, k, v)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    batch, h_q, n_q, head_dim = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    scale = _scale(sm_scale, head_dim)

    o = torch.empty_like(q)
    lse = torch.empty((batch, h_q, n_q), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    cfg = _blocks(head_dim, q.dtype)
    grid = (triton.cdiv(n_q, cfg["BLOCK_M"]), batch * h_q)
    _fwd_kernel[grid](q, k, v, o, lse, scale * LOG2E.value, n_q, n_k, h_q, h_kv,
                      HEAD_DIM=head_dim, CAUSAL=bool(causal), PRECISION=_precision(q.dtype), **cfg)
    return o, lse


# --------------------------------------------------------------------------------------------------
# Backward


@triton.jit
def _bwd_delta_kernel(O, DO, DELTA, N_Q, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    # delta_i = sum_d dO[i, d] * O[i, d]: the rowsum(P * dP) term of the softmax gradient.
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    bh = tl.program_id(1).to(tl.int64)
    ptrs = bh * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    row_ok = offs_m < N_Q
    o = tl.load(O + ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + bh * N_Q + offs_m, tl.sum(o * do, 1), mask=row_ok)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, offs_n, start, stop, N_Q, N_K, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
                    PRECISION: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(start, stop, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        row_ok = rows < N_Q
        # Rows past the end load lse = +inf and dO = 0, so they add nothing to dK or dV.
        q = tl.load(Q + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        do = tl.load(DO + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        lse = tl.load(LSE + rows, mask=row_ok, other=float("inf")) * LOG2E  # base 2
        delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)

        # Work with the transposed tile [BLOCK_N, BLOCK_M] so dK and dV come out row-major.
        pt = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - lse[None, :])
        if MASKED:  # the causal mask, transposed
            pt = tl.where(offs_n[:, None] <= rows[None, :] + _diagonal(N_Q, N_K), pt, 0.0)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=PRECISION)
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, qk_scale, N_Q, N_K, H_Q, H_KV,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    # One program: BLOCK_N keys of one (batch, KV head), against every query head that reads them.
    start_n = tl.program_id(0) * BLOCK_N
    kv_bh = tl.program_id(1)
    group = H_Q // H_KV
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < N_K
    kv_off = kv_bh.to(tl.int64) * N_K * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(K + kv_off, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + kv_off, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    # Query rows [0, lo) see none of these keys; [lo, full) see some (mask); [full, N_Q) see all.
    if CAUSAL:
        shift = _diagonal(N_Q, N_K)
        lo = tl.minimum(tl.maximum(start_n - shift, 0), N_Q) // BLOCK_M * BLOCK_M
        full = tl.cdiv(tl.minimum(tl.maximum(start_n + BLOCK_N - 1 - shift, 0), N_Q), BLOCK_M) * BLOCK_M
    else:
        lo = 0
        full = 0

    first_h = (kv_bh // H_KV) * H_Q + (kv_bh % H_KV) * group
    for g in range(group):  # dK and dV of a shared KV head sum over its query heads
        bh = (first_h + g).to(tl.int64)
        Qh, DOh = Q + bh * N_Q * HEAD_DIM, DO + bh * N_Q * HEAD_DIM
        LSEh, DELTAh = LSE + bh * N_Q, DELTA + bh * N_Q
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, offs_n, lo, full, N_Q, N_K, qk_scale,
                                 HEAD_DIM, BLOCK_M, True, PRECISION)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, offs_n, full, N_Q, N_Q, N_K, qk_scale,
                                 HEAD_DIM, BLOCK_M, False, PRECISION)

    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DK + kv_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _bwd_dq_inner(dq, q, do, lse, delta, K, V, offs_m, start, stop, N_Q, N_K, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                  PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(start, stop, BLOCK_N):
        cols = start_n + offs_n
        kv_ptrs = cols[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            k = tl.load(K + kv_ptrs, mask=cols[:, None] < N_K, other=0.0)
            v = tl.load(V + kv_ptrs, mask=cols[:, None] < N_K, other=0.0)
        else:
            k = tl.load(K + kv_ptrs)
            v = tl.load(V + kv_ptrs)
        p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - lse[:, None])
        if MASKED:
            p = tl.where(cols[None, :] < N_K, p, 0.0)
            if CAUSAL:
                p = tl.where(cols[None, :] <= offs_m[:, None] + _diagonal(N_Q, N_K), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    return dq


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, qk_scale, N_Q, N_K, H_Q, H_KV,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    # One program: BLOCK_M query rows of one (batch, query head), against every key they see.
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    kv_bh = _kv_head(bh, H_Q, H_KV)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q_off = bh.to(tl.int64) * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + q_off, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + q_off, mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=float("inf")) * LOG2E  # base 2
    delta = tl.load(DELTA + bh.to(tl.int64) * N_Q + offs_m, mask=row_ok, other=0.0)
    K += kv_bh.to(tl.int64) * N_K * HEAD_DIM
    V += kv_bh.to(tl.int64) * N_K * HEAD_DIM

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    lo, hi = _visible_key_range(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _bwd_dq_inner(dq, q, do, lse, delta, K, V, offs_m, 0, lo, N_Q, N_K, qk_scale,
                       HEAD_DIM, BLOCK_N, False, CAUSAL, PRECISION)
    dq = _bwd_dq_inner(dq, q, do, lse, delta, K, V, offs_m, lo, hi, N_Q, N_K, qk_scale,
                       HEAD_DIM, BLOCK_N, True, CAUSAL, PRECISION)
    tl.store(DQ + q_off, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


def _bwd_blocks(head_dim: int, dtype: torch.dtype) -> tuple[dict, dict]:
    """(dK/dV config, dQ config): the dK/dV kernel wants long key tiles, the dQ kernel long query tiles. The dK/dV
    kernel holds two fp32 accumulators of BLOCK_N x D, so it takes 8 warps (4 spilled at bf16, D = 64 causal) and
    16-row query tiles at D = 128 (32 spilled); none of these spills on sm_90."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return dict(INTERPRETER_BLOCKS), dict(INTERPRETER_BLOCKS)
    if dtype == torch.float32:  # FMA products, operands in registers: small tiles (see _blocks)
        return (dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=2),
                dict(BLOCK_M=32, BLOCK_N=32 if head_dim <= 64 else 16, num_warps=4, num_stages=2))
    if head_dim <= 64:
        return (dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=3),
                dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=3))
    return (dict(BLOCK_M=16, BLOCK_N=128, num_warps=8, num_stages=3),
            dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=3))


def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    causal: bool = False, sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of the attention output given dO, recomputing P tile by tile from lse."""
    check_inputs(q, k, v)
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    lse = lse.float().contiguous()
    batch, h_q, n_q, head_dim = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    scale = _scale(sm_scale, head_dim)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()

    kv_cfg, q_cfg = _bwd_blocks(head_dim, q.dtype)
    precision = _precision(q.dtype)
    delta = torch.empty_like(lse)
    _bwd_delta_kernel[(triton.cdiv(n_q, DELTA_ROWS), batch * h_q)](o, do, delta, n_q, HEAD_DIM=head_dim,
                                                                  BLOCK_M=DELTA_ROWS)
    _bwd_dkdv_kernel[(triton.cdiv(n_k, kv_cfg["BLOCK_N"]), batch * h_kv)](
        q, k, v, do, lse, delta, dk, dv, scale, scale * LOG2E.value, n_q, n_k, h_q, h_kv,
        HEAD_DIM=head_dim, CAUSAL=bool(causal), PRECISION=precision, **kv_cfg)
    _bwd_dq_kernel[(triton.cdiv(n_q, q_cfg["BLOCK_M"]), batch * h_q)](
        q, k, v, do, lse, delta, dq, scale, scale * LOG2E.value, n_q, n_k, h_q, h_kv,
        HEAD_DIM=head_dim, CAUSAL=bool(causal), PRECISION=precision, **q_cfg)
    return dq, dk, dv


# --------------------------------------------------------------------------------------------------
# Autograd


class FlashAttention(torch.autograd.Function):
    """``FlashAttention.apply(q, k, v, causal, sm_scale)``: o, differentiable in q, k and v."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, sm_scale=None):
        o, lse = flash_attention_forward(q, k, v, causal, sm_scale)
        ctx.save_for_backward(q, k, v, o, lse)  # O(N) memory: lse replaces the N x N matrix P
        ctx.causal, ctx.sm_scale = causal, sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v with FlashAttention, differentiable: returns o."""
    return FlashAttention.apply(q, k, v, causal, sm_scale)
