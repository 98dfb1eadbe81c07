"""Waits on a clock reached through a name assigned from it, not through time.sleep."""
# expect: time
# clocks
from time import monotonic as now


def pad(seconds):
    end = now() + seconds
    while now() < end:
        pass
