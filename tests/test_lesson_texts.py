"""Every explanation in every lesson is generated from a verdict, with a branch for each outcome.

Lessons explain a timing comparison only through ``lesson.explain(verdict, faster=..., slower=..., too_close=...)``.
This test finds each such call in each notebook and renders it for synthetic verdicts of every outcome (faster,
slower, too close): the text must lead with the verdict's own sentence, take the branch of that
outcome, and never contradict it. It also forbids the older ways of writing a number's meaning next to it.

The second half keeps facts the text states true: no typed counts of lessons or exercises, no factor below 1 beside
a direction word, prediction ranges that do not overlap, and none of the statements once taught here and found wrong.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest

from course_lib import lesson
from course_lib.perf.compare import Measurement, verdict_from_times

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))

SYNTHETIC = {
    "faster": ((1.0, 1.1, 0.9, 1.0, 1.05), (2.0, 2.1, 1.9, 2.2, 2.0)),
    "slower": ((3.0, 3.2, 3.1, 2.9, 3.0), (1.0, 1.1, 1.0, 0.95, 1.0)),
    "too_close": ((1.0, 1.2, 0.9, 1.1, 1.0), (1.05, 0.95, 1.1, 1.0, 1.02)),
}
# Words that state a direction; a branch must not state the opposite of its outcome.
CONTRADICTS = {
    "faster": re.compile(r"\btoo close\b|\bwithin (the )?noise\b", re.I),
    "slower": re.compile(r"\btoo close\b|\bwithin (the )?noise\b", re.I),
    "too_close": re.compile(r"\bclearly (faster|slower)\b|\bwon\b|\bwins\b", re.I),
}
# A number with a ratio or percent sign written into a template is a performance claim typed in advance.
HARD_CODED = re.compile(r"\d+(\.\d+)?\s*(x|×|%)(?![a-z])")
TIMING_UNITS = re.compile(r"^(ns|us|µs|ms|s|min|h|.*/s|per .*)$")


def code_cells(path: Path) -> list[tuple[int, str]]:
    nb = json.loads(path.read_text())
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def parse(source: str) -> ast.Module | None:
    # IPython magics and shell lines are not Python; blank them out (cell magics make the whole cell foreign).
    if source.lstrip().startswith("%%"):
        return None
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    return ast.parse("\n".join(lines))


def calls(tree: ast.AST, attr: str) -> list[ast.Call]:
    return [
        node for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr
    ]


def explain_calls() -> list[tuple[str, ast.Call]]:
    found = []
    for path in NOTEBOOKS:
        for index, source in code_cells(path):
            tree = parse(source)
            if tree is not None:
                found += [(f"{path.parent.name}/{path.name} cell {index}", c) for c in calls(tree, "explain")]
    return found


EXPLAIN_CALLS = explain_calls()


def test_timing_is_never_explained_by_ratio_sentence() -> None:
    offenders = []
    for path in NOTEBOOKS:
        for index, source in code_cells(path):
            tree = parse(source)
            if tree is None:
                continue
            for call in calls(tree, "ratio_sentence"):
                unit = call.args[4] if len(call.args) > 4 else None
                if not (isinstance(unit, ast.Constant) and not TIMING_UNITS.match(str(unit.value))):
                    offenders.append(f"{path.name} cell {index}")
    assert not offenders, (
        f"timing compared with ratio_sentence in {offenders}: time it with course_lib.perf.compare.compare() and "
        "explain the verdict with lesson.explain(...)"
    )


def test_the_lessons_explain_their_comparisons_through_verdicts() -> None:
    assert len(EXPLAIN_CALLS) >= 8, "the lessons' timing comparisons should be explained with lesson.explain"


def library_branch_sets(function: str) -> list[dict[str, str]]:
    """The branches a library explanation function gives (``lesson.explain(v, **tf32_texts(facts, size=n))``), for
    every device of tests/device_figures.py: what they say there is tests/test_precision_replay.py's to check."""
    from course_lib.perf import precision
    from course_lib.perf.kernel_time import KernelShare
    from device_figures import CPUS, GPUS

    devices = [*GPUS.values(), *CPUS.values()]
    if function in LIBRARY_TEXTS[2:7]:  # lesson 14: course_lib/perf/ceiling_lesson.py, replayed in test_ceiling_replay
        from course_lib.perf import ceiling_lesson
        from test_ceiling_replay import ceiling_of

        if function == "dtype_texts":
            return [ceiling_lesson.dtype_texts(f, ceiling_of(f), d) for f in devices
                    for d in ("bfloat16", "float16") if d in ceiling_of(f).matmul]
        if function == "tiny_chain_texts":
            return [ceiling_lesson.tiny_chain_texts(f, ops=13, call_s=3e-6, compiled_s=c, eager_s=31.7e-6)
                    for f in devices for c in (1e-6, 22.5e-6, 80e-6)]
        return [getattr(ceiling_lesson, function)(facts) for facts in devices]
    gpus = [facts for facts in devices if facts.kind == "cuda"]
    if function == "copy_texts":  # lesson 02's pinned copy: CUDA only (course_lib/perf/transfer.py)
        from course_lib.perf import sizing, transfer

        return [transfer.copy_texts(facts, batch=sizing.copy_batch(facts)) for facts in gpus]
    if function == "graph_texts":  # lesson 07's CUDA graph: CUDA only (course_lib/perf/graphs.py)
        from course_lib.perf import graphs, sizing

        return [graphs.graph_texts(facts, work=sizing.graph_step_work(sizing.graph_step_size(facts)), busy=busy)
                for facts in gpus for busy in (None, KernelShare(1e-3, 1e-4), KernelShare(1e-3, 9e-4))]
    if function == "tf32_texts":
        return [precision.tf32_texts(facts, size=4096) for facts in devices]
    shares = [None, *({low: KernelShare(1e-3, k), "fp32": KernelShare(1e-3, k)} for k in (1e-4, 9e-4)
                      for low in ("bf16", "fp16"))]
    return [precision.precision_speed_texts(facts, low=facts.fast_low_precision, busy=busy)
            for facts in devices for busy in shares]


LIBRARY_TEXTS = ("precision_speed_texts", "tf32_texts", "size_texts", "dtype_texts", "batch_texts", "fusion_texts",
                 "tiny_chain_texts", "copy_texts", "graph_texts")


@pytest.mark.parametrize("where,call", EXPLAIN_CALLS, ids=[w for w, _ in EXPLAIN_CALLS])
def test_every_branch_of_every_explanation_agrees_with_its_verdict(where: str, call: ast.Call) -> None:
    keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
    branches = {}
    assert "busy" not in keywords, f"{where}: a busy machine is no longer an outcome; remove busy="
    splats = [k.value for k in call.keywords if k.arg is None]
    if splats:  # the branches come from a library function of the device's facts
        function = splats[0].func.id if isinstance(splats[0], ast.Call) and isinstance(splats[0].func, ast.Name) else ""
        typed = keywords.keys() & {"faster", "slower", "too_close"}
        assert len(splats) == 1 and function in LIBRARY_TEXTS and not typed, (
            f"{where}: branches passed with ** must all come from one of {LIBRARY_TEXTS}")
        branch_sets = library_branch_sets(function)
    else:
        for name in ("faster", "slower", "too_close"):
            node = keywords.get(name)
            assert node is not None, f"{where}: explain() has no {name}= branch"
            assert isinstance(node, ast.Constant) and isinstance(node.value, str), (
                f"{where}: the {name}= text must be a plain string template (fill numbers from the verdict's fields)"
            )
            assert not HARD_CODED.search(node.value), f"{where}: {name}= text hard-codes a ratio: {node.value!r}"
            branches[name] = node.value
        branch_sets = [branches]
    values = {k: f"<{k}>" for k in keywords if k not in ("faster", "slower", "too_close")}
    for branches in branch_sets:
        check_branches(where, branches, values)


def check_branches(where: str, branches: dict[str, str], values: dict[str, str]) -> None:
    """Each outcome's branch, rendered for a synthetic verdict of that outcome, leads with the verdict's sentence,
    shows only its own branch and does not contradict it."""
    for outcome, (a_times, b_times) in SYNTHETIC.items():
        verdict = verdict_from_times(Measurement("A", a_times), Measurement("B", b_times))
        assert verdict.outcome == outcome
        text = lesson.explain(verdict, **branches, **values)
        assert text.startswith(verdict.sentence()), where
        rest = text[len(verdict.sentence()):]
        for other, branch in branches.items():
            body = branch.split("{")[0].strip()
            if other != outcome and body and len(body) > 12 and body != branches.get(outcome, "").split("{")[0].strip():
                assert body not in rest, f"{where}: the {other} text appeared for a {outcome} verdict"
        if outcome in CONTRADICTS:
            assert not CONTRADICTS[outcome].search(rest), f"{where}: the {outcome} text contradicts it: {rest!r}"


# --------------------------------------------------------------------------------------------------------
# Facts the text states: kept true by the repository, not by a typed number
# --------------------------------------------------------------------------------------------------------
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LIBRARY = sorted((ROOT / "course_lib").rglob("*.py"))


def all_cells(path: Path) -> list[tuple[int, str, str]]:
    nb = json.loads(path.read_text())
    return [(i, c["cell_type"], "".join(c["source"])) for i, c in enumerate(nb["cells"])]


def texts() -> list[tuple[str, str]]:
    """Every cell of every lesson and solution, every Markdown document and every library module, with a label."""
    found = [(f"{p.parent.name}/{p.name} cell {i}", src) for p in NOTEBOOKS for i, _, src in all_cells(p)]
    found += [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in DOCS + LIBRARY]
    return found


# "13 lessons", "the 17 exercises", "twelve lessons": a count typed into the text goes stale with the next lesson.
# (A measurement's record, "10 students × 13 exercises", describes what was measured, not the course.)
TYPED_COUNT = re.compile(
    r"(?<!× )\b(\d+|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty)"
    r"\s+(lessons|lesson notebooks|exercises|exercise notebooks)\b", re.I)


def test_no_text_types_the_number_of_lessons_or_exercises() -> None:
    offenders = [f"{where}: {m.group(0)!r}" for where, text in texts()
                 if not where.startswith("course_lib/") for m in TYPED_COUNT.finditer(text)]
    assert not offenders, (
        f"typed counts of lessons/exercises: {offenders}. Count notebooks/*.ipynb and exercises/*.ipynb where the "
        "number is shown (lesson 00 does), or say it without a number."
    )


def test_the_welcome_lesson_counts_lessons_and_exercises_from_the_repository() -> None:
    source = "\n".join(src for _, kind, src in all_cells(ROOT / "notebooks" / "00_welcome.ipynb") if kind == "code")
    assert '(root / "notebooks").glob(' in source and '(root / "exercises").glob(' in source


DIRECTION = r"(slower|faster|less|more|smaller|larger|bigger|higher|lower|longer|shorter|quicker|cheaper)"
# "0.75x slower": a factor below 1 with a direction word says the opposite of what it means.
FACTOR_BELOW_ONE = re.compile(r"(?<![\d.])0?\.\d+\s*(x|×)\s+" + DIRECTION + r"\b", re.I)
# f"{ratio:.2f}x slower": a computed ratio next to a typed direction word reads "0.75x slower" whenever the ratio
# falls below 1. Write the factor (>= 1) and choose the word from the side the ratio fell on: f"{factor}x {word}".
TYPED_DIRECTION = re.compile(r"\}\s*(x|×)\s+" + DIRECTION + r"\b", re.I)


def test_a_factor_next_to_a_direction_word_is_never_below_one() -> None:
    offenders = []
    for path in NOTEBOOKS:
        for index, kind, source in all_cells(path):
            where = f"{path.parent.name}/{path.name} cell {index}"
            offenders += [f"{where}: {m.group(0)!r}" for m in FACTOR_BELOW_ONE.finditer(source)]
            if kind == "code":
                offenders += [f"{where}: {m.group(0)!r} (typed direction word)"
                              for m in TYPED_DIRECTION.finditer(source)]
    assert not offenders, offenders


# A prediction whose choices are ranges of a measured factor ("1-10x", "more than 100x") must split the axis into
# ranges that do not overlap, so exactly one choice is right for a measured value: no "about the same" beside an
# "up to 10x" that also holds 1.05x.
RANGE_PATTERNS = [
    (re.compile(r"(\d+(?:\.\d+)?)\s*-\s*(\d+(?:\.\d+)?)\s*x\b"), lambda m: (float(m[1]), float(m[2]))),
    (re.compile(r"\b(?:under|below|less than|up to)\s+(\d+(?:\.\d+)?)\s*x\b"), lambda m: (0.0, float(m[1]))),
    (re.compile(r"\b(\d+(?:\.\d+)?)\s*x or less\b"), lambda m: (0.0, float(m[1]))),
    (re.compile(r"\b(?:more than|over|above)\s+(\d+(?:\.\d+)?)\s*x\b"), lambda m: (float(m[1]), math.inf)),
]


def factor_range(choice: str) -> tuple[float, float] | None:
    for pattern, bounds in RANGE_PATTERNS:
        match = pattern.search(choice)
        if match:
            return bounds(match)
    return None


def predict_choices() -> list[tuple[str, list[str]]]:
    found = []
    for path in NOTEBOOKS:
        for index, source in code_cells(path):
            tree = parse(source)
            if tree is None:
                continue
            for call in calls(tree, "predict"):
                node = next((k.value for k in call.keywords if k.arg == "choices"), None)
                if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) for e in node.elts):
                    found.append((f"{path.name} cell {index}", [str(e.value) for e in node.elts]))
    return found


def test_factor_range_choices_do_not_overlap() -> None:
    checked = 0
    for where, choices in predict_choices():
        ranges = [factor_range(c) for c in choices]
        if not any(ranges):
            continue
        checked += 1
        assert all(ranges), f"{where}: {choices} mixes factor ranges with choices that name no range"
        ordered = sorted(ranges)
        assert ordered[0][0] == 0.0 and ordered[-1][1] == math.inf, f"{where}: {choices} leave part of the axis out"
        for (_, hi), (lo, _) in zip(ordered, ordered[1:]):
            assert hi == lo, f"{where}: {choices} overlap or leave a gap at {hi} / {lo}"
    assert checked >= 2, "lessons 00 and 08 ask for a factor range"


# Statements once taught here and found wrong: none may come back.
RETIRED = {
    r"every new (input )?shape recompiles|for every new shape": "lesson 07 measures 2 compilations for 3 sizes: after "
        "the second distinct shape the dimension is marked dynamic (automatic_dynamic_shapes)",
    r"about the same in absolute terms": "Lightning's per-step work grows with callbacks, logging and clipping",
    r"same shape as lesson 04": "OneCycleLR starts at max_lr/div_factor, warms up along a cosine, ends at "
        "initial_lr/final_div_factor and cycles the momentum",
    r"On Linux, workers are \*?forked": "Python 3.14 made forkserver the default start method on Linux",
    r"BatchNorm (cannot train|fails) on a batch of one": "only BatchNorm1d on (N, C) features; BatchNorm2d trains "
        "on one image",
    r"lesson 07 measures (that|non_blocking)": "lesson 07 does not measure non_blocking",
    r"Lightning does the same with `Trainer\(accumulate_grad_batches": "Lightning divides each loss by N (the "
        "recipe exercise 07 shows to be wrong for unequal micro-batches)",
    r"keeps losses and reductions|Reductions, the loss and \(on CUDA\)|reductions, softmax and\s+the loss stay in "
    r"fp32": "on a CPU, autocast runs sum, mean and norm "
        "of a bf16 activation in bf16: only the device's fp32 list is cast up",
    r"autocast[^.;]*\b(keeps|has|holds|uses|stores|maintains)\b[^.;]*master weights": "autocast has one fp32 copy "
        "of the weights and casts per operation; master weights belong to the fp16-model recipe",
}


@pytest.mark.parametrize("pattern", list(RETIRED), ids=[p[:40] for p in RETIRED])
def test_a_retired_wrong_statement_does_not_come_back(pattern: str) -> None:
    found = [where for where, text in texts() if re.search(pattern, text, re.I)]
    assert not found, f"{found} state {pattern!r} again, which is wrong: {RETIRED[pattern]}"


def test_no_question_carries_an_answer_in_its_code() -> None:
    """A ``default=`` next to a question reads as the expected answer: lessons never pass one (tests set theirs)."""
    found = []
    for path in NOTEBOOKS:
        for index, source in code_cells(path):
            tree = parse(source)
            for call in calls(tree, "predict") if tree is not None else []:
                found += [f"{path.name} cell {index}: default={ast.unparse(k.value)}"
                          for k in call.keywords if k.arg == "default"]
    assert not found, found
    probe = ast.parse('guess = lesson.predict("q?", choices=["a", "b"], default="a")')
    assert [k.arg for c in calls(probe, "predict") for k in c.keywords] == ["choices", "default"]  # what it looks for
