"""Checks for exercise 02: find the bottleneck (loader settings, samples/s, profiler top-k, verdict)."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from course_lib.grading.api import CheckFailed, call, check_for, need, observe, one_line, run_seed

# ------------------------------------------------------------------ loader_config


def _machines(seed: int) -> list[tuple[int, str]]:
    """One core, two, and two larger counts that differ in every grading run, with each device, shuffled."""
    counts = (1, 2, 3 + seed % 6, 9 + seed % 40)
    machines = [(cores, device_type) for cores in counts for device_type in ("cpu", "cuda", "mps")]
    random.Random(seed).shuffle(machines)  # the answers come back in this run's order
    return machines


def _loader_configs(ns: dict[str, Any], machines: list[tuple[int, str]]) -> list[Any]:
    loader_config = need(ns, "loader_config", "define `loader_config(cores, device_type)` in the exercise cell")
    configs = []
    for cores, device_type in machines:
        cfg = call(loader_config, cores, device_type)
        data_like = isinstance(cfg, dict) and all(v is None or isinstance(v, (bool, int, float, str))
                                                  for v in cfg.values())
        configs.append(cfg if data_like else one_line(cfg))
    return configs


@check_for("02", "loader settings legal on any machine", parts=("02.1",))
def loader_settings(ns: dict[str, Any]) -> None:
    machines = _machines(run_seed(ns))
    for (cores, device_type), cfg in zip(machines, observe(ns, _loader_configs, machines)):
        where = f"loader_config({cores}, {device_type!r})"
        if not isinstance(cfg, dict):
            raise CheckFailed(f"{where} should return a dict", got=cfg)
        missing = {"num_workers", "prefetch_factor", "persistent_workers", "pin_memory"} - set(cfg)
        if missing:
            raise CheckFailed(f"{where} is missing key(s) {sorted(missing)}", got=sorted(cfg))
        workers = cfg["num_workers"]
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise CheckFailed(f"{where}: num_workers must be an int >= 0", got=workers)
        if cores == 1 and workers != 0:
            raise CheckFailed(f"{where}: with one core there is none to spare for workers",
                              hint="the training loop itself needs the only core: use num_workers=0",
                              expected=0, got=workers)
        if cores > 1 and not 1 <= workers <= cores - 1:
            raise CheckFailed(f"{where}: use between 1 and cores-1 workers (leave a core for the training loop)",
                              expected=f"1..{cores - 1}", got=workers)
        if workers == 0 and (cfg["prefetch_factor"] is not None or cfg["persistent_workers"]):
            raise CheckFailed(f"{where}: prefetch_factor/persistent_workers only exist for worker processes",
                              hint="with num_workers=0 use prefetch_factor=None and persistent_workers=False",
                              got=cfg)
        if workers > 0 and not (isinstance(cfg["prefetch_factor"], int) and cfg["prefetch_factor"] >= 1):
            raise CheckFailed(f"{where}: with workers, prefetch_factor is an int >= 1 (batches per worker)",
                              got=cfg["prefetch_factor"])
        if cfg["pin_memory"] != (device_type == "cuda"):
            raise CheckFailed(f"{where}: pinned memory only speeds up copies to a CUDA GPU",
                              hint="pin_memory = (device_type == 'cuda')",
                              expected=device_type == "cuda", got=cfg["pin_memory"])


# ------------------------------------------------------------------ samples_per_second


class _FakeClock:
    """A clock that only moves when the fake loader produces a batch (so the check never depends on timing)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _CountingLoader:
    sizes: list[int]
    clock: _FakeClock
    seconds_per_batch: float = 0.5
    produced: int = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for size in self.sizes:
            self.clock.now += self.seconds_per_batch
            self.produced += 1
            yield torch.zeros(size, 3), torch.zeros(size, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.sizes)


def _rate_inputs(seed: int) -> tuple[list[int], float]:
    """Batch sizes (the third one short) and seconds per batch, different in every grading run. The seconds take 11
    values, so the rate of neighbouring seeds never coincides (with 4 values, 1 seed in 60 gave its neighbour's rate,
    and a replayed answer passed)."""
    full = 4 + seed % 5
    return [full, full, full - 1 - seed % 3, full, full, full], round(0.2 + 0.03 * (seed % 11), 2)


def _rates(ns: dict[str, Any], sizes: list[int], seconds: float) -> dict[str, Any]:
    fn = need(ns, "samples_per_second",
              "define `samples_per_second(loader, n_batches, clock=time.perf_counter)` in the exercise cell")
    clock = _FakeClock()
    loader = _CountingLoader(sizes, clock, seconds)
    got = call(fn, loader, 3, clock=clock)
    short = _CountingLoader([4, 4], _FakeClock())
    try:
        fn(short, 5, clock=short.clock)
        too_few = "returned"
    except ValueError:
        too_few = "ValueError"
    except Exception as exc:
        too_few = type(exc).__name__
    return {"got": got if isinstance(got, (int, float)) else one_line(got), "produced": loader.produced,
            "too_few": too_few}


def _rate_hint(got: Any, sizes: list[int], seconds: float) -> str:
    """The hint for a wrong rate: the mistake whose result ``got`` equals, else both things to look at."""
    if not isinstance(got, (int, float)):
        return "return the rate as a number: samples / seconds"
    total, n = sum(sizes), len(sizes)
    late_start = ("start the clock before asking for the first batch (waiting for it is part of what training "
                  "pays): read clock() once before the loop and once after the last batch")
    mistakes = [
        (n * 2 / (n * seconds), "len(batch) is 2 for an (x, y) tuple: count len(x) instead"),
        (n * sizes[0] / (n * seconds), "the third batch is smaller: add up the real batch sizes instead of "
                                       "n_batches * batch_size"),
        (total / ((n - 1) * seconds), late_start),
        (sum(sizes[1:]) / ((n - 1) * seconds), late_start),
        (n * seconds / total, "that is seconds per sample: return samples / seconds"),
    ]
    for value, hint in mistakes:
        if got != 0 and math.isclose(got, value, rel_tol=1e-6):
            return hint
    if got > 100 * total / (n * seconds):
        return ("the time is far too short for batches that arrive every few tenths of a second: read every time "
                "with the `clock` argument (not time.perf_counter or time.time directly)")
    return ("check both halves: the samples (len(x) of each of the n_batches batches, a short one included) and the "
            "seconds (the `clock` argument, read before asking for the first batch and after the last one)")


@check_for("02", "samples/s counts samples over the measured batches", parts=("02.2",))
def samples_rate(ns: dict[str, Any]) -> None:
    sizes, seconds = _rate_inputs(run_seed(ns))
    seen = observe(ns, _rates, sizes, seconds)
    got = seen["got"]
    expected = sum(sizes[:3]) / (3 * seconds)
    if seen["produced"] > 3:
        raise CheckFailed("stop after n_batches: the loader was read further than asked",
                          hint="break out of the loop once n_batches batches have arrived",
                          expected="3 batches read", got=f"{seen['produced']} batches read")
    if not isinstance(got, (int, float)) or not math.isclose(got, expected, rel_tol=1e-6):
        raise CheckFailed(f"samples per second is off for batches of {sizes[0]}, {sizes[1]} and {sizes[2]} arriving "
                          f"every {seconds} s",
                          hint=_rate_hint(got, sizes[:3], seconds), expected=expected, got=got)
    if seen["too_few"] != "ValueError":
        raise CheckFailed("a loader with fewer batches than n_batches should raise ValueError",
                          hint="otherwise the rate silently covers fewer batches than you asked for",
                          expected="ValueError", got=seen["too_few"])


# ------------------------------------------------------------------ profile_steps


def _profiled(ns: dict[str, Any], warmup: int, active: int) -> dict[str, Any]:
    fn = need(ns, "profile_steps", "define `profile_steps(step_fn, warmup=1, active=3)` in the exercise cell")
    calls = []
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)

    def step() -> None:
        calls.append(1)
        torch.mm(a, b)

    prof = call(fn, step, warmup=warmup, active=active)
    if prof is None or not hasattr(prof, "key_averages"):
        return {"calls": len(calls), "returned": type(prof).__name__, "mm": None}
    return {"calls": len(calls), "returned": "profile",
            "mm": {e.key: e.count for e in prof.key_averages()}.get("aten::mm", 0)}


@check_for("02", "profiler records only the active steps", parts=("02.3",))
def profiler_schedule(ns: dict[str, Any]) -> None:
    warmup, active = 1 + run_seed(ns) % 3, 2 + run_seed(ns) // 3 % 4  # different in every grading run
    seen = observe(ns, _profiled, warmup, active)
    if seen["calls"] != warmup + active:
        raise CheckFailed("run the step warmup + active times", expected=warmup + active, got=seen["calls"])
    if seen["returned"] != "profile":
        raise CheckFailed("return the torch.profiler.profile object", got=seen["returned"])
    if seen["mm"] != active:
        raise CheckFailed(
            f"the profile should hold the {active} active steps only (warm-up steps are not recorded)",
            hint="schedule=torch.profiler.schedule(wait=0, warmup=warmup, active=active, repeat=1) and prof.step() "
                 "after every step; without repeat=1 the schedule starts a new cycle after the last step and the "
                 "recorded events are gone" if seen["mm"] == 0 else
                 "record only the active steps: pass schedule=torch.profiler.schedule(wait=0, warmup=warmup, "
                 "active=active, repeat=1) and call prof.step() after every step",
            expected=f"aten::mm x {active}", got=f"aten::mm x {seen['mm']}")


# ------------------------------------------------------------------ top_ops


@dataclass
class _Event:
    key: str
    self_cpu_time_total: float  # microseconds, like torch's FunctionEventAvg
    cpu_time_total: float
    count: int = 1


class _FakeProfile:
    def __init__(self, events: list[_Event]) -> None:
        self.events = events

    def key_averages(self) -> list[_Event]:
        return list(self.events)


def _reference_top(prof: Any, k: int) -> list[tuple[str, float]]:
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [(e.key, e.self_cpu_time_total / 1000.0) for e in events[:k]]



# Nested ops: "step" and "aten::linear" have big totals that include their children.
_EVENTS = [
    _Event("step", 50.0, 9000.0), _Event("aten::linear", 200.0, 6000.0), _Event("aten::addmm", 4000.0, 4100.0),
    _Event("aten::relu", 900.0, 900.0), _Event("aten::copy_", 1500.0, 1500.0), _Event("aten::mul", 700.0, 700.0),
    _Event("aten::sum", 300.0, 300.0), _Event("aten::add", 1200.0, 1300.0),
]


def _events(seed: int) -> list[_Event]:
    """The events above with self times (and totals) scaled per op, differently in every grading run."""
    draw = random.Random(seed)
    leaves = [e for e in _EVENTS if e.key not in ("step", "aten::linear")]
    scales = {e.key: draw.uniform(0.5, 1.5) for e in leaves}
    scaled = [_Event(e.key, round(e.self_cpu_time_total * scales[e.key], 1),
                     round(e.cpu_time_total * scales[e.key], 1)) for e in leaves]
    draw.shuffle(scaled)
    return [_EVENTS[0], _EVENTS[1], *scaled]


def _tops(ns: dict[str, Any], events: list[_Event], k: int) -> dict[str, Any]:
    fn = need(ns, "top_ops", "define `top_ops(prof, k=5)` in the exercise cell")
    got = call(fn, _FakeProfile(events), k=k)
    if isinstance(got, (list, tuple)) and all(isinstance(i, (list, tuple)) and len(i) == 2 for i in got):
        return [[one_line(name) if not isinstance(name, str) else name,
                 float(ms) if isinstance(ms, (int, float)) else one_line(ms)] for name, ms in got]
    return one_line(got)


@check_for("02", "top operations by self time, in ms", parts=("02.4",))
def top_operations(ns: dict[str, Any]) -> None:
    events, k = _events(run_seed(ns)), 3 + run_seed(ns) % 2
    expected = _reference_top(_FakeProfile(events), k)
    got = observe(ns, _tops, events, k)
    got_list = [tuple(item) for item in got] if isinstance(got, (list, tuple)) else got
    names = [n for n, _ in got_list] if isinstance(got_list, list) and all(len(i) == 2 for i in got_list) else None
    if names is None:
        raise CheckFailed("return a list of (name, self_ms) pairs", expected=expected, got=got)
    if names and names[0] in ("step", "aten::linear"):
        raise CheckFailed("this ranks by total time, which counts every child op again inside its parent",
                          hint="sort by self time (self_cpu_time_total): time spent in the op itself",
                          expected=[n for n, _ in expected], got=names)
    if names != [n for n, _ in expected]:
        raise CheckFailed("wrong operations or order", hint="sort descending by self_cpu_time_total, keep k",
                          expected=[n for n, _ in expected], got=names)
    for (_, want), (_, have) in zip(expected, got_list):
        if not isinstance(have, (int, float)) or not math.isclose(have, want, rel_tol=1e-6):
            hint = "the profiler reports microseconds: divide by 1000 for milliseconds"
            raise CheckFailed("self times should be in milliseconds", hint=hint, expected=expected, got=got_list)


# ------------------------------------------------------------------ verdict


_CASES = [((3.0, 1.0), "input-bound"), ((0.2, 2.5), "compute-bound"), ((1.5, 1.5), "input-bound"),
          ((0.0, 4.0), "compute-bound"), ((7.0, 0.0), "input-bound")]
_INVALID = ((-1.0, 1.0), (1.0, -0.5), (0.0, 0.0))


def _cases(seed: int) -> list[tuple[tuple[float, float], str]]:
    """The cases above scaled by a factor, plus six drawn at random, shuffled: different in every grading run."""
    draw = random.Random(seed)
    scale = 0.5 + (seed % 50) / 10
    cases = [((data * scale, compute * scale), answer) for (data, compute), answer in _CASES]
    for _ in range(6):
        data, compute = round(draw.uniform(0.01, 5.0), 3), round(draw.uniform(0.01, 5.0), 3)
        cases.append(((data, compute), "input-bound" if data >= compute else "compute-bound"))
    draw.shuffle(cases)
    return cases


def _verdicts(ns: dict[str, Any], cases: list[tuple[tuple[float, float], str]]) -> dict[str, Any]:
    fn = need(ns, "verdict", "define `verdict(data_s, compute_s)` in the exercise cell")
    answers = [one_line(call(fn, *args)) for args, _ in cases]
    rejected = []
    for bad in _INVALID:
        try:
            fn(*bad)
            rejected.append("returned")
        except ValueError:
            rejected.append("ValueError")
        except Exception as exc:
            rejected.append(type(exc).__name__)
    return {"answers": answers, "rejected": rejected}


@check_for("02", "verdict from the measured split", parts=("02.5",))
def verdict_rule(ns: dict[str, Any]) -> None:
    cases = _cases(run_seed(ns))
    seen = observe(ns, _verdicts, cases)
    for (args, expected), got in zip(cases, seen["answers"]):
        if got != repr(expected):
            raise CheckFailed(f"verdict(data_s={args[0]}, compute_s={args[1]}) is wrong",
                              hint="input-bound when the step waits for data at least as long as it computes",
                              expected=expected, got=got)
    for bad, outcome in zip(_INVALID, seen["rejected"]):
        if outcome != "ValueError":
            raise CheckFailed(f"verdict{bad} should raise ValueError (negative times, or nothing measured)",
                              hint="check the inputs before deciding", expected="ValueError", got=outcome)


# ------------------------------------------------------------------ batches: collate_fn, drop_last, shuffle


def _sequences(seed: int, n: int) -> list[tuple[torch.Tensor, int]]:
    """``n`` items ``(token ids of length 1..9, label = the item's index)``: the label shows where a batch came from."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 10, (n,), generator=g).tolist()
    return [(torch.randint(1, 50, (length,), generator=g), i) for i, length in enumerate(lengths)]


def _reference_collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seqs = [s for s, _ in batch]
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=0)
    return padded, torch.tensor([len(s) for s in seqs]), torch.tensor([label for _, label in batch])


def _as_tensors(out: Any) -> Any:
    if isinstance(out, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in out):
        return [t.detach() for t in out]
    return one_line(out)


def _collated(ns: dict[str, Any], seed: int) -> Any:
    fn = need(ns, "pad_collate", "define `pad_collate(batch)` in the exercise cell")
    return _as_tensors(call(fn, _sequences(seed, 5)))


@check_for("02", "pad_collate pads to the longest, keeps the lengths", parts=("02.6",))
def collate_padding(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    got = observe(ns, _collated, seed)
    expected = list(_reference_collate(_sequences(seed, 5)))
    if not isinstance(got, list) or len(got) != 3:
        raise CheckFailed("pad_collate should return three tensors: (padded, lengths, labels)", got=got)
    names = ("padded", "lengths", "labels")
    for name, want, have in zip(names, expected, got):
        if have.shape != want.shape or not torch.equal(have.to(want.dtype), want):
            hint = {"padded": "pad every sequence at the end with 0 up to the longest one in *this* batch "
                              "(torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True))",
                    "lengths": "record each sequence's length before padding",
                    "labels": "stack the labels in the batch's order"}[name]
            raise CheckFailed(f"pad_collate's {name} is wrong for sequences of lengths "
                              f"{expected[1].tolist()}", hint=hint, expected=want.tolist(), got=have.tolist())


def _epochs(ns: dict[str, Any], seed: int, n: int, batch_size: int) -> Any:
    fn = need(ns, "epoch_batches", "define `epoch_batches(dataset, batch_size, seed)` in the exercise cell")
    data = _sequences(seed, n)
    runs = []
    for loader_seed in (seed, seed, seed + 1):
        batches = []
        for batch in call(fn, data, batch_size, loader_seed):
            if not isinstance(batch, (list, tuple)) or len(batch) != 3:
                return {"batch": one_line(batch)}
            padded, _, labels = batch
            batches.append({"labels": [int(v) for v in labels], "width": int(padded.shape[1])})
        runs.append(batches)
    # Started from two different global random states: a helper that calls torch.manual_seed ends in the same one.
    ends = []
    for start in (seed, seed + 7):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(start)
            for _ in call(fn, data, batch_size, seed):
                pass
            ends.append(torch.get_rng_state())
    return {"runs": runs, "global rng reset": bool(torch.equal(ends[0], ends[1]))}


def _epoch_inputs(seed: int) -> tuple[int, int]:
    """Dataset size and batch size (the last batch is always incomplete), different in every grading run."""
    batch_size = 4 + seed % 3
    return batch_size * (4 + seed % 3) + 1 + seed % (batch_size - 1), batch_size


@check_for("02", "epoch loader: full batches only (drop_last)", parts=("02.6", "02.7"))
def epoch_drop_last(ns: dict[str, Any]) -> None:
    n, batch_size = _epoch_inputs(run_seed(ns))
    seen = observe(ns, _epochs, run_seed(ns), n, batch_size)
    if "runs" not in seen:
        raise CheckFailed("each batch should be pad_collate's (padded, lengths, labels)",
                          hint="DataLoader(..., collate_fn=pad_collate)", got=seen["batch"])
    sizes = [len(b["labels"]) for b in seen["runs"][0]]
    if sizes != [batch_size] * (n // batch_size):
        raise CheckFailed(f"{n} samples in batches of {batch_size}: training should see only full batches (a small "
                          "last batch gives a noisier step and, with BatchNorm, can even fail)",
                          hint="DataLoader(..., drop_last=True)", expected=[batch_size] * (n // batch_size), got=sizes)
    data = _sequences(run_seed(ns), n)
    widths = [max(len(data[i][0]) for i in b["labels"]) for b in seen["runs"][0]]
    if [b["width"] for b in seen["runs"][0]] != widths:
        raise CheckFailed("each batch should be padded to its own longest sequence", hint="collate_fn=pad_collate",
                          expected=widths, got=[b["width"] for b in seen["runs"][0]])


@check_for("02", "epoch loader: shuffled, reproducible from the seed", parts=("02.6", "02.7"))
def epoch_shuffle(ns: dict[str, Any]) -> None:
    n, batch_size = _epoch_inputs(run_seed(ns))
    seen = observe(ns, _epochs, run_seed(ns), n, batch_size)
    if "runs" not in seen:
        raise CheckFailed("each batch should be pad_collate's (padded, lengths, labels)", got=seen["batch"])
    first, again, other = ([i for b in run for i in b["labels"]] for run in seen["runs"])
    if len(set(first)) != len(first) or not set(first) <= set(range(n)) or len(first) != n // batch_size * batch_size:
        raise CheckFailed(f"an epoch over {n} samples in full batches of {batch_size} should visit "
                          f"{n // batch_size * batch_size} different samples", got=first)
    if first == sorted(first):
        raise CheckFailed("the samples come in dataset order: training batches should be shuffled every epoch",
                          hint="DataLoader(..., shuffle=True)", got=first[:12])
    if first != again or first == other:
        raise CheckFailed("the order should be the same for the same seed and differ for another seed",
                          hint="shuffle with generator=torch.Generator().manual_seed(seed) (not the global RNG)",
                          expected="same seed: same order; seed + 1: another order",
                          got={"same seed, same order": first == again, "seed + 1, another order": first != other})
    if seen.get("global rng reset"):
        raise CheckFailed("epoch_batches resets the program's global random state (torch.manual_seed): every random "
                          "draw after it (initialisation, dropout, augmentation) repeats whenever a loader is built",
                          hint="leave the global generator alone: give the DataLoader its own, "
                               "generator=torch.Generator().manual_seed(seed)",
                          expected="the global random state untouched by the seed", got="reset to the seed")


# ------------------------------------------------------------------ memory and shapes in the profiler


def _memory_profiled(ns: dict[str, Any], rows: int, inner: int) -> dict[str, Any]:
    fn = need(ns, "profile_memory_steps", "define `profile_memory_steps(step_fn, steps=2)` in the exercise cell")
    g = torch.Generator().manual_seed(rows)
    a, b = torch.randn(rows, inner, generator=g), torch.randn(inner, 3, generator=g)

    def step() -> None:
        torch.zeros(rows, 256)  # the allocation the profile must account for
        torch.mm(a, b)

    prof = call(fn, step, steps=2)
    if prof is None or not hasattr(prof, "key_averages"):
        return {"returned": type(prof).__name__}
    events = list(prof.key_averages(group_by_input_shape=True))
    return {"returned": "profile", "mm_shapes": [e.input_shapes for e in events if e.key == "aten::mm"],
            "allocated": max([int(e.self_cpu_memory_usage) for e in events] or [0])}


@check_for("02", "profile with memory and input shapes", parts=("02.8",))
def profile_memory_shapes(ns: dict[str, Any]) -> None:
    rows, inner = 100 + run_seed(ns) % 200, 3 + run_seed(ns) % 7  # different in every grading run
    seen = observe(ns, _memory_profiled, rows, inner)
    if seen["returned"] != "profile":
        raise CheckFailed("return the torch.profiler.profile object", got=seen["returned"])
    if [[rows, inner], [inner, 3]] not in seen["mm_shapes"]:
        raise CheckFailed("the profile does not know the operations' input shapes",
                          hint="torch.profiler.profile(..., record_shapes=True)",
                          expected=f"aten::mm with input shapes {[[rows, inner], [inner, 3]]}", got=seen["mm_shapes"])
    if seen["allocated"] < rows * 256 * 4:
        raise CheckFailed("the profile does not count memory: each step allocates a "
                          f"[{rows}, 256] float32 tensor ({rows * 256 * 4} bytes)",
                          hint="torch.profiler.profile(..., profile_memory=True)",
                          expected=f">= {rows * 256 * 4} bytes in one operation", got=seen["allocated"])


@dataclass
class _MemoryEvent:
    key: str
    input_shapes: list[list[int]]
    self_cpu_memory_usage: int  # bytes allocated by the op itself
    cpu_memory_usage: int  # bytes including its children


class _FakeMemoryProfile:
    """key_averages() like torch's: grouped by name, or by name and input shapes when asked."""

    def __init__(self, events: list[_MemoryEvent]) -> None:
        self.events = events

    def key_averages(self, group_by_input_shape: bool = False, **_: Any) -> list[_MemoryEvent]:
        if group_by_input_shape:
            return list(self.events)
        merged: dict[str, _MemoryEvent] = {}
        for e in self.events:
            m = merged.setdefault(e.key, _MemoryEvent(e.key, [], 0, 0))
            m.self_cpu_memory_usage += e.self_cpu_memory_usage
            m.cpu_memory_usage += e.cpu_memory_usage
        return list(merged.values())


def _memory_events(seed: int) -> list[_MemoryEvent]:
    """Allocations in MiB-sized multiples, different in every grading run; 'linear' and 'conv' hold their children."""
    draw = random.Random(seed)
    mib = 1 << 20
    sizes = draw.sample(range(2, 40), 4)
    return [_MemoryEvent("aten::linear", [[64, 128], [256, 128]], 0, (sizes[0] + sizes[1]) * mib),
            _MemoryEvent("aten::empty", [[64, 256]], sizes[0] * mib, sizes[0] * mib),
            _MemoryEvent("aten::empty", [[8, 3, 32, 32]], sizes[1] * mib, sizes[1] * mib),
            _MemoryEvent("aten::cat", [[64, 256], [64, 256]], sizes[2] * mib, sizes[2] * mib),
            _MemoryEvent("aten::relu", [[64, 256]], sizes[3] * mib, sizes[3] * mib),
            _MemoryEvent("aten::conv2d", [[8, 3, 32, 32], [16, 3, 3, 3]], mib, 80 * mib)]


def _reference_top_memory(events: list[_MemoryEvent], k: int) -> list[tuple[str, str, float]]:
    ranked = sorted(events, key=lambda e: e.self_cpu_memory_usage, reverse=True)[:k]
    return [(e.key, str(e.input_shapes), e.self_cpu_memory_usage / 2**20) for e in ranked]


def _shapes_text(shapes: Any) -> str:
    """Input shapes as torch prints them (lists), whether given as lists or tuples."""
    if isinstance(shapes, (list, tuple)) and all(isinstance(s, (list, tuple)) for s in shapes):
        return str([list(s) for s in shapes])
    return shapes if isinstance(shapes, str) else one_line(shapes)


def _top_memory(ns: dict[str, Any], seed: int, k: int) -> Any:
    fn = need(ns, "top_memory", "define `top_memory(prof, k=3)` in the exercise cell")
    got = call(fn, _FakeMemoryProfile(_memory_events(seed)), k=k)
    if isinstance(got, (list, tuple)) and all(isinstance(i, (list, tuple)) and len(i) == 3 for i in got):
        return [[one_line(name) if not isinstance(name, str) else name, _shapes_text(shapes),
                 float(mb) if isinstance(mb, (int, float)) else one_line(mb)] for name, shapes, mb in got]
    return one_line(got)


@check_for("02", "top allocations by self memory, per input shape, in MiB", parts=("02.9",))
def top_memory_ops(ns: dict[str, Any]) -> None:
    seed = run_seed(ns)
    k = 2 + seed % 3
    expected = [list(item) for item in _reference_top_memory(_memory_events(seed), k)]
    got = observe(ns, _top_memory, seed, k)
    if not isinstance(got, list):
        raise CheckFailed("return a list of (name, input_shapes, MiB) triples", expected=expected, got=got)
    if [g[:2] for g in got] != [e[:2] for e in expected]:
        hint = "rank by self_cpu_memory_usage (what the op itself allocates; cpu_memory_usage counts its children " \
               "too), from prof.key_averages(group_by_input_shape=True) so each shape is its own row"
        raise CheckFailed("wrong operations or order", hint=hint, expected=[e[:2] for e in expected],
                          got=[g[:2] for g in got])
    for want, have in zip(expected, got):
        if not isinstance(have[2], float) or not math.isclose(have[2], want[2], rel_tol=1e-6):
            raise CheckFailed("memory should be in MiB", hint="the profiler reports bytes: divide by 2**20",
                              expected=[e[2] for e in expected], got=[g[2] for g in got])


# ------------------------------------------------------------------ 02.8 the experiment order

TUNING_ORDER = ("num_workers", "batch_size", "pin_memory", "prefetch_factor")


def _tuning_inputs(seed: int) -> tuple[dict[str, Any], dict[str, list[Any]], float, float]:
    """Baseline, candidates (in a shuffled dict order), memory budget in MiB and allowed val_loss rise."""
    batch = (32, 64)[seed % 2]
    candidates = {"num_workers": [1, 2, 4 + seed % 3], "batch_size": [batch // 2, batch * 2, batch * 4],
                  "pin_memory": [True], "prefetch_factor": [4]}
    keys = list(candidates)
    random.Random(seed).shuffle(keys)  # the course's order, not the dict's, decides what is tried first
    if tuple(keys) == TUNING_ORDER:
        keys.reverse()
    baseline = {"num_workers": 0, "batch_size": batch, "pin_memory": False, "prefetch_factor": None}
    candidates = {k: candidates[k] for k in keys}
    rise = _loss_rise(seed)
    # The budget is exactly the peak of the batch * 2 trial: at the budget is legal (only more is over memory), so
    # `peak_mib >= budget_mib` calls it over memory. Batch * 4 never fits; every other trial is far below.
    _, unlimited = reference_tuning(_SyntheticLoader(seed), baseline, candidates, math.inf, rise)
    budget = next(r["peak_mib"] for r in unlimited if r["setting"] == "batch_size" and r["value"] == batch * 2)
    return baseline, candidates, budget, rise


def _loss_rise(seed: int) -> float:
    """The run's max_loss_rise: a multiple of 1/128, so the baseline's val_loss plus it is exact in binary and the
    half batch sits exactly at the limit however a learner writes the comparison (a - b > rise or a > b + rise)."""
    return (3 + seed % 3) / 128


class _SyntheticLoader:
    """``measure(config)``: timed rounds (seconds per batch), peak memory and val_loss of one loader setting.

    No timing happens: every number is made up from the config and the run's seed, so the rules (not the machine)
    decide. Workers help up to 2 then stop (the third count is within the noise of 2), half batches are slower per
    sample and validate exactly max_loss_rise worse (still the same training: only more is worse validation),
    doubling the batch is faster but validates worse and exactly fills the memory budget, four times the batch is
    fastest but does not fit in memory, pinned memory changes nothing on this CPU, and deeper prefetch helps a little.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.calls: list[dict[str, Any]] = []

    def _speed(self, cfg: dict[str, Any], batch0: int) -> tuple[float, float]:
        workers = int(cfg.get("num_workers") or 0)
        speed = (1.0, 1.7, 2.6)[min(workers, 2)] * (1.01 if workers > 2 else 1.0)
        ratio = int(cfg["batch_size"]) / batch0
        speed *= {0.5: 0.8, 1.0: 1.0, 2.0: 1.35, 4.0: 1.6}.get(ratio, 1.0)
        if cfg.get("prefetch_factor") == 4 and workers > 0:
            speed *= 1.15 + self.seed % 5 / 100
        loss = 0.5 + self.seed % 7 / 128  # exact in binary, as is loss + _loss_rise(seed)
        if ratio >= 2:
            loss += 0.08
        elif ratio < 1:
            loss += _loss_rise(self.seed)  # exactly at the limit: not worse validation
        return speed, loss

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(config, dict):
            raise TypeError(f"measure() takes a config dict, got {config!r}")
        self.calls.append(dict(config))
        batch0 = (32, 64)[self.seed % 2]
        speed, loss = self._speed(config, batch0)
        rng = random.Random(f"{self.seed}-{len(self.calls)}")
        per_batch = int(config["batch_size"]) / (2000.0 * (1 + self.seed % 10 / 10) * speed)
        seconds = tuple(per_batch * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5))
        workers = int(config.get("num_workers") or 0)
        peak = 250.0 + 2.4 * int(config["batch_size"]) + 10 * workers
        return {"seconds": seconds, "peak_mib": peak, "val_loss": loss}


def reference_tuning(measure: Any, baseline: dict[str, Any], candidates: dict[str, list[Any]], budget_mib: float,
                     max_loss_rise: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The course's order, one change at a time, kept only when the verdict says faster within memory and quality."""
    from course_lib.perf.compare import Measurement, verdict_from_times

    current = dict(baseline)
    ref = measure(current)
    base_loss = ref["val_loss"]

    def row(setting: str, value: Any, m: dict[str, Any], batch: int, kept: bool, reason: str) -> dict[str, Any]:
        return {"setting": setting, "value": value, "samples_per_s": batch / statistics.median(m["seconds"]),
                "peak_mib": m["peak_mib"], "val_loss": m["val_loss"], "kept": kept, "reason": reason}

    log = [row("baseline", None, ref, current["batch_size"], True, "baseline")]
    for key in TUNING_ORDER:
        for value in candidates.get(key, []):
            trial = {**current, key: value}
            m = measure(trial)
            if m["peak_mib"] > budget_mib:
                reason = "over memory"
            elif m["val_loss"] > base_loss + max_loss_rise:
                reason = "worse validation"
            else:
                reason = verdict_from_times(
                    Measurement("trial", tuple(m["seconds"]), trial["batch_size"]),
                    Measurement("current", tuple(ref["seconds"]), current["batch_size"])).outcome
            kept = reason == "faster"
            log.append(row(key, value, m, trial["batch_size"], kept, reason))
            if kept:
                current, ref = trial, m
    return current, log


def _tuned(ns: dict[str, Any], seed: int) -> dict[str, Any]:
    tune = need(ns, "tune_loader",
                "define `tune_loader(measure, baseline, candidates, budget_mib, max_loss_rise=0.02)`")
    baseline, candidates, budget, rise = _tuning_inputs(seed)
    measure = _SyntheticLoader(seed)
    out = call(tune, measure, dict(baseline), {k: list(v) for k, v in candidates.items()}, budget, rise)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], dict) and isinstance(out[1], list)):
        return {"form": one_line(out), "calls": measure.calls}
    fields = ("setting", "value", "samples_per_s", "peak_mib", "val_loss", "kept", "reason")
    rows = [{k: r.get(k) for k in fields} if isinstance(r, dict) else one_line(r) for r in out[1]]
    return {"form": "ok", "config": out[0], "log": rows, "calls": measure.calls}


def _tuning_reference(seed: int) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    baseline, candidates, budget, rise = _tuning_inputs(seed)
    measure = _SyntheticLoader(seed)
    config, log = reference_tuning(measure, baseline, candidates, budget, rise)
    return config, log, measure.calls


def _tuning_seen(ns: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], list[Any]]:
    seed = run_seed(ns)
    seen = observe(ns, _tuned, seed)
    if seen["form"] != "ok":
        raise CheckFailed("tune_loader should return (config dict, list of row dicts)", got=seen["form"])
    if not all(isinstance(r, dict) for r in seen["log"]):
        raise CheckFailed("every row of the log should be a dict", got=seen["log"][:2])
    config, log, calls = _tuning_reference(seed)
    return seen, config, log, calls


@check_for("02", "tuning order: baseline, workers, batch size, pinned, prefetch", parts=("02.10",))
def tuning_order(ns: dict[str, Any]) -> None:
    seen, _, log, calls = _tuning_seen(ns)
    want = [(r["setting"], r["value"]) for r in log]
    got = [(r["setting"], r["value"]) for r in seen["log"]]
    if got != want:
        raise CheckFailed(
            "measure the baseline first, then one setting at a time in the course's order (workers, batch size, "
            "pinned memory, prefetch), each candidate value once, whatever order the candidates dict has",
            hint="for key in ('num_workers', 'batch_size', 'pin_memory', 'prefetch_factor'): for value in "
            "candidates.get(key, []): ...",
            expected=want, got=got,
        )
    if len(seen["calls"]) != len(calls):
        raise CheckFailed("measure each configuration exactly once (every call is a real measurement)",
                          expected=f"{len(calls)} calls", got=f"{len(seen['calls'])} calls")


@check_for("02", "tuning keeps a change only when the verdict says faster", parts=("02.10",))
def tuning_verdicts(ns: dict[str, Any]) -> None:
    seen, config, log, calls = _tuning_seen(ns)
    budget_reasons = ("over memory", "worse validation")
    for want, got in zip(log, seen["log"]):
        if want["reason"] in budget_reasons or want["reason"] == "baseline":
            continue
        if (got["kept"], got["reason"]) != (want["kept"], want["reason"]):
            raise CheckFailed(
                f"{want['setting']}={want['value']!r}: keep a change only when verdict_from_times says 'faster' "
                "against the config kept so far, per sample (work = batch size); too close to call keeps the "
                "simpler setting",
                hint="verdict_from_times(Measurement('trial', m['seconds'], trial['batch_size']), "
                "Measurement('current', ref['seconds'], current['batch_size'])).outcome",
                expected={"kept": want["kept"], "reason": want["reason"]},
                got={"kept": got["kept"], "reason": got["reason"]},
            )
    measured = [dict(c) for c in seen["calls"]]
    if measured != calls:
        i = next((i for i, (a, b) in enumerate(zip(measured, calls)) if a != b), min(len(measured), len(calls)))
        raise CheckFailed("the configurations measured are not the course's: each trial changes one setting of the "
                          "config kept so far (the baseline until a change is kept)",
                          expected=f"measurement {i + 1}: {calls[i] if i < len(calls) else 'none'}",
                          got=f"measurement {i + 1}: {measured[i] if i < len(measured) else 'none'}")
    if seen["config"] != config:
        raise CheckFailed("the chosen config is not the last one kept (each trial changes one setting of it)",
                          expected=config, got=seen["config"])


@check_for("02", "tuning respects the memory budget and validation", parts=("02.10",))
def tuning_limits(ns: dict[str, Any]) -> None:
    seen, _, log, _ = _tuning_seen(ns)
    for want, got in zip(log, seen["log"]):
        if want["reason"] not in ("over memory", "worse validation"):
            continue
        measured = all(isinstance(got[k], (int, float)) and math.isclose(got[k], want[k], rel_tol=1e-6)
                       for k in ("peak_mib", "val_loss"))
        if got["kept"] is not False or got["reason"] != want["reason"] or not measured:
            raise CheckFailed(
                f"{want['setting']}={want['value']!r} is faster but {want['reason']}: a setting over the memory "
                "budget is not legal, and one whose val_loss rises more than max_loss_rise above the baseline's is "
                "not the same training",
                hint="check peak_mib > budget_mib first, then val_loss > baseline val_loss + max_loss_rise",
                expected={k: want[k] for k in ("kept", "reason", "peak_mib", "val_loss")},
                got={k: got[k] for k in ("kept", "reason", "peak_mib", "val_loss")},
            )


@check_for("02", "tuning log records samples/s, memory and val_loss", parts=("02.10",))
def tuning_log(ns: dict[str, Any]) -> None:
    seen, _, log, _ = _tuning_seen(ns)
    first = seen["log"][0] if seen["log"] else {}
    if (first.get("kept"), first.get("reason")) != (True, "baseline"):
        raise CheckFailed("the baseline's row is kept (it is the config every later trial starts from), with "
                          "reason 'baseline'", expected={"kept": True, "reason": "baseline"},
                          got={"kept": first.get("kept"), "reason": first.get("reason")})
    for want, got in zip(log, seen["log"]):
        for key in ("samples_per_s", "peak_mib", "val_loss"):
            value = got[key]
            if not isinstance(value, (int, float)) or not math.isclose(value, want[key], rel_tol=1e-6):
                raise CheckFailed(
                    f"row {want['setting']}={want['value']!r}: {key} should be recorded from its measurement",
                    hint="samples_per_s = batch_size / median of the per-batch seconds",
                    expected=want[key], got=value,
                )
