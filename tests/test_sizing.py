"""The size for the device (course_lib/perf/sizing.py): on every GPU class each timed call meets the rule, counted
on the ``meta`` device for figures of devices this machine does not have (tests/device_figures.py: the H200 of the
GPU evidence, T4-, L4- and A100-like datasheet figures); on the CPU nothing changes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from course_lib.perf import sizing
from course_lib.perf.sizing import (
    Work,
    count_work,
    cpu_sizes,
    device_class,
    device_seconds,
    estimated_seconds,
    matmul_work,
    meets_rule,
    min_call_seconds,
    precision_step_work,
    sizes_for,
    timed_calls,
)
from device_figures import A100, CPU_PLAIN, H200, H200_FAST_LAUNCH, L4, T4

GPUS = {"H200": (H200, "large-gpu"), "H200, 5 µs launch": (H200_FAST_LAUNCH, "large-gpu"), "T4": (T4, "small-gpu"),
        "L4": (L4, "small-gpu"), "A100": (A100, "large-gpu")}
CPU = CPU_PLAIN


@pytest.mark.parametrize("name", list(GPUS))
def test_every_gpu_sized_call_meets_the_rule_and_the_lesson_stays_minutes(name: str) -> None:
    facts, klass = GPUS[name]
    sizes = sizes_for(facts)
    assert sizes.device_class == klass == device_class(facts)
    floor = min_call_seconds(facts)
    assert floor == max(1e-3, 50 * facts.launch_s)
    calls = timed_calls(sizes, facts)
    assert len(calls) >= 3
    for what, work in calls.items():
        seconds = device_seconds(work, facts)
        assert seconds >= floor, f"{name}: {what} is {seconds * 1e3:.3f} ms at the roofs, under {floor * 1e3} ms"
        assert work.held <= sizing.MEMORY_SHARE * facts.memory_bytes, f"{name}: {what} would not fit"
    assert sizes.tf32_size >= 4096  # where the TF32 expectation is stated
    assert estimated_seconds(sizes, facts) < 180, "the quality runs alone would take minutes too many"
    assert "measured matmul roofs" in sizes.why and "fastest roof" in sizes.why


def test_todays_cpu_sizes_break_the_rule_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lesson 05 as it ran on the H200: a batch-64, width-32 CNN step and a 256x256 TF32 matmul are launch-bound."""
    monkeypatch.setenv("COURSE_MODE", "full")
    today = cpu_sizes()
    step = precision_step_work(today.precision_width, today.precision_batch, dtype="bf16")
    assert device_seconds(step, H200) < 50e-6  # microseconds, against a 1 ms floor
    assert not meets_rule(step, H200) and not meets_rule(matmul_work(today.tf32_size), H200)
    for facts in (T4, A100):
        assert not all(meets_rule(w, facts) for w in timed_calls(today, facts).values())


@pytest.mark.parametrize("mode", ["full", "smoke"])
def test_the_cpu_keeps_the_sizes_the_lessons_always_used(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv("COURSE_MODE", mode)
    sizes = sizes_for(CPU)
    expected = {"full": (32, 64, 8, 40, 256), "smoke": (32, 16, 2, 3, 256)}[mode]
    assert sizes.device_class == "cpu"
    assert (sizes.precision_width, sizes.precision_batch, sizes.precision_batches, sizes.precision_steps,
            sizes.tf32_size) == expected


def test_the_class_and_sizes_come_from_figures_not_the_name() -> None:
    small_h200 = dataclasses.replace(H200, memory_bytes=16 * 2**30)
    assert device_class(small_h200) == "small-gpu"
    slow_launch = dataclasses.replace(A100, launch_s=60e-6)  # 50 launches: 3 ms
    assert min_call_seconds(slow_launch) == pytest.approx(3e-3)
    big, small = sizes_for(slow_launch), sizes_for(A100)
    assert (big.precision_width, big.precision_batch) > (small.precision_width, small.precision_batch)
    for work in timed_calls(big, slow_launch).values():
        assert meets_rule(work, slow_launch)
    faster = dataclasses.replace(A100, matmul={k: 4 * v for k, v in A100.matmul.items()}, bandwidth=4 * A100.bandwidth)
    assert sizes_for(faster).precision_batch > small.precision_batch


def test_work_is_counted_on_meta_from_shapes() -> None:
    def mm() -> None:
        with torch.device("meta"):
            a, b = torch.randn(64, 32), torch.randn(32, 16)
        torch.mm(a, b)

    work = count_work(mm)
    assert work.flops == 2 * 64 * 32 * 16
    # randn writes both operands; mm reads them and writes its result (fp32: 4 bytes each)
    assert work.bytes == 4 * (64 * 32 + 32 * 16) + 4 * (64 * 32 + 32 * 16 + 64 * 16)
    assert matmul_work(8) == Work(flops=1024.0, bytes=768.0, held=768.0)
    step32, step16 = precision_step_work(32, 64), precision_step_work(32, 64, dtype="bf16")
    assert step16.flops == step32.flops and step16.bytes < step32.bytes
    assert precision_step_work(32, 128).flops == pytest.approx(2 * step32.flops, rel=0.01)


def test_device_time_needs_measured_figures() -> None:
    with pytest.raises(ValueError, match="no measured matmul roof"):
        device_seconds(Work(1.0, 1.0), CPU)


# ------------------------------------------------------------------ lessons 02 and 07: the GPU-only comparisons
CUDA_GPUS = {name: facts for name, (facts, _) in GPUS.items()}


@pytest.mark.parametrize("name", list(CUDA_GPUS))
def test_lesson_02s_copy_meets_the_rule_at_the_measured_bandwidth(name: str) -> None:
    facts = CUDA_GPUS[name]
    batch = sizing.copy_batch(facts)
    work = sizing.copy_work(batch)
    assert batch % sizing.COPY_BATCH_STEP == 0
    assert work.bytes == batch * 3 * 32 * 32 * 4  # float32 images of the lesson's size, from the shape
    assert work.bytes / facts.bandwidth >= min_call_seconds(facts) and meets_rule(work, facts)
    assert not meets_rule(sizing.copy_work(batch - sizing.COPY_BATCH_STEP), facts)  # the fewest that do
    assert work.held <= sizing.MEMORY_SHARE * facts.memory_bytes
    assert timed_calls(sizes_for(facts), facts)["02 host-to-device copy"] == work


@pytest.mark.parametrize("name", list(CUDA_GPUS))
def test_lesson_07s_graph_step_is_long_and_launch_bound(name: str) -> None:
    facts = CUDA_GPUS[name]
    (what, work), = sizing.launch_bound_calls(facts).items()
    floor = min_call_seconds(facts)
    assert work.launches * facts.launch_s >= floor, f"{name}: {what} launches too few kernels to time"
    assert device_seconds(work, facts) < sizing.LAUNCH_BOUND_SHARE * work.launches * facts.launch_s, (
        f"{name}: {what} is not launch-bound: its work at the roofs is no small part of its launches")
    assert sizing.meets_launch_rule(work, facts) and work.held <= sizing.MEMORY_SHARE * facts.memory_bytes
    layers = sizing.graph_step_size(facts)
    assert work == sizing.graph_step_work(layers)
    smaller = [n for n in sizing.GRAPH_LAYERS if n < layers]
    assert not smaller or not sizing.meets_launch_rule(sizing.graph_step_work(smaller[-1]), facts)


def test_the_graph_step_is_counted_on_meta() -> None:
    """Two operations per layer (addmm, gelu: the transpose of the weight is a view), and their FLOPs."""
    work = sizing.graph_step_work(3, width=16, batch=4)
    assert work.launches == 2 * 3
    assert work.flops == 3 * 2 * 4 * 16 * 16


def test_sizes_that_are_not_the_rules_fail_it() -> None:
    """What the rule rejects: lesson 02's CPU batch (64 images) as a copy, and lesson 14's CUDA graph comparison
    (its compiled chain is one or two kernels: too few launches), or a step whose kernels are large."""
    for facts in CUDA_GPUS.values():
        assert not meets_rule(sizing.copy_work(64), facts)
        assert not sizing.meets_launch_rule(Work(flops=1e6, bytes=1e6, launches=2), facts)
        assert not sizing.meets_launch_rule(sizing.graph_step_work(64, width=4096, batch=4096), facts)


def test_the_gpu_only_sizes_refuse_a_cpu() -> None:
    with pytest.raises(ValueError, match="only on a CUDA GPU"):
        sizing.copy_batch(CPU)
    with pytest.raises(ValueError, match="only on a CUDA GPU"):
        sizing.graph_step_size(CPU)


def test_lesson_08s_large_batch_meets_the_rule_on_a_gpu_and_stays_64_on_a_cpu() -> None:
    assert sizing.throughput_batch(CPU) == 64
    for name, facts in CUDA_GPUS.items():
        batch = sizing.throughput_batch(facts)
        assert meets_rule(sizing.inference_work(32, batch), facts), name
        assert batch == 64 or not meets_rule(sizing.inference_work(32, batch // 2), facts), name
        assert not meets_rule(sizing.inference_work(32, 64), facts), f"{name}: the CPU's batch 64 is launch-bound"


def test_lesson_11s_gpu_step_is_lesson_05s() -> None:
    """The capstone trains lesson 05's SmallCNN step: on a GPU its width and batch, which meet the rule (above)."""
    for facts in CUDA_GPUS.values():
        sizes = sizes_for(facts)
        calls = timed_calls(sizes, facts)
        assert calls["11 capstone training step (the same SmallCNN step, fp32)"] == calls["05 precision step, fp32"]
    assert not meets_rule(precision_step_work(32, 32), H200)  # the capstone's CPU sizes: batch 32, width 32


def test_lesson_01s_narrow_step_meets_the_rule_on_a_gpu_and_keeps_its_batch_on_a_cpu() -> None:
    assert sizing.step_batch(CPU, width=8, cpu_batch=64) == 64
    for name, facts in CUDA_GPUS.items():
        batch = sizing.step_batch(facts, width=8, cpu_batch=64)
        assert meets_rule(precision_step_work(8, batch), facts), name
        assert meets_rule(precision_step_work(32, batch), facts), f"{name}: the wide side does more work still"
        assert not meets_rule(precision_step_work(8, 64), facts), f"{name}: the CPU's batch 64 is launch-bound"
