"""The census's saved_tensors_hooks class, taken out of a list, with its __enter__ replaced: hooks never set."""
# expect: ...__enter__ = ...
# structural
import torch

_hooks = [torch.autograd.graph.saved_tensors_hooks][0]
_hooks.__enter__ = lambda self: self
