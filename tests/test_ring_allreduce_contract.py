"""ring_allreduce's signature and the communicator clauses of its contract (issue 36).

The signature is the ring's messages: 2(N - 1) of them per rank, one chunk each, to the right neighbour, each the
ring's partial sum or finished chunk. The textbook all-reduces of tests/known_wrong/ring_allreduce.py compute the
contract's numbers bit for bit (each chunk summed in the ring order, in the tensor's dtype), so no check of results
alone can tell them from the ring: shown here in-process, on the simulated ring, together with what the counted
trace sees instead. Their grades (tests/test_scoring.py) prove that they lose every check that runs ring_allreduce
and keep those of the two phases.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from grader.hidden.ring_allreduce.oracle import exact_sum, ring_order_sum, sizes_of
from grader.support.ring_allreduce import CommError, run_simulated
from tests.conftest import ROOT
from tests.known_wrong.ring_allreduce import MUTANTS

TEXTBOOK = [m for m in MUTANTS if m.name.startswith("textbook_")]


def load_mutant(tmp_path, mutant):
    source = (ROOT / "solutions" / "ring_allreduce" / "ring_allreduce.py").read_text()
    path = tmp_path / f"{mutant.name}.py"
    path.write_text(mutant.apply(source))
    spec = importlib.util.spec_from_file_location(mutant.name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_textbook_mutants():
    assert {m.name for m in TEXTBOOK} >= {"textbook_allgather_then_sum", "textbook_root_reduce",
                                         "textbook_direct_exchange"}
    for m in TEXTBOOK:
        assert {"volume", "volume_public", "allreduce", "float_order"} <= set(m.loses), m.name
        assert {"reduce_scatter", "all_gather"} <= set(m.keeps), m.name


@pytest.mark.parametrize("mutant", TEXTBOOK, ids=[m.name for m in TEXTBOOK])
def test_a_textbook_all_reduce_has_the_contracts_numbers_and_not_its_messages(tmp_path, mutant):
    fn = load_mutant(tmp_path, mutant).ring_allreduce
    gen = torch.Generator().manual_seed(5)
    for world in (3, 4, 8):
        for n in (0, 1, world + 1, 1009, 64 * world):
            for dtype in (torch.float32, torch.bfloat16, torch.int64):
                scale = torch.exp2(torch.randint(-8, 9, (n,), generator=gen).double())
                xs = [(torch.randn(n, generator=gen, dtype=torch.float64) * scale * 100).to(dtype) for _ in range(world)]
                want = ring_order_sum(xs) if dtype.is_floating_point else exact_sum(xs)
                run = run_simulated(fn, [x.clone() for x in xs], trace=True)
                for r, out in enumerate(run["outputs"]):
                    assert out.dtype == dtype and torch.equal(out, want), (
                        f"{mutant.name}, N={world}, n={n}, {dtype}: rank {r} should hold the ring-order sum bit for "
                        "bit (the textbook mutants must differ from the ring in their messages only)"
                    )
    # What the counted trace sees, at N = 4 and n = 64 N (every chunk 64 elements): the ring sends 6 messages of
    # 64 elements per rank, to the right neighbour.
    world, n = 4, 256
    run = run_simulated(fn, [torch.randn(n, generator=gen) for _ in range(world)], trace=True)
    optimum = [2 * n - sizes_of(n, world)[(r + 1) % world] - sizes_of(n, world)[(r + 2) % world] for r in range(world)]
    peers = {(m["dst"], m["src"]) for r, msgs in enumerate(run["trace"]) for m in msgs if m["dst"] != (r + 1) % world}
    if mutant.name == "textbook_direct_exchange":  # the ring's volume, to the wrong peers: only the trace sees it
        assert run["messages_sent"] == [2 * (world - 1)] * world and run["elements_sent"] == optimum, run
        assert peers, "direct exchange must talk to ranks other than the right neighbour"
    else:  # whole tensors: more than the optimum on some rank
        assert max(e - o for e, o in zip(run["elements_sent"], optimum)) >= n // 2, (run["elements_sent"], optimum)


def test_the_communicator_refuses_overlapping_buffers_and_a_rank_itself():
    """The contract: `send` and `recv` must not overlap in memory, and `dst` and `src` must be other ranks."""

    def overlapping(tensor, comm):
        comm.send_recv(tensor[:3], (comm.rank + 1) % comm.world_size, tensor[2:5], (comm.rank - 1) % comm.world_size)

    with pytest.raises(CommError, match="overlap in memory"):
        run_simulated(overlapping, [torch.zeros(6) for _ in range(3)], timeout_s=20)

    def to_itself(tensor, comm):
        comm.send_recv(tensor, comm.rank, torch.empty_like(tensor), comm.rank)

    with pytest.raises(CommError, match="this rank itself"):
        run_simulated(to_itself, [torch.zeros(2) for _ in range(2)], timeout_s=20)

    def disjoint_halves(tensor, comm):  # the same storage, apart: allowed
        comm.send_recv(tensor[:3], (comm.rank + 1) % comm.world_size, tensor[3:], (comm.rank - 1) % comm.world_size)

    run = run_simulated(disjoint_halves, [torch.arange(6.0) + 10 * r for r in range(3)])
    assert run["outputs"][0].tolist() == [0.0, 1.0, 2.0, 20.0, 21.0, 22.0], run["outputs"][0]
