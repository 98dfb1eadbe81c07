"""Counts the activations a student's `run_pipeline` really keeps alive, where the student's code runs.

Autograd keeps a forward's activations as the graph's *saved tensors* until a backward through that
graph frees them. `census` wraps every saved tensor (torch.autograd.graph.saved_tensors_hooks) in a
small token that knows which forward call saved it, and counts, per pipeline stage, the forwards that
still have a token alive. A forward pre-hook on each model piece starts a new forward call; the loss
module's saved tensors belong to the forward running at the time (the last piece's). The peak of that
count per stage is what the schedule promises: the microbatches whose forward ran and backward has not.

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
import weakref
from typing import Any, Callable, Sequence

import torch


class _Census:
    def __init__(self, num_stages: int):
        self.num_stages = num_stages
        self.current: tuple[int, int] | None = None  # (stage, forward call id) saving tensors now
        self.next_call = 0
        self.tokens: dict[int, int] = {}  # forward call id -> live saved tensors
        self.live = [0] * num_stages  # forward calls with a live saved tensor, per stage
        self.peak = [0] * num_stages

    def start_forward(self, piece: int) -> None:
        self.current = (piece % self.num_stages, self.next_call)
        self.next_call += 1

    def pack(self, tensor: torch.Tensor) -> Any:
        token = _Token(tensor)
        if self.current is not None:
            stage, call = self.current
            if self.tokens.get(call, 0) == 0:
                self.live[stage] += 1
                self.peak[stage] = max(self.peak[stage], self.live[stage])
            self.tokens[call] = self.tokens.get(call, 0) + 1
            weakref.finalize(token, self.release, stage, call)
        return token

    def release(self, stage: int, call: int) -> None:
        self.tokens[call] -= 1
        if self.tokens[call] == 0:
            del self.tokens[call]
            self.live[stage] -= 1


class _Token:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def census(run_pipeline: Callable, stages: Sequence[torch.nn.Module], microbatches: Sequence[torch.Tensor],
           targets: Sequence[torch.Tensor], schedule: Sequence[Sequence[tuple]], loss_fn: torch.nn.Module,
           dirty_grads: bool = False) -> tuple[Any, list[int], list[int]]:
    """Call ``run_pipeline(stages, microbatches, targets, schedule, loss_fn)`` and return
    ``(its result, peak live forwards per stage, live forwards per stage at the end)``.

    With `dirty_grads`, every parameter first gets a stale gradient (as after an earlier step), which
    a correct run_pipeline zeroes before it starts.
    """
    if dirty_grads:
        for piece in stages:
            for q in piece.parameters():
                q.grad = torch.full_like(q, 100.0)
    counter = _Census(len(schedule))
    hooks = [piece.register_forward_pre_hook(lambda _m, _a, i=i: counter.start_forward(i))
             for i, piece in enumerate(stages)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda token: token.tensor):
            result = run_pipeline(stages, microbatches, targets, schedule, loss_fn)
    finally:
        for hook in hooks:
            hook.remove()
    gc.collect()  # forwards the student dropped without a backward are freed now, not counted as live
    return result, list(counter.peak), list(counter.live)


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
