"""Speed checks, measured against the machine in the same run (README.md, "Speed checks").

Absolute times mean nothing across GPUs, so every speed check is a ratio to a ceiling or a baseline
measured just before, on the same device, in the trusted grader process:

* memory-bound work: bytes that must move / time, as a fraction of the device-to-device copy
  bandwidth (``ceil.copy_fraction(bytes, t.mean_s)``);
* compute-bound work: FLOPs / time, as a fraction of a large bf16 matmul's throughput
  (``ceil.matmul_fraction(flops, t.mean_s)``), and/or a ratio to the library baseline timed with
  `time_here` in this process.

How `time_student` times the student's function (grader/support/timing.py holds the loop):

1. Warm-up: one request to the worker, outside the grader's clock, with inputs of its own.
2. The timed request: the loop of `reps` reps on fresh inputs made from recipes (`Randn`) and a
   nonce drawn here for this request (so nothing can be computed before it starts), timed by the
   worker per rep, and by this process's wall clock as a whole. The reply is small: the rep times,
   one fingerprint (norms) of every rep's output, and a handle to the outputs, which stay in the worker.
3. This process picks one rep at random, after the timing, and takes that rep's output (untimed). Its
   fingerprint must be the one the worker sent during the timing, and the test's `check` judges it
   against inputs this process makes itself from the recipes and the nonce: "fast garbage on every
   rep but the last", a cached output and an output computed only when asked all fail here.
4. The same loop, around a function that does nothing (returning zeros shaped like that output), runs
   in this process on the same device: the loop's own cost.
5. The bound (`check_wall_clock`): the reported times must add up to no more than the timed request
   took, and to no less than that wall time minus the loop's own cost minus a small slack
   (`SLACK_S` + `SLACK_FRACTION` of the wall time, for the request's round trip and noise). The
   check scores their mean, ``t.mean_s``: their sum is what the wall clock bounds, so a worker that
   moves time between reps gains nothing, and one that understates them all is rejected.

What the bound cannot see, by construction (everything the worker runs is the student's):

* Work the loop itself does (making inputs, fingerprints, launches): a worker that reimplements it
  faster (fuses the fingerprint into its kernel, captures the loop in a CUDA graph, makes inputs just
  in time so they are warm in L2) hides up to that work's cost, `t.overhead_s`, plus the slack. The
  loop is kept lean for this reason, and checks run enough reps that the function's own time
  dominates the slack (grader/AUTHORING.md, "Speed checks").
* Garbage on some reps: only one rep is checked, so a worker that skips the work on a fraction f of
  the reps gains that fraction and is caught with probability f.
* A kernel that computes the fingerprint but never stores its output, and computes the checked rep
  again when asked, saves the output's write: at most a factor of about two, for a softmax-like
  kernel whose output is as large as its input; nothing where the output is small against the work.
* A kernel that generates its inputs itself, replicating torch's random number generator bit for
  bit, instead of reading them.

A typical check::

    @pytest.mark.cuda
    @pytest.mark.check("triton_speed")
    def test_bandwidth(student, sm, score):
        ceil = speed.ceilings()
        t = speed.time_student(student, sm.softmax_triton, [speed.Randn((4096, 8192), torch.float16)],
                               check=lambda args, out: assert_softmax(out, args[0]), reps=4000, stride=256)
        moved = 2 * 4096 * 8192 * 2
        score.metrics(gbps=moved / t.mean_s / 1e9, **ceil.figures())
        score.speed(ceil.copy_fraction(moved, t.mean_s))

`ceil.figures()` records, beside the ceilings, the clocks the GPU ran at when they were measured (a
throttled or clock-locked GPU explains a low figure); the result's "device" block names the GPU, the
driver and the torch, CUDA and Triton versions (grader.results.device_info).
"""

from __future__ import annotations

import functools
import math
import random
import secrets
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from grader import rehearsal
from grader.support.timing import (Randn, default_device, fingerprint, fingerprint_values, foreign_part, rep_inputs,
                                   timed_loop, warm_up)

__all__ = ["Randn", "Ceilings", "Timing", "TimingRejected", "WrongTimedOutput", "ceilings", "time_here",
           "time_student", "check_wall_clock", "loop_overhead", "SLACK_S", "SLACK_FRACTION"]

SLACK_S = 5e-3  # the timed request's round trip (pickling, the socket, the reply) and scheduling noise
SLACK_FRACTION = 0.03  # of the wall time: the GPU's clocks and the host's noise between the two loops


class TimingRejected(AssertionError):
    """The worker's figures contradict the grader's: its wall clock, or the output it fingerprinted."""


class WrongTimedOutput(AssertionError):
    """The output of the rep the grader checked is wrong."""


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

    def copy_fraction(self, bytes_moved: float, seconds: float) -> float:
        """Bytes per second achieved, as a fraction of the copy bandwidth."""
        return bytes_moved / seconds / self.copy_bytes_per_s

    def matmul_fraction(self, flops: float, seconds: float) -> float:
        """FLOPs per second achieved, as a fraction of the bf16 matmul throughput."""
        return flops / seconds / self.matmul_flops_per_s


@dataclass
class Timing:
    mean_s: float  # sum of the rep times / reps: what the wall clock bounds, and what checks score
    median_s: float
    min_s: float
    times_s: list[float]
    wall_s: float  # the timed reps as this process's clock saw them (the whole timed request)
    overhead_s: float = 0.0  # the same loop around a function that does nothing, in this process
    rep: int | None = None  # the rep whose output was checked (0-based)
    args: list[Any] = field(default_factory=list)  # that rep's inputs, made in this process
    out: Any = None  # that rep's output, as the worker returned it
    nonce: int | None = None  # the timed request's nonce: rep_inputs(specs, device, nonce, rep) rebuilds any rep

    @classmethod
    def of(cls, times: Sequence[float], wall_s: float, **rest: Any) -> "Timing":
        times = list(times)
        return cls(sum(times) / len(times), statistics.median(times), min(times), times, wall_s, **rest)


def time_here(fn: Callable, specs: Sequence[Any], kwargs: dict | None = None, reps: int = 30,
              warmup: int = 3, seed: int | None = None) -> Timing:
    """Time a trusted function (a library baseline, a ceiling) in this process with the same loop."""
    nonce = secrets.randbits(62) if seed is None else 2 * seed
    reps, warmup = rehearsal.reps(reps), rehearsal.reps(warmup)
    warm_up(fn, specs, kwargs, warmup, nonce + 1)
    start = time.perf_counter()
    result = timed_loop(fn, specs, kwargs, reps, nonce, keep_bytes=0)
    return Timing.of(result["times_s"].tolist(), time.perf_counter() - start)


@functools.lru_cache(maxsize=None)
def ceilings(device: str = "cuda", copy_mb: int = 512, matmul_n: int = 8192) -> Ceilings:
    """Measure the device's copy bandwidth and bf16 matmul throughput (once per process). In a CPU rehearsal
    (grader/rehearsal.py) the same measurement runs on the CPU, small and in fp32: figures for the scoring path
    to run on, never for a bar."""
    if rehearsal.active():
        src = torch.empty(1 << 20, dtype=torch.float16)
        dst = torch.empty_like(src)
        copy = time_here(lambda: dst.copy_(src), [], reps=3)
        a, b = torch.randn(128, 128), torch.randn(128, 128)
        mm = time_here(lambda: a @ b, [], reps=3)
        return Ceilings("cpu (rehearsal)", 2 * src.numel() * 2 / copy.median_s, 2 * 128**3 / mm.median_s, {})
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


def check_wall_clock(reported: Sequence[float], wall_s: float, overhead_s: float, slack_s: float = SLACK_S,
                     slack_fraction: float = SLACK_FRACTION) -> None:
    """Reject per-rep times that the grader's wall clock contradicts.

    `wall_s` is the wall time of the timed request; `overhead_s` that of the same loop around a
    function that does nothing, run in this process. The reported times must add up to no more than
    `wall_s`, and to no less than ``wall_s - overhead_s - slack_s - slack_fraction * wall_s``.
    """
    n = len(reported)
    if any(not math.isfinite(t) or t < 0 for t in reported):
        raise TimingRejected("the worker's figures and the grader's clock disagree: the reported rep times "
                             "include negative, infinite or NaN values")
    total = sum(reported)
    if total > wall_s * (1 + 1e-6) + 1e-6:
        raise TimingRejected(
            f"the worker's figures and the grader's clock disagree: its {n} rep times add up to {total:.6f} s, "
            f"more than the {wall_s:.6f} s the whole timed call took on the grader's clock"
        )
    slack = slack_s + slack_fraction * wall_s
    floor = wall_s - overhead_s - slack
    if total < floor:
        raise TimingRejected(
            f"the worker's figures and the grader's clock disagree: its {n} rep times add up to {total:.6f} s, "
            f"but the timed call took {wall_s:.6f} s on the grader's clock, of which the loop's own work "
            f"(measured by the grader around a function that does nothing) accounts for {overhead_s:.6f} s: at "
            f"least {floor:.6f} s must be the function's (slack {slack:.6f} s)"
        )


def zeros_like_output(value: Any) -> Any:
    """Zeros of the same shapes, dtypes and devices as the tensors in `value` (the rest as it is)."""
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(zeros_like_output(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(zeros_like_output(v) for v in value)
    if isinstance(value, dict):
        return {k: zeros_like_output(v) for k, v in value.items()}
    return value


def loop_overhead(specs: Sequence[Any], reps: int, like: Any, stride: int = 1) -> float:
    """Wall seconds of the timed loop, in this process, around a function that does nothing but return
    zeros shaped like `like` (the student's output): the loop's own cost, fingerprints included."""
    template = zeros_like_output(like)

    def nothing(*args: Any, **kwargs: Any) -> Any:
        return template

    nonce = secrets.randbits(62)
    warm_up(nothing, specs, None, 1, nonce + 1)
    start = time.perf_counter()
    timed_loop(nothing, specs, None, reps, nonce, keep_bytes=0, stride=stride)
    return time.perf_counter() - start


def same_fingerprint(a: Sequence[float], b: Sequence[float], rel: float = 1e-3) -> bool:
    """Equal lengths and values within `rel` (NaN matches NaN: the output's own check reports it)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if math.isnan(x) and math.isnan(y):
            continue
        if not (x == y or math.isclose(x, y, rel_tol=rel, abs_tol=1e-6)):
            return False
    return True


def _floats(value: Any, what: str, most: int) -> list[float]:
    """A 1-D tensor or a list of at most `most` numbers, as floats (anything else: rejected). The size is
    checked before anything is read: the figures come from the worker, and a reply may hold a gigabyte,
    which tolist() would make tens of gigabytes of Python floats in this process."""
    size = value.numel() if isinstance(value, torch.Tensor) else len(value) if isinstance(value, (list, tuple)) else 0
    if size > most:
        raise TimingRejected(f"the timing loop returned {size} numbers for {what}, expected at most {most}")
    if isinstance(value, torch.Tensor) and value.dim() == 1 and not value.is_complex():
        return [float(v) for v in value.tolist()]
    if not isinstance(value, (list, tuple)):
        raise TimingRejected(f"the timing loop returned {type(value).__name__} for {what}, expected numbers")
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError, RuntimeError):
        raise TimingRejected(f"the timing loop returned something other than numbers for {what}") from None


def time_student(student: Any, fn: Any, specs: Sequence[Any], kwargs: dict | None = None, *,
                 check: Callable[[list[Any], Any], None], reps: int = 30, warmup: int = 3, stride: int = 1,
                 keep_bytes: int | None = None, slack_s: float = SLACK_S, slack_fraction: float = SLACK_FRACTION,
                 rng: random.Random | None = None, seed: int | None = None) -> Timing:
    """Time the student's `fn` in its worker over `reps` fresh inputs, bounded by this process's clock.

    `check(args, out)` judges one rep's output (raise AssertionError with a message when it is wrong);
    the rep is picked with `rng` (default: the system's randomness) after the timing, and `args` are
    its inputs as this process makes them. `stride` thins each output's fingerprint to every
    `stride`-th element of its rows (see grader.support.timing.fingerprint). `seed` fixes the nonces
    (and, without `rng`, the pick) to reproduce a run; by default they are fresh and secret.
    Raises TimingRejected when the worker's figures and the grader's disagree, WrongTimedOutput when
    the checked output is wrong.
    """
    if reps < 1:
        raise ValueError(f"a speed check times at least one rep, found reps={reps}")
    if rehearsal.active():  # a CPU rehearsal runs the path on a few reps; a shared CPU's noise is no finding
        reps, warmup, slack_fraction = rehearsal.reps(reps), rehearsal.reps(warmup), max(slack_fraction, 0.5)
    device = default_device()
    timed_nonce, warm_nonce = (secrets.randbits(62), secrets.randbits(62)) if seed is None else (2 * seed, 2 * seed + 1)
    rng = rng or (random.Random(seed) if seed is not None else random.SystemRandom())
    options = {"nonce": timed_nonce, "keep_bytes": keep_bytes, "stride": stride}
    # Warm up (compile kernels, fill caches) outside the wall clock, on inputs of its own.
    student.drive("grader.support.timing:bench", fn, specs, kwargs, reps=0, warmup=warmup, nonce=warm_nonce,
                  keep_bytes=keep_bytes)
    start = time.perf_counter()
    result = student.drive("grader.support.timing:bench", fn, specs, kwargs, reps=reps, warmup=0, **options)
    wall = time.perf_counter() - start

    if not isinstance(result, dict):
        raise TimingRejected(f"the timing loop returned {type(result).__name__}, expected its dict of figures")
    times = _floats(result.get("times_s"), "the rep times", reps)
    prints = result.get("fingerprints")
    if isinstance(prints, torch.Tensor) and prints.dim() == 2 and prints.shape[0] == reps:
        prints = list(prints)  # one row per rep: reps views of it, whatever its width
    if len(times) != reps or not isinstance(prints, (list, tuple)) or len(prints) != reps:
        raise TimingRejected(f"the timing loop did not return one time and one fingerprint per rep (of {reps})")
    if result.get("device") != device:
        raise TimingRejected(f"the timing loop ran on {result.get('device')!r}, but the grader's device is {device!r}")

    # One rep, picked now that the timing is over; its inputs made here, its output taken from the worker.
    rep = rng.randrange(reps)
    committed_raw = prints[rep]
    runs = result.get("runs")
    if runs is None or isinstance(runs, (bool, int, float, str, bytes, list, tuple, dict, torch.Tensor)):
        raise TimingRejected("the timing loop returned no handle to the outputs it kept")
    out = runs.take(rep)
    foreign = foreign_part(out)
    if foreign is not None:
        raise TimingRejected(
            f"the output of rep {rep + 1} of {reps} holds {foreign}: a timed function must return plain data "
            "(tensors, numbers, and tuples, lists or dicts of them), which the grader can hold the worker to"
        )
    args = rep_inputs(specs, device, timed_nonce, rep)
    here = fingerprint_values(fingerprint(out, stride))
    committed = _floats(committed_raw, f"the fingerprint of rep {rep + 1}", max(len(here), 1))
    if not same_fingerprint(committed, here):
        raise TimingRejected(
            f"the worker's figures and the grader's disagree: the output of rep {rep + 1} of {reps}, taken after the "
            f"timing, is not the one the worker fingerprinted during it (norms {committed[:4]} then {here[:4]}). "
            "Each call must return a result of its own, computed during the call: not a buffer a later call "
            "overwrites, not a value computed only when it is read"
        )

    overhead = loop_overhead(specs, reps, out, stride)
    check_wall_clock(times, wall, overhead, slack_s, slack_fraction)
    try:
        check(args, out)
    except AssertionError as exc:
        raise WrongTimedOutput(f"the output of rep {rep + 1} of {reps} (picked at random after the timing) is wrong: "
                               f"{exc}") from None
    return Timing.of(times, wall, overhead_s=overhead, rep=rep, args=args, out=out, nonce=timed_nonce)
