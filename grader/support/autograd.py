"""Forward and backward through a student's function, where the student's code runs."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


def forward_backward(
    fn: Callable, args: Sequence[Any], grad_output: torch.Tensor | Sequence[torch.Tensor], wrt: Sequence[int],
    kwargs: dict | None = None,
) -> tuple[Any, list[torch.Tensor | None]]:
    """Call ``fn(*args, **kwargs)`` with ``args[i]`` requiring grad for i in `wrt`, backpropagate
    `grad_output` from the output (or from each tensor output, given a sequence), and return
    ``(output, [grad of args[i] for i in wrt])``. Module parameters among the args get .grad too;
    collect them with `module_grads` in a driver of your own when needed.
    """
    args = list(args)
    for i in wrt:
        args[i] = args[i].detach().clone().requires_grad_(True)
    out = fn(*args, **(kwargs or {}))
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    grads_out = grad_output if isinstance(grad_output, (tuple, list)) else (grad_output,)
    pairs = [(o, g) for o, g in zip(outputs, grads_out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not pairs:
        raise RuntimeError("the output does not require grad: is it computed from the inputs with torch ops?")
    torch.autograd.backward([o for o, _ in pairs], [g.to(o.dtype) for o, g in pairs])
    detached = [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs]
    value: Any
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        value = type(out)(*detached)  # a named tuple keeps its fields
    elif isinstance(out, (tuple, list)):
        value = type(out)(detached)
    else:
        value = detached[0]
    return value, [args[i].grad for i in wrt]
