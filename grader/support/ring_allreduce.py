"""Communicators for the ring all-reduce exercise, and the drivers that run a function on every rank.

The student's functions take a communicator ``comm`` with exactly this interface::

    comm.rank            # this rank, 0 .. world_size - 1
    comm.world_size      # the number of ranks, N
    comm.send_recv(send, dst, recv, src)
        # send the tensor `send` to rank `dst` and, at the same time, receive a message from rank `src`
        # into the tensor `recv` (like MPI_Sendrecv: a ring of these cannot deadlock on ordering).
        # The message is the flat sequence of elements; the receive buffer must have the same dtype
        # and number of elements as the send buffer on the other side. Returns None.

Two implementations, both counting what each rank sends (``messages_sent``, ``elements_sent``,
``bytes_sent``, ``message_sizes``) and, when asked (``trace=True``, or ``trace="digest"`` for a
fingerprint of each message instead of a copy), recording every message it sends:

* `SimulatedComm`: N ranks as threads in one process, exchanging through queues. A mismatched
  exchange, a rank waiting for a message that never comes (a deadlock, a peer that returned or
  failed) or a message nobody received raises `CommError` with a message that names the ranks, not a
  hang. Start here: ``run_simulated``.
* `DistributedComm`: N real processes on this machine over ``torch.distributed`` (gloo on the CPU,
  NCCL with one GPU per rank), using ``isend``/``irecv`` underneath. ``run_distributed``.

Run your own code on either (from the repository root)::

    import torch
    from grader.support.ring_allreduce import run_simulated, run_distributed
    from ring_allreduce import ring_allreduce        # exercises/ring_allreduce on sys.path

    xs = [torch.arange(10.0) * (r + 1) for r in range(4)]   # one tensor per rank
    run = run_simulated(ring_allreduce, xs)                # threads; xs are changed in place
    print(run["outputs"][0], run["elements_sent"], run["messages_sent"])
    run = run_distributed(ring_allreduce, [torch.arange(10.0) * (r + 1) for r in range(4)])

`run_distributed` forks the calling process (Linux): the ranks inherit your function and inputs.

What a rank's code is handed is a `RankView`: ``rank``, ``world_size`` and ``send_recv``, nothing
else. The counters and the trace stay with the driver, out of the ranks' reach, because they are the
evidence the grader reads: the messages a rank sent, each recorded from the very copy that is
delivered. The ranks share a process (simulated) or a machine (real), so a module-level variable or
a file could carry data between them; the grader does not try to stop that, it checks the messages:
each must be exactly what the ring sends at that step (grader/hidden/ring_allreduce, README.md).
"""

from __future__ import annotations

import collections
import datetime
import hashlib
import operator
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch

from grader.harness import kernel_rule

__all__ = [
    "Communicator", "CommError", "SimulatedComm", "DistributedComm", "RankView",
    "run_simulated", "run_distributed", "run_distributed_cases", "run_on_processes", "forbidden_collectives",
    "message_digest",
]


class Communicator(Protocol):
    rank: int
    world_size: int

    def send_recv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        """Send `send` to rank `dst` and, at the same time, receive from rank `src` into `recv`."""


class CommError(RuntimeError):
    """A communication mistake: a bad rank, mismatched buffers, a deadlock, a lost message."""


class PeerFailed(CommError):
    """This rank cannot go on because another rank failed first (reported only if nothing else is)."""


class ExchangeFailed(CommError):
    """A real exchange failed or timed out: often only the echo of another rank's failure."""


class RankFailed(RuntimeError):
    """A rank of a real multi-process run raised; the message carries that rank's error and traceback."""


_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
    "all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced", "all_gather_object",
    "broadcast", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
)
_PROCESS_GROUP_METHODS = (
    "allreduce", "allreduce_coalesced", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor_coalesced",
    "allgather", "allgather_coalesced", "allgather_into_tensor_coalesced", "all_gather_single", "broadcast",
    "reduce", "gather", "scatter", "alltoall", "alltoall_base", "all_to_all_single",
)
_FUNCTIONAL = (
    "all_reduce", "all_reduce_inplace", "reduce_scatter_tensor", "all_gather_tensor", "all_gather_tensor_inplace",
)


def forbidden_collectives() -> list[str]:
    """The torch.distributed collectives a submission must not call (for the grader's `forbid` guard)."""
    import importlib

    names = []
    for module_name, attrs in (
        ("torch.distributed", _COLLECTIVES),
        ("torch.distributed.distributed_c10d", _COLLECTIVES),
        ("torch.distributed._functional_collectives", _FUNCTIONAL),
    ):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        names += [f"{module_name}.{a}" for a in attrs if hasattr(module, a)]
    import torch.distributed as dist

    if hasattr(dist, "ProcessGroup"):
        group = dist.ProcessGroup
        names += [f"torch.distributed.ProcessGroup.{m}" for m in _PROCESS_GROUP_METHODS if hasattr(group, m)]
    return names


# --------------------------------------------------------------------------------------------------
# What both communicators check before an exchange, and what they count


def _describe(t: torch.Tensor) -> str:
    return f"{t.numel()} {str(t.dtype).removeprefix('torch.')} elements"


def _extent(t: torch.Tensor) -> tuple[int, int]:
    span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + span * t.element_size()


class _Counters:
    """What one rank has sent so far."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.messages_sent = 0
        self.elements_sent = 0
        self.bytes_sent = 0
        self.message_sizes: list[int] = []

    def stats(self) -> dict:
        return {
            "messages_sent": self.messages_sent,
            "elements_sent": self.elements_sent,
            "bytes_sent": self.bytes_sent,
            "message_sizes": list(self.message_sizes),
        }

    def _rank_arg(self, value: Any, name: str) -> int:
        try:
            peer = operator.index(value)
        except TypeError:
            raise CommError(
                f"rank {self.rank}: {name} must be an int rank, found {type(value).__name__} {value!r}"
            ) from None
        if not 0 <= peer < self.world_size:
            raise CommError(
                f"rank {self.rank}: {name}={peer} is not a rank: ranks are 0..{self.world_size - 1}. "
                f"Did you forget '% world_size' when you stepped {'back' if peer < 0 else 'past the end'} "
                "around the ring?"
            )
        if peer == self.rank:
            raise CommError(
                f"rank {self.rank}: {name}={peer} is this rank itself; a ring exchanges with its neighbours "
                "(and with world_size 1 there is nothing to exchange: do nothing)"
            )
        return peer

    def check(self, send: Any, dst: Any, recv: Any, src: Any) -> tuple[int, int]:
        """Validate one send_recv call and count its message; returns (dst, src) as ints."""
        for name, value in (("send", send), ("recv", recv)):
            if not isinstance(value, torch.Tensor):
                raise CommError(f"rank {self.rank}: {name} must be a tensor, found {type(value).__name__}")
        dst, src = self._rank_arg(dst, "dst"), self._rank_arg(src, "src")
        if send.device != recv.device:
            raise CommError(f"rank {self.rank}: send is on {send.device} but recv is on {recv.device}")
        if send.numel() and recv.numel() and kernel_rule.storage_of(send) == kernel_rule.storage_of(recv):
            (a0, a1), (b0, b1) = _extent(send), _extent(recv)
            if a0 < b1 and b0 < a1:
                raise CommError(
                    f"rank {self.rank}: the send and recv buffers overlap in memory, so the message would "
                    "overwrite what is being sent. Receive into a separate buffer (or a different chunk)."
                )
        self.messages_sent += 1
        self.elements_sent += send.numel()
        self.bytes_sent += send.numel() * send.element_size()
        self.message_sizes.append(send.numel())
        return dst, src


def _mismatch(rank: int, src: int, got: str, recv: torch.Tensor, theirs: int, mine: int, world: int = 0) -> CommError:
    # With N > 2 the left and right neighbours differ: a message from the right says the ring runs leftward.
    leftward = (
        f" Rank {rank} receives from rank {src}, its right neighbour (r + 1) % N: the ring sends to the right, "
        "(r + 1) % N, and receives from the left, (r - 1) % N; the chunk indices (r - s) % N and (r - s - 1) % N "
        "are those of that rightward ring"
        if world > 2 and src == (rank + 1) % world else ""
    )
    return CommError(
        f"rank {rank}, exchange {mine}: rank {src} sent {got} (its exchange {theirs}) but the receive buffer "
        f"holds {_describe(recv)}. The two sides of a message must agree on dtype and length: "
        "do both ranks compute the same chunk index for this step?" + leftward
    )


def message_digest(elements: torch.Tensor) -> str:
    """A fingerprint of one message: its dtype, its length and its elements' bits, in row-major order.

    Equal for two messages exactly when they are equal element for element as torch.equal sees them
    (a float -0.0 counts as 0.0); the grader compares it with the digest of the message the ring must
    send, so a large run need not send every message back. Hashed from the tensor's memory with numpy
    (no torch operation: in a guarded call every operation passes through the guard)."""
    flat = elements.detach().reshape(-1).to("cpu")
    if flat.numel() and flat.stride() != (1,):  # torch counts a 1-element view of any stride as contiguous
        flat = torch.empty(flat.numel(), dtype=flat.dtype).copy_(flat)
    h = hashlib.sha256(f"{str(flat.dtype).removeprefix('torch.')}:{flat.numel()}:".encode())
    if flat.numel():
        bits = flat.view(torch.view_as_real(flat).dtype) if flat.is_complex() else flat
        if bits.is_floating_point():  # the sign bit alone is -0.0: count it as 0.0
            width = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[bits.element_size()]
            words = bits.view(width).numpy()
            negative_zero = words == np.iinfo(words.dtype).min
            if negative_zero.any():
                words = np.where(negative_zero, 0, words).astype(words.dtype)
            h.update(words.view(np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer (stubs: 3.12+ only)
        else:
            h.update(bits.view(torch.uint8).numpy())  # type: ignore[arg-type]  # likewise
    return h.hexdigest()[:32]


_TRACE_MODES = (False, True, "digest")


def _trace_mode(trace: Any) -> bool | str:
    if not any(trace is mode or (isinstance(mode, str) and trace == mode) for mode in _TRACE_MODES):
        raise ValueError(f"trace must be False, True (a copy of every message) or 'digest', found {trace!r}")
    return trace


def _trace_entry(payload: torch.Tensor, dst: int, src: int, mode: bool | str, private: bool = False) -> dict:
    """What the trace keeps of one message: its peers and the message (``sent``, a flat copy; `payload`
    itself when it is `private`, a copy nobody else holds) or, for ``trace="digest"``, its dtype, length
    and `message_digest`."""
    if mode == "digest":
        return {"dst": dst, "src": src, "dtype": str(payload.dtype).removeprefix("torch."), "numel": payload.numel(),
                "digest": message_digest(payload)}
    sent = payload if private and payload.device.type == "cpu" else payload.detach().reshape(-1).to("cpu", copy=True)
    return {"dst": dst, "src": src, "sent": sent}


class ReadOnly:
    """A communicator view whose attributes, set once in `__init__` by ``object.__setattr__``, cannot be set or
    deleted: RankView here, and grader.support.collectives.CollectiveView."""

    __slots__ = ()
    rank: int
    world_size: int

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the communicator is read-only (tried to set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"the communicator is read-only (tried to delete {name!r})")

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world_size={self.world_size})"


class RankView(ReadOnly):
    """One rank's communicator as the rank's code sees it: ``rank``, ``world_size`` and ``send_recv``.

    It holds the communicator only inside a function, so the counters and trace behind it, which
    the grader reads, are not attributes a rank can reach; its attributes cannot be set."""

    __slots__ = ("rank", "world_size", "send_recv")
    rank: int
    world_size: int
    send_recv: Callable[[torch.Tensor, int, torch.Tensor, int], None]

    def __init__(self, comm: Any):
        exchange = comm.send_recv

        def send_recv(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
            exchange(send, dst, recv, src)

        send_recv.__doc__ = Communicator.send_recv.__doc__
        for name, value in (("rank", comm.rank), ("world_size", comm.world_size), ("send_recv", send_recv)):
            object.__setattr__(self, name, value)



# --------------------------------------------------------------------------------------------------
# The simulated ring: threads and queues


class _Ring:
    """The shared state of one simulated run: mailboxes and what each rank is doing."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.cond = threading.Condition()
        self.boxes: dict[tuple[int, int], collections.deque] = collections.defaultdict(collections.deque)
        self.state = ["running"] * world_size  # running | waiting | returned | failed
        self.waiting_for: list[int | None] = [None] * world_size
        self.exchanges = [0] * world_size
        self.failure: str | None = None

    def _stuck(self) -> tuple[type, str] | None:
        """(exception class, message) if no rank can make progress any more, else None."""
        if any(s == "running" for s in self.state):
            return None
        waiting = [r for r, s in enumerate(self.state) if s == "waiting"]
        if not waiting or any(self.boxes[(self.waiting_for[r], r)] for r in waiting):  # type: ignore[index]  # set while waiting
            return None
        failed = [r for r, s in enumerate(self.state) if s == "failed"]
        if failed:
            return PeerFailed, f"rank {failed[0]} failed, so the ranks waiting on it cannot go on"
        who = "; ".join(
            f"rank {r} (exchange {self.exchanges[r]}) waits for rank {self.waiting_for[r]}" for r in waiting
        )
        return CommError, (
            f"deadlock: every rank is waiting for a message that will never come: {who}. "
            "Each rank must receive from the rank that sends to it, the same number of times."
        )

    def exchange(self, rank: int, payload: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        """`payload`: the sender's own flat copy of the message (a buffered send: it may reuse its buffer)."""
        with self.cond:
            if self.failure:
                raise PeerFailed(self.failure)
            self.exchanges[rank] += 1
            mine = self.exchanges[rank]
            self.boxes[(rank, dst)].append((mine, payload))
            self.state[rank], self.waiting_for[rank] = "waiting", src
            self.cond.notify_all()
            box = self.boxes[(src, rank)]
            while not box:
                if self.failure:
                    raise PeerFailed(self.failure)
                if self.state[src] in ("returned", "failed"):
                    what = "has already returned" if self.state[src] == "returned" else "failed"
                    raise (CommError if self.state[src] == "returned" else PeerFailed)(
                        f"rank {rank} (exchange {mine}) waits for a message from rank {src}, but rank {src} {what} "
                        f"after {self.exchanges[src]} exchanges. Every rank must make the same number of exchanges."
                    )
                stuck = self._stuck()
                if stuck:
                    self.failure = stuck[1]
                    self.cond.notify_all()
                    raise stuck[0](stuck[1])
                self.cond.wait(timeout=1.0)
            theirs, message = box.popleft()
            self.state[rank], self.waiting_for[rank] = "running", None
        if message.dtype != recv.dtype or message.numel() != recv.numel():
            raise _mismatch(rank, src, _describe(message), recv, theirs, mine, len(self.exchanges))
        with torch.no_grad():
            recv.copy_(message.view(recv.shape))

    def finish(self, rank: int, failed: bool) -> None:
        with self.cond:
            self.state[rank] = "failed" if failed else "returned"
            self.waiting_for[rank] = None
            self.cond.notify_all()

    def leftovers(self) -> str | None:
        lost = [(s, d, len(q)) for (s, d), q in sorted(self.boxes.items()) if q]
        if not lost:
            return None
        parts = "; ".join(f"rank {s} sent {k} message(s) to rank {d} that rank {d} never received" for s, d, k in lost)
        return f"{parts}. Every send needs a matching receive on the other side."


class _CountedComm:
    """What both communicators report: the traffic counted by their `_counters`."""

    _counters: _Counters

    @property
    def messages_sent(self) -> int:
        return self._counters.messages_sent

    @property
    def elements_sent(self) -> int:
        return self._counters.elements_sent

    def stats(self) -> dict:
        return self._counters.stats()


class SimulatedComm(_CountedComm):
    """One rank of a simulated ring (see the module docstring). Made by `run_simulated`."""

    def __init__(self, ring: _Ring, rank: int, trace: list | None = None, trace_mode: bool | str = True):
        self._ring = ring
        self._counters = _Counters(rank, ring.world_size)
        self._trace = trace  # with run_simulated(..., trace=...): every message this rank sends
        self._trace_mode = trace_mode
        self.rank = rank
        self.world_size = ring.world_size

    def send_recv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        dst, src = self._counters.check(send, dst, recv, src)
        payload = send.detach().reshape(-1).clone()  # one copy: what is traced is what is delivered
        if self._trace is not None:
            self._trace.append(_trace_entry(payload, dst, src, self._trace_mode, private=True))
        self._ring.exchange(self.rank, payload, dst, recv, src)

    def __repr__(self) -> str:
        return f"SimulatedComm(rank={self.rank}, world_size={self.world_size})"


def _collect(stats: list[dict]) -> dict:
    return {key: [s[key] for s in stats] for key in ("messages_sent", "elements_sent", "bytes_sent", "message_sizes")}


def _rank_args(rank_args: Sequence[Sequence[Any]] | None, world_size: int) -> list[tuple]:
    if rank_args is None:
        return [()] * world_size
    if len(rank_args) != world_size:
        raise ValueError(f"rank_args needs one tuple per rank ({world_size}), found {len(rank_args)}")
    return [tuple(a) for a in rank_args]


def run_simulated(
    fn: Callable, tensors: Sequence[torch.Tensor], *args: Any,
    rank_args: Sequence[Sequence[Any]] | None = None, timeout_s: float = 60.0, trace: bool | str = False,
) -> dict:
    """Run ``fn(tensors[r], comm_r, *args, *rank_args[r])`` on N = len(tensors) simulated ranks at once.

    Each rank is a thread; the tensors are changed in place. Returns a dict of per-rank lists:
    ``outputs`` (the tensors), ``returns`` (what fn returned), ``messages_sent``, ``elements_sent``,
    ``bytes_sent``, ``message_sizes``; with ``trace=True`` also ``trace``: each rank's exchanges in order,
    as ``{"dst", "src", "sent"}`` (a flat copy of the elements sent), or with ``trace="digest"`` as
    ``{"dst", "src", "dtype", "numel", "digest"}`` (`message_digest` of the elements sent). If a rank
    raises, its exception is raised here (the first one; errors that only follow from it are not
    reported); a deadlock or a message nobody received raises `CommError`.
    """
    trace = _trace_mode(trace)
    world_size = len(tensors)
    if world_size < 1:
        raise ValueError("run_simulated needs one tensor per rank, found none")
    extra = _rank_args(rank_args, world_size)
    ring = _Ring(world_size)
    traces: list[list[dict]] = [[] for _ in range(world_size)]
    comms = [SimulatedComm(ring, r, traces[r] if trace else None, trace) for r in range(world_size)]
    views = [RankView(c) for c in comms]  # what the ranks get: the counters and traces stay here
    returns: list[Any] = [None] * world_size
    errors: list[tuple[int, BaseException]] = []
    order = threading.Lock()

    def body(rank: int) -> None:
        failed = True
        try:
            returns[rank] = fn(tensors[rank], views[rank], *args, *extra[rank])
            failed = False
        except BaseException as exc:  # noqa: BLE001 - reported by the driver
            with order:
                errors.append((rank, exc))
        finally:
            ring.finish(rank, failed)

    threads = [threading.Thread(target=body, args=(r,), name=f"rank-{r}", daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    if stuck:
        with ring.cond:
            ring.failure = f"the run was stopped after {timeout_s:g} s"
            ring.cond.notify_all()
        raise CommError(
            f"after {timeout_s:g} s, rank(s) {stuck} had not returned and were not waiting for a message: "
            "a loop that never ends?"
        )
    if errors:
        primary = [e for e in errors if not isinstance(e[1], PeerFailed)] or errors
        rank, exc = primary[0]
        if hasattr(exc, "add_note"):
            exc.add_note(f"(raised on rank {rank} of {world_size}, simulated ring)")
        raise exc
    lost = ring.leftovers()
    if lost:
        raise CommError(lost)
    out = {"outputs": list(tensors), "returns": returns, **_collect([c.stats() for c in comms])}
    return {**out, "trace": traces} if trace else out


# --------------------------------------------------------------------------------------------------
# Real processes over torch.distributed


_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


class DistributedComm(_CountedComm):
    """One rank of a real run over torch.distributed (the default process group must exist).

    Every exchange first swaps a 3-number header (dtype, length, exchange number) so that mismatched
    buffers raise `CommError` instead of corrupting memory or aborting the process; ``checked=False``
    skips it (the benchmark times the ring that way). Waits longer than `timeout_s` raise `CommError`.
    """

    def __init__(self, rank: int, world_size: int, device: torch.device | str = "cpu", tag: int = 0,
                 checked: bool = True, timeout_s: float = 60.0, trace: bool | str = False):
        import torch.distributed as dist

        self._dist = dist
        self._trace_mode = _trace_mode(trace)
        self.trace: list[dict] = []  # with trace=...: every message this rank sends (see run_simulated)
        self._counters = _Counters(rank, world_size)
        self.rank, self.world_size = rank, world_size
        self.device = torch.device(device)
        self.tag, self.checked, self.timeout_s = tag, checked, timeout_s
        self._nccl = self.device.type == "cuda"
        self._exchanges = 0

    def _swap(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        dist = self._dist
        if self._nccl:  # NCCL runs a ring of separate sends into a deadlock unless they are grouped
            ops = [dist.P2POp(dist.isend, send, dst, tag=self.tag), dist.P2POp(dist.irecv, recv, src, tag=self.tag)]
            works = dist.batch_isend_irecv(ops)
        else:
            works = [dist.irecv(recv, src, tag=self.tag), dist.isend(send, dst, tag=self.tag)]
        for work in works:
            try:
                work.wait(datetime.timedelta(seconds=self.timeout_s))
            except Exception as exc:  # noqa: BLE001 - gloo's errors are opaque; say what they mean
                raise ExchangeFailed(
                    f"rank {self.rank}, exchange {self._exchanges}: the exchange with dst={dst}, src={src} failed "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). A rank that waits "
                    "too long, or whose peer has gone, usually means the ranks disagree on how many exchanges "
                    "to make or with whom; run_simulated names the culprit."
                ) from None

    def send_recv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        dst, src = self._counters.check(send, dst, recv, src)
        self._exchanges += 1
        for t, name in ((send, "send"), (recv, "recv")):
            if t.device != self.device:
                raise CommError(f"rank {self.rank}: {name} is on {t.device}, this communicator on {self.device}")
        if self.checked:
            mine = torch.tensor([_dtype_code(send.dtype), send.numel(), self._exchanges], dtype=torch.int64,
                                device=self.device)
            theirs = torch.empty(3, dtype=torch.int64, device=self.device)
            self._swap(mine, dst, theirs, src)
            code, length, their_exchange = (int(v) for v in theirs.tolist())
            if code != _dtype_code(recv.dtype) or length != recv.numel():
                name = str(_DTYPES[code]).removeprefix("torch.") if code < len(_DTYPES) else "other"
                raise _mismatch(self.rank, src, f"{length} {name} elements", recv, their_exchange, self._exchanges)
        payload = send.detach()
        payload = payload if payload.is_contiguous() else payload.contiguous()
        if self._trace_mode:  # from the payload itself, just before it goes (one thread: nothing changes it)
            self.trace.append(_trace_entry(payload, dst, src, self._trace_mode))
        landing = recv if recv.is_contiguous() else torch.empty_like(recv, memory_format=torch.contiguous_format)
        with torch.no_grad():
            self._swap(payload, dst, landing, src)
            if landing is not recv:
                recv.copy_(landing)

    def __repr__(self) -> str:
        return f"DistributedComm(rank={self.rank}, world_size={self.world_size}, device={self.device})"


def _student_frames(exc: BaseException, filename: str | None) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    keep = [f for f in frames if filename is None or f.filename == filename]
    if frames and (not keep or keep[-1] is not frames[-1]):
        keep.append(frames[-1])
    def where(path: str) -> str:
        parts = path.split(os.sep)
        return os.path.basename(path) if path == filename else "/".join(parts[-3:])

    lines = [f'  File "{where(f.filename)}", line {f.lineno}, in {f.name}\n    {(f.line or "").strip()}' for f in keep]
    return "\n".join(lines)


def _child_main(rank: int, world_size: int, backend: str, store_dir: str, body: Callable, timeout_s: float,
                filename: str | None) -> None:
    """The life of one forked rank: join the group, run `body`, write the result (or the error), exit."""
    code = 1
    try:
        torch.set_num_threads(1)  # after fork: the parent's OpenMP pool is gone (and ranks share the cores)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch.distributed as dist

        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        store = dist.FileStore(os.path.join(store_dir, "store"), world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            _write(os.path.join(store_dir, f"result{rank}.pt"), body(rank, world_size, device))
        except BaseException as exc:  # noqa: BLE001
            text = f"{type(exc).__name__}: {exc}"
            report = {"rank": rank, "type": type(exc).__name__, "text": text,
                      "where": _student_frames(exc, filename), "time": time.monotonic(),
                      "secondary": isinstance(exc, (PeerFailed, ExchangeFailed))}
            _write(os.path.join(store_dir, f"error{rank}.pkl"), report)
            raise
        code = 0
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the result is written; teardown noise does not matter
            pass
    except BaseException:  # noqa: BLE001
        pass
    finally:
        os._exit(code)


def _write(path: str, value: Any) -> None:
    tmp = path + ".tmp"
    torch.save(value, tmp)
    os.replace(tmp, path)


def run_on_processes(body: Callable[[int, int, torch.device], Any], world_size: int, backend: str = "gloo",
                     timeout_s: float = 120.0, filename: str | None = None) -> list[Any]:
    """Fork `world_size` processes that join one torch.distributed group; rank r returns
    ``body(r, world_size, device)``. Returns the results in rank order, or raises `RankFailed` with
    the first rank's error (its traceback restricted to `filename`, when given)."""
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise RuntimeError(f"NCCL needs one GPU per rank: {world_size} ranks, {torch.cuda.device_count()} GPUs")
    store_dir = tempfile.mkdtemp(prefix="ring-allreduce-")
    pids: dict[int, int] = {}
    try:
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child never returns
                _child_main(rank, world_size, backend, store_dir, body, timeout_s, filename)
            pids[pid] = rank
        exits = _wait_all(pids, timeout_s)
        errors = []
        for rank in range(world_size):
            path = os.path.join(store_dir, f"error{rank}.pkl")
            if os.path.exists(path):
                errors.append(torch.load(path, weights_only=True))  # plain data: never unpickle a rank's objects
        if errors:
            e = min(errors, key=lambda e: (e["secondary"], e["time"]))
            raise RankFailed(
                f"rank {e['rank']} of {world_size} ({backend} processes) raised {e['text']}\n"
                f"Traceback (your code only):\n{e['where']}"
            )
        results = []
        for rank in range(world_size):
            path = os.path.join(store_dir, f"result{rank}.pt")
            if not os.path.exists(path):
                raise RankFailed(f"rank {rank} of {world_size} ({backend} processes) {exits.get(rank, 'died')}")
            results.append(torch.load(path, weights_only=True))
        return results
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(pids)
        shutil.rmtree(store_dir, ignore_errors=True)


def _wait_all(pids: dict[int, int], timeout_s: float) -> dict[int, str]:
    """Wait for every child; after the first failure give the others a moment, then stop waiting."""
    exits: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s + 10
    live = set(pids)
    while live and time.monotonic() < deadline:
        finished = False
        for pid in list(live):
            got, status = os.waitpid(pid, os.WNOHANG)
            if not got:
                continue
            finished = True
            live.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                exits[pids[pid]] = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                deadline = min(deadline, time.monotonic() + 3.0)
        if not finished:
            time.sleep(0.005)
    for pid in live:
        exits[pids[pid]] = "did not finish in time (a deadlock, or a rank that never returned?)"
    return exits


def _reap(pids: dict[int, int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def run_distributed_cases(
    fn: Callable, cases: Sequence[Sequence[torch.Tensor]], *args: Any,
    rank_args: Sequence[Sequence[Any]] | None = None, backend: str = "gloo", timeout_s: float = 60.0,
    checked: bool = True, trace: bool | str = False,
) -> list[dict]:
    """`run_distributed` for several inputs on one set of processes (start-up is paid once).

    Every case holds one tensor per rank, all cases the same number of ranks. Returns one dict per case
    (``outputs`` on the CPU, ``returns``, and the per-rank counters, as `run_simulated`; with `trace`,
    also ``trace``, as `run_simulated`'s).
    """
    trace = _trace_mode(trace)
    if not cases:
        return []
    world_size = len(cases[0])
    if any(len(c) != world_size for c in cases):
        raise ValueError("every case needs the same number of tensors (one per rank)")
    extra = _rank_args(rank_args, world_size)
    code = getattr(fn, "__code__", None)

    def body(rank: int, n: int, device: torch.device) -> list[dict]:
        out = []
        for index, case in enumerate(cases):
            x = case[rank].to(device)
            comm = DistributedComm(rank, n, device, tag=index, checked=checked, timeout_s=timeout_s / 2, trace=trace)
            ret = fn(x, RankView(comm), *args, *extra[rank])  # the counters and trace stay here
            if device.type == "cuda":
                torch.cuda.synchronize()
            out.append({"output": x.cpu(), "return": ret, "trace": comm.trace, **comm.stats()})
        return out

    per_rank = run_on_processes(body, world_size, backend, timeout_s, code.co_filename if code else None)
    results = []
    for index in range(len(cases)):
        rows = [per_rank[r][index] for r in range(world_size)]
        result = {"outputs": [row["output"] for row in rows], "returns": [row["return"] for row in rows],
                  **_collect(rows)}
        results.append({**result, "trace": [row["trace"] for row in rows]} if trace else result)
    return results


def run_distributed(
    fn: Callable, tensors: Sequence[torch.Tensor], *args: Any,
    rank_args: Sequence[Sequence[Any]] | None = None, backend: str = "gloo", timeout_s: float = 60.0,
    trace: bool | str = False,
) -> dict:
    """Run ``fn(tensors[r], comm_r, *args, *rank_args[r])`` on N = len(tensors) real processes.

    Unlike `run_simulated`, the ranks work on copies: read the results from ``outputs``.
    """
    return run_distributed_cases(fn, [tensors], *args, rank_args=rank_args, backend=backend, timeout_s=timeout_s,
                                 trace=trace)[0]


# What a wrong result's chunks show, for the public and the hidden tests' messages (never called by a driver).


def finished_chunk_sizes(xs: list[torch.Tensor], outputs: list[torch.Tensor], atol: float = 0.0) -> list[int] | None:
    """The chunk sizes the ranks' results show, or None when they show none: rank r finishes chunk (r + 1) % N, and
    the positions where its output holds every rank's contribution are that chunk. None unless those runs are
    contiguous and tile the tensor in chunk order."""
    from grader.testing import mismatches  # the test process's comparison; never needed where rank code runs

    world = len(xs)
    total = torch.stack([x.reshape(-1).double() for x in xs]).sum(0)
    scale = torch.stack([x.reshape(-1).double().abs() for x in xs]).sum(0)
    sizes, pos = [], 0
    for c in range(world):
        got = outputs[(c - 1) % world].reshape(-1).double()
        full = (~mismatches(got, total, atol=atol * scale)).nonzero().flatten()  # the complete sums
        if not full.numel():
            sizes.append(0)
            continue
        if int(full[0]) != pos or int(full[-1]) - int(full[0]) + 1 != full.numel():
            return None
        sizes.append(full.numel())
        pos += full.numel()
    return sizes if pos == total.numel() else None


def chunking_cause(xs: list[torch.Tensor], outputs: list[torch.Tensor], atol: float = 0.0) -> str:
    """'' unless the results show chunks cut other than torch.tensor_split's; else what they show."""
    world, n = len(xs), xs[0].numel()
    sizes, want = finished_chunk_sizes(xs, outputs, atol), [n // world + (1 if c < n % world else 0) for c in range(world)]
    if sizes is None or sizes == want:
        return ""
    return (f"The ranks finished chunks of sizes {sizes} (rank r finishes chunk (r + 1) % N, and its complete sums sit "
            f"there), but the contract cuts n = {n} into N = {world} chunks as torch.tensor_split(flat, N) does: sizes "
            f"{want}, the first n % N chunks one element longer. Cut the chunks that way on every rank")
