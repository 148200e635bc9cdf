"""The resumable training template, one concern per file.

Read in this order: ``config.py`` (what a run is), ``loss.py`` (cross-entropy over real targets: sum and
count), ``schedule.py`` (learning rate from the step), ``optim.py``
(AdamW groups), ``accumulate.py`` (exact gradient accumulation), ``evaluate.py`` (sums, not means),
``guard.py`` (stop on inf/nan), ``checkpoint.py`` (atomic, complete, checked), ``rundir.py`` (one run per
folder), ``stream.py`` (where we are in the data), ``loop.py`` (the loop
itself), ``launch.py`` (data + model + distributed around it) and ``cli.py`` (the command line).
"""

from __future__ import annotations

from course_lib.train.accumulate import (
    accumulation_groups,
    backward_group,
    count_targets,
    loss_and_count,
    take_group,
    train_accumulated,
)
from course_lib.train.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from course_lib.train.config import ConfigError, TrainConfig
from course_lib.train.evaluate import evaluate
from course_lib.train.guard import NonFiniteError
from course_lib.train.loop import seed_everything, train
from course_lib.train.loss import IGNORE_INDEX, mean_cross_entropy, summed_cross_entropy
from course_lib.train.optim import build_optimizer, param_groups
from course_lib.train.rundir import RunFolderError
from course_lib.train.schedule import lr_at


def run(cfg: TrainConfig, resume: bool = False, overwrite: bool = False, download: bool | None = None) -> list[dict]:
    """Build data + model from ``cfg`` and train (see :func:`course_lib.train.launch.run`).

    Taught in lesson 08 (``notebooks/08_latency_memory.ipynb``).
    """
    from course_lib.train.launch import run as _run  # the data package is imported only when a run starts

    return _run(cfg, resume=resume, overwrite=overwrite, download=download)


__all__ = [
    "TrainConfig", "ConfigError", "lr_at", "param_groups", "build_optimizer", "loss_and_count", "count_targets",
    "backward_group", "train_accumulated", "accumulation_groups", "evaluate", "train", "save_checkpoint",
    "load_checkpoint", "read_checkpoint", "CheckpointError", "run", "seed_everything", "NonFiniteError",
    "RunFolderError", "IGNORE_INDEX", "summed_cross_entropy", "mean_cross_entropy", "take_group",
]
