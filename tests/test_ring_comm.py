"""The course's simulated ring communicator: counts traffic, and fails with a clear message instead
of hanging when a student's exchange is wrong."""

import pytest
import torch

from grader.support.ring_allreduce import CommError, run_simulated


def pass_right(tensor, comm):
    recv = torch.empty_like(tensor)
    comm.send_recv(tensor, (comm.rank + 1) % comm.world_size, recv, (comm.rank - 1) % comm.world_size)
    tensor.copy_(recv)


def test_a_shift_around_the_ring_is_counted():
    tensors = [torch.full((3,), float(r)) for r in range(4)]
    out = run_simulated(pass_right, tensors)
    assert [t.tolist() for t in out["outputs"]] == [[3.0] * 3, [0.0] * 3, [1.0] * 3, [2.0] * 3]
    assert out["messages_sent"] == [1, 1, 1, 1] and out["elements_sent"] == [3, 3, 3, 3]


def test_everyone_receiving_first_is_a_deadlock_not_a_hang():
    def wrong_partner(tensor, comm):
        recv = torch.empty_like(tensor)  # every rank sends to itself + 1 but expects from itself + 1 too
        comm.send_recv(tensor, (comm.rank + 1) % comm.world_size, recv, (comm.rank + 1) % comm.world_size)

    with pytest.raises(CommError):
        run_simulated(wrong_partner, [torch.zeros(2) for _ in range(3)], timeout_s=20)


def test_mismatched_buffers_are_named():
    def uneven(tensor, comm):
        recv = torch.empty(comm.rank + 1)  # rank r expects r + 1 elements; its neighbour sends 2
        comm.send_recv(tensor, (comm.rank + 1) % comm.world_size, recv, (comm.rank - 1) % comm.world_size)

    with pytest.raises(CommError) as info:
        run_simulated(uneven, [torch.zeros(2) for _ in range(3)], timeout_s=20)
    assert "rank" in str(info.value)


def test_a_rank_out_of_range_says_what_was_expected():
    def no_modulo(tensor, comm):
        recv = torch.empty_like(tensor)
        comm.send_recv(tensor, comm.rank + 1, recv, comm.rank - 1)

    with pytest.raises(CommError, match="world_size"):
        run_simulated(no_modulo, [torch.zeros(2) for _ in range(2)], timeout_s=20)
