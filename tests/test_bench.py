"""bench --tiny writes the table and the JSON with ratio fields (numbers meaningless at this size)."""

from __future__ import annotations

import json

import pytest
import torch

from course_lib.perf.bench import gpt_flops_per_token, main, peak_flops


@pytest.mark.slow
def test_bench_tiny_writes_both_files(tmp_path) -> None:
    threads = torch.get_num_threads()
    code = main(["--tiny", "--threads", "1", "--out", str(tmp_path), "--only", "loops", "loaders", "in_memory", "compile", "precision",
                 "gpu"])
    report = json.loads((tmp_path / "latest.json").read_text())
    assert code == 0, report["errors"]
    assert report["machine"]["torch_threads"] == 1 and torch.get_num_threads() == threads
    res = report["results"]
    for key in ("ratio_train_vs_minimal", "ratio_train_vs_lightning"):
        assert res["training_loops"][key] > 0
    assert res["loaders"]["ratio_tuned_vs_workers0"] > 0
    assert res["in_memory"]["ratio_devicebatcher_vs_dataloader"] > 0
    assert res["compile"]["ratio_compiled_vs_eager_step_time"] > 0
    assert res["precision"]["ratio_bf16_vs_fp32_step_time"] > 0
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"]
    md = (tmp_path / "latest.md").read_text()
    assert "| (a) `train()` step time / minimal loop |" in md and "Machine:" in md


def test_flops_and_peak_table() -> None:
    assert gpt_flops_per_token(1000, 2, 64, 128) == 6000 + 12 * 2 * 64 * 128
    assert peak_flops("NVIDIA H100 80GB HBM3") and peak_flops("Mystery GPU") is None
    assert peak_flops("Mystery GPU", 100.0) == 100e12
