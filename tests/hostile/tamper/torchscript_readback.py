"""TorchScript reads a tensor's values (`x.tolist()` inside a scripted function) below the patched Python
methods and the dispatcher, and `torch.tensor(list)` writes them back with only `aten::empty` dispatched: a red
team scored softmax_triton, paged_attention_triton and FlashAttention full marks with host numpy behind empty
kernels, and kept moe_router's and speculative's vectorised counts flat around per-token loops."""
# expect: torch.jit.script
import torch


@torch.jit.script
def values(x: torch.Tensor) -> list[float]:
    return x.tolist()
