"""Benchmark online softmax against torch.softmax, in one run, as ratios.

    python -m grader.bench.online_softmax [SUBMISSION_FILE]     (default: exercises/online_softmax/online_softmax.py)

On CUDA: GB/s of the submission's softmax_triton and of torch.softmax (bytes that must move: read x
once, write y once), each as a fraction of the measured device copy bandwidth, fp16, on the shapes of
grader/cases/online_softmax.py (the graded ones and one more).
On the CPU: time of online_softmax relative to torch.softmax (one thread, minimum of 5 runs); the
Triton kernel is skipped there (the interpreter measures NumPy, not the kernel).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from grader.bench import load, min_time
from grader.cases import online_softmax as cases
from grader.course import find_root


def main(argv: list[str]) -> None:
    root = find_root()
    path = Path(argv[0]) if argv else root / "exercises" / "online_softmax" / "online_softmax.py"
    sub = load(path)
    print(f"submission: {path}")
    if torch.cuda.is_available():
        from grader import speed

        ceil = speed.ceilings()
        print(f"device copy bandwidth: {ceil.copy_bytes_per_s / 1e9:.0f} GB/s")
        print(f"{'shape':>16} {'softmax_triton GB/s':>20} {'fraction':>9} {'torch.softmax GB/s':>19} {'ratio':>6}")
        for case in cases.BENCHED:
            rows, cols = case.shape
            spec = [speed.Randn(case.shape, cases.DTYPE)]
            moved = case.bytes()
            mine = speed.time_here(sub.softmax_triton, spec)
            lib = speed.time_here(lambda x: torch.softmax(x, -1), spec)
            print(
                f"{rows:>7} x {cols:<7} {moved / mine.mean_s / 1e9:>20.0f} "
                f"{moved / mine.mean_s / ceil.copy_bytes_per_s:>9.2f} {moved / lib.mean_s / 1e9:>19.0f} "
                f"{lib.mean_s / mine.mean_s:>6.2f}"
            )
        return
    torch.set_num_threads(1)
    print("CPU, one thread, minimum of 5 runs (softmax_triton skipped: the interpreter is not the kernel)")
    print(f"{'shape':>16} {'block':>6} {'online_softmax ms':>18} {'torch.softmax ms':>17} {'ratio':>6}")
    for rows, cols, block in ((512, 4096, 1024), (64, 65536, 4096)):
        x = torch.randn(rows, cols)
        mine_s = min_time(lambda: sub.online_softmax(x, block_size=block))
        lib_s = min_time(lambda: torch.softmax(x, -1))
        print(f"{rows:>7} x {cols:<7} {block:>6} {mine_s * 1e3:>18.2f} {lib_s * 1e3:>17.2f} {mine_s / lib_s:>6.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
