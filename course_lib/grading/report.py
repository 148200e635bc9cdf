"""Plain-text score tables: one row per check, the hint and the expected/got diff under a failure."""

from __future__ import annotations

import textwrap
from typing import Iterable

from course_lib.grading.api import CheckResult


def format_results(results: Iterable[CheckResult], *, width: int = 100) -> str:
    """Render results as a table a learner can act on, ending with the score."""
    rows = list(results)
    if not rows:
        return "no checks ran"
    name_w = min(40, max(len(r.name) for r in rows))
    lines = [f"{'ex':<3} {'check':<{name_w}}  {'result':<6}  points", "-" * (name_w + 22)]
    for r in rows:
        mark = "pass" if r.passed else "FAIL"
        lines.append(f"{r.exercise:<3} {r.name[:name_w]:<{name_w}}  {mark:<6}  {r.earned}/{r.points}")
        if r.passed:
            continue
        indent = " " * 6
        for label, text in (("", r.message), ("hint: ", r.hint)):
            if text:
                lines += textwrap.wrap(label + text, width, initial_indent=indent, subsequent_indent=indent + "  ")
        if r.expected is not None or r.got is not None:
            lines.append(f"{indent}expected: {r.expected}")
            lines.append(f"{indent}got:      {r.got}")
    earned = sum(r.earned for r in rows)
    total = sum(r.points for r in rows)
    passed = sum(r.passed for r in rows)
    lines += ["-" * (name_w + 22), f"score: {earned}/{total} points ({passed}/{len(rows)} checks pass)"]
    return "\n".join(lines)
