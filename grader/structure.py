"""The trusted side of the structural checks: what the grader's own process observes.

A structural check ("no Python loop over rows", "linear work", "O(1) per operation") first reads a
figure from the process that runs the student's code: the lines of the student's file a call
executed (`student.lines_executed`), or what a course driver counted beside the student's code
(`student.drive`). That process is the student's: their module can switch off line tracing, patch
the counter or the driver, and the figure then says whatever they like. So no such figure decides
points on its own. Each check also asks:

* `scan_source`: does the student's file tamper with what measured the figure (tracing, dispatch
  modes, the harness, frame introspection, dynamic code)? The static scan of grader/harness/tamper.py
  runs here, on the file's text, in the trusted process; any finding fails the check
  (`assert_untampered`).
* `clock`: what does the grader's own wall clock say? The remote call is timed here, around the proxy
  call (the round trip to the worker included), at a small size and at a size hundreds of times
  larger, alternating, keeping the best of several runs at each. The sizes are chosen so that
  vectorised code costs about the same at both (fixed per-call costs dominate) while a Python loop
  over rows costs tens of times more. Every timed call gets fresh inputs and its output is checked
  against the grader's own answer, so a submission can neither replay a cached answer nor take a
  fast, wrong path when it is not being traced. When the ratio is above the bar, more runs are taken
  before it fails (a busy machine slows some runs, rarely the best of fifteen).

`Scaling` holds one check's sizes and bar as data; the tests keep a table of them beside themselves.
What each check can and cannot prove is written down in grader/AUTHORING.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter  # bound at import, before any student module can replace time.perf_counter
from typing import Any, Callable, Sequence

from grader.harness import tamper


# --------------------------------------------------------------------------------------------------
# The grader's own clock at two sizes


@dataclass(frozen=True)
class Scaling:
    """Two sizes far apart and the largest time ratio (large / small) that honest code may show.

    Timed at ``small`` and ``large`` through the sandbox, where every call pays a round trip to the
    worker (about 2 ms on the course machine), and at ``small`` and ``large_in_process`` when the
    student's module runs in the test process (``make check``), where a call's fixed cost is ten times
    smaller and a smaller large size gives the same ratios. Either way `large` is chosen so that the
    vectorised work of the extra rows costs about one call's fixed cost (a ratio of 2-4), while a
    Python loop over them, at a few microseconds per row for even one torch call, costs 20-50 of them.
    `unit` names what grows ("rows", "tokens"). `bar` sits between the two, set from measurements on
    the course's shared machine (the tables' comments give them). `runs` calls at each size decide a
    pass; a ratio above the bar takes up to `max_runs` before it fails.
    """

    small: int
    large: int
    bar: float
    large_in_process: int | None = None
    bar_in_process: float | None = None
    unit: str = "rows"
    runs: int = 5
    max_runs: int = 15

    def sizes(self, mode: str) -> tuple[int, int]:
        large = self.large if mode == "sandbox" or self.large_in_process is None else self.large_in_process
        return self.small, large

    def bar_for(self, mode: str) -> float:
        return self.bar if mode == "sandbox" or self.bar_in_process is None else self.bar_in_process


@dataclass
class Timing:
    """The best (minimum) time of the calls at each size, on the grader's clock."""

    scaling: Scaling
    small: int
    large: int
    bar: float
    small_s: list[float] = field(default_factory=list)
    large_s: list[float] = field(default_factory=list)

    @property
    def best_small(self) -> float:
        return min(self.small_s)

    @property
    def best_large(self) -> float:
        return min(self.large_s)

    @property
    def ratio(self) -> float:
        return self.best_large / max(self.best_small, 1e-9)

    @property
    def flat(self) -> bool:
        return self.ratio <= self.bar

    def metrics(self, prefix: str = "clock") -> dict[str, float]:
        """Figures for `score.metrics`: best times in ms and their ratio."""
        return {f"{prefix}_small_ms": round(self.best_small * 1e3, 3),
                f"{prefix}_large_ms": round(self.best_large * 1e3, 3), f"{prefix}_ratio": round(self.ratio, 2)}

    def describe(self) -> str:
        s = self.scaling
        return (f"the call at {self.large / self.small:g}x the {s.unit} ({self.large} against {self.small}) took "
                f"{self.ratio:.1f}x as long on the grader's own clock ({self.best_small * 1e3:.2f} ms against "
                f"{self.best_large * 1e3:.2f} ms, best of {len(self.large_s)} runs each; the bar is {self.bar:g}x)")


def clock(mode: str, call: Callable[..., Any], make: Callable[[int], Sequence[Any]], check: Callable[..., None],
          scaling: Scaling, work: Callable[..., float] | None = None) -> Timing:
    """Time ``call(*make(n))`` on this process's clock at the two sizes of `scaling` for `mode`
    (``student.mode``: "sandbox" or "local").

    `make(n)` builds fresh arguments for one call at size n (fresh every run: a cached answer gains
    nothing); `check(result, *args)` asserts that the result is right (the test's oracle), so the timed
    calls are the real computation. One untimed call at each size first (imports, first-call caches),
    then runs alternate between the sizes; `runs` decide a pass, up to `max_runs` when the ratio is
    above the bar, so a busy machine does not fail honest code.

    `work(result, *args)`, when given, is the size of each call as the grader counts it (the ops in a
    returned schedule): each time is then scaled to exactly n, so that `make` may vary the sizes a
    little from run to run (no two calls alike) and the ratio still compares like with like.
    """
    import torch

    small, large = scaling.sizes(mode)
    timing = Timing(scaling, small, large, scaling.bar_for(mode))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # in-process (make check) as in the worker: one thread, no waiting on a busy core
    try:
        for n in (small, large):  # warm-up, checked too
            args = tuple(make(n))
            check(call(*args), *args)
        for run in range(scaling.max_runs):
            for n, times in ((small, timing.small_s), (large, timing.large_s)):
                args = tuple(make(n))
                start = perf_counter()
                result = call(*args)
                elapsed = perf_counter() - start
                check(result, *args)
                times.append(elapsed if work is None else elapsed * n / max(work(result, *args), 1e-9))
            if run + 1 >= scaling.runs and timing.flat:
                break
    finally:
        torch.set_num_threads(threads)
    return timing


def assert_flat_on_the_clock(timing: Timing, what: str, advice: str, lines: tuple[int, int] | None = None,
                             loop: str | None = None) -> None:
    """Fail when the grader's clock shows the cost growing with the size.

    `lines`: the worker's line counts at the two sizes, when the test read them (and found them
    flat): the message then says that the two disagree.
    """
    if timing.flat:
        return
    loop = loop or f"a loop over {timing.scaling.unit}"
    told = (f"the worker counted {lines[0]} and {lines[1]} lines of your module at the two sizes it traced, but "
            if lines is not None else "")
    raise AssertionError(f"{what}: {told}{timing.describe()}: {loop}. {advice}".strip())


def assert_worker_agrees(timing: Timing, what: str, worker_says: str) -> None:
    """Fail when the grader's clock contradicts the worker's figures (`worker_says`, which the test has
    already found within its own bar)."""
    if timing.flat:
        return
    raise AssertionError(
        f"{what}: the worker's figures ({worker_says}) disagree with the grader's own clock: {timing.describe()}. "
        "The worker's figures are not trusted when the grader's clock contradicts them"
    )


# --------------------------------------------------------------------------------------------------
# The trusted static scan of the student's source

_scanned: dict[tuple[str, int, int], list] = {}


def scan_source(path: str | Path) -> list:
    """The tamper findings (grader.harness.tamper) for the student's file, read here as bytes, never imported."""
    path = Path(path)
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key not in _scanned:
        _scanned[key] = list(tamper.scan_file(path))
    return _scanned[key]


def assert_untampered(path: str | Path, figure: str) -> None:
    """Fail when the student's file tampers with what measures `figure` (a worker-side count)."""
    findings = scan_source(path)
    if findings:
        raise tamper.Tampered(
            f"{figure} comes from the process that runs your code, and your file reaches for what measures it "
            f"({tamper.describe(findings)}), so it cannot be trusted and the check fails. Remove that code: this "
            "exercise needs none of it"
        )
