"""From a config to a finished run: data, model, distributed set-up, then :func:`train`.

This is what ``python -m course_lib.train`` calls. It works the same launched as a plain process (one device) and
under ``torchrun`` (one process per device, DDP): ``course_lib.distributed.setup()`` tells which.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from course_lib import distributed
from course_lib.mode import by_mode, mode
from course_lib.models import build_model
from course_lib.train.config import ConfigError, TrainConfig
from course_lib.train.loop import seed_everything, train

TEXT_BLOCK_SIZE = 128  # characters of context for the GPT (the text data cuts longer lines)


def model_kwargs(name: str) -> dict[str, Any]:
    """Model sizes for the current mode: tiny in smoke mode (wiring checks), laptop-sized in full mode.

    Taught in lesson 04 (``notebooks/04_template.ipynb``).
    """
    if name == "cnn":
        return {"width": by_mode(smoke=8, full=32)}
    if name == "net":
        return {"d": by_mode(smoke=64, full=256), "n_blocks": 2}
    return {"n_layer": by_mode(smoke=1, full=4), "n_head": 4, "n_embd": by_mode(smoke=32, full=128)}


def build_data_and_model(cfg: TrainConfig, ctx: distributed.DistContext, *, download: bool | None = None
                         ) -> tuple[Any, Any, nn.Module]:
    """``(train_loader, val_loader, model)`` for ``cfg`` (model weights seeded with ``cfg.seed``).

    ``download=False`` never fetches a dataset (the command line: it says how to get one instead); ``None``
    follows ``COURSE_ALLOW_DOWNLOAD``.
    """
    from course_lib.data import load_image_datasets, load_text_datasets, make_loader, pad_collate

    collate = None
    if cfg.dataset == "text":
        data = load_text_datasets(block_size=TEXT_BLOCK_SIZE)
        collate = pad_collate
        sizes: dict[str, Any] = {"vocab_size": data.vocab_size, "block_size": data.block_size}
    else:
        data = load_image_datasets(cfg.dataset, download=download)
        sizes = {"num_classes": data.num_classes, "image_size": data.image_size}
    shard = -(-len(data.train) // ctx.world_size)
    if cfg.bs > shard:
        where = f" per process ({ctx.world_size} processes)" if ctx.world_size > 1 else ""
        raise ConfigError(
            f"bs={cfg.bs} is larger than the {shard} training samples of dataset {cfg.dataset!r}{where} "
            f"(COURSE_MODE={mode()}); every batch would be dropped. Use --bs {shard} or less."
        )
    train_loader = make_loader(
        data.train, batch_size=cfg.bs, train=True, num_workers=cfg.workers, collate_fn=collate,
        seed=cfg.seed, rank=ctx.rank, world_size=ctx.world_size, pin_memory=ctx.device.type == "cuda",
    )
    # Every rank evaluates the whole validation set (small here): identical numbers on every rank, no gather.
    val_loader = make_loader(
        data.val, batch_size=cfg.bs, train=False, num_workers=cfg.workers, collate_fn=collate, seed=cfg.seed,
        pin_memory=ctx.device.type == "cuda",
    )
    seed_everything(cfg.seed)  # same initial weights on every rank and in every run
    kwargs = model_kwargs(cfg.model)
    if cfg.model == "gpt":
        model = build_model("gpt", vocab_size=sizes["vocab_size"], block_size=sizes["block_size"], **kwargs)
    else:
        model = build_model(cfg.model, num_classes=sizes["num_classes"], image_size=sizes["image_size"], **kwargs)
    return train_loader, val_loader, model


def run(cfg: TrainConfig, resume: bool = False, overwrite: bool = False, download: bool | None = None
        ) -> list[dict[str, Any]]:
    """Validate ``cfg``, build everything, train (or resume), tear down; returns the history.

    ``overwrite`` starts fresh even when ``cfg.out`` holds a run (see :func:`course_lib.train.train`);
    ``download`` as in :func:`build_data_and_model`.
    """
    cfg.validate()
    ctx = distributed.setup(device=cfg.device)
    try:
        return _build_and_train(cfg, ctx, resume, overwrite, download)
    finally:
        # The DDP model lives only inside _build_and_train: destroying the process group while a DDP module is
        # still alive can abort the process at exit ("terminate called without an active exception").
        distributed.teardown()


def _build_and_train(cfg: TrainConfig, ctx: distributed.DistContext, resume: bool, overwrite: bool,
                     download: bool | None) -> list[dict[str, Any]]:
    train_loader, val_loader, model = build_data_and_model(cfg, ctx, download=download)
    model = distributed.wrap_model(model, ctx, strategy="ddp")
    return train(model, train_loader, val_loader, cfg, device=ctx.device, resume=resume, overwrite=overwrite)
