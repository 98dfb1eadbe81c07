"""A name spelled in chr() codes and joined, then looked up with getattr on a module."""
# expect: sys.settrace
import sys


def quiet():
    name = "".join(map(chr, [115, 101, 116, 116, 114, 97, 99, 101]))
    getattr(sys, "".join(map(chr, [115, 101, 116, 116, 114, 97, 99, 101])))(None)
    return name
