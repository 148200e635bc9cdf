"""``python -m course_lib.train [--option value ...]``: the template from the command line.

Every :class:`TrainConfig` field is an option, generated from the dataclass (``eval_every`` -> ``--eval-every``;
booleans as ``--compile`` / ``--no-compile``), so adding a field to the config adds its option here for free.
With no argument it trains the small CNN on the offline "shapes" data.

``--resume`` continues the run stored in ``--out``: the configuration comes from its checkpoint, and only the
options you pass explicitly override it (e.g. ``--steps 1200`` to train longer). A fresh run into a folder that
already holds one is refused unless ``--overwrite`` says to replace it; a folder another process is writing to is
refused too. The run uses the course's intra-op thread count (``COURSE_THREADS``, else half the cores: see
:func:`course_lib.device.course_threads`), like every lesson.

Every failure ends in one ``error:`` line that says what, why and what to do, never a traceback. Exit codes:
``0`` done, ``1`` the run failed while running (diverged, disk full, a file could not be written, a data-loading
worker killed: the last good checkpoint is intact), ``2`` bad input (options, environment, folder, data,
checkpoint: nothing was changed), ``130`` interrupted with Ctrl-C, ``143`` stopped by SIGTERM (what a cluster
scheduler or a container sends before killing). Both stop the run the same way: the last checkpoint is kept, the
metrics are cut back to it, and the line says how to resume.

Everything that can be checked cheaply is checked before the data is generated or loaded: the options, the
environment (``COURSE_MODE``, ``COURSE_DATA_DIR``), the folder, and on ``--resume`` the checkpoint itself (its
format, its mode, its precision on this machine, and that the options continue the same run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from course_lib import atomic, mode
from course_lib.argparsing import CommandParser
from course_lib.device import apply_course_threads, pick_device
from course_lib.train.checkpoint import CheckpointError, WriteError, check_compatible, check_mode, read_checkpoint
from course_lib.train.config import ConfigError, TrainConfig
from course_lib.train.guard import NonFiniteError
from course_lib.train.loop import CHECKPOINT_FILE, METRICS_FILE, Terminated, stop_signals
from course_lib.train.rundir import RunFolderError, run_folder

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 130, 143

_HELP = {
    "lr": "peak learning rate",
    "wd": "AdamW weight decay (matrices only)",
    "warmup": "linear warm-up steps (default: 5%% of steps)",
    "steps": "optimizer steps (default depends on COURSE_MODE)",
    "bs": "micro-batch size",
    "accum": "micro-batches per optimizer step",
    "clip": "max gradient norm; 0 or 'none' disables clipping",
    "amp_dtype": "autocast precision: auto, bf16, fp16 (CUDA), fp32",
    "eval_every": "evaluate + checkpoint every N steps (default: steps/4)",
    "log_every": "log a train line every N steps (default: steps/20)",
    "seed": "random seed (weights, data order, augmentation, dropout)",
    "device": "auto, cpu, cuda, cuda:N or mps",
    "dataset": "shapes (offline), cifar10 or text",
    "model": "cnn, net (images) or gpt (text)",
    "workers": "DataLoader worker processes",
    "compile": "torch.compile the model",
    "out": "run directory (metrics.jsonl, ckpt.pt)",
}


def _optional_float(text: str) -> float | None:
    return None if text.strip().lower() in ("none", "off") else float(text)


def _parser_type(field: dataclasses.Field) -> Any:
    """The argparse ``type`` for a dataclass field (``int | None`` -> int, ``float | None`` -> float or 'none')."""
    hints = typing.get_type_hints(TrainConfig)
    hint = hints[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    if base is float and type(None) in typing.get_args(hint):
        return _optional_float
    return base


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m course_lib.train",
        description="Train with the resumable template. Every TrainConfig field is an option.",
    )
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        kind = _parser_type(field)
        # An option not given is absent from the namespace (SUPPRESS), so the dataclass default (or the checkpoint's
        # value on --resume) applies, while an explicit `--clip none` still means None.
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=_HELP.get(field.name))
        else:
            parser.add_argument(flag, type=kind, default=argparse.SUPPRESS, metavar=field.name.upper(),
                                help=_HELP.get(field.name))
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="start fresh even if --out holds a run (deletes its checkpoint and metrics)")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The config for these arguments; on ``--resume`` the checkpoint's config with explicit overrides."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    if args.resume:
        out = Path(given.get("out", TrainConfig.__dataclass_fields__["out"].default))
        ckpt = out / CHECKPOINT_FILE
        if not ckpt.is_file():
            raise CheckpointError(
                f"--resume: there is no checkpoint at {ckpt}; start the run without --resume first "
                "(or point --out at the run directory)."
            )
        payload = read_checkpoint(ckpt)
        check_mode(payload, ckpt)  # now, not after generating the other mode's data
        saved = payload["config"] or {}
        saved = {k: v for k, v in saved.items() if k in TrainConfig.__dataclass_fields__}
        saved.pop("device", None)  # the checkpoint stores the resolved device; pick again on this machine
        _check_precision_here(saved, given, ckpt)
        cfg = TrainConfig(**{**saved, **given})
        check_compatible(payload["config"], cfg.resolved(), ckpt, step=payload["step"])
        return cfg
    return TrainConfig(**given)


def _check_precision_here(saved: dict[str, Any], given: dict[str, Any], ckpt: Path) -> None:
    """An fp16 run (CUDA only) resumed where there is no GPU: say what can work. Another precision cannot: it is
    part of the run's trajectory, so suggesting ``--amp-dtype fp32`` would only be refused in turn."""
    if saved.get("amp_dtype") != "fp16" or "amp_dtype" in given:
        return
    try:
        here = pick_device(given.get("device", "auto")).type
    except ValueError:
        return  # a bad --device is reported by the config's own check
    if here != "cuda":
        raise CheckpointError(
            f"checkpoint {ckpt} was trained in fp16 on a CUDA GPU, and fp16 training needs one (here the device is "
            f"{here!r}); the precision is part of the run, so another one would not continue it. Resume it on a "
            f"machine with a CUDA GPU, or start a new run in another --out with --amp-dtype fp32 (or bf16).")


def _bad_input_types() -> tuple[type[BaseException], ...]:
    from course_lib.data.errors import DataError, DatasetUnavailable, LoaderConfigError

    return (ConfigError, CheckpointError, RunFolderError, DatasetUnavailable, LoaderConfigError, DataError,
            mode.SettingError)


def loader_failure_line(exc: BaseException) -> str | None:
    """One line for a DataLoader worker that died (OOM killer) or ran out of shared memory; None for anything else.

    PyTorch reports both as a RuntimeError whose text names the worker; its advice (``--shm-size``, ``ulimit``)
    is about a container, so the line says what to do with this command.
    """
    text = str(exc)
    if "shared memory" in text or "/torch_" in text or ("No space left" in text and "DataLoader" in text):
        return ("the data-loading workers ran out of shared memory (/dev/shm is full or too small, common in "
                "containers); run again with --workers 0, or give the container more shared memory (docker run "
                "--shm-size=1g); --resume continues from the last checkpoint, which is intact, if one was written.")
    if "DataLoader worker" in text and ("killed by signal" in text or "exited unexpectedly" in text):
        signal_name = text.split("killed by signal:", 1)[1].strip().rstrip(".") if "killed by signal:" in text else ""
        why = f" (killed by signal: {signal_name})" if signal_name else ""
        return (f"a data-loading worker process died{why}; the out-of-memory killer does this when memory runs out. "
                f"Run again with fewer --workers (or --workers 0) or a smaller --bs; --resume continues from the last "
                f"checkpoint, which is intact, if one was written.")
    return None


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (a DataLoader worker's error arrives wrapped in its traceback text)."""
    from course_lib.data.errors import DatasetUnavailable

    text = str(exc).strip()
    if "Original Traceback" in text:  # re-raised from a worker: the message is the last line, after "Type: "
        last = text.splitlines()[-1]
        text = last.split(": ", 1)[1] if ": " in last else last
    if isinstance(exc, DatasetUnavailable):
        from course_lib.data.cifar import ARCHIVE, cifar_root

        root = cifar_root()
        return (f"CIFAR-10 is not in {root}, and training never downloads it; get it with `python -m course_lib data "
                f"prepare --which cifar10` (downloads unless COURSE_ALLOW_DOWNLOAD=0), or copy {ARCHIVE} into {root}, "
                f"or train on --dataset shapes.")
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _interrupted_line(out: Path | None, how: str = "interrupted (Ctrl-C)") -> str:
    if out is None:
        return f"{how} before the run started; nothing to resume: start it again."
    ckpt = out / CHECKPOINT_FILE
    command = f"python -m course_lib train --out {shlex.quote(str(out))} --resume"
    try:
        step = read_checkpoint(ckpt)["step"]
    except CheckpointError:
        return f"{how} before the first checkpoint; nothing to resume: start the run again."
    return f"{how}; the last checkpoint (step {step}) is in {ckpt}. Continue with: {command}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help (0) or a malformed option (2)
        return int(exc.code or 0)
    received: list[int] = []
    with stop_signals(received):
        return _main(args, received)


def _main(args: argparse.Namespace, received: list[int]) -> int:
    is_main = os.environ.get("RANK", "0") == "0"  # under torchrun, only rank 0 talks
    out: Path | None = None
    try:
        if args.resume and args.overwrite:
            raise ConfigError("--resume and --overwrite contradict each other: --resume continues the run in --out, "
                              "--overwrite deletes it. Pass one of them.")
        mode.data_dir()  # a data folder that is a file fails now, not after the folder is claimed
        cfg = config_from_args(args)
        out = Path(cfg.out)
        try:
            threads = apply_course_threads()  # the course's thread count (COURSE_THREADS, else half the cores)
        except ValueError as exc:  # a bad COURSE_THREADS: bad input, reported in one line
            raise ConfigError(str(exc)) from None
        if is_main:
            print("config: " + json.dumps(cfg.resolved().to_dict()), flush=True)
            print(f"threads: {threads} (COURSE_THREADS overrides)", flush=True)
        from course_lib.train.launch import run  # imported late: the data package loads only when a run starts

        # Claim the folder before loading any data, so a bad --out fails first (train() joins this claim).
        claim = (run_folder(cfg.out, out / CHECKPOINT_FILE, resume=args.resume, overwrite=args.overwrite)
                 if is_main else contextlib.nullcontext())
        with claim as held:
            if held is not None and held.stale_note:
                print(f"note: {held.stale_note}", flush=True)
            history = run(cfg, resume=args.resume, overwrite=args.overwrite, download=False)
    except KeyboardInterrupt as exc:
        return _stopped(out, terminated=isinstance(exc, Terminated), is_main=is_main)
    except (NonFiniteError, WriteError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except _bad_input_types() as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        if received:  # a loader worker hit by the same Ctrl-C or SIGTERM failed first: still a stop, not a crash
            return _stopped(out, terminated=received[0] == signal.SIGTERM, is_main=is_main)
        line = loader_failure_line(exc)
        if line is not None:
            print(f"error: {line}", file=sys.stderr)
            return EXIT_FAILED
        if isinstance(exc, OSError):  # a full disk, a read-only or unreadable folder while preparing the data
            print(f"error: {atomic.os_error_line(exc)}{mode.data_dir_hint(exc.filename)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise
    if not is_main:
        return 0
    last_eval = next((r for r in reversed(history) if "val_loss" in r), None)
    if last_eval is not None:
        print(f"final: step {last_eval['step']}  val_loss {last_eval['val_loss']:.4f}  "
              f"val_acc {last_eval['val_acc']:.3f}")
    print(f"metrics:    {out / METRICS_FILE}")
    print(f"checkpoint: {out / CHECKPOINT_FILE}")
    return 0


def _stopped(out: Path | None, *, terminated: bool, is_main: bool) -> int:
    """Ctrl-C and SIGTERM end alike: one line naming the last checkpoint and the resume command."""
    if is_main:
        how = "stopped by SIGTERM" if terminated else "interrupted (Ctrl-C)"
        print(f"\nerror: {_interrupted_line(out, how)}", file=sys.stderr, flush=True)
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
