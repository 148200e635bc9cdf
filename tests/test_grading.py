"""The grading machinery on a toy exercise: builder, isolated runner, `check` and `grade` commands."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.grading import build, gradebook, notebook, sandbox
from course_lib.grading.api import Check, CheckFailed, call, check_for, observe, run_check
from course_lib.grading.grade import main as grade_main
from course_lib.grading.runner import grade_notebook

REPO = Path(__file__).resolve().parents[1]

TOY_CHECKS = '''
from course_lib.grading.api import CheckFailed, call, check_for, need, observe, run_seed


def _double(ns, x):
    return call(need(ns, "double", "define `double(x)` in the exercise cell"), x)


def _half(ns, x):
    return call(need(ns, "half", "define `half(x)` in the exercise cell"), x)


@check_for("90", "doubles")
def doubles(ns):
    x = 21 + run_seed(ns) % 1_000_000  # an input chosen per grading run
    got = observe(ns, _double, x)
    if got != 2 * x:
        raise CheckFailed(f"double({x}) is wrong", hint="multiply by two", expected=2 * x, got=got)


@check_for("90", "halves", points=2)
def halves(ns):
    x = 9 + run_seed(ns) % 100_000
    got = observe(ns, _half, x)
    if got != x / 2:
        raise CheckFailed(f"half({x}) is wrong", expected=x / 2, got=got)
'''


def toy_notebook(path: Path, double_body: str = "return 2 * x", half_body: str = "return x / 2",
                 regions: bool = True) -> Path:
    """A solution-style notebook for exercise 90 with two regions in two exercise cells."""
    def region(what: str, body: str) -> str:
        return f"    ### BEGIN SOLUTION: {what}\n    {body}\n    ### END SOLUTION" if regions else f"    {body}"

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [
        nbformat.v4.new_markdown_cell("# Toy"),
        nbformat.v4.new_code_cell("import math\n%matplotlib inline"),
        nbformat.v4.new_code_cell("def double(x):\n" + region("return twice x", double_body)),
        nbformat.v4.new_code_cell("print(double(3))"),
        nbformat.v4.new_code_cell("def half(x):\n" + region("return half of x", half_body)),
        nbformat.v4.new_code_cell('from course_lib.grading import check\ncheck("90", globals())'),
    ]
    for cell, tag in zip(cells, [None, "setup", "exercise", None, "exercise", "check"]):
        if tag:
            cell.metadata["tags"] = [tag]
    nb.cells = cells
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture()
def extra(tmp_path: Path) -> Path:
    folder = tmp_path / "instructor"
    folder.mkdir()
    (folder / "toy_checks.py").write_text(TOY_CHECKS)
    return folder


# ---------------------------------------------------------------- builder


def test_regions_become_numbered_stubs_at_their_indentation() -> None:
    code = "def f():\n    x = 1\n    ### BEGIN SOLUTION: compute y\n    y = 2\n    ### END SOLUTION\n    return y"
    out, count = notebook.replace_regions(code, "07", start=3)
    assert count == 1
    assert out == 'def f():\n    x = 1\n    raise NotImplementedError("Exercise 07.3: compute y")\n    return y'


@pytest.mark.parametrize("code, problem", [
    ("### BEGIN SOLUTION: a\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without BEGIN"),
    ("### BEGIN SOLUTION:\nx\n### END SOLUTION", "say what to do"),
    ("### BEGIN SOLUTION: a\n### BEGIN SOLUTION: b\n### END SOLUTION", "inside another"),
])
def test_malformed_regions_are_reported(code: str, problem: str) -> None:
    with pytest.raises(notebook.NotebookError, match=problem):
        notebook.replace_regions(code, "01", start=1)


def test_build_numbers_regions_across_cells_and_check_mode_detects_drift(tmp_path: Path) -> None:
    toy_notebook(tmp_path / "solutions" / "90_toy.ipynb")
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    assert build.main(["--solutions", str(solutions), "--exercises", str(exercises), "--check"]) == 1
    assert build.main(["--solutions", str(solutions), "--exercises", str(exercises)]) == 0
    text = (exercises / "90_toy.ipynb").read_text()
    assert "Exercise 90.1: return twice x" in text and "Exercise 90.2: return half of x" in text
    assert "return 2 * x" not in text and "%matplotlib inline" in text
    assert build.main(["--solutions", str(solutions), "--exercises", str(exercises), "--check"]) == 0
    assert (exercises / "90_toy.ipynb").read_text() == text  # deterministic
    (exercises / "90_toy.ipynb").write_text(text.replace("Toy", "Edited by hand"))
    assert build.main(["--solutions", str(solutions), "--exercises", str(exercises), "--check"]) == 1


def test_build_rejects_an_exercise_cell_without_region(tmp_path: Path) -> None:
    toy_notebook(tmp_path / "solutions" / "90_toy.ipynb", regions=False)
    assert build.main(["--solutions", str(tmp_path / "solutions"), "--exercises", str(tmp_path / "ex")]) == 2


# ---------------------------------------------------------------- one check


def test_run_check_turns_every_ending_into_a_result() -> None:
    def stub(ns: dict) -> None:
        raise NotImplementedError("Exercise 90.1: do it")

    def wrong(ns: dict) -> None:
        raise CheckFailed("off by one", hint="count from zero", expected=[0, 1], got=[1, 2])

    def exits(ns: dict) -> None:
        sys.exit(3)

    def crashes(ns: dict) -> None:
        call(lambda x: {}["x"], 7)

    results = {f.__name__: run_check(Check("90", f.__name__, 1, f, "test"), {}) for f in (stub, wrong, exits, crashes)}
    assert results["stub"].message == "not attempted yet: Exercise 90.1: do it"
    wrong = results["wrong"]
    assert (wrong.hint, wrong.expected, wrong.got) == ("count from zero", "[0, 1]", "[1, 2]")
    assert "sys.exit(3)" in results["exits"].message
    assert "KeyError" in results["crashes"].message and "(7)" in results["crashes"].message
    assert not any(r.passed for r in results.values())


# ---------------------------------------------------------------- isolated runner


def test_solution_passes_and_stub_fails_in_isolation(tmp_path: Path, extra: Path) -> None:
    toy_notebook(tmp_path / "solutions" / "90_toy.ipynb")
    build.build(tmp_path / "solutions", tmp_path / "exercises")
    good = grade_notebook(tmp_path / "solutions" / "90_toy.ipynb", "90", extra_dirs=[extra], timeout_s=60).results
    stub = grade_notebook(tmp_path / "exercises" / "90_toy.ipynb", "90", extra_dirs=[extra], timeout_s=60).results
    assert [r.passed for r in good] == [True, True]
    assert [r.message for r in stub] == ["not attempted yet: Exercise 90.1: return twice x",
                                        "not attempted yet: Exercise 90.2: return half of x"]


def test_wrong_answer_gets_message_hint_and_diff(tmp_path: Path, extra: Path) -> None:
    path = toy_notebook(tmp_path / "90_toy.ipynb", double_body="return x + 2")
    first, second = grade_notebook(path, "90", extra_dirs=[extra], timeout_s=60).results
    assert not first.passed and second.passed
    assert first.message.startswith("double(") and first.message.endswith(") is wrong")
    x = int(first.message[len("double("):-len(") is wrong")])
    assert (first.hint, first.expected, first.got) == ("multiply by two", str(2 * x), str(x + 2))


@pytest.mark.parametrize("body, message", [
    ("while True: pass", "timed out"),
    ("import os; os._exit(7)", "exit code 7"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "ended before"),
])
def test_hostile_code_fails_checks_without_hanging_the_grader(tmp_path: Path, extra: Path, body: str,
                                                              message: str) -> None:
    # The statement runs when the cell is loaded, before any check.
    path = toy_notebook(tmp_path / "90_toy.ipynb", double_body="return 2 * x\n" + body)
    nb = json.loads(path.read_text())
    nb["cells"][2]["source"] = "".join(nb["cells"][2]["source"]) + "\n" + body
    path.write_text(json.dumps(nb))
    # A hang needs the timeout, and never ends however long it is: 2 s gives "timed out" on any machine (the
    # interpreter may still be starting then: the verdict is the same). The others must be told apart from a hang,
    # however loaded the machine is.
    results = grade_notebook(path, "90", extra_dirs=[extra], timeout_s=2 if "while" in body else 120).results
    assert len(results) == 2 and not any(r.passed for r in results)
    assert all(message in r.message for r in results), [r.message for r in results]


def test_sys_exit_in_a_cell_and_invalid_json_are_failed_checks(tmp_path: Path, extra: Path) -> None:
    path = toy_notebook(tmp_path / "90_toy.ipynb")
    nb = json.loads(path.read_text())
    nb["cells"][4]["source"] = "import sys\nsys.exit(0)"
    path.write_text(json.dumps(nb))
    doubles, halves = grade_notebook(path, "90", extra_dirs=[extra], timeout_s=60).results
    assert doubles.passed and not halves.passed and "sys.exit" in halves.message
    path.write_text("{ not json")
    graded = grade_notebook(path, "90", extra_dirs=[extra], timeout_s=60)
    assert graded.status == "invalid notebook"
    assert not any(r.passed for r in graded.results) and "not a valid notebook" in graded.results[0].message


@pytest.mark.parametrize("damage, says", [
    (lambda text: text[: len(text) // 2], "cut short"),  # a download or a copy that stopped half-way
    (lambda text: text.replace('"cells"', '"cells" "', 1), "Expecting"),
    (lambda text: "[]", "without a list of cells"),
    (lambda text: text.encode("utf-16").decode("latin-1"), "not UTF-8"),
])
def test_a_damaged_notebook_gets_advice_jupyter_can_follow(tmp_path: Path, damage, says: str) -> None:
    path = toy_notebook(tmp_path / "90_toy.ipynb")
    path.write_bytes(damage(path.read_text()).encode("utf-8") if says != "not UTF-8" else
                     path.read_text().encode("utf-16"))
    with pytest.raises(notebook.NotebookError) as error:
        notebook.read(path)
    assert says in str(error.value), str(error.value)
    # Jupyter cannot open any of these, so "save it again from Jupyter" would be advice nobody can follow.
    assert "Download" in error.value.hint and ".ipynb_checkpoints" in error.value.hint
    assert "save it again" not in str(error.value) + error.value.hint


# ---------------------------------------------------------------- grade command


def test_grade_a_class_folder(tmp_path: Path, extra: Path) -> None:
    subs = tmp_path / "class"
    toy_notebook(subs / "ada" / "90_toy.ipynb", double_body="return 2 * abs(x)")  # right for the inputs of today
    (subs / "bob").mkdir(parents=True)  # submitted nothing
    (subs / "cy").mkdir()
    (subs / "cy" / "90_toy.ipynb").write_text("{ broken")
    # A broken function fails its check only (a hang is test_hostile_code_fails_checks_without_hanging_the_grader's:
    # here it would hold the whole class for the timeout).
    toy_notebook(subs / "dee" / "90_toy.ipynb", double_body="raise RuntimeError('not today')")
    toy_notebook(subs / "eve" / "90_toy.ipynb", half_body="import os; os._exit(0)")
    # A hostile one deletes what it can reach from its working directory (a temporary one).
    toy_notebook(subs / "fay" / "90_toy.ipynb",
                 double_body="import shutil; shutil.rmtree('.', ignore_errors=True); return 2 * x")
    out = tmp_path / "grades.csv"
    code = grade_main([str(subs), "--out", str(out), "--exercises", "90", "--extra-tests", str(extra),
                       "--timeout", "40", "--jobs", "3"])
    assert code == 0
    rows = {row["student"]: row for row in csv.DictReader(out.open())}
    assert {s: (rows[s]["ex90"], rows[s]["total"], rows[s]["max"]) for s in rows} == {
        "ada": ("3", "3", "3"), "bob": ("0", "0", "3"), "cy": ("0", "0", "3"), "dee": ("2", "2", "3"),
        "eve": ("1", "1", "3"), "fay": ("3", "3", "3"),
    }
    assert (subs / "ada" / "90_toy.ipynb").exists() and (subs / "fay" / "90_toy.ipynb").exists()
    assert {row["grader"] for row in rows.values()} == {gradebook.grader_version([extra])}
    canvas = list(csv.reader((tmp_path / "grades-canvas.csv").open()))
    assert canvas[0][-1] == "Exercise 90" and canvas[1][-1] == "3" and ["dee", "", "", "dee", "", "2"] in canvas
    assert ["bob", "", "", "bob", "", ""] in canvas  # nothing handed in: blank ("no change"), not a grade of 0
    assert ["eve", "eve", "", "", "1"] in list(csv.reader((tmp_path / "grades-moodle.csv").open()))

    # The instructor fixes a check (doubling is now judged on a negative input too) and grades again against the
    # previous grades: the report names the students, exercises and checks whose outcome changed.
    (extra / "toy_checks.py").write_text(TOY_CHECKS.replace("x = 21 + run_seed(ns) % 1_000_000",
                                                            "x = -(21 + run_seed(ns) % 1_000_000)"))
    code = grade_main([str(subs), "--out", str(out), "--exercises", "90", "--extra-tests", str(extra),
                       "--timeout", "40", "--jobs", "3", "--regrade", str(out)])
    assert code == 0
    report = (tmp_path / "grades-regrade.txt").read_text()
    assert "ada ex90: 3 -> 2  ('doubles' now failed)" in report, report
    assert "1 of 6 student(s) changed" in report and gradebook.grader_version([extra]) in report


@pytest.mark.skipif(not (sandbox.find_bwrap()[0] and os.geteuid() == 0 and shutil.which("setpriv")),
                    reason="only graded as root with bubblewrap does the sandbox drop to nobody")
def test_checks_nobody_can_read_are_refused_before_grading_as_root(tmp_path: Path, extra: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    toy_notebook(tmp_path / "class" / "ada" / "90_toy.ipynb")
    extra.chmod(0o700)
    with pytest.raises(SystemExit) as stop:
        grade_main([str(tmp_path / "class"), "--out", str(tmp_path / "g.csv"), "--exercises", "90",
                    "--extra-tests", str(extra)])
    assert stop.value.code == 2
    assert f"chmod -R o+rX {extra}" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()


def test_ctrl_c_during_grade_keeps_what_was_graded(tmp_path: Path, extra: Path) -> None:
    """Ctrl-C while a notebook hangs: the notebooks graded so far are written, the rest say so, nothing runs on."""
    subs, out = tmp_path / "class", tmp_path / "grades.csv"
    toy_notebook(subs / "ada" / "90_toy.ipynb")
    toy_notebook(subs / "zed" / "90_toy.ipynb", half_body="import time; time.sleep(600)")
    nb = json.loads((subs / "zed" / "90_toy.ipynb").read_text())
    nb["cells"].append(nbformat.v4.new_code_cell("import time\ntime.sleep(600)", metadata={"tags": ["exercise"]}))
    (subs / "zed" / "90_toy.ipynb").write_text(json.dumps(nb))
    workdirs = tmp_path / "tmp"  # each notebook is graded in a fresh folder made here
    workdirs.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "course_lib", "grade", str(subs), "--out", str(out),
                             "--exercises", "90", "--extra-tests", str(extra), "--jobs", "1", "--timeout", "600"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(workdirs)})
    seen: set[str] = set()
    try:
        # --jobs 1 grades ada, then zed: a second grading folder means ada is done and zed hangs in its cell.
        for _ in range(1200):  # a hang guard (120 s), not a measurement
            seen |= {p.name for p in workdirs.glob("course-grade-90-*")}
            if len(seen) >= 2 or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert len(seen) >= 2, "the second notebook's grading never started"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, (stdout, stderr)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "1 of 2 notebook(s) were graded" in errors[0], stderr
    assert "nothing was written (there were no previous results)" in errors[0], stderr
    assert "Traceback" not in stderr
    assert not out.exists() and not (tmp_path / "grades-feedback").exists()  # no half set: all of a run or nothing
    assert not list(workdirs.glob("course-grade-*")), "a grading folder (and so its child) outlived Ctrl-C"


def _toy_table(doubles_passed: bool) -> dict:
    from course_lib.grading.api import CheckResult
    from course_lib.grading.runner import NotebookGrade

    def grade(passed: bool) -> dict:
        return {"90": NotebookGrade("90", [CheckResult("90", "doubles", 1, passed=passed, message="" if passed else
                                                       "double(21) is wrong"), CheckResult("90", "halves", 2, True)])}

    return {"ada": grade(doubles_passed), "=1+1 Zoë": grade(True)}


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("moment", ["grading", "csv", "feedback", "exports", "regrade report",
                                    "swap: feedback", "swap: grades-canvas.csv", "swap: grades-regrade.txt",
                                    "swap: clean up"])
def test_ctrl_c_at_any_moment_leaves_one_complete_set(tmp_path: Path, extra: Path, monkeypatch, capsys,
                                                      moment: str) -> None:
    """Ctrl-C while a regrade is written: the previous run's complete set stays (or, once the swap began, the new
    complete set is in place); never the new CSV beside the old exports, as before."""
    import signal as signals

    from course_lib.grading import grade, outputs
    from course_lib.grading.grade import GradingInterrupted

    subs, out = tmp_path / "class", tmp_path / "out" / "grades.csv"
    (subs / "ada").mkdir(parents=True)
    command = [str(subs), "--out", str(out), "--exercises", "90", "--extra-tests", str(extra)]
    monkeypatch.setattr(grade, "grade_class", lambda *a, **k: _toy_table(doubles_passed=True))
    assert grade_main(command) == 0
    previous = _files(out.parent)
    assert {"grades.csv", "grades-canvas.csv", "grades-moodle.csv", "grades-feedback/ada/results.json"} <= set(previous)
    capsys.readouterr()

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    def stop_after(write):
        def wrapped(*args, **kwargs):
            write(*args, **kwargs)
            raise KeyboardInterrupt
        return wrapped

    new_table = _toy_table(doubles_passed=False)  # ada loses a point: the new set differs in every file
    if moment == "grading":
        def interrupted(*args, **kwargs):
            raise GradingInterrupted(new_table)
        monkeypatch.setattr(grade, "grade_class", interrupted)
    else:
        monkeypatch.setattr(grade, "grade_class", lambda *a, **k: new_table)
    if moment == "csv":
        monkeypatch.setattr(grade, "write_csv", stop_after(grade.write_csv))
    elif moment == "feedback":  # the first student's feedback is written, the second's not
        monkeypatch.setattr(grade, "feedback_text", lambda student, *a: stop() if student == "ada" else "x")
    elif moment == "exports":
        monkeypatch.setattr(gradebook, "write_moodle_csv", stop)
    elif moment == "regrade report":
        monkeypatch.setattr(grade.atomic, "write_text", stop)
    elif moment.startswith("swap: "):  # a real SIGINT, as Ctrl-C sends it, in the middle of the swap
        step = moment.removeprefix("swap: ")
        monkeypatch.setattr(outputs, "before_step",
                            lambda name: os.kill(os.getpid(), signals.SIGINT) if name == step else None)
    assert grade_main([*command, "--regrade", str(out)]) == 130
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    now = _files(out.parent)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "a staging folder was left behind"
    if not moment.startswith("swap"):
        assert now == previous, f"interrupted at {moment}: the previous set changed"
        assert "the previous run's results are kept whole" in errors[0] and str(out) in errors[0]
        return
    # Once the swap began, the new set is in place whole: every file says ada has 2 points and the report exists.
    assert "are this run's, complete" in errors[0]
    rows = {gradebook.from_csv_cell(r["student"]): r for r in csv.DictReader((out.parent / "grades.csv").open())}
    assert rows["ada"]["ex90"] == "2" and rows["=1+1 Zoë"]["ex90"] == "3"
    assert ["ada", "ada", "", "", "2"] in list(csv.reader((out.parent / "grades-moodle.csv").open(encoding="utf-8")))
    assert json.loads((out.parent / "grades-feedback" / "ada" / "results.json").read_text())["score"] == 2
    assert "ada ex90: 3 -> 2  ('doubles' now failed)" in (out.parent / "grades-regrade.txt").read_text()


def test_grade_rejects_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        grade_main([str(tmp_path / "nope"), "--out", str(tmp_path / "g.csv")])


def test_grade_rejects_a_regrade_file_that_is_not_a_grade_table_before_grading(tmp_path: Path, capsys) -> None:
    (tmp_path / "class" / "ada").mkdir(parents=True)
    (tmp_path / "notes.csv").write_text("name,score\nada,3\n")
    for bad, why in ((tmp_path / "notes.csv", "no 'student' column"), (tmp_path / "gone.csv", "cannot be read")):
        with pytest.raises(SystemExit):
            grade_main([str(tmp_path / "class"), "--out", str(tmp_path / "g.csv"), "--regrade", str(bad)])
        assert why in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()  # nothing graded, nothing written


# ---------------------------------------------------------------- check command and in-notebook check


def test_check_command_exit_code(tmp_path: Path) -> None:
    solved, todo = tmp_path / "solved", tmp_path / "todo"
    solved.mkdir()
    todo.mkdir()
    shutil.copy(REPO / "solutions" / "02_bottleneck.ipynb", solved)
    shutil.copy(REPO / "exercises" / "02_bottleneck.ipynb", todo)
    run = [sys.executable, "-m", "course_lib", "check", "02", "--timeout", "240"]
    ok = subprocess.run(run + ["--notebooks", str(solved)], capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "FAIL" not in ok.stdout
    bad = subprocess.run(run + ["--notebooks", str(todo)], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 1
    assert "not attempted yet: Exercise 02.1" in bad.stdout


def test_in_notebook_check_raises_assertion_error_and_names_the_missing_function(capsys: pytest.CaptureFixture) -> None:
    from course_lib.grading import check

    with pytest.raises(AssertionError, match="exercise 02"):
        check("02", {})
    out = capsys.readouterr().out
    assert "define `loader_config(cores, device_type)`" in out
    # Every notebook check says it is the practice loop, and how the grade is made.
    assert "for practice" in out and "python -m course_lib check 02" in out


def test_demo_cells_after_an_exercise_do_not_stop_run_all(tmp_path: Path) -> None:
    toy_notebook(tmp_path / "solutions" / "90_toy.ipynb")
    build.build(tmp_path / "solutions", tmp_path / "exercises")
    nb = json.loads((tmp_path / "exercises" / "90_toy.ipynb").read_text())
    tags = [c["metadata"].get("tags") for c in nb["cells"] if c["cell_type"] == "code"]
    # set-up, exercise, demo (calls the stub), exercise, check: only the demo may raise and Run All goes on.
    assert tags == [["setup"], ["exercise"], [build.DEMO_TAG], ["exercise"], ["check"]]


def test_a_failing_check_cell_reads_as_one_line_not_a_traceback(capsys: pytest.CaptureFixture) -> None:
    from course_lib.grading import check
    from course_lib.grading.check import ChecksFailed

    with pytest.raises(ChecksFailed) as failed:
        check("05", {})
    assert isinstance(failed.value, AssertionError)  # nbval and scripts still see a failing cell
    assert failed.value._render_traceback_() == ["\x1b[31mexercise 05: 5 check(s) to fix (see the table above)\x1b[0m"]
    assert "warmup == steps" in capsys.readouterr().out


def test_learner_text_is_escaped_and_names_are_never_cut() -> None:
    from course_lib.grading.api import CheckResult
    from course_lib.grading.report import format_results

    long_name = "a check name that is much longer than forty characters, on purpose"
    table = format_results([CheckResult("90", long_name, 1, passed=False, message="bad \x1b[2J\x1b[31mred",
                                        got="\x07bell")])
    assert long_name in table and "\x1b" not in table and "\x07" not in table and "\\x1b[2J" in table
    assert "expected:" not in table  # no expected value: no "expected: None" line


def test_each_row_names_the_parts_it_checks_and_a_repeated_blank_is_said_once() -> None:
    from course_lib.grading.api import CheckResult, check_for
    from course_lib.grading.report import format_results

    blank = "not attempted yet: Exercise 14.1: collect every state_dict"
    rows = [CheckResult("14", "resumes", 1, passed=False, message=blank, parts=("14.1", "14.2")),
            CheckResult("14", "scaler", 1, passed=False, message=blank, parts=("14.1",)),
            CheckResult("14", "atomic", 2, passed=True, parts=("14.3",)),
            CheckResult("90", "no parts known", 1, passed=True)]
    table = format_results(rows)
    lines = table.splitlines()
    assert lines[0].startswith("part ")
    assert any(line.startswith("14.1+2 resumes") for line in lines)
    assert any(line.startswith("14.3   atomic") for line in lines)
    assert any(line.startswith("90     no parts known") for line in lines)
    assert CheckResult("04", "x", 1, passed=True, parts=("04.1", "04.2", "04.3", "04.5")).part_label == "04.1-3+5"
    assert table.count("collect every state_dict") == 1 and "Exercise 14.1 (as above)" in table
    assert CheckResult.from_dict(rows[0].to_dict() | {"parts": ["14.1", "14.2"]}).parts == ("14.1", "14.2")
    for bad in ("14.1", ("4.1",), ("14.x",), ("15.1",)):
        with pytest.raises(ValueError, match="parts="):
            check_for("14", "x", parts=bad)


def test_reference_use_is_flagged(tmp_path: Path) -> None:
    from course_lib.grading.reference_use import reference_uses

    def nb_with(code: str) -> dict:
        cell = nbformat.v4.new_code_cell(code)
        cell.metadata["tags"] = ["exercise"]
        setup = nbformat.v4.new_code_cell("import course_lib.train as T")
        setup.metadata["tags"] = ["setup"]
        return {"cells": [setup, cell]}

    assert reference_uses(nb_with("def lr_at(step, cfg):\n    return T.lr_at(step, cfg)"), "05") == [
        "course_lib.train.schedule.lr_at"]
    assert reference_uses(nb_with("from course_lib.train.schedule import lr_at as f"), "05")
    assert reference_uses(nb_with("def lr_at(step, cfg):\n    return cfg.lr"), "05") == []
    for solution in sorted((REPO / "solutions").glob("[0-9][0-9]_*.ipynb")):
        assert reference_uses(notebook.read(solution), notebook.exercise_number(solution)) == [], solution.name


def test_grading_survives_reordered_duplicated_split_and_untagged_cells(tmp_path: Path, extra: Path) -> None:
    tmp_path = tmp_path / "class"
    base = toy_notebook(tmp_path / "base" / "90_toy.ipynb")
    nb = nbformat.read(base, as_version=4)
    variants = {}
    reordered = nbformat.from_dict(json.loads(json.dumps(nb)))
    reordered.cells = [reordered.cells[i] for i in (0, 4, 2, 3, 1, 5)]  # exercises moved above the set-up
    variants["reordered"] = reordered
    duplicated = nbformat.from_dict(json.loads(json.dumps(nb)))
    duplicated.cells.insert(3, nbformat.from_dict(json.loads(json.dumps(nb.cells[2]))))
    variants["duplicated"] = duplicated
    split = nbformat.from_dict(json.loads(json.dumps(nb)))
    helper = nbformat.v4.new_code_cell("def twice(x):\n    return x + x")  # split off, untagged
    split.cells.insert(2, helper)
    split.cells[3].source = "def double(x):\n    return twice(x)"
    variants["split"] = split
    untagged = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in untagged.cells:
        cell.metadata.pop("tags", None)
    variants["untagged"] = untagged
    deleted = nbformat.from_dict(json.loads(json.dumps(nb)))
    del deleted.cells[4]  # the cell defining half
    variants["deleted"] = deleted
    minor = json.loads(json.dumps(nb))
    minor["nbformat_minor"] = 2
    for cell in minor["cells"]:
        cell.pop("id", None)
    for name, version in variants.items():
        (tmp_path / name).mkdir()
        nbformat.write(version, tmp_path / name / "90_toy.ipynb")
    (tmp_path / "minor" ).mkdir()
    (tmp_path / "minor" / "90_toy.ipynb").write_text(json.dumps(minor))
    from course_lib.grading.grade import grade_class

    table = grade_class(tmp_path, ["90"], timeout_s=120, extra_dirs=[extra], jobs=2)
    scores = {student: grades["90"].earned for student, grades in table.items()}
    assert scores == {"base": 3, "reordered": 3, "duplicated": 3, "split": 3, "untagged": 3, "deleted": 1,
                      "minor": 3}
    assert all(grades["90"].status == "graded" for grades in table.values())


def _replaces_torch(ns: dict) -> int:
    """Observed next to learner code that replaces torch.compile and the matmul precision, and never restores."""
    ns["tamper"]()
    return 1


@check_for("91", "learner code replaces torch attributes")
def _tampered(ns: dict) -> None:
    observe(ns, _replaces_torch)


def test_in_process_grading_puts_back_what_learner_code_replaced_in_torch() -> None:
    """In-process paths (tests, `check()` in a notebook) share torch with the learner's code: a replaced
    torch.compile must not outlive the check (it once leaked into later tests of the same pytest worker)."""
    import torch

    from course_lib.grading.check import check
    from course_lib.grading.inprocess import observe_and_judge

    original, precision = torch.compile, torch.get_float32_matmul_precision()

    def tamper() -> None:
        torch.compile = lambda model, **kwargs: model
        torch.set_float32_matmul_precision("medium" if precision != "medium" else "high")

    ns = {"tamper": tamper}
    (result,) = observe_and_judge("91", ns)
    assert result.passed
    assert torch.compile is original and torch.get_float32_matmul_precision() == precision
    check("91", ns)
    assert torch.compile is original and torch.get_float32_matmul_precision() == precision


def test_grade_joins_a_roster_into_the_exports_and_sets_aside_whom_it_cannot_map(tmp_path: Path, extra: Path,
                                                                                  monkeypatch, capsys) -> None:
    from course_lib.grading import grade

    subs, out = tmp_path / "class", tmp_path / "out" / "grades.csv"
    (subs / "ada").mkdir(parents=True)
    (tmp_path / "roster.csv").write_text("folder,login,name,email\nada,ada.l,Ada,ada@example.edu\n", encoding="utf-8")
    monkeypatch.setattr(grade, "grade_class", lambda *a, **k: _toy_table(doubles_passed=True))
    command = [str(subs), "--out", str(out), "--exercises", "90", "--extra-tests", str(extra),
               "--roster", str(tmp_path / "roster.csv"), "--id-column", "email"]
    assert grade_main(command) == 0
    err = capsys.readouterr().err
    assert "warning: 1 graded student(s) are in no export" in err and "=1+1 Zoë" in err, err
    moodle = list(csv.reader((out.parent / "grades-moodle.csv").open(encoding="utf-8")))
    assert moodle[1:] == [["Ada", "ada.l", "ada@example.edu", "", "3"]]
    unmapped = list(csv.reader((out.parent / "grades-unmapped.csv").open(encoding="utf-8")))
    assert unmapped[1] == ["'=1+1 Zoë", "not on the roster", "3"]
    (tmp_path / "roster.csv").write_text("folder,login,name,email\nada,ada.l,Ada,ada@example.edu\n"
                                         "=1+1 Zoë,zoe,Zoë,zoe@example.edu\n", encoding="utf-8")
    assert grade_main(command) == 0
    assert not (out.parent / "grades-unmapped.csv").exists()  # last run's list is not left beside this run's set
    with pytest.raises(SystemExit):
        grade_main([*command[:-4], "--roster", str(tmp_path / "missing.csv")])
    assert "--roster" in capsys.readouterr().err


# ---------------------------------------------------------------- what is graded as whose work, and where it goes


def test_renamed_copies_are_found_and_named_in_a_note(tmp_path: Path) -> None:
    from course_lib.grading.runner import find_notebooks, renamed_note

    for name in ("05_lr_schedule (1).ipynb", "07_accumulation.ipynb", "07_accumulation (2).ipynb",
                 "08_amp_step - Copy.ipynb", "notes.ipynb"):
        (tmp_path / name).write_text("{}")
    found = find_notebooks(tmp_path)
    assert {n: p.name for n, p in found.items()} == {
        "05": "05_lr_schedule (1).ipynb", "07": "07_accumulation.ipynb", "08": "08_amp_step - Copy.ipynb"}
    assert renamed_note(found["05"]) == "graded '05_lr_schedule (1).ipynb', a renamed copy: hand it in as " \
                                        "05_lr_schedule.ipynb"
    assert renamed_note(found["07"]) == ""


@pytest.mark.parametrize("name", ["Copy of 05_lr_schedule.ipynb", "05_lr_schedule-1.ipynb",
                                  "05_lr_schedule (1) (1).ipynb", "Copy of 05_lr_schedule (2).ipynb",
                                  "05_lr_schedule copy 2.ipynb", "05_lr_schedule-2 (1).ipynb"])
def test_names_platforms_give_hand_ins_are_found(tmp_path: Path, name: str) -> None:
    """Seen: Colab's "Copy of", Canvas's resubmission "-1" and a twice-downloaded "(1) (1)" scored 0 as missing."""
    from course_lib.grading.runner import find_notebooks, renamed_note

    (tmp_path / name).write_text("{}")
    (tmp_path / "notes-1.ipynb").write_text("{}")
    found = find_notebooks(tmp_path)
    assert {n: p.name for n, p in found.items()} == {"05": name}
    assert renamed_note(found["05"]).endswith("a renamed copy: hand it in as 05_lr_schedule.ipynb")


def test_csv_cells_never_run_as_spreadsheet_formulas(tmp_path: Path) -> None:
    from course_lib.grading.api import CheckResult
    from course_lib.grading.grade import write_csv
    from course_lib.grading.runner import NotebookGrade

    def grade() -> NotebookGrade:
        return NotebookGrade("90", [CheckResult("90", "doubles", 1, passed=True)])

    names = ['=HYPERLINK("http://example.invalid","x")', "+1", "-2", "@SUM(A1)", "ada"]
    out = tmp_path / "grades.csv"
    write_csv({name: {"90": grade()} for name in names}, ["90"], out)
    rows = list(csv.DictReader(out.open()))
    assert [r["student"] for r in rows] == ["'" + n for n in names[:4]] + ["ada"]
    assert all(r["ex90"] == "1" for r in rows)


def test_links_are_refused_renamed_copies_graded_and_the_output_never_a_student(tmp_path: Path, extra: Path) -> None:
    subs = tmp_path / "class"
    toy_notebook(subs / "ada" / "90_toy.ipynb")
    (subs / "bob").mkdir()
    (subs / "bob" / "90_toy.ipynb").symlink_to(subs / "ada" / "90_toy.ipynb")  # a classmate's notebook
    (subs / "cy").symlink_to(subs / "ada", target_is_directory=True)  # a classmate's whole folder
    toy_notebook(subs / "dee" / "90_toy (1).ipynb")  # a browser's second download
    out = subs / "grades.csv"  # inside the class folder, with its feedback folder beside it
    code = grade_main([str(subs), "--out", str(out), "--exercises", "90", "--extra-tests", str(extra),
                       "--timeout", "120", "--jobs", "2"])
    assert code == 0
    rows = {row["student"]: row for row in csv.DictReader(out.open())}
    assert {s: rows[s]["total"] for s in rows} == {"ada": "3", "bob": "0", "cy": "0", "dee": "3"}
    assert rows["bob"]["status"] == rows["cy"]["status"] == "ex90 refused (a link)"
    assert "renamed copy" in rows["dee"]["flags"]
    feedback = (subs / "grades-feedback" / "bob" / "feedback.txt").read_text()
    assert "is a link" in feedback
    # The next run does not grade the feedback folder as a student called "grades-feedback".
    from course_lib.grading.grade import student_folders

    again = [p.name for p in student_folders(subs, [out, subs / "grades-feedback"])]
    assert again == ["ada", "bob", "cy", "dee"]


def test_an_output_that_cannot_be_written_is_refused_before_any_grading(tmp_path: Path, capsys) -> None:
    subs = tmp_path / "class"
    toy_notebook(subs / "ada" / "90_toy.ipynb")
    for args in (["--out", str(tmp_path)], ["--out", str(tmp_path / "g.csv"), "--feedback", str(subs / "ada" /
                                                                                                 "90_toy.ipynb")]):
        with pytest.raises(SystemExit) as stop:
            grade_main([str(subs), *args, "--exercises", "90"])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "error:" in err and ("is a folder" in err or "is a file" in err)
    assert not (tmp_path / "g.csv").exists()


def test_observations_that_decode_to_more_than_the_file_are_rejected(tmp_path: Path) -> None:
    """A few KB of zero-stride views would become a gigabyte once a judge touched them: such a file is no
    observation (the check fails), and ordinary records still load."""
    import torch

    from course_lib.grading.runner import _load_observations
    from course_lib.grading.worker import observations_file

    torch.save([{"key": "k", "value": torch.zeros(1).expand(10**9)}], observations_file(tmp_path, 0))
    torch.save([{"key": "k", "value": torch.zeros(1 << 25)}], observations_file(tmp_path, 1))  # 32 M elements
    torch.save([{"key": "k", "value": [torch.arange(6).view(2, 3), {"loss": 0.5}]}], observations_file(tmp_path, 2))
    assert observations_file(tmp_path, 0).stat().st_size < 4096
    assert _load_observations(tmp_path, 0, 1 << 30) is None
    assert _load_observations(tmp_path, 1, 1 << 30) is None
    loaded = _load_observations(tmp_path, 2, 1 << 30)
    assert loaded is not None and torch.equal(loaded[0]["value"][0], torch.arange(6).view(2, 3))


def test_the_grader_judges_under_a_memory_limit(tmp_path: Path, extra: Path) -> None:
    """The backstop behind the decoding cap: `grade` lowers its own data-segment limit (checked in a child process,
    so this test's process keeps its own), and an allocation past it is a MemoryError, not a machine out of memory."""
    toy_notebook(tmp_path / "class" / "ada" / "90_toy.ipynb")
    script = (
        "import resource, sys\n"
        "from course_lib.grading.grade import main\n"
        f"code = main([{str(tmp_path / 'class')!r}, '--out', {str(tmp_path / 'g.csv')!r}, '--exercises', '90',"
        f" '--extra-tests', {str(extra)!r}])\n"
        "print('limit', resource.getrlimit(resource.RLIMIT_DATA)[0] >> 20)\n"
        "try:\n"
        "    hog = bytearray(9 << 30)\n"
        "    print('allocated')\n"
        "except MemoryError:\n"
        "    print('MemoryError')\n"
        "sys.exit(code)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "limit 8192" in proc.stdout and "MemoryError" in proc.stdout, proc.stdout[-500:]


# ---------------------------------------------------------------- hand-ins as the platforms give them


def test_canvas_and_moodle_downloads_are_collected_and_graded_with_no_missing_exercise(tmp_path: Path, extra: Path,
                                                                                     capsys) -> None:
    """Seen: a Canvas zip and a Moodle download had to be unpacked and renamed by hand, and any name grade did not
    know scored 0 as missing, silently."""
    import zipfile

    from course_lib.grading.collect import main as collect_main

    notebook_bytes = toy_notebook(tmp_path / "made" / "90_toy.ipynb").read_bytes()
    canvas = tmp_path / "submissions.zip"
    with zipfile.ZipFile(canvas, "w") as archive:
        for name in ("ada_101_9001_90_toy.ipynb", "bob_late_102_9002_Copy of 90_toy.ipynb",
                     "cy_103_9003_90_toy-1.ipynb", "dee_smith_104_9004_Dee's 90 Toy final.ipynb"):
            archive.writestr(name, notebook_bytes)
        archive.writestr("ada_101_9006_notes.txt", b"my notes")
    moodle = tmp_path / "moodle"
    for folder, name in (("Zoë O'Brien_201_assignsubmission_file_", "90_toy (1).ipynb"),
                         ("Ada Lovelace_202_assignsubmission_file_", "ex90 toy.ipynb")):
        (moodle / folder).mkdir(parents=True)
        (moodle / folder / name).write_bytes(notebook_bytes)
    moodle_zip = tmp_path / "moodle.zip"
    with zipfile.ZipFile(moodle_zip, "w") as archive:
        for path in sorted(moodle.rglob("*.ipynb")):
            archive.write(path, str(path.relative_to(moodle)))
    titles = ["--titles-from", str(tmp_path / "made")]  # the toy exercise's title (the course's come from its checks)

    assert collect_main(["--canvas", str(canvas), "--into", str(tmp_path / "c"), *titles]) == 0
    err = capsys.readouterr().err
    assert "warning: ada: 'notes.txt' is not graded" in err, err
    assert "dee_smith: handed in as \"Dee's 90 Toy final.ipynb\", saved as 90_toy.ipynb" in err, err
    assert collect_main(["--moodle", str(moodle_zip), "--into", str(tmp_path / "m"), *titles]) == 0
    assert collect_main(["--moodle", str(moodle), "--into", str(tmp_path / "m2"), *titles]) == 0
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["Ada Lovelace", "Zoë O'Brien", "collected.csv"]
    assert sorted(str(p.relative_to(tmp_path / "m")) for p in (tmp_path / "m").rglob("*.ipynb")) == sorted(
        str(p.relative_to(tmp_path / "m2")) for p in (tmp_path / "m2").rglob("*.ipynb"))
    with pytest.raises(SystemExit):  # never mixed into a class folder that holds hand-ins already
        collect_main(["--canvas", str(canvas), "--into", str(tmp_path / "c")])

    flags = {}
    for layout in ("c", "m"):
        out = tmp_path / f"grades-{layout}.csv"
        assert grade_main([str(tmp_path / layout), "--out", str(out), "--exercises", "90", "--extra-tests", str(extra),
                           "--jobs", "2", "--timeout", "60"]) == 0
        for row in csv.DictReader(out.open(encoding="utf-8")):
            assert (row["ex90"], row["status"]) == ("3", "graded"), row
            flags[row["student"]] = row["flags"]
    assert set(flags) == {"ada", "bob", "cy", "dee_smith", "Ada Lovelace", "Zoë O'Brien"}
    assert "late" in flags["bob"] and "a renamed copy" in flags["bob"] and "a renamed copy" in flags["cy"]
    assert "handed in as \"Dee's 90 Toy final.ipynb\"" in flags["dee_smith"]
    assert "handed in as 'ex90 toy.ipynb'" in flags["Ada Lovelace"] and flags["ada"] == ""


def test_a_second_regrade_of_an_unchanged_class_runs_no_notebook(tmp_path: Path, extra: Path, monkeypatch,
                                                                 capsys) -> None:
    """Seen: --regrade re-ran every notebook (84 s against 77 s), and one student could not be graded alone."""
    from course_lib.grading import grade

    subs, out = tmp_path / "class", tmp_path / "grades.csv"
    toy_notebook(subs / "ada" / "90_toy.ipynb")
    toy_notebook(subs / "bob" / "90_toy.ipynb", double_body="return x + 2")
    ran: list[str] = []
    real = grade.grade_notebook
    monkeypatch.setattr(grade, "grade_notebook",
                        lambda path, *a, **k: ran.append(path.parent.name) or real(path, *a, **k))
    command = [str(subs), "--out", str(out), "--exercises", "90", "--extra-tests", str(extra), "--jobs", "1"]

    def run(*more: str) -> dict[str, dict[str, str]]:
        ran.clear()
        assert grade_main([*command, *more]) == 0
        return {row["student"]: row for row in csv.DictReader(out.open(encoding="utf-8"))}

    first = run()
    assert sorted(ran) == ["ada", "bob"] and (first["ada"]["ex90"], first["bob"]["ex90"]) == ("3", "2")
    feedback_before = (tmp_path / "grades-feedback" / "bob" / "feedback.txt").read_text()
    again = run("--regrade", str(out))
    assert ran == [] and again == first
    assert "0 of 2 student(s) changed" in (tmp_path / "grades-regrade.txt").read_text()
    assert (tmp_path / "grades-feedback" / "bob" / "feedback.txt").read_text() == feedback_before
    assert "2 notebook(s) unchanged since they were graded: not run again" in capsys.readouterr().out

    toy_notebook(subs / "bob" / "90_toy.ipynb")  # bob fixes his notebook: only his runs
    fixed = run("--regrade", str(out))
    assert ran == ["bob"] and fixed["bob"]["ex90"] == "3"
    assert "bob ex90: 2 -> 3" in (tmp_path / "grades-regrade.txt").read_text()

    toy_notebook(subs / "bob" / "90_toy.ipynb", half_body="return x")  # changed, but only ada is asked for
    alone = run("--students", "ada")
    assert ran == ["ada"] and alone["bob"]["ex90"] == "3" and "not graded again (--students)" in alone["bob"]["flags"]
    assert sorted(run()) == ["ada", "bob"] and ran == ["bob"]  # bob's change is still seen as one
    assert sorted(run("--no-reuse") and ran) == ["ada", "bob"]
    with pytest.raises(SystemExit):
        grade_main([*command, "--students", "nobody"])


def test_instructor_overrides_show_with_their_reason_and_survive_regrades(tmp_path: Path, extra: Path, monkeypatch,
                                                                         capsys) -> None:
    from course_lib.grading import grade

    subs, out = tmp_path / "class", tmp_path / "grades.csv"
    toy_notebook(subs / "ada" / "90_toy.ipynb")
    toy_notebook(subs / "bob" / "90_toy.ipynb", double_body="return x + 2")
    (subs / "cy").mkdir()  # handed in by email, too late for the run
    overrides = tmp_path / "overrides.csv"
    overrides.write_text('student,exercise,points,reason\n'
                         'ada,90,-1,"halves copied from a classmate, agreed with Zoë"\n'
                         'bob,ex90,+1,regrade request: doubling was right for the task as written\n'
                         'cy,90,set 2,graded by hand from the emailed notebook\n', encoding="utf-8")
    ran: list[str] = []
    real = grade.grade_notebook
    monkeypatch.setattr(grade, "grade_notebook",  # cy's missing notebook (path None) runs nothing
                        lambda path, *a, **k: (path and ran.append(path.parent.name)) or real(path, *a, **k))
    command = [str(subs), "--out", str(out), "--exercises", "90", "--extra-tests", str(extra), "--jobs", "1"]

    def run(*more: str) -> dict[str, dict[str, str]]:
        ran.clear()
        assert grade_main([*command, *more]) == 0
        return {row["student"]: row for row in csv.DictReader(out.open(encoding="utf-8"))}

    def exported() -> dict[str, str]:
        rows = list(csv.DictReader((tmp_path / "grades-canvas.csv").open(encoding="utf-8")))
        return {row["Student"]: row["Exercise 90"] for row in rows if row["Student"] in ("ada", "bob", "cy")}

    first = run("--overrides", str(overrides))
    assert {s: (first[s]["ex90"], first[s]["total"]) for s in first} == {"ada": ("2", "2"), "bob": ("3", "3"),
                                                                         "cy": ("2", "2")}
    assert "instructor override: -1 point (the checks gave 3): halves copied from a classmate, agreed with Zoë" \
        in first["ada"]["flags"]
    assert exported() == {"ada": "2", "bob": "3", "cy": "2"}  # cy's override is a grade, not a blank
    feedback = (tmp_path / "grades-feedback" / "bob" / "feedback.txt").read_text(encoding="utf-8")
    assert "exercise 90: 3/3 points" in feedback
    assert "+1 point (the checks gave 2): regrade request: doubling was right" in feedback
    results = json.loads((tmp_path / "grades-feedback" / "bob" / "results.json").read_text(encoding="utf-8"))
    assert results["score"] == 3 and "instructor override" in results["output"]

    again = run("--regrade", str(out))  # no --overrides: the ones kept with the feedback apply again
    assert ran == [] and again == first and exported() == {"ada": "2", "bob": "3", "cy": "2"}
    assert "0 of 3 student(s) changed" in (tmp_path / "grades-regrade.txt").read_text()
    assert "applying the previous run's 3 override(s)" in capsys.readouterr().out

    toy_notebook(subs / "bob" / "90_toy.ipynb")  # bob fixes his notebook; only he is graded again
    alone = run("--students", "bob")
    assert ran == ["bob"] and (alone["ada"]["ex90"], alone["bob"]["ex90"], alone["cy"]["ex90"]) == ("2", "3", "2")
    assert "the checks gave 3" in alone["bob"]["flags"]

    overrides.write_text("student,exercise,points,reason\n", encoding="utf-8")  # the instructor drops them all
    dropped = run("--overrides", str(overrides))
    assert ran == [] and (dropped["ada"]["ex90"], dropped["bob"]["ex90"], dropped["cy"]["ex90"]) == ("3", "3", "0")
    assert exported()["cy"] == ""


@pytest.mark.parametrize("row, named", [
    ("nobody,90,+1,late", "no student folder 'nobody'"),
    ("ada,05,+1,late", "exercise '05' is not graded in this run"),
    ("ada,90,2,late", "points '2' is not '+N', '-N' or 'set N'"),
    ("ada,90,+1,", "no reason"),
])
def test_a_bad_override_is_refused_in_one_line_before_grading(tmp_path: Path, extra: Path, row: str, named: str,
                                                             capsys) -> None:
    toy_notebook(tmp_path / "class" / "ada" / "90_toy.ipynb")
    overrides = tmp_path / "overrides.csv"
    overrides.write_text(f"student,exercise,points,reason\n{row}\n", encoding="utf-8")
    with pytest.raises(SystemExit) as stop:
        grade_main([str(tmp_path / "class"), "--out", str(tmp_path / "g.csv"), "--exercises", "90",
                    "--extra-tests", str(extra), "--overrides", str(overrides)])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and named in err[0], err
    assert "line 2" in err[0] and not (tmp_path / "g.csv").exists()
