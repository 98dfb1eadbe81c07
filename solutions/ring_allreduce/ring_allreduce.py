"""Ring all-reduce: the reference solution.

Every rank holds a tensor; afterwards every rank must hold the elementwise sum. The ring does it in
two phases over the same N chunks of the flat tensor:

* reduce-scatter: N - 1 steps; in each, every rank passes one partially summed chunk to its right
  neighbour and adds the chunk arriving from its left. A chunk travels once around the ring,
  picking up one rank's contribution per hop, and ends complete on rank (chunk - 1) % N.
* all-gather: N - 1 more steps that pass the complete chunks around, overwriting.

Each rank sends 2(N - 1) chunks of n / N elements: 2(N - 1)/N * n, the least any all-reduce can
send (Patarasuk & Yuan, 2009), and every link is busy at every step.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Protocol

import torch


class Communicator(Protocol):
    rank: int
    world_size: int

    def send_recv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None: ...


@contextlib.contextmanager
def flat_view(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The tensor as a 1-D contiguous buffer in row-major order; changes land in `tensor` on exit."""
    if tensor.is_contiguous():
        yield tensor.view(-1)
        return
    flat = tensor.reshape(-1)  # a copy: a transposed view has no flat view
    yield flat
    tensor.copy_(flat.view(tensor.shape))


def neighbours(comm: Communicator) -> tuple[int, int]:
    """(right, left): the rank this one sends to and the rank it receives from."""
    return (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size


def split_chunks(flat: torch.Tensor, world: int) -> tuple[torch.Tensor, ...]:
    """N views of the flat buffer; the first n % N are one element longer (torch.tensor_split)."""
    return flat.tensor_split(world)


def ring_reduce_scatter(tensor: torch.Tensor, comm: Communicator) -> int:
    """In place; afterwards chunk (rank + 1) % N holds the sum over all ranks. Returns that index."""
    rank, world = comm.rank, comm.world_size
    right, left = neighbours(comm)
    with flat_view(tensor) as flat:
        chunks = split_chunks(flat, world)
        inbox = torch.empty_like(chunks[0])  # chunk 0 is the longest
        for step in range(world - 1):
            send_idx = (rank - step) % world  # the partial sum this rank extended last step (or its own)
            recv_idx = (rank - step - 1) % world  # the one its left neighbour extended
            incoming = inbox[: chunks[recv_idx].numel()]
            comm.send_recv(chunks[send_idx], right, incoming, left)
            chunks[recv_idx].add_(incoming)  # in the tensor's own dtype: one hop of the ring order
    return right


def ring_all_gather(tensor: torch.Tensor, comm: Communicator, owned: int) -> None:
    """In place; rank r starts with chunk `owned` final, and ends with every chunk final."""
    world = comm.world_size
    right, left = neighbours(comm)
    with flat_view(tensor) as flat:
        chunks = split_chunks(flat, world)
        for step in range(world - 1):
            send_idx = (owned - step) % world  # the chunk that arrived last step (or the one we own)
            recv_idx = (owned - step - 1) % world
            comm.send_recv(chunks[send_idx], right, chunks[recv_idx], left)  # overwrite: it is final


def ring_allreduce(tensor: torch.Tensor, comm: Communicator) -> None:
    """In place: every rank's tensor becomes the sum of all ranks' tensors."""
    if comm.world_size == 1:
        return
    with flat_view(tensor) as flat:
        owned = ring_reduce_scatter(flat, comm)
        ring_all_gather(flat, comm, owned)
