"""Course-provided code for the moe_router exercise that runs where the student's code runs.

* `Routing`: a named tuple with the fields of the exercise's Routing, importable in the grader and in
  the worker, so a test can build a routing (or pass one back that came from the student) to
  `dispatch` and `combine`. The student's functions read it by field name.
* Drivers for gradient checks (`student.drive("grader.support.moe_router:<name>", fn, ...)`): each
  runs the student's function forward, backpropagates given output gradients, and returns the
  outputs and the input gradients as plain tensors.
* Drivers for the signature check (`sparse_experts`): `expert_work` runs the student's `moe_layer` with
  a forward pre-hook on every expert module (the token rows each expert is handed, counted by the
  leading dimensions of its input), under `WorkCounter`: gptq's `TrafficCounter` (elements every aten
  operation reads and writes) with the matmul-family FLOPs by torch's own formulas (those of
  `torch.utils.flop_counter`), and counts the tensor
  elements read back into Python; `traffic` does the last two around `dispatch` or `combine`.
  The technique is that expert e computes at most `capacity` rows, not all T tokens, and that
  dispatch and combine move the T*k assignments' rows, not a one-hot [T, E, capacity] tensor.
  These figures are taken beside the student's code, so they are theirs to forge: the tests call
  `student.assert_untampered` before trusting them (the trusted scan fails a file that reaches for
  the dispatch-mode machinery, hooks or tracing), and check the counted call's result.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch.utils.flop_counter import flop_registry

from grader.harness.probes import reads_counted
from grader.support.gptq import TrafficCounter


class Routing(NamedTuple):
    expert_index: torch.Tensor
    combine_weight: torch.Tensor
    slot: torch.Tensor
    tokens_per_expert: torch.Tensor
    aux_loss: Any
    z_loss: Any


FIELDS = Routing._fields


def as_routing(value: Any) -> Routing:
    """A Routing from any object with the six fields (the student's Routing, as it came back)."""
    missing = [f for f in FIELDS if not hasattr(value, f)]
    if missing:
        raise AssertionError(
            f"route must return a Routing named tuple with fields {list(FIELDS)}; "
            f"found {type(value).__name__} without {missing}"
        )
    return Routing(*(getattr(value, f) for f in FIELDS))


def _plain(value: Any) -> Any:
    """Detached tensors; a Routing-like result as a plain Routing of detached values."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if all(hasattr(value, f) for f in FIELDS):
        return Routing(*(_plain(getattr(value, f)) for f in FIELDS))
    return value


def _requires_grad(t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} should be a tensor, found {type(t).__name__}")
    if not t.requires_grad:
        raise RuntimeError(
            f"{what} does not require grad: compute it from the inputs with differentiable torch ops "
            "(no .detach(), no torch.no_grad(), no .item()/.tolist() round trips)"
        )
    return t


def route_backward(
    route: Callable, logits: torch.Tensor, args: Sequence[Any], kwargs: dict | None,
    grad_combine_weight: torch.Tensor | None, grad_aux: float, grad_z: float,
) -> tuple[Routing, torch.Tensor]:
    """``r = route(logits, *args, **kwargs)``; backpropagate ``sum(g * r.combine_weight) +
    grad_aux * r.aux_loss + grad_z * r.z_loss`` and return ``(r, d loss / d logits)``."""
    logits = logits.detach().clone().requires_grad_(True)
    r = route(logits, *args, **(kwargs or {}))
    terms = []
    if grad_combine_weight is not None:
        cw = _requires_grad(r.combine_weight, "combine_weight")
        terms.append((cw * grad_combine_weight.to(cw.dtype)).sum())
    if grad_aux:
        terms.append(grad_aux * _requires_grad(r.aux_loss, "aux_loss"))
    if grad_z:
        terms.append(grad_z * _requires_grad(r.z_loss, "z_loss"))
    sum(terms).backward()  # type: ignore[union-attr]  # every caller asks for a term: a tensor, not 0
    grad = logits.grad if logits.grad is not None else torch.zeros_like(logits)
    return _plain(r), grad


def combine_backward(
    combine: Callable, expert_out: torch.Tensor, routing: Routing, grad_y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``y = combine(expert_out, routing)`` with expert_out and routing.combine_weight requiring grad;
    returns ``(y, d/d expert_out, d/d combine_weight)`` for the loss ``sum(grad_y * y)``."""
    expert_out = expert_out.detach().clone().requires_grad_(True)
    weight = routing.combine_weight.detach().clone().requires_grad_(True)
    y = _requires_grad(combine(expert_out, routing._replace(combine_weight=weight)), "combine's output")
    (y * grad_y.to(y.dtype)).sum().backward()
    zeros = torch.zeros_like
    return (y.detach(), expert_out.grad if expert_out.grad is not None else zeros(expert_out),
            weight.grad if weight.grad is not None else zeros(weight))


def dispatch_backward(
    dispatch: Callable, x: torch.Tensor, routing: Routing, capacity: int, grad_buffers: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``b = dispatch(x, routing, capacity)``; returns ``(b, d/dx)`` for the loss ``sum(grad_buffers * b)``."""
    x = x.detach().clone().requires_grad_(True)
    b = _requires_grad(dispatch(x, routing, capacity), "dispatch's output")
    (b * grad_buffers.to(b.dtype)).sum().backward()
    return b.detach(), x.grad if x.grad is not None else torch.zeros_like(x)


def moe_layer_backward(
    moe_layer: Callable, x: torch.Tensor, gate_weight: torch.Tensor, experts: Sequence[torch.nn.Module],
    k: int, capacity_factor: float, grad_y: torch.Tensor,
) -> tuple[torch.Tensor, Routing, torch.Tensor, torch.Tensor, list[list[torch.Tensor]]]:
    """``y, r = moe_layer(x, gate_weight, experts, k, capacity_factor)``; backpropagate ``sum(grad_y * y)``.

    Returns ``(y, r, dx, d gate_weight, [[grad of each parameter] for each expert])``; a parameter
    that received no gradient reports zeros.
    """
    x = x.detach().clone().requires_grad_(True)
    gate_weight = gate_weight.detach().clone().requires_grad_(True)
    experts = list(experts)
    for expert in experts:
        expert.zero_grad(set_to_none=True)
    y, r = moe_layer(x, gate_weight, experts, k, capacity_factor)
    _requires_grad(y, "moe_layer's output")
    (y * grad_y.to(y.dtype)).sum().backward()

    def grad(t: torch.Tensor) -> torch.Tensor:
        return t.grad.detach() if t.grad is not None else torch.zeros_like(t)

    param_grads = [[grad(p) for p in expert.parameters()] for expert in experts]
    return y.detach(), _plain(r), grad(x), grad(gate_weight), param_grads


# --------------------------------------------------------------------------------------------------
# The signature: the work each expert does, and the elements dispatch and combine move


class WorkCounter(TrafficCounter):
    """gptq's TrafficCounter (elements each aten operation reads and writes), plus the FLOPs of the
    matmul family (mm, addmm, bmm, baddbmm, convolutions, attention) by torch's own formulas, those
    `torch.utils.flop_counter.FlopCounterMode` applies, without that mode's module tracking (not needed
    here) and with one pass over the operators. The first operator a process runs under a Python
    dispatch mode imports torch._dynamo (torch/_compile.py), some 3 s on this course's CPU, once per
    worker: that, not the counting, is most of this check's time."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        formula = flop_registry.get(func.overloadpacket)
        if formula is not None:
            self.flops += int(formula(*args, **(kwargs or {}), out_val=out))
        return out


def _leading_rows(value: Any) -> int:
    """Token rows in an expert's input: the product of every dimension but the last (features)."""
    if isinstance(value, torch.Tensor):
        return math.prod(value.shape[:-1]) if value.dim() else 1
    return 0


class _ExpertTally:
    """What the forward hooks of the experts saw: rows and calls per expert, and the elements the counter
    saw moved inside the experts' calls (so that the layer's own traffic, outside them, can be told apart)."""

    def __init__(self, num_experts: int, counter: TrafficCounter) -> None:
        self.rows, self.calls = [0] * num_experts, [0] * num_experts
        self.counter = counter
        self.inside = 0  # elements read and written during the experts' calls
        self.depth, self.mark = 0, 0

    def before(self, e: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        self.rows[e] += _leading_rows(first)
        self.calls[e] += 1
        if self.depth == 0:
            self.mark = self.counter.read + self.counter.written
        self.depth += 1

    def after(self, e: int, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.inside += self.counter.read + self.counter.written - self.mark


def _result(value: Any) -> Any:
    """What a counted call returned, detached, as plain data for the test to judge."""
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_plain(v) for v in value)
    return _plain(value)


def expert_work(
    moe_layer: Callable, x: torch.Tensor, gate_weight: torch.Tensor, experts: Sequence[torch.nn.Module],
    k: int, capacity_factor: float,
) -> dict:
    """Run ``moe_layer(x, gate_weight, experts, k, capacity_factor)`` and measure its work.

    Returns {"result": what it returned (detached), "rows": [token rows handed to each expert, summed over
    its calls], "calls": [calls of each expert through ``module(...)``], "flops": matmul-family FLOPs of
    the whole call (torch's FLOP formulas), "moved": elements every aten operation read and wrote,
    "moved_outside_experts": the same less what moved during the experts' calls (routing, dispatch,
    combine), "host_reads": tensor elements read back into Python or numpy, "ops": {aten name: [read,
    written]}}. The hooks see calls made through the module (``experts[e](rows)``, as the contract
    says); a call of ``.forward`` or a functional one escapes them (its work then counts as the
    layer's own), never the FLOP count.
    """
    experts = list(experts)
    counter = WorkCounter()
    tally = _ExpertTally(len(experts), counter)
    handles = []
    for e, expert in enumerate(experts):
        handles.append(expert.register_forward_pre_hook(partial(tally.before, e), with_kwargs=True))
        handles.append(expert.register_forward_hook(partial(tally.after, e), with_kwargs=True, always_call=True))
    try:
        with reads_counted() as host, counter:
            result = moe_layer(x, gate_weight, experts, k, capacity_factor)
    finally:
        for handle in handles:
            handle.remove()
    moved = counter.read + counter.written
    return {"result": _result(result), "rows": tally.rows, "calls": tally.calls, "flops": counter.flops,
            "moved": moved, "moved_outside_experts": moved - tally.inside, "host_reads": host.reads,
            "ops": {name: list(v) for name, v in counter.ops.items()}}


def traffic(fn: Callable, *args: Any) -> dict:
    """Run ``fn(*args)`` (dispatch or combine) and count what it moves: {"result", "moved" (elements read
    and written by every aten operation), "flops", "host_reads", "ops": {aten name: [read, written]}}, as
    `expert_work` counts them."""
    counter = WorkCounter()
    with reads_counted() as host, counter:
        result = fn(*args)
    return {"result": _result(result), "moved": counter.read + counter.written,
            "flops": counter.flops, "host_reads": host.reads,
            "ops": {name: list(v) for name, v in counter.ops.items()}}
