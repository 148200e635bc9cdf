"""Exercise 22 (ZeRO-1 with a reduce-scatter on two real processes, ring bytes, ZeRO's memory, the communication-bound
crossover): realistic mistakes fail their check, correct variants pass.

Each row is appended to the solution's exercise cell, as a learner would edit it: the ZeRO checks run the *cell* on
two processes under the course's driver, so the row's redefinition is what every rank executes. Judged through the
grader's observe -> save -> load -> replay path. A row that changes the cell costs one two-process run.
"""

from __future__ import annotations

from course_lib.grading.api import CheckResult
from variant_tables import judge_cell_edit


def judge(number: str, code: str, only: str = "") -> dict[str, CheckResult]:
    """The solution's set-up cell, then its exercise cell with ``code`` appended, judged as the grader does."""
    return judge_cell_edit(number, "22_beyond_dp.ipynb", code, only)


def _zero(reduce: str, *, divide: str = " / self.world") -> str:
    """The solution's ReduceScatterAdamW with the gradient reduction replaced (``reduce``: lines that set ``mine``,
    this rank's shard of the summed gradient) and the division after it."""
    body = "\n".join("        " + line for line in reduce.strip("\n").splitlines())
    return f"""
class ReduceScatterAdamW:
    def __init__(self, params, lr, weight_decay):
        self.params = list(params)
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.size = math.ceil(self.numel / self.world)
        self.start = min(self.rank * self.size, self.numel)
        self.end = min(self.start + self.size, self.numel)
        with torch.no_grad():
            flat = torch.cat([p.reshape(-1) for p in self.params])
            self.shard = torch.nn.Parameter(flat[self.start:self.end].clone())
        self.optimizer = torch.optim.AdamW([self.shard], lr=lr, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.zeros(self.size * self.world)
        flat[: self.numel] = torch.cat([g.reshape(-1) for g in grads])
{body}
        self.shard.grad = mine[: self.end - self.start]{divide}
        self.optimizer.step()
        send = torch.zeros(self.size)
        send[: self.end - self.start] = self.shard
        gathered = torch.empty(self.size * self.world)
        dist.all_gather_into_tensor(gathered, send)
        offset = 0
        for p in self.params:
            p.copy_(gathered[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
"""


# The solution's reduction: each rank receives the sum of its own shard.
REDUCE_SCATTER = """
mine = torch.empty(self.size)
dist.reduce_scatter_tensor(mine, flat, op=dist.ReduceOp.SUM)
"""

# Exercise 21's ZeRO-1: the whole gradient all-reduced, then this rank's slice taken.
ALL_REDUCE = """
dist.all_reduce(flat, op=dist.ReduceOp.SUM)
mine = flat[self.rank * self.size:(self.rank + 1) * self.size]
"""
# No sharding at all: every rank steps one AdamW over every parameter with the all-reduced gradient.
UNSHARDED = """
class ReduceScatterAdamW:
    def __init__(self, params, lr, weight_decay):
        self.params = list(params)
        self.world = dist.get_world_size()
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= self.world
        self.optimizer.step()
"""

def _pipeline(loss: str = "F.cross_entropy(stage(activation), y_mb) / micro_batches",
              backward_order: str = "zip(received, losses)") -> str:
    """The solution's pipeline_step with rank 1's loss term or the order of its backwards replaced."""
    return f"""
def pipeline_step(stage, rank, x, y, micro_batches, hidden):
    if rank == 0:
        outputs = []
        for x_mb in x.chunk(micro_batches):
            out = stage(x_mb)
            dist.send(out.detach(), dst=1)
            outputs.append(out)
        for out in outputs:
            grad = torch.empty_like(out)
            dist.recv(grad, src=1)
            out.backward(grad)
        return None
    received, losses = [], []
    for y_mb in y.chunk(micro_batches):
        activation = torch.empty(len(y_mb), hidden)
        dist.recv(activation, src=0)
        activation.requires_grad_()
        losses.append({loss})
        received.append(activation)
    for activation, loss in {backward_order}:
        loss.backward()
        dist.send(activation.grad, dst=0)
    return sum(loss.detach() for loss in losses)
"""


def _attention(qkv_rows: str = "[slice(part * C + rank * width, part * C + (rank + 1) * width) for part in range(3)]",
               x_line: str = "x = SumInBackward.apply(x)",
               tail: str = "SumInForward.apply(partial) + attn.proj.bias") -> str:
    """The solution's tp_attention with the rows of qkv, the input's handling or the last line replaced."""
    return f"""
def tp_attention(x, attn, rank, world):
    B, T, C = x.shape
    width, heads = C // world, attn.n_head // world
    mine = {qkv_rows}
    {x_line}
    q, k, v = (F.linear(x, attn.qkv.weight[rows], attn.qkv.bias[rows]) for rows in mine)
    q, k, v = (t.view(B, T, heads, width // heads).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, width)
    partial = F.linear(y, attn.proj.weight[:, rank * width:(rank + 1) * width])
    return {tail}
"""


# (what the mistake is, the code appended to the cell, a word from the name of the check that must fail)
WRONG: list[tuple[str, str, str]] = [
    ("exercise 21's ZeRO-1: gradients all-reduced, then the shards all-gathered (1.5x the bytes)",
     _zero(ALL_REDUCE), "traffic"),
    ("no reduction: each rank steps its shard with its own gradient",
     _zero("mine = flat[self.rank * self.size:(self.rank + 1) * self.size]", divide=""), "averaged"),
    ("the reduce-scatter's sum stepped without dividing by the world size (AdamW's update hides the 2x: only its "
     "moments show it)", _zero(REDUCE_SCATTER, divide=""), "averaged"),
    ("the reduce-scatter's sum multiplied by the world size instead of divided",
     _zero(REDUCE_SCATTER, divide=" * self.world"), "averaged"),
    ("no sharding: every rank steps AdamW over everything after an all-reduce", UNSHARDED, "moments"),
    ("an all-gather priced like a reduce-scatter ((world-1)/world of its input)", """
def ring_bytes(records, world):
    share = {"all_reduce": 2 * (world - 1) / world, "reduce_scatter_tensor": (world - 1) / world,
             "all_gather_into_tensor": (world - 1) / world}
    return sum(share[op] * nbytes for op, nbytes in records)
""", "ring bytes"),
    ("an all-reduce priced at 2x its bytes, whatever the world size", """
def ring_bytes(records, world):
    share = {"all_reduce": 2, "reduce_scatter_tensor": (world - 1) / world, "all_gather_into_tensor": world - 1}
    return sum(share[op] * nbytes for op, nbytes in records)
""", "ring bytes"),
    ("mixed precision's state counted as 8 bytes (the fp32 master weights forgotten)", """
def zero_bytes(numel, world, stage, mixed_precision):
    weights, grads, state = (2, 2, 8) if mixed_precision else (4, 4, 8)
    shard = -(-numel // world)
    return (weights * (shard if stage >= 3 else numel) + grads * (shard if stage >= 2 else numel)
            + state * (shard if stage >= 1 else numel))
""", "stages 0 and 1"),
    ("shards of numel / world, a fraction of a parameter", """
def zero_bytes(numel, world, stage, mixed_precision):
    weights, grads, state = (2, 2, 12) if mixed_precision else (4, 4, 8)
    shard = numel / world
    return (weights * (shard if stage >= 3 else numel) + grads * (shard if stage >= 2 else numel)
            + state * (shard if stage >= 1 else numel))
""", "stages 0 and 1"),
    ("stage 2 answered as stage 1 (the gradients kept whole)", """
def zero_bytes(numel, world, stage, mixed_precision):
    weights, grads, state = (2, 2, 12) if mixed_precision else (4, 4, 8)
    shard = -(-numel // world)
    return (weights * (shard if stage >= 3 else numel) + grads * (shard if stage >= 3 else numel)
            + state * (shard if stage >= 1 else numel))
""", "stage 2"),
    ("stage 3 leaves the weights whole", """
def zero_bytes(numel, world, stage, mixed_precision):
    weights, grads, state = (2, 2, 12) if mixed_precision else (4, 4, 8)
    shard = -(-numel // world)
    return weights * numel + grads * (shard if stage >= 2 else numel) + state * (shard if stage >= 1 else numel)
""", "stage 3"),
    ("beta taken for a bandwidth (bytes divided by it)", """
def allreduce_seconds(nbytes, world, alpha, beta):
    return 2 * (world - 1) * alpha + 2 * (world - 1) / world * nbytes / beta
""", "ring all-reduce time"),
    ("the latency paid once, not once per ring step", """
def allreduce_seconds(nbytes, world, alpha, beta):
    return alpha + 2 * (world - 1) / world * nbytes * beta
""", "ring all-reduce time"),
    ("the last world size that is still compute-bound", """
def comm_bound_ranks(compute_s, grad_bytes, alpha, beta, max_world):
    for world in range(2, max_world + 1):
        if allreduce_seconds(grad_bytes, world, alpha, beta) >= compute_s:
            return max(2, world - 1)
    return None
""", "crossover in ranks"),
    ("max_world returned when no world size is communication-bound", """
def comm_bound_ranks(compute_s, grad_bytes, alpha, beta, max_world):
    for world in range(2, max_world + 1):
        if allreduce_seconds(grad_bytes, world, alpha, beta) >= compute_s:
            return world
    return max_world
""", "crossover in ranks"),
    ("the first world whose all-reduce takes strictly longer than the compute (the task says 'at least')", """
def comm_bound_ranks(compute_s, grad_bytes, alpha, beta, max_world):
    for world in range(2, max_world + 1):
        if allreduce_seconds(grad_bytes, world, alpha, beta) > compute_s:
            return world
    return None
""", "crossover in ranks"),
    ("world sizes tried up to max_world - 1 (range's end left exclusive)", """
def comm_bound_ranks(compute_s, grad_bytes, alpha, beta, max_world):
    for world in range(2, max_world):
        if allreduce_seconds(grad_bytes, world, alpha, beta) >= compute_s:
            return world
    return None
""", "crossover in ranks"),
    ("world sizes tried up to max_world + 1", """
def comm_bound_ranks(compute_s, grad_bytes, alpha, beta, max_world):
    for world in range(2, max_world + 2):
        if allreduce_seconds(grad_bytes, world, alpha, beta) >= compute_s:
            return world
    return None
""", "crossover in ranks"),
    ("a latency term exactly equal to the compute time divided by a zero remainder", """
def bandwidth_needed(compute_s, grad_bytes, world, alpha):
    left = compute_s - 2 * (world - 1) * alpha
    if left < 0:
        return math.inf
    return 2 * (world - 1) / world * grad_bytes / left
""", "crossover in bandwidth"),
    ("the latency left out of the bandwidth needed", """
def bandwidth_needed(compute_s, grad_bytes, world, alpha):
    return 2 * (world - 1) / world * grad_bytes / compute_s
""", "crossover in bandwidth"),
    ("a negative bandwidth when latency alone takes the compute time", """
def bandwidth_needed(compute_s, grad_bytes, world, alpha):
    return 2 * (world - 1) / world * grad_bytes / (compute_s - 2 * (world - 1) * alpha)
""", "crossover in bandwidth"),
    ("the bubble as (p - 1) / m", """
def bubble_fraction(stages, micro_batches):
    return (stages - 1) / micro_batches
""", "bubble"),
    ("the bubble as (p - 1) / p, whatever the micro-batches", """
def bubble_fraction(stages, micro_batches):
    return (stages - 1) / stages
""", "bubble"),
    ("GPipe's order given for 1F1B: every forward, then every backward", """
def one_f_one_b(stages, micro_batches, stage):
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
""", "1F1B memory"),
    ("p - stage warm-up forwards, one too many", """
def one_f_one_b(stages, micro_batches, stage):
    warmup = min(stages - stage, micro_batches)
    order = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro_batches):
        order += [("F", i), ("B", i - warmup)]
    return order + [("B", i) for i in range(micro_batches - warmup, micro_batches)]
""", "1F1B order"),
    ("warm-up not capped at the number of micro-batches", """
def one_f_one_b(stages, micro_batches, stage):
    warmup = stages - stage - 1
    order = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro_batches):
        order += [("F", i), ("B", i - warmup)]
    return order + [("B", i) for i in range(max(0, micro_batches - warmup), micro_batches)]
""", "1F1B order"),
    ("the steady state runs the newest backward, not the oldest", """
def one_f_one_b(stages, micro_batches, stage):
    warmup = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warmup)]
    for i in range(warmup, micro_batches):
        order += [("F", i), ("B", i)]
    return order + [("B", i) for i in range(warmup)]
""", "1F1B order"),
    ("each micro-batch's mean loss not divided by the number of micro-batches",
     _pipeline(loss="F.cross_entropy(stage(activation), y_mb)"), "match the unsplit"),
    ("the gradients sent back last micro-batch first: rank 0 applies them to the wrong micro-batches",
     _pipeline(backward_order="reversed(list(zip(received, losses)))"), "match the unsplit"),
    ("the whole batch as one message (no micro-batches)", """
_solution_pipeline = pipeline_step
def pipeline_step(stage, rank, x, y, micro_batches, hidden):
    return _solution_pipeline(stage, rank, x, y, 1, hidden)
""", "pipeline traffic"),
    ("the projection's bias added on every rank, before the sum",
     _attention(tail="SumInForward.apply(partial + attn.proj.bias)"), "attention: output"),
    ("q, k and v all read from q's rows of qkv (the offsets C and 2C forgotten)",
     _attention(qkv_rows="[slice(rank * width, (rank + 1) * width)] * 3"), "attention: output"),
    ("the input's gradient not summed over the ranks (no SumInBackward)", _attention(x_line="pass"),
     "attention: output"),
    ("the heads' axis never moved (view without transpose): each rank's heads attend across one another",
     _attention().replace(".transpose(1, 2)", ""), "attention: output"),
    ("gather_tokens' buffer in the default float32, whatever the shard's dtype", """
def gather_tokens(shard):
    send = shard.transpose(0, 1).contiguous()
    out = torch.empty(dist.get_world_size() * send.shape[0], *send.shape[1:])
    dist.all_gather_into_tensor(out, send)
    return out.transpose(0, 1).contiguous()
""", "sequence parallelism: this rank"),
    ("scatter_tokens' output sized from the last axis (d / world rows) instead of the tokens", """
def scatter_tokens(full):
    send = full.transpose(0, 1).contiguous()
    out = torch.empty(send.shape[-1] // dist.get_world_size(), *send.shape[1:], dtype=full.dtype)
    dist.reduce_scatter_tensor(out, send, op=dist.ReduceOp.SUM)
    return out.transpose(0, 1).contiguous()
""", "sequence parallelism: this rank"),
    ("the sequence-parallel block's bias added on every rank before the reduce-scatter", """
def sp_mlp(x_shard, block, rank, world):
    fc, act, proj = block
    mine = slice(rank * fc.out_features // world, (rank + 1) * fc.out_features // world)
    hidden = act(F.linear(GatherTokens.apply(x_shard), fc.weight[mine], fc.bias[mine]))
    return ScatterTokens.apply(F.linear(hidden, proj.weight[:, mine], proj.bias))
""", "sequence parallelism: this rank"),
    ("an all-reduce, then this rank's slice, in place of the reduce-scatter (right numbers, twice the bytes)", """
def scatter_tokens(full):
    total = full.contiguous().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    width = full.shape[1] // dist.get_world_size()
    return total[:, dist.get_rank() * width:(dist.get_rank() + 1) * width].contiguous()
""", "all-gather and a reduce-scatter"),
]

# (what differs, the code appended to the cell)
RIGHT: list[tuple[str, str]] = [
    ("the list forms: dist.reduce_scatter and dist.all_gather, and pure functions written another way", """
class ReduceScatterAdamW:
    def __init__(self, params, lr, weight_decay):
        self.params = list(params)
        world, rank = dist.get_world_size(), dist.get_rank()
        n = sum(p.numel() for p in self.params)
        self.size, self.world = -(-n // world), world
        self.bounds = [(min(r * self.size, n), min((r + 1) * self.size, n)) for r in range(world)]
        self.start, self.end = self.bounds[rank]
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.shard = flat[self.start:self.end].clone().requires_grad_()
        self.optimizer = torch.optim.AdamW([self.shard], lr=lr, weight_decay=weight_decay)

    def step(self):
        with torch.no_grad():
            flat = torch.cat([p.grad.reshape(-1) for p in self.params])
            flat = torch.nn.functional.pad(flat, (0, self.size * self.world - flat.numel()))
            chunks = list(flat.chunk(self.world))
            mine = torch.empty(self.size)
            dist.reduce_scatter(mine, chunks)
            self.shard.grad = mine[: self.end - self.start].div(self.world)
        self.optimizer.step()
        with torch.no_grad():
            pieces = [torch.empty(self.size) for _ in range(self.world)]
            dist.all_gather(pieces, torch.nn.functional.pad(self.shard.detach(), (0, self.size - self.shard.numel())))
            new = torch.cat(pieces)
            start = 0
            for p in self.params:
                p.copy_(new[start:start + p.numel()].reshape(p.shape))
                start += p.numel()


def ring_bytes(records, world):
    total = 0
    for op, nbytes in records:
        if op == "all_reduce":
            total += nbytes * 2 * (world - 1) / world
        elif op == "reduce_scatter_tensor":
            total += nbytes * (world - 1) / world
        else:
            total += nbytes * (world - 1)
    return total


def zero_bytes(numel, world, stage, mixed_precision):
    per_param = [2, 2, 12] if mixed_precision else [4, 4, 8]  # weights, gradients, state
    sharded = {1: [2], 2: [1, 2], 3: [0, 1, 2]}.get(stage, [])
    return sum(b * (math.ceil(numel / world) if i in sharded else numel) for i, b in enumerate(per_param))


def comm_bound_ranks(compute_s, grad_bytes, alpha, beta, max_world):
    import bisect  # the time only grows with the world size: a binary search finds the first one
    worlds = range(2, max_world + 1)
    i = bisect.bisect_left(worlds, True, key=lambda w: allreduce_seconds(grad_bytes, w, alpha, beta) >= compute_s)
    return worlds[i] if i < len(worlds) else None


def bandwidth_needed(compute_s, grad_bytes, world, alpha):
    beta = (compute_s - 2 * (world - 1) * alpha) / (2 * (world - 1) / world * grad_bytes)  # s per byte
    return 1 / beta if beta > 0 else float("inf")
"""),
    ("the bubble as 1 - the busy share, and 1F1B as a walk that runs a forward while it may run ahead, as lists", """
def bubble_fraction(stages, micro_batches):
    return 1 - micro_batches / (micro_batches + stages - 1)


def one_f_one_b(stages, micro_batches, stage):
    ahead = min(stages - stage - 1, micro_batches)  # how far the forwards may run ahead of the backwards
    order, f, b = [], 0, 0
    while b < micro_batches:
        if f < micro_batches and f - b <= ahead:
            order.append(["F", f])
            f += 1
        else:
            order.append(["B", b])
            b += 1
    return order
"""),
    ("the pipeline with isend/irecv and their handles waited for, micro-batches sliced by hand", """
def pipeline_step(stage, rank, x, y, micro_batches, hidden):
    size = len(x) // micro_batches
    pieces = [slice(i * size, (i + 1) * size) for i in range(micro_batches)]
    if rank == 0:
        outputs = [stage(x[piece]) for piece in pieces]
        for out in outputs:
            dist.isend(out.detach().contiguous(), dst=1).wait()
        grads = [torch.zeros(size, hidden) for _ in pieces]
        for grad in grads:
            dist.irecv(grad, src=1).wait()
        torch.autograd.backward(outputs, grads)
        return None
    total, saved = 0, []
    for piece in pieces:
        activation = torch.zeros(size, hidden)
        dist.irecv(activation, src=0).wait()
        activation.requires_grad_(True)
        loss = F.cross_entropy(stage(activation), y[piece], reduction="sum") / len(y)
        saved.append((activation, loss))
        total = total + loss.item()
    for activation, loss in saved:
        loss.backward()
        dist.isend(activation.grad, dst=0).wait()
    return torch.tensor(total)
"""),
    ("attention's heads from a (3, C, C) view of qkv's weight, softmax and the causal mask written out", """
def tp_attention(x, attn, rank, world):
    B, T, C = x.shape
    cols = slice(rank * C // world, (rank + 1) * C // world)
    weight, bias = attn.qkv.weight.view(3, C, C)[:, cols], attn.qkv.bias.view(3, C)[:, cols]
    x = SumInBackward.apply(x)
    heads, size = attn.n_head // world, C // attn.n_head
    q, k, v = (F.linear(x, weight[i], bias[i]).view(B, T, heads, size).transpose(1, 2) for i in range(3))
    scores = q @ k.transpose(-2, -1) / math.sqrt(size)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, heads * size)
    return SumInForward.apply(y @ attn.proj.weight[:, cols].T) + attn.proj.bias
"""),
    ("sequence parallelism with the list forms: all_gather into a list, reduce_scatter of chunks along dim 1", """
def gather_tokens(shard):
    pieces = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, shard.contiguous())
    return torch.cat(pieces, dim=1)


def scatter_tokens(full):
    chunks = [c.contiguous() for c in full.chunk(dist.get_world_size(), dim=1)]
    out = torch.empty_like(chunks[0])
    dist.reduce_scatter(out, chunks, op=dist.ReduceOp.SUM)
    return out
"""),
]
