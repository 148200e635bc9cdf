"""Exercise 17 (the capstone challenge): realistic wrong answers fail a named check, correct alternatives pass.

Judged through the grader's own observe -> save -> load -> replay path, like tests/test_grading_variants.py.
The correctness checks run on every row. The speed check measures real time, so it runs only where the verdict
cannot flip under load: on rows that must *fail* it (as slow as the original, or a measurement they tamper with).
A correct alternative is judged on the correctness checks only; that the solution passes the speed check is proven
by tests/test_exercise_validity.py, and the speed judgement itself by tests/test_perf_challenge.py on synthetic
timings.
"""

from __future__ import annotations

SPEED = "faster than the original"
LOSSES = "one loss per step"
WEIGHTS = "weights after the epoch"
ONE_LABELLED = "one labelled sample"
RIGHT_ONLY = (LOSSES, WEIGHTS, ONE_LABELLED)  # the speed check measures real time: judged on rows that must fail it

# The solution's loop with the normalisation (how the summed loss of a group is divided) left open.
_FAST_LOOP = """
def _fast(model, images, labels, cfg, divide, keep_last=True):
    as_float = images.float()
    mean, std = as_float.mean(dim=(0, 2, 3)), as_float.std(dim=(0, 2, 3))
    inputs = (as_float - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    group = cfg.micro_batch * cfg.accum
    stop = len(labels) if keep_last else len(labels) - len(labels) % group
    losses = []
    for start in range(0, stop, group):
        x, y = inputs[start : start + group], labels[start : start + group]
        loss = divide(model, x, y, cfg)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return torch.stack(losses).tolist()
"""

# (what the mistake is, the code, a word from the name of the check that must fail)
WRONG: list[tuple[str, str, str]] = [
    ("the original, unchanged", "train_fast = train_original", WEIGHTS),
    ("fast, but the outdated mean / accum per micro-batch", _FAST_LOOP + """
def _mean_over_accum(model, x, y, cfg):
    return sum(F.cross_entropy(model(xm), ym) / cfg.accum
               for xm, ym in zip(x.split(cfg.micro_batch), y.split(cfg.micro_batch)))
def train_fast(model, images, labels, cfg):
    return _fast(model, images, labels, cfg, _mean_over_accum)
""", WEIGHTS),
    ("fast, but unlabelled samples counted in the mean", _FAST_LOOP + """
def train_fast(model, images, labels, cfg):
    return _fast(model, images, labels, cfg,
                 lambda model, x, y, cfg: F.cross_entropy(model(x), y, reduction="sum") / len(y))
""", WEIGHTS),
    ("fast, but the labelled count guarded at 2 (a group of one labelled sample halved)", _FAST_LOOP + """
def train_fast(model, images, labels, cfg):
    return _fast(model, images, labels, cfg, lambda model, x, y, cfg:
                 F.cross_entropy(model(x), y, reduction="sum") / (y != -100).sum().clamp(min=2))
""", ONE_LABELLED),
    ("fast, but the short last group skipped", _FAST_LOOP + """
def train_fast(model, images, labels, cfg):
    return _fast(model, images, labels, cfg, lambda model, x, y, cfg: F.cross_entropy(model(x), y),
                 keep_last=False)
""", LOSSES),
    ("fast, but each batch normalised with its own statistics", """
def train_fast(model, images, labels, cfg):
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    group, losses = cfg.micro_batch * cfg.accum, []
    for start in range(0, len(labels), group):
        x = images[start : start + group].float()
        x = (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), keepdim=True)
        loss = F.cross_entropy(model(x), labels[start : start + group])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
""", WEIGHTS),
    ("fast, but the losses taken after each step", _FAST_LOOP + """
def train_fast(model, images, labels, cfg):
    _fast(model, images, labels, cfg, lambda model, x, y, cfg: F.cross_entropy(model(x), y))
    x = images.float()
    x = (x - x.mean(dim=(0, 2, 3), keepdim=True)) / x.std(dim=(0, 2, 3), keepdim=True)
    with torch.no_grad():
        return [float(F.cross_entropy(model(x[s : s + 64]), labels[s : s + 64])) for s in range(0, len(labels), 64)]
""", LOSSES),
    ("correct, but as slow as the original (only the normalisation fixed)", """
def train_fast(model, images, labels, cfg):
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    collate = PerSampleCollate(images, labels)
    group, losses = cfg.micro_batch * cfg.accum, []
    for start in range(0, len(labels), group):
        batches = [collate(range(s, min(s + cfg.micro_batch, start + group, len(labels))))
                   for s in range(start, min(start + group, len(labels)), cfg.micro_batch)]
        labelled = sum(int((y != -100).sum()) for _, y in batches)
        total = 0.0
        for x, y in batches:
            loss = F.cross_entropy(model(x), y, reduction="sum") / labelled
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses
""", SPEED),
    ("replays its first answer instead of training (fast only when timed again)", """
_answers = []
_solution = train_fast
def train_fast(model, images, labels, cfg):
    if not _answers:
        _answers.append(_solution(model, images, labels, cfg))
    return _answers[0]
""", SPEED),
    ("replaces the measurement's clock", """
import time
import course_lib.clock as _clock
_solution = train_fast
def train_fast(model, images, labels, cfg):
    _real = time.perf_counter
    _clock.wall = lambda: _real() * 0.5
    return _solution(model, images, labels, cfg)
""", SPEED),
]

# (what differs from the solution, the code)
RIGHT: list[tuple[str, str]] = [
    ("micro-batches kept, each summed loss divided by the group's labelled count", """
def train_fast(model, images, labels, cfg):
    mean = images.float().mean(dim=(0, 2, 3))[:, None, None]
    std = images.float().std(dim=(0, 2, 3))[:, None, None]
    inputs = (images.float() - mean) / std
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    group, losses = cfg.micro_batch * cfg.accum, []
    for start in range(0, len(labels), group):
        y_group = labels[start : start + group]
        labelled = (y_group != -100).sum()
        total = torch.zeros(())
        for s in range(start, min(start + group, len(labels)), cfg.micro_batch):
            x, y = inputs[s : s + cfg.micro_batch], labels[s : s + cfg.micro_batch]
            loss = F.cross_entropy(model(x), y, reduction="sum") / labelled
            loss.backward()
            total += loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    return [float(v) for v in losses]
"""),
    ("a DataLoader over a normalised TensorDataset, one batch per group, mean over labelled targets", """
from torch.utils.data import DataLoader, TensorDataset
def train_fast(model, images, labels, cfg):
    x_all = images.float()
    x_all = (x_all - x_all.mean(dim=(0, 2, 3), keepdim=True)) / x_all.std(dim=(0, 2, 3), keepdim=True)
    loader = DataLoader(TensorDataset(x_all, labels), batch_size=cfg.micro_batch * cfg.accum, shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return [float(v) for v in torch.stack(losses)]
"""),
]
