"""Shared test set-up: every test runs in smoke mode against a data cache inside the repository."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Set before anything imports course_lib, so every module and every notebook kernel started by nbval sees it.
os.environ.setdefault("COURSE_MODE", "smoke")
os.environ.setdefault("COURSE_DATA_DIR", str(REPO / ".cache" / "data"))
os.environ.setdefault("MPLBACKEND", "Agg")


import pytest  # noqa: E402 - after the environment is set

# Every test in these files starts notebooks, kernels or sandboxed grader processes: ``slow``, so that
# ``make test-fast`` (``-m "not slow ..."``) keeps the library's own tests for the inner loop; ``make test`` runs all.
SLOW_FILES = {"test_site.py", "test_exercise_validity.py", "test_grading.py", "test_grading_hostile.py",
              "test_grading_variants.py", "test_magics.py", "test_resume_harness.py"}


def _is_slow_file(path: Path) -> bool:
    return path.name in SLOW_FILES or path.name.startswith("test_variants_") or path.suffix == ".ipynb"


# How the two test processes share the work (``make test``: ``--dist loadgroup --no-loadscope-reorder``). A file's
# tests stay together in one process, in order (its module fixtures are built once; a notebook's cells run in
# sequence), except in SPLIT_FILES, which share no expensive fixture and are dealt out test by test, and the lessons
# of test_site.py, each a unit of its own (tests/test_site.py: execute_once). The longest units start first
# (FIRST, measured on a quiet 2-core machine), the site built from the lessons last, so both processes end together.
SPLIT_FILES = {"test_grading_variants.py", "test_grading.py"}
FIRST = ("tests/test_site.py::test_lesson_runs[04", "tests/test_site.py::test_lesson_runs[09",
         "tests/test_browser.py", "tests/test_exercise_validity.py", "solutions/01_", "tests/test_site.py::test_lesson",
         "tests/test_grading.py", "tests/test_train.py", "tests/test_bootstrap.py", "tests/test_gpu_check.py",
         "tests/test_grading_hostile.py", "tests/test_magics.py", "tests/test_run_safety.py")
LAST = ("tests/test_site.py",)


def _group(item: pytest.Item) -> str | None:
    path = Path(str(item.fspath))
    if path.name in SPLIT_FILES or item.nodeid.startswith("tests/test_site.py::test_lesson_runs"):
        return None
    return item.nodeid.split("::")[0]


def _rank(item: pytest.Item) -> int:
    for index, prefix in enumerate(FIRST):
        if item.nodeid.startswith(prefix):
            return index
    return len(FIRST) + (1 if item.nodeid.startswith(LAST) else 0)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests in SLOW_FILES are marked ``slow``; every test gets its xdist group and the order the processes take
    them in. Tests marked ``gpu`` are skipped, with the reason, where no CUDA GPU is visible (they run in
    gpu-check)."""
    for item in items:
        if _is_slow_file(Path(str(item.fspath))):
            item.add_marker(pytest.mark.slow)
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_rank)  # stable: a file's tests keep their order
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False here); "
                                   "`make gpu-check` runs it on a GPU machine")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def one_thread():
    """One intra-op thread: on a small shared CPU, two OpenMP threads contend and tiny ops get many times slower."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
