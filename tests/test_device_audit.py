"""The device audit: on a CPU, a model or batch left behind fails as it fails on a GPU, and correct code runs as is.

Every lesson and solution kernel in the suite runs with the audit (tests/conftest.py); these tests pin its rules.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_lib import device_audit
from course_lib.device import pick_device
from course_lib.models import SmallCNN
from course_lib.train import evaluate


@pytest.fixture
def audited(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COURSE_DEVICE_AUDIT", "1")
    device = pick_device("auto")
    yield device
    device_audit.disable()


def batches(n: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, 3, (4,), generator=gen)) for _ in range(n)]


def test_pick_device_hands_out_the_audited_device_only_when_asked(audited: torch.device) -> None:
    assert audited == device_audit.AUDIT_DEVICE and audited != torch.device("cpu")
    assert pick_device("cpu") == torch.device("cpu")  # asking for the host explicitly is not the audited device


def test_without_the_variable_pick_device_is_the_plain_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COURSE_DEVICE_AUDIT", raising=False)
    if torch.cuda.is_available():
        pytest.skip("a GPU is the device here")
    assert pick_device("auto") == torch.device("cpu")


def test_a_model_left_on_the_host_fails_like_on_a_gpu(audited: torch.device) -> None:
    """Lesson 01's bug as the GPU found it: evaluate() moves the batches, the model was never moved."""
    model = SmallCNN(num_classes=3, width=8)
    with pytest.raises(device_audit.DeviceMismatch, match=r"conv2d .*left on the host.*\.to\(device\)"):
        evaluate(model, batches(), audited)


def test_a_batch_left_on_the_host_fails(audited: torch.device) -> None:
    model = SmallCNN(num_classes=3, width=8).to(audited)
    x, y = batches(1)[0]
    with pytest.raises(device_audit.DeviceMismatch):
        model(x)
    with pytest.raises(device_audit.DeviceMismatch, match="cross_entropy"):
        nn.functional.cross_entropy(model(x.to(audited)), y)  # the targets were forgotten


def test_code_that_moves_everything_runs_and_gives_the_same_numbers(audited: torch.device) -> None:
    data = batches()
    torch.manual_seed(0)
    model = SmallCNN(num_classes=3, width=8)
    plain = evaluate(model, data, "cpu")
    model.to(audited)
    assert all(device_audit.on_device(p) for p in model.parameters())
    assert evaluate(model, data, audited) == plain
    opt = torch.optim.AdamW(model.parameters())
    for x, y in data:  # a training step: optimizer state, gradients and scalars all follow the parameters
        loss = nn.functional.cross_entropy(model(x.to(audited)), y.to(audited))
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() > 0
    with pytest.raises(device_audit.DeviceMismatch, match="numpy"):
        loss.detach().numpy()  # a GPU tensor goes through .cpu() first
    assert loss.detach().cpu().numpy() > 0


def test_what_cuda_allows_is_allowed(audited: torch.device) -> None:
    on_device = torch.arange(6.0).to(audited)
    assert (on_device * torch.tensor(2.0)).sum().item() == 30  # a 0-d host tensor joins device tensors
    assert on_device[torch.tensor([0, 5])].tolist() == [0.0, 5.0]  # host indices index a device tensor
    made_there = torch.zeros(6, device=on_device.device)  # device= taken from a device tensor
    assert device_audit.on_device(made_there) and device_audit.on_device(on_device + made_there)
    back = on_device.to("cpu")
    assert not device_audit.on_device(back) and not device_audit.on_device(on_device.cpu())
    with pytest.raises(device_audit.DeviceMismatch):
        on_device + back


def test_moving_a_module_back_to_the_host_moves_its_parameters(audited: torch.device) -> None:
    model = nn.Linear(3, 2).to(audited)
    model.to("cpu")
    assert not any(device_audit.on_device(p) for p in model.parameters())
    assert all(device_audit.on_device(p) for p in model.to(audited).parameters())
    assert not any(device_audit.on_device(p) for p in model.cpu().parameters())
    with pytest.raises(device_audit.DeviceMismatch):
        model(torch.randn(2, 3).to(audited))


def test_a_compiled_model_runs_under_the_audit(audited: torch.device) -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(audited)
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(4, 8).to(audited)
    loss = nn.functional.cross_entropy(compiled(x), torch.tensor([0, 1, 2, 0]).to(audited))
    loss.backward()
    assert model[0].weight.grad is not None
