"""The shared counted collectives (grader/support/collectives.py): values, ring order and exact traffic."""

import pytest
import torch

from grader.support.collectives import CommError, run_ranks, ring_elements


def rank_inputs(world: int, shape: tuple, dtype=torch.float64) -> list[torch.Tensor]:
    """x_r = 1000 r + position: every value says which rank and position it came from."""
    n = 1
    for d in shape:
        n *= d
    return [(torch.arange(n, dtype=dtype) + 1000 * r).reshape(shape) for r in range(world)]


def run(world: int, op: str, xs: list[torch.Tensor], **kw):
    def body(rank, comm, log):
        return getattr(comm, op)(xs[rank], **kw)

    return run_ranks(body, world)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [12, 7, 2])
def test_all_reduce_values_and_counts(world, n):
    xs = rank_inputs(world, (n,))
    out = run(world, "all_reduce", xs)
    want = torch.stack(xs).sum(0)
    for r in range(world):
        torch.testing.assert_close(out["returns"][r], want, rtol=0, atol=0)
        entry, = out["logs"][r]
        assert entry["op"] == "all_reduce" and entry["shape"] == (n,)
        assert entry["messages"] == 2 * (world - 1) == out["messages_sent"][r]
        assert entry["elements"] == ring_elements("all_reduce", n, world, r) == out["elements_sent"][r]
    if n % world == 0:  # the textbook figure: 2 (p - 1) / p * n per rank
        assert all(e * world == 2 * (world - 1) * n for e in out["elements_sent"])


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_all_gather_values_and_counts(world, dim):
    xs = rank_inputs(world, (2, 3, 4))
    out = run(world, "all_gather", xs, dim=dim)
    want = torch.cat(xs, dim=dim)
    for r in range(world):
        torch.testing.assert_close(out["returns"][r], want, rtol=0, atol=0)
        assert out["elements_sent"][r] == (world - 1) * 24 == ring_elements("all_gather", 24, world)
        assert out["messages_sent"][r] == world - 1
        # (p - 1) / p of the gathered tensor
        assert out["elements_sent"][r] * world == (world - 1) * want.numel()


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("dim", [0, 1])
def test_reduce_scatter_values_and_counts(world, dim):
    shape = [12, 12]
    xs = rank_inputs(world, tuple(shape))
    out = run(world, "reduce_scatter", xs, dim=dim)
    total = torch.stack(xs).sum(0)
    for r in range(world):
        torch.testing.assert_close(out["returns"][r], total.chunk(world, dim=dim)[r], rtol=0, atol=0)
        assert out["elements_sent"][r] * world == (world - 1) * 144
        assert out["elements_sent"][r] == ring_elements("reduce_scatter", 144, world)
        assert out["logs"][r][0]["op"] == "reduce_scatter" and out["logs"][r][0]["dim"] == dim


def test_rs_plus_ag_moves_what_all_reduce_moves():
    world, n = 4, 64
    assert ring_elements("reduce_scatter", n, world) + ring_elements("all_gather", n // world, world) == \
        ring_elements("all_reduce", n, world)


def test_reduce_scatter_sums_in_ring_order():
    """Chunk c starts on rank c + 1 and picks up one rank per hop: float32 shows the order."""
    world = 3
    big, tiny = 2.0 ** 24, 1.0
    xs = [torch.full((3,), v, dtype=torch.float32) for v in (big, tiny, -big)]
    out = run(world, "reduce_scatter", xs)
    for r in range(world):
        acc = xs[(r + 1) % world][r].clone()
        for hop in range(2, world + 1):
            acc = acc + xs[(r + hop) % world][r]
        torch.testing.assert_close(out["returns"][r], acc.reshape(1), rtol=0, atol=0)


def test_collectives_return_new_tensors_and_leave_inputs():
    world = 2
    xs = rank_inputs(world, (4, 2))
    keep = [x.clone() for x in xs]

    def body(rank, comm, log):
        x = xs[rank]
        outs = [comm.all_reduce(x), comm.all_gather(x, 0), comm.reduce_scatter(x, 0)]
        return [o.data_ptr() != x.data_ptr() for o in outs]

    got = run_ranks(body, world)
    assert all(all(r) for r in got["returns"])
    for x, k in zip(xs, keep):
        torch.testing.assert_close(x, k, rtol=0, atol=0)


def test_not_differentiable():
    world = 2
    xs = [torch.ones(4, requires_grad=True) for _ in range(world)]

    def body(rank, comm, log):
        return comm.all_reduce(xs[rank] * 2).requires_grad

    assert run_ranks(body, world)["returns"] == [False, False]


def test_errors():
    with pytest.raises(ValueError, match="multiple of world_size"):
        run(2, "reduce_scatter", rank_inputs(2, (3, 2)))
    with pytest.raises(CommError):  # ranks disagree on the shape
        run(2, "all_gather", [torch.zeros(4), torch.zeros(6)])


def test_communicator_is_read_only():
    def body(rank, comm, log):
        with pytest.raises(AttributeError):
            comm.all_reduce = None
        return repr(comm)

    assert run_ranks(body, 2)["returns"] == ["Communicator(rank=0, world_size=2)", "Communicator(rank=1, world_size=2)"]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [13, 12, 3, 0])
def test_flat_pair_uneven_pieces(world, n):
    """reduce_scatter_flat and all_gather_flat cut like torch.tensor_split (uneven, even empty pieces)."""
    xs = [(torch.arange(n, dtype=torch.float64) + 1000 * r).reshape(-1) for r in range(world)]
    total = torch.stack(xs).sum(0) if n else torch.zeros(0, dtype=torch.float64)
    rs = run(world, "reduce_scatter_flat", xs)
    pieces = list(total.tensor_split(world))
    for r in range(world):
        torch.testing.assert_close(rs["returns"][r], pieces[r], rtol=0, atol=0)
        assert rs["elements_sent"][r] == ring_elements("reduce_scatter_flat", n, world, r) == n - pieces[r].numel()
        assert rs["messages_sent"][r] == world - 1
        assert rs["logs"][r][0]["op"] == "reduce_scatter_flat"
    whole = torch.arange(n, dtype=torch.float32) * 3
    mine = [p.clone() for p in whole.tensor_split(world)]

    def body(rank, comm, log):
        return comm.all_gather_flat(mine[rank], n)

    ag = run_ranks(body, world)
    for r in range(world):
        torch.testing.assert_close(ag["returns"][r], whole, rtol=0, atol=0)
        assert ag["elements_sent"][r] == ring_elements("all_gather_flat", n, world, r)
        assert ag["elements_sent"][r] == n - mine[(r + 1) % world].numel()
    # a reduce-scatter then an all-gather moves what the flat all-reduce moves, rank by rank
    for r in range(world):
        assert (ring_elements("reduce_scatter_flat", n, world, r) + ring_elements("all_gather_flat", n, world, r)
                == ring_elements("all_reduce", n, world, r))


def test_flat_pair_errors_and_observer():
    def wrong_piece(rank, comm, log):
        return comm.all_gather_flat(torch.zeros(3), 4)   # piece sizes of 4 over 2 ranks are 2, 2

    with pytest.raises(Exception, match="piece"):
        run_ranks(wrong_piece, 2, timeout_s=10)
    seen = []

    def body(rank, comm, log):
        out = comm.all_gather_flat(torch.ones(2) * rank, 4)
        return out.data_ptr()

    got = run_ranks(body, 2, on_output=lambda rank, op, out: seen.append((rank, op, out.data_ptr())))
    assert sorted((r, op) for r, op, _ in seen) == [(0, "all_gather_flat"), (1, "all_gather_flat")]
    assert {r: p for r, _, p in seen} == dict(enumerate(got["returns"]))
