"""The course as a static website: the lessons with their outputs, the README as home page, the guides.

``python -m course_lib.website`` (or ``make site``) works in three steps, each in its own folder:

1. **execute** every lesson of ``notebooks/`` with nbclient, in the current ``COURSE_MODE`` (``full`` by default:
   the numbers, plots and explanations a learner would get; ``smoke`` for CI), into
   ``.cache/site/<mode>/executed/``. A lesson is executed again only when its notebook, the library, the mode or the
   torch/Python versions changed (a key file next to it), so rebuilding the site after editing prose costs nothing;
2. **stage** the pages into ``build/site/<mode>/src/``: README (with the navigation in course order), the executed
   lessons (set-up cell dropped, live widgets replaced by their final text: a static page cannot run them), and
   ``docs/*.md``; relative links to files that are not pages point at the repository;
3. **render** them with Sphinx + myst-nb and the Furo theme (all shipped in wheels: nothing is downloaded at build
   time; search is Sphinx's own, in the browser) into ``build/site/<mode>/html/``. Open ``index.html``.

Lessons executed on a GPU by ``make gpu-check`` (committed in ``benchmarks/results/gpu-<device>/``, with the machine
that ran them) are staged as they ran there, one page each beside the CPU run (:func:`gpu_runs`): a reader without a
GPU sees what one showed.

Executing in full mode takes as long as running every lesson (minutes each on a laptop CPU); lessons run one at a
time so their measurements do not compete for the CPU.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import platform
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib import atomic, bootstrap, mode
from course_lib.argparsing import CommandParser
from course_lib.gpu_check import MACHINE_FILE
from course_lib.lesson import SKIP_CHOICE
from course_lib.perf import claims

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
GUIDES_FIRST = ("coverage.md", "grading.md")  # the syllabus map, then the instructor's guide to exercises/grading
CONF_DIR = Path("docs") / "site"


@dataclass(frozen=True)
class SiteFolders:
    """Where each step of a build writes, for one checkout and one mode."""

    root: Path
    mode: str

    @property
    def executed(self) -> Path:
        return self.root / ".cache" / "site" / self.mode / "executed"

    @property
    def staging(self) -> Path:
        return self.root / "build" / "site" / self.mode / "src"

    @property
    def html(self) -> Path:
        return self.root / "build" / "site" / self.mode / "html"

    @property
    def doctrees(self) -> Path:
        return self.root / "build" / "site" / self.mode / "doctrees"


def lessons(root: Path) -> list[Path]:
    """The lessons in course order (``notebooks/NN_topic.ipynb``)."""
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def exercises(root: Path) -> list[Path]:
    """The exercises as they come (blank, nothing run): pages of the site; their solutions never are."""
    return sorted((root / "exercises").glob("[0-9][0-9]_*.ipynb"))


def instructor_notes(root: Path) -> list[Path]:
    """``docs/instructor/``: its README (the index), the agenda, then one note per lesson."""
    folder = root / "docs" / "instructor"
    first = [folder / name for name in ("README.md", "agenda.md") if (folder / name).is_file()]
    return first + sorted(p for p in folder.glob("*.md") if p not in first)


def guides(root: Path) -> list[Path]:
    """``docs/*.md`` pages: the coverage map and the grading guide first, then the others by name."""
    pages = sorted((root / "docs").glob("*.md"))
    return sorted(pages, key=lambda p: (GUIDES_FIRST.index(p.name) if p.name in GUIDES_FIRST else len(GUIDES_FIRST),
                                        p.name))


# --- 1. execute -----------------------------------------------------------------------------------------------------
def execution_key(lesson: Path, course_mode: str) -> str:
    """Everything an executed lesson depends on that can change between builds."""
    import torch

    digest = hashlib.sha256(lesson.read_bytes())
    digest.update(f"{bootstrap.identity()}|{course_mode}|{torch.__version__}|{platform.python_version()}".encode())
    return digest.hexdigest()


class LessonFailed(RuntimeError):
    """A lesson raised while being executed for the site (the message has the cell and the traceback)."""


def claim_log_of(out_dir: Path, lesson: Path) -> Path:
    """Where :func:`execute` writes the lesson's claim log (every verdict it showed, :mod:`course_lib.perf.claims`)."""
    return out_dir / f"{lesson.stem}.claims.jsonl"


def execute(lesson: Path, out_dir: Path, *, force: bool = False, timeout: int = 900) -> bool:
    """Execute ``lesson`` into ``out_dir/<name>`` unless an up-to-date copy is there; True when it ran.

    The kernel starts in the lesson's own folder (as in JupyterLab), with the current environment. Every verdict the
    lesson shows goes to :func:`claim_log_of` (``python -m course_lib claims check`` re-derives them).
    """
    import nbformat
    from nbclient.exceptions import CellExecutionError

    from course_lib.nbrun import NotebookRunner, unattended_env

    out, key_file = out_dir / lesson.name, out_dir / f"{lesson.stem}.key"
    key = execution_key(lesson, mode.mode())
    if not force and out.is_file() and key_file.is_file() and key_file.read_text() == key:
        return False
    nb = nbformat.read(lesson, as_version=4)
    client = NotebookRunner(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(lesson.parent)}})
    env = unattended_env(lesson)  # plots as images, each reveal written out, the lesson named in the claim log
    claim_log = claim_log_of(out_dir, lesson)
    claim_log.unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    env[claims.ENV] = str(claim_log)
    try:
        client.execute(env=env)
    except CellExecutionError as exc:
        raise LessonFailed(f"{lesson.name} failed in {mode.mode()} mode:\n{exc}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a killed build never leaves half a notebook behind a valid key.
    atomic.write_with(out, lambda f: nbformat.write(nb, f), encoding="utf-8")
    atomic.write_text(key_file, key)
    return True


# --- GPU runs -------------------------------------------------------------------------------------------------------
GPU_RESULTS = Path("benchmarks") / "results"
COURSE_ID = re.compile(r'^COURSE_ID, COURSE_SOURCE = "(?P<id>[^"]+)"', re.M)


@dataclass(frozen=True)
class GpuRun:
    """A lesson executed on a GPU by ``make gpu-check`` (``benchmarks/results/gpu-<device>/NN_topic.ipynb``), with
    the machine that ran it (:data:`course_lib.gpu_check.MACHINE_FILE` beside it)."""

    lesson: Path
    notebook: Path
    machine: dict[str, Any]

    @property
    def page(self) -> Path:
        """Where the page is staged, relative to the site's root: ``gpu/<device>/NN_topic.ipynb``."""
        return Path("gpu") / self.notebook.parent.name.removeprefix("gpu-") / self.lesson.name

    @property
    def title(self) -> str:
        return f"Lesson {self.lesson.name[:2]} on {self.machine['name']}"


def gpu_runs(root: Path, chosen: Sequence[Path]) -> list[GpuRun]:
    """The GPU runs of the ``chosen`` lessons, device by device; a folder of runs without a readable machine file is
    an error (the page would not say what produced it)."""
    runs = []
    for folder in sorted(p for p in (root / GPU_RESULTS).glob("gpu-*") if p.is_dir()):
        executed = [(lesson, folder / lesson.name) for lesson in chosen if (folder / lesson.name).is_file()]
        if not executed:
            continue
        machine_file = folder / MACHINE_FILE
        try:
            machine = json.loads(machine_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"{machine_file}: cannot be read ({exc}); the executed lessons beside it need the "
                               f"machine that ran them: `make gpu-check` writes it with them") from None
        missing = [key for key in ("name", "torch", "date") if not machine.get(key)]
        if missing:
            raise RuntimeError(f"{machine_file}: no {', '.join(missing)}; run the lessons again with `make gpu-check`,"
                               f" which writes it with them")
        runs += [GpuRun(lesson, notebook, machine) for lesson, notebook in executed]
    return runs


def _gpu_header(run: GpuRun, course_id: str, root: Path, config: bootstrap.LaunchConfig) -> str:
    """Which machine, software and course version produced the page, all read from the run's files."""
    m = run.machine
    device = ", ".join(filter(None, [f"compute capability {m['capability']}" if m.get("capability") else "",
                                     f"{m['memory_gib']} GiB" if m.get("memory_gib") else ""]))
    software = ", ".join(filter(None, [f"torch {m['torch']}", f"CUDA {m['cuda']}" if m.get("cuda") else "",
                                       f"Python {m['python']}" if m.get("python") else ""]))
    today = os.path.relpath(Path("notebooks") / run.lesson.name, run.page.parent)
    folder = _repository_link(root, config, run.notebook.parent)
    return (f":::{{admonition}} Executed on {m['name']}\n:class: note\n"
            f"This page shows the outputs of a run on **{m['name']}**{f' ({device})' if device else ''}, with "
            f"{software}, in **{m.get('mode', 'full')}** mode, on **{m['date']}**, from the course at "
            f"`{course_id}`. The text and code are that version's and may differ from today's lesson, "
            f"[run on this site's CPU]({today}). Produced by `make gpu-check`; the executed notebook and "
            f"the machine's description: [{run.notebook.parent.relative_to(root).as_posix()}/]({folder}).\n:::")


def _gpu_page(run: GpuRun, root: Path, pages: set[Path], config: bootstrap.LaunchConfig) -> dict[str, Any]:
    """The lesson as executed on the GPU: its outputs, under a title naming the GPU and the header above."""
    nb = static_outputs(json.loads(run.notebook.read_text(encoding="utf-8")))
    setup = "".join(next((c["source"] for c in nb["cells"] if c.get("id") == bootstrap.SETUP_CELL_ID), ""))
    found = COURSE_ID.search(setup)
    course_id = found["id"] if found else run.machine.get("course", "unknown")
    nb["cells"] = [c for c in nb["cells"] if c.get("id") not in (bootstrap.SETUP_CELL_ID, bootstrap.LAUNCH_CELL_ID)]
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = rewrite_links("".join(cell["source"]), run.lesson, root, pages, config,
                                           staged_as=run.page)
    header = _gpu_header(run, course_id, root, config)
    first = nb["cells"][0]
    title = re.match(r"# Lesson \d\d\b(?P<topic>.*)\n?", first["source"]) if first["cell_type"] == "markdown" else None
    if title:  # the header right under the title, before the lesson's own introduction
        first["source"] = f"# {run.title}{title['topic']}\n\n{header}\n\n{first['source'][title.end():]}"
    else:
        nb["cells"].insert(0, {"cell_type": "markdown", "id": "site-gpu-title", "metadata": {},
                               "source": f"# {run.title}\n\n{header}"})
    return nb


# --- 2. stage -------------------------------------------------------------------------------------------------------
CONTROLS = re.compile(
    r"(Button|ToggleButtons|Dropdown|Slider|Checkbox|Select|Text|Textarea|Toggle|RadioButtons|Combobox)Model$")
LIVE_WIDGET = "(an interactive widget: open the lesson in Jupyter to use it)"


def _widget_tree(model_id: str, state: dict[str, Any]) -> list[dict[str, Any]]:
    model = state.get(model_id, {}).get("state", {})
    children = [str(c).removeprefix("IPY_MODEL_") for c in model.get("children", [])]
    return [model, *(m for child in children for m in _widget_tree(child, state))]


def _widget_text(model_id: str, state: dict[str, Any]) -> str:
    """What a widget shows, from the saved widget state: a progress bar's final line, a question with its choices;
    other controls cannot be static."""
    tree = _widget_tree(model_id, state)
    texts = [re.sub(r"<[^>]+>", "", re.sub(r"<style>.*?</style>", "", html.unescape(str(m["value"])), flags=re.S))
             .strip() for m in tree if m.get("_model_name") in ("HTMLModel", "LabelModel") and m.get("value")]
    text = " ".join(t for t in texts if t)
    choices = [c for m in tree for c in m.get("_options_labels", []) if c != SKIP_CHOICE]
    if any(CONTROLS.search(str(m.get("_model_name", ""))) for m in tree):
        return f"{text}\n" + "\n".join(f"- {c}" for c in choices) if text and choices else LIVE_WIDGET
    return text or LIVE_WIDGET


def _held_outputs(model_id: str, state: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The outputs a question held back until answered, from the saved widget state (a notebook executed without
    ``COURSE_UNATTENDED`` keeps them there). The stack holds one copy per choice, the last for skipping: nobody
    answered, so the page shows that one (the reveal without a prediction)."""
    held = [m["outputs"] for m in _widget_tree(model_id, state)
            if m.get("_model_name") == "OutputModel" and m.get("outputs")]
    return held[-1] if held else None


def _static(output: dict[str, Any], state: dict[str, Any], seen: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    view = output.get("data", {}).get(WIDGET_VIEW)
    if view is None:  # an output widget's outputs may lack the metadata a notebook's display outputs must have
        rich = output.get("output_type") in ("display_data", "execute_result")
        return [{"metadata": {}, **output} if rich else output]
    model_id = view.get("model_id", "")
    held = _held_outputs(model_id, state) if model_id not in seen else None
    if held is not None:
        return [shown for inner in held for shown in _static(inner, state, seen | {model_id})]
    return [{**output, "data": {"text/plain": _widget_text(model_id, state)}}]


def static_outputs(nb: dict[str, Any]) -> dict[str, Any]:
    """Replace live widgets by what they show (the page has no kernel) and forget the widget state."""
    state = nb.get("metadata", {}).pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb["cells"]:
        if "outputs" in cell:
            cell["outputs"] = [shown for output in cell["outputs"] for shown in _static(output, state)]
    return nb


def _repository_link(root: Path, config: bootstrap.LaunchConfig, target: Path) -> str:
    relative = target.resolve().relative_to(root.resolve()).as_posix()
    kind = "tree" if target.is_dir() else "blob"
    return f"{config.repository}/{kind}/{config.branch}/{relative}"


LINK = re.compile(r"(\]\()(?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?(\))")


def rewrite_links(text: str, page: Path, root: Path, pages: set[Path], config: bootstrap.LaunchConfig, *,
                  staged_as: Path | None = None) -> str:
    """Relative links to repository files that are not pages of the site point at the repository instead; links
    to pages are made relative to ``staged_as`` (``root``-relative) when the page is staged elsewhere than ``page``."""
    def replace(match: re.Match[str]) -> str:
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            return match.group(0)
        resolved = (page.parent / target).resolve()
        here = (root / staged_as).parent if staged_as is not None else page.parent
        if resolved == (root / "README.md").resolve():  # the home page is staged as index.md
            return f"{match[1]}{os.path.relpath(root / 'index.md', here)}{match['anchor'] or ''})"
        if resolved in pages and staged_as is not None:
            return f"{match[1]}{os.path.relpath(resolved, here.resolve())}{match['anchor'] or ''})"
        if resolved in pages or not resolved.exists() or root.resolve() not in resolved.parents:
            return match.group(0)
        return f"{match[1]}{_repository_link(root, config, resolved)}{match['anchor'] or ''})"
    return LINK.sub(replace, text)


def _write_if_changed(path: Path, text: str) -> None:
    """Unchanged files keep their time stamps, so Sphinx rebuilds only the pages that changed."""
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, text)


def _toctree(caption: str, entries: list[str]) -> str:
    return "\n```{toctree}\n:hidden:\n:caption: " + caption + "\n\n" + "\n".join(entries) + "\n```\n"


def _exercise_page(source: Path, root: Path, pages: set[Path], config: bootstrap.LaunchConfig) -> dict[str, Any]:
    """An exercise as it comes (no set-up cell: it is for kernels), with a note on how to do and check it."""
    nb = json.loads(source.read_text(encoding="utf-8"))
    nb["cells"] = [c for c in nb["cells"] if c.get("id") != bootstrap.SETUP_CELL_ID]
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = rewrite_links("".join(cell["source"]), source, root, pages, config)
    note = (f"*The exercise as it comes, nothing run. Do it in JupyterLab (`make lab`, then open "
            f"`exercises/{source.name}`); `python -m course_lib check {source.name[:2]}` grades your copy.*")
    nb["cells"].insert(1, {"cell_type": "markdown", "id": "site-exercise-note", "metadata": {}, "source": note})
    return nb


def stage(root: Path, folders: SiteFolders, executed: list[Path], *, machine: str) -> list[Path]:
    """Write the Sphinx sources into ``folders.staging``; return the staged files."""
    config = bootstrap.read_config(root)
    home = root / "README.md"
    sources = [home, *(root / "notebooks" / p.name for p in executed), *exercises(root), *guides(root),
               *instructor_notes(root)]
    pages = {p.resolve() for p in sources}
    runs = gpu_runs(root, [root / "notebooks" / p.name for p in executed])
    staged = []
    for run in runs:
        target = folders.staging / run.page
        _write_if_changed(target, json.dumps(_gpu_page(run, root, pages, config), indent=1, ensure_ascii=False))
        staged.append(target)
    for source in sources:
        relative = Path("index.md") if source == home else source.relative_to(root)
        target = folders.staging / relative
        if source.suffix == ".md":
            text = rewrite_links(source.read_text(encoding="utf-8"), source, root, pages, config)
            if source == home:
                text += _toctree("Lessons", [f"notebooks/{p.stem}" for p in executed])
                text += _toctree("Lessons executed on a GPU", [run.page.with_suffix("").as_posix() for run in runs]
                                 ) if runs else ""
                text += _toctree("Exercises", [f"exercises/{p.stem}" for p in exercises(root)])
                text += _toctree("Guides", [p.relative_to(root).with_suffix("").as_posix() for p in guides(root)])
                notes = [p.relative_to(root).with_suffix("").as_posix() for p in instructor_notes(root)]
                text += _toctree("Instructor notes", notes) if notes else ""
        elif source.parent.name == "exercises":
            text = json.dumps(_exercise_page(source, root, pages, config), indent=1, ensure_ascii=False)
        else:
            nb = static_outputs(json.loads((folders.executed / source.name).read_text(encoding="utf-8")))
            nb["cells"] = [c for c in nb["cells"] if c.get("id") != bootstrap.SETUP_CELL_ID]
            for cell in nb["cells"]:
                if cell["cell_type"] == "markdown":
                    cell["source"] = rewrite_links("".join(cell["source"]), source, root, pages, config)
            note = (f"*This page shows the lesson's outputs from a run in **{folders.mode}** mode on {machine}; "
                    "yours will differ: every number comes from the machine that runs it.*")
            nb["cells"].insert(1, {"cell_type": "markdown", "id": "site-run-note", "metadata": {}, "source": note})
            on_gpus = [f"[{run.title}]({os.path.relpath(run.page, relative.parent)}) ({run.machine['date']})"
                       for run in runs if run.lesson.name == source.name]
            if on_gpus:
                also = f"*Also executed on a GPU: see {', '.join(on_gpus)}, the outputs that machine showed.*"
                nb["cells"].insert(2, {"cell_type": "markdown", "id": "site-gpu-runs", "metadata": {},
                                       "source": also})
            text = json.dumps(nb, indent=1, ensure_ascii=False)
        _write_if_changed(target, text)
        staged.append(target)
    keep = {p.resolve() for p in staged}
    for stale in [p for p in folders.staging.rglob("*") if p.is_file() and p.resolve() not in keep]:
        stale.unlink()  # a page removed from the course disappears from the site
    return staged


# --- 3. render ------------------------------------------------------------------------------------------------------
def render(root: Path, folders: SiteFolders, *, quiet: bool = True) -> Path:
    """Sphinx: staged sources -> ``folders.html``; returns the path of the warnings log."""
    from sphinx.cmd.build import build_main

    warnings = folders.html.parent / "warnings.log"
    args = ["-b", "html", "-c", str(root / CONF_DIR), "-d", str(folders.doctrees), "-w", str(warnings),
            # Markdown outputs (the lessons' tables of measurements) in MyST, as the text: CommonMark has no tables.
            "-D", "nb_render_markdown_format=myst"]
    if quiet:
        args.append("-q")
    status = build_main([*args, str(folders.staging), str(folders.html)])
    if status:
        raise RuntimeError(f"sphinx-build failed (exit {status}); see {warnings}")
    return warnings


def machine_summary() -> str:
    """'a 2-core CPU (x86_64), device cpu': the context a reader needs to read the numbers."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"a {cores}-core {platform.machine()} machine, device {bootstrap.device_summary()}"


def build(root: Path, *, force: bool = False, only: Sequence[str] = (), quiet: bool = False) -> SiteFolders:
    """Execute (as needed), stage and render the site for the current mode; returns where it went."""
    folders = SiteFolders(root=root, mode=mode.mode())
    chosen = [p for p in lessons(root) if not only or p.name[:2] in only]
    for lesson in chosen:
        start = time.perf_counter()
        ran = execute(lesson, folders.executed, force=force)
        if not quiet:
            print(f"{lesson.name}: {'executed in %.0f s' % (time.perf_counter() - start) if ran else 'up to date'}",
                  flush=True)
    stage(root, folders, chosen, machine=machine_summary())
    render(root, folders, quiet=quiet)
    return folders


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(prog="python -m course_lib.website", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="execute every lesson again, even when up to date")
    parser.add_argument("--lessons", nargs="*", default=(), metavar="NN", help="only these lessons (a quick preview)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    root = bootstrap.checkout_root()
    if root is None:
        parser.error("the site is built from a clone of the course (course_lib is installed here, not cloned)")
    start = time.perf_counter()
    try:
        folders = build(root, force=args.force, only=args.lessons, quiet=args.quiet)
    except (LessonFailed, RuntimeError) as exc:
        print(f"site: {exc}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in folders.html.rglob("*") if p.is_file())
    print(f"site ({folders.mode} mode) in {folders.html / 'index.html'}: {size / 1e6:.1f} MB, "
          f"built in {time.perf_counter() - start:.0f} s. Open that file, or serve the folder: "
          f"python -m http.server -d {folders.html}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
