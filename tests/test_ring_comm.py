"""The course's communicators for ring all-reduce: the simulated ring counts traffic and fails with a
clear message instead of hanging when a student's exchange is wrong; the real one over gloo sums,
counts, names a mismatch, and inherits the grader's guard against library collectives. Also a smoke
run of the benchmark."""

from pathlib import Path

import pytest
import torch

from grader.support.ring_allreduce import (CommError, RankFailed, forbidden_collectives, message_digest, run_distributed,
                                          run_simulated)

ROOT = Path(__file__).resolve().parents[1]


def pass_right(tensor, comm):
    recv = torch.empty_like(tensor)
    comm.send_recv(tensor, (comm.rank + 1) % comm.world_size, recv, (comm.rank - 1) % comm.world_size)
    tensor.copy_(recv)


def test_a_shift_around_the_ring_is_counted():
    tensors = [torch.full((3,), float(r)) for r in range(4)]
    out = run_simulated(pass_right, tensors)
    assert [t.tolist() for t in out["outputs"]] == [[3.0] * 3, [0.0] * 3, [1.0] * 3, [2.0] * 3]
    assert out["messages_sent"] == [1, 1, 1, 1] and out["elements_sent"] == [3, 3, 3, 3]


def test_a_traced_run_keeps_a_copy_of_every_message():
    tensors = [torch.full((2, 3), float(r)).t() for r in range(3)]  # non-contiguous: the trace holds flat copies
    out = run_simulated(pass_right, tensors, trace=True)
    assert [[(m["dst"], m["src"], m["sent"].tolist()) for m in t] for t in out["trace"]] == [
        [(1, 2, [0.0] * 6)], [(2, 0, [1.0] * 6)], [(0, 1, [2.0] * 6)]]
    assert "trace" not in run_simulated(pass_right, [torch.zeros(2) for _ in range(2)])


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


def test_a_returned_peer_and_a_lost_message_are_named():
    def rank0_stops_early(tensor, comm):
        recv = torch.empty_like(tensor)
        steps = 1 if comm.rank == 0 else 2  # rank 0 makes one exchange fewer than the others
        for _ in range(steps):
            comm.send_recv(tensor, (comm.rank + 1) % comm.world_size, recv, (comm.rank - 1) % comm.world_size)

    with pytest.raises(CommError, match="same number of exchanges|never received"):
        run_simulated(rank0_stops_early, [torch.zeros(2) for _ in range(3)], timeout_s=20)


# --------------------------------------------------------------------------------------------------
# The real communicator: N forked processes over gloo (a few seconds each)


def test_real_processes_count_and_sum():
    out = run_distributed(pass_right, [torch.full((3,), float(r)) for r in range(3)])
    assert [t.tolist() for t in out["outputs"]] == [[2.0] * 3, [0.0] * 3, [1.0] * 3]
    assert out["messages_sent"] == [1, 1, 1] and out["elements_sent"] == [3, 3, 3]


def test_real_processes_name_a_dtype_mismatch_instead_of_crashing_gloo():
    def wrong_dtype(tensor, comm):
        recv = torch.empty(tensor.numel(), dtype=torch.float64)  # the neighbour sends float32
        comm.send_recv(tensor, (comm.rank + 1) % comm.world_size, recv, (comm.rank - 1) % comm.world_size)

    with pytest.raises(RankFailed) as info:
        run_distributed(wrong_dtype, [torch.zeros(4) for _ in range(2)], timeout_s=30)
    text = str(info.value)
    assert "CommError" in text and "float32" in text and "float64" in text, text


def test_the_collectives_guard_reaches_the_forked_ranks():
    """The grader's guard is installed in the worker before it forks the ranks; they inherit it."""
    import torch.distributed as dist

    from grader.harness.guard import forbidden

    def cheat(tensor, comm):
        dist.all_reduce(tensor)

    original = dist.all_reduce
    with forbidden(forbidden_collectives(), "build the all-reduce from comm.send_recv"):
        with pytest.raises(RankFailed, match=r"must not call torch\.distributed\.all_reduce"):
            run_distributed(cheat, [torch.ones(4) for _ in range(2)], timeout_s=30)
    assert dist.all_reduce is original


def test_the_benchmark_reports_volume_and_bus_bandwidth(capsys):
    from grader.bench.ring_allreduce import main

    main([str(ROOT / "solutions" / "ring_allreduce" / "ring_allreduce.py"), "--worlds", "2", "--sizes-mb", "0.05",
          "--reps", "1"])
    out = capsys.readouterr().out
    assert "1835014 (1.7500,  14 msgs)" in out  # N = 8, n = 2^20 + 3: the optimum, met by the reference
    marked = [line for line in out.splitlines() if "!" in line and "'!' marks" not in line]
    assert not marked, out  # every rank sent its optimum, and every result equals all_reduce's
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("2 ") and "0.05" in line]
    assert rows and len(rows[0]) == 5, out  # N, MB, gloo's busbw, the submission's, and their ratio
    assert float(rows[0][4]) > 0, out


# --------------------------------------------------------------------------------------------------
# What a rank sees, and the trace the grader reads


def test_a_rank_sees_only_rank_world_size_and_send_recv():
    seen = {}

    def peek(tensor, comm):
        seen[comm.rank] = (comm.world_size, sorted(n for n in dir(comm) if not n.startswith("__")))
        for name in ("_counters", "_ring", "_trace", "_dist", "stats", "messages_sent"):
            assert not hasattr(comm, name), name
        with pytest.raises(AttributeError):
            comm.rank = 5
        with pytest.raises(AttributeError):
            comm.send_recv = print
        pass_right(tensor, comm)

    out = run_simulated(peek, [torch.zeros(2) for _ in range(3)], trace=True)
    assert seen == {r: (3, ["rank", "send_recv", "world_size"]) for r in range(3)}, seen
    assert out["messages_sent"] == [1, 1, 1]


def test_the_trace_holds_what_was_delivered_and_digests_match_it():
    def pass_then_scribble(tensor, comm):
        pass_right(tensor, comm)
        tensor.fill_(-1.0)  # changing the buffer after sending does not change what was sent

    tensors = [torch.arange(4.0) + 10 * r for r in range(3)]
    copies = run_simulated(pass_then_scribble, [t.clone() for t in tensors], trace=True)["trace"]
    digests = run_simulated(pass_then_scribble, [t.clone() for t in tensors], trace="digest")["trace"]
    for r in range(3):
        assert torch.equal(copies[r][0]["sent"], tensors[r]), copies[r]
        assert digests[r][0] == {"dst": (r + 1) % 3, "src": (r - 1) % 3, "dtype": "float32", "numel": 4,
                                 "digest": message_digest(tensors[r])}, digests[r]
    with pytest.raises(ValueError, match="trace"):
        run_simulated(pass_right, tensors, trace="all")


def test_a_digest_sees_every_bit_but_the_sign_of_zero():
    a = torch.tensor([1.0, -0.0, 3.0])
    assert message_digest(a) == message_digest(torch.tensor([1.0, 0.0, 3.0]))
    assert message_digest(a) != message_digest(torch.tensor([1.0, 0.0, 3.0000002]))
    assert message_digest(a) != message_digest(a.double())  # the dtype is part of the message
    assert message_digest(torch.arange(6)[::2]) == message_digest(torch.tensor([0, 2, 4]))  # any layout: its elements
    assert message_digest(torch.ones(2, dtype=torch.bfloat16)) != message_digest(torch.ones(3, dtype=torch.bfloat16))


def test_real_processes_record_every_message():
    out = run_distributed(pass_right, [torch.full((3,), float(r)) for r in range(2)], trace="digest")
    assert out["trace"] == [
        [{"dst": 1, "src": 1, "dtype": "float32", "numel": 3, "digest": message_digest(torch.zeros(3))}],
        [{"dst": 0, "src": 0, "dtype": "float32", "numel": 3, "digest": message_digest(torch.ones(3))}],
    ], out["trace"]
    assert "trace" not in run_distributed(pass_right, [torch.zeros(1) for _ in range(2)])
