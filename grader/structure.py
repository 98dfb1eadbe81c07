"""The trusted side of the structural checks: what the grader's own process observes.

A structural check ("no Python loop over rows", "linear work", "O(1) per operation") first reads a
figure from the process that runs the student's code: the lines of the student's file a call
executed (`student.lines_executed`), or what a course driver counted beside the student's code
(`student.drive`). That process is the student's: their module can switch off line tracing, patch
the counter or the driver, and the figure then says whatever they like. So no such figure decides
points on its own. Each check also asks:

* `tamper.scan_source`: does the student's file tamper with what measured the figure (tracing, dispatch
  modes, the harness, frame introspection, dynamic code), or patch modules and classes in place (what
  the drivers call)? The static scan of grader/harness/tamper.py runs in the trusted process, on the
  file's text, with its structural rules on; any finding fails the check (`tamper.assert_untampered`,
  which `student.assert_untampered` calls). Before `clock` times anything, the files the session loaded are scanned with
  the clock rules too (a clock read, a wait, a socket: what can pad a timed call), and any finding
  fails the timed check (`assert_no_clocks`).
* `clock`: what does the grader's own wall clock say? The remote call is timed here, around the proxy
  call (the round trip to the worker included), at a small size and at a size hundreds of times
  larger, alternating, keeping the best of several runs at each. The sizes are chosen so that
  vectorised code costs about the same at both (fixed per-call costs dominate) while a Python loop
  over rows costs tens of times more. Every timed call gets fresh inputs and its output is checked
  against the grader's own answer, so a submission can neither replay a cached answer nor take a
  fast, wrong path when it is not being traced. When the ratio is above the bar, more runs are taken
  before it fails (a busy machine slows some runs, rarely the best of fifteen).

The ratio alone can be bought by making the small call slow: a sleep, a busy wait, or a loop with a
padded trip count (``for i in range(max(n, CAP))``) that already costs at the small size what it
costs at the large one. So in the sandbox the ratio's denominator is not the student's to inflate:
before each small call the grader sends the same arguments to the same worker through the same
request, probes and reply, but to a driver that does nothing (`StudentSession.round_trip`,
grader.support.baseline), and the small call counts for at most `Scaling.small_cap` such round trips
(`Timing.ratio`). A small call slower than that is padded as far as the grader is concerned: the
excess buys nothing, and a loop must then fit within ``bar * small_cap`` round trips at the large
size. A loop padded to a fixed trip count pays its whole cost at the small size, over the cap, so its
ratio is large / cap. `assert_flat_on_the_clock` also refuses a line count over `Scaling.max_lines`
at the small size, which a padded Python loop cannot stay under (the count of a vectorised call is a
few dozen lines, whatever the size).

The sizes stay the tables' own: sizes drawn from the seed would not help, since the code that draws
them is in the student's release and a padded loop would pad to the top of any range it can read;
the cap is what bounds padding, whatever the sizes.

What this does not cover (grader/CHECKS.md, "What each structural check can and cannot prove"):

* a loop cheaper at the large size than ``bar * small_cap`` round trips, padded with work (no clock)
  at the small size: honest small calls measured 0.3-3x their round trip (speculative, moe_router,
  paged_kv, pipeline_1f1b under load), so with the default cap of 5 such a loop can be up to about
  ``small_cap`` times slower than the slowest honest call the bar lets through; a table with its own
  measurements can set a tighter `small_cap`;
* in-process (``make check``), no round trip exists to measure and the student's code shares this
  process: the ratio alone decides there, and nothing there is proof;
* anything that slows the worker's request machinery as much as the student's calls (it would inflate
  the round trip too): the scan flags the ways a file can reach it (the socket, signals, gc callbacks,
  finalisers, patching torch's classes and any module it can trace), but a Python class of the
  standard library patched through an object the scan cannot trace is not seen
  (grader/harness/tamper.py, "Not covered"); a uniform slowdown of the worker's process (its
  priority) leaves every ratio as it was.

`Scaling` holds one check's sizes and bar as data; the tests keep a table of them beside themselves.
Set ``GRADER_CLOCK_LOG`` to a file name to append one JSON line per clock (sizes, best times, the
round trip, the ratio), to measure a table's figures; ``GRADER_WORK_LOG`` likewise appends the operators
and reads of each pair of counted calls that `assert_no_hidden_loop` compares (to set `OPS_ALLOWANCE`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter  # bound at import, before any student module can replace time.perf_counter
from typing import Any, Callable, Protocol, Sequence

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

    `small_cap`: the most round trips to the worker with the same arguments (timed in the same runs,
    running none of the student's code) that the call at the small size counts for in the sandbox; a slower small call is
    treated as padded (module docstring). `max_lines`: the most lines of the student's file the call
    at the small size may execute, when the test counted them.

    `same`, when given, says what the two sizes share ("8192 ops"): a probe that holds the work fixed and
    changes only its shape (the same ops over 2 stages and over 4096), where honest code costs the same at
    both. Its small call is real work, not a round trip's worth, so `small_cap` does not bound it (set it to
    ``math.inf``); `linear_cap` does: the small call counts for at most that many times the trusted linear
    baseline's time at the small size, so that padding the small shape with work buys nothing beyond it.
    """

    small: int
    large: int
    bar: float
    large_in_process: int | None = None
    bar_in_process: float | None = None
    unit: str = "rows"
    runs: int = 5
    max_runs: int = 15
    small_cap: float = 5.0
    max_lines: int = 400
    linear_cap: float | None = None
    same: str = ""

    def sizes(self, mode: str) -> tuple[int, int]:
        large = self.large if mode == "sandbox" or self.large_in_process is None else self.large_in_process
        return self.small, large

    def bar_for(self, mode: str) -> float:
        return self.bar if mode == "sandbox" or self.bar_in_process is None else self.bar_in_process


@dataclass
class Timing:
    """The best (minimum) time of the calls at each size, and of the round trips, on the grader's clock."""

    scaling: Scaling
    small: int
    large: int
    bar: float
    small_s: list[float] = field(default_factory=list)
    large_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)  # round trips that run none of the student's code (sandbox)
    linear_small_s: list[float] = field(default_factory=list)  # the trusted linear baseline, when the test gave one
    linear_large_s: list[float] = field(default_factory=list)

    @property
    def best_small(self) -> float:
        return min(self.small_s)

    @property
    def best_large(self) -> float:
        return min(self.large_s)

    @property
    def best_base(self) -> float | None:
        return min(self.base_s) if self.base_s else None

    @property
    def small_allowance(self) -> float | None:
        """The most the small call counts for: `small_cap` round trips, and `linear_cap` times the linear
        baseline at the small size, when the scaling sets one (None when neither bounds it)."""
        caps = []
        if self.best_base is not None and self.scaling.small_cap != float("inf"):
            caps.append(self.scaling.small_cap * self.best_base)
        if self.scaling.linear_cap is not None and self.linear_small_s:
            caps.append(self.scaling.linear_cap * min(self.linear_small_s))
        return min(caps) if caps else None

    @property
    def padded(self) -> bool:
        """The small call took longer than `small_cap` round trips: the excess does not count."""
        allowance = self.small_allowance
        return allowance is not None and self.best_small > allowance

    @property
    def counted_small(self) -> float:
        allowance = self.small_allowance
        return self.best_small if allowance is None else min(self.best_small, allowance)

    @property
    def growth(self) -> float:
        """How many times as long the large call took as the small one (counted as `counted_small`)."""
        return self.best_large / max(self.counted_small, 1e-9)

    @property
    def linear_growth(self) -> float | None:
        """How many times as long the trusted linear baseline took at the large size (None without one)."""
        if not self.linear_small_s or not self.linear_large_s:
            return None
        return min(self.linear_large_s) / max(min(self.linear_small_s), 1e-9)

    @property
    def ratio(self) -> float:
        """The figure the bar applies to: the growth, or with a linear baseline, the growth beyond the
        baseline's (what linear work of the same size grew by in the same runs, on the same machine)."""
        linear = self.linear_growth
        return self.growth if linear is None else self.growth / max(linear, 1.0)

    @property
    def flat(self) -> bool:
        return self.ratio <= self.bar

    def metrics(self, prefix: str = "clock") -> dict[str, float]:
        """Figures for `score.metrics`: best times in ms and their ratio (and the round trip, when timed)."""
        figures = {f"{prefix}_small_ms": round(self.best_small * 1e3, 3),
                   f"{prefix}_large_ms": round(self.best_large * 1e3, 3), f"{prefix}_ratio": round(self.ratio, 2)}
        if self.best_base is not None:
            figures[f"{prefix}_round_trip_ms"] = round(self.best_base * 1e3, 3)
        if self.linear_growth is not None:
            figures[f"{prefix}_linear_growth"] = round(self.linear_growth, 2)
        return figures

    def describe(self) -> str:
        s = self.scaling
        linear = self.linear_growth
        if s.same:
            text = (f"the same {s.same} over {self.large} {s.unit} took {self.growth:.1f}x as long as over {self.small} "
                    f"on the grader's own clock ({self.counted_small * 1e3:.2f} ms against {self.best_large * 1e3:.2f} ms, "
                    f"best of {len(self.large_s)} runs each)")
            if linear is not None:
                text += (f", where linear work of the same shapes took {linear:.2f}x as long in the same runs: your "
                         f"code's cost per op grows {self.ratio:.1f} times as fast with the {s.unit} as linear work's")
            text += f" (the bar is {self.bar:g}x)"
        elif linear is None:
            text = (f"the call at {self.large / self.small:g}x the {s.unit} ({self.large} against {self.small}) took "
                    f"{self.ratio:.1f}x as long on the grader's own clock ({self.counted_small * 1e3:.2f} ms against "
                    f"{self.best_large * 1e3:.2f} ms, best of {len(self.large_s)} runs each; the bar is {self.bar:g}x)")
        else:
            text = (f"the call at {self.large / self.small:g}x the {s.unit} ({self.large} against {self.small}) took "
                    f"{self.growth:.1f}x as long on the grader's own clock ({self.counted_small * 1e3:.2f} ms against "
                    f"{self.best_large * 1e3:.2f} ms, best of {len(self.large_s)} runs each), where linear work of the "
                    f"same sizes took {linear:.1f}x as long in the same runs: your code's cost grows {self.ratio:.1f} "
                    f"times as fast as linear work's (the bar is {self.bar:g}x)")
        if self.padded and s.same:
            text += (f". The call over {self.small} {s.unit} itself took {self.best_small * 1e3:.2f} ms, more than "
                     f"{s.linear_cap:g} times linear work of that shape ({min(self.linear_small_s) * 1e3:.2f} ms), so it "
                     "counts for that much only: making the small shape slow does not hide the growth")
        elif self.padded:
            base = self.best_base
            assert base is not None  # padded by small_cap round trips: linear_cap comes with `same` (Scaling)
            text += (f". The call at {self.small} {s.unit} itself took {self.best_small * 1e3:.2f} ms where the same "
                     f"arguments make the round trip to the worker in {base * 1e3:.2f} ms, so it counts for "
                     f"{s.small_cap:g} round trips only: slowing the small call (a sleep, a busy wait, a loop padded to a fixed length) "
                     "does not hide the growth")
        return text


class SupportsRoundTrip(Protocol):
    """What `clock` needs of the `student` session: its mode, a round trip that runs no student code,
    and the student's files it has loaded (scanned for clocks before the timing)."""

    mode: str

    def round_trip(self, *args: Any) -> bool: ...

    def student_files(self) -> list[Path]: ...


def _session_for(student: str | SupportsRoundTrip) -> tuple[str, SupportsRoundTrip | None]:
    if not isinstance(student, str):
        return student.mode, student
    from grader.harness.session import registered_session  # the latest StudentSession made in this process

    registered = registered_session()
    session = registered if registered is not None and registered.mode == student else None
    if student == "sandbox" and session is None:
        raise RuntimeError("grader.structure.clock in the sandbox needs the session (pass `student`, or "
                           "make a StudentSession first) to time a round trip to the worker")
    return student, session


def assert_no_clocks(session: SupportsRoundTrip | None) -> None:
    """Fail when a student file the session loaded reads a clock, waits, or reaches a socket (the scan's
    rule 8, with rule 5's patching): the grader's clock times that code, and those can pad the calls."""
    for path in session.student_files() if session is not None else []:
        findings = tamper.scan_cached(path, clocks=True)
        if findings:
            raise tamper.Tampered(
                f"the grader's own clock times your calls, and your file reaches for a clock, a wait or a socket "
                f"({tamper.describe(findings)}), which can pad the calls it times, so the check fails. Remove that "
                "code: this exercise needs none of it"
            )


# A ratio this many times its bar after `Scaling.runs` runs fails without the rest of `max_runs`: the best
# of five alternating runs does not fall several times on a busy machine, and a superlinear call at the
# large size can take seconds each (a rescan of 4096 stages per op), which the exercise's time limit pays.
GIVE_UP = 4.0

ROUND_TRIPS_PER_RUN = 1  # as many round trips as small calls: the best of each is taken over as many samples


def clock(student: str | SupportsRoundTrip, call: Callable[..., Any], make: Callable[[int], Sequence[Any]],
          check: Callable[..., None], scaling: Scaling, work: Callable[..., float] | None = None,
          linear: Callable[..., Any] | None = None) -> Timing:
    """Time ``call(*make(n))`` on this process's clock at the two sizes of `scaling`.

    `student` is the `student` session, or its mode ("sandbox" or "local"; in the sandbox the session
    this process made last is used: grader.harness.session.registered_session). `make(n)` builds fresh arguments for one call at size n
    (fresh every run: a cached answer gains nothing); `check(result, *args)` asserts that the result is
    right (the test's oracle), so the timed calls are the real computation. One untimed call at each
    size first (imports, first-call caches), then runs alternate between the sizes; `runs` decide a
    pass, up to `max_runs` when the ratio is above the bar, so a busy machine does not fail honest code.
    In the sandbox each run also times `ROUND_TRIPS_PER_RUN` round trips with the small call's arguments
    to a worker-side driver that does nothing (the best one bounds what the small call counts for:
    `Timing.ratio`).

    `work(result, *args)`, when given, is the size of each call as the grader counts it (the ops in a
    returned schedule): each time is then scaled to exactly n, so that `make` may vary the sizes a
    little from run to run (no two calls alike) and the ratio still compares like with like.

    `linear(*args)`, when given, is a trusted baseline: course code that does linear work of the same size
    by the same path (a driver that builds an output as large, with the student's function not called). It
    is timed beside each call, and the bar then applies to the call's growth beyond the baseline's
    (`Timing.ratio`): on a loaded machine linear work itself grows faster than its size (the allocator, the
    caches, the other jobs), and measuring that in the same runs keeps honest code under the bar.
    """
    import torch

    mode, session = _session_for(student)
    assert_no_clocks(session)
    small, large = scaling.sizes(mode)
    timing = Timing(scaling, small, large, scaling.bar_for(mode))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # in-process (make check) as in the worker: one thread, no waiting on a busy core
    try:
        for n in (small, large):  # warm-up, checked too
            args = tuple(make(n))
            check(call(*args), *args)
            if linear is not None:
                linear(*args)
        for run in range(scaling.max_runs):
            for n, times in ((small, timing.small_s), (large, timing.large_s)):
                args = tuple(make(n))
                if session is not None and mode == "sandbox" and n == small:
                    timing.base_s.append(_round_trip(session, args))
                if linear is not None:
                    start = perf_counter()
                    baseline = linear(*args)
                    elapsed = perf_counter() - start
                    scaled = elapsed if work is None else elapsed * n / max(work(baseline, *args), 1e-9)
                    (timing.linear_small_s if n == small else timing.linear_large_s).append(scaled)
                start = perf_counter()
                result = call(*args)
                elapsed = perf_counter() - start
                check(result, *args)
                times.append(elapsed if work is None else elapsed * n / max(work(result, *args), 1e-9))
            if run + 1 >= scaling.runs and (timing.flat or timing.ratio > GIVE_UP * timing.bar):
                break  # more runs rescue a ratio near the bar on a busy machine, not one this far above it
    finally:
        torch.set_num_threads(threads)
    _log(timing, mode)
    return timing


def _round_trip(session: SupportsRoundTrip, args: tuple) -> float:
    """The best of a few round trips with `args` to the worker that run none of the student's code."""
    best = float("inf")
    for _ in range(ROUND_TRIPS_PER_RUN):
        start = perf_counter()
        sent = session.round_trip(*args)
        elapsed = perf_counter() - start
        if not sent:
            raise RuntimeError("grader.structure.clock: no worker was running to time a round trip to")
        best = min(best, elapsed)
    return best


def _log(timing: Timing, mode: str, **extra: Any) -> None:
    path = os.environ.get("GRADER_CLOCK_LOG")
    if not path:
        return
    record = {"mode": mode, "unit": timing.scaling.unit, "small": timing.small, "large": timing.large,
              "bar": timing.bar, "small_ms": round(timing.best_small * 1e3, 3),
              "large_ms": round(timing.best_large * 1e3, 3), "ratio": round(timing.ratio, 2),
              "round_trip_ms": None if timing.best_base is None else round(timing.best_base * 1e3, 3),
              "growth": round(timing.growth, 2),
              "linear_growth": None if timing.linear_growth is None else round(timing.linear_growth, 2),
              "runs": len(timing.large_s), **extra}
    with open(path, "a") as out:
        out.write(json.dumps(record) + "\n")


def assert_flat_on_the_clock(timing: Timing, what: str, advice: str, lines: tuple[int, int] | None = None,
                             loop: str | None = None) -> None:
    """Fail when the grader's clock shows the cost growing with the size.

    `lines`: the worker's line counts at the two sizes, when the test read them (and found them
    flat): the message then says that the two disagree. A count at the small size above
    `Scaling.max_lines` fails too: a vectorised call runs a few dozen lines, a loop padded to a fixed
    trip count runs thousands at every size.
    """
    loop = loop or f"a loop over {timing.scaling.unit}"
    if lines is not None:
        _log(timing, "lines", lines_small=lines[0], lines_large=lines[1])
        if max(lines) > timing.scaling.max_lines:
            raise AssertionError(
                f"{what}: your code executed {lines[0]} and {lines[1]} lines of your module at the two sizes the "
                f"worker traced (the bar is {timing.scaling.max_lines}, whatever the size): a loop that runs many "
                f"times even for small inputs ({loop}, or one padded to a fixed length). {advice}".strip()
            )
    if timing.flat:
        return
    told = (f"the worker counted {lines[0]} and {lines[1]} lines of your module at the two sizes it traced, but "
            if lines is not None else "")
    raise AssertionError(f"{what}: {told}{timing.describe()}: {loop}. {advice}".strip())


class SupportsWork(Protocol):
    """What `assert_no_hidden_loop` reads of the worker's counts (grader.harness.session.Work)."""

    ops: int
    reads: int
    read_bytes: int


# The bytes of tensors a call may read back into Python at the big size, whatever it read at the small one:
# vectorised code reads none, or a few scalars (a capacity, a shape's bound): 16 values of 8 bytes. A growth
# test alone let a loop over .tolist() values pad its reads at the small size to what it reads at the big one
# (red team round 16: moe_router and speculative kept their vectorised points). Counted in bytes, not
# elements: values packed several to an element (int8 ids viewed as int64) read few elements but every
# byte, and a loop needs at least its data's information, which the counted calls' big sizes keep above this
# (moe_router: T * k expert ids of 3 bits at T = 480, k = 2, 360 bytes; speculative: a match bit per draft
# token, gamma = 4 at B of about 500, 250 bytes).
READ_ALLOWANCE = 128


# The operators a counted call may dispatch at either size, whatever its size: the references dispatch 10-52
# (paged_kv's slot_mapping 10, speculative 19-39, moe_router 12-48, paged_attention 52), so six times the
# largest leaves room for honest code that loops over a few heads or experts. The big counted sizes hold more
# elements than this to loop over (moe_router 480 tokens, speculative about 500 rows or vocabulary entries,
# paged_kv 320 sequences or more), so a loop padded to a constant above its big size's count fails here.
OPS_ALLOWANCE = 300


def assert_no_hidden_loop(what: str, sizes: tuple[str, str], small: SupportsWork, big: SupportsWork,
                          advice: str, slack: int = 10, max_ops: int | None = OPS_ALLOWANCE,
                          max_read_bytes: int = READ_ALLOWANCE) -> None:
    """Fail when the torch operators a call dispatched, or the tensor elements it read back into Python,
    grow from the small size to the big one (`sizes` names them, "T=48" and "T=480"): a loop over the data
    that runs in C (``map``, ``sorted`` with a key, a comprehension over ``.tolist()``) executes no line per
    element, but it dispatches an operator per element or reads every element back. Vectorised code keeps
    both counts whatever the size. `max_ops` bounds the count at either size outright (`OPS_ALLOWANCE`): a
    growth test alone let a loop pad the small call's operators up to the big one's (red team round 18: one
    tensor_split(k) dispatches k slices), so the big size must hold more elements to loop over than
    `max_ops`; a test whose big size is smaller passes None (the public tests' quick sizes). `max_read_bytes`
    bounds the bytes read back at the big size (`READ_ALLOWANCE`). Worker figures: call
    `student.assert_untampered` first (the session's `work_executed` does). An exercise's test declares the
    whole check with `assert_no_loop_over`, which chooses both bounds from its sizes."""
    path = os.environ.get("GRADER_WORK_LOG")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"what": what, "sizes": list(sizes), "ops": [small.ops, big.ops],
                                  "reads": [small.reads, big.reads], "read_bytes": [small.read_bytes, big.read_bytes],
                                  "max_ops": max_ops}) + "\n")
    if max_ops is not None and max(small.ops, big.ops) > max_ops:
        raise AssertionError(
            f"{what} dispatched {small.ops} torch operators for {sizes[0]} and {big.ops} for {sizes[1]}: vectorised "
            f"code dispatches a few dozen whatever the size (the bar is {max_ops} at either size), so something runs "
            f"operators once per element, or pads the count. {advice}".strip()
        )
    if big.ops > small.ops + slack:
        raise AssertionError(
            f"{what} dispatched {small.ops} torch operators for {sizes[0]} and {big.ops} for {sizes[1]}: the count "
            "grows with the input, so something runs operators once per element (a loop, perhaps run by map() or "
            f"a comprehension, over rows, tokens or their values). {advice}".strip()
        )
    if big.read_bytes > max_read_bytes:
        raise AssertionError(
            f"{what} read {big.reads} tensor elements ({big.read_bytes} bytes) back into Python for {sizes[1]} "
            f"(.tolist(), .item(), .numpy(), iterating or printing a tensor): vectorised code reads back at most a "
            f"few scalars ({max_read_bytes} bytes here) whatever the size; the work is being done on Python values. "
            f"{advice}".strip()
        )
    if big.reads > small.reads + slack:
        raise AssertionError(
            f"{what} read {small.reads} tensor elements back into Python for {sizes[0]} and {big.reads} for "
            f"{sizes[1]} (.tolist(), .item(), .numpy(), iterating or printing a tensor): the work is done on Python "
            "values, element by element, where the GPU cannot help; vectorised code keeps the data in tensors. "
            f"{advice}".strip()
        )


# The fewest items the big size of `assert_no_loop_over` may hold: a vectorised call dispatches a few dozen
# operators whatever the size (the references 10-52), and a loop over the items dispatches at least one per item,
# so the big size must hold more items than an honest call has operators for the two to be told apart.
FEWEST_ITEMS = 64


def assert_no_loop_over(student: Any, fn: Any, make: Callable[[int], Sequence[Any]], check: Callable[..., None], *,
                        over: str, sizes: tuple[int, int] = (8, 128), advice: str = "", name: str | None = None,
                        scaling: Scaling | None = None) -> None:
    """The declared structural check "no Python loop over `over`": one call in a hidden test, no counters to read.

    `make(n)` builds the arguments of one call in which the dimension `over` ("query heads", "experts") has n
    items, fresh each time; `check(result, *args)` asserts the answer (the test's oracle), so every counted call
    did the work. `sizes` are the small and the big n: take real model shapes (a big size of 64 to 128 heads or
    experts is enough; `FEWEST_ITEMS` is the least). The call is counted at both sizes in the process that runs
    the student's code (`student.work_executed`: the lines of their file, the torch operators dispatched, the
    tensor bytes read back into Python), and it fails when

    * the lines executed grow with n (a Python loop);
    * the operators or the elements read back grow with n (a loop run by C: ``map``, a comprehension over
      ``.tolist()``), or exceed what the big size leaves to a loop: fewer operators than items
      (``sizes[1] - 1``, at most `OPS_ALLOWANCE`), so a loop padded to a fixed trip count at the small size pays
      at least one operator per item at both; fewer bytes read back than items (at most `READ_ALLOWANCE`).

    Those figures come from the student's process, and a file that tampers with the counters fails first (the
    trusted static scan, as `work_executed` does). `scaling`, when given, adds the grader's own clock at its sizes
    (`clock`, `assert_flat_on_the_clock`): use it where the sizes can be far apart (hundreds of times) and a loop
    costs tens of round trips to the worker; at real model shapes the counts are the check.

    What it cannot see: a loop over a dimension that `make` does not grow, and work that is quadratic inside
    vectorised operators (both are the test's to choose sizes for)."""
    small, big = sizes
    if not 0 < small < big or big < FEWEST_ITEMS:
        raise ValueError(f"assert_no_loop_over(over={over!r}): expected sizes (small, big) with 0 < small < big and "
                         f"big >= {FEWEST_ITEMS} (a vectorised call's operators would hide a loop over fewer items), "
                         f"found {sizes}")
    what: str = name or getattr(fn, "__name__", None) or "the call"
    work = {}
    for n in sizes:
        args = tuple(make(n))
        _, work[n] = student.work_executed(fn, *args, check=lambda result, args=args: check(result, *args))
    labels = (f"{small} {over}", f"{big} {over}")
    if work[big].lines > work[small].lines + 10:
        raise AssertionError(
            f"{what} executed {work[small].lines} lines of your file for {labels[0]} and {work[big].lines} for "
            f"{labels[1]}: the count grows with the {over}, so something loops over them in Python. {advice}".strip())
    assert_no_hidden_loop(what, labels, work[small], work[big], advice, max_ops=min(OPS_ALLOWANCE, big - 1),
                          max_read_bytes=min(READ_ALLOWANCE, big - 1))
    if scaling is not None:
        timing = clock(student.mode, fn, make, check, scaling)
        assert_flat_on_the_clock(timing, what, advice, lines=(work[small].lines, work[big].lines),
                                 loop=f"a loop over {over}")


def assert_worker_agrees(timing: Timing, what: str, worker_says: str) -> None:
    """Fail when the grader's clock contradicts the worker's figures (`worker_says`, which the test has
    already found within its own bar)."""
    if timing.flat:
        return
    raise AssertionError(
        f"{what}: the worker's figures ({worker_says}) disagree with the grader's own clock: {timing.describe()}. "
        "The worker's figures are not trusted when the grader's clock contradicts them"
    )
