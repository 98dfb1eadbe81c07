"""getattr rebound to another name, then called with a computed name."""
# expect: getattr used as a value
import sys

g = getattr


def quiet(name):
    g(sys, name)(None)
