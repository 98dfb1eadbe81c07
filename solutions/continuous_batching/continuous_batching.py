"""Continuous batching with chunked prefill: a step-level scheduler with vLLM v1's rules, and a simulator.

Every step the engine runs one forward pass over a batch of tokens. The scheduler decides which requests take
part and how many tokens each brings: a decoding request brings 1, a prefilling one brings a chunk of its prompt.
There is no prefill phase and no decode phase: each request has `num_tokens` (prompt plus the tokens generated
so far) and `num_computed` (the tokens whose KV is in the cache), and each step lets `num_computed` catch up.

The rules, in order (vLLM v1's `Scheduler.schedule`, first-come first-served):
1. RUNNING requests first, in their order, while the token budget lasts. Each asks for
   num_tokens - num_computed tokens, cut to the long-prefill threshold (when > 0) and to the budget left.
   If its KV blocks cannot be allocated, preempt the LAST running request (free its blocks, num_computed = 0,
   put it at the FRONT of waiting) and retry, until the request fits or is itself preempted (then stop).
2. WAITING requests next, front first, only if step 1 preempted nothing, while the budget lasts and fewer than
   max_num_seqs requests run. Without chunked prefill, a request that does not fit the budget left stops the
   loop; with it, the request gets a chunk. A request whose blocks cannot be allocated stops the loop.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, NamedTuple


class Request(NamedTuple):
    """One request of a trace: it arrives at `arrival` (seconds) with a prompt of `prompt_len` tokens and
    generates `max_tokens` tokens."""

    id: int
    arrival: float
    prompt_len: int
    max_tokens: int


class Config(NamedTuple):
    """The scheduler's limits: tokens per step, running requests, the KV pool (`num_blocks` blocks of
    `block_size` tokens), chunked prefill on or off, and the long-prefill threshold (0: none)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_blocks: int
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0


class Seq:
    """The scheduler's state for one unfinished request."""

    def __init__(self, request: Request):
        self.request = request
        self.num_tokens = request.prompt_len  # prompt + generated tokens
        self.num_computed = 0                 # tokens whose KV is in this request's blocks
        self.num_generated = 0
        self.num_blocks = 0                   # KV blocks held


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    """A step-level scheduler: `add` requests, then repeat `schedule()` and `update(scheduled)`."""

    def __init__(self, config: Config):
        c = config
        if min(c.max_num_batched_tokens, c.max_num_seqs, c.block_size, c.num_blocks) < 1:
            raise ValueError(f"every limit of the config must be >= 1: {c}")
        if c.long_prefill_token_threshold < 0:
            raise ValueError(f"long_prefill_token_threshold must be >= 0, got {c.long_prefill_token_threshold}")
        if c.long_prefill_token_threshold > 0 and not c.enable_chunked_prefill:
            raise ValueError("a long-prefill threshold cuts prompts into chunks: it needs enable_chunked_prefill")
        self.config = config
        self.free_blocks = c.num_blocks
        self.seqs: dict[int, Seq] = {}         # every unfinished request, by id
        self.running: list[Seq] = []
        self.waiting: deque[Seq] = deque()

    def add(self, request: Request) -> None:
        """Append `request` to the back of waiting. ValueError if it could never finish (see the stub)."""
        c = self.config
        if request.prompt_len < 1 or request.max_tokens < 1:
            raise ValueError(f"request {request.id}: prompt_len and max_tokens must be >= 1")
        if request.id in self.seqs:
            raise ValueError(f"request {request.id} is already in the scheduler")
        longest = request.prompt_len + request.max_tokens - 1  # the most tokens whose KV it ever holds
        if cdiv(longest, c.block_size) > c.num_blocks:
            raise ValueError(f"request {request.id} needs {cdiv(longest, c.block_size)} blocks, the pool has "
                             f"{c.num_blocks}")
        if not c.enable_chunked_prefill and longest > c.max_num_batched_tokens:
            raise ValueError(f"request {request.id}'s prefill of up to {longest} tokens never fits a step of "
                             f"{c.max_num_batched_tokens} without chunked prefill")
        seq = Seq(request)
        self.seqs[request.id] = seq
        self.waiting.append(seq)

    def allocate(self, seq: Seq, n: int) -> bool:
        """Give `seq` the blocks for num_computed + n tokens (those it holds count). False if the pool is short."""
        need = cdiv(seq.num_computed + n, self.config.block_size) - seq.num_blocks
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        seq.num_blocks += need
        return True

    def preempt(self, seq: Seq) -> None:
        """Preemption by recompute: drop the KV, forget the progress, go to the front of the queue."""
        self.free_blocks += seq.num_blocks
        seq.num_blocks = 0
        seq.num_computed = 0
        self.waiting.appendleft(seq)

    def new_tokens(self, seq: Seq, budget: int) -> int:
        n = seq.num_tokens - seq.num_computed
        threshold = self.config.long_prefill_token_threshold
        if 0 < threshold < n:
            n = threshold
        return min(n, budget)

    def schedule(self) -> dict[int, int]:
        """One step's batch: {request id: tokens scheduled}, running requests first, then admitted ones."""
        scheduled: dict[int, int] = {}
        budget, preempted = self.schedule_running(self.config.max_num_batched_tokens, scheduled)
        if not preempted:
            self.schedule_waiting(budget, scheduled)
        return scheduled

    def schedule_running(self, budget: int, scheduled: dict[int, int]) -> tuple[int, list[Seq]]:
        """Rule 1: the running requests, in order. Returns the budget left and the requests preempted."""
        preempted: list[Seq] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self.new_tokens(seq, budget)
            while not self.allocate(seq, n):
                victim = self.running.pop()       # the newest running request
                self.preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if preempted and preempted[-1] is seq:
                break                             # it preempted itself: nothing more fits this step
            scheduled[seq.request.id] = n
            budget -= n
            i += 1
        return budget, preempted

    def schedule_waiting(self, budget: int, scheduled: dict[int, int]) -> int:
        """Rule 2: admit waiting requests, front first, with the budget left. Returns the budget left."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            n = seq.num_tokens - seq.num_computed
            if not self.config.enable_chunked_prefill and n > budget:
                break                             # no chunking: the whole prefill or nothing
            n = self.new_tokens(seq, budget)
            if not self.allocate(seq, n):
                break
            self.waiting.popleft()
            self.running.append(seq)
            scheduled[seq.request.id] = n
            budget -= n
        return budget

    def update(self, scheduled: dict[int, int]) -> list[int]:
        """After the forward pass: advance num_computed; each request that caught up emits one token.

        Returns the ids that emitted a token, in `scheduled`'s order. A request that has emitted max_tokens
        tokens finishes: its blocks are freed and it leaves the scheduler."""
        emitted = []
        finished = False
        for rid, n in scheduled.items():
            seq = self.seqs[rid]
            seq.num_computed += n
            if seq.num_computed == seq.num_tokens:  # caught up: this step sampled a new token
                seq.num_tokens += 1
                seq.num_generated += 1
                emitted.append(rid)
                if seq.num_generated == seq.request.max_tokens:
                    self.free_blocks += seq.num_blocks
                    seq.num_blocks = 0
                    del self.seqs[rid]
                    finished = True
        if finished:
            self.running = [s for s in self.running if s.request.id in self.seqs]
        return emitted

    def snapshot(self) -> dict:
        """The scheduler's state as plain data (see the stub)."""
        return {
            "running": [s.request.id for s in self.running],
            "waiting": [s.request.id for s in self.waiting],
            "computed": {rid: s.num_computed for rid, s in self.seqs.items()},
            "tokens": {rid: s.num_tokens for rid, s in self.seqs.items()},
            "blocks": {rid: s.num_blocks for rid, s in self.seqs.items()},
            "free_blocks": self.free_blocks,
        }


def simulate(requests: list[Request], config: Config, step_time: Callable[[int, int], float]) -> dict:
    """Serve a whole trace on one simulated engine and measure it (see the stub for the exact clock)."""
    if any(r.arrival < 0 for r in requests):
        raise ValueError("arrival times must be >= 0")
    if len({r.id for r in requests}) != len(requests):
        raise ValueError("request ids must be unique")
    max_tokens = {r.id: r.max_tokens for r in requests}
    pending = sorted(requests, key=lambda r: r.arrival)  # stable: ties keep the list's order
    sched = Scheduler(config)
    times: dict[int, list[float]] = {r.id: [] for r in requests}
    steps = []
    t, i, unfinished = 0.0, 0, 0
    while i < len(pending) or unfinished:
        while i < len(pending) and pending[i].arrival <= t:
            sched.add(pending[i])
            i, unfinished = i + 1, unfinished + 1
        if not unfinished:
            t = pending[i].arrival                # idle: jump to the next arrival
            continue
        scheduled = sched.schedule()
        context = sum(sched.seqs[rid].num_computed + n for rid, n in scheduled.items())
        dt = step_time(sum(scheduled.values()), context)
        steps.append({"start": t, "duration": dt, "scheduled": dict(scheduled)})
        t += dt
        for rid in sched.update(scheduled):
            times[rid].append(t)
            if len(times[rid]) == max_tokens[rid]:
                unfinished -= 1
    first = min((r.arrival for r in requests), default=0.0)
    total = sum(len(ts) for ts in times.values())
    makespan = t - first
    arrival = {r.id: r.arrival for r in requests}
    return {
        "token_times": times,
        "ttft": {rid: ts[0] - arrival[rid] for rid, ts in times.items()},
        "tbt": {rid: [b - a for a, b in zip(ts, ts[1:])] for rid, ts in times.items()},
        "makespan": makespan,
        "throughput": total / makespan if makespan > 0 else 0.0,
        "steps": steps,
    }

