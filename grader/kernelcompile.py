"""The compile step of the kernel resource model (grader/kernelmodel.py), run as its own process.

``python -I grader/kernelcompile.py`` reads one request as JSON on stdin: {"module": the path of a module that
grader.kernelmodel generated from the student's file (their kernels and module constants, nothing else),
"kernel": a kernel's name, "arguments": {parameter: description} as the launch recorder wrote them
(grader.harness.launches.describe_argument), "options": {num_warps, num_stages, ...}, "target": [backend, arch,
warp size]}. It builds the signature Triton's launcher would build for those arguments, compiles the kernel for
the target with Triton's compiler and the ptxas in its wheel (no GPU needed), reads the cubin's resources with
the wheel's cuobjdump, and writes one JSON object on stdout: {"registers", "stack", "shared", "static_shared",
"local", "signature", "constexprs"}, or {"error": text, "stage": "arguments" | "compile" | "registers" |
"resources"} ("registers": a tile far beyond the registers, refused before LLVM and ptxas, see FAR_BEYOND).

It imports neither torch nor the grader, so that it starts in a tenth of a second; it never runs the student's
host code (the generated module holds none).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

I32 = (-(2**31), 2**31)
I64 = (-(2**63), 2**63)

# A tile far beyond the registers is refused before LLVM and ptxas see it: on such a tile they take minutes (LLVM
# alone spent 50 s, then ptxas ran past 120 s, on paged attention with a 4,096-key tile) and would spill most of it.
# The rule reads the TritonGPU IR, where a `tensor<...>` value lives in the registers of the program's threads: a
# tensor of N bits over T threads holds at least N / 32 / T 32-bit values in each thread (more where the layout
# repeats it). A thread has REGISTERS of them; FAR_BEYOND times that is refused. Measured on sm_90: paged attention
# at 1,024 values a thread (a 2,048-key tile) compiles, in 38 s, to 32 registers and 17,608 bytes of spill a
# thread; at 256 (512 keys), 255 registers and 520 bytes. Every reference kernel holds far fewer (kernel_resources).
REGISTERS = 255
FAR_BEYOND = 4
_TENSOR = re.compile(r"tensor<((?:\d+x)+)([a-z]+)(\d*)")


class FarBeyondRegisters(Exception):
    """The TritonGPU IR holds a tensor too large for the program's registers by far (see FAR_BEYOND)."""


def largest_tensor(ir: str, threads: int) -> tuple[float, str]:
    """(32-bit values per thread, 'a 64x128 tensor of f16') of the largest register tensor in TritonGPU IR text."""
    best, shown = 0.0, ""
    for dims, kind, width in set(_TENSOR.findall(ir)):
        numel = 1
        for d in dims.rstrip("x").split("x"):
            numel *= int(d)
        bits = int(width) if width else 32
        per_thread = numel * max(bits, 8) / 32 / threads
        if per_thread > best:
            best, shown = per_thread, f"a {dims.rstrip('x')} tensor of {kind}{width}"
    return best, shown


def refuse_far_beyond_registers(stages: dict, num_warps: int, warp_size: int) -> None:
    """Check the TritonGPU IR before it is lowered to LLVM (the "llir" stage); leave `stages` as it is where a
    Triton names its stages otherwise (the whole compile then runs, under the caller's timeout)."""
    if "llir" not in stages:
        return
    lower = stages["llir"]

    def checked(src, metadata):
        values, shown = largest_tensor(str(src), num_warps * warp_size)
        if values > FAR_BEYOND * REGISTERS:
            raise FarBeyondRegisters(
                f"{shown} holds at least {values:,.0f} 32-bit values in "
                f"each of the program's {num_warps * warp_size} threads, over {FAR_BEYOND} times the {REGISTERS} "
                f"registers a thread has: a tile that size cannot live in registers (the compiler would spill most "
                f"of it, after minutes of work), so the model counts it as not fitting without compiling it")
        return lower(src, metadata)

    stages["llir"] = checked


def _dtype(name: str):
    """A Triton dtype for a recorded dtype name: Triton's own ('fp16') or torch's ('float16', 'bfloat16')."""
    import triton.language as tl
    from triton._utils import canonicalize_dtype

    return tl.dtype(canonicalize_dtype(name))


def _value(desc: dict):
    """The Python value of a recorded constexpr."""
    kind = desc.get("kind")
    if kind in ("int", "float", "bool", "str"):
        return desc["value"]
    if kind == "none":
        return None
    if kind == "dtype":
        return _dtype(desc["value"])
    if kind == "tuple":
        return tuple(_value(item) for item in desc["items"])
    raise ValueError(f"a constexpr of a kind the model cannot rebuild ({desc.get('type', kind)})")


def _specialise(desc: dict, specialise: bool, align: bool) -> tuple[str, object]:
    """(Triton type, specialisation) of a runtime argument, as triton.runtime.jit's native_specialize_impl gives
    them (Triton 3.x): a tensor '*fp16' with 'D' when 16-byte aligned; an int 1 becomes the constexpr 1, others
    i32 / i64 / u64 by value, 'D' when divisible by 16; a float fp32; a bool u1; None the constexpr None."""
    from triton._utils import canonicalize_dtype

    kind = desc.get("kind")
    if kind == "tensor":
        return "*" + canonicalize_dtype(desc["dtype"]), ("D" if desc.get("aligned") and align else "")
    if kind == "bool":
        return "u1", None
    if kind == "int":
        v = desc["value"]
        if specialise and v == 1:
            return "constexpr", 1
        kind = "i32" if I32[0] <= v < I32[1] else "i64" if I64[0] <= v < I64[1] else "u64"
        return kind, ("D" if specialise and v % 16 == 0 else "")
    if kind == "float":
        return "fp32", None
    if kind == "none":
        return "constexpr", None
    raise ValueError(f"an argument of a kind the model cannot compile ({desc.get('type', kind)})")


def build(fn, arguments: dict, backend) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) for `fn` (a JITFunction) launched with these recorded arguments."""
    signature, constexprs, attrs = {}, {}, {}
    unknown = sorted(set(arguments) - {p.name for p in fn.params})
    if unknown:
        raise ValueError(f"the launch named arguments the kernel does not have: {', '.join(unknown)}")
    for i, param in enumerate(fn.params):
        if param.name in arguments:
            desc = arguments[param.name]
        elif param.has_default:
            default = param.default
            desc = {"kind": "none"} if default is None else {"kind": type(default).__name__, "value": default}
            if hasattr(default, "value"):  # a tl.constexpr default
                desc = {"kind": type(default.value).__name__, "value": default.value}
        else:
            raise ValueError(f"the launch gave no value for the parameter {param.name!r}, which has no default")
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[(i,)] = _value(desc)
            continue
        kind, spec = _specialise(desc, not param.do_not_specialize, not param.do_not_specialize_on_alignment)
        if param.annotation_type and kind != "constexpr":
            kind = param.annotation_type
            if kind == "u1" or kind[:2] in ("fp", "bf"):
                spec = None
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = spec
        elif isinstance(spec, str) and spec:
            attrs[(i,)] = backend.parse_attr(spec)
    return signature, constexprs, attrs


def _resources(cubin: bytes, name: str) -> dict:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        text = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, timeout=60).stdout
    blocks = re.findall(r"Function ([^:\s]+):\s*\n\s*(REG:.*)", text)
    if not blocks:
        raise ValueError(f"cuobjdump printed no function's resources: {text[-300:]!r}")
    line = next((usage for fn_name, usage in blocks if fn_name == name), blocks[0][1])
    fields = dict(re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line))
    return {"registers": int(fields["REG"]), "stack": int(fields["STACK"]),
            "static_shared": int(fields.get("SHARED", 0)), "local": int(fields.get("LOCAL", 0))}


def main() -> int:
    request = json.load(sys.stdin)
    out: dict
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.compiler.compiler import make_backend

        spec = importlib.util.spec_from_file_location("kernelmodel_kernels", request["module"])
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load the generated module {request['module']}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, request["kernel"])
        target = GPUTarget(*request["target"])
        backend = make_backend(target)
        signature, constexprs, attrs = build(fn, request["arguments"], backend)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, as data
        json.dump({"error": f"{type(exc).__name__}: {exc}", "stage": "arguments"}, sys.stdout)
        return 0
    options = {k: v for k, v in request["options"].items() if v is not None}
    add_stages = type(backend).add_stages

    def add_checked_stages(self, stages, stage_options, *rest):
        add_stages(self, stages, stage_options, *rest)
        refuse_far_beyond_registers(stages, stage_options.num_warps, target.warp_size)

    type(backend).add_stages = add_checked_stages
    try:
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options)
    except FarBeyondRegisters as exc:
        json.dump({"error": str(exc), "stage": "registers"}, sys.stdout)
        return 0
    except Exception as exc:  # noqa: BLE001
        json.dump({"error": str(exc) or type(exc).__name__, "type": type(exc).__name__, "stage": "compile"},
                  sys.stdout)
        return 0
    try:
        out = _resources(compiled.asm["cubin"], compiled.metadata.name)
        out["shared"] = int(compiled.metadata.shared)
    except Exception as exc:  # noqa: BLE001
        json.dump({"error": f"{type(exc).__name__}: {exc}", "stage": "resources"}, sys.stdout)
        return 0
    names = [p.name for p in fn.params]
    out["signature"] = signature
    out["constexprs"] = {names[k[0]]: (str(v) if not isinstance(v, (int, float, str, bool, type(None))) else v)
                         for k, v in constexprs.items()}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
