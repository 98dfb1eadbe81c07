"""Hidden checks for ring all-reduce.

Oracles, all written out here: chunk bounds from the formula (first n % N chunks one longer), the
exact sum over ranks in int64, and the ring-order sum in the tensor's dtype, chunk by chunk:
chunk c is ((x_c + x_(c+1)) + x_(c+2)) + ... + x_(c-1), ranks mod N. The communication volume is
read from the course's simulated ring, which counts every message each rank sends.
"""

from __future__ import annotations

import pytest
import torch

from grader.support.ring_allreduce import forbidden_collectives
from grader.testing import is_close

SIMULATED = "grader.support.ring_allreduce:run_simulated"
DISTRIBUTED = "grader.support.ring_allreduce:run_distributed_cases"
WORLDS = [1, 2, 3, 4, 5, 8]
BIG = 2**20 + 3


@pytest.fixture(scope="module")
def ra(student):
    return student.load(
        "ring_allreduce",
        forbid=forbidden_collectives(),
        forbid_why="build the all-reduce from comm.send_recv",
    )


# --------------------------------------------------------------------------------------------------
# Oracles


def sizes_of(n: int, world: int) -> list[int]:
    return [n // world + (1 if c < n % world else 0) for c in range(world)]


def bounds(n: int, world: int, c: int) -> tuple[int, int]:
    sizes = sizes_of(n, world)
    start = sum(sizes[:c])
    return start, start + sizes[c]


def lengths(world: int) -> list[int]:
    """The n values to try for a world size: empty, one element, fewer than N, uneven, large-ish."""
    return sorted({0, 1, max(world - 1, 0), world + 1, 1009})


def exact_sum(xs: list[torch.Tensor]) -> torch.Tensor:
    """The sum over ranks of the flat tensors, exact (int64 for integer data, float64 otherwise)."""
    wide = torch.int64 if not xs[0].dtype.is_floating_point else torch.float64
    total = torch.zeros(xs[0].numel(), dtype=wide)
    for x in xs:
        total += x.reshape(-1).to(wide)
    return total


def ring_order_sum(xs: list[torch.Tensor], chunks: list[int] | None = None) -> torch.Tensor:
    """Chunk c summed in ring order, starting at rank c, in the tensors' own dtype (flat)."""
    world, flats = len(xs), [x.reshape(-1) for x in xs]
    n = flats[0].numel()
    out = torch.zeros_like(flats[0])
    for c in chunks if chunks is not None else range(world):
        lo, hi = bounds(n, world, c)
        acc = flats[c][lo:hi].clone()
        for hop in range(1, world):
            acc = acc + flats[(c + hop) % world][lo:hi]
        out[lo:hi] = acc
    return out


def int_inputs(world: int, n: int, dtype: torch.dtype, offset: int, shape=None) -> list[torch.Tensor]:
    """x_r[k] = r * n + k + offset: each value says which rank and position it came from."""
    shape = shape or (n,)
    return [(torch.arange(n, dtype=torch.int64) + r * n + offset).to(dtype).reshape(shape) for r in range(world)]


def rand_inputs(world: int, n: int, dtype: torch.dtype, rng: torch.Generator) -> list[torch.Tensor]:
    """Values of mixed magnitudes, so that the order of additions shows in the last bits."""
    xs = []
    for _ in range(world):
        x = torch.randn(n, generator=rng, dtype=torch.float64) * torch.exp2(torch.randint(-8, 9, (n,), generator=rng))
        xs.append(x.to(dtype))
    return xs


def chunk_of(k: int, n: int, world: int) -> int:
    return next(c for c in range(world) if bounds(n, world, c)[0] <= k < bounds(n, world, c)[1])


def explain_int(xs: list[torch.Tensor], got: torch.Tensor, want: torch.Tensor, rank: int, label: str) -> str:
    """Name the first wrong position and, when it can, the rank whose contribution went missing."""
    world, n = len(xs), want.numel()
    got = got.reshape(-1).to(torch.int64)
    bad = (got != want).nonzero().flatten()
    k = int(bad[0])
    diff = int(got[k]) - int(want[k])
    values = [int(x.reshape(-1)[k]) for x in xs]
    why = ""
    if int(got[k]) == values[rank]:
        why = "it still holds this rank's own input: is the result written into the caller's tensor?"
    elif -diff in values:
        why = f"the difference is rank {values.index(-diff)}'s value there: its contribution is missing"
    elif diff in values:
        why = f"the difference is rank {values.index(diff)}'s value there: it was added twice"
    return (
        f"{label}: rank {rank}, position {k} of {n} (chunk {chunk_of(k, n, world)}): found {int(got[k])}, "
        f"expected {int(want[k])}; {len(bad)} positions wrong. {why}"
    )


def explain_float(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor, rank: int, label: str, n: int,
                  world: int) -> str:
    got, want = got.reshape(-1), want.reshape(-1)
    bad = (got != want).nonzero().flatten()
    k = int(bad[0])
    scale = exact.abs().max().item() or 1.0
    hint = (
        "The result is close to the true sum but not bit-identical to the ring order: accumulate in the "
        "tensor's own dtype (no float32/float64 accumulator), one hop at a time, chunk c starting at rank c."
        if is_close(got, exact.reshape(-1), atol=0.05 * scale) else
        "The result is far from the sum: check the chunk indices and the peers."
    )
    return (
        f"{label}: rank {rank}, position {k} (chunk {chunk_of(k, n, world)}): found {float(got[k])!r}, the ring "
        f"order gives {float(want[k])!r}; {len(bad)} of {n} positions differ. {hint}"
    )


def run_ring(student, fn, xs, **kwargs):
    return student.drive(SIMULATED, fn, [x.clone() for x in xs], **kwargs)


# --------------------------------------------------------------------------------------------------
# reduce_scatter: the returned index and the one chunk it promises


@pytest.mark.check("reduce_scatter")
@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter(student, ra, rng, world):
    for n in lengths(world):
        for dtype in (torch.float32, torch.int64):
            xs = rand_inputs(world, n, dtype, rng) if dtype.is_floating_point else int_inputs(world, n, dtype, 7)
            run = run_ring(student, ra.ring_reduce_scatter, xs)
            label = f"ring_reduce_scatter, N={world}, n={n}, {dtype}"
            for r in range(world):
                owned = run["returns"][r]
                assert owned == (r + 1) % world, (
                    f"{label}: rank {r} returned {owned!r}, expected {(r + 1) % world} (the chunk it holds complete)"
                )
                lo, hi = bounds(n, world, owned)
                want = ring_order_sum(xs, [owned])[lo:hi]
                got = run["outputs"][r].reshape(-1)[lo:hi]
                if dtype == torch.int64:
                    assert torch.equal(got, want), (
                        f"{label}: rank {r}, chunk {owned} ([{lo}:{hi}]) is not the sum over ranks "
                        f"(first values {got[:4].tolist()} vs {want[:4].tolist()})"
                    )
                else:
                    assert torch.equal(got, want), explain_float(
                        got, want, exact_sum(xs)[lo:hi], r, label + f", chunk {owned}", hi - lo, world)


@pytest.mark.check("reduce_scatter")
def test_reduce_scatter_keeps_the_dtype_and_shape(student, ra, rng):
    xs = [x.reshape(5, 7, 3) for x in rand_inputs(3, 105, torch.bfloat16, rng)]
    run = run_ring(student, ra.ring_reduce_scatter, xs)
    for r, out in enumerate(run["outputs"]):
        assert out.dtype == torch.bfloat16 and out.shape == (5, 7, 3), (
            f"rank {r}: the tensor came back {out.dtype} {tuple(out.shape)}, expected bfloat16 (5, 7, 3)"
        )
        owned = (r + 1) % 3
        lo, hi = bounds(105, 3, owned)
        want = ring_order_sum(xs, [owned])[lo:hi]
        assert torch.equal(out.reshape(-1)[lo:hi], want), explain_float(
            out.reshape(-1)[lo:hi], want, exact_sum(xs)[lo:hi], r, "ring_reduce_scatter, bfloat16 [5, 7, 3]",
            hi - lo, 3)


# --------------------------------------------------------------------------------------------------
# all_gather: overwrite, any offset


@pytest.mark.check("all_gather")
@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_all_gather(student, ra, rng, world):
    for n in lengths(world):
        shift = int(torch.randint(0, world, (1,), generator=rng))
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            final = (torch.randint(-1000, 1000, (n,), generator=rng)).to(dtype)
            xs = []
            for r in range(world):
                x = torch.randint(1, 50, (n,), generator=rng).to(dtype)  # stale, never zero
                lo, hi = bounds(n, world, (r + shift) % world)
                x[lo:hi] = final[lo:hi]
                xs.append(x)
            owned = [((r + shift) % world,) for r in range(world)]
            run = run_ring(student, ra.ring_all_gather, xs, rank_args=owned)
            for r in range(world):
                got = run["outputs"][r]
                if not torch.equal(got, final):
                    k = int((got != final).nonzero()[0])
                    stale = float(got[k]) == float(final[k]) + float(xs[r][k])
                    pytest.fail(
                        f"ring_all_gather, N={world}, n={n}, {dtype}, owned = (rank + {shift}) % N: rank {r}, "
                        f"position {k} (chunk {chunk_of(k, n, world)}) holds {float(got[k])}, expected "
                        f"{float(final[k])}. "
                        + ("That is the final value plus the stale one: overwrite, never add. " if stale else "")
                        + "At step s send chunk (owned - s) % N, receive chunk (owned - s - 1) % N."
                    )


# --------------------------------------------------------------------------------------------------
# allreduce: exact sums


@pytest.mark.check("allreduce")
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=["int64", "float64"])
@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_exact(student, ra, seed, world, dtype):
    for n in lengths(world):
        xs = int_inputs(world, n, dtype, offset=seed % 1000)
        want = exact_sum(xs)
        run = run_ring(student, ra.ring_allreduce, xs)
        for r in range(world):
            got = run["outputs"][r]
            assert got.dtype == dtype, f"N={world}, n={n}: rank {r}'s tensor became {got.dtype}; keep {dtype}"
            if not torch.equal(got.reshape(-1).to(want.dtype), want):
                pytest.fail(explain_int(xs, got, want.to(torch.int64), r, f"ring_allreduce, N={world}, n={n}, {dtype}"))


def transposed_int_inputs(world: int, rows: int, cols: int, dtype: torch.dtype, offset: int) -> list[torch.Tensor]:
    """x_r[k] = r * n + k + offset in logical row-major order, stored as the transpose of a [cols, rows]
    buffer: shape [rows, cols], strides (1, rows), so the memory order is not the order to chunk in."""
    xs = []
    for x in int_inputs(world, rows * cols, dtype, offset, shape=(rows, cols)):
        stored = x.t().contiguous().t()  # same values, column-major memory
        assert rows < 2 or cols < 2 or not stored.is_contiguous()
        xs.append(stored)
    return xs


def transposed_shapes(world: int) -> list[tuple[int, int]]:
    """[rows, cols] for the transposed inputs: empty, fewer elements than ranks, uneven, large-ish."""
    return [(0, 3), (2, 3), (world + 1, 2), (29, 37)]


@pytest.mark.check("allreduce")
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=["int64", "float64"])
@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_exact_transposed(student, ra, seed, world, dtype):
    for rows, cols in transposed_shapes(world):
        xs = transposed_int_inputs(world, rows, cols, dtype, offset=seed % 1000)
        want = exact_sum(xs)  # flat, in row-major order
        run = student.drive(SIMULATED, ra.ring_allreduce, xs)  # the very tensors, strides and all
        label = f"ring_allreduce, N={world}, transposed {dtype} [{rows}, {cols}] (strides (1, {rows}))"
        for r in range(world):
            got = run["outputs"][r]
            assert got.dtype == dtype and got.shape == (rows, cols), (
                f"{label}: rank {r} came back {got.dtype} {tuple(got.shape)}; keep the caller's dtype and shape"
            )
            if not torch.equal(got.reshape(-1).to(want.dtype), want):
                pytest.fail(
                    explain_int(xs, got, want.to(torch.int64), r, label)
                    + " A transposed tensor is chunked in its logical row-major order (tensor.reshape(-1), a "
                    "copy), and the result is copied back into the caller's tensor."
                )


@pytest.mark.check("allreduce")
@pytest.mark.parametrize(
    "world, dtype, transposed",
    [(3, torch.int64, False), (8, torch.int64, False), (8, torch.float64, False), (3, torch.float64, True)],
    ids=["3-int64", "8-int64", "8-float64", "3-float64-transposed"],
)
def test_allreduce_large(student, ra, seed, world, dtype, transposed):
    if transposed:  # 2^20 + 3 = 7 * 149797
        xs = transposed_int_inputs(world, 7, BIG // 7, dtype, offset=seed % 1000)
    else:
        xs = int_inputs(world, BIG, dtype, offset=seed % 1000)
    want = exact_sum(xs)
    label = f"ring_allreduce, N={world}, n=2^20+3, {dtype}" + (", transposed [7, 149797]" if transposed else "")
    run = student.drive(SIMULATED, ra.ring_allreduce, xs)
    for r in range(world):
        got = run["outputs"][r]
        assert got.dtype == dtype, f"{label}: rank {r}'s tensor became {got.dtype}; keep {dtype}"
        if not torch.equal(got.reshape(-1).to(want.dtype), want):
            pytest.fail(explain_int(xs, got, want.to(torch.int64), r, label))


# --------------------------------------------------------------------------------------------------
# float_order: bit for bit in the ring order


@pytest.mark.check("float_order")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_ring_order(student, ra, rng, world, dtype):
    for n in lengths(world):
        xs = rand_inputs(world, n, dtype, rng)
        want = ring_order_sum(xs)
        run = run_ring(student, ra.ring_allreduce, xs)
        for r in range(world):
            got = run["outputs"][r]
            assert got.dtype == dtype, f"N={world}: rank {r}'s tensor became {got.dtype}; keep {dtype}"
            assert torch.equal(got, want), explain_float(
                got, want, exact_sum(xs), r, f"N={world}, n={n}, {dtype}", n, world)


@pytest.mark.check("float_order")
@pytest.mark.parametrize("world, dtype", [(4, torch.float32), (3, torch.bfloat16)], ids=["4-float32", "3-bfloat16"])
def test_ring_order_large(student, ra, rng, world, dtype):
    xs = rand_inputs(world, BIG, dtype, rng)
    want = ring_order_sum(xs)
    run = run_ring(student, ra.ring_allreduce, xs)
    for r in range(world):
        got = run["outputs"][r]
        assert got.dtype == dtype, f"N={world}, n=2^20+3: rank {r}'s tensor became {got.dtype}; keep {dtype}"
        assert torch.equal(got, want), explain_float(
            got, want, exact_sum(xs), r, f"N={world}, n=2^20+3, {dtype}", BIG, world)


# --------------------------------------------------------------------------------------------------
# layouts: any shape and layout, in place; N = 1


def _check_layout(student, ra, xs: list[torch.Tensor], label: str) -> None:
    flat_xs = [x.reshape(-1) for x in xs]
    if xs[0].dtype.is_floating_point and xs[0].dtype != torch.float64:
        want = ring_order_sum(flat_xs).reshape(xs[0].shape)
    else:
        want = exact_sum(flat_xs).to(xs[0].dtype).reshape(xs[0].shape)
    run = student.drive(SIMULATED, ra.ring_allreduce, xs)  # the very tensors, strides and all
    for r in range(len(xs)):
        got = run["outputs"][r]
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"{label}: rank {r} came back {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}"
        )
        if not torch.equal(got, want):
            pytest.fail(
                f"{label}: rank {r}'s tensor does not hold the sum in row-major order "
                f"(first row found {got.reshape(-1)[:5].tolist()}, expected {want.reshape(-1)[:5].tolist()}). "
                "Chunk the tensor as tensor.reshape(-1) sees it; a non-contiguous tensor has no flat view, so "
                "reshape returns a copy: copy the result back into the caller's tensor."
            )


@pytest.mark.check("layouts")
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32], ids=["int64", "float32"])
@pytest.mark.parametrize("world", [2, 3, 5])
def test_transposed(student, ra, rng, world, dtype):
    bases = [torch.randint(-500, 500, (29, 37), generator=rng).to(dtype) for _ in range(world)]
    xs = [b.t() for b in bases]  # [37, 29], strides (1, 37)
    originals = [x.clone() for x in xs]
    if dtype == torch.int64:
        want = exact_sum(originals).to(dtype).reshape(37, 29)
    else:
        want = ring_order_sum(originals).reshape(37, 29)
    run = student.drive(SIMULATED, ra.ring_allreduce, xs)
    for r in range(world):
        got = run["outputs"][r]
        if torch.equal(got, want):
            continue
        if torch.equal(got, originals[r]):
            pytest.fail(
                f"N={world}, transposed {dtype} [37, 29]: rank {r}'s tensor is unchanged. tensor.reshape(-1) of a "
                "transpose is a copy; write the result back with tensor.copy_(...)"
            )
        pytest.fail(
            f"N={world}, transposed {dtype} [37, 29]: rank {r}'s result differs from the sum at "
            f"{int((got != want).sum())} positions. Chunk in logical row-major order (tensor.reshape(-1)), "
            "not in memory order."
        )


@pytest.mark.check("layouts")
def test_shapes(student, ra, rng):
    world = 4
    cases = {
        "a permuted 3-D float32 tensor [3, 4, 5]": [
            torch.randn(5, 3, 4, generator=rng).permute(1, 2, 0) for _ in range(world)],
        "a 0-d int64 tensor": [torch.tensor(7 * r + 1) for r in range(world)],
        "an empty float32 tensor [0, 3]": [torch.empty(0, 3) for _ in range(world)],
        "a sliced int64 row view x[::2]": [torch.arange(40)[::2] * (r + 1) for r in range(world)],
        "a contiguous int64 [6, 7] matrix": [torch.arange(42).reshape(6, 7) * (r - 1) for r in range(world)],
    }
    for label, xs in cases.items():
        _check_layout(student, ra, xs, f"N={world}, {label}")


@pytest.mark.check("layouts")
def test_world_size_one_is_a_no_op(student, ra, rng):
    x = torch.randn(11, generator=rng)
    run = student.drive(SIMULATED, ra.ring_allreduce, [x.clone()])
    assert torch.equal(run["outputs"][0], x), "with one rank, the sum over ranks is the tensor itself: leave it alone"
    assert run["messages_sent"] == [0], (
        f"with one rank, ring_allreduce sent {run['messages_sent'][0]} messages; there is nobody to talk to"
    )


@pytest.mark.check("layouts")
def test_writes_into_the_callers_tensor(student, ra, rng):
    xs = [torch.randint(-9, 9, (4, 6), generator=rng) for _ in range(3)]
    want = exact_sum(xs).reshape(4, 6)
    run = student.drive(SIMULATED, ra.ring_allreduce, [x.clone() for x in xs])
    for r in range(3):
        ret = run["returns"][r]
        assert ret is None or isinstance(ret, torch.Tensor), f"rank {r} returned {type(ret).__name__}; return None"
        got = run["outputs"][r]
        if torch.equal(got, xs[r]) and isinstance(ret, torch.Tensor):
            pytest.fail(f"rank {r} returned the result but left its input unchanged: ring_allreduce works in place")
        assert torch.equal(got, want), f"rank {r}: the caller's tensor does not hold the sum"


# --------------------------------------------------------------------------------------------------
# volume: what each rank sends, counted by the simulated ring


def _volume_message(label: str, r: int, run: dict, want_msgs: int, want_elems: int, sizes: list[int]) -> str | None:
    msgs, elems = run["messages_sent"][r], run["elements_sent"][r]
    if msgs != want_msgs:
        return (
            f"{label}: rank {r} sent {msgs} messages, expected {want_msgs} (one per step, even when a chunk is empty). "
            f"Message sizes: {run['message_sizes'][r][:12]}"
        )
    if elems != want_elems:
        biggest = max(run["message_sizes"][r], default=0)
        why = (
            f"one message held {biggest} elements, more than the largest chunk ({max(sizes)}): "
            "a ring step passes one chunk, not the whole buffer"
            if biggest > max(sizes) else
            f"the chunk sizes must follow torch.tensor_split: {sizes}"
        )
        return f"{label}: rank {r} sent {elems} elements, the optimum is {want_elems}; {why}"
    return None


@pytest.mark.check("volume")
@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_allreduce_volume(student, ra, world):
    for n in sorted({0, 1, world - 1, world + 1, 1009, 4099}):
        run = run_ring(student, ra.ring_allreduce, int_inputs(world, n, torch.int64, 1))
        sizes = sizes_of(n, world)
        for r in range(world):
            want = 2 * n - sizes[(r + 1) % world] - sizes[(r + 2) % world]
            problem = _volume_message(f"ring_allreduce, N={world}, n={n}", r, run, 2 * (world - 1), want, sizes)
            assert problem is None, problem
            expected_sizes = [sizes[(r - s) % world] for s in range(world - 1)] + [
                sizes[(r + 1 - s) % world] for s in range(world - 1)]
            assert run["message_sizes"][r] == expected_sizes, (
                f"ring_allreduce, N={world}, n={n}: rank {r} sent messages of {run['message_sizes'][r]} elements, "
                f"expected {expected_sizes} (chunk (r - s) % N, then chunk (r + 1 - s) % N)"
            )


@pytest.mark.check("volume")
@pytest.mark.parametrize("world", [3, 5, 8])
def test_phase_volume(student, ra, world):
    n = 2 * world + 3
    sizes = sizes_of(n, world)
    run = run_ring(student, ra.ring_reduce_scatter, int_inputs(world, n, torch.int64, 1))
    for r in range(world):
        problem = _volume_message(f"ring_reduce_scatter, N={world}, n={n}", r, run, world - 1,
                                  n - sizes[(r + 1) % world], sizes)
        assert problem is None, problem
    shift = 2
    owned = [((r + shift) % world,) for r in range(world)]
    run = run_ring(student, ra.ring_all_gather, int_inputs(world, n, torch.int64, 1), rank_args=owned)
    for r in range(world):
        problem = _volume_message(f"ring_all_gather, N={world}, n={n}, owned=(rank+2)%N", r, run, world - 1,
                                  n - sizes[(r + shift + 1) % world], sizes)
        assert problem is None, problem


# --------------------------------------------------------------------------------------------------
# distributed: real processes over gloo


@pytest.mark.check("distributed")
@pytest.mark.parametrize("world", [2, 3, 4])
def test_real_processes(student, ra, rng, world):
    cases = {
        "float32, n=1009 (ring order)": rand_inputs(world, 1009, torch.float32, rng),
        "int64 transposed [7, 5]": [torch.randint(-99, 99, (5, 7), generator=rng).t() for _ in range(world)],
        f"bfloat16, n={world + 1} (ring order)": rand_inputs(world, world + 1, torch.bfloat16, rng),
        "float64, n=1 (empty chunks)": [torch.tensor([float(r + 1)], dtype=torch.float64) for r in range(world)],
        "float32, n=0": [torch.empty(0) for _ in range(world)],
    }
    if world == 4:
        cases["float32, n=2^20+3 (ring order)"] = rand_inputs(world, BIG, torch.float32, rng)
    labels, inputs = list(cases), list(cases.values())
    runs = student.drive(DISTRIBUTED, ra.ring_allreduce, inputs)
    assert len(runs) == len(inputs), f"expected {len(inputs)} results, found {len(runs)}"
    for label, xs, run in zip(labels, inputs, runs):
        if xs[0].dtype in (torch.float32, torch.bfloat16):
            want = ring_order_sum(xs).reshape(xs[0].shape)
        else:
            want = exact_sum(xs).to(xs[0].dtype).reshape(xs[0].shape)
        for r in range(world):
            got = run["outputs"][r]
            assert got.dtype == want.dtype and got.shape == want.shape, (
                f"{world} gloo processes, {label}: rank {r} came back {got.dtype} {tuple(got.shape)}"
            )
            assert torch.equal(got, want), (
                f"{world} gloo processes, {label}: rank {r} does not hold the expected sum "
                f"({int((got != want).sum())} positions differ). Run the same input on run_simulated, "
                "which counts and names every message."
            )
            assert run["messages_sent"][r] == 2 * (world - 1), (
                f"{world} gloo processes, {label}: rank {r} sent {run['messages_sent'][r]} messages, "
                f"expected {2 * (world - 1)}"
            )
