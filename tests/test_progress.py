"""A forked run killed while it holds the progress-bar lock must not hang the next bar of its parent."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The parent forks a child that takes tqdm's write lock and SIGKILLs itself while holding it (as a run killed in the
# middle of drawing its bar does); then the parent, and a second fork, each create a bar. With tqdm's own default
# lock (a semaphore shared across fork) both block for ever; with the course's process-local lock both go through.
SCRIPT = textwrap.dedent("""
    import io, os, signal, sys
    {setup}
    from tqdm.auto import tqdm

    tqdm(total=1, file=io.StringIO()).close()  # the lock exists before the fork, as in a notebook that drew a bar
    pid = os.fork()
    if pid == 0:
        tqdm.get_lock().acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    with tqdm(total=3, file=io.StringIO()) as bar:
        bar.update(3)
    pid = os.fork()
    if pid == 0:
        with tqdm(total=1, file=io.StringIO()) as bar:
            bar.update(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("bars drawn after the kill", os.WEXITSTATUS(status))
""")


def _run(setup: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run([sys.executable, "-c", SCRIPT.format(setup=setup)], capture_output=True, text=True,
                              timeout=60, cwd=REPO)
    except subprocess.TimeoutExpired:
        return None  # the bar after the kill blocked


def test_a_child_killed_holding_the_bar_lock_leaves_later_bars_working() -> None:
    done = _run("import course_lib.progress")
    assert done is not None, "a bar blocked on a lock that a killed child held"
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "bars drawn after the kill 0"


@pytest.mark.slow
def test_the_course_lib_modules_that_draw_bars_install_the_lock() -> None:
    """Importing the training loop alone is enough: no module draws a bar with tqdm's shared lock."""
    done = _run("import course_lib.train.loop")
    assert done is not None and done.returncode == 0, "the training loop's bars use tqdm's cross-process lock"


@pytest.mark.slow
def test_tqdm_alone_shows_the_hang_this_guards_against() -> None:
    """Without the course's lock, the killed child's semaphore stays held: the tests above would catch a regression.
    (Probed with a timed acquire instead of a bar, which would block for ever.)"""
    probe = SCRIPT.split("with tqdm(total=3")[0] + "print(all(lk.acquire(timeout=2) for lk in tqdm.get_lock().locks))\n"
    done = subprocess.run([sys.executable, "-c", probe.format(setup="")], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
