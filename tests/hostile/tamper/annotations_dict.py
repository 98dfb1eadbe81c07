"""__annotations__ written by hand: singledispatch evaluates them, and they sit in no annotation position."""
# expect: ...__annotations__
import functools


@functools.singledispatch
def step(x):
    return x


def _handler(x):
    return x


_handler.__annotations__ = {"x": "__import__('sys').settrace(None) or int"}
step.register(_handler)
