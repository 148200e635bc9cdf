"""Does a submission's exercise code use the ``course_lib`` implementation it was asked to write?

Several exercises ask for a function that ``course_lib`` ships (the reference the checks compare with).
Calling it passes the checks without doing the exercise, so the grader *flags* it (a CSV column, a line
in ``check`` output) instead of hiding it. It is a flag for a person to look at, not a score. Two detectors:

* by spelling (:func:`reference_uses`, in the grader): the code of the cells tagged ``exercise``, parsed, not run:
  ``from course_lib.x import name``, ``import course_lib.x as m; m.name(...)`` and ``course_lib.x.name``;
* by what runs (:class:`Watch`, in the grading worker, whatever the spelling: ``importlib``, ``getattr``, a copy):
  before the notebook loads, the code of every reference function (and of every function of the exercise's own
  check module) is replaced by a trampoline that notes the call when the nearest caller outside torch, numpy and
  Python's own library is the learner's code, then runs the original; every object a check takes from the
  learner's namespace (:func:`~course_lib.grading.api.need`) is also compared with the references (an alias, a
  subclass, a ``functools.partial``, a copy of the function).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import sys
import sysconfig
import types
from collections.abc import Iterable
from typing import Any

import torch

import course_lib
from course_lib.grading import notebook

# Exercise -> the course_lib functions it asks the learner to write (dotted paths).
REFERENCES: dict[str, tuple[str, ...]] = {
    "01": ("course_lib.train.cli.build_parser", "course_lib.train.cli.config_from_args"),
    "02": ("course_lib.perf.profile.profile_steps", "course_lib.perf.profile.top_ops",
           "course_lib.perf.stepsplit.Split.verdict", "course_lib.grading.checks.ex02_bottleneck.reference_tuning"),
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
    "08": ("course_lib.train.loop.optimizer_step", "course_lib.train.accumulate.backward_group",
           "course_lib.train.accumulate.backward_one"),
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
    "22": ("course_lib.parallel.zero.ShardedOptimizer", "course_lib.parallel.zero.zero_bytes_per_rank",
           "course_lib.parallel.comm.ring_bytes_sent", "course_lib.parallel.comm.ring_allreduce_bytes",
           "course_lib.parallel.comm.predicted_allreduce_seconds", "course_lib.parallel.comm.comm_bound_world",
           "course_lib.parallel.comm.bandwidth_for_compute", "course_lib.parallel.pipeline.bubble_fraction",
           "course_lib.parallel.pipeline.stage_order"),
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


# ---------------------------------------------------------------- by what runs

_COURSE = os.path.dirname(os.path.abspath(course_lib.__file__)) + os.sep
# Frames skipped when looking for who called: the standard library (a map(), a Thread, a partial) and installed
# packages (torch calling a module's forward), never the notebook's folder.
_LIBRARY = tuple(sorted({os.path.abspath(p) + os.sep for p in (
    *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    os.path.dirname(os.path.dirname(torch.__file__)))}))
_DISPATCH = "__course_reference_call__"


def _resolve(dotted: str) -> Any:
    """The object a ``REFERENCES`` entry names (``module.attribute`` or ``module.Class.method``), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that imports is the module
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            value = inspect.getattr_static(value, name, None)
        return getattr(value, "fget", value)  # a property: its getter runs
    return None


def _functions(value: Any) -> list[types.FunctionType]:
    """The Python functions whose code running means ``value`` is used (a class: its own methods)."""
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, type):
        found = []
        for member in vars(value).values():
            member = getattr(member, "__func__", member)  # staticmethod, classmethod
            if isinstance(member, property):
                found += [f for f in (member.fget, member.fset) if isinstance(f, types.FunctionType)]
            elif isinstance(member, types.FunctionType):
                found.append(member)
        return found
    return []


def _trampoline(function: types.FunctionType, key: int) -> types.CodeType:
    """Code with ``function``'s free variables (so it can replace its ``__code__``) that hands every call to the
    watch's dispatcher, looked up in the function's own module globals."""
    free = function.__code__.co_freevars
    lines = ["def _outer():", *[f"    {name} = None" for name in free], "    def _inner(*args, **kwargs):"]
    if free:
        lines.append(f"        {', '.join(free)}")
    lines += [f"        return {_DISPATCH}({key}, args, kwargs)", "    return _inner"]
    scope: dict[str, Any] = {}
    exec(compile("\n".join(lines), f"<reference watch of {function.__qualname__}>", "exec"), scope)
    code = scope["_outer"]().__code__
    names = {"co_name": function.__code__.co_name}
    if hasattr(code, "co_qualname"):  # Python 3.11+
        names["co_qualname"] = function.__code__.co_qualname
    return code.replace(**names)


def _learner_called(frame: types.FrameType | None) -> bool:
    """Whether the nearest caller outside the libraries is the learner's code (not the course's)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_COURSE):
            return False
        if not filename.startswith(_LIBRARY) and not filename.startswith("<frozen "):
            return True
        frame = frame.f_back
    return False


class Watch:
    """Notes every reference of one exercise that the learner's code calls or hands to a check (:attr:`used`)."""

    def __init__(self, exercise: str, modules: Iterable[str] = ()) -> None:
        self.used: set[str] = set()
        self._watched: list[tuple[str, types.FunctionType, types.FunctionType]] = []  # name, patched, original
        self._classes: dict[type, str] = {}
        targets = [(dotted, _resolve(dotted)) for dotted in REFERENCES.get(exercise, ())]
        for module_name in modules:  # the grader's own helpers
            targets += [(f"{module_name}.{name}", value) for name, value in vars(sys.modules[module_name]).items()
                        if isinstance(value, types.FunctionType) and value.__module__ == module_name]
        for dotted, value in targets:
            if isinstance(value, type):
                self._classes[value] = dotted
            for function in _functions(value):
                if all(function is not patched for _, patched, _ in self._watched):
                    self._patch(function, dotted)

    def _patch(self, function: types.FunctionType, dotted: str) -> None:
        if function.__code__.co_filename.startswith("<reference watch"):
            raise RuntimeError(f"{dotted} is watched already: restore() the other Watch first")
        original = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                                      function.__defaults__, function.__closure__)
        for attribute in ("__kwdefaults__", "__qualname__", "__annotations__", "__doc__", "__module__"):
            setattr(original, attribute, getattr(function, attribute))
        try:
            function.__signature__ = inspect.signature(function)  # introspection of the patched one stays true
        except (TypeError, ValueError):
            pass
        function.__globals__[_DISPATCH] = self._dispatch
        function.__code__ = _trampoline(function, len(self._watched))
        self._watched.append((dotted, function, original))

    def _dispatch(self, key: int, args: tuple, kwargs: dict) -> Any:
        dotted, _, original = self._watched[key]
        if _learner_called(sys._getframe(2)):  # 0: here, 1: the trampoline, 2: its caller
            self.used.add(dotted)
        return original(*args, **kwargs)

    def taken(self, value: Any) -> None:
        """A check took ``value`` from the learner's namespace: note it if it is, or is made from, a reference
        (the function itself, a copy of its code, a bound method, a ``partial``, a subclass or an instance)."""
        for inner in (value, getattr(value, "func", None), getattr(value, "__func__", None), type(value)):
            code = getattr(inner, "__code__", None)
            for dotted, function, _ in self._watched:
                if inner is function or (code is not None and code is function.__code__):
                    self.used.add(dotted)
            if isinstance(inner, type) and inner is not type:
                self.used.update(dotted for cls, dotted in self._classes.items() if issubclass(inner, cls))

    def restore(self) -> None:
        """Put every original code back (for grading in a process that goes on, such as a test's)."""
        for _, function, original in self._watched:
            function.__code__ = original.__code__
            function.__dict__.pop("__signature__", None)


def watched_modules(exercise: str) -> list[str]:
    """The grader's own check modules of ``exercise`` (loaded already)."""
    prefix = f"course_lib.grading.checks.ex{exercise}_"
    return [name for name in sys.modules if name.startswith(prefix)]

