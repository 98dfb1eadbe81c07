"""The scaling layer: many submissions at once, on this machine, in containers, or on a Slurm cluster.

    errors.py     BatchError: bad input to a batch
    discover.py   the submissions of a folder, their ids, their content hashes
    backend.py    the interface: a Backend opens Slots; a Slot grades one Job into one result file
    local.py      the local backend: one long-lived grading process per lane
    container.py  the docker / apptainer backend, and the grading image's entry point
    backends.py   a backend by name, and the --backend flags
    resume.py     whether a result is current (the batch's state file)
    summary.py    per-exercise statistics, the histogram, the console tables
    batch.py      the scheduler: lanes, jobs, a result for every submission whatever happens; `grader batch`
    slurm.py      the same submissions as a Slurm job array; `grader slurm`

Everything here stands on grader/runner.py (one grade) and grader/results.py (the result file); nothing
below this package imports from it.
"""
