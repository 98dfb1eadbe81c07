"""A driver that does nothing: the trusted baseline of grader.structure.clock.

``StudentSession.round_trip(*args)`` sends the arguments of a timed call to the worker through the same
request, probes and reply as a real call, but runs this instead of the student's code, so the grader's
clock learns what a call with those arguments costs before the student's code does any work.
"""

from __future__ import annotations

from typing import Any


def nothing(fn: Any, *args: Any, **kwargs: Any) -> None:
    """Receives the call's arguments and returns at once (never calls `fn`)."""
    return None
