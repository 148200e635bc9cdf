"""Shared test set-up: every test runs in smoke mode against a data cache inside the repository."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Set before anything imports course_lib, so every module and every notebook kernel started by nbval sees it.
os.environ.setdefault("COURSE_MODE", "smoke")
os.environ.setdefault("COURSE_DATA_DIR", str(REPO / ".cache" / "data"))
os.environ.setdefault("MPLBACKEND", "Agg")
# A learner's progress journal is never touched by tests (unattended runs record nothing; this is the second guard).
# Every notebook kernel the tests start (lessons, solutions through nbval) runs with the device audit
# (course_lib/device_audit.py): a model or a batch that a notebook forgot to move fails here as it fails on a GPU.
# Tests that run in this process do not (the fixture `_no_device_audit_in_process` below).
os.environ.setdefault("COURSE_DEVICE_AUDIT", "1")
os.environ.setdefault("COURSE_PROGRESS_FILE", os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                           f"course-progress-tests-{os.getpid()}.json"))


import pytest  # noqa: E402 - after the environment is set

# Every test in these files starts notebooks, kernels or sandboxed grader processes: ``slow``, so that
# ``make test-fast`` (``-m "not slow ..."``) keeps the library's own tests for the inner loop; ``make test`` runs all.
SLOW_FILES = {"test_site.py", "test_lessons.py", "test_exercise_validity.py", "test_grading.py",
              "test_grading_hostile.py", "test_grading_variants.py", "test_magics.py", "test_resume_harness.py"}


def _is_slow_file(path: Path) -> bool:
    return path.name in SLOW_FILES or path.name.startswith("test_variants_") or path.suffix == ".ipynb"


# The order in which the two test processes take the files (``make test``: ``--dist loadfile --no-loadscope-reorder``;
# a file's tests stay together, in order). The longest files start first (measured on a quiet 2-core machine), so both
# processes end together: the lessons (first to last) in one process and the site (whose fixture executes the lessons
# last to first) in the other split the lessons between them (tests/test_lessons.py: execute_once).
FIRST = ("tests/test_lessons.py", "tests/test_site.py", "tests/test_browser.py", "tests/test_exercise_validity.py",
         "tests/test_grading_variants.py", "solutions/01_", "tests/test_grading.py", "tests/test_train.py",
         "tests/test_bootstrap.py", "tests/test_gpu_check.py", "tests/test_grading_hostile.py", "tests/test_magics.py",
         "tests/test_run_safety.py")


def _rank(item: pytest.Item) -> int:
    return next((index for index, prefix in enumerate(FIRST) if item.nodeid.startswith(prefix)), len(FIRST))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests in SLOW_FILES are marked ``slow``; the files are put in the order the test processes take them (FIRST).
    Tests marked ``gpu`` are skipped, with the reason, where no CUDA GPU is visible (they run in gpu-check)."""
    for item in items:
        if _is_slow_file(Path(str(item.fspath))):
            item.add_marker(pytest.mark.slow)
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


@pytest.fixture(autouse=True)
def _no_device_audit_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Library tests call ``pick_device()`` as any user does, and what they start inherits their environment: the
    audit is for notebook kernels (above), and ``tests/test_device_audit.py`` turns it on where it tests it."""
    monkeypatch.delenv("COURSE_DEVICE_AUDIT", raising=False)
