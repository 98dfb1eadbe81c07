"""Speed checks, measured against the machine in the same run (DESIGN.md, "Speed checks").

Absolute times mean nothing across GPUs, so every speed check is a ratio to a ceiling or a baseline
measured just before, on the same device, in the trusted grader process:

* memory-bound work: bytes that must move / time, as a fraction of the device-to-device copy
  bandwidth (`ceilings().copy_bytes_per_s`);
* compute-bound work: FLOPs / time, as a fraction of a large bf16 matmul's throughput
  (`ceilings().matmul_flops_per_s`), and/or a ratio to the library baseline timed with `time_here`.

The student's code is timed in its worker (grader.support.timing.bench: warm-up, fresh inputs per
rep, L2 flushed, CUDA events, median). Those figures come from an untrusted process, so
`time_student` bounds them with the grader's own wall clock: it also times the same loop around a
function that does nothing, and rejects a report whose total is impossible (more than the wall
clock) or implausible (well under the wall clock minus the loop's own overhead).

A typical check::

    @pytest.mark.cuda
    @pytest.mark.check("triton_speed")
    def test_bandwidth(student, sm, score):
        ceil = speed.ceilings()
        t = speed.time_student(student, sm.softmax_triton, [Randn((4096, 8192), torch.float16)])
        assert torch.allclose(t.out.float(), naive(t.args[0]), atol=2e-3), "the timed output is wrong"
        achieved = 2 * 4096 * 8192 * 2 / t.median_s / ceil.copy_bytes_per_s
        score.metrics(gbps=2 * 4096 * 8192 * 2 / t.median_s / 1e9, **ceil.figures())
        score.speed(achieved)

`ceil.figures()` records, beside the ceilings, the clocks the GPU ran at when they were measured (a
throttled or clock-locked GPU explains a low figure); the result's "device" block names the GPU, the
driver and the torch, CUDA and Triton versions (grader.results.device_info).
"""

from __future__ import annotations

import functools
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from grader.support.timing import Randn, bench

__all__ = ["Randn", "Ceilings", "Timing", "TimingRejected", "ceilings", "time_here", "time_student", "check_wall_clock"]


class TimingRejected(AssertionError):
    """The worker's reported times contradict the grader's wall clock."""


@dataclass(frozen=True)
class Ceilings:
    device: str  # the GPU's name, e.g. "NVIDIA H200"
    copy_bytes_per_s: float  # bytes read + written per second by a large device-to-device copy
    matmul_flops_per_s: float  # bf16 matmul throughput, 2*n^3 FLOPs per product
    clocks_mhz: dict[str, float] = field(default_factory=dict)  # sm, mem, max_sm (nvidia-smi; {} without it)

    def figures(self) -> dict[str, float]:
        """The ceilings and clocks as numbers for ``score.metrics(**ceil.figures())``."""
        out = {"matmul_tflops": self.matmul_flops_per_s / 1e12, "copy_gbps": self.copy_bytes_per_s / 1e9}
        out.update({f"{name}_clock_mhz": mhz for name, mhz in self.clocks_mhz.items()})
        return out


@dataclass
class Timing:
    median_s: float
    min_s: float
    times_s: list[float]
    wall_s: float
    args: list[Any] = field(default_factory=list)
    out: Any = None


def _median(times: Sequence[float]) -> float:
    return statistics.median(times)


def time_here(fn: Callable, specs: Sequence[Any], kwargs: dict | None = None, reps: int = 30,
              warmup: int = 3, seed: int = 0) -> Timing:
    """Time a trusted function (a library baseline) in this process with the same loop."""
    start = time.perf_counter()
    result = bench(fn, specs, kwargs, reps=reps, warmup=warmup, seed=seed)
    wall = time.perf_counter() - start
    times = result["times_s"]
    return Timing(_median(times), min(times), times, wall, result["args"], result["out"])


@functools.lru_cache(maxsize=None)
def ceilings(device: str = "cuda", copy_mb: int = 512, matmul_n: int = 8192) -> Ceilings:
    """Measure the device's copy bandwidth and bf16 matmul throughput (once per process)."""
    if device != "cuda" or not torch.cuda.is_available():
        raise RuntimeError("ceilings are measured on a CUDA device only")
    n = copy_mb * (1 << 20) // 2
    src = torch.empty(n, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    copy = time_here(lambda: dst.copy_(src), [], reps=20)
    a = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16)
    mm = time_here(lambda: a @ b, [], reps=20)
    clocks, _ = gpu_clocks()  # right after the matmuls: the clocks under load
    return Ceilings(torch.cuda.get_device_name(), 2 * src.numel() * 2 / copy.median_s, 2 * matmul_n**3 / mm.median_s,
                    clocks)


def gpu_clocks() -> tuple[dict[str, float], str | None]:
    """({"sm": MHz, "mem": MHz, "max_sm": MHz}, driver version) of the current CUDA device, read with
    nvidia-smi; ({}, None) where nvidia-smi is missing or says nothing useful."""
    smi = shutil.which("nvidia-smi")
    if smi is None or not torch.cuda.is_available():
        return {}, None
    query = ["--query-gpu=clocks.sm,clocks.mem,clocks.max.sm,driver_version", "--format=csv,noheader,nounits"]
    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    for select in ([f"--id=GPU-{uuid}"] if uuid is not None else []) + [None]:
        try:
            proc = subprocess.run([smi, *query, *([select] if select else [])], capture_output=True, text=True,
                                  timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            return {}, None
        if proc.returncode == 0 and proc.stdout.strip():
            return parse_clocks(proc.stdout.strip().splitlines()[0])
    return {}, None


def parse_clocks(line: str) -> tuple[dict[str, float], str | None]:
    """One line of nvidia-smi's csv answer, "1980, 3201, 1980, 550.54.15" -> (clocks, driver)."""
    fields = [f.strip() for f in line.split(",")]
    clocks = {}
    for name, value in zip(("sm", "mem", "max_sm"), fields[:3]):
        try:
            clocks[name] = float(value)
        except ValueError:  # "[N/A]" on some virtualised GPUs
            pass
    return clocks, (fields[3] if len(fields) > 3 and fields[3] else None)


def check_wall_clock(reported: Sequence[float], wall_s: float, overhead_wall_s: float, slack_s: float = 0.05) -> None:
    """Reject reported per-rep times that the grader's wall clock contradicts.

    `wall_s` is the wall time of the whole timed call; `overhead_wall_s` that of the same loop around a
    function that does nothing. The student's reps account for the difference: their reported total
    may not exceed `wall_s`, nor fall below half of `wall_s - overhead_wall_s` (minus `slack_s`).
    """
    total = sum(reported)
    if any(t != t or t < 0 for t in reported):
        raise TimingRejected("the reported times include negative or NaN values")
    if total > wall_s * 1.01 + 1e-3:
        raise TimingRejected(
            f"the reported times add up to {total:.4f} s, more than the {wall_s:.4f} s the whole call took"
        )
    floor = 0.5 * (wall_s - overhead_wall_s) - slack_s
    if total < floor:
        raise TimingRejected(
            f"the reported times add up to {total:.4f} s, but the call took {wall_s:.4f} s against "
            f"{overhead_wall_s:.4f} s for the same loop doing nothing: the timing was not honest"
        )


def time_student(student: Any, fn: Any, specs: Sequence[Any], kwargs: dict | None = None, reps: int = 30,
                 warmup: int = 3, seed: int = 0) -> Timing:
    """Time the student's `fn` in its worker, bounded by this process's wall clock."""
    # Warm up (compile kernels, fill caches) outside the wall clock, then time the reps alone.
    student.drive("grader.support.timing:bench", fn, specs, kwargs, reps=0, warmup=warmup, seed=seed, return_last=False)
    options = dict(reps=reps, warmup=0, seed=seed)
    start = time.perf_counter()
    result = student.drive("grader.support.timing:bench", fn, specs, kwargs, **options)
    wall = time.perf_counter() - start
    start = time.perf_counter()
    student.drive("grader.support.timing:bench_overhead", fn, specs, kwargs, **options)
    overhead = time.perf_counter() - start
    if not isinstance(result, dict) or not isinstance(result.get("times_s"), list) or len(result["times_s"]) != reps:
        raise TimingRejected("the timing loop did not return one time per rep")
    times = [float(t) for t in result["times_s"]]
    check_wall_clock(times, wall, overhead)
    return Timing(_median(times), min(times), times, wall, list(result.get("args") or []), result.get("out"))
