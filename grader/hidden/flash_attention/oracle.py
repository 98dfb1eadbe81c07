"""Naive oracles for FlashAttention's hidden checks: the textbook formulas, never the solution.

- `scores`: the full score matrix scale * q k^T [B, Hq, Nq, Nk] (scale 1/sqrt(D) unless given), with
  grouped-query heads expanded (query head h reads KV head h // (Hq // Hkv)) and the bottom-right causal
  mask built as a full matrix: query i sees key j iff j <= i + (Nk - Nq).
- `naive_attention`: (o, lse) = (softmax(scores) v, logsumexp of the scores), in float64 by default; in a
  lower dtype it is what a straightforward implementation in that precision makes (scores and P rounded to
  it, softmax in fp32), the tests' measure of the rounding a right answer may carry. A row that sees no
  key gives o = 0 and lse = +inf.
- `naive_grads`: (dq, dk, dv), autograd through `naive_attention`.
- `grads_from_lse`: the textbook backward formula from a given (o, lse) of one head: P = exp(scores - lse),
  dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dq = scale dS K, dk = scale dS^T Q, dv = P^T dO.
"""

from __future__ import annotations

import math

import torch

INF = float("inf")


def scores(q, k, causal=False, sm_scale=None, dtype=torch.float64):
    """The scaled, masked score matrix [B, Hq, Nq, Nk] (bottom-right causal mask) in `dtype`."""
    group = q.shape[1] // k.shape[1]
    q, k = q.to(dtype), k.repeat_interleave(group, 1).to(dtype)
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = (q @ k.transpose(-1, -2)) * scale
    n_q, n_k = s.shape[-2:]
    if causal:
        i = torch.arange(n_q, device=s.device)[:, None]
        j = torch.arange(n_k, device=s.device)[None, :]
        s = s.masked_fill(j > i + (n_k - n_q), -INF)
    return s


def naive_attention(q, k, v, causal=False, sm_scale=None, dtype=torch.float64):
    """(o, lse). In float64 this is the reference; in q's own dtype it is what a straightforward
    implementation in that precision makes (scores and P rounded to the dtype, softmax in fp32)."""
    group = q.shape[1] // k.shape[1]
    s = scores(q, k, causal, sm_scale, dtype)
    s = s if dtype == torch.float64 else s.float()
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(m == -INF, torch.zeros_like(m), m)  # rows that see no key: exp(-inf - 0) = 0
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    p = (e / torch.where(l > 0, l, torch.ones_like(l))).to(dtype)
    o = p @ v.repeat_interleave(group, 1).to(dtype)
    lse = torch.where(l > 0, m + torch.log(l), torch.full_like(l, INF))[..., 0]
    return o, lse


def naive_grads(q, k, v, do, causal=False, sm_scale=None, dtype=torch.float64):
    """(dq, dk, dv): autograd through naive_attention in `dtype`, from the upstream gradient do."""
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    o, _ = naive_attention(*leaves, causal=causal, sm_scale=sm_scale, dtype=dtype)
    o.backward(do.to(dtype))
    return [t.grad for t in leaves]


def grads_from_lse(qh, kh, vh, oh, lseh, doh, causal, dtype=torch.float32):
    """(dq, dk, dv) of one head by the textbook backward formula, from the given o and lse, in `dtype`."""
    scale = 1 / math.sqrt(qh.shape[-1])
    p = torch.exp(scores(qh, kh, causal, None, dtype) - lseh[..., None])
    dp = doh @ vh.transpose(-1, -2)
    ds = p * (dp - (doh * oh).sum(-1, keepdim=True))
    return scale * ds @ kh, scale * ds.transpose(-1, -2) @ qh, p.transpose(-1, -2) @ doh
