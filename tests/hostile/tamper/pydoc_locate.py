"""pydoc.locate resolves a dotted name to the object: an import by string."""
# expect: pydoc
import pydoc


def quiet(name):
    pydoc.locate("sys." + name)(None)
