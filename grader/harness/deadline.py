"""A time limit for tests that run the student's code in-process (`make check`, `interview check`).

Grading runs the student's code in a worker and stops any one call after the exercise's
``call_timeout_s`` (grader.harness.client). Self-study imports the student's module into the test
process itself (grader.harness.session.LocalModule), where no worker can be killed: an endless loop
there used to freeze `make check` until the exercise's whole time limit ran out, silently.

Here each in-process test gets the same limit as one graded call, enforced with SIGALRM. When it
rings, `TestDeadline` is raised in the main thread at the next Python instruction, naming the
innermost line of the student's file that was running (in the main thread, else in any other
thread: a simulated rank blocked on a message). The test fails with it; the run goes on with the
next test.

What it cannot do, by design (the worker's kill covers these when grading):
- stop a single C call that never returns to Python (the signal waits for the next instruction);
- stop threads the student's code started: the test ends, they keep running in the background;
- survive a bare ``except:`` (or ``except BaseException``) around the loop that swallows it: then the
  exercise's ``time_limit_s`` ends the run, as before.
The limit is per test, a test's calls together: public tests use small inputs, and the reference
passes each in a second or two.

One loop usually hangs many tests (a loop in merge_states hangs every test that merges): at 120 s each,
eight of them used to spend the exercise's whole time limit and leave the rest "not run". So once a test
was stopped at a line of the student's file, a later test of the same run found at that same line after
`SAME_PLACE_S` is stopped there, saying why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType


SAME_PLACE_S = 3.0  # a later test found this long at a line where an earlier test ran out of time is stopped

_stopped_at: dict[tuple[str, str, int], str] = {}  # (file, function, line) where a test of this run was stopped -> that test


class TestDeadline(BaseException):
    """The in-process test ran past its limit. A BaseException, so that the student's ``except Exception``
    around a loop does not swallow it."""

    __test__ = False  # not a pytest test class, whatever its name


def _student_line(frame: FrameType | None, student_file: str) -> tuple[str, int] | None:
    """(function, line) of the innermost frame of `frame`'s stack that runs the student's file."""
    while frame is not None:
        if os.path.realpath(frame.f_code.co_filename) == student_file:
            return frame.f_code.co_name, frame.f_lineno
        frame = frame.f_back
    return None


def _stack_holds(frame: FrameType | None, filename: str) -> bool:
    while frame is not None:
        if os.path.realpath(frame.f_code.co_filename) == filename:
            return True
        frame = frame.f_back
    return False


def _where(frame: FrameType | None, student_file: str) -> tuple[tuple[str, int] | None, bool]:
    """(function, line) of the student's code that runs, in the main thread's stack, else in another thread's
    (then True)."""
    found = _student_line(frame, student_file)
    if found is not None:
        return found, False
    main = threading.main_thread().ident
    for ident, other in sys._current_frames().items():
        found = _student_line(other, student_file) if ident != main else None
        if found is not None:
            return found, True
    return None, False


def where_stopped(frame: FrameType | None, student_file: str) -> str:
    """Where the student's code was when the limit rang: 'in f (line 12)', or in another thread's."""
    found, thread = _where(frame, student_file)
    if found is None:
        return "outside your file (in a library call it made, or in the test itself)"
    return (f"in {found[0]} (line {found[1]} of {Path(student_file).name})"
            + (", in a thread your code runs on" if thread else ""))


@contextlib.contextmanager
def limited(seconds: float, student_file: Path, test_file: Path, test_name: str = "an earlier test") -> Iterator[None]:
    """Raise `TestDeadline` in the main thread once `seconds` have passed, while the test's own code runs.

    The alarm raises only while a frame of `test_file` is on the main thread's stack (the test function, its
    fixtures, and the student's code they call); when it rings in pytest's own bookkeeping between phases, it
    rings again a second later instead. Outside the main thread, or where there is no SIGALRM, it does nothing.
    """
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    student, test = os.path.realpath(student_file), os.path.realpath(test_file)
    start = time.monotonic()
    end = start + seconds

    def ring(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if not _stack_holds(frame, test):
            signal.setitimer(signal.ITIMER_REAL, 1.0)
            return
        found, _ = _where(frame, student)
        if now < end - 0.05:  # a look at where a later test is: the line an earlier test was stopped at?
            if found is not None and (student, *found) in _stopped_at:
                raise TestDeadline(
                    f"stopped after {now - start:.0f} s {where_stopped(frame, student)}, the line where "
                    f"{_stopped_at[(student, *found)]} ran out of the {seconds:g} s limit for one call into your "
                    "code: "
                    "the same endless loop, or a wait that never ends? (a test found there is not given the "
                    "whole limit again)")
            signal.setitimer(signal.ITIMER_REAL, min(SAME_PLACE_S, end - now))
            return
        if found is not None:
            _stopped_at[(student, *found)] = test_name
        raise TestDeadline(f"stopped after {seconds:g} s, the exercise's time limit for one call into your code, "
                           f"{where_stopped(frame, student)}: an endless loop, or a wait that never ends?")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, min(SAME_PLACE_S, seconds) if any(k[0] == student for k in _stopped_at)
                     else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
