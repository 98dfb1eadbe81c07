"""A name bound twice, once to torch.Tensor: not a simple alias, but patched through all the same."""
# expect: T (= a library object
# structural
import torch

T = None
T = torch.Tensor
T.sum = T.sum
