"""Every committed notebook is stored clean (no outputs, counts or volatile metadata)."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from course_lib import nbclean

NOTEBOOKS = nbclean.notebooks([REPO / d for d in ("notebooks", "exercises", "solutions") if (REPO / d).exists()])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(REPO)) for p in NOTEBOOKS])
def test_notebook_is_stored_clean(path):
    assert nbclean.is_clean(path), f"{path} has outputs or volatile metadata: run `python -m course_lib.nbclean {path}`"


def test_clean_removes_outputs_and_volatile_metadata():
    dirty = {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                     "language_info": {"name": "python", "version": "3.11.7"}, "widgets": {"state": {}}},
        "cells": [{"cell_type": "code", "id": "a1", "execution_count": 7, "source": "1+1",
                   "metadata": {"tags": ["check"], "execution": {"iopub.status.busy": "2026"}},
                   "outputs": [{"output_type": "execute_result", "data": {"text/plain": "2"}}]}],
    }
    cleaned = nbclean.clean(dirty)
    cell = cleaned["cells"][0]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert cell["metadata"] == {"tags": ["check"]}
    assert "widgets" not in cleaned["metadata"]
    assert cleaned["metadata"]["language_info"] == {"name": "python"}
    assert nbclean.clean(cleaned) == cleaned  # idempotent
    assert json.loads(nbclean.dumps(cleaned)) == cleaned


# What JupyterLab puts into a notebook's metadata once a kernel has started, before any cell runs.
KERNEL_METADATA = {
    "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
    "language_info": {"name": "python", "version": "3.99.1", "mimetype": "text/x-python", "file_extension": ".py",
                      "codemirror_mode": {"name": "ipython", "version": 3}, "pygments_lexer": "ipython3",
                      "nbconvert_exporter": "python"},
    "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2, "version_minor": 0}},
}


def _contents_manager(root):
    from jupyter_server.services.contents.filemanager import FileContentsManager

    manager = FileContentsManager(root_dir=str(root))
    manager.register_pre_save_hook(nbclean.keep_stored_metadata)
    return manager


def test_saving_an_untouched_notebook_in_the_lab_writes_the_same_bytes(tmp_path):
    """Open (the kernel's metadata arrives) then save, through Jupyter's own contents manager and the course lab's
    save hook: every lesson, exercise and solution comes back byte for byte, whatever Python the kernel runs."""
    import shutil

    changed = []
    for path in NOTEBOOKS:
        rel = path.relative_to(REPO)
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, tmp_path / rel)
    manager = _contents_manager(tmp_path)
    for path in NOTEBOOKS:
        rel = path.relative_to(REPO).as_posix()
        model = manager.get(rel)
        model["content"]["metadata"].update(json.loads(json.dumps(KERNEL_METADATA)))
        manager.save(model, rel)
        if (tmp_path / rel).read_bytes() != path.read_bytes():
            changed.append(rel)
    assert changed == []


def test_the_save_hook_keeps_work_and_leaves_other_notebooks_alone(tmp_path):
    stored = json.loads(NOTEBOOKS[0].read_text(encoding="utf-8"))
    (tmp_path / "lesson.ipynb").write_text(nbclean.dumps(stored), encoding="utf-8")
    own = {**stored, "metadata": json.loads(json.dumps(KERNEL_METADATA))}
    own["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"] = {"m1": {"model_name": "x"}}
    (tmp_path / "mine.ipynb").write_text(nbclean.dumps(own), encoding="utf-8")
    manager = _contents_manager(tmp_path)

    model = manager.get("lesson.ipynb")
    model["content"]["metadata"].update(json.loads(json.dumps(KERNEL_METADATA)))
    model["content"]["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"] = {"m": {}}
    model["content"]["cells"][0]["source"] = "my notes"
    manager.save(model, "lesson.ipynb")
    saved = json.loads((tmp_path / "lesson.ipynb").read_text(encoding="utf-8"))
    assert "".join(saved["cells"][0]["source"]) == "my notes"  # the learner's work is saved
    assert saved["metadata"]["language_info"] == stored["metadata"]["language_info"]
    assert saved["metadata"]["kernelspec"] == stored["metadata"]["kernelspec"]
    assert saved["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"] == {"m": {}}

    model = manager.get("mine.ipynb")
    manager.save(model, "mine.ipynb")  # not in the course's stored form: saved as JupyterLab sends it
    assert json.loads((tmp_path / "mine.ipynb").read_text(encoding="utf-8"))["metadata"] == own["metadata"]
