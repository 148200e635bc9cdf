"""Imports in ``course_lib`` point downward and never go round in a circle.

The test reads every module's source (no import is executed), collects every ``import`` of a ``course_lib``
module -- including the ones inside functions, which are dependencies all the same -- and checks the graph:

* no cycle between modules;
* no module imports a part that sits in a higher layer than its own (same layer is fine).

``LAYERS`` is the one statement of the order, lowest first; docs/architecture.md shows the same list.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "course_lib"

# Lowest layer first. A part is a top-level module or package of course_lib.
LAYERS: list[set[str]] = [
    # foundation: reads the environment and the machine, writes files whole
    {"mode", "argparsing", "device_audit", "device", "nbclean", "nbrun", "labsettings", "progress", "atomic", "clock",
     "interrupts", "heartbeat", "journal"},
    {"data", "models", "distributed", "parallel"},  # what is trained, on what, across how many processes
    {"train"},  # the training template
    {"perf"},  # measuring instruments (they may time train's pieces)
    # what lessons, graders and commands use
    {"lesson", "widgets", "grading", "ddp_demo", "magics", "torchrun_entry", "doctor", "gpu_check", "bootstrap",
     "lab_auth", "lab", "labcontents", "room"},
    {"website", "cli", "__main__", "__init__"},  # entry points
]

# Upward imports being removed; each entry is (importer, imported) as dotted module names.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module and package of course_lib."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(path: Path, module: str) -> set[str]:
    """Every dotted name ``module`` imports (``from a import b`` gives ``a.b``: b may be a submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return {n for n in names if n == "course_lib" or n.startswith("course_lib.")}


@functools.cache  # the tree does not change during a test run; parse it once
def import_graph() -> dict[str, set[str]]:
    """Module -> the course_lib modules it imports (a name is resolved to the deepest module that exists)."""
    modules = module_files()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for name in imported_names(path, module):
            while name not in modules:
                name = name.rpartition(".")[0]
            # A submodule's import runs its package's __init__ first; that is not a dependency on the package.
            if name != module and not module.startswith(name + "."):
                graph[module].add(name)
    return dict(graph)


def layer_of(module: str) -> int:
    """Index in LAYERS of the part ``module`` belongs to."""
    parts = module.split(".")
    part = parts[1] if len(parts) > 1 else "__init__"
    for index, layer in enumerate(LAYERS):
        if part in layer:
            return index
    raise AssertionError(f"{module}: its part {part!r} is in no layer; add it to LAYERS (and docs/architecture.md)")


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected group, found by depth-first search."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """``(importer, imported)`` pairs where the imported module sits in a higher layer."""
    return {(a, b) for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a)}


def test_every_part_has_a_layer() -> None:
    for module in module_files():
        layer_of(module)


def test_no_import_cycle() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_imports_point_downward() -> None:
    upward = upward_imports(import_graph())
    new = sorted(upward - KNOWN_UPWARD)
    assert not new, "imports from a lower layer to a higher one (see LAYERS): " + ", ".join(
        f"{a} -> {b}" for a, b in new)
    gone = sorted(KNOWN_UPWARD - upward)
    assert not gone, f"KNOWN_UPWARD lists imports that no longer exist; remove them: {gone}"


def test_the_scan_sees_what_it_must() -> None:
    """The checks above fail on a planted cycle and a planted upward import (they are not vacuous)."""
    graph = {"course_lib.data.a": {"course_lib.data.b"}, "course_lib.data.b": {"course_lib.data.a"}}
    assert find_cycles(graph) == [["course_lib.data.a", "course_lib.data.b", "course_lib.data.a"]]
    assert upward_imports({"course_lib.data.a": {"course_lib.train.loop"}}) == {
        ("course_lib.data.a", "course_lib.train.loop")}
    real = import_graph()
    assert "course_lib.train.optim" in real["course_lib.train.loop"]  # a known import is found
    assert "course_lib.train.launch" in real["course_lib.train"]  # ... including one inside a function


@pytest.mark.parametrize("doc", ["docs/architecture.md"])
def test_architecture_doc_states_the_same_layers(doc: str) -> None:
    """The doc's layer line lists the parts of each layer in the order of LAYERS."""
    text = (ROOT.parent / doc).read_text(encoding="utf-8")
    line = next((ln for ln in text.splitlines() if ln.startswith("Layers (lowest first):")), None)
    assert line is not None, f"{doc} has no 'Layers (lowest first):' line"
    stated = [{p.strip(" `.") for p in group.split(",")} for group in line.split(":", 1)[1].split("<")]
    assert stated == LAYERS, f"{doc}'s layer line differs from LAYERS in tests/test_layering.py"


# ------------------------------------------------------------------------------------ docs/architecture.md's names
DOC = ROOT.parent / "docs" / "architecture.md"


def _file_table(text: str) -> dict[str, str]:
    """The rows of the doc's "Where each file sits" table: first cell -> the whole row."""
    rows = {}
    for line in text.split("## Where each file sits", 1)[1].splitlines():
        cells = line.split("|")
        if line.startswith("| `course_lib/") and len(cells) > 2:
            rows[cells[1].strip()] = line
    return rows


def _named_files(row_text: str) -> set[str]:
    """File and folder names a table row quotes: ``shapes.py``, ``checks/exNN_*.py``, ``lab_auth/``."""
    return set(re.findall(r"`((?:[\w*]+/)*[\w*]+\.py|\w+/)`", row_text))


def _as_glob(name: str) -> str:
    return name.replace("NN", "[0-9][0-9]")


def doc_module_names(text: str) -> tuple[set[str], list[str]]:
    """(modules of course_lib the doc names, names in the doc that match no module or folder)."""
    modules = set(module_files())
    named: set[str] = set()
    missing: list[str] = []
    for dotted in set(re.findall(r"\bcourse_lib(?:\.\w+)+", text)):
        module = dotted
        while module not in modules and "." in module:
            module = module.rpartition(".")[0]
        attribute = dotted[len(module) + 1:]
        source = module_files()[module].read_text(encoding="utf-8")
        if attribute and not re.search(rf"\b{re.escape(attribute.split('.')[0])}\b", source):
            missing.append(dotted)
        named.add(module)
    for first, row in _file_table(text).items():
        folders = [f for f in re.findall(r"`(course_lib/[\w/]*)`", first) if f.endswith("/")]
        base = ROOT.parent / (folders[0] if folders else "course_lib/")
        for name in _named_files(row):
            name = name.removeprefix("course_lib/").rstrip("/")
            matches: list[Path] = []
            # ``perf/compile.py`` in the train row is relative to course_lib/; ``checks/exNN_*.py`` to the row's folder
            for folder in [base, ROOT] if "/" in name else [base]:
                matches = matches or sorted(p for p in folder.glob(_as_glob(name)) if "__pycache__" not in p.parts)
            if not matches:
                missing.append(f"{base.relative_to(ROOT.parent)}/{name}")
            for path in matches:
                files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
                for file in files:
                    parts = list(file.relative_to(ROOT.parent).with_suffix("").parts)
                    named.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        if folders:
            named.add(folders[0].strip("/").replace("/", "."))
    return named, sorted(missing)


def test_architecture_doc_names_every_module_and_only_modules_that_exist() -> None:
    """Every module of course_lib is named in docs/architecture.md (as ``course_lib.x`` or in the file table), and
    every module, file or attribute the doc names exists: the doc cannot drift from the tree unnoticed."""
    named, missing = doc_module_names(DOC.read_text(encoding="utf-8"))
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"
    # A package's __init__ and __main__ are named by the package; entry points by the layer line.
    unnamed = sorted(m for m in module_files() if m not in named and not m.endswith(".__main__")
                     and m != "course_lib")
    assert not unnamed, f"docs/architecture.md does not name these modules (add them to its file table): {unnamed}"


def test_the_doc_check_sees_what_it_must() -> None:
    """The name check fails on a planted unknown module and attribute, and counts a folder row's files."""
    named, missing = doc_module_names(
        "`course_lib.nowhere` `course_lib.mode.no_such_function` `course_lib.mode.by_mode`\n"
        "## Where each file sits\n| `course_lib/train/` | `loss.py`, `gone.py`, `checks/exNN_*.py` |\n")
    assert set(missing) == {"course_lib.nowhere", "course_lib.mode.no_such_function", "course_lib/train/gone.py",
                            "course_lib/train/checks/exNN_*.py"}
    assert {"course_lib.mode", "course_lib.train.loss", "course_lib.train"} <= named
    assert "course_lib.train.loop" not in named
