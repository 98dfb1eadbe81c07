"""Benchmark `route` at T = 65,536 tokens, E = 64 experts, k = 2, as ratios measured in one run.

    python -m grader.bench.moe_router [SUBMISSION_FILE]     (default: exercises/moe_router/moe_router.py)

Prints both figures: the CPU table always, the CUDA table where a device is present.

CPU (one thread, minimum of 5 runs): the submission's route, the reference solution's route and a
vectorised oracle written here (sort-based slots), each as a ratio to the oracle. The bar is generous
(BAR times the oracle): timings on a shared CPU are noisy, and the graded vectorisation check counts
executed lines instead. On CUDA: the same shapes in bf16, as the time of one torch.topk plus one
softmax over the logits (a memory-bound floor) divided by route's time, the figure the course's
route_speed check scores (course.yaml holds its bar).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from grader.bench import load, min_time
from grader.cases.moe_router import ROUTE
from grader.course import find_root

T, E, K, CF = ROUTE.tokens, ROUTE.experts, ROUTE.k, ROUTE.capacity_factor
BAR = 5.0  # CPU: the submission may take up to BAR times the vectorised oracle


def oracle_route(logits: torch.Tensor, k: int, cf: float):
    """A vectorised position-policy route (renormalised top-k), for timing: slots from a stable sort."""
    t, e = logits.shape
    probs = torch.softmax(logits.float(), -1)
    top_p, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    top_p, idx = top_p[:, :k], idx[:, :k]
    weight = top_p / top_p.sum(-1, keepdim=True)
    cap = max(1, math.ceil(k * t * cf / e))
    seq = idx.t().reshape(-1)  # choice-major priority order
    grouped = torch.sort(seq, stable=True).indices
    counts = torch.bincount(seq, minlength=e)
    rank = torch.empty_like(seq)
    rank[grouped] = torch.arange(seq.numel(), device=seq.device) - (counts.cumsum(0) - counts)[seq[grouped]]
    rank = rank.view(k, t).t()
    kept = rank < cap
    aux = e * (counts.float() / (t * k) * probs.mean(0)).sum()
    z = torch.logsumexp(logits.float(), -1).square().mean()
    return idx, weight * kept, torch.where(kept, rank, -1), aux, z


def cpu_report(sub, ref) -> None:
    """One thread, minimum of 5 runs, each route as a ratio to the vectorised oracle timed just before."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        logits = torch.randn(T, E, generator=torch.Generator().manual_seed(0))
        oracle = min_time(lambda: oracle_route(logits, K, CF))
        print(f"CPU, one thread, minimum of 5 runs (bar: at most {BAR:g}x the oracle; information only)")
        print(f"{'':>12} {'ms':>9} {'/ oracle':>9}")
        print(f"{'oracle':>12} {oracle * 1e3:>9.1f} {1.0:>9.2f}")
        for name, module in (("reference", ref), ("submission", sub)):
            try:
                t = min_time(lambda m=module: m.route(logits, K, CF))  # type: ignore[misc]  # a lambda with a default
            except NotImplementedError as exc:
                print(f"{name:>12} not implemented: {exc}")
                continue
            verdict = "ok" if t <= BAR * oracle else f"slower than {BAR:g}x the oracle"
            print(f"{name:>12} {t * 1e3:>9.1f} {t / oracle:>9.2f}  {verdict}")
    finally:
        torch.set_num_threads(threads)


def cuda_report(sub, ref) -> None:
    """bf16 logits: time(one topk + one softmax) / time(route), the figure route_speed scores."""
    from grader import speed

    spec = [speed.Randn((T, E), ROUTE.dtype)]
    floor = speed.time_here(ROUTE.baseline, spec)
    print(f"CUDA ({torch.cuda.get_device_name()}), bf16, mean of the reps (route_speed bar in course.yaml)")
    print(f"{'':>12} {'us':>9} {'topk+softmax / route':>21}")
    print(f"{'topk+softmax':>12} {floor.mean_s * 1e6:>9.1f}")
    for name, fn in (("reference", ref.route), ("submission", sub.route), ("oracle", oracle_route)):
        try:
            t = speed.time_here(lambda lg, f=fn: f(lg, K, CF), spec)
        except NotImplementedError as exc:
            print(f"{name:>12} not implemented: {exc}")
            continue
        print(f"{name:>12} {t.mean_s * 1e6:>9.1f} {floor.mean_s / t.mean_s:>21.3f}")


def main(argv: list[str]) -> None:
    root = find_root()
    path = Path(argv[0]) if argv else root / "exercises" / "moe_router" / "moe_router.py"
    sub = load(path, "submission")
    ref = load(root / "solutions" / "moe_router" / "moe_router.py", "reference")
    print(f"submission: {path}")
    print(f"route(T={T}, E={E}, k={K}, capacity_factor={CF})")
    cpu_report(sub, ref)
    if torch.cuda.is_available():
        cuda_report(sub, ref)
    else:
        print("CUDA: no device here; route_speed is not graded on this machine")


if __name__ == "__main__":
    main(sys.argv[1:])
