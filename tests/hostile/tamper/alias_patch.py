"""A library class bound to a name, then patched through it: torch.Tensor's method replaced."""
# expect: torch.Tensor.clone = ...
# structural
import torch

T = torch.Tensor
_clone = T.clone
T.clone = lambda self, *a, **k: _clone(self, *a, **k)
