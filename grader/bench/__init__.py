"""Benchmarks: `python -m grader.bench.<exercise>` prints figures as ratios against a baseline
measured in the same run (never a bare time). See each module's docstring."""
