"""Top-k mixture-of-experts routing with expert capacity: the reference solution.

A mixture-of-experts layer keeps E expert MLPs but runs only k of them per token. The router scores
every expert for every token, keeps the k best, and sends each token to those experts' fixed-size
buffers ("capacity"); assignments that do not fit are dropped and the residual connection carries
the token past the layer. Every step below is a whole-tensor operation: no Python loop over tokens.

The one idea worth remembering: an assignment's slot in its expert's buffer is "how many
assignments to the same expert came before me in priority order", a running count per expert.
Everything else is gathers and scatters around it.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch
from torch import nn


class Routing(NamedTuple):
    """What `route` decides for T tokens, E experts and k choices per token."""

    expert_index: torch.Tensor  # [T, k] int64: chosen experts, best first (ties: lower index)
    combine_weight: torch.Tensor  # [T, k] fp32: gate weight of each choice; 0 where dropped
    slot: torch.Tensor  # [T, k] int64: position in the expert's buffer, -1 where dropped
    tokens_per_expert: torch.Tensor  # [E] int64: assignments kept per expert
    aux_loss: torch.Tensor  # scalar fp32: Switch load-balancing loss (1.0 when balanced)
    z_loss: torch.Tensor  # scalar fp32: mean(logsumexp(logits)^2)


def router_probs(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over experts, in fp32 whatever the logits' dtype."""
    return torch.softmax(logits.float(), dim=-1)


def expert_capacity(
    num_tokens: int, num_experts: int, k: int, capacity_factor: float, min_capacity: int = 1
) -> int:
    """Slots per expert: the even share of the k * T assignments, scaled by the capacity factor."""
    return max(min_capacity, math.ceil(k * num_tokens * capacity_factor / num_experts))


def _top_k(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row, best first, ties to the lower index.

    torch.topk promises nothing about the order of equal values; torch.argmax returns the first
    maximal index. So: k rounds of argmax, knocking each winner out (a loop over k, not over tokens).
    """
    remaining = probs.detach().clone()
    picks = []
    for _ in range(k):
        best = remaining.argmax(dim=-1)  # [T]
        picks.append(best)
        remaining.scatter_(1, best[:, None], float("-inf"))
    index = torch.stack(picks, dim=1)  # [T, k]
    return probs.gather(1, index), index  # gather keeps the values on the autograd graph


def _rank_within_expert(sequence: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For expert ids in priority order: how many earlier entries chose the same expert, and the
    number of entries per expert.

    Think of it as a running count per expert (a cumulative sum of one-hot rows). Here the count is
    found by grouping instead: a stable sort by expert id keeps priority order inside each expert's
    group, so an entry's rank is its position in the sorted list minus where its group starts.
    O(N log N) time and O(N) memory, where the one-hot version needs an [N, E] matrix.
    """
    grouped, by_expert = torch.sort(sequence, stable=True)
    ids = torch.arange(num_experts, device=sequence.device)
    starts = torch.searchsorted(grouped, ids)  # where each expert's group begins
    counts = torch.searchsorted(grouped, ids, right=True) - starts
    rank = torch.empty_like(sequence)
    rank[by_expert] = torch.arange(sequence.numel(), device=sequence.device) - starts[grouped]
    return rank, counts


def route(
    logits: torch.Tensor,
    k: int,
    capacity_factor: float,
    drop_policy: str = "position",
    min_capacity: int = 1,
    renormalize: bool | None = None,
) -> Routing:
    """Choose k experts per token, apply expert capacity, and compute the auxiliary losses."""
    num_tokens, num_experts = logits.shape
    if not 1 <= k <= num_experts:
        raise ValueError(f"k must be between 1 and the number of experts ({num_experts}), found {k}")
    if drop_policy not in ("position", "probs"):
        raise ValueError(f"drop_policy must be 'position' or 'probs', found {drop_policy!r}")
    if renormalize is None:
        renormalize = k > 1  # top-1 renormalised would be a constant 1, with no gradient to the router
    probs = router_probs(logits)  # [T, E]

    # 1. The k best experts per token and their gate weights (before any drop).
    top_p, expert_index = _top_k(probs, k)  # [T, k] each
    weight = top_p / top_p.sum(dim=-1, keepdim=True) if renormalize else top_p

    # 2. Priority order over the T*k assignments, flattened to one sequence.
    if drop_policy == "position":
        # All first choices (tokens in order), then all second choices, ... (GShard).
        order = torch.arange(num_tokens * k, device=logits.device).view(k, num_tokens).t()  # [T, k]
    else:
        # Highest router probability first; the stable sort keeps ties in token order.
        flat_p = top_p.reshape(-1)  # token-major: (t0,c0), (t0,c1), (t1,c0), ...
        by_prob = torch.sort(flat_p, descending=True, stable=True).indices
        order = torch.empty_like(by_prob)
        order[by_prob] = torch.arange(by_prob.numel(), device=logits.device)
        order = order.view(num_tokens, k)
    # order[t, j] is the place of assignment (t, j) in the sequence; invert it to walk the sequence.
    sequence = torch.empty(num_tokens * k, dtype=torch.long, device=logits.device)
    sequence[order.reshape(-1)] = expert_index.reshape(-1)

    # 3. Slot = rank among earlier assignments to the same expert; keep those below capacity.
    capacity = expert_capacity(num_tokens, num_experts, k, capacity_factor, min_capacity)
    rank, wanted = _rank_within_expert(sequence, num_experts)
    rank = rank[order]  # back to [T, k]
    kept = rank < capacity
    slot = torch.where(kept, rank, torch.full_like(rank, -1))
    combine_weight = weight * kept  # dropped -> 0, no renormalisation after the drop
    tokens_per_expert = wanted.clamp(max=capacity)  # each expert keeps min(wanted, capacity)

    # 4. Auxiliary losses. f counts every choice before drops; P carries the gradient.
    f = wanted.float() / (num_tokens * k)
    p_mean = probs.mean(dim=0)
    aux_loss = num_experts * (f * p_mean).sum()
    z_loss = torch.logsumexp(logits.float(), dim=-1).square().mean()

    return Routing(expert_index, combine_weight, slot, tokens_per_expert, aux_loss, z_loss)


def dispatch(x: torch.Tensor, routing: Routing, capacity: int) -> torch.Tensor:
    """Copy each kept assignment's token row into its expert's buffer: [E, capacity, d], zeros elsewhere."""
    num_tokens, d = x.shape
    num_experts = routing.tokens_per_expert.shape[0]
    kept = routing.slot >= 0  # [T, k]
    token = torch.arange(num_tokens, device=x.device)[:, None].expand_as(routing.slot)
    row = (routing.expert_index * capacity + routing.slot)[kept]  # row of the flat [E * capacity] buffer
    buffers = x.new_zeros(num_experts * capacity, d).index_copy(0, row, x[token[kept]])
    return buffers.view(num_experts, capacity, d)


def combine(expert_out: torch.Tensor, routing: Routing) -> torch.Tensor:
    """Each token's weighted sum of its kept experts' outputs: [T, d]; fully dropped tokens get zeros."""
    num_experts, capacity, d = expert_out.shape
    if capacity == 0:  # min_capacity=0 and a tiny factor: every assignment was dropped, there is no row to read
        return expert_out.new_zeros(routing.slot.shape[0], d)
    kept = routing.slot >= 0  # [T, k]
    row = routing.expert_index * capacity + routing.slot.clamp(min=0)
    gathered = expert_out.reshape(num_experts * capacity, d)[row]  # [T, k, d]
    gathered = torch.where(kept[..., None], gathered, torch.zeros_like(gathered))  # mask, not 0 * weight: 0 * inf is NaN
    weight = routing.combine_weight.float()[..., None]
    return (weight * gathered.float()).sum(dim=1).to(expert_out.dtype)


def moe_layer(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    experts: Sequence[nn.Module],
    k: int,
    capacity_factor: float,
) -> tuple[torch.Tensor, Routing]:
    """Route, dispatch, run each expert on its buffer, combine: y [T, d] and the Routing."""
    num_tokens = x.shape[0]
    num_experts = gate_weight.shape[0]
    logits = x @ gate_weight.t()  # [T, E], the nn.Linear layout
    routing = route(logits, k, capacity_factor)
    capacity = expert_capacity(num_tokens, num_experts, k, capacity_factor)
    buffers = dispatch(x, routing, capacity)  # [E, capacity, d]
    expert_out = torch.stack([expert(buffers[e]) for e, expert in enumerate(experts)])  # a loop over experts
    return combine(expert_out, routing), routing
