"""One output buffer per shape, overwritten by every call: right at the moment each call returns,
but every rep the grader kept now holds the last rep's softmax."""

import time

import torch

SLEEP_S = 0.06

_buffers: dict = {}


def softmax_triton(x: torch.Tensor) -> torch.Tensor:
    time.sleep(SLEEP_S)
    out = _buffers.get((x.shape, x.dtype))
    if out is None:
        out = _buffers[(x.shape, x.dtype)] = torch.empty_like(x)
    out.copy_(torch.softmax(x.float(), dim=-1))
    return out
