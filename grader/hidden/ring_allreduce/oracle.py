"""Naive oracles for ring all-reduce's hidden checks, written for the tests and never taken from the solution.

Every rank's tensor is split into N chunks as torch.tensor_split does (the first n % N chunks one element
longer); chunk c starts on rank c and travels the ring, so its sum is taken in ring order:
((x_c + x_(c+1)) + x_(c+2)) + ... + x_(c-1), ranks mod N, one addition at a time in the tensor's own dtype.

- `sizes_of` / `bounds`: the chunk sizes, and chunk c's [start, end), from that formula.
- `exact_sum`: the sum over ranks, exact: int64 for integer data, float64 otherwise.
- `ring_order_sum`: every chunk (or the chosen ones) summed in ring order, in the dtype, with a plain loop.
- `ring_partials`: each chunk after every hop of the ring order (what the reduce-scatter sends at each step).
- `expected_trace`: each rank's messages, step by step, as the contract prescribes them: at reduce-scatter step s
  rank r sends its partial sum of chunk (r - s) % N, at all-gather step s the finished chunk (owned - s) % N.
- `rank_state`: rank r's copy of every chunk just before a given step, by the same contract.
"""

from __future__ import annotations

import torch


def sizes_of(n: int, world: int) -> list[int]:
    """The sizes of the N chunks of n elements: n // N each, the first n % N one longer."""
    return [n // world + (1 if c < n % world else 0) for c in range(world)]


def bounds(n: int, world: int, c: int) -> tuple[int, int]:
    """Chunk c's [start, end) in the flat tensor."""
    sizes = sizes_of(n, world)
    start = sum(sizes[:c])
    return start, start + sizes[c]


def exact_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    """The sum over ranks of the flat tensors, exact (int64 for integer data, float64 otherwise)."""
    wide = torch.int64 if not xs[0].dtype.is_floating_point else torch.float64
    total = torch.zeros(xs[0].numel(), dtype=wide)
    for x in xs:
        total += x.reshape(-1).to(wide)
    return total


def ring_order_sum(xs: list[torch.Tensor], chunks: list[int] | None = None) -> torch.Tensor:
    """Chunk c summed in ring order, starting at rank c, in the tensors' own dtype (flat)."""
    world, flats = len(xs), [x.reshape(-1) for x in xs]
    n = flats[0].numel()
    out = torch.zeros_like(flats[0])
    for c in chunks if chunks is not None else range(world):
        lo, hi = bounds(n, world, c)
        acc = flats[c][lo:hi].clone()
        for hop in range(1, world):
            acc = acc + flats[(c + hop) % world][lo:hi]
        out[lo:hi] = acc
    return out


def ring_partials(flats: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """partials[c][h]: chunk c after h hops of the ring order, x_c + x_(c+1) + ... + x_(c+h), in the dtype."""
    world, n = len(flats), flats[0].numel()
    out = []
    for c in range(world):
        lo, hi = bounds(n, world, c)
        acc = flats[c][lo:hi].clone()
        hops = [acc]
        for hop in range(1, world):
            acc = acc + flats[(c + hop) % world][lo:hi]
            hops.append(acc)
        out.append(hops)
    return out


def expected_trace(flats: list, partials: list, kind: str, shift: int, finals: list | None = None) -> list[list[tuple]]:
    """Per rank, each exchange as (phase, step, chunk, the elements it sends), straight from the contract."""
    world, per_rank = len(flats), []
    for r in range(world):
        msgs = []
        if kind in ("allreduce", "reduce_scatter"):
            msgs += [("reduce-scatter", s, (r - s) % world, partials[(r - s) % world][s]) for s in range(world - 1)]
        if kind in ("allreduce", "all_gather"):
            owned = (r + 1) % world if kind == "allreduce" else (r + shift) % world
            for s in range(world - 1):
                c = (owned - s) % world
                msgs.append(("all-gather", s, c, finals[c] if finals else partials[c][world - 1]))
        per_rank.append(msgs)
    return per_rank


def rank_state(
    flats: list, partials: list, finals: list, kind: str, shift: int, r: int, phase: str, step: int
) -> list[torch.Tensor]:
    """Rank r's copy of every chunk just before `step` of `phase`, by the contract."""
    world, n = len(flats), flats[0].numel()
    own = [flats[r][slice(*bounds(n, world, j))] for j in range(world)]
    if kind == "all_gather":
        before = own
    else:  # chunk j gets its one addition at reduce-scatter step (r - j - 1) % N and then holds j .. r
        upto = step if phase == "reduce-scatter" else world - 1
        before = [partials[j][(r - j) % world] if (r - j - 1) % world < upto else own[j] for j in range(world)]
    if phase == "reduce-scatter":
        return before
    owned = (r + 1) % world if kind == "allreduce" else (r + shift) % world
    done = {(owned - t) % world for t in range(step + 1)}
    return [finals[j] if j in done else before[j] for j in range(world)]
