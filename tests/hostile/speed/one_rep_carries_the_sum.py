"""The forgery the issue measured: one rep reports the whole sum, every other rep about 1 ns. The
total is honest, so the wall clock cannot object; the median it makes is a thousand times too fast."""

import time

import torch

SLEEP_S = 0.06  # per call: the honest work, long enough to dominate any machine's noise


def softmax_triton(x: torch.Tensor) -> torch.Tensor:
    time.sleep(SLEEP_S)
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


import grader.support.timing as timing  # noqa: E402

_real_loop = timing.timed_loop


def _one_rep_carries_the_sum(*args, **kwargs):
    result = _real_loop(*args, **kwargs)
    times = [float(t) for t in result["times_s"]]
    if len(times) > 1:
        result["times_s"] = [sum(times) - 1e-9 * (len(times) - 1)] + [1e-9] * (len(times) - 1)
    return result


timing.timed_loop = _one_rep_carries_the_sum
