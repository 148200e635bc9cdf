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
    part_w = max(4, *(len(r.part_label) for r in rows))
    rule = "-" * (part_w + name_w + 19)
    lines = [f"{'part':<{part_w}} {'check':<{name_w}}  {'result':<6}  points", rule]
    shown: set[str] = set()
    for r in rows:
        mark = "pass" if r.passed else "FAIL"
        lines.append(f"{r.part_label:<{part_w}} {printable(r.name):<{name_w}}  {mark:<6}  {r.earned}/{r.points}")
        if r.passed:
            continue
        indent = " " * 6
        message = r.message
        if message in shown and message.startswith("not attempted yet: Exercise "):
            message = ": ".join(message.split(": ", 2)[:2]) + " (as above)"  # "not attempted yet: Exercise NN.k"
        shown.add(r.message)
        for label, text in (("", message), ("hint: ", r.hint)):
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
    lines += [rule, f"score: {earned}/{total} points ({passed}/{len(rows)} checks pass)"]
    return "\n".join(lines)
