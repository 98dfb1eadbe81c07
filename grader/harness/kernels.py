"""The scan's rule for Triton kernels (rule 10 of grader/harness/tamper.py): a kernel holds Triton and nothing else.

On a GPU, Triton compiles a ``@triton.jit`` function's body to device code, and the compiler refuses anything
that is not Triton: a numpy call, a Python function of the file, a tensor's ``.handle``. On the CPU, under
``TRITON_INTERPRET=1``, the same body runs as host Python, and the probes trust what runs inside a launch as
kernel code. Three of one round of attacks went through that gap: a kernel body computed a softmax with numpy
on its tiles' raw arrays; a default argument's expression ran when the interpreter re-executed the def; a
kernel's body read memory through a handle. Each was closed where it ran; this rule closes the gap itself, by
reading the file: what a kernel may contain is listed, and everything else is a finding.

A kernel is a module-level function whose decorators are Triton's own (``triton.jit``, ``triton.autotune``,
``triton.heuristics``, each through any import alias). Inside it, and in its parameters' defaults and
annotations:

* **Names**: its parameters and locals; the module's other kernels; module constants (a name bound once at
  module level, to a number, string, bool or None, or ``tl.constexpr`` of one, and never declared ``global``);
  Triton's language module under any alias (``tl``); and the builtins Triton's compiler understands
  (``range``, ``min``, ``max``, ``float``, ``int``, ``bool``, ``len``, ``abs``, ``print``).
* **Attributes**: a chain through ``triton.language`` to one of its public names (``tl.load``,
  ``tl.math.exp2``, ``tl.extra.cuda.libdevice.erf``), except ``inline_asm_elementwise`` (native code on the
  GPU) and the modules that build tensors from handles (``tl.core``, ``tl.semantic``); on a value, the public
  names of a Triton tensor and dtype (``x.to``, ``x.dtype``, ``ptr.dtype.element_ty``, ``acc.T``), never
  ``handle`` or ``type``.
* **Calls**: to those chains, those kernels, those builtins and those methods; nothing else is called
  (a parameter or a local is not a function in a kernel).
* **Statements**: assignment to names (and tuples of names), augmented assignment, ``if``, ``for`` over a
  call (``range``, ``tl.range``, ``tl.static_range``), ``while``, ``return``, ``assert``, ``break``,
  ``continue``, ``pass``, and expression statements. No nested functions or classes, ``with``, ``try``,
  ``raise``, ``import``, ``global``, ``del``, or stores into attributes and subscripts.
* **Expressions**: arithmetic, comparisons, boolean operators, conditional expressions, subscripts with
  slices and ``None``, tuples and lists; no lambdas, comprehensions, dicts, sets, f-strings or walrus.
* Defaults are constants; annotations are Triton chains (``tl.constexpr``) or strings; no ``*args`` or
  ``**kwargs``.

Outside kernels, ``triton.jit``, ``triton.autotune`` and ``triton.heuristics`` may only decorate a def: a
kernel made at run time (``triton.jit(f)``) is a body this rule never read. And outside kernels Triton's language
names types and constants only (``tl.constexpr``, ``tl.float16``): a grid function that called ``tl.load``,
ran numpy on the loaded tile's ``.handle`` and stored it back scored full marks with an empty kernel (red team
round 10), because the interpreter runs the grid function inside the launch. ``.handle`` is flagged anywhere
(rule 1). Every solution's kernels keep
these rules (tests/test_tamper.py scans them), and so does any kernel Triton's GPU compiler accepts: the
list is what that compiler understands, less the corners named above.
"""

from __future__ import annotations

import ast
import functools
from typing import Callable

KERNEL = ("your kernel holds Python that is not Triton: under the CPU interpreter a kernel's body runs as host "
          "Python, which the grader trusts as kernel code, and on a GPU Triton's compiler would refuse it")
HOST_LANGUAGE = ("your host code calls Triton's kernel language (tl.load, tl.sum, ...) outside a kernel: under the "
                 "CPU interpreter that runs as host Python inside a launch, which the grader trusts as kernel code; "
                 "outside kernels use triton.cdiv and triton.next_power_of_2, and tl's types and tl.constexpr")
MADE_AT_RUN_TIME = ("your code makes a Triton kernel at run time, not with a decorator on a def, so the grader "
                    "cannot read the kernel's body")

DECORATORS = frozenset({"triton.jit", "triton.autotune", "triton.heuristics"})
BUILTINS = frozenset({"range", "min", "max", "float", "int", "bool", "len", "abs", "print"})
LANGUAGE = "triton.language"
# Parts of triton.language a kernel does not need and that reach past it: native code, and the modules that
# build tensors from raw handles.
_LANGUAGE_REFUSED = frozenset({"inline_asm_elementwise", "core", "semantic", "standard", "random", "target_info",
                               "tensor"})
# The submodules of triton.language a kernel may call into: its math, and libdevice's functions.
_LANGUAGE_MODULES = frozenset({("math",), ("extra", "libdevice"), ("extra", "cuda", "libdevice"),
                               ("extra", "hip", "libdevice")})
_MODULE_PREFIXES = frozenset(p[:i] for p in _LANGUAGE_MODULES for i in range(1, len(p) + 1))
_VALUE_REFUSED = frozenset({"handle", "type", "to_ir", "codegen_name", "mangle", "cache_key_part"})
_VALUE_EXTRA = frozenset({"dtype", "shape", "numel", "element_ty", "value", "T", "primitive_bitwidth", "itemsize",
                          "int_bitwidth", "int_signedness", "fp_mantissa_width", "exponent_bias", "name", "scalar"})
_STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.If, ast.For, ast.While,
               ast.Break, ast.Continue, ast.Pass, ast.Assert)
_EXPRESSIONS = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.BinOp,
                ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.keyword)
_CONTEXTS = (ast.expr_context, ast.operator, ast.unaryop, ast.boolop, ast.cmpop)


@functools.lru_cache(maxsize=1)
def value_attributes() -> frozenset[str]:
    """The attribute names a kernel may read off a value: a Triton tensor's and dtype's public ones."""
    import triton.language as tl

    names = {n for source in (tl.tensor, tl.dtype, tl.pointer_type, tl.block_type) for n in dir(source)}
    return frozenset(n for n in names | _VALUE_EXTRA if not n.startswith("_")) - _VALUE_REFUSED


def language_path_allowed(path: str) -> bool:
    """Is a dotted path (resolved through import aliases) a part of triton.language a kernel may use?"""
    if not path.startswith(LANGUAGE + "."):
        return False
    parts = path[len(LANGUAGE) + 1:].split(".")
    if any(p.startswith("_") for p in parts) or parts[0] in _LANGUAGE_REFUSED:
        return False
    if len(parts) == 1:
        return (parts[0],) not in _MODULE_PREFIXES  # tl.math itself is a module, not a value for a kernel
    return tuple(parts[:-1]) in _LANGUAGE_MODULES


def _language_function(path: str) -> bool:
    """Is a triton.language path one of its functions (tl.load, tl.sum, tl.math.exp2), not a type or constant?"""
    import importlib

    parts = path.split(".")
    try:
        obj: object = importlib.import_module(LANGUAGE)
        for name in parts[2:]:
            obj = getattr(obj, name)
    except (ImportError, AttributeError):
        return True  # a name the language does not have: not a type or a constant either
    return callable(obj) and not isinstance(obj, type)


def is_kernel_decorator(path: str | None) -> bool:
    return path in DECORATORS


class KernelRule:
    """Rule 10 over one parsed file. `resolve` maps a Name or Attribute node to its dotted path through the
    file's import aliases, `parents` a node to its parent (both the scanner's own), `flag` records a finding."""

    def __init__(self, tree: ast.Module, resolve: Callable[[ast.AST], str | None],
                 flag: Callable[[ast.AST, str, str], None], parents: dict[int, ast.AST]):
        self.tree = tree
        self.resolve = resolve
        self.flag = flag
        self.parents = parents  # id(node) -> its parent: the scanner's own map of this tree
        self.module_names: set[str] = set()  # every name bound at module level (a builtin there is the file's)

    def decorator_path(self, node: ast.expr) -> str | None:
        return self.resolve(node.func if isinstance(node, ast.Call) else node)

    def run(self) -> None:
        kernels = {node.name: node for node in self.tree.body
                   if isinstance(node, ast.FunctionDef) and any(is_kernel_decorator(self.decorator_path(d))
                                                                for d in node.decorator_list)}
        decorators = set()
        nested: list[ast.AST] = []
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for dec in node.decorator_list:
                    decorators.add(id(dec.func if isinstance(dec, ast.Call) else dec))
                    if is_kernel_decorator(self.decorator_path(dec)) and node is not kernels.get(node.name) \
                            and node not in nested:
                        self.flag(node, f"def {node.name}", f"{KERNEL} (a kernel is a def at module level)")
                        nested.append(node)
        for node in ast.walk(self.tree):  # a kernel maker anywhere but on a decorator line
            if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in decorators \
                    and is_kernel_decorator(self.resolve(node)) \
                    and not isinstance(self.parent_of(node), ast.Attribute):
                self.flag(node, self.resolve(node) or "triton.jit", MADE_AT_RUN_TIME)
        for kernel in kernels.values():
            for dec in kernel.decorator_list:
                if not is_kernel_decorator(self.decorator_path(dec)):
                    self.flag(dec, f"@{ast.unparse(dec)[:60]}", f"{KERNEL} (a kernel's decorators are triton.jit, "
                                                              "triton.autotune and triton.heuristics)")
        bodies = {id(n) for k in kernels.values() for n in ast.walk(k)}
        for node in ast.walk(self.tree):  # outside kernels, a kernel is launched: K[grid](...)
            if isinstance(node, ast.Name) and node.id in kernels and id(node) not in bodies \
                    and isinstance(node.ctx, ast.Load) and not self.launched(node):
                self.flag(node, node.id, f"{KERNEL} (outside kernels, a kernel is only launched, as "
                                         f"{node.id}[grid](...): its attributes are Triton's launch machinery)")
        for node in ast.walk(self.tree):  # outside kernels, Triton's language names types and constants only
            if isinstance(node, (ast.Name, ast.Attribute)) and id(node) not in bodies and not self.chained(node):
                path = self.resolve(node)
                if path is not None and path.startswith(LANGUAGE + ".") and _language_function(path):
                    self.flag(node, path, HOST_LANGUAGE)
        constants, rebound = self.module_constants()
        for name, kernel in kernels.items():
            if name in rebound:
                self.flag(kernel, f"def {name}", f"{KERNEL} (the kernel's name is bound again in the file)")
            _Body(self, kernel, set(kernels) - rebound, constants).run()
        for inner in nested:  # flagged already; its body is read too, so the message names what it holds
            if isinstance(inner, ast.FunctionDef):
                _Body(self, inner, set(kernels) - rebound, constants).run()

    def chained(self, node: ast.AST) -> bool:
        """Is `node` the value of an attribute (``tl`` in ``tl.load``), so that the whole chain is judged?"""
        parent = self.parent_of(node)
        return isinstance(parent, ast.Attribute) and parent.value is node

    def launched(self, node: ast.Name) -> bool:
        subscript = self.parent_of(node)
        return isinstance(subscript, ast.Subscript) and subscript.value is node \
            and isinstance(call := self.parent_of(subscript), ast.Call) and call.func is subscript

    def parent_of(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def module_constants(self) -> tuple[set[str], set[str]]:
        """(names bound once at module level to a constant and never declared global, names bound more than
        once at module level or declared global anywhere)."""
        counts: dict[str, int] = {}
        values: dict[str, ast.AST | None] = {}
        for stmt in self.tree.body:
            for node in _module_level(stmt):
                for name in _bound_names(node):
                    counts[name] = counts.get(name, 0) + 1
                    values[name] = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        declared = {n for node in ast.walk(self.tree) if isinstance(node, (ast.Global, ast.Nonlocal))
                    for n in node.names}
        self.module_names = set(counts) | declared
        rebound = {n for n, c in counts.items() if c > 1} | declared
        constants = {n for n, v in values.items() if n not in rebound and v is not None and self.is_constant(v)}
        return constants, rebound

    def is_constant(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return type(node.value) in (int, float, str, bool, type(None))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return self.is_constant(node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv,
                                                                ast.LShift, ast.Pow)):
            return self.is_constant(node.left) and self.is_constant(node.right) \
                and all(isinstance(c, ast.Constant) and type(c.value) in (int, float, bool)
                        for c in ast.walk(node) if isinstance(c, ast.Constant)) \
                and not _too_large(node)
        if isinstance(node, ast.Call) and self.resolve(node.func) == f"{LANGUAGE}.constexpr":
            return len(node.args) == 1 and not node.keywords and self.is_constant(node.args[0])
        return False


def _too_large(node: ast.AST) -> bool:
    """A ``**`` or ``<<`` in a module constant: bounded, so that no constant is a huge number."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Pow, ast.LShift))
               and not (isinstance(n.right, ast.Constant) and type(n.right.value) is int and 0 <= n.right.value <= 64)
               for n in ast.walk(node))


def _module_level(stmt: ast.stmt):
    """The statements that run at module level: `stmt`, and those nested in its if/for/while/try/with."""
    yield stmt
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(stmt, field, []) or []:
            if isinstance(child, ast.ExceptHandler):
                for inner in child.body:
                    yield from _module_level(inner)
            else:
                yield from _module_level(child)
    if isinstance(stmt, ast.Match):
        for case in stmt.cases:
            for inner in case.body:
                yield from _module_level(inner)


def _bound_names(node: ast.AST) -> list[str]:
    """The module-level names a statement binds (without descending into functions and classes)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    elif isinstance(node, (ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.Try):
        return [h.name for h in node.handlers if h.name]
    names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Lambda)):  # a walrus at module level binds too
        names += [n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr)
                  and not _inside_scope(node, n)]
    return names


def _inside_scope(root: ast.AST, target: ast.AST) -> bool:
    """Is `target` inside a function, lambda or class nested in `root` (where a walrus binds elsewhere)?"""
    for node in ast.walk(root):
        if node is not root and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            if any(n is target for n in ast.walk(node)):
                return True
    return False


class _Body:
    """One kernel's signature and body, against the lists above."""

    def __init__(self, rule: KernelRule, kernel: ast.FunctionDef, kernels: set[str], constants: set[str]):
        self.rule, self.kernel, self.kernels, self.constants = rule, kernel, kernels, constants
        args = kernel.args
        self.params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        self.locals = {n.id for stmt in kernel.body for n in ast.walk(stmt)
                       if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    def bad(self, node: ast.AST, what: str, detail: str) -> None:
        self.rule.flag(node, f"{self.kernel.name}: {what}", f"{KERNEL} ({detail})")

    def run(self) -> None:
        args = self.kernel.args
        if args.vararg or args.kwarg:
            self.bad(self.kernel, "*args or **kwargs", "a kernel's parameters are named one by one")
        for default in (*args.defaults, *(d for d in args.kw_defaults if d is not None)):
            if not self.rule.is_constant(default):
                self.bad(default, ast.unparse(default)[:60], "a default is a constant")
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
            if arg.annotation is not None and not self.annotation_ok(arg.annotation):
                self.bad(arg.annotation, ast.unparse(arg.annotation)[:60],
                         "an annotation is a part of triton.language, such as tl.constexpr")
        if self.kernel.returns is not None and not self.annotation_ok(self.kernel.returns):
            self.bad(self.kernel.returns, ast.unparse(self.kernel.returns)[:60], "an annotation is Triton's")
        for stmt in self.kernel.body:
            self.statement(stmt)

    def annotation_ok(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return True
        path = self.rule.resolve(node)
        return path is not None and (language_path_allowed(path) or path == f"{LANGUAGE}.tensor")

    def statement(self, stmt: ast.stmt) -> None:
        if not isinstance(stmt, _STATEMENTS):
            self.bad(stmt, type(stmt).__name__.lower(), "a kernel holds assignments, if, for, while, return and "
                                                       "calls of Triton; no nested def, class, with, try, import")
            return
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                self.target(target)
            if isinstance(stmt, ast.AnnAssign) and not self.annotation_ok(stmt.annotation):
                self.bad(stmt.annotation, ast.unparse(stmt.annotation)[:60], "an annotation is Triton's")
            if stmt.value is not None:
                self.expression(stmt.value)
        elif isinstance(stmt, ast.For):
            self.target(stmt.target)
            if not isinstance(stmt.iter, ast.Call):
                self.bad(stmt.iter, ast.unparse(stmt.iter)[:60], "a loop runs over range, tl.range or "
                                                                 "tl.static_range")
            self.expression(stmt.iter)
        elif isinstance(stmt, (ast.If, ast.While)):
            self.expression(stmt.test)
        elif isinstance(stmt, ast.Assert):
            self.expression(stmt.test)
            if stmt.msg is not None:
                self.expression(stmt.msg)
        elif isinstance(stmt, (ast.Expr, ast.Return)) and stmt.value is not None:
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):  # a docstring
                self.expression(stmt.value)
        for field in ("body", "orelse"):
            for child in getattr(stmt, field, []) or []:
                self.statement(child)

    def target(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            return
        if isinstance(node, (ast.Tuple, ast.List)):
            for element in node.elts:
                self.target(element)
            return
        self.bad(node, ast.unparse(node)[:60], "a kernel assigns names; Triton's values are never changed in place")

    def expression(self, node: ast.AST) -> None:
        if isinstance(node, _CONTEXTS):
            return
        if not isinstance(node, _EXPRESSIONS):
            self.bad(node, type(node).__name__.lower(), "a kernel's expressions are arithmetic, comparisons, "
                                                       "subscripts and calls of Triton; no lambda, comprehension, "
                                                       "dict, set or f-string")
            return
        if isinstance(node, ast.Name):
            self.name(node)
            return
        if isinstance(node, ast.Attribute):
            self.attribute(node)
            return
        if isinstance(node, ast.Call):
            self.call(node)
            return
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float, str, bool, type(None)) and node.value is not Ellipsis:
                self.bad(node, repr(node.value)[:40], "a constant is a number, string, bool or None")
            return
        for child in ast.iter_child_nodes(node):
            self.expression(child)

    def name(self, node: ast.Name) -> None:
        name = node.id
        if name in self.params or name in self.locals or name in self.kernels or name in self.constants:
            return
        path = self.rule.resolve(node)
        if path is not None and language_path_allowed(path):  # from triton.language import load
            return
        if name in BUILTINS and path is None and name not in self.rule.module_names:
            return
        self.bad(node, name, "a kernel names its parameters, its locals, the file's other kernels and constants, "
                             "triton.language and a few builtins (range, min, max, float, int)")

    def attribute(self, node: ast.Attribute) -> None:
        path = self.rule.resolve(node)
        if path is not None:  # a chain through an import: only triton.language's public functions and types
            if not language_path_allowed(path):
                self.bad(node, path, "a kernel uses triton.language's public functions and types, not other modules, "
                                     "inline assembly, tl.core or tl.tensor")
            return
        if node.attr not in value_attributes():
            self.bad(node, f".{node.attr}", "a kernel reads a Triton tensor's or dtype's own attributes (x.to, "
                                            "x.dtype, x.T), never .handle or .type")
        self.expression(node.value)

    def call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            path = self.rule.resolve(func)
            ok = func.id in self.kernels or (path is None and func.id in BUILTINS and func.id not in self.params
                                              and func.id not in self.locals and func.id not in self.rule.module_names) \
                or (path is not None and language_path_allowed(path))
            if not ok:
                self.bad(func, f"{func.id}(...)", "a kernel calls Triton, the file's other kernels and a few builtins; "
                                                  "a parameter, a local or a Python function is not called")
        elif isinstance(func, ast.Attribute):
            self.attribute(func)
        else:
            self.bad(func, ast.unparse(func)[:60], "a kernel calls a named function or method")
        for child in (*node.args, *node.keywords):
            if isinstance(child, ast.Starred):
                self.bad(child, "*" + ast.unparse(child.value)[:40], "a kernel passes arguments one by one")
                continue
            self.expression(child.value if isinstance(child, ast.keyword) else child)
            if isinstance(child, ast.keyword) and child.arg is None:
                self.bad(child, "**" + ast.unparse(child.value)[:40], "a kernel passes arguments one by one")
