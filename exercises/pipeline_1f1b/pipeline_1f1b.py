"""Pipeline parallelism: GPipe, 1F1B, interleaved 1F1B, a simulator, and a real executor. The exercise.

Read README.md in this folder first. Fill in the six functions below; each raises NotImplementedError
until you do. Run the public tests with `make check EX=pipeline_1f1b` (or `.venv/bin/pytest exercises/pipeline_1f1b`).

Vocabulary shared by every function here:
- p stages (one per device), m microbatches, and for interleaved schedules v model chunks per stage.
- An op is ("F", mb) or ("B", mb): the forward or backward of microbatch mb on one stage. Interleaved
  ops name a model chunk too, ("F", mb, chunk), with GLOBAL chunk ids 0 .. p*v - 1: chunk c lives on
  stage c % p, so stage s holds chunks s, s + p, s + 2p, ...
- A schedule is a list with one list of ops per stage, run in that order by that stage.
- Dependencies: F of (mb, c) needs F of (mb, c - 1); B of (mb, c) needs F of (mb, c) and B of
  (mb, c + 1). For plain schedules the chunk of an op on stage s is s itself.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

Op = tuple  # ("F" | "B", microbatch) or ("F" | "B", microbatch, chunk)


def gpipe_schedule(num_stages: int, num_microbatches: int) -> list[list[Op]]:
    """GPipe: every stage runs all m forwards, then all m backwards, both in microbatch order 0..m-1.

    Returns:
        p lists, each [("F", 0), ..., ("F", m-1), ("B", 0), ..., ("B", m-1)].

    Raises:
        ValueError: if num_stages or num_microbatches is not a positive int.
    """
    raise NotImplementedError("gpipe_schedule: the same list for every stage, all forwards then all backwards")


def one_f_one_b_schedule(num_stages: int, num_microbatches: int) -> list[list[Op]]:
    """1F1B (PipeDream-Flush): the schedule that caps stage s at min(p - s, m) microbatches in flight.

    Stage s runs w = min(p - s - 1, m) warm-up forwards, then alternates one forward and one backward
    until its forwards run out, then runs the w cool-down backwards it still owes. Forwards and
    backwards each go in microbatch order 0..m-1.

    Raises:
        ValueError: if num_stages or num_microbatches is not a positive int.
    """
    raise NotImplementedError("one_f_one_b_schedule: warm-up forwards, then F,B pairs, then the backwards still owed")


def interleaved_schedule(num_stages: int, num_microbatches: int, num_chunks: int) -> list[list[Op]]:
    """Megatron's interleaved 1F1B with v = num_chunks model chunks per stage. Ops are ("F", mb, chunk).

    Stage s runs w = min(2 (p - s - 1) + (v - 1) p, m v) warm-up forwards, then one forward and one
    backward alternately while forwards remain, then the remaining backwards. Counting from k = 0:
    - its k-th forward is microbatch (k // (p v)) p + k % p on local chunk (k % (p v)) // p;
    - its k-th backward is the same microbatch formula on local chunk v - 1 - (k % (p v)) // p;
    and local chunk j of stage s is global chunk j p + s.

    Raises:
        ValueError: if an argument is not a positive int, if num_chunks < 2, or if
            num_microbatches is not a multiple of num_stages.
    """
    raise NotImplementedError("interleaved_schedule: write the k-th forward and k-th backward, then arrange them as in 1F1B")


class SimResult(NamedTuple):
    makespan: float  # when the last op ends (the pipeline starts at time 0)
    bubble_fraction: float  # idle stage-time over total stage-time, p * makespan
    peak_activations: list[int]  # per stage: the most (mb, chunk) pairs whose F ran and B has not
    timeline: list[list[tuple[float, float, Op]]]  # per stage, in the schedule's order: (start, end, op)


def simulate(schedule: Sequence[Sequence[Op]], forward_time: float = 1.0, backward_time: float = 2.0,
             p2p_time: float = 0.0) -> SimResult:
    """Run a schedule on an idealised pipeline and time it.

    Each stage runs its ops in order; an op starts when its stage is free AND every dependency has
    finished, plus p2p_time for a dependency that ran on another stage (none for one on the same
    stage). A forward costs forward_time / v and a backward backward_time / v, where v = (largest
    chunk id + 1) / p for interleaved schedules and v = 1 for plain ones.

    p is len(schedule); m is (largest microbatch id + 1). Every stage must run F and B exactly once for
    each microbatch 0..m-1 and each chunk it holds.

    Raises:
        ValueError: if the schedule is empty, holds something that is not an op, mixes plain and
            interleaved ops, has an op missing, duplicated, or on a stage that does not hold its chunk,
            if (largest chunk id + 1) is not a multiple of p, or if a time is negative. Also if the
            schedule can never finish (a deadlock): the message names each stuck op as its repr,
            e.g. "('B', 0)".
    """
    raise NotImplementedError("simulate: give every op a start time = max(stage free, dependencies done [+ p2p])")


class PipelineRun(NamedTuple):
    loss: float  # the mean loss over all microbatches
    grads: list[list[torch.Tensor]]  # per model piece, its parameters' gradients in parameters() order
    peak_activations: list[int]  # per pipeline stage: the most microbatch activations alive at once


def run_pipeline(stages: Sequence[torch.nn.Module], microbatches: Sequence[torch.Tensor],
                 targets: Sequence[torch.Tensor], schedule: Sequence[Sequence[Op]],
                 loss_fn: torch.nn.Module) -> PipelineRun:
    """Run one training step of a model split into pieces, following `schedule`, in one process.

    Args:
        stages: the model pieces in order: one per stage for a plain schedule, p * v for an
            interleaved one (piece c is chunk c, run on stage c % p). Piece c + 1 takes piece c's output.
        microbatches: m input tensors for piece 0, all the same batch size.
        targets: m targets; the last piece's output for microbatch i is scored by loss_fn(out, targets[i]).
        schedule: any valid schedule for these pieces (the same rules as `simulate`).
        loss_fn: a loss module returning the mean over its microbatch, e.g. torch.nn.MSELoss().

    Zero the pieces' gradients first. A forward gives the next piece a detached copy of its output (a
    fresh leaf that requires grad) and keeps what its backward will need; the backward calls
    torch.autograd.backward on that output with the gradient the next piece sent back (the last piece
    backpropagates its loss divided by m), passes its input's gradient to the piece before, and drops
    every reference to that microbatch's activations. Afterwards the gradients equal those of the mean
    loss over the whole batch, computed in one go.

    Returns:
        PipelineRun(loss, grads, peak_activations): the mean loss as a float; each piece's parameter
        gradients (zeros for a parameter that got none); and per stage the peak number of
        microbatch activations (mb, chunk) alive at once.

    Raises:
        ValueError: if the schedule is invalid or deadlocks (as in `simulate`), or does not match the
            number of pieces or microbatches.
    """
    raise NotImplementedError("run_pipeline: walk the schedule like the simulator, but run each op for real")
