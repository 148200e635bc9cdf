"""The claim log: every verdict a lesson shows, one JSON line each, and a check that re-derives them.

With ``COURSE_CLAIM_LOG=<path>`` set, every verdict shown (by :func:`course_lib.lesson.explain` or
:func:`course_lib.lesson.state`) appends one line to that file. The format is stable (the
workshop tools collect these files across a room of laptops); each line is a JSON object with:

``format`` (1), ``lesson`` (the notebook's file name, or ``""``), ``a``, ``b``, ``outcome`` (``faster``,
``slower`` or ``too_close``), ``ratio`` (a's speed over b's on the quantity decided: above 1 when ``a`` is faster),
``low``/``high`` (its interval), ``band``, ``quantity`` (``wall``, ``cpu`` or a count's name), ``unit``,
``a_times``/``b_times`` (that quantity per unit of work in each round, equal lengths), ``threads``, ``sentence``
(the text shown, exactly) and ``time`` (UTC, ISO 8601).

``python -m course_lib claims check <path>`` re-derives every verdict from its rounds with the same function the
lessons use (:func:`~course_lib.perf.compare.decide`) and lists each inconsistency: an outcome or ratio the rounds
do not give, or a sentence that does not state the verdict's outcome, factor and quantity.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from course_lib import atomic
from course_lib.argparsing import CommandParser
from course_lib.perf.compare import OUTCOMES, TIMED_QUANTITIES, Verdict, decide

__all__ = ["ENV", "FORMAT", "FIELDS", "current_lesson", "record", "problems", "check_file", "main"]

ENV = "COURSE_CLAIM_LOG"
FORMAT = 1
FIELDS = ("format", "lesson", "a", "b", "outcome", "ratio", "low", "high", "band", "quantity", "unit", "a_times",
          "b_times", "threads", "sentence", "time")


def current_lesson() -> str:
    """The running notebook's file name: JupyterLab and Jupyter Server give it to the kernel (``JPY_SESSION_NAME``),
    VS Code as ``__vsc_ipynb_file__``; ``""`` elsewhere."""
    name = os.environ.get("JPY_SESSION_NAME", "")
    if not name:
        try:
            from IPython import get_ipython

            shell = get_ipython()
            ns = shell.user_ns if shell is not None else {}
            name = str(ns.get("__vsc_ipynb_file__") or ns.get("__session__") or "")
        except ImportError:
            name = ""
    return Path(name).name if name else ""


def entry(verdict: Verdict, sentence: str) -> dict[str, Any]:
    """The log line for ``verdict`` shown as ``sentence``."""
    return {
        "format": FORMAT, "lesson": current_lesson(), **verdict.as_dict(), "sentence": sentence,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def record(verdict: Verdict, sentence: str) -> None:
    """Append ``verdict`` shown as ``sentence`` to the file ``COURSE_CLAIM_LOG`` names (nothing when unset).

    One ``write`` of one line in append mode, so lines from several processes do not interleave.
    """
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps(entry(verdict, sentence), ensure_ascii=False) + "\n"
    with atomic.open_append(path) as f:  # a link planted at the log's path is refused, not written through
        f.write(line)


def _verdict_of(claim: dict[str, Any]) -> Verdict:
    outcome, ratio, low, high = decide(claim["a_times"], claim["b_times"], band=claim["band"],
                                       quantity=claim["quantity"])
    return Verdict(a=claim["a"], b=claim["b"], outcome=outcome, ratio=ratio, low=low, high=high,
                   quantity=claim["quantity"], a_times=tuple(claim["a_times"]), b_times=tuple(claim["b_times"]),
                   band=claim["band"], unit=claim.get("unit", "call"), threads=claim.get("threads"))


def problems(claim: Any) -> list[str]:
    """What is inconsistent in one claim (empty when it re-derives exactly)."""
    if not isinstance(claim, dict):
        return ["not a JSON object"]
    missing = [k for k in ("a", "b", "outcome", "ratio", "quantity", "a_times", "b_times", "sentence", "band")
               if k not in claim]
    if missing:
        return [f"missing {', '.join(missing)}"]
    out = []
    if claim["outcome"] not in OUTCOMES:
        out.append(f"outcome {claim['outcome']!r} is not one of {OUTCOMES}")
    a_times, b_times = claim["a_times"], claim["b_times"]
    if not (isinstance(a_times, list) and isinstance(b_times, list) and len(a_times) == len(b_times) and a_times):
        return out + ["a_times and b_times must be lists of equal, non-zero length"]
    try:
        derived = _verdict_of(claim)
    except (ValueError, TypeError) as exc:
        return out + [f"its rounds cannot be judged: {exc}"]
    if derived.outcome != claim["outcome"]:
        out.append(f"the rounds give {derived.outcome!r}, the log says {claim['outcome']!r}")
    ratio = claim["ratio"]
    if not (isinstance(ratio, (int, float)) and math.isclose(ratio, derived.ratio, rel_tol=1e-9)):
        out.append(f"the rounds give a ratio of {derived.ratio:.6g}, the log says {ratio!r}")
    sentence = claim["sentence"]
    if not isinstance(sentence, str) or derived.headline() not in sentence:
        out.append(f"the sentence does not state the verdict: expected {derived.headline()!r} in {sentence!r}")
    elif claim["quantity"] not in TIMED_QUANTITIES and claim["quantity"] not in sentence:
        out.append(f"the sentence does not name the count {claim['quantity']!r}")
    return out


def check_file(path: Path) -> tuple[int, list[str]]:
    """``(claims read, inconsistencies)`` of a claim log; each inconsistency names its line."""
    found, count = [], 0
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        count += 1
        try:
            claim = json.loads(line)
        except json.JSONDecodeError as exc:
            found.append(f"line {number}: not JSON ({exc.msg})")
            continue
        where = f"line {number}" + (f" ({claim.get('lesson')})" if isinstance(claim, dict) and claim.get(
            "lesson") else "")
        found += [f"{where}: {p}" for p in problems(claim)]
    return count, found


def summary(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Per lesson: how many verdicts were decided and too close to call, and on which quantities."""
    rows: dict[str, dict[str, Any]] = {}
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                claim = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(claim, dict):
                continue
            row = rows.setdefault(str(claim.get("lesson") or Path(path).name),
                                  {"decided": 0, "too_close": 0, "quantities": {}})
            row["too_close" if claim.get("outcome") == "too_close" else "decided"] += 1
            q = str(claim.get("quantity"))
            row["quantities"][q] = row["quantities"].get(q, 0) + 1
    return [{"lesson": name, **row} for name, row in sorted(rows.items())]


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib claims",
                                     description="Check a claim log written with COURSE_CLAIM_LOG.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="re-derive every verdict from its rounds; list each inconsistency")
    check.add_argument("paths", type=Path, nargs="+", help="claim log files (JSON lines)")
    table = sub.add_parser("summary", help="per lesson: decided and too-close verdicts, and what they rest on")
    table.add_argument("paths", type=Path, nargs="+", help="claim log files (JSON lines)")
    args = parser.parse_args(argv)
    if args.command == "summary":
        for row in summary([p for p in args.paths if p.is_file()]):
            quantities = ", ".join(f"{q} {n}" for q, n in sorted(row["quantities"].items()))
            print(f"{row['lesson']}: {row['decided']} decided, {row['too_close']} too close ({quantities})")
        return 0
    bad = 0
    for path in args.paths:
        if not path.is_file():
            print(f"{path}: no such file (write one with {ENV}={path} while running a lesson)")
            bad += 1
            continue
        count, found = check_file(path)
        for line in found:
            print(f"{path}: {line}")
        print(f"{path}: {count} claim{'s' if count != 1 else ''}, {len(found)} inconsistenc"
              f"{'y' if len(found) == 1 else 'ies'}")
        bad += len(found)
    return 1 if bad else 0
