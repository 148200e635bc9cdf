"""Exercises and their automatic grading.

* ``solutions/NN_topic.ipynb`` is the source of truth; ``python -m course_lib build-exercises``
  writes the learner's ``exercises/`` from it (:mod:`course_lib.grading.build`).
* Checks live in ``course_lib/grading/checks/exNN_<topic>.py`` (:mod:`course_lib.grading.api`).
* In a notebook: ``from course_lib.grading import check; check("05", globals())``.
* From a shell: ``python -m course_lib check`` (a learner) or ``python -m course_lib grade`` (an
  instructor); both run learner code in a separate process (:mod:`course_lib.grading.runner`).

See ``docs/grading.md``.
"""

from __future__ import annotations

from course_lib.grading.api import CheckFailed, CheckResult, check_for, need
from course_lib.grading.check import check

__all__ = ["CheckFailed", "CheckResult", "check", "check_for", "need"]
