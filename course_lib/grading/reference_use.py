"""Does a submission's exercise code use the ``course_lib`` implementation it was asked to write?

Several exercises ask for a function that ``course_lib`` ships (the reference the checks compare with).
Calling it passes the checks without doing the exercise, so the grader *flags* it (a CSV column, a line
in ``check`` output) instead of hiding it. Detection reads the code of the cells tagged ``exercise``
(parsed, not run): ``from course_lib.x import name``, ``import course_lib.x as m; m.name(...)`` and
``course_lib.x.name`` all count. It is a flag for a person to look at, not a score.
"""

from __future__ import annotations

import ast
from typing import Any

from course_lib.grading import notebook

# Exercise -> the course_lib functions it asks the learner to write (dotted paths).
REFERENCES: dict[str, tuple[str, ...]] = {
    "01": ("course_lib.train.cli.build_parser", "course_lib.train.cli.config_from_args"),
    "02": ("course_lib.perf.profile.profile_steps", "course_lib.perf.profile.top_ops",
           "course_lib.perf.stepsplit.verdict", "course_lib.grading.checks.ex02_bottleneck.reference_tuning"),
    "03": ("course_lib.perf.compile.RecompileCounter", "course_lib.perf.compile.enable_tf32",
           "course_lib.perf.fusion.break_even_calls"),
    "05": ("course_lib.train.schedule.lr_at",),
    "06": ("course_lib.train.optim.param_groups",),
    "07": ("course_lib.train.accumulate.train_accumulated",),
    "09": ("course_lib.train.evaluate.evaluate",),
    "10": ("course_lib.perf.memory.stored_bytes", "course_lib.perf.memory.count_parameters",
           "course_lib.perf.timing.measure_latency"),
    "11": ("course_lib.distributed.scaled_lr",),
    "14": ("course_lib.grading.resume_harness.reference_save", "course_lib.grading.resume_harness.reference_load",
           "course_lib.train.checkpoint.save_checkpoint", "course_lib.train.checkpoint.load_checkpoint",
           "course_lib.train.checkpoint.rng_state", "course_lib.train.checkpoint.set_rng_state",
           "course_lib.train.checkpoint.atomic_write", "course_lib.train.checkpoint.atomic_torch_save",
           "course_lib.atomic.write_with", "course_lib.atomic.write_bytes", "course_lib.atomic.torch_save"),
    "17": ("course_lib.grading.challenge_judge.train_reference",),
    "15": ("course_lib.perf.checkpointing.count_saved_bytes", "course_lib.perf.checkpointing.checkpointed_forward"),
    "16": ("course_lib.perf.memory_format.to_channels_last", "course_lib.perf.threads.intra_op_threads"),
    "18": ("course_lib.perf.compare.decide", "course_lib.perf.compare.choose_quantity",
           "course_lib.perf.compare.verdict_from_times", "course_lib.perf.compare.compare"),
    "19": ("course_lib.perf.anatomy.step_flops", "course_lib.perf.anatomy.counted_step_flops",
           "course_lib.perf.ceiling.roofline_point", "course_lib.perf.ceiling.ridge_intensity"),
    "20": ("course_lib.perf.anatomy.predict_memory", "course_lib.perf.anatomy.measured_memory"),
    "21": ("course_lib.parallel.data_parallel.broadcast_parameters", "course_lib.parallel.data_parallel.assign_buckets",
           "course_lib.parallel.data_parallel.BucketedDP", "course_lib.parallel.data_parallel.OverlappedDP",
           "course_lib.parallel.data_parallel.allreduce_gradients", "course_lib.parallel.zero.ShardedOptimizer",
           "course_lib.parallel.zero.shard_bounds", "course_lib.parallel.tensor_parallel.TPMLP",
           "course_lib.parallel.tensor_parallel.ColumnParallelLinear",
           "course_lib.parallel.tensor_parallel.RowParallelLinear",
           "course_lib.parallel.tensor_parallel._CopyToParallel",
           "course_lib.parallel.tensor_parallel._ReduceFromParallel"),
}


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    base = aliases.get(node.id)
    if base is None:
        return None
    return ".".join([base, *reversed(parts)])


def _matches(dotted: str, reference: str) -> bool:
    """``course_lib.train.lr_at`` (a re-export) matches ``course_lib.train.schedule.lr_at``."""
    package, _, name = reference.rpartition(".")
    if not dotted.startswith("course_lib") or dotted.rpartition(".")[2] != name:
        return False
    return package.startswith(dotted.rpartition(".")[0])


def _aliases(tree: ast.AST) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("course_lib"):
                    aliases[alias.asname or "course_lib"] = alias.name if alias.asname else "course_lib"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib"):
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _parse(code: str) -> ast.AST | None:
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def uses_in_code(code: str, references: tuple[str, ...], context: str = "") -> list[str]:
    """The references ``code`` imports or uses (sorted, each once); ``context`` (set-up code) may import them."""
    tree, before = _parse(code), _parse(context)
    if tree is None:
        return []
    aliases = {**(_aliases(before) if before is not None else {}), **_aliases(tree)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib"):
            for alias in node.names:
                found.update(r for r in references if _matches(f"{node.module}.{alias.name}", r))
        elif isinstance(node, (ast.Attribute, ast.Name)):
            dotted = _dotted(node, aliases)
            if dotted:
                found.update(r for r in references if _matches(dotted, r))
    return sorted(found)


def reference_uses(nb: dict[str, Any], exercise: str) -> list[str]:
    """The reference implementations used by the exercise cells of ``nb`` (names imported by set-up count)."""
    references = REFERENCES.get(exercise, ())
    if not references:
        return []
    cells = notebook.graded_cells(nb)
    setup = "\n".join(code for _, code, tags in cells if "setup" in tags)
    exercise_code = "\n".join(code for _, code, tags in cells if "setup" not in tags)
    return uses_in_code(exercise_code, references, context=setup)
