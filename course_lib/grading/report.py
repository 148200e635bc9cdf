"""Plain-text score tables: one row per check, the hint and the expected/got diff under a failure."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

from course_lib.grading.api import CheckResult, printable


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + "…"


def format_results(results: Iterable[CheckResult], *, width: int = 100) -> str:
    """Render results as a table a learner can act on, ending with the score."""
    rows = list(results)
    if not rows:
        return "no checks ran"
    name_w = max(len(r.name) for r in rows)  # names are short by design: never cut, so never cut mid-word
    lines = [f"{'ex':<3} {'check':<{name_w}}  {'result':<6}  points", "-" * (name_w + 22)]
    for r in rows:
        mark = "pass" if r.passed else "FAIL"
        lines.append(f"{r.exercise:<3} {printable(r.name):<{name_w}}  {mark:<6}  {r.earned}/{r.points}")
        if r.passed:
            continue
        indent = " " * 6
        for label, text in (("", r.message), ("hint: ", r.hint)):
            if text:
                lines += textwrap.wrap(label + printable(text), width, initial_indent=indent,
                                       subsequent_indent=indent + "  ", break_long_words=False)
        if r.expected is not None:
            lines.append(f"{indent}expected: {printable(r.expected)}")
        if r.got is not None:
            lines.append(f"{indent}got:      {printable(r.got)}")
    earned = sum(r.earned for r in rows)
    total = sum(r.points for r in rows)
    passed = sum(r.passed for r in rows)
    lines += ["-" * (name_w + 22), f"score: {earned}/{total} points ({passed}/{len(rows)} checks pass)"]
    return "\n".join(lines)
