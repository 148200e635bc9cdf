"""Exercise 11 (a DDP loop on two real processes): realistic mistakes fail their check, correct variants pass.

Each row is appended to the solution's exercise cell, as a learner would edit it: the checks run the *cell* on two
processes (its source crosses the process boundary), so the row's redefinition is what every rank executes. Judged
through the grader's observe -> save -> load -> replay path (:func:`course_lib.grading.inprocess.observe_and_judge`).
Every row costs one two-process run (two fresh interpreters): keep the table short.
"""

from __future__ import annotations

from course_lib.grading.api import CheckResult
from variant_tables import judge_cell_edit


def judge(number: str, code: str, only: str = "") -> dict[str, CheckResult]:
    """The solution's set-up cell, then its exercise cell with ``code`` appended, judged as the grader does."""
    return judge_cell_edit(number, "11_ddp.ipynb", code, only)


def _train(*, sampler: str = "DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, "
                             "seed=cfg['seed'])",
           loader_shuffle: str = "", set_epoch: str = "sampler.set_epoch(epoch)",
           loss: str = "F.cross_entropy(model(x), y, reduction='sum') / samples",
           context: str = "contextlib.nullcontext() if last else model.no_sync()",
           save_if: str = "rank == 0", drop_last: str = "") -> str:
    """The solution's loop with one piece replaced (what learners get wrong is usually one line)."""
    return f"""
        def ddp_train(rank, world_size, model, dataset, cfg, out_dir):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            model = DDP(model)
            sampler = {sampler}
            loader = DataLoader(dataset, batch_size=cfg["batch"], sampler=sampler{loader_shuffle}{drop_last})
            lr = scaled_lr(cfg["base_lr"], cfg["base_batch"], cfg["batch"], world_size, cfg["accum"])
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            for epoch in range(cfg["epochs"]):
                {set_epoch}
                batches = list(loader)
                for start in range(0, len(batches), cfg["accum"]):
                    group = batches[start:start + cfg["accum"]]
                    samples = sum(len(y) for _, y in group)
                    for j, (x, y) in enumerate(group):
                        last = j == len(group) - 1
                        with {context}:
                            loss = {loss}
                            loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
            if {save_if}:
                torch.save(model.module.state_dict(), os.path.join(out_dir, "model.pt.tmp"))
                os.replace(os.path.join(out_dir, "model.pt.tmp"), os.path.join(out_dir, "model.pt"))
            dist.destroy_process_group()
            return model.module
        """


# (what the mistake is, the code appended to the cell, a word from the name of the check that must fail)
WRONG: list[tuple[str, str, str]] = [
    ("the process group is never left (no destroy_process_group)",
     _train().replace("            dist.destroy_process_group()\n", ""), "leaves the process group"),
    ("no DistributedSampler: every rank shuffles the whole dataset",
     _train(sampler="torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(0))"),
     "disjoint"),
    ("set_epoch forgotten", _train(set_epoch="pass"), "set_epoch"),
    ("every rank saves the checkpoint", _train(save_if="True"), "rank 0"),
    ("saves the DDP wrapper's state_dict() (every name prefixed with 'module.')",
     _train().replace("model.module.state_dict()", "model.state_dict()"), "rank 0"),
    ("loss not divided by the accumulation steps", _train(loss="F.cross_entropy(model(x), y)"), "one process"),
    ("loss / accum on every group: the short last group weighed like a full one",
     _train(loss="F.cross_entropy(model(x), y) / cfg['accum']"), "one process"),
    ("each micro-batch's mean / the group's micro-batches: a short micro-batch weighed like a full one",
     _train(loss="F.cross_entropy(model(x), y) / len(group)"), "one process"),
    ("drop_last=True: the short last micro-batch of the shard never read",
     _train(drop_last=", drop_last=True"), "disjoint"),
    ("steps only on full groups: the short last group of an epoch is never stepped on", """
        def ddp_train(rank, world_size, model, dataset, cfg, out_dir):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            model = DDP(model)
            sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg["seed"])
            loader = DataLoader(dataset, batch_size=cfg["batch"], sampler=sampler)
            lr = scaled_lr(cfg["base_lr"], cfg["base_batch"], cfg["batch"], world_size, cfg["accum"])
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            for epoch in range(cfg["epochs"]):
                sampler.set_epoch(epoch)
                for i, (x, y) in enumerate(loader):
                    last = (i + 1) % cfg["accum"] == 0
                    with contextlib.nullcontext() if last else model.no_sync():
                        (F.cross_entropy(model(x), y) / cfg["accum"]).backward()
                    if last:
                        optimizer.step()
                        optimizer.zero_grad()
            if rank == 0:
                torch.save(model.module.state_dict(), os.path.join(out_dir, "model.pt.tmp"))
                os.replace(os.path.join(out_dir, "model.pt.tmp"), os.path.join(out_dir, "model.pt"))
            dist.destroy_process_group()
            return model.module
        """, "one process"),
    ("no_sync forgotten: every micro-batch all-reduces", _train(context="contextlib.nullcontext()"), "no_sync"),
    ("forward outside no_sync, only backward inside", """
        def ddp_train(rank, world_size, model, dataset, cfg, out_dir):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            model = DDP(model)
            sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg["seed"])
            loader = DataLoader(dataset, batch_size=cfg["batch"], sampler=sampler)
            lr = scaled_lr(cfg["base_lr"], cfg["base_batch"], cfg["batch"], world_size, cfg["accum"])
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            for epoch in range(cfg["epochs"]):
                sampler.set_epoch(epoch)
                batches = list(loader)
                for start in range(0, len(batches), cfg["accum"]):
                    group = batches[start:start + cfg["accum"]]
                    samples = sum(len(y) for _, y in group)
                    for j, (x, y) in enumerate(group):
                        loss = F.cross_entropy(model(x), y, reduction="sum") / samples
                        if j < len(group) - 1:
                            with model.no_sync():
                                loss.backward()
                        else:
                            loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
            if rank == 0:
                torch.save(model.module.state_dict(), os.path.join(out_dir, "tmp.pt"))
                os.replace(os.path.join(out_dir, "tmp.pt"), os.path.join(out_dir, "model.pt"))
            dist.destroy_process_group()
            return model.module
        """, "no_sync"),
    ("no_sync around every micro-batch, the last one too", _train(context="model.no_sync()"), "identical"),
    ("LR scaled by the per-device batch only", """
        def scaled_lr(base_lr, base_batch, per_device_batch, world_size, accum=1):
            return base_lr * per_device_batch / base_batch
        """, "linear LR"),
]

# (what differs, the code appended to the cell)
RIGHT: list[tuple[str, str]] = [
    ("env:// rendezvous without arguments, groups taken with itertools.islice from the loader (never a list), "
     "head under one no_sync block, zero_grad at the start of a group, NamedTemporaryFile + os.replace", """
        import itertools
        import tempfile

        def ddp_train(rank, world_size, model, dataset, cfg, out_dir):
            dist.init_process_group(backend="gloo")  # RANK, WORLD_SIZE, MASTER_*: the launcher's environment
            ddp = DDP(model)
            sampler = DistributedSampler(dataset, shuffle=True, seed=cfg["seed"])
            loader = DataLoader(dataset, batch_size=cfg["batch"], sampler=sampler)
            global_batch = effective_batch(cfg["batch"], dist.get_world_size(), cfg["accum"])
            optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg["base_lr"] * global_batch / cfg["base_batch"])
            for epoch in range(cfg["epochs"]):
                sampler.set_epoch(epoch)
                micro_batches = iter(loader)
                while group := list(itertools.islice(micro_batches, cfg["accum"])):
                    optimizer.zero_grad(set_to_none=True)
                    samples = sum(y.numel() for _, y in group)
                    *head, (x, y) = group
                    with ddp.no_sync():  # forward too: DDP decides in forward whether backward syncs
                        for hx, hy in head:
                            (F.cross_entropy(ddp(hx), hy, reduction="sum") / samples).backward()
                    (F.cross_entropy(ddp(x), y, reduction="sum") / samples).backward()
                    optimizer.step()
            if dist.get_rank() == 0:
                with tempfile.NamedTemporaryFile(dir=out_dir, delete=False) as f:
                    torch.save(model.state_dict(), f.name)
                os.replace(f.name, os.path.join(out_dir, "model.pt"))
            dist.destroy_process_group()
            return model
        """),
    ("each micro-batch's mean weighed by its share of the group's samples",
     _train(loss="F.cross_entropy(model(x), y) * len(y) / samples")),
]
