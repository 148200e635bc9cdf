"""Character-level text: a small generated corpus, variable-length samples, and padding collation.

The corpus is produced locally by a template grammar (:mod:`course_lib.data.corpus`: short stories of one to
several sentences), so it is offline and deterministic, and its lines vary a lot in length: exactly the case
where the default collation (which stacks equal-shaped tensors) fails and a padding ``collate_fn`` is needed.

One line = one sample: ``dataset[i]`` is a ``LongTensor[L]`` of character ids, ending with ``"\\n"``.
:func:`pad_collate` turns a list of them into ``(x[B, T], y[B, T], lengths[B])`` where ``y`` is ``x`` shifted
by one (each position predicts the next character) and padded with ``-100``, the ``ignore_index`` of
``cross_entropy``: padding contributes neither to the loss nor to the count of predicted tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from course_lib.data.corpus import prepare_text
from course_lib.data.keys import split_key

IGNORE_INDEX = -100
DEFAULT_BLOCK_SIZE = 256


def pad_collate(batch: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Variable-length token sequences -> ``(x[B, T], y[B, T], lengths[B])`` for next-character prediction.

    For a sequence ``s`` of length ``L``: ``x = s[:-1]``, ``y = s[1:]`` (length ``L - 1``). ``T`` is the longest
    such length in the batch; ``x`` is padded with ``0`` (any valid id: those positions are never scored) and
    ``y`` with ``-100`` so ``cross_entropy(..., ignore_index=-100)`` and every sample/token count skip padding.
    Module scope, so DataLoader workers can unpickle it under ``spawn``.

    Taught in lesson 02 (``notebooks/02_dataloader.ipynb``).
    """
    if len(batch) == 0:
        raise ValueError("pad_collate: got an empty batch.")
    for i, seq in enumerate(batch):
        if not isinstance(seq, torch.Tensor) or seq.dim() != 1 or seq.numel() < 2:
            raise ValueError(f"pad_collate: sample {i} must be a 1-D tensor of at least 2 token ids, got "
                             f"{getattr(seq, 'shape', type(seq))}.")
    lengths = torch.tensor([seq.numel() - 1 for seq in batch], dtype=torch.long)
    T = int(lengths.max())
    x = torch.zeros(len(batch), T, dtype=torch.long)
    y = torch.full((len(batch), T), IGNORE_INDEX, dtype=torch.long)
    for i, seq in enumerate(batch):
        n = seq.numel() - 1
        x[i, :n] = seq[:-1]
        y[i, :n] = seq[1:]
    return x, y, lengths


class CharLinesDataset(Dataset):
    """One line of text per sample, encoded as character ids (``LongTensor[L]``, ending with the newline id).

    Lines longer than ``block_size + 1`` characters are cut, so ``x`` never exceeds the model's context.
    ``default_collate_fn`` tells :func:`make_loader` to pad batches with :func:`pad_collate`.
    """

    accepts_aug_seed = False  # no augmentation: a key's seed, if given, is ignored
    default_collate_fn = staticmethod(pad_collate)

    def __init__(self, lines: list[str], stoi: dict[str, int], block_size: int) -> None:
        self.block_size = block_size
        self.samples = [torch.tensor([stoi[c] for c in line + "\n"][: block_size + 1], dtype=torch.long)
                        for line in lines]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: Any) -> torch.Tensor:
        index, _ = split_key(key, len(self.samples))
        return self.samples[index]


@dataclass
class TextData:
    """What :func:`load_text_datasets` returns: the datasets plus the character vocabulary."""

    train: CharLinesDataset
    val: CharLinesDataset
    vocab_size: int
    stoi: dict[str, int]
    itos: dict[int, str]
    block_size: int
    root: Path

    def encode(self, text: str) -> torch.Tensor:
        """Characters -> ``LongTensor`` of ids (unknown characters raise a ``KeyError`` naming them)."""
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise KeyError(f"characters {unknown!r} are not in the vocabulary of {self.vocab_size} characters.")
        return torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Ids -> string; ``-100`` (padding) is skipped."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return "".join(self.itos[int(i)] for i in values if int(i) != IGNORE_INDEX)


def load_text_datasets(*, block_size: int | None = None, root: str | Path | None = None) -> TextData:
    """Generate (first time) and load the character-level text datasets.

    ``block_size`` (default 256) is the longest input ``x`` a sample yields; the vocabulary is every character
    of the corpus plus the newline, sorted, so ids are stable.

    Taught in lesson 00 (``notebooks/00_welcome.ipynb``).
    """
    if block_size is None:
        block_size = DEFAULT_BLOCK_SIZE
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"load_text_datasets: block_size={block_size!r} must be an int >= 1 (context length).")
    folder = prepare_text(root)
    lines = {split: (folder / f"{split}.txt").read_text().splitlines() for split in ("train", "val")}
    chars = sorted(set("".join(lines["train"] + lines["val"])) | {"\n"})
    stoi = {c: i for i, c in enumerate(chars)}
    itos = {i: c for c, i in stoi.items()}
    return TextData(
        train=CharLinesDataset(lines["train"], stoi, block_size),
        val=CharLinesDataset(lines["val"], stoi, block_size),
        vocab_size=len(chars), stoi=stoi, itos=itos, block_size=block_size, root=folder,
    )
