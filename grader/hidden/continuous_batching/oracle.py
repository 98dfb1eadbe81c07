"""Naive oracles for continuous_batching's hidden checks: a per-step simulator on plain lists. None of this is the
solution.

- `oracle_run(requests, config, cost)`: serves a trace with vLLM v1's rules (vllm/v1/core/sched/scheduler.py,
  `Scheduler.schedule` and `_preempt_request`, commit 00024d314514), one request at a time: every request is a
  dict; the KV pool is a list of real block numbers (a block is taken from the free list and given back, never
  counted); running and waiting are Python lists (`insert(0, ...)` for the front). The clock is the driver's
  (grader/support/continuous_batching.py `run_trace`). It returns the same log the driver records for the
  student's Scheduler, plus each request's token times: everything a test compares.
- `oracle_metrics(requests, run)`: TTFT, TBT, makespan and throughput from the token times, by their definitions.
"""

from __future__ import annotations

from typing import Sequence


def blocks_needed(tokens: int, block_size: int) -> int:
    """Blocks for `tokens` tokens of KV: the smallest b with b * block_size >= tokens, by counting up."""
    b = 0
    while b * block_size < tokens:
        b += 1
    return b


def oracle_run(requests: Sequence[Sequence], config: dict, cost: Sequence[float]) -> dict:
    bs = config["block_size"]
    budget_max = config["max_num_batched_tokens"]
    max_seqs = config["max_num_seqs"]
    chunked = config.get("enable_chunked_prefill", True)
    threshold = config.get("long_prefill_token_threshold", 0)
    base, per_token, per_context = cost

    free = list(range(config["num_blocks"]))   # block numbers not held by anyone
    reqs: dict[int, dict] = {}
    running: list[int] = []
    waiting: list[int] = []
    times: dict[int, list[float]] = {r[0]: [] for r in requests}
    pending = sorted(requests, key=lambda r: r[1])
    steps: list[dict] = []
    t, i = 0.0, 0

    def unfinished() -> int:
        return sum(1 for r in reqs.values() if not r["done"])

    def snapshot() -> dict:
        live = [rid for rid in reqs if not reqs[rid]["done"]]
        return {
            "running": list(running),
            "waiting": list(waiting),
            "computed": sorted([rid, reqs[rid]["computed"]] for rid in live),
            "tokens": sorted([rid, reqs[rid]["tokens"]] for rid in live),
            "blocks": sorted([rid, len(reqs[rid]["blocks"])] for rid in live),
            "free_blocks": len(free),
        }

    def grow(rid: int, n: int) -> bool:
        r = reqs[rid]
        want = blocks_needed(r["computed"] + n, bs)
        if want - len(r["blocks"]) > len(free):
            return False
        while len(r["blocks"]) < want:
            r["blocks"].append(free.pop(0))
        return True

    def release(rid: int) -> None:
        free.extend(reqs[rid]["blocks"])
        reqs[rid]["blocks"] = []

    def wanted(rid: int, budget: int) -> int:
        r = reqs[rid]
        n = r["tokens"] - r["computed"]
        if threshold > 0 and n > threshold:
            n = threshold
        return min(n, budget)

    while i < len(pending) or unfinished():
        while i < len(pending) and pending[i][1] <= t:
            rid, _, prompt, max_tokens = pending[i]
            reqs[rid] = {"tokens": prompt, "computed": 0, "generated": 0, "max": max_tokens, "blocks": [],
                         "done": False}
            waiting.append(rid)
            i += 1
        if not unfinished():
            t = pending[i][1]
            continue
        before = list(running)
        budget = budget_max
        scheduled: list[list[int]] = []
        preempted: list[int] = []

        k = 0
        while k < len(running) and budget > 0:
            rid = running[k]
            n = wanted(rid, budget)
            self_preempted = False
            while not grow(rid, n):
                victim = running[-1]
                running = running[:-1]
                release(victim)
                reqs[victim]["computed"] = 0
                waiting.insert(0, victim)
                preempted.append(victim)
                if victim == rid:
                    self_preempted = True
                    break
            if self_preempted:
                break
            scheduled.append([rid, n])
            budget -= n
            k += 1

        if not preempted:
            while waiting and budget > 0:
                if len(running) == max_seqs:
                    break
                rid = waiting[0]
                n = reqs[rid]["tokens"] - reqs[rid]["computed"]
                if threshold > 0 and n > threshold:
                    n = threshold
                if not chunked and n > budget:
                    break
                n = min(n, budget)
                if not grow(rid, n):
                    break
                waiting = waiting[1:]
                running.append(rid)
                scheduled.append([rid, n])
                budget -= n

        state = snapshot()
        ctx = sum(reqs[rid]["computed"] + n for rid, n in scheduled)
        start = t
        t = t + (base + per_token * sum(n for _, n in scheduled) + per_context * ctx)
        emitted = []
        for rid, n in scheduled:
            r = reqs[rid]
            r["computed"] += n
            if r["computed"] == r["tokens"]:
                r["tokens"] += 1
                r["generated"] += 1
                emitted.append(rid)
                times[rid].append(t)
                if r["generated"] == r["max"]:
                    r["done"] = True
                    release(rid)
                    running = [x for x in running if x != rid]
        steps.append({"start": start, "before": before, "scheduled": scheduled, "state": state,
                      "emitted": emitted, "end": t, "preempted": preempted})
    return {"steps": steps, "times": times}


def oracle_metrics(requests: Sequence[Sequence], run: dict) -> dict:
    times = run["times"]
    arrival = {r[0]: r[1] for r in requests}
    ttft = {rid: ts[0] - arrival[rid] for rid, ts in times.items()}
    tbt = {rid: [ts[j + 1] - ts[j] for j in range(len(ts) - 1)] for rid, ts in times.items()}
    last = max(ts[-1] for ts in times.values())
    makespan = last - min(arrival.values())
    total = sum(len(ts) for ts in times.values())
    return {"token_times": times, "ttft": ttft, "tbt": tbt, "makespan": makespan, "throughput": total / makespan}
