"""operator.attrgetter with a name built at run time."""
# expect: operator.attrgetter
import operator
import sys


def quiet(name):
    operator.attrgetter(name)(sys)(None)
