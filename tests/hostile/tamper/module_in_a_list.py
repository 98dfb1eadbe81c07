"""A module put in a list loses its name: [torch][0]._C pops the dispatch stack past the dotted-path rules."""
# expect: torch (a module) used as a value
import torch


def pop():
    return [torch][0]._C._pop_torch_dispatch_stack()
