"""os re-exports sys: os.sys.modules is sys.modules under another path."""
# expect: os.sys.modules
import os


def harness(name):
    return os.sys.modules[name]
