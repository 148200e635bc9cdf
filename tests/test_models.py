"""The course's model tests: shapes, registration, gradient flow, overfitting one batch, causality."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_lib.models import Block, GPTConfig, Net, SmallCNN, TinyGPT, build_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_block_keeps_shape_and_is_residual() -> None:
    block = Block(16, p=0.0)
    x = torch.randn(5, 16)
    assert block(x).shape == (5, 16)
    # With the last linear layer zeroed, the branch outputs 0 and the block is the identity: the residual path.
    torch.nn.init.zeros_(block.mlp[2].weight)
    torch.nn.init.zeros_(block.mlp[2].bias)
    assert torch.equal(block(x), x)


def test_net_registers_its_blocks() -> None:
    net = Net(d_in=12, d=8, n_blocks=3, n_out=4)
    assert isinstance(net.blocks, torch.nn.ModuleList)
    assert sum(1 for name in net.state_dict() if name.startswith("blocks.2.")) > 0
    assert net(torch.randn(7, 12)).shape == (7, 4)
    assert net(torch.randn(7, 3, 2, 2)).shape == (7, 4)  # images are flattened


@pytest.mark.parametrize(
    "name, kwargs, x, shape",
    [
        ("cnn", {"num_classes": 10, "width": 4}, torch.randn(3, 3, 32, 32), (3, 10)),
        ("cnn", {"num_classes": 5, "width": 4}, torch.randn(2, 3, 20, 20), (2, 5)),
        ("net", {"num_classes": 10, "image_size": 8, "d": 16}, torch.randn(3, 3, 8, 8), (3, 10)),
        ("gpt", {"vocab_size": 11, "block_size": 16, "n_embd": 16, "n_head": 2},
         torch.randint(0, 11, (2, 9)), (2, 9, 11)),
    ],
)
def test_build_model_output_shapes(name: str, kwargs: dict, x: torch.Tensor, shape: tuple) -> None:
    assert build_model(name, **kwargs)(x).shape == shape


def test_build_model_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="not one of"):
        build_model("resnet", num_classes=10)
    with pytest.raises(ValueError, match="num_classes"):
        build_model("cnn")
    with pytest.raises(ValueError, match="vocab_size"):
        build_model("gpt")
    with pytest.raises(ValueError, match="block_size"):
        TinyGPT(GPTConfig(vocab_size=5, block_size=4, n_embd=8, n_head=2))(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=10, n_head=4)


def test_gpt_is_causal_and_ties_weights() -> None:
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16)).eval()
    assert model.head.weight is model.tok_emb.weight
    x = torch.randint(0, 13, (2, 10))
    changed = x.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 13  # change only the future
    with torch.no_grad():
        a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def _tiny_models() -> list[tuple[torch.nn.Module, torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return [
        (SmallCNN(num_classes=4, width=4), torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))),
        (Net(d_in=48, d=16, n_blocks=2, n_out=4), torch.randn(4, 3, 4, 4), torch.randint(0, 4, (4,))),
        (TinyGPT(GPTConfig(vocab_size=9, block_size=8, n_layer=2, n_head=2, n_embd=16)),
         torch.randint(0, 9, (3, 8)), torch.randint(0, 9, (3, 8))),
    ]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["cnn", "net", "gpt"])
def test_every_trainable_parameter_gets_a_finite_gradient(index: int) -> None:
    model, x, y = _tiny_models()[index]
    logits = model(x)
    F.cross_entropy(logits.flatten(0, -2), y.flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


def test_overfit_one_batch() -> None:
    """A model that cannot memorise 16 samples has a bug (wiring, loss, or optimizer)."""
    torch.manual_seed(0)
    model = Net(d_in=3 * 4 * 4, d=32, n_blocks=2, n_out=4, p=0.0)
    x, y = torch.randn(16, 3, 4, 4), torch.randint(0, 4, (16,))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(200):
        loss = F.cross_entropy(model(x), y)
        if loss.item() < 0.05:
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
