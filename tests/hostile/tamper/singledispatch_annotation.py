"""functools.singledispatch evaluates a string annotation (typing.get_type_hints): code in a string."""
# expect: __import__
import functools


@functools.singledispatch
def step(x):
    return x


@step.register
def _(x: "__import__('sys').settrace(None) or int"):
    return x
