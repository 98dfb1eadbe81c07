"""moe_router's speed case: the shape `route_speed` times (grader/hidden/moe_router/) and the benchmark
(python -m grader.bench.moe_router) runs, and the floor its figure is a ratio to.

The figure is no FLOP or byte count: it is time(one torch.topk + one softmax over the same logits) /
time(route), a memory-bound floor over route's time, so the case carries that floor, `baseline()`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class RouteSpeedCase:
    """route(logits [tokens, experts] in `dtype`, k, capacity_factor), the position policy."""

    name: str
    tokens: int
    experts: int
    k: int
    capacity_factor: float
    dtype: torch.dtype = torch.bfloat16
    tiny_tokens: int | None = None  # tokens in a CPU rehearsal of the speed check (grader/rehearsal.py)

    def tiny_case(self) -> RouteSpeedCase:
        """This case at its rehearsal size."""
        if self.tiny_tokens is None:
            raise ValueError(f"{self.name} has no rehearsal size")
        return replace(self, tokens=self.tiny_tokens, tiny_tokens=None)

    def baseline(self, logits: torch.Tensor):
        """The floor route is scored against: one top-k and one fp32 softmax over the logits."""
        return torch.topk(logits, self.k, dim=-1), torch.softmax(logits.float(), dim=-1)


ROUTE = RouteSpeedCase("route", tokens=65536, experts=64, k=2, capacity_factor=1.25, tiny_tokens=256)
