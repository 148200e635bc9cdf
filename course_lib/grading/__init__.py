"""Exercises and their automatic grading.

* ``solutions/NN_topic.ipynb`` is the source of truth; ``python -m course_lib build-exercises``
  writes the learner's ``exercises/`` from it (:mod:`course_lib.grading.build`).
* Checks live in ``course_lib/grading/checks/exNN_<topic>.py`` (:mod:`course_lib.grading.api`).
* In a notebook: ``from course_lib.grading import check; check("05", globals())``.
* From a shell: ``python -m course_lib check`` (a learner) or ``python -m course_lib grade`` (an
  instructor); both run learner code in a sandboxed process that only *observes*, and judge the
  observations in their own process (:mod:`course_lib.grading.runner`, :mod:`course_lib.grading.sandbox`).

See ``docs/grading.md``.
"""

from __future__ import annotations

from course_lib.grading.api import CheckFailed, CheckResult, call, check_for, need, observe
from course_lib.grading.check import check

__all__ = ["CheckFailed", "CheckResult", "call", "check", "check_for", "need", "observe"]
