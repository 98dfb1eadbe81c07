"""A module kept as a class attribute and reached as A.m: no alias the scan can follow, so torch.library's
public Library class (a kernel over aten::exp, which runs below the guard) would not be named."""
# expect: torch (a module) used as a value
import torch


class Holder:
    m = torch


def register(kernel):
    lib = Holder.m.library.Library("aten", "IMPL")
    lib.impl("exp", kernel, "CPU")
    return lib
