"""The library code of lesson 12: checkpointing, channels_last, optimizers, attention, threads, the prefetcher."""

from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.nn.functional as F

from course_lib.models import SmallCNN
from course_lib.models.attention import manual_attention
from course_lib.perf.busy import BusyCores
from course_lib.perf.checkpointing import block_stack, checkpointed_forward, count_saved_bytes
from course_lib.perf.memory_format import conv_weights_layouts, layout_of, to_channels_last
from course_lib.perf.optimizers import ADAMW_IMPLEMENTATIONS, adamw_step, many_small_params
from course_lib.perf.threads import DecodingDataset, intra_op_threads, thread_settings, with_threads
from course_lib.train.prefetch import Prefetcher


# ---------------------------------------------------------------- checkpointing
def _run(blocks, x, which):
    blocks.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    out = checkpointed_forward(blocks, x, which)
    out.pow(2).mean().backward()
    return out.detach(), [p.grad.clone() for p in blocks.parameters()]


def test_checkpointed_forward_equals_plain_with_dropout_and_saves_less():
    blocks, x = block_stack(4, 16, p=0.3), torch.randn(5, 16)
    plain_out, plain_grads = _run(blocks, x, [])
    ckpt_out, ckpt_grads = _run(blocks, x, [0, 1, 2, 3])
    assert torch.equal(plain_out, ckpt_out)
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, ckpt_grads))
    params = list(blocks.parameters())
    saved = [count_saved_bytes(lambda w=w: checkpointed_forward(blocks, x, w), exclude=params)
             for w in ([], [0, 2], [0, 1, 2, 3])]
    assert saved[0] > saved[1] > saved[2]
    assert saved[2] == 4 * x.numel() * x.element_size()  # only each block's input is kept


def test_count_saved_bytes_counts_each_storage_once_in_bytes_and_skips_exclude():
    a = torch.randn(10, 3, requires_grad=True)
    assert count_saved_bytes(lambda: a * a) == a.numel() * 4  # saved twice, one storage
    assert count_saved_bytes(lambda: a.double().exp()) == a.numel() * 8  # exp saves its float64 result
    linear = torch.nn.Linear(3, 2)
    with_weights = count_saved_bytes(lambda: linear(a))
    without = count_saved_bytes(lambda: linear(a), exclude=list(linear.parameters()))
    assert with_weights - without == linear.weight.numel() * 4


def test_block_stack_validates_and_is_seeded():
    with pytest.raises(ValueError, match="n_blocks"):
        block_stack(0, 8)
    first, second = block_stack(2, 8, seed=5), block_stack(2, 8, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), second.parameters()))


# ---------------------------------------------------------------- channels_last
def test_to_channels_last_converts_model_and_batch_keeping_shape_and_outputs():
    torch.manual_seed(0)
    model, x = SmallCNN(num_classes=3, width=4).eval(), torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        before = model(x)
    model, x_cl = to_channels_last(model, x)
    assert x_cl.shape == x.shape and layout_of(x_cl) == "channels_last" and layout_of(x) == "contiguous"
    assert set(conv_weights_layouts(model).values()) == {"channels_last"}
    with torch.no_grad():
        assert torch.allclose(model(x_cl), before, atol=1e-5)
    assert layout_of(torch.randn(2, 1, 4, 4)) == "both"
    assert layout_of(x.transpose(2, 3)) == "other"
    with pytest.raises(ValueError, match="4-D"):
        to_channels_last(model, torch.randn(3, 4))


# ---------------------------------------------------------------- optimizers
def test_the_three_adamw_implementations_make_the_same_update():
    model = many_small_params(n_layers=3, width=4)
    after = {}
    for name in ADAMW_IMPLEMENTATIONS:
        copy_ = copy.deepcopy(model)
        adamw_step(copy_, name)()
        after[name] = torch.cat([p.detach().flatten() for p in copy_.parameters()])
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.equal(after["for-loop"], before)
    assert all(torch.allclose(after["for-loop"], v, atol=1e-6) for v in after.values())
    with pytest.raises(ValueError, match="implementation"):
        adamw_step(model, "turbo")


# ---------------------------------------------------------------- attention
@pytest.mark.parametrize("is_causal", [False, True])
def test_manual_attention_equals_sdpa(is_causal):
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert torch.allclose(manual_attention(q, k, v, is_causal=is_causal), want, atol=1e-5)
    scaled = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=0.5)
    assert torch.allclose(manual_attention(q, k, v, is_causal=is_causal, scale=0.5), scaled, atol=1e-5)
    with pytest.raises(ValueError, match="shapes"):
        manual_attention(q, k[..., :4], v)


# ---------------------------------------------------------------- threads
def test_intra_op_threads_takes_the_cores_left_and_at_least_one():
    assert intra_op_threads(8) == 8
    assert intra_op_threads(8, workers=2, busy=1) == 5
    assert intra_op_threads(2, workers=4, busy=1) == 1
    for bad in ({"cores": 0}, {"cores": 4, "workers": -1}, {"cores": 2.5}):
        with pytest.raises(ValueError):
            intra_op_threads(**bad)


def test_thread_settings_and_with_threads():
    settings = thread_settings()
    assert settings["torch.get_num_threads()"] == torch.get_num_threads()
    assert {"OMP_NUM_THREADS", "MKL_NUM_THREADS"} <= set(settings)
    previous = torch.get_num_threads()
    try:
        assert with_threads(1, torch.get_num_threads)() == 1
    finally:
        torch.set_num_threads(previous)
    image, label = DecodingDataset(n=4, size=8, passes=1)[3]
    assert image.shape == (3, 8, 8) and label == 3
    assert torch.equal(DecodingDataset(n=4, size=8, passes=1)[3][0], image)  # seeded by its index


def test_busy_cores_start_and_are_gone_after_the_block():
    with BusyCores(1, max_s=30) as busy:
        processes = list(busy.processes)
        assert len(processes) == 1 and processes[0].is_alive()
    deadline = time.monotonic() + 5
    while processes[0].is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes[0].is_alive()
    with pytest.raises(ValueError):
        BusyCores(-1)


# ---------------------------------------------------------------- prefetcher
def test_prefetcher_cpu_fallback_yields_the_loaders_batches():
    data = torch.utils.data.TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    prefetcher = Prefetcher(loader, "cpu")
    assert not prefetcher.uses_side_stream
    got, want = list(prefetcher), list(loader)
    assert len(got) == len(want) == 3
    assert all(torch.equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))
    dicts = list(Prefetcher([{"x": torch.ones(2)}, {"x": torch.zeros(2)}], "cpu"))
    assert [d["x"].sum().item() for d in dicts] == [2.0, 0.0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_prefetcher_refuses_cuda_without_cuda():
    with pytest.raises(ValueError, match="CUDA is not available"):
        Prefetcher([], "cuda")
