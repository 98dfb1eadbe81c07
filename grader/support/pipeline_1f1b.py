"""Counts the activations a student's `run_pipeline` really keeps alive, where the student's code runs.

Autograd keeps a forward's activations as the graph's *saved tensors* until a backward through that
graph frees them. `census` wraps every saved tensor (torch.autograd.graph.saved_tensors_hooks) in a
small token that knows which forward call saved it. A forward pre-hook on each model piece starts a new
forward call; the loss module's saved tensors belong to the forward running at the time (the last
piece's). A forward call counts as many microbatches as its input has microbatches' rows (one for a
microbatch, m for the whole batch pushed through at once). Two counts per pipeline stage come back:

- `peak`: the most microbatches whose forward calls still have a token alive: what autograd holds. The
  peak of that count is what the schedule promises, the microbatches whose forward ran and backward has not.
- `held`: the same, where a call also stays alive while any storage it saved and made itself (not a
  parameter, buffer, microbatch, target or its own input) is alive. A backward without retain_graph drops
  the tokens whatever the executor keeps; an executor that keeps the microbatch's output after its
  backward (a dict entry it never pops, a list of outputs) keeps the storage, and this count sees it.
- `left`: `held` once the call has returned and the garbage collector has run: a finished step holds nothing.

What it cannot see: a copy the executor makes itself outside autograd (a clone of an output kept in a
list) is no saved tensor; a piece whose saved tensors are all its input and parameters (a bare Linear in
the middle of the model) shows only its tokens; and a forward run other than through the piece's
__call__ (piece.forward(x)) fires no pre-hook, so nothing it saves is counted (the test asks that
something was).

`schedule_digest` and `simulate_packed` serve the grader's own clock on the linear-work checks: a
schedule of 8192 ops costs a quarter of a second to send back as lists of tuples, far more than making
it, so the generator's result stays here and only its digest travels, and a schedule to simulate travels
as one int tensor (and only its makespan comes back). The grader checks the digest against its oracle's (`digest`, the same code on both sides).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import itertools
import math
import weakref
from typing import Any, Callable, Sequence

import torch

_TENSOR_STORAGE = torch._C.TensorBase.untyped_storage  # the unpatched method: one Python object per live storage


def _storage(t: Any) -> Any:
    """The storage of a dense tensor (the same Python object while the storage lives), else None."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.device.type == "meta":
        return None
    try:
        return _TENSOR_STORAGE(t)
    except (RuntimeError, NotImplementedError):
        return None


class _Call:
    """One forward call of a model piece: its stage, how many microbatches it carries, what it holds."""

    __slots__ = ("stage", "weight", "tokens", "storages", "inputs", "held")

    def __init__(self, stage: int, weight: int, inputs: list):
        self.stage, self.weight = stage, weight
        self.tokens = 0  # saved-tensor tokens alive
        self.storages: set[int] = set()  # ids of the storages it saved and made itself, while alive
        self.inputs = inputs  # weak references to its inputs' storages (never its own)
        self.held = False


class _Census:
    def __init__(self, num_stages: int, rows: int | None, excluded: Sequence[Any]):
        self.num_stages = num_stages
        self.rows = rows  # rows of one microbatch
        self._excluded = [s for s in excluded if s is not None]  # kept alive: their ids must not be reused
        self.excluded = {id(s) for s in self._excluded}
        self.current: _Call | None = None  # the forward call saving tensors now
        self.live = [0] * num_stages  # microbatches with a token alive, per stage
        self.peak = [0] * num_stages
        self.held = [0] * num_stages  # microbatches with a token or a storage of their own alive, per stage
        self.held_peak = [0] * num_stages

    def start_forward(self, piece: int, args: tuple) -> None:
        first = args[0] if args else None
        weight = 1
        if isinstance(first, torch.Tensor) and first.dim() > 0 and self.rows:
            weight = max(1, math.ceil(first.shape[0] / self.rows))
        inputs = [weakref.ref(s) for s in map(_storage, args) if s is not None]
        self.current = _Call(piece % self.num_stages, weight, inputs)

    def pack(self, tensor: torch.Tensor) -> Any:
        token = _Token(tensor)
        call = self.current
        if call is None:
            return token
        if call.tokens == 0:
            self.live[call.stage] += call.weight
            self.peak[call.stage] = max(self.peak[call.stage], self.live[call.stage])
        call.tokens += 1
        weakref.finalize(token, self.release, call)
        storage = _storage(tensor)
        if (storage is not None and id(storage) not in self.excluded and id(storage) not in call.storages
                and not any(ref() is storage for ref in call.inputs)):
            call.storages.add(id(storage))
            weakref.finalize(storage, self.drop, call, id(storage))
        self._update(call)
        return token

    def release(self, call: _Call) -> None:
        call.tokens -= 1
        if call.tokens == 0:
            self.live[call.stage] -= call.weight
        self._update(call)

    def drop(self, call: _Call, key: int) -> None:
        call.storages.discard(key)
        self._update(call)

    def _update(self, call: _Call) -> None:
        held = call.tokens > 0 or bool(call.storages)
        if held and not call.held:
            self.held[call.stage] += call.weight
            self.held_peak[call.stage] = max(self.held_peak[call.stage], self.held[call.stage])
        elif call.held and not held:
            self.held[call.stage] -= call.weight
        call.held = held


class _Token:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def _owned_storages(stages: Sequence[torch.nn.Module], loss_fn: Any, microbatches: Sequence[Any],
                    targets: Sequence[Any]) -> list:
    """The storages no forward call makes: parameters and buffers, the microbatches and the targets."""
    tensors: list = []
    for module in [*stages, loss_fn]:
        if isinstance(module, torch.nn.Module):
            tensors += [*module.parameters(), *module.buffers()]
    tensors += [*microbatches, *targets]
    return [_storage(t) for t in tensors]


def census(run_pipeline: Callable, stages: Sequence[torch.nn.Module], microbatches: Sequence[torch.Tensor],
           targets: Sequence[torch.Tensor], schedule: Sequence[Sequence[tuple]], loss_fn: torch.nn.Module,
           dirty_grads: bool = False) -> tuple[Any, list[int], list[int], list[int]]:
    """Call ``run_pipeline(stages, microbatches, targets, schedule, loss_fn)`` and return
    ``(its result, peak microbatches autograd held per stage, peak microbatches held per stage by autograd or
    by the storages their forwards saved, microbatches still held per stage at the end)``.

    With `dirty_grads`, every parameter first gets a stale gradient (as after an earlier step), which
    a correct run_pipeline zeroes before it starts.
    """
    if dirty_grads:
        for piece in stages:
            for q in piece.parameters():
                q.grad = torch.full_like(q, 100.0)
    first = microbatches[0] if len(microbatches) else None
    rows = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() > 0 else None
    counter = _Census(len(schedule), rows, _owned_storages(stages, loss_fn, microbatches, targets))
    hooks = [piece.register_forward_pre_hook(lambda _m, args, i=i: counter.start_forward(i, args))
             for i, piece in enumerate(stages)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda token: token.tensor):
            result = run_pipeline(stages, microbatches, targets, schedule, loss_fn)
    finally:
        for hook in hooks:
            hook.remove()
        counter.current = None
    gc.collect()  # forwards the student dropped without a backward are freed now, not counted as live
    return result, list(counter.peak), list(counter.held_peak), list(counter.held)


# --------------------------------------------------------------------------------------------------
# Compact travel for the grader's clock

KINDS = ("F", "B")


def digest(schedule: Sequence[Sequence[Sequence[Any]]]) -> str:
    """sha256 of the schedule's ops as plain tuples of str and int (lists or tuples, int-like ids alike).

    A schedule already in that form (a list of lists of tuples of exact str and int) is hashed from its
    repr as it is, which runs in C: the grader's clock times this beside the student's generator, and
    normalising every op in Python cost three times what generating it does, which hid extra work per op.
    Any other form is normalised first; both give the same digest for the same ops."""
    if _canonical(schedule):
        return hashlib.sha256(repr(schedule).encode()).hexdigest()
    rows = [[tuple(x if isinstance(x, str) else int(x) for x in op) for op in row] for row in schedule]
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def _canonical(schedule: Any) -> bool:
    """A list of lists of tuples whose items are exact str or int (no subclass: its repr is not theirs)."""
    if type(schedule) is not list or not set(map(type, schedule)) <= {list}:
        return False
    ops = list(itertools.chain.from_iterable(schedule))
    return set(map(type, ops)) <= {tuple} and set(map(type, itertools.chain.from_iterable(ops))) <= {str, int}


def schedule_digest(fn: Callable, *args: Any) -> dict:
    """Call the student's schedule generator ``fn(*args)``: {"ops": how many, "digest": `digest` of them}."""
    with _no_gc():
        schedule = fn(*args)
    return {"ops": sum(len(row) for row in schedule), "digest": digest(schedule)}


def linear_schedule(p: int, m: int, v: int | None = None) -> list[list[tuple]]:
    """A schedule-shaped list of as many ops as a real schedule of these sizes holds (2 * m per stage, times v
    chunks), built by the simplest loop: not a valid schedule, only linear work of the same size."""
    if v is None:
        return [[(kind, mb) for kind in KINDS for mb in range(m)] for _ in range(p)]
    return [[(kind, mb, c) for kind in KINDS for c in range(v) for mb in range(m)] for _ in range(p)]


def schedule_baseline(fn: Callable, *args: Any) -> dict:
    """What `schedule_digest` costs for a schedule of the same size built by `linear_schedule` (`fn`, the
    student's generator, is not called): the grader's clock times it beside the student's calls, in the same
    runs and through the same round trip, so that what makes linear work grow on a busy machine (the
    allocator, the caches, the load) is measured, not assumed."""
    with _no_gc():
        schedule = linear_schedule(*args)
    return {"ops": sum(len(row) for row in schedule), "digest": digest(schedule)}


def simulate_baseline(fn: Callable, ops: torch.Tensor, lengths: list[int]) -> dict:
    """What `simulate_packed` costs with a single pass over the ops in place of the student's `simulate` (not
    called): unpacked the same way, each op's finish time from the op it depends on and the last on its stage
    (not the schedule's makespan: the stages are visited once, in order)."""
    flat = [(KINDS[op[0]], *op[1:]) for op in ops.tolist()]
    schedule, at = [], 0
    for n in lengths:
        schedule.append(flat[at : at + n])
        at += n
    with _no_gc():  # per op what any simulation does: look up the op it depends on, record its finish time
        finish: dict[tuple, float] = {}
        for stage, row in enumerate(schedule):
            t = 0.0
            for op in row:
                forward = op[0] == "F"
                t = max(t, finish.get((stage - 1 if forward else stage + 1, *op), 0.0)) + (1.0 if forward else 2.0)
                finish[(stage, *op)] = t
    return {"makespan": max(finish.values(), default=0.0)}


@contextlib.contextmanager
def _no_gc():
    """The cyclic garbage collector off for the call: its full collections cost in proportion to every live
    object, so thousands of fresh tuples would make linear work look superlinear on the clock."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def pack(schedule: Sequence[Sequence[Sequence[Any]]]) -> tuple[torch.Tensor, list[int]]:
    """A schedule as one int64 tensor of ops ([kind, mb] or [kind, mb, chunk]; kind 0 = F, 1 = B) and the
    number of ops of each stage."""
    ops = [[KINDS.index(op[0]), *op[1:]] for row in schedule for op in row]
    return torch.tensor(ops, dtype=torch.int64), [len(row) for row in schedule]


def simulate_packed(fn: Callable, ops: torch.Tensor, lengths: list[int]) -> dict:
    """``fn(schedule)`` (the student's `simulate`) on the schedule that `pack` packed: {"makespan": ...}
    (the timeline stays here: thousands of entries would cost the round trip more than simulating them)."""
    flat = [(KINDS[op[0]], *op[1:]) for op in ops.tolist()]
    schedule, at = [], 0
    for n in lengths:
        schedule.append(flat[at : at + n])
        at += n
    with _no_gc():
        result = fn(schedule)
    return {"makespan": float(result.makespan)}
