"""Every Triton kernel of the reference solutions builds for a GPU as the reference launches it there: no GPU needed.

The CPU runs the references under Triton's interpreter, which never compiles a kernel, so the CUDA path (the tile
sizes, warps and stages the host code picks when TRITON_INTERPRET is unset) would otherwise be first compiled on the
grading machine. Here each launch (grader/bench/kernel_resources.py: every kernel the references launch, the
configurations their host code picks on CUDA at the speed checks' shapes, fp16 and bf16) is compiled for sm_90
(H100 / H200) and sm_80 (A100) by the kernel resource model (grader.kernelmodel: Triton's compiler, the ptxas in its
wheel, cuobjdump -res-usage), and must

* compile;
* spill at most STACK_BOUND = 64 bytes per thread. A reference's per-thread state must live in registers: 64 bytes is
  16 fp32 values, a few loop-carried scalars that ptxas parks in local memory (L1-resident); a tile that lives in
  local memory spills hundreds to thousands of bytes (the old flash_attention tiles spilled 280 to 8,600, see
  exercises/flash_attention/README.md). Students are held to kernelmodel.STACK_LIMIT (512): the references, which
  set the speed bars, to this much tighter bound;
* ask at most the architecture's shared memory per block (kernelmodel.SHARED_LIMITS: sm_90 227 KiB, sm_80 163 KiB).

Compiles are cached on disk by the model (key: the generated kernel source, the launch's types and constexprs,
options, target, Triton's version; $GRADER_KERNELMODEL_CACHE, default ~/.cache/grader/kernelmodel), so a rerun takes
seconds (about 10 s warm); a cold run compiles 68 kernels on as many threads as there are CPUs: 104 s of
compiles, 111 s for the whole file, on a 2-core machine at load 5.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import time

import pytest

from grader import kernelmodel
from grader.bench import kernel_resources as kr

from grader.gpucheck import STACK_BOUND  # bytes of spill per thread a reference kernel may have (see the module docstring)
LAUNCHES = kr.launches()
CASES = [(launch, arch) for launch in LAUNCHES for arch in kr.ARCHS]


@pytest.fixture(scope="module")
def measured():
    start = time.monotonic()
    results = kr.measure(LAUNCHES)
    fresh = sum(1 for r in results.values() if not r.cached)
    print(f"\n{len(results)} reference compiles ({fresh} not cached) in {time.monotonic() - start:.1f} s")
    return results


def _fix(launch: kr.Launch) -> str:
    return (f"Change the tiles (smaller BLOCK_M / BLOCK_N / BLOCK), num_warps (more warps share a tile's registers) or "
            f"num_stages (each stage holds another copy of the loaded tiles in shared memory) in the host code of "
            f"{launch.path.relative_to(kr.ROOT)}, then the launch in grader/bench/kernel_resources.py, and rerun "
            "python -m grader.bench.kernel_resources for the README's table.")


@pytest.mark.parametrize("launch,arch", CASES, ids=[f"{launch.id()}-sm{arch}" for launch, arch in CASES])
def test_the_reference_kernel_builds_and_fits(measured, launch, arch):
    result = measured[(launch.id(), arch)]
    what = (f"{launch.exercise}'s {launch.kernel} ({launch.config}, {kr.SHORT[launch.dtype]}, num_warps="
            f"{launch.num_warps}, num_stages={launch.num_stages}) compiled for sm_{arch}")
    assert not result.timed_out, (
        f"{what}: ptxas did not finish within {kernelmodel.COMPILE_TIMEOUT_S:.0f} s, which it does when a tile "
        f"overflows the registers by far (or the machine is overloaded: rerun once). {_fix(launch)}")
    assert result.error is None, f"{what} does not compile: {result.error}\n{_fix(launch)}"
    assert result.stack <= STACK_BOUND, (
        f"{what} spills {result.stack} bytes per thread ({result.registers} registers, the most a thread has is 255), "
        f"over the {STACK_BOUND} bytes this test allows a reference: its state does not live in registers, and "
        f"a spill is paid in local-memory traffic on every iteration. {_fix(launch)}")
    limit = kernelmodel.SHARED_LIMITS[arch]
    assert result.shared <= limit, (
        f"{what} asks for {result.shared:,} bytes of shared memory per block, over the {limit:,} bytes "
        f"({limit // 1024} KiB) an sm_{arch} block may have: it would fail to launch there. {_fix(launch)}")


def _launched_kernels(path) -> set[str]:
    """The module-level @triton.jit functions of a file that its host code launches as name[grid](...)."""
    tree = ast.parse(path.read_text())
    jit = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
           and any("jit" in ast.unparse(d) for d in node.decorator_list)}
    launched = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            value = node.func.value
            if isinstance(value, ast.Name) and value.id in jit:
                launched.add(value.id)
    return launched


def test_every_launched_reference_kernel_is_compiled():
    """A new kernel (or a new exercise with kernels) in solutions/ must get its launches in kernel_resources.py."""
    want = {(path.parent.name, name) for path in sorted(kr.SOLUTIONS.glob("*/*.py")) for name in _launched_kernels(path)}
    have = {(launch.exercise, launch.kernel) for launch in LAUNCHES}
    assert {"online_softmax", "flash_attention", "paged_kv"} <= {exercise for exercise, _ in want}, want
    missing = sorted(want - have)
    assert not missing, (f"these reference kernels are launched by their host code but not compiled here: {missing}. "
                         "Add their CUDA-path launches (tiles, warps, stages, dtypes at the speed checks' shapes) to "
                         "grader/bench/kernel_resources.py")
    for dtype in kr.DTYPES:
        assert {(launch.exercise, launch.kernel) for launch in LAUNCHES if launch.dtype == dtype} == have, dtype


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"reference_{name}", kr.SOLUTIONS / name / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flash_attention_launches_are_the_references_cuda_configs(monkeypatch):
    """The tiles compiled here are the ones flash_attention's host code picks on CUDA (TRITON_INTERPRET unset)."""
    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    fa = _module("flash_attention")
    assert fa.DELTA_ROWS == kr.FLASH_DELTA_ROWS
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            fwd = fa._blocks(d, dtype)
            dkdv, dq = fa._bwd_blocks(d, dtype)
            for name, got, want in (("_blocks", fwd, kr.FLASH_FORWARD[d]), ("_bwd_blocks dK/dV", dkdv, kr.FLASH_DKDV[d]),
                                    ("_bwd_blocks dQ", dq, kr.FLASH_DQ[d])):
                assert (got["BLOCK_M"], got["BLOCK_N"], got["num_warps"], got["num_stages"]) == (*want, 3), (
                    f"flash_attention's {name}({d}, {dtype}) on CUDA picks {got}, but grader/bench/kernel_resources.py "
                    f"compiles (BLOCK_M, BLOCK_N, num_warps) = {want} with 3 stages: update it to the reference's tiles")


def test_online_softmax_and_paged_kv_launches_follow_their_host_code():
    """Their host code computes the launch inline: the expressions kernel_resources.py mirrors must still be there."""
    expected = {
        "online_softmax": ["block = min(4096, triton.next_power_of_2(n_cols))",
                           "num_warps = 4 if block <= 1024 else 8", "BLOCK=block, num_warps=num_warps)"],
        "paged_kv": ["GROUP_PAD=max(16, triton.next_power_of_2(group))", "DIM_PAD=max(16, triton.next_power_of_2(D))",
                     "TILE=64", 'PRECISION="ieee" if k_cache.dtype == torch.float32 else "tf32", num_warps=4,'],
    }
    for name, parts in expected.items():
        source = re.sub(r"\s+", " ", (kr.SOLUTIONS / name / f"{name}.py").read_text())
        for part in parts:
            assert part in source, (f"solutions/{name}/{name}.py no longer holds {part!r}: its CUDA launch changed, so "
                                    "update its launches in grader/bench/kernel_resources.py to match")
