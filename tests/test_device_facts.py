"""Device facts (course_lib/perf/device_facts.py): read and measured on this CPU; words that fit each device."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_lib.perf.device_facts import DeviceFacts, device_facts, launch_seconds, read_cpu_flags


def test_this_cpu_is_read_and_its_launch_cost_measured() -> None:
    facts = device_facts("cpu")
    assert facts.kind == "cpu" and facts.capability is None and not facts.is_gpu
    assert facts.memory_bytes and facts.memory_bytes > 2**28
    assert 0 < facts.launch_s < 1e-3  # a tiny in-place add: microseconds
    assert "bf16" in facts.low_precision_units and "tensor cores" not in facts.low_precision_units
    assert launch_seconds("cpu", calls=20, rounds=3) > 0


def test_cpu_flags_read_from_cpuinfo_or_none(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n")
    assert read_cpu_flags(info) == frozenset({"fpu", "avx2", "amx_bf16"})
    assert read_cpu_flags(tmp_path / "missing") is None


@pytest.mark.parametrize("capability,low,tf32,words", [
    ((9, 0), "bf16", True, "bf16 and fp16 tensor cores"),
    ((7, 5), "fp16", False, "fp16 tensor cores but no bf16 ones"),
    ((6, 1), "fp16", False, "no tensor cores"),
])
def test_a_gpu_is_described_by_its_compute_capability(capability, low, tf32, words) -> None:
    facts = DeviceFacts(kind="cuda", name="GPU X", capability=capability,
                        matmul={"float32": 50e12, "bfloat16": 750e12})
    assert (facts.fast_low_precision, facts.has_tf32) == (low, tf32)
    assert words in facts.low_precision_units and "CPU" not in facts.low_precision_units
    assert facts.roof_ratio("bf16") == 15.0 and facts.roof_ratio("fp16") is None
    assert facts.roofs_text() == "measured matmul roofs: bf16 750 TFLOP/s, fp32 50 TFLOP/s"


def test_cpu_words_name_its_bf16_units() -> None:
    amx = DeviceFacts(kind="cpu", name="c", cpu_flags=frozenset({"amx_bf16", "avx2"}))
    plain = DeviceFacts(kind="cpu", name="c", cpu_flags=frozenset({"avx2"}))
    unread = DeviceFacts(kind="cpu", name="c")
    assert "reports amx_bf16" in amx.low_precision_units and amx.cpu_bf16_units
    assert "no bf16 matrix units" in plain.low_precision_units and not plain.cpu_bf16_units
    assert "lists no CPU flags" in unread.low_precision_units and not unread.cpu_bf16_units


def test_bad_facts_are_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="kind='tpu'"):
        DeviceFacts(kind="tpu", name="x")
    with pytest.raises(ValueError, match="CUDA fact"):
        DeviceFacts(kind="cpu", name="x", capability=(8, 0))
    with pytest.raises(ValueError, match=r"matmul\['int8'\]"):
        DeviceFacts(kind="cuda", name="x", matmul={"int8": 1e12})
    with pytest.raises(ValueError, match="launch_s=0"):
        DeviceFacts(kind="cuda", name="x", launch_s=0)
