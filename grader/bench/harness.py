"""Where the time goes when grading: harness overhead against test work.

    python -m grader.bench.harness [--exercise online_softmax] [--reps 5]

Prints, minimum over reps (this machine is shared and noisy; the minimum is the least disturbed):
  * the wall time to grade the reference solution of one exercise, end to end;
  * the sum of its tests' own durations (test work, including calls into the worker);
  * the cost of starting one sandboxed worker (process, namespaces, importing torch);
  * the round trip of one call into the worker, with a tiny argument and with a 1 MiB tensor.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from grader.course import find_root, load_course
from grader.harness.client import CallOptions, RemoteModule, Sandbox, WorkerProcess
from grader.options import GradeOptions
from grader.runner import grade

PROBE = "def echo(x):\n    return x\n"


def worker_costs(reps: int) -> dict[str, float]:
    """A worker's start, cold and warm (forked from the zygote, grader/harness/zygote.py, as a grade starts it
    where it can), and the round trip of one call."""
    import os

    from grader.harness import zygote
    from grader.runner import worker_zygote

    server = worker_zygote()
    with tempfile.TemporaryDirectory() as tmp:
        module = Path(tmp) / "probe.py"
        module.write_text(PROBE)
        starts: dict[str, list[float]] = {"cold": [], "warm": []}
        tiny: list[float] = []
        big: list[float] = []
        for _ in range(reps):
            for kind in ("cold", "warm") if server is not None else ("cold",):
                if kind == "warm":
                    os.environ[zygote.ENV_VAR] = server.handle()  # type: ignore[union-attr]  # warm only with one
                else:
                    os.environ.pop(zygote.ENV_VAR, None)
                worker = WorkerProcess(module, Sandbox(), call_timeout=60)
                t0 = time.perf_counter()
                worker.start()
                starts[kind].append(time.perf_counter() - t0)
                assert worker.warm_starts == (kind == "warm"), f"the {kind} start was not {kind}"
                echo = RemoteModule(worker, "probe", CallOptions()).echo
                echo(1)
                for sink, arg in ((tiny, 1), (big, torch.zeros(1 << 18))):
                    t0 = time.perf_counter()
                    for _ in range(20):
                        echo(arg)
                    sink.append((time.perf_counter() - t0) / 20)
                worker.shutdown()
        os.environ.pop(zygote.ENV_VAR, None)
    costs = {"worker start, cold": min(starts["cold"]), "call, tiny argument": min(tiny), "call, 1 MiB tensor": min(big)}
    if starts["warm"]:
        costs["worker start, warm"] = min(starts["warm"])
    return costs


def grade_costs(exercise: str, reps: int) -> dict[str, float]:
    root = find_root()
    course = load_course(root)
    walls, work = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        result = grade(course, root, root / "solutions", None, GradeOptions(exercises=[exercise], seed=1))
        walls.append(time.perf_counter() - t0)
        work.append(sum(t["duration_s"] for c in result["exercises"][0]["checks"] for t in c["tests"]))
    return {"grade wall time": min(walls), "test work": min(work)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exercise", default="online_softmax")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    grading = grade_costs(args.exercise, args.reps)
    worker = worker_costs(args.reps)
    wall = grading["grade wall time"]
    print(f"grading the reference {args.exercise} (min of {args.reps}):")
    print(f"  wall time                 {wall:8.2f} s")
    print(f"  tests' own durations      {grading['test work']:8.2f} s  ({grading['test work'] / wall:5.1%} of wall)")
    print(f"  everything else           {wall - grading['test work']:8.2f} s  (pytest process start, imports, collection)")
    print("the harness (min of reps):")
    for kind in ("cold", "warm"):
        if f"worker start, {kind}" in worker:
            start = worker[f"worker start, {kind}"]
            print(f"  start one worker, {kind}    {start * 1e3:8.1f} ms  ({start / wall:5.1%} of wall)")
    print(f"  call, tiny argument       {worker['call, tiny argument'] * 1e3:8.2f} ms")
    print(f"  call, 1 MiB tensor        {worker['call, 1 MiB tensor'] * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
