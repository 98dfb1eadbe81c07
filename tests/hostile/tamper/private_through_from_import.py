"""A submodule imported by name and put in a list: its private module read off an object the scan cannot resolve."""
# expect: ..._python_dispatch
from torch import utils


def modes():
    return [utils][0]._python_dispatch
