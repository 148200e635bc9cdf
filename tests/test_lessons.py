"""Every lesson, executed top to bottom in smoke mode as the course website executes it, once per test run.

One test per lesson (errors reported with the cell and its traceback). The executed notebooks are what
tests/test_site.py renders: whichever test process asks for a lesson first executes it, the other waits for it and
reuses it (:func:`execute_once`). This file takes the lessons first to last while the site's fixture takes them last
to first, so on two test processes the lessons split between them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import REPO
from course_lib import mode, website
from course_lib.perf import claims

LESSONS = website.lessons(REPO)
FOLDERS = website.SiteFolders(root=REPO, mode=mode.mode())


def execute_once(lesson: Path, run_id: str) -> None:
    """Execute ``lesson`` for the site once in this test run, whichever test process asks first.

    The test processes share the executed folder. A file lock per lesson makes the second asker wait for the first and
    then reuse its notebook; a marker holding the run's id (pytest-xdist's ``testrun_uid``, the same in every test
    process) tells "executed in this run" from a leftover of an earlier run, which is executed again: a test run
    always executes every lesson.
    """
    import fcntl

    FOLDERS.executed.mkdir(parents=True, exist_ok=True)
    marker = FOLDERS.executed / f"{lesson.stem}.run"
    with open(FOLDERS.executed / f"{lesson.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        if marker.is_file() and marker.read_text() == run_id:
            return
        marker.unlink(missing_ok=True)
        # The lesson's kernel runs with the device audit (tests/conftest.py), whichever test asked for it.
        previous = os.environ.get("COURSE_DEVICE_AUDIT")
        os.environ["COURSE_DEVICE_AUDIT"] = "1"
        try:
            website.execute(lesson, FOLDERS.executed, force=True)
        finally:
            if previous is None:
                del os.environ["COURSE_DEVICE_AUDIT"]
            else:
                os.environ["COURSE_DEVICE_AUDIT"] = previous
        marker.write_text(run_id)


def raw_ansi_outputs(nb: dict) -> list[str]:
    """Outputs (streams, text, HTML) carrying raw ANSI escape codes; tracebacks are coloured on purpose."""
    found = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            values = [out.get("text", ""), *(out.get("data") or {}).values()]
            texts = ["".join(v) if isinstance(v, list) else v for v in values if isinstance(v, (str, list))]
            found += [text[:200] for text in texts if "\x1b[" in text]
    return found


def test_raw_ansi_codes_are_found() -> None:
    nb = {"cells": [{"outputs": [{"output_type": "stream", "text": ["ok\n"]},
                                 {"output_type": "execute_result", "data": {"text/plain": "\x1b[31mred\x1b[0m"}}]}]}
    assert raw_ansi_outputs(nb) == ["\x1b[31mred\x1b[0m"]
    assert raw_ansi_outputs({"cells": [{"cell_type": "markdown"}]}) == []


@pytest.mark.timeout(900)
@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs(lesson, testrun_uid):
    execute_once(lesson, testrun_uid)
    executed = json.loads((FOLDERS.executed / lesson.name).read_text(encoding="utf-8"))
    shown = raw_ansi_outputs(executed)
    assert not shown, f"{lesson.name} prints raw ANSI colour codes (JupyterLab shows them as garbage): {shown[:3]}"
    log = website.claim_log_of(FOLDERS.executed, lesson)
    if log.is_file():  # every verdict the lesson showed re-derives from its rounds, and none refuses to teach
        count, found = claims.check_file(log)
        assert not found, f"{lesson.name}: {count} claims, inconsistent:\n" + "\n".join(found)
        shown = log.read_text(encoding="utf-8")
        assert "too busy" not in shown and lesson.name in shown


@pytest.mark.timeout(600)
def test_a_lesson_beside_two_busy_processes_still_teaches(tmp_path):
    """Two other programs hold the cores: the welcome lesson's verdict moves to CPU time, says so, and re-derives."""
    from course_lib.perf.busy import BusyCores

    lesson = REPO / "notebooks" / "00_welcome.ipynb"
    with BusyCores(2, max_s=300):
        website.execute(lesson, tmp_path, force=True)
    count, found = claims.check_file(website.claim_log_of(tmp_path, lesson))
    assert count >= 1 and not found, found
    shown = [json.loads(line) for line in website.claim_log_of(tmp_path, lesson).read_text().splitlines()]
    assert all(c["quantity"] == "cpu" and "Decided on CPU time" in c["sentence"] for c in shown), shown
