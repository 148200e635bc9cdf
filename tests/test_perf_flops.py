"""FLOPs counted the same on a CPU and on ``meta`` for every model the course has (lesson 14's MFU rests on it)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from course_lib.models import MODEL_NAMES, GPTConfig, TinyGPT, build_model
from course_lib.perf.flops import counted_flops

# Each model the course builds, small, with an input of its kind: (build, input, loss of the output).
LESSON14_GPT = GPTConfig(vocab_size=256, block_size=128, n_layer=2, n_head=4, n_embd=128, dropout=0.0, bias=True)
MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[], torch.Tensor]]] = {
    "cnn": (lambda: build_model("cnn", num_classes=10), lambda: torch.randn(2, 3, 32, 32)),
    "net": (lambda: build_model("net", num_classes=10, image_size=8), lambda: torch.randn(2, 3, 8, 8)),
    "gpt": (lambda: build_model("gpt", vocab_size=65), lambda: torch.randint(0, 65, (2, 64))),
    "gpt (lesson 14's small GPT)": (lambda: TinyGPT(LESSON14_GPT), lambda: torch.randint(0, 256, (1, 128))),
}


def _step_flops(name: str, device: str) -> int:
    build, example = MODELS[name]
    with torch.device(device):
        torch.manual_seed(0)
        model, x = build(), example()
    model.eval()  # dropout off: the same operations on both devices

    def step() -> None:
        out = model(x)
        F.cross_entropy(out.reshape(-1, out.shape[-1]), torch.zeros(out.shape[:-1], dtype=torch.long,
                                                                    device=device).reshape(-1)).backward()
    return counted_flops(step)


def test_every_model_the_course_has_is_listed() -> None:
    assert {name.split(" ")[0] for name in MODELS} == set(MODEL_NAMES)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_cpu_counts_the_same_flops_as_meta(name: str) -> None:
    cpu, meta = _step_flops(name, "cpu"), _step_flops(name, "meta")
    assert cpu == meta, f"{name}: {cpu:,} FLOPs counted on the CPU, {meta:,} on meta"


def test_the_cpu_attention_is_counted_forward_and_backward() -> None:
    q, k, v = (torch.randn(1, 2, 16, 8, requires_grad=True) for _ in range(3))
    flops = counted_flops(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward())
    forward = 2 * (2 * 2 * 16 * 16 * 8)  # scores and weighted sum, each 2 FLOPs per multiply-add
    assert flops == forward + 2 * forward  # backward: four matmuls of the forward's shapes, nothing recomputed
