"""Checks catch realistic mistakes and accept correct alternatives, judged exactly as the grader judges.

Each row is a piece of code that redefines one exercise function on top of the solution notebook's set-up and
exercise cells. A *wrong variant* must fail the named check; a *correct alternative* must pass every check. The
judging goes through the grader's own observe -> save -> load -> replay path
(:func:`course_lib.grading.inprocess.observe_and_judge`), in this process: the rows are the course's own code.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from course_lib.grading import notebook
from course_lib.grading.api import CELL_ERRORS, CheckResult
from course_lib.grading.inprocess import observe_and_judge
from course_lib.grading.worker import load_namespace

REPO = Path(__file__).resolve().parents[1]


def solution_namespace(number: str, extra_code: str = "") -> dict:
    """A fresh namespace with the solution's graded cells run, then ``extra_code``."""
    (path,) = sorted((REPO / "solutions").glob(f"{number}_*.ipynb"))
    ns = load_namespace(notebook.read(path))
    assert not ns[CELL_ERRORS], ns[CELL_ERRORS]
    exec(compile(textwrap.dedent(extra_code), f"<variant {number}>", "exec"), ns)
    return ns


def judge(number: str, code: str, only: str = "") -> dict[str, CheckResult]:
    return {r.name: r for r in observe_and_judge(number, solution_namespace(number, code), only)}


# (exercise, what the mistake is, the code, a word from the name of the check that must fail)
WRONG: list[tuple[str, str, str, str]] = [
    # ---------------------------------------------------------------- 01
    ("01", "resume starts a fresh run", """
        def resume(cfg):
            return run(cfg)
        """, "resumed"),
    ("01", "kill helper returns steps // 2 without reading the checkpoint", """
        _solution_kill = kill_at_halfway
        def kill_at_halfway(cfg, poll_s=0.05):
            _solution_kill(cfg, poll_s)
            return cfg.steps // 2
        """, "resumed"),
    ("01", "field types ignored (every value a string)", """
        def parse_overrides(argv, cls=TrainConfig):
            it = iter(argv)
            return cls(**{flag[2:].replace("-", "_"): value for flag, value in zip(it, it)})
        """, "types"),
    ("01", "unknown flags silently ignored", """
        _solution_parse = parse_overrides
        def parse_overrides(argv, cls=TrainConfig):
            names = {f.name for f in dataclasses.fields(cls)}
            keep, i = [], 0
            while i < len(argv):
                name = argv[i][2:].replace("-", "_")
                if argv[i].startswith("--") and name.removeprefix("no_") not in names:
                    i += 2
                    continue
                keep.append(argv[i])
                i += 1
            return _solution_parse(keep, cls)
        """, "malformed"),
    ("01", "booleans written as --compile True", """
        def to_argv(cfg):
            return [x for f in dataclasses.fields(cfg)
                    for x in ("--" + f.name.replace("_", "-"), str(getattr(cfg, f.name)))]
        """, "round-trips"),
    # ---------------------------------------------------------------- 05
    ("05", "divides by steps - warmup without a guard", """
        def lr_at(step, cfg):
            if step < cfg.warmup:
                return cfg.lr * step / cfg.warmup
            t = min(1.0, (step - cfg.warmup) / (cfg.steps - cfg.warmup))
            return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
        """, "warmup == steps"),
    ("05", "no clamp past the end", """
        def lr_at(step, cfg):
            if step < cfg.warmup:
                return cfg.lr * step / cfg.warmup
            t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
            return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
        """, "past the end"),
    ("05", "warm-up off by one (starts at lr/warmup)", """
        def lr_at(step, cfg):
            if step < cfg.warmup:
                return cfg.lr * (step + 1) / cfg.warmup
            t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
            return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
        """, "cosine"),
    ("05", "cosine down to 0 instead of 10%", """
        def lr_at(step, cfg):
            if step < cfg.warmup:
                return cfg.lr * step / cfg.warmup
            t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
            return cfg.lr * 0.5 * (1 + math.cos(math.pi * t))
        """, "cosine"),
    ("05", "avoids the zero division by changing cfg.warmup", """
        def lr_at(step, cfg):
            cfg.warmup = max(1, cfg.warmup)
            if step < cfg.warmup:
                return cfg.lr * step / cfg.warmup
            t = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
            return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
        """, "warmup=0"),
]

# (exercise, what differs from the solution, the code)
RIGHT: list[tuple[str, str, str]] = [
    ("01", "resume through the training CLI's --resume in-process", """
        def resume(cfg):
            from course_lib.train.launch import run as course_run
            return course_run(cfg, resume=True)
        """),
    ("05", "numpy-free closed form with a conditional expression", """
        def lr_at(step, cfg):
            peak, floor = cfg.lr, 0.1 * cfg.lr
            if cfg.warmup and step < cfg.warmup:
                return peak * step / cfg.warmup
            span = cfg.steps - cfg.warmup
            t = 1.0 if span <= 0 else min(1.0, (step - cfg.warmup) / span)
            return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * t))
        """),
]


@pytest.mark.parametrize("number, mistake, code, check", WRONG, ids=[f"{w[0]}-{w[1]}" for w in WRONG])
def test_wrong_variant_fails(number: str, mistake: str, code: str, check: str) -> None:
    results = judge(number, code, only=check)  # only the check that must catch it: some checks train models
    assert results, f"no check of exercise {number} is named like {check!r}"
    failing = {name: r.message for name, r in results.items() if not r.passed}
    assert any(check in name for name in failing), f"{mistake!r} should fail {check!r}; failing: {failing}"


@pytest.mark.parametrize("number, difference, code", RIGHT, ids=[f"{r[0]}-{r[1]}" for r in RIGHT])
def test_correct_alternative_passes(number: str, difference: str, code: str) -> None:
    results = judge(number, code)
    failing = {name: (r.message, r.hint, r.expected, r.got) for name, r in results.items() if not r.passed}
    assert not failing, f"{difference!r} is correct but failed: {failing}"
