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
import pkgutil
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

CheckFunc = Callable[[dict[str, Any]], None]

# Exercise number (two digits, "01".."13") -> the checks registered for it, in definition order.
_REGISTRY: dict[str, dict[str, "Check"]] = {}

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


@dataclass(frozen=True)
class Check:
    """One registered check: which exercise, a short name, how many points, and the function."""

    exercise: str
    name: str
    points: int
    func: CheckFunc
    source: str  # module or file it came from (instructor-held checks are marked as such)


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

    @property
    def earned(self) -> int:
        return self.points if self.passed else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CheckResult":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def normalise_exercise(number: str | int) -> str:
    """``5``, ``"5"``, ``"05"`` -> ``"05"``; anything else is a clear error."""
    text = str(number).strip()
    if not text.isdigit() or not 0 < int(text) < 100:
        raise ValueError(f"exercise number {number!r} is not a number between 1 and 99 (e.g. \"05\")")
    return f"{int(text):02d}"


def check_for(exercise: str | int, name: str, points: int = 1) -> Callable[[CheckFunc], CheckFunc]:
    """Register the decorated function as a check of ``exercise`` worth ``points``.

    Re-importing a module replaces its checks instead of duplicating them.
    """
    number = normalise_exercise(exercise)
    if not isinstance(points, int) or points < 0:
        raise ValueError(f"points={points!r} for check {name!r}: use a non-negative int")

    def register(func: CheckFunc) -> CheckFunc:
        source = getattr(func, "__module__", "?")
        key = f"{source}:{func.__qualname__}"
        _REGISTRY.setdefault(number, {})[key] = Check(number, name, points, func, source)
        return func

    return register


def need(ns: Mapping[str, Any], name: str, how: str | None = None) -> Any:
    """Return ``ns[name]`` or fail with "define ..." (mentioning a cell that stopped early, if any)."""
    if name in ns:
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


def one_line(value: Any, limit: int = 160) -> str:
    """``repr`` squeezed onto one line and cut to ``limit`` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _learner_frame(exc: BaseException) -> str:
    """Where in the learner's code an exception came from (their cells are compiled as ``<cell N>``)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith("<cell"):
            return f" ({frame.filename[1:-1]}, line {frame.lineno})"
    return ""


def run_check(check: Check, ns: dict[str, Any]) -> CheckResult:
    """Run one check against ``ns`` and turn every way it can end into a :class:`CheckResult`."""
    result = CheckResult(check.exercise, check.name, check.points, passed=False, source=check.source)
    try:
        check.func(ns)
    except CheckFailed as failed:
        result.message, result.hint = failed.message, failed.hint
        if failed.has_values:
            result.expected, result.got = one_line(failed.expected), one_line(failed.got)
    except NotImplementedError as exc:
        text = str(exc)
        result.message = f"not attempted yet: {text}" if text.startswith("Exercise") else (
            f"your code raised NotImplementedError: {text}{_learner_frame(exc)}")
    except SystemExit as exc:
        result.message = f"your code called sys.exit({exc.code!r}); return a value instead"
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # learner code may raise anything; it is a failed check, not a crash
        result.message = f"your code raised {type(exc).__name__}: {exc}{_learner_frame(exc)}"
    else:
        result.passed = True
    return result
