"""Probes that run around one call into student code, in whichever process runs that code.

* `forbidden(names)`: for the duration of the call, each named library function raises
  `ForbiddenCall` ("flash_attention must not call torch.softmax: ..."). A teaching guard: it stops
  the honest shortcut (calling the library instead of writing the technique) with a clear message.
* `count_lines(filename)`: counts the lines of one source file executed during the call. The
  structural check for vectorisation: run at two input sizes, the count must not grow with the
  number of tokens. Deterministic on a noisy machine, unlike timing.

Both are used by the sandboxed worker and by the in-process runner, so the two modes agree.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from typing import Iterable, Iterator

_INHERITED = object()


class ForbiddenCall(RuntimeError):
    """Student code called a library function the exercise asks it to write itself."""


def _resolve(dotted: str):
    """'torch.nn.functional.softmax' -> (owner object, attribute name)."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:-1]:
            owner = getattr(owner, attr)
        return owner, parts[-1]
    raise ValueError(f"cannot resolve {dotted!r} to a module attribute")


@contextlib.contextmanager
def forbidden(names: Iterable[str], why: str = "") -> Iterator[None]:
    patched = []
    try:
        for name in names:
            owner, attr = _resolve(name)
            # For a class, restore exactly what its own __dict__ held (an inherited method: nothing).
            original = vars(owner).get(attr, _INHERITED) if isinstance(owner, type) else getattr(owner, attr)

            def guard(*args, __name=name, **kwargs):
                raise ForbiddenCall(
                    f"this exercise must not call {__name}{': ' + why if why else ''}. "
                    "Write the computation yourself; that is the point of the exercise."
                )

            setattr(owner, attr, guard)
            patched.append((owner, attr, original))
        yield
    finally:
        for owner, attr, original in reversed(patched):
            if original is _INHERITED:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)


class LineCounter:
    """Counts 'line' events in frames whose code comes from one file (all threads).

    It runs in the process that runs the student's code, so its count is the student's to forge; the
    trusted side cross-checks it (grader/structure.py). It does catch the plain ways of switching it
    off: when the call ends with another trace function installed (``sys.settrace(None)`` inside the
    call, a debugger's tracer), `count` is -1, which the session reports as tampering.
    """

    TAMPERED = -1

    def __init__(self, filename: str):
        self.filename = filename
        self.count = 0
        self._tracer = self._global  # one bound method, so that `is` can recognise it later

    def _local(self, frame, event, arg):
        if event == "line":
            self.count += 1
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename == self.filename:
            return self._local
        return None

    def __enter__(self) -> "LineCounter":
        self._old = sys.gettrace()
        threading.settrace(self._tracer)
        sys.settrace(self._tracer)
        return self

    def __exit__(self, *exc) -> None:
        intact = sys.gettrace() is self._tracer
        sys.settrace(self._old)
        threading.settrace(None)  # type: ignore[arg-type]
        if not intact:
            self.count = self.TAMPERED


@contextlib.contextmanager
def around_call(filename: str, forbid: Iterable[str] = (), forbid_why: str = "", count_lines: bool = False):
    """Apply the requested probes around one call; yields the LineCounter (or None)."""
    with forbidden(forbid, forbid_why):
        if count_lines:
            with LineCounter(filename) as counter:
                yield counter
        else:
            yield None
