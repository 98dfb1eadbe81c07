"""inspect.getmembers lists a module's attributes by name, so no getattr is needed."""
# expect: inspect
import inspect
import sys


def quiet(name):
    dict(inspect.getmembers(sys))[name](None)
