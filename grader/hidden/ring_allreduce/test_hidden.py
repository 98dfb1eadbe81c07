"""Hidden checks for ring all-reduce.

Oracles, all written out for the tests (oracle.py): chunk bounds from the formula (first n % N chunks
one longer), the exact sum over ranks in int64, and the ring-order sum in the tensor's dtype, chunk by
chunk: chunk c is ((x_c + x_(c+1)) + x_(c+2)) + ... + x_(c-1), ranks mod N. The communication volume is
read from the course's simulated ring, which counts every message each rank sends.

Every run that sends a message is traced, and every message is checked: the contract says what each
holds (rank r's partial sum of chunk (r - s) % N at reduce-scatter step s, in the ring order and the
tensor's dtype; a finished chunk in the all-gather), so it must equal the oracle's, bit for bit, for
float and integer inputs alike, on the simulated ring and on real processes. The ranks share a process
(threads) or a machine (forked processes), so a module-level variable or a file can carry data between
them, and nothing here stops that; what it proves is that comm.send_recv carried exactly the ring's
messages. A submission that moves data some other way and sends dummies of the right sizes fails, in
every check that sends a message; one that computes the ring's messages from data it got another way
sends what the ring sends, which is the ring. The trace is recorded by the course's communicator from
the very copy it delivers, and the ranks see only rank, world_size and send_recv (RankView), so the
trace is not theirs to rewrite without the introspection that the trusted scan fails. Small runs keep a
copy of every message (a failure names the first that left the ring and what it holds instead); large
ones and real processes keep a digest of each (grader.support.ring_allreduce.message_digest).

The signature (issue 36): the ring's messages. Each rank sends 2(N - 1) messages of one chunk (about n/N elements),
to its right neighbour, in the order the contract gives, each the ring's partial sum (reduce-scatter) or a finished
chunk (all-gather). The textbook all-reduce computes the same numbers from whole tensors: an all-gather of full
tensors and a local sum, a root that sums and broadcasts, or a direct exchange between every pair of ranks. Summed in
the ring order, each gives the contract's results bit for bit (tests/test_ring_allreduce_contract.py), so the
results alone cannot tell it from the ring; the counted trace can. The checks that see it: `volume` and
`volume_public` (counts and sizes of the messages, per rank and phase, then the trace), and the trace check inside
every other test that runs ring_allreduce (allreduce, float_order, layouts, distributed, allreduce_public). The
bit-exact ring order (`float_order`) is the ring's arithmetic, not its signature: a rank that holds every input can
sum in that order too; a sum in rank order (known-wrong gather_broadcast) fails it as well.

Contract clauses (README "The contract") and the tests that draw them. "every run" = every test below that sends
a message, through assert_ring_messages / trace_divergence; "generated" = the test_generated_* of each function.

| clause | drawn by |
| --- | --- |
| comm: rank, world_size, send_recv and nothing else (RankView) | every run; tests/test_ring_comm.py |
| send_recv: a mismatch (dtype, length), a deadlock, an out-of-range or own rank, overlapping buffers, a lost message raise CommError (the course's errors, not the student's) | tests/test_ring_comm.py, tests/test_ring_allreduce_contract.py; on the student's side: known-wrong negative_modulo, skips_empty_chunks |
| flat = the row-major order of tensor.reshape(-1) | test_transposed, test_shapes, test_allreduce_exact_transposed, test_*_any_layout, generated (6 layouts) |
| chunks as torch.tensor_split: first n % N one longer, empty when n < N | lengths() 0, 1, N - 1, N + 1, 1009 in test_reduce_scatter, test_allreduce_exact, test_ring_order; message sizes in order in test_allreduce_volume; generated length classes; known-wrong torch_chunk, remainder_in_last_chunk |
| ring_reduce_scatter: step s sends chunk (r - s) % N right, adds chunk (r - s - 1) % N from the left | every run of it: test_reduce_scatter, test_reduce_scatter_keeps_the_dtype_and_shape, test_reduce_scatter_any_layout, test_phase_volume, generated; known-wrong wrong_recv_chunk, step_sign, reversed_ring |
| ring_reduce_scatter returns (rank + 1) % N; that chunk complete, the others unspecified (not compared) | test_reduce_scatter, test_reduce_scatter_any_layout, generated, rs_public |
| ring_all_gather: step s sends chunk (owned - s) % N, overwrites chunk (owned - s - 1) % N | test_all_gather (stale values never zero), test_all_gather_any_layout, test_phase_volume, generated; known-wrong all_gather_adds |
| owned = (rank + k) % N for any k shared by all ranks | test_all_gather, test_all_gather_any_layout, generated (k at random), test_phase_volume (k = 2), ag_public (k = 0, 1) |
| ring_all_gather returns None | check_all_gather_case: test_all_gather_any_layout, generated (since issue 36); known-wrong returns_the_tensor |
| ring_allreduce: in place, the sum over ranks; a reduce-scatter then an all-gather on one flat buffer | test_allreduce_*, test_ring_order*, every run's trace |
| ring_allreduce returns None | test_writes_into_the_callers_tensor (a returned tensor passed before issue 36); known-wrong returns_the_tensor |
| in place, any layout: a non-contiguous tensor chunked in row-major order and copied back, for all three functions | ring_allreduce: test_transposed, test_shapes, test_allreduce_exact_transposed, generated; the phases: test_reduce_scatter_any_layout, test_all_gather_any_layout (every layout, every grade, since issue 36), generated; known-wrong no_copy_back, phases_skip_copy_back |
| any shape: 0-d, n = 0 | test_shapes (0-d, [0, 3]), lengths() 0, test_*_any_layout (0-d), generated; distributed n = 0 |
| dtypes float32, float64, bfloat16, int64, kept | test_allreduce_exact (int64, float64), test_ring_order (float32, bfloat16), test_reduce_scatter (float32, int64), test_reduce_scatter_keeps_the_dtype_and_shape (bfloat16), test_all_gather (float32, bfloat16, int64), generated (all four, each function; assert_kept_dtype_and_shape) |
| sums in ring order in the tensor's dtype: float32 and bfloat16 bit for bit | test_ring_order, test_ring_order_large, generated ring order, test_reduce_scatter (float32 owned chunk), distributed; every message's dtype; known-wrong float32_accumulator |
| int64 and integer-valued float64: the exact sum | test_allreduce_exact, _transposed, _large, generated (values that decode to ranks and position) |
| one message per step, even empty; N - 1 per phase; 2n - len(chunk (r+1)%N) - len(chunk (r+2)%N) elements; N = 1 sends none | test_allreduce_volume, test_phase_volume, test_world_size_one_is_a_no_op, volume_public, every run's trace (too few or too many exchanges); known-wrong skips_empty_chunks, whole_buffer_ring, gather_broadcast, textbook_* |
| no library collectives | the `ra` fixture (forbid=forbidden_collectives()) in every test; known-wrong calls_all_reduce |
| comm.send_recv the only channel; every message the ring's | every run, simulated and real (digests); known-wrong side_channel_files, side_channel_module_global, textbook_* |
| torch.distributed: the same ring_allreduce on real processes (gloo) | test_real_processes (N = 2, 3, 4: results, message counts, every message's digest), allreduce_public (N = 2) |
| sizes beyond one buffer | n = 2^20 + 3: test_allreduce_large, test_ring_order_large, test_real_processes[4] |

Not drawn, and named by no clause: values the contract does not constrain (non-finite floats, int64 sums that
overflow), NCCL (run_distributed(backend="nccl") is offered to students, never graded), and ring_reduce_scatter or
ring_all_gather on real processes (only ring_allreduce runs there).
"""

from __future__ import annotations

import random
from typing import NamedTuple

import pytest
import torch

from grader.hidden.ring_allreduce.oracle import (
    bounds,
    exact_sum,
    expected_trace,
    rank_state,
    ring_order_sum,
    ring_partials,
    sizes_of,
)
from grader.support.ring_allreduce import chunking_cause, forbidden_collectives, message_digest
from grader.testing import is_close, mismatches, show

SIMULATED = "grader.support.ring_allreduce:run_simulated"
DISTRIBUTED = "grader.support.ring_allreduce:run_distributed_cases"
WORLDS = [2, 3, 4, 5, 8]


def with_one_rank(world: int) -> list[int]:
    """The world sizes a test parametrised by `world` runs: one rank as well, beside two. With one rank the
    all-reduce is the identity, so a function that does nothing is right there; it earns nothing alone."""
    return [1, world] if world == 2 else [world]


BIG = 2**20 + 3
# The simulated ring's own deadline for the 2^20-element runs (its default is 60 s): a run of 8 ranks takes
# about 0.5 s on a quiet machine, but the course's shared 2-core machine under load (load average 40) stretched
# one past 60 s. Below the exercise's call_timeout_s (120 s), so the ring still reports a hang by name.
LARGE_TIMEOUT_S = 100.0


@pytest.fixture(scope="module")
def ra(student):
    return student.load(
        "ring_allreduce",
        forbid=forbidden_collectives(),
        forbid_why="build the all-reduce from comm.send_recv",
    )


# --------------------------------------------------------------------------------------------------
# Inputs, messages and assertion helpers (the oracles are in oracle.py)


def lengths(world: int) -> list[int]:
    """The n values to try for a world size: empty, one element, fewer than N, uneven, large-ish."""
    return sorted({0, 1, max(world - 1, 0), world + 1, 1009})


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


def explain_float(
    got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor, rank: int, label: str, n: int, world: int
) -> str:
    got, want = got.reshape(-1), want.reshape(-1)
    bad = (got != want).nonzero().flatten()
    k = int(bad[0])
    scale = exact.abs().max().item() or 1.0
    hint = (
        "The result is close to the true sum but not bit-identical to the ring order: accumulate in the "
        "tensor's own dtype (no float32/float64 accumulator), one hop at a time, chunk c starting at rank c."
        if is_close(got, exact.reshape(-1), atol=0.05 * scale)
        else "The result is far from the sum: check the chunk indices and the peers."
    )
    return (
        f"{label}: rank {rank}, position {k} (chunk {chunk_of(k, n, world)}): found {float(got[k])!r}, the ring "
        f"order gives {float(want[k])!r}; {len(bad)} of {n} positions differ. {hint}"
    )


def first_wrong(got: torch.Tensor, want: torch.Tensor, world: int) -> str:
    """'position k of n (chunk c): found X, expected Y; j positions differ', in row-major order."""
    got, want = got.reshape(-1), want.reshape(-1)
    bad = mismatches(got, want, atol=0.0)
    k, n = int(bad.nonzero()[0]), want.numel()
    close = want.dtype in (torch.float32, torch.bfloat16) and is_close(
        got, want, atol=1e-2 * (float(want.double().abs().max()) or 1.0)
    )
    return (
        f"position {k} of {n} (chunk {chunk_of(k, n, world)}) holds {got[k].item()!r}, expected "
        f"{want[k].item()!r}; {int(bad.sum())} positions differ"
        + (" (all close to the sum: the order or dtype of the additions?)" if close else "")
    )


def run_ring(student, fn, xs, trace=True, **kwargs):
    """fn on a simulated ring of copies of xs, every message traced (a copy each, or a digest)."""
    return student.drive(SIMULATED, fn, [x.clone() for x in xs], trace=trace, **kwargs)


def exchanges_cause(msgs: list[dict], r: int, world: int, n: int) -> str:
    """What rank r's traced exchanges show when there are not 2(N - 1) of them: their sizes and peers, and what
    those say (one phase's worth of exchanges, whole-tensor messages, a peer other than the right neighbour)."""
    sizes = [int(m["sent"].numel()) if "sent" in m else int(m["numel"]) for m in msgs]
    dsts = [int(m["dst"]) for m in msgs]
    said = f"its messages held {sizes} elements, sent to ranks {dsts}" if msgs else "it made none"
    if n < world and len(msgs) < 2 * (world - 1):
        said += (f"; with n = {n} < N = {world} some chunks are empty, and the ring still makes every step's exchange "
                 "for them, empty or not, so that every rank makes 2(N - 1)")
    if len(msgs) == world - 1:
        said += ("; N - 1 exchanges are one phase: the ring runs a reduce-scatter of N - 1 steps, then an all-gather "
                 "of N - 1 more, each step one chunk")
    if n > -(-n // world) and n in sizes:
        said += f"; a message of {n} elements is the whole tensor, where a ring step passes one chunk"
    if any(d != (r + 1) % world for d in dsts):
        said += f"; the ring sends only to the right neighbour (r + 1) % N = {(r + 1) % world}"
    return said


RING_ONLY = (
    "Every message must be exactly what the ring sends at that step: at reduce-scatter step s, rank r's partial "
    "sum of chunk (r - s) % N (its own values plus what it received for that chunk, in the tensor's dtype); at "
    "all-gather step s, the finished chunk (owned - s) % N. comm.send_recv is the only channel between ranks: the "
    "grader checks what it carries, not only the results"
)


def assert_ring_messages(
    run: dict, flats: list[torch.Tensor], kind: str, what: str, shift: int = 1, finals: list | None = None
) -> None:
    """Every message of a traced run is the ring's: right peers, dtype, length and elements, bit for bit.

    `flats`: the ranks' inputs, flat, as they were before the run; `kind`: "allreduce", "reduce_scatter" or
    "all_gather" (owned = (rank + shift) % N, finished chunks `finals`, by default the ring-order sums)."""
    first = trace_divergence(run, flats, kind, shift, finals)
    if first:
        pytest.fail(f"{what}: the messages are not the ring's. The first that left it: {first}. {RING_ONLY}")


def flat_copies(xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The ranks' inputs as flat, contiguous copies, taken before a run changes them."""
    return [x.reshape(-1).clone() for x in xs]


# --------------------------------------------------------------------------------------------------
# reduce_scatter: the returned index and the one chunk it promises


@pytest.mark.check("reduce_scatter")
@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter(student, ra, rng, world):
    for world in with_one_rank(world):  # noqa: B020 - one rank, then the parametrised two
        for n in lengths(world):
            for dtype in (torch.float32, torch.int64):
                xs = rand_inputs(world, n, dtype, rng) if dtype.is_floating_point else int_inputs(world, n, dtype, 7)
                label = f"ring_reduce_scatter, N={world}, n={n}, {dtype}"
                try:
                    run = run_ring(student, ra.ring_reduce_scatter, xs)
                except IndexError as exc:  # the student's: an index past the end of its chunks
                    if n >= world:
                        raise
                    pytest.fail(
                        f"{label}: your code raised {exc}. With n = {n} < N = {world} some chunks are empty: does your "
                        "code still cut N of them? torch.tensor_split(flat, N) always gives N chunks (the contract's "
                        "cut); torch.chunk gives fewer"
                    )
                for r in range(world):
                    owned = run["returns"][r]
                    dsts = [d for d in sorted({int(m["dst"]) for m in (run.get("trace") or [[]] * world)[r]})
                            if d != (r + 1) % world]  # any peer but the right neighbour
                    assert owned == (r + 1) % world, (
                        f"{label}: rank {r} returned {owned!r}, expected {(r + 1) % world} (the chunk it holds complete: "
                        "the chunk that starts on rank r + 1 goes once around the ring and ends on rank r)"
                        + (f". It sent to rank {dsts[0]}, not to its right neighbour (r + 1) % N = {(r + 1) % world}: "
                           "the ring sends right and receives from the left, (r - 1) % N"
                           if dsts and world > 2 else "")
                    )
                    lo, hi = bounds(n, world, owned)
                    want = ring_order_sum(xs, [owned])[lo:hi]
                    got = run["outputs"][r].reshape(-1)[lo:hi]
                    if not torch.equal(got, want):  # chunks cut otherwise show in where the complete sums sit
                        cut = chunking_cause(xs, run["outputs"], 1e-5 if dtype.is_floating_point else 0.0)
                        if cut:
                            pytest.fail(f"{label}: {cut}")
                    if dtype == torch.int64:
                        if not torch.equal(got, want):
                            full = run["outputs"][r].reshape(-1).clone()
                            full[lo:hi] = want  # only the owned chunk is promised
                            pytest.fail(
                                explain_int(xs, run["outputs"][r], full, r, f"{label}, owned chunk {owned}")
                                + f" After N - 1 steps chunk {owned} must hold every rank's contribution: at step s "
                                "rank r adds the chunk (r - s - 1) % N that arrives from rank (r - 1) % N."
                            )
                    else:
                        assert torch.equal(got, want), explain_float(
                            got, want, exact_sum(xs)[lo:hi], r, label + f", chunk {owned}", hi - lo, world
                        )
                assert_ring_messages(run, xs, "reduce_scatter", label)


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
            out.reshape(-1)[lo:hi], want, exact_sum(xs)[lo:hi], r, "ring_reduce_scatter, bfloat16 [5, 7, 3]", hi - lo, 3
        )
    assert_ring_messages(run, flat_copies(xs), "reduce_scatter", "ring_reduce_scatter, bfloat16 [5, 7, 3]")


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
            finals = [final[slice(*bounds(n, world, c))] for c in range(world)]
            assert_ring_messages(
                run,
                xs,
                "all_gather",
                f"ring_all_gather, N={world}, n={n}, {dtype}, owned = (rank + {shift}) % N",
                shift=shift,
                finals=finals,
            )


# --------------------------------------------------------------------------------------------------
# allreduce: exact sums


@pytest.mark.check("allreduce")
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64], ids=["int64", "float64"])
@pytest.mark.parametrize("world", WORLDS)
def test_allreduce_exact(student, ra, seed, world, dtype):
    for world in with_one_rank(world):  # noqa: B020 - one rank, then the parametrised two
        for n in lengths(world):
            xs = int_inputs(world, n, dtype, offset=seed % 1000)
            want = exact_sum(xs)
            run = run_ring(student, ra.ring_allreduce, xs)
            for r in range(world):
                got = run["outputs"][r]
                assert got.dtype == dtype, f"N={world}, n={n}: rank {r}'s tensor became {got.dtype}; keep {dtype}"
                if not torch.equal(got.reshape(-1).to(want.dtype), want):
                    pytest.fail(
                        explain_int(xs, got, want.to(torch.int64), r, f"ring_allreduce, N={world}, n={n}, {dtype}")
                    )
            assert_ring_messages(run, xs, "allreduce", f"ring_allreduce, N={world}, n={n}, {dtype}")


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
    for world in with_one_rank(world):  # noqa: B020 - one rank, then the parametrised two
        for rows, cols in transposed_shapes(world):
            xs = transposed_int_inputs(world, rows, cols, dtype, offset=seed % 1000)
            want = exact_sum(xs)  # flat, in row-major order
            flats = flat_copies(xs)
            run = student.drive(SIMULATED, ra.ring_allreduce, xs, trace=True)  # the very tensors, strides and all
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
            assert_ring_messages(run, flats, "allreduce", label)


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
    flats = flat_copies(xs)
    run = student.drive(SIMULATED, ra.ring_allreduce, xs, trace="digest", timeout_s=LARGE_TIMEOUT_S)
    for r in range(world):
        got = run["outputs"][r]
        assert got.dtype == dtype, f"{label}: rank {r}'s tensor became {got.dtype}; keep {dtype}"
        if not torch.equal(got.reshape(-1).to(want.dtype), want):
            pytest.fail(explain_int(xs, got, want.to(torch.int64), r, label))
    assert_ring_messages(run, flats, "allreduce", label)


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
                got, want, exact_sum(xs), r, f"N={world}, n={n}, {dtype}", n, world
            )
        assert_ring_messages(run, xs, "allreduce", f"ring_allreduce, N={world}, n={n}, {dtype}")


@pytest.mark.check("float_order")
@pytest.mark.parametrize("world, dtype", [(4, torch.float32), (3, torch.bfloat16)], ids=["4-float32", "3-bfloat16"])
def test_ring_order_large(student, ra, rng, world, dtype):
    xs = rand_inputs(world, BIG, dtype, rng)
    want = ring_order_sum(xs)
    run = run_ring(student, ra.ring_allreduce, xs, trace="digest", timeout_s=LARGE_TIMEOUT_S)
    for r in range(world):
        got = run["outputs"][r]
        assert got.dtype == dtype, f"N={world}, n=2^20+3: rank {r}'s tensor became {got.dtype}; keep {dtype}"
        assert torch.equal(got, want), explain_float(
            got, want, exact_sum(xs), r, f"N={world}, n=2^20+3, {dtype}", BIG, world
        )
    assert_ring_messages(run, xs, "allreduce", f"ring_allreduce, N={world}, n=2^20+3, {dtype}")


# --------------------------------------------------------------------------------------------------
# layouts: any shape and layout, in place; N = 1


def _check_layout(student, ra, xs: list[torch.Tensor], label: str) -> None:
    flat_xs = [x.reshape(-1) for x in xs]
    if xs[0].dtype.is_floating_point and xs[0].dtype != torch.float64:
        want = ring_order_sum(flat_xs).reshape(xs[0].shape)
    else:
        want = exact_sum(flat_xs).to(xs[0].dtype).reshape(xs[0].shape)
    flats = flat_copies(xs)
    run = student.drive(SIMULATED, ra.ring_allreduce, xs, trace=True)  # the very tensors, strides and all
    for r in range(len(xs)):
        got = run["outputs"][r]
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"{label}: rank {r} came back {got.dtype} {tuple(got.shape)}, expected {want.dtype} {tuple(want.shape)}"
        )
        if not torch.equal(got, want):
            unchanged = " It is this rank's own input, unchanged." if torch.equal(got, xs[r]) else ""
            pytest.fail(
                f"{label}: rank {r}'s tensor does not hold the sum in row-major order: "
                f"{first_wrong(got, want, len(xs))}.{unchanged} Chunk the tensor as tensor.reshape(-1) sees it; a "
                "non-contiguous tensor has no flat view, so reshape returns a copy: copy the result back into the "
                "caller's tensor."
            )
    assert_ring_messages(run, flats, "allreduce", label)


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
    run = student.drive(SIMULATED, ra.ring_allreduce, xs, trace=True)
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
            f"N={world}, transposed {dtype} [37, 29]: rank {r}'s result differs from the sum: "
            f"{first_wrong(got, want, world)}. Chunk in logical row-major order (tensor.reshape(-1)), not in memory "
            "order, and copy the result back into the caller's tensor."
        )
    assert_ring_messages(run, flat_copies(originals), "allreduce", f"N={world}, transposed {dtype} [37, 29]")


@pytest.mark.check("layouts")
def test_shapes(student, ra, rng):
    world = 4
    cases = {
        "a permuted 3-D float32 tensor [3, 4, 5]": [
            torch.randn(5, 3, 4, generator=rng).permute(1, 2, 0) for _ in range(world)
        ],
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
    # A function that does nothing is right for one rank: the same tensor on two ranks must come back doubled.
    run = student.drive(SIMULATED, ra.ring_allreduce, [x.clone(), x.clone()])
    for r in range(2):
        assert torch.equal(run["outputs"][r], x + x), (
            f"with two ranks holding the same tensor, rank {r} should end with twice it, found "
            f"{show(run['outputs'][r])} (one rank is the identity; two must sum)"
        )


@pytest.mark.check("layouts")
def test_writes_into_the_callers_tensor(student, ra, rng):
    xs = [torch.randint(-9, 9, (4, 6), generator=rng) for _ in range(3)]
    want = exact_sum(xs).reshape(4, 6)
    run = student.drive(SIMULATED, ra.ring_allreduce, [x.clone() for x in xs], trace=True)
    for r in range(3):
        ret = run["returns"][r]
        got = run["outputs"][r]
        if torch.equal(got, xs[r]) and isinstance(ret, torch.Tensor):
            pytest.fail(f"rank {r} returned the result but left its input unchanged: ring_allreduce works in place")
        assert torch.equal(got, want), (
            f"rank {r}: the caller's tensor does not hold the sum: {first_wrong(got, want, 3)}. ring_allreduce works "
            "in place: the result goes into the tensor it was given"
        )
        assert_returns_none(run, r, "ring_allreduce, N=3, int64 [4, 6]", "ring_allreduce")
    assert_ring_messages(run, flat_copies(xs), "allreduce", "ring_allreduce, N=3, int64 [4, 6]")


# --------------------------------------------------------------------------------------------------
# volume: what each rank sends, counted by the simulated ring


def _volume_message(label: str, r: int, run: dict, want_msgs: int, want_elems: int, sizes: list[int]) -> str | None:
    msgs, elems = run["messages_sent"][r], run["elements_sent"][r]
    if msgs != want_msgs:
        return (
            f"{label}: rank {r} sent {msgs} messages, expected {want_msgs} (one per step, even when a chunk is empty). "
            f"Message sizes: {show(run['message_sizes'][r], 12)}"
        )
    if elems != want_elems:
        biggest = max(run["message_sizes"][r], default=0)
        why = (
            f"one message held {biggest} elements, more than the largest chunk ({max(sizes)}): "
            "a ring step passes one chunk, not the whole buffer"
            if biggest > max(sizes)
            else f"the chunk sizes must follow torch.tensor_split: {sizes}"
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
                sizes[(r + 1 - s) % world] for s in range(world - 1)
            ]
            assert run["message_sizes"][r] == expected_sizes, (
                f"ring_allreduce, N={world}, n={n}: rank {r} sent messages of {show(run['message_sizes'][r])} "
                f"elements, expected {show(expected_sizes)} (chunk (r - s) % N, then chunk (r + 1 - s) % N)"
            )
        assert_ring_messages(
            run, int_inputs(world, n, torch.int64, 1), "allreduce", f"ring_allreduce, N={world}, n={n}"
        )


@pytest.mark.check("volume")
@pytest.mark.parametrize("world", [3, 5, 8])
def test_phase_volume(student, ra, world):
    n = 2 * world + 3
    sizes = sizes_of(n, world)
    run = run_ring(student, ra.ring_reduce_scatter, int_inputs(world, n, torch.int64, 1))
    for r in range(world):
        problem = _volume_message(
            f"ring_reduce_scatter, N={world}, n={n}", r, run, world - 1, n - sizes[(r + 1) % world], sizes
        )
        assert problem is None, problem
    assert_ring_messages(
        run, int_inputs(world, n, torch.int64, 1), "reduce_scatter", f"ring_reduce_scatter, N={world}, n={n}"
    )
    shift = 2
    owned = [((r + shift) % world,) for r in range(world)]
    run = run_ring(student, ra.ring_all_gather, int_inputs(world, n, torch.int64, 1), rank_args=owned)
    for r in range(world):
        problem = _volume_message(
            f"ring_all_gather, N={world}, n={n}, owned=(rank+2)%N",
            r,
            run,
            world - 1,
            n - sizes[(r + shift + 1) % world],
            sizes,
        )
        assert problem is None, problem
    flats = int_inputs(world, n, torch.int64, 1)
    finals = [flats[(c - shift) % world][slice(*bounds(n, world, c))] for c in range(world)]
    assert_ring_messages(
        run, flats, "all_gather", f"ring_all_gather, N={world}, n={n}, owned=(rank+2)%N", shift=shift, finals=finals
    )


# --------------------------------------------------------------------------------------------------
# Generated cases: random world sizes, lengths, dtypes and layouts, checked against the ring order exactly.
# The run is traced (grader.support.ring_allreduce.run_simulated with trace=True keeps a copy of every
# message), so a wrong result is explained by the first message that left the ring: (step, rank, chunk,
# position), and what that message holds instead.

TRACED = "grader.support.ring_allreduce:run_simulated"
LENGTH_CLASSES = ["0", "1", "N - 1", "N", "N + 1", "2N - 1", "a multiple of N", "small", "large"]
LAYOUTS = ["contiguous", "transposed", "permuted 3-D", "strided slice", "column slice", "offset view"]


def seeded(rng: torch.Generator) -> random.Random:
    return random.Random(int(torch.randint(0, 2**31, (1,), generator=rng)))


def generated_length(rnd: random.Random, kind: str, world: int) -> int:
    return {
        "0": 0,
        "1": 1,
        "N - 1": world - 1,
        "N": world,
        "N + 1": world + 1,
        "2N - 1": 2 * world - 1,
        "a multiple of N": world * rnd.randint(2, 40),
        "small": rnd.randint(2, 64),
        "large": rnd.randint(500, 3000),
    }[kind]


def factors(n: int, count: int, rnd: random.Random) -> tuple[int, ...] | None:
    """n as a product of `count` factors, each at least 2 (random among the ways), or None."""
    if count == 1:
        return (n,) if n >= 2 else None
    ways = [d for d in range(2, n // 2 + 1) if n % d == 0 and factors(n // d, count - 1, rnd)]
    if not ways:
        return None
    d = rnd.choice(ways)
    rest = factors(n // d, count - 1, rnd)
    assert rest is not None  # d is one of the ways that have one
    return (d, *rest)


def laid_out(flat: torch.Tensor, layout: str, rnd: random.Random) -> tuple[torch.Tensor, str]:
    """A tensor whose row-major values are `flat`, stored as `layout` says (falling back to a strided slice
    where n has no shape for it); and a description of what it made. Every rank's tensor must get the same
    shape and strides: give each call a generator in the same state."""
    n = flat.numel()
    shape = factors(n, 3 if layout == "permuted 3-D" else 2, rnd)
    if layout == "contiguous" and n == 1 and rnd.random() < 0.5:
        x = flat.reshape(()).clone()
    elif layout == "transposed" and shape:
        x = flat.reshape(shape).t().contiguous().t()  # column-major memory, row-major values
    elif layout == "permuted 3-D" and shape:
        x = flat.reshape(shape).permute(2, 0, 1).contiguous().permute(1, 2, 0)
    elif layout == "column slice" and shape:
        a, b = shape
        x = torch.zeros(a, b + 3, dtype=flat.dtype)[:, 1 : 1 + b]
        x.copy_(flat.reshape(a, b))
    elif layout == "offset view":
        x = torch.zeros(n + 5, dtype=flat.dtype)[3 : 3 + n]
        x.copy_(flat)
    elif layout == "contiguous":
        x = flat.clone()
    else:
        layout, step = "strided slice", rnd.randint(2, 3)
        x = torch.zeros(step * n + 1, dtype=flat.dtype)[1::step][:n]
        x.copy_(flat)
    shown = "0-d" if x.dim() == 0 else str(tuple(x.shape))
    return x, f"{layout} {shown}, strides {x.stride()}, storage offset {x.storage_offset()}"


def exact_values(world: int, n: int, offset: int) -> list[torch.Tensor]:
    """x_r[k] = (k + offset) 4^N + 4^r: any sum of the ranks' values at k says which ranks (each up to 3 times)
    and which position it came from (decoded by `decode`)."""
    k = torch.arange(n, dtype=torch.int64)
    return [(k + offset) * 4**world + 4**r for r in range(world)]


def decode(value: int, k: int, world: int, offset: int) -> str:
    """What an exact sum at position k holds: whose contributions, how many times, from which position."""
    base = 4**world
    counts = [(value % base) >> (2 * r) & 3 for r in range(world)]
    total, high = sum(counts), value // base
    if total == 0 or high % total or high // total - offset < 0:
        return "it is no sum of the ranks' values (uninitialised memory, or a value from another dtype?)"
    source = high // total - offset
    missing = [r for r in range(world) if counts[r] == 0]
    extra = [r for r in range(world) if counts[r] > 1]
    parts = []
    if source != k:
        parts.append(f"it holds values of position {source}, not {k}: elements landed in the wrong place")
    if missing:
        parts.append(f"rank(s) {missing} contributed nothing to it")
    if extra:
        parts.append(
            f"rank(s) {extra} contributed more than once (a chunk added twice, or added where it should overwrite)"
        )
    return "; ".join(parts) or "it is the right sum"


class RingCase(NamedTuple):
    world: int
    xs: list  # what the ranks get, in the drawn layout
    flats: list  # the same values, flat and contiguous (the oracle's copy)
    label: str
    offset: int  # for decode (exact dtypes)


def ring_world(trial: int) -> int:
    return 1 + trial % 8


def generated_ring_case(rnd: random.Random, trial: int, dtypes: list, gen: torch.Generator, values=None) -> RingCase:
    """Trial t: world 1 + t % 8, the length classes in turn, a layout and a dtype drawn at random. The values are
    `exact_values` for int64 and float64, mixed magnitudes for float32 and bfloat16, or values(flats) of those."""
    world = ring_world(trial)
    kind = LENGTH_CLASSES[(trial // 8 + trial) % len(LENGTH_CLASSES)]
    n, dtype, layout = generated_length(rnd, kind, world), dtypes[trial % len(dtypes)], rnd.choice(LAYOUTS)
    offset = rnd.randrange(1000)
    if dtype.is_floating_point and dtype != torch.float64:
        flats = rand_inputs(world, n, dtype, gen)
    else:
        flats = [x.to(dtype) for x in exact_values(world, n, offset)]
    if values is not None:
        flats = values(flats)
    layout_seed = rnd.randrange(2**31)
    shaped = [laid_out(f, layout, random.Random(layout_seed)) for f in flats]  # one shape and layout for every rank
    label = f"N={world}, n={n} ({kind}), {str(dtype).removeprefix('torch.')}, {shaped[0][1]}"
    return RingCase(world, [x for x, _ in shaped], flats, label, offset)


def message_cause(
    got: torch.Tensor,
    want: torch.Tensor,
    state: list,
    before_gather: list,
    finals: list,
    phase: str,
    step: int,
    c: int,
    partials: list,
    exact: torch.Tensor | None,
) -> str:
    """What a rank most likely did wrong to send `got` where the contract sends `want` (chunk c)."""
    send_rule = (
        "at reduce-scatter step s rank r sends chunk (r - s) % N"
        if phase == "reduce-scatter"
        else "at all-gather step s rank r sends chunk (owned - s) % N"
    )
    if got.numel() and not got.any() and want.any():
        return (
            "the message is all zeros where the ring's is not: a placeholder of the right size? The data must travel "
            "in the messages themselves"
        )
    for j, held in enumerate(state):
        if j != c and held.numel() == got.numel() and held.numel() and torch.equal(got, held):
            return f"it sent its copy of chunk {j} instead: {send_rule}"
    if phase == "reduce-scatter" and step > 0 and torch.equal(got, partials[c][step - 1]):
        return (
            "it is the message that arrived for this chunk one step earlier, without this rank's own values: the "
            "reduce-scatter ADDS the incoming chunk into this rank's copy (receive into a scratch buffer, then add)"
        )
    if phase == "all-gather" and torch.equal(got, finals[c] + before_gather[c]):
        return "it is the final chunk plus this rank's stale partial sum: the all-gather overwrites, never adds"
    if exact is not None and is_close(got, exact, atol=0.05 * (float(exact.abs().max()) if exact.numel() else 1.0)):
        return (
            "it is close to the true partial sum but not bit-identical to the ring order: add in the tensor's own "
            "dtype, one hop at a time (no wider accumulator), chunk c starting at rank c"
        )
    return (
        f"this rank's copy of chunk {c} is not what the earlier steps make it: at reduce-scatter step s rank r "
        "receives chunk (r - s - 1) % N from rank (r - 1) % N and adds it into its own copy of that chunk"
    )


def trace_divergence(run: dict, flats: list[torch.Tensor], kind: str, shift: int, finals: list | None = None) -> str:
    """The first exchange (step by step, rank by rank) whose message is not the contract's, explained; '' if none.

    The trace holds a copy of each message (``sent``) or its digest (``digest``, with ``dtype`` and ``numel``)."""
    world = len(flats)
    n = flats[0].numel()
    partials = ring_partials(flats)
    finals = finals or [partials[c][world - 1] for c in range(world)]
    want = expected_trace(flats, partials, kind, shift, finals)
    trace = run.get("trace") or [[] for _ in range(world)]
    floats = flats[0].dtype in (torch.float32, torch.bfloat16)
    for e in range(max((len(t) for t in want), default=0)):
        for r in range(world):
            phase, step, c, elems = want[r][e]
            where = f"{phase} step {step}, rank {r} (chunk {c})"
            if e >= len(trace[r]):
                return (f"{where}: rank {r} made only {len(trace[r])} exchanges; each phase takes N - 1 = {world - 1}: "
                        + exchanges_cause(trace[r], r, world, n))
            msg = trace[r][e]
            if (msg["dst"], msg["src"]) != ((r + 1) % world, (r - 1) % world):
                return (
                    f"{where}: rank {r} sent to rank {msg['dst']} and received from rank {msg['src']}; in the ring "
                    f"it sends to (r + 1) % N = {(r + 1) % world} and receives from (r - 1) % N = {(r - 1) % world}"
                )
            if "digest" in msg:
                problem = digest_divergence(msg, elems, phase, c)
                if problem:
                    return f"{where}: {problem}"
                continue
            got, lo = msg["sent"], bounds(n, world, c)[0]
            state = rank_state(flats, partials, finals, kind, shift, r, phase, step)
            if got.dtype != elems.dtype:
                return (
                    f"{where}: rank {r} sent {dtype_name(got.dtype)} elements, the tensor is {dtype_name(elems.dtype)}: "
                    "accumulate and send in the tensor's own dtype (no upcast: each hop rounds)"
                )
            if got.numel() != elems.numel():
                same = [
                    j for j in range(world) if j != c and state[j].numel() == got.numel() and torch.equal(got, state[j])
                ]
                why = (
                    f"it is this rank's copy of chunk {same[0]}: at {phase} step s rank r sends chunk "
                    + ("(r - s) % N" if phase == "reduce-scatter" else "(owned - s) % N")
                    if same and got.numel()
                    else "it is the whole buffer: a ring step passes one chunk"
                    if got.numel() == n and n > elems.numel()
                    else "an empty message: at every step each rank sends one chunk to its right neighbour"
                    if not got.numel()
                    else f"chunks follow torch.tensor_split: sizes {sizes_of(n, world)}"
                )
                return f"{where}: rank {r} sent {got.numel()} elements, chunk {c} holds {elems.numel()}: {why}"
            bad = mismatches(got, elems, atol=0.0)
            if bad.any():
                j = int(bad.nonzero()[0])
                before_gather = rank_state(flats, partials, finals, kind, shift, r, "reduce-scatter", world - 1)
                exact = None
                if floats:
                    hi = lo + elems.numel()
                    terms = (
                        [flats[(c + h) % world][lo:hi] for h in range(step + 1)]
                        if phase == "reduce-scatter"
                        else [x[lo:hi] for x in flats]
                    )
                    exact = sum(t.double() for t in terms)
                cause = message_cause(got, elems, state, before_gather, finals, phase, step, c, partials,
                                      exact)  # type: ignore[arg-type]  # a sum of one tensor or more: a tensor
                return (
                    f"{where}: its message differs first at position {lo + j} (element {j} of chunk {c}): found "
                    f"{got[j].item()!r}, the ring order gives {elems[j].item()!r}: {cause}"
                )
    extra = [r for r in range(world) if len(trace[r]) > len(want[r])]
    if extra:
        return f"rank {extra[0]} made {len(trace[extra[0]])} exchanges, the contract {len(want[extra[0]])}"
    return ""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def digest_divergence(msg: dict, elems: torch.Tensor, phase: str, c: int) -> str:
    """'' when a digested message is the contract's `elems`; else what differs (dtype, length, or the values)."""
    if msg["dtype"] != dtype_name(elems.dtype):
        return (
            f"it sent {msg['dtype']} elements, the tensor is {dtype_name(elems.dtype)}: accumulate and send in the "
            "tensor's own dtype (no upcast: each hop rounds)"
        )
    if msg["numel"] != elems.numel():
        return f"it sent {msg['numel']} elements, chunk {c} holds {elems.numel()}"
    if msg["digest"] != message_digest(elems):
        if elems.any() and msg["digest"] == message_digest(torch.zeros_like(elems)):
            return (
                f"it sent {elems.numel()} zeros, as many elements as chunk {c} holds, where the ring's message is not "
                "zero: a placeholder of the right size? The data must travel in the messages themselves"
            )
        what = "its partial sum of" if phase == "reduce-scatter" else "the finished"
        return (
            f"it sent {elems.numel()} {dtype_name(elems.dtype)} elements, as many as chunk {c} holds, but not "
            f"{what} chunk {c} (run the same input on run_simulated with trace=True to see its values)"
        )
    return ""


def result_divergence(
    got: torch.Tensor,
    want: torch.Tensor,
    case: RingCase,
    r: int,
    what: str,
    before_gather: torch.Tensor | None = None,
    sums: bool = True,
) -> str:
    """The first wrong position of rank r's flat result, its chunk, and what it holds instead: its own input,
    the final value added to what the rank held before the all-gather (`before_gather`), or (exact dtypes,
    `sums`) the ranks and position its value decodes to."""
    world, n = case.world, want.numel()
    got = got.reshape(-1)
    bad = mismatches(got, want, atol=0.0)
    k = int(bad.nonzero()[0])
    text = (
        f"{what}, rank {r}: position {k} of {n} (chunk {chunk_of(k, n, world)}) holds {got[k].item()!r}, "
        f"expected {want[k].item()!r} ({'the ring-order sum' if sums else 'the final value'}); "
        f"{int(bad.sum())} positions differ"
    )
    if torch.equal(got, case.flats[r]):
        return text + ". It is this rank's own input, unchanged: write the result into the caller's tensor"
    if before_gather is not None and torch.equal(got[k : k + 1], want[k : k + 1] + before_gather[k : k + 1]):
        return (
            text + ". It is the final value plus what this rank held there before the all-gather: the all-gather "
            "overwrites each incoming chunk, never adds it"
        )
    if sums and (not got.dtype.is_floating_point or got.dtype == torch.float64):
        value = got[k].item()
        if float(value) == int(value):
            text += f". Decoded: {decode(int(value), k, world, case.offset)}"
    return text


def held_before_gather(case: RingCase, r: int, kind: str, shift: int) -> torch.Tensor:
    """Rank r's flat buffer just before the all-gather, by the contract."""
    if case.world == 1 or not case.flats[0].numel():
        return case.flats[r]
    partials = ring_partials(case.flats)
    finals = [partials[c][case.world - 1] for c in range(case.world)]
    return torch.cat(rank_state(case.flats, partials, finals, kind, shift, r, "reduce-scatter", case.world - 1))


def traced_run(student, fn, case: RingCase, rank_args=None) -> dict:
    try:
        return student.drive(TRACED, fn, case.xs, rank_args=rank_args, trace=True)
    except Exception as exc:  # noqa: BLE001 - the student's own error (a CommError names the ranks), with its case
        exc.args = (f"{case.label}: {exc.args[0] if exc.args else ''}", *exc.args[1:])
        raise


def assert_kept_dtype_and_shape(run: dict, case: RingCase, what: str) -> None:
    for r, out in enumerate(run["outputs"]):
        x = case.xs[r]
        assert out.dtype == x.dtype and tuple(out.shape) == tuple(x.shape), (
            f"{what}, rank {r}: the tensor came back {out.dtype} {tuple(out.shape)}, expected {x.dtype} {tuple(x.shape)}: "
            "work in place, in the tensor's own dtype"
        )


def assert_returns_none(run: dict, r: int, what: str, fn: str) -> None:
    ret = run["returns"][r]
    assert ret is None, (
        f"{what}: rank {r}'s {fn} returned {show(ret) if isinstance(ret, torch.Tensor) else repr(ret)}, expected None: "
        "it works in place, on the caller's tensor, and returns nothing (like torch.distributed's collectives)"
    )


def check_generated_allreduce(student, ra, rng: torch.Generator, dtypes: list, trials: int) -> None:
    rnd = seeded(rng)
    for trial in range(trials):
        case = generated_ring_case(rnd, trial, dtypes, rng)
        want = ring_order_sum(case.flats) if case.flats[0].numel() else case.flats[0].clone()
        run = traced_run(student, ra.ring_allreduce, case)
        what = f"ring_allreduce, {case.label}"
        assert_kept_dtype_and_shape(run, case, what)
        for r in range(case.world):
            if not torch.equal(run["outputs"][r].reshape(-1), want):
                first = trace_divergence(run, case.flats, "allreduce", 1)
                pytest.fail(
                    result_divergence(
                        run["outputs"][r], want, case, r, what, held_before_gather(case, r, "allreduce", 1)
                    )
                    + ". "
                    + (
                        f"The first message that left the ring: {first}"
                        if first
                        else "Every message matched the ring, so the result went wrong in this rank's own buffer: store each "
                        "chunk received in the all-gather in place (overwrite, never add), and copy a non-contiguous "
                        "tensor's flat copy (tensor.reshape(-1)) back"
                    )
                )
        assert_ring_messages(run, case.flats, "allreduce", what)


@pytest.mark.check("allreduce")
def test_generated_allreduce_exact(student, ra, rng):
    check_generated_allreduce(student, ra, rng, [torch.int64, torch.float64], trials=32)


@pytest.mark.check("float_order")
def test_generated_ring_order(student, ra, rng):
    check_generated_allreduce(student, ra, rng, [torch.float32, torch.bfloat16], trials=32)


def check_reduce_scatter_case(student, ra, case: RingCase) -> None:
    """ring_reduce_scatter on a case's tensors, as laid out: the returned index, the owned chunk exact (in the ring
    order), written into the caller's tensor, dtype and shape kept, and every message the ring's."""
    world, n = case.world, case.flats[0].numel()
    run = traced_run(student, ra.ring_reduce_scatter, case)
    what = f"ring_reduce_scatter, {case.label}"
    assert_kept_dtype_and_shape(run, case, what)
    for r in range(world):
        owned = run["returns"][r]
        assert owned == (r + 1) % world, (
            f"{what}: rank {r} returned {owned!r}, expected (r + 1) % N = {(r + 1) % world}: after N - 1 steps the "
            "chunk that started on rank r + 1 has gone once around the ring and ends, complete, on rank r"
        )
        lo, hi = bounds(n, world, owned)
        want = ring_order_sum(case.flats, [owned])
        got = run["outputs"][r].reshape(-1)
        if not torch.equal(got[lo:hi], want[lo:hi]):
            full = got.clone()
            full[lo:hi] = want[lo:hi]  # only the owned chunk is promised
            first = trace_divergence(run, case.flats, "reduce_scatter", 1)
            pytest.fail(
                result_divergence(got, full, case, r, what + f", owned chunk {owned}")
                + ". "
                + (
                    f"The first message that left the ring: {first}"
                    if first
                    else "Every message matched the ring: add the last incoming chunk into this rank's own copy, and copy a "
                    "non-contiguous tensor's flat copy back"
                )
            )
    assert_ring_messages(run, case.flats, "reduce_scatter", what)


@pytest.mark.check("reduce_scatter")
def test_generated_reduce_scatter_ownership(student, ra, rng):
    rnd = seeded(rng)
    for trial in range(32):
        case = generated_ring_case(rnd, trial, [torch.float32, torch.int64, torch.bfloat16, torch.float64], rng)
        check_reduce_scatter_case(student, ra, case)


def with_final_chunks(flats: list[torch.Tensor], shift: int, rng: torch.Generator) -> list[torch.Tensor]:
    """Rank r holds chunk (r + shift) % N final (values none of the ranks' stale copies hold), the rest stale."""
    world, n = len(flats), flats[0].numel()
    final = (torch.randint(-1000, 1000, (n,), generator=rng) * 4 - 1).to(flats[0].dtype)
    out = [x.clone() for x in flats]
    for r in range(world):
        lo, hi = bounds(n, world, (r + shift) % world)
        out[r][lo:hi] = final[lo:hi]
    return out


def check_all_gather_case(student, ra, case: RingCase, shift: int) -> None:
    """ring_all_gather with owned = (rank + shift) % N on a case whose ranks hold their owned chunk final: every
    rank ends with every final chunk, written into the caller's tensor, returns None, every message the ring's."""
    world, n = case.world, case.flats[0].numel()
    finals = [case.flats[(c - shift) % world][slice(*bounds(n, world, c))] for c in range(world)]
    final = torch.cat(finals) if finals else case.flats[0]
    run = traced_run(student, ra.ring_all_gather, case, rank_args=[((r + shift) % world,) for r in range(world)])
    what = f"ring_all_gather, owned = (rank + {shift}) % N, {case.label}"
    assert_kept_dtype_and_shape(run, case, what)
    for r in range(world):
        if not torch.equal(run["outputs"][r].reshape(-1), final):
            first = trace_divergence(run, case.flats, "all_gather", shift, finals)
            pytest.fail(
                result_divergence(run["outputs"][r], final, case, r, what, case.flats[r], sums=False)
                + ". "
                + (
                    f"The first message that left the ring: {first}"
                    if first
                    else "Every message matched the ring: store each incoming chunk in place (overwrite), at chunk "
                    "(owned - s - 1) % N, and copy a non-contiguous tensor's flat copy back"
                )
            )
        assert_returns_none(run, r, what, "ring_all_gather")
    assert_ring_messages(run, case.flats, "all_gather", what, shift=shift, finals=finals)


@pytest.mark.check("all_gather")
def test_generated_all_gather(student, ra, rng):
    rnd = seeded(rng)
    for trial in range(32):
        world = ring_world(trial)
        shift = rnd.randrange(world)
        case = generated_ring_case(
            rnd,
            trial,
            [torch.float32, torch.int64, torch.bfloat16, torch.float64],
            rng,
            lambda flats: with_final_chunks(flats, shift, rng),  # noqa: B023 - called at once, in this iteration
        )
        check_all_gather_case(student, ra, case, shift)


# --------------------------------------------------------------------------------------------------
# The two phases on any layout, every time: the generated cases draw a layout at random, so a given seed may miss
# one; these draw each, for both phases, on every grade (the contract's "In place, any layout" is for all three).

PHASE_LAYOUTS = ["transposed", "permuted 3-D", "column slice", "strided slice", "offset view"]


def phase_layout_cases(world: int, rng: torch.Generator, values=None) -> list[RingCase]:
    """One case per layout of PHASE_LAYOUTS (n = 12 (N + 1): a 3-D shape exists), and a 0-d case (n = 1, so every
    chunk but chunk 0 is empty), all int64 with `exact_values`, or values(flats) of those."""
    rnd = seeded(rng)
    cases = []
    for layout in [*PHASE_LAYOUTS, "0-d"]:
        n = 1 if layout == "0-d" else 12 * (world + 1)
        offset = rnd.randrange(1000)
        flats = exact_values(world, n, offset)
        if values is not None:
            flats = values(flats)
        if layout == "0-d":
            shaped = [(f.reshape(()).clone(), "0-d") for f in flats]
        else:
            layout_seed = rnd.randrange(2**31)
            shaped = [laid_out(f, layout, random.Random(layout_seed)) for f in flats]
            assert shaped[0][1].startswith(layout), f"test setup: {layout} made {shaped[0][1]}"
        cases.append(RingCase(world, [x for x, _ in shaped], flats, f"N={world}, n={n}, int64, {shaped[0][1]}", offset))
    return cases


@pytest.mark.check("reduce_scatter")
@pytest.mark.parametrize("world", [2, 3, 5])
def test_reduce_scatter_any_layout(student, ra, rng, world):
    for case in phase_layout_cases(world, rng):
        check_reduce_scatter_case(student, ra, case)


@pytest.mark.check("all_gather")
@pytest.mark.parametrize("world", [2, 3, 5])
def test_all_gather_any_layout(student, ra, rng, world):
    shift = int(torch.randint(0, world, (1,), generator=rng))
    for case in phase_layout_cases(world, rng, lambda flats: with_final_chunks(flats, shift, rng)):
        check_all_gather_case(student, ra, case, shift)


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
    generated = generated_ring_case(
        seeded(rng),
        world - 1 + 8 * int(torch.randint(0, 9, (1,), generator=rng)),
        [torch.float32, torch.bfloat16, torch.int64, torch.float64],
        rng,
    )
    cases[f"generated: {generated.label}"] = generated.xs
    if world == 4:
        cases["float32, n=2^20+3 (ring order)"] = rand_inputs(world, BIG, torch.float32, rng)
    labels, inputs = list(cases), list(cases.values())
    flats = [flat_copies(xs) for xs in inputs]
    runs = student.drive(DISTRIBUTED, ra.ring_allreduce, inputs, trace="digest")
    assert len(runs) == len(inputs), f"expected {len(inputs)} results, found {len(runs)}"
    for label, xs, run, flat in zip(labels, inputs, runs, flats):
        if xs[0].dtype in (torch.float32, torch.bfloat16):
            want = ring_order_sum(xs).reshape(xs[0].shape)
        else:
            want = exact_sum(xs).to(xs[0].dtype).reshape(xs[0].shape)
        for r in range(world):
            got = run["outputs"][r]
            assert got.dtype == want.dtype and got.shape == want.shape, (
                f"{world} gloo processes, {label}: rank {r} came back {got.dtype} {tuple(got.shape)}"
            )
            if not torch.equal(got, want):
                pytest.fail(
                    f"{world} gloo processes, {label}: rank {r} does not hold the expected sum: "
                    f"{first_wrong(got, want, world)}. Run the same input on run_simulated (trace=True keeps every "
                    "message), which names the ranks and exchanges."
                )
            assert run["messages_sent"][r] == 2 * (world - 1), (
                f"{world} gloo processes, {label}: rank {r} sent {run['messages_sent'][r]} messages, "
                f"expected {2 * (world - 1)}"
            )
        assert_ring_messages(run, flat, "allreduce", f"{world} gloo processes, {label}")
