"""Scores where instructors keep them: every export renders the canonical result (grader/results.py).

* `csv_gradebook`: one row per student, one column per exercise (course.yaml's order).
* `gradescope`: Gradescope's ``results.json``; `bundle` builds the autograder zip and `gradescope_run`
  is what its ``run_autograder`` runs.
* `prairielearn`: PrairieLearn's ``results.json``; `prairielearn_run` is the external grader's entry point.
* `nbgrader_gradebook`: scores written into an nbgrader gradebook through ``nbgrader.api.Gradebook``;
  `nbgrader_feedback` writes the feedback pages where ``nbgrader release_feedback`` takes them.
* `times`: submission times for lateness (an LMS's CSV, or nbgrader's ``timestamp.txt`` files).
* `feedback`: one student's self-contained HTML page, with a roofline-style plot per speed check (`roofline`).
* `cli`: the ``export``, ``feedback`` and ``gradescope-bundle`` subcommands.

Course-level choices (visibility on Gradescope, leaderboard, whether checks that need CUDA count) come
from an optional ``export:`` mapping in course.yaml (`settings`). See grader/export/README.md.
"""
