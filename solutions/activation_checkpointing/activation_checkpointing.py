"""Activation checkpointing: buy activation memory back with one extra forward.

A checkpointed function runs its forward under no_grad, keeping only its inputs; in backward it runs the
forward again, this time with autograd on, and backpropagates through the graph it just rebuilt. The RNG is
put back first, so dropout draws the masks it drew the first time. On top of it: an exact model of the bytes
saved for backward (with the recompute's spike), the plan that recomputes the fewest FLOPs under a byte
budget, Chen et al.'s sqrt(n) segments, and Korthikanti et al.'s selective recompute of attention's core.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------------
# Part 1: the checkpoint


class CheckpointFunction(torch.autograd.Function):
    """forward: fn under no_grad, save the tensor inputs and the RNG state. backward: recompute, backprop."""

    @staticmethod
    def forward(ctx, fn, *args):
        ctx.fn = fn
        ctx.rng_state = torch.get_rng_state()
        ctx.cuda_rng_state = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
        # tensors go through save_for_backward (autograd's saved-tensor machinery); the rest by reference
        ctx.tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.others = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*[args[i] for i in ctx.tensor_at])
        with torch.no_grad():  # autograd.Function.forward already runs without grad; say so
            outputs = fn(*args)
        ctx.single = not isinstance(outputs, tuple)
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        args = list(ctx.others)
        for i, t in zip(ctx.tensor_at, ctx.saved_tensors):
            args[i] = t.detach().requires_grad_(t.requires_grad)  # a fresh leaf: the earlier graph is not ours
        # replay the forward's random numbers, then leave the stream where the backward found it
        rng_now = torch.get_rng_state()
        cuda_now = torch.cuda.get_rng_state() if ctx.cuda_rng_state is not None else None
        torch.set_rng_state(ctx.rng_state)
        if ctx.cuda_rng_state is not None:
            torch.cuda.set_rng_state(ctx.cuda_rng_state)
        try:
            with torch.enable_grad():
                outputs = ctx.fn(*args)
        finally:
            torch.set_rng_state(rng_now)
            if cuda_now is not None:
                torch.cuda.set_rng_state(cuda_now)
        outputs = (outputs,) if ctx.single else outputs
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        if pairs:
            # backward, not autograd.grad: the parameters inside fn accumulate their .grad too
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads = [a.grad if isinstance(a, torch.Tensor) else None for a in args]
        return (None, *grads)


def checkpoint(fn: Callable, *args: Any) -> Any:
    """Run ``fn(*args)`` keeping only the tensor inputs for backward; recompute fn in backward.

    fn returns a tensor or a tuple of tensors. Non-tensor args are kept by reference. At least one tensor
    input must require grad for the parameters inside fn to get gradients (autograd sees only the inputs).
    """
    return CheckpointFunction.apply(fn, *args)


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


def _check_plan(plan: list, n: int) -> None:
    at = 0
    for start, stop, _ in plan:
        if start != at or stop <= start:
            raise ValueError(f"plan must cover 0..{n} in order with non-empty segments; found {plan}")
        at = stop
    if at != n:
        raise ValueError(f"plan must cover 0..{n} in order with non-empty segments; found {plan}")


def _held(start: int, stop: int, checkpointed: bool, costs: Sequence[LayerCost]) -> int:
    """Bytes a segment holds between its forward and its backward."""
    return costs[start].x if checkpointed else sum(c.a for c in costs[start:stop])


def peak_bytes(plan: Plan, costs: Sequence[Sequence[int]]) -> int:
    """The most bytes saved for backward at once over forward and backward, under `plan`."""
    costs = _costs(costs)
    _check_plan(plan, len(costs))
    peak = held = 0
    for start, stop, checkpointed in plan:
        if checkpointed:  # its recompute: everything before it, plus the whole segment saved at once
            peak = max(peak, held + sum(c.a for c in costs[start:stop]))
        held += _held(start, stop, checkpointed, costs)
    return max(peak, held)


def recompute_flops(plan: Plan, costs: Sequence[Sequence[int]]) -> int:
    """FLOPs spent running checkpointed segments a second time."""
    costs = _costs(costs)
    _check_plan(plan, len(costs))
    return sum(c.f for start, stop, ck in plan if ck for c in costs[start:stop])


def plan_checkpoints(costs: Sequence[Sequence[int]], budget: int) -> Plan:
    """The plan with the fewest recomputed FLOPs whose peak_bytes fits `budget`.

    Ties: fewer segments, then the smallest list. Infeasible: ValueError naming the smallest feasible budget.

    A dynamic program left to right. After the segments covering 0..i, what the rest can do depends only on
    `held`, the bytes those segments hold (a later recompute adds to it, and so does the final total). So keep,
    for each i, the best (flops, segments, plan) at each value of held, dropping any state another beats with
    no more held and a key no worse.
    """
    costs = _costs(costs)
    n = len(costs)
    if n == 0:
        raise ValueError("costs must hold at least one layer")
    prefix_a = [0]
    for c in costs:
        prefix_a.append(prefix_a[-1] + c.a)
    prefix_f = [0]
    for c in costs:
        prefix_f.append(prefix_f[-1] + c.f)

    # states[i]: {held: (flops, segments, plan)}; `low[i]` the least peak reachable, for the error message
    states: list[dict[int, tuple]] = [dict() for _ in range(n + 1)]
    states[0][0] = (0, 0, [])
    least: list[dict[int, int]] = [dict() for _ in range(n + 1)]  # held -> least spike so far
    least[0][0] = 0
    for i in range(n):
        least[i] = _lowest(least[i])
        for held, spike in least[i].items():
            for j in range(i + 1, n + 1):
                seg_a = prefix_a[j] - prefix_a[i]
                for ck in (False, True):
                    h = held + (costs[i].x if ck else seg_a)
                    s = max(spike, held + seg_a) if ck else spike
                    if s < least[j].get(h, s + 1):
                        least[j][h] = s
        for held, (flops, segs, plan) in states[i].items():
            for j in range(i + 1, n + 1):
                seg_a = prefix_a[j] - prefix_a[i]
                for ck in (False, True):
                    if ck and held + seg_a > budget:  # the recompute spike must fit
                        continue
                    h = held + (costs[i].x if ck else seg_a)
                    if h > budget:
                        continue
                    key = (flops + (prefix_f[j] - prefix_f[i] if ck else 0), segs + 1, plan + [(i, j, ck)])
                    if h not in states[j] or key < states[j][h]:
                        states[j][h] = key
        states[i + 1] = _pareto(states[i + 1])
    if not states[n]:
        least[n] = _lowest(least[n])
        smallest = min(max(h, s) for h, s in least[n].items())
        raise ValueError(f"no plan fits a budget of {budget} bytes; the smallest feasible budget is {smallest}")
    return min(states[n].values())[2]


def _pareto(front: dict[int, tuple]) -> dict[int, tuple]:
    """Drop the states that another state beats: no more bytes held, and a key no worse."""
    kept: dict[int, tuple] = {}
    best = None
    for held in sorted(front):
        if best is None or front[held] < best:
            kept[held] = front[held]
            best = front[held]
    return kept


def _lowest(front: dict[int, int]) -> dict[int, int]:
    """Drop the (held, spike) pairs another beats on both."""
    kept: dict[int, int] = {}
    for held in sorted(front):
        if not kept or front[held] < min(kept.values()):
            kept[held] = front[held]
    return kept


def sqrt_plan(n: int) -> Plan:
    """Chen et al.'s plan: checkpointed segments of ceil(sqrt(n)) layers, the last one possibly shorter."""
    if n < 1:
        raise ValueError(f"n must be at least 1, found {n}")
    k = math.isqrt(n - 1) + 1  # ceil(sqrt(n)) in integers
    return [(i, min(i + k, n), True) for i in range(0, n, k)]


# ----------------------------------------------------------------------------------------------------
# Part 3: selective recompute


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p_drop: float) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)), dropout, times v: the part whose activations grow as s^2."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    probs = F.dropout(torch.softmax(scores, dim=-1), p_drop, training=True)
    return probs @ v


def attention_block(x: torch.Tensor, w_qkv: torch.Tensor, w_out: torch.Tensor, heads: int, p_drop: float,
                    recompute: str) -> torch.Tensor:
    """Multi-head self-attention without masks or biases, [b, s, h] -> [b, s, h], with a recompute option.

    recompute: "none" keeps every activation, "core" checkpoints only attention_core, "full" checkpoints
    the whole block.
    """
    if recompute not in ("none", "core", "full"):
        raise ValueError(f"recompute must be 'none', 'core' or 'full', found {recompute!r}")
    if recompute == "full":
        return checkpoint(attention_block, x, w_qkv, w_out, heads, p_drop, "none")
    b, s, h = x.shape
    d = h // heads
    q, k, v = (x @ w_qkv).split(h, dim=-1)
    q, k, v = (t.reshape(b, s, heads, d).transpose(1, 2) for t in (q, k, v))  # [b, heads, s, d]
    if recompute == "core":
        ctx = checkpoint(attention_core, q, k, v, p_drop)
    else:
        ctx = attention_core(q, k, v, p_drop)
    return ctx.transpose(1, 2).reshape(b, s, h) @ w_out
