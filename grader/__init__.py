"""The course's autograder: harness, rubric, runner, reports."""

__version__ = "0.1.0"
