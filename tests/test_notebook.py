"""Notebooks as submissions (grader/notebook.py, grader/submission.py): a notebook stands for the exercise's file,
scratch cells are left out, a notebook that cannot become a module is refused naming its cell; and the student's
`grader notebook <id>` writes a starter that nbformat validates and that, filled in, grades."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from grader.notebook import build_module, contract_names, stub_cells
from grader.submission import SubmissionError, locate
from tests.conftest import COURSE, ROOT, checks_of, grade_folder

nbformat = pytest.importorskip("nbformat")

EX = "online_softmax"
STUB = (ROOT / "exercises" / EX / f"{EX}.py").read_text()
SOLUTION = (ROOT / "solutions" / EX / f"{EX}.py").read_text()
CHECKS = ["merge_public", "normalizer_public"]


def code(source: str, tags: list[str] | None = None) -> dict:
    return {"cell_type": "code", "source": source, "metadata": {"tags": tags} if tags else {}, "outputs": [],
            "execution_count": None}


def markdown(source: str) -> dict:
    return {"cell_type": "markdown", "source": source, "metadata": {}}


def notebook(*cells: dict) -> bytes:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "cells": list(cells),
                       "metadata": {"language_info": {"name": "python"}}}).encode()


def reference_cells() -> list[dict]:
    return [code(c) for c in stub_cells(SOLUTION)]


def staged(folder: Path) -> tuple[str, list[str]]:
    sub = locate(COURSE, folder, [EX], root=ROOT)
    try:
        return sub.files[EX].read_text(), sub.notes
    finally:
        sub.cleanup()


def refusal(tmp_path: Path, data: bytes) -> str:
    (tmp_path / f"{EX}.ipynb").write_bytes(data)
    with pytest.raises(SubmissionError) as caught:
        locate(COURSE, tmp_path, [EX], root=ROOT)
    return str(caught.value)


def grader_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=300)


@pytest.fixture()
def course_copy(tmp_path: Path) -> Path:
    """A course root with one exercise's README and stub: where `grader notebook` writes."""
    lab = tmp_path / "lab"
    (lab / "exercises" / EX).mkdir(parents=True)
    shutil.copy(ROOT / "course.yaml", lab / "course.yaml")
    for name in ("README.md", f"{EX}.py"):
        shutil.copy(ROOT / "exercises" / EX / name, lab / "exercises" / EX / name)
    return lab


# ---------------------------------------------------------------------------------------------
# The module a notebook makes


def test_the_module_is_the_code_cells_in_order_without_scratch_cells():
    data = notebook(markdown("# notes"), *reference_cells(),
                    code("!pip install numpy\n%timeit online_softmax(x)", tags=["scratch"]),
                    code("# Scratch: timing\n%%time\nonline_softmax(x)"),
                    code("  \n# scratch\n!ls"))
    source, notes = build_module(data, f"{EX}.ipynb", contract_names(STUB))
    assert notes == []
    assert "3 scratch cell(s) left out" in source.splitlines()[0]
    assert "pip" not in source and "%" not in source.replace("%s", "")  # nothing of the scratch cells
    n = len(reference_cells())
    assert f"# cell {n + 1}\n" in source and f"# cell {n + 2}" not in source
    import ast

    assert ast.dump(ast.parse(source)) == ast.dump(ast.parse(SOLUTION)), "the cells, joined, are the reference"


def test_a_py_beside_the_notebook_is_graded_and_the_notebook_named(tmp_path):
    (tmp_path / f"{EX}.py").write_text(SOLUTION)
    (tmp_path / EX).mkdir()
    (tmp_path / EX / f"{EX}.ipynb").write_bytes(b"not even json")  # never read as a module: the .py wins
    text, notes = staged(tmp_path)
    assert text == SOLUTION
    assert any(f"graded {EX}.py" in n and f"{EX}/{EX}.ipynb" in n and "a .py is graded before a notebook" in n
               for n in notes), notes


def test_a_notebook_that_defines_some_of_the_contract_is_graded_with_a_warning(tmp_path):
    (tmp_path / f"{EX}.ipynb").write_bytes(notebook(code("def merge_states(m_a, l_a, m_b, l_b):\n    return m_a, l_a")))
    text, notes = staged(tmp_path)
    assert "def merge_states" in text
    assert any("does not define online_normalizer, online_softmax, softmax_triton" in n for n in notes), notes
    assert any("graded the code cells of online_softmax.ipynb as online_softmax.py" in n for n in notes), notes


@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_a_notebook_in_an_archive_is_found(tmp_path, kind):
    data = notebook(*reference_cells())
    member = f"alice/exercises/{EX}/{EX}.ipynb" if kind == "zip" else f"{EX}.ipynb"
    archive = tmp_path / f"sub.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(archive, "w") as zf:
            zf.writestr(member, data)
            zf.writestr("alice/README.txt", "hello")
    else:
        with tarfile.open(archive, "w:gz") as tf:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    text, notes = staged(archive)
    assert text == build_module(data, f"{EX}.ipynb", contract_names(STUB))[0]
    assert any("graded the code cells" in n for n in notes), notes


# ---------------------------------------------------------------------------------------------
# Refusals: each names what was expected and where


@pytest.mark.parametrize("data, message", [
    (b"[1, 2]", "expected a Jupyter notebook (a JSON object with a list of 'cells' and 'nbformat': 4), found a JSON list"),
    (b"def online_softmax(x): pass", "found text that is not JSON"),
    (b'{"metadata": {}}', "found a JSON object with keys 'metadata'"),
    (b'{"worksheets": [], "nbformat": 3}', "found an nbformat 3 notebook"),
    (json.dumps({"nbformat": 4, "cells": [{"source": "x"}]}).encode(), "found cell 1 as a JSON object with keys "
                                                                       "'source' (no 'cell_type')"),
])
def test_not_a_notebook(tmp_path, data, message):
    got = refusal(tmp_path, data)
    assert f"'{EX}.ipynb' in the submission (the notebook for {EX})" in got and message in got and "refused" in got


def test_no_code_cell_defines_the_contract(tmp_path):
    got = refusal(tmp_path, notebook(markdown("my answer"), code("import torch\nx = torch.ones(3)"),
                                     code("def online_softmax(x):\n    return x", tags=["scratch"])))
    assert ("no code cell defines the contract: expected top-level definitions of merge_states, online_normalizer, "
            "online_softmax, softmax_triton, found none of them in 1 graded code cell(s) (1 scratch cell(s) "
            "left out)") in got, got


def test_a_syntax_error_names_the_cell_and_its_line(tmp_path):
    cells = reference_cells()
    cells.insert(2, code("def helper(x):\n    return x +\n"))
    got = refusal(tmp_path, notebook(markdown("intro"), *cells))
    assert "cell 4 (code cell 3, starting 'def helper(x):'), line 2: syntax error: invalid syntax" in got, got


@pytest.mark.parametrize("line, shown", [("!pip install triton", "'!pip install triton'"),
                                         ("%timeit online_softmax(x)", "'%timeit online_softmax(x)'"),
                                         ("%%time", "'%%time'"),
                                         ("%matplotlib inline", "'%matplotlib inline'"),
                                         ("get_ipython().system('ls')", "\"get_ipython().system('ls')\"")])
def test_a_shell_or_magic_line_names_the_cell(tmp_path, line, shown):
    cells = reference_cells()
    cells.insert(1, code(f"import math\n{line}\nx = 1"))
    got = refusal(tmp_path, notebook(*cells))
    assert f"cell 2 (code cell 2, starting 'import math'), line 2: a shell or magic line ({shown})" in got, got
    assert "mark the cell as scratch (tag it 'scratch', or make its first line '# scratch')" in got


def test_a_late_future_import_names_its_cell(tmp_path):
    n = len(reference_cells()) + 1
    got = refusal(tmp_path, notebook(*reference_cells(), code("from __future__ import annotations")))
    assert f"cell {n} (code cell {n}, starting 'from __future__ import annotations'), line 1: a 'from __future__' import" \
           in got, got


def test_a_refused_notebook_is_the_grade_s_unreadable_submission(tmp_path):
    (tmp_path / f"{EX}.ipynb").write_bytes(notebook(*reference_cells(), code("!nvidia-smi")))
    result = grade_folder(tmp_path, [EX])
    assert result["gradable"] is False
    message = result["exercises"][0]["message"]
    assert message.startswith("the submission could not be read: ") and "'!nvidia-smi'" in message, message


# ---------------------------------------------------------------------------------------------
# The student's side, and the round trip through a real grade


def test_grader_notebook_writes_a_valid_starter_and_refuses_to_overwrite(course_copy):
    run = grader_cli(course_copy, "notebook", EX)
    assert run.returncode == 0, run.stdout + run.stderr
    path = course_copy / "exercises" / EX / f"{EX}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    kinds = [c.cell_type for c in nb.cells]
    assert kinds[:2] == ["markdown", "markdown"] and "## The contract" in nb.cells[1].source
    assert "| `merge_states(m_a, l_a, m_b, l_b) -> (m, l)` |" in nb.cells[1].source
    codes = [c.source for c in nb.cells if c.cell_type == "code"]
    assert [c.splitlines()[0] for c in codes[1:5]] == ["def merge_states(", "def online_normalizer(chunks: "
                                                       "Iterable[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:",
                                                       "def online_softmax(x: torch.Tensor, block_size: int = 1024) "
                                                       "-> torch.Tensor:", "# A Triton kernel is a function decorated "
                                                       "with @triton.jit; write yours here. One program per row"]
    assert nb.cells[-1].metadata.get("tags") == ["scratch"]
    source, _ = build_module(path.read_bytes(), path.name, contract_names(STUB))  # the stub, as a notebook, builds
    import ast

    assert ast.dump(ast.parse(source)) == ast.dump(ast.parse(STUB))
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask, (
        f"the notebook must get a plain file's mode, found {path.stat().st_mode & 0o777:o} (the temporary file's 600?)")
    assert "as it is now" in run.stdout, "the message must say the cells hold the file as it is, not the stub"

    path.write_text("my work")
    again = grader_cli(course_copy, "notebook", EX)
    assert again.returncode == 2 and f"exercises/{EX}/{EX}.ipynb exists already" in again.stderr + again.stdout
    assert "--force" in again.stderr + again.stdout and path.read_text() == "my work"
    forced = grader_cli(course_copy, "notebook", EX, "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert nbformat.read(path, as_version=4).cells[0].source == nb.cells[0].source


def test_the_starter_filled_with_the_reference_grades_as_the_py(course_copy, tmp_path):
    assert grader_cli(course_copy, "notebook", EX).returncode == 0
    nb = nbformat.read(course_copy / "exercises" / EX / f"{EX}.ipynb", as_version=4)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    scratch = [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("tags") == ["scratch"]]
    scratch[0].source = "# scratch\n!pip install numpy\n%timeit online_softmax(torch.randn(4, 8))"
    nb.cells = (nb.cells[:first] + [nbformat.v4.new_code_cell(c) for c in stub_cells(SOLUTION)] + scratch
                + [nbformat.v4.new_code_cell("%%time\nraise SystemExit", metadata={"tags": ["scratch"]})])
    as_notebook = tmp_path / "notebook"
    as_notebook.mkdir()
    nbformat.write(nb, str(as_notebook / f"{EX}.ipynb"))
    as_file = tmp_path / "file"
    as_file.mkdir()
    (as_file / f"{EX}.py").write_text(SOLUTION)

    graded = grade_folder(as_notebook, [EX], checks=CHECKS)
    reference = grade_folder(as_file, [EX], checks=CHECKS)
    assert graded["gradable"] is True, graded.get("format_errors")
    assert any("graded the code cells" in w for w in graded["warnings"]), graded["warnings"]
    got, want = checks_of(graded, EX), checks_of(reference, EX)
    for check in CHECKS:
        assert got[check]["status"] == want[check]["status"] == "passed", got[check]
        assert got[check]["points"] == want[check]["points"] > 0
    assert graded["exercises"][0]["score"] == reference["exercises"][0]["score"]
