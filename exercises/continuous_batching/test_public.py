"""Public tests for continuous_batching: three hand-worked traces, each failure says which rule to look at.

Run: make check EX=continuous_batching   (or: .venv/bin/pytest exercises/continuous_batching)

The traces go through grader/support/continuous_batching.py's `run_trace` (your Scheduler, step by step, with
the course's clock: a step costs base + per_token * tokens + per_context * context seconds) and `run_simulate`
(your simulate). Each step of the log holds "before" (running ids before schedule()), "scheduled"
([[id, n], ...]), "state" (your snapshot() after schedule(), dicts as [[id, value], ...] lists) and "emitted".
"""

import math

import pytest

DRIVER = "grader.support.continuous_batching"


@pytest.fixture(scope="module")
def sm(student):
    return student.load("continuous_batching")


class Steps(list):
    """The log's steps; reading a step the run never reached (or never finished) says what stopped it."""

    def __init__(self, log: dict):
        super().__init__(log["steps"])
        self.error = log["error"]

    def __getitem__(self, k):
        if isinstance(k, int) and self.error and (k >= len(self) or not {"scheduled", "state"} <= set(super().__getitem__(k))):
            e = self.error
            raise AssertionError(f"the trace stopped at step {min(k, len(self))}: {e['where']} raised {e['raised']}: "
                                 f"{e['message']}")
        return super().__getitem__(k)


def trace(student, sm, reqs, cfg, cost):
    steps = Steps(student.drive(f"{DRIVER}:run_trace", sm.simulate, reqs, cfg, cost))
    if not len(steps) and steps.error:
        e = steps.error
        raise AssertionError(f"{e['where']} raised {e['raised']}: {e['message']}")
    return steps


@pytest.mark.check("schedule_public")
def test_a_step_mixes_decodes_and_a_prefill_chunk(student, sm):
    # Requests 0 (prompt 3, 5 tokens) and 1 (prompt 2, 4 tokens) arrive at t = 0; request 2 (prompt 20) at t = 0.5. Each step
    # lasts 1 s, so request 2 joins before step 1. Budget 8, blocks of 4.
    reqs = [(0, 0.0, 3, 5), (1, 0.0, 2, 4), (2, 0.5, 20, 2)]
    cfg = {"max_num_batched_tokens": 8, "max_num_seqs": 4, "block_size": 4, "num_blocks": 16}
    steps = trace(student, sm, reqs, cfg, (1.0, 0.0, 0.0))
    assert steps[0]["scheduled"] == [[0, 3], [1, 2]], (
        f"step 0: expected both prompts whole, [[0, 3], [1, 2]] (5 tokens fit the budget of 8), got "
        f"{steps[0]['scheduled']}")
    assert steps[0]["emitted"] == [0, 1], (
        f"step 0 computed both prompts whole, so each emits its first token: expected update() to return [0, 1], "
        f"got {steps[0]['emitted']}")
    assert steps[1]["scheduled"] == [[0, 1], [1, 1], [2, 6]], (
        f"step 1: expected the two decodes first (1 token each) and then a 6-token chunk of request 2's prompt "
        f"with the budget left (8 - 2 = 6): [[0, 1], [1, 1], [2, 6]], got {steps[1]['scheduled']}. Running "
        "requests are scheduled before waiting ones, and with chunked prefill a prompt takes what the budget allows")
    blocks = dict(steps[1]["state"]["blocks"])
    assert blocks == {0: 1, 1: 1, 2: 2}, (
        f"after step 1's schedule(): request 0 has 3 + 1 tokens of KV (1 block of 4), request 1 has 2 + 1 "
        f"(1 block), request 2 has 6 (2 blocks): expected {{0: 1, 1: 1, 2: 2}}, got {blocks}. A request holds "
        "ceil((num_computed + n) / block_size) blocks: the blocks it already holds count toward that")
    assert steps[1]["emitted"] == [0, 1], (
        f"step 1: the decodes emit, request 2's chunk (6 of 20 prompt tokens) must not, a partial prefill chunk "
        f"emits nothing: expected [0, 1], got "
        f"{steps[1]['emitted']}")
    assert steps[2]["scheduled"] == [[0, 1], [1, 1], [2, 6]] and steps[3]["scheduled"] == [[0, 1], [1, 1], [2, 6]], (
        f"steps 2 and 3 repeat step 1 (request 2 reaches 12 then 18 of 20 tokens): got {steps[2]['scheduled']} "
        f"and {steps[3]['scheduled']}")
    assert steps[4]["scheduled"] == [[0, 1], [2, 2]] and steps[4]["emitted"] == [0, 2], (
        f"step 4: request 1 finished in step 3 (its 4th token), so step 4 is request 0's decode and the last 2 prompt "
        f"tokens of request 2, which emits its first token: expected [[0, 1], [2, 2]] emitting [0, 2], got "
        f"{steps[4]['scheduled']} emitting {steps[4]['emitted']}")


@pytest.mark.check("schedule_public")
def test_a_preemption(student, sm):
    # A pool of 4 blocks of 2 tokens. Requests 0 and 1 (prompt 3, 4 tokens each) fill it in step 0.
    reqs = [(0, 0.0, 3, 4), (1, 0.0, 3, 4)]
    cfg = {"max_num_batched_tokens": 16, "max_num_seqs": 4, "block_size": 2, "num_blocks": 4}
    steps = trace(student, sm, reqs, cfg, (1.0, 0.0, 0.0))
    assert [s["scheduled"] for s in steps[:2]] == [[[0, 3], [1, 3]], [[0, 1], [1, 1]]], (
        f"steps 0 and 1: expected [[0, 3], [1, 3]] (2 blocks each, the pool is full) then [[0, 1], [1, 1]] (4 "
        f"tokens of KV each still fit 2 blocks), got {[s['scheduled'] for s in steps[:2]]}")
    s2 = steps[2]
    assert s2["scheduled"] == [[0, 1]], (
        f"step 2: request 0 needs a 3rd block (5 tokens of KV) and none is free, so it preempts the LAST running "
        f"request, 1, and runs alone: expected [[0, 1]], got {s2['scheduled']}")
    st = s2["state"]
    assert st["running"] == [0] and st["waiting"] == [1], (
        f"step 2: after preempting request 1, running should be [0] and waiting [1] (a preempted request goes to "
        f"the front of waiting), got running {st['running']}, waiting {st['waiting']}")
    assert dict(st["computed"])[1] == 0 and dict(st["blocks"])[1] == 0 and dict(st["tokens"])[1] == 5, (
        f"step 2: the preempted request 1 should hold 0 blocks, have num_computed = 0 (its KV is gone: it will be "
        f"recomputed) and keep num_tokens = 5 (3 prompt + 2 generated); got blocks {dict(st['blocks'])[1]}, "
        f"computed {dict(st['computed'])[1]}, tokens {dict(st['tokens'])[1]}")
    assert st["free_blocks"] == 1, f"step 2: 4 blocks - request 0's 3 = 1 free, got {st['free_blocks']}"
    assert steps[3]["scheduled"] == [[0, 1]], (
        f"step 3: request 1 wants all 5 of its tokens back (3 blocks) and only 1 block is free, so the waiting pass "
        f"stops: expected [[0, 1]], got {steps[3]['scheduled']}")
    assert steps[4]["scheduled"] == [[1, 5]], (
        f"step 4: request 0 finished in step 3 (its 4th token) and freed its blocks; request 1 recomputes its 5 "
        f"tokens (prompt and the 2 it generated): expected [[1, 5]], got {steps[4]['scheduled']}")


@pytest.mark.check("metrics_public")
def test_simulate_two_requests(student, sm):
    # Step cost: 0.1 s + 0.01 s per token. Request 0 (prompt 4, 3 tokens) at t = 0; request 1 (prompt 6,
    # 2 tokens) at t = 0.05, so it joins at step 1 (t = 0.14).
    #   step 0: {0: 4}        0.14 s -> t = 0.14   token 0 of request 0
    #   step 1: {0: 1, 1: 6}  0.17 s -> t = 0.31   request 0's token 1, request 1's token 0
    #   step 2: {0: 1, 1: 1}  0.12 s -> t = 0.43   both finish
    reqs = [(0, 0.0, 4, 3), (1, 0.05, 6, 2)]
    cfg = {"max_num_batched_tokens": 8, "max_num_seqs": 4, "block_size": 4, "num_blocks": 16}
    out = student.drive(f"{DRIVER}:run_simulate", sm.simulate, reqs, cfg, (0.1, 0.01, 0.0))
    assert "error" not in out, f"simulate raised {out.get('error')}"
    times = dict(out["token_times"])
    want = {0: [0.14, 0.31, 0.43], 1: [0.31, 0.43]}
    for rid, w in want.items():
        assert len(times.get(rid, [])) == len(w) and all(math.isclose(a, b) for a, b in zip(times[rid], w)), (
            f"request {rid}'s token times: expected {w}, got {times.get(rid)}. A token is stamped at the end of the "
            "step that emitted it; request 1 arrives during step 0 and is added before step 1")
    ttft = dict(out["ttft"])
    assert math.isclose(ttft[0], 0.14) and math.isclose(ttft[1], 0.26), (
        f"TTFT is the first token's time minus the arrival: expected {{0: 0.14, 1: 0.26}}, got {ttft}")
    tbt = dict(out["tbt"])
    assert len(tbt[0]) == 2 and all(map(math.isclose, tbt[0], [0.17, 0.12])) and len(tbt[1]) == 1 \
        and math.isclose(tbt[1][0], 0.12), (
        f"TBT lists the gaps between consecutive tokens: expected {{0: [0.17, 0.12], 1: [0.12]}}, got {tbt}")
    assert math.isclose(out["makespan"], 0.43) and math.isclose(out["throughput"], 5 / 0.43), (
        f"makespan = last token - earliest arrival = 0.43 and throughput = 5 tokens / 0.43 s = {5 / 0.43:.4f}; got "
        f"{out['makespan']} and {out['throughput']}")
    assert [s[2] for s in out["steps"]] == [[[0, 4]], [[0, 1], [1, 6]], [[0, 1], [1, 1]]], (
        f"the step log's schedules: expected [{{0: 4}}, {{0: 1, 1: 6}}, {{0: 1, 1: 1}}], got {out['steps']}")
    assert all(math.isclose(s[1], d) for s, d in zip(out["steps"], [0.14, 0.17, 0.12])), (
        f"each step lasts step_time(tokens, context) = 0.1 + 0.01 * tokens here: expected durations "
        f"[0.14, 0.17, 0.12], got {[s[1] for s in out['steps']]}")
