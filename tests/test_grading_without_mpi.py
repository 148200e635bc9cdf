"""Grading where ``mpi4py`` is installed: the judging process never starts MPI.

Lightning looks for an MPI launcher whenever ``mpi4py`` is installed (``MPIEnvironment.detect`` imports
``mpi4py.MPI``, and that import starts MPI). On the first GPU machine that start aborted the sandboxed worker, so
every check of exercise 12 scored 0 for the correct solution. Here a stand-in ``mpi4py`` that aborts the process on
import is put on the worker's import path, through the grader's real path (runner -> sandbox -> worker), and the
solution must still score full marks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from course_lib.grading.runner import grade_notebook

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ABORTING_MPI4PY = ("import os\n\n"
                   "print('stand-in mpi4py imported: aborting, as starting MPI did in the sandbox', flush=True)\n"
                   "os.abort()\n")
# An instructor's checks folder is mounted into the sandbox and its *.py imported by the worker before the notebook
# loads: this one puts the stand-in first on the worker's import path (never on the grader's own).
PLANT = '''"""Not a check: puts the stand-in mpi4py on the grading worker's import path."""
import importlib.metadata
import sys
from pathlib import Path

_main = getattr(sys.modules["__main__"], "__spec__", None)
if _main is not None and _main.name == "course_lib.grading.worker":
    sys.path.insert(0, str(Path(__file__).parent / "site"))
    importlib.invalidate_caches()
    # Installed as far as Lightning can tell (it reads the package's metadata before importing it).
    assert importlib.metadata.version("mpi4py") == "4.0.0", "the stand-in mpi4py is not visible to the worker"
'''


def plant_aborting_mpi4py(folder: Path) -> Path:
    """An extra-checks folder that puts an ``mpi4py`` aborting on import on the grading worker's path."""
    site = folder / "site"
    (site / "mpi4py").mkdir(parents=True)
    (site / "mpi4py" / "__init__.py").write_text(ABORTING_MPI4PY)
    (site / "mpi4py-4.0.0.dist-info").mkdir()
    (site / "mpi4py-4.0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mpi4py\nVersion: 4.0.0\n")
    (folder / "plant_mpi4py.py").write_text(PLANT)
    return folder


def test_lightning_exercise_scores_full_marks_where_mpi4py_aborts_on_import(tmp_path: Path) -> None:
    extra = plant_aborting_mpi4py(tmp_path / "extra")
    grade = grade_notebook(REPO / "solutions" / "12_lightning.ipynb", "12", extra_dirs=[extra], timeout_s=600)
    assert grade.status == "graded", f"{grade.status}; the worker's last output: {grade.output_tail}"
    failing = [f"{r.name}: {r.message}" for r in grade.results if not r.passed]
    assert not failing, "\n".join(failing)
    assert grade.earned == sum(r.points for r in grade.results)
