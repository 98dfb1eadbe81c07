"""Drivers for activation_checkpointing: a student's `checkpoint` (or `attention_block`) run forward and backward
where the student's code runs, with every tensor saved for backward counted.

`SavedBytes` is the live-bytes tracker: autograd's saved-tensor hooks wrap each saved tensor in a token; a token
holds its storage's bytes live until autograd drops it (a weakref finaliser on the token), and a storage saved
twice counts once. Parameters and the caller's targets are left out: they live anyway. `live` is the bytes alive
now, `peak` the most at once, `log` the (phase, shape, bytes, storage is an input) of every pack.

torch.utils.checkpoint is the answer the exercise asks the student to write: while a driver runs, its entry
points raise (`no_library_checkpoint`), whether reached by name or through a reference bound at import
(`checkpoint` looks up `CheckpointFunction` and `_checkpoint_without_reentrant_generator` at call time).

Run your own code the same way (from the repository root)::

    import torch
    from grader.support.activation_checkpointing import run_case, run_plan
    import activation_checkpointing as ac                  # exercises/activation_checkpointing on sys.path

    out = run_case(ac.checkpoint, "dropout", seed=0)
    print(out["calls_forward"], out["calls_total"], out["forward_saves"])
    print(run_plan(ac.checkpoint, [8, 8, 8, 8], [16, 16, 16], 4, [(0, 2, True), (2, 3, False)], seed=0))
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as _library

__all__ = ["SavedBytes", "CASES", "build_case", "run_case", "run_plan", "run_attention", "plan_costs",
           "stack_weights", "stack_forward", "no_library_checkpoint", "device_stack", "Step", "plan_memory",
           "bench_step"]


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes()) if s.nbytes() else (id(t), 0)


class _Token:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedBytes:
    """Saved-tensor hooks counting the bytes autograd holds for backward, distinct storages, live and peak."""

    def __init__(self, excluded: Sequence[torch.Tensor] = (), inputs: Sequence[torch.Tensor] = ()):
        self.excluded = {_storage_key(t) for t in excluded}
        self.inputs = {_storage_key(t) for t in inputs}
        self.count: dict[tuple[int, int], int] = {}
        self.live = 0
        self.peak = 0
        self.phase = "forward"
        self.log: list[tuple[str, tuple, int, bool]] = []

    def pack(self, tensor: torch.Tensor) -> Any:
        token = _Token(tensor)
        key = _storage_key(tensor)
        self.log.append((self.phase, tuple(tensor.shape), key[1], key in self.inputs))
        if key in self.excluded:
            return token
        if self.count.get(key, 0) == 0:
            self.live += key[1]
            self.peak = max(self.peak, self.live)
        self.count[key] = self.count.get(key, 0) + 1
        weakref.finalize(token, self.release, key)
        return token

    def release(self, key: tuple[int, int]) -> None:
        self.count[key] -= 1
        if self.count[key] == 0:
            self.live -= key[1]

    @contextlib.contextmanager
    def hooks(self) -> Iterator["SavedBytes"]:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda token: token.tensor):
            yield self


def _refuse(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("torch.utils.checkpoint is what this exercise asks you to write: write the autograd "
                       "Function yourself (torch.utils.checkpoint is banned inside the graded functions)")


@contextlib.contextmanager
def no_library_checkpoint() -> Iterator[None]:
    """torch.utils.checkpoint's entry points raise while the block runs."""
    saved = {}
    names = ("checkpoint", "checkpoint_sequential", "_checkpoint_without_reentrant_generator", "_checkpoint_hook")
    for name in names:
        if hasattr(_library, name):
            saved[name] = getattr(_library, name)
            setattr(_library, name, _refuse)
    forward = _library.CheckpointFunction.forward
    _library.CheckpointFunction.forward = staticmethod(_refuse)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(_library, name, value)
        _library.CheckpointFunction.forward = forward  # type: ignore[method-assign]


# --------------------------------------------------------------------------------------------------
# The grads / saves / rng cases: each a function, its inputs, the gradients fed back


CASES = ("mlp", "dropout", "two_outputs", "input_without_grad", "non_tensor_args", "nested")


class _Counted:
    def __init__(self, fn: Callable):
        self.fn, self.calls = fn, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.fn(*args)


def build_case(case: str, seed: int, checkpoint: Callable) -> dict:
    """The case's function (calls counted), its args, its parameters and the gradients fed to its outputs.

    `checkpoint` is used only by "nested" (a checkpoint inside the checkpointed function); the plain run passes
    ``lambda fn, *a: fn(*a)``. Parameters come from `seed`; the driver seeds the global RNG for dropout."""
    g = torch.Generator().manual_seed(seed)
    rows, width = 3 + seed % 4, 4 + seed % 3

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).requires_grad_(True)

    w = [weight(width, width) for _ in range(3)]
    x = torch.randn(rows, width, generator=g).requires_grad_(True)
    params = list(w)
    args: list[Any]
    body: Callable[..., Any]
    if case == "mlp":
        def mlp(x):
            return torch.tanh(torch.tanh(torch.tanh(x @ w[0]) @ w[1]) @ w[2])
        body = mlp
        args = [x]
    elif case == "dropout":
        def dropout(x):
            h = F.dropout(torch.relu(x @ w[0]), 0.4, training=True)
            return F.dropout(h @ w[1], 0.25, training=True) @ w[2]
        body = dropout
        args = [x]
    elif case == "two_outputs":
        def two(x, y):
            h = torch.sigmoid(x @ w[0] + y)
            return h @ w[1], (h * y).sum(-1), (h @ w[2]).argmax(-1)  # the last needs no grad
        body = two
        args = [x, torch.randn(rows, width, generator=g).requires_grad_(True)]
    elif case == "input_without_grad":
        mask = (torch.rand(rows, width, generator=g) > 0.3).float()  # an input that needs no grad
        def masked(x, m):
            return torch.tanh(x @ w[0]) * m @ w[1]
        body = masked
        args = [x, mask]
    elif case == "non_tensor_args":
        def scaled(x, scale, act):
            h = getattr(torch, act)(x @ w[0] * scale)
            return h @ w[1]
        body = scaled
        args = [x, 0.75, "tanh"]
    elif case == "nested":
        def inner(h):
            return torch.tanh(F.dropout(h @ w[1], 0.3, training=True))

        def outer(x):
            h = torch.relu(x @ w[0])
            return checkpoint(inner, h) @ w[2]
        body = outer
        args = [x]
    else:
        raise ValueError(f"unknown case {case!r}")
    fn = _Counted(body)
    probe = body(*[a.detach() if isinstance(a, torch.Tensor) else a for a in args]) if case != "nested" else None
    outs = probe if isinstance(probe, tuple) else (probe,) if probe is not None else (torch.empty(rows, width),)
    grads = [torch.randn(o.shape, generator=g) if o.is_floating_point() else None for o in outs]
    return {"fn": fn, "args": args, "params": params, "grads": grads, "x": x}


def _results(outputs: Any, case: dict) -> dict:
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    return {
        "outputs": [o.detach() for o in outs],
        "input_grads": [a.grad if isinstance(a, torch.Tensor) else None for a in case["args"]],
        "param_grads": [p.grad for p in case["params"]],
    }


def _backward(outputs: Any, grads: list) -> None:
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def run_case(checkpoint: Callable, case_name: str, seed: int, backward: bool = True) -> dict:
    """``checkpoint(fn, *args)`` on the named case, forward then (with `backward`) backward: outputs, gradients,
    the calls of fn after forward and in all, the forward's saves and the global RNG's next draws."""
    case = build_case(case_name, seed, checkpoint)
    tracker = SavedBytes(excluded=case["params"],
                         inputs=[a for a in case["args"] if isinstance(a, torch.Tensor)])
    torch.manual_seed(seed + 1)
    with no_library_checkpoint(), tracker.hooks():
        outputs = checkpoint(case["fn"], *case["args"])
        calls_forward = case["fn"].calls
        forward_log = list(tracker.log)
        tracker.phase = "backward"
        torch.rand(5)  # the caller's own draw between forward and backward (another layer's dropout)
        if backward:
            _backward(outputs, case["grads"])
    result = _results(outputs, case)
    result.update(calls_forward=calls_forward, calls_total=case["fn"].calls, rng_after=torch.rand(8),
                  forward_saves=[(shape, nbytes, is_input) for _, shape, nbytes, is_input in forward_log])
    return result


def run_plain(case_name: str, seed: int) -> dict:
    """The same case without any checkpoint (the oracle's run, in the grader's process)."""
    case = build_case(case_name, seed, lambda fn, *a: fn(*a))
    torch.manual_seed(seed + 1)
    outputs = case["fn"](*case["args"])
    torch.rand(5)
    _backward(outputs, case["grads"])
    result = _results(outputs, case)
    result.update(calls_total=case["fn"].calls, rng_after=torch.rand(8))
    return result


# --------------------------------------------------------------------------------------------------
# The measured check: a stack of layers y = relu(x @ W1) @ W2 run under a plan


def stack_weights(widths: Sequence[int], hidden: Sequence[int], seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Layer i maps widths[i] -> hidden[i] -> widths[i + 1]: len(widths) == len(hidden) + 1."""
    g = torch.Generator().manual_seed(seed)
    return [((torch.randn(widths[i], hidden[i], generator=g) / widths[i] ** 0.5).requires_grad_(True),
             (torch.randn(hidden[i], widths[i + 1], generator=g) / hidden[i] ** 0.5).requires_grad_(True))
            for i in range(len(hidden))]


def stack_forward(weights: list, start: int, stop: int) -> Callable:
    def segment(x: torch.Tensor) -> torch.Tensor:
        for w1, w2 in weights[start:stop]:
            x = torch.relu(x @ w1) @ w2
        return x
    return segment


def plan_costs(widths: Sequence[int], hidden: Sequence[int], rows: int, itemsize: int = 4) -> list[tuple[int, int, int]]:
    """(a, x, f) per layer of the stack (fp32 by default): it saves its input and its relu output; 2 matmuls' FLOPs."""
    return [(itemsize * rows * (widths[i] + hidden[i]), itemsize * rows * widths[i],
             2 * rows * hidden[i] * (widths[i] + widths[i + 1])) for i in range(len(hidden))]


def run_plan(checkpoint: Callable, widths: Sequence[int], hidden: Sequence[int], rows: int,
             plan: Sequence[Sequence[Any]], seed: int) -> dict:
    """Run the stack under `plan` (checkpointed segments through the student's `checkpoint`), backward from a
    fixed gradient: the peak and final live bytes saved for backward, and the input's gradient."""
    weights = stack_weights(widths, hidden, seed)
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(rows, widths[0], generator=g).requires_grad_(True)
    tracker = SavedBytes(excluded=[w for pair in weights for w in pair])
    with no_library_checkpoint(), tracker.hooks():
        h = x
        for start, stop, checkpointed in plan:
            segment = stack_forward(weights, int(start), int(stop))
            h = checkpoint(segment, h) if checkpointed else segment(h)
        forward_bytes = tracker.live
        tracker.phase = "backward"
        h.backward(torch.ones_like(h))
    return {"peak": tracker.peak, "forward": forward_bytes, "left": tracker.live, "x_grad": x.grad}


# --------------------------------------------------------------------------------------------------
# The selective check: the student's attention_block, its saved shapes and gradients


def run_attention(attention_block: Callable, x: torch.Tensor, w_qkv: torch.Tensor, w_out: torch.Tensor, heads: int,
                  p_drop: float, recompute: str, grad: torch.Tensor, seed: int) -> dict:
    """``attention_block(x, w_qkv, w_out, heads, p_drop, recompute)`` with the global RNG seeded, forward and
    backward: the output, the three gradients, the shapes saved during forward, the forward's saved bytes."""
    x, w_qkv, w_out = (t.detach().clone().requires_grad_(True) for t in (x, w_qkv, w_out))
    tracker = SavedBytes(inputs=[x, w_qkv, w_out])
    torch.manual_seed(seed)
    with no_library_checkpoint(), tracker.hooks():
        out = attention_block(x, w_qkv, w_out, heads, p_drop, recompute)
        shapes = [shape for _, shape, _, _ in tracker.log]
        forward_bytes = tracker.live
        tracker.phase = "backward"
        out.backward(grad)
    return {"out": out.detach(), "grads": [x.grad, w_qkv.grad, w_out.grad], "forward_shapes": shapes,
            "forward_bytes": forward_bytes}


# --------------------------------------------------------------------------------------------------
# The CUDA checks: a bf16 stack on the GPU, its allocator's peak under a plan, and a timed training step


_STACKS: dict[tuple, list] = {}


def device_stack(widths: Sequence[int], hidden: Sequence[int], seed: int, dtype: torch.dtype,
                 device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`stack_weights` in `dtype` on `device` (made once per process: the grader and the worker each build the
    same weights from the seed, on the CPU's generator, so the grader can check the worker's gradients)."""
    key = (tuple(widths), tuple(hidden), seed, dtype, device)
    if key not in _STACKS:
        _STACKS.clear()  # one stack at a time on the GPU
        # stack_weights' draws in its order, each moved as it is drawn: the worker's host memory holds one fp32
        # weight at a time (16 MiB), not the whole fp32 stack (768 MiB at the CUDA checks' size)
        g = torch.Generator().manual_seed(seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=g) / rows ** 0.5).to(device, dtype).requires_grad_(True)

        _STACKS[key] = [(weight(widths[i], hidden[i]), weight(hidden[i], widths[i + 1])) for i in range(len(hidden))]
    return _STACKS[key]


class Step:
    """One training step of the stack under `plan`: forward (checkpointed segments through `checkpoint`; None runs
    every segment plainly), backward from a fixed gradient, and what a grader can check of it: the input's
    gradient and the float norm of every weight's gradient (the weights' .grad are cleared first)."""

    def __init__(self, checkpoint: Callable | None, widths: Sequence[int], hidden: Sequence[int],
                 plan: Sequence[Sequence[Any]], seed: int, dtype: torch.dtype, device: str):
        self.checkpoint, self.plan = checkpoint, [(int(s), int(e), bool(c)) for s, e, c in plan]
        self.weights = device_stack(widths, hidden, seed, dtype, device)
        self.params = [w for pair in self.weights for w in pair]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for start, stop, checkpointed in self.plan:
            segment = stack_forward(self.weights, start, stop)
            h = self.checkpoint(segment, h) if checkpointed and self.checkpoint is not None else segment(h)
        return h

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        for p in self.params:
            p.grad = None
        x = x.detach().requires_grad_(True)
        out = self.forward(x)
        # the gradient fed back: the output itself, scaled (d/dout of 0.5 |out|^2 / numel), made from x alone
        out.backward(out.detach() / out.numel() ** 0.5)
        norms = torch.stack([p.grad.float().norm() if p.grad is not None else p.new_zeros((), dtype=torch.float32)
                             for p in self.params])
        return x.grad, norms


def bench_step(checkpoint: Callable, specs: Sequence[Any], kwargs: dict | None = None, **options: Any) -> dict:
    """grader.support.timing's `bench` on a training `Step` through the student's `checkpoint`: the test times it
    with ``speed.time_student`` (every rep's x fresh from the recipe), `kwargs` holding the Step's configuration."""
    from grader.support.timing import bench, default_device

    step = Step(checkpoint, device=default_device(), **(kwargs or {}))
    with no_library_checkpoint():
        return bench(step, specs, None, **options)


def plan_memory(checkpoint: Callable, widths: Sequence[int], hidden: Sequence[int], rows: int,
                plan: Sequence[Sequence[Any]], seed: int, dtype: torch.dtype, device: str) -> dict:
    """One training step of the stack under `plan`, after a warm-up step: the memory allocated at its peak above
    what was allocated before it (the weights and their .grad, the input, the gradient fed back), and the peak of
    the bytes saved for backward (`SavedBytes`).

    On CUDA the first is ``torch.cuda.max_memory_allocated``. On the CPU (the rehearsal, grader/rehearsal.py)
    torch keeps no allocator statistics, and the stand-in is the second figure, never scored. (flash_attention's
    `_Alive`, the bytes alive among the storages operations write, was tried as the stand-in: at the rehearsal's
    tiny widths it counts each weight-gradient temporary as alive after autograd frees it, several layers'
    activations too many, so it measures the stand-in's blind spot, not the plan.)"""
    weights = device_stack(widths, hidden, seed, dtype, device)
    params = [w for pair in weights for w in pair]
    for p in params:
        p.grad = torch.zeros_like(p)  # the gradients accumulate in place: part of the model, not the step
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(rows, widths[0], generator=g).to(device, dtype).requires_grad_(True)
    grad = (torch.randn(rows, widths[-1], generator=g) / rows ** 0.5).to(device, dtype)

    def step() -> torch.Tensor:
        h = x
        for start, stop, checkpointed in plan:
            segment = stack_forward(weights, int(start), int(stop))
            h = checkpoint(segment, h) if checkpointed else segment(h)
        h.backward(grad)
        return h

    tracker = SavedBytes(excluded=params)
    with no_library_checkpoint():
        step()  # the warm-up: cuBLAS's workspace and the allocator's first blocks are no part of the figure
        x.grad = None
        if x.is_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            with tracker.hooks():
                step()
            torch.cuda.synchronize()
            extra = int(torch.cuda.max_memory_allocated() - before)
        else:  # the rehearsal: no allocator statistics on the CPU
            with tracker.hooks():
                step()
            extra = tracker.peak
    return {"extra": extra, "saved_peak": tracker.peak, "device": str(x.device)}
