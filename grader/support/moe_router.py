"""Course-provided code for the moe_router exercise that runs where the student's code runs.

* `Routing`: a named tuple with the fields of the exercise's Routing, importable in the grader and in
  the worker, so a test can build a routing (or pass one back that came from the student) to
  `dispatch` and `combine`. The student's functions read it by field name.
* Drivers for gradient checks (`student.drive("grader.support.moe_router:<name>", fn, ...)`): each
  runs the student's function forward, backpropagates given output gradients, and returns the
  outputs and the input gradients as plain tensors.
* Drivers for the signature check (`sparse_experts`): `expert_work` runs the student's `moe_layer` with
  each expert module's `forward` wrapped (the token rows each expert's forward body computes, counted by
  the leading dimensions of its input, and its calls), under `WorkCounter`: gptq's `TrafficCounter`
  (elements every aten operation reads and writes) with the FLOPs of every operator that does arithmetic
  beyond a constant per element it moves (torch's own formulas, those of `torch.utils.flop_counter`, and
  the course's for the contractions torch leaves out), and counts the tensor elements read back into
  Python; `traffic` does the last two around `dispatch` or `combine`. Everything between entering and
  leaving the counted call is counted: the student's own hooks on the experts (pre-hooks, forward hooks)
  and any code they run included. An operator the counter has no formula for and cannot bound by its
  traffic is reported by name (`uncounted`), and the check fails on it (never counted as zero).
  The technique is that expert e computes at most `capacity` rows, not all T tokens, and that
  dispatch and combine move the T*k assignments' rows, not a one-hot [T, E, capacity] tensor.
  These figures are taken beside the student's code, so they are theirs to forge: the tests call
  `student.assert_untampered` before trusting them (the trusted scan fails a file that reaches for
  the dispatch-mode machinery, global hooks or tracing), and check the counted call's result.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch.utils.flop_counter import flop_registry
from torch.utils._pytree import tree_flatten

from grader.harness.host_reads import reads_counted
from grader.support.gptq import _NO_DATA, TrafficCounter


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


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else ()


def _batch_matrix(t: Any) -> tuple[int, int, int]:
    """(batch, rows, cols) of a tensor's last two dimensions; (1, 1, n) for a vector."""
    shape = _shape(t)
    if len(shape) < 2:
        return 1, 1, math.prod(shape)
    return math.prod(shape[:-2]), shape[-2], shape[-1]


def _trilinear_flops(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1, **_: Any) -> int:
    """aten._trilinear (torch.nn.functional.bilinear): the three inputs, each unsqueezed at its `expand` dims,
    are multiplied over their broadcast shape and summed over `sumdim`: two multiplies and an add for each
    element of that broadcast product (none of which is an element of its output)."""
    shapes = []
    for t, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        shape = list(_shape(t))
        for dim in sorted(expand):
            shape.insert(dim, 1)
        shapes.append(shape)
    rank = max(len(x) for x in shapes)  # equal ranks (torch checks); padded on the left all the same
    full = [max(sizes) for sizes in zip(*([1] * (rank - len(x)) + x for x in shapes))]
    return 3 * math.prod(full)


def _pairwise_flops(x1, x2, *_: Any, per: int = 3, **__: Any) -> int:
    """cdist's kernels ([.., n, d] against [.., m, d]): `per` operations for each of the n * m * d terms."""
    batch, n, d = _batch_matrix(x1)
    return per * batch * n * _batch_matrix(x2)[1] * d


def _sdpa_cpu_flops(query, key, value, *_: Any, **__: Any) -> int:
    """softmax(q k^T) v on the CPU's fused kernel: 2 L S E for the scores, 2 L S Ev for the weighted sum."""
    *batch, L, E = _shape(query)
    S, Ev = _shape(key)[-2], _shape(value)[-1]
    return 2 * math.prod(batch) * L * S * (E + Ev)


# Contractions that torch's FLOP counter has no formula for, each with the course's: multiply-adds counted as 2,
# as torch's formulas count them. Every one reaches the same arithmetic as a matmul from a public torch entry point
# (measured under a dispatch mode, torch 2.13): torch.addbmm, torch.mv / Tensor.mv, torch.addmv, torch.dot,
# torch.vdot, torch._addmm_activation, torch.nn.functional.bilinear (-> _trilinear), torch.cdist (-> _euclidean_dist
# or _cdist_forward), torch.nn.functional.embedding_bag with per_sample_weights (a weighted sum of weight rows:
# its traffic counts each weight row once, however often it is summed), scaled_dot_product_attention's fused CPU
# kernel, torch._int_mm.
COURSE_FLOPS: dict[str, Callable[..., int]] = {
    "addbmm": lambda self, b1, b2, *_, **__: 2 * math.prod(_shape(b1)) * _shape(b2)[-1],
    "mv": lambda mat, vec, *_, **__: 2 * math.prod(_shape(mat)),
    "addmv": lambda self, mat, vec, *_, **__: 2 * math.prod(_shape(mat)),
    "dot": lambda a, b, *_, **__: 2 * math.prod(_shape(a)),
    "vdot": lambda a, b, *_, **__: 2 * math.prod(_shape(a)),
    "_addmm_activation": lambda self, m1, m2, *_, **__: 2 * math.prod(_shape(m1)) * _shape(m2)[-1],
    "_int_mm": lambda m1, m2, *_, **__: 2 * math.prod(_shape(m1)) * _shape(m2)[-1],
    "_trilinear": _trilinear_flops,
    "_euclidean_dist": lambda x1, x2, *_, **__: _pairwise_flops(x1, x2, per=2),
    "_cdist_forward": _pairwise_flops,
    "_embedding_bag": lambda weight, indices, *_, **__: 2 * math.prod(_shape(indices)) * _shape(weight)[-1],
    "_embedding_bag_forward_only": lambda weight, indices, *_, **__: 2 * math.prod(_shape(indices)) * _shape(weight)[-1],
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa_cpu_flops,
}

# Operators whose arithmetic is at most a constant (a logarithm, for sorting) per element they read or write: for
# these the traffic count (elements read and written) is the measure of their work, and they add no FLOPs, as in
# torch's own counter. Besides these names: every operator torch tags pointwise or reduction (elementwise maths,
# comparisons, where, masked_fill; sum, mean, amax, logsumexp, ...: one operand, read once), and every view.
# Names are the overload packets' (an in-place variant's trailing "_" dropped).
TRAFFIC_BOUNDED = frozenset({
    # creating, filling, random
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "fill", "zero", "arange", "linspace",
    "logspace", "eye", "scalar_tensor", "lift", "lift_fresh", "lift_fresh_copy", "rand", "rand_like", "randn",
    "randn_like", "randint", "randint_like", "randperm", "normal", "uniform", "bernoulli", "multinomial",
    "exponential", "random", "tril_indices", "triu_indices", "native_dropout", "dropout",
    # copies, dtypes, views, shapes, read-backs
    "clone", "copy", "_to_copy", "to", "_copy_from", "_copy_from_and_resize", "contiguous", "detach", "alias",
    "_unsafe_view", "view", "_reshape_alias", "reshape", "expand", "resize", "set", "_local_scalar_dense", "item",
    "is_nonzero", "equal", "isclose", "sym_size", "sym_numel", "sym_stride", "sym_storage_offset", "_assert_async",
    "_assert_scalar", "_functional_assert_async", "record_stream", "view_as_real", "view_as_complex",
    "as_strided", "as_strided_scatter", "slice_scatter", "select_scatter", "diagonal_scatter", "expand_copy",
    "permute_copy", "t_copy", "transpose_copy", "view_copy", "unsqueeze_copy", "squeeze_copy", "slice_copy",
    "select_copy", "split_copy", "unbind_copy", "alias_copy", "detach_copy", "_unsafe_index", "_unsafe_index_put",
    # joining, splitting, rearranging
    "cat", "stack", "hstack", "vstack", "split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes",
    "chunk", "unsafe_chunk", "unbind", "narrow", "narrow_copy", "slice", "select", "flip", "roll", "repeat",
    "repeat_interleave", "tile", "constant_pad_nd", "pad", "tril", "triu", "diag", "diag_embed", "diagonal",
    "permute", "transpose", "t", "squeeze", "unsqueeze", "movedim", "flatten", "unflatten", "rot90",
    # indexing, gathering, scattering (each element of a source read once)
    "index", "_index_put_impl", "index_put", "index_copy", "index_fill", "index_add", "index_reduce",
    "index_select", "gather", "scatter", "scatter_add", "scatter_reduce", "masked_scatter", "masked_select",
    "take", "take_along_dim", "put", "nonzero", "nonzero_static", "argwhere", "embedding", "one_hot",
    "bucketize", "searchsorted", "histc", "bincount", "unique", "_unique", "_unique2", "unique_consecutive",
    "unique_dim", "segment_reduce", "addr", "isin", "masked_fill", "block_diag",
    # sorting and scans
    "sort", "argsort", "msort", "topk", "kthvalue", "mode", "median", "nanmedian", "cumsum", "cumprod", "cummax",
    "cummin", "_cummax_helper", "_cummin_helper", "logcumsumexp",
    # normalisations over one operand
    "_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax", "native_layer_norm", "layer_norm",
    "native_group_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "_fused_rms_norm", "rms_norm", "renorm",
    # elementwise or one pass over their operands, not tagged pointwise or reduction
    "floor_divide", "allclose", "trace", "dist", "diff", "logit", "xlogy", "cross", "histogram",
})
_BOUNDING_TAGS = (torch.Tag.pointwise, torch.Tag.reduction)


def _packet_bounded(name: str) -> bool:
    """Whether the aten operator `name` (an overload packet) is traffic-bounded by its name or its tags."""
    if name in TRAFFIC_BOUNDED:
        return True
    packet = getattr(torch.ops.aten, name, None)
    if packet is None or not hasattr(packet, "overloads"):
        return False
    return any(tag in getattr(packet, overload).tags for overload in packet.overloads() for tag in _BOUNDING_TAGS)


_BOUNDED: dict[Any, bool] = {}


def _traffic_bounded(func: Any) -> bool:
    """Whether an operator's arithmetic is bounded by the elements it moves: a view, a name on TRAFFIC_BOUNDED, or a
    tag pointwise or reduction, on the operator or on its out-of-place form (masked_fill_ as masked_fill)."""
    if func not in _BOUNDED:
        name = func.overloadpacket.__name__
        tags = getattr(func, "tags", ())
        _BOUNDED[func] = (any(tag in tags for tag in _BOUNDING_TAGS) or bool(getattr(func, "is_view", False))
                          or func._schema.name in _NO_DATA or _packet_bounded(name)
                          or (name.endswith("_") and _packet_bounded(name.rstrip("_"))))
    return _BOUNDED[func]


class WorkCounter(TrafficCounter):
    """gptq's TrafficCounter (elements each aten operation reads and writes), plus FLOPs: torch's own formulas
    for the matmul family (mm, addmm, bmm, baddbmm, convolutions, attention: those
    `torch.utils.flop_counter.FlopCounterMode` applies, without that mode's module tracking), the course's
    (`COURSE_FLOPS`) for the contractions torch's counter leaves out, and the arithmetic of factorisations and
    solves (gptq's tally). An operator with none of these that is not traffic-bounded (`TRAFFIC_BOUNDED`, or
    tagged pointwise or reduction, or a view) is recorded in `uncounted` ({aten name: calls}), never counted as
    zero: its arithmetic is unknown to the counter, and the check fails naming it.

    Why fail rather than estimate: an operator's arithmetic depends on which of its dimensions it contracts,
    which only its semantics say (aten._trilinear's product has four dimensions, none of them its output's). An
    estimate from the output and one input dimension could be wrong either way; a formula is written here for
    each contraction a public torch entry point reaches, and any other operator asks the student to write the
    computation with matmul, nn.Linear or einsum, which a correct submission needs anyway.

    The first operator a process runs under a Python dispatch mode imports torch._dynamo (torch/_compile.py),
    some 3 s on this course's CPU, once per worker: that, not the counting, is most of this check's time."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self.uncounted: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        before = self.factor_flops
        out = super().__torch_dispatch__(func, types, args, kwargs)
        formula = flop_registry.get(func.overloadpacket)
        name = func.overloadpacket.__name__
        if formula is not None:
            self.flops += int(formula(*args, **kwargs, out_val=out))
        elif name in COURSE_FLOPS:
            self.flops += int(COURSE_FLOPS[name](*args, **kwargs))
        elif self.factor_flops != before:
            self.flops += self.factor_flops - before
        elif not _traffic_bounded(func):
            self.uncounted[name] = self.uncounted.get(name, 0) + 1
        return out


def _leading_rows(value: Any) -> int:
    """Token rows in an expert's input: the product of every dimension but the last (features)."""
    if isinstance(value, torch.Tensor):
        return math.prod(value.shape[:-1]) if value.dim() else 1
    return 0


class _ExpertTally:
    """What the experts' forward bodies were handed: rows and calls per expert. The count sits on the module's
    `forward` itself (an instance attribute that wraps it), innermost: the student's pre-hooks have run and may
    have changed the input, and `expert.forward(rows)` is counted as `expert(rows)` is."""

    def __init__(self, num_experts: int) -> None:
        self.rows, self.calls = [0] * num_experts, [0] * num_experts

    def watch(self, e: int, expert: torch.nn.Module) -> Callable[[], None]:
        """Wrap `expert.forward`; returns the function that puts it back."""
        had_own = "forward" in vars(expert)
        original = expert.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            first = next((a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)), None)
            self.rows[e] += _leading_rows(first)
            self.calls[e] += 1
            return original(*args, **kwargs)

        object.__setattr__(expert, "forward", forward)

        def restore() -> None:
            if vars(expert).get("forward") is forward:
                if had_own:
                    object.__setattr__(expert, "forward", original)
                else:
                    del expert.__dict__["forward"]
        return restore


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

    Returns {"result": what it returned (detached), "rows": [token rows each expert's forward computed, summed
    over its calls], "calls": [calls of each expert's forward], "flops": the FLOPs of the whole call (see
    WorkCounter), "uncounted": {aten name: calls} of operators the counter could not count, "moved": elements
    every aten operation of the whole call read and wrote (the experts' own included: the test budgets them from
    the rows and calls), "host_reads": tensor elements read back into Python or numpy, "ops": {aten name: [read,
    written]}}. Everything between entering and leaving the call is counted, the student's hooks on the experts
    and whatever they run included. The rows are counted at each expert's `forward` (through the module, or
    `.forward` called directly); a call of the class's function with the module as argument escapes them, never
    the FLOP or element counts.
    """
    experts = list(experts)
    counter = WorkCounter()
    tally = _ExpertTally(len(experts))
    restores = [tally.watch(e, expert) for e, expert in enumerate(experts)]
    try:
        with reads_counted() as host, counter:
            result = moe_layer(x, gate_weight, experts, k, capacity_factor)
    finally:
        for restore in restores:
            restore()
    return {"result": _result(result), "rows": tally.rows, "calls": tally.calls, "flops": counter.flops,
            "uncounted": dict(counter.uncounted), "moved": counter.read + counter.written,
            "host_reads": host.reads, "ops": {name: list(v) for name, v in counter.ops.items()}}


def traffic(fn: Callable, *args: Any) -> dict:
    """Run ``fn(*args)`` (dispatch or combine) and count what it moves: {"result", "moved" (elements read
    and written by every aten operation), "flops", "uncounted", "host_reads", "ops": {aten name: [read,
    written]}}, as `expert_work` counts them."""
    counter = WorkCounter()
    with reads_counted() as host, counter:
        result = fn(*args)
    return {"result": _result(result), "moved": counter.read + counter.written,
            "flops": counter.flops, "uncounted": dict(counter.uncounted), "host_reads": host.reads,
            "ops": {name: list(v) for name, v in counter.ops.items()}}
