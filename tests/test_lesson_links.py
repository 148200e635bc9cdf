"""Lessons and library point at each other: each lesson names the course_lib files it uses, and each course_lib
function or class a lesson uses names, in its docstring, the first lesson that uses it."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# Course machinery every lesson uses (the set-up cell, predict/explain, smoke/full sizes): not what a lesson teaches.
MACHINERY = {"course_lib/bootstrap.py", "course_lib/lesson.py", "course_lib/mode.py"}
HEADER = re.compile(r"^\*\*Library code:\*\*(.*)$", re.M)


def _imported(tree: ast.AST) -> tuple[dict[str, object], dict[str, object]]:
    names: dict[str, object] = {}
    modules: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("course_lib"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                obj = getattr(module, alias.name, None)
                if obj is None:
                    obj = importlib.import_module(f"{node.module}.{alias.name}")
                (modules if inspect.ismodule(obj) else names)[alias.asname or alias.name] = obj
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("course_lib"):
                    modules[alias.asname or alias.name] = importlib.import_module(alias.name)
    return names, modules


def lesson_uses(path: Path) -> dict[str, tuple[object, str]]:
    """``{qualified name: (object, file)}`` for every course_lib function or class the lesson's code uses."""
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code" and not c.source.startswith("%%"))
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    tree = ast.parse(code)
    names, modules = _imported(tree)
    candidates = list(names.values()) + [
        getattr(modules[n.value.id], n.attr, None)
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules
    ]
    used: dict[str, tuple[object, str]] = {}
    for obj in candidates:
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        source = inspect.getsourcefile(obj) or ""
        if "course_lib" in source:
            rel = Path(source).resolve().relative_to(ROOT).as_posix()
            used[f"{obj.__module__}.{obj.__qualname__}"] = (obj, rel)
    return used


USES = {path.name: lesson_uses(path) for path in LESSONS}


@pytest.mark.parametrize("name", list(USES))
def test_each_lesson_header_names_the_library_files_it_uses(name: str) -> None:
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    header = nb.cells[0].source
    match = HEADER.search(header)
    expected = sorted({f for _, f in USES[name].values() if f not in MACHINERY})
    assert match, f"{name}: the first cell needs a line '**Library code:** ...' naming {expected}"
    named = sorted(re.findall(r"`(course_lib/[^`]+\.py)`", match.group(1)))
    assert named == expected, f"{name}: the header names {named}, the lesson's code uses {expected}"
    for path in named:
        assert (ROOT / path).is_file(), f"{name}: {path} does not exist"


def test_every_library_object_a_lesson_uses_names_its_first_lesson() -> None:
    first: dict[str, tuple[object, str]] = {}
    for name, uses in USES.items():
        for qualname, (obj, path) in uses.items():
            if path not in MACHINERY:
                first.setdefault(qualname, (obj, name))
    stale = [
        f"{qualname}: its docstring should say 'Taught in lesson {lesson[:2]} (``notebooks/{lesson}``).'"
        for qualname, (obj, lesson) in first.items()
        if not re.search(rf"\blesson {lesson[:2]}\b", inspect.getdoc(obj) or "", re.I)
    ]
    assert not stale, "\n".join(stale)
    assert len(first) > 50  # the scan found the lessons' imports (a broken scan must not pass vacuously)
