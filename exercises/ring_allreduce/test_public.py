"""Public tests for ring all-reduce: small rings, and each failure says what to look at.

Run: make check EX=ring_allreduce   (or: .venv/bin/pytest exercises/ring_allreduce)

Your functions run on the course's simulated ring (N threads, one per rank) through
`student.drive`, which calls grader.support.ring_allreduce.run_simulated(fn, tensors, ...): rank r
runs fn(tensors[r], comm_r, ...). One test runs them on real processes over torch.distributed.
The oracles are plain sums over ranks, never a clever implementation.

The ring_allreduce tests also read every message each rank sent (run_simulated(..., trace=True)) and
compare it with what the ring must send at that step: right sums sent through some other channel (a
global variable, a file) with dummy messages do not pass.
"""

import pytest
import torch

from grader.support.ring_allreduce import chunking_cause, forbidden_collectives
from grader.testing import is_close, mismatches, show

SIMULATED = "grader.support.ring_allreduce:run_simulated"
DISTRIBUTED = "grader.support.ring_allreduce:run_distributed_cases"


@pytest.fixture(scope="module")
def ra(student):
    return student.load(
        "ring_allreduce",
        forbid=forbidden_collectives(),
        forbid_why="build the all-reduce from comm.send_recv",
    )


def rank_inputs(world: int, n: int, dtype=torch.float64) -> list[torch.Tensor]:
    """x_r[k] = 100 * r + k: every value says which rank and position it came from."""
    return [(torch.arange(n) + 100 * r).to(dtype) for r in range(world)]


def chunk_sizes(n: int, world: int) -> list[int]:
    """Sizes of torch.tensor_split(range(n), world): the first n % world chunks get one more."""
    return [n // world + (1 if c < n % world else 0) for c in range(world)]


def chunk_slice(n: int, world: int, c: int) -> slice:
    sizes = chunk_sizes(n, world)
    start = sum(sizes[:c])
    return slice(start, start + sizes[c])


def ring_messages(xs: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """What rank r sends at each step of ring_allreduce, from the contract. Reduce-scatter step s: its partial
    sum of chunk c = (r - s) % N, x_c + x_(c+1) + ... + x_r (the chunk started on rank c and picked up one rank
    per hop), in the tensor's dtype. All-gather step s: the finished chunk (r + 1 - s) % N, summed over all N
    ranks in the same ring order."""
    world, flats = len(xs), [x.reshape(-1) for x in xs]
    n = flats[0].numel()

    def ring_sum(c: int, hops: int) -> torch.Tensor:
        part = chunk_slice(n, world, c)
        acc = flats[c][part].clone()
        for k in range(1, hops + 1):
            acc = acc + flats[(c + k) % world][part]
        return acc

    return [[ring_sum((r - s) % world, s) for s in range(world - 1)]
            + [ring_sum((r + 1 - s) % world, world - 1) for s in range(world - 1)] for r in range(world)]


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


def own_chunk_cause(got: torch.Tensor, x: torch.Tensor, world: int, c: int | None, dst: int) -> str:
    """'' unless `got` is, element for element, this rank's own input of a chunk other than c; then which."""
    n = x.numel()
    for j in range(world):
        part = x.reshape(-1)[chunk_slice(n, world, j)]
        if j != c and part.numel() and part.numel() == got.numel() and torch.equal(part, got):
            finisher = (j - 1) % world
            return (f". It is this rank's own input of chunk {j}"
                    + (f", the chunk its receiver rank {dst} finishes: sending each rank the chunk it finishes is a "
                       "direct exchange, not the ring" if finisher == dst else "")
                    + (f"; in the ring, rank r sends its partial sum of chunk (r - s) % N = {c}" if c is not None
                       else ""))
    return ""


def assert_ring_messages(run: dict, xs: list[torch.Tensor], what: str) -> None:
    """Every message in run["trace"] is the one the ring sends at that step, element for element."""
    world, want = len(xs), ring_messages(xs)
    for r in range(world):
        sent = [m["sent"] for m in run["trace"][r]]
        assert len(sent) == len(want[r]), (
            f"{what}: rank {r} made {len(sent)} exchanges, expected {len(want[r])}: "
            + exchanges_cause(run["trace"][r], r, world, xs[0].numel())
        )
        for e, (got, expected) in enumerate(zip(sent, want[r])):
            phase, step = ("reduce-scatter", e) if e < world - 1 else ("all-gather", e - world + 1)
            peers = (run["trace"][r][e]["dst"], run["trace"][r][e]["src"])
            assert peers == ((r + 1) % world, (r - 1) % world), (
                f"{what}: at {phase} step {step} rank {r} sent to rank {peers[0]} and received from rank {peers[1]}; "
                f"in the ring it sends to (r + 1) % N = {(r + 1) % world} and receives from (r - 1) % N = "
                f"{(r - 1) % world}, at every step"
            )
            assert got.dtype == expected.dtype and torch.equal(got, expected), (
                f"{what}: rank {r}'s message at {phase} step {step} holds {show(got)}, the ring sends "
                f"{show(expected)} there: "
                + (f"its partial sum of chunk {(r - step) % world}" if phase == "reduce-scatter" else
                   f"the finished chunk {(r + 1 - step) % world}")
                + (". An empty message: at every step each rank sends one chunk to its right neighbour"
                   if not got.numel() and expected.numel() else "")
                + own_chunk_cause(got, xs[r], world, (r - step) % world if phase == "reduce-scatter" else None,
                                  peers[0])
                + ". comm.send_recv is the only channel between ranks, and every message must be exactly the ring's"
            )


@pytest.mark.check("rs_public")
def test_reduce_scatter_three_ranks(student, ra):
    world, n = 3, 7  # chunks of 3, 2, 2 elements
    xs = rank_inputs(world, n)
    total = sum(x.clone() for x in xs)
    run = student.drive(SIMULATED, ra.ring_reduce_scatter, [x.clone() for x in xs])
    for r in range(world):
        owned = run["returns"][r]
        assert owned == (r + 1) % world, (
            f"rank {r} returned {owned!r}; after N - 1 steps of sending right, rank r holds chunk (r + 1) % N "
            f"complete, so it should return {(r + 1) % world}"
        )
        part = chunk_slice(n, world, owned)
        got, want = run["outputs"][r][part], total[part]
        assert torch.equal(got, want), (
            f"rank {r}, chunk {owned}: found {show(got)}, expected the sum over ranks {show(want)}. "
            + (chunking_cause(xs, run["outputs"]) or
               "At step s, rank r sends chunk (r - s) % N and adds the chunk (r - s - 1) % N it receives.")
        )


@pytest.mark.check("rs_public")
def test_reduce_scatter_two_ranks_uneven(student, ra):
    world, n = 2, 5  # chunks of 3 and 2 elements
    xs = rank_inputs(world, n)
    total = xs[0] + xs[1]
    run = student.drive(SIMULATED, ra.ring_reduce_scatter, [x.clone() for x in xs])
    for r in range(world):
        owned = (r + 1) % world
        got = run["outputs"][r][chunk_slice(n, world, owned)]
        assert torch.equal(got, total[chunk_slice(n, world, owned)]), (
            f"rank {r}, chunk {owned}: found {show(got)}; with n = 5 and N = 2 the chunks are "
            "[0:3] and [3:5] (torch.tensor_split): the first n % N chunks are one element longer"
        )


@pytest.mark.check("ag_public")
def test_all_gather_overwrites(student, ra):
    world, n = 3, 8  # chunks of 3, 3, 2
    final = torch.arange(n, dtype=torch.float64) * 10 + 1
    xs = []
    for r in range(world):
        x = torch.full((n,), -1.0 - r, dtype=torch.float64)  # stale partial sums everywhere ...
        part = chunk_slice(n, world, (r + 1) % world)
        x[part] = final[part]  # ... but this rank's finished chunk
        xs.append(x)
    run = student.drive(SIMULATED, ra.ring_all_gather, xs, rank_args=[((r + 1) % world,) for r in range(world)])
    for r in range(world):
        got = run["outputs"][r]
        assert torch.equal(got, final), (
            f"rank {r} ends with {show(got)}, expected {show(final)} everywhere. "
            + ("Values are off by the stale contents: all-gather must overwrite (copy), never add. "
               if is_close(got, final, atol=5.0) else "")
            + "At step s, send chunk (owned - s) % N and receive chunk (owned - s - 1) % N into place."
        )


@pytest.mark.check("ag_public")
def test_all_gather_uses_owned(student, ra):
    world, n = 4, 6  # chunks of 2, 2, 1, 1; here rank r owns chunk r (not r + 1)
    final = torch.arange(n, dtype=torch.float64) + 1
    xs = [torch.zeros(n, dtype=torch.float64) for _ in range(world)]
    for r in range(world):
        xs[r][chunk_slice(n, world, r)] = final[chunk_slice(n, world, r)]
    run = student.drive(SIMULATED, ra.ring_all_gather, xs, rank_args=[(r,) for r in range(world)])
    for r in range(world):
        assert torch.equal(run["outputs"][r], final), (
            f"with owned = rank, rank {r} ends with {show(run['outputs'][r])}, expected {show(final)}: "
            "compute the chunk indices from `owned`, not from the rank"
        )


@pytest.mark.check("allreduce_public")
@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_sums(student, ra, world):
    for world in ([1, 2] if world == 2 else [world]):  # noqa: B020 - one rank (the identity) only beside two
        check_allreduce_sums(student, ra, world)


def check_allreduce_sums(student, ra, world: int) -> None:
    n = 10
    xs = rank_inputs(world, n, torch.int64)
    total = sum(x.clone() for x in xs)
    run = student.drive(SIMULATED, ra.ring_allreduce, [x.clone() for x in xs], trace=True)
    for r in range(world):
        got = run["outputs"][r]
        assert got.dtype == torch.int64, f"rank {r}: the tensor became {got.dtype}; keep the caller's dtype"
        assert got.shape == total.shape, f"rank {r}: the tensor's shape became {tuple(got.shape)}, expected ({n},)"
        bad = (got != total).nonzero().flatten().tolist()
        assert not bad, (
            f"N={world}, rank {r}: position {bad[0]} holds {int(got[bad[0]])}, expected {int(total[bad[0]])} "
            f"(the sum of 100*r + {bad[0]} over ranks). "
            + ("It still holds this rank's own value: is the result written into the caller's tensor? "
               if int(got[bad[0]]) == 100 * r + bad[0] else "")
        )
    assert_ring_messages(run, xs, f"N={world}, n={n}")


@pytest.mark.check("allreduce_public")
def test_allreduce_transposed_input(student, ra):
    world = 3
    bases = [torch.arange(12, dtype=torch.float32).reshape(4, 3) * (r + 1) for r in range(world)]
    xs = [b.t() for b in bases]  # shape [3, 4], not contiguous
    total = sum(x.clone() for x in xs)
    originals = [x.clone() for x in xs]
    run = student.drive(SIMULATED, ra.ring_allreduce, xs, trace=True)
    for r in range(world):
        got = run["outputs"][r]
        assert got.shape == (3, 4), f"rank {r}: shape changed to {tuple(got.shape)}"
        assert torch.equal(got, total), (
            f"rank {r}: a transposed input came back as {show(got)}, expected {show(total)}. "
            "tensor.reshape(-1) of a transpose is a copy: work on it, then copy the result back into tensor."
        )
    assert_ring_messages(run, originals, "N=3, a transposed [3, 4] input")


@pytest.mark.check("allreduce_public")
def test_allreduce_on_real_processes(student, ra):
    world = 2
    cases = [rank_inputs(world, 9, torch.float64), rank_inputs(world, 1, torch.int64)]  # n = 1: one chunk is empty
    runs = student.drive(DISTRIBUTED, ra.ring_allreduce, cases, trace=True)
    for case, run in zip(cases, runs):
        total = case[0] + case[1]
        for r in range(world):
            assert torch.equal(run["outputs"][r], total), (
                f"on 2 real processes over gloo, rank {r} holds {show(run['outputs'][r])}, "
                f"expected {show(total)}; try the same input with run_simulated, which names the culprit"
            )
        assert_ring_messages(run, case, f"on 2 real processes over gloo, n={case[0].numel()}")


@pytest.mark.check("volume_public")
@pytest.mark.parametrize("world, n", [(4, 10), (3, 2)])
def test_allreduce_sends_the_optimum(student, ra, world, n):
    run = student.drive(SIMULATED, ra.ring_allreduce, rank_inputs(world, n), trace=True)
    sizes = chunk_sizes(n, world)
    for r in range(world):
        want = 2 * n - sizes[(r + 1) % world] - sizes[(r + 2) % world]
        assert run["messages_sent"][r] == 2 * (world - 1), (
            f"N={world}, n={n}: rank {r} sent {run['messages_sent'][r]} messages, expected 2(N - 1) = "
            f"{2 * (world - 1)}: one per step, even when the chunk is empty; "
            + exchanges_cause(run["trace"][r], r, world, n)
        )
        assert run["elements_sent"][r] == want, (
            f"N={world}, n={n}: rank {r} sent {run['elements_sent'][r]} elements in messages of "
            f"{show(run['message_sizes'][r])}; the ring sends one chunk per step, {want} elements in all "
            f"(chunk sizes {sizes})"
        )
    assert_ring_messages(run, rank_inputs(world, n), f"N={world}, n={n}")
