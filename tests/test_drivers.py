"""Every course driver a test names (`student.drive("grader.support.<module>:<function>", ...)`) exists and is
callable. A driver is named by a string, which the worker imports when the test calls it: a typo there would
show only when that test runs, as a failure of the student's grade. This test reads every public and hidden
test file and resolves each name the way the call will, so a missing driver fails here, not in a grade."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_FILES = sorted([*ROOT.glob("exercises/*/test_public.py"), *ROOT.glob("grader/hidden/*/test_hidden.py")])


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound once to a string."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found[node.targets[0].id] = node.value.value
    return found


def _value(node: ast.AST, constants: dict[str, str]) -> str | None:
    """The string `node` spells when it is built from literals and module constants only; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _value(node.left, constants), _value(node.right, constants)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.JoinedStr):
        parts = [_value(v.value if isinstance(v, ast.FormattedValue) else v, constants) for v in node.values]
        return None if any(p is None for p in parts) else "".join(parts)
    return None


def driver_names(path: Path) -> list[tuple[int, str | None]]:
    tree = ast.parse(path.read_text())
    constants = _constants(tree)
    return [(node.lineno, _value(node.args[0], constants)) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "drive"
            and node.args]


def test_the_tests_name_drivers():
    assert sum(len(driver_names(p)) for p in TEST_FILES) >= 40, "the scan must find the course's driver calls"


@pytest.mark.parametrize("path", TEST_FILES, ids=[str(p.relative_to(ROOT)) for p in TEST_FILES])
def test_every_driver_a_test_names_exists(path):
    for line, name in driver_names(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        assert name is not None, f"{where}: name the driver with a literal or a module constant, so it can be checked"
        module, sep, function = name.partition(":")
        assert sep and module.startswith("grader.support.") and function, (
            f"{where}: expected a driver as 'grader.support.<module>:<function>', found {name!r}")
        target = getattr(importlib.import_module(module), function, None)
        assert callable(target), f"{where}: {module} has no function {function!r} (the driver {name!r})"
