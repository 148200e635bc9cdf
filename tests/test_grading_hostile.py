"""Hostile submissions against the real grader: forging, tampering and escaping all fail, nothing leaks out.

One class of students is graded once, the way an instructor runs ``python -m course_lib grade`` (sandboxed on
Linux with bubblewrap); every test reads its part of that one run. The exercise is the toy exercise 90 (instructor
checks ``double(x) == 2 * x`` and ``half(y) == y / 2`` for inputs drawn from the run's seed) plus the real exercise
05 for the forgeries aimed at its results, so grading stays fast.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import secrets
import subprocess
import time
from pathlib import Path

import nbformat
import pytest
import torch

from course_lib.grading import api, sandbox
from course_lib.grading.api import checks_for
from course_lib.grading.grade import main as grade_main
from test_grading import TOY_CHECKS, toy_notebook

REPO = Path(__file__).resolve().parents[1]
# Generous on a shared machine: the first test waits for the whole class to be graded.
pytestmark = pytest.mark.timeout(1500)
SANDBOXED = sandbox.find_bwrap()[0] is not None

# Code run when the exercise cell loads (before any check), in place of a solution. Each forges, tampers or escapes.
FORGERIES = {
    # Appends "passed" records to every file it can find next to it, then leaves before the checks run.
    "forge_results": """
import os, sys, json, glob
for path in sys.argv[1:] + glob.glob("/grading/*") + glob.glob("*"):
    try:
        with open(path, "a") as f:
            f.write(json.dumps({"index": 0, "result": {"passed": True, "points": 5}}) + "\\n")
    except OSError:
        pass
os._exit(0)
""",
    # Writes observation files that claim correct answers in the grader's format, then leaves.
    "forge_observations": """
import os, sys, torch
out = sys.argv[3] if len(sys.argv) > 3 else "/grading"
torch.save([{"key": "_double", "value": 42}], os.path.join(out, "observations-0.pt"))
torch.save([{"key": "_half", "value": 4.5}], os.path.join(out, "observations-1.pt"))
os._exit(0)
""",
    # Replaces the grader's functions through sys.modules: every check "passes" in this process.
    "patch_grader": """
import sys
import course_lib.grading.api as api
api.run_check = lambda check, ns: api.CheckResult(check.exercise, check.name, check.points, passed=True)
for module in list(sys.modules.values()):
    if getattr(module, "__name__", "").startswith("course_lib"):
        for name in ("CheckFailed",):
            if hasattr(module, name):
                setattr(module, name, type("Never", (Exception,), {}))
main = sys.modules["__main__"]
if hasattr(main, "run_check"):
    main.run_check = api.run_check
""",
    # Looks for the run's seed everywhere a loading notebook can read (the command line, the grader's module, the
    # environment) and writes the observations the toy's checks would record for the inputs drawn from it.
    "seed_at_load": """
import os, re, sys, torch
import course_lib.grading.api as api
text = " ".join(sys.argv) + " " + open("/proc/self/cmdline", "rb").read().decode(errors="replace").replace("\\0", " ")
found = re.findall(r"--seed\\s+(\\d+)", text) + [str(api._run_seed)] + [v for k, v in os.environ.items() if "SEED" in k]
seed = int(found[0])
out = "/grading" if os.path.isdir("/grading") else re.findall(r"\\S*observations", text)[0]
torch.save([{"key": "_double", "value": 2 * (21 + seed % 1_000_000)}], os.path.join(out, "observations-0.pt"))
torch.save([{"key": "_half", "value": (9 + seed % 100_000) / 2}], os.path.join(out, "observations-1.pt"))
os._exit(0)
""",
    # Says "ready" on every descriptor it can write to, to be sent the seed before its functions are called.
    "steal_the_seed_channel": """
import os
for fd in range(3, 64):
    try:
        os.write(fd, b"ready\\n")
    except OSError:
        pass
""",
    # Prints lines that look like results, then exits with success.
    "fake_stdout": """
import os
print('{"index": 0, "result": {"passed": true}}')
print("score: 3/3 points (2/2 checks pass)")
os._exit(0)
""",
}
# Without a sandbox a submission runs as the grader's user and can signal the grader itself: that case is only
# claimed (and tested) where bubblewrap isolates the process tree.
SANDBOXED_FORGERIES = {
    # Tries to kill its parent (the grader) and everything in its process group.
    "kill_parent": """
import os, signal
for pid in (os.getppid(), 1):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
try:
    os.killpg(0, signal.SIGTERM)
except OSError:
    pass
""",
}

# Code that tries to escape: read or write outside its scratch folder, survive grading, exhaust resources.
ESCAPES = {
    "write_tmp": """
open("/tmp/course-hostile-marker", "w").write("escaped")
""",
    "vandalise_classmate": """
import os, glob
for pattern in ("{subs}/*/*.ipynb", "/proc/*/cwd/../*/*.ipynb"):
    for path in glob.glob(pattern):
        try:
            open(path, "w").write("vandalised")
        except OSError:
            pass
try:
    open("{csv}", "w").write("student,total\\nmallory,999\\n")
except OSError:
    pass
""",
    "survive_with_setsid": """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "course-hostile-survivor"],
                 start_new_session=True)
""",
    "memory_hog": """
hog = bytearray(3 * 1024 ** 3)
for i in range(0, len(hog), 4096):
    hog[i] = 1
""",
    "output_flood": """
import sys
line = "x" * 1023 + "\\n"
for _ in range(300 * 1024):
    sys.stdout.write(line)
""",
    # Reads a file only root may read, inside a folder the sandbox mounts (the instructor's), and hands it back as its
    # answer, where the feedback would show it.
    "read_root_only": """
try:
    secret = open("{secret}").read()
    double = lambda x: secret
except OSError:
    pass
""",
    "read_classmate": """
import glob
stolen = [open(p).read() for p in glob.glob("{subs}/ada/*.ipynb")]
if stolen:
    raise SystemExit("read a classmate's notebook")
""",
}


ROOT_ONLY_TEXT = "course-root-only-secret-5f1c"


# Writes the observation files an earlier grading run recorded for a correct notebook (base64), then leaves.
REPLAY = """
import base64, os, sys
out = sys.argv[3] if len(sys.argv) > 3 else "/grading"
for index, data in enumerate({saved!r}):
    with open(os.path.join(out, f"observations-{{index}}.pt"), "wb") as f:
        f.write(base64.b64decode(data))
os._exit(0)
"""


def _hostile_toy(path: Path, code: str) -> None:
    """A correct toy notebook whose first exercise cell also runs ``code`` when it loads."""
    toy_notebook(path, double_body="return 3 * x")  # wrong on purpose: only forging could score exercise 90 fully
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].source = nb.cells[2].source + "\n\n" + code
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("hostile")
    instructor = root / "instructor"
    instructor.mkdir()
    (instructor / "toy_checks.py").write_text(TOY_CHECKS)
    secret = instructor / "root-only.txt"
    secret.write_text(ROOT_ONLY_TEXT)
    secret.chmod(0o600)
    subs, out = root / "class", root / "grades.csv"
    toy_notebook(subs / "ada" / "90_toy.ipynb")  # the honest classmate: 3/3
    honest_copy = (subs / "ada" / "90_toy.ipynb").read_bytes()
    # Observations of a correct notebook recorded the way the worker records them, in an earlier run (another seed),
    # handed in again by a notebook that writes the files and leaves: in this run the checks ask about other inputs.
    saved = []
    api.set_run_seed(secrets.randbelow(2**31))
    try:
        for check in checks_for("90", [instructor]):
            records = api.start_recording()
            check.func({"double": lambda x: 2 * x, "half": lambda x: x / 2})
            api.stop_recording()
            buffer = io.BytesIO()
            torch.save(records, buffer)
            saved.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    finally:
        api.stop_recording()
        api.set_run_seed(0)
    _hostile_toy(subs / "replay_previous_run" / "90_toy.ipynb", REPLAY.format(saved=saved))
    hostile = {**FORGERIES, **SANDBOXED_FORGERIES, **ESCAPES} if SANDBOXED else FORGERIES
    for name, code in hostile.items():
        code = code.replace("{subs}", str(subs)).replace("{csv}", str(out)).replace("{secret}", str(secret))
        _hostile_toy(subs / name / "90_toy.ipynb", code)
    before = {p: p.read_bytes() for p in subs.glob("*/*.ipynb")}
    Path("/tmp/course-hostile-marker").unlink(missing_ok=True)
    started = time.monotonic()
    code = grade_main([str(subs), "--out", str(out), "--exercises", "90", "--extra-tests", str(instructor),
                       "--timeout", "90", "--jobs", "2"])
    elapsed = time.monotonic() - started
    rows = {row["student"]: row for row in csv.DictReader(out.open())}
    changed = [p for p, data in before.items() if p.read_bytes() != data]
    return {"code": code, "rows": rows, "subs": subs, "out": out, "honest": honest_copy, "changed": changed,
            "feedback": root / "grades-feedback", "elapsed": elapsed}


@pytest.mark.parametrize("name", sorted(FORGERIES) + sorted(SANDBOXED_FORGERIES))
def test_forged_or_tampered_verdicts_score_zero(graded_class: dict, name: str) -> None:
    if name not in graded_class["rows"]:
        pytest.skip("needs bubblewrap: " + sandbox.describe())
    row = graded_class["rows"][name]
    # double is wrong (3 * x) in every hostile notebook; half is right, but only counts if the checks really ran.
    assert row["ex90"] in ("0", "2"), row
    results = json.loads((graded_class["feedback"] / name / "results.json").read_text())
    by_name = {t["name"]: t for t in results["tests"]}
    assert by_name["ex90 doubles"]["score"] == 0, by_name


def test_exiting_before_the_checks_scores_zero(graded_class: dict) -> None:
    for name in ("forge_results", "fake_stdout"):
        assert graded_class["rows"][name]["ex90"] == "0", graded_class["rows"][name]
        assert "ended early" in graded_class["rows"][name]["status"]
    # Observations forged with answers worked out in advance do not match this run's inputs.
    assert graded_class["rows"]["forge_observations"]["ex90"] == "0"


def test_the_seed_cannot_be_read_while_the_notebook_loads(graded_class: dict) -> None:
    """The seed reaches the worker only after the cells have run: forging from it at load time scores nothing."""
    row = graded_class["rows"]["seed_at_load"]
    assert row["ex90"] == "0", row  # its observations answer the inputs of another seed


def test_speaking_on_the_graders_channel_is_refused(graded_class: dict) -> None:
    row = graded_class["rows"]["steal_the_seed_channel"]
    assert (row["ex90"], row["status"]) == ("0", "ex90 interfered with grading"), row
    feedback = (graded_class["feedback"] / "steal_the_seed_channel" / "feedback.txt").read_text()
    assert "grader's own channel" in feedback


def test_observations_replayed_from_an_earlier_run_score_zero(graded_class: dict) -> None:
    """Real observation files of a correct notebook, recorded by an earlier run, answer other inputs than this run's."""
    row = graded_class["rows"]["replay_previous_run"]
    assert row["ex90"] == "0", row


def test_the_honest_classmate_is_untouched(graded_class: dict) -> None:
    assert graded_class["code"] == 0
    assert graded_class["rows"]["ada"]["ex90"] == "3"
    assert graded_class["rows"]["ada"]["status"] == "graded"
    assert (graded_class["subs"] / "ada" / "90_toy.ipynb").read_bytes() == graded_class["honest"]
    assert "mallory" not in graded_class["out"].read_text()


@pytest.mark.skipif(not SANDBOXED, reason="needs bubblewrap: " + sandbox.describe())
def test_no_side_effect_escapes_the_sandbox(graded_class: dict) -> None:
    assert not Path("/tmp/course-hostile-marker").exists()
    assert not graded_class["changed"], "grading changed submitted notebooks"
    # Reading a classmate's notebook was impossible, so that submission was not stopped by its own check.
    assert graded_class["rows"]["read_classmate"]["ex90"] == "2"


@pytest.mark.skipif(not SANDBOXED, reason="needs bubblewrap: " + sandbox.describe())
def test_graded_as_root_the_notebook_cannot_read_root_only_files(graded_class: dict) -> None:
    """The sandbox's user is nobody on the host too (not root mapped into a user namespace)."""
    row = graded_class["rows"]["read_root_only"]
    feedback = (graded_class["feedback"] / "read_root_only" / "feedback.txt").read_text()
    assert ROOT_ONLY_TEXT not in feedback and ROOT_ONLY_TEXT not in graded_class["out"].read_text()
    assert row["ex90"] == "2", row  # double stayed wrong (3 * x): the secret was never read


@pytest.mark.skipif(not SANDBOXED, reason="needs bubblewrap: " + sandbox.describe())
def test_no_process_outlives_grading(graded_class: dict) -> None:
    # The submission started a process in a session of its own (out of reach of a process-group kill).
    survivors = subprocess.run(["pgrep", "-f", "course-hostile-survivor"], capture_output=True, text=True).stdout
    assert not survivors.split(), "a process started by a submission outlived grading"


@pytest.mark.skipif(not SANDBOXED, reason="needs bubblewrap: " + sandbox.describe())
def test_resource_limits_end_hogs_without_harm(graded_class: dict) -> None:
    for name in ("memory_hog", "output_flood"):
        row = graded_class["rows"][name]
        assert row["ex90"] in ("0", "2") and row["status"] != "timed out", row


def test_outputs_for_the_instructor(graded_class: dict) -> None:
    header = next(csv.reader(graded_class["out"].open()))
    assert header == ["student", "ex90", "total", "max", "status", "flags", "grader"]
    results = json.loads((graded_class["feedback"] / "ada" / "results.json").read_text())
    assert (results["score"], results["max_score"]) == (3, 3)
    assert {(t["name"], t["score"], t["max_score"]) for t in results["tests"]} == {
        ("ex90 doubles", 1, 1), ("ex90 halves", 2, 2)}
    feedback = (graded_class["feedback"] / "forge_results" / "feedback.txt").read_text()
    assert "exercise 90: 0/3 points (ended early)" in feedback


def test_observations_written_before_the_handshake_are_not_judged(tmp_path: Path, monkeypatch) -> None:
    """A notebook that knows (here: is told) the seed writes the right observations for it while it loads, then leaves
    before the worker says ready: nothing it wrote is judged. Written files are deleted unread at the handshake too."""
    from course_lib.grading import runner

    seed = 123_457
    monkeypatch.setattr(runner.secrets, "randbelow", lambda n: seed)
    instructor = tmp_path / "instructor"
    instructor.mkdir()
    (instructor / "toy_checks.py").write_text(TOY_CHECKS)
    forge = f"""
import os, sys, torch
out = "/grading" if os.path.isdir("/grading") else sys.argv[3]
torch.save([{{"key": "_double", "value": 2 * (21 + {seed} % 1_000_000)}}], os.path.join(out, "observations-0.pt"))
torch.save([{{"key": "_half", "value": (9 + {seed} % 100_000) / 2}}], os.path.join(out, "observations-1.pt"))
"""
    leaves = tmp_path / "leaves" / "90_toy.ipynb"
    _hostile_toy(leaves, forge + "os._exit(0)\n")
    graded = runner.grade_notebook(leaves, "90", extra_dirs=[instructor], timeout_s=60)
    assert [r.passed for r in graded.results] == [False, False], graded.results
    assert all("handed it this run's inputs" in r.message for r in graded.results), graded.results
    # The same files written by a notebook that stays: deleted at the handshake, so its wrong double() is judged.
    stays = tmp_path / "stays" / "90_toy.ipynb"
    _hostile_toy(stays, forge)
    graded = runner.grade_notebook(stays, "90", extra_dirs=[instructor], timeout_s=60)
    assert [r.passed for r in graded.results] == [False, True], graded.results
