"""The grader used to learn the loop's own cost by timing it here, around a do-nothing function: a
slow do-nothing made room under the wall clock for understated times. This one slows every
do-nothing it can reach in its own process, and understates its rep times by 10x."""

import time

import torch

SLEEP_S = 0.06  # per call: the honest work, long enough to dominate any machine's noise


def softmax_triton(x: torch.Tensor) -> torch.Tensor:
    time.sleep(SLEEP_S)
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


import grader.support.timing as timing  # noqa: E402


def _slow_nothing(*args, **kwargs):
    time.sleep(SLEEP_S)
    return args[0] if args else None


timing.identity = _slow_nothing  # the old grader's do-nothing
try:
    import grader.speed as speed

    speed.loop_overhead = lambda *args, **kwargs: 1e3  # this process's copy: the grader never reads it
except ImportError:
    pass

_real_loop = timing.timed_loop


def _understated(fn, *args, **kwargs):
    if getattr(fn, "__name__", "") in ("identity", "nothing"):
        fn = _slow_nothing
    result = _real_loop(fn, *args, **kwargs)
    result["times_s"] = [float(t) / 10 for t in result["times_s"]]
    return result


timing.timed_loop = _understated
