# Handed in as moe_router.py (tests/test_hostile_large_results.py). route() returns a routing that is right for its
# first E entries but whose tokens_per_expert runs on for 25 million more (100 MB of float32, within
# the reply limit): a check that gets as far as comparing the counts and formats them with .tolist()
# in its message builds gigabytes of Python objects in the grader's own process. expert_capacity is
# off by one, so nothing in the capacity check is earned.
import math
from typing import NamedTuple

import torch

PADDING = 25_000_000


class Routing(NamedTuple):
    expert_index: torch.Tensor
    combine_weight: torch.Tensor
    slot: torch.Tensor
    tokens_per_expert: torch.Tensor
    aux_loss: torch.Tensor
    z_loss: torch.Tensor


def router_probs(logits):
    return torch.softmax(logits.float(), -1)


def expert_capacity(num_tokens, num_experts, k, capacity_factor, min_capacity=1):
    return max(min_capacity, math.ceil(k * num_tokens * capacity_factor / num_experts)) + 1


def route(logits, k, capacity_factor, drop_policy="position", min_capacity=1, renormalize=None):
    T, E = logits.shape
    probs = router_probs(logits)
    weight, index = torch.sort(probs, dim=-1, descending=True, stable=True)
    weight, index = weight[:, :k], index[:, :k]
    cap = max(min_capacity, math.ceil(k * T * capacity_factor / E))
    flat = index.t().reshape(-1)  # position policy: every first choice before any second
    earlier = torch.nn.functional.one_hot(flat, E).cumsum(0).gather(1, flat[:, None]).squeeze(1) - 1
    slot = torch.where(earlier < cap, earlier, -1).view(k, T).t().contiguous()
    kept = slot >= 0
    counts = torch.bincount(index[kept], minlength=E).float()
    tokens = torch.cat([counts, torch.arange(PADDING, dtype=torch.float32)])
    combine = torch.where(kept, weight / weight.sum(-1, keepdim=True) if k > 1 else weight, 0.0)
    return Routing(index, combine, slot, tokens, torch.tensor(0.0), torch.tensor(0.0))


def dispatch(x, routing, capacity):
    raise NotImplementedError


def combine(expert_out, routing):
    raise NotImplementedError


def moe_layer(x, gate_weight, experts, k=2, capacity_factor=1.25):
    raise NotImplementedError
