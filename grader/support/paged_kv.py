"""Drivers for the paged_kv checks: they run where the student's code runs (the worker).

A BlockManager is driven by many small calls. Sending each one across the process boundary would
make a random-operation test cost thousands of round trips, so the tests send a whole script of
operations here; the driver runs it on the student's BlockManager and returns what it observed
after each step (results, exceptions, free count, tables, token counts, reference counts). The
trusted test compares those observations with its own model. Everything returned is plain data.

Drivers are called as ``driver(fn, *args)`` where `fn` is any function of the student's module
(the tests pass ``slot_mapping``); the BlockManager class is looked up in that module.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence

from grader.harness.counters import LineCounter


def _module(fn: Any):
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or not hasattr(module, "BlockManager"):
        raise RuntimeError("could not find BlockManager in the module that defines slot_mapping")
    return module


def _plain(value: Any, depth: int = 0) -> Any:
    """The student's return value as plain data (ints, lists, None); anything else as its repr."""
    if depth > 4:
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    try:
        import operator

        return operator.index(value)  # numpy / torch integer scalars
    except TypeError:
        return repr(value)


def _raised(exc: BaseException) -> dict:
    return {"raised": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}


def _call(method, *args) -> dict:
    try:
        return {"result": _plain(method(*args))}
    except Exception as exc:  # noqa: BLE001 - the test decides whether this exception was right
        return _raised(exc)


def _snapshot(bm: Any, live: Sequence[Any], num_blocks: int) -> dict:
    state: dict[str, Any] = {}
    for key, get in (
        ("free", lambda: bm.num_free_blocks),
        ("tables", lambda: [bm.block_table(s) for s in live]),
        ("tokens", lambda: [bm.num_tokens(s) for s in live]),
        ("refs", lambda: [bm.ref_count(b) for b in range(num_blocks)]),
    ):
        try:
            state[key] = _plain(get())
        except Exception as exc:  # noqa: BLE001
            state[key] = {"error": f"{type(exc).__name__}: {exc}"}
    return state


def run_script(fn: Any, num_blocks: int, block_size: int, caching: bool, script: Sequence[tuple]) -> list[dict]:
    """Run `script` on a fresh ``BlockManager(num_blocks, block_size, caching)``.

    Each step is ``(op, args, live)``: op is "add", "append", "fork" or "free" (the manager's
    method), args its arguments, and live the sequence ids whose state to record after the step
    (None: record nothing). Returns one record per step: {"result": ...} or {"raised": name, "mro":
    [...], "message": ...}, plus {"state": {...}} when recorded.
    """
    bm = _module(fn).BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    methods = {"add": "add_sequence", "append": "append_token", "fork": "fork", "free": "free"}
    records = []
    for op, args, live in script:
        record = _call(getattr(bm, methods[op]), *args)
        if live is not None:
            record["state"] = _snapshot(bm, live, num_blocks)
        records.append(record)
    return records


def block_table_copies(fn: Any) -> dict:
    """Does ``block_table`` return a new list? It must run here, beside the manager: across the process boundary
    every list comes back as a copy anyway. A manager of 8 blocks of 4 holds "a" (6 tokens: blocks 0, 1); the
    list it returned is then changed (an element set, one appended, one removed), and the manager asked again.
    Returns {"first": the table as returned, "after": block_table("a") after the changes to the returned list,
    "append": what append_token("a", 7) returned, "table": block_table("a") after it, "free": num_free_blocks},
    each as plain data, or {"raised": ...} where a call raised."""
    bm = _module(fn).BlockManager(8, 4)
    bm.add_sequence("a", [1, 2, 3, 4, 5, 6])
    table = bm.block_table("a")
    first = _plain(table)
    try:
        table[0] = 7
        table.append(6)
        del table[1]
    except Exception as exc:  # noqa: BLE001 - not a mutable list: the test says so
        return {"first": first, "raised": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"first": first}
    for key, get in (("after", lambda: bm.block_table("a")), ("append", lambda: bm.append_token("a", 7)),
                     ("table", lambda: bm.block_table("a")), ("free", lambda: bm.num_free_blocks)):
        try:
            out[key] = _plain(get())
        except Exception as exc:  # noqa: BLE001
            return {**out, "raised": f"{key}: {type(exc).__name__}: {exc}"}
    return out


# --------------------------------------------------------------------------------------------------
# Cost per operation at two pool sizes


def _workload(bm: Any, seqs: int, prompt: int, steps: int, hits: list | None = None) -> int:
    """A small serving loop: prompts, decode steps, a few forks, frees, the same prompts again.

    It allocates fewer blocks than the smallest pool holds, so the manager behaves identically in
    every pool size: only an implementation that scans the pool can tell them apart. Returns the
    number of operations performed; appends what each add_sequence returned to `hits`.
    """
    ops = 0
    for round_ in range(2):
        for s in range(seqs):
            hit = bm.add_sequence(s, [s * 1000 + t for t in range(prompt)])
            if hits is not None:
                hits.append(_plain(hit))
            ops += 1
        for step in range(steps):
            for s in range(seqs):
                bm.append_token(s, step)
                ops += 1
        for s in range(0, seqs, 4):
            bm.fork(s, seqs + s)
            bm.append_token(seqs + s, 7)
            bm.free(seqs + s)
            ops += 3
        for s in range(seqs):
            bm.free(s)
            ops += 1
        _ = bm.num_free_blocks
    return ops


def manager_scaling(fn: Any, sizes: Sequence[int] = (512, 131072), block_size: int = 1, reps: int = 9,
                    seqs: int = 8, prompt: int = 8, steps: int = 16) -> dict:
    """Time the same workload on a small and a large pool, and count the student's lines it runs.

    Returns {"sizes", "ops", "best_s": [per size], "lines": [per size]}. Managers are built outside
    the timed region (building a pool may well be O(num_blocks)); reps alternate between the sizes
    and the best (minimum) time of each is kept, which filters out a busy machine's noise.
    """
    cls = _module(fn).BlockManager
    filename = _module(fn).__file__
    best = [float("inf")] * len(sizes)
    ops = 0
    for _ in range(reps):
        for i, n in enumerate(sizes):
            bm = cls(n, block_size, enable_prefix_caching=True)
            start = time.perf_counter()
            ops = _workload(bm, seqs, prompt, steps)
            best[i] = min(best[i], time.perf_counter() - start)
    lines = []
    for n in sizes:
        bm = cls(n, block_size, enable_prefix_caching=True)
        with LineCounter(filename) as counter:
            _workload(bm, seqs, prompt, steps)
        lines.append(counter.count)
    return {"sizes": list(sizes), "ops": ops, "best_s": best, "lines": lines}


def manager(fn: Any, num_blocks: int, block_size: int = 1) -> Any:
    """A fresh ``BlockManager(num_blocks, block_size, enable_prefix_caching=True)``: it comes back to the
    grader as a remote handle, built outside whatever the grader times next."""
    return _module(fn).BlockManager(num_blocks, block_size, enable_prefix_caching=True)


def workload(fn: Any, bm: Any, seqs: int = 8, prompt: int = 8, steps: int = 16) -> dict:
    """Run `manager_scaling`'s serving loop once on `bm`, for the grader to time around the call.

    Returns {"ops", "hits": what each add_sequence returned, "free": num_free_blocks at the end}: the
    grader checks them (every block free again; the same hits whatever the pool's size).
    """
    hits: list = []
    ops = _workload(bm, seqs, prompt, steps, hits)
    return {"ops": ops, "hits": hits, "free": _plain(bm.num_free_blocks)}


# --------------------------------------------------------------------------------------------------
# Is a Triton kernel really launched?


def triton_launches(fn: Any, *args, **kwargs) -> dict:
    """Call ``fn(*args, **kwargs)`` and count the Triton kernel launches it makes: {"out", "launches"}.

    A launch ``kernel[grid](...)`` ends in ``run`` of the kernel's class: JITFunction when compiling for
    a GPU, InterpretedFunction under TRITON_INTERPRET=1. Both are wrapped, at the class, for the call
    only; an autotuner's launches go through them too.
    """
    import triton.runtime.jit as jit

    classes = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # a Triton without the interpreter
        pass
    count = [0]
    originals = []
    for cls in classes:
        original = cls.__dict__.get("run")
        if original is None:
            continue

        def run(self, *a, __original=original, **k):
            if not k.get("warmup", False):
                count[0] += 1
            return __original(self, *a, **k)

        originals.append((cls, original))
        cls.run = run
    try:
        out = fn(*args, **kwargs)
    finally:
        for cls, original in originals:
            cls.run = original
    return {"out": out, "launches": count[0]}
