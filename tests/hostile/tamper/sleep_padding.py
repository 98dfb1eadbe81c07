"""Sleeps when the input is small, so the ratio between two sizes looks flat."""
# expect: time.sleep
# clocks
import time

import torch


def accept(x):
    if x.shape[0] < 256:
        time.sleep(0.02)
    return torch.stack([row.sum() for row in x])
