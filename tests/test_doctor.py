"""doctor runs, reports every area, and exits 0 without blocking problems."""

from __future__ import annotations

from course_lib.doctor import FAIL, doctor, main


def test_doctor_reports(capsys) -> None:
    checks = doctor(quick=True, show=False)
    names = {c.name for c in checks}
    for expected in ("python", "torch", "torchvision", "devices", "bf16 autocast", "TF32", "torch.compile",
                     "start method", "CPU cores", "dataset cache", "free disk", "jupyterlab", "ipywidgets"):
        assert expected in names
    assert all(c.fix for c in checks if c.status == FAIL)
    assert main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "Blocking problems: none" in out and "num_workers" in out
