"""Drivers for the gptq exercise, run where the student's code runs (the worker, or in-process).

`count_traffic` proves the lazy batch structurally, where timing cannot: it runs the student's
`gptq_quantize` under a `TorchDispatchMode` that sees every aten operation, and adds up, over the
whole call, the elements each operation reads and writes. That total is what the lazy batch is
about (Frantar et al., 2022, section 4, "Step 2: lazy batch-updates"): updating every later column
after each column touches rows * cols^2 / 2 weights in all, however the update is cut into
operations, while the lazy batch touches rows * cols * (B + cols / B) / 2 (B = block_size): the
block's own columns after each column, and the rest once per block. Chunking an update into many
small operations does not change the sum.

What the count cannot see: work that never reaches torch's dispatcher (numpy, plain Python, a
kernel of one's own). So it also counts the tensor elements the call reads back into Python or
numpy (grader.harness.host_reads.reads_counted: `.numpy()`, `.tolist()`, `__array__`, storages ...,
watched from before the student's file was imported): work done outside torch must first read the
weights out, and the test bounds that count far below one copy of W. It runs beside the student's
code, so it is theirs to forge; the trusted static scan (grader/harness/tamper.py) fails a file that
reaches for the dispatch-mode machinery.

The same pass tallies the matrix factorisations the call runs (Cholesky, LU, inverse, solves, QR, eigen- and
singular-value decompositions: `FACTORISING` and `SOLVING`, the aten operators every torch.linalg entry point
reaches), with their arithmetic: n^3 for factoring an [n, n] matrix (whatever the method's constant), n^2 k for
a solve against k right-hand sides with a factor already made. That is GPTQ's other half (section 4, "Step 3:
Cholesky reformulation"): the inverse Hessian is factored ONCE, so its factorisations cost a few d^3 in all,
where the textbook OBQ loop re-inverts the Hessian of the remaining columns for every column (d^4 / 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from grader.harness.host_reads import reads_counted
from grader.harness.kernel_rule import storage_of
from grader.support.timing import Randn

# Operations that create, reinterpret or inspect memory without reading or writing its values.
_NO_DATA = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::detach", "aten::alias",
    "aten::lift_fresh", "aten::_unsafe_view", "aten::view", "aten::_reshape_alias",
    "aten::set_", "aten::resize_", "aten::is_nonzero",
}


# Operators that factor a matrix (n^3 for [n, n], m * n * min(m, n) for [m, n]; times the batch), each with the
# index of the matrix it factors. The public torch.linalg and torch entry points reach these (measured under a
# TorchDispatchMode, torch 2.x): linalg.cholesky(_ex), torch.cholesky, cholesky_inverse, linalg.inv(_ex),
# torch.inverse, matrix_power(-1), tensorinv, linalg.solve, pinv, lu_factor, lu, qr, eigh, eigvalsh, eig,
# eigvals, svd, svdvals, cond, ldl_factor, det, slogdet, lstsq, matrix_exp, geqrf and householder_product.
FACTORISING = {
    "aten::linalg_cholesky_ex": 0, "aten::cholesky": 0, "aten::cholesky_inverse": 0, "aten::linalg_inv_ex": 0,
    "aten::_linalg_solve_ex": 0, "aten::linalg_solve_ex": 0, "aten::linalg_solve": 0, "aten::linalg_pinv": 0,
    "aten::linalg_lu_factor_ex": 0, "aten::linalg_lu": 0, "aten::_lu_with_info": 0, "aten::linalg_qr": 0,
    "aten::_linalg_eigh": 0, "aten::linalg_eig": 0, "aten::_linalg_eigvals": 0, "aten::_linalg_svd": 0,
    "aten::linalg_ldl_factor_ex": 0, "aten::_linalg_det": 0, "aten::_linalg_slogdet": 0, "aten::linalg_lstsq": 0,
    "aten::linalg_matrix_exp": 0, "aten::geqrf": 0, "aten::linalg_householder_product": 0, "aten::ormqr": 0,
}
# Operators that solve with a factor already made: n^2 k, (index of the [n, n] factor, index of the right-hand
# sides [n, k]).
SOLVING = {
    "aten::linalg_solve_triangular": (0, 1), "aten::triangular_solve": (1, 0), "aten::cholesky_solve": (1, 0),
    "aten::_cholesky_solve_helper": (1, 0), "aten::linalg_lu_solve": (0, 2), "aten::lu_solve": (1, 0),
    "aten::linalg_ldl_solve": (0, 2),
}


def _matrix(value: Any) -> tuple[int, int, int] | None:
    """(batch, rows, cols) of a matrix argument, or None."""
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return None
    return math.prod(value.shape[:-2]), value.shape[-2], value.shape[-1]


def factorisation_flops(name: str, args: tuple, kwargs: dict) -> tuple[int, int] | None:
    """(arithmetic, n) of one factorising or solving operator (n: the size of the matrix it works on), or None
    for any other operator."""
    if name in FACTORISING:
        shape = _matrix(args[FACTORISING[name]] if args else None)
        if shape is None:
            return None
        batch, m, n = shape
        return batch * m * n * min(m, n), max(m, n)
    if name in SOLVING:
        a, b = SOLVING[name]
        factor = _matrix(args[a] if a < len(args) else None)
        rhs = args[b] if b < len(args) else None
        if factor is None or not isinstance(rhs, torch.Tensor):
            return None
        batch, n, _ = factor
        k = rhs.shape[-1] if rhs.dim() >= 2 else 1
        return batch * n * n * k, n
    return None


def distinct_elements(t: torch.Tensor) -> int:
    """The elements of memory a tensor covers, at most: its numel without the dimensions of stride 0
    (an expanded view reads one row, not the expanded matrix)."""
    if t.numel() == 0:
        return 0
    return math.prod(size for size, stride in zip(t.shape, t.stride()) if stride != 0)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):  # Tensor[] arguments (the _foreach_ family), Tensor?[] indices
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


_ARGUMENTS: dict[Any, tuple | None] = {}


def _arguments_of(func) -> tuple | None:
    """None for an operation that moves no data; else (index, name, written) for each argument."""
    if func not in _ARGUMENTS:
        schema = func._schema
        if getattr(func, "is_view", False) or schema.name in _NO_DATA:
            _ARGUMENTS[func] = None
        else:
            _ARGUMENTS[func] = tuple(
                (i, a.name, a.alias_info is not None and a.alias_info.is_write) for i, a in enumerate(schema.arguments)
            )
    return _ARGUMENTS[func]


class TrafficCounter(TorchDispatchMode):
    """Adds up the elements every aten operation reads (its tensor arguments that it does not write)
    and writes (the arguments it mutates or fills through out=, and its fresh outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.read = 0
        self.written = 0
        self.ops: dict[str, list[int]] = {}  # aten name -> [elements read, elements written]
        self.factor_flops = 0  # the arithmetic of the factorisations and solves (FACTORISING, SOLVING)
        self.factorisations: dict[str, list[int]] = {}  # aten name -> [calls, arithmetic, largest n]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        work = factorisation_flops(func._schema.name, args, kwargs)
        if work is not None:
            self.factor_flops += work[0]
            tally = self.factorisations.setdefault(func._schema.name.removeprefix("aten::"), [0, 0, 0])
            tally[0] += 1
            tally[1] += work[0]
            tally[2] = max(tally[2], work[1])
        arguments = _arguments_of(func)
        if arguments is None:
            return out
        read = written = 0
        targets: list[torch.Tensor] = []
        for index, name, writes in arguments:
            tensors = _tensors(args[index] if index < len(args) else kwargs.get(name))
            if writes:
                targets += tensors
            else:
                read += sum(distinct_elements(t) for t in tensors)
        written += sum(distinct_elements(t) for t in targets)
        # kernel_rule.storage_of reads the address through torch's own base class: Tensor.untyped_storage is watched
        # as a read-back during the call (count_traffic counts those), and this is the counter's code, not the call's.
        storages = {storage_of(t) for t in targets if t.numel()}
        for t in tree_flatten(out)[0]:  # fresh outputs (an in-place operation returns its target)
            if isinstance(t, torch.Tensor) and t.numel() and storage_of(t) not in storages:
                written += distinct_elements(t)
        self.read += read
        self.written += written
        tally = self.ops.setdefault(func.overloadpacket.__name__, [0, 0])
        tally[0] += read
        tally[1] += written
        return out


def count_traffic(fn: Callable, W: torch.Tensor, H: torch.Tensor, **kwargs: Any) -> dict:
    """Run ``fn(W, H, **kwargs)`` and add up the elements its operations read and wrote.

    Returns {"result": fn's return value, "read": elements read, "written": elements written,
    "ops": {aten name: [read, written]}, "host_reads": tensor elements read back into Python or numpy,
    "factor_flops": the arithmetic of its factorisations and solves, "factorisations": {aten name: [calls,
    arithmetic, largest n]}}.
    """
    counter = TrafficCounter()
    with reads_counted() as host, counter:
        result = fn(W, H, **kwargs)
    return {"result": tuple(result) if isinstance(result, tuple) else result, "read": counter.read,
            "written": counter.written, "ops": {name: list(v) for name, v in counter.ops.items()},
            "host_reads": host.reads, "factor_flops": counter.factor_flops,
            "factorisations": {name: list(v) for name, v in counter.factorisations.items()}}


# --------------------------------------------------------------------------------------------------
# Timing on CUDA: the Hessian is a recipe (grader.support.timing), built where it is used from its
# seed, so the worker and the grader hold the same H without hundreds of megabytes crossing over.


def calibration_hessian(cols: int, device: str = "cuda", seed: int = 0) -> torch.Tensor:
    """H = 2 X^T X / n for 2 * cols calibration rows whose features are mixed (correlated)."""
    g = torch.Generator(device=device).manual_seed(seed)
    mix = torch.randn(cols, cols, device=device, generator=g) / cols**0.5 + torch.eye(cols, device=device)
    X = torch.randn(2 * cols, cols, device=device, generator=g) @ mix
    return 2 * X.T @ X / X.shape[0]


@dataclass(frozen=True)
class Hessian(Randn):
    """The recipe of `calibration_hessian(cols, device, seed)` for a timed loop, with shape (cols, cols):
    made once per loop (not per rep) and shared by the reps, in the worker and again in the grader."""

    seed: int = 0
    fresh: ClassVar[bool] = False

    def make(self, device: str, generator: torch.Generator) -> torch.Tensor:
        cols = self.shape[0]
        if tuple(self.shape) != (cols, cols):
            raise ValueError(f"a Hessian is square, found shape {tuple(self.shape)}")
        return calibration_hessian(cols, device, self.seed)
