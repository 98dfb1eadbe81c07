"""Top-k mixture-of-experts router with expert capacity: the exercise. Read README.md in this folder first.

Fill in the six functions below; each raises NotImplementedError until you do. `Routing` is given.
Run the public tests with `make check EX=moe_router` (or `.venv/bin/pytest exercises/moe_router`).

Conventions shared by every function here (README.md, "The contract", says why):
- T tokens, E experts, k choices per token, d features; router probabilities are fp32.
- Experts are chosen in descending probability; equal probabilities go to the lower expert index.
- An expert takes at most `capacity` assignments. Which ones win is the drop policy: "position"
  (all first choices before any second choice; earlier tokens first within a choice rank) or
  "probs" (higher router probability first; earlier tokens first on ties). An expert's buffer fills
  in that priority order: its first kept assignment takes slot 0, the next slot 1, and so on.
- A dropped assignment has slot -1 and combine weight 0; the other weights are NOT renormalised.
- No Python loop over tokens anywhere (a loop over k or over experts is fine): the grader counts the
  lines of this file your code executes at two sizes of T, and the count must not grow.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import nn


class Routing(NamedTuple):
    """What `route` decides for T tokens, E experts and k choices per token. Given; do not change."""

    expert_index: torch.Tensor  # [T, k] int64: chosen experts, best first (ties: lower index)
    combine_weight: torch.Tensor  # [T, k] fp32: gate weight of each choice; 0 where dropped
    slot: torch.Tensor  # [T, k] int64: position in the expert's buffer, -1 where dropped
    tokens_per_expert: torch.Tensor  # [E] int64: assignments kept per expert
    aux_loss: torch.Tensor  # scalar fp32: Switch load-balancing loss (1.0 when balanced)
    z_loss: torch.Tensor  # scalar fp32: mean(logsumexp(logits)^2)


def router_probs(logits: torch.Tensor) -> torch.Tensor:
    """Softmax of the router logits over the experts, computed and returned in fp32.

    Args:
        logits: [T, E], any float dtype (fp32, bf16, fp16).

    Returns:
        [T, E] fp32; each row sums to 1.
    """
    raise NotImplementedError("router_probs: cast to fp32 first, then softmax over the last dim")


def expert_capacity(
    num_tokens: int, num_experts: int, k: int, capacity_factor: float, min_capacity: int = 1
) -> int:
    """The number of slots in each expert's buffer.

    Exactly ``max(min_capacity, math.ceil(k * num_tokens * capacity_factor / num_experts))``,
    evaluated in that order in Python floats (other orders differ in the last bit for some inputs).

    Returns:
        a Python int.
    """
    raise NotImplementedError("expert_capacity: the even share of the k * T assignments, times the factor, rounded up")


def route(
    logits: torch.Tensor,
    k: int,
    capacity_factor: float,
    drop_policy: str = "position",
    min_capacity: int = 1,
    renormalize: bool | None = None,
) -> Routing:
    """Choose k experts per token, apply expert capacity, compute the auxiliary losses.

    Args:
        logits: [T, E] router logits, any float dtype.
        k: experts per token, 1 <= k <= E.
        capacity_factor: capacity = expert_capacity(T, E, k, capacity_factor, min_capacity).
        drop_policy: "position" or "probs" (see the module docstring): who wins when an expert overflows.
            For "probs" the priority is the softmax probability of that expert for that token, not
            the renormalised weight.
        min_capacity: the smallest capacity, whatever the factor.
        renormalize: divide the k chosen probabilities by their sum (Mixtral). None means True for
            k > 1 and False for k = 1 (Switch: a renormalised top-1 weight is always 1 and carries no
            gradient to the router). Renormalise BEFORE dropping; never after.

    Returns:
        Routing with
          expert_index [T, k] int64, best first, ties to the lower expert index;
          combine_weight [T, k] fp32, the chosen (renormalised or raw) probabilities, 0 if dropped,
              differentiable with respect to the logits;
          slot [T, k] int64, the assignment's position in its expert's buffer, -1 if dropped;
          tokens_per_expert [E] int64, kept assignments per expert (never above capacity);
          aux_loss, scalar fp32: E * sum_e f_e * P_e, where f_e is the fraction of the T*k choices
              that picked expert e BEFORE any drop and P_e the mean over tokens of the router
              probability of e; differentiable through P_e only;
          z_loss, scalar fp32: mean over tokens of logsumexp(logits)^2, differentiable.

    Raises:
        ValueError: if k is not in [1, E] or drop_policy is not "position" or "probs".
    """
    raise NotImplementedError("route: top-k, then each assignment's rank among earlier ones to the same expert")


def dispatch(x: torch.Tensor, routing: Routing, capacity: int) -> torch.Tensor:
    """Scatter tokens into their experts' buffers.

    Args:
        x: [T, d] token activations.
        routing: a Routing for these T tokens (E is len(routing.tokens_per_expert)).
        capacity: slots per expert (the capacity `route` used).

    Returns:
        [E, capacity, d] in x's dtype: buffers[e, s] = x[t] for each kept assignment (t, j) with
        expert_index[t, j] = e and slot[t, j] = s; every other row is zero. Differentiable in x.
        Capacity 0 (min_capacity=0) is legal: every assignment was dropped, the result is [E, 0, d].
    """
    raise NotImplementedError("dispatch: one index_copy of the kept tokens into a flat [E * capacity, d] buffer")


def combine(expert_out: torch.Tensor, routing: Routing) -> torch.Tensor:
    """Gather the experts' outputs back to their tokens and mix them with the combine weights.

    Args:
        expert_out: [E, capacity, d] the experts' outputs, slot by slot.
        routing: the Routing that filled those buffers.

    Returns:
        [T, d] in expert_out's dtype (accumulate in fp32): y[t] = sum over kept j of
        combine_weight[t, j] * expert_out[expert_index[t, j], slot[t, j]]. A token whose every
        assignment was dropped gets zeros. A dropped assignment contributes nothing even if the
        slot you would read holds inf: mask it out (0 * inf is NaN). With capacity 0 there is no
        row to read at all: every token gets zeros. Gradients flow to expert_out and to
        routing.combine_weight.
    """
    raise NotImplementedError("combine: gather rows at expert * capacity + slot, weight them, sum over k")


def moe_layer(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    experts: Sequence[nn.Module],
    k: int,
    capacity_factor: float,
) -> tuple[torch.Tensor, Routing]:
    """A whole mixture-of-experts layer (without the residual).

    Args:
        x: [T, d] tokens.
        gate_weight: [E, d] router weight in the nn.Linear layout: logits = x @ gate_weight.T.
        experts: E modules, each mapping [n, d] to [n, d_out].
        k, capacity_factor: as for `route` (default drop policy, min_capacity and renormalize).

    Returns:
        (y [T, d_out], routing): route, dispatch, run expert e on its whole buffer (a loop over
        experts is fine), combine. Gradients reach x, gate_weight and the experts' parameters.
    """
    raise NotImplementedError("moe_layer: route -> dispatch -> each expert on its buffer -> combine")
