"""The exit statuses of the grader's commands, one meaning each, for every command that grades or exports.

| status | meaning |
| --- | --- |
| 0 | done: every submission graded (or exported) |
| 1 | the grader itself failed on some submission (an error of the grade: rerun to retry; the student is not blamed) |
| 2 | bad input to the command (a missing folder, a bad option): nothing was done |
| 3 | done, but some students need attention: their material could not be graded or exported (each is named, with the reason, in the output and the summary); everyone else's result is final |
| 130 | interrupted (Ctrl-C): rerun the same command to finish |

A status of 1 wins over 3: a grade to redo matters before a student to chase.
"""

from __future__ import annotations

DONE = 0
GRADER_FAILED = 1
BAD_INPUT = 2
NEEDS_ATTENTION = 3
INTERRUPTED = 130


def of(grader_failures: int, students_to_chase: int) -> int:
    """The status of a step that finished: 1 when the grader failed on anyone, else 3 when any student's
    material could not be used, else 0."""
    if grader_failures:
        return GRADER_FAILED
    return NEEDS_ATTENTION if students_to_chase else DONE
