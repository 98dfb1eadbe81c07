"""Every clock reading advances by the same step, so whatever the worker times looks flat. A plain
import of time passes the default scan; the clock rules and the patching rule both see it."""
# expect: time.perf_counter = ...
# structural
import itertools
import time

_ticks = itertools.count()
time.perf_counter = lambda: next(_ticks) * 1e-3
