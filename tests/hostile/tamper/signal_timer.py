"""A timer signal's handler runs between the grader's requests, in the worker's loop."""
# expect: signal
import signal


def arm(handler):
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
