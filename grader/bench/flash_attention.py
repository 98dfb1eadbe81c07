"""Benchmark FlashAttention against scaled_dot_product_attention and the naive path, in one run.

    python -m grader.bench.flash_attention [SUBMISSION_FILE]   (default: exercises/flash_attention/flash_attention.py)

On CUDA, bf16, B = 4, H = 16, N = 4096 (the graded speed checks' cases, grader/cases/flash_attention.py):
for each head dim and causal setting, the TFLOP/s of the submission, of the reference solution (when
solutions/ is present), of torch.nn.functional.scaled_dot_product_attention and of the naive path (matmul,
softmax, matmul),
the submission's fraction of SDPA (the graded figure) and of a large bf16 matmul's measured throughput
(the roofline ceiling). Then the same for the backward pass at D = 128. FLOPs: 4 * B * H * Nq * Nk * D
forward, halved when causal; 2.5x that backward.

On the CPU the kernels run under TRITON_INTERPRET=1, which measures numpy, not a GPU kernel: the script
prints the submission's time relative to the reference's on a small shape (one thread, minimum of
3 runs), a sanity check only.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch

from grader.bench import load, min_time
from grader.cases import flash_attention as cases
from grader.course import find_root

B, H, N = cases.BATCH, cases.HEADS, cases.SEQ_LEN


def naive_attention(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
    if causal:
        n_q, n_k = s.shape[-2:]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril(n_k - n_q)
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def cuda_main(sub, ref) -> None:
    import torch.nn.functional as F

    from grader import speed
    from grader.results import device_info

    ceil = speed.ceilings()
    clocks = ", ".join(f"{name} {mhz:.0f} MHz" for name, mhz in ceil.clocks_mhz.items()) or "clocks unknown"
    info = device_info()
    versions = ", ".join(f"{name} {info.get(name)}" for name in ("torch", "cuda", "triton", "driver") if info.get(name))
    print(f"device {ceil.device} ({clocks}; {versions})")
    print(
        f"ceilings: bf16 matmul {ceil.matmul_flops_per_s / 1e12:.0f} TFLOP/s, copy {ceil.copy_bytes_per_s / 1e9:.0f} GB/s"
    )
    print(f"forward, bf16, B={B} H={H} N={N}: TFLOP/s")
    print(
        f"{'D':>4} {'causal':>6} {'submission':>11} {'reference':>10} {'sdpa':>7} {'naive':>7} {'/sdpa':>6} {'/matmul':>8}"
    )
    for case in cases.FORWARD:
        head_dim, causal = case.head_dim, case.causal
        specs = case.inputs()
        f = case.flops()

        def tflops(fn):
            return f / speed.time_here(fn, specs, reps=20).mean_s / 1e12

        mine = tflops(lambda q, k, v: sub.flash_attention_forward(q, k, v, causal))
        theirs = tflops(lambda q, k, v: ref.flash_attention_forward(q, k, v, causal)) if ref else float("nan")
        sdpa = tflops(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        naive = tflops(lambda q, k, v: naive_attention(q, k, v, causal))
        print(
            f"{head_dim:>4} {causal!s:>6} {mine:>11.1f} {theirs:>10.1f} {sdpa:>7.1f} {naive:>7.1f} "
            f"{mine / sdpa:>6.2f} {mine * 1e12 / ceil.matmul_flops_per_s:>8.2f}"
        )

    print(f"backward, bf16, B={B} H={H} N={N} D=128: TFLOP/s (SDPA's backward = its forward+backward - forward)")
    print(f"{'causal':>6} {'submission':>11} {'reference':>10} {'sdpa':>7} {'/sdpa':>6} {'/matmul':>8}")
    for case in cases.BACKWARD:
        causal = case.causal
        f = case.flops()
        specs = case.inputs()

        def bwd_tflops(module):
            return (
                f
                / speed.time_here(lambda *a: module.flash_attention_backward(*a, causal=causal), specs, reps=20).mean_s
                / 1e12
            )

        sdpa_s = cases.sdpa_backward_s(case, reps=20)
        mine = bwd_tflops(sub)
        theirs = bwd_tflops(ref) if ref else float("nan")
        sdpa = f / sdpa_s / 1e12
        print(
            f"{causal!s:>6} {mine:>11.1f} {theirs:>10.1f} {sdpa:>7.1f} {mine / sdpa:>6.2f} "
            f"{mine * 1e12 / ceil.matmul_flops_per_s:>8.2f}"
        )


def cpu_main(sub, ref) -> None:
    torch.set_num_threads(1)
    print("CPU under TRITON_INTERPRET=1 (numpy, not a GPU kernel): a sanity check, not a speed measurement")
    if ref is None:
        print("no reference solution here (solutions/ is not shipped with the course): nothing to compare")
        return
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=g) for _ in range(3))

    print(f"{'pass':>9} {'submission s':>13} {'reference s':>12} {'ratio':>6}")
    for name, call in (
        ("forward", lambda m: m.flash_attention_forward(q, k, v, True)),
        (
            "fwd+bwd",
            lambda m: m.flash_attention(*(t.clone().requires_grad_() for t in (q, k, v)), True).sum().backward(),
        ),
    ):
        mine, theirs = min_time(lambda: call(sub), reps=3), min_time(lambda: call(ref), reps=3)
        print(f"{name:>9} {mine:>13.3f} {theirs:>12.3f} {mine / theirs:>6.2f}")


def main(argv: list[str]) -> None:
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the modules import triton
    root = find_root()
    path = Path(argv[0]) if argv else root / "exercises" / "flash_attention" / "flash_attention.py"
    sub = load(path, "submission")
    ref_path = root / "solutions" / "flash_attention" / "flash_attention.py"
    ref = load(ref_path, "reference") if ref_path.is_file() else None
    print(f"submission: {path}")
    try:
        if torch.cuda.is_available():
            cuda_main(sub, ref)
        else:
            cpu_main(sub, ref)
    except NotImplementedError as exc:
        print(
            f"the submission is not written yet ({exc}): nothing to time. Benchmark another file with "
            "python -m grader.bench.flash_attention PATH"
        )
        raise SystemExit(1) from None


if __name__ == "__main__":
    main(sys.argv[1:])
