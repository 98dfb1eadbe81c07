"""torch.Tensor taken out of a list, then patched: no chain the scan can resolve, but a torch method's name."""
# expect: ...clone = ...
# structural
import torch

_T = [torch.Tensor][0]
_clone = _T.clone
_T.clone = lambda self, *a, **k: _clone(self, *a, **k)
