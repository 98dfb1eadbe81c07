"""The kernel resource model (grader/kernelmodel.py): Triton kernels compiled for sm_90 as launched, no GPU.

Launch records are written here by hand, as the worker's recorder writes them (grader.harness.launches.
describe_argument), so that these tests need no interpreter run; tests/test_scoring.py grades online_softmax's
reference and its known-wrong kernels through the whole path (worker, record, model). The compiles share one
cache directory per module, so each distinct kernel is compiled once here (about a second each; the one-tile
kernel at 2^17 columns compiles at 32 warps, its fastest, ~1.5 s).
"""

from __future__ import annotations

import re

from pathlib import Path

import pytest
import torch

from grader import kernelmodel
from grader.harness import launches, tamper

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "solutions" / "online_softmax" / "online_softmax.py"

ONE_TILE = '''import triton
import triton.language as tl


@triton.jit
def one_tile(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=cols < n_cols)


def host(x):
    raise SystemExit("host code must never run on the trusted side")
'''

NOT_A_KERNEL_FOR_A_GPU = '''import triton
import triton.language as tl


@triton.jit
def ranged(x_ptr, n_cols):
    # a tl.arange whose bound is a runtime value: the interpreter runs it, the GPU compiler refuses it
    cols = tl.arange(0, n_cols)
    tl.store(x_ptr + cols, cols)
'''

AUTOTUNED = '''import triton
import triton.language as tl

WIDTH = tl.constexpr(64)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4)], key=["n"])
@triton.jit
def scaled(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, x * WIDTH, mask=offs < n)
'''


def tensor(dtype: str = "float16") -> dict:
    return {"kind": "tensor", "dtype": dtype, "aligned": True}


def integer(value: int) -> dict:
    return {"kind": "int", "value": value}


def launch(kernel: str, warps: int, **arguments: dict) -> dict:
    return {"kernel": kernel, "grid": [2, 1, 1], "programs": 2, "arguments": arguments, "options": {"num_warps": warps}}


def reference_launch(n: int, block: int = 4096, warps: int = 8) -> dict:
    return launch("_softmax_kernel", warps, x_ptr=tensor(), out_ptr=tensor(), n_cols=integer(n), stride_xr=integer(n),
                  stride_xc=integer(1), stride_or=integer(n), BLOCK=integer(block))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    where = tmp_path_factory.mktemp("kernelmodel-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADER_KERNELMODEL_CACHE", str(where))
        yield where


@pytest.fixture
def model(cache):
    """The model with this module's disk cache and an empty memory cache."""
    kernelmodel._MEMORY.clear()
    yield kernelmodel
    kernelmodel._MEMORY.clear()


def write(tmp_path: Path, text: str, name: str = "kernels.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_reference_kernel_fits(model):
    found = model.resources(REFERENCE, [reference_launch(1 << 17), reference_launch((1 << 18) + 16)])
    assert len(found) == 1, f"rows of 2^17 and 2^18 + 16 columns share one compile (same specialisation): {found}"
    (result,) = found
    assert result.error is None and not result.timed_out, result
    assert result.launches == 2 and result.constexprs == {"BLOCK": 4096} and result.num_warps == 8
    assert result.stack == 0 and 0 < result.registers <= 255 and result.shared <= model.SHARED_LIMIT, result
    model.assert_fit(found, "the reference")


def test_a_one_tile_kernel_at_2_17_columns_spills_and_is_refused(model, tmp_path):
    path = write(tmp_path, ONE_TILE)
    found = model.resources(path, [launch("one_tile", 32, x_ptr=tensor(), out_ptr=tensor(), n_cols=integer(1 << 17),
                                          BLOCK=integer(1 << 17))])
    (result,) = found
    assert result.error is None and result.stack > model.STACK_LIMIT, result
    with pytest.raises(AssertionError) as failure:
        model.assert_fit(found, "one_tile on rows of 131,072 columns", hint="HINT")
    message = str(failure.value)
    for part in ("one_tile on rows of 131,072 columns", "one_tile (BLOCK=131072, num_warps=32", f"{result.stack:,} bytes",
                 "over the 512 bytes allowed", "131072 elements over 1024 threads is 128 values a thread",
                 "loop over the row", "HINT"):
        assert part in message, f"expected {part!r} in the message: {message}"


def test_a_tile_far_beyond_the_registers_is_refused_from_the_ir_before_llvm_runs(model, tmp_path):
    # 2^20 columns in one tile over 4 warps: 8,192 values a thread, 32 times the registers. LLVM and ptxas would
    # take minutes on it (the model's timeout is 120 s); the TritonGPU IR says it at once (about 1.5 s measured on
    # an idle 2-core machine; not asserted: a timed unit test fails under load). `overflow` is set only by the rule
    # on the IR, before LLVM, and no register count means ptxas never ran.
    path = write(tmp_path, ONE_TILE)
    found = model.resources(path, [launch("one_tile", 4, x_ptr=tensor(), out_ptr=tensor(), n_cols=integer(1 << 20),
                                          BLOCK=integer(1 << 20))])
    (result,) = found
    assert result.overflow is not None and not result.timed_out and result.registers is None, result
    # The row's values (f32) and its offsets (i32) are tensors of the same size: either may be named.
    assert re.search(r"a 1048576 tensor of [fi]32 holds at least 8,192 32-bit values in each of the program's 128 "
                     r"threads", result.overflow), result.overflow
    assert not result.fits() and result.problems() == [result.overflow]


def test_the_registers_rule_counts_the_largest_register_tensor_per_thread():
    from grader import kernelcompile

    ir = "%0 = tt.splat %a : f32 -> tensor<64x128xf32, #blocked>\n%1 = tt.load %p : tensor<4096x128xf16, #b>\n" \
         "%2 = ttg.local_alloc : !ttg.memdesc<8192x128xf16, #shared>"  # shared memory: not registers, not counted
    assert kernelcompile.largest_tensor(ir, 128) == (2048.0, "a 4096x128 tensor of f16")


def test_the_same_kernel_at_a_small_tile_fits(model, tmp_path):
    path = write(tmp_path, ONE_TILE)
    found = model.resources(path, [launch("one_tile", 4, x_ptr=tensor(), out_ptr=tensor(), n_cols=integer(1000),
                                          BLOCK=integer(1024))])
    assert found[0].fits() and found[0].stack == 0, found


def test_a_kernel_only_the_interpreter_runs_is_named_with_the_compilers_error(model, tmp_path):
    path = write(tmp_path, NOT_A_KERNEL_FOR_A_GPU)
    found = model.resources(path, [launch("ranged", 4, x_ptr=tensor("float32"), n_cols=integer(100))])
    (result,) = found
    assert result.error is not None and not result.fits(), result
    with pytest.raises(AssertionError) as failure:
        model.assert_fit(found, "ranged")
    message = str(failure.value)
    for part in ("the kernel ranged (num_warps=4", "does not compile for an H100-class GPU (sm_90)",
                 "line 8 of kernels.py", "tl.constexpr", "TRITON_INTERPRET=1"):
        assert part in message, f"expected {part!r} in the message: {message}"


def test_results_are_cached_in_memory_and_on_disk(model, cache, monkeypatch):
    first = model.resources(REFERENCE, [reference_launch(5000, 4096, 8)])
    assert first[0].fits()
    calls = []
    monkeypatch.setattr(model, "_compile", lambda *a, **k: calls.append(a) or ({"error": "compiled again"}, 0.0))
    again = model.resources(REFERENCE, [reference_launch(5001, 4096, 8)])  # 5000 and 5001: neither divisible by 16
    assert not calls and again[0].cached and again[0].registers == first[0].registers, again
    model._MEMORY.clear()
    from_disk = model.resources(REFERENCE, [reference_launch(5000, 4096, 8)])
    assert not calls and from_disk[0].cached and from_disk[0].stack == first[0].stack, from_disk
    different = model.resources(REFERENCE, [reference_launch(5000, 2048, 8)])  # another constexpr: a new compile
    assert len(calls) == 1 and different[0].error == "compiled again", different


def test_a_timeout_counts_as_not_fitting_and_is_not_kept(model, tmp_path, cache):
    path = write(tmp_path, ONE_TILE.replace("one_tile", "slow_tile"))
    record = [launch("slow_tile", 4, x_ptr=tensor(), out_ptr=tensor(), n_cols=integer(256), BLOCK=integer(256))]
    found = model.resources(path, record, timeout=0.05)
    assert found[0].timed_out and not found[0].fits(), found
    with pytest.raises(AssertionError, match="did not finish within"):
        model.assert_fit(found, "slow_tile")
    model._MEMORY.clear()
    assert not any(p.suffix == ".json" and "timed_out" in p.read_text() for p in cache.iterdir()), \
        "a timeout depends on the machine's load: it must not be cached on disk"
    assert model.resources(path, record)[0].fits()


def test_a_misfit_stops_the_compiles_after_it(model, tmp_path):
    path = write(tmp_path, NOT_A_KERNEL_FOR_A_GPU + ONE_TILE.split("\n\n\n", 1)[1])
    found = model.resources(path, [launch("ranged", 4, x_ptr=tensor("float32"), n_cols=integer(100)),
                                   launch("one_tile", 4, x_ptr=tensor(), out_ptr=tensor(), n_cols=integer(10),
                                          BLOCK=integer(16))])
    assert found[0].error and found[1].not_compiled and found[1].registers is None, found


def test_autotune_is_dropped_and_the_launchs_constexprs_compiled(model, tmp_path):
    path = write(tmp_path, AUTOTUNED)
    source = model.KernelSource(AUTOTUNED)
    assert "autotune" not in source.text and "WIDTH = tl.constexpr(64)" in source.text, source.text
    found = model.resources(path, [launch("scaled", 4, x_ptr=tensor("float32"), n=integer(1000),
                                          BLOCK=integer(128))])
    assert found[0].fits() and found[0].constexprs == {"BLOCK": 128}, found


def test_the_generated_module_holds_no_host_code(tmp_path):
    source = kernelmodel.KernelSource(ONE_TILE)
    assert "SystemExit" not in source.text and "def host" not in source.text, source.text
    assert "def one_tile(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):" in source.text
    assert source.def_lines == {"one_tile": 6}


def test_a_file_the_scan_flags_is_not_compiled(model, tmp_path):
    path = write(tmp_path, ONE_TILE + "\nimport ctypes\n")
    assert tamper.scan(path.read_bytes())
    with pytest.raises(tamper.Tampered, match="kernel resource model"):
        model.resources(path, [launch("one_tile", 4, x_ptr=tensor(), out_ptr=tensor(), n_cols=integer(10),
                                      BLOCK=integer(16))])


def test_unknown_and_undescribed_launches_are_named(model, tmp_path):
    path = write(tmp_path, ONE_TILE)
    found = model.resources(path, [{"kernel": "elsewhere", "arguments": {}, "options": {}}])
    assert "no module-level @triton.jit function named 'elsewhere'" in found[0].error, found
    found = model.resources(path, [{"kernel": "one_tile", "arguments": None, "options": None}])
    assert "were not recorded" in found[0].error, found
    with pytest.raises(AssertionError, match="no Triton launch was recorded"):
        kernelmodel.assert_fit([], "nothing")


def test_too_many_variants_are_refused_before_compiling(model, tmp_path, monkeypatch):
    monkeypatch.setattr(model, "_compile", lambda *a, **k: pytest.fail("compiled a call with too many variants"))
    path = write(tmp_path, ONE_TILE)
    record = [launch("one_tile", 4, x_ptr=tensor(), out_ptr=tensor(), n_cols=integer(10), BLOCK=integer(16 << i))
              for i in range(model.MAX_VARIANTS + 1)]
    found = model.resources(path, record)
    assert len(found) == 1 and "distinct compiles" in found[0].error, found


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(8, dtype=torch.float16), lambda: torch.zeros(9, dtype=torch.float32)[1:],
    lambda: torch.zeros(3, dtype=torch.bool), lambda: torch.zeros(3, dtype=torch.bfloat16),
    lambda: torch.zeros(3, dtype=torch.int64), lambda: 1, lambda: 16, lambda: 17, lambda: -5, lambda: 2**31,
    lambda: 2**40 + 3, lambda: 2.5, lambda: True, lambda: None,
], ids=["fp16", "fp32-offset", "bool", "bf16", "i64", "one", "sixteen", "seventeen", "negative", "two-31", "two-40",
        "float", "true", "none"])
def test_a_recorded_argument_specialises_as_tritons_launcher_does(make):
    """The compile's signature is rebuilt from the record (grader/kernelcompile.py): it must be what Triton's own
    launcher (native_specialize_impl, the CUDA backend) makes of the real value."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl

    from grader import kernelcompile

    value = make()
    want = native_specialize_impl(CUDABackend, value, False, True, True)
    got = kernelcompile._specialise(launches.describe_argument(value), True, True)
    assert (got[0], got[1] or None) == (want[0], want[1] or None), f"{value!r}: recorded {got}, Triton {want}"


def test_the_toolchain_is_in_the_wheel():
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    assert (tool / "cuobjdump").is_file() and (tool / "ptxas").is_file(), f"Triton's wheel lacks its toolchain: {tool}"


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_student_kernel_resources_records_the_call_and_models_its_launches(model):
    """The whole path in-process: the reference's softmax_triton under the kernel rule, its launch recorded by
    grader.support.kernels:launches, the tamper gate, and the model on the file the session loaded."""
    from grader.harness.kernel_rule import KERNELS_ONLY
    from grader.harness.session import StudentSession

    session = StudentSession("local", lambda _id: REFERENCE)
    sm = session.load("online_softmax", forbid=[KERNELS_ONLY])
    x = torch.randn(3, 5000, dtype=torch.float16)
    run = session.kernel_resources(sm.softmax_triton, x)
    assert run.handed == [True] and len(run.launches) == 1, run.launches
    assert run.launches[0]["arguments"]["BLOCK"] == {"kind": "int", "value": 4096}, run.launches
    assert run.launches[0]["options"] == {"num_warps": 8}, run.launches
    (result,) = run.resources
    assert result.fits() and result.constexprs == {"BLOCK": 4096} and result.num_warps == 8, result
    assert run.out.shape == x.shape and torch.isfinite(run.out).all(), "the call's own result comes back too"
