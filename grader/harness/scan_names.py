"""What a reference in a student's file names, for the trusted scan (grader/harness/tamper.py).

Chains of names resolved against the grader's own imports (`_module_rule`, `_walk`, `_reexported`,
`_foreign_object`), the course helpers a file may import (`_course_helper`, `_HARNESS_PARTS`), the names that
lead past the probes in the libraries' and the probes' own namespaces (`_library_private_names`,
`_watched_names`, `_torch_attribute_names`), and `_Folder`, which folds the string and integer constants a file
builds so the scan reads the names they spell.
"""

from __future__ import annotations

import ast

from grader.harness.scan_rules import (
    _ATTRIBUTE_CALLS, _CLOCK_ROOTS, _FOLD_LIMIT, _NAMESPACE_CALLS, _OS_PROCESS, _OWN_SUBMODULES,
    _PUBLIC_UNDERSCORED, _PYTHON_ENCODINGS, _REROOT, _SELF, BUILTINS, CLOCK_TABLE, FILE_MODULES, FILES, IMPORTABLE,
    MODULES, NESTED, NOT_IMPORTABLE, PRIVATE, PROCESSES, SUBMODULES, TORCH_PRIVATE,
)


def _dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _private(name: str) -> bool:
    return name.startswith("_") and not _dunder(name)


def _module_rule(path: str, clocks: bool, structural: bool = False) -> str | None:
    """Why a dotted path is flagged: the module table, the os process family, clocks, private segments,
    and the same again from every segment that names a module re-exported there (torch.sys.modules).
    `posix` and `nt` are os's own implementation: their names are os's (posix.write is os.write)."""
    parts = path.split(".")
    if parts[0] in ("posix", "nt"):
        parts[0] = "os"
        path = ".".join(parts)
    for start in range(1, len(parts)):
        parent = ".".join(parts[:start])
        if parent in SUBMODULES and parts[start] not in SUBMODULES[parent] and _module_or_unknown(parts[:start + 1]):
            return NOT_IMPORTABLE
        if ".".join(parts[:start + 1]) in _OWN_SUBMODULES or _own_module(parts[:start + 1]):
            continue
        if parts[start] in _REROOT or ((clocks or structural) and parts[start] in _CLOCK_ROOTS):
            why = _module_rule(".".join(parts[start:]), clocks, structural)
            if why:
                return why
        foreign = _reexported(parts[:start + 1])
        if foreign is not None:  # numpy.ctypeslib.ctypes, torch.os.system: the chain goes on from that module
            why = _module_rule(".".join([foreign, *parts[start + 1:]]), clocks, structural)
            if why:
                return why
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        why = (MODULES.get(prefix) or (CLOCK_TABLE.get(prefix) if clocks else None)
               or (FILES if structural and prefix in FILE_MODULES else None))
        if why:
            return why
    if _OS_PROCESS.match(path):
        return PROCESSES
    if parts[0] == "torch":
        # torch.ops.<namespace>.<operator> names an operator (the guard sees those); after it, and
        # everywhere else under torch, a private segment is internals. The nested and jagged operators are not
        # the guard's: they build tensors whose pieces' shapes are another tensor's values, read in C++
        # (torch.ops.aten._nested_view_from_buffer: red team round 19, moe_router and speculative 9/9).
        if parts[1:2] == ["ops"] and len(parts) > 3 and ("nested" in parts[3] or "jagged" in parts[3]):
            return NESTED
        first_free = 4 if parts[1:2] == ["ops"] else 1
        if any(_private(p) for p in parts[first_free:]):
            return TORCH_PRIVATE
    elif any(_private(p) for p in parts) and path not in _PUBLIC_UNDERSCORED:
        return PRIVATE
    if parts[0] not in IMPORTABLE:
        return NOT_IMPORTABLE
    return None


_MISSING = object()


def _walk(parts: list[str]) -> object:
    """The object a chain of public names stands for in the grader's own imports, or _MISSING. Through module
    namespaces only: no module's ``__getattr__`` runs, and nothing is imported beyond an importable root."""
    import importlib
    import sys
    from types import ModuleType

    if parts[0] not in IMPORTABLE or any(_private(p) or _dunder(p) for p in parts):
        return _MISSING
    try:
        obj: object = sys.modules.get(parts[0]) or importlib.import_module(parts[0])
    except Exception:  # pragma: no cover - every importable root is installed with the grader
        return _MISSING
    for name in parts[1:]:
        if not isinstance(obj, ModuleType):
            return _MISSING  # a class or a function: the scan follows modules only
        found = vars(obj).get(name, _MISSING)
        obj = sys.modules.get(f"{obj.__name__}.{name}", _MISSING) if found is _MISSING else found
        if obj is _MISSING:
            return _MISSING
    return obj


def _own_module(parts: list[str]) -> bool:
    """True when the chain is a library's own submodule of that name (torch.types, torch.signal), not a module
    re-exported there."""
    from types import ModuleType

    found = _walk(parts)
    return isinstance(found, ModuleType) and found.__name__ == ".".join(parts)


def _module_or_unknown(parts: list[str]) -> bool:
    """True unless the chain is known to be a plain attribute (a function, a class, a constant) of its module:
    a submodule, or a name not loaded here (a lazy submodule), is treated as a module."""
    from types import ModuleType

    found = _walk(parts)
    return found is _MISSING or isinstance(found, ModuleType)


def _reexported(parts: list[str]) -> str | None:
    """The real name of the module a chain of public names leads to, when that module is not the chain's own
    (``torch.os`` is os, ``numpy.ctypeslib.ctypes`` is ctypes, ``os.path`` is posixpath); None when the chain
    is the module it names, or is no module. A standard module's name that the walk cannot find at the end of
    the chain (a lazy submodule not loaded here) counts as that module: a chain is never let through for being
    unknown."""
    import sys
    from types import ModuleType

    found = _walk(parts)
    if found is _MISSING:
        parent = _walk(parts[:-1]) if len(parts) > 1 else _MISSING
        name = parts[-1]
        if isinstance(parent, ModuleType) and name in sys.stdlib_module_names and name not in IMPORTABLE:
            return name
        return None
    if isinstance(found, ModuleType):
        return found.__name__ if found.__name__ != ".".join(parts) else None
    return _foreign_object(found, parts)


def _foreign_object(found: object, parts: list[str]) -> str | None:
    """The real name of a function or class a library re-exports from a module outside its own package
    (``torch.cuda.amp.common.find_spec`` is importlib's, ``torch.autograd.graph.WeakKeyDictionary`` is weakref's,
    ``triton.language.extra.module_from_spec`` is importlib's), so the rules of that module apply to it; None for
    a library's own objects and for the builtins a chain may name anyway."""
    if not (callable(found) or isinstance(found, type)):
        return None
    module, name = getattr(found, "__module__", None), getattr(found, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return None
    root = module.split(".")[0]
    if root in ("posix", "nt"):  # os's own implementation (see _module_rule)
        root = "os"
    if root.lstrip("_") == parts[0] or root == parts[0]:
        return None
    if root == "builtins":  # int, dict, module: plain types; exec, eval and the like keep their own rules
        return f"builtins.{name}" if name in BUILTINS or name in _ATTRIBUTE_CALLS + _NAMESPACE_CALLS else None
    if root.startswith("_frozen_importlib"):
        module = "importlib"
    return f"{module}.{name}"


# The course's helper modules a student may import by name, to try their code as its README shows
# (from grader.support.ring_allreduce import run_simulated); every other reference to grader is flagged.
_HARNESS_PARTS = frozenset({"harness", "probes", "session", "worker", "client", "launch", "wire", "tamper", "plugin",
                            "integrity", "opfamilies", "kernel_rule", "launches", "host_reads", "interpreter_bound",
                            "guard", "counters", "deadline", "lookup"})


def _course_helper(module: str) -> bool:
    parts = module.split(".")
    return module == "grader.testing" or (len(parts) == 3 and parts[:2] == ["grader", "support"])


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in _SELF


def _bounded(text: str | bytes) -> str | bytes | None:
    return text if len(text) <= _FOLD_LIMIT else None


_TORCH_NAMES: list[frozenset[str]] = []


_LIBRARY_PRIVATE: list[frozenset[str]] = []
# Private names that lead past the probes, whatever object they are read from: torch's C core and its dispatcher,
# the operator namespaces, frames, threads. A file may still name its own private attributes anything else.
_DANGEROUS_PRIVATE = frozenset({
    "_C", "_VF", "_TensorBase", "_ops", "_dynamo", "_subclasses", "_python_dispatch", "_mode_utils", "_library",
    "_dispatch", "_functorch", "_higher_order_ops", "_prims", "_decomp", "_inductor", "_export", "_compile",
    "_guards", "_jit_internal", "_disabled_torch_function_impl", "_thread", "_getframe", "_current_frames",
    "_sys", "_os", "_ctypes", "_posixsubprocess", "_imp",
})


def _library_private_names() -> frozenset[str]:
    """Private names a file may not use even for its own attributes: `_DANGEROUS_PRIVATE`, and every private
    name of torch's C module, sys, threading and the grader's probes. Any object can be passed as ``self``
    (``f(torch)`` with ``def f(self): return self._C``), so a file's own private names are allowed only
    where they cannot be these."""
    if not _LIBRARY_PRIVATE:
        import sys
        import threading

        sources: list = [sys, threading]
        try:
            import importlib

            import torch

            from grader.harness.integrity import PROBE_MODULES

            sources += [torch._C, *map(importlib.import_module, PROBE_MODULES), torch.Tensor, torch.UntypedStorage,
                        torch.TypedStorage, torch.nn.Module]
        except ImportError:  # pragma: no cover - the grader always has torch
            pass
        _LIBRARY_PRIVATE.append(_DANGEROUS_PRIVATE | frozenset(n for src in sources for n in dir(src) if _private(n)))
    return _LIBRARY_PRIVATE[0]


def _watched_names() -> frozenset[str]:
    """The attribute names of the read-back routes the probes watch (host_reads.HOST_READS: numpy, tolist, ...)."""
    from grader.harness.host_reads import HOST_READS

    return frozenset(dotted.rsplit(".", 1)[-1] for dotted in HOST_READS)


def _torch_attribute_names() -> frozenset[str]:
    """The public attribute names of torch, torch.Tensor and torch.nn.Module in the grader's own torch:
    an attribute of that name set on an object the scan cannot resolve patches torch (rule 5)."""
    if not _TORCH_NAMES:
        try:
            import torch

            names = {n for source in (torch, torch.Tensor, torch.nn.Module) for n in dir(source) if not n.startswith("_")}
        except ImportError:  # pragma: no cover - the grader always has torch
            names = set()
        _TORCH_NAMES.append(frozenset(names))
    return _TORCH_NAMES[0]


def _small_int(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int and -_FOLD_LIMIT <= node.value <= _FOLD_LIMIT:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _small_int(node.operand)
        return None if value is None else -value
    return None


class _Folder:
    """Folds expressions made only of constants into the string (or bytes) they evaluate to (rule 7).

    Never evaluates anything: each supported form is computed here, bounded in size. None when the
    expression is not one of those forms."""

    def __init__(self) -> None:
        self.cache: dict[int, str | bytes | None] = {}

    def __call__(self, node: ast.AST) -> str | bytes | None:
        key = id(node)
        if key not in self.cache:
            self.cache[key] = None  # a cycle is impossible in an AST; this also bounds re-entry
            try:
                self.cache[key] = self.fold(node)
            except (ValueError, TypeError, IndexError, UnicodeError, OverflowError):
                self.cache[key] = None
        return self.cache[key]

    def seq(self, node: ast.AST) -> list | None:
        """A list, tuple or string of constants, element by element."""
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self(e) for e in node.elts]
            if all(isinstance(i, str) for i in items):
                return items
            ints = [_small_int(e) for e in node.elts]
            return ints if all(i is not None for i in ints) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("reversed", "list",
                                                                                                "tuple") and len(node.args) == 1:
            inner = self.seq(node.args[0])
            return None if inner is None else (inner[::-1] if node.func.id == "reversed" else inner)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "map"
                and len(node.args) == 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == "chr"):
            codes = self.seq(node.args[1])
            return None if codes is None or not all(isinstance(c, int) for c in codes) else [chr(c) for c in codes]
        text = self(node)
        return list(text) if isinstance(text, str) else None

    def fold(self, node: ast.AST) -> str | bytes | None:
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, (str, bytes)) else None
        if isinstance(node, ast.JoinedStr):
            parts = []
            for value in node.values:
                part = self(value.value) if isinstance(value, ast.FormattedValue) else self(value)
                if not isinstance(part, str):
                    return None
                parts.append(part)
            return _bounded("".join(parts))
        if isinstance(node, ast.BinOp):
            left = self(node.left)
            if isinstance(node.op, ast.Add):
                right = self(node.right)
                if isinstance(left, str) and isinstance(right, str) or isinstance(left, bytes) and isinstance(right, bytes):
                    return _bounded(left + right)  # type: ignore[operator]  # both str or both bytes
            elif isinstance(node.op, ast.Mult):
                count = _small_int(node.right)
                if left is not None and count is not None and len(left) * max(count, 0) <= _FOLD_LIMIT:
                    return left * count
            elif isinstance(node.op, ast.Mod) and isinstance(left, str):
                right = self(node.right)
                if isinstance(right, str):
                    return _bounded(left % right)
                if isinstance(node.right, ast.Tuple):
                    items = [self(e) for e in node.right.elts]
                    if all(isinstance(i, str) for i in items):
                        return _bounded(left % tuple(items))
            return None
        if isinstance(node, ast.Subscript):
            base = self(node.value)
            if base is None:
                return None
            if isinstance(node.slice, ast.Slice):
                bounds = []
                for end in (node.slice.lower, node.slice.upper, node.slice.step):
                    bound = None if end is None else _small_int(end)
                    if end is not None and bound is None:
                        return None
                    bounds.append(bound)
                return base[slice(*bounds)]
            index = _small_int(node.slice)
            return None if index is None or isinstance(base, bytes) else base[index]
        if isinstance(node, ast.Call):
            return self.fold_call(node)
        return None

    def fold_call(self, node: ast.Call) -> str | bytes | None:
        func, args = node.func, node.args
        if node.keywords and not (isinstance(func, ast.Attribute) and func.attr in ("decode", "encode")):
            return None
        if isinstance(func, ast.Name):
            if func.id == "chr" and len(args) == 1:
                code = _small_int(args[0]) if not isinstance(args[0], ast.BinOp) else self.int_expr(args[0])
                return None if code is None or not 0 <= code < 0x110000 else chr(code)
            if func.id == "str" and len(args) == 1:
                return self(args[0]) if isinstance(self(args[0]), str) else None
            if func.id in ("bytes", "bytearray") and len(args) == 1:
                codes = self.seq(args[0])
                return bytes(codes) if codes is not None and all(isinstance(c, int) for c in codes) else None
            return None
        if not isinstance(func, ast.Attribute):
            return None
        if func.attr == "fromhex" and isinstance(func.value, ast.Name) and func.value.id == "bytes" and len(args) == 1:
            text = self(args[0])
            return bytes.fromhex(text) if isinstance(text, str) else None
        base = self(func.value)
        if base is None:
            return None
        if func.attr == "join" and len(args) == 1:
            items = self.seq(args[0])
            if items is not None and all(isinstance(i, type(base)) for i in items):
                return _bounded(base.join(items))
            return None
        if func.attr == "decode" and isinstance(base, bytes):
            encoding = self(args[0]) if args else "utf-8"
            for keyword in node.keywords:
                if keyword.arg == "encoding":
                    encoding = self(keyword.value)
            return base.decode(encoding) if isinstance(encoding, str) and encoding.lower() in _PYTHON_ENCODINGS else None
        if func.attr in ("upper", "lower", "strip", "lstrip", "rstrip", "title", "capitalize", "swapcase") and not args:
            return getattr(base, func.attr)()
        if func.attr == "replace" and len(args) == 2:
            old, new = self(args[0]), self(args[1])
            if type(old) is type(base) and type(new) is type(base):
                return _bounded(base.replace(old, new))  # type: ignore[arg-type]  # all three str or all bytes
            return None
        if func.attr == "format" and isinstance(base, str) and "{" in base and "." not in base and "[" not in base:
            items = [self(a) for a in args]
            return _bounded(base.format(*items)) if all(isinstance(i, str) for i in items) else None
        return None

    def int_expr(self, node: ast.AST) -> int | None:
        """Small integer arithmetic for chr(): chr(100 + 15)."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            left, right = self.int_expr(node.left), self.int_expr(node.right)
            if left is None or right is None:
                return None
            return left + right if isinstance(node.op, ast.Add) else left - right
        return _small_int(node)
