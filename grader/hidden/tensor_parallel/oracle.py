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
