"""Naive oracles for activation_checkpointing's hidden checks: event simulations, exhaustive search, fp64 loops.

None of this is the solution.

- `simulate_peak`: the bytes saved for backward, simulated event by event over named buffers ("x3" the input of
  layer 3, "r3" the rest of what layer 3 saves): the forward adds a stored layer's two buffers or a checkpointed
  segment's input; the backward walks the segments from the last, re-adding a checkpointed segment's buffers
  (its input is already held: a set counts it once) and freeing the segment after. The peak of the set's bytes.
- `flops_loop`: FLOPs of the checkpointed segments' layers, one layer at a time.
- `every_plan`, `brute_force`: every segmentation of 0..n (each of the n-1 cuts on or off) times every marking
  of its segments; the feasible ones sorted by (FLOPs, segments, plan); the least peak for infeasible budgets.
- `sqrt_closed_form`: Chen's plan from the definition (k the least integer with k * k >= n).
- `attention_fp64`: attention head by head, batch by batch, in float64 loops over heads, with the dropout mask
  read from F.dropout on a tensor of ones of the same shape and seed (the draws depend on the shape and dtype only).
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F


def simulate_peak(plan: Sequence[Sequence[Any]], costs: Sequence[tuple[int, int, int]]) -> int:
    """Peak bytes over the forward and the backward under `plan`; costs are (a, x, f)."""
    size = {}
    for i, (a, x, _) in enumerate(costs):
        size[f"x{i}"], size[f"r{i}"] = x, a - x
    held: set[str] = set()
    peak = 0

    def note() -> None:
        nonlocal peak
        peak = max(peak, sum(size[b] for b in held))

    kept = []  # per segment, the buffers its forward left
    for start, stop, checkpointed in plan:
        before = set(held)
        if checkpointed:
            held.add(f"x{start}")
        else:
            for i in range(start, stop):
                held |= {f"x{i}", f"r{i}"}
        note()
        kept.append(held - before)
    for (start, stop, checkpointed), mine in zip(reversed(plan), reversed(kept)):
        if checkpointed:
            for i in range(start, stop):
                held |= {f"x{i}", f"r{i}"}
            note()
            held -= {f"x{i}" for i in range(start, stop)} | {f"r{i}" for i in range(start, stop)}
        held -= mine
    return peak


def flops_loop(plan: Sequence[Sequence[Any]], costs: Sequence[tuple[int, int, int]]) -> int:
    total = 0
    for start, stop, checkpointed in plan:
        if checkpointed:
            for i in range(start, stop):
                total += costs[i][2]
    return total


def every_plan(n: int) -> list[list[tuple[int, int, bool]]]:
    plans = []
    for cuts in itertools.product((False, True), repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        segments = list(zip(bounds, bounds[1:]))
        for marks in itertools.product((False, True), repeat=len(segments)):
            plans.append([(s, e, m) for (s, e), m in zip(segments, marks)])
    return plans


def brute_force(costs: Sequence[tuple[int, int, int]], budget: int) -> tuple[list | None, int]:
    """(the best feasible plan or None, the least peak over every plan)."""
    best, best_key, least = None, None, None
    for plan in every_plan(len(costs)):
        peak = simulate_peak(plan, costs)
        least = peak if least is None else min(least, peak)
        if peak <= budget:
            key = (flops_loop(plan, costs), len(plan), plan)
            if best_key is None or key < best_key:
                best, best_key = plan, key
    assert least is not None
    return best, least


def sqrt_closed_form(n: int) -> list[tuple[int, int, bool]]:
    k = 1
    while k * k < n:
        k += 1
    plan, start = [], 0
    while start < n:
        plan.append((start, min(start + k, n), True))
        start += k
    return plan


def dropout_mask(shape: Sequence[int], p: float, seed: int) -> torch.Tensor:
    """The scaled mask F.dropout draws for an fp32 tensor of `shape` right after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return F.dropout(torch.ones(*shape), p, training=True).double()


def attention_fp64(x: torch.Tensor, w_qkv: torch.Tensor, w_out: torch.Tensor, heads: int, mask: torch.Tensor
                   ) -> torch.Tensor:
    """Multi-head attention in float64 with explicit loops over batch and heads; differentiable."""
    b, s, h = x.shape
    d = h // heads
    qkv = x.double() @ w_qkv.double()
    rows = []
    for bi in range(b):
        ctx = []
        for hd in range(heads):
            q = qkv[bi, :, hd * d:(hd + 1) * d]
            k = qkv[bi, :, h + hd * d:h + (hd + 1) * d]
            v = qkv[bi, :, 2 * h + hd * d:2 * h + (hd + 1) * d]
            scores = q @ k.T / math.sqrt(d)
            e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
            probs = e / e.sum(dim=-1, keepdim=True) * mask[bi, hd]
            ctx.append(probs @ v)
        rows.append(torch.cat(ctx, dim=-1))
    return torch.stack(rows) @ w_out.double()
