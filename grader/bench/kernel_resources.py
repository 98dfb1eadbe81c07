"""Every Triton kernel of the reference solutions, compiled as the reference launches it on a GPU, for sm_90 and
sm_80: registers, stack (spilled bytes) and shared memory per kernel, from the toolchain alone (no GPU).

    python -m grader.bench.kernel_resources            # a Markdown table, both architectures
    python -m grader.bench.kernel_resources --arch 80  # one architecture
    python -m grader.bench.kernel_resources --merged   # the README's form (architectures side by side)

The launches are written here by hand, as the worker's recorder writes them (grader.harness.launches.
describe_argument), from each reference's CUDA path (the tile sizes, warps and stages its host code picks when
TRITON_INTERPRET is unset) at the shapes its speed checks use (grader/cases/<id>.py), in fp16 and bf16. The kernel
resource model (grader.kernelmodel) compiles each with Triton's compiler and the ptxas in its wheel and reads the
cubin with cuobjdump -res-usage; its disk cache keeps the answers ($GRADER_KERNELMODEL_CACHE). Compiles run on
as many threads as the machine has CPUs, each in its own process. tests/test_reference_kernels_compile.py asserts
on the same launches; README.md, "Performance", holds the table.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grader import kernelmodel

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
ARCHS = (90, 80)
DTYPES = ("float16", "bfloat16")
SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def tensor(dtype: str) -> dict:
    return {"kind": "tensor", "dtype": dtype, "aligned": True}


def integer(value: int) -> dict:
    return {"kind": "int", "value": value}


def flag(value: bool) -> dict:
    return {"kind": "bool", "value": value}


def text(value: str) -> dict:
    return {"kind": "str", "value": value}


def real(value: float) -> dict:
    return {"kind": "float", "value": value}


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch of a reference kernel as its host code makes it on a GPU."""

    exercise: str
    kernel: str
    dtype: str  # of the inputs: "float16", "bfloat16"
    config: str  # what the row shows: "D=64 causal, 128x64"
    arguments: dict
    num_warps: int
    num_stages: int = 3  # Triton's default, where the host code names none

    @property
    def path(self) -> Path:
        return SOLUTIONS / self.exercise / f"{self.exercise}.py"

    def record(self) -> dict:
        """The launch as grader.support.kernels:launches records it."""
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        return {"kernel": self.kernel, "grid": [1, 1, 1], "programs": 1, "arguments": self.arguments,
                "options": options}

    def id(self) -> str:
        return f"{self.exercise}-{self.kernel.strip('_')}-{SHORT[self.dtype]}-{self.config.replace(' ', '')}"


# -- online_softmax: softmax_triton picks BLOCK = min(4096, next_power_of_2(n_cols)), 4 warps up to BLOCK = 1024,
# else 8. Speed checks (grader/cases/online_softmax.py): 4096 x 8192 and 64 x 2^18 (both BLOCK 4096, one compile:
# n_cols divisible by 16 either way), benchmarked too at 16384 x 1024 (BLOCK 1024). x contiguous: stride_xc = 1.


def online_softmax(dtype: str) -> list[Launch]:
    out = []
    for n_cols in (8192, 1024):
        block = min(4096, 1 << (n_cols - 1).bit_length())
        warps = 4 if block <= 1024 else 8
        out.append(Launch("online_softmax", "_softmax_kernel", dtype, f"BLOCK={block}",
                          dict(x_ptr=tensor(dtype), out_ptr=tensor(dtype), n_cols=integer(n_cols),
                               stride_xr=integer(n_cols), stride_xc=integer(1), stride_or=integer(n_cols),
                               BLOCK=integer(block)), warps))
    return out


# -- flash_attention: _blocks and _bwd_blocks (fp16 / bf16 on CUDA): forward 128 x 64, 4 warps at D <= 64, 8 at
# D = 128, 3 stages; dK/dV 32 x 128 (D <= 64) or 16 x 128 (D = 128), 8 warps; dQ 128 x 32, 4 or 8 warps; the delta
# kernel 64 rows (DELTA_ROWS), Triton's default 4 warps and 3 stages. Speed checks (grader/cases/flash_attention.py):
# B = 4, H = 16, N = 4096, forward at D = 64 and 128, backward at D = 128, causal and not; the backward at D = 64
# (the reference's other config) is compiled too. PRECISION is "tf32" (ignored by fp16 / bf16 products).

FLASH_FORWARD = {64: (128, 64, 4), 128: (128, 64, 8)}  # D: (BLOCK_M, BLOCK_N, num_warps), num_stages 3
FLASH_DKDV = {64: (32, 128, 8), 128: (16, 128, 8)}
FLASH_DQ = {64: (128, 32, 4), 128: (128, 32, 8)}
FLASH_DELTA_ROWS = 64
FLASH_SHAPE = (4, 16, 4096)  # batch, heads, sequence length


def flash_attention(dtype: str) -> list[Launch]:
    _, heads, n = FLASH_SHAPE
    out = []
    for d in (64, 128):
        common = dict(N_Q=integer(n), N_K=integer(n), H_Q=integer(heads), H_KV=integer(heads),
                      HEAD_DIM=integer(d), PRECISION=text("tf32"))
        for causal in (False, True):
            mask = "causal" if causal else "full"
            bm, bn, warps = FLASH_FORWARD[d]
            out.append(Launch("flash_attention", "_fwd_kernel", dtype, f"D={d} {mask} {bm}x{bn}",
                              dict(Q=tensor(dtype), K=tensor(dtype), V=tensor(dtype), O=tensor(dtype),
                                   LSE=tensor("float32"), qk_scale=real(0.18), BLOCK_M=integer(bm),
                                   BLOCK_N=integer(bn), CAUSAL=flag(causal), **common), warps))
            backward = dict(Q=tensor(dtype), K=tensor(dtype), V=tensor(dtype), DO=tensor(dtype),
                            LSE=tensor("float32"), DELTA=tensor("float32"), sm_scale=real(0.125),
                            qk_scale=real(0.18), CAUSAL=flag(causal), **common)
            bm, bn, warps = FLASH_DKDV[d]
            out.append(Launch("flash_attention", "_bwd_dkdv_kernel", dtype, f"D={d} {mask} {bm}x{bn}",
                              dict(backward, DK=tensor(dtype), DV=tensor(dtype), BLOCK_M=integer(bm),
                                   BLOCK_N=integer(bn)), warps))
            bm, bn, warps = FLASH_DQ[d]
            out.append(Launch("flash_attention", "_bwd_dq_kernel", dtype, f"D={d} {mask} {bm}x{bn}",
                              dict(backward, DQ=tensor(dtype), BLOCK_M=integer(bm), BLOCK_N=integer(bn)), warps))
        out.append(Launch("flash_attention", "_bwd_delta_kernel", dtype, f"D={d} {FLASH_DELTA_ROWS} rows",
                          dict(O=tensor(dtype), DO=tensor(dtype), DELTA=tensor("float32"), N_Q=integer(n),
                               HEAD_DIM=integer(d), BLOCK_M=integer(FLASH_DELTA_ROWS)), 4))
    return out


# -- paged_kv: paged_attention_triton launches one program per (sequence, KV head), TILE = 64, 4 warps, GROUP_PAD =
# max(16, next_power_of_2(group)), DIM_PAD = max(16, next_power_of_2(D)). Speed check (grader/cases/paged_kv.py,
# DECODE): 32 query heads on 8 KV heads (group 4), D = 128, cache blocks of 16 tokens, contiguous q [B, Hq, D] and
# caches [blocks, 16, Hkv, D], tables int32 [B, up to 256], lengths int64.

PAGED = dict(q_heads=32, kv_heads=8, head_dim=128, block_size=16, max_blocks=256)


def paged_kv(dtype: str) -> list[Launch]:
    hq, hkv, d, bs = PAGED["q_heads"], PAGED["kv_heads"], PAGED["head_dim"], PAGED["block_size"]
    group = hq // hkv
    group_pad, dim_pad = max(16, 1 << (group - 1).bit_length()), max(16, 1 << (d - 1).bit_length())
    cache = [integer(bs * hkv * d), integer(hkv * d), integer(d), integer(1)]
    args = dict(q_ptr=tensor(dtype), k_ptr=tensor(dtype), v_ptr=tensor(dtype), tables_ptr=tensor("int32"),
                lens_ptr=tensor("int64"), out_ptr=tensor(dtype), sm_scale=real(d ** -0.5),
                stride_qb=integer(hq * d), stride_qh=integer(d), stride_qd=integer(1),
                **dict(zip(("stride_kn", "stride_ks", "stride_kh", "stride_kd"), cache)),
                **dict(zip(("stride_vn", "stride_vs", "stride_vh", "stride_vd"), cache)),
                stride_tb=integer(PAGED["max_blocks"]), stride_ob=integer(hq * d), stride_oh=integer(d),
                stride_od=integer(1), BLOCK_SIZE=integer(bs), GROUP=integer(group), GROUP_PAD=integer(group_pad),
                HEAD_DIM=integer(d), DIM_PAD=integer(dim_pad), TILE=integer(64), PRECISION=text("tf32"))
    return [Launch("paged_kv", "_paged_attention_kernel", dtype, f"D={d} group={group} TILE=64", args, 4)]


def launches(dtypes=DTYPES) -> list[Launch]:
    """Every reference kernel's GPU launches, each dtype."""
    return [launch for dtype in dtypes for make in (online_softmax, flash_attention, paged_kv)
            for launch in make(dtype)]


def measure(found: list[Launch], archs=ARCHS, jobs: int | None = None) -> dict[tuple[str, int], kernelmodel.LaunchResources]:
    """{(launch id, arch): kernelmodel.LaunchResources}, compiled on `jobs` threads (each compile is a process)."""
    from grader.harness import tamper

    groups: dict[tuple, list[Launch]] = {}  # one model call per file, arch and dtype: the file is scanned once
    for arch in archs:
        for launch in found:
            groups.setdefault((launch.path, arch, launch.dtype), []).append(launch)
    # The model runs the tamper scan on each file first, and the scan resolves names (triton.jit) through the modules
    # this process has imported, importing their roots on first use: one thread's half-done `import triton` makes
    # another's triton.jit look unknown (flagged). One scan of each file here, before the threads, imports them.
    for path in sorted({launch.path for launch in found}):
        tamper.scan(path.read_bytes())

    def one(item):
        (path, arch, _), group = item
        results = kernelmodel.resources(path, [launch.record() for launch in group], stop_at_misfit=False,
                                        target=("cuda", arch, 32))
        assert len(results) == len(group), f"two launches of {path.name} share a compile: {group}"
        return [((launch.id(), arch), result) for launch, result in zip(group, results)]

    # Largest groups first, so that the threads finish together.
    work = sorted(groups.items(), key=lambda item: -len(item[1]))
    with one_parse_at_a_time(), ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
        return dict(pair for pairs in pool.map(one, work) for pair in pairs)


@contextlib.contextmanager
def one_parse_at_a_time():
    """ast.parse serialised while the threads compile: CPython 3.11's AST conversion keeps its recursion depth
    in shared state, and two threads parsing at once (the scan's, the model's or Triton's own parse of a kernel)
    raised "SystemError: AST constructor recursion depth mismatch" in a fresh clone's `make test`. The compiles
    (ptxas, a process each) still run in parallel."""
    import ast
    import threading

    parse, lock = ast.parse, threading.Lock()

    def locked(*args, **kwargs):
        with lock:
            return parse(*args, **kwargs)

    ast.parse = locked
    try:
        yield
    finally:
        ast.parse = parse


def table(found: list[Launch], results: dict, archs=ARCHS) -> str:
    """A Markdown table: one row per launch and architecture."""
    rows = ["| exercise | kernel | arch | dtype | config | warps | stages | registers | stack | shared |",
            "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for launch in found:
        for arch in archs:
            r = results[(launch.id(), arch)]
            if r.registers is None:
                figures = "did not compile | | "
            else:
                figures = f"{r.registers} | {r.stack} | {r.shared:,}"
            rows.append(f"| {launch.exercise} | `{launch.kernel}` | sm_{arch} | {SHORT[launch.dtype]} | {launch.config} "
                        f"| {launch.num_warps} | {launch.num_stages} | {figures} |")
    return "\n".join(rows)


def merged_table(found: list[Launch], results: dict, archs=ARCHS) -> str:
    """The README's form: one row per kernel and config, each architecture's registers / stack / shared side by
    side; fp16 and bf16 share a row where every figure agrees."""
    head = " | ".join(f"sm_{arch} registers | stack | shared" for arch in archs)
    rows = [f"| exercise | kernel | config | warps | stages | dtype | {head} |",
            "| --- | --- | --- | ---: | ---: | --- |" + " ---: | ---: | ---: |" * len(archs)]

    def figures(launch):
        out = []
        for arch in archs:
            r = results[(launch.id(), arch)]
            out += ["did not compile", "", ""] if r.registers is None else [str(r.registers), str(r.stack), f"{r.shared:,}"]
        return out

    seen: dict[tuple, list[Launch]] = {}
    for launch in found:
        seen.setdefault((launch.exercise, launch.kernel, launch.config, launch.num_warps, launch.num_stages),
                        []).append(launch)
    for (exercise, kernel, config, warps, stages), group in seen.items():
        distinct: dict[tuple, list[str]] = {}
        for launch in group:
            distinct.setdefault(tuple(figures(launch)), []).append(SHORT[launch.dtype])
        for values, dtypes in distinct.items():
            rows.append(f"| {exercise} | `{kernel}` | {config} | {warps} | {stages} | {', '.join(dtypes)} | "
                        f"{' | '.join(values)} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, action="append", choices=ARCHS, help="sm_XX; both when omitted")
    parser.add_argument("--dtype", action="append", choices=DTYPES,
                        help="the inputs' dtype; fp16 and bf16 when omitted")
    parser.add_argument("--merged", action="store_true",
                        help="the README's form: architectures side by side, fp16 and bf16 in one row where equal")
    parser.add_argument("--jobs", type=int, default=None, help="compiles at once (default: the CPUs)")
    args = parser.parse_args(argv)
    archs = tuple(args.arch or ARCHS)
    found = launches(tuple(args.dtype or DTYPES))
    start = time.monotonic()
    results = measure(found, archs, args.jobs)
    import triton

    print((merged_table if args.merged else table)(found, results, archs))
    compiled = sum(1 for r in results.values() if not r.cached)
    print(f"\n{len(results)} compiles ({compiled} not from the cache) in {time.monotonic() - start:.1f} s, "
          f"Triton {triton.__version__}", file=sys.stderr)
    bad = [f"{key[0]} sm_{key[1]}: {'; '.join(r.problems())}" for key, r in results.items() if r.problems()]
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
