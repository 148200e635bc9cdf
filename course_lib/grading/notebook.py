"""Reading exercise notebooks: tags, solution regions, and the code a grader may run.

Notebooks are read as plain JSON (nbformat 4) so a grader never needs a kernel and a broken
file is a clear :class:`NotebookError`, not a crash.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION:[ \t]*(?P<what>.*?)[ \t]*$")
END = re.compile(r"^[ \t]*### END SOLUTION[ \t]*$")
NOTEBOOK_NAME = re.compile(r"^(?P<number>\d\d)_(?P<topic>[A-Za-z0-9_]+)\.ipynb$")
GRADED_TAGS = ("setup", "exercise")


class NotebookError(ValueError):
    """A notebook that cannot be read or whose solution regions are malformed (``hint``: what the learner can do)."""

    def __init__(self, message: str, hint: str = "open the notebook in Jupyter and save it again") -> None:
        super().__init__(message)
        self.hint = hint


# Jupyter cannot open a file that is not JSON either, so "save it again from Jupyter" is advice nobody can follow.
_RESTORE = ("hand it in again from a copy that opens in Jupyter (File > Download), or restore it from the "
            ".ipynb_checkpoints folder beside it")


def exercise_number(path: Path) -> str:
    """``solutions/05_accumulation.ipynb`` -> ``"05"``."""
    match = NOTEBOOK_NAME.match(Path(path).name)
    if not match:
        raise NotebookError(f"{path}: exercise notebooks are named NN_topic.ipynb (e.g. 05_accumulation.ipynb)")
    return match["number"]


def read(path: Path) -> dict[str, Any]:
    """Load a notebook's JSON, with a message that says what is broken."""
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotebookError(f"{path}: notebook not found") from None
    except UnicodeDecodeError as exc:
        raise NotebookError(f"{path}: not a valid notebook file (not UTF-8 text: byte {exc.start}); Jupyter cannot "
                            "open it either", _RESTORE) from None
    except json.JSONDecodeError as exc:
        if exc.pos >= len(exc.doc.rstrip()):
            raise NotebookError(f"{path}: not a valid notebook file: it is cut short ({len(exc.doc)} characters, "
                                "it ends in the middle of the notebook); Jupyter cannot open it either",
                                _RESTORE) from None
        raise NotebookError(f"{path}: not a valid notebook file (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                            "Jupyter cannot open it either", _RESTORE) from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError(f"{path}: not a notebook (valid JSON without a list of cells)", _RESTORE)
    return nb


def source(cell: dict[str, Any]) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else str(text)


def tags(cell: dict[str, Any]) -> list[str]:
    meta = cell.get("metadata") or {}
    found = meta.get("tags") or []
    return [str(t) for t in found] if isinstance(found, list) else []


def replace_regions(code: str, number: str, start: int, where: str = "cell") -> tuple[str, int]:
    """Replace each solution region of ``code`` by a numbered ``NotImplementedError`` stub.

    Returns the new code and how many regions were replaced; regions are numbered from ``start``.
    """
    out: list[str] = []
    inside: re.Match[str] | None = None
    count = 0
    for lineno, line in enumerate(code.split("\n"), 1):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise NotebookError(f"{where}, line {lineno}: BEGIN SOLUTION inside another region")
            if not begin["what"]:
                raise NotebookError(f"{where}, line {lineno}: say what to do after `### BEGIN SOLUTION:`")
            inside = begin
            continue
        if END.match(line):
            if not inside:
                raise NotebookError(f"{where}, line {lineno}: END SOLUTION without BEGIN SOLUTION")
            label = f"Exercise {number}.{start + count}: {inside['what']}"
            out.append(f"{inside['indent']}raise NotImplementedError({json.dumps(label, ensure_ascii=False)})")
            count += 1
            inside = None
            continue
        if not inside:
            out.append(line)
    if inside:
        raise NotebookError(f"{where}: BEGIN SOLUTION ({inside['what']!r}) is never closed by ### END SOLUTION")
    return "\n".join(out), count


def _python(code: str) -> str:
    """``%magic`` and ``!shell`` lines become ``pass`` (same line numbers in error messages)."""
    lines = []
    for line in code.split("\n"):
        stripped = line.lstrip()
        lines.append(line[: len(line) - len(stripped)] + "pass" if stripped[:1] in ("%", "!") else line)
    return "\n".join(lines)


_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
                ast.AnnAssign)


def _only_definitions(code: str) -> bool:
    """A cell of imports, functions, classes and plain assignments only (no loops, no calls, no prints)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    body = [n for n in tree.body if not (isinstance(n, (ast.Expr, ast.Pass)) and (
        isinstance(n, ast.Pass) or isinstance(n.value, ast.Constant)))]
    # An assignment that calls something (``history = run(cfg)``) may be long work: not a definition.
    return bool(body) and all(isinstance(n, _DEFINITIONS) and not (
        isinstance(n, (ast.Assign, ast.AnnAssign)) and any(isinstance(c, ast.Call) for c in ast.walk(n)))
        for n in body)


def graded_cells(nb: dict[str, Any]) -> list[tuple[int, str, list[str]]]:
    """``[(cell index, python source, tags)]`` the grader runs, in the order it runs them.

    The cells tagged ``setup`` first, then those tagged ``exercise``, each group in notebook order (so a
    learner who moved a cell, or duplicated one, still gets the same names). An untagged code cell that only
    *defines* things (imports, functions, classes, assignments without calls) runs too, in its place among the exercise
    cells: a learner who split an exercise cell, or whose editor dropped the tags, is graded all the same.
    """
    setup, rest = [], []
    for index, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        cell_tags = tags(cell)
        code = _python(source(cell))
        if "setup" in cell_tags:
            setup.append((index, code, cell_tags))
        elif "exercise" in cell_tags or ("check" not in cell_tags and _only_definitions(code)):
            rest.append((index, code, cell_tags))
    return setup + rest


def graded_code(nb: dict[str, Any]) -> list[tuple[int, str]]:
    """``[(cell index, python source)]`` of :func:`graded_cells`."""
    return [(index, code) for index, code, _ in graded_cells(nb)]
