"""Each exercise's speed cases as data: `grader/cases/<exercise>.py` names the shapes its speed checks
and its benchmark run, with the FLOP and byte formulas that turn a time into TFLOP/s or GB/s. The
hidden speed tests (grader/hidden/<exercise>/) and the benchmark (grader/bench/<exercise>.py) both
read them, so the graded shapes and the benchmarked shapes cannot drift apart.
"""
