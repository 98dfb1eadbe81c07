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
- `near_tie`, `accepted_choices`, `accepted_order`: the rounding band of an fp32 softmax. Two probabilities
  that differ by no more than a correctly rounded fp32 softmax can get wrong may come out in either order
  from a correct submission (a hand-written exp / sum rounds differently from torch.softmax); probabilities
  that are exactly equal (equal logits) follow the contract's tie rule. `oracle_route(..., accept=...)`
  adopts the student's choice of experts (per token) and, for the probs policy, their order in an expert's
  buffer (per expert) where these differ from the oracle's only inside that band, rank for rank.
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


# The band of near ties, in units of fp32's unit roundoff (2^-24) per unit of |log p|, plus a few: an fp32 softmax
# rounds each (logit - max) to fp32, an absolute error of |logit - max| * 2^-24 in the exponent (so a relative
# error growing with |log p| >= |logit - max|), and its exp, sum and division add a few units. Measured against
# fp64 (20,000 rows, E = 4, 8, 64, logits N(0, s^2) with s = 0.5, 2, 10): torch.softmax and four hand-written fp32
# softmaxes (exp / sum, exp(z - logsumexp), exp * (1 / sum), exp / cumsum) err by at most 95 units, about 2 units
# per unit of |log p|; the band allows 8 per unit of |log p| + 4 of each of the two. It is some 3e-6 relative at
# p = 0.3, far below any real difference in these tests' logits (bf16 logits differ by 2^-8 at least).
TIE_ULPS = 8
UNIT = 2.0**-24
TINIEST = 2.0**-126  # fp32's smallest normal number: below it an fp32 softmax cannot tell values apart


def near_tie(a: float, b: float) -> bool:
    """Two fp64 probabilities that differ, but by no more than a correct fp32 softmax's rounding can: a correct
    submission may rank them either way. Exactly equal probabilities are not near ties: the tie rule decides."""
    if a == b:
        return False
    if abs(a - b) <= TINIEST:
        return True
    if a <= 0.0 or b <= 0.0:
        return False
    la, lb = math.log(a), math.log(b)
    return abs(la - lb) <= TIE_ULPS * UNIT * (4 + abs(la) + abs(lb))


def accepted_choices(p64_row: list[float], want: list[int], got: list) -> bool:
    """Whether `got`, one token's k experts, is as good a ranking as the oracle's `want`: k distinct expert ids,
    and at every rank j the same expert as the oracle's or one whose probability is a near tie of the oracle's
    j-th (so the set is a top-k, and its order descending, up to rounding). Equal probabilities are no excuse: ties
    go to the lower index."""
    E = len(p64_row)
    if len(got) != len(want) or not all(type(g) is int and 0 <= g < E for g in got) or len(set(got)) != len(got):
        return False
    return all(g == w or near_tie(p64_row[g], p64_row[w]) for g, w in zip(got, want))


def accepted_order(p64_of: dict, want: list[tuple[int, int]], got: list[tuple[int, int]]) -> bool:
    """Whether `got`, the assignments an expert keeps in slot order, is as good as the oracle's `want` under the
    probs policy: as many, and at every slot the same assignment or one whose probability for this expert is a
    near tie of the oracle's (`p64_of[(t, j)]`: that assignment's probability). Equal probabilities: the earlier
    token."""
    return len(got) == len(want) and all(g == w or near_tie(p64_of[g], p64_of[w]) for g, w in zip(got, want))


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
    accept: tuple[list, list] | None = None,
) -> dict:
    """Routing by loops. Ranking uses fp32 probabilities (the contract); values are fp64.

    `accept` = (expert_index, slot) of a student's routing, as nested lists: where a token's experts differ from
    the oracle's only by near ties (`accepted_choices`), the oracle takes the student's; then, for the probs policy,
    where an expert's kept assignments in slot order differ only by near ties (`accepted_order`), the oracle takes
    the student's slots for that expert. Everything else (drops, slots, weights, counts, losses) follows from those
    decisions by the contract, so a student's routing that resolves near ties otherwise matches exactly."""
    T, E = logits.shape
    p32 = torch.softmax(logits.float(), -1).tolist()
    p64 = torch.softmax(logits.double(), -1)
    p64_rows = p64.tolist()
    if renormalize is None:
        renormalize = k > 1
    cap = capacity_formula(T, E, k, cf, min_capacity)
    idx = [ranked_experts(p32[t], k) for t in range(T)]
    if accept is not None:
        got_idx = accept[0]
        idx = [got_idx[t] if got_idx[t] != idx[t] and accepted_choices(p64_rows[t], idx[t], got_idx[t]) else idx[t]
               for t in range(T)]
    weight = [[p64_rows[t][e] for e in idx[t]] for t in range(T)]
    if renormalize:
        weight = [[w / sum(row) for w in row] for row in weight]

    slot = oracle_slots(idx, p32, cap, policy)
    if accept is not None and policy == "probs":
        got_slot = accept[1]
        for e in range(E):
            mine = [(t, j) for t in range(T) for j in range(k) if idx[t][j] == e]
            want = sorted((tj for tj in mine if slot[tj[0]][tj[1]] >= 0), key=lambda tj: slot[tj[0]][tj[1]])
            held = [tj for tj in mine if type(got_slot[tj[0]][tj[1]]) is int and got_slot[tj[0]][tj[1]] >= 0]
            got = sorted(held, key=lambda tj: got_slot[tj[0]][tj[1]])
            if got != want and [got_slot[t][j] for t, j in got] == list(range(len(got))) and accepted_order(
                    {tj: p64_rows[tj[0]][e] for tj in mine}, want, got):
                kept_by_student = set(held)
                for t, j in mine:
                    slot[t][j] = got_slot[t][j] if (t, j) in kept_by_student else -1

    kept = [[slot[t][j] >= 0 for j in range(k)] for t in range(T)]
    tokens = [sum(kept[t][j] for t in range(T) for j in range(k) if idx[t][j] == e) for e in range(E)]
    chosen = [sum(1 for t in range(T) for j in range(k) if idx[t][j] == e) for e in range(E)]
    f = [c / (T * k) for c in chosen]
    P = [sum(p64_rows[t][e] for t in range(T)) / T for e in range(E)]
    lse = torch.logsumexp(logits.double(), -1)
    return {
        "policy": policy,
        "logits": logits,
        "args": {"k": k, "cf": cf, "policy": policy, "min_capacity": min_capacity, "renormalize": renormalize},
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
