"""Tables of realistic wrong answers and unusual correct ones, one module per exercise whose table is long.

Each module defines ``WRONG`` (what the mistake is, the code, a word from the name of the check that must fail) and
``RIGHT`` (what differs, the code); optionally ``judge(number, code, only)`` where the exercise is judged differently
(exercise 11 runs two processes) and ``RIGHT_ONLY`` (the checks a correct alternative is judged on, where some
check cannot be judged on it). tests/test_grading_variants.py runs every row of every table.
"""

from __future__ import annotations

import linecache
import textwrap
from pathlib import Path

from course_lib.grading import notebook
from course_lib.grading.api import CELL_ERRORS, CheckResult
from course_lib.grading.inprocess import observe_and_judge

REPO = Path(__file__).resolve().parents[2]


def judge_cell_edit(number: str, solution: str, code: str, only: str = "") -> dict[str, CheckResult]:
    """The solution's set-up cells, then its one exercise cell with ``code`` appended, judged as the grader does.

    For the exercises whose checks run the exercise *cell* on other processes (its source crosses the process
    boundary): the row's redefinition must be part of that cell, as a learner's edit would be, and the cell is
    registered with :mod:`linecache` as Jupyter registers it.
    """
    nb = notebook.read(REPO / "solutions" / solution)
    setup = ["".join(c["source"]) for c in nb["cells"] if "setup" in c.get("metadata", {}).get("tags", [])]
    (exercise,) = ["".join(c["source"]) for c in nb["cells"] if "exercise" in c.get("metadata", {}).get("tags", [])]
    ns: dict = {"__name__": "__main__", CELL_ERRORS: []}
    for source in setup:
        exec(compile(source, "<setup>", "exec"), ns)
    cell = exercise + "\n\n" + textwrap.dedent(code)
    filename = f"<exercise {number} variant {abs(hash(code)):x}>"
    linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)
    exec(compile(cell, filename, "exec"), ns)
    return {r.name: r for r in observe_and_judge(number, ns, only)}
