"""Schedule generation and simulation at scale: a submission against the reference, in one run.

    python -m grader.bench.pipeline_1f1b [SUBMISSION.py] [--reps 3]

SUBMISSION defaults to exercises/pipeline_1f1b/pipeline_1f1b.py. For p = 64 stages and m = 1024
microbatches (v = 4 chunks for the interleaved schedule: 262,144 ops per direction of the pipeline),
prints the time of each step for the submission and for solutions/pipeline_1f1b/pipeline_1f1b.py,
one thread, minimum over reps, and their ratio. Everything here is linear in p * m * v, so a ratio
far above 1 (say 5x or more) means extra work per op, or work that grows faster than the ops do.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grader.bench import load, min_time
from grader.course import find_root

P, M, V = 64, 1024, 4


def steps(mod: Any) -> dict[str, Callable[[], Any]]:
    plain = mod.one_f_one_b_schedule(P, M)
    interleaved = mod.interleaved_schedule(P, M, V)
    return {
        f"gpipe_schedule({P}, {M})": lambda: mod.gpipe_schedule(P, M),
        f"one_f_one_b_schedule({P}, {M})": lambda: mod.one_f_one_b_schedule(P, M),
        f"interleaved_schedule({P}, {M}, {V})": lambda: mod.interleaved_schedule(P, M, V),
        "simulate(1F1B)": lambda: mod.simulate(plain, 1.0, 2.0, 0.1),
        "simulate(interleaved)": lambda: mod.simulate(interleaved, 1.0, 2.0, 0.1),
    }


def main(argv: list[str] | None = None) -> int:
    root = find_root()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("submission", nargs="?", default=str(root / "exercises/pipeline_1f1b/pipeline_1f1b.py"))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    reference = load(root / "solutions/pipeline_1f1b/pipeline_1f1b.py", "reference_pipeline_1f1b")
    submission = load(Path(args.submission), "submitted_pipeline_1f1b")
    print(f"p = {P}, m = {M}, v = {V}; one thread; minimum of {args.reps} runs")
    print(f"{'step':<34} {'submission s':>13} {'reference s':>12} {'ratio':>7}")
    ref_steps = steps(reference)
    try:
        sub_steps = steps(submission)
    except NotImplementedError as exc:
        print(f"the submission is not finished: {exc}")
        return 1
    for name, ref_fn in ref_steps.items():
        ref_t = min_time(ref_fn, args.reps)
        try:
            sub_t = min_time(sub_steps[name], args.reps)
        except NotImplementedError:
            print(f"{name:<34} {'not written':>13} {ref_t:>12.3f}")
            continue
        print(f"{name:<34} {sub_t:>13.3f} {ref_t:>12.3f} {sub_t / ref_t:>6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
