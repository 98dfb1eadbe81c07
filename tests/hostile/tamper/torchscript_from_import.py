"""TorchScript reached through a from-import (`from torch.jit import script`): the same class by another name."""
# expect: torch.jit
from torch.jit import script


@script
def values(x):
    return x.tolist()
