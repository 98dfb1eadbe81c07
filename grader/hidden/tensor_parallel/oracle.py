"""Naive oracles for tensor_parallel's hidden checks: the unsharded module in float64, and sharding by
plain slicing of Python index lists. None of this is the solution.

- `mlp_full`: the single-device MLP (GeLU or SwiGLU) and the pre-LN block, fp64 autograd on whole tensors.
- `rows_of_column_shard` / `cols_of_row_shard`: which rows (columns) of the full weight rank r holds, listed
  index by index from the contract (k fused matrices, block r of each).
- `expected_pattern`: the collectives a block must run each way, with the elements each rank sends, from
  the ring's closed forms (2 (t - 1) / t n for an all-reduce, (t - 1) / t n for a reduce-scatter, (t - 1)
  times the piece for an all-gather).
"""

from __future__ import annotations

import math

import torch


def column_rows(out_features: int, t: int, r: int, stride: int = 1) -> list[int]:
    """The rows of a column-parallel weight rank r holds: block r of each of the `stride` fused matrices."""
    per_matrix = out_features // stride
    block = per_matrix // t
    return [m * per_matrix + r * block + i for m in range(stride) for i in range(block)]


def row_cols(in_features: int, t: int, r: int) -> list[int]:
    block = in_features // t
    return [r * block + i for i in range(block)]


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2.0)))


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def mlp_full(x: torch.Tensor, p: dict, act: str) -> torch.Tensor:
    """fc2(act(fc1(x))): fc1 [f or 2f, h] (SwiGLU: gate rows first, then up), in float64."""
    h = x @ p["w1"].T + p["b1"]
    if act == "gelu":
        h = _gelu(h)
    else:
        gate, up = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2:]
        h = gate * torch.sigmoid(gate) * up
    return h @ p["w2"].T + p["b2"]


def block_full(x: torch.Tensor, p: dict, act: str) -> torch.Tensor:
    return x + mlp_full(_layer_norm(x, p["ln_w"], p["ln_b"]), p, act)


def full_grads(fn, x: torch.Tensor, p: dict, grad: torch.Tensor, act: str) -> tuple[torch.Tensor, torch.Tensor | None, dict]:
    """(output, x's gradient, each parameter's gradient) of `fn` in float64 on one device."""
    x = x.detach().double().requires_grad_(True)
    q = {k: v.detach().double().requires_grad_(True) for k, v in p.items()}
    out = fn(x, q, act)
    out.backward(grad.double())
    return out.detach(), x.grad, {k: v.grad for k, v in q.items()}


def shard_params(p: dict, t: int, r: int, act: str) -> dict:
    """Rank r's MLP shard by index lists: fc1's rows (stride 2 for SwiGLU), fc2's columns; the rest whole."""
    stride = 2 if act == "swiglu" else 1
    rows = column_rows(p["w1"].shape[0], t, r, stride)
    cols = row_cols(p["w2"].shape[1], t, r)
    out = {k: v.clone() for k, v in p.items()}
    out["w1"], out["b1"] = p["w1"][rows].clone(), p["b1"][rows].clone()
    out["w2"] = p["w2"][:, cols].clone()
    return out


def expected_pattern(s: int, b: int, h: int, t: int, sequence_parallel: bool) -> dict:
    """{"forward": [(op, elements)], "backward": [...]} for one MLP block on every rank."""
    n = s * b * h
    if t == 1:
        ar = ag = rs = 0
    else:
        ar, ag, rs = 2 * (t - 1) * n // t, (t - 1) * (n // t), (t - 1) * n // t
    if sequence_parallel:
        return {"forward": [("all_gather", ag), ("reduce_scatter", rs)],
                "backward": [("all_gather", ag), ("all_gather", ag), ("reduce_scatter", rs)]}
    return {"forward": [("all_reduce", ar)], "backward": [("all_reduce", ar)]}


# ---------------------------------------------------------------- attention


def qkv_rows(n_heads: int, n_kv_heads: int, d: int, t: int, r: int) -> list[int]:
    """The rows of the fused w_qkv [(n_heads + 2 n_kv_heads) d, h] that rank r holds: its query heads' rows,
    then its key heads', then its value heads' (head by head, d rows each)."""
    hq, hkv = n_heads // t, n_kv_heads // t
    rows = [(r * hq + j) * d + i for j in range(hq) for i in range(d)]
    for base in (n_heads * d, (n_heads + n_kv_heads) * d):
        rows += [base + (r * hkv + j) * d + i for j in range(hkv) for i in range(d)]
    return rows


def o_cols(n_heads: int, d: int, t: int, r: int) -> list[int]:
    """The columns of w_o [h, n_heads d] rank r holds: its query heads' outputs."""
    hq = n_heads // t
    return [(r * hq + j) * d + i for j in range(hq) for i in range(d)]


def attention_full(x: torch.Tensor, p: dict, n_heads: int, n_kv_heads: int, causal: bool) -> torch.Tensor:
    """Single-device self-attention, one head at a time, with Python loops over heads and batch.

    w_qkv's rows: Q's heads, then K's, then V's, d rows per head. Query head j reads key/value head
    j // (n_heads / n_kv_heads). p["k_cache"], p["v_cache"] ([s_past, b, n_kv_heads, d], optional) are the
    keys and values of earlier positions. Causal: query i is position s_past + i, and sees keys 0 .. s_past + i."""
    s, b, _ = x.shape
    d = p["w_qkv"].shape[0] // (n_heads + 2 * n_kv_heads)
    qkv = x @ p["w_qkv"].T + (p["b_qkv"] if p.get("b_qkv") is not None else 0)
    group = n_heads // n_kv_heads
    outs = []
    for j in range(n_heads):
        kv = j // group
        q = qkv[..., j * d:(j + 1) * d]
        k = qkv[..., (n_heads + kv) * d:(n_heads + kv + 1) * d]
        v = qkv[..., (n_heads + n_kv_heads + kv) * d:(n_heads + n_kv_heads + kv + 1) * d]
        if p.get("k_cache") is not None:
            k = torch.cat([p["k_cache"][:, :, kv], k])
            v = torch.cat([p["v_cache"][:, :, kv], v])
        past = k.shape[0] - s
        per_batch = []
        for bi in range(b):
            rows = []
            for i in range(s):
                seen = past + i + 1 if causal else k.shape[0]
                sc = (k[:seen, bi] @ q[i, bi]) / d ** 0.5
                w = torch.exp(sc - sc.max())
                rows.append((w / w.sum()) @ v[:seen, bi])
            per_batch.append(torch.stack(rows))
        outs.append(torch.stack(per_batch, dim=1))  # [s, b, d]
    o = torch.cat(outs, dim=-1)
    return o @ p["w_o"].T + p["b_o"]


def attention_grads(x: torch.Tensor, p: dict, grad: torch.Tensor, n_heads: int, n_kv_heads: int, causal: bool):
    """(output, x's gradient, each parameter's gradient) of `attention_full`, float64 autograd on whole tensors."""
    x = x.detach().double().requires_grad_(True)
    q = {k: v.detach().double().requires_grad_(True) for k, v in p.items()}
    out = attention_full(x, q, n_heads, n_kv_heads, causal)
    out.backward(grad.double())
    return out.detach(), x.grad, {k: v.grad for k, v in q.items()}


def shard_attention_params(p: dict, n_heads: int, n_kv_heads: int, t: int, r: int) -> dict:
    """Rank r's attention shard by index lists: w_qkv's and b_qkv's rows, w_o's columns, b_o whole, and the
    caches' heads (dim 2) of its key/value heads."""
    d = p["w_qkv"].shape[0] // (n_heads + 2 * n_kv_heads)
    rows, cols = qkv_rows(n_heads, n_kv_heads, d, t, r), o_cols(n_heads, d, t, r)
    out = {"w_qkv": p["w_qkv"][rows].clone(), "b_qkv": p["b_qkv"][rows].clone(),
           "w_o": p["w_o"][:, cols].clone(), "b_o": p["b_o"].clone()}
    hkv = n_kv_heads // t
    for name in ("k_cache", "v_cache"):
        if p.get(name) is not None:
            out[name] = p[name][:, :, [r * hkv + j for j in range(hkv)]].clone()
    return out


def layer_full(x: torch.Tensor, p: dict, n_heads: int, n_kv_heads: int, causal: bool, act: str) -> torch.Tensor:
    """A pre-LN transformer layer on one device: h = x + attention(ln1(x)), then h + mlp(ln2(h))."""
    h = x + attention_full(_layer_norm(x, p["ln1_w"], p["ln1_b"]), p, n_heads, n_kv_heads, causal)
    return h + mlp_full(_layer_norm(h, p["ln2_w"], p["ln2_b"]), p, act)


def expected_layer_pattern(s: int, b: int, h: int, t: int, sequence_parallel: bool) -> dict:
    """A whole layer: the block's pattern twice (attention's, then the MLP's forward; backward the MLP's first)."""
    one = expected_pattern(s, b, h, t, sequence_parallel)
    return {"forward": one["forward"] * 2, "backward": one["backward"] * 2}
