"""The ``gpu``-marked tests kept in step with the code they test, on a machine without a GPU.

Those tests are skipped everywhere but ``make gpu-check``, so a key, function or argument they use could vanish from
the library unnoticed until the next GPU run (it did: ``compare_precisions`` stopped returning ``peak_what``). Two
checks catch that on every CPU:

* the stand-in run: pytest runs each file of ``gpu`` tests with ``COURSE_GPU_STAND_IN=1``, where the ``cuda``
  fixture yields the CPU and each test runs until its first ``cuda_only(...)`` step, which skips the rest;
* the static check: every name those tests import exists, every attribute they read from a module or class exists,
  and every function or class they call accepts the number of positional arguments and the keywords they pass.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU_TEST_FILES = sorted(p for p in (REPO / "tests").glob("test_*.py")
                        if p.name != Path(__file__).name and "pytest.mark.gpu" in p.read_text(encoding="utf-8"))
STAND_IN_SKIP = "CPU stand-in run: the rest needs CUDA itself"  # the prefix of test_gpu_paths.cuda_only's skips


def test_there_are_gpu_tests_to_keep_in_step() -> None:
    assert REPO / "tests" / "test_gpu_paths.py" in GPU_TEST_FILES


# ------------------------------------------------------------------------------------------------ the stand-in run
def stand_in_run(files: list[Path], tmp_path: Path) -> dict[str, str]:
    """Run ``files`` under pytest with ``COURSE_GPU_STAND_IN=1``; ``{test id: problem}`` for each test that failed,
    errored, or skipped for any reason but a ``cuda_only`` step (such a test checked nothing here)."""
    report = tmp_path / "stand-in.xml"
    # --noconftest: tests/conftest.py skips gpu tests where CUDA is missing; the environment it sets is set here.
    env = {**os.environ, "COURSE_GPU_STAND_IN": "1", "COURSE_MODE": "smoke", "MPLBACKEND": "Agg",
           "COURSE_DATA_DIR": str(REPO / ".cache" / "data"), "CUDA_VISIBLE_DEVICES": "",
           "COURSE_PROGRESS_FILE": str(tmp_path / "progress.json")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:nbval", "-o",
                           "addopts=", "--noconftest", "-q", "-m", "gpu", f"--junitxml={report}", *map(str, files)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    if not report.exists():
        pytest.fail(f"the stand-in run wrote no report (exit code {proc.returncode}):\n{proc.stdout[-3000:]}"
                    f"\n{proc.stderr[-3000:]}")
    problems: dict[str, str] = {}
    cases = ET.parse(report).getroot().iter("testcase")
    for case in cases:
        test = f"{case.get('classname')}::{case.get('name')}"
        for outcome in ("failure", "error", "skipped"):
            found = case.find(outcome)
            if found is None:
                continue
            message = found.get("message") or ""
            if outcome == "skipped" and STAND_IN_SKIP in message:
                continue
            problems[test] = f"{outcome}: {message[:600]}"
    if proc.returncode not in (0, 1):  # 1: tests failed (listed above); anything else: pytest itself failed
        problems["pytest"] = f"exit code {proc.returncode}: {proc.stdout[-2000:]}"
    return problems


@pytest.mark.slow
def test_every_gpu_test_runs_on_a_cpu_stand_in_up_to_its_cuda_only_step(tmp_path: Path) -> None:
    problems = stand_in_run(GPU_TEST_FILES, tmp_path)
    assert not problems, (
        "On the CPU stand-in (the `cuda` fixture yields the CPU) these gpu tests failed before reaching a CUDA-only "
        "step; fix the test or the code it calls, or mark where it starts to need CUDA with cuda_only(device, "
        "'why'):\n" + "\n".join(f"  {test}: {why}" for test, why in problems.items()))


# ------------------------------------------------------------------------------------------------ the static check
_UNKNOWN = object()  # an expression whose object only exists at run time (a local, an instance's attribute)


def _load(path: Path) -> ModuleType:
    """The test file as a module of its own (never the one pytest collected), for the names it defines."""
    spec = importlib.util.spec_from_file_location(f"_in_step_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _imported(node: ast.Import | ast.ImportFrom) -> tuple[dict[str, Any], list[str]]:
    """The names an import statement binds, and what it could not import."""
    names: dict[str, Any] = {}
    problems: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            try:
                module = importlib.import_module(alias.name)
            except ImportError as exc:
                problems.append(f"line {node.lineno}: import {alias.name}: {exc}")
                continue
            names[alias.asname] = module if alias.asname else importlib.import_module(alias.name.split(".")[0])
        return names, problems
    try:
        module = importlib.import_module(node.module or "")
    except ImportError as exc:
        return names, [f"line {node.lineno}: from {node.module} import ...: {exc}"]
    for alias in node.names:
        try:
            names[alias.asname or alias.name] = getattr(module, alias.name)
        except AttributeError:
            try:  # a submodule not yet imported
                names[alias.asname or alias.name] = importlib.import_module(f"{node.module}.{alias.name}")
            except ImportError:
                problems.append(f"line {node.lineno}: {node.module} has no {alias.name}")
    return names, problems


def _resolve(node: ast.expr, names: dict[str, Any]) -> tuple[Any, str | None]:
    """The object ``node`` (``name`` or ``name.attr.attr``) stands for, through modules and classes only, and a
    problem when one of those attributes does not exist."""
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in names:
        return _UNKNOWN, None
    obj, dotted = names[node.id], node.id
    for attr in reversed(chain):
        if not (inspect.ismodule(obj) or inspect.isclass(obj)):
            return _UNKNOWN, None  # an instance's attributes are facts of run time
        if not hasattr(obj, attr):
            return _UNKNOWN, f"{dotted}.{attr} does not exist"
        obj, dotted = getattr(obj, attr), f"{dotted}.{attr}"
    return obj, None


def _bound_locally(function: ast.FunctionDef | ast.Lambda) -> set[str]:
    """Names a function binds itself (arguments, assignments, loop and with targets), which hide module names."""
    bound = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.Lambda)) and node is not function:
            bound |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    return bound


def static_problems(path: Path) -> list[str]:
    """What in ``path``'s functions names something that does not exist, or calls it with arguments it refuses."""
    module = _load(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    problems: list[str] = []
    for node in tree.body:  # module-level imports are checked by _load already; a vanished name fails it
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            problems += _imported(node)[1]
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    for function in functions:
        names = {k: v for k, v in vars(module).items() if k not in _bound_locally(function)}
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bound, missing = _imported(node)
                names.update(bound)
                problems += missing
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                _, problem = _resolve(node, names)
                if problem:
                    problems.append(f"line {node.lineno}: {problem}")
            if not isinstance(node, ast.Call):
                continue
            target, _ = _resolve(node.func, names)
            unpacked = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
            if target is _UNKNOWN or unpacked or not callable(target):
                continue
            try:
                signature = inspect.signature(target)
            except (TypeError, ValueError):  # a builtin without a signature
                continue
            try:
                signature.bind_partial(*node.args, **{k.arg: k.value for k in node.keywords})
            except TypeError as exc:
                problems.append(f"line {node.lineno}: {ast.unparse(node.func)}(...): {exc}")
    return sorted(set(problems), key=lambda p: int(p.split(":")[0].split()[1]))


@pytest.mark.parametrize("path", GPU_TEST_FILES, ids=lambda p: p.name)
def test_every_name_a_gpu_test_uses_exists_and_takes_the_arguments_it_is_given(path: Path) -> None:
    problems = static_problems(path)
    assert not problems, f"{path.name} uses what the code no longer has:\n" + "\n".join(f"  {p}" for p in problems)
