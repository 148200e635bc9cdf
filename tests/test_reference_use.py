"""Reference use is seen by what runs, whatever the spelling (course_lib/grading/reference_use.py, ``Watch``).

Learner code is compiled under a cell's file name (``<cell N>``), as the grading worker compiles it. The watch patches
functions of this process: every test restores them (the ``watch`` fixture).
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from course_lib.grading import runner
from course_lib.grading.api import checks_for
from course_lib.grading.reference_use import Watch, watched_modules
from course_lib.train import schedule

CFG = SimpleNamespace(lr=0.1, warmup=2, steps=10)


@pytest.fixture
def watch() -> Watch:
    checks_for("05")  # the exercise's check module is loaded before the notebook, as in the worker
    w = Watch("05", watched_modules("05"))
    try:
        yield w
    finally:
        w.restore()


def original(watch: Watch, name: str) -> types.FunctionType:
    (found,) = [o for dotted, _, o in watch._watched if dotted.endswith("." + name)]
    return found


def learner(code: str, **names: object) -> dict:
    """Run ``code`` as a notebook cell would be run by the grading worker; return its namespace."""
    ns: dict = {"__name__": "__main__", **names}
    exec(compile(code, "<cell 3>", "exec"), ns)
    return ns


@pytest.mark.parametrize("spelling", [
    "import importlib\nmod = importlib.import_module('course_lib.train.' + 'sched' + 'ule')\n"
    "value = mod.lr_at(5, cfg)",
    "import course_lib.train as t\nfn = [getattr(t.schedule, n) for n in dir(t.schedule) if n.endswith('_at')][0]\n"
    "value = fn(5, cfg)",
    "import sys\nvalue = list(map(lambda s: sys.modules['course_lib.train.schedule'].lr_at(s, cfg), [5]))[0]",
    "import functools, course_lib.train.schedule as s\nvalue = functools.partial(s.lr_at, cfg=cfg)(5)",
])
def test_calls_of_the_reference_are_seen_whatever_the_spelling(watch: Watch, spelling: str) -> None:
    ns = learner(spelling, cfg=CFG)
    assert watch.used == {"course_lib.train.schedule.lr_at"}
    assert ns["value"] == original(watch, "lr_at")(5, CFG)  # the original ran


def test_the_reference_still_computes_the_same_and_looks_the_same(watch: Watch) -> None:
    before_watch = original(watch, "lr_at")
    assert schedule.lr_at(5, CFG) == before_watch(5, CFG)
    assert str(inspect.signature(schedule.lr_at)) == str(inspect.signature(before_watch))
    assert schedule.lr_at.__name__ == "lr_at"
    assert watch.used == {"course_lib.train.schedule.lr_at"}  # this file is not the course's code: it counts


def test_course_code_calling_the_reference_is_not_the_learners_use(watch: Watch) -> None:
    import torch

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    # The learner calls a course function that uses lr_at inside: that is the library at work, not a copy of it.
    learner("from course_lib.train.loop import set_lr\nset_lr(optimizer, 5, cfg)", optimizer=optimizer, cfg=CFG)
    assert watch.used == set()


@pytest.mark.parametrize("handed", [
    "lr_at = __import__('importlib').import_module('course_lib.train.schedule').lr_at",
    "import functools, course_lib.train.schedule as s\nlr_at = functools.partial(s.lr_at)",
    "import types, course_lib.train.schedule as s\n"
    "lr_at = types.FunctionType(s.lr_at.__code__, s.lr_at.__globals__, 'lr_at')",
])
def test_a_reference_handed_to_the_checks_as_the_answer_is_seen(watch: Watch, handed: str) -> None:
    ns = learner(handed)
    assert watch.used == set()  # nothing ran yet
    watch.taken(ns["lr_at"])  # what need(ns, "lr_at") does in the worker
    assert watch.used == {"course_lib.train.schedule.lr_at"}


def test_the_graders_own_helpers_count_as_references(watch: Watch) -> None:
    learner("import sys\nm = sys.modules['course_lib.grading.checks.ex05_lr_schedule']\n"
            "cfg = m._cfg(0.1, 2, 10)")
    assert watch.used == {"course_lib.grading.checks.ex05_lr_schedule._cfg"}


def test_an_own_implementation_is_not_flagged(watch: Watch) -> None:
    ns = learner("import math\ndef lr_at(step, cfg):\n    return cfg.lr * min(1, (step + 1) / cfg.warmup)\n"
                 "value = lr_at(5, cfg)", cfg=CFG)
    watch.taken(ns["lr_at"])
    assert watch.used == set()


def test_restore_puts_every_code_back() -> None:
    checks_for("05")
    code = schedule.lr_at.__code__
    w = Watch("05", watched_modules("05"))
    assert schedule.lr_at.__code__ is not code
    with pytest.raises(RuntimeError, match="watched already"):
        Watch("05")
    w.restore()
    assert schedule.lr_at.__code__ is code and "__signature__" not in vars(schedule.lr_at)


def test_classes_and_subclasses_are_seen() -> None:
    from course_lib.parallel import data_parallel

    w = Watch("21")
    try:
        ns = learner("from course_lib.parallel import data_parallel as d\nclass Mine(d.BucketedDP):\n    pass\n")
        w.taken(ns["Mine"])
        assert "course_lib.parallel.data_parallel.BucketedDP" in w.used
        assert isinstance(data_parallel.BucketedDP.__init__, types.FunctionType)
    finally:
        w.restore()


def test_the_grader_flags_a_notebook_that_calls_the_reference_by_a_roundabout_route(tmp_path: Path) -> None:
    """End to end, in the sandboxed worker: no import of the reference in the text, flagged all the same."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import importlib\n"
        "def lr_at(step, cfg):\n"
        "    module = importlib.import_module('.'.join(['course_lib', 'train', 'sched' + 'ule']))\n"
        "    return getattr(module, 'lr' + '_at')(step, cfg)\n", metadata={"tags": ["exercise"]})]
    path = tmp_path / "05_lr_schedule.ipynb"
    nbformat.write(nb, path)
    grade = runner.grade_notebook(path, "05", timeout_s=120)
    assert grade.earned == grade.points  # the reference is right, of course
    assert grade.uses_reference == ["course_lib.train.schedule.lr_at"]
