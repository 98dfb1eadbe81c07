"""Fault injection for tests/test_isolation.py: one student's material makes a reader raise an exception
of a type that no code of the grader names, as an archive, notebook or codec library may tomorrow.

`install()` patches the reader in this process; `serve()` is a local batch lane's grading process with
the same patch (LocalBackend(ROOT, [python, "-c", "import tests.faults as f; f.serve()"])), so that the
batch's pre-scan and the grade itself both meet the fault."""

from __future__ import annotations

import os
import sys

FAULTY = "mallory"  # the student (a folder submission) whose reading raises


class Unforeseen(Exception):
    """An exception type that nothing in the grader names."""


def install(patch=None) -> None:
    """Make reading any file of the folder submission FAULTY raise Unforeseen. `patch`: a setattr-like
    function (pytest's monkeypatch.setattr, to undo it after the test); default: setattr."""
    import grader.submission as submission

    real = submission._read_candidate

    def read(root_fd: int, parts: tuple[str, ...]) -> bytes | None:
        if os.path.basename(os.readlink(f"/proc/self/fd/{root_fd}")) == FAULTY:
            raise Unforeseen("a reader met something nobody planned for")
        return real(root_fd, parts)

    (patch or setattr)(submission, "_read_candidate", read)


def serve() -> int:
    from grader.scale.local import serve as real_serve

    install()
    return real_serve()


SERVE = [sys.executable, "-c", "import sys, tests.faults as f; sys.exit(f.serve())"]
