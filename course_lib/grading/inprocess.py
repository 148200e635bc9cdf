"""Grade a namespace inside this process, exactly as the grader judges it (for tests and authors).

:func:`observe_and_judge` records each check's observations as the sandboxed worker does, sends them
through the same ``torch.save``/``torch.load(weights_only=True)`` round trip, and judges the replay as
the parent does. It runs learner code in *this* process: use it for trusted code only (the course's
own tables of right and wrong answers), never for submissions.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from course_lib.grading import api
from course_lib.grading.api import CheckResult, Replay, checks_for, run_check


def observe_and_judge(exercise: str, ns: dict[str, Any], only: str = "") -> list[CheckResult]:
    """One result per check of ``exercise`` (whose name contains ``only``), judged from replayed observations."""
    # Whatever the checks or the learner's code replace in torch, or set in the environment, is put back.
    with api.preserved_globals(), api.preserved_environ():
        return _observe_and_judge(exercise, ns, only)


def _observe_and_judge(exercise: str, ns: dict[str, Any], only: str) -> list[CheckResult]:
    results = []
    for check in checks_for(exercise):
        if only not in check.name:
            continue
        records = api.start_recording()
        try:
            check.func(ns)
        except KeyboardInterrupt:
            raise
        except BaseException:
            pass
        finally:
            api.stop_recording()
        buffer = io.BytesIO()
        torch.save(records, buffer)
        buffer.seek(0)
        results.append(run_check(check, Replay(torch.load(buffer, weights_only=True), seed=api.run_seed(ns))))
    return results
