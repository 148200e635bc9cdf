"""The ``%%torchrun`` cell magic, from a real Jupyter kernel, and ``run_torchrun`` directly."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.magics import TorchrunError, _parse_magic_line, run_torchrun, torchrun_command
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
    assert any(part.startswith("--log-line-prefix-template=[rank") for part in cmd)


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
