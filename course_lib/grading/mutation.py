"""How much of each solution the checks pin down: mutation testing of the graded code (an author's tool).

Each *mutant* is the solution notebook with one small change inside one solution region (the code the exercise stub
blanks): a comparison flipped or its boundary moved, a number replaced, a term dropped, two arguments swapped, a dtype
or a device changed, a statement left out. Every mutant is judged by the real checks through the grader's in-process
path (:func:`course_lib.grading.inprocess.observe_and_judge`) in a forked child with a time limit; the mutant is
*killed* when a check fails (or it runs past the limit), *survives* otherwise. A survivor is a wrong program that
scores full marks, unless it computes the same thing as the solution: those are listed in :data:`EQUIVALENT` with the
reason. The target is at least 98% of the non-equivalent mutants killed, per exercise.

``make mutation`` (``python -m course_lib.grading.mutation [--exercise NN ...] [--timeout S]``) runs every exercise,
keeps each one's result in ``benchmarks/results/mutation.json`` and writes the report to ``docs/mutation.md``.
It runs the course's own solutions in this process's children: trusted code only.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from course_lib.argparsing import CommandParser
from course_lib.grading import notebook

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
RESULTS = REPO / "benchmarks" / "results" / "mutation.json"
REPORT = REPO / "docs" / "mutation.md"
TARGET = 0.98

# ---------------------------------------------------------------- the operators
_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_NEGATED = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE,
            ast.LtE: ast.Gt, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_ARITHMETIC = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
               ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_DTYPES = {"float32": "float64", "float": "double", "float64": "float32", "double": "float", "float16": "bfloat16",
           "half": "bfloat16", "bfloat16": "float16", "int64": "int32", "long": "int"}
_DEVICES = {"cpu": "cuda", "cuda": "cpu", "meta": "cpu"}
_PAIRED_CALLS = {"min": "max", "max": "min", "any": "all", "all": "any"}
_SAID_ONCE = ("dtype", "device")  # keyword arguments whose omission is a mutant
_SYMMETRIC = ("min", "max")  # swapping their arguments changes nothing: not a mutant


@dataclass(frozen=True)
class Mutant:
    """One change to a cell's source: where, which operator, what it replaced and with what, the new source."""

    cell: int
    line: int
    operator: str
    before: str
    after: str
    source: str = ""
    where: str = ""  # the solution's line it changes

    def describe(self) -> str:
        return f"cell {self.cell} line {self.line}, {self.operator}: `{self.before}` -> `{self.after}`"


def _replacements(node: ast.AST) -> Iterator[tuple[str, ast.AST | str]]:
    """``(operator, what replaces node)`` for every mutation of ``node`` itself (not of its children)."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            for name, table in (("boundary", _BOUNDARY), ("comparison", _NEGATED)):
                if type(op) in table:
                    new = copy.deepcopy(node)
                    new.ops[i] = table[type(op)]()
                    yield name, new
    elif isinstance(node, ast.Constant) and type(node.value) in (bool, int, float):
        value = node.value
        if isinstance(value, bool):
            yield "constant", ast.Constant(not value)
        elif isinstance(value, int):
            yield "constant", ast.Constant(value + 1)
            yield "constant", ast.Constant(value - 1)
        elif value == 0:
            yield "constant", ast.Constant(1.0)
        else:
            yield "constant", ast.Constant(value * 2)
            yield "constant", ast.Constant(0.0)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in _DEVICES:
        yield "dtype/device", ast.Constant(_DEVICES[node.value])
    elif isinstance(node, ast.BinOp):
        if type(node.op) in _ARITHMETIC:
            yield "arithmetic", ast.BinOp(node.left, _ARITHMETIC[type(node.op)](), node.right)
        if isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            yield "dropped term", node.left
            yield "dropped term", node.right
        elif isinstance(node.op, (ast.Div, ast.FloorDiv)):
            yield "dropped term", node.left
    elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITHMETIC:
        yield "arithmetic", ast.AugAssign(node.target, _ARITHMETIC[type(node.op)](), node.value)
    elif isinstance(node, ast.BoolOp):
        yield "logic", ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        yield "logic" if isinstance(node.op, ast.Not) else "arithmetic", node.operand
    elif isinstance(node, ast.Call):
        positional = [a for a in node.args if not isinstance(a, ast.Starred)]
        symmetric = isinstance(node.func, ast.Name) and node.func.id in _SYMMETRIC
        if not symmetric and len(positional) == len(node.args) >= 2 and ast.unparse(node.args[0]) != ast.unparse(
                node.args[1]):
            new = copy.deepcopy(node)
            new.args[0], new.args[1] = new.args[1], new.args[0]
            yield "swapped arguments", new
        if isinstance(node.func, ast.Name) and node.func.id in _PAIRED_CALLS:
            yield "constant", ast.Call(ast.Name(_PAIRED_CALLS[node.func.id]), node.args, node.keywords)
        for i, keyword in enumerate(node.keywords):
            if keyword.arg in _SAID_ONCE:
                yield "dtype/device", ast.Call(node.func, node.args, node.keywords[:i] + node.keywords[i + 1:])
    elif isinstance(node, ast.Attribute) and node.attr in _DTYPES and isinstance(node.value, ast.Name) \
            and node.value.id == "torch":
        yield "dtype/device", ast.Attribute(node.value, _DTYPES[node.attr])
    if isinstance(node, ast.AugAssign) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        yield "dropped statement", "pass"


def _offset(lines: list[str], line: int, col: int) -> int:
    """The character offset of (1-based line, UTF-8 byte column) in the source split into ``lines``."""
    text = lines[line - 1].encode()[:col].decode()
    return sum(len(x) + 1 for x in lines[: line - 1]) + len(text)


def mutate_source(code: str, lines: Callable[[int], bool] = lambda line: True) -> list[tuple[int, str, str, str,
                                                                                              str]]:
    """``[(line, operator, before, after, new source)]``: every mutation of a node that lies on lines for which
    ``lines(line)`` is true, one change per mutant, in source order; mutations that leave the code as it was are
    dropped."""
    tree = ast.parse(code)
    text = code.split("\n")
    out, seen = [], set()
    nodes = sorted((n for n in ast.walk(tree) if hasattr(n, "end_lineno") and n.end_lineno is not None),
                   key=lambda n: (n.lineno, n.col_offset))
    for node in nodes:
        if not all(lines(k) for k in range(node.lineno, node.end_lineno + 1)):
            continue
        start = _offset(text, node.lineno, node.col_offset)
        end = _offset(text, node.end_lineno, node.end_col_offset)
        before = code[start:end]
        for operator, replacement in _replacements(node):
            after = replacement if isinstance(replacement, str) else ast.unparse(replacement)
            if isinstance(node, ast.expr) and not isinstance(replacement, str) and not isinstance(
                    replacement, (ast.Constant, ast.Name, ast.Attribute, ast.Call)):
                after = f"({after})"  # keeps the precedence it replaced
            new = code[:start] + after + code[end:]
            if after == before or new in seen:
                continue
            seen.add(new)
            out.append((node.lineno, operator, " ".join(before.split()), " ".join(after.split()), new))
    return out


def region_lines(code: str) -> set[int]:
    """The 1-based line numbers strictly inside a ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region."""
    inside, lines = False, set()
    for number, line in enumerate(code.split("\n"), 1):
        if notebook.BEGIN.match(line):
            inside = True
        elif notebook.END.match(line):
            inside = False
        elif inside:
            lines.add(number)
    return lines


def solution_path(number: str) -> Path:
    found = sorted(SOLUTIONS.glob(f"{number}_*.ipynb"))
    if not found:
        raise ValueError(f"exercise {number!r} has no solution notebook in {SOLUTIONS} (numbers: 01 to "
                         f"{max(p.name[:2] for p in SOLUTIONS.glob('[0-9][0-9]_*.ipynb'))})")
    return found[0]


def mutants(nb: dict[str, Any]) -> list[Mutant]:
    """Every mutant of the solution regions of ``nb``'s exercise cells."""
    out = []
    for index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code" or "exercise" not in notebook.tags(cell):
            continue
        code = notebook.source(cell)
        inside = region_lines(code)
        for line, operator, before, after, new in mutate_source(code, inside.__contains__):
            out.append(Mutant(index, line, operator, before, after, new, code.split("\n")[line - 1].strip()))
    return out


# ---------------------------------------------------------------- the mutants the checks cannot kill, and why
# (exercise, [the solution's line,] before, after) -> why the mutant computes what the solution computes.
_NON_BLOCKING = ("non_blocking only lets a copy from pinned memory to a GPU return before it finishes; the values "
                 "copied are the same, and the grader runs on the CPU")
_ON_THE_CPU = "the grader runs on the CPU, where device=device names the default device"
_EXACT_COUNT = ("a count of at most a few thousand targets is exact in int32 as in int64; both add to the same "
                "Python int")
_PLATEAU = 'plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=1)'
_ANY_PATIENCE = ("another legal answer: the task asks for a ReduceLROnPlateau in mode 'min'; patience=1 is the hint's "
                 "example")
_TEST_CHOICE = ("another valid test: exercise 04's graded code is a test suite, and the task leaves its model seeds, "
                "batch sizes, step counts and thresholds to the learner; the changed test still passes on the right "
                "implementation and fails on every broken one the grader runs it against")
_SYMMETRIC_TEST = "torch.equal and the pairs zip makes are symmetric: the test compares the same two things"
_ONE_TYPE = ("options is the field's type with None taken out; the task's fields are int, float or str, or one "
             "of them | None, so options holds exactly one type and options[-1] is options[0]")
EQUIVALENT: dict[tuple[str, ...], str] = {
    ("01", "overrides[name] = options[0](text)", "0", "-1"): _ONE_TYPE,
    ("01", 'raise ValueError(f"{arg} {text!r}: expected {options[0].__name__}") from None', "0", "-1"): _ONE_TYPE,
    ("01", "proc.wait()  # gone now: the checkpoint read next is the last it wrote", "proc.wait()", "pass"):
        "not observable by a check: the finally block kills and waits for the process before the function returns, "
        "so it is reaped either way; this wait() only keeps the read that follows from racing a run that saves again "
        "between kill() and the signal landing, and under the grader the run holds at the checkpoint until it has "
        "been read twice (the handshake in course_lib/train/checkpoint.py), so the read sees the same file",
    ("01", "time.sleep(poll_s)"):
        "not observable by a check: without the pause the loop polls as fast as it can, a core kept busy while it "
        "waits, and stops at the same checkpoint with the same step; what the waiting costs in CPU time depends on "
        "the machine's speed and load, which no check may measure",
    **{("04", line): _TEST_CHOICE for line in (
        "model = impl.make_model(0).eval()", "model = impl.make_model(0)", "model = impl.make_model(seed=3)",
        "model = impl.make_model(0).train()", "for batch_size in (1, 3, 8):", "batch = impl.make_batch(8, seed=1)",
        "x, y = impl.make_batch(8, seed=2)", "x, _ = impl.make_batch(4, seed=10)",
        "batch = impl.make_batch(8, seed=11)",
        "for _ in range(60):", "for s in range(3):", "impl.train_step(model, optimizer, impl.make_batch(8, seed=s))",
        "losses = [impl.train_step(model, optimizer, impl.make_batch(8, seed=s)) for s in range(3)]",
        'assert last < 0.1 * first, f"loss went from {first:.3f} to {last:.3f} on a single batch"')},
    ("04", "torch.equal(a, b)", "torch.equal(b, a)"): _SYMMETRIC_TEST,
    ("04", "zip(weights_a, weights_b)", "zip(weights_b, weights_a)"): _SYMMETRIC_TEST,
    ("04", "torch.equal(model(x), restored(x))", "torch.equal(restored(x), model(x))"): _SYMMETRIC_TEST,
    ("04", "zip(model.parameters(), restored.parameters())", "zip(restored.parameters(), model.parameters())"):
        _SYMMETRIC_TEST,
    ("08", "x, y = (t.to(device, non_blocking=True) for t in batch)", "True", "False"): _NON_BLOCKING,
    ("08", "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)", "True", "False"): _NON_BLOCKING,
    ("08", "optimizer.zero_grad(set_to_none=True)", "True", "False"):
        "every parameter gets a gradient in every step, so gradients zeroed in place and gradients set to None give "
        "the same next gradients and the same step",
    ("07", "optimizer.zero_grad(set_to_none=True)", "True", "False"):
        "every parameter gets a gradient in every group, so gradients zeroed in place and gradients set to None give "
        "the same next gradients and the same step",
    ("07", "(loss_sum / max(count, 1)).backward()", "1", "0"):
        "differs only for a group of padding only (count 0), where loss_sum is 0 and the division 0/0 is NaN; "
        "cross_entropy's backward gives an ignored (-100) target exactly zero gradient whatever comes from above (here "
        "inf), so the gradients are zeros and the step the same; what is added to the epoch's loss is loss_sum, not "
        "the quotient (the check's padding-only group gives the same weights and loss either way)",
    ("09", "torch.zeros((), dtype=torch.float64, device=device)", "torch.zeros((), dtype=torch.float64)"): _ON_THE_CPU,
    ("09", "torch.zeros((), dtype=torch.long, device=device)", "torch.zeros((), dtype=torch.long)"): _ON_THE_CPU,
    ("09", "torch.long", "torch.int"): _EXACT_COUNT,
    ("09", "correct = torch.zeros((), dtype=torch.long, device=device)"): _EXACT_COUNT + " (float32 too, up to 2**24)",
    ("09", "count = torch.zeros((), dtype=torch.long, device=device)"): _EXACT_COUNT + " (float32 too, up to 2**24)",
    ("09", "loss_sum = torch.zeros((), dtype=torch.float64, device=device)"):
        "the task sets no precision for the running sum (float64 is the solution's choice): float32 sums of the "
        "check's few hundred per-target losses agree to about 1e-7 relative, inside the check's tolerance; on the "
        "CPU device=device is the default device",
    ("09", "logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)  # text batches too"):
        "the task's model gives (batch, classes) logits, where shape[1] is shape[-1]: the reshape is the solution's "
        "own generality (text batches), not a requirement",
    ("09", "correct += ((logits.argmax(-1) == y) & keep).sum()"):
        "after the reshape the logits are (rows, classes): argmax(1) is argmax(-1)",
    ("02", "workers = 0 if cores <= 1 else min(cores - 1, 8)"):
        "another legal answer: the task asks for 0 workers at one core and 'between 1 and cores - 1 workers (you "
        "pick how many)' above it; cores < 1 and cores <= 0 differ only at 0 cores, which no machine has",
    ("02", '"prefetch_factor": 2 if workers > 0 else None,'):
        "another legal answer: the task asks to 'prefetch at least one batch' with workers, not for 2",
    ("02", '"persistent_workers": workers > 0,'):
        "another legal answer: the task only forbids persistent workers without workers",
    ("14", 'if rng["cuda"] is not None and torch.cuda.is_available():'):
        "a GPU's random state: on the CPU grader torch.cuda.is_available() is False, so the branch never runs "
        "(the GPU check machine runs the solution, not the mutants)",
    ("14", 'torch.cuda.set_rng_state_all(rng["cuda"])'):
        "a GPU's random state: the line runs only where torch.cuda.is_available(), never on the CPU grader",
    ("14", "np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))"):
        "np.random.set_state converts the key array to uint32 itself: the same state is restored",
    ("14", 'state = torch.load(path, map_location="cpu", weights_only=True)'):
        "not observable by a check: a checkpoint the course wrote holds tensors and plain data only, which load the "
        "same either way (weights_only=True refuses pickled code, a safety the task asks for but no output shows)",
    ("14", "f.flush()"):
        "not observable by a check: flush and fsync make the bytes durable before the rename, which only a power "
        "cut or a kernel crash between the two would show (the rename-after-write itself is checked)",
    ("14", "os.fsync(f.fileno())"):
        "not observable by a check: see f.flush() (durability against a power cut)",
    ("12", "self.train_acc(self(x), y)"):
        "not required: the task asks MeteredClassifier to log val_acc; train_acc is the solution's extra (a correct "
        "alternative without it is a row of tests/test_grading_variants.py)",
    ("12", 'self.log("train_acc", self.train_acc, batch_size=len(y))'):
        "not required: the task asks MeteredClassifier to log val_acc; train_acc is the solution's extra",
    ("12", _PLATEAU, "1", "2"): _ANY_PATIENCE,
    ("12", _PLATEAU, "1", "0"): _ANY_PATIENCE,
    ("12", "enable_model_summary=False)"): "a display setting: what the trainer prints, not what it computes",
    ("12", 'trainer = L.Trainer(fast_dev_run=n_batches, accelerator="cpu", devices=1, enable_progress_bar=False,',
     "False", "True"): "a display setting: the progress bar changes what is printed, not what is computed",
    ("17", "model.train()"):
        "the challenge's model (Linear, ReLU, Linear) has no dropout or batch norm: train and eval mode compute the "
        "same",
    ("17", "optimizer.zero_grad(set_to_none=True)", "True", "False"):
        "every parameter gets a gradient in every step, so gradients zeroed in place and gradients set to None give "
        "the same next gradients and the same step",
    ("17", "labelled = (y != -100).sum().clamp(min=1)", "1", "0"):
        "differs only for a group without a labelled sample, whose mean loss the task leaves undefined (0/0), and "
        "the challenge has none: challenge_data marks every 17th sample unlabelled, groups hold 64 samples and the "
        "shortest last group of the sizes the grader draws (194 and up) holds 2, one labelled. Even there "
        "cross_entropy's backward gives ignored targets exactly zero gradient, so only the logged loss would differ "
        "(NaN against 0.0); correct alternatives that take F.cross_entropy's mean behave like the mutant",
    ("20", "size = torch.finfo(getattr(torch, dtype)).bits // 8"):
        "bits / 8 is the same number as bits // 8, and bits // 7 gives 4 and 2 for the only dtypes the task names "
        "(float32, bfloat16), as // 8 does",
    ("20", "state = 2 * params * size + 4 * 2 * len(layers)  # two moments; a float32 step per weight and per bias"):
        "AdamW's step counters (a float32 scalar per parameter tensor) are few-byte scalars the task allows leaving "
        "out: every change to that term stays inside the check's 1% tolerance",
    ("20", "activations = saved * size + batch * 8 + size  # + the int64 targets and the 0-dim total_weight"):
        "the 0-dim total_weight is a scalar the task allows leaving out, and +-batch bytes on the int64 targets stay "
        "under 1% of activations that are at least 108 * batch bytes",
    ("11", "return base_lr * effective_batch(per_device_batch, world_size, accum) / base_batch",
     "effective_batch(per_device_batch, world_size, accum)", "effective_batch(world_size, per_device_batch, accum)"):
        "the solution's effective_batch is the product of its arguments: swapping two factors gives the same "
        "number (a learner's own effective_batch is checked on its own)",
    ("11", "optimizer.zero_grad(set_to_none=True)", "True", "False"):
        "every parameter gets a gradient in every step, so gradients zeroed in place and gradients set to None give "
        "the same next gradients and the same step",
    ("21", "total = 0  # set again when the first bucket opens"):
        "the first parameter always opens the first bucket (no buckets yet), which sets total to 0 again before any "
        "size is added: this first value is never read",
    ("21", "if not self.buckets or (self.buckets[-1][\"params\"] and total + nbytes > bucket_cap_bytes):", "1", "0"):
        "every bucket gets its first parameter the moment it is made, so any bucket's list, the first ([-0]) as "
        "the last ([-1]), is non-empty when it is tested",
    ("21", "while self.next < len(self.buckets) and \\", "self.next < len(self.buckets)",
     "(self.next <= len(self.buckets))"):
        "self.next reaches len(self.buckets) only when the last bucket leaves, in the hook of the step's last "
        "ready parameter: no hook runs after it in that backward, and finish() sets self.next back to 0",
    **{("22", f"{t}.transpose({a}, {b})", f"{t}.transpose({b}, {a})"):
       "transpose swaps two axes: transpose(a, b) and transpose(b, a) are the same tensor"
       for t, a, b in (("t.view(B, T, heads, width // heads)", 1, 2), ("shard", 0, 1), ("out", 0, 1),
                       ("full", 0, 1), ("F.scaled_dot_product_attention(q, k, v, is_causal=True)", 1, 2))},
    ("22", "for world in range(2, max_world + 1):", "2", "1"):
        "a world of one rank has no all-reduce (0 s), which never reaches a compute time; the task's compute times "
        "are positive (comm_bound_world refuses any other), so the walk returns what it returns from 2",
    ("19", "zip(widths[:-1], widths[1:])", "zip(widths[1:], widths[:-1])"):
        "each layer's count 2*N*a*b is symmetric in a and b, and which layer is first is read from enumerate, "
        "not from the widths",
}


def equivalence(number: str, mutant: Mutant) -> str:
    """Why ``mutant`` (a survivor) computes what the solution does, or ''. A reason keyed by the solution's line
    alone covers every survivor on that line."""
    for key in ((number, mutant.where, mutant.before, mutant.after), (number, mutant.before, mutant.after),
                (number, mutant.where)):
        if key in EQUIVALENT:
            return EQUIVALENT[key]
    return ""


# ---------------------------------------------------------------- judging a mutant
def _judge_in_child(number: str, nb: dict[str, Any], seed: int, write_fd: int) -> None:
    from course_lib.grading import api
    from course_lib.grading.inprocess import observe_and_judge
    from course_lib.grading.worker import load_namespace

    _forget_parents_fork_server()
    api.set_run_seed(seed)
    os.environ[_CHILD] = "1"  # a mutant that relaunches this program (Lightning's DDP launcher does) gets no run
    ns = load_namespace(nb)
    failed = [r.name for r in observe_and_judge(number, ns) if not r.passed]
    os.write(write_fd, json.dumps(failed).encode())


_CHILD = "COURSE_MUTATION_CHILD"


def _forget_parents_fork_server() -> None:
    """Make the first rank this child starts bring up the child's own fork server (exercises 11, 21, 22).

    A forked child inherits the parent's ``multiprocessing`` fork-server state, which it cannot use: it is not the
    server's parent (``waitpid`` on it fails), so every rank it started would fail and every mutant count as killed.
    Resetting that state costs one server start per mutant (a few seconds) and only in the exercises that start ranks.
    """
    from multiprocessing import forkserver

    forkserver._forkserver.__init__()  # type: ignore[attr-defined]  # the module's one server, not yet started here


def judge(number: str, nb: dict[str, Any], seed: int, timeout_s: float) -> tuple[str, list[str]]:
    """``("killed" | "survived" | "timeout" | "crashed", failing checks)`` of ``nb`` judged in a forked child."""
    sys.stdout.flush()  # or the child inherits what is buffered and prints it again
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own process group, so a timeout also ends what the checks started
        os.close(read_fd)
        os.setpgid(0, 0)
        code = 0
        try:
            _judge_in_child(number, nb, seed, write_fd)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline, chunks = time.monotonic() + timeout_s, []
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([read_fd], [], [], max(0.0, left))
        if not ready:  # past the limit
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except ProcessLookupError:
                    pass
            os.waitpid(pid, 0)
            os.close(read_fd)
            return "timeout", []
        chunk = os.read(read_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    try:
        failed = json.loads(b"".join(chunks))
    except ValueError:
        return "crashed", []
    return ("killed" if failed else "survived"), failed


def with_cell(nb: dict[str, Any], index: int, source: str) -> dict[str, Any]:
    new = copy.deepcopy(nb)
    new["cells"][index]["source"] = source
    return new


@dataclass
class Outcome:
    mutant: str
    where: str
    status: str  # killed, survived, timeout, crashed
    failed: list[str]
    equivalent: str


def run_exercise(number: str, seed: int, timeout_s: float, log: Callable[[str], None] = print,
                 previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Judge the solution (it must pass every check) and then each of its mutants; with ``previous`` (an earlier
    result of this exercise), only the mutants that survived it, the others keeping their outcome (for checks made
    stricter since: a mutant they killed stays killed)."""
    import torch

    from course_lib.grading import api
    from course_lib.grading.inprocess import observe_and_judge
    from course_lib.grading.worker import load_namespace

    nb = notebook.read(solution_path(number))
    started = time.monotonic()
    # Judged once here first, so every child starts with the modules, data and lazy imports loaded (about 100x
    # faster per mutant); one thread, so no thread pool exists when the children are forked.
    torch.set_num_threads(1)
    api.set_run_seed(seed)
    observe_and_judge(number, load_namespace(nb))
    status, failed = judge(number, nb, seed, timeout_s)
    if status != "survived":
        raise RuntimeError(f"exercise {number}: the solution itself does not pass ({status}: {failed})")
    baseline_s = time.monotonic() - started
    outcomes = []
    all_mutants = mutants(nb)
    log(f"exercise {number}: {len(all_mutants)} mutants, the solution judged in {baseline_s:.1f} s")
    before = {o["mutant"]: o for o in (previous or {}).get("outcomes", [])}
    for k, m in enumerate(all_mutants, 1):
        kept = before.get(m.describe())
        if kept is not None and kept["status"] != "survived":
            outcomes.append(Outcome(**kept))
            continue
        status, failed = judge(number, with_cell(nb, m.cell, m.source), seed, timeout_s)
        outcome = Outcome(m.describe(), m.where, status, failed, equivalence(number, m))
        outcomes.append(outcome)
        if status == "survived":
            log(f"  [{k}/{len(all_mutants)}] survived: {m.describe()}  ({m.where})"
                + (f"  equivalent: {outcome.equivalent}" if outcome.equivalent else ""))
    return {"number": number, "seed": seed, "timeout_s": timeout_s, "baseline_s": round(baseline_s, 2),
            "seconds": round(time.monotonic() - started, 1), "outcomes": [asdict(o) for o in outcomes]}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    outcomes = result["outcomes"]
    survived = [o for o in outcomes if o["status"] == "survived"]
    equivalent = [o for o in survived if o["equivalent"]]
    live = len(outcomes) - len(equivalent)
    killed = len(outcomes) - len(survived)
    return {"made": len(outcomes), "killed": killed, "timeouts": sum(o["status"] == "timeout" for o in outcomes),
            "equivalent": len(equivalent), "survived": len(survived) - len(equivalent),
            "rate": killed / live if live else 1.0}


def refresh(results: dict[str, dict[str, Any]]) -> None:
    """Give every stored survivor the reason :data:`EQUIVALENT` holds for it now (reasons are added after a run)."""
    for number, result in results.items():
        by_name = {m.describe(): m for m in mutants(notebook.read(solution_path(number)))}
        for outcome in result["outcomes"]:
            mutant = by_name.get(outcome["mutant"])
            if mutant is not None and outcome["status"] == "survived":
                outcome["where"], outcome["equivalent"] = mutant.where, equivalence(number, mutant)


def render(results: dict[str, dict[str, Any]]) -> str:
    """docs/mutation.md from every exercise's result."""
    lines = [
        "# Mutation testing of the checks",
        "",
        "Generated by `make mutation` (`python -m course_lib.grading.mutation`, see its docstring); do not edit by "
        "hand. Each mutant is a solution with one change inside a solution region (the code the exercise stub "
        "blanks): a comparison flipped or its boundary moved, a number replaced, a term dropped, two arguments "
        "swapped, a dtype or device changed, a statement left out. It is judged by the real checks in a forked "
        "child with a time limit. *Killed*: a check failed (or it ran past the limit). *Equivalent*: it "
        "computes what the solution computes (the reason is given). Target: at least "
        f"{TARGET:.0%} of the non-equivalent mutants killed, per exercise.",
        "",
        "| exercise | mutants | killed | of which timeouts | equivalent | survived | killed / non-equivalent | "
        "seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for number in sorted(results):
        s = summary(results[number])
        mark = "" if s["rate"] >= TARGET else " (below target)"
        lines.append(f"| {number} | {s['made']} | {s['killed']} | {s['timeouts']} | {s['equivalent']} | "
                     f"{s['survived']} | {s['rate']:.1%}{mark} | {results[number]['seconds']:.0f} |")
    missing = sorted({p.name[:2] for p in SOLUTIONS.glob("[0-9][0-9]_*.ipynb")} - set(results))
    for number in missing:
        lines += ["", f"Exercise {number} is not measured: not run yet "
                      f"(`make mutation MUTATION_ARGS='--exercise {number}'`)."]
    lines += ["", "## Survivors", ""]
    for number in sorted(results):
        survived = [o for o in results[number]["outcomes"] if o["status"] == "survived"]
        if not survived:
            continue
        lines.append(f"### Exercise {number}")
        lines.append("")
        for o in survived:
            why = f"equivalent: {o['equivalent']}" if o["equivalent"] else "**not killed**"
            lines.append(f"- {o['mutant']} (`{o['where']}`): {why}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib.grading.mutation", description=__doc__.splitlines()[0])
    parser.add_argument("--exercise", action="append", default=[], metavar="NN",
                        help="only this exercise (repeat for several; default: every exercise)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="seconds one mutant may take before it counts as killed (default 120)")
    parser.add_argument("--seed", type=int, default=1234, help="the grading run's seed every mutant is judged with")
    parser.add_argument("--survivors", action="store_true",
                        help="judge again only the stored survivors of each exercise (after making checks stricter)")
    parser.add_argument("--report-only", action="store_true",
                        help=f"judge nothing: write {REPORT.name} again from the stored results and today's reasons")
    args = parser.parse_args(argv)
    if os.environ.get(_CHILD):  # started by a mutant (a launcher that re-runs the command line): judge nothing
        print("error: started from inside a mutant's run; nothing judged", file=sys.stderr)
        return 2
    if args.report_only:
        if not RESULTS.exists():
            parser.error(f"--report-only: {RESULTS.relative_to(REPO)} does not exist yet; run without it first")
        results = json.loads(RESULTS.read_text())
        refresh(results)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        REPORT.write_text(render(results))
        print(f"report: {REPORT.relative_to(REPO)}")
        return 0
    if args.timeout <= 0:
        parser.error(f"--timeout {args.timeout:g}: a mutant needs a positive number of seconds")
    numbers = args.exercise or sorted(p.name[:2] for p in SOLUTIONS.glob("[0-9][0-9]_*.ipynb"))
    for number in numbers:
        try:
            solution_path(number)
        except ValueError as exc:
            parser.error(str(exc))
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for number in numbers:
        result = run_exercise(number, args.seed, args.timeout,
                              previous=stored.get(number) if args.survivors else None)
        # Read again before writing, after each exercise: runs of other exercises may have finished meanwhile, and an
        # interrupted run keeps what it measured.
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        results[number] = result
        refresh(results)
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
        REPORT.write_text(render(results))
        s = summary(results[number])
        print(f"exercise {number}: {s['made']} mutants, {s['killed']} killed, {s['equivalent']} equivalent, "
              f"{s['survived']} survived: {s['rate']:.1%} of the non-equivalent killed")
    results = json.loads(RESULTS.read_text())
    below = [n for n in numbers if summary(results[n])["rate"] < TARGET]
    print(f"report: {REPORT.relative_to(REPO)}" + (f"; below {TARGET:.0%}: {', '.join(below)}" if below else ""))
    return 1 if below else 0


if __name__ == "__main__":
    raise SystemExit(main())
