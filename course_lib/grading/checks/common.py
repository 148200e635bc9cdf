"""Instruments several exercises' checks share (not a checks module: it registers nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from course_lib.grading.api import CheckFailed
from course_lib.grading.ddp_ranks import failed_run_is_a_failed_check


class CountingSGD(torch.optim.SGD):
    """SGD that counts the calls that reach ``step`` (a GradScaler skips the call on an overflowing step)."""

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.steps_taken = 0

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.steps_taken += 1
        return super().step(closure)


# ------------------------------------------------------------------ exercises run on ranks (21, 22)
def rank_records(run_exercise: Callable[[Any, dict[str, Any]], dict[str, Any]], ns: Any, cfg: dict[str, Any],
                 section: str) -> list[dict[str, Any]]:
    """Every rank's record of one ``section`` of a driver's run (exercises 21 and 22: the run is shared by all
    checks); raise what a rank raised: a blank exercise as not attempted, anything else as a failed check."""
    with failed_run_is_a_failed_check("both ranks must reach the same collectives in the same order; run the demo "
                                      "cell to see what each rank did"):
        run = run_exercise(ns, cfg)
    records = []
    for record in run["ranks"]:
        error = record.get("error") or record.get(section, {}).get("error")
        if error is not None:
            if error["type"] == "NotImplementedError" and error["message"].startswith("Exercise"):
                raise NotImplementedError(error["message"])
            raise CheckFailed(f"rank {record['rank']} raised {error['type']}: {error['message']}",
                              hint="the exercise cell runs on its own in each process: it must import everything "
                                   "it uses, and both ranks must issue the same collectives",
                              got=error["where"].strip().splitlines()[-3:])
        records.append(record[section])
    return records


def gap(a: torch.Tensor, b: torch.Tensor) -> str:
    """How two tensors differ, for a check's ``got``."""
    return f"largest difference {(a - b).abs().max().item():.3g}" if a.shape == b.shape else \
        f"{a.numel()} values instead of {b.numel()}"


def split_layer_matches(ranks: list[dict[str, Any]], want: dict[str, Any],
                        share: Callable[[str, torch.Tensor, int], torch.Tensor], *, layer: str,
                        param: Callable[[str], str], hint: str, tolerance: float) -> None:
    """Each rank of a tensor-parallel layer gives the unsplit ``layer``'s output and input gradient, and each
    parameter's gradient on the rank's ``share`` (zeros elsewhere); ``param`` names a parameter for the message."""
    for rank, record in enumerate(ranks):
        for what, got, expected in (("output", record["out"], want["out"]),
                                    ("input gradient", record["x_grad"], want["x_grad"])):
            if got is None or got.shape != expected.shape or not torch.allclose(got, expected, rtol=0,
                                                                                 atol=tolerance):
                raise CheckFailed(f"rank {rank}: the {what} differs from the unsplit {layer}'s", hint=hint,
                                  expected=f"{tuple(expected.shape)} within {tolerance:g}",
                                  got="no gradient" if got is None else gap(got, expected))
        for name, grad in want["grads"].items():
            expected, got = share(name, grad, rank), record["grads"].get(name)
            if got is None or got.shape != expected.shape or not torch.allclose(got, expected, rtol=0,
                                                                                 atol=tolerance):
                raise CheckFailed(
                    f"rank {rank}: {param(name)}'s gradient is not the unsplit {layer}'s on this rank's share "
                    "(zeros elsewhere)", hint=hint, expected=f"{tuple(expected.shape)} within {tolerance:g}",
                    got="no gradient" if got is None else gap(got, expected))


def hidden_share(name: str, grad: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """The part of an MLP block's gradient that rank ``rank``'s hidden units reach when the first Linear (``0.``)
    is split by its rows and the second by its columns (zeros elsewhere)."""
    h = grad.shape[0] if name.startswith("0.") else grad.shape[1]
    mine = slice(rank * h // world, (rank + 1) * h // world)
    out = torch.zeros_like(grad)
    if name.startswith("0."):
        out[mine] = grad[mine]
    else:
        out[:, mine] = grad[:, mine]
    return out
