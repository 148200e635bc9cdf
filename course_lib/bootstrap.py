"""Run any notebook of the course in any Jupyter kernel: a local clone, Colab, Kaggle, a workshop's JupyterHub.

The first code cell of every lesson, exercise and solution is the *set-up cell*. It is short and self-contained (it
cannot import ``course_lib`` to install ``course_lib``):

* ``course_lib`` importable (a local clone, or a kernel set up before): it calls :func:`ensure`, which checks that
  the library is the one the notebook was written with, prepares the data for the current ``COURSE_MODE`` (instant
  when it is there) and prints one line: version, mode, device.
* not importable (a fresh hosted kernel that has torch but not the course): it first runs
  ``pip install <source>``, where the source is ``$COURSE_SOURCE`` when set (a pip requirement, a ``git+`` URL or a
  local path / wheel, e.g. a workshop's mirror), else the repository declared in ``pyproject.toml``
  (``[project.urls] Repository`` at ``[tool.course_lib] branch``). pip runs with short network time-outs, so
  offline the cell stops quickly with what to do instead of hanging.

*The same commit.* The cell carries the identity of the library it was written with: ``<version>+<fingerprint>``,
where the fingerprint hashes every ``.py`` file of the package. A notebook never silently runs against a library from
another commit: an installed library that differs stops the notebook with the command that fixes it; in a clone
(where someone is editing the library) it is one line of warning.

``python -m course_lib.bootstrap --write-cells`` writes the set-up cell and the launch links (Colab, Kaggle) into
every notebook of ``notebooks/``, ``solutions/`` and ``exercises/``, and the launch links into the README's course
table. It is idempotent: run it after changing the library or ``pyproject.toml``, or after merging notebook edits.
``--check`` changes nothing and exits 1 when something is out of date (a test runs it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import course_lib
from course_lib.argparsing import CommandParser

PACKAGE_DIR = Path(course_lib.__file__).resolve().parent
NOTEBOOK_FOLDERS = ("notebooks", "solutions", "exercises")
SETUP_CELL_ID = "course-setup"
LAUNCH_CELL_ID = "course-launch"
SETUP_MARK = "# Course set-up"
LAUNCH_MARK = "[Open in Colab]"
README_COLUMN = "Open"


class CourseVersionMismatch(RuntimeError):
    """The installed ``course_lib`` is not the one this notebook was written with."""


# --- identity ------------------------------------------------------------------------------------------------------
def fingerprint(package_dir: Path = PACKAGE_DIR) -> str:
    """12 hex digits hashing every ``.py`` file of the package (path and content, line endings normalised).

    Computed the same way from a source tree and from an installed copy, so both agree exactly when the code does.
    """
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes().replace(b"\r\n", b"\n") + b"\0")
    return digest.hexdigest()[:12]


def identity(package_dir: Path = PACKAGE_DIR) -> str:
    """``"<version>+<fingerprint>"`` of the library (the string the set-up cell carries)."""
    return f"{course_lib.__version__}+{fingerprint(package_dir)}"


def checkout_root(package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The clone ``course_lib`` is imported from (its ``pyproject.toml`` names this project), or None when installed."""
    root = package_dir.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(r'^name\s*=\s*"course_lib"', pyproject.read_text(encoding="utf-8"), re.M):
        return root
    return None


# --- what the set-up cell calls -------------------------------------------------------------------------------------
def ensure(expected: str, source: str = "") -> None:
    """Check the library against the notebook's ``expected`` identity, prepare the data, print one line.

    Raises :class:`CourseVersionMismatch` (with the command that fixes it) when an *installed* library differs.
    """
    found = identity()
    if found != expected:
        root = checkout_root()
        if root is None:
            raise CourseVersionMismatch(mismatch_message(expected, found, source))
        print(f"note: this notebook's set-up cell was written for course_lib {expected}; the clone in {root} is "
              f"{found} (edited since). `python -m course_lib.bootstrap --write-cells` refreshes the cells.")
    from course_lib import journal, mode
    from course_lib.data.corpus import prepare_text
    from course_lib.data.shapes import prepare_shapes

    prepare_shapes(progress=True)  # reads one marker file when the data is already there
    prepare_text()
    show_blank_exercises_briefly()
    watch_long_cells()
    journal.lesson_run()  # the learner's progress journal (a lesson's notebook only; never in tests)
    print(f"course_lib {found} · {mode.mode()} mode · data in {mode.data_dir()} · device: {device_summary()}")


def watch_long_cells() -> bool:
    """In a notebook, a cell silent for 10 s shows what it is doing and about how long is left
    (:mod:`course_lib.heartbeat`). Returns whether the watch is installed (False outside IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    from course_lib import heartbeat

    return heartbeat.watch_cells(get_ipython())


NOT_ATTEMPTED = "Exercise "  # how a blank exercise's NotImplementedError starts ("Exercise 14.1: ...")


def show_blank_exercises_briefly() -> bool:
    """In a notebook, a cell that reaches a blank exercise (``NotImplementedError("Exercise NN.k: ...")``) shows one
    line, "not attempted yet: Exercise NN.k: ...", instead of a traceback through the library; any other
    NotImplementedError keeps its traceback. The cell still fails (Run All and nbval see an error). Returns whether
    it was installed (False outside IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False

    def brief(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> None:
        # IPython ignores a custom handler's return value: the handler shows the error itself.
        if str(value).startswith(NOT_ATTEMPTED):
            shell._showtraceback(etype, value, [f"not attempted yet: {value}"])
        else:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)

    shell.set_custom_exc((NotImplementedError,), brief)
    return True


def mismatch_message(expected: str, found: str, source: str) -> str:
    source = os.environ.get("COURSE_SOURCE") or source or "<the course repository>"
    return (
        f"This notebook was written for course_lib {expected}, but this kernel has course_lib {found} "
        f"(installed in {PACKAGE_DIR}). A notebook and a library from different commits can disagree, so the "
        f"notebook stops here.\nFix: install the library from the notebook's own commit, then restart the kernel "
        f"and run again:\n    %pip install --force-reinstall --no-deps \"{source}\"\n"
        "If the source is a branch that has moved on since you opened this notebook, reopen the notebook from the "
        "same branch, or pin both to one commit (COURSE_SOURCE=git+<repository URL>@<commit>)."
    )


def device_summary() -> str:
    """The device the lessons will pick, with the GPU's name when there is one."""
    import torch

    from course_lib.device import pick_device

    device = pick_device("auto")
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


# --- configuration: the repository, declared once in pyproject.toml -------------------------------------------------
@dataclass(frozen=True)
class LaunchConfig:
    """Where the course lives: the GitHub repository and branch that launch links open and the cell installs."""

    repository: str  # https://github.com/<owner>/<name>
    branch: str

    @property
    def slug(self) -> str:
        return self.repository.removeprefix("https://github.com/")

    @property
    def pip_source(self) -> str:
        return f"git+{self.repository}@{self.branch}"

    def blob_url(self, path: str) -> str:
        return f"{self.repository}/blob/{self.branch}/{path}"

    def colab_url(self, path: str) -> str:
        return f"https://colab.research.google.com/github/{self.slug}/blob/{self.branch}/{path}"

    def kaggle_url(self, path: str) -> str:
        return f"https://kaggle.com/kernels/welcome?src={self.blob_url(path)}"


def read_config(root: Path) -> LaunchConfig:
    """``[project.urls] Repository`` and ``[tool.course_lib] branch`` (default ``main``) from ``pyproject.toml``."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    repository = data.get("project", {}).get("urls", {}).get("Repository", "").rstrip("/")
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repository):
        raise ValueError(
            f"pyproject.toml [project.urls] Repository = {repository!r}: the launch links and the set-up cell need a "
            "GitHub repository URL, https://github.com/<owner>/<name> (a fork or a workshop puts its own here)."
        )
    branch = str(data.get("tool", {}).get("course_lib", {}).get("branch", "main"))
    return LaunchConfig(repository=repository, branch=branch)


# --- the cells ------------------------------------------------------------------------------------------------------
def setup_cell_source(config: LaunchConfig, course_id: str) -> str:
    """The set-up cell: self-contained (no course_lib import before it is installed), short, safe offline."""
    return f'''{SETUP_MARK}: in a clone it only checks the library's version; in a fresh kernel (Colab, Kaggle,
# JupyterHub) it installs the course first, from $COURSE_SOURCE when set. Written by `python -m course_lib.bootstrap`.
COURSE_ID, COURSE_SOURCE = "{course_id}", "{config.pip_source}"
try:
    import course_lib.bootstrap as course_setup
except ModuleNotFoundError:
    import importlib, os, subprocess, sys
    source = os.environ.get("COURSE_SOURCE") or COURSE_SOURCE
    print(f"Installing the course from {{source}} ...", flush=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--timeout", "15", "--retries", "1", source]
    if subprocess.run(pip, env={{**os.environ, "GIT_TERMINAL_PROMPT": "0"}}, timeout=900).returncode:
        raise RuntimeError(f"Could not install the course from {{source}} (pip says why above). Offline? Set "
                           "COURSE_SOURCE to a local copy of the course or a wheel of it, then run this cell again.")
    importlib.invalidate_caches()
    import course_lib.bootstrap as course_setup
course_setup.ensure(COURSE_ID, COURSE_SOURCE)'''


def launch_cell_source(config: LaunchConfig, path: str, what: str) -> str:
    """One markdown line of launch links for the repository file ``path``."""
    return (f"{LAUNCH_MARK}({config.colab_url(path)}) · [Open in Kaggle]({config.kaggle_url(path)}) — "
            f"runs {what} in a hosted kernel; its first code cell installs the course there.")


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _is_setup(cell: dict[str, Any]) -> bool:
    return cell.get("id") == SETUP_CELL_ID or (
        cell.get("cell_type") == "code" and "".join(cell.get("source", "")).startswith(SETUP_MARK))


def _is_launch(cell: dict[str, Any]) -> bool:
    return cell.get("id") == LAUNCH_CELL_ID or (
        cell.get("cell_type") == "markdown" and "".join(cell.get("source", "")).startswith(LAUNCH_MARK))


def with_course_cells(nb: dict[str, Any], setup_source: str, launch_source: str) -> dict[str, Any]:
    """``nb`` with the launch line after its title cell and the set-up cell as its first code cell (idempotent)."""
    from course_lib import nbclean

    nb = nbclean.clean(nb)
    cells = [c for c in nb["cells"] if not (_is_setup(c) or _is_launch(c))]
    has_ids = nb.get("nbformat", 4) > 4 or nb.get("nbformat_minor", 0) >= 5
    setup = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
             "source": _lines(setup_source)}
    launch = {"cell_type": "markdown", "metadata": {}, "source": _lines(launch_source)}
    if has_ids:
        setup["id"], launch["id"] = SETUP_CELL_ID, LAUNCH_CELL_ID
    first_code = next((i for i, c in enumerate(cells) if c.get("cell_type") == "code"), len(cells))
    cells.insert(first_code, setup)
    cells.insert(1 if cells and cells[0].get("cell_type") == "markdown" else 0, launch)
    nb["cells"] = cells
    return nb


def notebook_target(folder: str, path: Path) -> tuple[str, str]:
    """(repository path the launch links open, what it is). Solutions link to the exercise: that is what a learner runs
    (and ``build-exercises`` copies the solution's cells into the exercise unchanged)."""
    if folder == "notebooks":
        return f"notebooks/{path.name}", "this lesson"
    return f"exercises/{path.name}", "this exercise"


def readme_with_links(text: str, config: LaunchConfig, lessons: list[Path]) -> str:
    """The README with an ``Open`` column of launch links in its course table (rows ``| NN | ...``)."""
    by_number = {p.name[:2]: p for p in lessons}
    out, in_table = [], False
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        cells = [c.strip() for c in body.strip().strip("|").split("|")] if body.startswith("|") else None
        if cells and cells[0] == "#" and any("notebooks/" in c for c in cells):
            in_table = True
            cells = cells[:-1] if cells[-1] == README_COLUMN else cells
            cells.append(README_COLUMN)
        elif cells and in_table and set(cells[0]) <= {"-", ":"}:
            cells = cells[:-1] if len(cells) > 3 else cells
            cells.append("---")
        elif cells and in_table and re.fullmatch(r"\d\d", cells[0]):
            cells = cells[:3]
            lesson = by_number.get(cells[0])
            path = f"notebooks/{lesson.name}" if lesson else None
            cells.append(f"[Colab]({config.colab_url(path)}) · [Kaggle]({config.kaggle_url(path)})" if path else "—")
        else:
            in_table = in_table and bool(cells)
            out.append(line)
            continue
        out.append("| " + " | ".join(cells) + " |" + ("\n" if line.endswith("\n") else ""))
    return "".join(out)


def write_cells(root: Path, *, check_only: bool = False) -> list[Path]:
    """Write (or with ``check_only`` compare) the set-up and launch cells everywhere; return what differs."""
    from course_lib import nbclean

    config = read_config(root)
    setup = setup_cell_source(config, identity(root / "course_lib"))
    changed = []
    for folder in NOTEBOOK_FOLDERS:
        for path in sorted((root / folder).glob("[0-9][0-9]_*.ipynb")):
            target, what = notebook_target(folder, path)
            text = path.read_text(encoding="utf-8")
            new = nbclean.dumps(with_course_cells(json.loads(text), setup, launch_cell_source(config, target, what)))
            if new != text:
                changed.append(path)
                if not check_only:
                    path.write_text(new, encoding="utf-8")
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = readme_with_links(text, config, sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    if new != text:
        changed.append(readme)
        if not check_only:
            readme.write_text(new, encoding="utf-8")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib.bootstrap", description=__doc__.splitlines()[0])
    parser.add_argument("--write-cells", action="store_true",
                        help="write the set-up cell and launch links into every notebook and the README")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a cell or link is stale")
    parser.add_argument("--root", type=Path, default=None, help="the course checkout (default: this library's)")
    args = parser.parse_args(argv)
    root = args.root or checkout_root()
    if root is None:
        parser.error("course_lib is installed, not a clone: pass --root <the course checkout>")
    if not (args.write_cells or args.check):
        print(f"course_lib {identity(root / 'course_lib')} in {root}; --write-cells writes the cells, --check checks")
        return 0
    try:
        changed = write_cells(root, check_only=args.check)
    except ValueError as exc:
        print(f"bootstrap: {exc}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"{'stale' if args.check else 'wrote'}: {path.relative_to(root)}")
    if args.check and changed:
        print("run `python -m course_lib.bootstrap --write-cells`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
