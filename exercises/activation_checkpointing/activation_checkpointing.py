"""Activation checkpointing: buy activation memory back with one extra forward.

Write `checkpoint` (an autograd Function that recomputes in backward, with the RNG replayed), the exact cost model
`peak_bytes` / `recompute_flops`, the optimal `plan_checkpoints` under a byte budget, Chen's `sqrt_plan`, and
Korthikanti's selective recompute in `attention_block`. torch.utils.checkpoint is banned: it raises inside the
graded calls. The README's "The contract" is the full statement.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------------
# Part 1: the checkpoint


def checkpoint(fn: Callable, *args: Any) -> Any:
    """Run ``fn(*args)`` keeping only its tensor inputs for backward, and run fn again in backward.

    fn returns a tensor or a tuple of tensors (an integer tensor among them needs no grad). args may mix tensors
    (saved with ctx.save_for_backward: nothing else of fn's is saved) and other values (kept by reference).

    forward: run fn without grad, once; remember torch.get_rng_state() (and the CUDA generator's state when CUDA
    is available). backward: detach the saved inputs (each requiring grad as the original did), set the
    forward's RNG state, run fn again with grad enabled, put back the RNG state the backward found, and call
    torch.autograd.backward(recomputed outputs, their incoming grads), so that the parameters used inside fn
    accumulate .grad; return the detached inputs' .grad. After forward and backward, gradients, .grad of every
    parameter and the global RNG stream are exactly those of ``fn(*args)`` without checkpoint.

    As with any reentrant checkpoint, at least one tensor input must require grad for backward to reach it.
    """
    raise NotImplementedError


# ----------------------------------------------------------------------------------------------------
# Part 2: the cost model and the planner


class LayerCost(NamedTuple):
    """One layer: `a` bytes it saves for backward when run normally (its input included), `x` bytes of its
    input, `f` its forward FLOPs. Any (a, x, f) triple is accepted where a LayerCost is."""

    a: int
    x: int
    f: int


Plan = list[tuple[int, int, bool]]


def _costs(costs: Sequence[Sequence[int]]) -> list[LayerCost]:
    return [LayerCost(*c) for c in costs]


def peak_bytes(plan: Plan, costs: Sequence[Sequence[int]]) -> int:
    """The most bytes saved for backward at once, over forward and backward, under `plan`.

    plan: segments (start, stop, checkpointed) covering 0..len(costs) in order, each non-empty; anything else
    raises ValueError. A stored segment holds the sum of its layers' a; a checkpointed one holds only its input,
    costs[start].x. The peak is the larger of the sum of every segment's hold (the end of the forward) and, for
    each checkpointed segment k, the holds of the segments before k plus the sum of a over k's layers (its
    recompute: the segments after k are already freed). An int.
    """
    raise NotImplementedError


def recompute_flops(plan: Plan, costs: Sequence[Sequence[int]]) -> int:
    """The sum of f over the layers of the checkpointed segments (ValueError for a plan as in peak_bytes)."""
    raise NotImplementedError


def plan_checkpoints(costs: Sequence[Sequence[int]], budget: int) -> Plan:
    """The plan with the least recompute_flops among those with peak_bytes <= budget.

    Ties: the fewest segments, then the smallest list (Python's list order, False < True). A list of
    (int, int, bool). ValueError for an empty costs, and when no plan fits: its message names the smallest
    budget that a plan fits (as a plain integer). Polynomial in the number of layers for bytes of bounded size
    (a dynamic program; not an enumeration of the 3^(n-1) plans).
    """
    raise NotImplementedError


def sqrt_plan(n: int) -> Plan:
    """Chen et al.'s plan for n layers: checkpointed segments of ceil(sqrt(n)) layers from layer 0, the last one
    possibly shorter. ValueError for n < 1."""
    raise NotImplementedError


# ----------------------------------------------------------------------------------------------------
# Part 3: selective recompute


def attention_block(x: torch.Tensor, w_qkv: torch.Tensor, w_out: torch.Tensor, heads: int, p_drop: float,
                    recompute: str) -> torch.Tensor:
    """Multi-head self-attention without masks or biases, [b, s, h] -> [b, s, h], with a recompute option.

    q, k, v = (x @ w_qkv).split(h, -1), each reshaped to [b, heads, s, h / heads]; probs = softmax(q k^T /
    sqrt(h / heads)); probs = F.dropout(probs, p_drop, training=True) (the only random draw); the heads' probs @ v
    are merged back to [b, s, h] and multiplied by w_out.

    recompute: "none" keeps every activation autograd keeps; "core" checkpoints (with your checkpoint) only the
    part from q, k, v to probs @ v, so nothing of shape [.., s, s] is saved; "full" checkpoints the whole block,
    saving only x, w_qkv and w_out. Any other value raises ValueError. Every mode returns the same values and
    gradients.
    """
    raise NotImplementedError
