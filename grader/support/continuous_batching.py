"""Drivers for the continuous_batching checks: they run where the student's code runs (the worker).

A scheduler is driven by thousands of small calls (add, schedule, update, snapshot per step). Sending each one
across the process boundary would cost a round trip per call, so a test sends a whole trace here; the driver runs
it on the student's `Scheduler` with the course's clock (the same one `simulate` must use) and returns what it
saw at every step as plain data. The trusted test compares that log with the oracle's.

Drivers are called as ``driver(fn, *args)`` where `fn` is the student's `simulate`; `Scheduler`, `Request` and
`Config` are looked up in its module. Requests travel as ``(id, arrival, prompt_len, max_tokens)`` tuples, the
config as a dict of `Config`'s fields, the cost model as ``(base_s, per_token_s, per_context_token_s)``: a step of
`n` batched tokens whose scheduled requests attend to `ctx` tokens in all takes ``base + per_token * n +
per_context * ctx`` seconds. Run your own code the same way (from the repository root)::

    from grader.support.continuous_batching import run_trace
    import continuous_batching as cb               # exercises/continuous_batching on sys.path
    log = run_trace(cb.simulate, [(0, 0.0, 5, 3), (1, 0.0, 9, 2)], {"max_num_batched_tokens": 8,
                    "max_num_seqs": 4, "block_size": 4, "num_blocks": 16}, (0.01, 0.001, 0.0))
    print(log["steps"][0])
"""

from __future__ import annotations

import math
import sys
from typing import Any, Sequence

from grader.harness.counters import LineCounter

MAX_STEPS = 50_000


def module_of(fn: Any):
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or not all(hasattr(module, n) for n in ("Scheduler", "Request", "Config")):
        raise RuntimeError("could not find Scheduler, Request and Config in the module that defines simulate")
    return module


def plain_int(x: Any) -> Any:
    return x if isinstance(x, int) and not isinstance(x, bool) else repr(x)


def plain_pairs(scheduled: Any) -> Any:
    """A schedule() result as [[id, n], ...] in its order; anything that is not a dict as its repr."""
    if not isinstance(scheduled, dict):
        return repr(scheduled)[:200]
    return [[plain_int(k), plain_int(v)] for k, v in scheduled.items()]


def plain_snapshot(snap: Any) -> Any:
    if not isinstance(snap, dict):
        return repr(snap)[:200]
    out: dict[str, Any] = {}
    for key in ("running", "waiting"):
        v = snap.get(key)
        out[key] = [plain_int(x) for x in v] if isinstance(v, (list, tuple)) else repr(v)[:200]
    for key in ("computed", "tokens", "blocks"):
        v = snap.get(key)
        out[key] = [[plain_int(k), plain_int(x)] for k, x in v.items()] if isinstance(v, dict) else repr(v)[:200]
    out["free_blocks"] = plain_int(snap.get("free_blocks"))
    return out


def raised(exc: BaseException) -> dict:
    return {"raised": type(exc).__name__, "message": str(exc)[:300]}


def step_cost(cost: Sequence[float], n: int, ctx: int) -> float:
    base, per_token, per_context = cost
    return base + per_token * n + per_context * ctx


def run_trace(fn: Any, requests: Sequence[Sequence], config: dict, cost: Sequence[float]) -> dict:
    """Serve `requests` on the student's Scheduler with the course's clock; log every step.

    Returns {"steps": [...], "error": None or what went wrong}. Each step: {"start": t, "before": running ids
    before schedule(), "scheduled": [[id, n], ...], "state": snapshot() after schedule(), "emitted": update()'s
    ids, "end": t after the step}. The clock: before each step every request with arrival <= t is added (in
    arrival order, ties in the list's order); an idle scheduler jumps to the next arrival.
    """
    m = module_of(fn)
    try:
        sched = m.Scheduler(m.Config(**config))
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"steps": [], "error": {"where": "Scheduler(config)", **raised(exc)}}
    pending = sorted(requests, key=lambda r: r[1])
    left = {r[0]: r[3] for r in requests}
    steps: list[dict] = []
    t, i, live = 0.0, 0, 0
    while i < len(pending) or live:
        while i < len(pending) and pending[i][1] <= t:
            try:
                sched.add(m.Request(*pending[i]))
            except Exception as exc:  # noqa: BLE001
                return {"steps": steps, "error": {"where": f"add(request {pending[i][0]})", **raised(exc)}}
            i, live = i + 1, live + 1
        if not live:
            t = pending[i][1]
            continue
        if len(steps) >= MAX_STEPS:
            return {"steps": steps, "error": {"where": "the trace", "raised": "TooManySteps",
                                              "message": f"{MAX_STEPS} steps and requests remain"}}
        step: dict[str, Any] = {"start": t}
        try:
            step["before"] = plain_snapshot(sched.snapshot())["running"]
            scheduled = sched.schedule()
            step["scheduled"] = plain_pairs(scheduled)
            state = sched.snapshot()
            step["state"] = plain_snapshot(state)
        except Exception as exc:  # noqa: BLE001
            steps.append(step)
            return {"steps": steps, "error": {"where": f"step {len(steps) - 1}: schedule()", **raised(exc)}}
        steps.append(step)
        if not isinstance(scheduled, dict) or not scheduled:
            return {"steps": steps, "error": {"where": f"step {len(steps) - 1}: schedule()", "raised": "NoProgress",
                                              "message": f"schedule() returned {repr(scheduled)[:100]} while "
                                                         f"{live} requests are unfinished"}}
        computed = dict(step["state"]["computed"]) if isinstance(step["state"]["computed"], list) else {}
        try:
            ctx = sum(int(computed.get(rid, 0)) + int(n) for rid, n in scheduled.items())
            t += step_cost(cost, sum(int(n) for n in scheduled.values()), ctx)
            emitted = sched.update(scheduled)
            step["emitted"] = [plain_int(x) for x in emitted] if isinstance(emitted, (list, tuple)) else repr(emitted)
        except Exception as exc:  # noqa: BLE001
            return {"steps": steps, "error": {"where": f"step {len(steps) - 1}: update()", **raised(exc)}}
        step["end"] = t
        if isinstance(step["emitted"], list):
            for rid in step["emitted"]:
                if rid in left:
                    left[rid] -= 1
                    if left[rid] == 0:
                        live -= 1
    return {"steps": steps, "error": None}


def try_config(fn: Any, config: dict) -> dict:
    """Build ``Scheduler(Config(**config))``: {"ok": True} or what it raised."""
    m = module_of(fn)
    try:
        m.Scheduler(m.Config(**config))
    except Exception as exc:  # noqa: BLE001
        return raised(exc)
    return {"ok": True}


def try_add(fn: Any, config: dict, requests: Sequence[Sequence]) -> dict:
    """Add `requests` in order to a fresh scheduler: {"ok": True} or what the first failing add raised."""
    m = module_of(fn)
    sched = m.Scheduler(m.Config(**config))
    for k, r in enumerate(requests):
        try:
            sched.add(m.Request(*r))
        except Exception as exc:  # noqa: BLE001
            return {"index": k, **raised(exc)}
    return {"ok": True}


def run_simulate(fn: Any, requests: Sequence[Sequence], config: dict, cost: Sequence[float]) -> dict:
    """The student's ``simulate(requests, config, step_time)`` with the course's cost model, as plain data."""
    m = module_of(fn)
    try:
        out = fn([m.Request(*r) for r in requests], m.Config(**config), lambda n, ctx: step_cost(cost, n, ctx))
    except Exception as exc:  # noqa: BLE001
        return {"error": raised(exc)}
    if not isinstance(out, dict):
        return {"error": {"raised": "TypeError", "message": f"simulate returned {type(out).__name__}, not a dict"}}

    def per_request(v: Any) -> Any:
        if not isinstance(v, dict):
            return repr(v)[:200]
        return [[plain_int(k), [float(x) for x in x_] if isinstance(x_, (list, tuple)) else float(x_)]
                for k, x_ in v.items()]

    result: dict[str, Any] = {}
    try:
        for key in ("token_times", "ttft", "tbt"):
            result[key] = per_request(out.get(key))
        result["makespan"] = float(out["makespan"])
        result["throughput"] = float(out["throughput"])
        result["steps"] = [[float(s["start"]), float(s["duration"]), plain_pairs(s["scheduled"])]
                           for s in out["steps"]]
    except Exception as exc:  # noqa: BLE001
        return {"error": {"raised": type(exc).__name__, "message": f"reading simulate's result: {exc}"[:300]}}
    if any(isinstance(v, float) and not math.isfinite(v) for v in (result["makespan"], result["throughput"])):
        result["nonfinite"] = True
    return result


def scaling(fn: Any, finished: Sequence[int] = (8, 2048), steps: int = 24) -> dict:
    """Lines of the student's file that the same steps run after `finished` requests have come and gone.

    For each count F: a fresh scheduler serves F short requests to the end (not counted), then 6 fresh
    requests are added and `steps` schedule()+update() rounds are counted; all 6 finish within them. Returns {"finished", "lines",
    "scheduled": the schedules of the counted steps, per F}.
    """
    m = module_of(fn)
    filename = m.__file__
    lines, logs = [], []
    for f in finished:
        sched = m.Scheduler(m.Config(max_num_batched_tokens=64, max_num_seqs=8, block_size=4, num_blocks=64))
        for k in range(f):
            sched.add(m.Request(k, 0.0, 3, 1))
        for _ in range(4 * f + 8):
            done = sched.schedule()
            if not done:
                break
            sched.update(done)
        for k in range(6):
            sched.add(m.Request(10**6 + k, 0.0, 10 + k, 3 + 2 * k))
        log = []
        with LineCounter(filename) as counter:
            for _ in range(steps):
                s = sched.schedule()
                sched.update(s)
                log.append(s)
        lines.append(counter.count)
        logs.append([plain_pairs(s) for s in log])
    return {"finished": list(finished), "lines": lines, "scheduled": logs}
