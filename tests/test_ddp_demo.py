"""The DDP demo's result files and the compact summary the lesson shows instead of the interleaved rank logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from course_lib import ddp_demo
from course_lib.grading import ddp_ranks


def _record(rank: int, *, strategy: str = "ddp", indices=None, losses=None, identical: bool = True,
            stored: int = 100) -> dict:
    return {
        "strategy": strategy, "rank": rank, "world_size": 2, "backend": "gloo", "effective_batch": 16, "lr": 0.1,
        "stored_elements": stored, "full_elements": 100, "identical": identical,
        "indices": indices if indices is not None else [[rank, rank + 2], [rank + 2, rank]],
        "local_losses": losses if losses is not None else [1.0 + rank], "mean_losses": [1.5],
    }


def test_every_rank_writes_its_record_and_the_summary_reads_them(tmp_path: Path) -> None:
    assert ddp_demo.main(["--strategy", "ddp", "none", "--epochs", "2", "--steps", "1",
                          "--results", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["ddp.rank0.json", "none.rank0.json"]
    results = ddp_demo.read_results(tmp_path)
    assert list(results) == ["ddp", "none"]
    record = results["ddp"][0]
    assert record["world_size"] == 1 and len(record["indices"]) == 2 and len(record["local_losses"]) == 2
    assert record["stored_elements"] == record["full_elements"] > 0
    table = ddp_demo.summary_table(results)
    assert table.count("\n") == 3 and "| ddp | 1 |" in table and "| none | 1 |" in table


def test_summary_reports_what_the_ranks_saw() -> None:
    ddp = [_record(0), _record(1)]
    s = ddp_demo.summarize(ddp)
    assert s["disjoint_shards"] and s["reshuffled_each_epoch"] and s["local_losses_differ"] and s["identical"]
    drifted = ddp_demo.summarize([_record(0, strategy="none", identical=False), _record(1, strategy="none")])
    assert not drifted["identical"]
    overlapping = ddp_demo.summarize([_record(0, indices=[[0, 1], [1, 0]]), _record(1, indices=[[1, 2], [2, 1]])])
    assert not overlapping["disjoint_shards"]
    same_order = ddp_demo.summarize([_record(0, indices=[[0, 2], [0, 2]]), _record(1, indices=[[1, 3], [1, 3]])])
    assert not same_order["reshuffled_each_epoch"]
    fsdp = ddp_demo.summary_table({"fsdp": [_record(0, strategy="fsdp", stored=50),
                                            _record(1, strategy="fsdp", stored=50)]})
    assert "50 (50%), 50 (50%) of 100" in fsdp


def test_reading_a_folder_without_results_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--results"):
        ddp_demo.read_results(tmp_path)


def test_result_files_are_whole_json(tmp_path: Path) -> None:
    ddp_demo.main(["--strategy", "ddp", "--epochs", "1", "--steps", "1", "--results", str(tmp_path)])
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, then renamed
    json.loads((tmp_path / "ddp.rank0.json").read_text())


def test_global_batches_put_every_ranks_kth_group_together() -> None:
    reads = [[0, 1, 2, 3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15, 16, 17]]
    assert ddp_demo.global_batches(reads, 4) == [[0, 1, 2, 3, 10, 11, 12, 13], [4, 5, 6, 7, 14, 15, 16, 17]]
    with pytest.raises(ValueError, match="same whole number"):
        ddp_demo.global_batches([[0, 1, 2], [3, 4, 5]], 2)
    with pytest.raises(ValueError, match=r"\[2, 4\]"):
        ddp_demo.global_batches([[0, 1], [2, 3, 4, 5]], 2)


def test_recording_dataset_remembers_reads_and_the_reference_steps_on_the_whole_batch() -> None:
    data = ddp_ranks.make_recording_dataset(8, seed=1)
    x, y = data[5]
    assert data.reads == [5] and torch.equal(x, ddp_demo.make_dataset(8, seed=1).tensors[0][5])
    with pytest.raises(ValueError, match="pair up"):
        ddp_ranks.RecordingDataset(torch.zeros(3, 2), torch.zeros(2))
    # One reference step on a batch of 4 is one SGD step on the mean loss of those 4 samples.
    model = ddp_demo.make_model(seed=3)
    manual = ddp_demo.make_model(seed=3)
    assert torch.equal(ddp_demo.flat_parameters(model), ddp_demo.flat_parameters(manual))
    ddp_demo.one_process_reference(model, data, [[0, 1, 2, 3]], lr=0.5)
    xs, ys = ddp_demo.make_dataset(8, seed=1).tensors
    torch.nn.functional.cross_entropy(manual(xs[:4]), ys[:4]).backward()
    with torch.no_grad():
        for p in manual.parameters():
            p -= 0.5 * p.grad
    assert torch.allclose(ddp_demo.flat_parameters(model), ddp_demo.flat_parameters(manual), atol=1e-7)


def test_two_heads_leave_the_unused_head_without_gradient() -> None:
    model = ddp_demo.TwoHeads()
    model(torch.randn(2, ddp_demo.IN_FEATURES), head="a").sum().backward()
    assert model.heads["a"].weight.grad is not None and model.heads["b"].weight.grad is None
