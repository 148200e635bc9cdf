"""Exercise 21 (bucketed all-reduce, ZeRO-1, a tensor-parallel MLP on two real processes): realistic mistakes fail
their check, correct variants pass.

Each row is appended to the solution's exercise cell, as a learner would edit it: the checks run the *cell* on two
processes under the course's driver (its source crosses the process boundary), so the row's redefinition is what
every rank executes. Judged through the grader's observe -> save -> load -> replay path
(:func:`course_lib.grading.inprocess.observe_and_judge`). Every row costs one two-process run: keep the table short.
"""

from __future__ import annotations

import textwrap

from course_lib.grading.api import CheckResult
from variant_tables import judge_cell_edit


def judge(number: str, code: str, only: str = "") -> dict[str, CheckResult]:
    """The solution's set-up cell, then its exercise cell with ``code`` appended, judged as the grader does."""
    return judge_cell_edit(number, "21_parallel.ipynb", code, only)


def _buckets(*, hook: str = "param.register_post_accumulate_grad_hook(ready)",
             average: str = "bucket['flat'] / self.world", flush: str = "launch(bucket)",
             wait: str = "bucket['work'].wait()", cap: str = "bucket_cap_bytes", launch_first: str = "",
             in_order: bool = True, reset: str = "bucket.update(ready=0, flat=None, work=None)") -> str:
    """The solution's BucketedAllReduce with one piece replaced (what learners get wrong is usually one line)."""
    full = "bucket['ready'] == len(bucket['params'])"
    rule = ((  # a full bucket leaves only after the ones before it, as the solution does
        "for bucket in self.buckets:", "    if bucket['work'] is not None: continue", f"    if not {full}: break",
        "    launch(bucket)") if in_order else (f"if {full}: launch(bucket)", "", "", ""))
    return f"""
        class BucketedAllReduce:
            def __init__(self, model, bucket_cap_bytes):
                self.world, self.previous = dist.get_world_size(), []
                self.buckets, total = [], 0
                for param in reversed([p for p in model.parameters() if p.requires_grad]):
                    nbytes = param.numel() * param.element_size()
                    if not self.buckets or (self.buckets[-1]["params"] and total + nbytes > {cap}):
                        self.buckets.append({{"params": [], "ready": 0, "flat": None, "work": None}})
                        total = 0
                    self.buckets[-1]["params"].append(param)
                    total += nbytes
                bucket_of = {{id(p): b for b in self.buckets for p in b["params"]}}

                def launch(bucket):
                    {launch_first}
                    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket["params"]]
                    bucket["flat"] = torch.cat([g.reshape(-1) for g in grads])
                    bucket["work"] = dist.all_reduce(bucket["flat"], async_op=True)

                def ready(param):
                    bucket = bucket_of[id(param)]
                    bucket["ready"] += 1
                    {rule[0]}
                    {rule[1]}
                    {rule[2]}
                    {rule[3]}

                self.launch = launch
                for bucket in self.buckets:
                    for param in bucket["params"]:
                        {hook}

            def finish(self):
                launch = self.launch
                for bucket in self.buckets:
                    if bucket["work"] is None:
                        {flush}
                for bucket in self.buckets:
                    if bucket["work"] is None:
                        continue
                    {wait}
                    averaged = {average}
                    offset = 0
                    for param in bucket["params"]:
                        piece = averaged[offset:offset + param.numel()].view_as(param)
                        if param.grad is None:
                            param.grad = piece.clone()
                        else:
                            param.grad.copy_(piece)
                        offset += param.numel()
                    {reset}
        """


def _tp(body: str) -> str:
    return "def tp_mlp(x, block, rank, world):\n" + textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"


# (what the mistake is, the code appended to the cell, a word from the name of the check that must fail)
WRONG: list[tuple[str, str, str]] = [
    ("gradients summed over the ranks but not averaged", _buckets(average="bucket['flat']"), "one process"),
    ("register_hook instead of the post-accumulate hook: .grad is read before autograd writes it",
     _buckets(hook="param.register_hook(lambda grad, p=param: ready(p))"), "one process"),
    ("the handles are never waited for", _buckets(wait="pass"), "one process"),
    ("the handles are waited for at the next step, after optimizer.step()",
     _buckets(wait="self.previous.append(bucket['work'])",
              launch_first="[work.wait() for work in self.previous]; self.previous.clear()"), "one process"),
    ("a bucket that never filled is never sent", _buckets(flush="pass"), "one process"),
    ("everything all-reduced after backward (no hooks)", _buckets(hook="pass"), "overlap"),
    ("one message per parameter (no buckets)", _buckets(cap="0"), "bucket"),
    # total + nbytes > cap - 1 is '>=' (and a running total that starts at 1); > cap + 1 is a total that starts at -1
    ("a bucket closed when it reaches the cap ('>=' for '>'): an exactly full bucket loses its last parameter",
     _buckets(cap="bucket_cap_bytes - 1"), "bucket"),
    ("a running total one byte short (starts at -1): a bucket one byte over the cap keeps its last parameter",
     _buckets(cap="bucket_cap_bytes + 1"), "bucket"),
    ("each bucket sent the moment it fills, not in bucket order", _buckets(in_order=False), "order"),
    ("initial weights not broadcast", """
        def broadcast_parameters(model):
            pass
        """, "broadcast"),
    ("shards of N // world elements: the last one skipped", """
        class ShardedAdamW:
            def __init__(self, params, lr, weight_decay):
                self.params = list(params)
                self.world, self.rank = dist.get_world_size(), dist.get_rank()
                self.size = sum(p.numel() for p in self.params) // self.world
                with torch.no_grad():
                    flat = torch.cat([p.reshape(-1) for p in self.params])
                    self.shard = torch.nn.Parameter(flat[self.rank * self.size:(self.rank + 1) * self.size].clone())
                self.optimizer = torch.optim.AdamW([self.shard], lr=lr, weight_decay=weight_decay)

            @torch.no_grad()
            def step(self):
                grad = torch.cat([p.grad.reshape(-1) for p in self.params])
                self.shard.grad = grad[self.rank * self.size:(self.rank + 1) * self.size]
                self.optimizer.step()
                gathered = torch.empty(self.size * self.world)
                dist.all_gather_into_tensor(gathered, self.shard.detach())
                flat = torch.cat([p.reshape(-1) for p in self.params])
                flat[:gathered.numel()] = gathered
                offset = 0
                for p in self.params:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
        """, "unsharded"),
    ("every rank keeps AdamW over all the parameters (nothing sharded)", """
        class ShardedAdamW:
            def __init__(self, params, lr, weight_decay):
                self.optimizer = torch.optim.AdamW(list(params), lr=lr, weight_decay=weight_decay)

            def step(self):
                self.optimizer.step()
        """, "state"),
    ("the row-parallel partial outputs are not summed", _tp("""
        fc, act, proj = block
        mine = slice(rank * fc.out_features // world, (rank + 1) * fc.out_features // world)
        hidden = act(F.linear(SumInBackward.apply(x), fc.weight[mine], fc.bias[mine]))
        return F.linear(hidden, proj.weight[:, mine], proj.bias)
        """), "unsplit"),
    ("the second Linear's bias added on every rank, before the sum", _tp("""
        fc, act, proj = block
        mine = slice(rank * fc.out_features // world, (rank + 1) * fc.out_features // world)
        hidden = act(F.linear(SumInBackward.apply(x), fc.weight[mine], fc.bias[mine]))
        return SumInForward.apply(F.linear(hidden, proj.weight[:, mine], proj.bias))
        """), "unsplit"),
    ("SumInForward all-reduces in backward too", """
        class SumInForward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, partial):
                out = partial.clone()
                dist.all_reduce(out)
                return out

            @staticmethod
            def backward(ctx, grad):
                grad = grad.clone()
                dist.all_reduce(grad)
                return grad
        """, "activation"),
]

# (what differs, the code appended to the cell)
RIGHT: list[tuple[str, str]] = [
    ("broadcast through all_gather; a dict of buckets and sets of pending names; one broadcast per ZeRO shard "
     "(no padding); tp_mlp with torch.chunk and F.gelu", """
        def broadcast_parameters(model):
            world = dist.get_world_size()
            with torch.no_grad():
                for p in model.parameters():
                    copies = [torch.empty_like(p) for _ in range(world)]
                    dist.all_gather(copies, p.detach().clone())
                    p.copy_(copies[0])

        class BucketedAllReduce:
            def __init__(self, model, bucket_cap_bytes):
                self.world = dist.get_world_size()
                named = list(model.named_parameters())[::-1]
                self.params = dict(named)
                self.members, key, used = {}, 0, 0
                for name, p in named:
                    size = p.numel() * p.element_size()
                    if self.members.get(key) and used + size > bucket_cap_bytes:
                        key, used = key + 1, 0
                    self.members.setdefault(key, []).append(name)
                    used += size
                self.where = {name: k for k, names in self.members.items() for name in names}
                self.pending = {k: set(names) for k, names in self.members.items()}
                self.sent = {}
                for name, p in named:
                    p.register_post_accumulate_grad_hook(lambda p, name=name: self._arrived(name))

            def _send(self, k):
                flat = torch.cat([(self.params[n].grad if self.params[n].grad is not None
                                   else torch.zeros_like(self.params[n])).flatten() for n in self.members[k]])
                self.sent[k] = (flat, dist.all_reduce(flat, dist.ReduceOp.SUM, None, True))

            def _arrived(self, name):
                self.pending[self.where[name]].discard(name)
                for k in sorted(self.members):  # in key order: the first bucket not sent must be full first
                    if k in self.sent:
                        continue
                    if self.pending[k]:
                        break
                    self._send(k)

            def finish(self):
                for k in self.members:
                    if k not in self.sent:
                        self._send(k)
                for k, (flat, work) in sorted(self.sent.items()):
                    work.wait()
                    flat.div_(self.world)
                    pieces = flat.split([self.params[n].numel() for n in self.members[k]])
                    for n, piece in zip(self.members[k], pieces):
                        self.params[n].grad = piece.view_as(self.params[n]).clone()
                self.sent.clear()
                self.pending = {k: set(names) for k, names in self.members.items()}

        class ShardedAdamW:
            def __init__(self, params, lr, weight_decay):
                self.params = list(params)
                world, rank = dist.get_world_size(), dist.get_rank()
                n = sum(p.numel() for p in self.params)
                size = -(-n // world)
                self.bounds = [(min(r * size, n), min((r + 1) * size, n)) for r in range(world)]
                start, end = self.bounds[rank]
                flat = torch.cat([p.detach().flatten() for p in self.params])
                self.shard = flat[start:end].clone().requires_grad_()
                self.optimizer = torch.optim.AdamW([self.shard], lr=lr, weight_decay=weight_decay)
                self.rank = rank

            def step(self):
                start, end = self.bounds[self.rank]
                self.shard.grad = torch.cat([p.grad.flatten() for p in self.params])[start:end].clone()
                self.optimizer.step()
                with torch.no_grad():
                    flat = torch.cat([p.flatten() for p in self.params])
                    for owner, (a, b) in enumerate(self.bounds):
                        piece = self.shard.detach().clone() if owner == self.rank else torch.empty(b - a)
                        dist.broadcast(piece, src=owner)
                        flat[a:b] = piece
                    torch.nn.utils.vector_to_parameters(flat, self.params)

        def tp_mlp(x, block, rank, world):
            w1 = torch.chunk(block[0].weight, world, dim=0)[rank]
            b1 = torch.chunk(block[0].bias, world)[rank]
            w2 = torch.chunk(block[2].weight, world, dim=1)[rank]
            hidden = F.gelu(SumInBackward.apply(x) @ w1.T + b1)
            return SumInForward.apply(hidden @ w2.T) + block[2].bias
        """),
    ("broadcast through scatter; all_gather of padded shards into a list; gradients reduced in place "
     "(bucket views) with blocking all-reduces inside the hooks", """
        def broadcast_parameters(model):
            rank, world = dist.get_rank(), dist.get_world_size()
            with torch.no_grad():
                for p in model.parameters():
                    buffer = torch.empty_like(p)
                    dist.scatter(buffer, [p.detach().clone() for _ in range(world)] if rank == 0 else None, src=0)
                    p.copy_(buffer)

        class BucketedAllReduce:
            def __init__(self, model, bucket_cap_bytes):
                self.world = dist.get_world_size()
                self.groups, used = [[]], 0
                for p in list(model.parameters())[::-1]:
                    nbytes = p.numel() * p.element_size()
                    if self.groups[-1] and used + nbytes > bucket_cap_bytes:
                        self.groups.append([])
                        used = 0
                    self.groups[-1].append(p)
                    used += nbytes
                self.done = [False] * len(self.groups)
                self.seen = set()
                for p in model.parameters():
                    p.register_post_accumulate_grad_hook(self.hook)

            def reduce(self, i):
                group = self.groups[i]
                flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in group])
                dist.all_reduce(flat)  # blocking, still during backward
                flat /= self.world
                for p, piece in zip(group, flat.split([p.numel() for p in group])):
                    p.grad = piece.view_as(p)
                self.done[i] = True

            def hook(self, p):
                self.seen.add(id(p))
                for i, group in enumerate(self.groups):
                    if self.done[i]:
                        continue
                    if not all(id(q) in self.seen for q in group):
                        break  # the buckets after it wait: every rank sends them in the same order
                    self.reduce(i)

            def finish(self):
                for i in range(len(self.groups)):
                    if not self.done[i]:
                        self.reduce(i)
                self.done = [False] * len(self.groups)
                self.seen = set()

        class ShardedAdamW:
            def __init__(self, params, lr, weight_decay):
                self.params = list(params)
                self.world, self.rank = dist.get_world_size(), dist.get_rank()
                self.n = sum(p.numel() for p in self.params)
                self.size = math.ceil(self.n / self.world)
                self.start = min(self.rank * self.size, self.n)
                self.end = min(self.start + self.size, self.n)
                self.shard = torch.nn.Parameter(torch.nn.utils.parameters_to_vector(self.params)
                                                .detach()[self.start:self.end].clone())
                self.optimizer = torch.optim.AdamW([self.shard], lr=lr, weight_decay=weight_decay)

            @torch.no_grad()
            def step(self):
                grad = torch.nn.utils.parameters_to_vector([p.grad for p in self.params])
                self.shard.grad = grad[self.start:self.end].clone()
                self.optimizer.step()
                padded = torch.cat([self.shard.detach(), torch.zeros(self.size - (self.end - self.start))])
                pieces = [torch.empty(self.size) for _ in range(self.world)]
                dist.all_gather(pieces, padded)
                torch.nn.utils.vector_to_parameters(torch.cat(pieces)[:self.n], self.params)
        """),
]

# (what the mistake is, the code, a word from the name of the check that must fail, words its hint must contain):
# the hint names the mistake that was made (here: state kept from one step to the next), not averaging.
HINTS: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("finish() never resets the buckets: the next steps reuse the first step's handles and averages",
     _buckets(reset="pass"), "one process", ("reset", "__init__")),
]
