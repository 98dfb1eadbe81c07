"""Naive oracles for moe_router's hidden checks: plain Python loops over tokens, choices and experts, on lists.

None of this is the solution; each function is the contract written out the obvious way.

- `capacity_formula`: the capacity formula, max(min_capacity, ceil(k * T * cf / E)), in Python floats.
- `ranked_experts`: one token's k best experts, by sorting the expert ids on (-probability, id): descending
  fp32 probability, ties to the lower index.
- `oracle_slots`: each choice's slot in its expert's buffer (-1: dropped), by counting in loops: the position
  policy visits every first choice (tokens in order) before any second choice (GShard); the probs policy
  sorts each expert's assignments by (-probability, token).
- `oracle_route`: the whole routing as a dict: the ranking on fp32 softmax probabilities (the contract),
  weights in fp64 (renormalised over the k chosen when asked), the slots above, kept counts, Switch's
  auxiliary loss E * sum_e f_e P_e (f_e counts choices before drops) and the z-loss mean(logsumexp^2), in fp64.
- `oracle_dispatch`: the [E, capacity, d] buffers, one row copied at a time.
- `oracle_combine`: each token's weighted sum of the buffer rows it kept, in fp64, one row at a time.
"""

from __future__ import annotations

import math

import torch


def capacity_formula(T: int, E: int, k: int, cf: float, min_capacity: int = 1) -> int:
    """Slots per expert: max(min_capacity, ceil(k * T * cf / E)), evaluated in that order in Python floats."""
    return max(min_capacity, math.ceil(k * T * cf / E))


def ranked_experts(p32_row: list[float], k: int) -> list[int]:
    """The k best experts of one token: descending probability, ties to the lower index."""
    return sorted(range(len(p32_row)), key=lambda e: (-p32_row[e], e))[:k]


def oracle_slots(idx: list[list[int]], p32: list[list[float]], cap: int, policy: str) -> list[list[int]]:
    """Each choice's slot in its expert's buffer (-1: dropped), by loops over lists."""
    T, k, E = len(idx), len(idx[0]) if idx else 0, len(p32[0]) if p32 else 0
    slot = [[-1] * k for _ in range(T)]
    if policy == "position":
        count = [0] * E
        for j in range(k):  # every first choice before any second choice
            for t in range(T):
                e = idx[t][j]
                if count[e] < cap:
                    slot[t][j] = count[e]
                    count[e] += 1
    else:
        wanting: list[list[tuple[int, int]]] = [[] for _ in range(E)]
        for t in range(T):
            for j in range(k):
                wanting[idx[t][j]].append((t, j))
        for e in range(E):
            wanting[e].sort(key=lambda tj: (-p32[tj[0]][e], tj[0]))
            for rank, (t, j) in enumerate(wanting[e][:cap]):
                slot[t][j] = rank
    return slot


def oracle_route(
    logits: torch.Tensor,
    k: int,
    cf: float,
    policy: str = "position",
    min_capacity: int = 1,
    renormalize: bool | None = None,
) -> dict:
    """Routing by loops. Ranking uses fp32 probabilities (the contract); values are fp64."""
    T, E = logits.shape
    p32 = torch.softmax(logits.float(), -1).tolist()
    p64 = torch.softmax(logits.double(), -1)
    if renormalize is None:
        renormalize = k > 1
    cap = capacity_formula(T, E, k, cf, min_capacity)
    idx = [ranked_experts(p32[t], k) for t in range(T)]
    weight = [[float(p64[t, e]) for e in idx[t]] for t in range(T)]
    if renormalize:
        weight = [[w / sum(row) for w in row] for row in weight]

    slot = oracle_slots(idx, p32, cap, policy)

    kept = [[slot[t][j] >= 0 for j in range(k)] for t in range(T)]
    tokens = [sum(kept[t][j] for t in range(T) for j in range(k) if idx[t][j] == e) for e in range(E)]
    chosen = [sum(1 for t in range(T) for j in range(k) if idx[t][j] == e) for e in range(E)]
    f = [c / (T * k) for c in chosen]
    P = [sum(float(p64[t, e]) for t in range(T)) / T for e in range(E)]
    lse = torch.logsumexp(logits.double(), -1)
    return {
        "policy": policy,
        "p32": torch.tensor(p32, dtype=torch.float32).view(T, E),
        "capacity": cap,
        "expert_index": torch.tensor(idx, dtype=torch.long).view(T, k),
        "weight": torch.tensor(weight, dtype=torch.float64).view(T, k),
        "slot": torch.tensor(slot, dtype=torch.long).view(T, k),
        "kept": torch.tensor(kept, dtype=torch.bool).view(T, k),
        "combine_weight": torch.tensor(
            [[weight[t][j] if kept[t][j] else 0.0 for j in range(k)] for t in range(T)], dtype=torch.float64
        ).view(T, k),
        "tokens_per_expert": torch.tensor(tokens, dtype=torch.long),
        "f": torch.tensor(f, dtype=torch.float64),
        "aux_loss": E * sum(f[e] * P[e] for e in range(E)),
        "z_loss": float((lse**2).mean()),
    }


def oracle_dispatch(x: torch.Tensor, o: dict, E: int, cap: int) -> torch.Tensor:
    """The [E, cap, d] buffers: token t's row copied to (expert, slot) of each kept choice; zeros elsewhere."""
    out = torch.zeros(E, cap, x.shape[1], dtype=x.dtype)
    T, k = o["slot"].shape
    for t in range(T):
        for j in range(k):
            s = int(o["slot"][t, j])
            if s >= 0:
                out[int(o["expert_index"][t, j]), s] = x[t]
    return out


def oracle_combine(expert_out: torch.Tensor, o: dict) -> torch.Tensor:
    """y[t] = sum over token t's kept choices of combine_weight * expert_out[expert, slot], in fp64."""
    T, k = o["slot"].shape
    y = torch.zeros(T, expert_out.shape[-1], dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            s = int(o["slot"][t, j])
            if s >= 0:
                y[t] += float(o["combine_weight"][t, j]) * expert_out[int(o["expert_index"][t, j]), s].double()
    return y
