"""Drivers for the tensor_parallel exercise: a student's function run on every simulated (or real) rank,
forward and backward, with each rank's collectives logged per phase and the tensors autograd saved.

The ranks' communicators are grader/support/collectives.py's `CollectiveView`s: ``rank``, ``world_size``
and the counted ring collectives. Run your own code the same way (from the repository root)::

    import torch
    from grader.support.tensor_parallel import run_tp
    import tensor_parallel as tp                      # exercises/tensor_parallel on sys.path

    x = torch.randn(8, 2, 16, dtype=torch.float64)    # [s, b, h]
    out = run_tp(tp.copy_to_tp, [x] * 2, grads=[torch.ones_like(x)] * 2)
    print(out[0]["forward"], out[0]["backward"])        # each rank's collectives, in order

Each rank's result is a dict: ``out`` (detached), ``x_grad``, ``grads`` (the parameters', by name, after
``finalize_grads`` when asked), ``forward`` / ``backward`` / ``finalize`` (the collective log entries of
each phase: op, shape, dim, dtype, messages, elements), and ``saved`` (with ``saved=True``: one
``(shape, is_parameter)`` per tensor autograd packed during the forward).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import torch

from grader.support.collectives import CollectiveView, run_ranks
from grader.support.ring_allreduce import DistributedComm, RankView, run_on_processes

__all__ = ["run_tp", "run_call", "run_tp_distributed", "solo_comm"]


def _strip(entries: list[dict]) -> list[dict]:
    return [{**e, "dtype": str(e["dtype"]).removeprefix("torch.")} for e in entries]


def _step(fn: Callable, rank: int, comm: Any, log: list, x: torch.Tensor, params: dict | tuple | None,
          grad: torch.Tensor | None, kwargs: dict, finalize: bool, saved: bool) -> dict:
    x = x.detach().clone().requires_grad_(True)
    # params: a dict (fn(x, params, comm)), a tuple of tensors (fn(x, *params, comm): a linear's w, b) or None
    named: dict[str, Any] = dict(params) if isinstance(params, dict) else {str(i): v for i, v in enumerate(params or ())}
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in named.items() if v is not None}
    storages = {v.untyped_storage().data_ptr() for v in leaves.values()}
    packed: list[tuple[tuple[int, ...], bool]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        packed.append((tuple(t.shape), t.untyped_storage().data_ptr() in storages))
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    if params is None:
        args: tuple = (x, comm)
    elif isinstance(params, dict):
        args = (x, leaves, comm)
    else:
        args = (x, *(leaves.get(k) for k in named), comm)
    if saved:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = fn(*args, **kwargs)
    else:
        out = fn(*args, **kwargs)
    n_forward = len(log)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"expected a tensor from {getattr(fn, '__name__', 'the function')}, found {type(out).__name__}")
    if grad is not None:
        if not out.requires_grad:
            raise RuntimeError("the output does not require grad: is it computed from x with torch operations "
                               "(or autograd Functions)?")
        if out.shape != grad.shape:
            raise RuntimeError(f"the output has shape {tuple(out.shape)}, expected {tuple(grad.shape)}")
        out.backward(grad.to(out.dtype))
    n_backward = len(log)
    grads = {k: v.grad for k, v in leaves.items()}
    if finalize:
        module = inspect.getmodule(fn)
        grads = module.finalize_grads(grads, comm, kwargs.get("sequence_parallel", False))  # type: ignore[union-attr]
    return {"out": out.detach(), "x_grad": x.grad, "grads": grads,
            "forward": _strip(log[:n_forward]), "backward": _strip(log[n_forward:n_backward]),
            "finalize": _strip(log[n_backward:]), "saved": packed}


def run_tp(fn: Callable, xs: Sequence[torch.Tensor], params: Sequence[dict] | None = None,
           grads: Sequence[torch.Tensor] | None = None, kwargs: dict | None = None, finalize: bool = False,
           saved: bool = False, timeout_s: float = 60.0) -> list[dict]:
    """On t = len(xs) simulated ranks: rank r calls ``fn(xs[r], comm)`` (or ``fn(xs[r], params[r], comm,
    **kwargs)``), then backpropagates ``grads[r]`` from the output (when given), then (``finalize``) calls
    the same module's ``finalize_grads(grads, comm, sequence_parallel)``. Returns each rank's dict."""
    world = len(xs)

    def body(rank: int, comm: CollectiveView, log: list) -> dict:
        return _step(fn, rank, comm, log, xs[rank], None if params is None else params[rank],
                     None if grads is None else grads[rank], dict(kwargs or {}), finalize, saved)

    return run_ranks(body, world, timeout_s)["returns"]


def run_call(fn: Callable, world: int, args: Sequence[Any], comm_at: int, kwargs: dict | None = None,
             timeout_s: float = 60.0) -> list[dict]:
    """On `world` simulated ranks: rank r calls fn with its comm inserted at position `comm_at` of `args`.
    Returns ``{"value", "log"}`` per rank (sharding functions: no autograd)."""

    def body(rank: int, comm: CollectiveView, log: list) -> dict:
        a = list(args)
        a.insert(comm_at, comm)
        return {"value": fn(*a, **(kwargs or {})), "log": _strip(log)}

    return run_ranks(body, world, timeout_s)["returns"]


def run_tp_distributed(fn: Callable, xs: Sequence[torch.Tensor], params: Sequence[dict],
                       grads: Sequence[torch.Tensor], kwargs: dict | None = None, timeout_s: float = 120.0) -> list[dict]:
    """`run_tp` on len(xs) real processes over torch.distributed (gloo): the same collectives on a
    `DistributedComm`. Returns each rank's dict (without ``saved``)."""
    code = getattr(fn, "__code__", None)

    def body(rank: int, world: int, device: torch.device) -> dict:
        log: list[dict] = []
        base = DistributedComm(rank, world, device)
        view = RankView(base)
        comm = CollectiveView(view, lambda: (base.messages_sent, base.elements_sent), log)
        got = _step(fn, rank, comm, log, xs[rank], params[rank], grads[rank], dict(kwargs or {}), False, False)
        return {k: v for k, v in got.items() if k != "saved"}

    return run_on_processes(body, len(xs), "gloo", timeout_s, code.co_filename if code else None)


def solo_comm(fn: Callable) -> CollectiveView:
    """A one-rank communicator (t = 1: every collective a copy, no message) that outlives the call, for the
    structural check that runs the student's `fn` once, counted, outside `run_tp` (``student.drive`` hands
    it back; the grader passes it to the counted call as `comm`). `fn` is not called."""
    return run_ranks(lambda rank, comm, log: comm, 1)["returns"][0]
