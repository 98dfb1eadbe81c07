"""Hidden checks for continuous_batching: a token-budget scheduler with vLLM v1's rules, and its simulator
(grader/support/continuous_batching.py runs the student's Scheduler over a whole trace and logs every step).

The oracle (oracle.py) is a per-step simulator on plain lists written from vLLM v1's `Scheduler.schedule` and
`_preempt_request`: real block numbers taken from and given back to a free list, one request at a time.

The signature: decodes are never stalled behind a long prefill. `stall_free` serves a crafted trace (8 requests
decoding when a prompt of 3,000-5,000 tokens arrives) through the student's `simulate`: with chunked prefill and a
512-token budget the longest gap between two tokens of a decoding request is at most one full step's cost, and the
prompt's first token comes within the steps its chunks need, plus one; without chunking the longest gap is at
least the whole prefill's. A scheduler that admits waiting prefills before running decodes, or
runs prefill-only steps (the textbook, vLLM v0's default), fails it. `scaling` counts the lines of the student's
file that the same 24 steps run after 8 and after 2,048 finished requests. They cannot see a scheduler that
behaves on these traces and not on others (`schedule_equal` compares every step on random traces for that), nor
work outside the student's file (a scan in a library call counts one line).

Contract clauses (README "The contract") and the tests that draw them:

| clause | tests |
| --- | --- |
| Scheduler(config): the ValueErrors of a bad config | test_config_errors |
| add: back of waiting; ValueErrors (sizes, duplicate id, never fits the pool or the budget) | test_add_errors, test_schedule_equals_the_oracle |
| schedule: running first, in order; threshold, then budget; blocks = ceil((computed + n) / block_size) | test_schedule_equals_the_oracle, test_invariants |
| schedule: preempt the last running request until it fits or preempts itself; recompute; front of waiting | test_preemption_by_hand, test_preemption_random, test_invariants |
| schedule: waiting only when nothing was preempted; max_num_seqs; unchunked stops; short pool stops | test_schedule_equals_the_oracle, test_preemption_by_hand |
| update: num_computed += n; a token only on catching up; finish frees blocks; returns the emitters | test_schedule_equals_the_oracle, test_metrics |
| snapshot: running, waiting, computed, tokens, blocks, free_blocks | test_schedule_equals_the_oracle, test_invariants |
| simulate: the clock, arrivals, idle jumps, step_time(tokens, context), metrics, steps, errors | test_metrics, test_simulate_errors |
| decodes never wait behind a prefill (the signature) | test_stall_free |
| a step's cost does not grow with finished requests | test_scaling |
"""

from __future__ import annotations

import math
import random

import pytest

from grader.hidden.continuous_batching.oracle import oracle_metrics, oracle_run
from grader.testing import show

DRIVER = "grader.support.continuous_batching"
COST = (0.004, 2e-5, 1e-7)  # a step: 4 ms + 20 us per batched token + 0.1 us per token of attended context


@pytest.fixture(scope="module")
def sm(student):
    return student.load("continuous_batching")


def run(student, sm, reqs, cfg, cost=COST):
    return student.drive(f"{DRIVER}:run_trace", sm.simulate, reqs, cfg, cost)


def fmt_cfg(cfg: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def draw_trace(r: random.Random, kind: str) -> tuple[list, dict]:
    """A random trace and config of one kind; every request fits (add must accept it)."""
    n = r.randint(2, 16)
    bs = r.choice([1, 2, 4, 16])
    arrivals = {"bursty": lambda: r.choice([0.0, 0.0, 0.05, 0.2]) + r.random() * 0.01,
                "spread": lambda: r.random() * 0.5}[r.choice(["bursty", "spread"])]
    prompt = (lambda: r.randint(100, 400)) if kind == "long_prompts" else (lambda: r.randint(1, 60))
    reqs = [(k, round(arrivals(), 4), prompt(), r.randint(1, 24)) for k in range(n)]
    r.shuffle(reqs)
    longest = max(p + m - 1 for _, _, p, m in reqs)
    cfg = {"max_num_batched_tokens": r.choice([16, 64, 256]), "max_num_seqs": r.randint(1, 10), "block_size": bs,
           "num_blocks": math.ceil(longest / bs) + r.randint(4, 60), "enable_chunked_prefill": True,
           "long_prefill_token_threshold": 0}
    if kind == "tiny_budget":
        cfg["max_num_batched_tokens"] = r.randint(2, 8)
    elif kind == "huge_budget":
        cfg["max_num_batched_tokens"] = 100_000
        cfg["max_num_seqs"] = r.randint(8, 32)
    elif kind == "unchunked":
        cfg["enable_chunked_prefill"] = False
        cfg["max_num_batched_tokens"] = longest + r.choice([0, 0, 5, 100])
    elif kind == "threshold":
        cfg["long_prefill_token_threshold"] = r.randint(1, 40)
    elif kind == "small_pool":
        cfg["num_blocks"] = math.ceil(longest / bs) + r.randint(0, 3)
        cfg["max_num_seqs"] = r.randint(3, 10)
        cfg["max_num_batched_tokens"] = r.choice([32, 128, 1000])
        cfg["long_prefill_token_threshold"] = r.choice([0, 0, r.randint(1, 20)])
        cfg["enable_chunked_prefill"] = r.random() < 0.7 or cfg["long_prefill_token_threshold"] > 0
        if not cfg["enable_chunked_prefill"]:
            cfg["max_num_batched_tokens"] = max(cfg["max_num_batched_tokens"], longest)
    return reqs, cfg


def as_dict(pairs) -> dict:
    return {k: v for k, v in pairs} if isinstance(pairs, list) else {}


def preempted_in(step: dict) -> list:
    """The ids that left running during schedule(): the step's preemptions (finishing happens in update)."""
    state = step.get("state") or {}
    running = state.get("running") if isinstance(state, dict) else None
    if not isinstance(running, list):
        return []
    return [rid for rid in step.get("before", []) if rid not in running]


def explain_step(k: int, got: dict, want: dict, cfg: dict) -> str | None:
    """Why step `k` of the student's log differs from the oracle's, naming the rule; None if it does not."""
    where = f"step {k} (t = {want['start']:.6f} s; config {fmt_cfg(cfg)})"
    g_sched, w_sched = got.get("scheduled"), want["scheduled"]
    g_state, w_state = got.get("state"), want["state"]
    if not isinstance(g_state, dict):
        return f"{where}: snapshot() returned {show(g_state)}, expected a dict with running, waiting, ..."
    g_pre, w_pre = preempted_in(got), preempted_in(want)
    before = want["before"]
    g_comp = as_dict(g_state.get("computed"))
    g_ids = [rid for rid, _ in g_sched] if isinstance(g_sched, list) else []
    again = [rid for rid in w_pre if rid not in g_pre and rid in g_ids and g_comp.get(rid) == 0]
    if again:
        return (f"{where}: request {again[0]} was preempted (its num_computed is back to 0) and admitted again in "
                "the same step; a step that preempts admits no waiting request (the waiting pass runs only if "
                "nothing was preempted)")
    if sorted(g_pre) != sorted(w_pre):
        if w_pre and g_pre and set(g_pre) <= set(before[: len(g_pre)]):
            return (f"{where}: the pool was short and you preempted {show(g_pre)}, the oldest running requests (running "
                    f"was {before}); the rules preempt {w_pre}: the LAST running request (the newest) first, again "
                    "and again until the request fits or has preempted itself")
        return (f"{where}: running was {before}; you preempted {show(g_pre)}, the rules preempt {w_pre} (a running "
                "request that the pool cannot grow preempts the last running request, newest first, and retries)")
    g_new = [rid for rid, _ in g_sched if rid not in before] if isinstance(g_sched, list) else []
    if w_pre and g_new:
        return (f"{where}: you preempted {show(g_pre)} and in the same step admitted waiting requests {show(g_new)}; a step "
                "that preempts admits no waiting request (the waiting pass runs only if nothing was preempted)")
    if g_pre:
        kept = {rid: g_comp.get(rid) for rid in g_pre if g_comp.get(rid) != 0}
        if kept:
            return (f"{where}: the preempted requests kept num_computed = {show(kept)} (id: num_computed); "
                    "preemption is by recompute: free every block and reset num_computed to 0 (num_tokens stays)")
        if g_state.get("waiting") != w_state["waiting"]:
            return (f"{where}: after preempting {show(g_pre)}, waiting is {show(g_state.get('waiting'))}, the rules give "
                    f"{w_state['waiting']}: each preempted request goes to the FRONT of waiting (vLLM's "
                    "prepend_request), so the last one preempted is first")
    if g_sched != w_sched:
        if isinstance(g_sched, list) and g_sched and g_sched[0][0] not in before and before:
            return (f"{where}: you scheduled {show(g_sched)} with waiting request {g_sched[0][0]} before the running "
                    f"requests {before}; the rules give {w_sched}. Schedule the running requests first (their "
                    "decodes), then admit waiting ones with the budget left: decodes never wait behind a prefill")
        w_new = [rid for rid, _ in w_sched if rid not in before]
        if w_new and not w_pre and isinstance(g_sched, list) and not set(w_new) & {rid for rid, _ in g_sched}:
            left = cfg["max_num_batched_tokens"] - sum(n for rid, n in w_sched if rid in before)
            return (f"{where}: you scheduled {show(g_sched)} and admitted none of the waiting requests; the rules give "
                    f"{w_sched}: after the running requests, waiting ones are admitted with the budget left in every "
                    f"step ({left} tokens here), while fewer than max_num_seqs run and the pool can give their blocks")
        return (f"{where}: you scheduled {show(g_sched)}, the rules give {w_sched} (running was {before}, waiting "
                f"{want['state']['waiting'] if not w_pre else '...'}; look at the budget, the threshold, max_num_seqs, "
                "the chunking rule and the pool)")
    g_blocks, w_blocks = as_dict(g_state.get("blocks")), as_dict(w_state["blocks"])
    if g_blocks != w_blocks or g_state.get("free_blocks") != w_state["free_blocks"]:
        comp = as_dict(w_state["computed"])
        n_of = as_dict(w_sched)
        for rid in sorted(w_blocks):
            if g_blocks.get(rid) != w_blocks[rid]:
                toks = comp.get(rid, 0) + n_of.get(rid, 0)
                return (f"{where}: request {rid} holds {g_blocks.get(rid)} blocks after schedule(); with "
                        f"{toks} tokens of KV (num_computed {comp.get(rid)} + {n_of.get(rid, 0)} scheduled) it needs "
                        f"ceil({toks} / {cfg['block_size']}) = {w_blocks[rid]}: the blocks it already holds count "
                        "toward the need, allocate only the difference")
        return (f"{where}: free_blocks is {g_state.get('free_blocks')}, the rules leave {w_state['free_blocks']}: "
                "every block is either free or held by exactly one unfinished request")
    for key in ("running", "waiting", "computed", "tokens"):
        g, w = g_state.get(key), w_state[key]
        if key in ("computed", "tokens"):
            g, w = as_dict(g), as_dict(w)
        if g != w:
            return f"{where}: snapshot()['{key}'] after schedule() is {show(g)}, the rules give {show(w)}"
    if got.get("emitted") != want["emitted"]:
        comp, toks = as_dict(w_state["computed"]), as_dict(w_state["tokens"])
        n_of = as_dict(w_sched)
        extra = [rid for rid in (got.get("emitted") or []) if rid not in want["emitted"]]
        partial = [rid for rid in extra if comp.get(rid, 0) + n_of.get(rid, 0) < toks.get(rid, 0)]
        if partial:
            rid = partial[0]
            return (f"{where}: request {rid} emitted a token after a partial prefill chunk ({n_of.get(rid)} tokens "
                    f"brought num_computed to {comp.get(rid, 0) + n_of.get(rid, 0)} of its {toks.get(rid)}); a token "
                    "is emitted only when num_computed reaches num_tokens: a partial chunk emits nothing")
        return (f"{where}: update() returned {show(got.get('emitted'))}, the rules emit {want['emitted']} (a token for "
                "each request whose num_computed reaches its num_tokens, in scheduled order)")
    return None


def assert_log_matches(got: dict, want: dict, cfg: dict, what: str) -> None:
    gsteps, wsteps = got["steps"], want["steps"]
    for k, w in enumerate(wsteps):
        if k >= len(gsteps):
            break
        why = explain_step(k, gsteps[k], w, cfg)
        assert why is None, f"{what}: {why}"
    err = got.get("error")
    if err:
        k = len(gsteps) - 1
        raise AssertionError(f"{what}: {err.get('where')} raised {err.get('raised')}: {err.get('message')} "
                             f"(the rules run {len(wsteps)} steps; step {k} of yours matched up to there)")
    assert len(gsteps) == len(wsteps), (
        f"{what}: your scheduler took {len(gsteps)} steps, the rules {len(wsteps)}")


# --------------------------------------------------------------------------------------------------
# schedule_equal: every step against the oracle

KINDS = ["bursty", "long_prompts", "tiny_budget", "huge_budget", "unchunked", "threshold"]


@pytest.mark.check("schedule_equal")
@pytest.mark.parametrize("kind", KINDS)
def test_schedule_equals_the_oracle(student, sm, seed, kind):
    r = random.Random(f"{seed}-{kind}")
    for trial in range(5):
        reqs, cfg = draw_trace(r, kind)
        got = run(student, sm, reqs, cfg)
        assert_log_matches(got, oracle_run(reqs, cfg, COST), cfg, f"{kind} trace {trial} ({len(reqs)} requests)")


@pytest.mark.check("schedule_equal")
def test_config_errors(student, sm):
    ok = {"max_num_batched_tokens": 8, "max_num_seqs": 2, "block_size": 4, "num_blocks": 8}
    assert student.drive(f"{DRIVER}:try_config", sm.simulate, ok) == {"ok": True}, (
        f"Scheduler(Config({fmt_cfg(ok)})) is valid and must not raise")
    for field, bad in (("max_num_batched_tokens", 0), ("max_num_seqs", 0), ("block_size", 0), ("num_blocks", 0),
                       ("long_prefill_token_threshold", -1)):
        cfg = {**ok, field: bad}
        out = student.drive(f"{DRIVER}:try_config", sm.simulate, cfg)
        assert out.get("raised") == "ValueError", f"Scheduler(Config({fmt_cfg(cfg)})): expected ValueError, got {out}"
    cfg = {**ok, "enable_chunked_prefill": False, "long_prefill_token_threshold": 4}
    out = student.drive(f"{DRIVER}:try_config", sm.simulate, cfg)
    assert out.get("raised") == "ValueError", (
        f"Scheduler(Config({fmt_cfg(cfg)})): a threshold cuts prompts into chunks, so it needs chunked prefill: "
        f"expected ValueError, got {out}")


@pytest.mark.check("schedule_equal")
def test_add_errors(student, sm):
    cfg = {"max_num_batched_tokens": 8, "max_num_seqs": 2, "block_size": 4, "num_blocks": 4}
    fits = [(0, 0.0, 10, 7)]  # 16 tokens of KV at most: 4 blocks, exactly the pool
    assert student.drive(f"{DRIVER}:try_add", sm.simulate, cfg, fits) == {"ok": True}, (
        "add((0, 0.0, 10, 7)) on a pool of 4 blocks of 4 must be accepted: its KV peaks at 10 + 7 - 1 = 16 tokens")
    cases = [
        ([(0, 0.0, 0, 3)], "a prompt of 0 tokens"),
        ([(0, 0.0, 3, 0)], "max_tokens = 0"),
        ([(0, 0.0, 10, 8)], "a request whose KV peaks at 10 + 8 - 1 = 17 tokens, 5 blocks, in a pool of 4"),
        ([(0, 0.0, 3, 3), (0, 0.0, 4, 2)], "a second unfinished request with the same id"),
    ]
    for reqs, what in cases:
        out = student.drive(f"{DRIVER}:try_add", sm.simulate, cfg, reqs)
        assert out.get("raised") == "ValueError" and out.get("index") == len(reqs) - 1, (
            f"add: {what}: expected ValueError from the last add, got {out}")
    unchunked = {**cfg, "num_blocks": 100, "enable_chunked_prefill": False}
    out = student.drive(f"{DRIVER}:try_add", sm.simulate, unchunked, [(0, 0.0, 6, 3)])
    assert out == {"ok": True}, (
        "add without chunked prefill: prompt 6, max_tokens 3 can need a prefill of 6 + 3 - 1 = 8 tokens after a late "
        f"preemption, which fits the budget of 8: it must be accepted, got {out}")
    out = student.drive(f"{DRIVER}:try_add", sm.simulate, unchunked, [(0, 0.0, 6, 4)])
    assert out.get("raised") == "ValueError", (
        "add without chunked prefill: prompt 6, max_tokens 4 can need a prefill of 6 + 4 - 1 = 9 tokens, more than "
        f"the budget of 8, which would never be scheduled: expected ValueError, got {out}")


# --------------------------------------------------------------------------------------------------
# invariants: the student's own log, step by step


@pytest.mark.check("invariants")
@pytest.mark.parametrize("kind", ["small_pool", "threshold", "unchunked"])
def test_invariants(student, sm, seed, kind):
    r = random.Random(f"{seed}-inv-{kind}")
    for trial in range(6):
        reqs, cfg = draw_trace(r, kind)
        got = run(student, sm, reqs, cfg)
        what = f"{kind} trace {trial} ({len(reqs)} requests; config {fmt_cfg(cfg)})"
        for k, step in enumerate(got["steps"]):
            if "state" not in step or not isinstance(step["state"], dict):
                break
            st, sched = step["state"], as_dict(step.get("scheduled"))
            comp, toks, blocks = as_dict(st.get("computed")), as_dict(st.get("tokens")), as_dict(st.get("blocks"))
            total = sum(sched.values())
            assert total <= cfg["max_num_batched_tokens"], (
                f"{what}, step {k}: {total} tokens scheduled, over the budget of {cfg['max_num_batched_tokens']}")
            assert len(st["running"]) <= cfg["max_num_seqs"], (
                f"{what}, step {k}: {len(st['running'])} running requests, over max_num_seqs = {cfg['max_num_seqs']}")
            held = sum(blocks.values())
            assert held + (st.get("free_blocks") or 0) == cfg["num_blocks"], (
                f"{what}, step {k}: the requests hold {held} blocks and {st.get('free_blocks')} are free, of a pool of "
                f"{cfg['num_blocks']}: a block is lost or counted twice")
            for rid, b in blocks.items():
                need = math.ceil((comp.get(rid, 0) + sched.get(rid, 0)) / cfg["block_size"])
                if b < math.ceil(comp.get(rid, 0) / cfg["block_size"]):
                    raise AssertionError(
                        f"{what}, step {k}: request {rid} has num_computed = {comp.get(rid)} but holds {b} blocks: "
                        "tokens computed without their KV. A preempted request loses its blocks, so it must restart "
                        "from num_computed = 0 (recompute)")
                assert b == need, (
                    f"{what}, step {k}: request {rid} holds {b} blocks for {comp.get(rid, 0)} computed + "
                    f"{sched.get(rid, 0)} scheduled tokens; it needs exactly ceil(that / {cfg['block_size']}) = {need}:"
                    " the blocks it already holds count toward the need")
            for rid, n in sched.items():
                assert 1 <= n <= toks.get(rid, 0) - comp.get(rid, 0), (
                    f"{what}, step {k}: request {rid} was scheduled {n} tokens with num_tokens = {toks.get(rid)} and "
                    f"num_computed = {comp.get(rid)}: between 1 and the tokens it has not computed")
                assert rid in st["running"], f"{what}, step {k}: request {rid} was scheduled but is not running"
        assert got.get("error") is None, f"{what}: {got['error']}"


# --------------------------------------------------------------------------------------------------
# preemption


@pytest.mark.check("preemption")
def test_preemption_by_hand(student, sm):
    # Four requests of prompt 4 on a pool of 8 blocks of 2: all admitted at once (2 blocks each), then each
    # decode needs a third block: request 0 preempts 3 then 2; request 1 then fits.
    reqs = [(k, 0.0, 4, 6) for k in range(4)] + [(4, 0.0, 2, 2)]
    cfg = {"max_num_batched_tokens": 64, "max_num_seqs": 8, "block_size": 2, "num_blocks": 8}
    assert_log_matches(run(student, sm, reqs, cfg), oracle_run(reqs, cfg, COST), cfg,
                       "4 requests of prompt 4 and 1 of prompt 2 on 8 blocks of 2")


@pytest.mark.check("preemption")
@pytest.mark.parametrize("trial", range(3))
def test_preemption_random(student, sm, seed, trial):
    r = random.Random(f"{seed}-pre-{trial}")
    seen = 0
    for sub in range(5):
        reqs, cfg = draw_trace(r, "small_pool")
        want = oracle_run(reqs, cfg, COST)
        seen += sum(len(s["preempted"]) for s in want["steps"])
        assert_log_matches(run(student, sm, reqs, cfg), want, cfg, f"small-pool trace {sub} ({len(reqs)} requests)")
    assert seen > 0, "these traces preempted nothing: the test drew no preemption (report this to the course)"


# --------------------------------------------------------------------------------------------------
# metrics: simulate against the oracle


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 + 1e-9 * abs(b)


@pytest.mark.check("metrics")
@pytest.mark.parametrize("kind", ["bursty", "long_prompts", "small_pool", "unchunked"])
def test_metrics(student, sm, seed, kind):
    r = random.Random(f"{seed}-met-{kind}")
    for trial in range(3):
        reqs, cfg = draw_trace(r, kind)
        if trial == 0:  # an idle gap: the clock jumps to the next arrival
            reqs = reqs + [(99, 30.0 + r.random(), r.randint(1, 8), r.randint(1, 4))]
        what = f"simulate on a {kind} trace ({len(reqs)} requests; config {fmt_cfg(cfg)})"
        got = student.drive(f"{DRIVER}:run_simulate", sm.simulate, reqs, cfg, COST)
        assert "error" not in got, f"{what}: {got.get('error')}"
        want_run = oracle_run(reqs, cfg, COST)
        want = oracle_metrics(reqs, want_run)
        times = as_dict(got["token_times"])
        for rid in sorted(want["token_times"]):
            w, g = want["token_times"][rid], times.get(rid)
            assert isinstance(g, list) and len(g) == len(w), (
                f"{what}: request {rid} has {len(g) if isinstance(g, list) else show(g)} token times, expected "
                f"{len(w)} (one per generated token)")
            for j, (a, b) in enumerate(zip(g, w)):
                if not close(a, b):
                    hint = ("earlier than the rules: a token is emitted only when a request's num_computed reaches "
                            "num_tokens; a partial prefill chunk emits nothing" if a < b and j == 0 else
                            "check the clock: a token is stamped at the END of its step, a step lasts "
                            "step_time(tokens scheduled, context) with context = sum of (num_computed before + n)")
                    raise AssertionError(f"{what}: request {rid}'s token {j} at t = {a:.6f}, the rules give "
                                         f"{b:.6f}: {hint}")
        for key in ("ttft", "tbt"):
            g = as_dict(got[key])
            for rid, w in want[key].items():
                ok = (close(g.get(rid, math.nan), w) if key == "ttft" else
                      isinstance(g.get(rid), list) and len(g[rid]) == len(w) and all(map(close, g[rid], w)))
                assert ok, f"{what}: {key} of request {rid} is {show(g.get(rid))}, expected {show(w)}"
        assert close(got["makespan"], want["makespan"]), (
            f"{what}: makespan {got['makespan']}, expected {want['makespan']} (last token's t - earliest arrival)")
        assert close(got["throughput"], want["throughput"]), (
            f"{what}: throughput {got['throughput']}, expected {want['throughput']} (tokens emitted / makespan)")
        steps = got["steps"]
        assert len(steps) == len(want_run["steps"]), (
            f"{what}: {len(steps)} steps in the log, the rules take {len(want_run['steps'])}")
        for k, (g, w) in enumerate(zip(steps, want_run["steps"])):
            dur = w["end"] - w["start"]
            assert close(g[0], w["start"]) and close(g[1], dur) and g[2] == w["scheduled"], (
                f"{what}: step {k} is (start {show(g[0])}, duration {show(g[1])}, {show(g[2])}), the rules give "
                f"({w['start']}, {dur}, {show(w['scheduled'])})")


@pytest.mark.check("metrics")
def test_simulate_errors(student, sm):
    cfg = {"max_num_batched_tokens": 8, "max_num_seqs": 2, "block_size": 4, "num_blocks": 8}
    for reqs, what in (([(0, -1.0, 2, 2)], "an arrival at -1.0"), ([(0, 0.0, 2, 2), (0, 0.1, 3, 1)], "two requests "
                                                                                                     "with id 0")):
        got = student.drive(f"{DRIVER}:run_simulate", sm.simulate, reqs, cfg, COST)
        assert (got.get("error") or {}).get("raised") == "ValueError", f"simulate with {what}: expected ValueError, got {got.get('error')}"
    got = student.drive(f"{DRIVER}:run_simulate", sm.simulate, [(0, 0.0, 2, 2)], cfg, COST)
    assert "error" not in got, f"simulate on one request of prompt 2, max_tokens 2: {got.get('error')}"


# --------------------------------------------------------------------------------------------------
# stall_free: the signature


def stall_case(r: random.Random) -> tuple[list, int, int]:
    decoders = 8
    prompt = r.randint(3000, 5000)
    reqs = [(k, 0.0, r.randint(16, 64), 160) for k in range(decoders)]
    reqs.append((decoders, round(0.05 + 0.05 * r.random(), 4), prompt, 4))
    return reqs, decoders, prompt


@pytest.mark.check("stall_free")
def test_stall_free(student, sm, seed):
    r = random.Random(f"{seed}-stall")
    reqs, decoders, prompt = stall_case(r)
    base, per_token, per_context = COST
    ctx_max = sum(p + m for _, _, p, m in reqs)
    budget = 512
    chunked = {"max_num_batched_tokens": budget, "max_num_seqs": 16, "block_size": 16, "num_blocks": 2000}
    got = student.drive(f"{DRIVER}:run_simulate", sm.simulate, reqs, chunked, COST)
    assert "error" not in got, f"simulate on the stall trace (chunked, budget {budget}): {got.get('error')}"
    tbt = as_dict(got["tbt"])
    worst = max((max(tbt.get(k) or [0.0]) for k in range(decoders)), default=0.0)
    bound = base + per_token * budget + per_context * ctx_max
    assert worst <= bound, (
        f"{decoders} requests were decoding when a {prompt}-token prompt arrived; with chunked prefill and a "
        f"{budget}-token budget the longest gap between two of their tokens was {worst:.4f} s, but one full step "
        f"costs at most {bound:.4f} s: a decode waited behind the prefill. Schedule the running requests (their "
        "decodes) first in every step and give the prompt only the budget left, one chunk per step "
        "(stall-free batching, Sarathi-Serve)")
    ttft = as_dict(got["ttft"]).get(decoders)
    steps = math.ceil(prompt / (budget - decoders)) + 1  # + 1: it arrives during a step and waits for its end
    assert isinstance(ttft, float) and ttft <= steps * bound, (
        f"the {prompt}-token prompt's first token came {ttft} s after it arrived; in chunks of the budget the "
        f"{decoders} decodes leave ({budget - decoders} tokens) it needs {steps - 1} steps of at most {bound:.4f} s, "
        f"plus the step it arrived in: at most {steps * bound:.4f} s. A waiting prompt must get the budget left in "
        "every step, not wait for the decodes to finish")
    whole = {**chunked, "max_num_batched_tokens": prompt + 8, "enable_chunked_prefill": False}
    got = student.drive(f"{DRIVER}:run_simulate", sm.simulate, reqs, whole, COST)
    assert "error" not in got, f"simulate on the stall trace without chunking: {got.get('error')}"
    tbt = as_dict(got["tbt"])
    worst = max((max(tbt.get(k) or [0.0]) for k in range(decoders)), default=0.0)
    floor = base + per_token * prompt
    assert worst >= floor, (
        f"without chunked prefill the whole {prompt}-token prompt runs in one step beside the decodes, so some gap "
        f"between two decode tokens must be at least that step, {floor:.4f} s; the longest was {worst:.4f} s. "
        "Without chunking, a waiting request is admitted whole or not at all")


# --------------------------------------------------------------------------------------------------
# scaling: the cost of a step does not grow with the finished requests


@pytest.mark.check("scaling")
def test_scaling(student, sm):
    out = student.drive(f"{DRIVER}:scaling", sm.simulate)
    small, large = out["lines"]
    f_small, f_large = out["finished"]
    student.assert_untampered(sm.simulate, "the count of lines your scheduler executed")
    assert out["scheduled"][0] == out["scheduled"][1], (
        f"the same 6 requests were scheduled differently after {f_small} and after {f_large} finished requests: "
        "a finished request must leave no trace in the scheduler")
    assert large <= small * 1.02 + 10, (
        f"the same 24 steps ran {small} lines of your scheduler after {f_small} finished requests and {large} after "
        f"{f_large}: something visits the finished requests every step. Drop a request from every structure when "
        "it finishes, and loop only over running and waiting requests")
