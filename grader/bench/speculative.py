"""Benchmark speculative_accept: a submission against the reference and a plain vectorised oracle, in one run.

    python -m grader.bench.speculative                       # exercises/speculative/speculative.py
    python -m grader.bench.speculative path/to/speculative.py

On CUDA: the graded shape (B = 64, gamma = 4, V = 128256, fp32): bytes of both probability tensors over
the mean time, as a fraction of the device copy bandwidth measured just before (what the
`accept_speed` check scores). On the CPU: the same shape scaled down to V = 8192, one thread, fresh
inputs for every run, the minimum of several runs, as ratios. CPU figures are never a verdict: time on
a shared machine is too noisy to grade (the graded check for loops is structural; see README.md).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from grader.bench import load
from grader.cases.speculative import ACCEPT, ACCEPT_CPU

ROOT = Path(__file__).resolve().parents[2]
B, GAMMA, VOCAB = ACCEPT_CPU.batch, ACCEPT_CPU.gamma, ACCEPT_CPU.vocab
RUNS = 15


def oracle_accept(draft_tokens, draft_probs, target_probs, generator):
    """The straightforward vectorised rule: the residual of EVERY position, normalised, then gathered."""
    Bn, gamma = draft_tokens.shape
    dev = target_probs.device
    rows = torch.arange(Bn, device=dev)
    q_x = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    p_x = target_probs[:, :gamma].gather(-1, draft_tokens[..., None]).squeeze(-1)
    u = 1 - torch.rand(Bn, gamma, generator=generator, device=dev)
    n = ((q_x > 0) & (u <= p_x / q_x)).long().cumprod(1).sum(1)
    residual = (target_probs[:, :gamma] - draft_probs).clamp(min=0)
    residual = torch.cat([residual, target_probs[:, gamma:]], dim=1)
    residual = residual / residual.sum(-1, keepdim=True).clamp(min=1e-30)
    extra = torch.multinomial(residual[rows, n], 1, generator=generator).squeeze(1)
    pos = torch.arange(gamma + 1, device=dev)
    padded = torch.cat([draft_tokens, torch.full((Bn, 1), -1, device=dev)], 1)
    tokens = torch.where(pos < n[:, None], padded, -1).scatter(1, n[:, None], extra[:, None])
    return tokens, n


def inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(B, GAMMA, VOCAB, generator=g), -1)
    p = torch.softmax(torch.randn(B, GAMMA + 1, VOCAB, generator=g), -1)
    draft = torch.multinomial(q.reshape(-1, VOCAB), 1, generator=g).reshape(B, GAMMA)
    return draft, q, p, torch.Generator().manual_seed(seed + 1)


def best_time(fn) -> float:
    fn(*inputs(0))  # warm-up
    times = []
    for r in range(RUNS):
        args = inputs(r + 1)
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return min(times)


def cuda_report(contenders: dict) -> None:
    from grader import speed
    from grader.support.speculative import Probs, SeededGenerator, Tokens

    Bc, gamma, vocab = ACCEPT.batch, ACCEPT.gamma, ACCEPT.vocab
    ceil = speed.ceilings()
    specs = [
        Tokens((Bc, gamma), high=vocab),
        Probs((Bc, gamma, vocab)),
        Probs((Bc, gamma + 1, vocab)),
        SeededGenerator(()),
    ]
    moved = ACCEPT.bytes()
    print(
        f"CUDA: speculative_accept, B={Bc}, gamma={gamma}, V={vocab}, fp32; copy bandwidth "
        f"{ceil.copy_bytes_per_s / 1e9:.0f} GB/s (the check: full marks at 0.15 of it, none at 0.03)"
    )
    for name, fn in contenders.items():
        try:
            t = speed.time_here(fn, specs)
        except NotImplementedError as exc:
            print(f"  {name:18s} not implemented yet ({exc})")
            continue
        print(
            f"  {name:18s} {t.mean_s * 1e6:9.1f} us  {moved / t.mean_s / 1e9:8.1f} GB/s  "
            f"{moved / t.mean_s / ceil.copy_bytes_per_s:6.3f} of copy bandwidth"
        )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    submission = Path(argv[0]) if argv else ROOT / "exercises" / "speculative" / "speculative.py"
    contenders = {
        "submission": load(submission, "speculative_submission").speculative_accept,
        "reference": load(
            ROOT / "solutions" / "speculative" / "speculative.py", "speculative_reference"
        ).speculative_accept,
        "vectorised oracle": oracle_accept,
    }
    if torch.cuda.is_available():
        cuda_report(contenders)
    torch.set_num_threads(1)
    moved = ACCEPT_CPU.bytes()
    print(f"CPU: speculative_accept, B={B}, gamma={GAMMA}, V={VOCAB}, fp32, 1 thread, best of {RUNS}")
    times = {}
    for name, fn in contenders.items():
        try:
            times[name] = best_time(fn)
        except NotImplementedError as exc:
            print(f"  {name:18s} not implemented yet ({exc})")
    for name, t in times.items():
        line = f"  {name:18s} {t * 1e3:8.3f} ms  {moved / t / 1e9:6.2f} GB/s (both tensors once)"
        if "reference" in times:
            line += f"  {t / times['reference']:5.2f}x reference"
        if "vectorised oracle" in times:
            line += f"  {t / times['vectorised oracle']:5.2f}x oracle"
        print(line)


if __name__ == "__main__":
    main()
