"""Benchmark a ring all-reduce against torch.distributed.all_reduce, on the same processes, in one run.

    python -m grader.bench.ring_allreduce [SUBMISSION_FILE] [--worlds 2 4] [--sizes-mb 1 4 16 64 256]
                                          [--reps 5] [--backend gloo|nccl]

SUBMISSION_FILE defaults to exercises/ring_allreduce/ring_allreduce.py; the reference
(solutions/ring_allreduce/ring_allreduce.py) runs beside it when it is there.

1. Volume, on the simulated ring: elements each rank sends, divided by n, against the optimum
   2(N - 1)/N, and the number of messages. Exact and noise-free.
2. Time, on N real processes (gloo on the CPU; NCCL with one GPU per rank): for each size, float32,
   the median over reps of each implementation, bracketed by barriers, and the effective bus
   bandwidth 2(N - 1)/N * bytes / time (the figure nccl-tests calls busbw). Every implementation
   runs on the same processes, sizes and inputs; its result is checked against all_reduce's once.
   The ring uses the course's DistributedComm with checked=False (no header exchange) while timed.

On a shared 2-core machine the absolute numbers mean little and single runs jump around: read the
ratios, which come from the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from grader.bench import load
from grader.course import find_root
from grader.support.ring_allreduce import (
    DistributedComm,
    run_on_processes,
    run_simulated,
)


def optimum_elements(n: int, world: int) -> list[int]:
    """What rank r of a ring all-reduce must send: 2n - len(chunk (r+1) % N) - len(chunk (r+2) % N)."""
    sizes = [n // world + (1 if c < n % world else 0) for c in range(world)]
    return [2 * n - sizes[(r + 1) % world] - sizes[(r + 2) % world] for r in range(world)]


def volume_table(impls: dict, n: int) -> None:
    print(f"\nvolume on the simulated ring, n = {n} float32 elements: the most elements any rank sends, that over n, "
          "and the messages per rank, against the optimum 2(N-1)/N * n in 2(N-1) messages")
    print(f"{'N':>3} {'optimum':>30}" + "".join(f" {name:>30}" for name in impls))
    for world in (2, 4, 8):
        best = max(optimum_elements(n, world))
        row = f"{world:>3} {best:>11} ({best / n:.4f}, {2 * (world - 1):>3} msgs)"
        for fn in impls.values():
            try:
                run = run_simulated(fn, [torch.randn(n) for _ in range(world)])
                sent = max(run["elements_sent"])
                mark = " " if run["elements_sent"] == optimum_elements(n, world) else "!"
                row += f" {sent:>10}{mark}({sent / n:.4f}, {max(run['messages_sent']):>3} msgs)"
            except Exception as exc:  # noqa: BLE001 - a broken submission still gets a row
                row += f" {'error: ' + type(exc).__name__:>30}"
        print(row)
    print("'!' marks a rank that sent other than its optimum.")


def timed(world: int, sizes_mb: list[float], reps: int, backend: str, impls: dict) -> list[dict]:
    """On `world` processes: per size, per implementation, the median seconds (rank 0's view)."""

    def body(rank: int, n_ranks: int, device: torch.device) -> list[dict]:
        import torch.distributed as dist

        rows = []
        for mb in sizes_mb:
            numel = int(mb * (1 << 20)) // 4
            gen = torch.Generator().manual_seed(1000 + rank)
            x = torch.randn(numel, generator=gen).to(device)
            want = x.clone()
            dist.all_reduce(want)
            row: dict[str, Any] = {"mb": mb, "numel": numel}
            for name, fn in {"all_reduce": None, **impls}.items():
                def op(t: torch.Tensor, fn=fn) -> None:
                    if fn is None:
                        dist.all_reduce(t)
                    else:
                        fn(t, DistributedComm(rank, n_ranks, device, checked=False))

                try:
                    check = x.clone()
                    if fn is not None:
                        fn(check, DistributedComm(rank, n_ranks, device, checked=True))
                        ok = torch.allclose(check, want, rtol=1e-4, atol=1e-4 * n_ranks)
                    else:
                        ok = True
                    times = []
                    for rep in range(reps + 1):  # the first run warms up
                        work = x.clone()
                        dist.barrier()
                        t0 = time.perf_counter()
                        op(work)
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                        dist.barrier()
                        if rep:
                            times.append(time.perf_counter() - t0)
                    row[name] = {"median_s": statistics.median(times), "ok": ok}
                except Exception as exc:  # noqa: BLE001 - report and go on
                    row[name] = {"error": f"{type(exc).__name__}: {exc}"[:120]}
            rows.append(row)
        return rows

    return run_on_processes(body, world, backend, timeout_s=3600)[0]


def busbw(world: int, numel: int, seconds: float) -> float:
    return 2 * (world - 1) / world * numel * 4 / seconds / 1e9


def main(argv: list[str] | None = None) -> None:
    root = find_root()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = root / "exercises" / "ring_allreduce" / "ring_allreduce.py"
    parser.add_argument("submission", nargs="?", default=str(default))
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = parser.parse_args(argv)

    impls = {"submission": load(Path(args.submission), "submission_ring_allreduce").ring_allreduce}
    reference = root / "solutions" / "ring_allreduce" / "ring_allreduce.py"
    if reference.is_file() and reference.resolve() != Path(args.submission).resolve():
        impls["reference"] = load(reference, "reference_ring_allreduce").ring_allreduce
    print(f"submission: {args.submission}")
    volume_table(impls, (1 << 20) + 3)

    print(f"\ntime on real processes ({args.backend}), float32, median of {args.reps}: busbw = 2(N-1)/N * bytes / time "
          "in GB/s, and X/gloo = all_reduce's time / X's time (above 1: X is faster than gloo's all_reduce)")
    header = f"{'N':>3} {'MB':>6} {'all_reduce':>11}" + "".join(f" {name:>11}" for name in impls) + \
             "".join(f" {name + '/gloo':>16}" for name in impls)
    print(header)
    for world in args.worlds:
        for row in timed(world, args.sizes_mb, args.reps, args.backend, impls):
            base = row["all_reduce"]
            line = f"{world:>3} {row['mb']:>6g}"
            for name in ("all_reduce", *impls):
                cell = row[name]
                if "error" in cell:
                    line += f" {'error':>11}"
                else:
                    mark = "" if cell["ok"] else "!"
                    line += f" {busbw(world, row['numel'], cell['median_s']):>10.2f}{mark or ' '}"
            for name in impls:
                cell = row[name]
                both = "median_s" in cell and "median_s" in base
                ratio = base["median_s"] / cell["median_s"] if both else float("nan")
                line += f" {ratio:>16.2f}"
            print(line)
            for name in impls:
                if "error" in row[name]:
                    print(f"      {name}: {row[name]['error']}")
    print("\n'!' marks a result that differs from all_reduce's. A ratio above 1 means faster than gloo's all_reduce.")


if __name__ == "__main__":
    main()
