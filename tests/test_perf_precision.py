"""Precision comparison: rows side by side from one initialisation; saved-activation bytes; loss scaling on CPU."""

from __future__ import annotations

import pytest
import torch

from course_lib.perf.compare import compare
from course_lib.perf.precision import (
    compare_precisions,
    format_rows,
    grad_scaler_demo,
    precision_steps,
    saved_activation_bytes,
)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def make_batches():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(2)]


def test_compare_precisions_rows() -> None:
    rows = compare_precisions(make_model, make_batches, device="cpu", steps=3, precisions=("fp32", "bf16", "fp16"))
    assert [r["precision"] for r in rows] == ["fp32", "bf16", "fp16"]
    for r in rows:
        assert r["step_ms"] > 0 and torch.isfinite(torch.tensor(r["final_loss"]))
        assert 0.0 <= r["eval_acc"] <= 1.0
    assert rows[0]["step_time_vs_fp32"] == pytest.approx(1.0)
    assert rows[0]["final_loss"] != rows[1]["final_loss"]  # bf16 rounding changes the trajectory
    assert rows[1]["activation_mb"] < rows[0]["activation_mb"]
    assert "bf16" in format_rows(rows) and "fp16" in format_rows(rows)


def test_compare_precisions_judges_quality_on_held_out_batches_when_given() -> None:
    seen_sizes: list[int] = []

    def watched_model() -> torch.nn.Module:
        model = make_model()  # its copies keep the hook: it sees every batch any copy runs
        model.register_forward_hook(lambda m, inputs, out: seen_sizes.append(inputs[0].shape[0]))
        return model

    g = torch.Generator().manual_seed(1)
    held_out = [(torch.randn(5, 8, generator=g), torch.randint(0, 4, (5,), generator=g))]
    on_training = compare_precisions(make_model, make_batches, device="cpu", steps=3)
    assert {r["eval_on"] for r in on_training} == {"training"}
    # The same batches passed as "held-out" give the same numbers: val_batches replaces only what is evaluated.
    same = compare_precisions(make_model, make_batches, device="cpu", steps=3, val_batches=make_batches)
    assert [(r["eval_loss"], r["eval_acc"]) for r in same] == [(r["eval_loss"], r["eval_acc"]) for r in on_training]
    judged = compare_precisions(watched_model, make_batches, device="cpu", steps=3, val_batches=lambda: held_out)
    assert {r["eval_on"] for r in judged} == {"held-out"} and "held-out" in format_rows(judged)
    assert 5 in seen_sizes  # the held-out batch (5 samples) was evaluated; training batches have 8
    assert [r["final_loss"] for r in judged] == [r["final_loss"] for r in on_training]  # training is unchanged
    assert [r["eval_loss"] for r in judged] != [r["eval_loss"] for r in on_training]
    with pytest.raises(ValueError, match="val_batches"):
        compare_precisions(make_model, make_batches, device="cpu", steps=3, val_batches=list)


def test_unknown_precision_is_refused_before_work() -> None:
    calls = []
    with pytest.raises(ValueError, match="fp8"):
        compare_precisions(lambda: calls.append(1) or make_model(), make_batches, device="cpu", steps=3,
                           precisions=("fp32", "fp8"))
    assert not calls


def test_precision_steps_are_timed_by_compare() -> None:
    steps = precision_steps(make_model, make_batches(), device="cpu", precisions=("fp32", "fp16"))
    result = compare(steps, rounds=3, min_round_s=0.001)
    assert set(result.measurements) == {"fp32", "fp16"}
    assert result.verdict("fp32", "fp16").outcome in ("faster", "slower", "too_close", "busy")


def test_saved_bytes_count_activations_once_and_weights_apart() -> None:
    layer = torch.nn.Linear(32, 64, bias=False)
    x = torch.randn(10, 32, requires_grad=True)  # so the weight is saved too (for x.grad)
    fp32 = saved_activation_bytes(layer, x)
    # linear saves its input (10 x 32 floats) and its weight: the weight is not an activation.
    assert fp32["activation_bytes"] == 10 * 32 * 4
    assert fp32["weight_bytes"] == 64 * 32 * 4
    bf16 = saved_activation_bytes(layer, x, amp_dtype=torch.bfloat16)
    assert bf16["activation_bytes"] == 10 * 32 * 2  # the input, cast to bf16
    assert bf16["weight_bytes"] == 64 * 32 * 2  # autocast's bf16 copy of the weight
    assert set(bf16["activation_bytes_by_dtype"]) == {"torch.bfloat16"}

    class Twice(torch.nn.Module):  # the same tensor saved by two operations is one piece of memory
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            h = t.exp()
            return h * h

    shared = saved_activation_bytes(Twice(), torch.randn(100, requires_grad=True))
    assert shared["shared_saves"] >= 1 and shared["activation_bytes"] == 100 * 4


def test_grad_scaler_on_cpu_skips_the_overflowing_step_backs_off_and_grows() -> None:
    rows = grad_scaler_demo(steps=7, overflow_at=(3,), init_scale=1024.0, growth_interval=2)
    bad = rows[3]
    assert bad["overflow"] and bad["skipped"]
    assert bad["scale_after"] == bad["scale_before"] / 2  # backoff_factor 0.5
    clean = [r for r in rows if not r["overflow"]]
    assert not any(r["skipped"] for r in clean)  # every clean step updated the weights
    assert rows[1]["scale_after"] == 2 * rows[0]["scale_before"]  # two clean steps: the scale doubled
    assert rows[5]["scale_after"] == 2 * rows[4]["scale_before"]  # and again two clean steps after the back-off
    assert rows[4]["scale_after"] == rows[4]["scale_before"]  # one clean step is not enough to grow


def test_grad_scaler_demo_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="overflow_at"):
        grad_scaler_demo(steps=3, overflow_at=(5,))


def test_saved_bytes_count_only_the_slice_a_view_spans() -> None:
    layer = torch.nn.Linear(32, 8, bias=False)
    big = torch.randn(100, 32)
    whole = saved_activation_bytes(layer, big)["activation_bytes"]
    part = saved_activation_bytes(layer, big[10:20])["activation_bytes"]
    assert whole == 100 * 32 * 4 and part == 10 * 32 * 4
