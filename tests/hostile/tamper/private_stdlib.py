"""warnings._getcategory imports by a dotted name: a private helper of a module that is not torch."""
# expect: warnings._getcategory
import warnings


def find(name):
    return warnings._getcategory(name)
