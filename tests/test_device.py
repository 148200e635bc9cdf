"""Precision names resolve to the autocast dtype each device really supports."""

import pytest
import torch

from course_lib.device import autocast, resolve_amp_dtype


def test_fp16_resolves_on_the_cpu_and_autocast_uses_it() -> None:
    assert resolve_amp_dtype("fp16", "cpu") is torch.float16
    with autocast("cpu", torch.float16):
        out = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype is torch.float16


def test_auto_and_fp32_mean_no_autocast_on_the_cpu() -> None:
    assert resolve_amp_dtype("auto", "cpu") is None
    assert resolve_amp_dtype("fp32", "cpu") is None
    assert resolve_amp_dtype(torch.bfloat16, "cpu") is torch.bfloat16


def test_unknown_precision_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'fp8' is not one of"):
        resolve_amp_dtype("fp8", "cpu")
