"""The anatomy of a training step: the FLOP formula equals FlopCounterMode, the memory predictor equals the
measurement to the byte, on a grid of specs; bad specs are refused before any work."""

from __future__ import annotations

import itertools

import pytest
import torch

from course_lib.perf.anatomy import (
    CATEGORIES,
    DTYPES,
    OPTIMIZERS,
    MLPSpec,
    build_mlp,
    counted_step_flops,
    example_batch,
    make_optimizer,
    measured_memory,
    predict_memory,
    step_flops,
    step_loss,
)
from course_lib.perf.precision import saved_activation_bytes

# Every combination that changes a rule: dtype, dropout, embedding, tokens; 1 to 4 Linear layers.
GRID = [MLPSpec(widths, batch=batch, tokens=tokens, vocab=vocab, dropout=dropout, dtype=dtype)
        for (widths, batch), dtype, dropout, vocab, tokens in itertools.product(
            [((16, 32, 10), 4), ((7, 13, 5, 3), 3), ((9, 4), 5), ((12, 20, 24, 16, 6), 2)],
            DTYPES, (0.0, 0.25), (None, 11), (1, 3))]


def _name(spec: MLPSpec) -> str:
    return f"{spec.widths}-B{spec.batch}-T{spec.tokens}-V{spec.vocab}-p{spec.dropout}-{spec.dtype}"


def test_the_measured_figures_from_the_lesson() -> None:
    with_embedding = MLPSpec((16, 32, 10), batch=4, tokens=8, vocab=50)
    forward = 2 * 4 * 8 * (16 * 32 + 32 * 10)
    assert step_flops(with_embedding) == counted_step_flops(with_embedding) == 159744 == 3 * forward
    without = MLPSpec((16, 32, 10), batch=4, tokens=8)
    assert step_flops(without) == counted_step_flops(without) == 126976  # no input gradient for the data


@pytest.mark.parametrize("spec", GRID, ids=_name)
def test_the_flop_formula_is_what_flop_counter_mode_counts(spec: MLPSpec) -> None:
    assert step_flops(spec) == counted_step_flops(spec)


@pytest.mark.parametrize("spec", GRID, ids=_name)
def test_the_memory_prediction_equals_the_measurement_to_the_byte(spec: MLPSpec) -> None:
    for optimizer in OPTIMIZERS:
        assert predict_memory(spec, optimizer) == measured_memory(spec, optimizer), optimizer


def test_the_categories_follow_the_rules() -> None:
    spec = MLPSpec((8, 16, 4), batch=6, dropout=0.5, dtype="bfloat16")
    params = 8 * 16 + 16 + 16 * 4 + 4
    got = {name: measured_memory(spec, name) for name in OPTIMIZERS}
    assert set(got["adamw"]) == set(CATEGORIES)
    assert got["sgd"]["parameters"] == got["sgd"]["gradients"] == params * 2  # bf16: 2 bytes each
    assert got["sgd"]["optimizer_state"] == 0
    assert got["sgd_momentum"]["optimizer_state"] == params * 2
    assert got["adamw"]["optimizer_state"] == 2 * params * 2 + 4 * 4  # two moments, four float32 step scalars
    # x, ReLU's output, the mask, dropout's output, log_softmax's output, the targets, total_weight
    assert got["sgd"]["activations"] == 6 * 8 * 2 + 3 * 6 * 16 * 2 + 6 * 4 * 2 + 6 * 8 + 2


def test_without_dropout_the_relu_output_is_the_next_input_counted_once() -> None:
    spec = MLPSpec((8, 16, 4), batch=6)
    saved = saved_activation_bytes(build_mlp(spec), example_batch(spec)[0])
    assert saved["shared_saves"] >= 1
    assert saved["activation_bytes"] == 6 * 8 * 4 + 6 * 16 * 4  # no loss here: x and ReLU's output


def test_the_loss_is_counted_only_when_given() -> None:
    spec = MLPSpec((8, 16, 4), batch=6)
    model, (x, y) = build_mlp(spec), example_batch(spec)
    without = saved_activation_bytes(model, x)["activation_bytes"]
    with_loss = saved_activation_bytes(model, x, loss_fn=lambda logits: step_loss(logits, y))["activation_bytes"]
    assert with_loss - without == 6 * 4 * 4 + 6 * 8 + 4  # log_softmax's output, the targets, total_weight


def test_build_and_batch_have_the_documented_shapes_and_leave_the_global_rng_alone() -> None:
    before = torch.get_rng_state()
    spec = MLPSpec((5, 7, 3), batch=2, tokens=4, vocab=9, dropout=0.1, dtype="bfloat16")
    model = build_mlp(spec, seed=3)
    assert torch.equal(torch.get_rng_state(), before)
    assert [type(m).__name__ for m in model] == ["Embedding", "Linear", "ReLU", "Dropout", "Linear"]
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    x, y = example_batch(spec)
    assert x.shape == (2, 4) and x.dtype == torch.int64 and y.shape == (2, 4) and y.dtype == torch.int64
    assert model(x).shape == (2, 4, 3)
    assert torch.equal(build_mlp(spec, seed=3)[1].weight, model[1].weight)
    flat = MLPSpec([5, 3], batch=2)
    assert flat.widths == (5, 3)
    x, y = example_batch(flat)
    assert x.shape == (2, 5) and not x.requires_grad and y.shape == (2,)
    assert example_batch(MLPSpec((5, 3), batch=2, tokens=4))[0].shape == (2, 4, 5)


@pytest.mark.parametrize("kwargs, word", [
    ({"widths": (5,), "batch": 2}, "widths"),
    ({"widths": (5, 0), "batch": 2}, "widths"),
    ({"widths": (5, 2.0), "batch": 2}, "widths"),
    ({"widths": (5, 2), "batch": 0}, "batch"),
    ({"widths": (5, 2), "batch": 2, "tokens": True}, "tokens"),
    ({"widths": (5, 2), "batch": 2, "vocab": 0}, "vocab"),
    ({"widths": (5, 2), "batch": 2, "dropout": 1.0}, "dropout"),
    ({"widths": (5, 2), "batch": 2, "dtype": torch.float32}, "dtype"),
    ({"widths": (5, 2), "batch": 2, "dtype": "float16"}, "dtype"),
])
def test_a_bad_spec_is_refused_with_the_value_named(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        MLPSpec(**kwargs)


def test_an_unknown_optimizer_is_refused_before_any_work() -> None:
    spec = MLPSpec((5, 2), batch=2)
    for fn in (measured_memory, predict_memory):
        with pytest.raises(ValueError, match="adam"):
            fn(spec, "adam")
    with pytest.raises(ValueError, match="lion"):
        make_optimizer("lion", build_mlp(spec).parameters())
