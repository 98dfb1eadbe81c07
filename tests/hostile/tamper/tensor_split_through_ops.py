"""tensor_split reached through torch.ops, where the watched torch.tensor_split is not: its tensor of indices is
read in C++ and each piece's storage_offset() hands one value to Python (red team round 18)."""
# expect: torch.ops.aten.tensor_split
import torch


def values(x):
    raw = x.contiguous().view(-1).view(torch.uint8).to(torch.int64)
    pieces = torch.ops.aten.tensor_split.tensor_indices_or_sections(torch.zeros(256), raw)
    return [p.storage_offset() for p in pieces]
