"""Drivers for the zero_sharding exercise: a student's ZeroAdamW run on every simulated rank, with each rank's
traffic per step, the bytes it holds, and (stage 3) how many gathered layers are alive at once.

The ranks' communicators are grader/support/collectives.py's `CollectiveView`s. Run your own code the same
way (from the repository root)::

    import torch
    from grader.support.zero_sharding import run_optimizer
    import zero_sharding as zs                         # exercises/zero_sharding on sys.path

    full = torch.randn(10)
    grads = [[torch.randn(10).bfloat16() for rank in range(2)] for step in range(3)]
    out = run_optimizer(zs.ZeroAdamW, [10], 2, full, grads, stage=1, lr=1e-2)
    print(out[0]["steps"], out[0]["memory_bytes"], out[0]["reachable_bytes"])

What a rank "holds" is measured twice: the distinct storages of ``held_tensors()`` (each counted whole, so
a view of a slice counts its whole buffer), and every tensor reachable from the optimizer object's attributes
(lists, tuples, dicts and plain objects followed; the communicator left out).
"""

from __future__ import annotations

import inspect
import threading
import weakref
from typing import Any, Callable, Sequence

import torch

from grader.support.collectives import CollectiveView, flat_sizes, run_ranks
from grader.support.ring_allreduce import ReadOnly, run_on_processes

__all__ = ["run_optimizer", "run_zero3", "run_distributed", "TorchCollectives", "LAYER_KINDS", "layer_fn", "mse",
           "storage_bytes", "reachable_tensors"]


def storage_bytes(tensors: Any) -> int:
    """The bytes of the distinct storages under `tensors` (each storage counted once, whole)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"held_tensors() must return tensors, found {type(t).__name__}")
        s = t.untyped_storage()
        seen[s.data_ptr() if s.nbytes() else id(t)] = s.nbytes()
    return sum(seen.values())


def reachable_tensors(obj: Any, skip: tuple = (), depth: int = 6) -> list[torch.Tensor]:
    """Every tensor reachable from `obj`'s attributes through lists, tuples, sets, dicts and plain objects."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()

    def walk(x: Any, d: int) -> None:
        if id(x) in seen or d < 0 or any(x is s for s in skip):
            return
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            found.append(x)
            if x.grad is not None:
                found.append(x.grad)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k, d - 1)
                walk(v, d - 1)
        elif isinstance(x, (list, tuple, set, frozenset)):
            for v in x:
                walk(v, d - 1)
        elif isinstance(x, (CollectiveView, type)) or callable(x) and not hasattr(x, "__dict__"):
            return
        elif hasattr(x, "__dict__") and not isinstance(x, (str, bytes, int, float, complex)):
            for v in vars(x).values():
                walk(v, d - 1)

    walk(obj, depth)
    return found


def _strip(entries: list[dict]) -> list[dict]:
    return [{**e, "dtype": str(e["dtype"]).removeprefix("torch.")} for e in entries]


def _report(opt: Any, comm: Any) -> dict:
    held = list(opt.held_tensors())
    mem = opt.memory_bytes()
    return {"params": opt.params().detach().clone(), "memory_bytes": {k: int(v) for k, v in dict(mem).items()},
            "held_bytes": storage_bytes(held), "held_dtypes": sorted({str(t.dtype) for t in held}),
            "reachable_bytes": storage_bytes(reachable_tensors(opt, skip=(comm,)))}


def run_optimizer(cls: Callable, sizes: Sequence[int], world: int, full: torch.Tensor,
                  grads: Sequence[Sequence[torch.Tensor]], stage: int, timeout_s: float = 120.0,
                  **kwargs: Any) -> list[dict]:
    """On `world` simulated ranks: ``opt = cls(sizes, comm, stage, **kwargs)``, ``opt.init(full)``, then one
    ``opt.step(grads[k][rank])`` per step k. Returns each rank's dict: ``params`` (after the last step),
    ``memory_bytes``, ``held_bytes``, ``reachable_bytes``, ``steps`` (per step: the collectives' log entries,
    elements and messages sent), ``outside`` (elements sent by send_recv outside the collectives)."""

    def body(rank: int, comm: CollectiveView, log: list) -> dict:
        opt = cls(list(sizes), comm, stage, **kwargs)
        opt.init(full.clone())
        steps = []
        for k in range(len(grads)):
            mark = len(log)
            opt.step(grads[k][rank].clone())
            entries = _strip(log[mark:])
            steps.append({"log": entries, "elements": sum(e["elements"] for e in entries),
                          "messages": sum(e["messages"] for e in entries)})
        return {**_report(opt, comm), "steps": steps}

    run = run_ranks(body, world, timeout_s)
    out = run["returns"]
    for r in range(world):
        out[r]["outside"] = run["elements_sent"][r] - sum(s["elements"] for s in out[r]["steps"])
    return out


# ---------------------------------------------------------------- stage 3: a stack of layers from flat weights

LAYER_KINDS = ("tanh", "linear")


def layer_fn(kind: str, d_in: int, d_out: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``fn(h, flat_w)``: h [batch, d_in] times flat_w viewed as [d_in, d_out], then tanh ("tanh") or nothing."""
    if kind not in LAYER_KINDS:
        raise ValueError(f"unknown layer kind {kind!r}")

    def fn(h: torch.Tensor, flat_w: torch.Tensor) -> torch.Tensor:
        out = h @ flat_w.view(d_in, d_out)
        return torch.tanh(out) if kind == "tanh" else out

    fn.__name__ = f"{kind}_{d_in}x{d_out}"
    return fn


def mse(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss of the stage-3 runs: mean squared error."""
    return ((h - y) ** 2).mean()


class _Gathered:
    """Per rank: how many tensors that all_gather_flat returned are alive now, and the most at once."""

    def __init__(self, world: int):
        self.lock = threading.Lock()
        self.alive, self.peak, self.count = [0] * world, [0] * world, [0] * world

    def freed(self, rank: int) -> None:
        with self.lock:
            self.alive[rank] -= 1

    def observe(self, rank: int, op: str, out: torch.Tensor) -> None:
        if op != "all_gather_flat":
            return
        with self.lock:
            self.alive[rank] += 1
            self.count[rank] += 1
            self.peak[rank] = max(self.peak[rank], self.alive[rank])
        weakref.finalize(out.untyped_storage(), self.freed, rank)


def run_zero3(cls: Callable, spec: Sequence[tuple[str, int, int]], world: int,
              full: torch.Tensor, xs: Sequence[Sequence[torch.Tensor]], ys: Sequence[Sequence[torch.Tensor]],
              timeout_s: float = 120.0, **kwargs: Any) -> list[dict]:
    """On `world` simulated ranks: a stage-3 ``opt = cls(sizes, comm, 3, **kwargs)`` over the layers of `spec`
    (``(kind, d_in, d_out)`` each, see `layer_fn`), ``opt.init(full)``, then per step k the same module's
    ``zero3_train_step(layers, xs[k][rank], ys[k][rank], mse, opt)``. Returns each rank's dict as `run_optimizer`'s,
    with ``losses`` and ``gathered_peak`` (the most all_gather_flat results alive at once on that rank)."""
    train_step = inspect.getmodule(cls).zero3_train_step  # type: ignore[union-attr]
    layers = [(layer_fn(kind, a, b), a * b) for kind, a, b in spec]
    sizes = [n for _, n in layers]
    gathered = _Gathered(world)

    def body(rank: int, comm: CollectiveView, log: list) -> dict:
        opt = cls(sizes, comm, 3, **kwargs)
        opt.init(full.clone())
        steps, losses = [], []
        for k in range(len(xs)):
            mark = len(log)
            loss = train_step(layers, xs[k][rank].clone(), ys[k][rank].clone(), mse, opt)
            losses.append(float(loss))
            entries = _strip(log[mark:])
            steps.append({"log": entries, "elements": sum(e["elements"] for e in entries),
                          "messages": sum(e["messages"] for e in entries)})
        return {**_report(opt, comm), "steps": steps, "losses": losses}

    run = run_ranks(body, world, timeout_s, on_output=gathered.observe)
    out = run["returns"]
    for r in range(world):
        out[r]["outside"] = run["elements_sent"][r] - sum(s["elements"] for s in out[r]["steps"])
        out[r]["gathered_peak"] = gathered.peak[r]
        out[r]["gathered_count"] = gathered.count[r]
    return out


# ---------------------------------------------------------------- real processes: torch.distributed's collectives


class TorchCollectives(ReadOnly):
    """A rank's communicator on a real torch.distributed group (the default one), with the contract's three
    collectives mapped onto torch.distributed's own: ``all_reduce`` is ``dist.all_reduce`` of a copy;
    ``reduce_scatter_flat`` pads every ``torch.tensor_split`` piece to the largest (``ceil(numel / N)``) and
    calls ``dist.reduce_scatter``; ``all_gather_flat`` pads the rank's piece the same way and calls
    ``dist.all_gather``, then drops the padding. (torch.distributed's collectives want equal pieces, which is
    why DeepSpeed and FSDP pad their flat buffers; the padding here is the driver's and is not sent by the
    ring's count.) Each returns a new tensor and never changes its input; the sums are gloo's, not the
    course ring's order. Every call is logged (op, shape, dtype) in the driver's list, out of the rank's
    reach; nothing counts elements, because gloo's algorithms are its own."""

    __slots__ = ("rank", "world_size", "all_reduce", "reduce_scatter_flat", "all_gather_flat")

    def __init__(self, rank: int, world_size: int, log: list[dict]):
        import torch.distributed as dist

        def record(op: str, x: torch.Tensor) -> None:
            log.append({"op": op, "shape": tuple(x.shape), "dtype": str(x.dtype).removeprefix("torch.")})

        def all_reduce(x: torch.Tensor) -> torch.Tensor:
            """Every rank gets the sum over ranks of x (dist.all_reduce of a copy)."""
            record("all_reduce", x)
            with torch.no_grad():
                out = x.detach().clone(memory_format=torch.contiguous_format)
                dist.all_reduce(out)
            return out

        def reduce_scatter_flat(x: torch.Tensor) -> torch.Tensor:
            """Piece `rank` of tensor_split(sum of every rank's flattened x, N) (dist.reduce_scatter, padded)."""
            record("reduce_scatter_flat", x)
            with torch.no_grad():
                flat = x.detach().reshape(-1)
                sizes = flat_sizes(flat.numel(), world_size)
                width = max(sizes)
                if width == 0:
                    return flat[:0].clone()
                padded = torch.zeros(world_size, width, dtype=flat.dtype)
                for c, piece in enumerate(flat.tensor_split(world_size)):
                    padded[c, :piece.numel()] = piece
                out = torch.empty(width, dtype=flat.dtype)
                dist.reduce_scatter(out, list(padded.unbind(0)))
            return out[:sizes[rank]].clone()

        def all_gather_flat(piece: torch.Tensor, numel: int) -> torch.Tensor:
            """The flat [numel] tensor whose tensor_split piece r is rank r's piece (dist.all_gather, padded)."""
            record("all_gather_flat", piece)
            if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
                raise TypeError(f"comm.all_gather_flat(piece, numel): numel must be a non-negative int, found {numel!r}")
            sizes = flat_sizes(numel, world_size)
            if piece.numel() != sizes[rank]:
                raise ValueError(f"comm.all_gather_flat: rank {rank}'s piece has {piece.numel()} elements; piece "
                                 f"{rank} of torch.tensor_split over {numel} elements and {world_size} ranks has "
                                 f"{sizes[rank]}")
            with torch.no_grad():
                width = max(sizes)
                if width == 0:
                    return torch.empty(0, dtype=piece.dtype)
                mine = torch.zeros(width, dtype=piece.dtype)
                mine[:piece.numel()] = piece.detach().reshape(-1)
                outs = [torch.empty(width, dtype=piece.dtype) for _ in range(world_size)]
                dist.all_gather(outs, mine)
                return torch.cat([o[:n] for o, n in zip(outs, sizes)])

        for name, value in (("rank", rank), ("world_size", world_size), ("all_reduce", all_reduce),
                            ("reduce_scatter_flat", reduce_scatter_flat), ("all_gather_flat", all_gather_flat)):
            object.__setattr__(self, name, value)


def run_distributed(cls: Callable, world: int, runs: Sequence[dict], timeout_s: float = 120.0) -> list[dict]:
    """On `world` real processes (gloo, grader.support.ring_allreduce's `run_on_processes`, as tensor_parallel's
    check), each rank's communicator a `TorchCollectives`: one result per entry of `runs`, each rank running
    them in order on the same process group. An entry is either ``{"sizes", "full", "grads", "stage",
    "kwargs"}`` (``opt.step(grads[k][rank])`` per step, as `run_optimizer`) or ``{"spec", "full", "xs", "ys",
    "kwargs"}`` (stage 3's ``zero3_train_step``, as `run_zero3`). Returns, per rank, a list of dicts: ``params``,
    ``memory_bytes``, ``held_bytes``, ``reachable_bytes``, ``steps`` (each step's log: op, shape, dtype) and,
    for a stage-3 run, ``losses``."""
    train_step: Any = getattr(inspect.getmodule(cls), "zero3_train_step", None)  # only the stage-3 runs call it
    code = getattr(cls, "__init__", None)
    filename = getattr(getattr(code, "__code__", None), "co_filename", None)

    def body(rank: int, world_size: int, device: torch.device) -> list[dict]:
        out = []
        for run in runs:
            log: list[dict] = []
            comm = TorchCollectives(rank, world_size, log)
            kw = dict(run.get("kwargs", {}))
            steps, losses = [], []
            if "spec" in run:
                layers = [(layer_fn(kind, a, b), a * b) for kind, a, b in run["spec"]]
                opt = cls([n for _, n in layers], comm, 3, **kw)
                opt.init(run["full"].clone())
                for k in range(len(run["xs"])):
                    mark = len(log)
                    losses.append(float(train_step(layers, run["xs"][k][rank].clone(), run["ys"][k][rank].clone(),
                                                   mse, opt)))
                    steps.append(log[mark:])
            else:
                opt = cls(list(run["sizes"]), comm, run["stage"], **kw)
                opt.init(run["full"].clone())
                for k in range(len(run["grads"])):
                    mark = len(log)
                    opt.step(run["grads"][k][rank].clone())
                    steps.append(log[mark:])
            rep = _report(opt, comm)
            rep["held_dtypes"] = list(rep["held_dtypes"])
            out.append({**rep, "steps": steps, "losses": losses})
        return out

    return run_on_processes(body, world, "gloo", timeout_s, filename)
