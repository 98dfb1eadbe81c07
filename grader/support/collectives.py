"""Counted ring collectives on the course's simulated ranks: all-reduce, all-gather and reduce-scatter.

Given helpers for the exercises that run on simulated ranks and need more than ``send_recv``
(tensor_parallel; next, zero_sharding and ring_attention). They are written once here, on
ring_allreduce's communicator (grader/support/ring_allreduce.py: `run_simulated`, `RankView`), and
every message they send goes through ``send_recv``, so its counters and trace see them.

What a rank's code is handed is a `CollectiveView`::

    comm.rank, comm.world_size
    comm.send_recv(send, dst, recv, src)          # ring_allreduce's exchange
    comm.all_reduce(x)                             # every rank gets the sum of all ranks' x
    comm.all_gather(x, dim=0)                      # torch.cat([x_0, ..., x_(t-1)], dim)
    comm.reduce_scatter(x, dim=0)                  # rank r gets chunk r (along dim) of the sum
    comm.reduce_scatter_flat(x)                    # rank r gets tensor_split(sum.flatten(), t)[r] (uneven ok)
    comm.all_gather_flat(piece, numel)             # the flat [numel] tensor whose tensor_split piece r is rank r's

Each returns a new tensor (never a view of `x`, never changing `x`) of `x`'s dtype, computed without
autograd: a collective is not differentiable here. Wrapping it in a `torch.autograd.Function` whose
backward calls the conjugate collective is what tensor_parallel asks the student to write.

The ring algorithms, for t = world_size ranks (t = 1: a copy, no message):

* reduce-scatter of a tensor cut into t chunks: t - 1 steps; at step s rank r sends its partial sum of
  chunk (r - s - 1) % t to rank (r + 1) % t and adds the partial sum of chunk (r - s - 2) % t that it
  receives from rank (r - 1) % t. Chunk c starts on rank c + 1 and picks up one rank per hop, so rank r
  ends with chunk r complete, summed in the order r + 1, r + 2, ..., r (mod t). Each rank sends
  (t - 1) / t of the elements.
* all-gather of t chunks, one per rank: t - 1 steps; at step s rank r sends chunk (r - s) % t and receives
  chunk (r - s - 1) % t. Each rank sends (t - 1) times its own chunk, (t - 1) / t of the result.
* all-reduce: the flat tensor cut as ``torch.tensor_split(flat, t)`` (uneven sizes allowed), a
  reduce-scatter, then an all-gather: 2 (t - 1) messages, 2 (t - 1) / t of the elements when t divides n.

The flat pair (zero_sharding's) cuts a flat tensor as ``torch.tensor_split(flat, t)``, so pieces may differ
by one element and be empty: reduce_scatter_flat sends every piece but its own (numel - size_r elements),
all_gather_flat every piece but rank r + 1's (numel - size_(r+1)).

Every collective a rank calls is also recorded in the driver's log (out of the rank's reach, as the
counters are): ``{"op", "shape", "dim", "dtype", "messages", "elements"}``, ``messages`` and
``elements`` being what this rank sent for it. `run_ranks` runs a body on every rank and returns the
logs; `ring_elements` gives the closed forms the logs must equal.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from grader.support.ring_allreduce import CommError, RankView, ReadOnly, run_simulated

__all__ = ["CollectiveView", "run_ranks", "ring_elements", "all_reduce", "all_gather", "reduce_scatter",
           "reduce_scatter_flat", "all_gather_flat", "flat_sizes", "CommError"]


def _ring(view: Any) -> tuple[int, int, int, int]:
    rank, world = view.rank, view.world_size
    return rank, world, (rank + 1) % world, (rank - 1) % world


def _reduce_scatter_chunks(chunks: list[torch.Tensor], view: Any) -> None:
    """In place on `chunks` (t views of one buffer): afterwards chunks[rank] holds the sum over all ranks."""
    rank, world, right, left = _ring(view)
    for step in range(world - 1):
        send, mine = chunks[(rank - step - 1) % world], chunks[(rank - step - 2) % world]
        scratch = torch.empty_like(mine)
        view.send_recv(send, right, scratch, left)
        mine.add_(scratch)


def _all_gather_chunks(chunks: list[torch.Tensor], view: Any) -> None:
    """In place on `chunks`: chunks[rank] is this rank's; afterwards every chunk holds its owner's."""
    rank, world, right, left = _ring(view)
    for step in range(world - 1):
        view.send_recv(chunks[(rank - step) % world], right, chunks[(rank - step - 1) % world], left)


def _check_tensor(x: Any, op: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"comm.{op} takes a tensor, found {type(x).__name__}")
    return x


def _check_dim(x: torch.Tensor, dim: Any, op: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"comm.{op}: dim must be an int, found {type(dim).__name__}")
    if x.dim() == 0 or not -x.dim() <= dim < x.dim():
        raise ValueError(f"comm.{op}: dim={dim} is not a dimension of a tensor of shape {tuple(x.shape)}")
    return dim % x.dim()


def all_reduce(x: torch.Tensor, view: Any) -> torch.Tensor:
    """The sum of every rank's `x` (same shape and dtype on every rank), as a new tensor on each."""
    x = _check_tensor(x, "all_reduce")
    with torch.no_grad():
        out = x.detach().clone(memory_format=torch.contiguous_format)
        if view.world_size > 1:
            flat = out.view(-1)
            _reduce_scatter_chunks(list(flat.tensor_split(view.world_size)), view)
            chunks = list(flat.tensor_split(view.world_size))
            # the reduce-scatter leaves rank r owning chunk r: gather from there
            _all_gather_chunks(chunks, view)
    return out


def all_gather(x: torch.Tensor, view: Any, dim: int = 0) -> torch.Tensor:
    """Every rank's `x` concatenated along `dim` in rank order (same shape on every rank)."""
    x = _check_tensor(x, "all_gather")
    dim = _check_dim(x, dim, "all_gather")
    world = view.world_size
    with torch.no_grad():
        # gather into a [t, ...] buffer laid out rank-major, then move the rank axis next to `dim`
        buf = torch.empty((world, *x.shape), dtype=x.dtype, device=x.device)
        buf[view.rank].copy_(x.detach())
        _all_gather_chunks(list(buf.unbind(0)), view)
        out = torch.cat(list(buf.unbind(0)), dim=dim)
    return out


def reduce_scatter(x: torch.Tensor, view: Any, dim: int = 0) -> torch.Tensor:
    """Chunk `rank` (of t equal chunks along `dim`) of the sum of every rank's `x`.

    ``x.shape[dim]`` must be a multiple of t (ValueError otherwise)."""
    x = _check_tensor(x, "reduce_scatter")
    dim = _check_dim(x, dim, "reduce_scatter")
    world = view.world_size
    if x.shape[dim] % world:
        raise ValueError(
            f"comm.reduce_scatter: dim {dim} has size {x.shape[dim]}, not a multiple of world_size {world}: "
            "every rank must get an equal chunk"
        )
    with torch.no_grad():
        size = x.shape[dim] // world
        # one contiguous [t, ...chunk] buffer, so that each chunk is one message
        buf = torch.stack([c.detach() for c in x.split(size, dim=dim)]).contiguous()
        chunks = list(buf.unbind(0))
        _reduce_scatter_chunks(chunks, view)
        out = chunks[view.rank].clone()
    return out


def flat_sizes(numel: int, world_size: int) -> list[int]:
    """The sizes of ``torch.tensor_split(torch.empty(numel), world_size)``: the first numel % t pieces one longer."""
    return [numel // world_size + (1 if c < numel % world_size else 0) for c in range(world_size)]


def reduce_scatter_flat(x: torch.Tensor, view: Any) -> torch.Tensor:
    """Piece `rank` of ``torch.tensor_split(s, t)``, s the sum of every rank's flattened `x` (same numel on every rank).

    A new 1-D tensor of `x`'s dtype; pieces may be uneven or empty."""
    x = _check_tensor(x, "reduce_scatter_flat")
    with torch.no_grad():
        buf = x.detach().reshape(-1).clone()
        chunks = list(buf.tensor_split(view.world_size))
        _reduce_scatter_chunks(chunks, view)
        out = chunks[view.rank].clone()
    return out


def all_gather_flat(x: torch.Tensor, view: Any, numel: Any = None) -> torch.Tensor:
    """The flat [numel] tensor whose ``torch.tensor_split(_, t)`` piece r is rank r's `x` (flattened).

    Every rank passes the same `numel`; `x` must have exactly its piece's size (ValueError otherwise)."""
    x = _check_tensor(x, "all_gather_flat")
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise TypeError(f"comm.all_gather_flat(piece, numel): numel must be a non-negative int, found {numel!r}")
    want = flat_sizes(numel, view.world_size)[view.rank]
    if x.numel() != want:
        raise ValueError(f"comm.all_gather_flat: rank {view.rank}'s piece has {x.numel()} elements; piece "
                         f"{view.rank} of torch.tensor_split over {numel} elements and {view.world_size} ranks has {want}")
    with torch.no_grad():
        out = torch.empty(numel, dtype=x.dtype, device=x.device)
        chunks = list(out.tensor_split(view.world_size))
        chunks[view.rank].copy_(x.detach().reshape(-1))
        _all_gather_chunks(chunks, view)
    return out


class CollectiveView(ReadOnly):
    """One rank's communicator with the collectives (see the module docstring); read-only.

    The log of its collectives lives with the driver (a closure here), out of the rank's reach."""

    __slots__ = ("rank", "world_size", "send_recv", "all_reduce", "all_gather", "reduce_scatter",
                 "reduce_scatter_flat", "all_gather_flat")

    def __init__(self, view: RankView, counters: Callable[[], tuple[int, int]], log: list[dict],
                 on_output: Callable[[str, torch.Tensor], None] | None = None):
        def record(op: str, x: Any, dim: int | None, run: Callable[[], torch.Tensor]) -> torch.Tensor:
            m0, e0 = counters()
            out = run()
            m1, e1 = counters()
            log.append({"op": op, "shape": tuple(x.shape), "dim": dim, "dtype": x.dtype,
                        "messages": m1 - m0, "elements": e1 - e0})
            if on_output is not None:  # the driver's (zero_sharding's: which gathered tensors stay alive)
                on_output(op, out)
            return out

        def all_reduce_(x: torch.Tensor) -> torch.Tensor:
            return record("all_reduce", x, None, lambda: all_reduce(x, view))

        def all_gather_(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
            return record("all_gather", x, dim, lambda: all_gather(x, view, dim))

        def reduce_scatter_(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
            return record("reduce_scatter", x, dim, lambda: reduce_scatter(x, view, dim))

        def reduce_scatter_flat_(x: torch.Tensor) -> torch.Tensor:
            return record("reduce_scatter_flat", x, None, lambda: reduce_scatter_flat(x, view))

        def all_gather_flat_(x: torch.Tensor, numel: int) -> torch.Tensor:
            return record("all_gather_flat", x, None, lambda: all_gather_flat(x, view, numel))

        reduce_scatter_flat_.__doc__ = reduce_scatter_flat.__doc__
        all_gather_flat_.__doc__ = all_gather_flat.__doc__
        all_reduce_.__doc__ = all_reduce.__doc__
        all_gather_.__doc__ = all_gather.__doc__
        reduce_scatter_.__doc__ = reduce_scatter.__doc__
        for name, value in (("rank", view.rank), ("world_size", view.world_size), ("send_recv", view.send_recv),
                            ("all_reduce", all_reduce_), ("all_gather", all_gather_),
                            ("reduce_scatter", reduce_scatter_), ("reduce_scatter_flat", reduce_scatter_flat_),
                            ("all_gather_flat", all_gather_flat_)):
            object.__setattr__(self, name, value)



class _Counting:
    """A rank's exchange counted as it passes: (messages, elements) so far."""

    def __init__(self, view: RankView):
        self._view, self.messages, self.elements = view, 0, 0
        self.rank, self.world_size = view.rank, view.world_size

    def send_recv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        self._view.send_recv(send, dst, recv, src)
        self.messages += 1
        self.elements += send.numel()


def run_ranks(body: Callable[[int, CollectiveView, list], Any], world_size: int, timeout_s: float = 60.0,
              on_output: Callable[[int, str, torch.Tensor], None] | None = None) -> dict:
    """Run ``body(rank, comm, log)`` on `world_size` simulated ranks (threads) at once.

    `body` is the driver's code (it hands `comm` to the student's); `log` is that rank's list of collective
    entries so far, for a driver that marks where a phase began (``len(log)`` before the backward pass).
    Returns ``{"returns": [...], "logs": [[entry, ...] per rank], "messages_sent": [...],
    "elements_sent": [...]}``; a rank's exception is raised here (see ring_allreduce's `run_simulated`).
    `on_output(rank, op, out)`, when given, sees every collective's result as it is returned."""
    logs: list[list[dict]] = [[] for _ in range(world_size)]

    def rank_main(_: torch.Tensor, view: RankView) -> Any:
        counting = _Counting(view)
        hook = None if on_output is None else (lambda op, out: on_output(view.rank, op, out))
        comm = CollectiveView(counting, lambda: (counting.messages, counting.elements), logs[view.rank],  # type: ignore[arg-type]
                              hook)
        return body(view.rank, comm, logs[view.rank])

    run = run_simulated(rank_main, [torch.empty(0) for _ in range(world_size)], timeout_s=timeout_s)
    return {"returns": run["returns"], "logs": logs, "messages_sent": run["messages_sent"],
            "elements_sent": run["elements_sent"]}


def ring_elements(op: str, numel: int, world_size: int, rank: int = 0) -> int:
    """The elements rank `rank` sends for one ring collective over `world_size` ranks.

    `numel` is the input's element count: the whole tensor for all_reduce and reduce_scatter, the rank's
    own piece for all_gather. all_reduce: twice the elements of the chunks it sends (tensor_split sizes);
    reduce_scatter: (t - 1) / t of the input; all_gather: (t - 1) times the piece. The flat pair takes the
    whole flat numel: reduce_scatter_flat every tensor_split piece but the rank's own, all_gather_flat every
    piece but rank + 1's."""
    t = world_size
    if t == 1:
        return 0
    if op == "reduce_scatter_flat":
        return numel - flat_sizes(numel, t)[rank]
    if op == "all_gather_flat":
        return numel - flat_sizes(numel, t)[(rank + 1) % t]
    if op == "all_gather":
        return (t - 1) * numel
    if op == "reduce_scatter":
        if numel % t:
            raise ValueError(f"reduce_scatter needs numel divisible by world_size: {numel}, {t}")
        return (t - 1) * numel // t
    if op == "all_reduce":
        sizes = [numel // t + (1 if c < numel % t else 0) for c in range(t)]
        sent_rs = [sizes[(rank - s - 1) % t] for s in range(t - 1)]
        sent_ag = [sizes[(rank - s) % t] for s in range(t - 1)]
        return sum(sent_rs) + sum(sent_ag)
    raise ValueError(f"unknown collective {op!r}")
