"""Gradient accumulation gives the gradient of one big batch, whatever the group sizes and token counts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from course_lib.data import pad_collate
from course_lib.models import GPTConfig, Net, TinyGPT
from course_lib.train import accumulation_groups, backward_group, loss_and_count, train_accumulated

pytestmark = pytest.mark.usefixtures("one_thread")


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _assert_same_grads(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=f"gradient of {name} differs")


def _net() -> Net:
    torch.manual_seed(0)
    return Net(d_in=12, d=16, n_blocks=2, n_out=5, p=0.0)  # no dropout/BatchNorm: exact equivalence expected


@pytest.mark.parametrize("sizes", [[8, 8, 8], [8, 8, 3], [5, 1, 7, 2]])
def test_micro_batches_match_one_big_batch(sizes: list[int]) -> None:
    torch.manual_seed(1)
    n = sum(sizes)
    x, y = torch.randn(n, 12), torch.randint(0, 5, (n,))
    y[3] = -100  # an ignored target must not count anywhere

    big = _net()
    F.cross_entropy(big(x), y, ignore_index=-100).backward()

    small = _net()
    batches = list(zip(x.split(sizes), y.split(sizes)))
    loss_sum, count = backward_group(small, batches, "cpu")
    assert int(count) == n - 1
    _assert_same_grads(_grads(big), _grads(small))
    torch.testing.assert_close(loss_sum / count, F.cross_entropy(big(x), y, ignore_index=-100))


def test_a_single_batch_in_host_memory_is_counted_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a separate device (the audited CPU stands in for a GPU), a step without accumulation counts its targets in
    the batch the loader gave, a plain int: no operation is launched on the device for the log's count."""
    from course_lib import device_audit
    from course_lib.device import pick_device

    monkeypatch.setenv("COURSE_DEVICE_AUDIT", "1")
    device = pick_device("auto")
    try:
        model = _net().to(device)
        x, y = torch.randn(5, 12), torch.tensor([0, 1, 2, -100, 4])
        loss_sum, count = backward_group(model, [(x, y)], device)
    finally:
        device_audit.disable()
    assert type(count) is int and count == 4
    torch.testing.assert_close(loss_sum / count, F.cross_entropy(_net()(x), y, ignore_index=-100))


def test_naive_division_by_accumulation_steps_is_wrong_for_an_incomplete_group() -> None:
    """The outdated recipe ``loss / accum`` differs from the big batch when micro-batches differ in size."""
    torch.manual_seed(1)
    x, y = torch.randn(11, 12), torch.randint(0, 5, (11,))
    big = _net()
    F.cross_entropy(big(x), y).backward()
    naive = _net()
    for xb, yb in zip(x.split([8, 3]), y.split([8, 3])):
        (F.cross_entropy(naive(xb), yb) / 2).backward()
    diffs = [(a - b).abs().max().item() for a, b in zip(_grads(big).values(), _grads(naive).values())]
    assert max(diffs) > 1e-4


def test_variable_token_counts_with_padding_match_one_batch() -> None:
    torch.manual_seed(2)
    sequences = [torch.randint(0, 9, (int(n),)) for n in (9, 3, 6, 2, 8, 5)]

    def gpt() -> TinyGPT:
        torch.manual_seed(0)
        return TinyGPT(GPTConfig(vocab_size=9, block_size=8, n_layer=1, n_head=2, n_embd=16))

    big = gpt()
    loss_sum, count = loss_and_count(big, pad_collate(sequences), "cpu")
    assert int(count) == sum(len(s) - 1 for s in sequences)
    (loss_sum / count).backward()

    small = gpt()
    micro = [pad_collate(sequences[0:2]), pad_collate(sequences[2:5]), pad_collate(sequences[5:])]
    backward_group(small, micro, "cpu")
    _assert_same_grads(_grads(big), _grads(small))


def test_accumulation_groups() -> None:
    assert accumulation_groups(12, 4) == [4, 4, 4]
    assert accumulation_groups(10, 4) == [4, 4, 2]
    assert accumulation_groups(3, 1) == [1, 1, 1]
    assert accumulation_groups(0, 4) == []
    with pytest.raises(ValueError, match="accum"):
        accumulation_groups(5, 0)


def test_train_accumulated_weights_each_group_by_its_samples() -> None:
    torch.manual_seed(3)
    x, y = torch.randn(133, 12), torch.randint(0, 5, (133,))
    loader = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=False)  # 11 micro-batches of 12 and one of 1

    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    result = train_accumulated(model, loader, opt, "cpu", microbatches=4)
    assert result["group_sizes"] == [48, 48, 37]
    assert result["steps"] == 3

    # Reference: three plain SGD steps on the three big batches.
    ref = _net()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    losses = []
    for xb, yb in zip(x.split([48, 48, 37]), y.split([48, 48, 37])):
        loss = F.cross_entropy(ref(xb), yb)
        losses.append(loss.item() * len(yb))
        ref_opt.zero_grad(set_to_none=True)
        loss.backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=f"{name} differs after accumulation")
    assert result["loss"] == pytest.approx(sum(losses) / 133, rel=1e-5)


def test_summed_cross_entropy_skips_padding_in_sum_and_count() -> None:
    from course_lib.train.loss import IGNORE_INDEX, mean_cross_entropy, summed_cross_entropy

    logits = torch.randn(2, 3, 5)  # [B, T, V]: a language model's output
    targets = torch.tensor([[1, 4, IGNORE_INDEX], [0, IGNORE_INDEX, IGNORE_INDEX]])
    loss_sum, count = summed_cross_entropy(logits, targets)
    real = [(0, 0), (0, 1), (1, 0)]
    expected = sum(F.cross_entropy(logits[b, t][None], targets[b, t][None]) for b, t in real)
    assert int(count) == 3
    torch.testing.assert_close(loss_sum, expected)
    torch.testing.assert_close(mean_cross_entropy(logits, targets), expected / 3)


def test_take_group_cuts_a_stream_into_groups() -> None:
    from course_lib.train import take_group

    batches = iter(range(10))
    assert [take_group(batches, 4) for _ in range(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], []]


def test_batch_stream_groups_never_span_epochs_and_count_samples() -> None:
    from course_lib.data import make_loader
    from course_lib.train.stream import BatchStream

    data = TensorDataset(torch.arange(10.0), torch.zeros(10, dtype=torch.long))
    stream = BatchStream(make_loader(data, batch_size=2, train=True))  # 5 batches per epoch
    sizes = []
    for _ in range(4):
        group = stream.next_group(3)
        sizes.append(len(group))
        if len(sizes) == 1:
            assert (stream.epoch, stream.position) == (0, 6)
    assert sizes == [3, 2, 3, 2]  # each epoch's last group is short
    assert stream.state_dict() == {"epoch": 2, "samples_in_epoch": 0, "exact": True}
    assert stream.samples == 20  # every sample handed out, across epochs: what the log's throughput reads
    empty = BatchStream(DataLoader(TensorDataset(torch.zeros(0)), batch_size=2))
    with pytest.raises(RuntimeError, match="yields no batches"):
        empty.next_group(2)
