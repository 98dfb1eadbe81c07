"""Naive oracles for pipeline_1f1b's hidden checks. None of them comes from the reference solution.

- `expected_gpipe` / `expected_1f1b` / `expected_interleaved`: the schedules transcribed from the
  contract's formulas, as lists per stage (warm-up forwards, forward/backward pairs, the backwards owed).
- `gpipe_op` / `one_f_one_b_op` / `interleaved_op` (and `defined_schedule`, which builds a whole schedule
  from one of them): the same definitions again, op i of stage s straight from the formulas, no list
  built and sliced: a second, independent reading.
- `trusted_simulate` (and `is_valid`): a simulator that sweeps the stages again and again, starting every
  op whose dependencies are done, until nothing moves; it raises `Invalid` for a schedule that cannot run.
  Makespan, bubble fraction (p * makespan - busy) / (p * makespan) and peak live activations per stage.
- `event_oracle`: the README's contract rule by rule (returning a `Verdict`), then one event at a time:
  of the stages whose next op has all its inputs, the one that can start it earliest starts it.
- `full_batch_oracle`: the loss (mean squared error, or cross-entropy over class ids) and gradients of the
  whole batch through a float64 copy of the model, in one go (what a pipeline's accumulated microbatch
  gradients must equal).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import NamedTuple

import torch


def expected_gpipe(p: int, m: int) -> list[list[tuple]]:
    """GPipe: on every stage, all m forwards, then all m backwards."""
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


def expected_1f1b(p: int, m: int) -> list[list[tuple]]:
    """1F1B as lists: w = min(p - s - 1, m) warm-up forwards, then forward/backward pairs, then the backwards owed."""
    schedule = []
    for s in range(p):
        w = min(p - s - 1, m)
        ops, f, b = [], 0, 0
        while f < w:
            ops.append(("F", f))
            f += 1
        while f < m:
            ops.append(("F", f))
            f += 1
            ops.append(("B", b))
            b += 1
        while b < m:
            ops.append(("B", b))
            b += 1
        schedule.append(ops)
    return schedule


def expected_interleaved(p: int, m: int, v: int) -> list[list[tuple]]:
    """Interleaved 1F1B as lists: the k-th forward and backward of each stage from the contract's formulas,
    w = min(2(p - s - 1) + (v - 1)p, m v) warm-up forwards, then pairs, then the rest of the backwards."""
    schedule = []
    for s in range(p):
        n = m * v
        fwd = [("F", (k // (p * v)) * p + k % p, ((k % (p * v)) // p) * p + s) for k in range(n)]
        bwd = [("B", (k // (p * v)) * p + k % p, (v - 1 - (k % (p * v)) // p) * p + s) for k in range(n)]
        w = min(2 * (p - s - 1) + (v - 1) * p, n)
        ops = fwd[:w]
        for i in range(n - w):
            ops.append(fwd[w + i])
            ops.append(bwd[i])
        ops.extend(bwd[n - w :])
        schedule.append(ops)
    return schedule


def peaks_in_flight(schedule) -> list[int]:
    """Per stage, the most microbatches whose forward has run and whose backward has not, walking its ops."""
    peaks = []
    for row in schedule:
        live = peak = 0
        for op in row:
            live += 1 if op[0] == "F" else -1
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


class Invalid(Exception):
    """The trusted simulator's verdict that a schedule is not runnable."""


def trusted_simulate(schedule, tf: float = 1.0, tb: float = 2.0, p2p: float = 0.0) -> dict:
    """Sweep the stages again and again, starting every op whose dependencies are done, until nothing moves."""
    p = len(schedule)
    ops = [tuple(op) for row in schedule for op in row]
    if p == 0 or not ops:
        raise Invalid("empty schedule")
    arities = {len(op) for op in ops}
    if len(arities) != 1 or arities.pop() not in (2, 3):
        raise Invalid("ops of mixed or wrong length")
    for op in ops:
        if op[0] not in ("F", "B") or not all(type(x) is int and x >= 0 for x in op[1:]):
            raise Invalid(f"bad op {op}")
    interleaved = len(ops[0]) == 3
    m = max(op[1] for op in ops) + 1
    n_chunks = max(op[2] for op in ops) + 1 if interleaved else p
    if n_chunks % p:
        raise Invalid("chunk count not a multiple of p")
    v = n_chunks // p

    def chunk(op, s):
        return op[2] if interleaved else s

    for s, row in enumerate(schedule):
        want: Counter = Counter()
        for c in range(s, n_chunks, p):
            for mb in range(m):
                for kind in "FB":
                    want[(kind, mb, c) if interleaved else (kind, mb)] += 1
        if Counter(tuple(op) for op in row) != want:
            raise Invalid(f"stage {s} does not run each of its ops exactly once")

    finish: dict[tuple, float] = {}
    free = [0.0] * p
    pos = [0] * p
    timeline: list[list] = [[] for _ in range(p)]
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while pos[s] < len(schedule[s]):
                op = tuple(schedule[s][pos[s]])
                kind, mb, c = op[0], op[1], chunk(op, s)
                deps = []
                if kind == "F" and c > 0:
                    deps.append(("F", mb, c - 1))
                if kind == "B":
                    deps.append(("F", mb, c))
                    if c < n_chunks - 1:
                        deps.append(("B", mb, c + 1))
                if any(d not in finish for d in deps):
                    break
                start = free[s]
                for d in deps:
                    start = max(start, finish[d] + (p2p if d[2] % p != s else 0.0))
                end = start + (tf if kind == "F" else tb) / v
                finish[(kind, mb, c)] = end
                free[s] = end
                timeline[s].append((start, end, op))
                pos[s] += 1
                moved = True
    stuck = [tuple(schedule[s][pos[s]]) for s in range(p) if pos[s] < len(schedule[s])]
    if stuck:
        raise Invalid(f"deadlock at {stuck}", stuck)
    makespan = max(free)
    busy = sum(e - b for row in timeline for b, e, _ in row)
    peaks = peaks_in_flight(schedule)
    return {
        "makespan": makespan,
        "bubble": (p * makespan - busy) / (p * makespan),
        "peaks": peaks,
        "timeline": timeline,
    }


def is_valid(schedule, **times) -> bool:
    """Whether `trusted_simulate` runs the schedule to the end."""
    try:
        trusted_simulate(schedule, **times)
        return True
    except Invalid:
        return False


# The definitions again, one op at a time: op i of stage s straight from the contract's formulas (no list
# is built and sliced), so the generated sizes are checked against a second, independent reading.


def gpipe_op(p: int, m: int, s: int, i: int) -> tuple:
    """Op i of a GPipe stage."""
    return ("F", i) if i < m else ("B", i - m)


def one_f_one_b_op(p: int, m: int, s: int, i: int) -> tuple:
    """Op i of 1F1B stage s, from the warm-up / steady state / cool-down formulas."""
    w = min(p - s - 1, m)
    if i < w:
        return ("F", i)  # warm-up
    j = i - w
    if j < 2 * (m - w):
        return ("F", w + j // 2) if j % 2 == 0 else ("B", j // 2)  # steady state: F, then the oldest B
    return ("B", i - m)  # cool-down: the k-th backward sits at i = m + k


def interleaved_op(p: int, m: int, v: int, s: int, i: int) -> tuple:
    """Op i of interleaved stage s: its kind and rank k, then the microbatch and global chunk of the k-th."""
    n = m * v
    w = min(2 * (p - s - 1) + (v - 1) * p, n)
    if i < w:
        kind, k = "F", i
    elif i - w < 2 * (n - w):
        kind, k = ("F", w + (i - w) // 2) if (i - w) % 2 == 0 else ("B", (i - w) // 2)
    else:
        kind, k = "B", i - n
    local = (k % (p * v)) // p
    return (kind, (k // (p * v)) * p + k % p, (local if kind == "F" else v - 1 - local) * p + s)


def defined_schedule(op_at, p: int, m: int, *v: int) -> list[list[tuple]]:
    """A whole schedule from one of the op-at-a-time definitions above."""
    per_stage = 2 * m * (v[0] if v else 1)
    return [[op_at(p, m, *v, s, i) for i in range(per_stage)] for s in range(p)]


class Verdict(NamedTuple):
    """What the contract says of one schedule: either why it is invalid, or its timing."""

    why: str = ""  # the rule an invalid schedule breaks ("" when valid)
    stuck: tuple = ()  # a deadlock's stuck ops: each unfinished stage's next op, spelled as in the schedule
    makespan: float = 0.0
    bubble: float = 0.0
    peaks: tuple = ()
    timeline: tuple = ()  # per stage, in its order: (start, end, op)
    v: int = 1


def event_oracle(schedule, tf: float, tb: float, p2p: float) -> Verdict:
    """The README's contract, rule by rule, then one event at a time: of the stages whose next op has all
    its inputs, the one that can start it earliest starts it; when no stage can, the rest is stuck."""
    if min(tf, tb, p2p) < 0:
        return Verdict(why="has a negative time")
    p = len(schedule)
    ops = [(s, tuple(op)) for s, row in enumerate(schedule) for op in row]
    if p == 0 or not ops:
        return Verdict(why="is empty")
    for s, op in ops:
        if len(op) not in (2, 3) or op[0] not in ("F", "B") or any(type(x) is not int or x < 0 for x in op[1:]):
            return Verdict(why=f"holds {op!r}, which is not an op")
    if len({len(op) for _, op in ops}) > 1:
        return Verdict(why="mixes plain and interleaved ops")
    plain = len(ops[0][1]) == 2
    chunks = p if plain else 1 + max(op[2] for _, op in ops)
    if chunks % p:
        return Verdict(why=f"has chunk ids up to {chunks - 1}, not a whole number of chunks per stage")
    v, m = chunks // p, 1 + max(op[1] for _, op in ops)

    def key(s: int, op: tuple) -> tuple:
        return (op[0], op[1], s if plain else op[2])

    for s, op in ops:
        if key(s, op)[2] % p != s:
            return Verdict(why=f"runs {op!r} on stage {s}, but chunk {op[2]} lives on stage {op[2] % p}")
    for s, row in enumerate(schedule):
        have = Counter(key(s, tuple(op)) for op in row)
        for c in range(s, chunks, p):
            for mb in range(m):
                for kind in "FB":
                    spelled = (kind, mb) if plain else (kind, mb, c)
                    if have[(kind, mb, c)] == 0:
                        return Verdict(why=f"never runs {spelled!r} on stage {s}")
                    if have[(kind, mb, c)] > 1:
                        return Verdict(why=f"runs {spelled!r} {have[(kind, mb, c)]} times on stage {s}")

    def inputs(kind: str, mb: int, c: int) -> list[tuple]:
        if kind == "F":
            return [("F", mb, c - 1)] if c > 0 else []
        return [("F", mb, c)] + ([("B", mb, c + 1)] if c + 1 < chunks else [])

    ended: dict[tuple, float] = {}
    free, pos = [0.0] * p, [0] * p
    timeline: list[list[tuple]] = [[] for _ in range(p)]
    while True:
        best = None
        for s in range(p):
            if pos[s] == len(schedule[s]):
                continue
            op = tuple(schedule[s][pos[s]])
            deps = inputs(*key(s, op))
            if all(d in ended for d in deps):
                start = max([free[s]] + [ended[d] + (p2p if d[2] % p != s else 0.0) for d in deps])
                if best is None or start < best[0]:
                    best = (start, s, op)
        if best is None:
            break
        start, s, op = best
        end = start + (tf if op[0] == "F" else tb) / v
        ended[key(s, op)] = free[s] = end
        timeline[s].append((start, end, op))
        pos[s] += 1
    stuck = tuple(tuple(schedule[s][pos[s]]) for s in range(p) if pos[s] < len(schedule[s]))
    if stuck:
        return Verdict(why="deadlocks", stuck=stuck)
    makespan = max(free)
    busy = sum(end - start for row in timeline for start, end, _ in row)
    peaks = peaks_in_flight(schedule)
    return Verdict(
        makespan=makespan,
        bubble=(p * makespan - busy) / (p * makespan),
        peaks=tuple(peaks),
        timeline=tuple(tuple(row) for row in timeline),
        v=v,
    )


def full_batch_oracle(stages, xs, ys, loss: str = "mse"):
    """The whole batch through a float64 copy of the model in one go: loss and gradients. `loss` is "mse" (the
    mean squared error against float targets) or "cross_entropy" (class ids, int64 targets, kept as they are)."""
    model = copy.deepcopy(torch.nn.Sequential(*stages)).double()
    model.zero_grad(set_to_none=True)
    out = model(torch.cat(xs).double())
    if loss == "cross_entropy":
        value = torch.nn.functional.cross_entropy(out, torch.cat(ys))
    else:
        value = torch.nn.functional.mse_loss(out, torch.cat(ys).double())
    value.backward()
    grads = [[q.grad if q.grad is not None else torch.zeros_like(q) for q in piece.parameters()] for piece in model]
    return float(value.detach()), grads
