"""Values read as the shapes of a nested tensor's pieces (red team round 19): the sizes tensor is read in C++ by
unbind(), so expert ids reached Python with one operator and no read-back route (moe_router vectorised 9/9)."""
# expect: torch.ops.aten._nested_view_from_buffer
import torch


def ids_of(expert_index):
    sizes = expert_index.reshape(-1, 8)
    nt = torch.ops.aten._nested_view_from_buffer(torch.zeros(1), sizes, torch.zeros_like(sizes),
                                                 torch.zeros(sizes.shape[0], dtype=torch.long))
    return [tuple(piece.size()) for piece in nt.unbind()]
