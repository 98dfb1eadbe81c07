"""getattr as a value: functools.reduce walks a dotted path with a name built at run time."""
# expect: getattr used as a value
import functools
import sys


def quiet(parts):
    name = "".join(reversed(parts))  # "ecarttes" reversed at run time
    functools.reduce(getattr, [name], sys)(None)
