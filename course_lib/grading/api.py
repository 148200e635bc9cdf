"""The grading contract: how a check is written, registered, run and reported.

A *check* is a plain function in ``course_lib/grading/checks/exNN_<topic>.py`` that takes the
learner's namespace (the dict of names their notebook defined) and either returns (pass) or
raises :class:`CheckFailed` (fail)::

    from course_lib.grading.api import CheckFailed, check_for, need

    @check_for("05", "warm-up then cosine", points=1)
    def lr_schedule(ns):
        lr_at = need(ns, "lr_at", "define `lr_at(step, cfg)` in the exercise cell")
        got = lr_at(0, cfg)                       # NotImplementedError from a stub is reported for you
        if abs(got - expected) > 1e-9:
            raise CheckFailed("the first step should use the warm-up LR, not the peak",
                              hint="step 0 is 1/warmup of the peak", expected=expected, got=got)

Where a verdict is made. Learner code is untrusted, so a check is written in two halves: the part that
touches learner code is wrapped in :func:`observe` and returns plain data (numbers, strings, lists, dicts,
tensors); everything after it *judges* that data. The grader runs each check twice: in the sandboxed child,
where ``observe`` calls the learner's code and records what came back, and then in the trusted parent, where
``observe`` replays the recorded data and only the parent's verdict counts. In a notebook (``check(...)``) and
in tests ``observe`` simply calls the function. So: never read ``ns`` outside an ``observe`` function, and build
inputs inside it from fixed seeds (or pass them in as arguments), never from the global random state::

    def _values(ns, cfg):                        # runs next to the learner's code: return data only
        lr_at = need(ns, "lr_at", "define `lr_at(step, cfg)`")
        return [call(lr_at, step, cfg) for step in range(cfg.steps + 1)]

    @check_for("05", "warm-up then cosine", points=2)
    def values(ns):
        got = observe(ns, _values, cfg)          # replayed in the grader's own process
        ...                                      # compare with the reference here

Rules that keep feedback useful:

* Say what is wrong first, then how to fix it (``hint``), then ``expected``/``got`` (rendered as one
  line each). Test behaviour with inputs the notebook does not show; compare against the
  ``course_lib`` reference implementation rather than hard-coded numbers.
* Never print; never depend on another check having run; keep each check tiny in smoke mode.
* A learner's ``NotImplementedError("Exercise NN.k: ...")`` (the stub the exercise builder writes)
  becomes "not attempted yet: Exercise NN.k: ..."; any other exception from learner code becomes a
  failed check naming the exception. You only raise :class:`CheckFailed` for wrong *answers*.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

CheckFunc = Callable[[dict[str, Any]], None]

# Exercise number (two digits) -> the checks registered for it, in definition order.
_REGISTRY: dict[str, dict[str, Check]] = {}

# Name the runner stores in the learner namespace: cells that raised while loading ([(cell index, message)]).
CELL_ERRORS = "__grading_cell_errors__"


class CheckFailed(Exception):
    """A check's verdict: the learner's answer is wrong (or missing).

    ``message`` says what is wrong, ``hint`` how to find the fix, ``expected``/``got`` the values
    that differ (any objects; they are shown with ``repr`` cut to one line).
    """

    def __init__(self, message: str, *, hint: str | None = None, expected: Any = None, got: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.expected = expected
        self.got = got
        self.has_values = expected is not None or got is not None
        self.has_expected = expected is not None


class LearnerRaised(Exception):
    """Replayed in the grader: the learner's code raised while an observation was being made.

    ``kind`` is ``"not_attempted"`` (the stub), ``"exit"`` (``sys.exit``/``SystemExit``), ``"failed"`` (a
    :class:`CheckFailed` raised next to the learner's code, e.g. by :func:`need`) or ``"error"``.
    """

    def __init__(self, kind: str, message: str, hint: str | None = None, expected: str | None = None,
                 got: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.hint, self.expected, self.got = kind, message, hint, expected, got


class Replay:
    """What a check receives in the grader's trusted process instead of the learner's namespace.

    It holds the observations the sandboxed child recorded for this check, in order; :func:`observe`
    hands them out. Anything else that tries to read it as a namespace is a bug in the check.
    """

    def __init__(self, records: list[dict[str, Any]], missing: str = "no observation was recorded",
                 seed: int = 0, mode: str | None = None) -> None:
        self.records = list(records)
        self.missing = missing
        self.seed = seed
        self.mode = mode  # the COURSE_MODE the child observed in (None: this process's own)
        self.position = 0

    def take(self, key: str) -> dict[str, Any]:
        if self.position >= len(self.records):
            raise LearnerRaised("missing", self.missing)
        record = self.records[self.position]
        self.position += 1
        if not isinstance(record, dict) or record.get("key") != key:
            raise LearnerRaised("missing", "the observations from your notebook do not match what the check "
                                "asked for (did your code change the grader?)")
        # Bound to the whole seed: a check's inputs may vary with a few bits of it (job sizes), but an answer recorded
        # for another run, or written for a guessed seed, is refused however many of those bits it shares.
        if type(record.get("seed")) is not int or record["seed"] != self.seed:
            raise LearnerRaised("missing", f"these observations were recorded for another grading run (seed "
                                f"{one_line(record.get('seed'), 30)}, this run's is {self.seed}): only what the "
                                "grader's own worker records for this run is judged")
        return record

    def __getitem__(self, name: str) -> Any:
        raise TypeError("a check read the learner's namespace outside observe(); wrap that code in observe()")

    def __contains__(self, name: object) -> bool:
        raise TypeError("a check read the learner's namespace outside observe(); wrap that code in observe()")

    def get(self, name: str, default: Any = None) -> Any:
        raise TypeError("a check read the learner's namespace outside observe(); wrap that code in observe()")


# Set by the grading worker (the sandboxed child) while one check runs: observations are appended here.
_recording: list[dict[str, Any]] | None = None
# This grading run's seed (chosen by the grader, 0 in a notebook): checks may draw inputs from it, so a
# submission cannot pass by replaying answers computed in advance for fixed inputs.
_run_seed = 0


def set_run_seed(seed: int) -> None:
    """Worker side: the seed the grader chose for this run."""
    global _run_seed
    _run_seed = int(seed)


def run_seed(ns: Mapping[str, Any] | Replay) -> int:
    """The seed of this grading run, the same in the sandboxed child and in the grader's replay."""
    return ns.seed if isinstance(ns, Replay) else _run_seed


def start_recording() -> list[dict[str, Any]]:
    """Worker side: record every :func:`observe` of the check about to run."""
    global _recording
    _recording = []
    return _recording


def stop_recording() -> None:
    global _recording
    _recording = None


_DATA_TYPES = (str, int, float, bool, type(None))


def as_data(value: Any, where: str = "observation", depth: int = 0) -> Any:
    """``value`` as plain data that crosses to the grader safely (tensors detached, copied, on the CPU).

    Only ``None``/bool/int/float/str, tensors, and lists, tuples and str-keyed dicts of those: the
    grader reads them with ``torch.load(weights_only=True)``, which builds nothing else.
    """
    if depth > 20:
        raise TypeError(f"{where} is nested too deeply")
    if isinstance(value, bool) or value is None or type(value) in (int, float, str):
        return value
    if isinstance(value, _DATA_TYPES):  # subclasses of int/str/float become the plain type
        return bool(value) if isinstance(value, bool) else type(value).__mro__[-2](value)
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True).contiguous() if value.layout == torch.strided else (
            value.detach().to_dense().cpu())
    if isinstance(value, (list, tuple)):
        items = [as_data(v, where, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {str(k): as_data(v, where, depth + 1) for k, v in value.items()}
    raise TypeError(f"{where}: {type(value).__name__} is not plain data (a check returned it from observe())")


def _raised_record(key: str, exc: BaseException) -> dict[str, Any]:
    call_text = getattr(exc, "__grading_call__", None)
    where = f" in {call_text}" if call_text else ""
    if isinstance(exc, LearnerRaised):
        return {"key": key, "raised": exc.kind, "message": exc.message, "hint": exc.hint, "expected": exc.expected,
                "got": exc.got}
    if isinstance(exc, CheckFailed):
        return {"key": key, "raised": "failed", "message": exc.message, "hint": exc.hint,
                "expected": one_line(exc.expected) if exc.has_expected else None,
                "got": one_line(exc.got) if exc.has_values else None}
    if isinstance(exc, NotImplementedError) and str(exc).startswith("Exercise"):
        return {"key": key, "raised": "not_attempted", "message": f"not attempted yet: {exc}"}
    if isinstance(exc, SystemExit):
        return {"key": key, "raised": "exit",
                "message": f"your code called sys.exit({exc.code!r}){where}; return a value or raise an exception "
                           "instead"}
    return {"key": key, "raised": "error",
            "message": f"your code raised {type(exc).__name__}: {exc}{where}{_learner_frame(exc)}"}


# Modules whose attributes learner code (or a check's spy) may replace while it runs: put back afterwards, so one
# check, or one in-process grading (tests, a notebook), never changes what the next one calls (torch.compile...).
_GUARDED_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.nn.utils", "torch.optim", "torch.amp",
                    "torch.utils.data", "torch.profiler", "torch.backends", "course_lib.device")


@contextmanager
def preserved_globals() -> Iterator[None]:
    """Restore the attributes of torch's main modules (and a few global settings) to what they were on entry.

    Attributes replaced inside the block (``torch.compile = spy``) get their original object back; attributes
    added are left alone (imports add submodules). The float32 matmul precision and the default dtype, which
    exercises change through torch's setters, are restored too.
    """
    saved = {name: dict(vars(sys.modules[name])) for name in _GUARDED_MODULES if name in sys.modules}
    precision, dtype = torch.get_float32_matmul_precision(), torch.get_default_dtype()
    try:
        yield
    finally:
        for name, before in saved.items():
            now = vars(sys.modules[name])
            for key, value in before.items():
                if now.get(key, _MISSING) is not value:
                    setattr(sys.modules[name], key, value)
        torch.set_float32_matmul_precision(precision)
        torch.set_default_dtype(dtype)


_MISSING = object()


@contextmanager
def preserved_environ() -> Iterator[None]:
    """Put ``os.environ`` back as it was on entry: every variable set, changed or removed inside the block.

    Grading sets ``COURSE_MODE`` for the checks it judges, and learner code or a check may set anything else
    (``OMP_NUM_THREADS``...); none of it may outlive the check.
    """
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k not in saved]:
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value

# One check runs at a time in a process. Judges draw from torch's, Python's and numpy's global generators, set
# torch's thread count and read COURSE_MODE: two judges at once (``grade --jobs``) would take each other's draws.
_ONE_CHECK_AT_A_TIME = threading.RLock()


@contextmanager
def isolated_check(mode: str | None = None, seed: int | None = None) -> Iterator[None]:
    """Run a check alone, and leave every process-wide setting it may change as it was.

    Held across the whole check: a process-wide lock (judges never overlap), and on exit the global random
    generators (torch, ``random``, numpy), torch's intra-op thread count, grad mode, deterministic-algorithms flag,
    the environment (``COURSE_MODE`` included: :func:`preserved_environ`) and everything :func:`preserved_globals`
    keeps are put back. With ``seed`` (the grader judging a replay) the check starts from a fixed state, whatever
    ran in this process before: every generator seeded from the run's seed, one thread, full float32 precision,
    ``COURSE_MODE=mode``.
    """
    import random

    import numpy as np

    with _ONE_CHECK_AT_A_TIME, preserved_environ():
        rng = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        settings = (torch.get_num_threads(), torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled())
        try:
            if mode is not None:
                os.environ["COURSE_MODE"] = mode
            if seed is not None:
                torch.manual_seed(seed)
                random.seed(seed)
                np.random.seed(seed % 2**32)
                torch.set_num_threads(1)
                torch.set_float32_matmul_precision("highest")
                torch.set_default_dtype(torch.float32)
                torch.set_grad_enabled(True)
            with preserved_globals():  # torch's module attributes, matmul precision and default dtype
                yield
        finally:
            torch.set_rng_state(rng[0])
            random.setstate(rng[1])
            np.random.set_state(rng[2])
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
            threads, grad, deterministic, warn_only = settings
            if torch.get_num_threads() != threads:  # setting it again is not free: it rebuilds the thread pool
                torch.set_num_threads(threads)
            torch.set_grad_enabled(grad)
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def observe(ns: Mapping[str, Any] | Replay, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(ns, *args, **kwargs)`` next to the learner's code and return its result (plain data).

    In the grader's trusted process (``ns`` is a :class:`Replay`) the function is *not* run: the result the
    sandboxed child recorded is returned instead, or the exception it recorded is raised again (as
    :class:`LearnerRaised`). Learner exceptions are therefore reported by :func:`run_check`, never caught here.
    """
    key = getattr(fn, "__qualname__", repr(fn))
    if isinstance(ns, Replay):
        record = ns.take(key)
        if "raised" in record:
            raise LearnerRaised(str(record["raised"]), str(record.get("message")), record.get("hint"),
                                record.get("expected"), record.get("got"))
        return record.get("value")
    recording = _recording
    try:
        with preserved_globals():
            value = as_data(fn(ns, *args, **kwargs))  # in a notebook too, so a check behaves the same everywhere
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the same exception in a notebook, in the sandbox and in the grader
        record = _raised_record(key, exc)
        if recording is not None:
            recording.append({**record, "seed": _run_seed})
        raise LearnerRaised(record["raised"], record["message"], record.get("hint"), record.get("expected"),
                            record.get("got")) from exc
    if recording is not None:
        recording.append({"key": key, "value": value, "seed": _run_seed})  # the run it answers (Replay.take)
    return value


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, and if it raises, the error message names this call (the failing input)."""
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        if getattr(exc, "__grading_call__", None) is None:
            shown = [one_line(a, 60) for a in args] + [f"{k}={one_line(v, 60)}" for k, v in kwargs.items()]
            try:
                exc.__grading_call__ = f"{getattr(fn, '__name__', 'your function')}({', '.join(shown)})"
            except AttributeError:
                pass
        raise


@dataclass(frozen=True)
class Check:
    """One registered check: which exercise, a short name, how many points, the function, and the parts of the
    exercise it checks (``("14.1", "14.2")``: the parts whose blank stub makes it fail; empty when unknown)."""

    exercise: str
    name: str
    points: int
    func: CheckFunc
    source: str  # module or file it came from (instructor-held checks are marked as such)
    parts: tuple[str, ...] = ()


@dataclass
class CheckResult:
    """Outcome of one check; serialisable with :meth:`to_dict` (it crosses a process boundary as JSON)."""

    exercise: str
    name: str
    points: int
    passed: bool
    message: str = ""
    hint: str | None = None
    expected: str | None = None
    got: str | None = None
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    parts: tuple[str, ...] = ()

    @property
    def part_label(self) -> str:
        """``"14.1+2"`` for parts 14.1 and 14.2, ``"04.1-5"`` for 04.1 to 04.5; the exercise number when the parts
        are not known."""
        if not self.parts:
            return self.exercise
        minors = sorted({int(part.split(".", 1)[1]) for part in self.parts})
        runs: list[list[int]] = []
        for k in minors:
            if runs and k == runs[-1][-1] + 1:
                runs[-1].append(k)
            else:
                runs.append([k])
        return f"{self.exercise}." + "+".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else "+".join(map(str, r)) for r in runs)

    @property
    def earned(self) -> int:
        return self.points if self.passed else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckResult:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if "parts" in known:
            known["parts"] = tuple(known["parts"])  # JSON has lists
        return cls(**known)


def normalise_exercise(number: str | int) -> str:
    """``5``, ``"5"``, ``"05"`` -> ``"05"``; anything else is a clear error."""
    text = str(number).strip()
    if not text.isdigit() or not 0 < int(text) < 100:
        raise ValueError(f"exercise number {number!r} is not a number between 1 and 99 (e.g. \"05\")")
    return f"{int(text):02d}"


def check_for(exercise: str | int, name: str, points: int = 1,
              parts: Sequence[str] = ()) -> Callable[[CheckFunc], CheckFunc]:
    """Register the decorated function as a check of ``exercise`` worth ``points``, checking ``parts`` (each
    ``"NN.k"``: the exercise's k-th stub; the feedback names them).

    Re-importing a module replaces its checks instead of duplicating them.
    """
    number = normalise_exercise(exercise)
    if not isinstance(points, int) or points < 0:
        raise ValueError(f"points={points!r} for check {name!r}: use a non-negative int")
    wrong = [p for p in parts if not re.fullmatch(rf"{number}\.[1-9][0-9]?", str(p))]
    if wrong or isinstance(parts, str):
        raise ValueError(f"parts={parts!r} for check {name!r}: give a tuple of \"{number}.k\" part numbers")

    def register(func: CheckFunc) -> CheckFunc:
        source = getattr(func, "__module__", "?")
        key = f"{source}:{func.__qualname__}"
        _REGISTRY.setdefault(number, {})[key] = Check(number, name, points, func, source, tuple(parts))
        return func

    return register


# Set by the grading worker: shown every object a check takes from the learner's namespace (is it a reference?).
_taken_hook: Callable[[Any], None] | None = None


def watch_taken(hook: Callable[[Any], None] | None) -> None:
    """Worker side: call ``hook(value)`` for every value :func:`need` returns."""
    global _taken_hook
    _taken_hook = hook


def need(ns: Mapping[str, Any], name: str, how: str | None = None) -> Any:
    """Return ``ns[name]`` or fail with "define ..." (mentioning a cell that stopped early, if any)."""
    if name in ns:
        if _taken_hook is not None:
            _taken_hook(ns[name])
        return ns[name]
    message = how or f"define `{name}` in the exercise cell"
    errors = ns.get(CELL_ERRORS) or []
    for _, error in errors:
        if error.startswith("NotImplementedError: Exercise"):
            raise CheckFailed(f"not attempted yet: {error.split(': ', 1)[1]}", hint=message)
    if errors:
        message += f" (a cell stopped early: {errors[0][1]})"
    raise CheckFailed(message)


# ---------------------------------------------------------------- discovery


def _import_builtin_checks(exercise: str) -> None:
    """Import every ``course_lib.grading.checks.ex<exercise>_*`` module (registering its checks)."""
    package = importlib.import_module("course_lib.grading.checks")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith(f"ex{exercise}_"):
            importlib.import_module(f"{package.__name__}.{info.name}")


def load_extra_checks(directory: str | Path) -> list[Path]:
    """Import every ``*.py`` in ``directory`` (instructor-held checks using :func:`check_for`)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(f"--extra-tests {folder}: not a folder of check files (*.py)")
    loaded = []
    for path in sorted(folder.glob("*.py")):
        module_name = f"course_lib_extra_checks.{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        loaded.append(path)
    return loaded


def checks_for(exercise: str | int, extra_dirs: Iterable[str | Path] = ()) -> list[Check]:
    """All checks of one exercise: the shipped ones, then any from ``extra_dirs``."""
    number = normalise_exercise(exercise)
    _import_builtin_checks(number)
    for directory in extra_dirs:
        load_extra_checks(directory)
    return list(_REGISTRY.get(number, {}).values())


def known_exercises() -> list[str]:
    """Exercise numbers that have a checks module."""
    package = importlib.import_module("course_lib.grading.checks")
    found = {info.name[2:4] for info in pkgutil.iter_modules(package.__path__) if info.name.startswith("ex")}
    return sorted(n for n in found if n.isdigit())


# ---------------------------------------------------------------- running one check


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: Any, limit: int | None = None) -> str:
    """Learner-controlled text made safe for a terminal: control characters (ANSI escapes included) shown as
    ``\\x1b``-style escapes, optionally cut to ``limit`` characters."""
    text = _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def one_line(value: Any, limit: int = 160) -> str:
    """``repr`` squeezed onto one line, made printable and cut to ``limit`` characters."""
    try:
        text = repr(value)
    except Exception as exc:  # a learner's __repr__ may raise
        text = f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    return printable(" ".join(text.split()), limit)


def _learner_frame(exc: BaseException) -> str:
    """Where in the learner's code an exception came from (their cells are compiled as ``<cell N>``)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith("<cell"):
            return f" ({frame.filename[1:-1]}, line {frame.lineno})"
    return ""


def run_check(check: Check, ns: dict[str, Any] | Replay) -> CheckResult:
    """Run one check against ``ns`` and turn every way it can end into a :class:`CheckResult`.

    With a :class:`Replay` (the grader) the verdict rests only on the recorded observations. Checks run one at
    a time and leave the process as they found it (:func:`isolated_check`).
    """
    result = CheckResult(check.exercise, check.name, check.points, passed=False, source=check.source,
                         parts=check.parts)
    judging = isinstance(ns, Replay)
    try:
        with isolated_check(mode=ns.mode if judging else None, seed=ns.seed if judging else None):
            check.func(ns)
    except CheckFailed as failed:
        result.message, result.hint = failed.message, failed.hint
        if failed.has_values:
            result.expected = one_line(failed.expected) if failed.has_expected else None
            result.got = one_line(failed.got)
    except LearnerRaised as raised:
        result.message, result.hint, result.expected, result.got = (
            raised.message, raised.hint, raised.expected, raised.got)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # learner code may raise anything; it is a failed check, not a crash
        record = _raised_record("", exc)
        result.message, result.hint = record["message"], record.get("hint")
        result.expected, result.got = record.get("expected"), record.get("got")
    else:
        result.passed = True
    for name in ("message", "hint", "expected", "got"):
        value = getattr(result, name)
        if value is not None:
            setattr(result, name, printable(value, 2000))
    return result
