"""Continuous batching with chunked prefill: a step-level scheduler with vLLM v1's rules, and a simulator.

Every step the engine runs one forward pass over a batch of tokens. The scheduler decides which requests take
part and how many tokens each brings: a decoding request brings 1, a prefilling one brings a chunk of its prompt.
There is no prefill phase and no decode phase: each request has `num_tokens` (prompt plus the tokens generated
so far) and `num_computed` (the tokens whose KV is in the cache), and each step lets `num_computed` catch up.

Write `Scheduler` (add, schedule, update, snapshot) and `simulate`. `Request` and `Config` are given.
The README's "The contract" is the full statement; the docstrings below are its summary.
"""

from __future__ import annotations

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


class Scheduler:
    """A step-level scheduler: `add` requests, then repeat `schedule()` and `update(scheduled)`.

    Each unfinished request has num_tokens (prompt_len + tokens generated so far), num_computed (tokens whose
    KV is cached; 0 on arrival) and the KV blocks it holds. It is in exactly one of two queues: `running`
    (ordered by admission) or `waiting` (front first).
    """

    def __init__(self, config: Config):
        """An empty scheduler with all `config.num_blocks` blocks free.

        ValueError if max_num_batched_tokens, max_num_seqs, block_size or num_blocks is < 1, if
        long_prefill_token_threshold < 0, or if it is > 0 while enable_chunked_prefill is False.
        """
        raise NotImplementedError

    def add(self, request: Request) -> None:
        """Append `request` to the back of `waiting` (num_computed = 0, num_tokens = prompt_len, no blocks).

        ValueError (and nothing added) if prompt_len < 1 or max_tokens < 1; if an unfinished request with the
        same id is in the scheduler; if it could never finish: its longest KV, prompt_len + max_tokens - 1
        tokens, needs more than num_blocks blocks; or, without chunked prefill, if prompt_len + max_tokens - 1
        > max_num_batched_tokens (a prefill after a late preemption would never fit a step).
        """
        raise NotImplementedError

    def schedule(self) -> dict[int, int]:
        """One step's batch: {request id: tokens scheduled this step}, in scheduling order. Every value >= 1.

        The token budget is max_num_batched_tokens. A request with num_tokens - num_computed = r wants r
        tokens, cut to long_prefill_token_threshold when that is > 0 and smaller, then to the budget left.
        Scheduling n tokens of a request makes it hold exactly ceil((num_computed + n) / block_size) blocks
        (the blocks it holds count; allocate only the difference, from the free pool).

        1. Running requests, in order, while the budget is > 0. If the pool is short for one, preempt the
           LAST running request (newest) and retry; repeat until it fits or it has preempted itself (then the
           running pass stops). Preempting: free all its blocks, num_computed = 0 (recompute, not swap),
           remove it from running and put it at the FRONT of waiting (num_tokens is kept: generated tokens
           are recomputed as prompt).
        2. Only if step 1 preempted nothing: waiting requests, front first, while the budget is > 0 and
           fewer than max_num_seqs run. Without chunked prefill, a request that wants more than the budget
           left stops this pass (it is not cut). A request whose blocks the pool cannot give stops it (no
           preemption for waiting requests). An admitted request moves to the back of running.

        The counters (num_computed, num_tokens) do not move here: `update` moves them.
        """
        raise NotImplementedError

    def update(self, scheduled: dict[int, int]) -> list[int]:
        """After the step's forward pass: for each (id, n) of `scheduled`, num_computed += n; a request whose
        num_computed now equals its num_tokens emits one token (num_tokens += 1). A partial prefill chunk
        emits nothing. A request that has emitted max_tokens tokens finishes: its blocks return to the pool
        and it leaves the scheduler (running, snapshot).

        Returns the ids that emitted a token, in `scheduled`'s order. Its cost must not grow with the number
        of requests that have already finished, nor must `schedule`'s.
        """
        raise NotImplementedError

    def snapshot(self) -> dict:
        """The state, as plain data: {"running": [ids in order], "waiting": [ids, front first],
        "computed": {id: num_computed}, "tokens": {id: num_tokens}, "blocks": {id: blocks held},
        "free_blocks": int}; the dicts cover every unfinished request (running and waiting)."""
        raise NotImplementedError


def simulate(requests: list[Request], config: Config, step_time: Callable[[int, int], float]) -> dict:
    """Serve a whole trace on one simulated engine and measure it.

    The clock t starts at 0.0. Before each step, every request with arrival <= t is added, in arrival order
    (ties keep the list's order). If no request is unfinished, t jumps to the next arrival. A step runs
    ``scheduled = schedule()``, lasts ``step_time(sum of scheduled tokens, context)`` where context =
    sum over scheduled requests of (num_computed before the step + n), then t advances by that duration and
    ``update(scheduled)``: every token it emits is emitted at the new t. It ends when every request has
    emitted its max_tokens tokens.

    Returns {"token_times": {id: [t of each token]}, "ttft": {id: first token's t - arrival},
    "tbt": {id: [gaps between its consecutive tokens]}, "makespan": last token's t - the earliest arrival,
    "throughput": tokens emitted / makespan (0.0 if makespan is 0), "steps": [{"start": t, "duration": seconds,
    "scheduled": {id: n}} for every step, in order]}.

    ValueError if an arrival is < 0 or two requests share an id; errors from Scheduler and add propagate.
    """
    raise NotImplementedError
