"""Ring all-reduce: the exercise. Read README.md in this folder first.

Fill in the three functions below; each raises NotImplementedError until you do. Run the public
tests with `make check EX=ring_allreduce` (or `.venv/bin/pytest exercises/ring_allreduce`), and your own
experiments with the course's communicators (README.md, "Running your code"):

    from grader.support.ring_allreduce import run_simulated, run_distributed

Conventions shared by every function here:
- N = comm.world_size ranks in a ring: rank r sends to (r + 1) % N and receives from (r - 1) % N.
- The tensor is worked on as a flat sequence of n elements in row-major order (what
  tensor.reshape(-1) shows), cut into N chunks exactly like torch.tensor_split(flat, N): the first
  n % N chunks have one element more than the others; chunks may be empty.
- Every step is one comm.send_recv call, even when the chunk is empty: each rank makes exactly N - 1
  calls per phase. The send buffer on one side and the receive buffer on the other must have the
  same dtype and number of elements.
- Results are written into the caller's tensor (in place), whatever its layout: a non-contiguous
  tensor (a transpose) has no flat view, so work on a copy and copy the result back.
- Sums are accumulated in the tensor's own dtype, in ring order: the finished chunk c is
  ((x_c + x_(c+1)) + x_(c+2)) + ... + x_(c-1), where x_k is rank k's chunk c and indices are mod N.
- Never call torch.distributed's collectives (all_reduce, reduce_scatter, all_gather, broadcast, ...):
  the grader blocks them. comm.send_recv is the only way to talk to other ranks.
"""

from __future__ import annotations

from typing import Protocol

import torch


class Communicator(Protocol):
    """What the course's communicators provide (grader/support/ring_allreduce.py). Given complete."""

    rank: int  # this rank, 0 .. world_size - 1
    world_size: int  # N

    def send_recv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        """Send `send` to rank `dst` and, at the same time, receive from rank `src` into `recv`."""
        ...


def ring_reduce_scatter(tensor: torch.Tensor, comm: Communicator) -> int:
    """The first half of the ring: after it, this rank holds one chunk of the sum.

    In N - 1 steps, each rank sends one chunk to (rank + 1) % N and receives one chunk from
    (rank - 1) % N, which it adds (in the tensor's dtype) to its own copy of that chunk. At step s
    (0 .. N-2), rank r sends chunk (r - s) % N and receives chunk (r - s - 1) % N.

    Args:
        tensor: this rank's data, any shape and layout; float32, float64, bfloat16 or int64.
        comm: this rank's communicator.

    Returns:
        The index of the chunk this rank now holds complete: (rank + 1) % N (0 when N == 1). That
        chunk holds the ring-order sum over all ranks; the other chunks hold partial sums (unspecified).
    """
    raise NotImplementedError("ring_reduce_scatter: at step s, send chunk (r - s) % N right, add the incoming one")


def ring_all_gather(tensor: torch.Tensor, comm: Communicator, owned: int) -> None:
    """The second half: circulate the finished chunks so that every rank has all of them.

    In N - 1 steps, each rank sends the chunk it finished (or received last step) to (rank + 1) % N
    and receives the next one from (rank - 1) % N, OVERWRITING its own copy (never adding): at
    step s it sends chunk (owned - s) % N and receives chunk (owned - s - 1) % N.

    Args:
        tensor: this rank's data (any shape and layout), modified in place.
        comm: this rank's communicator.
        owned: the chunk this rank holds final. Across ranks, owned is (rank + k) % N for one k
            shared by all ranks (after ring_reduce_scatter, k = 1).
    """
    raise NotImplementedError("ring_all_gather: at step s, send chunk (owned - s) % N right, overwrite with the incoming")


def ring_allreduce(tensor: torch.Tensor, comm: Communicator) -> None:
    """In place: every rank's tensor becomes the elementwise sum over all ranks.

    Reduce-scatter, then all-gather, on one flat buffer: each rank sends exactly 2(N - 1) messages
    holding 2n - len(chunk (r+1) % N) - len(chunk (r+2) % N) elements in all. Any shape (0-d and
    n = 0 included) and layout; dtypes float32, float64, bfloat16 and int64. With N = 1 it does
    nothing (no messages).
    """
    raise NotImplementedError("ring_allreduce: flatten once, reduce-scatter, then all-gather, then write back")
