"""Every exercise is gradable: its checks all fail on the generated stub and all pass on the solution.

The solutions go through the real grader (a sandboxed process per notebook that observes, verdicts judged in this
process, as `course grade` does), two notebooks at a time, once per test session. The stubs are generated afresh into a
temporary folder, so the proof does not depend on what a learner has typed into `exercises/`, and judged in this
process through the same observe -> save -> load -> replay path (they are the course's own code: no sandbox needed);
a separate test checks that the committed `exercises/` is exactly what the builder generates.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from course_lib.grading import build, notebook
from course_lib.grading.api import Replay, checks_for, run_check
from course_lib.grading.inprocess import observe_and_judge
from course_lib.grading.notebook import exercise_number
from course_lib.grading.runner import NotebookGrade, grade_notebooks
from course_lib.grading.worker import load_namespace

REPO = Path(__file__).resolve().parents[1]
# Generous on a shared machine: the first test waits for all 17 solutions to be graded.
pytestmark = pytest.mark.timeout(1500)
SOLUTIONS = sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb"))
TIMEOUT_S = 400  # generous: only a hang should ever reach it on a shared machine


@pytest.fixture(scope="session")
def graded() -> dict[str, NotebookGrade]:
    """``{number: grade}`` of every solution, through the real sandboxed grader, two notebooks at a time."""
    return grade_notebooks({exercise_number(p): p for p in SOLUTIONS}, timeout_s=TIMEOUT_S, jobs=2)


@pytest.fixture(scope="session")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stubs")
    build.build(REPO / "solutions", folder)
    return folder


def test_exercises_folder_is_up_to_date() -> None:
    stale = build.build(REPO / "solutions", REPO / "exercises", check_only=True)
    assert not stale, (
        f"exercises/ differs from what the builder generates for {[p.name for p in stale]}. Maintainers: run "
        "`python -m course_lib build-exercises` after changing solutions/. Learners: this is expected once you have "
        "worked in exercises/ -- grade your work with `python -m course_lib check` instead."
    )


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_every_check_passes_on_the_solution(solution: Path, graded: dict) -> None:
    grade = graded[exercise_number(solution)]
    assert grade.status == "graded", f"{solution.name}: {grade.status}; output: {grade.output_tail}"
    assert not grade.uses_reference, f"{solution.name} calls the reference implementation: {grade.uses_reference}"
    results = grade.results
    assert results, f"{solution.name} has no checks (add course_lib/grading/checks/ex{exercise_number(solution)}_*.py)"
    failing = [f"{r.name}: {r.message} (hint: {r.hint}; expected {r.expected}, got {r.got})"
               for r in results if not r.passed]
    assert not failing, "\n".join(failing)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_every_check_fails_on_the_stub(solution: Path, stubs: Path) -> None:
    """The stub is the course's own generated code, so it is judged in this process (no sandbox, no interpreter
    start) through the grader's observe -> save -> load -> replay path."""
    ns = load_namespace(notebook.read(stubs / solution.name))
    results = observe_and_judge(exercise_number(solution), ns)
    assert results
    passing = [r.name for r in results if r.passed]
    assert not passing, f"these checks pass on the unsolved exercise, so they grade nothing: {passing}"


# Every exercise: each check draws its inputs from the grading run's seed.
SEEDED = tuple(exercise_number(path) for path in SOLUTIONS)


@pytest.mark.parametrize("number", SEEDED)
def test_observations_replayed_from_another_run_fail(number: str, graded: dict) -> None:
    """A submission that saves the observations of an earlier (correct) run and hands them in again scores 0:
    judged with the next run's seed, the recorded answers belong to other inputs."""
    grade = graded[number]
    checks = checks_for(number)
    assert len(grade.observations) == len(checks) and all(r is not None for r in grade.observations)
    replayed = [run_check(c, Replay(records, seed=grade.seed + 1)) for c, records in zip(checks, grade.observations)]
    passing = [r.name for r in replayed if r.passed]
    assert not passing, f"these checks accept answers recorded for another run's inputs: {passing}"


def test_judging_every_exercise_at_once_equals_judging_each_alone(graded: dict) -> None:
    """``grade --jobs N`` judges in threads: the verdicts must not depend on what other judges run at the same
    time (judges seed global generators and set thread counts), nor leave this process's settings changed."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    import torch

    def judge(number: str) -> list[tuple[str, bool, str]]:
        grade = graded[number]
        return [(r.name, r.passed, r.message) for r in
                (run_check(c, Replay(records, seed=grade.seed, mode="smoke"))
                 for c, records in zip(checks_for(number), grade.observations))]

    numbers = sorted(graded)
    assert all(len(graded[n].observations) == len(checks_for(n)) for n in numbers), "every check was observed"
    torch.manual_seed(123)
    random.seed(123)
    before = (torch.get_rng_state(), random.getstate(), torch.get_num_threads(), torch.get_float32_matmul_precision())
    alone = {n: judge(n) for n in numbers}
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = dict(zip(numbers, pool.map(judge, numbers)))
    assert together == alone
    after = (torch.get_rng_state(), random.getstate(), torch.get_num_threads(), torch.get_float32_matmul_precision())
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:], "judging changed this process's state"
