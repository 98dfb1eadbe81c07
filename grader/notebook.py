"""Notebooks as submissions: an exercise's module built from a Jupyter notebook, and the starter notebook.

Grader side (`build_module`, called by grader/submission.py while it stages a submission). A notebook named
``<id>.ipynb`` (or the exercise file's stem + ``.ipynb``) is accepted wherever ``<file>.py`` is: flat, in
``<id>/``, in ``exercises/<id>/``, in a folder or an archive. Its module is its code cells, in order, joined
(each after a ``# cell N`` line, so a line number in a message can be traced back to its cell); markdown and
raw cells are left out, and so are **scratch cells**:

* a code cell whose metadata tags hold ``scratch`` (JupyterLab: the property inspector; Jupyter Notebook:
  View > Cell Toolbar > Tags), or
* a code cell whose first non-blank line is a comment ``# scratch`` (any case, anything may follow:
  ``# scratch: timing``), for Colab and editors without tags.

Nothing is executed: the JSON (at most `submission.MAX_FILE_BYTES`, like any file) is parsed with the
standard library, the source built, and ``ast.parse`` checks it. The notebook is refused, with a message
naming the cell, when

* the file is not a notebook (not JSON, not an object with a list of ``cells``, not nbformat 4, a cell that
  is not ``{"cell_type": ..., "source": ...}``);
* a code cell that is not scratch holds a shell or magic line (``!pip install ...``, ``%timeit``,
  ``%%time``, ``%matplotlib inline``) or calls ``get_ipython()``: only Python runs where it is graded;
* a cell has a syntax error (its number, the line within it, Python's message);
* no code cell defines any of the contract's names (the top-level functions and classes of the exercise's
  stub, ``exercises/<id>/<file>``). A notebook that defines some of them is graded, with a warning naming
  the missing ones (their tests fail, as they would for a ``.py`` without them).

When both ``<file>.py`` and a notebook are found for an exercise, the ``.py`` is graded and the result's
warnings say the notebook was not. The module built is then staged, scanned and graded exactly like a ``.py``.

Student side (`write_starter`, ``grader notebook <id>`` / ``make notebook EX=<id>``): writes
``exercises/<id>/<id>.ipynb`` with nbformat: the README's contract as markdown, the stub as code cells (one
for its imports, one per top-level function or class), a scratch cell to try things in.
"""

from __future__ import annotations

import ast
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader.report import markdown_section

SUFFIX = ".ipynb"
SCRATCH_TAG = "scratch"
_SCRATCH_LINE = re.compile(r"#\s*scratch\b", re.I)
_MAGIC_LINE = re.compile(r"\s*(%|!(?!=))")
_QUOTE = 60  # characters of a cell's first line quoted in a message


class NotebookError(ValueError):
    """The notebook cannot become the exercise's module; the message says why and where."""


def notebook_names(exercise_id: str, file: str) -> list[str]:
    """The names a notebook for this exercise may have: ``<id>.ipynb``, then ``<file stem>.ipynb``."""
    names = [exercise_id + SUFFIX, Path(file).stem + SUFFIX]
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------------------------------
# Grader side: never executes anything


@dataclass
class _Cell:
    number: int  # 1-based, among all cells, as a student counts them down the notebook
    code_number: int  # 1-based, among code cells
    source: str

    def where(self) -> str:
        first = next((line.strip() for line in self.source.splitlines() if line.strip()), "")
        if len(first) > _QUOTE:
            first = first[:_QUOTE - 3] + "..."
        return f"cell {self.number} (code cell {self.code_number}, starting {first!r})"


def _describe_json(value: object) -> str:
    if isinstance(value, dict):
        keys = ", ".join(repr(k) for k in list(value)[:5])
        return f"a JSON object with keys {keys}" if keys else "an empty JSON object"
    return {list: "a JSON list", str: "a JSON string", bool: "a JSON boolean", type(None): "JSON null"}.get(
        type(value), f"a JSON {type(value).__name__}")


_EXPECTED = "a Jupyter notebook (a JSON object with a list of 'cells' and 'nbformat': 4)"


def _source_text(cell: dict, number: int) -> str:
    source = cell.get("source", "")
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        source = "".join(source)
    if not isinstance(source, str):
        raise NotebookError(f"expected {_EXPECTED}, found cell {number} whose 'source' is "
                            f"{_describe_json(source)}, not text")
    return source


def is_scratch(cell: dict) -> bool:
    """A code cell left out of the module: tagged ``scratch``, or first non-blank line ``# scratch``."""
    metadata = cell.get("metadata")
    tags = metadata.get("tags") if isinstance(metadata, dict) else None
    if isinstance(tags, list) and any(isinstance(t, str) and t.strip().lower() == SCRATCH_TAG for t in tags):
        return True
    source = cell.get("source", "")
    text = "".join(source) if isinstance(source, list) and all(isinstance(p, str) for p in source) else source
    if not isinstance(text, str):
        return False
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return bool(_SCRATCH_LINE.match(first))


def _code_cells(data: bytes) -> tuple[list[_Cell], int]:
    """The graded code cells (scratch ones left out) and how many scratch cells there were."""
    try:
        nb = json.loads(data)
    except UnicodeDecodeError as exc:
        raise NotebookError(f"expected {_EXPECTED}, found bytes that are not UTF-8 text ({exc.reason} at byte "
                            f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise NotebookError(f"expected {_EXPECTED}, found text that is not JSON ({exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno})") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise NotebookError(f"expected {_EXPECTED}, found JSON that cannot be read ({type(exc).__name__})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        found = _describe_json(nb)
        if isinstance(nb, dict) and "worksheets" in nb:
            found = "an nbformat 3 notebook (its cells in 'worksheets'): open and save it in Jupyter to upgrade it"
        raise NotebookError(f"expected {_EXPECTED}, found {found}")
    version = nb.get("nbformat")
    if version != 4:
        raise NotebookError(f"expected {_EXPECTED}, found 'nbformat': {str(version)[:20]}")
    language = (nb.get("metadata") or {}).get("language_info", {}) if isinstance(nb.get("metadata"), dict) else {}
    name = language.get("name") if isinstance(language, dict) else None
    if isinstance(name, str) and name.lower() not in ("python", "python3", "ipython"):
        raise NotebookError(f"expected a Python notebook, found one whose language is {name[:40]!r}")
    cells: list[_Cell] = []
    scratch = code = 0
    for number, cell in enumerate(nb["cells"], 1):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise NotebookError(f"expected {_EXPECTED}, found cell {number} as {_describe_json(cell)} "
                                f"(no 'cell_type')")
        if cell["cell_type"] != "code":
            continue
        code += 1
        source = _source_text(cell, number)
        if is_scratch(cell):
            scratch += 1
            continue
        cells.append(_Cell(number, code, source))
    return cells, scratch


def _parse_cell(cell: _Cell) -> ast.Module:
    try:
        return ast.parse(cell.source, filename=f"cell {cell.number}")
    except SyntaxError as exc:
        lines = cell.source.splitlines()
        line = exc.lineno or 1
        magic = [(i, text) for i, text in enumerate(lines, 1) if _MAGIC_LINE.match(text)]
        hit = next(((i, text) for i, text in magic if i == line), None) or next(
            ((i, text) for i, text in magic if i < line), None)
        if hit is not None:
            raise NotebookError(_magic_message(cell, hit[0], hit[1])) from None
        raise NotebookError(f"{cell.where()}, line {line}: syntax error: {exc.msg}; fix it, or mark the cell as "
                            f"scratch to leave it out ({_HOW_SCRATCH})") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise NotebookError(f"{cell.where()}: cannot be parsed ({type(exc).__name__}: {str(exc)[:120]})") from None


_HOW_SCRATCH = "tag it 'scratch', or make its first line '# scratch'"


def _magic_message(cell: _Cell, line: int, text: str) -> str:
    shown = text.strip()
    if len(shown) > _QUOTE:
        shown = shown[:_QUOTE - 3] + "..."
    return (f"{cell.where()}, line {line}: a shell or magic line ({shown!r}); the notebook is graded as a Python "
            f"file, where only Python runs: delete the line, or mark the cell as scratch ({_HOW_SCRATCH})")


def _defined(tree: ast.Module) -> set[str]:
    """Names a module defines at its top level (inside top-level if/try/with blocks too)."""
    names: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for block in ("body", "orelse", "finalbody"):
                todo.extend(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)
    return names


def contract_names(stub_source: str) -> list[str]:
    """The public top-level functions and classes of an exercise's stub, in order."""
    tree = ast.parse(stub_source)
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not n.name.startswith("_")]


def _late_future_import(tree: ast.Module) -> int | None:
    """The line of a ``from __future__`` import that follows other statements (a compile error, which
    ast.parse alone does not report), or None."""
    body = tree.body
    first = body[0].value if body and isinstance(body[0], ast.Expr) else None
    start = 1 if isinstance(first, ast.Constant) and isinstance(first.value, str) else 0
    seen_other = False
    for node in body[start:]:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            if seen_other:
                return node.lineno
        else:
            seen_other = True
    return None


def _ipython_call(tree: ast.Module) -> int | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "get_ipython":
            return node.lineno
    return None


def build_module(data: bytes, name: str, contract: list[str] | None) -> tuple[str, list[str]]:
    """The module a notebook's bytes stand for, and notes for the result's warnings. `name` is the notebook's
    file name (for the header line); `contract` the names the stub defines (None: unknown, then at least one
    top-level function or class is asked for). NotebookError says why it cannot be built."""
    cells, scratch = _code_cells(data)
    parts = [f"# Built by the grader from {name}: its code cells in order, {scratch} scratch cell(s) left out.\n"]
    offsets: list[tuple[int, _Cell]] = []  # first line of each cell's code in the module
    defined: set[str] = set()
    trees: list[ast.Module] = []
    line = 2
    for cell in cells:
        tree = _parse_cell(cell)
        trees.append(tree)
        call = _ipython_call(tree)
        if call is not None:
            raise NotebookError(_magic_message(cell, call, cell.source.splitlines()[call - 1]))
        defined |= _defined(tree)
        text = cell.source if cell.source.endswith("\n") or not cell.source else cell.source + "\n"
        parts.append(f"# cell {cell.number}\n")
        offsets.append((line + 1, cell))
        parts.append(text)
        parts.append("\n")
        line += 2 + text.count("\n")
    source = "".join(parts)

    def where(at: int) -> str:
        found = next(((start, c) for start, c in reversed(offsets) if start <= at), None)
        return f"{found[1].where()}, line {at - found[0] + 1}" if found else f"line {at}"

    try:
        joined = ast.parse(source, filename=name)
    except SyntaxError as exc:  # each cell parses alone; together they should too
        raise NotebookError(f"{where(exc.lineno or 1)}: syntax error once the cells are joined: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise NotebookError(f"the joined code cells cannot be parsed ({type(exc).__name__})") from None
    late = _late_future_import(joined)
    if late is not None:
        raise NotebookError(f"{where(late)}: a 'from __future__' import after other code: Python allows it only at "
                            f"the top of the module; move it to the first code cell")
    notes: list[str] = []
    if contract:
        missing = [n for n in contract if n not in defined]
        if len(missing) == len(contract):
            raise NotebookError(f"no code cell defines the contract: expected top-level definitions of "
                                f"{', '.join(contract)}, found none of them in {len(cells)} graded code cell(s)"
                                + (f" ({scratch} scratch cell(s) left out)" if scratch else ""))
        if missing:
            notes.append(f"{name} does not define {', '.join(missing)} (their tests fail)")
    elif not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for t in trees for n in t.body):
        raise NotebookError(f"no code cell defines a function or a class ({len(cells)} graded code cell(s))")
    return source, notes


# ---------------------------------------------------------------------------------------------
# Student side: the starter notebook (nbformat)

NBFORMAT_MISSING = ("writing a notebook needs nbformat, which this environment lacks: install it with "
                    "`.venv/bin/python -m pip install 'nbformat>=5.7'` (or `pip install -e '.[notebook]'`)")
_INSTRUCTOR_BLOCK = re.compile(r"\n?<!-- instructor[^>]*-->.*?<!-- /instructor -->\n?", re.S)


def stub_cells(stub: str) -> list[str]:
    """The stub cut into code cells: what comes before its first top-level function or class (the docstring,
    the imports), then one cell per top-level function or class, each with the comments and decorators just
    above it (a comment block a blank line above it too). Joined again, they are the stub."""
    tree = ast.parse(stub)
    lines = stub.splitlines(keepends=True)
    starts: list[int] = []
    previous_end = 0  # the last line of the statement before
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            back = start  # the comments above it, blank lines between them included, go with it
            while back > previous_end and (not lines[back - 1].strip() or lines[back - 1].lstrip().startswith("#")):
                back -= 1
            while back < start and not lines[back].strip():
                back += 1
            if not starts or back > starts[-1]:
                starts.append(back)
        previous_end = node.end_lineno or node.lineno
    bounds = ([0] if not starts or starts[0] > 0 else []) + starts + [len(lines)]
    cells = ["".join(lines[a:b]).strip("\n") for a, b in zip(bounds, bounds[1:])]
    return [c for c in cells if c.strip()]


def starter_notebook(exercise_id: str, title: str, file: str, stub: str, readme: str) -> Any:
    """The starter notebook (an nbformat NotebookNode) for one exercise."""
    try:
        import nbformat
        from nbformat import v4
    except ImportError:
        raise NotebookError(NBFORMAT_MISSING) from None
    readme = _INSTRUCTOR_BLOCK.sub("\n", readme)
    intro = (f"# {title} (`{exercise_id}`)\n\n"
             f"Write your solution in the code cells below and hand in this notebook as `{exercise_id}.ipynb` "
             f"(alone, in a folder or in an archive). The grader builds `{file}` from the code cells, in order, and "
             f"grades it exactly like the file. It runs nothing of the notebook itself, so:\n\n"
             f"- **Scratch cells are left out**: tag a cell `{SCRATCH_TAG}` (JupyterLab's property inspector), or "
             f"make its first line `# scratch` (Colab). Use them for experiments, plots and timing.\n"
             f"- **No shell or magic lines** (`!pip ...`, `%timeit`, `%%time`, `%matplotlib`) outside scratch "
             f"cells: the notebook is refused, with the cell named.\n"
             f"- Keep the names of the functions and classes below: they are the contract. "
             f"`exercises/{exercise_id}/README.md` is the whole task.")
    nb = v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells.append(v4.new_markdown_cell(intro))
    contract = markdown_section(readme, "The contract")
    if contract:
        nb.cells.append(v4.new_markdown_cell(contract))
    for code in stub_cells(stub):
        nb.cells.append(v4.new_code_cell(code))
    nb.cells.append(v4.new_code_cell("# scratch: not graded. Try your functions here, e.g.\n"
                                     "# import torch; x = torch.randn(4, 10)",
                                     metadata={"tags": [SCRATCH_TAG]}))
    nbformat.validate(nb)
    return nb


def write_starter(root: Path, exercise_id: str, title: str, file: str, force: bool = False) -> Path:
    """Write ``exercises/<id>/<id>.ipynb`` from the exercise's file as it is now (the stub, or the student's work
    so far) and its README; FileExistsError when it exists and not `force`. The notebook gets a plain file's mode
    (0666 less the umask), not the private 0600 of the temporary file it is written through."""
    folder = root / "exercises" / exercise_id
    target = folder / (exercise_id + SUFFIX)
    if target.exists() and not force:
        raise FileExistsError(f"{target.relative_to(root)} exists already; expected no notebook there. Pass --force "
                              f"(make notebook EX={exercise_id} FORCE=1) to overwrite it with a fresh starter")
    try:
        stub = (folder / file).read_text()
        readme = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
    except OSError as exc:
        raise NotebookError(f"expected the stub at {(folder / file).relative_to(root)}, found {exc.strerror}") from None
    nb = starter_notebook(exercise_id, title, file, stub, readme)
    import nbformat

    fd, tmp = tempfile.mkstemp(prefix=f".{exercise_id}-", suffix=SUFFIX, dir=folder)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.fchmod(fd, 0o666 & ~mask)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            nbformat.write(nb, out)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
    return target
