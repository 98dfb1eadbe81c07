"""CPU benchmark of the BlockManager: decode steps per second, the submission against the reference.

    python -m grader.bench.paged_kv [path/to/paged_kv.py]     # default: exercises/paged_kv/paged_kv.py

1,000 sequences get a 100-token prompt each, then 1,000 decode steps append one token to every
sequence (1,000,000 append_token calls, a block allocated every block_size of them), then all are
freed. Both files run in this process, one thread, alternating, and the best of several runs of
each is reported: single timings on a shared machine are noisy, the minimum is not. What matters is
the ratio: the manager's work per token should be a handful of dict and list operations.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from grader.bench import load

ROOT = Path(__file__).resolve().parents[2]


def decode_run(module, seqs: int, steps: int, prompt: int, block_size: int, caching: bool) -> tuple[float, int]:
    """Seconds for one full serving run, and the number of manager operations in it."""
    blocks_needed = seqs * (-(-(prompt + steps) // block_size))
    bm = module.BlockManager(blocks_needed + 16, block_size, enable_prefix_caching=caching)
    system = list(range(prompt // 2))  # a shared system prompt: half of every prompt
    start = time.perf_counter()
    for s in range(seqs):
        bm.add_sequence(s, system + [s] * (prompt - len(system)))
    for step in range(steps):
        for s in range(seqs):
            bm.append_token(s, step)
    for s in range(seqs):
        bm.free(s)
    return time.perf_counter() - start, seqs * (steps + 2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submission", nargs="?", default=str(ROOT / "exercises" / "paged_kv" / "paged_kv.py"))
    parser.add_argument("--reference", default=str(ROOT / "solutions" / "paged_kv" / "paged_kv.py"))
    parser.add_argument("--seqs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    modules = {
        "submission": load(Path(args.submission), "paged_kv_submission"),
        "reference": load(Path(args.reference), "paged_kv_reference"),
    }
    print(
        f"{args.seqs} sequences x {args.steps} decode steps, prompt {args.prompt}, block size {args.block_size}; "
        f"best of {args.runs} runs, one thread"
    )
    for caching in (False, True):
        best = {name: float("inf") for name in modules}
        ops = 0
        for _ in range(args.runs):
            for name, module in modules.items():  # alternate, so a busy spell hits both
                try:
                    seconds, ops = decode_run(module, args.seqs, args.steps, args.prompt, args.block_size, caching)
                except NotImplementedError as exc:
                    print(f"  {name}: not implemented yet ({exc})")
                    return
                best[name] = min(best[name], seconds)
        rates = {name: ops / s for name, s in best.items()}
        print(
            f"prefix caching {'on ' if caching else 'off'}: submission {rates['submission']:>12,.0f} ops/s   "
            f"reference {rates['reference']:>12,.0f} ops/s   ratio {rates['submission'] / rates['reference']:.2f}"
        )
    if torch.cuda.is_available():
        cuda_attention(modules)


def cuda_attention(modules: dict) -> None:
    """GB/s of K/V read by each paged attention, as a fraction of the device copy bandwidth, on the graded decode
    batch (grader/cases/paged_kv.py; lengths and tables drawn from seed 0)."""
    import torch

    from grader import speed
    from grader.cases import paged_kv as cases

    case = cases.DECODE
    B, Hq, Hkv, D, block_size = case.batch, case.q_heads, case.kv_heads, case.head_dim, case.block_size
    lengths, need, tables = case.layout(torch.Generator().manual_seed(0))
    specs = [
        speed.Randn(case.q_shape, cases.DTYPE),
        speed.Randn(case.cache_shape(sum(need)), cases.DTYPE),
        speed.Randn(case.cache_shape(sum(need)), cases.DTYPE),
        tables.cuda(),
        lengths.to(torch.int32).cuda(),
    ]
    moved = case.bytes(lengths)
    ceil = speed.ceilings()
    print(
        f"CUDA decode, B={B}, Hq={Hq}, Hkv={Hkv}, D={D}, block size {block_size}, fp16; copy bandwidth "
        f"{ceil.copy_bytes_per_s / 1e9:.0f} GB/s"
    )
    for name, module in modules.items():
        for fn_name in ("paged_attention_triton", "paged_attention"):
            t = speed.time_here(getattr(module, fn_name), specs, reps=20)
            print(
                f"  {name:>10} {fn_name:<24} {moved / t.mean_s / 1e9:8.0f} GB/s  "
                f"{moved / t.mean_s / ceil.copy_bytes_per_s:5.2f} of copy"
            )


if __name__ == "__main__":
    main()
