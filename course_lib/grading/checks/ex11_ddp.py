"""Checks for exercise 11: the learner's DDP training loop, run for real on two processes.

The learner defines ``ddp_train(rank, world_size, model, dataset, cfg, out_dir)`` (and the helpers
``effective_batch`` and ``scaled_lr``) in one exercise cell. :func:`course_lib.grading.ddp_ranks.run_ranks` runs the
cell on two gloo processes (the source crosses the process boundary, not a pickled function), once per grading
run: every check below judges the same run, whose configuration comes from the run's seed. Each rank reports what
it *read* from the dataset, its final parameters, how many gradient all-reduces DDP sent and which files it saved;
the judge compares them with ``DistributedSampler``'s shards and with a one-process reference trained on the same
global batches (:func:`course_lib.ddp_demo.one_process_reference`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.data.distributed import DistributedSampler

from course_lib import ddp_demo
from course_lib.distributed import scaled_lr as reference_scaled_lr
from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed
from course_lib.grading.ddp_ranks import (
    CHECKPOINT,
    exercise_config,
    failed_run_is_a_failed_check,
    make_recording_dataset,
    run_ranks,
)

WORLD = 2
TIMEOUT_S = 240.0  # two fresh interpreters importing torch on a busy machine; a hang is what it guards against


def _run(ns: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    fn = need(ns, "ddp_train", "define `ddp_train(rank, world_size, model, dataset, cfg, out_dir)` in the "
                               "exercise cell")
    with failed_run_is_a_failed_check("every rank must reach the same collectives (each backward outside no_sync "
                                      "is one); run the demo cell to see both ranks' output"):
        result = run_ranks(fn, cfg, world_size=WORLD, timeout_s=TIMEOUT_S, reuse=True)
    for record in result["ranks"]:
        error = record.get("error")
        if error is None:
            continue
        if error["type"] == "NotImplementedError" and error["message"].startswith("Exercise"):
            raise NotImplementedError(error["message"])
        raise CheckFailed(f"rank {record['rank']} raised {error['type']}: {error['message']}",
                          hint="the cell runs on its own in each process: it must import everything it uses",
                          got=error["where"].strip().splitlines()[-3:])
    return result


def _ranks(ns: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = exercise_config(run_seed(ns))
    return cfg, observe(ns, _run, cfg)


def _expected_shard(cfg: dict[str, Any], rank: int, epoch: int) -> list[int]:
    sampler = DistributedSampler(range(cfg["n"]), num_replicas=WORLD, rank=rank, shuffle=True, seed=cfg["seed"])
    sampler.set_epoch(epoch)
    return list(sampler)


def _shard(cfg: dict[str, Any]) -> int:
    """Samples one rank reads per epoch: DistributedSampler pads an odd dataset so that both shards are this long."""
    return -(-cfg["n"] // WORLD)


def _epochs(cfg: dict[str, Any], reads: list[int]) -> list[list[int]]:
    """A rank's reads cut into epochs (of one shard each when it used the sampler)."""
    per = _shard(cfg)
    if len(reads) == cfg["epochs"] * cfg["n"]:  # no sampler: each rank read everything
        per = cfg["n"]
    return [reads[e * per:(e + 1) * per] for e in range(cfg["epochs"])]


def _steps(cfg: dict[str, Any]) -> tuple[int, int]:
    """(micro-batches, optimizer steps) of one rank over the run: the short last group of an epoch steps too."""
    micro = -(-_shard(cfg) // cfg["batch"])
    return cfg["epochs"] * micro, cfg["epochs"] * -(-micro // cfg["accum"])


@check_for("11", "ranks read disjoint shards (DistributedSampler)", points=2, parts=("11.1", "11.2", "11.3"))
def disjoint_shards(ns: dict[str, Any]) -> None:
    cfg, run = _ranks(ns)
    first = [_epochs(cfg, r["reads"])[0] for r in run["ranks"]]
    padding = set(_expected_shard(cfg, 0, 0)) & set(_expected_shard(cfg, 1, 0))  # an odd dataset: one sample twice
    if (set(first[0]) & set(first[1])) - padding:
        raise CheckFailed(
            "both ranks read the same samples in epoch 0: two processes did one process's work",
            hint="DataLoader(dataset, batch_size=..., sampler=DistributedSampler(dataset, num_replicas=world_size, "
                 "rank=rank, shuffle=True, seed=cfg['seed'])); no shuffle=True on the loader itself",
            got={"rank 0": first[0][:8], "rank 1": first[1][:8]},
        )
    for rank, got in enumerate(first):
        expected = _expected_shard(cfg, rank, 0)
        if got != expected:
            raise CheckFailed(
                f"rank {rank} did not read the shard DistributedSampler gives it in epoch 0",
                hint="pass num_replicas=world_size, rank=rank, shuffle=True and seed=cfg['seed'], and read the "
                     "batches in the loader's order",
                expected=expected, got=got,
            )


@check_for("11", "set_epoch gives every epoch a new order", points=1, parts=("11.1", "11.2", "11.3"))
def set_epoch_used(ns: dict[str, Any]) -> None:
    cfg, run = _ranks(ns)
    for record in run["ranks"]:
        epochs = _epochs(cfg, record["reads"])
        if epochs[1] == epochs[0]:
            raise CheckFailed(
                f"rank {record['rank']} read epoch 1 in exactly the order of epoch 0: every epoch repeats the "
                "same batches",
                hint="call sampler.set_epoch(epoch) at the start of every epoch: the shuffle is seeded with "
                     "seed + epoch",
                got=epochs[1][:8],
            )
        expected = _expected_shard(cfg, record["rank"], 1)
        if epochs[1] != expected:
            raise CheckFailed(f"rank {record['rank']}'s epoch 1 is not DistributedSampler's after set_epoch(1)",
                              expected=expected, got=epochs[1])


def _trained_from_this_run(cfg: dict[str, Any], params: torch.Tensor, what: str) -> None:
    """``params`` must be this run's model (``make_model(cfg["seed"])``) after a few small steps: independent
    initial weights are about as far apart as the weights are large, a short training run moves them far less."""
    start = ddp_demo.flat_parameters(ddp_demo.make_model(cfg["seed"]))
    if params.shape != start.shape or (params - start).norm() > 0.5 * start.norm():
        raise CheckFailed(f"{what} are not this run's model trained for a few steps",
                          hint="train the `model` passed to ddp_train (built from cfg['seed'] on every rank)",
                          expected=f"{start.numel()} weights near make_model({cfg['seed']})'s",
                          got=f"{params.numel()} weights" if params.shape != start.shape else
                          f"{(params - start).norm().item():.3g} away from them")


@check_for("11", "replicas identical after training", points=1, parts=("11.1", "11.2", "11.3"))
def replicas_identical(ns: dict[str, Any]) -> None:
    cfg, run = _ranks(ns)
    a, b = (r["params"] for r in run["ranks"])
    if a.shape != b.shape or not torch.allclose(a, b, rtol=0, atol=1e-6):
        gap = (a - b).abs().max().item() if a.shape == b.shape else "different shapes"
        raise CheckFailed(
            "the two ranks ended with different weights: their gradients were not averaged before every step",
            hint="wrap the model with DistributedDataParallel(model) after init_process_group, and let the last "
                 "micro-batch of each accumulation group run outside no_sync()",
            got=f"largest difference {gap}",
        )
    _trained_from_this_run(cfg, a, "the replicas' weights")


def _global_batches(cfg: dict[str, Any], run: dict[str, Any]) -> list[list[int]]:
    """What one process must train on to match: per optimizer step, every rank's micro-batches of that group."""
    try:
        return ddp_demo.global_batches([r["reads"] for r in run["ranks"]], cfg["batch"] * cfg["accum"],
                                       per_epoch=_shard(cfg))
    except ValueError as exc:
        raise CheckFailed(f"{exc}: every rank must read its whole shard in every epoch",
                          got=[len(r["reads"]) for r in run["ranks"]]) from None


def _one_process_hint(cfg: dict[str, Any], run: dict[str, Any]) -> str:
    micro, steps = _steps(cfg)
    if all(r.get("syncs") == steps - cfg["epochs"] for r in run["ranks"]):
        return ("the last group of each epoch holds fewer micro-batches than accum: step on it too, or its samples "
                "are never learned from")
    return ("divide each micro-batch's summed loss (reduction='sum') by the samples this rank reads in the group: "
            "the last group of an epoch is short, and so is its last micro-batch, so neither `/ accum` nor the mean "
            "of each micro-batch weighs every sample alike; DDP averages over the ranks. Step once per group and "
            "scale the LR linearly to the global batch (batch x world_size x accum)")


@check_for("11", "matches one process with the same global batch", points=2, parts=("11.1", "11.2", "11.3"))
def matches_one_process(ns: dict[str, Any]) -> None:
    cfg, run = _ranks(ns)
    global_batch = cfg["batch"] * WORLD * cfg["accum"]
    lr = reference_scaled_lr(cfg["base_lr"], cfg["base_batch"], global_batch, "linear")
    dataset = make_recording_dataset(cfg["n"], cfg["seed"])
    reference = ddp_demo.one_process_reference(ddp_demo.make_model(cfg["seed"]), dataset,
                                               _global_batches(cfg, run), lr)
    want, got = ddp_demo.flat_parameters(reference), run["ranks"][0]["params"]
    if want.shape != got.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
        moved_ratio = ((got - ddp_demo.flat_parameters(ddp_demo.make_model(cfg["seed"]))).norm()
                       / (want - ddp_demo.flat_parameters(ddp_demo.make_model(cfg["seed"]))).norm()).item()
        raise CheckFailed(
            f"rank 0's weights differ from one process trained with SGD at lr {lr:g} on the same "
            f"{global_batch}-sample global batches",
            hint=_one_process_hint(cfg, run),
            got=f"the weights moved {moved_ratio:.2f}x as far as the reference's",
        )


@check_for("11", "no_sync: one all-reduce per optimizer step", points=1, parts=("11.1", "11.2", "11.3"))
def one_allreduce_per_step(ns: dict[str, Any]) -> None:
    cfg, run = _ranks(ns)
    micro, steps = _steps(cfg)
    for record in run["ranks"]:  # the count is judged against this job's steps, so it must be this job's run
        expected = [i for epoch in range(cfg["epochs"]) for i in _expected_shard(cfg, record["rank"], epoch)]
        if record["reads"] != expected:
            raise CheckFailed(f"rank {record['rank']} did not read this job's shards (the shard checks say why), so "
                              "its all-reduces cannot be counted against this job's optimizer steps",
                              expected=f"{len(expected)} samples, {expected[:6]}...",
                              got=f"{len(record['reads'])} samples, {record['reads'][:6]}...")
    for record in run["ranks"]:
        if not record["ddp_models"]:
            raise CheckFailed("no DistributedDataParallel model was built on this rank",
                              hint="model = DistributedDataParallel(model) after init_process_group")
        if record["syncs"] != steps:
            why = ("every micro-batch's backward all-reduced its gradients" if record["syncs"] == micro else
                   "one all-reduce too few per epoch: the short last group of an epoch was never stepped on (or "
                   "its last micro-batch stayed inside no_sync)" if record["syncs"] == steps - cfg["epochs"] else
                   "fewer all-reduces than optimizer steps: some steps used gradients that were never averaged")
            raise CheckFailed(
                f"rank {record['rank']}: {why}",
                hint="with model.no_sync(): for every micro-batch but the last of each group; the last one's "
                     "backward (outside no_sync) all-reduces the accumulated gradients once",
                expected=f"{steps} all-reduces ({micro} micro-batches, accum {cfg['accum']})",
                got=f"{record['syncs']} all-reduces",
            )


@check_for("11", "only rank 0 saves, atomically", points=1, parts=("11.1", "11.2", "11.3"))
def rank0_saves(ns: dict[str, Any]) -> None:
    cfg, run = _ranks(ns)
    others = {r["rank"]: r["saves"] for r in run["ranks"] if r["rank"] != 0 and r["saves"]}
    if others:
        raise CheckFailed("ranks other than 0 wrote files: N processes writing one checkpoint race and corrupt "
                          "it, and the replicas are identical anyway", hint="if rank == 0: save", got=others)
    saves = run["ranks"][0]["saves"]
    if CHECKPOINT in saves:
        raise CheckFailed(f"rank 0 wrote {CHECKPOINT} in place: a run killed mid-write leaves a broken checkpoint",
                          hint=f"torch.save to a temporary name in out_dir, then os.replace(tmp, {CHECKPOINT!r})",
                          got=saves)
    checkpoint = run["checkpoint"]
    if not isinstance(checkpoint, torch.Tensor):
        raise CheckFailed(f"rank 0 should leave out_dir/{CHECKPOINT} holding the model's state_dict",
                          got=checkpoint if checkpoint is not None else f"files: {run['files']}")
    if checkpoint.shape != run["ranks"][0]["params"].shape or not torch.equal(checkpoint,
                                                                              run["ranks"][0]["params"]):
        raise CheckFailed(f"{CHECKPOINT} does not hold the trained weights",
                          hint="save model.module.state_dict() after the last step (module: the model inside DDP)")
    names = list(ddp_demo.make_model(cfg["seed"]).state_dict())
    keys = run.get("checkpoint_keys")
    if not isinstance(keys, list) or sorted(keys) != sorted(names):
        raise CheckFailed(f"{CHECKPOINT} holds the trained weights under other names than the model's, so "
                          "model.load_state_dict(torch.load(...)) on the plain model fails",
                          hint="save model.module.state_dict(): the DDP wrapper's own state_dict() puts 'module.' "
                               "in front of every name",
                          expected=names, got=keys)
    _trained_from_this_run(cfg, checkpoint, f"the weights in {CHECKPOINT}")


@check_for("11", "every rank leaves the process group", points=1, parts=("11.1", "11.2", "11.3"))
def leaves_group(ns: dict[str, Any]) -> None:
    _, run = _ranks(ns)
    open_ranks = [r["rank"] for r in run["ranks"] if r.get("group_left_open", True)]
    if open_ranks:
        raise CheckFailed(f"rank(s) {open_ranks} returned with the process group still initialized: the job's port "
                          "and its communication threads stay held, and the next init_process_group in that "
                          "process fails",
                          hint="dist.destroy_process_group() before returning (in a finally:, so an error leaves "
                               "the group too)")


def _setups(seed: int) -> list[tuple[int, int, int]]:
    """This run's (per-device batch, processes, accumulation steps): one plain, one of each kind of scaling."""
    return [(8 + seed % 29, 1 + seed % 3, 1), (2 + seed % 17, 2 + seed % 7, 2 + seed % 5),
            (1 + seed % 5, 3, 4 + seed % 3)]


def _base(seed: int) -> tuple[float, int]:
    """The LR this run's model was tuned at, and the batch it was tuned at."""
    return round(1e-3 * (1 + seed % 19), 9), 16 * (1 + seed % 4)


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else one_line(value)


def _batches_and_lrs(ns: dict[str, Any], setups: list[tuple[int, int, int]], base_lr: float,
                     base_batch: int) -> list[list[Any]]:
    eff = need(ns, "effective_batch", "define `effective_batch(per_device_batch, world_size, accum=1)`")
    lr = need(ns, "scaled_lr", "define `scaled_lr(base_lr, base_batch, per_device_batch, world_size, accum=1)`")
    return [[_plain(call(eff, per_device, world, accum)),
             _plain(call(lr, base_lr, base_batch, per_device, world, accum))] for per_device, world, accum in setups]


@check_for("11", "effective batch and linear LR scaling", points=1, parts=("11.1", "11.2"))
def batch_and_lr(ns: dict[str, Any]) -> None:
    setups, (base_lr, base_batch) = _setups(run_seed(ns)), _base(run_seed(ns))
    for (per_device, world, accum), (got, got_lr) in zip(setups, observe(ns, _batches_and_lrs, setups, base_lr,
                                                                          base_batch)):
        want = per_device * world * accum
        if got != want:
            raise CheckFailed(
                f"effective batch for {per_device} per device, {world} processes, {accum} accumulation steps",
                hint="every process sees its own per-device batch, and each step accumulates `accum` of them",
                expected=want,
                got=got,
            )
        expected_lr = reference_scaled_lr(base_lr, base_batch, want, "linear")
        if not isinstance(got_lr, (int, float)) or not math.isclose(got_lr, expected_lr, rel_tol=1e-9, abs_tol=1e-15):
            raise CheckFailed(
                f"linear rule: an LR of {base_lr:g} tuned at batch {base_batch} scaled to an effective batch of {want}",
                hint="base_lr * effective_batch / base_batch",
                expected=expected_lr,
                got=got_lr,
            )
