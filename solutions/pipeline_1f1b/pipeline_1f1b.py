"""Pipeline schedules (GPipe, 1F1B, interleaved 1F1B), a simulator, and a real executor: the reference.

A model split into p stages, fed m microbatches. Each stage runs a list of ops, in order:
("F", mb) is the forward of microbatch mb on that stage, ("B", mb) its backward. Interleaved
schedules split the model into p * v chunks, chunk c on stage c % p, and their ops name the chunk:
("F", mb, c). The schedule decides two things: how long the pipeline idles (the bubble) and how many
microbatches' activations each stage holds at once (the memory). Everything below is plain Python;
the one piece of machinery shared by the simulator and the executor is `_walk`, which runs the ops
in an order that respects every dependency, or says which ops are stuck.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator, NamedTuple, Sequence

import torch

Op = tuple  # ("F" | "B", microbatch) or ("F" | "B", microbatch, chunk)


# --------------------------------------------------------------------------------------------------
# Schedules


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, found {value!r}")


def gpipe_schedule(num_stages: int, num_microbatches: int) -> list[list[Op]]:
    """GPipe: every stage runs all forwards, then all backwards, both in microbatch order."""
    _check_positive(num_stages=num_stages, num_microbatches=num_microbatches)
    m = num_microbatches
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(num_stages)]


def one_f_one_b_schedule(num_stages: int, num_microbatches: int) -> list[list[Op]]:
    """1F1B (PipeDream-Flush): warm up with p - s - 1 forwards, then alternate, then drain."""
    _check_positive(num_stages=num_stages, num_microbatches=num_microbatches)
    p, m = num_stages, num_microbatches
    schedule = []
    for s in range(p):
        warmup = min(p - s - 1, m)  # enough forwards in flight to keep the stages below busy
        ops = [("F", i) for i in range(warmup)]
        for i in range(m - warmup):  # steady state: one forward, then the oldest backward
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", i) for i in range(m - warmup, m)]  # cool-down: the backwards still owed
        schedule.append(ops)
    return schedule


def interleaved_schedule(num_stages: int, num_microbatches: int, num_chunks: int) -> list[list[Op]]:
    """Megatron's interleaved 1F1B: stage s holds model chunks s, s + p, ..., s + (v - 1) p.

    Microbatches go through in groups of p: a stage runs the group's forwards on its first chunk,
    then on its second, and so on; backwards visit the chunks in the opposite order.
    """
    _check_positive(num_stages=num_stages, num_microbatches=num_microbatches, num_chunks=num_chunks)
    p, m, v = num_stages, num_microbatches, num_chunks
    if v < 2:
        raise ValueError(f"the interleaved schedule needs num_chunks >= 2 model chunks per stage, found {v}")
    if m % p:
        raise ValueError(f"the interleaved schedule needs num_microbatches to be a multiple of num_stages, found m={m}, p={p}")
    total = m * v  # forwards (and backwards) each stage runs

    def microbatch(k: int) -> int:
        return (k // (p * v)) * p + k % p

    def local_chunk(k: int) -> int:
        return (k % (p * v)) // p

    schedule = []
    for s in range(p):
        forwards = [("F", microbatch(k), local_chunk(k) * p + s) for k in range(total)]
        backwards = [("B", microbatch(k), (v - 1 - local_chunk(k)) * p + s) for k in range(total)]
        warmup = min(2 * (p - s - 1) + (v - 1) * p, total)
        ops = forwards[:warmup]
        for i in range(total - warmup):
            ops += [forwards[warmup + i], backwards[i]]
        ops += backwards[total - warmup :]
        schedule.append(ops)
    return schedule


# --------------------------------------------------------------------------------------------------
# Reading a schedule: validation, dependencies, and a dependency-respecting walk


class _Plan(NamedTuple):
    ops: list[list[tuple[str, int, int]]]  # per stage, every op as (kind, microbatch, global chunk)
    num_stages: int
    num_microbatches: int
    num_chunks: int  # v: model chunks per stage (1 for plain schedules)
    arity: int  # 2 for plain ops ("F", mb), 3 for interleaved ones ("F", mb, chunk)


def _plan(schedule: Sequence[Sequence[Op]]) -> _Plan:
    """Validate a schedule and give every op its global chunk (a plain op on stage s is chunk s)."""
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ValueError("a schedule is a non-empty list with one list of ops per stage")
    p = len(schedule)
    arity = None
    ops: list[list[tuple[str, int, int]]] = []
    for s, stage_ops in enumerate(schedule):
        if not isinstance(stage_ops, (list, tuple)):
            raise ValueError(f"stage {s}: expected a list of ops, found {type(stage_ops).__name__}")
        row = []
        for op in stage_ops:
            if not isinstance(op, (list, tuple)) or len(op) not in (2, 3) or op[0] not in ("F", "B"):
                raise ValueError(f"stage {s}: {op!r} is not an op: expected ('F' or 'B', microbatch[, chunk])")
            if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in op[1:]):
                raise ValueError(f"stage {s}: {op!r}: microbatch and chunk must be ints >= 0")
            if arity is None:
                arity = len(op)
            elif len(op) != arity:
                raise ValueError(f"stage {s}: {op!r} mixes plain and interleaved ops in one schedule")
            chunk = s if len(op) == 2 else op[2]
            if chunk % p != s:
                raise ValueError(f"stage {s}: {op!r} is misplaced: chunk {chunk} lives on stage {chunk % p}")
            row.append((op[0], op[1], chunk))
        ops.append(row)
    every = [op for row in ops for op in row]
    if not every:
        raise ValueError("the schedule has no ops")
    m = 1 + max(mb for _, mb, _ in every)
    num_chunks = 1 + max(c for _, _, c in every)
    if num_chunks % p:
        raise ValueError(f"chunk ids go up to {num_chunks - 1}: with {p} stages that is not a whole number of chunks per stage")
    for s, row in enumerate(ops):
        seen = set()
        for op in row:
            if op in seen:
                raise ValueError(f"stage {s} runs {_show(op, arity)} twice")
            seen.add(op)
        for c in range(s, num_chunks, p):
            for mb in range(m):
                for kind in ("F", "B"):
                    if (kind, mb, c) not in seen:
                        raise ValueError(f"stage {s} never runs {_show((kind, mb, c), arity)}")
    return _Plan(ops, p, m, num_chunks // p, arity)


def _show(op: tuple[str, int, int], arity: int) -> tuple:
    """An op as the schedule spells it."""
    return op if arity == 3 else op[:2]


def _dependencies(op: tuple[str, int, int], num_chunks_total: int) -> list[tuple[str, int, int]]:
    """The ops that must finish before `op` starts (chunks are global ids 0 .. p v - 1)."""
    kind, mb, c = op
    if kind == "F":
        return [("F", mb, c - 1)] if c > 0 else []
    deps = [("F", mb, c)]  # the backward needs this chunk's own forward ...
    if c + 1 < num_chunks_total:
        deps.append(("B", mb, c + 1))  # ... and the gradient from the chunk after it
    return deps


def _walk(plan: _Plan) -> Iterator[tuple[int, tuple[str, int, int]]]:
    """Yield (stage, op) in an order that keeps each stage's order and every dependency.

    Each stage runs until its next op waits on an op not done yet; it then parks on that op and is
    woken when it finishes. Every op is run once and every park is woken once: linear time.
    Raises ValueError, naming the stuck ops, if the stages wait on each other forever.
    """
    p, total_chunks = plan.num_stages, plan.num_stages * plan.num_chunks
    next_op = [0] * p
    done: set[tuple[str, int, int]] = set()
    parked: dict[tuple[str, int, int], list[int]] = {}
    ready = deque(range(p))
    while ready:
        s = ready.popleft()
        row = plan.ops[s]
        while next_op[s] < len(row):
            op = row[next_op[s]]
            missing = next((d for d in _dependencies(op, total_chunks) if d not in done), None)
            if missing is not None:
                parked.setdefault(missing, []).append(s)
                break
            yield s, op
            done.add(op)
            next_op[s] += 1
            ready.extend(parked.pop(op, ()))
    stuck = [f"stage {s}: {_show(plan.ops[s][i], plan.arity)}"
             for s, i in enumerate(next_op) if i < len(plan.ops[s])]
    if stuck:
        raise ValueError("the schedule deadlocks; these ops wait forever: " + ", ".join(stuck))


def _peak_in_flight(row: list[tuple[str, int, int]]) -> int:
    """The most (microbatch, chunk) pairs whose forward ran and backward has not, along one stage."""
    live = peak = 0
    for kind, _, _ in row:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


# --------------------------------------------------------------------------------------------------
# Simulator


class SimResult(NamedTuple):
    makespan: float  # when the last op ends (the pipeline starts at time 0)
    bubble_fraction: float  # idle stage-time over total stage-time, p * makespan
    peak_activations: list[int]  # per stage: the most (mb, chunk) pairs whose F ran and B has not
    timeline: list[list[tuple[float, float, Op]]]  # per stage, in the schedule's order: (start, end, op)


def simulate(schedule: Sequence[Sequence[Op]], forward_time: float = 1.0, backward_time: float = 2.0,
             p2p_time: float = 0.0) -> SimResult:
    """Run a schedule on an idealised pipeline: each op starts once its stage is free and its inputs
    have arrived (p2p_time later when they come from another stage)."""
    for name, value in (("forward_time", forward_time), ("backward_time", backward_time), ("p2p_time", p2p_time)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, found {value!r}")
    plan = _plan(schedule)
    p, v = plan.num_stages, plan.num_chunks
    cost = {"F": forward_time / v, "B": backward_time / v}  # a chunk holds 1/v of the stage's layers

    finish: dict[tuple[str, int, int], float] = {}
    stage_free = [0.0] * p
    timeline: list[list[tuple[float, float, Op]]] = [[] for _ in range(p)]
    for s, op in _walk(plan):
        start = stage_free[s]
        for dep in _dependencies(op, p * v):
            arrival = finish[dep] + (p2p_time if dep[2] % p != s else 0.0)
            start = max(start, arrival)
        end = start + cost[op[0]]
        finish[op] = stage_free[s] = end
        timeline[s].append((start, end, _show(op, plan.arity)))

    # _walk interleaves stages; each stage's own ops came out in its order, which is what we report.
    makespan = max(stage_free)
    busy = sum(end - start for row in timeline for start, end, _ in row)
    bubble = (p * makespan - busy) / (p * makespan) if makespan > 0 else 0.0
    peaks = [_peak_in_flight(row) for row in plan.ops]
    return SimResult(makespan, bubble, peaks, timeline)


# --------------------------------------------------------------------------------------------------
# Executor


class PipelineRun(NamedTuple):
    loss: float  # the mean loss over all microbatches
    grads: list[list[torch.Tensor]]  # per model piece, its parameters' gradients in parameters() order
    peak_activations: list[int]  # per pipeline stage: the most microbatch activations alive at once


def run_pipeline(stages: Sequence[torch.nn.Module], microbatches: Sequence[torch.Tensor],
                 targets: Sequence[torch.Tensor], schedule: Sequence[Sequence[Op]],
                 loss_fn: torch.nn.Module) -> PipelineRun:
    """Train-step a model split into `stages` by running `schedule` for real, in one process."""
    plan = _plan(schedule)
    p, m, v = plan.num_stages, plan.num_microbatches, plan.num_chunks
    if len(stages) != p * v:
        raise ValueError(f"the schedule has {p} stages x {v} chunks = {p * v} model pieces, found {len(stages)} modules")
    if len(microbatches) != m or len(targets) != m:
        raise ValueError(f"the schedule runs {m} microbatches, found {len(microbatches)} inputs and {len(targets)} targets")
    last = p * v - 1

    for stage in stages:
        stage.zero_grad(set_to_none=True)

    inbox: dict[tuple[int, int], torch.Tensor] = {}  # (mb, chunk) -> activation sent by chunk - 1
    grad_inbox: dict[tuple[int, int], torch.Tensor] = {}  # (mb, chunk) -> gradient sent by chunk + 1
    saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (mb, chunk) -> (input, output)
    live, peak = [0] * p, [0] * p
    total_loss = 0.0

    for s, (kind, mb, c) in _walk(plan):
        if kind == "F":
            # The input is a fresh leaf: this chunk's graph ends here, so its backward stops here too.
            x = microbatches[mb] if c == 0 else inbox.pop((mb, c)).requires_grad_(True)
            y = stages[c](x)
            if c == last:
                y = loss_fn(y, targets[mb]) / m  # mean over microbatches = the full-batch mean
                total_loss += y.item()
            else:
                inbox[(mb, c + 1)] = y.detach()
            saved[(mb, c)] = (x, y)
            live[s] += 1
            peak[s] = max(peak[s], live[s])
        else:
            x, y = saved.pop((mb, c))  # after this op nothing holds the chunk's graph: it is freed
            torch.autograd.backward(y, None if c == last else grad_inbox.pop((mb, c)))
            if c > 0:
                grad_inbox[(mb, c - 1)] = x.grad
            live[s] -= 1

    grads = [
        [(q.grad if q.grad is not None else torch.zeros_like(q)).detach().clone() for q in stage.parameters()]
        for stage in stages
    ]
    return PipelineRun(total_loss, grads, peak)
