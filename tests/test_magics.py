"""The ``%%torchrun`` cell magic, from a real Jupyter kernel, and ``run_torchrun`` directly."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import nbformat
import pytest

from course_lib import magics
from course_lib.magics import (
    TorchrunError,
    _parse_magic_line,
    failure_report,
    launcher_accepts,
    run_torchrun,
    torchrun_cell,
    torchrun_command,
)
from course_lib.nbrun import NotebookRunner

REPO = Path(__file__).resolve().parents[1]

# The lesson's demo, as a notebook runs it: every rank prints "rank R/W: ..." lines, rank 0 the summaries.
DEMO_CELL = """%%torchrun -n 2 --timeout 240
from course_lib import ddp_demo
ddp_demo.main(["--strategy", "ddp", "fsdp", "none", "--epochs", "1"])
"""

FAILING_CELL = """%%torchrun -n 2 --timeout 180
import os, sys
if os.environ["RANK"] == "1":
    sys.exit("rank 1 gives up")
"""


def test_parse_magic_line() -> None:
    assert _parse_magic_line("-n 3 --timeout 5") == (3, 5.0, [])
    assert _parse_magic_line("") == (2, 600.0, [])
    assert _parse_magic_line("-n 2 --timeout 0 -- --lr 0.1") == (2, None, ["--lr", "0.1"])
    with pytest.raises(ValueError, match="bad arguments"):
        _parse_magic_line("-n two")


def test_bad_input_is_refused_before_launching(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nproc=0"):
        run_torchrun("print(1)", nproc=0)
    with pytest.raises(ValueError, match="timeout=-1"):
        run_torchrun("print(1)", timeout=-1)
    with pytest.raises(FileNotFoundError, match="missing.py"):
        run_torchrun(str(tmp_path / "missing.py"))


def test_command_line_tags_ranks_and_supports_c10d() -> None:
    cmd = torchrun_command("-m course_lib.ddp_demo", nproc=2, log_dir="/tmp/x", script_args=["--strategy", "ddp"],
                           rdzv_endpoint="127.0.0.1:29555")
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--standalone" not in cmd
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=127.0.0.1:29555" in cmd
    assert cmd[-6:] == ["-m", "course_lib.torchrun_entry", "-m", "course_lib.ddp_demo", "--strategy", "ddp"]
    has_option = launcher_accepts("--log-line-prefix-template")
    assert ("--log-line-prefix-template=[rank${rank}]: " in cmd) == has_option


def test_launcher_options_are_asked_of_its_own_parser() -> None:
    assert launcher_accepts("--tee") and launcher_accepts("--log-dir") and launcher_accepts("--nproc-per-node")
    assert not launcher_accepts("--no-such-launcher-option")


def _parser_without_the_prefix_option() -> argparse.ArgumentParser:
    """A stand-in for the launcher's parser in torch 2.11: it knows --tee and --log-dir but not the prefix option."""
    parser = argparse.ArgumentParser(prog="torchrun")
    parser.add_argument("--tee")
    parser.add_argument("--log-dir")
    parser.add_argument("training_script")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


@pytest.mark.distributed
def test_a_launcher_without_the_prefix_option_still_tags_every_rank_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11's launcher passed the option it did not know on to each rank's Python, which exited 2."""
    import torch.distributed.run

    monkeypatch.setattr(torch.distributed.run, "get_args_parser", _parser_without_the_prefix_option)
    cmd = torchrun_command("cell.py", nproc=2, log_dir="/tmp/x")
    assert not [part for part in cmd if part.startswith("--log-line-prefix")]

    code = "import os\nprint('hello from', os.environ['RANK'])\n"
    returncode, output = run_torchrun(code, nproc=2, timeout=180)
    assert returncode == 0, output
    assert "[rank0]: hello from 0" in output.splitlines()
    assert "[rank1]: hello from 1" in output.splitlines()
    assert "[default" not in output  # tagged once, by the launcher, with the course's template


@pytest.mark.distributed
def test_a_failed_rank_shows_its_own_error_and_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    cell = "import os\nprint('ready', flush=True)\nif os.environ['RANK'] == '1':\n    raise ValueError('boom')\n"
    with pytest.raises(TorchrunError) as failed:
        torchrun_cell("-n 2 --timeout 180", cell)
    message = str(failed.value)
    assert "[rank1]: ValueError: boom" in message
    assert "rank 1: exit code 1" in message
    assert "launch_agent" not in message  # the launcher's traceback stays in .output
    assert "launch_agent" in failed.value.output
    assert "[rank1]: ValueError: boom" in capsys.readouterr().out  # streamed to the cell as it happened


# What the H200 run printed with torch 2.11 (../shared/gpu-evidence/h200-2026-12-04/torchrun-diagnosis.txt): the
# launcher tagged the ranks' lines with its default "[defaultR]:", and its own traceback came last.
TORCH_211_OUTPUT = """\
[default0]:unknown option --log-line-prefix-template=[rank${rank}]:
[default0]:usage: /opt/torch/.venv/bin/python3 [option] ... [-c cmd | -m mod | file | -] [arg] ...
[default0]:Try `python -h' for more information.
[default1]:unknown option --log-line-prefix-template=[rank${rank}]:
[default1]:usage: /opt/torch/.venv/bin/python3 [option] ... [-c cmd | -m mod | file | -] [arg] ...
[default1]:Try `python -h' for more information.
E1204 18:36:22.022000 498 torch/distributed/elastic/multiprocessing/api.py:986] failed (exitcode: 2) local_rank: 0 \
(pid: 563) of binary: /opt/torch/.venv/bin/python3
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/run.py", line 994, in <module>
    main()
  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", \
line 362, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/run.py", line 990, in main
    run(args)
  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/run.py", line 981, in run
    elastic_launch(
  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/launcher/api.py", line 170, in __call__
    return launch_agent(self._config, self._entrypoint, list(args))
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/launcher/api.py", line 317, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
course_lib.torchrun_entry FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-04_18:36:21
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 2 (pid: 564)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_18:36:21
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 563)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_failure_report_reads_torchruns_default_tags() -> None:
    report = failure_report(TORCH_211_OUTPUT, nproc=2)
    assert "[default0]:unknown option --log-line-prefix-template" in report
    assert "[default1]:unknown option --log-line-prefix-template" in report
    assert "rank 0: exit code 2" in report and "rank 1: exit code 2" in report
    assert "launch_agent" not in report and "Traceback" not in report


def test_failure_report_puts_the_failed_rank_first_with_its_signal_and_keeps_untagged_lines() -> None:
    """Rank 1 crashed; rank 0 was still running and is not in torchrun's report; one line came untagged."""
    launcher_tail = TORCH_211_OUTPUT[TORCH_211_OUTPUT.index("E1204"):]
    report_of_rank_1 = launcher_tail[launcher_tail.index("Failures:"):launcher_tail.index("Root Cause")]
    output = ("[default0]:step 1\n[default1]: Fatal Python error: Segmentation fault\nprinted without a tag\n"
              + launcher_tail[:launcher_tail.index("Failures:")]
              + report_of_rank_1.replace("exitcode  : 2", "exitcode  : -11") + "=" * 60 + "\n")
    report = failure_report(output, nproc=2)
    assert "rank 1: exit code -11 (killed by SIGSEGV)" in report
    assert "rank 0: not reported" in report
    assert report.index("--- rank 1") < report.index("--- rank 0") < report.index("--- lines from no rank")
    assert "[default1]: Fatal Python error: Segmentation fault" in report
    assert "printed without a tag" in report and "launch_agent" not in report


def test_failure_report_keeps_the_last_lines_of_every_rank() -> None:
    """Rank 1 failed first; rank 0 went on printing until the launcher stopped it: its lines must not push rank 1's
    error out of the message."""
    chatty = "".join(f"[rank0]: step {i}\n" for i in range(100))
    report = failure_report("[rank1]: ValueError: boom\n" + chatty, nproc=2)
    assert "[rank1]: ValueError: boom" in report and "[rank0]: step 99" in report
    assert f"[rank0]: step {99 - magics.TAIL_LINES}\n" not in report
    assert "--- rank 0, last lines ---" in failure_report("", nproc=2)


def _gone(pid: int, within_s: float = 20.0) -> bool:
    """Whether process ``pid`` has exited (and been reaped) within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.distributed
def test_interrupt_kills_the_whole_job() -> None:
    """What happens when the notebook user presses Interrupt: every rank (and the launcher) is stopped."""
    code = "import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(600)\n"
    pids: list[int] = []

    def interrupt_once_both_ranks_run(line: str) -> None:
        if line.startswith("[rank") and "pid " in line:
            pids.append(int(line.split()[-1]))
        if len(pids) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_torchrun(code, nproc=2, timeout=300, on_line=interrupt_once_both_ranks_run)
    assert len(pids) == 2
    assert all(_gone(pid) for pid in pids)


@pytest.mark.distributed
def test_timeout_raises() -> None:
    with pytest.raises(TorchrunError, match="timeout of 0.5 s"):
        run_torchrun("import time\ntime.sleep(600)\n", nproc=2, timeout=0.5)


@pytest.mark.distributed
def test_cell_magic_in_a_real_kernel() -> None:
    """A kernel loads the extension; a 2-rank cell streams both ranks' lines; a failing rank raises in the cell.

    The 2-rank cell is the DDP/FSDP2 demo: DDP keeps the replicas identical, FSDP2 stores part of the parameters on
    each rank, and without gradient averaging ('none') the ranks drift apart.
    """
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext course_lib.magics"),
        nbformat.v4.new_code_cell(DEMO_CELL),
        nbformat.v4.new_code_cell(FAILING_CELL),
    ]
    client = NotebookRunner(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(REPO)}})
    client.execute()

    load, demo, failing = nb.cells
    assert not [o for o in load.outputs if o.output_type == "error"]
    assert not [o for o in demo.outputs if o.output_type == "error"]
    out = "".join(o.get("text", "") for o in demo.outputs if o.output_type == "stream")
    assert "[rank0]: rank 0/2: epoch 0 first sample indices" in out  # tagged by torchrun, streamed to the cell
    assert "[rank1]: rank 1/2: epoch 0 first sample indices" in out

    verdicts = [line.split(": ")[-1] for line in out.splitlines() if "parameters identical on all ranks" in line]
    assert verdicts == ["yes", "yes", "NO"]  # rank 0 alone prints it; 'none' never averages, so the ranks drift
    assert out.count("effective batch = 8 per rank x 2 ranks = 16") == 3
    shards = {line.split("indices")[1] for line in out.splitlines() if "epoch 0 first sample indices" in line}
    assert len(shards) == 2  # DistributedSampler: each rank reads a different shard
    shard_lines = [line for line in out.splitlines() if "[fsdp shard]" in line]
    assert len(shard_lines) == 2
    for line in shard_lines:
        local, full = (int(w) for w in line.split("stores ")[1].split(" parameter")[0].split(" of "))
        assert 0 < local < full

    errors = [o for o in failing.outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "TorchrunError"
    assert "exited with code" in errors[0].evalue and "rank 1 gives up" in errors[0].evalue


def test_rank_entry_runs_the_target_with_its_arguments_and_line_buffered_output(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint(sys.argv[1:], sys.stdout.line_buffering, sys.stdout.write_through)\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # what the launcher sets; the entry must still buffer by line
    out = subprocess.run([sys.executable, "-m", "course_lib.torchrun_entry", str(script), "--a", "1"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "['--a', '1'] True False"
    module = subprocess.run([sys.executable, "-m", "course_lib.torchrun_entry", "-m", "course_lib.ddp_demo", "--help"],
                            capture_output=True, text=True, env=env)
    assert module.returncode == 0 and "--strategy" in module.stdout
    failing = tmp_path / "fails.py"
    failing.write_text("print('before')\nraise RuntimeError('boom')\n")
    failed = subprocess.run([sys.executable, "-m", "course_lib.torchrun_entry", str(failing)],
                            capture_output=True, text=True, env=env)
    assert failed.returncode == 1 and failed.stdout == "before\n" and "RuntimeError: boom" in failed.stderr
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    assert subprocess.run([sys.executable, "-m", "course_lib.torchrun_entry", str(exits)]).returncode == 3


def test_a_torchrun_cell_says_what_it_does_before_and_while_it_runs(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Seen: 7 of 8 lesson cells showed nothing for 19-27 s. Now the cell's first line is shown before the launcher
    starts (so it is there at once, whatever the machine), each rank says when it runs the cell, and a silent stretch
    is reported every SILENCE_S seconds (1 s here) with the time so far."""
    monkeypatch.setattr(magics, "SILENCE_S", 1.0)
    shown_before_launch: list[str] = []
    launch = magics._launch

    def recording_launch(cmd: list[str], env: dict[str, str]):
        shown_before_launch.append(capsys.readouterr().out)
        return launch(cmd, env)

    monkeypatch.setattr(magics, "_launch", recording_launch)
    torchrun_cell("-n 2 --timeout 180", "import time\ntime.sleep(3)\nprint('cell done', flush=True)\n")
    out = capsys.readouterr().out
    assert shown_before_launch[0].startswith("torchrun: starting 2 processes"), shown_before_launch
    lines = out.splitlines()
    done = next(i for i, line in enumerate(lines) if "cell done" in line)
    for rank in (0, 1):
        started = next(i for i, line in enumerate(lines) if line.startswith(f"[rank{rank}]: started: running the cell"))
        assert started < done, out
    assert any("still running" in line and "s since the last line" in line for line in lines[:done]), out
