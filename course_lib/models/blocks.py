"""The pre-norm residual block, and a small network built from a stack of them.

Two ideas from the "modules are trees" lesson live here:

* **Registration.** ``Net`` keeps its blocks in an ``nn.ModuleList``. A plain Python ``list`` would *look* the same
  in ``forward`` but the blocks would be invisible to ``parameters()``, ``state_dict()`` and ``.to(device)``: they
  would never be trained, saved or moved to the GPU.
* **Pre-norm residual.** ``x + f(norm(x))``: the normalisation sits *inside* the branch, so the residual path is a
  clean identity from input to output. Gradients reach early layers undamped, which is why deep stacks of these
  blocks train without careful initialisation (the same block shape as in GPT-style transformers).

Forward passes are pure: no state changes besides what autograd records (dropout draws from the torch RNG).
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """``x + MLP(LayerNorm(x))`` with a 4x wide hidden layer and dropout on the branch output.

    Args:
        d: feature width (input and output).
        p: dropout probability on the residual branch (0 disables it).

    Taught in lesson 03 (``notebooks/03_modules.ipynb``).
    """

    def __init__(self, d: int, p: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(
            nn.Linear(d, 4 * d),
            nn.GELU(),
            nn.Linear(4 * d, d),
            nn.Dropout(p),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The residual path carries x unchanged; only the branch sees the normalised input.
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    """Input projection -> ``n_blocks`` residual blocks -> output projection (logits).

    Inputs with more than two dimensions (e.g. images ``[B, C, H, W]``) are flattened to ``[B, d_in]`` first,
    so the same network doubles as the "MLP baseline" for the image lessons.

    Args:
        d_in: number of input features (``C * H * W`` for images).
        d: hidden width of every block.
        n_blocks: how many ``Block`` modules to stack.
        n_out: number of outputs (classes).
        p: dropout probability inside each block.

    Taught in lesson 03 (``notebooks/03_modules.ipynb``).
    """

    def __init__(self, d_in: int, d: int, n_blocks: int, n_out: int, p: float = 0.1) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        # nn.ModuleList, not a list: registered, so trained, saved and moved with the parent.
        self.blocks = nn.ModuleList([Block(d, p) for _ in range(n_blocks)])
        self.norm = nn.LayerNorm(d)  # pre-norm stacks end with a norm before the head
        self.out = nn.Linear(d, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x.flatten(1))
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))  # logits [B, n_out]
