"""Triton kernel launches, watched: each checked (Triton's own machinery, no hooks, plain arguments),
recorded (`Launch`, `LaunchLog`, `recording_launches`, `describe_argument` for grader.kernelmodel), and the
kernel rule suspended while it runs (`watching_launches`)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from grader.harness.integrity import ForbiddenCall
from grader.harness.kernel_rule import (
    _BOUND, _LAUNCH_MEMORY, _LAUNCH_STATE, _STORAGE_DATA_PTR, _TENSOR_ELEMENT_SIZE, _TENSOR_OFFSET, _TENSOR_STORAGE,
    storage_of,
)
from grader.harness.wire import type_name

@dataclass
class Launch:
    """One Triton kernel launch seen during a call."""

    kernel: str
    grid: tuple[int, int, int] | None = None  # None until the launcher resolved it (a callable grid)
    storages: frozenset[int] = frozenset()  # the address of each tensor argument's storage
    # What a compile of this launch needs (grader.kernelmodel), as plain data: each argument the launch named, by
    # parameter name, as `describe_argument` writes it, and the launch's options (num_warps, num_stages, ...).
    # None when the launch could not be described (the kernel model then says so).
    arguments: dict[str, dict] | None = None
    options: dict[str, Any] | None = None

    @property
    def programs(self) -> int:
        return 0 if self.grid is None else self.grid[0] * self.grid[1] * self.grid[2]


class LaunchLog(list):
    """The launches made while it is active, in order; `derived` holds the storages the host code filled by
    copying (clone, a cast, copy_) from memory a launch was handed, so that a kernel's result copied or cast
    into the returned tensor still counts as the kernel's."""

    def __init__(self) -> None:
        super().__init__()
        self.derived: set[int] = set()

    def kernel_storages(self) -> set[int]:
        return set().union(*(launch.storages for launch in self)) | self.derived


# Allowed host operators whose result holds the values of an input (a copy or a cast, not a view), as
# operator -> (index of the source argument, index of the target argument or None for the result).
_COPIES = {
    "aten::clone": (0, None), "aten::_to_copy": (0, None), "aten::contiguous": (0, None), "aten::to": (0, None),
    "aten::copy_": (1, 0), "aten::_copy_from": (0, 1), "aten::_copy_from_and_resize": (0, 1),
}


def _note_copies(name: str, args: tuple, out: Any) -> None:
    """Follow a kernel's result through a host copy, for every active LaunchLog."""
    where = _COPIES.get(name)
    if where is None or not _ACTIVE_LOGS or len(args) <= max(i for i in where if i is not None):
        return
    source, target = where
    written = _tensor_storages([args[source]])
    for log in list(_ACTIVE_LOGS):
        if written & log.kernel_storages():
            log.derived |= _tensor_storages([out if target is None else args[target]])


# -- Kernel launches: recorded, checked, and the rule suspended while they run


_ACTIVE_LOGS: list[LaunchLog] = []
_OWN_LAUNCH_WRAPPERS: set[Any] = set()  # our wrappers of Triton's launch machinery (_assert_launch_machinery_intact)
_WATCH_LOCK = threading.Lock()
_WATCH: dict[str, Any] = {"depth": 0, "restore": []}
# Triton's own functions a launch runs through: each must still be Triton's when a guarded call starts,
# or a replacement would run while the rule is suspended.
_LAUNCH_MACHINERY = (
    ("triton.runtime.jit", "KernelInterface", "__getitem__"),
    ("triton.runtime.jit", "JITFunction", "run"),
    ("triton.runtime.jit", "JITFunction", "_do_compile"),
    ("triton.runtime.interpreter", "InterpretedFunction", "run"),
    ("triton.runtime.interpreter", "InterpretedFunction", "rewrite"),
    ("triton.runtime.interpreter", "GridExecutor", "__call__"),
    ("triton.runtime.interpreter", "GridExecutor", "_init_args_hst"),
    ("triton.runtime.interpreter", "GridExecutor", "_restore_args_dev"),
)
_LAUNCHERS = (("triton.runtime.jit", "JITFunction"), ("triton.runtime.interpreter", "InterpretedFunction"))


def _triton_class(module: str, name: str) -> type | None:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):  # no Triton, or a Triton without the interpreter
        return None


@functools.lru_cache(maxsize=1)
def _triton_dir() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(Path(triton.__file__).resolve().parent)


@functools.lru_cache(maxsize=64)
def _resolved(filename: str) -> str:
    return str(Path(filename).resolve())


def _is_tritons_own(fn: Any, root: str) -> bool:
    code = getattr(fn, "__code__", None)
    filename = getattr(code, "co_filename", "")
    return isinstance(filename, str) and bool(filename) and _resolved(filename).startswith(root + "/")


def _assert_launch_machinery_intact() -> None:
    root = _triton_dir()
    if root is None:
        return
    for module, cls_name, attr in _LAUNCH_MACHINERY:
        cls = _triton_class(module, cls_name)
        if cls is None or attr not in vars(cls):
            continue
        if not _is_tritons_own(vars(cls)[attr], root) and vars(cls)[attr] not in _OWN_LAUNCH_WRAPPERS:
            raise ForbiddenCall(
                f"Triton's launch machinery was changed: {cls_name}.{attr} is not Triton's own. Code that runs "
                "inside a launch is trusted as kernel code, so the call cannot be graded; launch your kernels "
                "with kernel[grid](...) and leave Triton's runtime as it is."
            )


def _check_launch(kernel: Any) -> None:
    """Refuse a launch that would run host code of the student's inside it (hooks, patched methods)."""
    name = getattr(kernel, "__name__", "kernel")
    if getattr(kernel, "pre_run_hooks", None):
        raise ForbiddenCall(
            f"the kernel {name} has pre-run hooks: code that runs inside a launch is trusted as kernel code, so a "
            "hook would be host code that escapes the rule. Do that work in the kernel or before the launch."
        )
    hook = _runtime_hook_set()
    if hook:
        raise ForbiddenCall(f"a Triton runtime hook is set (triton.knobs.runtime.{hook}): it would run host code "
                            "inside a launch, where code is trusted as kernel code. Remove it.")
    methods = {n for c in type(kernel).__mro__ for n, v in vars(c).items() if callable(v) or isinstance(v, property)}
    shadowed = sorted(set(vars(kernel)) & methods)
    if shadowed:
        raise ForbiddenCall(
            f"the kernel {name} has its method {shadowed[0]} replaced on the instance: code that runs inside a "
            "launch is trusted as kernel code. Launch your kernels with kernel[grid](...) as Triton made them."
        )


_RUNTIME_HOOKS = ("launch_enter_hook", "launch_exit_hook", "kernel_load_start_hook", "kernel_load_end_hook",
                  "jit_cache_hook", "jit_post_compile_hook", "add_stages_inspection_hook")


def _runtime_hook_set() -> str | None:
    """The name of a Triton runtime hook that holds a function (a HookChain with calls, or any other value)."""
    try:
        from triton import knobs
    except ImportError:
        return None
    for name in _RUNTIME_HOOKS:
        hook = getattr(knobs.runtime, name, None)
        calls = getattr(hook, "calls", None)
        if hook is not None and (calls is None or calls):
            return name
    return None


def _grid_dims(grid: Any) -> tuple[int, int, int] | None:
    try:
        dims = [int(d) for d in grid]
    except (TypeError, ValueError):
        return None
    if not 1 <= len(dims) <= 3:
        return None
    return tuple(dims + [1] * (3 - len(dims)))  # type: ignore[return-value]


def _tensors_of(value: Any) -> Iterator[torch.Tensor]:
    """The tensor a launch argument is, or wraps (triton.reinterpret's TensorWrapper, a tensor descriptor's base)."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    base = getattr(value, "base", None)
    if isinstance(base, torch.Tensor):
        yield base


def _tensor_storages(values: Iterable[Any]) -> frozenset[int]:
    found = set()
    for value in values:
        for t in _tensors_of(value):
            try:
                found.add(storage_of(t))
            except RuntimeError:  # a tensor without storage (meta, a subclass)
                pass
    return frozenset(found)


_LAUNCH_SCALARS = (bool, int, float, str, type(None), torch.dtype)
_LAUNCH_OPTIONS = ("grid", "warmup")  # the launcher's own keywords, checked where they are used


@functools.lru_cache(maxsize=1)
def _triton_arg_types() -> tuple[frozenset[type], frozenset[type], frozenset[type]]:
    """(Triton's tensor wrappers, its dtype and constexpr classes, numpy's scalar types): exact classes whose
    methods are the libraries' own."""
    import numpy as np

    wrappers, values = set(), set()
    try:
        from triton.runtime.jit import TensorWrapper
        wrappers.add(TensorWrapper)
    except ImportError:
        pass
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
        wrappers.add(TensorDescriptor)
    except ImportError:
        pass
    try:
        import triton.language as tl
        values |= {tl.constexpr, tl.dtype, tl.pointer_type}
    except (ImportError, AttributeError):
        pass
    numbers = frozenset(t for t in set(np.sctypeDict.values()) if t.__module__ == "numpy")
    return frozenset(wrappers), frozenset(values), numbers


def _launch_argument_refused(value: Any, depth: int = 0) -> str | None:
    """Why `value` may not be handed to a kernel launch (None when it may). Inside a launch the kernel rule
    is suspended, and the launcher calls methods of its arguments (data_ptr, untyped_storage, stride): an
    object of the student's own, or a subclass of Tensor, would run host code there unwatched. So a launch
    takes exact tensors, Triton's own wrappers of them, numbers, strings, dtypes, and tuples of those."""
    kind = type(value)
    if kind in _LAUNCH_SCALARS:
        return None
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        # A tensor's own attributes (t.data_ptr = f) would shadow its methods for the launcher's duck typing.
        return f"a tensor with attributes of its own ({', '.join(sorted(map(str, _own(value))))[:80]})" if _own(value) \
            else None
    wrappers, values, numbers = _triton_arg_types()
    if kind in numbers:
        return None
    if kind in wrappers:  # every field: the base tensor, its shape, strides, device, dtype, padding
        fields = object.__getattribute__(value, "__dict__")
        if type(fields.get("base")) not in (torch.Tensor, torch.nn.Parameter):
            return f"a {type_name(kind)} over {type_name(type(fields.get('base')))}"
        for field_value in dict.values(fields):
            why = None if type(field_value) in (torch.device, torch.Size) else _launch_argument_refused(field_value, depth + 1)
            if why:
                return f"a {type_name(kind)} holding {why}"
        return None
    if kind in values:  # a constexpr, dtype or pointer type: only the fields Triton gives one, of plain values
        fields = _own(value)
        extra = set(map(str, fields)) - _TRITON_FIELDS.get(type_name(kind), frozenset())
        if extra:
            return f"a {type_name(kind)} with attributes Triton never sets ({', '.join(sorted(extra))[:80]})"
        for field_value in dict.values(fields):
            why = None if type(field_value) in _triton_field_types() else (
                "a value nested too deep" if depth > 4 else _launch_argument_refused(field_value, depth + 1))
            if why:
                return f"a {type_name(kind)} holding {why}"
        return None
    if kind in (tuple, list) and depth <= 4:
        for item in (tuple.__iter__(value) if kind is tuple else list.__iter__(value)):
            why = _launch_argument_refused(item, depth + 1)
            if why:
                return why
        return None
    return f"an object of type {type_name(kind)}"


def _own(value: Any) -> dict:
    """An object's own attributes, read without calling anything of its class."""
    try:
        fields = object.__getattribute__(value, "__dict__")
    except AttributeError:
        return {}
    return fields if type(fields) is dict else {"__dict__": fields}


# The attributes Triton itself gives its values (triton 3.x): anything else was set by the student's code.
_TRITON_FIELDS = {
    "constexpr": frozenset({"value", "type"}),
    "dtype": frozenset({"name", "primitive_bitwidth", "itemsize", "fp_mantissa_width", "exponent_bias", "int_signedness",
                        "int_bitwidth", "fp_exponent_width"}),
    "pointer_type": frozenset({"element_ty", "address_space", "const", "name"}),
}


@functools.lru_cache(maxsize=1)
def _triton_field_types() -> frozenset[type]:
    """Classes of Triton's own that its values hold as fields (a constexpr's type, a dtype's signedness)."""
    try:
        import triton.language as tl
        return frozenset({tl.core.constexpr_type, tl.dtype.SIGNEDNESS, tl.dtype, tl.pointer_type})
    except (ImportError, AttributeError):
        return frozenset()


def _check_arguments(name: str, args: tuple, kwargs: dict) -> None:
    for key, value in [*enumerate(args), *((k, v) for k, v in kwargs.items() if k not in _LAUNCH_OPTIONS)]:
        why = _launch_argument_refused(value)
        if why:
            where = f"argument {key}" if isinstance(key, int) else f"argument {key!r}"
            raise ForbiddenCall(
                f"the kernel {name} was launched with {why} as its {where}: a launch takes tensors (exactly "
                "torch.Tensor, or triton.reinterpret of one), numbers, strings and dtypes. Code that runs inside a "
                "launch is trusted as kernel code, and the launcher calls methods of its arguments, so an object "
                "of your own (or a subclass of Tensor) would run host code there. Pass the tensors themselves."
            )


# The launch options a compile takes (Triton's CUDA options), recorded beside a launch's arguments.
COMPILE_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion")


def describe_argument(value: Any, depth: int = 0) -> dict:
    """A launch argument as the plain data a compile needs (grader.kernelmodel builds Triton's signature from it):
    {"kind": "tensor", "dtype": "float16", "aligned": bool (its first element on a 16-byte boundary)}, {"kind":
    "int" | "float" | "bool" | "str", "value": ...}, {"kind": "none"}, {"kind": "dtype", "value": "fp16" or
    "float16"} (a Triton or torch dtype), {"kind": "tuple", "items": [...]}, or {"kind": "other", "type": name}.
    Arguments reach here already checked (`_check_arguments`): exact tensors, numbers, strings and dtypes, so
    nothing of the student's own class runs."""
    wrappers, values, numbers = _triton_arg_types()
    kind = type(value)
    wrapped = kind in wrappers and kind.__name__ == "TensorWrapper" and type(getattr(value, "base", None)) is torch.Tensor
    if kind is torch.Tensor or wrapped:
        tensor = value.base if wrapped else value
        dtype = value.dtype  # triton.reinterpret's TensorWrapper holds a Triton dtype
        address = _STORAGE_DATA_PTR(_TENSOR_STORAGE(tensor)) + _TENSOR_OFFSET(tensor) * _TENSOR_ELEMENT_SIZE(tensor)
        return {"kind": "tensor", "dtype": str(dtype).rsplit(".", 1)[-1], "aligned": address % 16 == 0}
    if kind is bool:
        return {"kind": "bool", "value": value}
    if kind is int:
        return {"kind": "int", "value": value}
    if kind is float:
        return {"kind": "float", "value": value}
    if kind is str:
        return {"kind": "str", "value": value[:200]}
    if value is None:
        return {"kind": "none"}
    if kind is torch.dtype:
        return {"kind": "dtype", "value": str(value).rsplit(".", 1)[-1]}
    if kind in numbers:
        plain = value.item()
        return describe_argument(plain, depth) if type(plain) in (bool, int, float) else {"kind": "other", "type": kind.__name__}
    if kind in values:
        if kind.__name__ == "constexpr":
            return describe_argument(value.value, depth + 1) if depth < 4 else {"kind": "other", "type": "constexpr"}
        return {"kind": "dtype", "value": str(value)}  # a tl.dtype (tl.float16 reads 'fp16'); a pointer type: 'pointer<fp16>'
    if kind in (tuple, list) and depth < 4:
        return {"kind": "tuple", "items": [describe_argument(item, depth + 1) for item in value][:64]}
    return {"kind": "other", "type": kind.__name__}


def _describe_launch(fn: Any, args: tuple, kwargs: dict) -> tuple[dict[str, dict] | None, dict[str, Any] | None]:
    """(arguments by parameter name, options) of a launch, or (None, None) where it cannot be described."""
    try:
        names = list(getattr(fn, "arg_names", None) or [])
        if len(args) > len(names):
            return None, None
        arguments = {name: describe_argument(value) for name, value in zip(names, args)}
        options = {}
        for key, value in kwargs.items():
            if key in _LAUNCH_OPTIONS:
                continue
            if key in names:
                arguments[key] = describe_argument(value)
            elif key in COMPILE_OPTIONS and type(value) in (int, bool, type(None)):
                options[key] = value
        return arguments, options
    except Exception:  # a description never breaks a launch: the kernel model reports the gap
        return None, None


def _wrap_run(cls: type, original: Any) -> Any:
    def run(self, *args, **kwargs):
        if type(self) is not cls:
            return original(self, *args, **kwargs)  # a subclass's run is not Triton's: no launch, no suspension
        _check_launch(self)
        _check_arguments(getattr(self, "__name__", "kernel"), args, kwargs)
        if not kwargs.get("warmup"):  # a warm-up only compiles: not recorded
            launch = Launch(getattr(self, "__name__", "kernel"), storages=_tensor_storages((*args, *kwargs.values())))
            if _ACTIVE_LOGS:  # described only for a record (a timed loop's launches pay nothing)
                launch.arguments, launch.options = _describe_launch(self, args, kwargs)
            grid = kwargs.get("grid")
            if callable(grid):
                def resolve(meta, _grid=grid):
                    # The grid callable is the student's host code, run by the launcher: the rule holds there.
                    depth, _LAUNCH_STATE.depth = _LAUNCH_STATE.depth, 0
                    _LAUNCH_MEMORY.host += 1  # and it may not load or store through the interpreter (_check_lanes)
                    try:
                        dims = _grid(meta)
                    finally:
                        _LAUNCH_STATE.depth = depth
                        _LAUNCH_MEMORY.host -= 1
                    launch.grid = _grid_dims(dims)
                    return dims
                kwargs["grid"] = resolve
            else:
                launch.grid = _grid_dims(grid)
            for log in list(_ACTIVE_LOGS):
                log.append(launch)
        # Under a bounded interpreter only Triton's own steps of the launch are suspended (bound_interpreter_memory)
        whole = not (_BOUND["installed"] and cls.__name__ == "InterpretedFunction")
        _LAUNCH_STATE.depth += whole
        try:
            return original(self, *args, **kwargs)
        finally:
            _LAUNCH_STATE.depth -= whole

    run.__wrapped__ = original  # type: ignore[attr-defined]
    return run


@contextlib.contextmanager
def watching_launches() -> Iterator[None]:
    """Wrap Triton's launchers (`JITFunction.run`, `InterpretedFunction.run`) for the block: each launch is
    checked, recorded in every active `recording_launches` log, and suspends the kernel rule while it runs.
    Nested blocks share one installation."""
    with _WATCH_LOCK:
        if _WATCH["depth"] == 0:
            _assert_launch_machinery_intact()
            restore = []
            for module, cls_name in _LAUNCHERS:
                cls = _triton_class(module, cls_name)
                if cls is not None and "run" in vars(cls):
                    original = vars(cls)["run"]
                    cls.run = _wrap_run(cls, original)  # type: ignore[attr-defined]  # Triton's launcher, found by name
                    restore.append((cls, original))
            _WATCH["restore"] = restore
        _WATCH["depth"] += 1
    try:
        yield
    finally:
        with _WATCH_LOCK:
            _WATCH["depth"] -= 1
            if _WATCH["depth"] == 0:
                for cls, original in _WATCH["restore"]:
                    cls.run = original
                _WATCH["restore"] = []


@contextlib.contextmanager
def recording_launches() -> Iterator[LaunchLog]:
    """The Triton launches made in the block, in order (a driver returns them for a coverage check); under
    the kernel rule it also follows their results through the host's copies (`LaunchLog.derived`)."""
    log = LaunchLog()
    with watching_launches():
        _ACTIVE_LOGS.append(log)
        try:
            yield log
        finally:
            _ACTIVE_LOGS.remove(log)
