"""numpy's datetime64("now") is a clock."""
# expect: numpy.datetime64
# clocks
import numpy as np


def now():
    return np.datetime64("now")
